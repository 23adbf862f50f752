/* Asynchronous signals in the mix: a 200 us interval timer (setitimer)
 * delivers SIGALRM wherever the program is, in a recursion that calls
 * qsort with a comparator; the handler counts, and every fifth time it
 * finds the recursion deep it siglongjmps out of it. A one-shot ualarm()
 * ends the wait for the last ticks (alarm() would make every run last a
 * second). Prints its own counts (the oracle: valgrind delivers timer
 * signals at its own points). */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static sigjmp_buf env;
static volatile sig_atomic_t ticks, jumps, depth_now, armed, alarmed;

static int by_value(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static void on_alarm(int sig) {
    if (sig == SIGALRM && armed == 0) {
        alarmed = 1;
        return;
    }
    ticks++;
    if (ticks % 5 == 0 && depth_now > 4) {
        jumps++;
        siglongjmp(env, 1);
    }
}

__attribute__((noinline)) static unsigned work(int depth, unsigned s) {
    depth_now = depth;
    int v[32];
    for (int i = 0; i < 32; i++)
        v[i] = (int)((s + (unsigned)i * 2654435761u) >> 7) % 1000;
    qsort(v, 32, sizeof v[0], by_value);
    s += (unsigned)v[depth % 32];
    if (depth < 9)
        s = work(depth + 1, s * 3u + 1u);
    depth_now = depth - 1;
    return s;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 200}, {0, 200}};
    armed = 1;
    setitimer(ITIMER_REAL, &it, NULL);
    unsigned s = 1;
    while (ticks < 60) {
        if (sigsetjmp(env, 1) == 0)
            s = work(0, s);
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    armed = 0;
    ualarm(2000, 0);
    while (!alarmed)
        pause();
    printf("ticks>=60 %d jumps>0 %d handled_alarm %d\n", ticks >= 60, jumps > 0, (int)alarmed);
    printf("ticks=%d jumps=%d\n", (int)ticks, (int)jumps);
    return 0;
}
