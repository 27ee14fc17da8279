/* test_megatron.c — Megatron indexed datasets: the reader's checks and the loader on them.
 *
 * A small writer here lays out .bin/.idx as Megatron-LM's format describes (megatron.h).
 * Checked: every dtype with ids (uint8, int8, int16, uint16, int32, int64) reads back the
 * written stream; the loader packs it into the windows of seq_len+1 the token shards give
 * (the same windows for 1 and 2 data-parallel ranks), "train" and "val" both read the
 * whole stream, the state saved on one dataset restores on it and is refused on another.
 * Refused, with the file named: a wrong magic, another version, an unknown or float dtype,
 * a multimodal index, pointers not back to back, a .bin longer or shorter than the
 * sequences, document indices that do not rise from 0 to the sequence count, a truncated
 * index, a dtype too narrow for the model's vocabulary, a missing vocabulary, an id
 * outside the vocabulary or negative (named by token and sequence when read).
 */
#include "data/loader.h"
#include "data/megatron.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tests/check.h"

static char g_dir[256];

/* what to break while writing */
typedef struct {
    int code;          /* dtype code written */
    int width;         /* bytes per id written */
    const char *magic; /* 9 bytes */
    uint64_t version;
    int modes;     /* append sequence modes */
    int shift_ptr; /* sequence 2's pointer moved by this many bytes */
    int bin_extra; /* bytes appended to (>0) or cut from (<0) the .bin */
    int bad_doc;   /* document index 2 set to 0 */
    int cut_idx;   /* bytes cut from the .idx's end */
    int grouped;   /* 4 documents of sequences {0,1} {2,3} {4,5} {6} instead of 7 of one */
} spec;

static void put(FILE *f, uint64_t v, int n) {
    for (int i = 0; i < n; i++) fputc((int)((v >> (8 * i)) & 0xFF), f);
}

/* 7 documents of lengths 10, 0, 33, 5, 61, 2, 19 (130 tokens), ids i*7 % 251 (+1 for
 * signed types: all fit int8 too), one sequence per document. */
static const int g_lens[7] = {10, 0, 33, 5, 61, 2, 19};
#define NTOK 130

static int64_t tok(int i) { return (int64_t)(((unsigned)i * 7u) % 127u); }

static char *write_ds(const char *name, const spec *s, const int64_t *override) {
    static char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/%s", g_dir, name);
    char p[600];
    snprintf(p, sizeof p, "%s.bin", prefix);
    FILE *f = fopen(p, "wb");
    int n = NTOK * s->width + (s->bin_extra < 0 ? s->bin_extra : 0);
    for (int i = 0; i < NTOK && (i + 1) * s->width <= n; i++)
        put(f, (uint64_t)(override ? override[i] : tok(i)), s->width);
    for (int i = 0; i < s->bin_extra; i++) fputc(0, f);
    fclose(f);
    snprintf(p, sizeof p, "%s.idx", prefix);
    f = fopen(p, "wb");
    fwrite(s->magic ? s->magic : "MMIDIDX\0\0", 1, 9, f);
    put(f, s->version ? s->version : 1, 8);
    put(f, (uint64_t)s->code, 1);
    put(f, 7, 8);
    put(f, s->grouped ? 5 : 8, 8);
    for (int i = 0; i < 7; i++) put(f, (uint64_t)g_lens[i], 4);
    uint64_t at = 0;
    for (int i = 0; i < 7; i++) {
        put(f, at + (i == 2 ? (uint64_t)(int64_t)s->shift_ptr : 0), 8);
        at += (uint64_t)g_lens[i] * (uint64_t)s->width;
    }
    static const uint64_t grouped[5] = {0, 2, 4, 6, 7};
    for (int i = 0; i < (s->grouped ? 5 : 8); i++)
        put(f, s->grouped ? grouped[i] : (uint64_t)(s->bad_doc && i == 2 ? 0 : i), 8);
    if (s->modes)
        for (int i = 0; i < 7; i++) fputc(0, f);
    fclose(f);
    if (s->cut_idx) {
        long size = 34 + 7 * 12 + 8 * 8 - s->cut_idx;
        if (truncate(p, size) != 0) perror("truncate");
    }
    return prefix;
}

static spec ok_spec(int code, int width) {
    spec s;
    memset(&s, 0, sizeof s);
    s.code = code;
    s.width = width;
    return s;
}

