/* The README's bundled example: a naive and a blocked matrix multiply, whose
 * cache behaviour differs visibly, plus a checksum so the output is an oracle. */
#include <stdio.h>
#include <stdlib.h>

#define N 96
#define B 16

static double a[N][N], b[N][N], c[N][N];

static void naive(void) {
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < N; k++)
                s += a[i][k] * b[k][j];
            c[i][j] = s;
        }
}

static void blocked(void) {
    for (int ii = 0; ii < N; ii += B)
        for (int kk = 0; kk < N; kk += B)
            for (int jj = 0; jj < N; jj += B)
                for (int i = ii; i < ii + B; i++)
                    for (int k = kk; k < kk + B; k++) {
                        double r = a[i][k];
                        for (int j = jj; j < jj + B; j++)
                            c[i][j] += r * b[k][j];
                    }
}

static double checksum(void) {
    double s = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            s += c[i][j] * ((i ^ j) & 7);
    return s;
}

int main(int argc, char **argv) {
    int blocked_version = argc > 1 && argv[1][0] == 'b';
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            a[i][j] = (i * 31 + j * 17) % 13;
            b[i][j] = (i * 7 + j * 3) % 11;
        }
    if (blocked_version)
        blocked();
    else
        naive();
    printf("%s checksum %.0f\n", blocked_version ? "blocked" : "naive", checksum());
    return 0;
}
