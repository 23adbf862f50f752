/* Untraced code that enters a traced procedure by a jump, with no return
   address at the top of the stack: `hop` is left alone by the rewriter (an
   indirect jump through memory), pushes a zero and jumps to `finish`'s
   entry, whose springboard leads to its outside-entry stub. `finish` pops
   the zero and returns to hop's caller. (gcc's split `.cold` parts of a
   procedure the rewriter leaves alone jump back into the hot part this
   way: python3.11's `Py_CompileStringExFlags` epilogue.) */
#include <stdio.h>

long hop(long x);
long finish(long x);

__asm__(".text\n"
        ".globl finish\n.type finish, @function\n"
        "finish:\n"
        "    add $8, %rsp\n"
        "    lea 1(%rdi), %rax\n"
        "    ret\n"
        ".size finish, .-finish\n"
        ".globl hop\n.type hop, @function\n"
        "hop:\n"
        "    push $0\n"
        "    jmp *finish_ptr(%rip)\n"
        ".size hop, .-hop\n"
        ".data\n.p2align 3\n"
        "finish_ptr: .quad finish\n"
        ".text\n");

int main(void)
{
    long sum = 0;
    for (long i = 0; i < 100; i++)
        sum += hop(i);
    printf("sum=%ld\n", sum);
    return 0;
}
