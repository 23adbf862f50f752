/* raw_clone: tasks created by the clone system call itself, not through
 * pthread_create or fork(), in the ways a program makes them.
 * A thread on a stack of its own: inline `syscall` instructions (`asm`),
 * libc's `syscall(SYS_clone, ...)` (`clone`) and `syscall(SYS_clone3,
 * ...)` (`clone3`). It shares the address space, files and signal
 * handlers but not the TLS (no CLONE_SETTLS: it runs on its creator's
 * TCB, so it calls nothing that uses errno or TLS), sums a range into
 * `result` and exits; its creator waits for its exit (CLONE_CHILD_CLEARTID
 * and one FUTEX_WAIT, no loop, inline: each thread's instructions do not
 * depend on the scheduling) and prints the sum. Through libc's `syscall()` the new
 * thread returns on its own stack, into `child` (whose address the
 * creator put at the stack's top).
 * A process that returns from libc's `syscall()` where its parent does:
 * `syscall(SYS_fork)` (`fork`), `syscall(SYS_clone, SIGCHLD, 0)`
 * (`clone-fork`) and clone3 with exit signal SIGCHLD and no stack
 * (`clone3-fork`). The child prints its sum and exits; the parent waits
 * for it, then prints its status. */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <linux/sched.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define FLAGS                                                                  \
    (CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD |         \
     CLONE_SYSVSEM | CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID)
#define STACK (64 * 1024)

static char stack[STACK] __attribute__((aligned(16)));
static volatile int tid_word; /* cleared (and woken) by the thread's exit */
static long bound = 1000;
static volatile long result;

__attribute__((noinline)) static long sum(long n) {
    long s = 0;
    for (long i = 0; i < n; i++)
        s += i % 3 == 0 ? i : 1;
    return s;
}

/* The thread's work; then it exits (the thread only: SYS_exit). */
__attribute__((noinline, noreturn)) static void child(void) {
    result = sum(bound);
    syscall(SYS_exit, 0);
    __builtin_unreachable();
}

/* The clone system call in this program's own code: the new thread calls
 * `child` on its own stack. */
__attribute__((noinline)) static long clone_asm(void) {
    register long r10 __asm__("r10") = (long)&tid_word;
    register long r8 __asm__("r8") = 0;
    register void (*fn)(void) __asm__("r12") = child;
    long ret;
    __asm__ volatile("syscall\n\t"
                     "test %%rax, %%rax\n\t"
                     "jnz 1f\n\t"
                     "call *%%r12\n\t"
                     "1:"
                     : "=a"(ret)
                     : "0"((long)SYS_clone), "D"((long)FLAGS), "S"(stack + STACK),
                       "d"(&tid_word), "r"(r10), "r"(r8), "r"(fn)
                     : "rcx", "r11", "memory");
    return ret;
}

/* libc's `syscall()` returns in the new thread with `ret` on its new
 * stack: to `child`, whose address is at the top (after that `ret` the
 * stack is as a call would leave it). */
static char *top_with_child(void) {
    char *top = stack + STACK - 16;
    void (*fn)(void) = child;
    memcpy(top, &fn, sizeof fn);
    return top;
}

static long clone_syscall(void) {
    return syscall(SYS_clone, (long)FLAGS, top_with_child(), &tid_word, &tid_word, 0L);
}

static long clone3_syscall(void) {
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = FLAGS & ~(uint64_t)0xff;
    args.parent_tid = (uintptr_t)&tid_word;
    args.child_tid = (uintptr_t)&tid_word;
    args.stack = (uintptr_t)stack;
    args.stack_size = (uintptr_t)(top_with_child() - stack);
    return syscall(SYS_clone3, &args, sizeof args);
}

/* One FUTEX_WAIT for the thread's exit, which clears `tid_word` and wakes
 * it; at once (EAGAIN) when the thread has exited already. Inline, so that
 * no instruction depends on which (libc's `syscall()` branches on it). */
static void wait_for_exit(int tid) {
    register long r10 __asm__("r10") = 0;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"((long)SYS_futex), "D"(&tid_word), "S"((long)FUTEX_WAIT),
                       "d"((long)tid), "r"(r10)
                     : "rcx", "r11", "memory");
    (void)ret;
}

/* The three ways of making a process through libc's `syscall()`. */
static long fork_syscall(const char *how) {
    if (strcmp(how, "fork") == 0)
        return syscall(SYS_fork);
    if (strcmp(how, "clone-fork") == 0)
        return syscall(SYS_clone, (long)SIGCHLD, 0L, NULL, NULL, 0L);
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.exit_signal = SIGCHLD;
    return syscall(SYS_clone3, &args, sizeof args);
}

static int process(const char *how) {
    long pid = fork_syscall(how);
    if (pid < 0) {
        perror(how);
        return 1;
    }
    if (pid == 0) {
        printf("%s child: sum %ld\n", how, sum(bound));
        exit(0);
    }
    int status;
    if (waitpid((pid_t)pid, &status, 0) != pid)
        return 1;
    printf("%s: child status %d\n", how, status);
    return 0;
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "asm";
    long tid;
    if (strcmp(how, "asm") == 0)
        tid = clone_asm();
    else if (strcmp(how, "clone") == 0)
        tid = clone_syscall();
    else if (strcmp(how, "clone3") == 0)
        tid = clone3_syscall();
    else if (!strcmp(how, "fork") || !strcmp(how, "clone-fork") || !strcmp(how, "clone3-fork"))
        return process(how);
    else {
        fprintf(stderr, "usage: raw_clone [asm|clone|clone3|fork|clone-fork|clone3-fork]\n");
        return 2;
    }
    if (tid <= 0) {
        perror("clone");
        return 1;
    }
    wait_for_exit((int)tid);
    printf("%s: thread sum %ld\n", how, result);
    return 0;
}
