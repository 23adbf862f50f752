/* vDSO calls: clock_gettime and gettimeofday in a loop run in the kernel's
 * vDSO page, outside every module (no system call, no trap). Their values
 * differ from run to run, so the program only mixes them into a sum it does
 * not print (no branch depends on them) and prints the number of calls. */
#include <stdio.h>
#include <sys/time.h>
#include <time.h>

static volatile unsigned long mix;

int main(int argc, char **argv) {
    (void)argv;
    int n = 200 * argc;
    for (int i = 0; i < n; i++) {
        struct timespec ts;
        struct timeval tv;
        clock_gettime(i & 1 ? CLOCK_MONOTONIC : CLOCK_REALTIME, &ts);
        gettimeofday(&tv, NULL);
        mix ^= (unsigned long)ts.tv_nsec + (unsigned long)tv.tv_usec;
    }
    printf("vdso: %d calls\n", 2 * n);
    return 0;
}
