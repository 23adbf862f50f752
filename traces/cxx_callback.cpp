/* C++ exceptions thrown by a callback and unwound through a traced
 * shared library (cxx_callback_lib.cpp, libaecxx.so.1): its cleanups and
 * its catch-and-rethrow run, then main catches. Prints what it caught. */
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

extern "C" int lib_each(int n, int depth, int (*f)(int));
extern "C" int lib_rethrow(int n, int (*f)(int));
extern "C" int lib_cleanups(void);

static int limit;

static int visit(int i) {
    if (i == limit)
        throw std::runtime_error("limit");
    return i * i;
}

static int visit_int(int i) {
    if (i == limit)
        throw i;
    return i;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    long total = 0;
    for (int r = 0; r < rounds; r++) {
        limit = r % 4 + 2;
        try {
            total += lib_each(limit + 1, r % 3, visit);
        } catch (const std::exception &e) {
            total += 1000;
        }
        try {
            total += lib_rethrow(limit + 1, visit_int);
        } catch (int v) {
            total += v;
        }
    }
    limit = -1;
    total += lib_each(3, 1, visit_int);
    printf("total %ld cleanups %d\n", total, lib_cleanups());
    return 0;
}
