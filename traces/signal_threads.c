/* Signals to threads that are just starting: a spawner thread starts
 * short workers one after another and sends each SIGUSR1 with
 * pthread_kill right after pthread_create, after a delay that sweeps
 * across the worker's start (libc's thread start, the traced start
 * routine's entry stub, the runtime's attach_thread and its windows
 * where signals are not blocked, the worker's loop). Each worker loops
 * in `step` until its handler ran. The program prints how many times the
 * handler ran and how many iterations the loops made: the regenerated
 * trace must enter `on_usr1` and `step` exactly that many times. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local volatile sig_atomic_t got;
static volatile long handled;
static long iterations;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void on_usr1(int sig) {
    got = sig;
    __atomic_add_fetch(&handled, 1, __ATOMIC_RELAXED);
}

__attribute__((noinline)) static unsigned long step(unsigned long x) {
    return x & 1 ? x * 3 + 1 : x >> 1;
}

static void *worker(void *arg) {
    unsigned long x = (unsigned long)arg | 1;
    long n = 0;
    while (!got) {
        x = step(x);
        n++;
    }
    pthread_mutex_lock(&lock);
    iterations += n;
    pthread_mutex_unlock(&lock);
    return (void *)(x & 1);
}

static void *spawner(void *arg) {
    long workers = (long)arg;
    for (long i = 0; i < workers; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, (void *)i) != 0)
            exit(1);
        for (volatile long k = 0; k < (i * 997) % 40000; k++)
            ;
        pthread_kill(t, SIGUSR1);
        pthread_join(t, NULL);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long workers = argc > 1 ? atol(argv[1]) : 200;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    pthread_t s;
    pthread_create(&s, NULL, spawner, (void *)workers);
    pthread_join(s, NULL);
    printf("handled=%ld iterations=%ld\n", handled, iterations);
    return 0;
}
