// C++ exceptions through many frames: destructors run on the way, catches
// at various depths, rethrow, catch(...), recursion, nested try blocks, a
// throw from a catch handler, std::exception_ptr, and a function-try-block.
// One result line per case; the log of destructors shows the unwinding.
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

static int live = 0;

struct Tracker {
    int id;
    explicit Tracker(int i) : id(i) { ++live; }
    ~Tracker() {
        --live;
        std::printf("  ~T%d\n", id);
    }
};

struct Depth : std::runtime_error {
    int depth;
    Depth(int d) : std::runtime_error("depth"), depth(d) {}
};

struct Odd {
    int v;
};

// Throws at depth 0 after building a chain of frames, each with a Tracker.
__attribute__((noinline)) int dive(int n, int kind) {
    Tracker t(n);
    if (n == 0) {
        switch (kind) {
        case 0:
            throw Depth(n);
        case 1:
            throw Odd{7};
        case 2:
            throw 42;
        default:
            return 1;
        }
    }
    return dive(n - 1, kind) + 1;
}

// Catches at a chosen depth and converts the exception.
__attribute__((noinline)) int catcher(int n, int at, int kind) {
    Tracker t(100 + n);
    if (n == at) {
        try {
            return dive(n, kind);
        } catch (const Depth &d) {
            std::printf("  caught Depth at %d\n", n);
            return -d.depth - 1;
        }
    }
    return catcher(n + 1, at, kind) * 2;
}

__attribute__((noinline)) int rethrow_twice(int n) {
    try {
        try {
            return dive(n, 0);
        } catch (Depth &d) {
            d.depth += 10;
            throw;
        }
    } catch (std::exception &e) {
        std::printf("  rethrown %s\n", e.what());
        throw;
    }
}

__attribute__((noinline)) int catch_all(int n, int kind) {
    Tracker t(200 + n);
    try {
        return dive(n, kind);
    } catch (...) {
        std::printf("  catch(...) at %d\n", n);
        return -1;
    }
}

__attribute__((noinline)) int throw_from_handler(int n) {
    try {
        dive(n, 2);
    } catch (int v) {
        Tracker t(300);
        throw std::string("from handler ") + std::to_string(v);
    }
    return 0;
}

__attribute__((noinline)) int fn_try_block(int n) try {
    Tracker t(400);
    return dive(n, 1);
} catch (const Odd &o) {
    return o.v * 3;
}

__attribute__((noinline)) std::exception_ptr capture(int n) {
    try {
        dive(n, 0);
    } catch (...) {
        return std::current_exception();
    }
    return nullptr;
}

int main(int argc, char **) {
    int base = argc; // 1: keeps the depths out of the compiler's reach
    for (int at = 0; at < 3; ++at) {
        int r = catcher(0, at, 0);
        std::printf("case catcher at=%d: %d live=%d\n", at, r, live);
    }
    try {
        rethrow_twice(base + 2);
    } catch (const Depth &d) {
        std::printf("case rethrow: depth=%d live=%d\n", d.depth, live);
    }
    for (int kind = 0; kind < 4; ++kind)
        std::printf("case catch_all kind=%d: %d live=%d\n", kind, catch_all(base + 1, kind), live);
    try {
        throw_from_handler(base);
    } catch (const std::string &s) {
        std::printf("case handler: %s live=%d\n", s.c_str(), live);
    }
    std::printf("case fn-try: %d live=%d\n", fn_try_block(base + 3), live);
    std::exception_ptr p = capture(base + 1);
    try {
        std::rethrow_exception(p);
    } catch (const Depth &d) {
        std::printf("case exception_ptr: depth=%d live=%d\n", d.depth, live);
    }
    int sum = 0;
    for (int i = 0; i < 50; ++i) {
        try {
            sum += dive(i % 5, i % 3 == 0 ? 0 : 3);
        } catch (const Depth &) {
            sum += 1000;
        }
    }
    std::printf("case loop: sum=%d live=%d\n", sum, live);
    return 0;
}
