/* exec_chain: does some traced work, then runs argv[1] with the rest of
 * argv through libc's exec family: `execvp` (a name looked up on PATH, or
 * a path), or with `-l` `execl(argv[2], argv[2], "l", "2", "3", "4", "5",
 * NULL)` (its last two arguments on the stack), with `-e`
 * `execve(argv[2], argv + 2, environ)`, with `-b` the same with a bad
 * pointer after argv[2] (EFAULT once the program is found). What it runs
 * (an ELF program, a `#!` script) is followed by the recorder; when the
 * exec fails it prints the native errno's text and its working directory
 * and exits 1. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

__attribute__((noinline)) static int work(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s += (i % 3) ? i : -i;
    return s;
}

int main(int argc, char **argv) {
    if (argc < 2 || (argv[1][0] == '-' && argc < 3)) {
        fprintf(stderr, "usage: exec_chain [-l|-e|-b] PROGRAM [ARG...]\n");
        return 2;
    }
    printf("before exec: %d\n", work(60));
    fflush(stdout);
    if (strcmp(argv[1], "-l") == 0)
        execl(argv[2], argv[2], "l", "2", "3", "4", "5", (char *)NULL);
    else if (strcmp(argv[1], "-e") == 0)
        execve(argv[2], argv + 2, environ);
    else if (strcmp(argv[1], "-b") == 0)
        execve(argv[2], (char *[]){argv[2], (char *)8, NULL}, environ);
    else
        execvp(argv[1], argv + 1);
    int e = errno;
    char cwd[PATH_MAX];
    printf("exec %s: %s (in %s)\n", argv[argc > 2 && argv[1][0] == '-' ? 2 : 1], strerror(e),
           getcwd(cwd, sizeof cwd) ? cwd : "?");
    return 1;
}
