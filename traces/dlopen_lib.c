/* The library traces/dlopen.c loads with dlopen (built by the test as
 * libaedl.so.1, not a DT_NEEDED of the program): a constructor and a
 * destructor run by dlopen and dlclose, a loop, a callback into the
 * program, and state that a second dlopen starts afresh. */
#include <stdlib.h>

static int calls;

__attribute__((constructor)) static void dl_init(void) { calls = 1; }

__attribute__((destructor)) static void dl_fini(void) {
    if (calls < 0)
        abort();
}

long dl_sum(const int *a, int n) {
    long s = 0;
    calls++;
    for (int i = 0; i < n; i++)
        s += a[i] & 1 ? a[i] : -a[i];
    return s;
}

long dl_apply(const int *a, int n, long (*f)(int)) {
    long s = 0;
    calls++;
    for (int i = 0; i < n; i++)
        s = s * 3 + f(a[i]);
    return s;
}

int dl_calls(void) { return calls; }
