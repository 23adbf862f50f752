/* The program's own `int3` as the first instruction after a call returns,
 * in the middle of a block (`int3; nop`), caught by a SIGTRAP handler that
 * returns. The first trap comes right after the lazily bound `sigaction`
 * returns, before the program writes anything: the trace's SIGNAL is the
 * next item after the jump into the dynamic linker's resolver. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile int traps;

static void on_trap(int sig) { traps += sig; }

__attribute__((noinline)) static int twice(int n) {
    __asm__ volatile("int3; nop");
    return 2 * n + traps;
}

int main(int argc, char **argv) {
    (void)argv;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_trap;
    sigaction(SIGTRAP, &sa, NULL);
    __asm__ volatile("int3; nop");
    int s = 0;
    for (int i = 0; i < 3 * argc; i++)
        s += twice(i);
    printf("int3_after_call: traps=%d s=%d\n", traps / SIGTRAP, s);
    return 0;
}
