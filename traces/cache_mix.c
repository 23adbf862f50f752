/* Cache-simulator check program: a data-dependent mix of indirect calls and
 * scattered data accesses, small enough for valgrind lackey to log whole. */
#include <stdio.h>
static int f0(int x) { return x * 3 + 1; }
static int f1(int x) { return x ^ (x >> 3); }
static int f2(int x) { return x + 7; }
static int f3(int x) { return x * x; }
static int (*const table[])(int) = { f0, f1, f2, f3 };
static int data[4096];
int main(void) {
    unsigned s = 1, acc = 0;
    for (int i = 0; i < 3000; i++) {
        s = s * 1103515245u + 12345u;
        data[(s >> 8) & 4095] += i;
        acc += table[(s >> 16) & 3](data[i & 4095]);
    }
    printf("%u\n", acc);
    return 0;
}
