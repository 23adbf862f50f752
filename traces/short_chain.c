/* A chain of procedures that untraced code enters (python3's 0x4db3e9 ->
 * 0x4db3eb -> 0x642ec0): `tiny`, two bytes whose address is taken, is
 * shorter than a springboard and left alone; its `jmp rel8` into `body`
 * cannot be retargeted to a copy, so `body` is left alone too (it may
 * keep values in every register); `body`'s `call leaf` starts one byte
 * after `body`'s start. `leaf` writes no register, so its outside-entry
 * stub is not safe for a caller that keeps values (gcc's -fipa-ra): the
 * call must go to `leaf`'s preserving stub. The rewriter refused that
 * call because `body`'s springboard, which `body` no longer gets, would
 * have covered it, and `leaf` was left alone as well (30 instructions of
 * python3 untraced). */
#include <stdio.h>

long tiny(long);
long hits;

__asm__(
    ".text\n"
    ".type tiny, @function\n"
    "tiny:\n"
    "  .cfi_startproc\n"
    "  jmp body\n"
    "  .cfi_endproc\n"
    ".size tiny, .-tiny\n"
    ".type body, @function\n"
    "body:\n"
    "  .cfi_startproc\n"
    "  push %rcx\n"
    "  .cfi_def_cfa_offset 16\n"
    "  call leaf\n"
    "  lea 3(%rdi), %rax\n"
    "  pop %rdx\n"
    "  .cfi_def_cfa_offset 8\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size body, .-body\n"
    ".type leaf, @function\n"
    "leaf:\n"
    "  .cfi_startproc\n"
    "  addq $1, hits(%rip)\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size leaf, .-leaf\n");

int main(int argc, char **argv) {
    long (*volatile f)(long) = tiny;
    long sum = 0;
    for (long i = 0; i < 5 + argc; i++)
        sum += f(i);
    printf("%ld %ld\n", sum, hits);
    return 0;
}
