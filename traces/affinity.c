/* A program whose path depends on its CPU affinity, as `sort` sizes its
 * thread pool: it does one unit of work per CPU it may run on. `aetrace
 * verify` pins itself and the program to one CPU; the program must still
 * see the mask the recorded run saw (its `sched_getaffinity` is answered
 * by the follower), or its trace diverges. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>

__attribute__((noinline)) static unsigned work(unsigned x) {
    for (int i = 0; i < 100; i++)
        x = x * 1103515245u + 12345u;
    return x;
}

int main(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return 1;
    unsigned x = 1;
    for (int cpu = 0; cpu < CPU_COUNT(&set); cpu++)
        x = work(x);
    printf("cpus=%d x=%u\n", CPU_COUNT(&set), x);
    return 0;
}
