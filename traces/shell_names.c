/* shell_names: runs a program (argv[1], with -a) through system(),
 * through popen(..., "r") (its output read and printed) and through
 * posix_spawn, and prints each status. For the transparency tests, whose
 * program is traces/exename.c's: a child of a followed shell sees the
 * native run's names, working directory, descriptors and stack, and its
 * parent's name, the shell's (the base name the shell was exec'd by).
 * The command ends in "; exit" so that the shell forks the program (dash
 * runs a command's last simple command by exec, without a fork). */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* Flushed before each child writes to the same stdout. */
static void heading(const char *how) {
    printf("%s:\n", how);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: shell_names PROGRAM\n");
        return 2;
    }
    char command[4096];
    snprintf(command, sizeof command, "%s -a; exit", argv[1]);
    heading("system");
    printf("system: status %#x\n", system(command));
    heading("popen");
    FILE *f = popen(command, "r");
    if (!f) {
        printf("popen failed\n");
        return 1;
    }
    char line[4096];
    while (fgets(line, sizeof line, f))
        printf("read: %s", line);
    printf("popen: status %#x\n", pclose(f));
    heading("posix_spawn");
    char *args[] = {argv[1], "-a", NULL};
    pid_t pid;
    int err = posix_spawn(&pid, argv[1], NULL, NULL, args, environ);
    int status = -1;
    if (err != 0)
        printf("posix_spawn: %s\n", strerror(err));
    else if (waitpid(pid, &status, 0) == pid)
        printf("posix_spawn: status %#x\n", status);
    return 0;
}
