/* procview: prints what the process sees of itself, for the transparency
 * tests (a recorded run must print what the native one prints): its argv,
 * its whole environment, its open descriptors (from /proc/self/fd, with
 * their targets, digits dropped: pipe and /proc numbers differ between
 * runs), the descriptor open() returns, and how many auxiliary vector
 * entries it got. Also a `#!` interpreter: argv then holds its argument
 * and the script. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

__attribute__((noinline)) static void print_target(const char *name) {
    char path[64], target[256];
    snprintf(path, sizeof path, "/proc/self/fd/%s", name);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0)
        n = 0;
    target[n] = 0;
    printf("fd %s -> ", name);
    for (char *c = target; *c; c++)
        if (*c < '0' || *c > '9')
            putchar(*c);
    putchar('\n');
}

static int by_number(const void *a, const void *b) {
    return atoi(*(char *const *)a) - atoi(*(char *const *)b);
}

__attribute__((noinline)) static void descriptors(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) {
        perror("opendir");
        exit(1);
    }
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256)
        if (e->d_name[0] != '.')
            names[n++] = strdup(e->d_name);
    qsort(names, n, sizeof *names, by_number);
    for (int i = 0; i < n; i++)
        if (atoi(names[i]) != dirfd(d))
            print_target(names[i]);
    closedir(d);
}

int main(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        printf("argv[%d] = \"%s\"\n", i, argv[i]);
    int envc = 0;
    for (char **e = environ; *e; e++, envc++)
        printf("env %s\n", *e);
    printf("%d variables\n", envc);
    descriptors();
    int fd = open("/dev/null", O_RDONLY);
    printf("open returned %d\n", fd);
    FILE *aux = fopen("/proc/self/auxv", "rb");
    unsigned long pair[2];
    int auxc = 0;
    while (aux && fread(pair, sizeof pair, 1, aux) == 1 && pair[0] != 0)
        auxc++;
    printf("%d auxv entries\n", auxc);
    return 0;
}
