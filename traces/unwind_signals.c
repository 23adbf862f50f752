/* Asynchronous signals while recursions unwind (issue 23 point 3,
 * docs/regen.md section 3a, "The transfer count"). An interval timer
 * (argument 1: microseconds, 0 for none) interrupts, round after round:
 *  - `down`, a deep direct recursion whose return path is branch-free: a
 *    chain of returns, each into the same blocks, with no witness between;
 *  - `ping`/`pong`, a mutual recursion with branch-free return paths;
 *  - `tailrec`, a recursion whose return path tail-calls `mix` (`jmp`):
 *    `mix` runs once per frame while it unwinds;
 *  - `twice`, `mix(mix(x))`: `call mix; jmp mix`, one procedure run twice
 *    with no call between;
 *  - `cmp`, a qsort comparator that calls qsort again (recursion through
 *    libc).
 * The handler counts; with argument 2 = 1 it also calls `mix`, which the
 * interrupted code may be running (argument 3: rounds, default 300).
 * The handler does not change the program's path outside it, so without a
 * timer the program runs the same instructions outside `on_alarm`. Prints
 * `s=... handled=H mixes=M` (M: calls of `mix`, the handler's included). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define DEPTH 200

static volatile sig_atomic_t handled, handler_calls_mix;
static volatile unsigned long mixes;
static volatile unsigned sink;
static int qdepth;

__attribute__((noipa)) unsigned mix(unsigned x) {
    // One locked instruction: a signal cannot split it (a `++` loses the
    // handler's counts when the handler lands between its load and store).
    __atomic_fetch_add(&mixes, 1, __ATOMIC_RELAXED);
    x ^= x >> 7;
    x *= 0x9E3779B1u;
    x ^= x >> 13;
    x *= 0x85EBCA77u;
    x ^= x >> 16;
    return x;
}

void on_alarm(int sig) {
    (void)sig;
    handled++;
    if (handler_calls_mix)
        sink = mix((unsigned)handled);
}

__attribute__((noipa)) unsigned down(int d, unsigned s) {
    if (d == 0)
        return s;
    unsigned r = down(d - 1, s + (unsigned)d);
    r ^= r >> 5;
    r *= 2654435761u;
    r += (unsigned)d;
    r ^= r >> 11;
    r *= 40503u;
    return r ^ (r >> 3);
}

unsigned pong(int d, unsigned s);

__attribute__((noipa)) unsigned ping(int d, unsigned s) {
    if (d <= 0)
        return s;
    unsigned r = pong(d - 1, s * 3u + 1u);
    r = r * 2246822519u + (unsigned)d;
    return r ^ (r >> 15);
}

__attribute__((noipa)) unsigned pong(int d, unsigned s) {
    if (d <= 0)
        return s + 1u;
    unsigned r = ping(d - 1, s ^ 0x5bd1e995u);
    r = (r << 7 | r >> 25) + (unsigned)d;
    return r * 3266489917u;
}

__attribute__((noipa)) unsigned tailrec(int d, unsigned s) {
    if (d == 0)
        return mix(s);
    unsigned r = tailrec(d - 1, s + 7u);
    return mix(r + (unsigned)d);
}

__attribute__((noipa)) unsigned twice(unsigned x) {
    return mix(mix(x));
}

__attribute__((noipa)) int cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    if (qdepth < 2) {
        int v[4] = {y & 15, x & 15, 3, 1};
        qdepth++;
        qsort(v, 4, sizeof v[0], cmp);
        qdepth--;
        sink = (unsigned)v[0];
    }
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    long us = argc > 1 ? atol(argv[1]) : 0;
    handler_calls_mix = argc > 2 && atoi(argv[2]) == 1;
    int rounds = argc > 3 ? atoi(argv[3]) : 300;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, us}, {0, us}};
    setitimer(ITIMER_REAL, &it, NULL);
    unsigned s = 1;
    for (int i = 0; i < rounds; i++) {
        s = down(DEPTH, s);
        s = ping(DEPTH, s);
        s = tailrec(DEPTH / 2, s);
        s = twice(s);
        if (i % 32 == 0) {
            int v[6];
            for (int k = 0; k < 6; k++)
                v[k] = (int)((s >> (k * 4)) & 255u);
            qsort(v, 6, sizeof v[0], cmp);
            s += (unsigned)v[0];
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("s=%u handled=%d mixes=%lu\n", s, (int)handled, (unsigned long)mixes);
    return 0;
}
