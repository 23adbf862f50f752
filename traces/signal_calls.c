/* Signals delivered synchronously (raise, kill(getpid())) to handlers that
 * call traced functions, one of them installed with SA_SIGINFO; the
 * interrupted code is a loop in traced code that calls raise/kill. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile long acc;
static volatile int info_codes;

__attribute__((noinline)) static long fib(int n) {
    return n < 2 ? n : fib(n - 1) + fib(n - 2);
}

__attribute__((noinline)) static void account(int sig, int k) {
    for (int i = 0; i < k; i++)
        acc += (sig * i) % 7;
}

static void on_usr1(int sig) {
    account(sig, 5);
    acc += fib(8);
}

static void on_usr2(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    if (si->si_signo == sig)
        info_codes += si->si_code == SI_USER ? 2 : 1;
    account(sig, 3);
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_usr2;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGUSR2, &sa, NULL);
    long s = 0;
    for (int i = 0; i < 40; i++) {
        s += i * 3;
        if (i % 7 == 0)
            raise(SIGUSR1);
        else if (i % 11 == 0)
            kill(getpid(), SIGUSR2);
    }
    printf("s=%ld acc=%ld info=%d\n", s, acc, info_codes);
    return 0;
}
