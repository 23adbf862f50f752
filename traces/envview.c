/* envview: prints the environment as the program and its `--libs` library
 * see it, for the transparency test of `--libs` (which loads the rewritten
 * library through LD_LIBRARY_PATH): every `environ` entry, then what
 * `getenv("LD_LIBRARY_PATH")` returns in main and what the library's
 * constructor saw. A recorded run must print what the native one prints. */
#include <stdio.h>
#include <stdlib.h>

extern char **environ;
const char *envview_lib_seen(void);
int envview_lib_count(const char *s);

int main(void) {
    int n = 0;
    for (char **e = environ; *e; e++, n++)
        printf("env[%d] = \"%s\"\n", n, *e);
    const char *p = getenv("LD_LIBRARY_PATH");
    printf("main: LD_LIBRARY_PATH %s%s%s\n", p ? "= \"" : "unset", p ? p : "", p ? "\"" : "");
    printf("library constructor: %s\n", envview_lib_seen());
    printf("colons: %d\n", envview_lib_count(p ? p : ""));
    return 0;
}
