/* A jump table that several jumps read (docs/rewrite.md "Computed
 * jumps"): gcc -O2 duplicates the bounded `goto *ops[i & 3]` into every
 * label and hoists the table's address into a register, so the four
 * jumps read one table (CPython's `opcode_targets`, 228 jumps). The copy
 * leaves the table as it is and each jump dispatches from its targets;
 * a rewritten table would hold one jump's case stubs, and the other jumps
 * wrote that jump's witnesses (regen stopped at the first). */
#include <stdio.h>

__attribute__((noinline)) static long run(const unsigned char *code, long x) {
    static const void *const ops[] = {&&inc, &&dbl, &&dec, &&halt};
#define NEXT goto *ops[*code++ & 3]
    NEXT;
inc:
    x += 1;
    NEXT;
dbl:
    x *= 2;
    NEXT;
dec:
    x -= 3;
    NEXT;
halt:
    return x;
}

int main(int argc, char **argv) {
    (void)argv;
    const unsigned char prog[] = {0, 1, 1, 2, 0, 1, 2, 2, 1, 0, 0, 1, 3};
    long s = 0;
    for (int i = 0; i < 50; i++)
        s += run(prog, i + argc);
    printf("%ld\n", s);
    return 0;
}
