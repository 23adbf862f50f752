/* A jump table of label addresses (`&&label`, GNU C) read with an index
 * bounded by a compare, the way glibc's vfprintf dispatches on a
 * conversion's class: in a PIE (and a static-PIE) the table holds absolute
 * addresses fixed by R_X86_64_RELATIVE relocations at load time, so the
 * rewritten copy's own table needs the load bias added at the jump. */
#include <stdio.h>

static long step(const char *s, long acc) {
    static const void *const jumps[] = {&&c_digit, &&c_alpha, &&c_space,
                                        &&c_punct, &&c_other, &&c_upper};
    for (; *s; s++) {
        unsigned k = (unsigned char)*s >> 4;
        if (k > 5)
            k = 4;
        goto *jumps[k];
    c_digit:
        acc = acc * 10 + (*s & 7);
        continue;
    c_alpha:
        acc += *s;
        continue;
    c_space:
        acc ^= acc >> 3;
        continue;
    c_punct:
        acc -= 17;
        continue;
    c_upper:
        acc += 5 * *s;
        continue;
    c_other:
        acc = acc * 3 + 1;
    }
    return acc;
}

int main(int argc, char **argv) {
    long acc = argc;
    for (int i = 0; i < 50; i++)
        acc = step(argc > 1 ? argv[1] : "Hello, jump Tables 12 3!\t~", acc) % 1000003;
    printf("%ld\n", acc);
    return 0;
}
