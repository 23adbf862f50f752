/* What a program sees of its signal dispositions (issue 23, point 2):
 * queries the signals a crash raises at start, installs and restores
 * handlers with sigaction, signal and sysv_signal (one-shot, raised
 * once; not SIGTRAP, which a single-stepping oracle takes for its own), ignores some, checks a fork child's and an exec'd image's view
 * (argv[1] "view": print the dispositions and exit), sets SIGSEGV back
 * to SIG_DFL after a handler of its own, then stores through a null
 * pointer ("segv"; "live" ends normally instead). Every line is the
 * program's own view, compared with the native run's. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int *volatile null_ptr;
static const int crash_signals[] = {SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGSYS};
static volatile sig_atomic_t caught;

static void on_signal(int sig) {
    caught = sig;
}

static void on_info(int sig, siginfo_t *info, void *uc) {
    (void)info;
    (void)uc;
    caught = sig;
}

static const char *kind(void (*h)(int)) {
    if (h == SIG_DFL)
        return "SIG_DFL";
    if (h == SIG_IGN)
        return "SIG_IGN";
    if (h == on_signal)
        return "on_signal";
    if (h == (void (*)(int))on_info)
        return "on_info";
    return "another handler";
}

/* One signal's disposition as the program sees it: the handler, the
 * flags, the mask's first 64 signals, whether a restorer is set. */
static void show(const char *when, int sig) {
    struct sigaction sa;
    if (sigaction(sig, NULL, &sa) != 0) {
        printf("%s: sigaction(%d) failed\n", when, sig);
        return;
    }
    unsigned long long mask = 0;
    for (int s = 1; s <= 64; s++)
        if (sigismember(&sa.sa_mask, s) == 1)
            mask |= 1ull << (s - 1);
    printf("%s: %d %s flags=%#x mask=%#llx restorer=%d\n", when, sig, kind(sa.sa_handler),
           (unsigned)sa.sa_flags, mask, sa.sa_restorer != NULL);
}

static void show_all(const char *when) {
    for (size_t i = 0; i < sizeof crash_signals / sizeof crash_signals[0]; i++)
        show(when, crash_signals[i]);
}

/* sigaction: install with flags and a mask, read it back, restore. */
static void with_sigaction(void) {
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_info;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR1);
    sigaddset(&sa.sa_mask, SIGBUS);
    sigaction(SIGSEGV, &sa, &old);
    printf("old SIGSEGV %s flags=%#x\n", kind(old.sa_handler), (unsigned)old.sa_flags);
    show("installed", SIGSEGV);
    sigaction(SIGSEGV, &old, NULL);
    show("restored", SIGSEGV);
}

/* signal: each call returns the one before. */
static void with_signal(void) {
    printf("signal(SIGFPE, on_signal) was %s\n", kind(signal(SIGFPE, on_signal)));
    printf("signal(SIGFPE, SIG_IGN) was %s\n", kind(signal(SIGFPE, SIG_IGN)));
    printf("signal(SIGFPE, SIG_DFL) was %s\n", kind(signal(SIGFPE, SIG_DFL)));
    show("signal", SIGFPE);
    printf("signal(SIGBUS, SIG_IGN) was %s\n", kind(signal(SIGBUS, SIG_IGN)));
    printf("signal(SIGSYS, SIG_DFL) was %s\n", kind(signal(SIGSYS, SIG_DFL)));
    /* One-shot: the kernel resets it to SIG_DFL as it runs. */
    printf("sysv_signal(SIGSYS) was %s\n", kind(sysv_signal(SIGSYS, on_signal)));
    raise(SIGSYS);
    printf("caught %d\n", caught);
    show("one-shot", SIGSYS);
}

/* A fork child inherits the dispositions; an exec'd image keeps only
 * the ignored ones. */
static void child_views(const char *self) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        show_all("child");
        fflush(stdout);
        execl(self, self, "view", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    printf("child status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "segv";
    if (strcmp(how, "view") == 0) {
        show_all("exec");
        return 0;
    }
    show_all("start");
    with_sigaction();
    with_signal();
    child_views(argv[0]);
    show_all("end");
    /* A handler of its own, then SIG_DFL again: the crash still ends
     * the run natively. */
    signal(SIGSEGV, on_signal);
    signal(SIGSEGV, SIG_DFL);
    fflush(stdout);
    if (strcmp(how, "segv") == 0)
        *null_ptr = 1;
    return 0;
}
