/* Procedures shorter than a springboard (5 bytes) with no fill after
   them: `tiny_direct` (`xor eax, eax; ret`, 3 bytes) is entered only by
   direct calls, from traced `main` and from untraced `outer` (left alone
   by a never-taken `xbegin`, encoded by hand for old assemblers), so it
   is traced without a springboard (`outer`'s call is retargeted to its
   copy); `tiny_taken` (`lea eax, [rdi+1]; ret`, 4 bytes) has its
   address taken and called through a pointer, so it keeps being left
   alone. Natively prints the same sum. */
#include <stdio.h>

int tiny_direct(void);
int tiny_taken(int);
int outer(int);

__asm__(".text\n"
        ".globl tiny_direct\n.type tiny_direct, @function\n"
        "tiny_direct:\n"
        "    xor %eax, %eax\n"
        "    ret\n"
        ".size tiny_direct, .-tiny_direct\n"
        ".globl tiny_taken\n.type tiny_taken, @function\n"
        "tiny_taken:\n"
        "    lea 1(%rdi), %eax\n"
        "    ret\n"
        ".size tiny_taken, .-tiny_taken\n"
        ".globl outer\n.type outer, @function\n"
        "outer:\n"
        "    push %rbx\n"
        "    mov %edi, %ebx\n"
        "    cmpq $0, never(%rip)\n"
        "    jne 1f\n"
        "    call tiny_direct\n"
        "    add %ebx, %eax\n"
        "    pop %rbx\n"
        "    ret\n"
        "1:  .byte 0xc7, 0xf8, 0, 0, 0, 0\n"
        "    ud2\n"
        ".size outer, .-outer\n"
        ".data\n.p2align 3\n"
        "never: .quad 0\n"
        ".text\n");

int (*volatile through)(int) = tiny_taken;

int main(void)
{
    long sum = 0;
    for (int i = 0; i < 30; i++)
        sum += tiny_direct() + outer(i) + through(i);
    printf("sum=%ld\n", sum);
    return 0;
}
