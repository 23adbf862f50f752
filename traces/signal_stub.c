/* A second signal inside the first one's handler stub. A 25 us SIGUSR1
 * timer keeps the thread entering `on_usr1`, while a 20 us SIGALRM timer
 * strikes anywhere: now and then within the instructions of `on_usr1`'s
 * outside-entry stub before it writes the SIGUSR1 record. `phase` is 1
 * around an indirect call to libc's `labs` (a few instructions of
 * untraced code) and 2 for the rest of the loop, traced code that writes
 * no record either (built -fno-plt): straight-line work in `main` (with
 * the transfer count of the `labs` call), then in `step`. `on_alarm`
 * counts the phase it interrupted (a SIGALRM nested in `on_usr1`'s stub
 * stands where SIGUSR1 struck). Prints `handled=H usr1=U iterations=I
 * phase0= phase1= phase2=`: H SIGALRMs, U SIGUSR1s, I loop iterations
 * (one `step` call each). The loop ends after `target` SIGALRMs or 20
 * times as many SIGUSR1s. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static volatile long handled, usr1;
static volatile int phase;
static volatile long by_phase[3];
static long (*volatile untraced)(long) = labs;

static void on_alarm(int sig) {
    handled++;
    by_phase[phase]++;
    (void)sig;
}

static void on_usr1(int sig) {
    usr1++;
    (void)sig;
}

#define ROUND x = x * 6364136223846793005UL + 1442695040888963407UL; x ^= x >> 29;
#define ROUND8 ROUND ROUND ROUND ROUND ROUND ROUND ROUND ROUND
#define ROUND64 ROUND8 ROUND8 ROUND8 ROUND8 ROUND8 ROUND8 ROUND8 ROUND8

/* One block of straight-line work: most of the loop's time, few blocks. */
__attribute__((noinline)) static unsigned long step(unsigned long x) {
    ROUND64 ROUND64
    return x;
}

int main(int argc, char **argv) {
    long target = argc > 1 ? atol(argv[1]) : 1000;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_SIGNAL;
    ev.sigev_signo = SIGUSR1;
    timer_t usr1_timer;
    timer_create(CLOCK_MONOTONIC, &ev, &usr1_timer);
    struct itimerspec fast = {{0, 25000}, {0, 25000}};
    timer_settime(usr1_timer, 0, &fast, NULL);
    struct itimerval it = {{0, 20}, {0, 20}};
    setitimer(ITIMER_REAL, &it, NULL);
    unsigned long x = 27;
    long iters = 0;
    /* Also bounded by SIGUSR1s: on a kernel 6.18 VM the SIGALRMs once came
     * so slowly that 27,000 SIGUSR1s came first, and the debugger's test,
     * which continues to every signal, ran for minutes. */
    while (handled < target && usr1 < 20 * target) {
        phase = 1;
        x ^= (unsigned long)untraced((long)x);
        phase = 2;
        /* As much work in main before the call, with the count of the
         * call to `labs`: a SIGALRM nested in `on_usr1`'s stub reported
         * in the stub fits that call's gap. */
        ROUND64 ROUND64
        x = step(x);
        iters++;
    }
    /* No handler after the loop (the timers are stopped with both
     * signals blocked): the counts are the loop's. */
    phase = 0;
    sigset_t both;
    sigemptyset(&both);
    sigaddset(&both, SIGALRM);
    sigaddset(&both, SIGUSR1);
    sigprocmask(SIG_BLOCK, &both, NULL);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    timer_delete(usr1_timer);
    printf("handled=%ld usr1=%ld iterations=%ld x=%lu phase0=%ld phase1=%ld phase2=%ld\n",
           handled, usr1, iters, x, by_phase[0], by_phase[1], by_phase[2]);
    return 0;
}
