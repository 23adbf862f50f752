/* fork through a wrapper that tail-jumps to it, as perl's Perl_my_fork
 * does (`jmp fork@plt` at -O2): the call of the wrapper returns twice,
 * and the child must get its own stream there. Each child then leaves
 * by longjmp to a jmp_buf its parent set before forking (perl's `exit`
 * in a forked child does this), and the parent waits for it. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static jmp_buf top;

__attribute__((noinline)) pid_t my_fork(void) {
    return fork();
}

__attribute__((noinline)) static void child_work(int i) {
    long x = i;
    for (int k = 0; k < 100 + 37 * i; k++)
        x = x * 5 + (x >> 3) + k;
    printf("child %d: %ld\n", i, x & 0xffff);
    fflush(stdout);
    longjmp(top, i + 1);
}

int main(void) {
    int r = setjmp(top);
    if (r) {
        /* In a child, back at the parent's setjmp. */
        _exit(0);
    }
    for (int i = 0; i < 3; i++) {
        pid_t pid = my_fork();
        if (pid < 0)
            return 1;
        if (pid == 0)
            child_work(i);
        waitpid(pid, NULL, 0);
    }
    printf("parent done\n");
    return 0;
}
