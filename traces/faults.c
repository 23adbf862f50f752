/* The programs of tests/faults.rs: recordings that fail, are killed or
 * interrupted, and runs at the recorder's limits. Each mode prints what
 * it did, so the recorded run's output and status can be compared with
 * the native run's.
 *
 *   faults gate N1 N2 FILE  N1 branchy iterations, "phase1 SUM", waits for
 *                           a line on stdin, N2 more, writes "SUM" to FILE,
 *                           "done SUM", exit 3
 *   faults sigint handler|default
 *                           "ready", then branchy work until SIGINT (a
 *                           handler: "caught N", exit 42) or 20 s
 *   faults exec N           execs itself N times, then "exec done"
 *   faults fork N           forks N children one after another, each
 *                           exiting with its own status; "forks N sum S"
 *   faults threads N        N threads alive at once, then "threads N sum S"
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Branchy, hard-to-compress work: a witness per iteration, random. */
static unsigned long work(unsigned long n, unsigned long seed) {
    unsigned long s = seed, acc = 0;
    for (unsigned long i = 0; i < n; i++) {
        s = s * 6364136223846793005UL + 1442695040888963407UL;
        if ((s >> 33) & 1)
            acc += s >> 40;
        else
            acc ^= s >> 20;
    }
    return acc;
}

static int gate(unsigned long n1, unsigned long n2, const char *file) {
    unsigned long a = work(n1, 1);
    printf("phase1 %lu\n", a);
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    unsigned long b = work(n2, a);
    FILE *f = fopen(file, "w");
    if (!f)
        return 2;
    fprintf(f, "%lu\n", b);
    fclose(f);
    printf("done %lu\n", b);
    return 3;
}

static volatile sig_atomic_t interrupted;

static void on_int(int sig) {
    (void)sig;
    interrupted++;
}

static int sigint(const char *how) {
    if (strcmp(how, "handler") == 0)
        signal(SIGINT, on_int);
    printf("ready\n");
    fflush(stdout);
    time_t end = time(NULL) + 20;
    unsigned long acc = 0;
    /* Mostly asleep: under load SIGINT may come seconds late, and every
       traced instruction until then is in the trace the test regenerates
       into memory. */
    while (!interrupted && time(NULL) < end) {
        acc += work(100, acc);
        usleep(1000);
    }
    if (interrupted) {
        /* A second SIGINT (forwarded twice) would show in the count. */
        usleep(200000);
        printf("caught %d\n", (int)interrupted);
        return 42;
    }
    printf("not interrupted\n");
    return 0;
}

static int exec_self(char **argv, int n) {
    work(1000, (unsigned long)n);
    if (n == 0) {
        printf("exec done\n");
        return 0;
    }
    char next[16];
    snprintf(next, sizeof next, "%d", n - 1);
    char *args[] = {argv[0], "exec", next, NULL};
    execv("/proc/self/exe", args);
    perror("execv");
    return 1;
}

static int forks(int n) {
    long sum = 0;
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p < 0) {
            perror("fork");
            return 1;
        }
        if (p == 0)
            _exit((int)(work(100 + i % 50, (unsigned long)i) % 7));
        int st;
        if (waitpid(p, &st, 0) != p || !WIFEXITED(st))
            return 1;
        sum += WEXITSTATUS(st);
    }
    printf("forks %d sum %ld\n", n, sum);
    return 0;
}

static pthread_barrier_t all_alive;

static void *thread(void *arg) {
    unsigned long *r = arg;
    *r = work(1000, *r);
    /* Every thread is alive (and has written) before any exits. */
    pthread_barrier_wait(&all_alive);
    return NULL;
}

static int threads(int n) {
    pthread_t *t = calloc(n, sizeof *t);
    unsigned long *r = calloc(n, sizeof *r), sum = 0;
    pthread_barrier_init(&all_alive, NULL, n);
    for (int i = 0; i < n; i++) {
        r[i] = i;
        if (pthread_create(&t[i], NULL, thread, &r[i]) != 0)
            return 1;
    }
    for (int i = 0; i < n; i++) {
        pthread_join(t[i], NULL);
        sum += r[i];
    }
    printf("threads %d sum %lu\n", n, sum);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "gate") == 0)
        return gate(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0), argv[4]);
    if (argc == 3 && strcmp(argv[1], "sigint") == 0)
        return sigint(argv[2]);
    if (argc == 3 && strcmp(argv[1], "exec") == 0)
        return exec_self(argv, atoi(argv[2]));
    if (argc == 3 && strcmp(argv[1], "fork") == 0)
        return forks(atoi(argv[2]));
    if (argc == 3 && strcmp(argv[1], "threads") == 0)
        return threads(atoi(argv[2]));
    fprintf(stderr, "usage: faults gate|sigint|exec|fork|threads ...\n");
    return 64;
}
