/* fork: the child computes and exits with a status derived from its work;
 * the parent waits and prints. Output order is fixed by waitpid. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static int work(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s = (s * 31 + i) % 251;
    return s;
}

int main(int argc, char **argv) {
    (void)argv;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        printf("child: %d\n", work(1000 * argc));
        fflush(stdout);
        _exit(work(77) % 50);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("parent: child exited %d, own %d\n", WEXITSTATUS(status), work(500));
    return 0;
}
