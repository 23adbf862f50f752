/* pthreads: four workers sum disjoint ranges into their own slots, the main
 * thread joins them and prints the sums in a fixed order. */
#include <pthread.h>
#include <stdio.h>

#define WORKERS 4

struct job {
    long from, to, sum;
};

static void *worker(void *arg) {
    struct job *j = arg;
    for (long i = j->from; i < j->to; i++)
        j->sum += i % 7 == 0 ? i : 1;
    return NULL;
}

int main(int argc, char **argv) {
    (void)argv;
    pthread_t t[WORKERS];
    struct job jobs[WORKERS];
    for (int k = 0; k < WORKERS; k++) {
        jobs[k] = (struct job){k * 1000L * argc, (k + 1) * 1000L * argc, 0};
        if (pthread_create(&t[k], NULL, worker, &jobs[k]) != 0)
            return 1;
    }
    long total = 0;
    for (int k = 0; k < WORKERS; k++) {
        pthread_join(t[k], NULL);
        printf("worker %d: %ld\n", k, jobs[k].sum);
        total += jobs[k].sum;
    }
    printf("total=%ld\n", total);
    return 0;
}
