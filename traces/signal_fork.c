/* A child signalled right after fork: the parent sends SIGUSR1 to each
 * child as soon as fork returns, after a delay that sweeps across the
 * child's start, so the child's traced handler often runs before the
 * child's own code (inside libc's fork, or inside the runtime's
 * `fork_child`, before the child has a stream of its own). Each
 * child waits for its signal, then exits with status 0; the parent prints
 * how many children it forked. Every child's regenerated trace enters
 * `on_usr1` exactly once, the parent's never. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t handled;

static void on_usr1(int sig) {
    handled += sig == SIGUSR1;
}

__attribute__((noinline)) static unsigned long step(unsigned long x) {
    return x & 1 ? x * 3 + 1 : x >> 1;
}

int main(int argc, char **argv) {
    int children = argc > 1 ? atoi(argv[1]) : 100;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    unsigned long x = 27;
    for (int i = 0; i < children; i++) {
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid == 0) {
            while (!handled)
                x = step(x);
            _exit(handled == 1 ? 0 : 2);
        }
        for (volatile int k = 0; k < (i * 997) % 30000; k++)
            ;
        kill(pid, SIGUSR1);
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            return 3;
    }
    printf("children=%d handled=%d\n", children, (int)handled);
    return 0;
}
