/* Watchpoints across signal handlers (issue 22): a counter written by
 * the program and by handlers that return, by a handler that siglongjmps
 * out, by a nested pair (SIGUSR1's handler sends SIGUSR2) and by a
 * SIGSEGV handler that returns so the faulting store runs again (the
 * counter's store right before it). Every
 * signal is sent by a raw `kill` syscall in the program's own code or
 * raised by one of its instructions, so a native run under gdb stops at
 * the same instructions as its trace. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile long counter;
static sigjmp_buf env;
static char *page;
static long page_size;

__attribute__((noinline)) static void self_kill(int sig) {
    long pid = getpid(), r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(SYS_kill), "D"(pid), "S"((long)sig) : "rcx", "r11", "memory");
    if (r != 0)
        _exit(3);
}

static void on_usr2(int sig) {
    counter += sig;
}

static void on_usr1(int sig) {
    counter += sig;
    self_kill(SIGUSR2);
    counter += 1;
}

static void on_hup(int sig) {
    counter += sig;
    siglongjmp(env, 1);
}

static void on_segv(int sig) {
    counter += sig;
    if (mprotect(page, page_size, PROT_READ | PROT_WRITE) != 0)
        _exit(4);
}

int main(void) {
    page_size = sysconf(_SC_PAGESIZE);
    page = mmap(NULL, page_size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return 2;
    int sigs[] = {SIGUSR1, SIGUSR2, SIGHUP, SIGSEGV};
    void (*handlers[])(int) = {on_usr1, on_usr2, on_hup, on_segv};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    for (int i = 0; i < 4; i++) {
        sa.sa_handler = handlers[i];
        sigaction(sigs[i], &sa, NULL);
    }
    for (int i = 0; i < 3; i++) {
        counter += 1;
        self_kill(SIGUSR1);
        if (sigsetjmp(env, 1) == 0) {
            counter += 2;
            self_kill(SIGHUP);
        }
        counter += 3;
        long v = counter + 4;
        /* A watched store right before a faulting one: natively gdb stops
         * at the watchpoint, then at SIGSEGV, both at the faulting store. */
        __asm__ volatile("movq %2, %0\n\tmovb %b2, (%1)" : "=m"(counter) : "r"(page + i), "r"(v) : "memory");
        if (mprotect(page, page_size, PROT_READ) != 0)
            return 5;
    }
    printf("counter %ld page %d %d %d\n", counter, page[0], page[1], page[2]);
    return 0;
}
