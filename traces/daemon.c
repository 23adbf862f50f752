/* libc's daemon(): it forks inside libc (untraced code, so no
 * fork_child), the parent exits at once, and the child returns into the
 * traced program on its parent's slot. The recorder must keep that slot
 * (its thread and process are gone, but a child still writes there) and
 * the child's output must come out as natively. */
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) static long work(long n) {
    long x = 1;
    for (long i = 0; i < n; i++)
        x = x * 3 + i;
    return x;
}

int main(void) {
    printf("before %ld\n", work(100));
    fflush(stdout);
    if (daemon(1, 1) != 0)
        return 1;
    usleep(100000); /* the parent has exited by now */
    printf("daemon %ld\n", work(100000));
    fflush(stdout);
    return 0;
}
