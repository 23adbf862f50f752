/* exec_lib: a program that execs its own running image (/proc/self/exe,
 * the instrumented copy the recorder started), whose new image opens an
 * instrumented library (exec_lib_lib.c as libaeexec.so.1, found through
 * the executable's DT_RUNPATH, traced with `--libs`) and calls into it.
 * With `both` the first image does so too, before the exec: the library
 * attaches in both images, at different addresses with randomisation on.
 * Without it only the new image ever loads the library. docs/format.md,
 * IMAGE. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int call_library(int n) {
    void *h = dlopen("libaeexec.so.1", RTLD_NOW);
    int (*work)(int) = h ? (int (*)(int))dlsym(h, "lib_work") : NULL;
    if (!work) {
        fprintf(stderr, "exec_lib: %s\n", dlerror());
        _exit(2);
    }
    return work(n);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "again") == 0) {
        printf("new image: %d\n", call_library(10));
        return 3;
    }
    if (argc > 1 && strcmp(argv[1], "both") == 0)
        printf("before exec: %d\n", call_library(1000));
    fflush(stdout);
    char *args[] = {argv[0], "again", NULL};
    execv("/proc/self/exe", args);
    perror("execv");
    return 1;
}
