/* One store whose address follows the argument and nothing else: the same
   instructions for "1" and "2", a different data address. The data
   comparison with lackey must tell the two runs apart. */
#include <stdio.h>
#include <stdlib.h>

static int table[4096];

int main(int argc, char **argv) {
    unsigned n = argc > 1 ? (unsigned)(argv[1][0] - '0') : 0;
    table[(n * 64) % 4096] += 1;
    printf("%d\n", table[64]);
    return 0;
}
