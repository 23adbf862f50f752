/* exit() called with several frames of our own still active (the paper's
 * Figure 4 case), with an atexit handler that runs afterwards. Exit status 4. */
#include <stdio.h>
#include <stdlib.h>

static int depth;

static void goodbye(void) { printf("atexit: depth was %d\n", depth); }

__attribute__((noinline)) static void descend(int n, int limit) {
    depth = n;
    if (n >= limit) {
        printf("exiting at depth %d\n", n);
        exit(4);
    }
    if (n < 100)
        descend(n + 1, limit);
    printf("never: %d\n", n);
}

int main(int argc, char **argv) {
    (void)argv;
    atexit(goodbye);
    descend(0, 4 + argc);
    return 0;
}
