/* vfork: the child runs in its parent's memory (and on its stack) until it
 * calls _exit or exec; the parent waits and prints the child's status. */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    (void)argv;
    pid_t pid = vfork();
    if (pid == 0)
        _exit(argc + 2);
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child exited %d\n", WEXITSTATUS(status));
    return 0;
}
