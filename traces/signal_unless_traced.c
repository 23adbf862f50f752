/* A signal only the recorded run takes: the program sends itself SIGUSR1
 * unless a tracer (ptrace) is attached, as anti-debugging code does, with
 * no branch of its own on the answer (`kill` gets signal 0, which only
 * checks the pid, under a tracer). The signal arrives in libc on the way
 * back from `kill`, outside the traced code; `aetrace verify`, which
 * follows the program under ptrace, must name the recorded run's signal
 * at the divergence. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile int handled;

static void on_usr1(int sig) {
    handled += sig;
}

/* TracerPid from /proc/self/status: nonzero under ptrace. */
static int tracer(void) {
    char buf[4096];
    FILE *f = fopen("/proc/self/status", "r");
    int pid = 0;
    if (!f)
        return 0;
    while (fgets(buf, sizeof buf, f))
        if (sscanf(buf, "TracerPid: %d", &pid) == 1)
            break;
    fclose(f);
    return pid;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    int untraced = tracer() == 0;
    kill(getpid(), SIGUSR1 * untraced);
    printf("handled=%d\n", handled);
    return 0;
}
