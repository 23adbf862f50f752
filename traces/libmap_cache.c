/* libmap_cache: where zlib's code, libc's printf, an anonymous mmap and a
 * 1 MiB malloc are, then its /proc/self/maps, for the transparency test of
 * `record --libs libz.so.1` (issue 23). zlib is found natively through
 * /etc/ld.so.cache, which ld.so maps while it searches for zlib and unmaps
 * at the end of start-up; the rewritten copy is found first in the copy's
 * own search path, so the loader has to be made to read its cache there
 * all the same, or zlib and what follows land 0x9000 bytes higher. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

const char *zlibVersion(void);

int main(void) {
    void *anon = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void *big = malloc(1 << 20);
    if (anon == MAP_FAILED || big == NULL)
        return 1;
    printf("zlib's code at %p\n", (void *)zlibVersion);
    printf("libc's printf at %p\n", (void *)printf);
    printf("mmap at %p\n", anon);
    printf("malloc at %p\n", big);
    FILE *maps = fopen("/proc/self/maps", "r");
    if (maps == NULL)
        return 1;
    char line[4096];
    while (fgets(line, sizeof line, maps))
        fputs(line, stdout);
    return fclose(maps) != 0;
}
