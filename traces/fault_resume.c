/* Fault handlers that return (issue 21: data traces across them). A
 * SIGSEGV handler makes the faulting page writable and returns, so the
 * faulting store runs again: a write barrier, as garbage collectors and
 * persistent-memory libraries build them. The stores go through a
 * pointer loaded from memory (its value recorded) and through the stack
 * of a callee; the pages are made read-only again each round. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGES 6

static char *region;
static long page;
static volatile int faults;
static char *volatile slots[PAGES];

static void on_segv(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)uc;
    uintptr_t p = (uintptr_t)si->si_addr & ~(uintptr_t)(page - 1);
    if (mprotect((void *)p, page, PROT_READ | PROT_WRITE) != 0)
        _exit(3);
    faults++;
}

/* A callee whose store faults: its frame is live across the handler. */
static __attribute__((noinline)) long store_through(char *volatile *slot, int k, char v) {
    char local[16];
    memset(local, v, sizeof local);
    (*slot)[k] = local[k & 15];
    return local[3] + k;
}

int main(void) {
    page = sysconf(_SC_PAGESIZE);
    region = mmap(NULL, PAGES * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED)
        return 2;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    for (int i = 0; i < PAGES; i++)
        slots[i] = region + i * page;
    long sum = 0;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < PAGES; i++) {
            region[i * page + round] = (char)(i + round);
            sum += store_through(&slots[(i + 1) % PAGES], 8 + round + i, (char)i);
        }
        if (mprotect(region, PAGES * page, PROT_READ) != 0)
            return 4;
    }
    for (int i = 0; i < PAGES * 16; i++)
        sum += region[(i % PAGES) * page + i / PAGES];
    printf("faults %d sum %ld\n", faults, sum);
    return 0;
}
