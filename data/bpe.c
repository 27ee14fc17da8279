/* bpe.c — hash maps, the BPE merge loop, UTF-8, base64 and the byte-level map. */
#include "data/bpe.h"

#include <stdlib.h>
#include <string.h>

/* ---- hashing -------------------------------------------------------------- */
uint64_t bpe_hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)n * 0xff51afd7ed558ccdULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    if (n) memcpy(&w, s, n);
    h = (h ^ w) * 0x94d049bb133111ebULL;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 32;
    return h;
}

/* ---- vocabulary ------------------------------------------------------------ */
void bpe_vocab_init(bpe_vocab *v) { memset(v, 0, sizeof *v); }

void bpe_vocab_free(bpe_vocab *v) {
    free(v->pool);
    free(v->off);
    free(v->len);
    free(v->kind);
    free(v->slots);
    memset(v, 0, sizeof *v);
}

static int vocab_grow_ids(bpe_vocab *v, uint32_t need) {
    if (need <= v->cap) return 0;
    uint32_t cap = v->cap ? v->cap : 1024;
    while (cap < need) cap = cap > UINT32_MAX / 2 ? need : cap * 2;
    uint64_t *off = realloc(v->off, (size_t)cap * sizeof *off);
    if (!off) return -1;
    v->off = off;
    uint32_t *len = realloc(v->len, (size_t)cap * sizeof *len);
    if (!len) return -1;
    v->len = len;
    uint8_t *kind = realloc(v->kind, cap);
    if (!kind) return -1;
    v->kind = kind;
    memset(v->kind + v->cap, BPE_TOK_HOLE, cap - v->cap);
    memset(v->len + v->cap, 0, (size_t)(cap - v->cap) * sizeof *len);
    memset(v->off + v->cap, 0, (size_t)(cap - v->cap) * sizeof *off);
    v->cap = cap;
    return 0;
}

/* A slot holds the id, the length and the first 8 bytes of its token, so a
 * lookup of a short piece touches one cache line. */
struct bpe_slot {
    uint64_t head;
    uint32_t id1; /* id + 1; 0 = empty */
    uint32_t len;
};

static inline uint64_t head8(const uint8_t *b, size_t len) {
    uint64_t w = 0;
    memcpy(&w, b, len < 8 ? len : 8);
    return w;
}

static void vocab_slot_insert(struct bpe_slot *slots, size_t mask, uint64_t h, uint32_t id, const uint8_t *b,
                              size_t len) {
    size_t i = (size_t)h & mask;
    while (slots[i].id1) i = (i + 1) & mask;
    slots[i].head = head8(b, len);
    slots[i].id1 = id + 1;
    slots[i].len = (uint32_t)len;
}

static int vocab_rehash(bpe_vocab *v, size_t nslots) {
    struct bpe_slot *slots = calloc(nslots, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; v->slots && i <= v->mask; i++) {
        if (!v->slots[i].id1) continue;
        uint32_t id = v->slots[i].id1 - 1;
        const uint8_t *b = v->pool + v->off[id];
        vocab_slot_insert(slots, nslots - 1, bpe_hash_bytes(b, v->len[id]), id, b, v->len[id]);
    }
    free(v->slots);
    v->slots = slots;
    v->mask = nslots - 1;
    return 0;
}

uint32_t bpe_vocab_find_h(const bpe_vocab *v, const uint8_t *bytes, size_t len, uint64_t h) {
    if (!v->slots) return BPE_NONE;
    uint64_t head = head8(bytes, len);
    size_t i = (size_t)h & v->mask;
    for (;;) {
        const struct bpe_slot *s = &v->slots[i];
        if (!s->id1) return BPE_NONE;
        if (s->len == len && s->head == head &&
            (len <= 8 || !memcmp(v->pool + v->off[s->id1 - 1] + 8, bytes + 8, len - 8)))
            return s->id1 - 1;
        i = (i + 1) & v->mask;
    }
}

uint32_t bpe_vocab_find(const bpe_vocab *v, const uint8_t *bytes, size_t len) {
    return bpe_vocab_find_h(v, bytes, len, bpe_hash_bytes(bytes, len));
}

