/* An `int3` in the program itself, caught by a SIGTRAP handler that
 * returns: execution goes on after the int3 (paper 004, Section 4.1: the
 * tracer must tell the program's own trap from its breakpoints and deliver
 * it). The handler runs traced code too. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile int traps;
static volatile long acc;

__attribute__((noinline)) static void note(int sig) { acc = acc * 3 + sig; }

static void on_trap(int sig) {
    traps++;
    note(sig);
}

__attribute__((noinline)) static long work(int n) {
    long s = 0;
    for (int i = 0; i < n; i++) {
        s += i * i;
        if (i % 10 == 0)
            __asm__ volatile("int3");
    }
    return s;
}

int main(int argc, char **argv) {
    (void)argv;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_trap;
    sigaction(SIGTRAP, &sa, NULL);
    long s = work(50 * argc);
    printf("int3: sum=%ld traps=%d acc=%ld\n", s, (int)traps, (long)acc);
    return 0;
}
