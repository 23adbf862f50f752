/* pthreads, deterministic per thread: three workers each wait for a byte
 * from a pipe, which the main thread writes once it has created all of
 * them (so each thread's own instructions do not depend on how the
 * threads were scheduled: none exits while another is being created),
 * then sum disjoint ranges into their own slots; the main thread joins
 * them in order and prints the sums. Built static and PIE (with libc.so.6
 * traced). */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#define WORKERS 3

static int gate[2];

struct job {
    long from, to, sum;
};

static void *worker(void *arg) {
    struct job *j = arg;
    char c;
    if (read(gate[0], &c, 1) != 1)
        return NULL;
    for (long i = j->from; i < j->to; i++)
        j->sum += i % 7 == 0 ? i : 1;
    return NULL;
}

int main(int argc, char **argv) {
    (void)argv;
    pthread_t t[WORKERS];
    struct job jobs[WORKERS];
    if (pipe(gate) != 0)
        return 1;
    /* Binds `read` (a dynamic build's PLT slot is bound lazily by its first
     * call): which worker would call it first depends on the scheduling. */
    if (read(gate[0], NULL, 0) != 0)
        return 1;
    for (int k = 0; k < WORKERS; k++) {
        jobs[k] = (struct job){k * 1000L * argc, (k + 1) * 1000L * argc, 0};
        if (pthread_create(&t[k], NULL, worker, &jobs[k]) != 0)
            return 1;
    }
    if (write(gate[1], "go!", WORKERS) != WORKERS)
        return 1;
    long total = 0;
    for (int k = 0; k < WORKERS; k++) {
        pthread_join(t[k], NULL);
        printf("worker %d: %ld\n", k, jobs[k].sum);
        total += jobs[k].sum;
    }
    printf("total=%ld\n", total);
    return 0;
}
