/* An instruction whose references the data walk cannot model (issue 21,
 * docs/data.md "Refused"): `xsave`, whose size XCR0 and the mask in
 * edx:eax decide. It runs only when the program is given an argument, so
 * a data trace of the run without one regenerates, and one with it is
 * refused at that instruction. */
#include <stdio.h>

/* The largest XSAVE area of this CPU family is under 3 KiB (AVX-512). */
static unsigned char area[8192] __attribute__((aligned(64)));

static __attribute__((noinline)) void save(void) {
    __asm__ volatile("xsave %0" : "=m"(area) : "a"(~0u), "d"(~0u) : "memory");
}

int main(int argc, char **argv) {
    (void)argv;
    long sum = 0;
    for (int i = 0; i < 64; i++)
        sum += i * argc;
    if (argc > 1)
        save();
    /* The legacy region's MXCSR (bytes 24..27) is nonzero once saved. */
    printf("%ld %d\n", sum, area[24] != 0);
    return 0;
}
