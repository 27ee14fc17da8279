/* bpe_train.c — byte-level BPE training and the tokenizer files it writes. */
#include "data/bpe_train.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/bpe.h"
#include "data/pretok.h"
#include "data/tokenizer.h"
#include "util/err.h"

const char *const BPE_TRAIN_DEFAULT_SPECIALS[] = {"<|begin_of_text|>",
                                                  "<|end_of_text|>",
                                                  "<|reserved_special_token_0|>",
                                                  "<|reserved_special_token_1|>",
                                                  "<|finetune_right_pad_id|>",
                                                  "<|reserved_special_token_2|>",
                                                  "<|start_header_id|>",
                                                  "<|end_header_id|>",
                                                  "<|eom_id|>",
                                                  "<|eot_id|>",
                                                  "<|python_tag|>"};
const size_t BPE_TRAIN_N_DEFAULT_SPECIALS = sizeof BPE_TRAIN_DEFAULT_SPECIALS / sizeof BPE_TRAIN_DEFAULT_SPECIALS[0];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- piece counting --------------------------------------------------------- */
typedef struct wordtab {
    uint8_t *pool;
    size_t pool_len, pool_cap;
    uint64_t *off;
    uint32_t *len;
    uint64_t *count;
    size_t n, cap;
    uint32_t *slots; /* index+1 */
    size_t mask;
    uint64_t pieces;
    int oom;
} wordtab;

static int wordtab_grow_slots(wordtab *w) {
    size_t ns = w->slots ? (w->mask + 1) * 2 : 1 << 16;
    uint32_t *s = calloc(ns, sizeof *s);
    if (!s) return -1;
    for (size_t i = 0; i < w->n; i++) {
        size_t j = (size_t)bpe_hash_bytes(w->pool + w->off[i], w->len[i]) & (ns - 1);
        while (s[j]) j = (j + 1) & (ns - 1);
        s[j] = (uint32_t)i + 1;
    }
    free(w->slots);
    w->slots = s;
    w->mask = ns - 1;
    return 0;
}

static int count_piece(const uint8_t *p, size_t n, void *user) {
    wordtab *w = user;
    w->pieces++;
    if (!w->slots || (w->n + 1) * 2 > w->mask + 1) {
        if (wordtab_grow_slots(w)) goto oom;
    }
    size_t j = (size_t)bpe_hash_bytes(p, n) & w->mask;
    while (w->slots[j]) {
        size_t i = w->slots[j] - 1;
        if (w->len[i] == n && !memcmp(w->pool + w->off[i], p, n)) {
            w->count[i]++;
            return 0;
        }
        j = (j + 1) & w->mask;
    }
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 1 << 14;
        uint64_t *off = realloc(w->off, cap * sizeof *off);
        if (!off) goto oom;
        w->off = off;
        uint32_t *len = realloc(w->len, cap * sizeof *len);
        if (!len) goto oom;
        w->len = len;
        uint64_t *cnt = realloc(w->count, cap * sizeof *cnt);
        if (!cnt) goto oom;
        w->count = cnt;
        w->cap = cap;
    }
    if (w->pool_len + n > w->pool_cap) {
        size_t cap = w->pool_cap ? w->pool_cap : 1 << 20;
        while (cap < w->pool_len + n) cap *= 2;
        uint8_t *pool = realloc(w->pool, cap);
        if (!pool) goto oom;
        w->pool = pool;
        w->pool_cap = cap;
    }
    memcpy(w->pool + w->pool_len, p, n);
    w->off[w->n] = w->pool_len;
    w->len[w->n] = (uint32_t)n;
    w->count[w->n] = 1;
    w->pool_len += n;
    w->slots[j] = (uint32_t)w->n + 1;
    w->n++;
    return 0;
oom:
    w->oom = 1;
    return -1;
}

static void wordtab_free(wordtab *w) {
    free(w->pool);
    free(w->off);
    free(w->len);
    free(w->count);
    free(w->slots);
}

static char *slurp(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        util_set_err(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        util_set_err(err, errlen, "%s: %s", path, bad ? "read error" : "out of memory");
        return NULL;
    }
    *len = n;
    return buf;
}

/* ---- pair statistics ------------------------------------------------------------ */
typedef struct tpair {
    uint64_t key; /* left<<32 | right */
    int64_t count;
    int64_t before; /* count at the start of the current merge step */
    uint32_t *words;
    uint32_t nw, cw;
    uint32_t last;  /* last word appended + 1 */
    uint32_t stamp; /* merge step that last touched it + 1 */
} tpair;

