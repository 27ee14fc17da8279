/* tokenizer.c — byte-level BPE tokenizer: loading tiktoken and Hugging Face
 * files, special tokens, encoding (pre-tokenizer + merge loop + cache) and
 * decoding. See tokenizer.h for the rules. */
#include "data/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/bpe.h"
#include "data/pretok.h"
#include "util/err.h"

/* ---- per-thread encode state ------------------------------------------------ */
#define CACHE_MAX_PIECE 64      /* pieces longer than this are not cached */
#define CACHE_MAX_ENTRIES 32768 /* cleared when full */

typedef struct cache_ent {
    uint64_t h;
    uint32_t koff, ioff;
    uint16_t klen, nids;
} cache_ent;

typedef struct tok_state {
    struct tok_state *prev, *next; /* in the owner's list */
    tok_tokenizer *owner;
    pretok_ctx *pc;
    bpe_scratch bs;
    uint32_t *sym;
    size_t sym_cap;
    cache_ent *ents; /* open addressing, 2*CACHE_MAX_ENTRIES slots; koff == UINT32_MAX = empty */
    size_t n_ents;
    uint8_t *keys;
    size_t keys_len, keys_cap;
    uint32_t *cids;
    size_t cids_len, cids_cap;
} tok_state;

typedef struct special {
    uint32_t id;
    uint32_t len;
    uint8_t *bytes;
} special;

struct tok_tokenizer {
    int format; /* TOK_FORMAT_* */
    bpe_vocab v;
    bpe_pairmap pairs;
    uint32_t byte_id[256];
    int whole_piece; /* a piece that is itself a token is emitted as is */
    pretok *re;
    special *sp; /* sorted by (first byte, length descending) */
    uint32_t n_sp;
    uint32_t sp_start[257]; /* sp index range per first byte */
    int64_t bos, eos;
    pthread_key_t key;
    pthread_mutex_t mu;
    tok_state *states;
};

static void state_free(tok_state *s) {
    if (!s) return;
    pretok_ctx_free(s->pc);
    bpe_scratch_free(&s->bs);
    free(s->sym);
    free(s->ents);
    free(s->keys);
    free(s->cids);
    free(s);
}

static void state_destroy(void *p) { /* thread exit */
    tok_state *s = p;
    tok_tokenizer *t = s->owner;
    pthread_mutex_lock(&t->mu);
    if (s->prev) s->prev->next = s->next;
    else t->states = s->next;
    if (s->next) s->next->prev = s->prev;
    pthread_mutex_unlock(&t->mu);
    state_free(s);
}

static void cache_clear(tok_state *s) {
    for (size_t i = 0; i < 2 * CACHE_MAX_ENTRIES; i++) s->ents[i].koff = UINT32_MAX;
    s->n_ents = 0;
    s->keys_len = 0;
    s->cids_len = 0;
}

static tok_state *get_state(const tok_tokenizer *tc) {
    tok_tokenizer *t = (tok_tokenizer *)tc; /* the state list is the only mutable part */
    tok_state *s = pthread_getspecific(t->key);
    if (s) return s;
    s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->owner = t;
    s->pc = pretok_ctx_new(t->re);
    s->ents = malloc(2 * CACHE_MAX_ENTRIES * sizeof *s->ents);
    if (!s->pc || !s->ents) {
        state_free(s);
        return NULL;
    }
    cache_clear(s);
    if (pthread_setspecific(t->key, s)) {
        state_free(s);
        return NULL;
    }
    pthread_mutex_lock(&t->mu);
    s->next = t->states;
    if (t->states) t->states->prev = s;
    t->states = s;
    pthread_mutex_unlock(&t->mu);
    return s;
}

static const uint32_t *cache_get(tok_state *s, const uint8_t *p, size_t n, uint64_t h, size_t *nids) {
    size_t mask = 2 * CACHE_MAX_ENTRIES - 1, i = (size_t)h & mask;
    for (;;) {
        cache_ent *e = &s->ents[i];
        if (e->koff == UINT32_MAX) return NULL;
        if (e->h == h && e->klen == n && !memcmp(s->keys + e->koff, p, n)) {
            *nids = e->nids;
            return s->cids + e->ioff;
        }
        i = (i + 1) & mask;
    }
}

static void cache_put(tok_state *s, const uint8_t *p, size_t n, uint64_t h, const uint32_t *ids, size_t nids) {
    if (s->n_ents >= CACHE_MAX_ENTRIES) cache_clear(s);
    if (s->keys_len + n > s->keys_cap) {
        size_t cap = s->keys_cap ? s->keys_cap * 2 : 1 << 16;
        uint8_t *k = realloc(s->keys, cap);
        if (!k) return;
        s->keys = k;
        s->keys_cap = cap;
    }
    if (s->cids_len + nids > s->cids_cap) {
        size_t cap = s->cids_cap ? s->cids_cap * 2 : 1 << 15;
        uint32_t *c = realloc(s->cids, cap * sizeof *c);
        if (!c) return;
        s->cids = c;
        s->cids_cap = cap;
    }
    size_t mask = 2 * CACHE_MAX_ENTRIES - 1, i = (size_t)h & mask;
    while (s->ents[i].koff != UINT32_MAX) i = (i + 1) & mask;
    cache_ent *e = &s->ents[i];
    e->h = h;
    e->koff = (uint32_t)s->keys_len;
    e->ioff = (uint32_t)s->cids_len;
    e->klen = (uint16_t)n;
    e->nids = (uint16_t)nids;
    memcpy(s->keys + s->keys_len, p, n);
    memcpy(s->cids + s->cids_len, ids, nids * sizeof *ids);
    s->keys_len += n;
    s->cids_len += nids;
    s->n_ents++;
}

