/* exec_self: the traced program execs its own running image
 * (/proc/self/exe, the instrumented copy the recorder started), so the new
 * image is traced too: the trace has a second stream, started by the exec
 * (docs/format.md, THREAD_START reason 3), which `aetrace debug --thread`
 * serves in a session of its own. Both images call `work`; the new one
 * prints its result and exits with status 0. */
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) static int work(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s += (i % 3) ? i : -i;
    return s;
}

int main(int argc, char **argv) {
    if (argc > 1) {
        printf("new image: %d\n", work(10));
        return 0;
    }
    printf("before exec: %d\n", work(100));
    fflush(stdout);
    char *args[] = {argv[0], "again", NULL};
    execv("/proc/self/exe", args);
    perror("execv");
    return 1;
}
