/* exec_script: does some traced work, then execs argv[1] (a `#!` script)
 * with the rest of argv. The kernel runs the script's interpreter, untraced
 * (the trace ends at the exec, like exec.c's); it must see the process as
 * it would natively: no descriptor or variable of the recorder's. */
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) static int work(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s += (i & 1) ? i : -i;
    return s;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: exec_script SCRIPT [ARG...]\n");
        return 2;
    }
    printf("before exec: %d\n", work(100));
    fflush(stdout);
    execv(argv[1], argv + 1);
    perror("execv");
    return 1;
}
