/* Signal handlers that resume after the instruction that trapped (issue 23:
 * the traced program must compute as the native one; issue 21: its data
 * trace too). A SIGILL handler skips `ud2` (REG_RIP += 2) in a loop whose
 * code after the trap reads what the code before it stored; a SIGTRAP
 * handler returns after `int3`; a SIGSEGV handler skips `hlt` (1 byte,
 * a general protection fault in user mode). With an argument the run
 * skips `hlt` instead of returning after `int3`: valgrind raises SIGILL
 * for `hlt`, and single-stepping a SIGTRAP handler makes the kernel reset
 * it (a step's trap while SIGTRAP is blocked), so lackey checks the run
 * without an argument and the native single-stepped run the other. The
 * sums printed depend on every register the loops keep live across the
 * traps. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>

static long a[64];
static volatile int ills, traps, segvs;

static void on_ill(int sig, siginfo_t *si, void *p) {
    (void)sig;
    (void)si;
    ((ucontext_t *)p)->uc_mcontext.gregs[REG_RIP] += 2;
    ills++;
}

static void on_trap(int sig) {
    (void)sig;
    traps++;
}

static void on_segv(int sig, siginfo_t *si, void *p) {
    (void)sig;
    (void)si;
    ((ucontext_t *)p)->uc_mcontext.gregs[REG_RIP] += 1;
    segvs++;
}

static void handle(int sig, void (*h)(int, siginfo_t *, void *)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = h;
    sa.sa_flags = SA_SIGINFO;
    sigaction(sig, &sa, NULL);
}

__attribute__((noinline)) static long ill_loop(int n) {
    long s = 0;
    for (int i = 0; i < n; i++) {
        a[i * 3] = i;
        __asm__ volatile("ud2" ::: "memory");
        s += a[i * 3 + 1] + a[i];
    }
    return s;
}

__attribute__((noinline)) static long trap_loop(int n) {
    long s = 1;
    for (int i = 0; i < n; i++) {
        a[i + 20] = s;
        __asm__ volatile("int3" ::: "memory");
        s = s * 3 + a[i + 19] + i;
    }
    return s;
}

__attribute__((noinline)) static long hlt_loop(int n) {
    long s = 2;
    for (int i = 0; i < n; i++) {
        a[40 + i] = s + i;
        __asm__ volatile("hlt" ::: "memory");
        s += a[40 + i] * 2 + a[39 + i];
    }
    return s;
}

int main(int argc, char **argv) {
    (void)argv;
    handle(SIGILL, on_ill);
    handle(SIGSEGV, on_segv);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_trap;
    sigaction(SIGTRAP, &sa, NULL);
    for (int i = 0; i < 64; i++)
        a[i] = i * 7 % 11;
    int stepped = argc > 1;
    long s = ill_loop(5);
    long t = stepped ? 0 : trap_loop(4);
    long h = stepped ? hlt_loop(3) : 0;
    printf("trap_resume: ill %ld (%d) trap %ld (%d) hlt %ld (%d)\n", s, ills, t, traps, h,
           segvs);
    return 0;
}
