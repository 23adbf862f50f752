/* bench/readlink.sh: N readlink calls on an ordinary symlink (argv[2], its
 * path copied to a stack buffer), through libc's readlink, which the
 * rewriter precedes with the runtime's exe_path hook (docs/runtime.md
 * section 5, "/proc/self/exe"), or with argv[3] = "raw" through
 * syscall(SYS_readlink), which it does not: the difference is the hook's
 * cost. Prints the bytes read in total, so a call that failed is seen. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    int raw = argc > 3 && strcmp(argv[3], "raw") == 0;
    char path[256], buf[256];
    snprintf(path, sizeof path, "%s", argc > 2 ? argv[2] : "/proc/self/cwd");
    long total = 0;
    for (long i = 0; i < n; i++) {
        long r = raw ? syscall(SYS_readlink, path, buf, sizeof buf)
                     : readlink(path, buf, sizeof buf);
        if (r < 0)
            return 1;
        total += r;
    }
    printf("read %ld bytes\n", total);
    return 0;
}
