/* A position-dependent program that takes the addresses of `malloc` and
   `free`: their canonical addresses are then its own PLT stubs, and ld.so
   binds libc's own references (libc calls `malloc` and `free` through its
   GOT) to them. So `strdup`, an import that calls no program code by
   itself, runs the program's traced `malloc@plt` stub (cc1 takes `free`'s
   address: its `nl_langinfo`, `setlocale`, ... calls entered `free@plt`,
   and regen stopped at that ENTER). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *(*volatile alloc)(size_t);
void (*volatile release)(void *);

int main(int argc, char **argv)
{
    (void)argv;
    /* Taken in code (an absolute immediate), not in initialised data,
       which ld would rather relocate at load time. */
    alloc = malloc;
    release = free;
    size_t total = 0;
    for (int i = 0; i < 20; i++) {
        char *s = strdup(i % 3 ? "witness" : "edge");
        total += strlen(s);
        char *t = alloc(16 + argc);
        strcpy(t, s);
        total += t[0] == 'w';
        release(t);
        release(s);
    }
    printf("total=%zu\n", total);
    return 0;
}
