/* test_tokenizer.c — the BPE merge loop against naive references on random
 * vocabularies, UTF-8 repair, the pre-tokenizer on whitespace edge cases, the
 * loaders' error messages, and encoding from several threads at once. */
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/bpe.h"
#include "data/pretok.h"
#include "data/tokenizer.h"
#include "tests/check.h"

/* ---- deterministic RNG ---------------------------------------------------------- */
static uint64_t rng_state = 0x1234567887654321ULL;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* ---- naive references ------------------------------------------------------------ */
/* tiktoken's _byte_pair_merge, literally: parts are byte ranges; merge the
 * adjacent pair whose concatenated bytes have the lowest rank (first on ties). */
static size_t naive_rank_merge(const bpe_vocab *v, const uint8_t *w, size_t n, uint32_t *out) {
    size_t *start = malloc((n + 1) * sizeof *start);
    size_t np = n;
    for (size_t i = 0; i <= n; i++) start[i] = i;
    for (;;) {
        uint32_t best = BPE_NONE;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < np; i++) {
            uint32_t r = bpe_vocab_find(v, w + start[i], start[i + 2] - start[i]);
            if (r != BPE_NONE && r < best) {
                best = r;
                bi = i;
            }
        }
        if (best == BPE_NONE) break;
        memmove(start + bi + 1, start + bi + 2, (np - bi - 1) * sizeof *start);
        np--;
    }
    for (size_t i = 0; i < np; i++) out[i] = bpe_vocab_find(v, w + start[i], start[i + 1] - start[i]);
    free(start);
    return np;
}

typedef struct merge_rule {
    uint32_t a, b, c;
} merge_rule;

/* Hugging Face's rule, literally: merge the adjacent pair with the lowest merge
 * index (first on ties), scanning the merges list for every pair. */
static size_t naive_hf_merge(const merge_rule *m, size_t nm, uint32_t *ids, size_t n) {
    for (;;) {
        size_t best = SIZE_MAX, bi = 0;
        for (size_t i = 0; i + 1 < n; i++)
            for (size_t k = 0; k < nm && k < best; k++)
                if (m[k].a == ids[i] && m[k].b == ids[i + 1]) {
                    best = k;
                    bi = i;
                    break;
                }
        if (best == SIZE_MAX) break;
        ids[bi] = m[best].c;
        memmove(ids + bi + 1, ids + bi + 2, (n - bi - 2) * sizeof *ids);
        n--;
    }
    return n;
}

/* ---- random vocabularies ------------------------------------------------------ */
static void random_word(uint8_t *w, size_t n, const uint8_t *alpha, size_t na) {
    for (size_t i = 0; i < n; i++) w[i] = alpha[rnd((uint32_t)na)];
}

