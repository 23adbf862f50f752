/* Thread churn: N threads (argv[1], default 1000) in waves of at most
 * four alive at once (create four, join four), each running a little
 * work whose path depends on its index; the main thread prints the count
 * and a checksum of the results. Over the run there are more threads than
 * the recorder's 256 slots, never more than five alive: the recorder must
 * reuse the slots of threads that have exited. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define WAVE 4

struct job {
    long index;
    long result;
};

static void *work(void *arg) {
    struct job *j = arg;
    long acc = j->index + 1;
    for (long i = 0; i < j->index % 13 + 3; i++)
        acc = acc % 2 ? 3 * acc + 1 : acc / 2;
    j->result = acc;
    return NULL;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    long done = 0;
    unsigned long sum = 0;
    for (long base = 0; base < n; base += WAVE) {
        pthread_t t[WAVE];
        struct job jobs[WAVE];
        int m = n - base < WAVE ? (int)(n - base) : WAVE;
        for (int k = 0; k < m; k++) {
            jobs[k] = (struct job){base + k, 0};
            if (pthread_create(&t[k], NULL, work, &jobs[k]) != 0)
                return 1;
        }
        for (int k = 0; k < m; k++) {
            pthread_join(t[k], NULL);
            sum = sum * 31 + (unsigned long)jobs[k].result;
            done++;
        }
    }
    printf("threads=%ld checksum=%lu\n", done, sum);
    return 0;
}
