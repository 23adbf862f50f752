/* stackview: prints where the kernel put the initial stack's contents
 * (argv, envp, their strings' end, the auxiliary vector's AT_EXECFN and
 * AT_RANDOM) and a local of main, then its library's answer. With address
 * randomisation off, a run recorded with `--libs` must print what the
 * native run prints: the recorder adds nothing to the environment, so
 * nothing moves the stack (issue 23). */
#include <stdio.h>
#include <string.h>
#include <sys/auxv.h>

extern char **environ;
int stackview_lib_sum(int n);

int main(int argc, char **argv) {
    int local = argc;
    char **e = environ;
    while (*e)
        e++;
    const char *last = e == environ ? argv[argc - 1] : e[-1];
    printf("argv %p envp %p\n", (void *)argv, (void *)environ);
    printf("env strings end %p\n", (void *)(last + strlen(last) + 1));
    printf("AT_EXECFN %p AT_RANDOM %p\n", (void *)getauxval(AT_EXECFN),
           (void *)getauxval(AT_RANDOM));
    printf("main's local %p\n", (void *)&local);
    printf("library: %d\n", stackview_lib_sum(10 + local));
    return 0;
}
