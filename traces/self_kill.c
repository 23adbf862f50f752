/* Counts to a known number, prints it, then kills itself with SIGKILL:
 * whatever a profiler keeps in the process is lost, what it keeps in
 * shared memory survives. */
#include <signal.h>
#include <stdio.h>

int main(int argc, char **argv) {
    (void)argv;
    volatile unsigned s = (unsigned)argc;
    for (int i = 0; i < 1234; i++)
        s = s * 3u + (unsigned)i;
    printf("%u\n", s);
    fflush(stdout);
    raise(SIGKILL);
    return 0;
}
