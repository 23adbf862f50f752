/* Signals the kernel sends on its own, at fixed points: SIGCHLD when a
 * child exits (si_code CLD_EXITED) and SIGALRM from an interval timer
 * (si_code SI_KERNEL). Both are blocked except inside sigsuspend, so each
 * handler runs at the same instruction in every run: a single-stepped run
 * and a recorded one can be compared instruction for instruction. Neither
 * signal is raised by an instruction, so the instruction the kernel stops
 * before runs once, after the handler. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile int children, alarms;

static void on_child(int sig) { children += sig == SIGCHLD; }
static void on_alarm(int sig) { alarms += sig == SIGALRM; }

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_child;
    sigaction(SIGCHLD, &sa, NULL);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    sigset_t block, open;
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGALRM);
    sigprocmask(SIG_BLOCK, &block, &open);
    int statuses = 0;
    for (int i = 0; i < 3; i++) {
        pid_t child = fork();
        if (child == 0)
            _exit(i);
        while (children <= i)
            sigsuspend(&open);
        int st;
        waitpid(child, &st, 0);
        statuses += WEXITSTATUS(st);
        struct itimerval once = {{0, 0}, {0, 1000}};
        setitimer(ITIMER_REAL, &once, NULL);
        while (alarms <= i)
            sigsuspend(&open);
    }
    printf("children=%d alarms=%d statuses=%d\n", children, alarms, statuses);
    return 0;
}
