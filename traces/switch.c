/* A dense switch (cases 0..11 with distinct bodies: a jump table at -O2),
 * driven by the bytes of argv[1] (or a default string) so it cannot be folded,
 * plus a sparse switch that compiles to a compare tree. */
#include <stdio.h>
#include <string.h>

static long acc[4];

static __attribute__((noinline)) void dense(int op, long v) {
    switch (op) {
    case 0: acc[0] += v; break;
    case 1: acc[1] -= v * 3; break;
    case 2: acc[2] ^= v << 2; break;
    case 3: acc[3] |= v; break;
    case 4: acc[0] *= 3; acc[1] += 1; break;
    case 5: acc[2] = acc[2] / 2 + v; break;
    case 6: acc[3] += acc[0] & 0xff; break;
    case 7: puts("seven"); break;
    case 8: acc[0] -= acc[3] >> 1; break;
    case 9: acc[1] = -acc[1]; break;
    case 10: acc[2] += 10 * v; acc[3] -= 1; break;
    case 11: acc[0] ^= acc[1] ^ acc[2]; break;
    default: acc[3] += 100; break;
    }
}

static __attribute__((noinline)) int sparse(int c) {
    switch (c) {
    case 'a': return 1;
    case 'm': return 20;
    case 'z': return 300;
    case 1000: return 4000;
    default: return 0;
    }
}

int main(int argc, char **argv) {
    const char *s = argc > 1 ? argv[1] : "the quick brown fox jumps over the lazy dog 0123456789";
    size_t n = strlen(s);
    int sp = 0;
    for (int round = 0; round < 3; round++)
        for (size_t i = 0; i < n; i++) {
            dense((s[i] + round) % 13, (long)i);
            sp += sparse(s[i]);
        }
    printf("%ld %ld %ld %ld %d\n", acc[0], acc[1], acc[2], acc[3], sp);
    return 0;
}