int bpe_vocab_set(bpe_vocab *v, uint32_t id, const uint8_t *bytes, size_t len, int kind) {
    if (id == BPE_NONE || len > UINT32_MAX) return -1;
    if (vocab_grow_ids(v, id + 1)) return -1;
    if (v->kind[id] != BPE_TOK_HOLE) return -3;
    if (kind == BPE_TOK_NORMAL && bpe_vocab_find(v, bytes, len) != BPE_NONE) return -2;
    if (v->pool_len + len > v->pool_cap) {
        size_t cap = v->pool_cap ? v->pool_cap : 65536;
        while (cap < v->pool_len + len) cap *= 2;
        uint8_t *pool = realloc(v->pool, cap);
        if (!pool) return -1;
        v->pool = pool;
        v->pool_cap = cap;
    }
    if (len) memcpy(v->pool + v->pool_len, bytes, len);
    v->off[id] = v->pool_len;
    v->len[id] = (uint32_t)len;
    v->pool_len += len;
    v->kind[id] = (uint8_t)kind;
    if (id >= v->n) v->n = id + 1;
    if (kind == BPE_TOK_NORMAL) {
        if (!v->slots || (v->n_mapped + 1) * 2 > v->mask + 1) {
            size_t nslots = v->slots ? (v->mask + 1) * 2 : 1024;
            while ((v->n_mapped + 1) * 2 > nslots) nslots *= 2;
            if (vocab_rehash(v, nslots)) return -1;
        }
        vocab_slot_insert(v->slots, v->mask, bpe_hash_bytes(bytes, len), id, bytes, len);
        v->n_mapped++;
    }
    return 0;
}

/* ---- pair map ------------------------------------------------------------- */
void bpe_pairmap_init(bpe_pairmap *m) { memset(m, 0, sizeof *m); }

void bpe_pairmap_free(bpe_pairmap *m) {
    free(m->e);
    memset(m, 0, sizeof *m);
}

static int pairmap_resize(bpe_pairmap *m, size_t nslots) {
    bpe_pair_ent *e = malloc(nslots * sizeof *e);
    if (!e) return -1;
    for (size_t i = 0; i < nslots; i++) e[i].key = UINT64_MAX;
    for (size_t i = 0; m->e && i <= m->mask; i++) {
        if (m->e[i].key == UINT64_MAX) continue;
        size_t j = (size_t)bpe_mix64(m->e[i].key) & (nslots - 1);
        while (e[j].key != UINT64_MAX) j = (j + 1) & (nslots - 1);
        e[j] = m->e[i];
    }
    free(m->e);
    m->e = e;
    m->mask = nslots - 1;
    return 0;
}

int bpe_pairmap_put(bpe_pairmap *m, uint32_t a, uint32_t b, uint32_t prio, uint32_t merged) {
    if (!m->e || (m->count + 1) * 2 > m->mask + 1) {
        if (pairmap_resize(m, m->e ? (m->mask + 1) * 2 : 1024)) return -1;
    }
    uint64_t key = ((uint64_t)a << 32) | b;
    size_t i = (size_t)bpe_mix64(key) & m->mask;
    while (m->e[i].key != UINT64_MAX && m->e[i].key != key) i = (i + 1) & m->mask;
    if (m->e[i].key == UINT64_MAX) m->count++;
    m->e[i].key = key;
    m->e[i].val = ((uint64_t)prio << 32) | merged;
    return 0;
}

/* ---- merge loop ----------------------------------------------------------- */
struct bpe_heap_ent {
    uint64_t key; /* priority<<32 | position: min-heap order */
    uint32_t merged;
};

