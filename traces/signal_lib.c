/* Signals interrupting a traced shared library (signal_lib_lib.c, built by
 * the test as libaesig.so.1), traced across both modules with
 * `aetrace record --libs libaesig.so.1`. Modes:
 *   kill N: the library's loop sends itself SIGUSR1 (handled here, in the
 *           program) by a `syscall` in its own code and SIGUSR2 (handled
 *           in the library) by raise, N iterations;
 *   timer-exe N / timer-lib N: a 20 us interval timer interrupts the
 *           library's hot loop until the handler (here, or in the
 *           library) ran N times; prints handler runs and iterations. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

unsigned long lib_kill_loop(int n, int sig_sys, int sig_raise);
long lib_spin(volatile long *stop, long target, long least, unsigned long *out);
int lib_install(int sig);
long lib_handled_count(void);
volatile long *lib_handled_counter(void);
unsigned long lib_step(unsigned long x, long i);

static volatile long handled;
static volatile unsigned long mix;

static void on_signal(int sig) {
    handled++;
    /* A call back into the library from the handler. */
    mix = lib_step(mix + (unsigned long)sig, handled);
}

static void install(int sig, void (*f)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = f;
    sa.sa_flags = SA_RESTART;
    sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "kill";
    long n = argc > 2 ? atol(argv[2]) : 30;
    if (!strcmp(mode, "kill")) {
        install(SIGUSR1, on_signal);
        lib_install(SIGUSR2);
        unsigned long x = lib_kill_loop((int)n, SIGUSR1, SIGUSR2);
        printf("x=%lu handled=%ld lib_handled=%ld mix=%lu\n", x, handled,
               lib_handled_count(), mix);
        return 0;
    }
    int in_lib = !strcmp(mode, "timer-lib");
    if (!in_lib && strcmp(mode, "timer-exe"))
        return 2;
    if (in_lib)
        lib_install(SIGALRM);
    else
        install(SIGALRM, on_signal);
    struct itimerval it = {{0, 20}, {0, 20}};
    setitimer(ITIMER_REAL, &it, NULL);
    unsigned long x = 0;
    /* The loop polls the counter of the handler that runs. At least
     * 20,000 iterations: at load this kernel delivered all the wanted
     * signals, back to back, before the loop's first iteration. */
    long iters = lib_spin(in_lib ? lib_handled_counter() : &handled, n, 20000, &x);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("handled=%ld iterations=%ld x=%lu\n", in_lib ? lib_handled_count() : handled, iters, x);
    return 0;
}
