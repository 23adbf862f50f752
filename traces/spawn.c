/* posix_spawn and system(): glibc creates each child with clone3
 * (CLONE_VM | CLONE_VFORK, a stack of its own), the child runs
 * __spawni_child in its parent's memory and execs. One spawn whose exec
 * fails (the child reports the error and exits 127 before its parent
 * goes on), one of a program that exits 0, and system(), which runs
 * /bin/sh. Deterministic output. */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

extern char **environ;

static int spawn(char *path) {
    char *argv[] = {path, NULL};
    pid_t pid;
    int err = posix_spawn(&pid, path, NULL, NULL, argv, environ);
    if (err != 0)
        return -err;
    int status;
    if (waitpid(pid, &status, 0) != pid)
        return -1000;
    return WEXITSTATUS(status);
}

int main(void) {
    printf("missing: %d\n", spawn("/nonexistent/aetrace-spawn"));
    printf("true: %d\n", spawn("/bin/true"));
    int status = system("exit 3");
    printf("system: %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}
