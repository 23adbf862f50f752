/* A small shared library for shlib_callback.c: exported functions the
 * program calls through its PLT, callbacks into the program (a comparator,
 * an allocator hook, a visitor), calls between the library's own exported
 * functions (through the library's PLT: semantic interposition), a
 * constructor that ld.so runs before main, an exported IFUNC whose resolver
 * ld.so runs while relocating the program (before any runtime exists), and
 * calls into libc. */
#include <stdio.h>
#include <stdlib.h>

static int ready;
static void *(*alloc_hook)(size_t);

__attribute__((constructor)) static void lib_init(void) { ready = 42; }

void lib_set_alloc(void *(*f)(size_t)) { alloc_hook = f; }

/* Insertion sort calling back into the program for every comparison. */
void lib_sort(int *a, int n, int (*cmp)(int, int)) {
    for (int i = 1; i < n; i++) {
        int v = a[i], j = i - 1;
        while (j >= 0 && cmp(a[j], v) > 0) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = v;
    }
}

/* Copies through the program's allocator, then sorts (an exported function
 * calling another one). */
int *lib_sorted_copy(const int *a, int n, int (*cmp)(int, int)) {
    int *c = alloc_hook ? alloc_hook(n * sizeof *c) : malloc(n * sizeof *c);
    for (int i = 0; i < n; i++)
        c[i] = a[i];
    lib_sort(c, n, cmp);
    return c;
}

long lib_visit(const int *a, int n, long (*visit)(int, long)) {
    long acc = ready;
    for (int i = 0; i < n; i++)
        acc = visit(a[i], acc);
    return acc;
}

void lib_report(const char *what, long v) { printf("%s: %ld\n", what, v); }

static long twice(long v) { return 2 * v; }
static long thrice(long v) { return 3 * v; }

/* The resolver: ld.so calls it, not the program. */
static long (*resolve_pick(void))(long) { return ready == 42 ? thrice : twice; }
long lib_pick(long) __attribute__((ifunc("resolve_pick")));
