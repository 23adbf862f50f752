// C++ exceptions thrown across several frames (with destructors to run on
// the way), caught by base class, rethrown, plus virtual calls through a
// base pointer. Prints a deterministic log.
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

struct Shape {
    virtual ~Shape() = default;
    virtual long area() const = 0;
    virtual const char *name() const { return "shape"; }
};
struct Rect : Shape {
    long w, h;
    Rect(long w_, long h_) : w(w_), h(h_) {}
    long area() const override { return w * h; }
    const char *name() const override { return "rect"; }
};
struct Square : Rect {
    explicit Square(long s) : Rect(s, s) {}
    const char *name() const override { return "square"; }
};
struct Tri : Shape {
    long b, h;
    Tri(long b_, long h_) : b(b_), h(h_) {}
    long area() const override { return b * h / 2; }
};

struct Guard {
    const char *what;
    explicit Guard(const char *w) : what(w) {}
    ~Guard() { std::printf("unwind %s\n", what); }
};

struct TooBig : std::runtime_error {
    long value;
    explicit TooBig(long v) : std::runtime_error("too big"), value(v) {}
};

__attribute__((noinline)) long check(const Shape &s, long limit) {
    Guard g("check");
    long a = s.area();
    if (a > limit)
        throw TooBig(a);
    return a;
}

__attribute__((noinline)) long middle(const Shape &s, long limit) {
    Guard g("middle");
    return check(s, limit) + 1;
}

__attribute__((noinline)) long rethrower(const Shape &s, long limit) {
    try {
        return middle(s, limit);
    } catch (const TooBig &e) {
        std::printf("rethrow %ld\n", e.value);
        throw;
    }
}

int main(int argc, char **) {
    std::vector<std::unique_ptr<Shape>> shapes;
    shapes.emplace_back(new Rect(3, 4 * argc));
    shapes.emplace_back(new Square(9));
    shapes.emplace_back(new Tri(10, 3));
    shapes.emplace_back(new Square(2 + argc));
    long total = 0;
    for (const auto &s : shapes) {
        try {
            total += rethrower(*s, 20);
            std::printf("%s ok\n", s->name());
        } catch (const std::exception &e) {
            std::printf("%s caught %s\n", s->name(), e.what());
        }
    }
    try {
        throw std::string("plain");
    } catch (const std::string &s) {
        std::printf("caught string %s\n", s.c_str());
    }
    std::printf("total=%ld\n", total);
    return 0;
}
