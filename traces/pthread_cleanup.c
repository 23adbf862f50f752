/* C cleanup handlers run by glibc's forced unwind: `pthread_cleanup_push`
 * without -fexceptions calls `__sigsetjmp`, and `pthread_exit` or a
 * cancellation `longjmp`s back into each level from inside libc
 * (`unwind_stop`), where no traced code writes a LONGJMP. One thread
 * recurses five levels, each with its own handler, and calls
 * `pthread_exit` at the bottom; another waits in `pause` with handlers
 * at three levels and is cancelled (in `pause`, or at once if the cancel
 * comes first). Prints what the handlers saw. */
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <unistd.h>

static int cleaned;
static int cancelled;
static sem_t ready;

static void cleanup(void *arg)
{
    cleaned += (int)(long)arg;
}

static void uncancel(void *arg)
{
    cancelled = cancelled * 10 + (int)(long)arg;
}

__attribute__((noinline)) static int depth(int n)
{
    int r = 0;
    pthread_cleanup_push(cleanup, (void *)(long)n);
    if (n == 0)
        pthread_exit((void *)7);
    r = depth(n - 1) + 1;
    pthread_cleanup_pop(0);
    return r;
}

static void *exiting(void *arg)
{
    (void)arg;
    return (void *)(long)depth(5);
}

__attribute__((noinline)) static void wait_here(int n)
{
    pthread_cleanup_push(uncancel, (void *)(long)n);
    if (n == 0) {
        sem_post(&ready);
        for (;;) {
            pause();
            pthread_testcancel();
        }
    }
    wait_here(n - 1);
    pthread_cleanup_pop(0);
}

static void *waiting(void *arg)
{
    (void)arg;
    wait_here(2);
    return NULL;
}

int main(void)
{
    pthread_t t;
    void *v;
    pthread_create(&t, NULL, exiting, NULL);
    pthread_join(t, &v);
    printf("exit %ld cleaned %d\n", (long)v, cleaned);
    sem_init(&ready, 0, 0);
    pthread_create(&t, NULL, waiting, NULL);
    sem_wait(&ready);
    pthread_cancel(t);
    pthread_join(t, &v);
    printf("cancelled %d %s\n", cancelled, v == PTHREAD_CANCELED ? "yes" : "no");
    return 0;
}