static void test_rank_merge(void) {
    static const uint8_t alpha[] = {'a', 'b', 'c', 'a', 'a', 'b', ' '};
    int bad = 0, total = 0;
    for (int trial = 0; trial < 40; trial++) {
        bpe_vocab v;
        bpe_vocab_init(&v);
        for (unsigned b = 0; b < 256; b++) {
            uint8_t c = (uint8_t)b;
            bpe_vocab_set(&v, b, &c, 1, BPE_TOK_NORMAL);
        }
        /* random multi-byte tokens with random ranks above 255 */
        uint32_t n_tok = 50 + rnd(400);
        uint32_t *perm = malloc(n_tok * sizeof *perm);
        for (uint32_t i = 0; i < n_tok; i++) perm[i] = i;
        for (uint32_t i = n_tok - 1; i > 0; i--) {
            uint32_t j = rnd(i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        uint32_t next = 0;
        for (int tries = 0; next < n_tok && tries < 100000; tries++) {
            uint8_t w[8];
            size_t len = 2 + rnd(6);
            random_word(w, len, alpha, sizeof alpha);
            if (bpe_vocab_find(&v, w, len) != BPE_NONE) continue;
            bpe_vocab_set(&v, 256 + perm[next++], w, len, BPE_TOK_NORMAL);
        }
        bpe_pairmap pm;
        bpe_pairmap_init(&pm);
        for (uint32_t id = 256; id < v.n; id++) {
            if (v.kind[id] != BPE_TOK_NORMAL) continue;
            size_t len;
            const uint8_t *b = bpe_vocab_bytes(&v, id, &len);
            for (size_t k = 1; k < len; k++) {
                uint32_t l = bpe_vocab_find(&v, b, k), r = bpe_vocab_find(&v, b + k, len - k);
                if (l != BPE_NONE && r != BPE_NONE) bpe_pairmap_put(&pm, l, r, id, id);
            }
        }
        bpe_scratch s = {0};
        for (int wi = 0; wi < 60; wi++) {
            size_t n = rnd(wi < 50 ? 40 : 400);
            uint8_t *w = malloc(n + 1);
            uint32_t *ref = malloc((n + 1) * sizeof *ref), *h = malloc((n + 1) * sizeof *h),
                     *l = malloc((n + 1) * sizeof *l), *d = malloc((n + 1) * sizeof *d);
            random_word(w, n, alpha, sizeof alpha);
            size_t nr = naive_rank_merge(&v, w, n, ref);
            for (size_t i = 0; i < n; i++) h[i] = l[i] = d[i] = w[i];
            size_t nh = bpe_merge_heap(&pm, h, n, &s);
            size_t nl = bpe_merge_linear(&pm, l, n, &s);
            size_t nd = bpe_merge(&pm, d, n, &s);
            total++;
            if (nh != nr || nl != nr || nd != nr || memcmp(h, ref, nr * 4) || memcmp(l, ref, nr * 4) ||
                memcmp(d, ref, nr * 4))
                bad++;
            free(w);
            free(ref);
            free(h);
            free(l);
            free(d);
        }
        bpe_scratch_free(&s);
        bpe_pairmap_free(&pm);
        bpe_vocab_free(&v);
        free(perm);
    }
    CHECK(bad == 0, "rank merge: %d of %d random words differ from the naive tiktoken loop", bad, total);
}

static void test_hf_merge(void) {
    static const uint8_t alpha[] = {'x', 'y', 'z', 'x'};
    int bad = 0, total = 0;
    for (int trial = 0; trial < 40; trial++) {
        bpe_vocab v;
        bpe_vocab_init(&v);
        for (unsigned b = 0; b < 256; b++) {
            uint8_t c = (uint8_t)b;
            bpe_vocab_set(&v, b, &c, 1, BPE_TOK_NORMAL);
        }
        /* merges between existing tokens; several merges may make the same
         * token (("xy","z") and ("x","yz")), as in Llama 3's tokenizer.json */
        size_t nm = 0, cap = 400;
        merge_rule *m = malloc(cap * sizeof *m);
        bpe_pairmap pm;
        bpe_pairmap_init(&pm);
        uint32_t small[64];
        size_t ns = 0;
        for (size_t i = 0; i < sizeof alpha; i++) small[ns++] = alpha[i];
        for (int tries = 0; nm < 150 + (size_t)rnd(200) && tries < 20000; tries++) {
            uint32_t a = small[rnd((uint32_t)ns)], b = small[rnd((uint32_t)ns)];
            uint32_t dummy1, dummy2;
            if (bpe_pairmap_get(&pm, a, b, &dummy1, &dummy2)) continue;
            size_t la, lb;
            const uint8_t *ba = bpe_vocab_bytes(&v, a, &la);
            uint8_t cat[64];
            if (la >= 32) continue;
            memcpy(cat, ba, la);
            const uint8_t *bb = bpe_vocab_bytes(&v, b, &lb);
            if (la + lb > 12) continue;
            memcpy(cat + la, bb, lb);
            uint32_t c = bpe_vocab_find(&v, cat, la + lb);
            if (c == BPE_NONE) {
                c = v.n;
                bpe_vocab_set(&v, c, cat, la + lb, BPE_TOK_NORMAL);
                if (ns < 64) small[ns++] = c;
                else small[rnd(64)] = c;
            }
            m[nm] = (merge_rule){a, b, c};
            bpe_pairmap_put(&pm, a, b, (uint32_t)nm, c);
            nm++;
        }
        bpe_scratch s = {0};
        for (int wi = 0; wi < 40; wi++) {
            size_t n = rnd(wi < 30 ? 30 : 150);
            uint8_t *w = malloc(n + 1);
            uint32_t *ref = malloc((n + 1) * 4), *h = malloc((n + 1) * 4), *l = malloc((n + 1) * 4);
            random_word(w, n, alpha, sizeof alpha);
            for (size_t i = 0; i < n; i++) ref[i] = h[i] = l[i] = w[i];
            size_t nr = naive_hf_merge(m, nm, ref, n);
            size_t nh = bpe_merge_heap(&pm, h, n, &s);
            size_t nl = bpe_merge_linear(&pm, l, n, &s);
            total++;
            if (nh != nr || nl != nr || memcmp(h, ref, nr * 4) || memcmp(l, ref, nr * 4)) bad++;
            free(w);
            free(ref);
            free(h);
            free(l);
        }
        bpe_scratch_free(&s);
        bpe_pairmap_free(&pm);
        bpe_vocab_free(&v);
        free(m);
    }
    CHECK(bad == 0, "merge-list merge: %d of %d random words differ from the naive Hugging Face loop", bad, total);
}

/* ---- UTF-8 ------------------------------------------------------------------------ */
static void check_lossy(const char *in, size_t n, const char *want) {
    uint8_t out[256];
    size_t k = bpe_utf8_lossy((const uint8_t *)in, n, out);
    out[k] = 0;
    CHECK(k == strlen(want) && !memcmp(out, want, k), "lossy decode of %zu bytes gave %zu bytes '%s'", n, k,
          (char *)out);
}

#define FFFD "\xEF\xBF\xBD"

static void test_utf8(void) {
    check_lossy("abc", 3, "abc");
    check_lossy("\x80", 1, FFFD);
    check_lossy("\xE2\x82", 2, FFFD); /* truncated 3-byte sequence: one U+FFFD */
    check_lossy("a\xF0\x9F\x98"
                "b",
                5, "a" FFFD "b");                            /* truncated 4-byte sequence */
    check_lossy("\xED\xA0\x80", 3, FFFD FFFD FFFD);          /* surrogate */
    check_lossy("\xC0\xAF", 2, FFFD FFFD);                   /* overlong */
    check_lossy("\xE0\x80\x80", 3, FFFD FFFD FFFD);          /* overlong */
    check_lossy("\xF4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD); /* above U+10FFFF */
    check_lossy("\xF5\xFF", 2, FFFD FFFD);
    check_lossy("\xF0\x9F\x98\x80", 4, "\xF0\x9F\x98\x80");
    check_lossy("\xE2\x82\xAC\xE2\x82", 5, "\xE2\x82\xAC" FFFD);
    check_lossy("\xC3", 1, FFFD);
    check_lossy("\xC3\x28", 2, FFFD "(");
    CHECK(bpe_utf8_check((const uint8_t *)"abc\xC3\xA9", 5) == 5, "valid UTF-8 rejected");
    CHECK(bpe_utf8_check((const uint8_t *)"abcdefghij\xFFz", 12) == 10, "invalid byte offset");
    CHECK(bpe_utf8_check((const uint8_t *)"ab\xED\xA0\x80", 5) == 2, "surrogate accepted");
    CHECK(bpe_utf8_check((const uint8_t *)"ab\xE2\x82", 4) == 2, "truncated sequence accepted");
    /* base64 and the byte-level map */
    uint8_t all[256], dec[256];
    char b64[400];
    for (int i = 0; i < 256; i++) all[i] = (uint8_t)i;
    for (size_t n = 0; n < 8; n++) {
        size_t k = bpe_b64_encode(all + 250 - n, n + 1, b64);
        long d = bpe_b64_decode(b64, k, dec);
        CHECK(d == (long)n + 1 && !memcmp(dec, all + 250 - n, n + 1), "base64 round trip of %zu bytes", n + 1);
    }
    CHECK(bpe_b64_decode("IQ=", 3, dec) < 0 && bpe_b64_decode("I*==", 4, dec) < 0, "bad base64 accepted");
    int seen[0x200] = {0}, ok = 1;
    for (int b = 0; b < 256; b++) {
        uint32_t cp = bpe_bytelevel_cp((uint8_t)b);
        if (cp >= 0x200 || seen[cp]++ || bpe_bytelevel_byte(cp) != b) ok = 0;
    }
    for (unsigned i = 0; i < 256; i++) seen[bpe_bytelevel_order(i)] += 0x100;
    for (int b = 0; b < 256; b++)
        if (seen[b] < 0x100) ok = 0;
    CHECK(ok && bpe_bytelevel_cp(' ') == 0x120 && bpe_bytelevel_cp('\n') == 0x10A && bpe_bytelevel_order(0) == '!' &&
              bpe_bytelevel_order(255) == 173,
          "byte-level map is not GPT-2's");
}

/* ---- pre-tokenizer ------------------------------------------------------------------ */
typedef struct pieces {
    char buf[1024];
    size_t o;
} pieces;

static int collect(const uint8_t *p, size_t n, void *user) {
    pieces *c = user;
    memcpy(c->buf + c->o, p, n);
    c->o += n;
    c->buf[c->o++] = '|';
    c->buf[c->o] = 0;
    return 0;
}

static void check_split(pretok *re, pretok_ctx *ctx, const char *text, const char *want) {
    pieces c = {.o = 0};
    char err[256];
    c.buf[0] = 0;
    int r = pretok_split(re, ctx, (const uint8_t *)text, strlen(text), collect, &c, err, sizeof err);
    CHECK(r == 0 && !strcmp(c.buf, want), "split of '%s': got '%s', want '%s'", text, c.buf, want);
}

static void test_pretok(void) {
    char err[256];
    pretok *re = pretok_compile(PRETOK_LLAMA3_PATTERN, err, sizeof err);
    CHECK(re != NULL, "Llama 3 pattern does not compile: %s", err);
    if (!re) return;
    pretok_ctx *ctx = pretok_ctx_new(re);
    check_split(re, ctx, "Hello world!", "Hello| world|!|");
    check_split(re, ctx, "It's 12345 'RE\r\n\r\nx  y", "It|'s| |123|45| '|RE|\r\n\r\n|x| | y|");
    check_split(re, ctx, "a   \n\n b", "a|   \n\n| b|");
    check_split(re, ctx, "!\xC2\x85!", "!|\xC2\x85|!|");       /* U+0085 is white space */
    check_split(re, ctx, "!\xE1\xA0\x8E!", "!\xE1\xA0\x8E!|"); /* U+180E is not */
    check_split(re, ctx, "!\xEF\xBB\xBF!", "!\xEF\xBB\xBF!|"); /* nor U+FEFF */
    check_split(re, ctx,
                "a\xC2\xA0"
                "b",
                "a|\xC2\xA0"
                "b|");                                               /* NBSP joins the next word */
    check_split(re, ctx, "x \xE2\x80\xA8 y", "x| \xE2\x80\xA8| y|"); /* U+2028 */
    char *tr = pretok_translate("\\s+(?!\\S)|[^\\s\\p{L}]", err, sizeof err);
    CHECK(tr && !strstr(tr, "\\s") && !strstr(tr, "\\S"), "\\s not translated: %s", tr ? tr : err);
    free(tr);
    tr = pretok_translate("[^\\S]", err, sizeof err);
    CHECK(tr == NULL && strstr(err, "not supported"), "\\S inside a class should be refused");
    free(tr);
    pretok_ctx_free(ctx);
    pretok_free(re);
    CHECK(pretok_compile("(unclosed", err, sizeof err) == NULL && strstr(err, "compile"), "bad regex accepted");
}

/* ---- files and the public API ---------------------------------------------------------- */
static char tmpdir[256];

static void write_file(const char *name, const char *text, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "wb");
    fwrite(text, 1, n, f);
    fclose(f);
}

/* a tiny tiktoken vocabulary: the 256 bytes in GPT-2 order, then a few merges */
static size_t tiny_model(char *buf, size_t cap, int skip_byte, int dup_rank) {
    size_t o = 0;
    char b64[64];
    for (unsigned i = 0; i < 256; i++) {
        uint8_t b = bpe_bytelevel_order(i);
        if ((int)b == skip_byte) continue;
        bpe_b64_encode(&b, 1, b64);
        o += (size_t)snprintf(buf + o, cap - o, "%s %u\n", b64, i);
    }
    const char *extra[] = {"ab", "abc", " a", "bc", "\xC3\xA9", "\xE2\x82"};
    for (unsigned i = 0; i < 6; i++) {
        bpe_b64_encode((const uint8_t *)extra[i], strlen(extra[i]), b64);
        o += (size_t)snprintf(buf + o, cap - o, "%s %u\n", b64, dup_rank && i == 5 ? 256 : 256 + i);
    }
    return o;
}

static void test_files(void) {
    char err[1024];
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tetra-tok-test-XXXXXX");
    CHECK(mkdtemp(tmpdir) != NULL, "mkdtemp");
    static char buf[1 << 16];

    /* missing */
    CHECK(tok_load("/nonexistent/tokenizer", err, sizeof err) == NULL && strstr(err, "/nonexistent/tokenizer"),
          "missing path: %s", err);
    CHECK(tok_load(tmpdir, err, sizeof err) == NULL && strstr(err, "no tokenizer.json or tokenizer.model"),
          "empty folder: %s", err);

    /* malformed tiktoken files */
    write_file("tokenizer.model", "IQ== 0\nnot-base64! 1\n", 22);
    CHECK(tok_load(tmpdir, err, sizeof err) == NULL && strstr(err, "tokenizer.model:2:"), "bad base64: %s", err);
    write_file("tokenizer.model", "IQ== 0\nIg== x\n", 14);
    CHECK(tok_load(tmpdir, err, sizeof err) == NULL && strstr(err, "tokenizer.model:2:"), "bad rank: %s", err);
    size_t n = tiny_model(buf, sizeof buf, 'q', 0);
    write_file("tokenizer.model", buf, n);
    CHECK(tok_load(tmpdir, err, sizeof err) == NULL && strstr(err, "0x71"), "missing byte: %s", err);
    n = tiny_model(buf, sizeof buf, -1, 1);
    write_file("tokenizer.model", buf, n);
    CHECK(tok_load(tmpdir, err, sizeof err) == NULL && strstr(err, "rank appears twice"), "dup rank: %s", err);

    /* a good one */
    n = tiny_model(buf, sizeof buf, -1, 0);
    write_file("tokenizer.model", buf, n);
    tok_tokenizer *t = tok_load(tmpdir, err, sizeof err);
    CHECK(t != NULL, "tiny tokenizer: %s", err);
    if (t) {
        CHECK(tok_vocab_size(t) == 262 && tok_bos_id(t) == -1 && tok_eos_id(t) == -1 && tok_num_special(t) == 0,
              "tiny tokenizer: vocab %u bos %lld eos %lld", tok_vocab_size(t), (long long)tok_bos_id(t),
              (long long)tok_eos_id(t));
        uint32_t *ids;
        size_t k;
        int r = tok_encode(t, "abc abcd", 8, 0, 0, 0, &ids, &k, err, sizeof err);
        /* "abc" is a token; " abcd": ab (256) then abc (257), " abc" is not a token */
        CHECK(r == 0 && k == 4 && ids[0] == 257 && ids[1] == 220 && ids[2] == 257 && ids[3] == 67,
              "tiny encode: r=%d k=%zu", r, k);
        if (!r) free(ids);
        r = tok_encode(t, "ok\xFF", 3, 0, 0, 0, &ids, &k, err, sizeof err);
        CHECK(r == -1 && strstr(err, "invalid UTF-8 at byte offset 2"), "invalid UTF-8: %s", err);
        r = tok_encode(t, "x", 1, 1, 0, 0, &ids, &k, err, sizeof err);
        CHECK(r == -1 && strstr(err, "no BOS"), "BOS without one: %s", err);
        r = tok_encode(t, "", 0, 0, 0, 0, &ids, &k, err, sizeof err);
        CHECK(r == 0 && k == 0, "empty text encodes to nothing");
        free(ids);
        /* decode: a lone half of a character becomes U+FFFD */
        uint32_t half[3] = {261, 256, 260}; /* "\xE2\x82" "ab" "\xC3\xA9" */
        size_t ol;
        char *s = tok_decode(t, half, 3, &ol, err, sizeof err);
        CHECK(s && ol == 7 && !memcmp(s, FFFD "ab\xC3\xA9", 7), "decode with a broken character");
        free(s);
        uint32_t badid = 262;
        s = tok_decode(t, &badid, 1, &ol, err, sizeof err);
        CHECK(s == NULL && strstr(err, "262"), "decode of an unknown id: %s", err);
        CHECK(tok_check_vocab_size(t, 262, err, sizeof err) == 0, "vocab size check");
        CHECK(tok_check_vocab_size(t, 2048, err, sizeof err) == -1 && strstr(err, "262") && strstr(err, "2048"),
              "vocab size mismatch: %s", err);
        tok_free(t);
    }

    /* specials from tokenizer_config.json */
    const char *cfg = "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\"},"
                      " \"added_tokens_decoder\": {\"262\": {\"content\": \"<s>\"}, \"263\": {\"content\": \"</s>\"}}}";
    write_file("tokenizer_config.json", cfg, strlen(cfg));
    t = tok_load(tmpdir, err, sizeof err);
    CHECK(t && tok_bos_id(t) == 262 && tok_eos_id(t) == 263 && tok_vocab_size(t) == 264, "config specials: %s",
          t ? "wrong ids" : err);
    if (t) {
        uint32_t *ids;
        size_t k;
        int r = tok_encode(t, "ab</s>", 6, 1, 1, 1, &ids, &k, err, sizeof err);
        CHECK(r == 0 && k == 4 && ids[0] == 262 && ids[1] == 256 && ids[2] == 263 && ids[3] == 263, "special matching");
        if (!r) free(ids);
        r = tok_encode(t, "ab</s>", 6, 0, 0, 0, &ids, &k, err, sizeof err);
        CHECK(r == 0 && k > 2, "special text encoded as ordinary text");
        if (!r) free(ids);
        tok_free(t);
    }
    cfg = "{\"bos_token\": \"<nope>\"}";
    write_file("tokenizer_config.json", cfg, strlen(cfg));
    CHECK(tok_load(tmpdir, err, sizeof err) == NULL && strstr(err, "bos_token"), "unknown bos: %s", err);
    write_file("tokenizer_config.json", "{", 1);
    CHECK(tok_load(tmpdir, err, sizeof err) == NULL && strstr(err, "tokenizer_config.json:"), "bad config: %s", err);
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", tmpdir);
    unlink(p);

    /* tokenizer.json errors */
    write_file("tokenizer.json", "{\"model\": \n  [}", 15);
    CHECK(tok_load(tmpdir, err, sizeof err) == NULL && strstr(err, "tokenizer.json:2:"), "bad json: %s", err);
    const char *j1 = "{\"normalizer\": {\"type\": \"NFC\"}, \"pre_tokenizer\": null, \"model\": {\"type\": \"BPE\","
                     " \"vocab\": {}, \"merges\": []}}";
    write_file("tokenizer.json", j1, strlen(j1));
    CHECK(tok_load(tmpdir, err, sizeof err) == NULL && strstr(err, "normalizer"), "normalizer: %s", err);
    const char *j2 = "{\"model\": {\"type\": \"WordPiece\"}}";
    write_file("tokenizer.json", j2, strlen(j2));
    CHECK(tok_load(tmpdir, err, sizeof err) == NULL && strstr(err, "WordPiece"), "model type: %s", err);
    const char *j3 = "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},"
                     " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}}";
    write_file("tokenizer.json", j3, strlen(j3));
    CHECK(tok_load(tmpdir, err, sizeof err) == NULL && strstr(err, "merges[0]"), "bad merge: %s", err);
    /* the shipped tokenizer with a pre-tokenizer regex that does not compile: the file is named */
    json_t *hf = json_load_file("tests/assets/tokenizer/tokenizer.json", 0, NULL);
    CHECK(hf != NULL, "tests/assets/tokenizer/tokenizer.json");
    json_t *split = json_array_get(json_object_get(json_object_get(hf, "pre_tokenizer"), "pretokenizers"), 0);
    json_object_set_new(json_object_get(split, "pattern"), "Regex", json_string("(unclosed"));
    snprintf(p, sizeof p, "%s/tokenizer.model", tmpdir);
    unlink(p);
    snprintf(p, sizeof p, "%s/tokenizer.json", tmpdir);
    CHECK(hf && json_dump_file(hf, p, 0) == 0, "write %s", p);
    json_decref(hf);
    char want[600];
    snprintf(want, sizeof want,
             "%s: pre_tokenizer.pretokenizers[0].pattern.Regex: pre-tokenizer pattern does not "
             "compile",
             p);
    CHECK(tok_load(tmpdir, err, sizeof err) == NULL && strstr(err, want), "bad regex names the file: %s", err);
    unlink(p);
    rmdir(tmpdir);
}

/* ---- the real thing, when the shared data is present ------------------------------ */
typedef struct job {
    const tok_tokenizer *t;
    const char *text;
    size_t len;
    uint32_t *ids;
    size_t n;
    int rc;
} job;

static void *run_job(void *arg) {
    job *j = arg;
    char err[256];
    for (int rep = 0; rep < 3; rep++) {
        free(j->ids);
        j->rc = tok_encode(j->t, j->text, j->len, 0, 0, 0, &j->ids, &j->n, err, sizeof err);
    }
    return NULL;
}

/* cl100k_base's ranks ship compressed (tests/assets/cl100k_base.tiktoken.xz): unpacked
 * with xz into a temporary file, which the tokenizer then loads by name */
static void test_cl100k(void) {
    const char *root = getenv("TETRA_ROOT");
    char path[] = "/tmp/tetra-cl100k-XXXXXX", cmd[2048];
    int fd = mkstemp(path);
    CHECK(fd >= 0, "cl100k: mkstemp");
    if (fd < 0) return;
    close(fd);
    snprintf(cmd, sizeof cmd, "xz -dc '%s/tests/assets/cl100k_base.tiktoken.xz' > '%s'", root ? root : ".", path);
    struct stat st;
    int unpacked = system(cmd) == 0 && stat(path, &st) == 0 && st.st_size == 1681126;
    CHECK(unpacked, "cl100k: `%s` did not give the 1,681,126-byte ranks file", cmd);
    if (!unpacked) {
        unlink(path);
        return;
    }
    char err[1024];
    tok_tokenizer *t = tok_load(path, err, sizeof err);
    unlink(path);
    CHECK(t != NULL, "cl100k: %s", err);
    if (!t) return;
    CHECK(tok_vocab_size(t) == 100277 && tok_eos_id(t) == 100257 && tok_bos_id(t) == -1, "cl100k specials");
    const char *s = "This is a test sentence.";
    uint32_t *ids;
    size_t n;
    static const uint32_t want[] = {2028, 374, 264, 1296, 11914, 13, 100257};
    int r = tok_encode(t, s, strlen(s), 0, 1, 0, &ids, &n, err, sizeof err);
    CHECK(r == 0 && n == 7 && !memcmp(ids, want, sizeof want), "cl100k: test sentence");
    if (!r) free(ids);
    /* several threads on one tokenizer give the same ids as one */
    static char text[200000];
    size_t len = 0;
    const char *words[] = {"the ", "whale ", "Ishmael ", "call ", "me. ", "\n\n", "1234 ", "naïve ", "日本 ", "😀 "};
    while (len < sizeof text - 32) {
        const char *w = words[rnd(10)];
        memcpy(text + len, w, strlen(w));
        len += strlen(w);
    }
    job jobs[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = (job){.t = t, .text = text, .len = len};
        pthread_create(&th[i], NULL, run_job, &jobs[i]);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    int same = 1;
    for (int i = 0; i < 3; i++)
        same &= jobs[i].rc == 0 && jobs[i].n == jobs[0].n && !memcmp(jobs[i].ids, jobs[0].ids, jobs[0].n * 4);
    CHECK(same && jobs[0].n > 1000, "threads disagree");
    size_t dl;
    char *back = tok_decode(t, jobs[0].ids, jobs[0].n, &dl, err, sizeof err);
    CHECK(back && dl == len && !memcmp(back, text, len), "decode(encode(x)) != x");
    free(back);
    for (int i = 0; i < 3; i++) free(jobs[i].ids);
    tok_free(t);
}

int main(void) {
    test_rank_merge();
    test_hf_merge();
    test_utf8();
    test_pretok();
    test_files();
    test_cl100k();
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
