/* exec: the traced process does some work, then replaces itself with a new
 * image (the original, untraced program, with an argument telling it to
 * stop); the trace ends at the exec and the recorder reports the final
 * image's exit status. With the argument `self` it execs its own running
 * image instead (/proc/self/exe, the instrumented copy the recorder
 * started), so the new image is traced too: a second stream, started by
 * the exec (docs/format.md, THREAD_START reason 3). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) static int work(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s += (i % 3) ? i : -i;
    return s;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "again") == 0) {
        printf("new image: %d\n", work(10));
        return 3;
    }
    printf("before exec: %d\n", work(1000));
    fflush(stdout);
    char *args[] = {argv[0], "again", NULL};
    execv(argc > 1 && strcmp(argv[1], "self") == 0 ? "/proc/self/exe" : argv[0], args);
    perror("execv");
    return 1;
}
