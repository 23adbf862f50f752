/* A function that only a data word names, whose `.cold` part starts with
 * a case of its switch (python3's `member_get`, issue 23: named only by
 * `member_descriptor`'s `tp_descr_get` slot, its rare cases tail-calling
 * from `.text.unlikely`). Built non-PIE and stripped, nothing names
 * `get`'s hot part but the table `ops`, and the `.cold` part's start is
 * entered only through the jump table: the hot part must stay the entry
 * that the indirect call reaches (before, the `.cold` part was taken as
 * the procedure's start, the hot entry got no springboard and its calls
 * ran the original code, untraced). */
#include <stdio.h>
#include <stdlib.h>

static long acc[4];

static __attribute__((noinline, cold)) long rare(int op, long v) {
    printf("rare %d %ld\n", op, v);
    return v * op + acc[op & 3];
}

static __attribute__((noinline)) long get(int op, long v) {
    switch (op & 15) {
    case 0: return acc[0] += v;
    case 1: return acc[1] -= v * 3;
    case 2: return acc[2] ^= v << 2;
    case 3: return rare(op, v);
    case 4: return acc[3] |= v;
    case 5: return acc[0] * 3 + acc[1];
    case 6: return acc[2] / 2 + v;
    case 7: return rare(op + 1, v);
    case 8: return acc[3] + (acc[0] & 0xff);
    case 9: return puts("nine");
    case 10: return acc[0] - (acc[3] >> 1);
    case 11: return -acc[1];
    case 12: return acc[2] + 10 * v;
    case 13: return acc[3] ^ v;
    case 14: return acc[0] + acc[2];
    default: return 15;
    }
}

struct slots { const char *name; long (*fn)(int, long); };
static struct slots ops[] = { { "get", get } };

int main(int argc, char **argv) {
    const char *s = argc > 1 ? argv[1] : "0123456789:;<=>?37";
    long sum = 0;
    struct slots *volatile p = ops;
    for (int i = 0; s[i]; i++)
        sum += p->fn(s[i] - '0', i);
    printf("%s %ld\n", p->name, sum);
    return 0;
}
