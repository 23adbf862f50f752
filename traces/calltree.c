/* A call tree below main that stays in the program (no libc calls): the
 * inclusive cost of each call site (callgrind's `calls=` lines). `mid` is
 * called from two sites and `leaf` from two procedures, every call of each
 * costing the same, so an edge profile's proportional split of their cost
 * is exact; `uneven` costs more at one site than at the other. `noipa`
 * keeps gcc from finding them pure and calling them once. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noipa)) static int leaf(int x) { return x * 3 + 1; }

__attribute__((noipa)) static int mid(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s += leaf(i);
    return s;
}

__attribute__((noipa)) static int twice(int n) { return mid(n) + (mid(n) >> 1); }

__attribute__((noipa)) static int uneven(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s ^= i * 7;
    return s;
}

__attribute__((noipa)) static int top(int n) {
    int s = 0;
    for (int k = 0; k < 10; k++)
        s += twice(n) ^ leaf(k);
    return s + uneven(n) + uneven(3 * n);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 50;
    printf("%d\n", top(n));
    return 0;
}