typedef struct ptab {
    tpair *e;
    size_t n, cap;
    uint32_t *slots; /* entry index + 1 */
    size_t mask;
} ptab;

static int ptab_rehash(ptab *t, size_t ns) {
    uint32_t *s = calloc(ns, sizeof *s);
    if (!s) return -1;
    for (size_t i = 0; i < t->n; i++) {
        size_t j = (size_t)bpe_mix64(t->e[i].key) & (ns - 1);
        while (s[j]) j = (j + 1) & (ns - 1);
        s[j] = (uint32_t)i + 1;
    }
    free(t->slots);
    t->slots = s;
    t->mask = ns - 1;
    return 0;
}

/* entry index of a pair, creating it; SIZE_MAX on out-of-memory */
static size_t ptab_get(ptab *t, uint64_t key) {
    if (!t->slots || (t->n + 1) * 2 > t->mask + 1) {
        if (ptab_rehash(t, t->slots ? (t->mask + 1) * 2 : 1 << 16)) return SIZE_MAX;
    }
    size_t j = (size_t)bpe_mix64(key) & t->mask;
    while (t->slots[j]) {
        size_t i = t->slots[j] - 1;
        if (t->e[i].key == key) return i;
        j = (j + 1) & t->mask;
    }
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1 << 15;
        tpair *e = realloc(t->e, cap * sizeof *e);
        if (!e) return SIZE_MAX;
        t->e = e;
        t->cap = cap;
    }
    memset(&t->e[t->n], 0, sizeof t->e[t->n]);
    t->e[t->n].key = key;
    t->slots[j] = (uint32_t)t->n + 1;
    return t->n++;
}

static void ptab_free(ptab *t) {
    for (size_t i = 0; i < t->n; i++) free(t->e[i].words);
    free(t->e);
    free(t->slots);
}

/* ---- max-heap of (count, pair) -------------------------------------------------- */
typedef struct hent {
    int64_t count;
    uint64_t key;
} hent;

typedef struct heap {
    hent *a;
    size_t n, cap;
} heap;

static int hbefore(const hent *x, const hent *y) { /* x pops before y */
    return x->count > y->count || (x->count == y->count && x->key < y->key);
}

static int heap_push(heap *h, int64_t count, uint64_t key) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 1 << 15;
        hent *a = realloc(h->a, cap * sizeof *a);
        if (!a) return -1;
        h->a = a;
        h->cap = cap;
    }
    hent x = {count, key};
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hbefore(&x, &h->a[p])) break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = x;
    return 0;
}

static hent heap_pop(heap *h) {
    hent top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && hbefore(&h->a[c + 1], &h->a[c])) c++;
        if (!hbefore(&h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n) h->a[i] = last;
    return top;
}

/* ---- trainer state ------------------------------------------------------------ */
typedef struct trainer {
    wordtab words;
    uint32_t *sym;  /* all words' symbols */
    uint64_t *woff; /* per word: offset into sym */
    uint32_t *wlen; /* per word: current symbol count */
    ptab pairs;
    heap hp;
    bpe_vocab v; /* learned vocabulary (ids = ranks) */
    size_t *touched;
    size_t n_touched, cap_touched;
    uint32_t step;
    uint8_t *cat; /* scratch: the bytes of the pair being merged */
    size_t cat_cap;
} trainer;

static int touch(trainer *T, size_t pi) {
    tpair *p = &T->pairs.e[pi];
    if (p->stamp == T->step + 1) return 0;
    p->stamp = T->step + 1;
    p->before = p->count;
    if (T->n_touched == T->cap_touched) {
        size_t cap = T->cap_touched ? T->cap_touched * 2 : 1024;
        size_t *t = realloc(T->touched, cap * sizeof *t);
        if (!t) return -1;
        T->touched = t;
        T->cap_touched = cap;
    }
    T->touched[T->n_touched++] = pi;
    return 0;
}

/* count delta for pair (a,b); word w is recorded when the pair is new there */
static int change(trainer *T, uint32_t a, uint32_t b, int64_t delta, uint32_t w, int record) {
    size_t pi = ptab_get(&T->pairs, ((uint64_t)a << 32) | b);
    if (pi == SIZE_MAX || touch(T, pi)) return -1;
    tpair *p = &T->pairs.e[pi];
    p->count += delta;
    if (record && p->last != w + 1) {
        if (p->nw == p->cw) {
            uint32_t cw = p->cw ? p->cw * 2 : 4;
            uint32_t *ws = realloc(p->words, cw * sizeof *ws);
            if (!ws) return -1;
            p->words = ws;
            p->cw = cw;
        }
        p->words[p->nw++] = w;
        p->last = w + 1;
    }
    return 0;
}

