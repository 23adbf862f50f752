/* Jump tables that the path reads past their entry 0 (issue 23, cc1's
 * `hash_operand`), built non-PIE so that the entries are absolute
 * addresses:
 * - `step`: gcc -O2 tests the index against zero before the switch
 *   (`test %bx, %bx; je; cmp $0xa, %bx; ja; jmp *T(,%rax,8)`) but keeps
 *   entry 0 (the default label) so that it can index the table from T: the
 *   path proves the index in 1..=10, the code names T;
 * - `shifted`: the table is named one entry before its first (`jmp
 *   *(shifted_table - 8)(,%rax,8)` with the index in 1..=3), where a word
 *   that is no label lies: the copy cannot rewrite it, so it is left alone.
 * The ops come from argv[1] (or a default string). */
#include <stdio.h>

long shifted(const unsigned short *p);
__asm__(".section .rodata\n"
        ".p2align 3\n"
        ".quad 0x5a5a5a5a\n" /* not a label: read by no path */
        "shifted_table: .quad 1f, 2f, 3f\n"
        ".text\n"
        ".globl shifted\n"
        ".type shifted, @function\n"
        "shifted:\n"
        "  movzwl (%rdi), %eax\n"
        "  test %ax, %ax\n"
        "  je 4f\n"
        "  cmp $3, %ax\n"
        "  ja 4f\n"
        "  jmp *(shifted_table - 8)(,%rax,8)\n"
        "1: mov $10, %eax\n"
        "  ret\n"
        "2: mov $20, %eax\n"
        "  ret\n"
        "3: mov $30, %eax\n"
        "  ret\n"
        "4: mov $-1, %rax\n"
        "  ret\n"
        ".size shifted, .-shifted\n");

static long acc[4];

static __attribute__((noipa)) long step(const unsigned short *p, long v) {
    unsigned op = *p;
    if (op == 0)
        return acc[0] - v;
    switch (op) {
    case 1: acc[1] -= v * 3; break;
    case 2: acc[2] ^= v << 2; break;
    case 3: acc[3] |= v; break;
    case 4: acc[0] *= 3; acc[1] += 1; break;
    case 5: acc[2] = acc[2] / 2 + v; break;
    case 6: acc[3] += acc[0] & 0xff; break;
    case 7: puts("seven"); break;
    case 8: acc[0] -= acc[3] >> 1; break;
    case 9: acc[1] = -acc[1]; break;
    case 10: acc[2] += 10 * v; acc[3] -= 1; break;
    default: acc[3] += 100; break;
    }
    return acc[op & 3];
}

int main(int argc, char **argv) {
    const char *s = argc > 1 ? argv[1] : "the quick brown fox jumps over the lazy dog 0123456789";
    long sum = 0;
    for (int round = 0; round < 3; round++)
        for (size_t i = 0; s[i]; i++) {
            unsigned short op = (unsigned short)((s[i] + round) % 12);
            sum += step(&op, (long)i);
            op %= 5;
            sum += shifted(&op);
        }
    printf("%ld %ld %ld %ld %ld\n", acc[0], acc[1], acc[2], acc[3], sum);
    return 0;
}
