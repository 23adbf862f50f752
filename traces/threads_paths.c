/* Threads running traced procedures at the same time: each worker calls a
 * branchy procedure in a loop, so the path registers of concurrent
 * activations (one per thread) must not be shared. Prints per-class
 * counts, the same in every run. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define WORKERS 3

struct job {
    long n, seed, a, b, c;
};

/* Stores in both arms keep gcc from turning the branches into cmov. */
__attribute__((noinline)) static void classify(struct job *j, long x) {
    if (x % 3 == 0)
        j->a++;
    else if (x % 5 == 1)
        j->b++;
    else
        j->c++;
    if (x & 8)
        j->a += 2;
    else
        j->c += 3;
}

static void *worker(void *arg) {
    struct job *j = arg;
    long x = j->seed;
    for (long i = 0; i < j->n; i++) {
        x = (x * 1103515245 + 12345) & 0x7fffffff;
        classify(j, x >> 4);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    pthread_t t[WORKERS];
    struct job jobs[WORKERS];
    for (int k = 0; k < WORKERS; k++) {
        jobs[k] = (struct job){n, k + 1, 0, 0, 0};
        if (pthread_create(&t[k], NULL, worker, &jobs[k]) != 0)
            return 1;
    }
    for (int k = 0; k < WORKERS; k++) {
        pthread_join(t[k], NULL);
        printf("worker %d: %ld %ld %ld\n", k, jobs[k].a, jobs[k].b, jobs[k].c);
    }
    return 0;
}
