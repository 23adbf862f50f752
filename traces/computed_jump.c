/* Indirect jumps to computed code addresses (`aetrace cfg` class
 * `computed`, docs/rewrite.md "Computed jumps"), traced through the copy's
 * dispatch tables: `vm`, an interpreter jumping through `&&label` pointers
 * in a writable array (CPython's `opcode_targets`);
 * `collatz`, a label chosen on each path and jumped to later (`volatile`:
 * -O2 would fold it); `tiny`, whose second jump reads the table of its
 * first through a hoisted register (left alone at -O2: the copy rewrites
 * that table, and the analysis gives the second jump one label); and
 * `scaled`, assembly that jumps to a label plus a bounded multiple of an
 * index (glibc's memmove-ssse3). With the argument `stray`, `vm`'s array
 * gets another procedure's address: the copy has no case for it, so the
 * original code runs on after DESYNC, and regen must say so. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

long scaled(long x, long k);

__asm__(".text\n"
        ".globl scaled\n"
        ".type scaled, @function\n"
        "scaled:\n"
        "    lea scaled_base(%rip), %rcx\n"
        "    and $3, %esi\n"
        "    shl $4, %esi\n"
        "    add %rsi, %rcx\n"
        "    jmp *%rcx\n"
        "    .p2align 4\n"
        "scaled_base:\n"
        "    lea 1(%rdi), %rax\n"
        "    ret\n"
        "    .p2align 4\n"
        "    lea (%rdi,%rdi), %rax\n"
        "    ret\n"
        "    .p2align 4\n"
        "    lea (%rdi,%rdi,2), %rax\n"
        "    ret\n"
        "    .p2align 4\n"
        "    mov %rdi, %rax\n"
        "    neg %rax\n"
        "    ret\n"
        ".size scaled, . - scaled\n");

enum { PUSH, ADD, MUL, DUP, SWAP, JNZ, DEC, RARE, HALT, NOPS };

/* Where the stray jump lands: it runs untraced-as-far-as-regen-knows
 * code with `vm`'s frame, so it only makes system calls. */
__attribute__((noinline)) void strayed(void) {
    static const char msg[] = "strayed\n";
    write(1, msg, sizeof msg - 1);
    _exit(0);
}

/* Called only from a cold block: gcc moves that block to `tiny.cold`. */
__attribute__((noinline, cold)) long rare_step(long x) {
    return x * 7 + 1;
}

/* A two-entry table of labels, one in gcc's `tiny.cold` part. */
__attribute__((noinline)) static long tiny(const unsigned char *ops, int n) {
    static void *go[] = {&&plain, &&rare};
    long x = 1;
    for (int i = 0; i < n; i++) {
        goto *go[ops[i] & 1];
    plain:
        x = x * 3 % 1009;
        continue;
    rare:
        x = rare_step(x);
    }
    return x;
}

__attribute__((noinline)) static long vm(const unsigned char *code, long seed, int stray) {
    static void *ops[NOPS] = {&&op_push, &&op_add, &&op_mul, &&op_dup, &&op_swap,
                              &&op_jnz,  &&op_dec, &&op_rare, &&op_halt};
    long stack[64];
    int sp = 0;
    const unsigned char *pc = code;
    if (stray)
        ops[HALT] = (void *)strayed;
    stack[sp++] = seed;
#define NEXT goto *ops[*pc++]
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
op_rare:
    stack[sp - 1] = stack[sp - 1] * 7 + 1;
    NEXT;
op_halt:
    return stack[sp - 1];
}

__attribute__((noinline)) static long collatz(long x, int n) {
    void *volatile next;
    for (int i = 0; i < n; i++) {
        next = (x & 1) ? &&odd : &&even;
        if (x > 100000)
            next = &&big;
        goto *next;
    odd:
        x = 3 * x + 1;
        continue;
    even:
        x /= 2;
        continue;
    big:
        x -= 99999;
    }
    return x;
}

int main(int argc, char **argv) {
    int stray = argc > 1 && strcmp(argv[1], "stray") == 0;
    /* acc counter: the loop multiplies by 3, adds 1, every third round
     * (by the counter's value) a rare step too. */
    const unsigned char prog[] = {
        PUSH, 12,           /* 0: stack = seed, 12 */
        SWAP, PUSH, 3, MUL, /* 2: stack = 12, seed*3 */
        PUSH, 1, ADD,       /* 6: + 1 */
        RARE,               /* 9 */
        SWAP, DEC, JNZ, 2,  /* 10: counter-- ; loop */
        SWAP, HALT,         /* 14 */
    };
    printf("vm=%ld\n", vm(prog, argc + 4, stray));
    long s = 0;
    for (long i = 0; i < 24; i++)
        s += scaled(i, i * 5 + 1);
    printf("scaled=%ld\n", s);
    printf("collatz=%ld\n", collatz(27 + argc, 200));
    printf("tiny=%ld\n", tiny(prog, sizeof prog));
    return 0;
}
