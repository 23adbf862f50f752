/* A SIGALRM handler that calls exit while main loops: the interrupted
 * frame is abandoned inside whatever block the timer struck, which no
 * edge count can describe (aetrace profile warns, naming the handler).
 * Prints the loop's iterations on its third signal and exits with 7. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>

static volatile unsigned long iters, acc;
static volatile int fired;

static void on_alarm(int sig) {
    (void)sig;
    if (++fired == 3) {
        printf("iters=%lu\n", iters);
        exit(7);
    }
}

__attribute__((noinline)) static unsigned long step(unsigned long x) {
    return x * 2654435761u + 1;
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, 0);
    struct itimerval t = {{0, 2000}, {0, 2000}};
    setitimer(ITIMER_REAL, &t, 0);
    unsigned long x = 1;
    for (;;) {
        x = step(x);
        if (x & 1)
            acc += x;
        else
            acc ^= x;
        iters++;
    }
}
