/* setjmp calls whose SETJMP record is the first thing their procedure
 * writes: main calls `parse` and then `run`, each of which calls sigsetjmp
 * before any witness (the record follows main's call at once), the second
 * on a jmp_buf at the address the first one used, right after an import
 * call (`strlen`); each longjmps back from a callee, the first time
 * through an import bound lazily on that call (`__longjmp_chk` when built
 * with optimisation: _FORTIFY_SOURCE), as perl does once, at its exit. */
#if defined(__OPTIMIZE__) && !defined(_FORTIFY_SOURCE)
#define _FORTIFY_SOURCE 2
#endif
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

static sigjmp_buf *top;

__attribute__((noinline)) static void bail(int v)
{
    siglongjmp(*top, v);
}

__attribute__((noinline)) int parse(int n)
{
    sigjmp_buf b;
    top = &b;
    int r = sigsetjmp(b, 0);
    if (r == 0 && n > 0)
        bail(1);
    return r + n;
}

__attribute__((noinline)) int run(int n, const char *name)
{
    sigjmp_buf b;
    size_t len = strlen(name);
    top = &b;
    int r = sigsetjmp(b, 0);
    if (r == 0) {
        if (n + len > 0)
            bail(2);
        return 0;
    }
    return r + 10;
}

int main(int argc, char **argv)
{
    int a = parse(argc);
    int b = run(argc, argv[0]);
    printf("parse=%d run=%d\n", a, b);
    return 0;
}
