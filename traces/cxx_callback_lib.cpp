/* A C++ shared library for cxx_callback.cpp: it calls back into the
 * program, whose callback throws; the exception unwinds through this
 * library's frames, running a destructor here (a cleanup landing pad in
 * the library) and a catch-and-rethrow, before the program catches it. */
#include <cstdio>

static int cleanups;

struct Guard {
    int depth;
    ~Guard() { cleanups += depth; }
};

/* Calls f(i) for i < n, nested `depth` frames deep, each with a guard. */
extern "C" int lib_each(int n, int depth, int (*f)(int)) {
    Guard g{depth};
    if (depth > 0)
        return lib_each(n, depth - 1, f) + 1;
    int sum = 0;
    for (int i = 0; i < n; i++)
        sum += f(i);
    return sum;
}

/* Catches what the callback throws, counts it, and throws it on. */
extern "C" int lib_rethrow(int n, int (*f)(int)) {
    try {
        return lib_each(n, 2, f);
    } catch (int v) {
        cleanups += 100;
        throw;
    }
}

extern "C" int lib_cleanups(void) { return cleanups; }
