/* Callbacks from libc into our code: qsort and bsearch call our comparators
 * (entries into the program from code we did not compile). */
#include <stdio.h>
#include <stdlib.h>

static long compares;

static int by_value(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    compares++;
    return (x > y) - (x < y);
}

static int by_last_digit(const void *a, const void *b) {
    int x = *(const int *)a % 10, y = *(const int *)b % 10;
    compares++;
    return x != y ? x - y : by_value(a, b);
}

int main(int argc, char **argv) {
    (void)argv;
    int v[100];
    for (int i = 0; i < 100; i++)
        v[i] = (i * 7919 + argc) % 1000;
    qsort(v, 100, sizeof v[0], by_last_digit);
    printf("first=%d last=%d\n", v[0], v[99]);
    qsort(v, 100, sizeof v[0], by_value);
    int key = v[42];
    int *hit = bsearch(&key, v, 100, sizeof v[0], by_value);
    printf("min=%d max=%d found_at=%ld\n", v[0], v[99], (long)(hit - v));
    return 0;
}
