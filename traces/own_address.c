/* Paper 004, Figure 2, in aetrace's terms: a program whose behaviour depends
 * on its own code addresses. hash_value() mixes its return address into the
 * hash: a return into the original .text (the uninstrumented program) keeps
 * the keys apart, a return into a relocated copy (aetrace's instrumented
 * run: the copies live above etext) sends every key into one bucket, so
 * hash_insert() takes its collision path on every call. The output says
 * which run it was. `aetrace verify` must report where the two runs part. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define HASH_SIZE 64
#define LOOP_COUNT 200

struct entry {
    int data;
    struct entry *next;
};

extern char __executable_start[], etext[];
static struct entry *table[HASH_SIZE];
static int collisions;

__attribute__((noinline)) static int hash_value(int data) {
    uintptr_t ra = (uintptr_t)__builtin_return_address(0);
    int original = ra >= (uintptr_t)__executable_start && ra < (uintptr_t)etext;
    return original ? data % HASH_SIZE : 0;
}

__attribute__((noinline)) static void hash_insert(int data) {
    int h = hash_value(data);
    struct entry *e = malloc(sizeof *e);
    e->data = data;
    e->next = NULL;
    if (table[h] != NULL) {
        struct entry *t = table[h];
        collisions++;
        while (t->next != NULL)
            t = t->next;
        t->next = e;
    } else {
        table[h] = e;
    }
}

int main(void) {
    for (int i = 0; i < LOOP_COUNT; i++)
        hash_insert(i);
    printf("collisions = %d\n", collisions);
    return 0;
}
