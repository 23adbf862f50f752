/* popen()/pclose() with an untraced libc: each stream's shell is
 * followed, and what the shell runs. A command's output read through
 * "r", lines written through "w" to cat, two "w" streams open at once
 * (the second child must not hold the first's pipe, or the first
 * pclose would wait forever), a status that is its exit code, a missing
 * command (the shell's 127), an invalid mode (EINVAL, nothing spawned).
 * Deterministic output (stdout flushed before each child writes to
 * it). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

static void report(const char *what, int status) {
    if (status != -1 && WIFEXITED(status))
        printf("%s: exit %d\n", what, WEXITSTATUS(status));
    else
        printf("%s: status %#x\n", what, status);
}

static void read_from(const char *command) {
    fflush(stdout);
    FILE *f = popen(command, "r");
    if (!f) {
        printf("%s: popen failed: %s\n", command, strerror(errno));
        return;
    }
    char line[256];
    while (fgets(line, sizeof line, f))
        printf("read: %s", line);
    report(command, pclose(f));
}

int main(void) {
    read_from("/bin/echo from the shell");
    read_from("exit 3");
    read_from("/nonexistent/aetrace-popen 2>/dev/null");

    fflush(stdout);
    FILE *first = popen("/bin/cat", "w");
    FILE *second = popen("/bin/cat", "we");
    if (!first || !second)
        return 1;
    fputs("to the first cat\n", first);
    fputs("to the second cat\n", second);
    report("first cat", pclose(first));
    report("second cat", pclose(second));

    errno = 0;
    FILE *bad = popen("/bin/true", "rw");
    printf("mode rw: %s, %s\n", bad ? "a stream" : "NULL", strerror(errno));
    return 0;
}