/* ---- errors ------------------------------------------------------------------ */
/* malloc'ed formatted string, or NULL */
static char *strfmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *strfmt(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* ---- Llama 3 and cl100k_base special tokens --------------------------------- */
static const char *const llama3_named[11] = {"<|begin_of_text|>",
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

const char *tok_llama3_special_name(unsigned k, char *buf, size_t buflen) {
    if (k < 11) return llama3_named[k];
    if (k >= TOK_LLAMA3_NUM_SPECIAL) return NULL;
    snprintf(buf, buflen, "<|reserved_special_token_%u|>", k - 8);
    return buf;
}

static const struct {
    uint32_t id;
    const char *name;
} cl100k_specials[] = {{100257, "<|endoftext|>"},
                       {100258, "<|fim_prefix|>"},
                       {100259, "<|fim_middle|>"},
                       {100260, "<|fim_suffix|>"},
                       {100276, "<|endofprompt|>"}};

/* ---- construction helpers ----------------------------------------------------- */
static tok_tokenizer *tok_new(void) {
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    bpe_vocab_init(&t->v);
    bpe_pairmap_init(&t->pairs);
    t->bos = t->eos = -1;
    if (pthread_key_create(&t->key, state_destroy)) {
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->mu, NULL);
    return t;
}

void tok_free(tok_tokenizer *t) {
    if (!t) return;
    pthread_key_delete(t->key); /* no destructor runs after this */
    for (tok_state *s = t->states; s;) {
        tok_state *nx = s->next;
        state_free(s);
        s = nx;
    }
    pthread_mutex_destroy(&t->mu);
    bpe_vocab_free(&t->v);
    bpe_pairmap_free(&t->pairs);
    pretok_free(t->re);
    for (uint32_t i = 0; i < t->n_sp; i++) free(t->sp[i].bytes);
    free(t->sp);
    free(t);
}

/* Register special token `bytes` with id. When id already names a token of the
 * vocabulary, that token must have the same bytes, unless the caller has
 * checked the two agree (in_vocab_ok: a tokenizer.json added token that is also
 * in model.vocab, whose vocab string is byte-level encoded). */
static int add_special(tok_tokenizer *t, uint32_t id, const uint8_t *bytes, size_t len, const char *where,
                       int in_vocab_ok, char *err, size_t errlen) {
    if (len == 0) {
        util_set_err(err, errlen, "%s: special token %u is empty", where, id);
        return -1;
    }
    for (uint32_t i = 0; i < t->n_sp; i++) {
        if (t->sp[i].len == len && !memcmp(t->sp[i].bytes, bytes, len)) {
            if (t->sp[i].id == id) return 0;
            util_set_err(err, errlen, "%s: special token '%.*s' has two ids (%u and %u)", where, (int)len,
                         (const char *)bytes, t->sp[i].id, id);
            return -1;
        }
        if (t->sp[i].id == id) {
            util_set_err(err, errlen, "%s: id %u names two special tokens", where, id);
            return -1;
        }
    }
    if (id < t->v.n && t->v.kind[id] != BPE_TOK_HOLE) {
        size_t ol;
        const uint8_t *ob = bpe_vocab_bytes(&t->v, id, &ol);
        if (!in_vocab_ok && (ol != len || memcmp(ob, bytes, len))) {
            util_set_err(err, errlen, "%s: special token '%.*s' reuses id %u of another token", where, (int)len,
                         (const char *)bytes, id);
            return -1;
        }
    } else if (bpe_vocab_set(&t->v, id, bytes, len, BPE_TOK_SPECIAL)) {
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    special *sp = realloc(t->sp, (t->n_sp + 1) * sizeof *sp);
    if (!sp) {
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    t->sp = sp;
    special *s = &t->sp[t->n_sp];
    s->bytes = malloc(len);
    if (!s->bytes) {
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    memcpy(s->bytes, bytes, len);
    s->len = (uint32_t)len;
    s->id = id;
    t->n_sp++;
    return 0;
}

static int sp_cmp(const void *a, const void *b) {
    const special *x = a, *y = b;
    if (x->bytes[0] != y->bytes[0]) return x->bytes[0] < y->bytes[0] ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return memcmp(x->bytes, y->bytes, x->len);
}

static void index_specials(tok_tokenizer *t) {
    if (t->n_sp) qsort(t->sp, t->n_sp, sizeof *t->sp, sp_cmp);
    uint32_t j = 0;
    for (unsigned b = 0; b < 256; b++) {
        t->sp_start[b] = j;
        while (j < t->n_sp && t->sp[j].bytes[0] == b) j++;
    }
    t->sp_start[256] = t->n_sp;
}

static int64_t find_special(const tok_tokenizer *t, const char *s) {
    size_t n = strlen(s);
    for (uint32_t i = 0; i < t->n_sp; i++)
        if (t->sp[i].len == n && !memcmp(t->sp[i].bytes, s, n)) return t->sp[i].id;
    return -1;
}

static int init_bytes(tok_tokenizer *t, const char *what, char *err, size_t errlen) {
    for (unsigned b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        t->byte_id[b] = bpe_vocab_find(&t->v, &c, 1);
        if (t->byte_id[b] == BPE_NONE) {
            util_set_err(err, errlen,
                         "%s: no token for the single byte 0x%02X (a byte-level BPE vocabulary needs all 256)", what,
                         b);
            return -1;
        }
    }
    return 0;
}

/* tiktoken's rule: any two adjacent parts whose concatenation is a token merge,
 * lowest rank first. Enumerate every split of every token into two tokens. */
static int build_rank_pairs(tok_tokenizer *t, char *err, size_t errlen) {
    for (uint32_t id = 0; id < t->v.n; id++) {
        if (t->v.kind[id] != BPE_TOK_NORMAL || t->v.len[id] < 2) continue;
        size_t len;
        const uint8_t *b = bpe_vocab_bytes(&t->v, id, &len);
        for (size_t k = 1; k < len; k++) {
            uint32_t l = bpe_vocab_find(&t->v, b, k);
            if (l == BPE_NONE) continue;
            uint32_t r = bpe_vocab_find(&t->v, b + k, len - k);
            if (r == BPE_NONE) continue;
            if (bpe_pairmap_put(&t->pairs, l, r, id, id)) {
                util_set_err(err, errlen, "out of memory");
                return -1;
            }
        }
    }
    return 0;
}

/* ---- file helpers ----------------------------------------------------------- */
static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static char *read_file(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        util_set_err(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
        } else {
            buf = nb;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        util_set_err(err, errlen, "%s: %s", path, bad ? "read error" : "out of memory");
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* ---- tokenizer_config.json (optional companion) ----------------------------- */
typedef struct tok_config {
    json_t *root;
    const char *bos, *eos; /* token contents, or NULL */
    json_t *added;         /* added_tokens_decoder object, or NULL */
} tok_config;

static const char *config_token(json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) {
        json_t *c = json_object_get(v, "content");
        if (json_is_string(c)) return json_string_value(c);
    }
    return NULL;
}

static int load_config(const char *dir, tok_config *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    char *path = strfmt("%s/tokenizer_config.json", dir);
    if (!path) {
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    if (!is_file(path)) {
        free(path);
        return 0;
    }
    json_error_t je;
    c->root = json_load_file(path, 0, &je);
    if (!c->root) {
        util_set_err(err, errlen, "%s:%d:%d: %s", path, je.line, je.column, je.text);
        free(path);
        return -1;
    }
    free(path);
    c->bos = config_token(json_object_get(c->root, "bos_token"));
    c->eos = config_token(json_object_get(c->root, "eos_token"));
    json_t *a = json_object_get(c->root, "added_tokens_decoder");
    if (json_is_object(a)) c->added = a;
    return 0;
}

static int config_specials(tok_tokenizer *t, const tok_config *c, const char *dir, char *err, size_t errlen) {
    const char *key;
    json_t *val;
    char *where = strfmt("%s/tokenizer_config.json: added_tokens_decoder", dir);
    if (!where) {
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    int rc = -1;
    json_object_foreach(c->added, key, val) {
        char *end;
        errno = 0;
        unsigned long id = strtoul(key, &end, 10);
        const char *content = config_token(val);
        if (*key == 0 || *end || errno || id >= BPE_NONE || !content) {
            util_set_err(err, errlen, "%s: entry \"%s\" needs a numeric id and a \"content\" string", where, key);
            goto out;
        }
        if (add_special(t, (uint32_t)id, (const uint8_t *)content, strlen(content), where, 0, err, errlen)) goto out;
    }
    rc = 0;
out:
    free(where);
    return rc;
}

static int resolve_bos_eos(tok_tokenizer *t, const tok_config *c, const char *dir, char *err, size_t errlen) {
    const char *names[2] = {c->bos, c->eos};
    int64_t *dst[2] = {&t->bos, &t->eos};
    for (int k = 0; k < 2; k++) {
        if (!names[k]) continue;
        int64_t id = find_special(t, names[k]);
        if (id < 0) {
            uint32_t v = bpe_vocab_find(&t->v, (const uint8_t *)names[k], strlen(names[k]));
            if (v != BPE_NONE) id = v;
        }
        if (id < 0) {
            util_set_err(err, errlen, "%s/tokenizer_config.json: %s \"%s\" is not a token of this tokenizer", dir,
                         k ? "eos_token" : "bos_token", names[k]);
            return -1;
        }
        *dst[k] = id;
    }
    if (!c->bos) t->bos = find_special(t, "<|begin_of_text|>");
    if (!c->eos) {
        t->eos = find_special(t, "<|end_of_text|>");
        if (t->eos < 0) t->eos = find_special(t, "<|endoftext|>");
    }
    return 0;
}

/* ---- tiktoken tokenizer.model ----------------------------------------------- */
static int load_tiktoken(tok_tokenizer *t, const char *path, char *err, size_t errlen) {
    size_t len;
    char *buf = read_file(path, &len, err, errlen);
    if (!buf) return -1;
    uint8_t *tmp = malloc(len / 4 * 3 + 4);
    if (!tmp) {
        free(buf);
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    int rc = -1;
    size_t lineno = 0, n_ranks = 0;
    uint32_t max_rank = 0;
    char *p = buf, *end = buf + len;
    /* a tiktoken file numbers its tokens 0, 1, 2, ...: a rank past the line count is not one
     * (and tables are sized by the largest rank, so it would only cost memory) */
    size_t n_lines = 1;
    for (const char *c = buf; c < end; c++) n_lines += *c == '\n';
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *le = nl ? nl : end;
        lineno++;
        char *q = le;
        if (q > p && q[-1] == '\r') q--;
        if (q == p) { /* empty line */
            p = le + 1;
            continue;
        }
        char *sp = memchr(p, ' ', (size_t)(q - p));
        if (!sp) {
            util_set_err(err, errlen, "%s:%zu: expected '<base64 token> <rank>'", path, lineno);
            goto out;
        }
        long bl = bpe_b64_decode(p, (size_t)(sp - p), tmp);
        if (bl <= 0) {
            util_set_err(err, errlen, "%s:%zu: token is not valid base64", path, lineno);
            goto out;
        }
        char *r = sp + 1;
        uint64_t rank = 0;
        if (r == q) {
            util_set_err(err, errlen, "%s:%zu: missing rank", path, lineno);
            goto out;
        }
        for (; r < q; r++) {
            if (*r < '0' || *r > '9' || rank >= (1u << 24)) {
                util_set_err(err, errlen,
                             "%s:%zu: rank is not a number below 16777216 (2^24; vocabularies are far "
                             "smaller)",
                             path, lineno);
                goto out;
            }
            rank = rank * 10 + (uint64_t)(*r - '0');
        }
        if (rank >= (1u << 24)) {
            util_set_err(err, errlen,
                         "%s:%zu: rank is not a number below 16777216 (2^24; vocabularies are far smaller)", path,
                         lineno);
            goto out;
        }
        if (rank >= n_lines) {
            util_set_err(err, errlen,
                         "%s:%zu: rank %llu, but the file has %zu lines: a tiktoken file numbers its tokens "
                         "0, 1, 2, ... one per line",
                         path, lineno, (unsigned long long)rank, n_lines);
            goto out;
        }
        int e = bpe_vocab_set(&t->v, (uint32_t)rank, tmp, (size_t)bl, BPE_TOK_NORMAL);
        if (e == -2 || e == -3) {
            util_set_err(err, errlen, "%s:%zu: %s", path, lineno,
                         e == -2 ? "token appears twice" : "rank appears twice");
            goto out;
        }
        if (e) {
            util_set_err(err, errlen, "out of memory");
            goto out;
        }
        n_ranks++;
        if (rank > max_rank) max_rank = (uint32_t)rank;
        p = le + 1;
    }
    if (!n_ranks) {
        util_set_err(err, errlen, "%s: no tokens", path);
        goto out;
    }
    rc = 0;
out:
    free(tmp);
    free(buf);
    return rc;
}

/* ---- Hugging Face tokenizer.json --------------------------------------------- */
/* Byte-level vocab string -> bytes. Returns length, or -1 when a character is
 * outside the byte-level map. out needs strlen(s) bytes. */
static long bytelevel_decode(const char *s, uint8_t *out) {
    size_t n = strlen(s), i = 0, o = 0;
    if (bpe_utf8_check((const uint8_t *)s, n) != n) return -1;
    while (i < n) {
        size_t adv;
        uint32_t cp = bpe_utf8_next((const uint8_t *)s + i, n - i, &adv);
        int b = bpe_bytelevel_byte(cp);
        if (b < 0) return -1;
        out[o++] = (uint8_t)b;
        i += adv;
    }
    return (long)o;
}

static int hf_pretokenizer(json_t *pt, const char **pattern, const char *path, char *err, size_t errlen) {
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (type && !strcmp(type, "ByteLevel")) {
        json_t *aps = json_object_get(pt, "add_prefix_space");
        json_t *ur = json_object_get(pt, "use_regex");
        if (json_is_true(aps)) {
            util_set_err(err, errlen, "%s: pre_tokenizer.add_prefix_space = true is not supported", path);
            return -1;
        }
        if (ur && !json_is_true(ur)) {
            util_set_err(err, errlen, "%s: a lone ByteLevel pre_tokenizer with use_regex = false is not supported",
                         path);
            return -1;
        }
        *pattern = PRETOK_GPT2_PATTERN;
        return 0;
    }
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(pt, "pretokenizers");
        if (json_is_array(list) && json_array_size(list) == 2) {
            json_t *sp = json_array_get(list, 0), *bl = json_array_get(list, 1);
            const char *t0 = json_string_value(json_object_get(sp, "type"));
            const char *t1 = json_string_value(json_object_get(bl, "type"));
            if (t0 && t1 && !strcmp(t0, "Split") && !strcmp(t1, "ByteLevel")) {
                json_t *pat = json_object_get(sp, "pattern");
                const char *rx = json_string_value(json_object_get(pat, "Regex"));
                const char *beh = json_string_value(json_object_get(sp, "behavior"));
                if (!rx) {
                    util_set_err(err, errlen, "%s: pre_tokenizer.pretokenizers[0].pattern must be {\"Regex\": ...}",
                                 path);
                    return -1;
                }
                if (!beh || strcmp(beh, "Isolated") || json_is_true(json_object_get(sp, "invert"))) {
                    util_set_err(err, errlen,
                                 "%s: pre_tokenizer.pretokenizers[0]: only behavior \"Isolated\" with invert false is "
                                 "supported",
                                 path);
                    return -1;
                }
                if (json_is_true(json_object_get(bl, "add_prefix_space")) ||
                    json_is_true(json_object_get(bl, "use_regex"))) {
                    util_set_err(
                        err, errlen,
                        "%s: pre_tokenizer.pretokenizers[1]: ByteLevel needs add_prefix_space and use_regex false",
                        path);
                    return -1;
                }
                *pattern = rx;
                return 0;
            }
        }
    }
    util_set_err(
        err, errlen,
        "%s: pre_tokenizer: expected Sequence[Split(Regex, Isolated), ByteLevel] (Llama 3) or ByteLevel (GPT-2)", path);
    return -1;
}

/* Refuse the model and normalizer settings that a plain byte-level BPE cannot honour. */
static int hf_check_model(json_t *root, json_t *model, const char *path, char *err, size_t errlen) {
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (mtype && strcmp(mtype, "BPE")) {
        util_set_err(err, errlen, "%s: model.type is \"%s\"; only BPE is supported", path, mtype);
        return -1;
    }
    if (json_is_true(json_object_get(model, "byte_fallback"))) {
        util_set_err(err, errlen, "%s: model.byte_fallback = true is not supported (byte-level BPE needs none)", path);
        return -1;
    }
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0)) {
        util_set_err(err, errlen, "%s: model.dropout is not supported", path);
        return -1;
    }
    const char *sfx[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        const char *s = json_string_value(json_object_get(model, sfx[k]));
        if (s && *s) {
            util_set_err(err, errlen, "%s: model.%s is not supported", path, sfx[k]);
            return -1;
        }
    }
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) {
        json_t *list = json_object_get(norm, "normalizers");
        const char *nt = json_string_value(json_object_get(norm, "type"));
        if (!(nt && !strcmp(nt, "Sequence") && json_is_array(list) && json_array_size(list) == 0)) {
            util_set_err(err, errlen, "%s: normalizer \"%s\" is not supported (byte-level BPE uses none)", path,
                         nt ? nt : "?");
            return -1;
        }
    }
    return 0;
}

/* State shared by the phases of load_hf. */
typedef struct hf_load {
    tok_tokenizer *t;
    const char *path;
    json_t *root, *model;
    size_t maxlen;       /* longest vocab string (at least 64): bounds the decode buffers */
    json_int_t id_limit; /* ids at or above this are refused */
    uint8_t *tmp, *tmp2; /* 2 * maxlen + 8 bytes each */
    char *err;
    size_t errlen;
} hf_load;

/* Size the decode buffers by the longest vocab string and set the id limit. */
static int hf_vocab_limits(hf_load *L, json_t *vocab) {
    L->maxlen = 64;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (strlen(key) > L->maxlen) L->maxlen = strlen(key);
    }
    /* ids number the tokens (a few gaps at most): tables are sized by the largest id, so an
     * id far past the count is refused rather than allocated */
    const json_t *added_all = json_object_get(L->root, "added_tokens");
    L->id_limit = (json_int_t)json_object_size(vocab) +
        (json_is_array(added_all) ? (json_int_t)json_array_size(added_all) : 0) + 1024;
    L->tmp = malloc(2 * L->maxlen + 8);
    L->tmp2 = malloc(2 * L->maxlen + 8);
    if (!L->tmp || !L->tmp2) {
        util_set_err(L->err, L->errlen, "out of memory");
        return -1;
    }
    return 0;
}

/* model.vocab: every entry into t->v, byte-level strings decoded to their bytes. */
static int hf_load_vocab(hf_load *L) {
    const char *path = L->path;
    json_t *vocab = json_object_get(L->model, "vocab");
    if (!json_is_object(vocab)) {
        util_set_err(L->err, L->errlen, "%s: model.vocab must be an object", path);
        return -1;
    }
    if (hf_vocab_limits(L, vocab)) return -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= L->id_limit) {
            util_set_err(L->err, L->errlen,
                         "%s: model.vocab[\"%s\"]: id must be a non-negative integer below %lld (the number of "
                         "tokens, plus 1024)",
                         path, key, (long long)L->id_limit);
            return -1;
        }
        uint32_t id = (uint32_t)json_integer_value(val);
        long bl = bytelevel_decode(key, L->tmp);
        int e;
        if (bl < 0) /* not a byte-level string: keep its text for decoding only */
            e = bpe_vocab_set(&L->t->v, id, (const uint8_t *)key, strlen(key), BPE_TOK_DECODE_ONLY);
        else e = bpe_vocab_set(&L->t->v, id, L->tmp, (size_t)bl, BPE_TOK_NORMAL);
        if (e == -3) {
            util_set_err(L->err, L->errlen, "%s: model.vocab: id %u is used twice (again by \"%s\")", path, id, key);
            return -1;
        }
        if (e) {
            util_set_err(L->err, L->errlen, "%s: model.vocab[\"%s\"]: %s", path, key,
                         e == -2 ? "two entries have the same bytes" : "out of memory");
            return -1;
        }
    }
    return 0;
}

/* The two parts of merge m, "a b" or ["a", "b"]; *a and *b stay NULL when m has neither form. The
 * string form is copied to *owned (freed by the caller). -1 on out-of-memory. */
static int hf_merge_parts(json_t *m, const char **a, const char **b, char **owned) {
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        const char *spc = strchr(s, ' ');
        if (spc && !strchr(spc + 1, ' ')) {
            *owned = strdup(s);
            if (!*owned) return -1;
            (*owned)[spc - s] = 0;
            *a = *owned;
            *b = *owned + (spc - s) + 1;
        }
    } else if (json_is_array(m) && json_array_size(m) == 2) {
        *a = json_string_value(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
    }
    return 0;
}

/* The ids of a merge's left part, right part and merged token (BPE_NONE for those not in the vocab). */
static void hf_merge_ids(hf_load *L, const char *a, const char *b, uint32_t *ia, uint32_t *ib, uint32_t *im) {
    const bpe_vocab *v = &L->t->v;
    size_t la = strlen(a), lb = strlen(b);
    uint8_t *ab = NULL;
    long ba = -1, bb = -1;
    if (la + lb <= 2 * L->maxlen) {
        ba = bytelevel_decode(a, L->tmp);
        bb = bytelevel_decode(b, L->tmp2);
    }
    *ia = *ib = *im = BPE_NONE;
    if (ba >= 0 && bb >= 0) {
        *ia = bpe_vocab_find(v, L->tmp, (size_t)ba);
        *ib = bpe_vocab_find(v, L->tmp2, (size_t)bb);
        ab = malloc((size_t)(ba + bb) + 1);
        if (ab) {
            memcpy(ab, L->tmp, (size_t)ba);
            memcpy(ab + ba, L->tmp2, (size_t)bb);
            *im = bpe_vocab_find(v, ab, (size_t)(ba + bb));
            free(ab);
        }
    }
}

/* model.merges: each into t->pairs, its index the priority. */
static int hf_load_merges(hf_load *L) {
    const char *path = L->path;
    json_t *merges = json_object_get(L->model, "merges");
    if (!json_is_array(merges)) {
        util_set_err(L->err, L->errlen, "%s: model.merges must be an array", path);
        return -1;
    }
    size_t mi;
    json_t *m;
    json_array_foreach(merges, mi, m) {
        const char *a = NULL, *b = NULL;
        char *owned = NULL;
        if (hf_merge_parts(m, &a, &b, &owned)) {
            util_set_err(L->err, L->errlen, "out of memory");
            return -1;
        }
        if (!a || !b) {
            free(owned);
            util_set_err(L->err, L->errlen, "%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", path, mi);
            return -1;
        }
        uint32_t ia, ib, im;
        hf_merge_ids(L, a, b, &ia, &ib, &im);
        if (ia == BPE_NONE || ib == BPE_NONE || im == BPE_NONE) {
            util_set_err(L->err, L->errlen, "%s: model.merges[%zu]: \"%s %s\": %s is not in the vocab", path, mi, a, b,
                         ia == BPE_NONE       ? "the left part"
                             : ib == BPE_NONE ? "the right part"
                                              : "the merged token");
            free(owned);
            return -1;
        }
        free(owned);
        if (bpe_pairmap_put(&L->t->pairs, ia, ib, (uint32_t)mi, im)) { /* a later duplicate wins, as in HF */
            util_set_err(L->err, L->errlen, "out of memory");
            return -1;
        }
    }
    return 0;
}

/* One entry of added_tokens (at index ai) as a special token. */
static int hf_added_token(hf_load *L, size_t ai, json_t *at) {
    tok_tokenizer *t = L->t;
    const char *path = L->path;
    json_t *jid = json_object_get(at, "id");
    const char *content = json_string_value(json_object_get(at, "content"));
    char where[64];
    snprintf(where, sizeof where, "added_tokens[%zu]", ai);
    if (!json_is_integer(jid) || json_integer_value(jid) < 0 || json_integer_value(jid) >= L->id_limit || !content) {
        util_set_err(L->err, L->errlen,
                     "%s: %s: needs an integer \"id\" below %lld (the number of tokens, plus 1024) and a "
                     "\"content\" string",
                     path, where, (long long)L->id_limit);
        return -1;
    }
    uint32_t id = (uint32_t)json_integer_value(jid);
    size_t cl = strlen(content);
    int in_vocab = id < t->v.n && t->v.kind[id] != BPE_TOK_HOLE && t->v.kind[id] != BPE_TOK_SPECIAL;
    if (in_vocab) {
        /* an added token that is also in model.vocab: must be the same token */
        size_t ol;
        const uint8_t *ob = bpe_vocab_bytes(&t->v, id, &ol);
        long bl = cl <= L->maxlen ? bytelevel_decode(content, L->tmp) : -1;
        int same = (ol == cl && !memcmp(ob, content, cl)) || (bl >= 0 && (size_t)bl == ol && !memcmp(ob, L->tmp, ol));
        if (!same) {
            util_set_err(L->err, L->errlen, "%s: %s: \"%s\" reuses id %u of another vocab entry", path, where, content,
                         id);
            return -1;
        }
    }
    char *w2 = strfmt("%s: %s", path, where);
    int bad = !w2 || add_special(t, id, (const uint8_t *)content, cl, w2, in_vocab, L->err, L->errlen);
    if (!w2) util_set_err(L->err, L->errlen, "out of memory");
    free(w2);
    return bad ? -1 : 0;
}

/* added_tokens (absent or null: none). */
static int hf_load_added(hf_load *L) {
    json_t *added = json_object_get(L->root, "added_tokens");
    if (!added || json_is_null(added)) return 0;
    if (!json_is_array(added)) {
        util_set_err(L->err, L->errlen, "%s: added_tokens must be an array", L->path);
        return -1;
    }
    size_t ai;
    json_t *at;
    json_array_foreach(added, ai, at) {
        if (hf_added_token(L, ai, at)) return -1;
    }
    return 0;
}

static int load_hf(tok_tokenizer *t, const char *path, const char **pattern_out, char **pattern_copy, char *err,
                   size_t errlen) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        util_set_err(err, errlen, "%s:%d:%d: %s", path, je.line, je.column, je.text);
        return -1;
    }
    int rc = -1;
    hf_load L = {.t = t, .path = path, .root = root, .err = err, .errlen = errlen};
    L.model = json_object_get(root, "model");
    if (!json_is_object(L.model)) {
        util_set_err(err, errlen, "%s: no \"model\" object", path);
        goto out;
    }
    if (hf_check_model(root, L.model, path, err, errlen)) goto out;
    if (hf_pretokenizer(json_object_get(root, "pre_tokenizer"), pattern_out, path, err, errlen)) goto out;
    *pattern_copy = strdup(*pattern_out);
    if (!*pattern_copy) {
        util_set_err(err, errlen, "out of memory");
        goto out;
    }
    *pattern_out = *pattern_copy;
    t->whole_piece = json_is_true(json_object_get(L.model, "ignore_merges"));
    if (hf_load_vocab(&L) || hf_load_merges(&L) || hf_load_added(&L)) goto out;
    rc = 0;
