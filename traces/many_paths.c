/* One procedure with 2^20 acyclic paths (20 independent decisions in a
 * row inside a loop): more than `aetrace paths` counts densely, so it is
 * edge-profiled instead. The calls keep gcc from if-converting them. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) static long up(int k) { return k * 3 + 1; }
__attribute__((noinline)) static long down(int k) { return k ^ 5; }

#define STEP(k)              \
    if ((x >> (k)) & 1)      \
        a += up(k);          \
    else                     \
        a -= down(k);

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 3;
    long a = 0;
    for (int x = 0; x < n * 100; x += 7) {
        STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) STEP(6) STEP(7) STEP(8) STEP(9)
        STEP(10) STEP(11) STEP(12) STEP(13) STEP(14) STEP(15) STEP(16) STEP(17) STEP(18) STEP(19)
    }
    printf("%ld\n", a);
    return 0;
}
