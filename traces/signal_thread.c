/* A signal handled in a second thread: the worker raises SIGUSR1 on
 * itself (pthread_kill) between iterations of its traced loop; the handler
 * calls a traced function. The main thread only waits. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile long hits, work;

__attribute__((noinline)) static void bump(int sig) { hits += sig; }

static void on_usr1(int sig) { bump(sig); }

static void *worker(void *arg) {
    long n = (long)arg;
    for (long i = 0; i < n; i++) {
        work += i ^ (i >> 2);
        if (i % 5 == 0)
            pthread_kill(pthread_self(), SIGUSR1);
    }
    return NULL;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    pthread_t t;
    pthread_create(&t, NULL, worker, (void *)30L);
    pthread_join(t, NULL);
    printf("hits=%ld work=%ld\n", hits, work);
    return 0;
}
