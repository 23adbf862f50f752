/* A shared library for signal_lib.c (built by the test as libaesig.so.1):
 * signals that interrupt the library's own traced code. `lib_kill_loop`
 * sends signals to itself with inline `syscall`s in the middle of a loop
 * (delivered as the system call returns, so the interrupted rip is inside
 * the library's instrumented copy) and with `raise` (inside libc);
 * `lib_spin` is a hot loop for an interval timer to interrupt anywhere,
 * instrumentation included. One handler lives here (`lib_on_signal`), the
 * other in the program. */
#include <signal.h>
#include <string.h>

static volatile long lib_handled;
static volatile unsigned long lib_mix;

static long sys2(long nr, long a, long b) {
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "0"(nr), "D"(a), "S"(b) : "rcx", "r11", "memory");
    return r;
}

static void lib_on_signal(int sig) {
    lib_handled++;
    lib_mix = lib_mix * 7 + (unsigned long)sig;
}

long lib_handled_count(void) { return lib_handled; }

volatile long *lib_handled_counter(void) { return &lib_handled; }

int lib_install(int sig) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = lib_on_signal;
    sa.sa_flags = SA_RESTART;
    return sigaction(sig, &sa, 0);
}

__attribute__((noinline)) unsigned long lib_step(unsigned long x, long i) {
    if (x & 1)
        x = x * 3 + 1;
    else
        x >>= 1;
    if ((i & 7) == 3)
        x += (unsigned long)i;
    return x;
}

/* `n` iterations; at some of them a signal to this process: `sig_sys`
 * by kill(2) issued from here, `sig_raise` by raise(3). */
unsigned long lib_kill_loop(int n, int sig_sys, int sig_raise) {
    unsigned long x = 27;
    long pid = sys2(39 /* getpid */, 0, 0);
    for (int i = 0; i < n; i++) {
        x = lib_step(x, i);
        if (i % 5 == 2)
            sys2(62 /* kill */, pid, sig_sys);
        if (i % 7 == 4)
            raise(sig_raise);
        if (x & 4)
            x ^= (unsigned long)i << 3;
    }
    return x;
}

/* Iterates until `*stop` reaches `target` and at least `least` times;
 * the iteration count. */
long lib_spin(volatile long *stop, long target, long least, unsigned long *out) {
    unsigned long x = 27;
    long iters = 0;
    while (*stop < target || iters < least) {
        x = lib_step(x, iters);
        iters++;
    }
    *out = x;
    return iters;
}
