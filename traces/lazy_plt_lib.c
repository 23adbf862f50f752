/* The library of lazy_plt.c (built by the test as liblazyplt.so.1, left
 * untraced): two IFUNCs whose resolvers run inside ld.so's lazy binding
 * of the program's GOT slot (`_dl_fixup`), and a small function for the
 * program's hot loop. */
#include <sched.h>

static void (*hook)(int);

void lib_set_hook(void (*h)(int)) { hook = h; }

static int once_impl(int x) { return x * 3 + 1; }
static int twice_impl(int x) { return x * 5 + 2; }

/* Resolved when the program first calls `once`: calls the program back
 * (traced code running during a lazy resolution). */
static void *resolve_once(void) {
    if (hook)
        hook(0);
    return (void *)once_impl;
}
int once(int) __attribute__((ifunc("resolve_once")));

/* Resolved when a thread first calls `twice`: waits (bounded) until a
 * second thread has come to resolve it too, so both threads found the
 * slot unbound and both took the lazy path. */
static volatile int arrived;
static void *resolve_twice(void) {
    __atomic_add_fetch(&arrived, 1, __ATOMIC_SEQ_CST);
    for (long i = 0; i < 20000000 && __atomic_load_n(&arrived, __ATOMIC_SEQ_CST) < 2; i++)
        sched_yield();
    return (void *)twice_impl;
}
int twice(int) __attribute__((ifunc("resolve_twice")));

int lib_met(void) { return __atomic_load_n(&arrived, __ATOMIC_SEQ_CST); }

unsigned long lib_mix(unsigned long x, long i) { return x * 31 + (unsigned long)i; }
