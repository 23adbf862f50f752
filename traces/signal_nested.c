/* Nested signal handlers: the SIGUSR1 handler raises SIGUSR2 (whose
 * handler calls a traced function) before and after its own work; SIGUSR1
 * is not blocked in its own handler (SA_NODEFER) and re-raises itself
 * once, so three handler frames are active at the deepest point. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile int depth, max_depth, log_[64], n_log;

__attribute__((noinline)) static void note(int v) {
    if (n_log < 64)
        log_[n_log++] = v;
}

static void on_usr2(int sig) {
    depth++;
    if (depth > max_depth)
        max_depth = depth;
    note(sig);
    depth--;
}

static void on_usr1(int sig) {
    static int again;
    depth++;
    note(sig * 10 + depth);
    raise(SIGUSR2);
    if (!again) {
        again = 1;
        raise(SIGUSR1);
    }
    note(-sig);
    depth--;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_NODEFER;
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = on_usr2;
    sa.sa_flags = 0;
    sigaction(SIGUSR2, &sa, NULL);
    for (int i = 0; i < 3; i++)
        raise(SIGUSR1);
    int sum = 0;
    for (int i = 0; i < n_log; i++)
        sum = sum * 3 + log_[i];
    printf("entries=%d max_depth=%d sum=%d\n", n_log, max_depth, sum);
    return 0;
}
