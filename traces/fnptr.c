/* Indirect calls through function pointers: a table of operations, a
 * struct-of-callbacks "vtable", and a pointer passed down as an argument. */
#include <stdio.h>

typedef long (*op_fn)(long, long);

static long add(long a, long b) { return a + b; }
static long sub(long a, long b) { return a - b; }
static long mul(long a, long b) { return a * b; }
static long mix(long a, long b) { return (a ^ b) + (a & 7); }

struct ops {
    op_fn combine;
    void (*report)(const char *, long);
};

static void report_plain(const char *what, long v) { printf("%s=%ld\n", what, v); }

static __attribute__((noinline)) long fold(const long *v, int n, op_fn f, long init) {
    for (int i = 0; i < n; i++)
        init = f(init, v[i]);
    return init;
}

int main(int argc, char **argv) {
    (void)argv;
    op_fn table[] = {add, sub, mul, mix};
    long v[8];
    for (int i = 0; i < 8; i++)
        v[i] = i * argc + 1;
    struct ops o = {table[argc % 4], report_plain};
    for (int k = 0; k < 4; k++)
        o.report("fold", fold(v, 8, table[(k + argc) % 4], k));
    o.report("combine", o.combine(40, 2));
    return 0;
}
