/* Asynchronous signals: a 20 us setitimer(ITIMER_REAL) delivers SIGALRM
 * while a hot loop runs in traced code, so handlers interrupt the loop at
 * any instruction, witness writes included. The program prints how many
 * times the handler ran and how many iterations the loop made (each
 * iteration calls `step` once): the regenerated trace must hold the
 * handler's and `step`'s entries exactly that many times. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

static volatile long handled;
static volatile unsigned long mix;

static void on_alarm(int sig) {
    handled++;
    mix ^= (unsigned long)sig << (handled & 15);
}

__attribute__((noinline)) static unsigned long step(unsigned long x, long i) {
    if (x & 1)
        x = x * 3 + 1;
    else
        x >>= 1;
    if ((i & 7) == 3)
        x += i;
    return x;
}

int main(void) {
    const long target = 300;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 20}, {0, 20}};
    setitimer(ITIMER_REAL, &it, NULL);
    unsigned long x = 27;
    long iters = 0;
    /* At least 20,000 iterations: at load a kernel may deliver the wanted
     * signals back to back before the loop ran much (signal_lib.c). */
    while (handled < target || iters < 20000) {
        x = step(x, iters);
        iters++;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("handled=%ld iterations=%ld x=%lu mix=%lu\n", handled, iters, x, mix);
    return 0;
}
