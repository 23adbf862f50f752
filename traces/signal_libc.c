/* A signal handler run while inside libc: SIGUSR1 sent by libc's own
 * `syscall` and `kill` functions (delivered on the syscall's return, so
 * the interrupted instruction is libc's, traced when libc is: `record
 * --libs libc.so.6`). */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile int got;

static void on_usr1(int sig) {
    got += sig;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    for (int i = 0; i < 2; i++) {
        syscall(SYS_kill, getpid(), SIGUSR1);
        kill(getpid(), SIGUSR1);
    }
    printf("got=%d\n", got);
    return 0;
}
