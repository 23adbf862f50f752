/* The README's bundled example: a naive and a blocked matrix multiply, whose
 * cache behaviour differs visibly, plus a checksum so the output is an oracle.
 * `demo` runs the naive version, `demo b` the blocked one.
 *
 * The matrices are page-aligned static arrays: their addresses, and so
 * their cache sets, are the same in every run of one build, whatever a tool
 * does with the heap, the libraries and the stack.
 *
 * Two builds. demo.sh's: `gcc -O2 demo.c` (libc's startup, write(2)). The
 * cachegrind comparison's (tests/data_trace.rs): `-DNOLIBC [-DBLOCKED]
 * -static -nostdlib -fno-builtin -fno-stack-protector`, a whole program
 * without libc: every instruction and data reference of the process is the
 * program's. Its _start moves the stack into a page-aligned static array
 * and the variant is chosen at build time, so the process touches no memory
 * the kernel or a tool laid out: every data address is a link-time one, the
 * same under cachegrind as in the recorded run, for any cache geometry. */

#define N 96
#define B 16

static double a[N][N] __attribute__((aligned(4096)));
static double b[N][N] __attribute__((aligned(4096)));
static double c[N][N] __attribute__((aligned(4096)));

static void naive(void) {
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < N; k++)
                s += a[i][k] * b[k][j];
            c[i][j] = s;
        }
}

static void blocked(void) {
    for (int ii = 0; ii < N; ii += B)
        for (int kk = 0; kk < N; kk += B)
            for (int jj = 0; jj < N; jj += B)
                for (int i = ii; i < ii + B; i++)
                    for (int k = kk; k < kk + B; k++) {
                        double r = a[i][k];
                        for (int j = jj; j < jj + B; j++)
                            c[i][j] += r * b[k][j];
                    }
}

static long checksum(void) {
    double s = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            s += c[i][j] * ((i ^ j) & 7);
    return (long)s;
}

#ifdef NOLIBC
static long write(int fd, const void *buf, unsigned long len) {
    long r;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "a"(1), "D"(fd), "S"(buf), "d"(len)
                     : "rcx", "r11", "memory");
    return r;
}
#else
#include <unistd.h>
#endif

/* "naive checksum N\n" or "blocked checksum N\n" on stdout. */
static void report(int blocked_version, long sum) {
    char buf[64];
    int n = 0;
    for (const char *s = blocked_version ? "blocked checksum " : "naive checksum "; *s; s++)
        buf[n++] = *s;
    char digits[24];
    int d = 0;
    do {
        digits[d++] = (char)('0' + sum % 10);
        sum /= 10;
    } while (sum > 0);
    while (d > 0)
        buf[n++] = digits[--d];
    buf[n++] = '\n';
    write(1, buf, n);
}

static int run(int blocked_version) {
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            a[i][j] = (i * 31 + j * 17) % 13;
            b[i][j] = (i * 7 + j * 3) % 11;
        }
    if (blocked_version)
        blocked();
    else
        naive();
    report(blocked_version, checksum());
    return 0;
}

#ifdef NOLIBC
#ifdef BLOCKED
#define BLOCKED_VERSION 1
#else
#define BLOCKED_VERSION 0
#endif

static char stack[1 << 16] __attribute__((aligned(4096), used));

__attribute__((noreturn, used)) static void start_c(void) {
    run(BLOCKED_VERSION);
    __asm__ volatile("syscall\n\thlt" : : "a"(231), "D"(0));
    __builtin_unreachable();
}

__attribute__((naked, noreturn)) void _start(void) {
    __asm__("lea stack+65536(%rip), %rsp\n\t"
            "call start_c\n\t"
            "hlt");
}
#else
int main(int argc, char **argv) {
    return run(argc > 1 && argv[1][0] == 'b');
}
#endif
