/* PLT stubs and lazy binding (docs/rewrite.md, "PLT stubs"): the imports
 * are bound lazily while the program runs (`-z lazy`), and the bound
 * outcome of a stub's jump writes nothing. Modes:
 *   bind: a lazy resolution that calls the program back (an IFUNC
 *         resolver of liblazyplt.so.1, whose callback binds more imports,
 *         `labs` and `qsort`, whose comparator binds `strcmp`), then two
 *         threads that both find one slot unbound and bind it, then each
 *         import called again, bound;
 *   timer N: a 100 us interval timer interrupts a loop of two calls in a
 *         row through bound stubs (`lib_mix`, `getppid`), mostly inside
 *         the library or libc right after a stub's jump, until the
 *         handler ran N times and the loop ran at least 20,000 times;
 *         prints handler runs and iterations. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

void lib_set_hook(void (*h)(int));
int once(int);
int twice(int);
int lib_met(void);
unsigned long lib_mix(unsigned long x, long i);

static const char *words[] = {"pear", "fig", "apple", "kiwi", "plum", "date"};
static long hooked;

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Runs inside ld.so's lazy binding of `once`. */
static void on_resolve(int k) {
    const char *w[6];
    memcpy(w, words, sizeof w);
    qsort(w, 6, sizeof w[0], by_name);
    hooked += labs(k - 7) + (long)strlen(w[0]);
}

static int results[2];

static void *worker(void *arg) {
    long k = (long)arg;
    results[k] = twice((int)k + 1);
    return NULL;
}

static volatile long handled;
static void on_signal(int sig) { handled += sig > 0; }

/* One iteration of the timer loop: two record-free calls in a row. */
__attribute__((noinline)) static unsigned long step(unsigned long x, long i) {
    x = lib_mix(x, i);
    return x + (unsigned long)getppid();
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "bind";
    if (!strcmp(mode, "bind")) {
        lib_set_hook(on_resolve);
        int a = once(4);
        pthread_t t[2];
        for (long k = 0; k < 2; k++)
            pthread_create(&t[k], NULL, worker, (void *)k);
        for (int k = 0; k < 2; k++)
            pthread_join(t[k], NULL);
        int b = once(5) + twice(6);
        on_resolve(1);
        printf("a=%d b=%d threads=%d,%d hooked=%ld met=%d\n", a, b, results[0], results[1],
               hooked, lib_met());
        return 0;
    }
    if (strcmp(mode, "timer"))
        return 2;
    long n = argc > 2 ? atol(argv[2]) : 30;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    unsigned long x = step(1, 0);
    /* 100 us, and a floor on the iterations: on a kernel 6.18 VM a 20 us
     * timer fell behind and its expiries came back to back, so the loop
     * ran twice while the handler ran 100 times. */
    struct itimerval it = {{0, 100}, {0, 100}};
    setitimer(ITIMER_REAL, &it, NULL);
    long i = 0;
    while (handled < n || i < 20000)
        x = step(x, ++i);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("handled=%ld iterations=%ld x=%lu\n", handled, i + 1, x);
    return 0;
}
