/* A switch on an array element indexed by a field (the range encoder of
 * liblzma, rc_encode): gcc -O2 folds the bound check into `cmpl $4,
 * 0x30(%rax,%rdx,4)` and loads the index again as `(%rax,%rcx,4)` with
 * `rcx = rdx + 12`, the same word through another address form. The jump
 * table is resolved only if the two reads are known to be one value.
 * Also a procedure shorter than a springboard (`mov 0x..(%rdi), %eax;
 * ret`, 4 bytes, followed by alignment fill). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum sym { BIT_0, BIT_1, DIRECT_0, DIRECT_1, FLUSH };

struct rc {
    uint64_t low;
    uint64_t cache_size;
    uint32_t range;
    uint8_t cache;
    uint32_t pending;
    size_t count;
    size_t pos;
    enum sym symbols[58];
    uint16_t *probs[58];
};

/* 4 bytes, then alignment fill up to `shift_low`: `mov 0x20(%rdi), %eax; ret`. */
static __attribute__((noipa)) unsigned symbols_pending(const struct rc *rc) {
    return (unsigned)rc->count;
}

static __attribute__((noipa)) int shift_low(struct rc *rc, uint8_t *out, size_t *out_pos,
                                               size_t out_size) {
    if ((uint32_t)rc->low < 0xff000000u || (uint32_t)(rc->low >> 32) != 0) {
        do {
            if (*out_pos == out_size)
                return 1;
            out[*out_pos] = rc->cache + (uint8_t)(rc->low >> 32);
            ++*out_pos;
            rc->cache = 0xff;
        } while (--rc->cache_size != 0);
        rc->cache = (rc->low >> 24) & 0xff;
    }
    ++rc->cache_size;
    rc->low = (rc->low & 0x00ffffff) << 8;
    return 0;
}

static __attribute__((noipa)) int encode(struct rc *rc, uint8_t *out, size_t *out_pos,
                                            size_t out_size) {
    while (rc->pos < rc->count) {
        if (rc->range < (1u << 24)) {
            if (shift_low(rc, out, out_pos, out_size))
                return 1;
            rc->range <<= 8;
        }
        switch (rc->symbols[rc->pos]) {
        case BIT_0: {
            uint32_t prob = *rc->probs[rc->pos];
            rc->range = (rc->range >> 11) * prob;
            prob += ((1u << 11) - prob) >> 5;
            *rc->probs[rc->pos] = (uint16_t)prob;
            break;
        }
        case BIT_1: {
            uint32_t prob = *rc->probs[rc->pos];
            uint32_t bound = prob * (rc->range >> 11);
            rc->low += bound;
            rc->range -= bound;
            prob -= prob >> 5;
            *rc->probs[rc->pos] = (uint16_t)prob;
            break;
        }
        case DIRECT_0:
            rc->range >>= 1;
            break;
        case DIRECT_1:
            rc->range >>= 1;
            rc->low += rc->range;
            break;
        case FLUSH:
            rc->range = UINT32_MAX;
            do {
                if (shift_low(rc, out, out_pos, out_size))
                    return 1;
            } while (++rc->pos < rc->count);
            rc->count = 0;
            rc->pos = 0;
            return 0;
        }
        ++rc->pos;
    }
    rc->count = 0;
    rc->pos = 0;
    return 0;
}

int main(int argc, char **argv) {
    const char *s = argc > 1 ? argv[1] : "the quick brown fox jumps over the lazy dog 0123456789";
    size_t n = strlen(s);
    static struct rc rc;
    static uint16_t probs[8];
    static uint8_t out[4096];
    size_t out_pos = 0;
    unsigned pending = 0;
    rc.range = UINT32_MAX;
    rc.cache_size = 1;
    for (int i = 0; i < 8; i++)
        probs[i] = 1 << 10;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        for (int b = 0; b < 8 && rc.count < 57; b++) {
            rc.symbols[rc.count] = (c >> b & 1) ? (b & 2 ? DIRECT_1 : BIT_1)
                                                : (b & 2 ? DIRECT_0 : BIT_0);
            rc.probs[rc.count] = &probs[b];
            rc.count++;
        }
        pending += symbols_pending(&rc);
        if (encode(&rc, out, &out_pos, sizeof out))
            break;
    }
    rc.symbols[rc.count] = FLUSH;
    rc.probs[rc.count] = NULL;
    rc.count++;
    encode(&rc, out, &out_pos, sizeof out);
    unsigned sum = 0;
    for (size_t i = 0; i < out_pos; i++)
        sum = sum * 31 + out[i];
    printf("%zu bytes, checksum %08x, pending %u\n", out_pos, sum, pending);
    return 0;
}
