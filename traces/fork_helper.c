/* fork inside helpers: `spawn` forks and both processes return from it
 * (and from `spawn_tail`, which tail-calls `spawn`), so main's calls to
 * them return once per process. The child computes, prints and exits with
 * a status; the parent waits and prints. Output order is fixed by waitpid. */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile int side;

__attribute__((noinline)) static int work(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s = (s * 31 + i) % 251;
    return s;
}

__attribute__((noinline)) static pid_t spawn(int n) {
    fflush(stdout);
    pid_t p = fork();
    side += p == 0 ? work(n) : 1; /* runs in both processes */
    return p;
}

__attribute__((noinline)) static pid_t spawn_tail(int n) {
    side++;
    return spawn(n + 1);
}

int main(int argc, char **argv) {
    (void)argv;
    for (int round = 0; round < 2; round++) {
        pid_t pid = round ? spawn_tail(argc * 40) : spawn(argc * 30);
        if (pid == 0) {
            printf("child %d: %d\n", round, work(200 + round));
            fflush(stdout);
            _exit(side % 50);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        printf("parent %d: child exited %d, own %d\n", round, WEXITSTATUS(status), work(100));
    }
    return 0;
}
