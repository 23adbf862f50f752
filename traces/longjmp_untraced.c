/* longjmp out of qsort's comparator back into a recursion whose every
 * level binds its own jmp_buf at the same setjmp site: the longjmp leaves
 * qsort's (untraced) frames and the levels above `target`. For odd
 * targets the comparator calls `longjmp` by name (a call the rewriter
 * knows); for even ones through a pointer it cannot tell from any other
 * indirect call, so to the trace the longjmp happens inside untraced code.
 * Prints what each setjmp returned and at which level. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

static jmp_buf bufs[8];
static int target;
static int compared;
static void (*volatile jump)(struct __jmp_buf_tag *, int) = longjmp;

static int cmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    if (++compared == 7) {
        if (target & 1)
            longjmp(bufs[target], 40 + target);
        jump(bufs[target], 40 + target);
    }
    return (x > y) - (x < y);
}

__attribute__((noinline)) static int level(int n, int *v, int len)
{
    int r = setjmp(bufs[n]);
    if (r != 0)
        return r * 100 + n;
    if (n == 0) {
        qsort(v, len, sizeof *v, cmp);
        return -1;
    }
    return level(n - 1, v, len) + 1;
}

int main(int argc, char **argv)
{
    int v[16];
    for (int i = 0; i < 16; i++)
        v[i] = (i * 7919) % 31;
    int sum = 0;
    for (target = 0; target < 4; target++) {
        compared = 0;
        int r = level(4 + (argc > 5), v, 16);
        printf("target %d: %d\n", target, r);
        sum += r;
    }
    (void)argv;
    printf("sum %d\n", sum);
    return 0;
}
