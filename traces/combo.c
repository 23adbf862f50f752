/* The features real programs combine, in one single-threaded program:
 * qsort and bsearch comparators (callbacks from libc), a SIGUSR1 handler
 * for signals raised inside a recursion, setjmp with longjmp out of that
 * recursion (from the recursion and from the handler), an atexit handler,
 * and exit() called from deep recursion. Prints what it counted. */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static jmp_buf env;
static volatile int handled, jumps, compares;
static volatile int jump_from_handler;
static int table[64];

static int by_value(const void *a, const void *b) {
    compares++;
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static void on_usr1(int sig) {
    handled += sig;
    if (jump_from_handler) {
        jump_from_handler = 0;
        longjmp(env, 2);
    }
}

__attribute__((noinline)) static int descend(int depth, int raise_at, int jump_at) {
    if (depth == raise_at)
        raise(SIGUSR1);
    if (depth == jump_at)
        longjmp(env, 1);
    if (depth == 0)
        return 1;
    int key = depth * 7 % 64;
    int *hit = bsearch(&key, table, 64, sizeof table[0], by_value);
    return descend(depth - 1, raise_at, jump_at) + (hit ? 1 : 0);
}

__attribute__((noinline)) static void leave_deep(int depth, int status) {
    if (depth == 0) {
        printf("handled=%d jumps=%d compares=%d\n", handled, jumps, compares);
        fflush(stdout);
        exit(status);
    }
    leave_deep(depth - 1, status + (depth & 1));
}

static void at_end(void) {
    int sum = 0;
    for (int i = 0; i < 64; i++)
        sum += table[i] & 3;
    printf("atexit sum=%d\n", sum);
}

int main(int argc, char **argv) {
    (void)argv;
    atexit(at_end);
    signal(SIGUSR1, on_usr1);
    for (int i = 0; i < 64; i++)
        table[i] = (i * 37 + argc) % 64;
    qsort(table, 64, sizeof table[0], by_value);
    int total = 0;
    for (int round = 0; round < 6; round++) {
        int r = setjmp(env);
        if (r != 0) {
            jumps++;
            continue;
        }
        jump_from_handler = round % 3 == 2;
        int jump_at = round % 3 == 1 ? 3 : -1;
        total += descend(10 + round, 5, jump_at);
    }
    printf("total=%d\n", total);
    leave_deep(20, 1);
    return 0;
}
