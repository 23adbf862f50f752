/* A `rep` string instruction stopped between its iterations by an
 * asynchronous signal (issue 21, docs/data.md "Signals with data"). A
 * 20 us interval timer (SIGALRM) fires while `rep stosq` and `rep movsb`
 * fill fresh pages (each page's first touch is a page fault, where a
 * pending signal is delivered, rip at the `rep`, its registers as the
 * iterations before left them). The handler keeps, per delivery, whether
 * it interrupted one of the two (the context's rip at its label) and
 * that context's rcx, rsi and rdi; the program prints them at the end
 * (up to MAX deliveries), and the two `rep`s' addresses: where each
 * interrupted `rep` stopped, the oracle of the test. It stops after 6
 * such deliveries (or 400 rounds). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <ucontext.h>

#define BYTES (64 * 1024)
#define MAX 4096

/* The two `rep`s' addresses (local labels: no symbol splits their
 * functions). */
extern const unsigned long rep_sites[2];
__asm__(".pushsection .rodata\n\t.p2align 3\nrep_sites:\n\t"
        ".quad .Lstos_site, .Lmovs_site\n\t.popsection");

static volatile int deliveries, stopped;
static volatile unsigned long seen[MAX][4];
static volatile long handled[8];

static void on_alarm(int sig, siginfo_t *info, void *context) {
    (void)sig;
    (void)info;
    const greg_t *g = ((ucontext_t *)context)->uc_mcontext.gregs;
    unsigned long rip = (unsigned long)g[REG_RIP];
    int at = rip == rep_sites[0] ? 1 : rip == rep_sites[1] ? 2 : 0;
    handled[deliveries & 7] += at;
    if (deliveries < MAX) {
        seen[deliveries][0] = (unsigned long)at;
        seen[deliveries][1] = (unsigned long)g[REG_RCX];
        seen[deliveries][2] = (unsigned long)g[REG_RSI];
        seen[deliveries][3] = (unsigned long)g[REG_RDI];
    }
    deliveries++;
    stopped += at != 0;
}

/* n 8-byte elements. */
static __attribute__((noinline)) void fill8(char *dst, long v, long n) {
    __asm__ volatile(".Lstos_site: rep stosq" : "+D"(dst), "+c"(n) : "a"(v) : "memory");
}

static __attribute__((noinline)) void copy(char *dst, const char *src, long n) {
    __asm__ volatile(".Lmovs_site: rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

int main(void) {
    static char src[BYTES / 4];
    for (int i = 0; i < BYTES / 4; i++)
        src[i] = (char)(i * 7 + 1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_alarm;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval t = {{0, 20}, {0, 20}};
    setitimer(ITIMER_REAL, &t, NULL);
    long sum = 0;
    int round = 0;
    for (; round < 400 && stopped < 6; round++) {
        char *region = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (region == MAP_FAILED)
            return 2;
        fill8(region, 0x0101010101010101L * (round & 15), BYTES / 8 / 2);
        copy(region + BYTES / 2, src, BYTES / 4);
        sum += region[round % BYTES] + region[BYTES / 2 + round % (BYTES / 4)];
        munmap(region, BYTES);
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("rounds %d deliveries %d stopped %d sum %ld\n", round, deliveries, stopped, sum);
    printf("sites %lx %lx\n", rep_sites[0], rep_sites[1]);
    for (int i = 0; i < deliveries && i < MAX; i++)
        printf("signal %lu rcx %lu rsi %lx rdi %lx\n", seen[i][0], seen[i][1], seen[i][2], seen[i][3]);
    return 0;
}
