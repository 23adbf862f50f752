/* Signals: a SIGUSR1 handler installed with sigaction and triggered
 * synchronously with raise(), interrupting the program between frames,
 * and a SIGALRM-free SIGUSR2 handler that modifies global state. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile sig_atomic_t hits;
static volatile sig_atomic_t last;

static void on_usr1(int sig) {
    hits++;
    last = sig;
}

static void on_usr2(int sig) { last = sig * 100 + hits; }

__attribute__((noinline)) static long busy(int n) {
    long s = 0;
    for (int i = 0; i < n; i++) {
        s += i;
        if (i % 100 == 0)
            raise(SIGUSR1);
    }
    return s;
}

int main(int argc, char **argv) {
    (void)argv;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = on_usr2;
    sigaction(SIGUSR2, &sa, NULL);
    long s = busy(1000 * argc);
    raise(SIGUSR2);
    printf("sum=%ld hits=%d last=%d\n", s, (int)hits, (int)last);
    return 0;
}
