/* bench/sigcost.sh: N SIGUSR1s raised in a loop, each handled by a traced
 * SA_SIGINFO handler (docs/runtime.md section 5, the cost per handled
 * signal). Prints the handled count, so a run that lost one is seen. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile long handled;

static void on_usr1(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)si;
    (void)uc;
    handled++;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_usr1;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGUSR1, &sa, NULL);
    for (long i = 0; i < n; i++)
        raise(SIGUSR1);
    printf("handled %ld\n", handled);
    return handled != n;
}
