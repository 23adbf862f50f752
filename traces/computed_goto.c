/* Computed goto (`&&label`, a GNU extension): a threaded bytecode
 * interpreter whose dispatch is `goto *table[op]`, an indirect jump that no
 * jump-table pattern describes. */
#include <stdio.h>
#include <string.h>

enum { PUSH, ADD, MUL, DUP, SWAP, JNZ, DEC, PRINT, HALT };

static long run(const unsigned char *code, long seed) {
    static void *dispatch[] = {&&op_push, &&op_add, &&op_mul, &&op_dup, &&op_swap,
                               &&op_jnz,  &&op_dec, &&op_print, &&op_halt};
    long stack[64];
    int sp = 0;
    const unsigned char *pc = code;
    stack[sp++] = seed;
#define NEXT goto *dispatch[*pc++]
    NEXT;
op_push:
    stack[sp++] = *pc++;
    NEXT;
op_add:
    sp--;
    stack[sp - 1] += stack[sp];
    NEXT;
op_mul:
    sp--;
    stack[sp - 1] = stack[sp - 1] * stack[sp] % 1000003;
    NEXT;
op_dup:
    stack[sp] = stack[sp - 1];
    sp++;
    NEXT;
op_swap: {
    long t = stack[sp - 1];
    stack[sp - 1] = stack[sp - 2];
    stack[sp - 2] = t;
    NEXT;
}
op_jnz: {
    unsigned char target = *pc++;
    if (stack[sp - 1] != 0)
        pc = code + target;
    NEXT;
}
op_dec:
    stack[sp - 1]--;
    NEXT;
op_print:
    printf("top=%ld\n", stack[sp - 1]);
    NEXT;
op_halt:
    return stack[sp - 1];
}

int main(int argc, char **argv) {
    (void)argv;
    /* acc counter: loop body multiplies acc by 3 and adds 1, counter times. */
    const unsigned char prog[] = {
        PUSH, 10,           /* 0: stack = seed, 10 */
        SWAP, PUSH, 3, MUL, /* 2: stack = 10, seed*3 */
        PUSH, 1, ADD,       /* 6: + 1 */
        SWAP, DEC, JNZ, 2,  /* 9: counter-- ; loop */
        SWAP, PRINT, HALT,  /* 13 */
    };
    long r = run(prog, argc + 4);
    printf("result=%ld\n", r);
    return 0;
}
