// std::vector and std::sort, no threads: code inlined from the C++
// headers (callgrind's fi=/fe=), and a C++ program that imports
// pthread_create through libstdc++ without starting a thread.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

static unsigned next(unsigned &s) {
    s = s * 1103515245u + 12345u;
    return s >> 8;
}

int main(int argc, char **argv) {
    unsigned n = argc > 1 ? (unsigned)atoi(argv[1]) : 200;
    unsigned s = 7;
    std::vector<unsigned> v;
    for (unsigned i = 0; i < n; i++)
        v.push_back(next(s) % 1000);
    std::sort(v.begin(), v.end());
    unsigned long sum = 0;
    for (unsigned i = 0; i < v.size(); i += 7)
        sum += v[i] * i;
    printf("%u %u %lu\n", v.front(), v.back(), sum);
    return 0;
}