static void test_dtypes(void) {
    static const struct { int code, width; } t[] = {{1, 1}, {2, 1}, {3, 2}, {8, 2}, {4, 4}, {5, 8}};
    for (size_t k = 0; k < sizeof t / sizeof *t; k++) {
        spec s = ok_spec(t[k].code, t[k].width);
        char name[32];
        snprintf(name, sizeof name, "dt%d", t[k].code);
        char *prefix = write_ds(name, &s, NULL);
        mg_dataset d;
        char err[512] = "";
        int rc = mg_open(&d, prefix, err, sizeof err);
        CHECK(rc == 0, "%s: %s", mg_dtype_name(t[k].code), err);
        if (rc) continue;
        CHECK(d.n_tokens == NTOK && d.n_sequences == 7 && d.n_documents == 7 && d.width == t[k].width, "%s facts",
              mg_dtype_name(t[k].code));
        int32_t out[NTOK];
        CHECK(mg_read(&d, 0, NTOK, 2048, out, err, sizeof err) == 0, "%s", err);
        int same = 1;
        for (int i = 0; i < NTOK; i++) same &= out[i] == tok(i);
        CHECK(same, "%s: the stream reads back", mg_dtype_name(t[k].code));
        mg_close(&d);
    }
}

static void expect_open_fails(const char *name, const spec *s, const char *want) {
    char *prefix = write_ds(name, s, NULL);
    mg_dataset d;
    char err[512] = "";
    CHECK(mg_open(&d, prefix, err, sizeof err) != 0 && strstr(err, want) && strstr(err, name),
          "%s: want '%s', got '%s'", name, want, err);
}

static void test_refusals(void) {
    spec s = ok_spec(8, 2);
    s.magic = "MMIDIDY\0\0";
    expect_open_fails("magic", &s, "not a Megatron index (wrong magic");
    s = ok_spec(8, 2);
    s.version = 2;
    expect_open_fails("version", &s, "version 2");
    s = ok_spec(9, 2);
    expect_open_fails("code9", &s, "unknown dtype code 9");
    s = ok_spec(7, 4);
    expect_open_fails("float", &s, "dtype float32 holds no token ids");
    s = ok_spec(8, 2);
    s.modes = 1;
    expect_open_fails("modes", &s, "unsupported: a multimodal dataset");
    s = ok_spec(8, 2);
    s.shift_ptr = 2;
    expect_open_fails("gap", &s, "sequence 2 starts at byte 22 of");
    s = ok_spec(8, 2);
    s.bin_extra = 4;
    expect_open_fails("binlong", &s, "has 264 bytes but the 7 sequences of");
    s = ok_spec(8, 2);
    s.bin_extra = -6;
    expect_open_fails("binshort", &s, "sequence 6 (19 tokens at byte 222) runs past the end of");
    s = ok_spec(8, 2);
    s.bad_doc = 1;
    expect_open_fails("docs", &s, "document index 2 is 0");
    s = ok_spec(8, 2);
    s.cut_idx = 9;
    expect_open_fails("idxcut", &s, "truncated or corrupt index");
    char err[512] = "";
    mg_dataset d;
    CHECK(mg_open(&d, "/nonexistent/ds", err, sizeof err) != 0 && strstr(err, "/nonexistent/ds.idx"), "%s", err);
    CHECK(!mg_is_dataset("/nonexistent/ds") && !mg_is_dataset(g_dir), "not datasets");
}

static dl_config cfg(int T, int B, int r, int R, uint32_t vocab) {
    dl_config c;
    memset(&c, 0, sizeof c);
    c.seq_len = T;
    c.local_batch_size = B;
    c.dp_rank = r;
    c.dp_size = R;
    c.expected_vocab_size = vocab;
    c.on_epoch = NULL;
    return c;
}

static void quiet_epoch(void *u, uint64_t e, const char *m) { (void)u, (void)e, (void)m; }

