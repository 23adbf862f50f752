/* mapsview: prints what the process sees of its own memory map, for the
 * transparency tests (a recorded run must print what the native one
 * prints). It reads /proc/self/maps as gnulib's c-stack does (open, a
 * buffer mapped after the open, read) and through stdio (fopen, fgets, as
 * glibc's pthread_getattr_np), /proc/PID/maps and /proc/thread-self/maps,
 * and prints what does not depend on where the kernel put things but
 * would differ if the recorder's mappings showed: the number of lines,
 * each line's permissions, offset, device, inode and path, and its own
 * executable's lines with addresses relative to its first. With the
 * argument `raw`, the text as it was read. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Reads the whole file at path with open + read into a buffer mapped
 * after the open (its mapping is in the text natively). */
__attribute__((noinline)) static char *read_maps(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    size_t size = 1 << 20;
    char *buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    size_t n = 0;
    ssize_t r;
    while ((r = read(fd, buf + n, size - 1 - n)) > 0)
        n += r;
    buf[n] = 0;
    close(fd);
    *len = n;
    return buf;
}

/* One line without its addresses; the executable's with them relative to
 * `base`. */
__attribute__((noinline)) static void print_line(const char *line, unsigned long base,
                                                 const char *exe) {
    unsigned long lo, hi, off, ino;
    char perms[8], dev[16], path[4096] = "";
    if (sscanf(line, "%lx-%lx %7s %lx %15s %lu %4095[^\n]", &lo, &hi, perms, &off, dev, &ino,
               path) < 6) {
        printf("unparsed: %s\n", line);
        return;
    }
    if (strcmp(path, exe) == 0)
        printf("+%lx-+%lx ", lo - base, hi - base);
    printf("%s %lx %s %lu %s\n", perms, off, dev, ino, path);
}

__attribute__((noinline)) static void summary(const char *tag, char *text, const char *exe) {
    int lines = 0;
    unsigned long base = 0;
    for (char *l = text; *l; l = strchr(l, '\n') + 1) {
        lines++;
        if (!strchr(l, '\n'))
            break;
    }
    printf("%s: %d lines\n", tag, lines);
    for (char *l = text; *l;) {
        char *end = strchr(l, '\n');
        if (end)
            *end = 0;
        if (!base && strstr(l, exe))
            base = strtoul(l, NULL, 16);
        print_line(l, base, exe);
        if (!end)
            break;
        l = end + 1;
    }
}

int main(int argc, char **argv) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    size_t len;
    char *text = read_maps("/proc/self/maps", &len);
    if (argc > 1 && strcmp(argv[1], "raw") == 0) {
        fwrite(text, 1, len, stdout);
        return 0;
    }
    /* The executable as this run's own maps name it (the recorded run
     * must name the original, as natively). */
    char *exe_line = NULL;
    for (char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strstr(l, " /") && !exe_line)
            exe_line = l;
    char first[4096] = "";
    if (exe_line)
        sscanf(exe_line, "%*s %*s %*s %*s %*s %4095s", first);
    printf("first file: %s\n", first);
    summary("open+read", text, first);

    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)getpid());
    summary("pid", read_maps(path, &len), first);
    summary("thread-self", read_maps("/proc/thread-self/maps", &len), first);

    FILE *f = fopen("/proc/self/maps", "re");
    if (!f) {
        perror("fopen");
        return 1;
    }
    char line[4200];
    int lines = 0;
    while (fgets(line, sizeof line, f))
        lines++;
    fclose(f);
    printf("fopen+fgets: %d lines\n", lines);
    int fd = open("/proc/self/maps", O_RDONLY);
    printf("open returned %d, writable: %s\n", fd,
           write(fd, "x", 1) < 0 ? "no" : "yes");
    return 0;
}