out:
    free(L.tmp);
    free(L.tmp2);
    json_decref(root);
    return rc;
}

/* ---- tok_load ------------------------------------------------------------------ */
static int ends_with(const char *s, const char *sfx) {
    size_t n = strlen(s), k = strlen(sfx);
    return n >= k && !strcmp(s + n - k, sfx);
}

char *tok_find_file(const char *path) {
    if (!path || !*path) return NULL;
    if (!is_dir(path)) return is_file(path) ? strdup(path) : NULL;
    static const char *const names[] = {"tokenizer.json", "tokenizer.model", "original/tokenizer.model"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *file = strfmt("%s/%s", path, names[i]);
        if (!file || is_file(file)) return file;
        free(file);
    }
    return NULL;
}

tok_tokenizer *tok_load(const char *path, char *err, size_t errlen) {
    char *file = NULL, *dir = NULL;
    int hf;
    if (!path || !*path) {
        util_set_err(err, errlen, "no tokenizer path given");
        return NULL;
    }
    if (is_dir(path)) {
        file = tok_find_file(path);
        if (!file) {
            util_set_err(err, errlen, "%s: no tokenizer.json or tokenizer.model in this folder", path);
            return NULL;
        }
        dir = strdup(path);
        if (!dir) goto oom;
        hf = ends_with(file, "/tokenizer.json");
    } else if (is_file(path)) {
        file = strdup(path);
        const char *slash = strrchr(path, '/');
        dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
        if (!file || !dir) goto oom;
        hf = ends_with(path, ".json");
    } else {
        util_set_err(err, errlen, "%s: no such tokenizer file or folder", path);
        return NULL;
    }
    tok_tokenizer *t = tok_new();
    if (!t) goto oom;
    tok_config cfg;
    char *pattern_copy = NULL;
    const char *pattern = PRETOK_LLAMA3_PATTERN;
    if (load_config(dir, &cfg, err, errlen)) goto fail;
    if (hf) {
        t->format = TOK_FORMAT_HF;
        if (load_hf(t, file, &pattern, &pattern_copy, err, errlen)) goto fail;
        if (init_bytes(t, file, err, errlen)) goto fail;
    } else {
        t->format = TOK_FORMAT_TIKTOKEN;
        t->whole_piece = 1;
        if (load_tiktoken(t, file, err, errlen)) goto fail;
        if (init_bytes(t, file, err, errlen)) goto fail;
        if (build_rank_pairs(t, err, errlen)) goto fail;
        uint32_t n_ranks = t->v.n;
        if (cfg.added) {
            if (config_specials(t, &cfg, dir, err, errlen)) goto fail;
        } else if (n_ranks == TOK_LLAMA3_NUM_RANKS) {
            char buf[64];
            for (unsigned k = 0; k < TOK_LLAMA3_NUM_SPECIAL; k++) {
                const char *nm = tok_llama3_special_name(k, buf, sizeof buf);
                if (add_special(t, n_ranks + k, (const uint8_t *)nm, strlen(nm), file, 0, err, errlen)) goto fail;
            }
        } else if (n_ranks == 100256) {
            for (size_t k = 0; k < sizeof cl100k_specials / sizeof cl100k_specials[0]; k++)
                if (add_special(t, cl100k_specials[k].id, (const uint8_t *)cl100k_specials[k].name,
                                strlen(cl100k_specials[k].name), file, 0, err, errlen))
                    goto fail;
        }
    }
    index_specials(t);
    if (resolve_bos_eos(t, &cfg, dir, err, errlen)) goto fail;
    t->re = pretok_compile(pattern, err, errlen);
    if (!t->re) { /* the pattern comes from the file (HF's pre_tokenizer): name it */
        char why[512];
        snprintf(why, sizeof why, "%s", err);
        util_set_err(err, errlen, "%s: %s%s", file, hf ? "pre_tokenizer.pretokenizers[0].pattern.Regex: " : "", why);
        goto fail;
    }
    free(pattern_copy);
    json_decref(cfg.root);
    free(file);
    free(dir);
    return t;
fail:
    free(pattern_copy);
    json_decref(cfg.root);
    tok_free(t);
    free(file);
    free(dir);
    return NULL;
oom:
    free(file);
    free(dir);
    util_set_err(err, errlen, "out of memory");
    return NULL;
}

