/* exec: the traced process does some work, then replaces itself with a new
 * image (the original program, with an argument telling it to stop), which
 * the recorder follows: rewritten and traced, a second stream started by
 * the exec; the recorder reports the final image's exit status. With the
 * argument `self` it execs its own running
 * image instead (/proc/self/exe, the instrumented copy the recorder
 * started), so the new image is traced too: a second stream, started by
 * the exec (docs/format.md, THREAD_START reason 3, IMAGE). Then each
 * image prints on stderr where its `work` and `counter` are (the two
 * images run at different load bases): the tests' oracle for the
 * addresses of each stream. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int counter;

__attribute__((noinline)) static int work(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s += (i % 3) ? i : -i;
    counter += n;
    return s;
}

/* The image's addresses, on stderr (stdout stays the native output's). */
static void where(const char *image) {
    fprintf(stderr, "%s image: work %p counter %p\n", image, (void *)work, (void *)&counter);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "again") == 0) {
        if (argc > 2)
            where("new");
        printf("new image: %d\n", work(10));
        return 3;
    }
    int self = argc > 1 && strcmp(argv[1], "self") == 0;
    if (self)
        where("first");
    printf("before exec: %d\n", work(1000));
    fflush(stdout);
    char *args[] = {argv[0], "again", self ? "self" : NULL, NULL};
    execv(self ? "/proc/self/exe" : argv[0], args);
    perror("execv");
    return 1;
}