void bpe_scratch_free(bpe_scratch *s) {
    free(s->prev);
    free(s->next);
    free(s->aux);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

static int scratch_reserve(bpe_scratch *s, size_t n) {
    if (n > s->cap) {
        size_t cap = s->cap ? s->cap : 64;
        while (cap < n) cap *= 2;
        uint32_t *p = realloc(s->prev, cap * sizeof *p);
        if (!p) return -1;
        s->prev = p;
        p = realloc(s->next, cap * sizeof *p);
        if (!p) return -1;
        s->next = p;
        p = realloc(s->aux, cap * 2 * sizeof *p);
        if (!p) return -1;
        s->aux = p;
        s->cap = cap;
    }
    return 0;
}

size_t bpe_merge_linear(const bpe_pairmap *m, uint32_t *ids, size_t n, bpe_scratch *s) {
    if (n < 2) return n;
    if (scratch_reserve(s, n)) return SIZE_MAX;
    uint32_t *prio = s->aux, *merged = s->aux + s->cap;
    for (size_t i = 0; i + 1 < n; i++)
        if (!bpe_pairmap_get(m, ids[i], ids[i + 1], &prio[i], &merged[i])) prio[i] = BPE_NONE;
    prio[n - 1] = BPE_NONE;
    for (;;) {
        uint32_t best = BPE_NONE;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < n; i++)
            if (prio[i] < best) {
                best = prio[i];
                bi = i;
            }
        if (best == BPE_NONE) break;
        ids[bi] = merged[bi];
        memmove(ids + bi + 1, ids + bi + 2, (n - bi - 2) * sizeof *ids);
        memmove(prio + bi + 1, prio + bi + 2, (n - bi - 2) * sizeof *prio);
        memmove(merged + bi + 1, merged + bi + 2, (n - bi - 2) * sizeof *merged);
        n--;
        if (bi + 1 < n) {
            if (!bpe_pairmap_get(m, ids[bi], ids[bi + 1], &prio[bi], &merged[bi])) prio[bi] = BPE_NONE;
        } else {
            prio[bi] = BPE_NONE;
        }
        if (bi > 0 && !bpe_pairmap_get(m, ids[bi - 1], ids[bi], &prio[bi - 1], &merged[bi - 1]))
            prio[bi - 1] = BPE_NONE;
    }
    return n;
}

static void heap_push(struct bpe_heap_ent *h, size_t *n, uint64_t key, uint32_t merged) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].key <= key) break;
        h[i] = h[p];
        i = p;
    }
    h[i].key = key;
    h[i].merged = merged;
}

static struct bpe_heap_ent heap_pop(struct bpe_heap_ent *h, size_t *n) {
    struct bpe_heap_ent top = h[0];
    struct bpe_heap_ent last = h[--(*n)];
    size_t i = 0, cnt = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= cnt) break;
        if (c + 1 < cnt && h[c + 1].key < h[c].key) c++;
        if (last.key <= h[c].key) break;
        h[i] = h[c];
        i = c;
    }
    if (cnt) h[i] = last;
    return top;
}

size_t bpe_merge_heap(const bpe_pairmap *m, uint32_t *ids, size_t n, bpe_scratch *s) {
    if (n < 2) return n;
    if (n >= UINT32_MAX) return SIZE_MAX;
    if (scratch_reserve(s, n)) return SIZE_MAX;
    size_t hcap = 3 * n;
    if (hcap > s->heap_cap) {
        struct bpe_heap_ent *h = realloc(s->heap, hcap * sizeof *h);
        if (!h) return SIZE_MAX;
        s->heap = h;
        s->heap_cap = hcap;
    }
    uint32_t *prev = s->prev, *next = s->next;
    uint8_t *dead = (uint8_t *)s->aux; /* cap*8 bytes available */
    struct bpe_heap_ent *heap = s->heap;
    size_t hn = 0;
    uint32_t prio, merged;
    for (size_t i = 0; i < n; i++) {
        prev[i] = i ? (uint32_t)(i - 1) : BPE_NONE;
        next[i] = i + 1 < n ? (uint32_t)(i + 1) : BPE_NONE;
        dead[i] = 0;
        if (i + 1 < n && bpe_pairmap_get(m, ids[i], ids[i + 1], &prio, &merged))
            heap_push(heap, &hn, ((uint64_t)prio << 32) | i, merged);
    }
    while (hn) {
        struct bpe_heap_ent e = heap_pop(heap, &hn);
        uint32_t pos = (uint32_t)e.key;
        if (dead[pos]) continue;
        uint32_t nx = next[pos];
        if (nx == BPE_NONE) continue;
        if (!bpe_pairmap_get(m, ids[pos], ids[nx], &prio, &merged) || merged != e.merged) continue;
        ids[pos] = merged;
        dead[nx] = 1;
        uint32_t nn = next[nx];
        next[pos] = nn;
        if (nn != BPE_NONE) prev[nn] = pos;
        uint32_t pv = prev[pos];
        if (pv != BPE_NONE && bpe_pairmap_get(m, ids[pv], ids[pos], &prio, &merged))
            heap_push(heap, &hn, ((uint64_t)prio << 32) | pv, merged);
        if (nn != BPE_NONE && bpe_pairmap_get(m, ids[pos], ids[nn], &prio, &merged))
            heap_push(heap, &hn, ((uint64_t)prio << 32) | pos, merged);
    }
    size_t out = 0;
    for (uint32_t i = 0; i != BPE_NONE; i = next[i]) ids[out++] = ids[i];
    return out;
}

