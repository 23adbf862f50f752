/* A SIGSEGV handler that moves the interrupted rip past a faulting load
 * (issue 23: the traced program must compute as the native one; issue 21:
 * its data trace too). `load` is `mov $0, %eax; mov (%rdi), %rax; ret`
 * (the `mov` past the first 5 bytes, which a traced procedure's
 * springboard overwrites); the handler checks the bytes at REG_RIP are
 * that `mov` and adds its length, 3. Six calls, three on a pointer that faults. Modes:
 *   skip     the skipped load leaves rax 0: prints the sum of the good ones;
 *   emulate  the handler also sets REG_RAX (100), as if the load read it;
 *   bt       the handler also counts the frames `backtrace()` finds and
 *            where the signal frame's pc is, relative to `load`.
 * Every line it prints is the native run's when the handler sees the
 * native rip and the thread resumes where the handler says. */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

long load(long *p);
__asm__(".text\n"
        ".globl load\n"
        ".type load, @function\n"
        "load:\n"
        ".cfi_startproc\n"
        "  mov $0, %eax\n"
        "  mov (%rdi), %rax\n"
        "  ret\n"
        ".cfi_endproc\n"
        ".size load, .-load\n");

static int emulate, bt;
static volatile int faults, frames;
static volatile long at_load = -1, frame_at = -1;

static void on_segv(int sig, siginfo_t *si, void *p) {
    (void)sig;
    (void)si;
    greg_t *g = ((ucontext_t *)p)->uc_mcontext.gregs;
    const unsigned char *rip = (const unsigned char *)g[REG_RIP];
    at_load = (long)((uintptr_t)rip - (uintptr_t)load);
    if (rip[0] != 0x48 || rip[1] != 0x8b || rip[2] != 0x07) {
        static const char m[] = "skip_fault: not the load at REG_RIP\n";
        write(2, m, sizeof m - 1);
        _exit(3);
    }
    if (bt) {
        void *f[64];
        int n = backtrace(f, 64);
        frames = n;
        for (int i = 0; i < n; i++)
            if ((uintptr_t)f[i] - (uintptr_t)load < 16) {
                frame_at = (long)((uintptr_t)f[i] - (uintptr_t)load);
                break;
            }
    }
    g[REG_RIP] += 3;
    if (emulate)
        g[REG_RAX] = 100;
    faults++;
}

__attribute__((noinline)) static long run(long **ps, int n) {
    long s = 0;
    for (int i = 0; i < n; i++)
        s += load(ps[i]);
    return s;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "skip";
    emulate = !strcmp(mode, "emulate");
    bt = !strcmp(mode, "bt");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    static long a = 5, b = 13, c = 18;
    long *ps[6] = {&a, NULL, &b, (long *)16, &c, NULL};
    long s = run(ps, 6);
    printf("sum %ld, %d faults, the handler saw load+%ld\n", s, faults, at_load);
    if (bt)
        printf("backtrace: %d frames, the signal frame at load+%ld\n", frames, frame_at);
    return 0;
}
