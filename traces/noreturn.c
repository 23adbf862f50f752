/* Calls to functions that do not return: our own noreturn `fatal` (which
 * calls exit), abort() and __stack_chk_fail-style paths the compiler knows,
 * on branches that are and are not taken. Exits with status 3 via `fatal`. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noreturn, noinline)) static void fatal(const char *msg, int code) {
    printf("fatal: %s\n", msg);
    fflush(stdout);
    exit(code);
}

__attribute__((noinline)) static int checked_div(int a, int b) {
    if (b == 0)
        fatal("division by zero", 3);
    return a / b;
}

__attribute__((noinline)) static int must_be_small(int x) {
    if (x > 1000)
        abort();
    return x * 2;
}

int main(int argc, char **argv) {
    (void)argv;
    int total = 0;
    for (int i = 5; i >= 0; i--) {
        total += must_be_small(i * argc);
        printf("100/%d=%d\n", i, checked_div(100, i));
    }
    printf("unreachable %d\n", total);
    return 0;
}