static void test_loader(void) {
    spec s = ok_spec(8, 2);
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s", write_ds("ld", &s, NULL));
    char err[640] = "";
    char bin[700];
    snprintf(bin, sizeof bin, "%s.bin", prefix);
    CHECK(dl_is_megatron(prefix) && mg_is_dataset(bin), "detected");
    /* T = 9: windows of 10 tokens, W = 13; step of 2 ranks x 2 rows */
    dl_config c1 = cfg(9, 4, 0, 1, 2048);
    c1.on_epoch = quiet_epoch;
    dl_loader *one = dl_open_config(prefix, "train", &c1, err, sizeof err);
    CHECK(one != NULL, "%s", err);
    if (!one) return;
    CHECK(dl_windows_per_epoch(one) == 13 && dl_num_tokens(one) == NTOK && dl_vocab_size(one) == 2048 &&
              dl_bos_id(one) == -1 && dl_eos_id(one) == -1,
          "facts");
    int32_t in[4 * 9], lab[4 * 9], in2[2][2 * 9], lab2[2][2 * 9];
    dl_loader *two[2];
    for (int r = 0; r < 2; r++) {
        dl_config c2 = cfg(9, 2, r, 2, 2048);
        c2.on_epoch = quiet_epoch;
        two[r] = dl_open_config(prefix, "val", &c2, err, sizeof err);
        CHECK(two[r] != NULL, "%s", err);
    }
    if (!two[0] || !two[1]) return;
    int windows_ok = 1, dp_ok = 1;
    for (int step = 0; step < 5; step++) { /* runs past the epoch's end: 20 windows of 13 */
        CHECK(dl_next(one, in, lab) == 1, "step %d: %s", step, dl_error(one));
        for (int r = 0; r < 2; r++) CHECK(dl_next(two[r], in2[r], lab2[r]) == 1, "dp step %d", step);
        for (int k = 0; k < 4; k++) {
            uint64_t w = ((uint64_t)step * 4 + (uint64_t)k) % 13;
            for (int i = 0; i < 9; i++) {
                windows_ok &= in[k * 9 + i] == tok((int)(w * 10) + i) && lab[k * 9 + i] == tok((int)(w * 10) + i + 1);
                dp_ok &= in2[k % 2][(k / 2) * 9 + i] == in[k * 9 + i];
            }
        }
    }
    CHECK(windows_ok, "windows of seq_len+1 over the stream");
    CHECK(dp_ok, "2 ranks read the 1-rank global batch");
    unsigned char st[DL_STATE_BYTES];
    CHECK(dl_state_save(one, st, sizeof st) == 0, "save");
    dl_loader *again = dl_open_config(prefix, "train", &c1, err, sizeof err);
    CHECK(again && dl_state_load(again, st, sizeof st, err, sizeof err) == 0 && dl_position(again) == 20, "%s", err);
    int32_t a[4 * 9], b[4 * 9];
    CHECK(again && dl_next(again, a, b) == 1 && dl_next(one, in, lab) == 1 && !memcmp(a, in, sizeof a), "resumed");
    dl_close(again);
    /* another dataset (other ids, same shape) refuses the state */
    int64_t other[NTOK];
    for (int i = 0; i < NTOK; i++) other[i] = tok(i) + 1;
    spec s2 = ok_spec(4, 4);
    char *p2 = write_ds("ld2", &s2, other);
    dl_loader *o2 = dl_open_config(p2, "train", &c1, err, sizeof err);
    CHECK(o2 && dl_state_load(o2, st, sizeof st, err, sizeof err) != 0 && strstr(err, "another corpus"), "%s", err);
    dl_close(o2);
    dl_close(one);
    dl_close(two[0]);
    dl_close(two[1]);

    /* the vocabulary: required, wide enough for the dtype, and every id checked */
    dl_config c0 = cfg(9, 1, 0, 1, 0);
    CHECK(!dl_open_config(prefix, "train", &c0, err, sizeof err) && strstr(err, "records no vocabulary"), "%s", err);
    dl_config cv = cfg(9, 1, 0, 1, 70000);
    CHECK(!dl_open_config(prefix, "train", &cv, err, sizeof err) && strstr(err, "uint16, at most 65535") &&
              strstr(err, "70000"),
          "%s", err);
    spec s8 = ok_spec(1, 1);
    char *p8 = write_ds("u8", &s8, NULL);
    dl_config c300 = cfg(9, 1, 0, 1, 300);
    CHECK(!dl_open_config(p8, "train", &c300, err, sizeof err) && strstr(err, "uint8, at most 255"), "%s", err);
    int64_t ids[NTOK];
    for (int i = 0; i < NTOK; i++) ids[i] = tok(i);
    ids[57] = 2048;
    ids[120] = -3;
    spec s4 = ok_spec(4, 4);
    char *p4 = write_ds("badids", &s4, ids);
    dl_config c4 = cfg(9, 1, 0, 1, 2048);
    dl_loader *l4 = dl_open_config(p4, "train", &c4, err, sizeof err);
    CHECK(l4 != NULL, "%s", err);
    int got = 0, step = 0;
    while (l4 && (got = dl_next(l4, in, lab)) == 1) step++;
    CHECK(got == -1 && step == 5 && strstr(dl_error(l4), "badids.bin: token 57 (sequence 4) holds id 2048"),
          "step %d: %s", step, l4 ? dl_error(l4) : "");
    dl_close(l4);
    mg_dataset d;
    int32_t w[10];
    CHECK(mg_open(&d, p4, err, sizeof err) == 0 && mg_read(&d, 115, 10, 2048, w, err, sizeof err) != 0 &&
              strstr(err, "token 120 (sequence 6) holds id -3"),
          "%s", err);
    mg_close(&d);
}

