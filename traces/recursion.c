/* Recursion: plain (fib), deep non-tail (ackermann), mutual (even/odd),
 * and divide and conquer (merge sort). Prints the results. */
#include <stdio.h>
#include <stdlib.h>

static __attribute__((noinline)) long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

static __attribute__((noinline)) int ack(int m, int n) {
    if (m == 0)
        return n + 1;
    if (n == 0)
        return ack(m - 1, 1);
    return ack(m - 1, ack(m, n - 1));
}

static int is_odd(unsigned n);
static __attribute__((noinline)) int is_even(unsigned n) { return n == 0 ? 1 : is_odd(n - 1); }
static __attribute__((noinline)) int is_odd(unsigned n) { return n == 0 ? 0 : is_even(n - 1); }

static void msort(int *a, int *tmp, int lo, int hi) {
    if (hi - lo < 2)
        return;
    int mid = (lo + hi) / 2;
    msort(a, tmp, lo, mid);
    msort(a, tmp, mid, hi);
    int i = lo, j = mid, k = lo;
    while (i < mid && j < hi)
        tmp[k++] = a[i] <= a[j] ? a[i++] : a[j++];
    while (i < mid)
        tmp[k++] = a[i++];
    while (j < hi)
        tmp[k++] = a[j++];
    for (k = lo; k < hi; k++)
        a[k] = tmp[k];
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 18;
    int a[64], tmp[64];
    for (int i = 0; i < 64; i++)
        a[i] = (i * 37 + n) % 64;
    msort(a, tmp, 0, 64);
    printf("fib=%ld ack=%d even=%d sorted=%d,%d,%d\n", fib(n), ack(2, n % 5), is_even((unsigned)n * 3),
           a[0], a[31], a[63]);
    return 0;
}
