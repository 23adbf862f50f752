/* setjmp/longjmp: longjmp out of nested frames back to a setjmp that then
 * "returns twice", repeatedly, plus a sigsetjmp/siglongjmp pair. */
#include <setjmp.h>
#include <stdio.h>

static jmp_buf env;
static sigjmp_buf senv;
static int depth_reached;

__attribute__((noinline)) static void dive(int depth, int limit) {
    depth_reached = depth;
    if (depth >= limit)
        longjmp(env, limit + 1);
    if (depth < 100)
        dive(depth + 1, limit);
    puts("not reached");
}

int main(int argc, char **argv) {
    (void)argv;
    volatile int rounds = 0;
    volatile long sum = 0;
    int r = setjmp(env);
    sum += r;
    if (rounds < 5) {
        rounds++;
        dive(0, rounds * argc + 2);
    }
    if (sigsetjmp(senv, 1) == 0)
        siglongjmp(senv, 7);
    printf("rounds=%d sum=%ld depth=%d\n", rounds, sum, depth_reached);
    return 0;
}
