/* A `rep` string instruction faulting after some of its iterations
 * (issue 21, docs/data.md "Signals with data"). `rep movsb`, `rep
 * stosb`, `rep movsl` and `rep stosq` write up to K bytes before a
 * PROT_NONE page and run into it (a wide element straddling the page
 * faults whole: none of it is written, maybe no iteration ran); the
 * SIGSEGV handler makes the page writable and returns, and the instruction
 * resumes where it stopped (rsi, rdi and rcx as the K iterations left
 * them). The handler keeps each fault's rcx, rsi and rdi from its context,
 * and the program prints them at the end: an oracle of where each `rep`
 * stopped. With the argument `crash` no handler is installed and the
 * first fault ends the program. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static long page;
static char *guard;
static volatile int faults;
static volatile unsigned long seen[16][3];

/* Only the guard page faults: open it and let the instruction resume. */
static void on_segv(int sig, siginfo_t *info, void *context) {
    (void)sig;
    (void)info;
    const greg_t *g = ((ucontext_t *)context)->uc_mcontext.gregs;
    if (mprotect(guard, page, PROT_READ | PROT_WRITE) != 0)
        _exit(3);
    if (faults < 16) {
        seen[faults][0] = g[REG_RCX];
        seen[faults][1] = g[REG_RSI];
        seen[faults][2] = g[REG_RDI];
    }
    faults++;
}

static __attribute__((noinline)) void copy(char *dst, const char *src, long n) {
    __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

static __attribute__((noinline)) void fill(char *dst, char v, long n) {
    __asm__ volatile("rep stosb" : "+D"(dst), "+c"(n) : "a"(v) : "memory");
}

/* n 4-byte elements. */
static __attribute__((noinline)) void copy4(char *dst, const char *src, long n) {
    __asm__ volatile("rep movsl" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

/* n 8-byte elements. */
static __attribute__((noinline)) void fill8(char *dst, long v, long n) {
    __asm__ volatile("rep stosq" : "+D"(dst), "+c"(n) : "a"(v) : "memory");
}

int main(int argc, char **argv) {
    int crash = argc > 1 && strcmp(argv[1], "crash") == 0;
    page = sysconf(_SC_PAGESIZE);
    char *region = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED)
        return 2;
    guard = region + page;
    if (!crash) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, NULL);
    }
    static char src[64];
    for (int i = 0; i < 64; i++)
        src[i] = (char)(i * 7 + 1);
    long sum = 0;
    for (int k = 3; k <= 11; k += 4) {
        if (mprotect(guard, page, PROT_NONE) != 0)
            return 4;
        copy(region + page - k, src, 24);
        if (mprotect(guard, page, PROT_NONE) != 0)
            return 4;
        fill(region + page - k, (char)k, 16);
        if (mprotect(guard, page, PROT_NONE) != 0)
            return 4;
        copy4(region + page - k, src, 6);
        if (mprotect(guard, page, PROT_NONE) != 0)
            return 4;
        fill8(region + page - k, 0x0101010101010101L * k, 3);
        for (int i = -k; i < 24; i++)
            sum += region[page + i] * (i + 100);
    }
    printf("faults %d sum %ld\n", faults, sum);
    for (int i = 0; i < faults && i < 16; i++)
        printf("fault rcx %lu rsi %lx rdi %lx\n", seen[i][0], seen[i][1], seen[i][2]);
    return 0;
}
