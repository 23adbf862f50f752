/* gcc -O2 (-fipa-ra) code that keeps values across a direct call in
   caller-saved registers, because it knows the callee never writes them:
   `mix` is left alone by the rewriter (a never-taken `xbegin`, encoded by
   hand for old assemblers) and calls the traced `step`, whose stub must
   then clobber nothing: not rcx, rsi, rdi, r8-r11 (the values `mix` keeps
   there) nor the flags. `step` is traced and entered from traced `main`
   as well. Natively prints the same sums. */
#include <stdio.h>

volatile int never;
static long acc;

__attribute__((noinline)) static void step(long x)
{
    acc += x;
}

__attribute__((noinline)) static long mix(long a, long b, long c, long d)
{
    if (never)
        __asm__ volatile(".byte 0xc7, 0xf8, 0, 0, 0, 0");
    long s = 0;
    for (long i = 0; i < 40; i++) {
        long p = a * i + b, q = c ^ i, r = d - i, t = a + c * i;
        step(i);
        s += p * q + r * t + (p ^ r) + (q | t);
        a += 3, c += 5;
    }
    return s;
}

int main(void)
{
    long total = 0;
    for (int k = 0; k < 20; k++) {
        total += mix(k, 2 * k + 1, 3 * k + 7, 100 - k);
        step(k);
    }
    printf("total=%ld acc=%ld\n", total, acc);
    return 0;
}
