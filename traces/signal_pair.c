/* Two signals at once: a sender thread sends the main thread SIGUSR1 and
 * SIGUSR2 back to back while it loops in traced code, so both are often
 * pending when it next returns to user mode; the kernel then sets up both
 * frames and the second handler starts at the first instruction of the
 * first one's. The program prints how many times the handler ran and how
 * many iterations the loop made (each calls `step` once): the regenerated
 * trace must enter `on_signal` and `step` exactly that many times. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile long handled;
static volatile int stop;

static void on_signal(int sig) {
    __atomic_add_fetch(&handled, 1, __ATOMIC_RELAXED);
    (void)sig;
}

__attribute__((noinline)) static unsigned long step(unsigned long x, long i) {
    if (x & 1)
        x = x * 3 + 1;
    else
        x >>= 1;
    if ((i & 7) == 3)
        x += i;
    return x;
}

static void *sender(void *arg) {
    pthread_t target = *(pthread_t *)arg;
    while (!stop) {
        pthread_kill(target, SIGUSR1);
        pthread_kill(target, SIGUSR2);
        usleep(20);
    }
    return NULL;
}

int main(void) {
    const long target = 200;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    pthread_t self = pthread_self(), t;
    pthread_create(&t, NULL, sender, &self);
    unsigned long x = 27;
    long iters = 0;
    while (handled < target) {
        x = step(x, iters);
        iters++;
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("handled=%ld iterations=%ld x=%lu\n", handled, iters, x);
    return 0;
}
