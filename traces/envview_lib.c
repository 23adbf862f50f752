/* The library of envview.c: its constructor reads LD_LIBRARY_PATH after
 * the executable's runtime init has run (ld.so runs the executable's
 * preinit array first). */
#include <stdio.h>
#include <stdlib.h>

static char seen[512];

__attribute__((constructor)) static void envview_lib_init(void) {
    const char *p = getenv("LD_LIBRARY_PATH");
    snprintf(seen, sizeof seen, "LD_LIBRARY_PATH %s%s%s", p ? "= \"" : "unset", p ? p : "",
             p ? "\"" : "");
}

const char *envview_lib_seen(void) { return seen; }

int envview_lib_count(const char *s) {
    int n = 0;
    for (; *s; s++)
        n += *s == ':';
    return n;
}
