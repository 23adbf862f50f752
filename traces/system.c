/* system() with an untraced libc: each call's shell is followed, and
 * what the shell runs. A command that runs /bin/echo, one whose status
 * is its exit code, a missing command (the shell's 127), system(NULL)
 * (a shell is there). Deterministic output (stdout flushed before each
 * child writes to it). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

static void run(const char *command) {
    fflush(stdout);
    int status = system(command);
    if (WIFEXITED(status))
        printf("%s: exit %d\n", command, WEXITSTATUS(status));
    else
        printf("%s: status %#x\n", command, status);
}

int main(void) {
    run("/bin/echo from the shell");
    run("exit 3");
    run("/nonexistent/aetrace-system 2>/dev/null");
    printf("system(NULL): %d\n", system(NULL));
    return 0;
}
