/* What one stop of `aetrace verify`'s follower costs, piece by piece, on
 * this machine: the ptrace requests it can make on a stopped tracee
 * (GETREGS, SETREGS, PEEKUSER, POKEUSER) and a whole stop (CONT to the next
 * int3 and waitpid), tracer and tracee pinned to one CPU as `--pin` does.
 * Run by bench/verify.sh; docs/verify.md (Speed) quotes it.
 * Usage: ptrace_cost [N] */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    sched_setaffinity(0, sizeof one, &one);
    pid_t pid = fork();
    if (pid == 0) {
        ptrace(PTRACE_TRACEME, 0, 0, 0);
        raise(SIGSTOP);
        for (;;) __asm__ volatile("int3");
    }
    int st;
    waitpid(pid, &st, 0);
    struct user_regs_struct r;
    size_t rip = offsetof(struct user, regs.rip);
    double t0 = now();
    for (long i = 0; i < n; i++) ptrace(PTRACE_GETREGS, pid, 0, &r);
    double t1 = now();
    for (long i = 0; i < n; i++) ptrace(PTRACE_SETREGS, pid, 0, &r);
    double t2 = now();
    for (long i = 0; i < n; i++) ptrace(PTRACE_PEEKUSER, pid, (void *)rip, 0);
    double t3 = now();
    long v = ptrace(PTRACE_PEEKUSER, pid, (void *)rip, 0);
    for (long i = 0; i < n; i++) ptrace(PTRACE_POKEUSER, pid, (void *)rip, (void *)v);
    double t4 = now();
    /* A whole stop: CONT to the next int3 and wait, the floor under any
     * request mix. */
    for (long i = 0; i < n; i++) {
        ptrace(PTRACE_CONT, pid, 0, 0);
        waitpid(pid, &st, 0);
    }
    double t5 = now();
    printf("GETREGS %.2f us  SETREGS %.2f us  PEEKUSER %.2f us  POKEUSER %.2f us  CONT+wait (a stop) %.2f us\n",
           (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6, (t3 - t2) / n * 1e6, (t4 - t3) / n * 1e6,
           (t5 - t4) / n * 1e6);
    printf("jcc stop by GETREGS+SETREGS: %.2f us of requests; by PEEKUSER rip,eflags + POKEUSER rip: %.2f us\n",
           (t1 - t0 + t2 - t1) / n * 1e6, (2 * (t3 - t2) + (t4 - t3)) / n * 1e6);
    kill(pid, SIGKILL);
    return 0;
}
