/* A function with two entry points, in hand-written assembly the way
 * glibc's `__mempcpy` runs into `__memmove`: `twice_plus1` adds one and
 * runs on into `twice`. One procedure with a secondary entry point:
 * called directly and through a pointer at both entries, and jumped to
 * from a tail call. Both entries write rcx before reading it, so the
 * stub at the secondary one has a register no caller can keep a value
 * in across the call. */
#include <stdio.h>

long twice(long);
long twice_plus1(long);
long tail_to_plus1(long);

__asm__(".text\n"
        ".globl twice_plus1\n"
        ".type twice_plus1, @function\n"
        "twice_plus1:\n"
        "    addq $1, %rdi\n"
        "    nop\n"
        "    nop\n"
        ".globl twice\n"
        ".type twice, @function\n"
        "twice:\n"
        "    movq %rdi, %rcx\n"
        "    leaq (%rcx,%rcx), %rax\n"
        "    testq %rax, %rax\n"
        "    jns 1f\n"
        "    negq %rax\n"
        "1:  ret\n"
        ".size twice, .-twice\n"
        ".globl tail_to_plus1\n"
        ".type tail_to_plus1, @function\n"
        "tail_to_plus1:\n"
        "    subq $3, %rdi\n"
        "    jmp twice_plus1\n"
        ".size tail_to_plus1, .-tail_to_plus1\n");

int main(int argc, char **argv) {
    (void)argv;
    long (*volatile fp)(long) = argc > 5 ? twice : twice_plus1;
    long (*volatile fq)(long) = argc > 5 ? twice_plus1 : twice;
    long sum = 0;
    for (long i = -4; i < 6; i++)
        sum += twice(i) + twice_plus1(i) + fp(i) + fq(i) + tail_to_plus1(i);
    printf("%ld\n", sum);
    return 0;
}
