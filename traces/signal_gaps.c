/* Signals interrupting one of several record-free transfers since the
 * thread's last record (built -fno-plt, so no traced PLT stub writes a
 * witness between two imports' calls):
 *   kill          kill(getpid(), SIGUSR1): the handler runs inside kill,
 *                 whose call follows getpid's with nothing written between
 *                 (lackey is the oracle);
 *   timer-calls N a 20 us SIGALRM timer while a loop calls `calls`, which
 *                 calls getppid and getpid back to back: most signals land
 *                 in one of the two system calls;
 *   timer-twice N the same timer while the loop calls `twice`, a
 *                 procedure without a branch (it writes nothing), two
 *                 times per iteration: most signals land in the second
 *                 run or the first, with no record between them. A store
 *                 of `phase` (1, 2) before each call tells the handler
 *                 which call it interrupted; it prints how many times each.
 * The timer modes print `handled=H iterations=I`: the handler ran H times,
 * and `calls` or `twice` I times. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static volatile long handled;
static volatile unsigned long mix;
static volatile int phase;
static volatile long by_phase[3];

static void on_signal(int sig) {
    handled++;
    by_phase[phase]++;
    mix ^= (unsigned long)sig << (handled & 15);
}

__attribute__((noinline)) static long calls(long x) {
    x += getppid();
    x ^= getpid();
    return x;
}

#define ROUND x = x * 6364136223846793005UL + 1442695040888963407UL; x ^= x >> 29;
#define ROUND8 ROUND ROUND ROUND ROUND ROUND ROUND ROUND ROUND

__attribute__((noinline)) static unsigned long twice(unsigned long x) {
    ROUND8 ROUND8 ROUND8 ROUND8
    return x;
}

static void timer(long us) {
    struct itimerval it = {{0, us}, {0, us}};
    setitimer(ITIMER_REAL, &it, NULL);
}

int main(int argc, char **argv) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    const char *mode = argc > 1 ? argv[1] : "kill";
    long target = argc > 2 ? atol(argv[2]) : 100;
    unsigned long x = 27;
    long iters = 0;
    if (strcmp(mode, "kill") == 0) {
        kill(getpid(), SIGUSR1);
        printf("handled=%ld\n", handled);
        return 0;
    }
    timer(20);
    if (strcmp(mode, "timer-calls") == 0) {
        while (handled < target) {
            x = calls(x);
            iters++;
        }
    } else {
        while (handled < target) {
            phase = 1;
            x = twice(x);
            phase = 2;
            x = twice(x);
            iters += 2;
        }
    }
    timer(0);
    printf("handled=%ld iterations=%ld x=%lu mix=%lu phase0=%ld phase1=%ld phase2=%ld\n",
           handled, iters, x, mix, by_phase[0], by_phase[1], by_phase[2]);
    return 0;
}
