/* bpe.h — internal building blocks of the byte-level BPE tokenizer and its
 * trainer: byte-string and pair hash maps, the merge loop, UTF-8 and base64
 * helpers, and the GPT-2 byte<->unicode map used by tokenizer.json files.
 *
 * Not a public API (use data/tokenizer.h); exposed so the unit tests can
 * check the merge loop against a naive reference. */
#ifndef TETRA_BPE_H
#define TETRA_BPE_H

#include <stddef.h>
#include <stdint.h>

#define BPE_NONE UINT32_MAX

/* ---- hashing -------------------------------------------------------------- */
uint64_t bpe_hash_bytes(const void *p, size_t n);

static inline uint64_t bpe_mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* ---- vocabulary: id -> bytes, and bytes -> id for mergeable tokens --------- */
enum {
    BPE_TOK_HOLE = 0,        /* id has no token (decode refuses it) */
    BPE_TOK_NORMAL = 1,      /* mergeable token, findable by its bytes */
    BPE_TOK_SPECIAL = 2,     /* special/added token: matched only as a whole */
    BPE_TOK_DECODE_ONLY = 3, /* has bytes for decoding but is never produced */
};

typedef struct bpe_vocab {
    uint32_t n; /* ids 0 .. n-1 */
    uint32_t cap;
    uint8_t *pool; /* token bytes */
    size_t pool_len, pool_cap;
    uint64_t *off;          /* per id: offset into pool */
    uint32_t *len;          /* per id: byte length */
    uint8_t *kind;          /* per id: BPE_TOK_* */
    struct bpe_slot *slots; /* bytes -> id for NORMAL tokens (open addressing) */
    size_t mask;            /* slots size - 1 */
    size_t n_mapped;
} bpe_vocab;

void bpe_vocab_init(bpe_vocab *v);
void bpe_vocab_free(bpe_vocab *v);
/* Give id its bytes and kind (grows the id range as needed). A NORMAL token is
 * also entered in the bytes -> id map. Returns 0, or -1 on out-of-memory, -2
 * when another id already maps the same bytes, -3 when id is already defined. */
int bpe_vocab_set(bpe_vocab *v, uint32_t id, const uint8_t *bytes, size_t len, int kind);
/* id of the NORMAL token with these bytes, or BPE_NONE */
uint32_t bpe_vocab_find(const bpe_vocab *v, const uint8_t *bytes, size_t len);
uint32_t bpe_vocab_find_h(const bpe_vocab *v, const uint8_t *bytes, size_t len, uint64_t h);
static inline const uint8_t *bpe_vocab_bytes(const bpe_vocab *v, uint32_t id, size_t *len) {
    *len = v->len[id];
    return v->pool + v->off[id];
}

/* ---- pair map: (left id, right id) -> (priority, merged id) ---------------- */
typedef struct bpe_pair_ent {
    uint64_t key; /* left<<32 | right; UINT64_MAX = empty */
    uint64_t val; /* priority<<32 | merged id */
} bpe_pair_ent;

typedef struct bpe_pairmap {
    bpe_pair_ent *e;
    size_t mask, count;
} bpe_pairmap;

void bpe_pairmap_init(bpe_pairmap *m);
void bpe_pairmap_free(bpe_pairmap *m);
/* insert or overwrite; -1 on out-of-memory */
int bpe_pairmap_put(bpe_pairmap *m, uint32_t a, uint32_t b, uint32_t prio, uint32_t merged);

static inline int bpe_pairmap_get(const bpe_pairmap *m, uint32_t a, uint32_t b, uint32_t *prio, uint32_t *merged) {
    if (!m->count) return 0;
    uint64_t key = ((uint64_t)a << 32) | b;
    size_t i = (size_t)bpe_mix64(key) & m->mask;
    for (;;) {
        const bpe_pair_ent *e = &m->e[i];
        if (e->key == key) {
            *prio = (uint32_t)(e->val >> 32);
            *merged = (uint32_t)e->val;
            return 1;
        }
        if (e->key == UINT64_MAX) return 0;
        i = (i + 1) & m->mask;
    }
}

/* ---- the merge loop ------------------------------------------------------- */
/* Repeatedly merge the adjacent pair with the lowest (priority, position) until
 * no pair is in the map: tiktoken's rule when priority = rank of the merged
 * token, Hugging Face's BPE rule when priority = merge index. ids is rewritten
 * in place; returns the new length, or SIZE_MAX on out-of-memory.
 *
 * Short words use an O(n^2) scan (fastest for a handful of symbols); long
 * words a binary heap over a linked list, O(n log n). Both give identical
 * results; bpe_merge_heap/_linear are exported for the tests. */
typedef struct bpe_scratch {
    size_t cap;
    uint32_t *prev, *next, *aux;
    struct bpe_heap_ent *heap;
    size_t heap_cap;
} bpe_scratch;

void bpe_scratch_free(bpe_scratch *s);
size_t bpe_merge(const bpe_pairmap *m, uint32_t *ids, size_t n, bpe_scratch *s);
size_t bpe_merge_heap(const bpe_pairmap *m, uint32_t *ids, size_t n, bpe_scratch *s);
size_t bpe_merge_linear(const bpe_pairmap *m, uint32_t *ids, size_t n, bpe_scratch *s);
#define BPE_LINEAR_MAX 24

/* ---- UTF-8 ---------------------------------------------------------------- */
/* Offset of the first byte that does not start a well-formed UTF-8 sequence
 * (overlongs, surrogates and code points above U+10FFFF are ill-formed), or
 * n when all n bytes are valid. */
size_t bpe_utf8_check(const uint8_t *s, size_t n);
/* Copy s to out replacing each maximal ill-formed subpart with U+FFFD (the
 * Unicode "best practice" that Rust's from_utf8_lossy and Python's
 * errors="replace" follow). out needs 3*n bytes; returns bytes written. */
size_t bpe_utf8_lossy(const uint8_t *s, size_t n, uint8_t *out);
/* Decode one code point of valid UTF-8 at s; sets *adv to its length. */
uint32_t bpe_utf8_next(const uint8_t *s, size_t n, size_t *adv);
/* Encode cp as UTF-8 into out (4 bytes max); returns its length. */
size_t bpe_utf8_put(uint32_t cp, uint8_t *out);

/* ---- base64 (standard alphabet, padded) ------------------------------------ */
/* Decode n chars into out (needs n/4*3 bytes); returns length or -1 when not base64. */
long bpe_b64_decode(const char *s, size_t n, uint8_t *out);
/* Encode n bytes into out (needs 4*((n+2)/3)+1); NUL-terminates; returns length. */
size_t bpe_b64_encode(const uint8_t *s, size_t n, char *out);

/* ---- GPT-2 byte-level map (tokenizer.json vocab strings) ------------------- */
/* The code point byte b is written as in a byte-level vocab string. */
uint32_t bpe_bytelevel_cp(uint8_t b);
/* The byte a code point stands for, or -1 when it is not in the map. */
int bpe_bytelevel_byte(uint32_t cp);
/* Bytes in GPT-2 order: the printable ones (33..126, 161..172, 174..255)
 * first, then the rest ascending. tiktoken's cl100k_base / Llama 3 ranks 0..255
 * are the single bytes in exactly this order. */
uint8_t bpe_bytelevel_order(unsigned i);

#endif
