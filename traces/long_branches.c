/* One procedure of 2048 branches in a row, with no loop and no call: its
   longest path writes thousands of witness bytes (4-byte WIDE witnesses:
   the procedure has more than 254 witness edges) between the entry check
   and the return, more than a buffer half's headroom unless the rewriter
   adds checks inside it (record/src/rewrite/checks.rs): one call writes
   about 19 kB, more than a 16 kB buffer half holds. */
#include <stdio.h>
#include <stdlib.h>

#define N 2048
volatile int v[N + 1];

#define B1(i) if (v[i] == x) v[(i) + 1] = x;
#define B4(i) B1(i) B1((i) + 1) B1((i) + 2) B1((i) + 3)
#define B16(i) B4(i) B4((i) + 4) B4((i) + 8) B4((i) + 12)
#define B64(i) B16(i) B16((i) + 16) B16((i) + 32) B16((i) + 48)
#define B256(i) B64(i) B64((i) + 64) B64((i) + 128) B64((i) + 192)
#define B1024(i) B256(i) B256((i) + 256) B256((i) + 512) B256((i) + 768)

__attribute__((noinline)) void chain(int x)
{
    B1024(0) B1024(1024)
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 4;
    long sum = 0;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i <= N; i++)
            v[i] = (i * 7 + r) % (2 + r % 3);
        chain(r % 3);
        for (int i = 0; i <= N; i++)
            sum += v[i];
    }
    printf("sum=%ld\n", sum);
    return 0;
}
