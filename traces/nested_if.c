/* Nested conditionals over pseudo-random values (seeded by argc), including
 * short-circuit && / || chains and else-if ladders. Prints class counts. */
#include <stdio.h>

static unsigned state;

static unsigned next(void) {
    state = state * 1103515245u + 12345u;
    return (state >> 8) & 0xffff;
}

static int classify(unsigned a, unsigned b, unsigned c) {
    if (a > b) {
        if (b > c)
            return 0;
        else if (a > c)
            return 1;
        else
            return 2;
    } else {
        if ((a & 1) && (b & 2))
            return 3;
        if ((c & 4) || (a == b))
            return a < c ? 4 : 5;
    }
    return 6;
}

int main(int argc, char **argv) {
    (void)argv;
    state = (unsigned)argc * 7u;
    int counts[7] = {0};
    for (int i = 0; i < 2000; i++) {
        unsigned a = next(), b = next(), c = next();
        counts[classify(a, b, c)]++;
    }
    for (int k = 0; k < 7; k++)
        printf("class %d: %d\n", k, counts[k]);
    return 0;
}