/* Document ids of windows, by the index's documents (not the tokens), against a count of
 * the document starts inside each window; one sequence per document and grouped ones. */
static void test_doc_ids(void) {
    /* sequence starts 0 10 10 43 48 109 111 (lengths 10 0 33 5 61 2 19) */
    static const int starts1[] = {0, 10, 10, 43, 48, 109, 111}, starts4[] = {0, 10, 48, 111};
    for (int g = 0; g < 2; g++) {
        spec s = ok_spec(8, 2);
        s.grouped = g;
        const int *st = g ? starts4 : starts1, nst = g ? 4 : 7;
        char prefix[600];
        snprintf(prefix, sizeof prefix, "%s", write_ds(g ? "docs4" : "docs7", &s, NULL));
        char err[640] = "";
        mg_dataset d;
        CHECK(mg_open(&d, prefix, err, sizeof err) == 0, "%s", err);
        int ok = 1;
        for (int first = 0; first < NTOK; first += 3)
            for (int n = 1; first + n <= NTOK; n += 7) {
                int32_t ids[NTOK];
                mg_doc_ids(&d, (uint64_t)first, (size_t)n, ids);
                for (int i = 0; i < n; i++) { /* starts in (first, first + i], empty documents counted once */
                    int want = 0, last = -1;
                    for (int k = 0; k < nst; k++)
                        if (st[k] > first && st[k] <= first + i && st[k] != last) want++, last = st[k];
                    if (ids[i] != want) ok = 0;
                }
            }
        CHECK(ok, "%s: mg_doc_ids counts the index's document starts in every window", g ? "grouped" : "one per doc");
        doclen_hist h;
        memset(&h, 0, sizeof h);
        mg_doc_lengths(&d, &h); /* lengths 10 0 33 5 61 2 19, or grouped 10 38 63 19: empty ones not counted */
        CHECK(doclen_documents(&h) == (g ? 4u : 6u) && doclen_tokens(&h) == NTOK &&
                  h.count[doclen_bucket(g ? 38 : 33)] == 1 && h.tokens[doclen_bucket(61)] == (g ? 63u : 61u),
              "%s: mg_doc_lengths", g ? "grouped" : "one per doc");
        mg_close(&d);
        /* through the loader: T = 9, the same ids as mg_doc_ids of each window */
        dl_config c = cfg(9, 2, 0, 1, 2048);
        c.on_epoch = quiet_epoch;
        dl_loader *dl = dl_open_config(prefix, "train", &c, err, sizeof err);
        CHECK(dl != NULL && dl_has_documents(dl), "%s", err);
        int32_t in[18], lab[18], docs[18], want[9];
        CHECK(mg_open(&d, prefix, err, sizeof err) == 0, "%s", err);
        int lok = 1;
        for (int step = 0; dl && step < 6; step++) {
            lok &= dl_next_docs(dl, in, lab, docs) == 1;
            for (int k = 0; k < 2; k++) {
                mg_doc_ids(&d, (uint64_t)(2 * step + k) * 10, 9, want);
                lok &= !memcmp(docs + 9 * k, want, sizeof want);
            }
        }
        CHECK(lok, "%s: dl_next_docs gives each window's document ids", g ? "grouped" : "one per doc");
        mg_close(&d);
        dl_close(dl);
    }
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/tetra_test_megatron_%ld", (long)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", g_dir);
    if (system(cmd) != 0) return 1;
    test_dtypes();
    test_refusals();
    test_loader();
    test_doc_ids();
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    printf("test_megatron: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
