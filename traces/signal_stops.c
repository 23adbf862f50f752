/* Signal stops in a debugger: signals delivered at known instructions,
 * so gdb's "Program received signal" stops on a native run and on the
 * trace can be compared. SIGUSR1 by a raw `kill` syscall in the
 * program's own code (delivered on the syscall's return: the interrupted
 * instruction is the next one, traced), SIGUSR2 by raise() (interrupted
 * in libc), SIGSEGV by a store through a null pointer (the faulting
 * instruction interrupted; the handler siglongjmps out). */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static sigjmp_buf env;
static volatile int got[32];
static int *volatile null_ptr;

static void on_signal(int sig) {
    got[sig]++;
    if (sig == SIGSEGV)
        siglongjmp(env, 1);
}

__attribute__((noinline)) static void self_kill(int sig) {
    long pid = getpid(), r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(SYS_kill), "D"(pid), "S"((long)sig) : "rcx", "r11", "memory");
    got[0] += (int)r;
}

__attribute__((noinline)) static void poke(int v) {
    *null_ptr = v;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    sigaction(SIGSEGV, &sa, NULL);
    for (int i = 0; i < 3; i++) {
        self_kill(SIGUSR1);
        raise(SIGUSR2);
    }
    if (sigsetjmp(env, 1) == 0)
        poke(7);
    printf("usr1=%d usr2=%d segv=%d\n", got[SIGUSR1], got[SIGUSR2], got[SIGSEGV]);
    return 0;
}
