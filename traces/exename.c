/* exename: prints the names the process has for its executable, for the
 * transparency tests (a recorded run must print what the native one
 * prints): getauxval(AT_EXECFN), and readlink of /proc/self/exe,
 * /proc/PID/exe and (readlinkat) /proc/thread-self/exe, one cut to 4
 * bytes, one of a bad pointer (EFAULT), and realpath of /proc/self/exe. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

__attribute__((noinline)) static void show(const char *what, const char *text) {
    printf("%s: %s\n", what, text ? text : "(null)");
}

__attribute__((noinline)) static void show_link(const char *what, ssize_t n, const char *buf) {
    if (n < 0)
        printf("%s: error %s\n", what, strerror(errno));
    else
        printf("%s: %.*s (%zd bytes)\n", what, (int)n, buf, n);
}

int main(void) {
    static char buf[PATH_MAX];
    char path[64];
    show("AT_EXECFN", (const char *)getauxval(AT_EXECFN));
    show_link("/proc/self/exe", readlink("/proc/self/exe", buf, sizeof buf), buf);
    snprintf(path, sizeof path, "/proc/%d/exe", (int)getpid());
    show_link("/proc/PID/exe", readlink(path, buf, sizeof buf), buf);
    show_link("/proc/thread-self/exe",
              readlinkat(AT_FDCWD, "/proc/thread-self/exe", buf, sizeof buf), buf);
    show_link("cut to 4", readlink("/proc/self/exe", buf, 4), buf);
    show_link("bad pointer", readlink((const char *)8, buf, sizeof buf), buf);
    char *real = realpath("/proc/self/exe", NULL);
    show("realpath", real);
    free(real);
    return 0;
}
