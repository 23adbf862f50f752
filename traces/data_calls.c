/* Calls whose return points keep rsp in a data trace (issue 21,
 * docs/data.md "Across calls"): after a call to a traced procedure that
 * returns only through `ret`, the caller's next stack reference is derived,
 * not recorded. Exercised: tree recursion whose frames spill and reload
 * around each call, a callee that allocates on the stack (alloca) and
 * returns, a callee that leaves by a tail call to another traced procedure
 * (the return point keeps rsp), and one that leaves by a tail call to
 * `free` (untraced: its callers' return points must start with nothing).
 * Prints a checksum. */
#include <alloca.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct node {
    struct node *left, *right;
    long value;
};

static __attribute__((noinline)) struct node *build(int depth, long *next) {
    if (depth == 0)
        return NULL;
    struct node *n = malloc(sizeof *n);
    n->left = build(depth - 1, next);
    n->value = (*next)++;
    n->right = build(depth - 1, next);
    return n;
}

/* Tree recursion: the caller's spills survive each call. */
static __attribute__((noinline)) long sum(const struct node *n, long weight) {
    if (!n)
        return 0;
    long l = sum(n->left, weight + 1);
    long r = sum(n->right, weight + 2);
    return l * 3 + r + n->value * weight;
}

/* A callee with a variable-sized stack area. */
static __attribute__((noinline)) long scratch(int n, long seed) {
    long *buf = alloca((size_t)n * sizeof *buf);
    for (int i = 0; i < n; i++)
        buf[i] = seed * (i + 1) ^ (seed >> (i % 7));
    long acc = 0;
    for (int i = n - 1; i >= 0; i -= 2)
        acc += buf[i];
    return acc;
}

static __attribute__((noinline)) long mix(long a, long b) { return a * 31 + (b ^ (a >> 3)); }

/* Leaves by a tail call to `mix`, traced: still returns by `ret`. */
static __attribute__((noinline)) long twice(long a, long b) { return mix(a + b, b * 2); }

/* Leaves by a tail call to `free`, untraced. */
static __attribute__((noinline)) void release(struct node *n) { free(n); }

static __attribute__((noinline)) void drop(struct node *n) {
    if (!n)
        return;
    drop(n->left);
    drop(n->right);
    release(n);
}

int main(int argc, char **argv) {
    int depth = argc > 1 ? atoi(argv[1]) : 7;
    long next = 1, acc = 0;
    volatile long keep[4];
    struct node *root = build(depth, &next);
    for (int i = 0; i < 6; i++) {
        keep[i & 3] = sum(root, i);
        acc = twice(acc, keep[i & 3]);
        acc += scratch(8 + i * 5, acc);
    }
    drop(root);
    char text[32];
    memset(text, 'a' + (int)(acc & 15), sizeof text - 1);
    text[sizeof text - 1] = 0;
    printf("acc=%ld nodes=%ld %c\n", acc, next - 1, text[3]);
    return 0;
}
