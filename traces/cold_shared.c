/* A function whose hot part only a data slot names and whose `.cold`
 * part another function also jumps to (python3's 0x56a100, a type's
 * `tp_init`-like slot: its `.cold` error path at 0x4489d7 is also where a
 * rich comparison's `ja` for an unreachable `default` lands). Built
 * non-PIE and stripped, the outside jump names the `.cold` part, so it
 * became the procedure's start and the hot part got no springboard: the
 * call through the slot ran the original code, untraced (python3's
 * stepped sweep: first difference at instruction 4,968,499). The hot
 * part must be an entry too. */
#include <stdio.h>
#include <stdlib.h>

/* `hot` calls libc, as real functions do (a procedure that writes no
 * scratch register, nor anything it calls, leaves none free for an entry
 * stub). */
long hot(long);
long cmp_op(long, long);

__asm__(
    ".text\n"
    ".type hot, @function\n"
    "hot:\n"
    "  .cfi_startproc\n"
    "  push %rbx\n"
    "  .cfi_def_cfa_offset 16\n"
    "  mov %rdi, %rbx\n"
    "  test %rdi, %rdi\n"
    "  js hot_cold\n"
    "  jz hot_zero\n" /* into the `.cold` part's middle: one group */
    "  mov %ebx, %edi\n"
    "  call abs\n"
    "  lea 1(%rbx,%rax), %rax\n"
    "  pop %rbx\n"
    "  .cfi_def_cfa_offset 8\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size hot, .-hot\n"
    ".type cmp_op, @function\n"
    "cmp_op:\n"
    "  .cfi_startproc\n"
    "  cmp $5, %esi\n"
    "  ja hot_cold\n" /* an unreachable default, as GCC emits it */
    "  lea (%rdi,%rsi), %rax\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size cmp_op, .-cmp_op\n"
    ".section .text.unlikely,\"ax\",@progbits\n"
    ".type hot_cold, @function\n"
    "hot_cold:\n"
    "  .cfi_startproc\n"
    "  .cfi_def_cfa_offset 16\n"
    "  neg %rbx\n"
    "  lea (%rbx,%rbx,2), %rax\n"
    "hot_out:\n"
    "  pop %rbx\n"
    "  .cfi_def_cfa_offset 8\n"
    "  ret\n"
    "hot_zero:\n"
    "  .cfi_def_cfa_offset 16\n"
    "  mov $7, %eax\n"
    "  jmp hot_out\n"
    "  .cfi_endproc\n"
    ".size hot_cold, .-hot_cold\n"
    ".text\n");

static long twice(long v) { return 2 * v; }
static long half(long v) { return v / 2; }

/* A type's slots: other functions' addresses beside `hot`'s. */
struct type { const char *name; long (*alloc)(long); long (*init)(long); long (*free)(long); };
static struct type t = { "t", twice, hot, half };

int main(int argc, char **argv) {
    struct type *volatile p = &t;
    long sum = 0;
    for (long i = -3; i < 4 + argc; i++)
        sum += p->init(i) + p->alloc(i) - p->free(i) + cmp_op(i, i & 3);
    printf("%s %ld\n", p->name, sum);
    return 0;
}