/* Merge (a,b) -> t in word w, left to right, recording pair count changes. */
static int merge_word(trainer *T, uint32_t w, uint32_t a, uint32_t b, uint32_t t) {
    uint32_t *s = T->sym + T->woff[w];
    uint32_t n = T->wlen[w], o = 0, i = 0;
    int64_t c = (int64_t)T->words.count[w];
    while (i < n) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
            if (o > 0) {
                if (change(T, s[o - 1], a, -c, w, 0) || change(T, s[o - 1], t, c, w, 1)) return -1;
            }
            if (i + 2 < n) {
                if (change(T, b, s[i + 2], -c, w, 0) || change(T, t, s[i + 2], c, w, 1)) return -1;
            }
            s[o++] = t;
            i += 2;
        } else {
            s[o++] = s[i++];
        }
    }
    T->wlen[w] = o;
    return 0;
}

static void trainer_free(trainer *T) {
    wordtab_free(&T->words);
    free(T->sym);
    free(T->woff);
    free(T->wlen);
    ptab_free(&T->pairs);
    free(T->hp.a);
    bpe_vocab_free(&T->v);
    free(T->touched);
    free(T->cat);
}

/* ---- output files -------------------------------------------------------------- */
static int write_text(const char *dir, const char *name, const char *text, size_t len, char *err, size_t errlen) {
    size_t pl = strlen(dir) + strlen(name) + 2;
    char *path = malloc(pl);
    if (!path) {
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    snprintf(path, pl, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        util_set_err(err, errlen, "%s: %s", path, strerror(errno));
        free(path);
        return -1;
    }
    int bad = fwrite(text, 1, len, f) != len;
    bad |= fflush(f) != 0;
    bad |= fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad) util_set_err(err, errlen, "%s: write failed: %s", path, strerror(errno));
    free(path);
    return bad ? -1 : 0;
}

static char *bytelevel_str(const uint8_t *b, size_t n) {
    char *s = malloc(2 * n + 1);
    if (!s) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) o += bpe_utf8_put(bpe_bytelevel_cp(b[i]), (uint8_t *)s + o);
    s[o] = 0;
    return s;
}

typedef struct msplit {
    uint32_t l, r;
} msplit;

static int msplit_cmp(const void *x, const void *y) {
    const msplit *a = x, *b = y;
    if (a->l != b->l) return a->l < b->l ? -1 : 1;
    if (a->r != b->r) return a->r < b->r ? -1 : 1;
    return 0;
}

static int write_tiktoken(const bpe_vocab *v, uint32_t n_ranks, const char *dir, char *err, size_t errlen) {
    size_t cap = (size_t)n_ranks * 16 + v->pool_len * 2 + 64, o = 0;
    char *buf = malloc(cap);
    if (!buf) {
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    for (uint32_t id = 0; id < n_ranks; id++) {
        size_t len;
        const uint8_t *b = bpe_vocab_bytes(v, id, &len);
        if (o + 4 * ((len + 2) / 3) + 16 > cap) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                util_set_err(err, errlen, "out of memory");
                return -1;
            }
            buf = nb;
        }
        o += bpe_b64_encode(b, len, buf + o);
        o += (size_t)sprintf(buf + o, " %u\n", id);
    }
    int rc = write_text(dir, "tokenizer.model", buf, o, err, errlen);
    free(buf);
    return rc;
}

static json_t *added_token_json(uint32_t id, const char *content, int with_id) {
    json_t *o = json_object();
    if (with_id) json_object_set_new(o, "id", json_integer(id));
    json_object_set_new(o, "content", json_string(content));
    json_object_set_new(o, "single_word", json_false());
    json_object_set_new(o, "lstrip", json_false());
    json_object_set_new(o, "rstrip", json_false());
    json_object_set_new(o, "normalized", json_false());
    json_object_set_new(o, "special", json_true());
    return o;
}