/* ---- queries ----------------------------------------------------------------- */
uint32_t tok_vocab_size(const tok_tokenizer *t) { return t->v.n; }
int64_t tok_bos_id(const tok_tokenizer *t) { return t->bos; }
int64_t tok_eos_id(const tok_tokenizer *t) { return t->eos; }
int tok_format(const tok_tokenizer *t) { return t->format; }
const char *tok_pattern(const tok_tokenizer *t) { return pretok_pattern(t->re); }
uint32_t tok_num_special(const tok_tokenizer *t) { return t->n_sp; }

int tok_is_special(const tok_tokenizer *t, uint32_t id) {
    for (uint32_t i = 0; i < t->n_sp; i++)
        if (t->sp[i].id == id) return 1;
    return 0;
}

const uint8_t *tok_token_bytes(const tok_tokenizer *t, uint32_t id, size_t *len) {
    if (id >= t->v.n || t->v.kind[id] == BPE_TOK_HOLE) return NULL;
    return bpe_vocab_bytes(&t->v, id, len);
}

int64_t tok_token_id(const tok_tokenizer *t, const char *bytes, size_t len) {
    for (uint32_t i = 0; i < t->n_sp; i++)
        if (t->sp[i].len == len && !memcmp(t->sp[i].bytes, bytes, len)) return t->sp[i].id;
    uint32_t id = bpe_vocab_find(&t->v, (const uint8_t *)bytes, len);
    return id == BPE_NONE ? -1 : (int64_t)id;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

uint64_t tok_fingerprint(const tok_tokenizer *t) {
    uint64_t h = 0xcbf29ce484222325ULL;
    const uint32_t n = t->v.n;
    h = fnv1a(h, &n, sizeof n);
    /* one mark per id rather than a search of the specials per id (Llama 3 has 256) */
    uint8_t *is_sp = calloc(n ? n : 1, 1);
    for (uint32_t i = 0; is_sp && i < t->n_sp; i++)
        if (t->sp[i].id < n) is_sp[t->sp[i].id] = 1;
    for (uint32_t id = 0; id < n; id++) {
        size_t len = 0;
        const uint8_t *b = tok_token_bytes(t, id, &len);
        const int is_special = is_sp ? is_sp[id] : tok_is_special(t, id);
        /* kind: 0 unassigned, 1 ordinary, 2 special; the length keeps "ab"+"c" apart from "a"+"bc" */
        const uint8_t kind = !b ? 0 : is_special ? 2 : 1;
        const uint64_t len64 = len;
        h = fnv1a(h, &kind, 1);
        h = fnv1a(h, &len64, sizeof len64);
        if (b) h = fnv1a(h, b, len);
    }
    free(is_sp);
    const int64_t be[2] = {t->bos, t->eos};
    return fnv1a(h, be, sizeof be);
}

int tok_check_vocab_size(const tok_tokenizer *t, int64_t model_vocab_size, char *err, size_t errlen) {
    if (model_vocab_size == (int64_t)t->v.n) return 0;
    util_set_err(err, errlen,
                 "the tokenizer has %u ids (special tokens included) but the model's vocab_size is %lld; set "
                 "model.vocab_size to %u or use the tokenizer the model was built for",
                 t->v.n, (long long)model_vocab_size, t->v.n);
    return -1;
}

/* ---- encode ------------------------------------------------------------------ */
typedef struct enc_ctx {
    const tok_tokenizer *t;
    tok_state *s;
    uint32_t *ids;
    size_t n, cap;
    int oom;
} enc_ctx;

static int out_reserve(enc_ctx *e, size_t more) {
    if (e->n + more <= e->cap) return 0;
    size_t cap = e->cap ? e->cap : 256;
    while (cap < e->n + more) cap *= 2;
    uint32_t *p = realloc(e->ids, cap * sizeof *p);
    if (!p) {
        e->oom = 1;
        return -1;
    }
    e->ids = p;
    e->cap = cap;
    return 0;
}

static int piece_cb(const uint8_t *p, size_t n, void *user) {
    enc_ctx *e = user;
    const tok_tokenizer *t = e->t;
    tok_state *s = e->s;
    if (out_reserve(e, n)) return -1;
    uint64_t h = 0;
    int hashed = 0;
    if (t->whole_piece || n == 1) {
        h = bpe_hash_bytes(p, n);
        hashed = 1;
        uint32_t id = bpe_vocab_find_h(&t->v, p, n, h);
        if (id != BPE_NONE) {
            e->ids[e->n++] = id;
            return 0;
        }
    }
    int cacheable = n <= CACHE_MAX_PIECE;
    if (cacheable) {
        if (!hashed) h = bpe_hash_bytes(p, n);
        size_t k;
        const uint32_t *c = cache_get(s, p, n, h, &k);
        if (c) {
            memcpy(e->ids + e->n, c, k * sizeof *c);
            e->n += k;
            return 0;
        }
    }
    if (n > s->sym_cap) {
        size_t cap = s->sym_cap ? s->sym_cap : 256;
        while (cap < n) cap *= 2;
        uint32_t *sym = realloc(s->sym, cap * sizeof *sym);
        if (!sym) {
            e->oom = 1;
            return -1;
        }
        s->sym = sym;
        s->sym_cap = cap;
    }
    for (size_t i = 0; i < n; i++) s->sym[i] = t->byte_id[p[i]];
    size_t k = bpe_merge(&t->pairs, s->sym, n, &s->bs);
    if (k == SIZE_MAX) {
        e->oom = 1;
        return -1;
    }
    memcpy(e->ids + e->n, s->sym, k * sizeof *s->sym);
    e->n += k;
    if (cacheable) cache_put(s, p, n, h, s->sym, k);
    return 0;
}

static int encode_ordinary(enc_ctx *e, const uint8_t *p, size_t n, char *err, size_t errlen) {
    if (!n) return 0;
    int r = pretok_split(e->t->re, e->s->pc, p, n, piece_cb, e, err, errlen);
    if (r && e->oom) util_set_err(err, errlen, "out of memory");
    return r ? -1 : 0;
}

int tok_encode(const tok_tokenizer *t, const char *text, size_t len, int bos, int eos, int allow_special,
               uint32_t **ids, size_t *n_ids, char *err, size_t errlen) {
    *ids = NULL;
    *n_ids = 0;
    const uint8_t *p = (const uint8_t *)text;
    size_t bad = bpe_utf8_check(p, len);
    if (bad < len) {
        util_set_err(err, errlen, "invalid UTF-8 at byte offset %zu", bad);
        return -1;
    }
    if ((bos && t->bos < 0) || (eos && t->eos < 0)) {
        util_set_err(err, errlen, "this tokenizer has no %s token", bos && t->bos < 0 ? "BOS" : "EOS");
        return -1;
    }
    enc_ctx e = {.t = t, .s = get_state(t)};
    if (!e.s) {
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    if (out_reserve(&e, len / 4 + 16)) goto oom;
    if (bos) e.ids[e.n++] = (uint32_t)t->bos;
    if (allow_special && t->n_sp) {
        size_t seg = 0, i = 0;
        while (i < len) {
            uint8_t b = p[i];
            uint32_t lo = t->sp_start[b], hi = t->sp_start[b + 1];
            const special *hit = NULL;
            for (uint32_t k = lo; k < hi; k++) {
                const special *sp = &t->sp[k];
                if (sp->len <= len - i && !memcmp(sp->bytes, p + i, sp->len)) {
                    hit = sp;
                    break;
                }
            }
            if (!hit) {
                i++;
                continue;
            }
            if (encode_ordinary(&e, p + seg, i - seg, err, errlen)) goto fail;
            if (out_reserve(&e, 1)) goto oom;
            e.ids[e.n++] = hit->id;
            i += hit->len;
            seg = i;
        }
        if (encode_ordinary(&e, p + seg, len - seg, err, errlen)) goto fail;
    } else {
        if (encode_ordinary(&e, p, len, err, errlen)) goto fail;
    }
    if (eos) {
        if (out_reserve(&e, 1)) goto oom;
        e.ids[e.n++] = (uint32_t)t->eos;
    }
    *ids = e.ids;
    *n_ids = e.n;
    return 0;
oom:
    util_set_err(err, errlen, "out of memory");
fail:
    free(e.ids);
    return -1;
}

/* ---- decode ------------------------------------------------------------------ */
char *tok_decode(const tok_tokenizer *t, const uint32_t *ids, size_t n_ids, size_t *out_len, char *err, size_t errlen) {
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] >= t->v.n || t->v.kind[ids[i]] == BPE_TOK_HOLE) {
            util_set_err(err, errlen, "id %u at position %zu is not a token of this tokenizer (vocab size %u)", ids[i],
                         i, t->v.n);
            return NULL;
        }
        total += t->v.len[ids[i]];
    }
    uint8_t *raw = malloc(total + 1);
    uint8_t *out = malloc(3 * total + 1);
    if (!raw || !out) {
        free(raw);
        free(out);
        util_set_err(err, errlen, "out of memory");
        return NULL;
    }
    size_t o = 0;
    for (size_t i = 0; i < n_ids; i++) {
        size_t l;
        const uint8_t *b = bpe_vocab_bytes(&t->v, ids[i], &l);
        memcpy(raw + o, b, l);
        o += l;
    }
    size_t n = bpe_utf8_lossy(raw, o, out);
    free(raw);
    out[n] = 0;
    if (out_len) *out_len = n;
    return (char *)out;
}
