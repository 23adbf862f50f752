/* Faults in traced code recovered with siglongjmp: stores through a null
 * pointer (SIGSEGV), one after a loop in the faulting procedure; the
 * handler calls a traced function, then jumps back to the sigsetjmp point.
 * (Loads and divisions fault the same way, but valgrind lackey loses the
 * instructions of a superblock that faults on them, so only stores are
 * compared with it; see docs/regen.md.) */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

static sigjmp_buf env;
static volatile int faults, last_sig;
static int *volatile null_ptr;

__attribute__((noinline)) static void record_fault(int sig) {
    faults++;
    last_sig = sig;
}

static void on_fault(int sig) {
    record_fault(sig);
    siglongjmp(env, sig);
}

__attribute__((noinline)) static int poke(int v) {
    *null_ptr = v; /* SIGSEGV */
    return v;
}

__attribute__((noinline)) static int fill(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s += i * n;
    null_ptr[n] = s; /* SIGSEGV */
    return s;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sigaction(SIGSEGV, &sa, NULL);
    int got = 0;
    for (int i = 0; i < 4; i++) {
        int r = sigsetjmp(env, 1);
        if (r == 0) {
            if (i % 2)
                got += fill(i);
            else
                got += poke(i);
        } else {
            got += r;
        }
    }
    printf("faults=%d last=%d got=%d\n", faults, last_sig, got);
    return 0;
}
