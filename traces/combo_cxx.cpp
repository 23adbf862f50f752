// C++ exceptions through callbacks, with the rest of combo.c's mix: a
// comparator called by libc's qsort and one called by std::sort throw
// from inside the sort, through the sorting code, to a catch in a
// recursion; a SIGUSR1 handler runs for signals raised in that recursion;
// an atexit handler and exit() from deep recursion end the run. Prints
// what it counted.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

static volatile int handled, compares, caught;
static int limit;

struct TooMany : std::runtime_error {
    TooMany() : std::runtime_error("too many compares") {}
};

extern "C" int by_value(const void *a, const void *b) {
    if (++compares == limit)
        throw TooMany();
    int x = *static_cast<const int *>(a), y = *static_cast<const int *>(b);
    return (x > y) - (x < y);
}

extern "C" void on_usr1(int sig) { handled += sig; }

__attribute__((noinline)) static int sort_deep(int depth, std::vector<int> &v) {
    if (depth == 3)
        std::raise(SIGUSR1);
    if (depth > 0)
        return sort_deep(depth - 1, v) + 1;
    try {
        if (v.size() % 2)
            std::qsort(v.data(), v.size(), sizeof v[0], by_value);
        else
            std::sort(v.begin(), v.end(), [](int a, int b) {
                if (++compares == limit)
                    throw TooMany();
                return a < b;
            });
    } catch (const TooMany &) {
        caught++;
    }
    return 0;
}

__attribute__((noinline)) static void leave_deep(int depth) {
    if (depth == 0) {
        std::printf("handled=%d compares=%d caught=%d\n", handled, compares, caught);
        std::fflush(stdout);
        std::exit(3);
    }
    leave_deep(depth - 1);
}

static void at_end() { std::printf("atexit caught=%d\n", caught); }

int main(int argc, char **) {
    std::atexit(at_end);
    std::signal(SIGUSR1, on_usr1);
    int total = 0;
    for (int round = 0; round < 6; round++) {
        std::vector<int> v;
        for (int i = 0; i < 40 + round; i++)
            v.push_back((i * 37 + argc + round) % 53);
        compares = 0;
        limit = round % 2 ? 30 + round : 1 << 30;
        total += sort_deep(6 + round, v);
    }
    std::printf("total=%d\n", total);
    leave_deep(15);
}
