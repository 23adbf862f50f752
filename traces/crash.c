/* A run that a signal ends, chosen by argv[1]: "segv" stores through a
 * null pointer, "fpe" divides by zero, "abort" calls abort(), "ill"
 * executes ud2, "trap" executes int3 (not under a debugger), "bus"
 * stores into a shared mapping past the end of its (empty) file; "handler" stores through a null pointer under its own
 * SIGSEGV handler, which siglongjmps back, then ends normally; "sleep"
 * ends normally after about 100 ms, sleeping 10 ms
 * every 300 steps of its work (a test kills it with SIGKILL from outside
 * at a random moment). Each does the same work first and prints its
 * result, so the trace has something to end after. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

static int *volatile null_ptr;
static volatile int zero;

__attribute__((noinline)) static unsigned step(unsigned s, int i) {
    if (i % 3 == 0)
        s = s * 2654435761u + (unsigned)i;
    else if (i % 3 == 1)
        s ^= s >> 7;
    else
        s += (unsigned)i * 40503u;
    return s;
}

static sigjmp_buf recover;

static void on_segv(int sig) {
    siglongjmp(recover, sig);
}

/* Its own SIGSEGV handler: the fault is survived, as natively. */
__attribute__((noinline)) static void survive(unsigned s) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_segv;
    sigaction(SIGSEGV, &sa, NULL);
    int got = sigsetjmp(recover, 1);
    if (got == 0)
        *null_ptr = (int)s;
    printf("recovered from signal %d\n", got);
}

__attribute__((noinline)) static void crash(const char *how, unsigned s) {
    if (strcmp(how, "segv") == 0)
        *null_ptr = (int)s;
    else if (strcmp(how, "fpe") == 0)
        printf("%d\n", (int)s / zero);
    else if (strcmp(how, "abort") == 0)
        abort();
    else if (strcmp(how, "handler") == 0)
        survive(s);
    else if (strcmp(how, "ill") == 0)
        __builtin_trap();
    else if (strcmp(how, "trap") == 0)
        __asm__ volatile("int3");
    else if (strcmp(how, "bus") == 0) {
        FILE *f = tmpfile();
        char *p = f ? mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fileno(f), 0)
                    : MAP_FAILED;
        if (p != MAP_FAILED)
            p[0] = (char)s;
    }
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "segv";
    int sleepy = strcmp(how, "sleep") == 0;
    unsigned s = 1;
    /* A tenth of the work when stepped through by a test's oracle. */
    for (int i = 0; i < (sleepy ? 3000 : 300); i++) {
        if (sleepy && i % 300 == 0)
            usleep(10000);
        s = step(s, i);
    }
    printf("s=%u\n", s);
    fflush(stdout);
    crash(how, s);
    return 0;
}
