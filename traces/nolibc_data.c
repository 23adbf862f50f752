/* Data references in the forms whose counting differs between tools, in a
 * whole program without libc (build: -O2 -static -nostdlib -fno-builtin
 * -fno-stack-protector), so every reference of the process is the
 * program's: read-modify-writes (add to memory, xchg, lock xadd, inc),
 * rep movsb/stosq with data-dependent counts (0 included), loads and stores
 * straddling two cache lines, push and pop of a memory operand, 16-byte SSE
 * loads and stores; with -DFX_STATE also fxsave (through a register) and
 * fxrstor64 (rip-relative) of 512-byte areas. Its stack is a page-aligned static array, so every data
 * address is a link-time one, the same under valgrind as in a recorded run.
 * It reads nothing the kernel laid out (not even argc): valgrind lackey's
 * text of it equals `aetrace regen --format lackey`'s line for line.
 * 1000 iterations; prints a checksum in hex; exits 0. */

typedef unsigned long u64;

static unsigned char buf[8192] __attribute__((aligned(4096)));
static u64 counters[64] __attribute__((aligned(64)));
static char stack[1 << 16] __attribute__((aligned(4096), used));

__attribute__((noinline)) static u64 step(u64 i, u64 x) {
    u64 *c = &counters[i & 63];
    /* add to memory: one modify */
    __asm__ volatile("addq %1, %0" : "+m"(*c) : "r"(x));
    /* inc of memory */
    __asm__ volatile("incq %0" : "+m"(counters[(i * 7) & 63]));
    /* xchg with memory (locked): one modify */
    u64 y = x ^ i;
    __asm__ volatile("xchgq %0, %1" : "+r"(y), "+m"(counters[(i * 13) & 63]));
    /* lock xadd: one modify */
    u64 z = i;
    __asm__ volatile("lock xaddq %0, %1" : "+r"(z), "+m"(counters[(i * 5) & 63]));
    /* an 8-byte load and store straddling a 64-byte line */
    u64 *s = (u64 *)(buf + 60 + 64 * (i & 15));
    u64 v;
    __asm__ volatile("movq %1, %0" : "=r"(v) : "m"(*s));
    __asm__ volatile("movq %1, %0" : "=m"(*(u64 *)(buf + 4092 + 64 * (i & 7))) : "r"(v + y));
    /* push and pop of memory */
    __asm__ volatile("pushq %0\n\tpopq %0" : "+m"(counters[(i * 3) & 63]));
    /* 16-byte loads and stores, one unaligned across a line */
    __asm__ volatile("movdqu %0, %%xmm0\n\tmovdqu %%xmm0, %1"
                     : : "m"(*(char(*)[16])(buf + 56 + 128 * (i & 7))),
                       "m"(*(char(*)[16])(buf + 4096 + 16 * (i & 31)))
                     : "xmm0", "memory");
    /* rep movsb and rep stosq, counts 0..36 and 0..4 */
    void *dst = buf + 2048 + (i & 63), *src = buf + 64 + (i & 127);
    u64 n = i % 37;
    __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
    dst = buf + 6144 + 8 * (i & 31);
    n = i % 5;
    __asm__ volatile("rep stosq" : "+D"(dst), "+c"(n) : "a"(x) : "memory");
    return x * 0x9e3779b97f4a7c15ul + z + v;
}

__attribute__((noinline)) static void print_hex(u64 v) {
    char out[17];
    for (int i = 15; i >= 0; i--) {
        out[i] = "0123456789abcdef"[v & 15];
        v >>= 4;
    }
    out[16] = '\n';
    long r;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "a"(1), "D"(1), "S"(out), "d"(17)
                     : "rcx", "r11", "memory");
}

#ifdef FX_STATE
static unsigned char fx[512] __attribute__((aligned(16)));

/* fxsave to buf at a 16-aligned offset that varies, then fxrstor64 of
 * the same state from fx. */
__attribute__((noinline)) static void fx_state(u64 i) {
    unsigned char *p = buf + ((i * 48) & 4095);
    __asm__ volatile("fxsave %0" : "=m"(*(unsigned char(*)[512])p));
    __asm__ volatile("fxsave64 %0\n\tfxrstor64 %0" : "+m"(fx));
}
#endif

__attribute__((noreturn, used)) static void start_c(void) {
    u64 x = 1;
    for (u64 i = 0; i < 1000; i++)
        x = step(i, x);
#ifdef FX_STATE
    for (u64 i = 0; i < 8; i++)
        fx_state(i);
#endif
    for (int k = 0; k < 64; k++)
        x += counters[k] + buf[k * 128];
    print_hex(x);
    __asm__ volatile("syscall\n\thlt" : : "a"(231), "D"(0));
    __builtin_unreachable();
}

__attribute__((naked, noreturn)) void _start(void) {
    __asm__("lea stack+65536(%rip), %rsp\n\t"
            "call start_c\n\t"
            "hlt");
}
