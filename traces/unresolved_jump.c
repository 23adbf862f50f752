/* Indirect jumps the analysis cannot resolve (docs/rewrite.md, "Unresolved
 * jumps"): an interpreter whose dispatch is a label plus an offset from a
 * table of label differences (`&&op - &&base`, arithmetic on labels, as in
 * glibc's printf), and `hop`, a frameless assembly procedure that jumps to
 * its own base plus an offset built at run time: to a later instruction of
 * its own, to a traced procedure's entry (`triple`, a tail jump through a
 * register) and to libc's `labs` (out of the module). With the argument
 * `desync`, `hop` jumps into the middle of one of its instructions (a
 * 1-byte nop hidden in a `mov` immediate): the copy cannot follow, the
 * original code runs on, and regen must say so. `leap` ends (its symbol's
 * size) at its jump to a label the `lea` names plus an offset from a
 * table: offset 0 enters that label's code (a procedure of its own); with
 * the argument `nowhere`, offset 5 enters the code right after it, which
 * no symbol, FDE, call or address names and which starts on no 16-byte
 * boundary, so no procedure holds it: the copy writes DESYNC, the original
 * code runs, and regen must say so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

long hop(long x, long k);
long hop_offsets[5];
extern char hop_base[], hop_double[], hop_hidden[];

__asm__(".text\n"
        ".globl hop\n"
        ".type hop, @function\n"
        "hop:\n"
        "    lea hop_base(%rip), %rcx\n"
        "    lea hop_offsets(%rip), %rax\n"
        "    add (%rax,%rsi,8), %rcx\n"
        "    jmp *%rcx\n"
        ".globl hop_base\n"
        "hop_base:\n"
        "    lea 1(%rdi), %rax\n"
        "    ret\n"
        ".globl hop_double\n"
        "hop_double:\n"
        "    lea (%rdi,%rdi), %rax\n"
        "    ret\n"
        "    movabs $0x90909090c3c03148, %rax\n"
        ".globl hop_hidden\n"
        "hop_hidden = . - 8\n"
        "    ret\n"
        ".size hop, . - hop\n");

long leap(long x, long k);
long leap_offsets[2] = {0, 5}; /* lea 1(%rdi), %rax (4 bytes); ret */

__asm__(".text\n"
        ".globl leap\n"
        ".type leap, @function\n"
        "leap:\n"
        "    lea .Lleap_first(%rip), %rcx\n"
        "    lea leap_offsets(%rip), %rax\n"
        "    add (%rax,%rsi,8), %rcx\n"
        "    jmp *%rcx\n"
        ".size leap, . - leap\n"
        "    .p2align 4\n"
        ".Lleap_first:\n"
        "    lea 1(%rdi), %rax\n"
        "    ret\n"
        "    lea 2(%rdi), %rax\n"
        "    ret\n");

__attribute__((noinline)) long triple(long x) {
    return 3 * x;
}

__attribute__((noinline)) static long interp(const unsigned char *code, long acc) {
    static const int off[] = {0, &&op_dbl - &&op_inc, &&op_dec - &&op_inc,
                              &&op_end - &&op_inc};
    const unsigned char *pc = code;
#define NEXT goto *(&&op_inc + off[*pc++])
    NEXT;
op_inc:
    acc += 1;
    NEXT;
op_dbl:
    acc = acc * 2 % 1000003;
    NEXT;
op_dec:
    acc -= 3;
    NEXT;
op_end:
    return acc;
}

int main(int argc, char **argv) {
    hop_offsets[0] = 0;
    hop_offsets[1] = hop_double - hop_base;
    hop_offsets[2] = (char *)triple - hop_base;
    hop_offsets[3] = (char *)labs - hop_base;
    hop_offsets[4] = hop_hidden - hop_base;
    if (argc > 1 && strcmp(argv[1], "desync") == 0) {
        /* xor %rax,%rax; ret (48 31 c0 c3): 0 */
        printf("hidden: %ld\n", hop(5, 4));
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "nowhere") == 0) {
        printf("nowhere: %ld\n", leap(5, 1));
        return 0;
    }
    unsigned char code[64];
    int n = 0;
    for (int i = 0; i < 40; i++)
        code[n++] = (unsigned char)(i * 7 % 3);
    code[n++] = 3;
    long acc = 0;
    for (int r = 0; r < 50; r++)
        acc = interp(code, acc + r);
    long h = 0;
    for (long i = 0; i < 200; i++)
        h += hop(i - 100, i % 4);
    for (long i = 0; i < 20; i++)
        h += leap(i, 0);
    printf("interp: %ld\nhop: %ld\n", acc, h);
    return 0;
}
