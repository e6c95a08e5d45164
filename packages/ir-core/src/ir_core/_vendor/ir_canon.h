/* Little-endian stores for the canonical encoding (see the package README). Each writes one
 * item header at p and returns the position after it; the caller has reserved the room. */
#ifndef IR_CANON_H
#define IR_CANON_H
#include <stdint.h>
#include <string.h>

static inline void ir_store_u32le(char* p, uint32_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    memcpy(p, &v, 4);
}

static inline void ir_store_u64le(char* p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8);
}

/* A tag and a u32 length or count: 5 bytes. */
static inline char* ir_put_len(char* p, char tag, uint32_t n) {
    p[0] = tag;
    ir_store_u32le(p + 1, n);
    return p + 5;
}

/* A tag and a 64-bit payload ('i' int64, 'f' float64 bits): 9 bytes. */
static inline char* ir_put_u64(char* p, char tag, uint64_t v) {
    p[0] = tag;
    ir_store_u64le(p + 1, v);
    return p + 9;
}

/* A 128-bit hash as a bytes item: 'y', length 16, the 16 little-endian bytes: 21 bytes. */
static inline char* ir_put_hash(char* p, uint64_t lo, uint64_t hi) {
    p = ir_put_len(p, 'y', 16);
    ir_store_u64le(p, lo);
    ir_store_u64le(p + 8, hi);
    return p + 16;
}
#endif