size_t bpe_merge(const bpe_pairmap *m, uint32_t *ids, size_t n, bpe_scratch *s) {
    return n <= BPE_LINEAR_MAX ? bpe_merge_linear(m, ids, n, s) : bpe_merge_heap(m, ids, n, s);
}

/* ---- UTF-8 ---------------------------------------------------------------- */
/* Length of the well-formed prefix of the sequence starting at s[0] (1..4),
 * and whether it is complete: returns the full length when valid, or
 * -(consumed) where consumed >= 1 is the maximal ill-formed subpart. */
static int utf8_seq(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else return -1;
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n) return -k;
        uint8_t b = s[k];
        if (b < lo || b > hi) return -k;
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

size_t bpe_utf8_check(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_seq(s + i, n - i);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return n;
}

size_t bpe_utf8_lossy(const uint8_t *s, size_t n, uint8_t *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        int k = utf8_seq(s + i, n - i);
        if (k > 0) {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            out[o++] = 0xEF;
            out[o++] = 0xBF;
            out[o++] = 0xBD;
            i += (size_t)(-k);
        }
    }
    return o;
}

uint32_t bpe_utf8_next(const uint8_t *s, size_t n, size_t *adv) {
    uint8_t c = s[0];
    if (c < 0x80 || n < 2) {
        *adv = 1;
        return c;
    }
    if (c < 0xE0) {
        *adv = 2;
        return ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (c < 0xF0 || n < 4) {
        *adv = 3;
        return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *adv = 4;
    return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
        (s[3] & 0x3F);
}

size_t bpe_utf8_put(uint32_t cp, uint8_t *out) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- base64 --------------------------------------------------------------- */
static const char b64_chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int b64_val(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

long bpe_b64_decode(const char *s, size_t n, uint8_t *out) {
    if (n == 0 || n % 4) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
            } else {
                if (pad) return -1;
                v[k] = b64_val(s[i + k]);
                if (v[k] < 0) return -1;
            }
        }
        uint32_t w = ((uint32_t)v[0] << 18) | ((uint32_t)v[1] << 12) | ((uint32_t)v[2] << 6) | (uint32_t)v[3];
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2) out[o++] = (uint8_t)(w >> 8);
        if (pad < 1) out[o++] = (uint8_t)w;
    }
    return (long)o;
}

size_t bpe_b64_encode(const uint8_t *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)s[i] << 16;
        if (i + 1 < n) w |= (uint32_t)s[i + 1] << 8;
        if (i + 2 < n) w |= s[i + 2];
        out[o++] = b64_chars[(w >> 18) & 63];
        out[o++] = b64_chars[(w >> 12) & 63];
        out[o++] = i + 1 < n ? b64_chars[(w >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? b64_chars[w & 63] : '=';
    }
    out[o] = 0;
    return o;
}

/* ---- GPT-2 byte-level map --------------------------------------------------- */
static int byte_printable(unsigned b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174); }

/* The 68 non-printable bytes, in order, are 0..32, 127..160 and 173. */
static unsigned nonprint_byte(unsigned k) { return k <= 32 ? k : k <= 66 ? 127 + (k - 33) : 173; }

uint32_t bpe_bytelevel_cp(uint8_t b) {
    if (byte_printable(b)) return b;
    unsigned k = b <= 32 ? b : b <= 160 ? 33 + (b - 127u) : 67;
    return 0x100 + k;
}

int bpe_bytelevel_byte(uint32_t cp) {
    if (cp < 256) return byte_printable(cp) ? (int)cp : -1;
    if (cp > 0x143) return -1;
    return (int)nonprint_byte(cp - 0x100);
}

uint8_t bpe_bytelevel_order(unsigned i) {
    if (i < 94) return (uint8_t)(33 + i);
    if (i < 106) return (uint8_t)(161 + (i - 94));
    if (i < 188) return (uint8_t)(174 + (i - 106));
    return (uint8_t)nonprint_byte(i - 188);
}