static int write_json_file(json_t *root, const char *dir, const char *name, char *err, size_t errlen) {
    char *s = json_dumps(root, JSON_INDENT(2));
    if (!s) {
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    t[n] = '\n';
    t[n + 1] = 0;
    int rc = write_text(dir, name, t, n + 1, err, errlen);
    free(t);
    return rc;
}

/* The merge rule "left right" for the split (l, r), in byte-level text; NULL on out-of-memory. */
static char *merge_string(const bpe_vocab *v, msplit m) {
    size_t ll, rl;
    const uint8_t *lb = bpe_vocab_bytes(v, m.l, &ll), *rb = bpe_vocab_bytes(v, m.r, &rl);
    char *ls = bytelevel_str(lb, ll), *rs = bytelevel_str(rb, rl);
    char *s = ls && rs ? malloc(strlen(ls) + strlen(rs) + 2) : NULL;
    if (s) sprintf(s, "%s %s", ls, rs);
    free(ls);
    free(rs);
    return s;
}

/* Append to merges every split of token b (len >= 2) into two ranked tokens, ordered by (left, right);
 * *loc is scratch grown as needed. -1 on out-of-memory. */
static int append_token_merges(const bpe_vocab *v, uint32_t n_ranks, const uint8_t *b, size_t len, msplit **loc,
                               size_t *cap_loc, json_t *merges) {
    size_t nl = 0;
    if (len > *cap_loc) {
        msplit *l = realloc(*loc, len * sizeof *l);
        if (!l) return -1;
        *loc = l;
        *cap_loc = len;
    }
    for (size_t k = 1; k < len; k++) {
        uint32_t l = bpe_vocab_find(v, b, k), r = bpe_vocab_find(v, b + k, len - k);
        if (l != BPE_NONE && r != BPE_NONE && l < n_ranks && r < n_ranks) (*loc)[nl++] = (msplit){l, r};
    }
    qsort(*loc, nl, sizeof **loc, msplit_cmp);
    for (size_t k = 0; k < nl; k++) {
        char *m = merge_string(v, (*loc)[k]);
        if (!m || json_array_append_new(merges, json_string(m))) {
            free(m);
            return -1;
        }
        free(m);
    }
    return 0;
}

/* Fill the model's vocab (byte-level text -> id) and merges, token by token in rank order. -1 on out-of-memory. */
static int hf_vocab_merges(const bpe_vocab *v, uint32_t n_ranks, json_t *vocab, json_t *merges) {
    msplit *loc = NULL;
    size_t cap_loc = 0;
    int rc = 0;
    for (uint32_t id = 0; id < n_ranks && !rc; id++) {
        size_t len;
        const uint8_t *b = bpe_vocab_bytes(v, id, &len);
        char *s = bytelevel_str(b, len);
        if (!s || json_object_set_new(vocab, s, json_integer(id))) {
            free(s);
            rc = -1;
            break;
        }
        free(s);
        if (len >= 2) rc = append_token_merges(v, n_ranks, b, len, &loc, &cap_loc, merges);
    }
    free(loc);
    return rc;
}

/* Llama 3's pre-tokenizer: Split on its regex, then ByteLevel without a regex of its own. */
static json_t *hf_pre_tokenizer(void) {
    json_t *split = json_object(), *pat = json_object(), *bl = json_object(), *seq = json_object(),
           *list = json_array();
    json_object_set_new(pat, "Regex", json_string(PRETOK_LLAMA3_PATTERN));
    json_object_set_new(split, "type", json_string("Split"));
    json_object_set_new(split, "pattern", pat);
    json_object_set_new(split, "behavior", json_string("Isolated"));
    json_object_set_new(split, "invert", json_false());
    json_object_set_new(bl, "type", json_string("ByteLevel"));
    json_object_set_new(bl, "add_prefix_space", json_false());
    json_object_set_new(bl, "trim_offsets", json_true());
    json_object_set_new(bl, "use_regex", json_false());
    json_array_append_new(list, split);
    json_array_append_new(list, bl);
    json_object_set_new(seq, "type", json_string("Sequence"));
    json_object_set_new(seq, "pretokenizers", list);
    return seq;
}

/* The BPE model object; vocab and merges are shared, not stolen (the caller releases its references). */
static json_t *hf_model(json_t *vocab, json_t *merges) {
    json_t *model = json_object();
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "dropout", json_null());
    json_object_set_new(model, "unk_token", json_null());
    json_object_set_new(model, "continuing_subword_prefix", json_null());
    json_object_set_new(model, "end_of_word_suffix", json_null());
    json_object_set_new(model, "fuse_unk", json_false());
    json_object_set_new(model, "byte_fallback", json_false());
    json_object_set_new(model, "ignore_merges", json_true());
    json_object_set(model, "vocab", vocab);
    json_object_set(model, "merges", merges);
    return model;
}

