/* pthread_atfork handlers in traced code: `prepare` and `parent` run in
 * the parent around each fork, `child` in the child before fork returns
 * there, i.e. before the child's runtime claims its own slot after the
 * call. Each handler does some branchy work, so it writes witnesses. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile int acc;

__attribute__((noinline)) static void work(int n) {
    for (int i = 0; i < n; i++)
        acc = (i & 1) ? acc * 3 + i : acc / 2;
}

static void prepare(void) { work(3); }
static void parent(void) { work(5); }
static void child(void) { work(7); }

int main(void) {
    pthread_atfork(prepare, parent, child);
    for (int i = 0; i < 3; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid == 0) {
            work(11);
            printf("child %d: %d\n", i, acc);
            fflush(stdout);
            _exit(0);
        }
        waitpid(pid, NULL, 0);
    }
    printf("parent: %d\n", acc);
    return 0;
}
