/* Loops: counted, nested, while with break/continue, do-while.
 * The trip counts come from argv so the compiler cannot fold them.
 * Prints a deterministic checksum. */
#include <stdio.h>
#include <stdlib.h>

static unsigned long triangle(int n) {
    unsigned long s = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++)
            s += (unsigned long)(i ^ j);
    return s;
}

static int collatz_steps(unsigned long x) {
    int steps = 0;
    while (x != 1) {
        if (x & 1)
            x = 3 * x + 1;
        else
            x >>= 1;
        steps++;
        if (steps > 1000)
            break;
    }
    return steps;
}

static int odd_digits(unsigned n) {
    int count = 0;
    do {
        unsigned d = n % 10;
        n /= 10;
        if (d % 2 == 0)
            continue;
        count++;
    } while (n != 0);
    return count;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 40;
    unsigned long total = triangle(n);
    int longest = 0;
    for (int i = 1; i <= n; i++) {
        int s = collatz_steps((unsigned long)i);
        if (s > longest)
            longest = s;
    }
    int odd = 0;
    for (unsigned k = 0; k < (unsigned)n * 25; k += 7)
        odd += odd_digits(k);
    printf("triangle=%lu longest=%d odd=%d\n", total, longest, odd);
    return 0;
}
