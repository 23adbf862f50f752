/* Entries from untraced code as the whole run: libc's qsort calls a
 * one-line comparator 3,298,734 times for 200,000 ints (the control-only
 * recording's cost of each entry's rsp, docs/format.md 1.21). */
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int main(void) {
    enum { N = 200000 };
    static int v[N];
    for (unsigned i = 0; i < N; i++)
        v[i] = (int)((i * 2654435761u) % 1000003u);
    qsort(v, N, sizeof v[0], cmp);
    printf("%d %d %d\n", v[0], v[N / 2], v[N - 1]);
    return 0;
}
