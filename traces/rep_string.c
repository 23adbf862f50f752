/* rep string instructions as the LAST instruction of a block (the label
 * after each is a branch target, so the block ends there; paper 004,
 * Section 4.1): `rep movsb` and `rep stosq` with counts 0, 1 and many, in
 * a loop. The counts come from argc so the compiler cannot fold them.
 * Prints a checksum of the buffers. */
#include <stdio.h>
#include <string.h>

static unsigned char src[4096], dst[4096];
static unsigned long words[512];

__attribute__((noinline)) static void copy(unsigned char *d, const unsigned char *s,
                                           unsigned long n, int skip) {
    __asm__ volatile("test %[skip], %[skip]\n\t"
                     "jnz 1f\n\t"
                     "rep movsb\n"
                     "1:\n\t"
                     : "+D"(d), "+S"(s), "+c"(n)
                     : [skip] "r"(skip)
                     : "memory", "cc");
}

__attribute__((noinline)) static void fill(unsigned long *d, unsigned long v,
                                           unsigned long n, int skip) {
    __asm__ volatile("test %[skip], %[skip]\n\t"
                     "jnz 1f\n\t"
                     "rep stosq\n"
                     "1:\n\t"
                     : "+D"(d), "+c"(n)
                     : "a"(v), [skip] "r"(skip)
                     : "memory", "cc");
}

int main(int argc, char **argv) {
    (void)argv;
    int skip = argc > 5; /* 0 in every test run */
    unsigned long counts[] = {0, 1, 7, 1000 * (unsigned long)argc, 0, 1};
    for (unsigned i = 0; i < sizeof src; i++)
        src[i] = (unsigned char)(i * 7 + 3);
    unsigned long sum = 0;
    for (int round = 0; round < 3; round++) {
        for (unsigned k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            unsigned long n = counts[k] % sizeof dst;
            memset(dst, 0, sizeof dst);
            copy(dst, src + round, n, skip);
            fill(words, n + round, n % 512, skip);
            for (unsigned long i = 0; i < n; i += 97)
                sum = sum * 31 + dst[i] + words[i % 512];
        }
    }
    printf("rep: %lu\n", sum);
    return 0;
}
