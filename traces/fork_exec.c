/* A process that forks a child which execs another program (/bin/true)
 * and waits for it: in a static program the child's stream ends inside
 * libc's traced `execve`, whose system call never returns. */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/true", "true", (char *)0);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}
