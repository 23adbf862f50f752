/* exename: prints the names the process has for its executable, for the
 * transparency tests (a recorded run must print what the native one
 * prints): getauxval(AT_EXECFN), and readlink of /proc/self/exe,
 * /proc/PID/exe and (readlinkat) /proc/thread-self/exe, one cut to 4
 * bytes, one of a bad pointer (EFAULT), and realpath of /proc/self/exe.
 * With -a also its working directory, its descriptors (number and
 * target, a pipe's or socket's as its kind; not the one listing them),
 * the descriptor open returns, its parent's name (comm: a shell's is the
 * base name it was exec'd by) and the addresses of a local, argv[0] and
 * AT_EXECFN's string (equal to the native run's with address
 * randomisation off). */
#define _GNU_SOURCE
#include <dirent.h>
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

/* The working directory, the descriptors and the stack addresses. */
__attribute__((noinline)) static void show_process(char **argv) {
    static char buf[PATH_MAX];
    show("cwd", getcwd(buf, sizeof buf));
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char path[300];
        if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
            continue;
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, buf, sizeof buf - 1);
        buf[n < 0 ? 0 : n] = 0;
        char *colon = strchr(buf, ':');
        if (buf[0] != '/' && colon)
            *colon = 0;
        printf("fd %s: %s\n", e->d_name, buf);
    }
    if (d)
        closedir(d);
    int fd = open("/dev/null", O_RDONLY);
    printf("open: %d\n", fd);
    close(fd);
    snprintf(buf, sizeof buf, "/proc/%d/comm", (int)getppid());
    FILE *comm = fopen(buf, "r");
    if (!comm || !fgets(buf, sizeof buf, comm))
        strcpy(buf, "?\n");
    if (comm)
        fclose(comm);
    printf("parent: %s", buf);
    int local = 0;
    printf("stack: local %p argv[0] %p AT_EXECFN %p\n", (void *)&local, (void *)argv[0],
           (void *)getauxval(AT_EXECFN));
}

int main(int argc, char **argv) {
    static char buf[PATH_MAX];
    char path[64];
    if (argc > 1 && strcmp(argv[1], "-a") == 0)
        show_process(argv);
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
