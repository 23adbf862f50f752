/* Thread constants (docs/data.md, "Thread constants"): `errno` is read and
 * written through `__errno_location`, whose result a data trace records
 * once per thread and per handler. A 100 us SIGALRM timer (SA_NODEFER, so
 * handlers nest) interrupts the main loop, a second thread's loop and the
 * handler itself anywhere, the first call's recording sequence included;
 * the handler uses errno too, and a fork child runs the loop again. The
 * program prints what it computed: the regenerated addresses must equal
 * the recorded ones (`record --data --check`). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile long handled;
static volatile long seen;

__attribute__((noinline)) static long step(long x, long i) {
    errno = (int)(i & 3);
    if (errno == 2)
        x += i;
    return x * 3 + errno;
}

static void on_alarm(int sig) {
    handled++;
    seen += step(sig, handled);
}

static long loop(long n) {
    long x = 1;
    for (long i = 0; i < n; i++)
        x = step(x, i) & 0xffffff;
    return x;
}

static void *worker(void *arg) {
    *(long *)arg = loop(200000);
    return NULL;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART | SA_NODEFER;
    sigaction(SIGALRM, &sa, NULL);
    /* 100 us, not 20: on a kernel 6.18 VM a 20 us timer fell behind at
     * once and its expiries came back to back, each nesting a handler at
     * its first instruction (SA_NODEFER) until the stack overflowed, in
     * half of the native runs. */
    struct itimerval it = {{0, 100}, {0, 100}};
    setitimer(ITIMER_REAL, &it, NULL);
    long t = 0;
    pthread_t th;
    pthread_create(&th, NULL, worker, &t);
    long x = 0;
    while (handled < 300)
        x += loop(1000);
    pthread_join(th, NULL);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    pid_t child = fork();
    if (child == 0) {
        printf("child %ld\n", loop(5000));
        return 0;
    }
    int status;
    waitpid(child, &status, 0);
    printf("handled>=300 x=%ld t=%ld seen>0=%d child=%d\n", x & 1, t, seen > 0, WEXITSTATUS(status));
    return 0;
}
