/* A caller that moves rsp by a register (alloca) before its calls: on a
 * control-only trace its callees' frames have no address, its own and its
 * callers' do (docs/debug.md, "Frames' addresses without data"). Prints a
 * checksum. */
#include <alloca.h>
#include <stdio.h>
#include <string.h>

static __attribute__((noinline)) int weigh(const char *s) {
    int n = (int)strlen(s);
    return n * 3;
}

static __attribute__((noinline)) int fill(int n) {
    char *buf = alloca(n);
    memset(buf, 'a', n - 1);
    buf[n - 1] = 0;
    int r = weigh(buf);
    r += weigh(buf + 1);
    return r;
}

int main(int argc, char **argv) {
    (void)argv;
    int r = fill(argc + 40);
    printf("r=%d\n", r);
    return 0;
}
