/* Read, write and access watchpoints (issue 22): a global and a heap
 * cell, read and written through a pointer, in `main`'s loop and in a
 * callee, each access its own instruction at -O0. Every write changes
 * the value (x86 has no read-only watchpoint: natively gdb takes a write
 * that keeps the value for a read). The cell's address is printed (the
 * trace has no heap to read it from). libc never touches the cell (it
 * is not freed: free would write into it). */
#include <stdio.h>
#include <stdlib.h>

long g;
long sink;

__attribute__((noinline)) static long bump(long *cell, long k) {
    long v = *cell;
    *cell = v + k + 1;
    return g + v;
}

int main(void) {
    long *p = malloc(sizeof *p);
    *p = 1;
    printf("cell %p\n", (void *)p);
    fflush(stdout);
    for (long i = 0; i < 6; i++) {
        g += i + 1;
        sink += *p;
        sink += bump(p, i);
        if (i & 1)
            g = sink + 1;
        *p += g + 1;
    }
    printf("%ld %ld %ld\n", g, *p, sink);
    return 0;
}
