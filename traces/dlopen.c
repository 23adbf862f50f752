/* Loads its library (dlopen_lib.c, built by the test as libaedl.so.1)
 * with dlopen by name, calls into it and is called back, closes it and
 * opens it again: traced with `aetrace record --libs libaedl.so.1`.
 * With the argument `move`, the library's old load address is occupied
 * before the second dlopen, so the second load lands elsewhere (the
 * recorder refuses that run: one load address per module). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

static long squares;

static long square(int v) {
    squares++;
    return (long)v * v % 1000;
}

static int use(void *h, const int *a, int n) {
    long (*sum)(const int *, int) = (long (*)(const int *, int))dlsym(h, "dl_sum");
    long (*apply)(const int *, int, long (*)(int)) =
        (long (*)(const int *, int, long (*)(int)))dlsym(h, "dl_apply");
    int (*calls)(void) = (int (*)(void))dlsym(h, "dl_calls");
    if (!sum || !apply || !calls)
        return 1;
    long x = sum(a, n);
    long y = apply(a, n, square);
    printf("sum %ld apply %ld calls %d\n", x, y, calls());
    return 0;
}

static unsigned long base(void *h) {
    struct link_map *m = NULL;
    return dlinfo(h, RTLD_DI_LINKMAP, &m) == 0 && m ? m->l_addr : 0;
}

int main(int argc, char **argv) {
    int move = argc > 1 && strcmp(argv[1], "move") == 0;
    int a[64];
    unsigned s = 777;
    for (int i = 0; i < 64; i++) {
        s = s * 1103515245u + 12345u;
        a[i] = (int)(s >> 16) % 500;
    }
    void *h = dlopen("libaedl.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    if (use(h, a, 40))
        return 3;
    unsigned long first = base(h);
    dlclose(h);
    if (move && mmap((void *)first, 4096, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) == MAP_FAILED)
        return 4;
    h = dlopen("libaedl.so.1", RTLD_NOW);
    if (!h)
        return 5;
    if (use(h, a, 64))
        return 6;
    printf("second load %s\n", base(h) == first ? "at the same address" : "moved");
    dlclose(h);
    printf("squares %ld\n", squares);
    return 0;
}
