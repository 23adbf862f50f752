/* A qsort comparator whose first instruction is a call: an outside
 * entry (from libc's qsort, untraced) that is also a call, under
 * recursion (the comparator's helper sorts again from inside it, so the
 * comparator is entered again while its frames are on the stack).
 * `cmp_first_call` calls `mid`, which calls `helper` with the stack
 * aligned as the ABI wants; neither has a frame of its own. */
#include <stdio.h>
#include <stdlib.h>

int cmp_first_call(const void *a, const void *b);

__asm__(".text\n"
        ".globl cmp_first_call\n"
        ".type cmp_first_call, @function\n"
        "cmp_first_call:\n"
        "\tcall mid\n"
        "\tret\n"
        ".size cmp_first_call, .-cmp_first_call\n"
        ".globl mid\n"
        ".type mid, @function\n"
        "mid:\n"
        "\tcall helper\n"
        "\tret\n"
        ".size mid, .-mid\n");

static int depth;

int helper(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    if (depth < 2 && x == 3) {
        int inner[4] = {4, 1, 3, 2};
        depth++;
        qsort(inner, 4, sizeof inner[0], cmp_first_call);
        depth--;
    }
    return (x > y) - (x < y);
}

int main(void) {
    int v[6] = {5, 3, 6, 1, 4, 2};
    qsort(v, 6, sizeof v[0], cmp_first_call);
    for (int i = 0; i < 6; i++)
        printf("%d ", v[i]);
    printf("\n");
    return 0;
}
