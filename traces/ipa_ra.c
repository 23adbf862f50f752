/* Untraced code that keeps values across a direct call in registers and
   flags the callee never writes, as gcc's -fipa-ra allows (cc1 -O2 keeps a
   pointer in r11 across a call of a local function and frees it after).
   Each `keep_*` procedure is left alone by the rewriter (a never-taken
   `xbegin`, encoded by hand for old assemblers), so it runs as it was and
   enters the traced callee through an outside-entry stub (its call
   retargeted to the preserving stub where the usual one could clobber
   something), which must clobber nothing the caller keeps:
   - keep_r11 keeps r11 across `bump_rcx`, which writes rcx only (its stub
     has rcx free);
   - keep_flags keeps the flags of a compare across `bump_lea`, which
     writes no flag;
   - keep_all keeps r11 across `bump_mem`, which writes no register.
   Natively each returns its argument (plus the compare's outcome). */
#include <stdio.h>

long keep_r11(long x);
long keep_flags(long x, long y);
long keep_all(long x);

__asm__(".text\n"
        ".globl bump_rcx\n.type bump_rcx, @function\n"
        "bump_rcx:\n"
        "    mov counter(%rip), %rcx\n"
        "    add $1, %rcx\n"
        "    mov %rcx, counter(%rip)\n"
        "    ret\n"
        ".size bump_rcx, .-bump_rcx\n"
        ".globl bump_lea\n.type bump_lea, @function\n"
        "bump_lea:\n"
        "    mov counter(%rip), %rax\n"
        "    lea 2(%rax), %rax\n"
        "    mov %rax, counter(%rip)\n"
        "    ret\n"
        ".size bump_lea, .-bump_lea\n"
        ".globl bump_mem\n.type bump_mem, @function\n"
        "bump_mem:\n"
        "    addl $3, counter(%rip)\n"
        "    ret\n"
        ".size bump_mem, .-bump_mem\n"
        ".globl keep_r11\n.type keep_r11, @function\n"
        "keep_r11:\n"
        "    mov %rdi, %r11\n"
        "    call bump_rcx\n"
        "    mov %r11, %rax\n"
        "    cmpq $0, never(%rip)\n"
        "    jne 1f\n"
        "    ret\n"
        "1:  .byte 0xc7, 0xf8, 0, 0, 0, 0\n"
        "    ud2\n"
        ".size keep_r11, .-keep_r11\n"
        ".globl keep_flags\n.type keep_flags, @function\n"
        "keep_flags:\n"
        "    push %rbx\n"
        "    mov %rdi, %rbx\n"
        "    cmpq $0, never(%rip)\n"
        "    jne 1f\n"
        "    cmp %rsi, %rdi\n"
        "    call bump_lea\n"
        "    setl %al\n"
        "    movzbl %al, %eax\n"
        "    add %rbx, %rax\n"
        "    pop %rbx\n"
        "    ret\n"
        "1:  .byte 0xc7, 0xf8, 0, 0, 0, 0\n"
        "    ud2\n"
        ".size keep_flags, .-keep_flags\n"
        ".globl keep_all\n.type keep_all, @function\n"
        "keep_all:\n"
        "    mov %rdi, %r11\n"
        "    call bump_mem\n"
        "    mov %r11, %rax\n"
        "    cmpq $0, never(%rip)\n"
        "    jne 1f\n"
        "    ret\n"
        "1:  .byte 0xc7, 0xf8, 0, 0, 0, 0\n"
        "    ud2\n"
        ".size keep_all, .-keep_all\n"
        ".data\n.p2align 3\n"
        "counter: .quad 0\n"
        "never: .quad 0\n"
                ".text\n");

int main(void)
{
    long sum = 0;
    for (long i = 0; i < 50; i++) {
        sum += keep_r11(i * 7);
        sum += keep_flags(i, 25);
        sum += keep_all(i * 3);
    }
    printf("sum=%ld\n", sum);
    return 0;
}
