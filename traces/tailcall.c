/* Tail calls: at -O2/-O3 gcc turns these `return f(...)` into jumps to
 * another procedure's entry (sibling calls), including mutual tail recursion
 * and a tail call through a function pointer. */
#include <stdio.h>

static long depth_total;

__attribute__((noinline)) long leaf(long x) {
    depth_total += x;
    return x * 2 + 1;
}

__attribute__((noinline)) long middle(long x, long y) { return leaf(x + y); }

static long ping(long n, long acc);
__attribute__((noinline)) long pong(long n, long acc) {
    if (n <= 0)
        return acc;
    return ping(n - 1, acc + 3);
}
__attribute__((noinline)) static long ping(long n, long acc) {
    if (n <= 0)
        return acc;
    return pong(n - 1, acc * 2 % 1000003);
}

__attribute__((noinline)) long via_pointer(long (*f)(long), long x) { return f(x + 1); }

int main(int argc, char **argv) {
    (void)argv;
    long s = 0;
    for (long i = 0; i < 50; i++)
        s += middle(i, argc);
    s += ping(200 + argc, 1);
    s += via_pointer(leaf, s & 0xff);
    printf("s=%ld depth_total=%ld\n", s, depth_total);
    return 0;
}
