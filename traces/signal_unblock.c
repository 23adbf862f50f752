/* Signals whose handlers run inside kill(getpid()), sigprocmask and
 * pthread_sigmask (unblocking a pending signal delivers it before the
 * call returns), back to back with no branch between the calls: each
 * handler must be placed inside its own call, which the calls' RETURN
 * records make exact. With the argument `die`, the program ends with
 * kill(getpid(), SIGKILL): its trace ends inside that call. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static volatile long hits, work;

static void handler(int s) {
    hits++;
    for (int i = 0; i < s; i++)
        work += i * s;
}

int main(int argc, char **argv) {
    signal(SIGUSR1, handler);
    signal(SIGUSR2, handler);
    pid_t me = getpid();
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    /* The loop's witnesses separate the calls above, which have no RETURN
     * (a signal landing in one of them could not be told from one landing
     * in the next signal-delivering call), from the calls below. */
    for (int i = 0; i < argc + 3; i++)
        work += i;
    kill(me, SIGUSR1);
    kill(me, SIGUSR2);
    sigprocmask(SIG_BLOCK, &set, &old);
    raise(SIGUSR1);
    sigprocmask(SIG_SETMASK, &old, NULL);
    sigprocmask(SIG_BLOCK, &set, NULL);
    kill(me, SIGUSR2);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    raise(SIGUSR2);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    printf("hits %ld work %ld\n", hits, work);
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "die") == 0)
        kill(me, SIGKILL);
    return 0;
}
