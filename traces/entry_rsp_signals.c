/* Each outside entry's rsp (format 1.21: a VALUE after ENTER, or
 * ENTER_SAME where it repeats the thread's last) against the program's
 * own: libc's qsort calls `cmp` from a few depths, so most of its entries
 * repeat the last rsp, while a 20 us timer's SIGALRM runs the traced
 * handler `on_alarm` anywhere, its stubs included. Each notes its rsp at
 * entry (-O0: `push rbp; mov rbp, rsp`, so the frame address plus 8) and
 * the program prints, per function and rsp, how many entries had it. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

enum { N = 3000, ROUNDS = 40, MAX = 4096 };

struct tab {
    long n;
    uintptr_t rsp[MAX];
    long count[MAX];
};

static struct tab by_cmp, by_alarm;
static volatile long handled;

static void note(struct tab *t, uintptr_t rsp) {
    for (long i = 0; i < t->n; i++)
        if (t->rsp[i] == rsp) {
            t->count[i]++;
            return;
        }
    if (t->n < MAX) {
        t->rsp[t->n] = rsp;
        t->count[t->n++] = 1;
    }
}

static void on_alarm(int sig) {
    (void)sig;
    note(&by_alarm, (uintptr_t)__builtin_frame_address(0) + 8);
    handled++;
}

static int cmp(const void *a, const void *b) {
    note(&by_cmp, (uintptr_t)__builtin_frame_address(0) + 8);
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static void print(const char *name, const struct tab *t) {
    for (long i = 0; i < t->n; i++)
        printf("%s %#lx %ld\n", name, (unsigned long)t->rsp[i], t->count[i]);
}

int main(void) {
    static int v[N];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 20}, {0, 20}};
    setitimer(ITIMER_REAL, &it, NULL);
    for (unsigned r = 0; r < ROUNDS; r++) {
        for (unsigned i = 0; i < N; i++)
            v[i] = (int)(((i + r) * 2654435761u) % 1000003u);
        qsort(v, N, sizeof v[0], cmp);
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    print("cmp", &by_cmp);
    print("on_alarm", &by_alarm);
    printf("handled %ld\n", handled);
    return 0;
}