/* Fill root with tokenizer.json's keys, in the order Hugging Face writes them. */
static void hf_fill_tokenizer(json_t *root, json_t *added, json_t *vocab, json_t *merges) {
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_object_set(root, "added_tokens", added);
    json_object_set_new(root, "normalizer", json_null());
    json_object_set_new(root, "pre_tokenizer", hf_pre_tokenizer());
    json_object_set_new(root, "post_processor", json_null());
    json_t *dec = json_object();
    json_object_set_new(dec, "type", json_string("ByteLevel"));
    json_object_set_new(dec, "add_prefix_space", json_true());
    json_object_set_new(dec, "trim_offsets", json_true());
    json_object_set_new(dec, "use_regex", json_true());
    json_object_set_new(root, "decoder", dec);
    json_object_set_new(root, "model", hf_model(vocab, merges));
}

/* tokenizer_config.json: the specials by id, bos and eos (JSON null when absent). */
static json_t *hf_tokenizer_config(uint32_t n_ranks, const char *const *specials, size_t n_sp, const char *bos,
                                   const char *eos) {
    json_t *root = json_object();
    json_t *dec_map = json_object();
    for (size_t k = 0; k < n_sp; k++) {
        char key[16];
        snprintf(key, sizeof key, "%u", n_ranks + (uint32_t)k);
        json_object_set_new(dec_map, key, added_token_json(0, specials[k], 0));
    }
    json_object_set_new(root, "added_tokens_decoder", dec_map);
    json_object_set_new(root, "bos_token", bos ? json_string(bos) : json_null());
    json_object_set_new(root, "eos_token", eos ? json_string(eos) : json_null());
    json_object_set_new(root, "clean_up_tokenization_spaces", json_false());
    json_t *names = json_array();
    json_array_append_new(names, json_string("input_ids"));
    json_array_append_new(names, json_string("attention_mask"));
    json_object_set_new(root, "model_input_names", names);
    json_object_set_new(root, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    return root;
}

static int write_hf(const bpe_vocab *v, uint32_t n_ranks, const char *const *specials, size_t n_sp, const char *bos,
                    const char *eos, const char *dir, char *err, size_t errlen) {
    int rc = -1;
    json_t *root = json_object(), *vocab = json_object(), *merges = json_array(), *added = json_array();
    if (!root || !vocab || !merges || !added) goto oom;
    if (hf_vocab_merges(v, n_ranks, vocab, merges)) goto oom;
    for (size_t k = 0; k < n_sp; k++)
        if (json_array_append_new(added, added_token_json(n_ranks + (uint32_t)k, specials[k], 1))) goto oom;
    hf_fill_tokenizer(root, added, vocab, merges);
    if (write_json_file(root, dir, "tokenizer.json", err, errlen)) goto out;

    /* tokenizer_config.json */
    json_decref(root);
    root = hf_tokenizer_config(n_ranks, specials, n_sp, bos, eos);
    if (write_json_file(root, dir, "tokenizer_config.json", err, errlen)) goto out;
    rc = 0;
    goto out;
oom:
    util_set_err(err, errlen, "out of memory");
out:
    json_decref(root);
    json_decref(vocab);
    json_decref(merges);
    json_decref(added);
    return rc;
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            size_t pl = strlen(dir) + strlen(e->d_name) + 2;
            char *p = malloc(pl);
            if (!p) continue;
            snprintf(p, pl, "%s/%s", dir, e->d_name);
            unlink(p);
            free(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* ---- training ------------------------------------------------------------------ */
/* Each special token is non-empty UTF-8 and listed once. */
static int check_specials(const char *const *sp, size_t n_sp, char *err, size_t errlen) {
    for (size_t i = 0; i < n_sp; i++) {
        size_t l = strlen(sp[i]);
        if (!l || bpe_utf8_check((const uint8_t *)sp[i], l) != l) {
            util_set_err(err, errlen, "special token %zu is empty or not UTF-8", i);
            return -1;
        }
        for (size_t j = 0; j < i; j++)
            if (!strcmp(sp[i], sp[j])) {
                util_set_err(err, errlen, "special token %s is listed twice", sp[i]);
                return -1;
            }
    }
    return 0;
}

/* The output folder must not exist yet and its parent must be a writable folder, checked before the
 * (long) training rather than after it. */
static int check_output_dir(const char *output_dir, char *err, size_t errlen) {
    struct stat sst;
    if (lstat(output_dir, &sst) == 0) {
        util_set_err(err, errlen, "%s already exists; refusing to overwrite it (choose a new folder)", output_dir);
        return -1;
    }
    char *parent = strdup(output_dir);
    if (!parent) {
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    size_t pl = strlen(parent);
    while (pl > 1 && parent[pl - 1] == '/') parent[--pl] = 0;
    char *slash = strrchr(parent, '/');
    const char *pdir = slash ? (slash == parent ? "/" : (*slash = 0, parent)) : ".";
    int ok = stat(pdir, &sst) == 0 && S_ISDIR(sst.st_mode) && access(pdir, W_OK) == 0;
    if (!ok)
        util_set_err(err, errlen, "%s: the folder to create it in (%s) does not exist or is not writable", output_dir,
                     pdir);
    free(parent);
    return ok ? 0 : -1;
}

/* Validate the options (sp/n_sp: the special tokens in effect). */
static int check_opts(const bpe_train_opts *o, const char *const *sp, size_t n_sp, char *err, size_t errlen) {
    if (!o->output_dir || !*o->output_dir) {
        util_set_err(err, errlen, "no output folder given");
        return -1;
    }
    if (!o->n_inputs) {
        util_set_err(err, errlen, "no input files given");
        return -1;
    }
    if (check_specials(sp, n_sp, err, errlen)) return -1;
    if (o->vocab_size < 256 + n_sp + 1) {
        util_set_err(err, errlen,
                     "vocab size %u is too small: 256 byte tokens + %zu special tokens leave no room to learn",
                     o->vocab_size, n_sp);
        return -1;
    }
    return check_output_dir(o->output_dir, err, errlen);
}

/* 1. Split every input into pieces and count the distinct ones into T->words. */
static int count_input_pieces(trainer *T, const bpe_train_opts *o, const pretok *re, pretok_ctx *pc,
                              bpe_train_stats *st, char *err, size_t errlen) {
    for (size_t i = 0; i < o->n_inputs; i++) {
        size_t len;
        char *text = slurp(o->inputs[i], &len, err, errlen);
        if (!text) return -1;
        size_t bad = bpe_utf8_check((const uint8_t *)text, len);
        if (bad < len) {
            free(text);
            util_set_err(err, errlen, "%s: invalid UTF-8 at byte offset %zu", o->inputs[i], bad);
            return -1;
        }
        int r = pretok_split(re, pc, (const uint8_t *)text, len, count_piece, &T->words, err, errlen);
        free(text);
        if (r) {
            if (T->words.oom) util_set_err(err, errlen, "out of memory");
            return -1;
        }
        st->bytes += len;
    }
    if (!st->bytes) {
        util_set_err(err, errlen, "the input is empty: nothing to train on");
        return -1;
    }
    st->pieces = T->words.pieces;
    st->unique_pieces = T->words.n;
    if (o->verbose)
        fprintf(stderr, "train-tokenizer: %llu bytes, %llu pieces, %llu distinct\n", (unsigned long long)st->bytes,
                (unsigned long long)st->pieces, (unsigned long long)st->unique_pieces);
    return 0;
}

/* 2. The 256 byte tokens, every word as byte symbols, the initial pair counts and the heap.
 * -1 on out-of-memory. */
static int init_symbols(trainer *T) {
    uint32_t byte_id[256];
    for (unsigned i = 0; i < 256; i++) {
        uint8_t b = bpe_bytelevel_order(i);
        byte_id[b] = i;
        if (bpe_vocab_set(&T->v, i, &b, 1, BPE_TOK_NORMAL)) return -1;
    }
    size_t nw = T->words.n;
    T->woff = malloc(nw * sizeof *T->woff);
    T->wlen = malloc(nw * sizeof *T->wlen);
    T->sym = malloc((T->words.pool_len ? T->words.pool_len : 1) * sizeof *T->sym);
    if (!T->woff || !T->wlen || !T->sym) return -1;
    for (size_t w = 0; w < nw; w++) {
        T->woff[w] = T->words.off[w];
        T->wlen[w] = T->words.len[w];
        const uint8_t *b = T->words.pool + T->words.off[w];
        uint32_t *s = T->sym + T->woff[w];
        for (uint32_t i = 0; i < T->wlen[w]; i++) s[i] = byte_id[b[i]];
        for (uint32_t i = 0; i + 1 < T->wlen[w]; i++)
            if (change(T, s[i], s[i + 1], (int64_t)T->words.count[w], (uint32_t)w, 1)) return -1;
    }
    for (size_t i = 0; i < T->pairs.n; i++)
        if (T->pairs.e[i].count > 0 && heap_push(&T->hp, T->pairs.e[i].count, T->pairs.e[i].key)) return -1;
    return 0;
}

/* Grow T->cat to hold at least need bytes (to twice that, keeping its contents). */
static int cat_reserve(trainer *T, size_t need) {
    if (need <= T->cat_cap) return 0;
    size_t cap = 2 * need;
    uint8_t *c = realloc(T->cat, cap);
    if (!c) return -1;
    T->cat = c;
    T->cat_cap = cap;
    return 0;
}

/* The bytes of token a followed by those of token b, in T->cat; -1 on out-of-memory. */
static int concat_pair(trainer *T, uint32_t a, uint32_t b, size_t *len) {
    size_t la, lb;
    const uint8_t *ba = bpe_vocab_bytes(&T->v, a, &la);
    if (cat_reserve(T, la + 64)) return -1;
    memcpy(T->cat, ba, la);
    const uint8_t *bb = bpe_vocab_bytes(&T->v, b, &lb);
    if (cat_reserve(T, la + lb)) return -1;
    memcpy(T->cat + la, bb, lb);
    *len = la + lb;
    return 0;
}

/* Merge pair pi = (a,b) into token t in every word that holds it, retire the pair, and push the pairs
 * whose counts grew (the heap keeps stale entries; shrunk ones are requeued when popped). */
static int apply_merge(trainer *T, size_t pi, uint32_t a, uint32_t b, uint32_t t) {
    T->n_touched = 0;
    for (uint32_t k = 0; k < T->pairs.e[pi].nw; k++) {
        uint32_t w = T->pairs.e[pi].words[k];
        if (merge_word(T, w, a, b, t)) return -1;
    }
    tpair *p = &T->pairs.e[pi];
    p->count = 0;
    free(p->words);
    p->words = NULL;
    p->nw = p->cw = 0;
    p->last = 0;
    for (size_t k = 0; k < T->n_touched; k++) {
        tpair *q = &T->pairs.e[T->touched[k]];
        if (q->count > q->before && heap_push(&T->hp, q->count, q->key)) return -1;
    }
    T->step++;
    return 0;
}

/* 3. The merge loop: learn tokens until n_ranks ids exist or no pair is left; *next_id gets the first
 * unlearned id. -1 on out-of-memory. */
static int learn_merges(trainer *T, uint32_t n_ranks, uint32_t target, int verbose, bpe_train_stats *st,
                        uint32_t *next_id) {
    uint32_t next = 256;
    while (next < n_ranks) {
        if (!T->hp.n) break;
        hent top = heap_pop(&T->hp);
        size_t pi = ptab_get(&T->pairs, top.key);
        if (pi == SIZE_MAX) return -1;
        int64_t cur = T->pairs.e[pi].count;
        if (cur <= 0) continue;
        if (cur != top.count) {
            if (heap_push(&T->hp, cur, top.key)) return -1;
            continue;
        }
        uint32_t a = (uint32_t)(top.key >> 32), b = (uint32_t)top.key;
        size_t len;
        if (concat_pair(T, a, b, &len)) return -1;
        uint32_t t = bpe_vocab_find(&T->v, T->cat, len);
        if (t == BPE_NONE) {
            t = next++;
            if (bpe_vocab_set(&T->v, t, T->cat, len, BPE_TOK_NORMAL)) return -1;
            st->merges++;
        } else {
            st->duplicate_merges++;
        }
        if (apply_merge(T, pi, a, b, t)) return -1;
        if (verbose && t == next - 1 && (next - 256) % 1000 == 0)
            fprintf(stderr, "train-tokenizer: %u/%u tokens learned (last pair seen %lld times)\n", next - 256, target,
                    (long long)cur);
    }
    *next_id = next;
    return 0;
}

/* 4a. Create <output_dir>.tmp-<pid> (trailing slashes dropped) to write into; NULL with err set. */
static char *make_tmpdir(const char *output_dir, char *err, size_t errlen) {
    size_t dl = strlen(output_dir);
    char *tmpdir = malloc(dl + 32), *od = tmpdir ? strdup(output_dir) : NULL;
    if (!od) {
        free(tmpdir);
        util_set_err(err, errlen, "out of memory");
        return NULL;
    }
    while (dl > 1 && od[dl - 1] == '/') od[--dl] = 0;
    snprintf(tmpdir, dl + 32, "%s.tmp-%ld", od, (long)getpid());
    free(od);
    if (mkdir(tmpdir, 0755)) {
        util_set_err(err, errlen, "%s: cannot create: %s", tmpdir, strerror(errno));
        free(tmpdir);
        return NULL;
    }
    return tmpdir;
}

/* 4b. Write the tiktoken and Hugging Face files into dir; bos and eos are the Llama 3 ones when listed. */
static int write_files(const bpe_vocab *v, uint32_t n_ranks, const char *const *sp, size_t n_sp, const char *dir,
                       char *err, size_t errlen) {
    const char *bos = NULL, *eos = NULL;
    for (size_t k = 0; k < n_sp; k++) {
        if (!strcmp(sp[k], "<|begin_of_text|>")) bos = sp[k];
        if (!strcmp(sp[k], "<|end_of_text|>")) eos = sp[k];
    }
    if (write_tiktoken(v, n_ranks, dir, err, errlen)) return -1;
    return write_hf(v, n_ranks, sp, n_sp, bos, eos, dir, err, errlen);
}

/* 5. Check that the written tokenizer loads with the wanted vocab size, then move it into place. */
static int install_tokenizer(const char *tmpdir, const bpe_train_opts *o, char *err, size_t errlen) {
    tok_tokenizer *tk = tok_load(tmpdir, err, errlen);
    if (!tk) return -1;
    uint32_t got = tok_vocab_size(tk);
    tok_free(tk);
    if (got != o->vocab_size) {
        util_set_err(err, errlen, "internal error: wrote %u ids, wanted %u", got, o->vocab_size);
        return -1;
    }
    if (rename(tmpdir, o->output_dir)) {
        util_set_err(err, errlen, "cannot rename %s to %s: %s", tmpdir, o->output_dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* 6. Measure it on the input (informational: failures leave tokens at 0). */
static void measure_tokens(const bpe_train_opts *o, bpe_train_stats *st) {
    char merr[256];
    tok_tokenizer *tk = tok_load(o->output_dir, merr, sizeof merr);
    for (size_t i = 0; tk && i < o->n_inputs; i++) {
        size_t len, n;
        uint32_t *ids;
        char *text = slurp(o->inputs[i], &len, merr, sizeof merr);
        int r = text ? tok_encode(tk, text, len, 0, 0, 0, &ids, &n, merr, sizeof merr) : -1;
        free(text);
        if (r) {
            st->tokens = 0;
            break;
        }
        free(ids);
        st->tokens += n;
    }
    tok_free(tk);
}

int bpe_train(const bpe_train_opts *o, bpe_train_stats *st, char *err, size_t errlen) {
    bpe_train_stats dummy;
    if (!st) st = &dummy;
    memset(st, 0, sizeof *st);
    double t0 = now_s();
    const char *const *sp = o->specials ? o->specials : BPE_TRAIN_DEFAULT_SPECIALS;
    size_t n_sp = o->specials ? o->n_specials : BPE_TRAIN_N_DEFAULT_SPECIALS;
    if (check_opts(o, sp, n_sp, err, errlen)) return -1;
    uint32_t n_ranks = o->vocab_size - (uint32_t)n_sp, target = n_ranks - 256;

    trainer T;
    memset(&T, 0, sizeof T);
    bpe_vocab_init(&T.v);
    int rc = -1;
    char *tmpdir = NULL;
    pretok *re = pretok_compile(PRETOK_LLAMA3_PATTERN, err, errlen);
    pretok_ctx *pc = re ? pretok_ctx_new(re) : NULL;
    if (!pc) {
        if (re) util_set_err(err, errlen, "out of memory");
        goto out;
    }
    if (count_input_pieces(&T, o, re, pc, st, err, errlen)) goto out;
    if (init_symbols(&T)) goto oom;
    uint32_t next_id;
    if (learn_merges(&T, n_ranks, target, o->verbose, st, &next_id)) goto oom;
    if (next_id < n_ranks) {
        util_set_err(
            err, errlen,
            "the input supports only %u learned tokens but vocab size %u needs %u: give more text or a smaller "
            "--vocab-size",
            next_id - 256, o->vocab_size, target);
        goto out;
    }

    /* 4. write into a temporary folder, then rename */
    tmpdir = make_tmpdir(o->output_dir, err, errlen);
    if (!tmpdir) goto out;
    if (write_files(&T.v, n_ranks, sp, n_sp, tmpdir, err, errlen)) goto out;
    if (install_tokenizer(tmpdir, o, err, errlen)) goto out;
    free(tmpdir);
    tmpdir = NULL;
    rc = 0;
    measure_tokens(o, st);
    goto out;
oom:
    util_set_err(err, errlen, "out of memory");
out:
    if (tmpdir) {
        remove_tree(tmpdir);
        free(tmpdir);
    }
    pretok_ctx_free(pc);
    pretok_free(re);
    trainer_free(&T);
    st->seconds = now_s() - t0;
    return rc;
}
