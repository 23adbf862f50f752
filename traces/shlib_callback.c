/* Calls into its own shared library (shlib_callback_lib.c, built by the
 * test as libaecb.so.1) which calls back into the program: traced across
 * both modules with `aetrace record --libs libaecb.so.1`. */
#include <stdio.h>
#include <stdlib.h>

void lib_set_alloc(void *(*f)(size_t));
void lib_sort(int *a, int n, int (*cmp)(int, int));
int *lib_sorted_copy(const int *a, int n, int (*cmp)(int, int));
long lib_visit(const int *a, int n, long (*visit)(int, long));
void lib_report(const char *what, long v);
long lib_pick(long v);

/* Its address, taken here, is bound when ld.so relocates the program. */
long (*volatile pick)(long) = lib_pick;

static long compares, allocs;

static int ascending(int x, int y) {
    compares++;
    return (x > y) - (x < y);
}

static int descending(int x, int y) { return ascending(y, x); }

static void *counting_alloc(size_t n) {
    allocs++;
    return malloc(n);
}

static long mix(int v, long acc) { return acc * 31 + (v & 1 ? v : -v); }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 200;
    int *a = malloc(n * sizeof *a);
    unsigned s = 12345;
    for (int i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        a[i] = (int)(s >> 16) % 1000;
    }
    lib_set_alloc(counting_alloc);
    int *up = lib_sorted_copy(a, n, ascending);
    lib_sort(a, n, descending);
    for (int i = 0; i < n; i++)
        if (a[i] != up[n - 1 - i])
            return 3;
    lib_report("compares", compares);
    lib_report("allocs", allocs);
    printf("mix: %ld\n", lib_visit(up, n, mix));
    printf("pick: %ld\n", pick(n) + lib_pick(1));
    free(up);
    free(a);
    return 0;
}
