/* A dense switch whose `default` calls a function that never returns: gcc
 * -O2 moves that call to the function's `.cold` part in `.text.unlikely`,
 * which nothing but the switch enters, so the jump table's holes are cases
 * in another procedure (issue 23, docs/rewrite.md "Jump tables"), as in
 * Debian's make and od. The ops come from argv[1] (or a default string);
 * the last one is a hole: the program ends in that case, with status 3. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long acc[4];

static __attribute__((noinline, noreturn, cold)) void bad_op(int op) {
    printf("bad op %d: %ld %ld %ld %ld\n", op, acc[0], acc[1], acc[2], acc[3]);
    exit(3);
}

static __attribute__((noinline)) void step(int op, long v) {
    switch (op & 15) { /* no bounds check: only the table enters .cold */
    case 0: acc[0] += v; break;
    case 1: acc[1] -= v * 3; break;
    case 2: acc[2] ^= v << 2; break;
    case 4: acc[3] |= v; break;
    case 5: acc[0] *= 3; acc[1] += 1; break;
    case 6: acc[2] = acc[2] / 2 + v; break;
    case 8: acc[3] += acc[0] & 0xff; break;
    case 9: puts("nine"); break;
    case 10: acc[0] -= acc[3] >> 1; break;
    case 11: acc[1] = -acc[1]; break;
    case 12: acc[2] += 10 * v; acc[3] -= 1; break;
    case 13: acc[3] ^= v; break;
    case 14: acc[0] += acc[2]; break;
    case 15: acc[1] += 15; break;
    default: bad_op(op);
    }
}

int main(int argc, char **argv) {
    const char *s = argc > 1 ? argv[1] : "0124568:;<=>?0124568:;<=>?56:;3";
    for (size_t i = 0; s[i]; i++)
        step(s[i] - '0', (long)i);
    printf("%ld %ld %ld %ld\n", acc[0], acc[1], acc[2], acc[3]);
    return 0;
}
