/* test_shard_loader.c — token shards, index.json and the packing loader on synthetic tokens.
 *
 * Checks: CRC-32C known answers; shard write/read round trips (uint16, uint32);
 * the packing rule (windows of seq_len+1, input/label shift, shards crossed);
 * DP slicing for 1, 2 and 4 ranks equals the single-rank global batch;
 * shuffling (deterministic by seed, a permutation per epoch); epoch wrap and
 * its message; state save / restore (also under another DP degree) giving the
 * uninterrupted run's batches; single-pass mode; and the errors: truncated
 * shard, wrong magic, checksum mismatch, vocab mismatch, missing index, missing
 * split, state mismatches. Also the text helpers of `tetra data prepare`.
 */
#include "util/crc32c.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/shard.h"

#include <dirent.h>
#include <math.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tests/check.h"

static char g_root[1024];

static char *pathf(const char *fmt, ...) {
    /* short-lived strings only: 16 rotating buffers */
    static char bufs[16][4096];
    static int k;
    char *b = bufs[k++ & 15];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, 4096, fmt, ap);
    va_end(ap);
    return b;
}

static void rm_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            struct stat st;
            if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) rm_tree(p);
            else unlink(p);
        }
        closedir(d);
    }
    rmdir(path);
}

/* Stream token at position p: unique per position for streams < vocab tokens. */
static uint32_t tok_at(uint64_t p, uint32_t vocab) { return (uint32_t)(p % vocab); }

/* Write a corpus: split "train" with the given shard sizes (and "val" if nval > 0). */
static void make_corpus(const char *dir_in, uint32_t vocab, const uint64_t *sizes, int n, uint64_t nval) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", dir_in);
    mkdir(dir, 0755);
    mkdir(pathf("%s/train", dir), 0755);
    char err[512];
    shard_index ix;
    memset(&ix, 0, sizeof ix);
    ix.vocab_size = vocab;
    ix.token_bytes = shard_token_bytes_for_vocab(vocab);
    ix.bos_id = 1;
    ix.eos_id = 2;
    shard_index_split sp[2];
    memset(sp, 0, sizeof sp);
    shard_index_shard sh[17];
    char names[17][64];
    uint64_t pos = 0;
    sp[0].name = "train";
    sp[0].shards = sh;
    for (int i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "train/shard_%05d.bin", i);
        shard_writer *w = shard_writer_open(pathf("%s/%s", dir, names[i]), vocab, 1, 2, err, sizeof err);
        CHECK(w != NULL, "%s", err);
        if (!w) return;
        uint32_t buf[256];
        for (uint64_t k = 0; k < sizes[i];) {
            size_t m = 0;
            while (m < 256 && k < sizes[i]) buf[m++] = tok_at(pos + k++, vocab);
            CHECK(shard_writer_append(w, buf, m, err, sizeof err) == 0, "%s", err);
        }
        shard_header h;
        CHECK(shard_writer_close(w, &h, err, sizeof err) == 0, "%s", err);
        sh[i].file = names[i];
        sh[i].n_tokens = h.n_tokens;
        sh[i].crc32c = h.crc32c;
        sp[0].n_tokens += h.n_tokens;
        sp[0].n_shards++;
        pos += sizes[i];
    }
    sp[0].n_documents = 3;
    ix.n_splits = 1;
    if (nval) {
        mkdir(pathf("%s/val", dir), 0755);
        snprintf(names[16], sizeof names[16], "val/shard_00000.bin");
        shard_writer *w = shard_writer_open(pathf("%s/%s", dir, names[16]), vocab, 1, 2, err, sizeof err);
        CHECK(w != NULL, "%s", err);
        for (uint64_t k = 0; k < nval; k++) {
            uint32_t t = tok_at(1000000 + k, vocab);
            shard_writer_append(w, &t, 1, err, sizeof err);
        }
        shard_header h;
        CHECK(shard_writer_close(w, &h, err, sizeof err) == 0, "%s", err);
        sh[16].file = names[16];
        sh[16].n_tokens = h.n_tokens;
        sh[16].crc32c = h.crc32c;
        sp[1].name = "val";
        sp[1].shards = &sh[16];
        sp[1].n_shards = 1;
        sp[1].n_tokens = h.n_tokens;
        sp[1].n_documents = 1;
        ix.n_splits = 2;
    }
    ix.splits = sp;
    CHECK(shard_index_write(dir, &ix, err, sizeof err) == 0, "%s", err);
}

static void test_crc(void) {
    CHECK(crc32c(0, "123456789", 9) == 0xE3069283u, "crc32c known answer: %08x", crc32c(0, "123456789", 9));
    CHECK(crc32c_sw(0, "123456789", 9) == 0xE3069283u, "software crc32c known answer");
    CHECK(crc32c(0, "", 0) == 0, "crc of nothing");
    unsigned char buf[4099];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 131 + (i >> 3));
    for (size_t off = 0; off < 9; off++)
        for (size_t len = 0; len < 300; len += 7) {
            uint32_t a = crc32c(0, buf + off, len), b = crc32c_sw(0, buf + off, len);
            CHECK(a == b, "hw/sw crc differ at off %zu len %zu", off, len);
        }
    uint32_t whole = crc32c(0, buf, sizeof buf);
    uint32_t part = crc32c(crc32c(0, buf, 1000), buf + 1000, sizeof buf - 1000);
    CHECK(whole == part, "incremental crc");
    /* 32 zero bytes: RFC 3720 test vector */
    unsigned char z[32] = {0};
    CHECK(crc32c(0, z, 32) == 0x8A9136AAu, "crc32c of 32 zeros: %08x", crc32c(0, z, 32));
}

static void test_roundtrip(void) {
    char err[512];
    uint32_t vocabs[2] = {1000, 100000};
    for (int v = 0; v < 2; v++) {
        const char *path = pathf("%s/rt%d.bin", g_root, v);
        shard_writer *w = shard_writer_open(path, vocabs[v], -1, vocabs[v] - 1, err, sizeof err);
        CHECK(w != NULL, "%s", err);
        struct stat st;
        CHECK(stat(path, &st) != 0, "final name must not exist before close");
        uint32_t ids[3000];
        for (int i = 0; i < 3000; i++) ids[i] = (uint32_t)(i * 37) % vocabs[v];
        CHECK(shard_writer_append(w, ids, 3000, err, sizeof err) == 0, "%s", err);
        uint32_t bad = vocabs[v];
        CHECK(shard_writer_append(w, &bad, 1, err, sizeof err) != 0 && strstr(err, "outside the vocabulary"),
              "id >= vocab must be refused: %s", err);
        shard_header h;
        CHECK(shard_writer_close(w, &h, err, sizeof err) == 0, "%s", err);
        CHECK(h.n_tokens == 3000 && h.token_bytes == (v ? 4u : 2u), "header: %llu tokens, width %u",
              (unsigned long long)h.n_tokens, h.token_bytes);
        CHECK(stat(pathf("%s.tmp", path), &st) != 0, "temporary file must be gone");
        CHECK(stat(path, &st) == 0 && (uint64_t)st.st_size == 64 + 3000ull * h.token_bytes, "file size");
        shard_file s;
        CHECK(shard_open(&s, path, 1, err, sizeof err) == 0, "%s", err);
        CHECK(s.h.bos_id == -1 && s.h.eos_id == (int64_t)vocabs[v] - 1, "bos/eos ids");
        int32_t out[3000];
        shard_read_tokens(&s, 0, 3000, out);
        int same = 1;
        for (int i = 0; i < 3000; i++) same &= out[i] == (int32_t)ids[i] && shard_token(&s, (uint64_t)i) == ids[i];
        CHECK(same, "tokens read back differ (width %u)", s.h.token_bytes);
        shard_close(&s);
    }
    /* abort leaves nothing */
    const char *path = pathf("%s/aborted.bin", g_root);
    shard_writer *w = shard_writer_open(path, 10, 1, 2, err, sizeof err);
    uint32_t one = 3;
    shard_writer_append(w, &one, 1, err, sizeof err);
    shard_writer_abort(w);
    struct stat st;
    CHECK(stat(path, &st) != 0 && stat(pathf("%s.tmp", path), &st) != 0, "abort must leave no file");
}

/* The global window index that fills (step, rank r of R, row k). */
static uint64_t first_token_window(int32_t first, int T) { return (uint64_t)first / (uint64_t)(T + 1); }

static void check_window(const int32_t *in, const int32_t *lab, int T, uint64_t w, uint32_t vocab, const char *what) {
    int ok = 1;
    for (int t = 0; t < T; t++) {
        ok &= in[t] == (int32_t)tok_at(w * (T + 1) + (uint64_t)t, vocab);
        ok &= lab[t] == (int32_t)tok_at(w * (T + 1) + (uint64_t)t + 1, vocab);
    }
    CHECK(ok, "%s: row is not window %llu", what, (unsigned long long)w);
}

static int g_epochs;
static uint64_t g_last_epoch;
static void on_epoch(void *user, uint64_t finished, const char *msg) {
    (void)user;
    g_epochs++;
    g_last_epoch = finished;
    CHECK(strstr(msg, "epoch") != NULL, "epoch message: %s", msg);
}

static const uint64_t SIZES[4] = {1000, 37, 2500, 1470}; /* 5007 tokens */

static void test_packing(void) {
    char err[512];
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/c1", g_root);
    make_corpus(dir, 65536, SIZES, 4, 0);
    const int T = 15, B = 8; /* windows of 16 tokens: W = 312, 15 tokens unused */
    dl_config c;
    memset(&c, 0, sizeof c);
    c.seq_len = T;
    c.local_batch_size = B;
    c.dp_size = 1;
    c.expected_vocab_size = 65536;
    c.on_epoch = on_epoch;
    g_epochs = 0;
    dl_loader *dl = dl_open_config(dir, "train", &c, err, sizeof err);
    CHECK(dl != NULL, "%s", err);
    if (!dl) return;
    CHECK(dl_num_tokens(dl) == 5007 && dl_windows_per_epoch(dl) == 312 && dl_steps_per_epoch(dl) == 39,
          "geometry: %llu tokens, %llu windows", (unsigned long long)dl_num_tokens(dl),
          (unsigned long long)dl_windows_per_epoch(dl));
    CHECK(dl_vocab_size(dl) == 65536 && dl_bos_id(dl) == 1 && dl_eos_id(dl) == 2, "facts");
    int32_t in[8 * 15], lab[8 * 15];
    for (int s = 0; s < 45; s++) { /* past one epoch */
        CHECK(dl_next(dl, in, lab) == 1, "dl_next");
        CHECK(dl_epoch(dl) == (s + 1 == 39 ? 1u : (uint64_t)(s + 1) * 8 / 312), "dl_epoch after step %d", s + 1);
        for (int k = 0; k < B; k++)
            check_window(in + k * T, lab + k * T, T, ((uint64_t)s * B + (uint64_t)k) % 312, 65536, "sequential");
        /* epoch 1 ends exactly with step 39; step 40 starts epoch 2 and says so */
        CHECK(g_epochs == (s + 1 >= 40 ? 1 : 0), "epoch messages after step %d: %d", s + 1, g_epochs);
    }
    CHECK(dl_epoch(dl) == 1 && dl_position(dl) == 45 * 8, "epoch %llu position %llu", (unsigned long long)dl_epoch(dl),
          (unsigned long long)dl_position(dl));
    dl_close(dl);
}

static void test_epoch_wrap(void) {
    char err[512];
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/c1", g_root);
    const int T = 16, B = 8; /* windows of 17: W = 294 (= 36.75 steps), 9 tokens unused */
    dl_config c;
    memset(&c, 0, sizeof c);
    c.seq_len = T;
    c.local_batch_size = B;
    c.dp_size = 1;
    c.on_epoch = on_epoch;
    dl_loader *dl = dl_open_config(dir, "train", &c, err, sizeof err);
    CHECK(dl != NULL, "%s", err);
    if (!dl) return;
    CHECK(dl_windows_per_epoch(dl) == 294, "W = %llu", (unsigned long long)dl_windows_per_epoch(dl));
    int32_t in[8 * 16], lab[8 * 16];
    g_epochs = 0;
    for (int s = 0; s < 36; s++) dl_next(dl, in, lab);
    CHECK(g_epochs == 0, "no wrap before the end of the epoch");
    dl_next(dl, in, lab); /* windows 288..293, then 0, 1 of epoch 2 */
    CHECK(g_epochs == 1 && g_last_epoch == 1, "wrap reported once, epoch 1 finished (%d, %llu)", g_epochs,
          (unsigned long long)g_last_epoch);
    uint64_t want[8] = {288, 289, 290, 291, 292, 293, 0, 1};
    for (int k = 0; k < 8; k++) check_window(in + k * T, lab + k * T, T, want[k], 65536, "wrapping step");
    dl_next(dl, in, lab);
    check_window(in, lab, T, 2, 65536, "after the wrap");
    CHECK(g_epochs == 1, "one wrap only");
    dl_close(dl);

    /* single pass: whole global batches only, then 0; rewind starts over */
    c.single_pass = 1;
    c.on_epoch = NULL;
    c.dp_size = 2;
    c.local_batch_size = 5; /* G = 10: 29 steps use 290 of the 294 windows */
    for (int r = 0; r < 2; r++) {
        c.dp_rank = r;
        dl = dl_open_config(dir, "train", &c, err, sizeof err);
        CHECK(dl != NULL, "%s", err);
        if (!dl) return;
        int32_t in5[5 * 16], lab5[5 * 16];
        int steps = 0;
        while (dl_next(dl, in5, lab5)) steps++;
        CHECK(steps == 29 && dl_steps_per_epoch(dl) == 29, "single pass: %d steps", steps);
        CHECK(dl_next(dl, in5, lab5) == 0, "stays exhausted");
        dl_rewind(dl);
        CHECK(dl_next(dl, in5, lab5) == 1, "rewind");
        check_window(in5, lab5, T, (uint64_t)r, 65536, "after rewind");
        dl_close(dl);
    }
}

/* Rank batches of R ranks (B = 8 / R each) equal the single-rank global batch, shuffled or not. */
static void test_dp_slices(void) {
    char err[512];
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/c1", g_root);
    const int T = 15, G = 8, STEPS = 80;
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        dl_loader *ref = dl_open(dir, "train", T, G, 0, 1, shuffle, 1234, 65536, err, sizeof err);
        CHECK(ref != NULL, "%s", err);
        if (!ref) return;
        int32_t *gin = malloc(sizeof(int32_t) * STEPS * G * T), *glab = malloc(sizeof(int32_t) * STEPS * G * T);
        for (int s = 0; s < STEPS; s++) dl_next(ref, gin + (size_t)s * G * T, glab + (size_t)s * G * T);
        dl_close(ref);
        int Rs[2] = {2, 4};
        for (int ri = 0; ri < 2; ri++) {
            int R = Rs[ri], B = G / R;
            dl_loader *dls[4];
            for (int r = 0; r < R; r++) {
                dls[r] = dl_open(dir, "train", T, B, r, R, shuffle, 1234, 65536, err, sizeof err);
                CHECK(dls[r] != NULL, "%s", err);
                if (!dls[r]) return;
            }
            int32_t in[8 * 15], lab[8 * 15];
            int ok = 1;
            for (int s = 0; s < STEPS; s++)
                for (int r = 0; r < R; r++) {
                    dl_next(dls[r], in, lab);
                    for (int k = 0; k < B; k++) {
                        size_t grow = (size_t)s * G + (size_t)k * R + (size_t)r; /* rank r takes r, r+R, ... */
                        ok &= !memcmp(in + k * T, gin + grow * T, sizeof(int32_t) * T);
                        ok &= !memcmp(lab + k * T, glab + grow * T, sizeof(int32_t) * T);
                    }
                }
            CHECK(ok, "R=%d shuffle=%d: rank rows differ from the global batch", R, shuffle);
            for (int r = 0; r < R; r++) dl_close(dls[r]);
        }
        free(gin);
        free(glab);
    }
}

static void test_shuffle(void) {
    char err[512];
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/c1", g_root);
    const int T = 15, B = 8; /* W = 312 = 39 steps */
    dl_loader *a = dl_open(dir, "train", T, B, 0, 1, 1, 7, 0, err, sizeof err);
    dl_loader *b = dl_open(dir, "train", T, B, 0, 1, 1, 7, 0, err, sizeof err);
    dl_loader *c = dl_open(dir, "train", T, B, 0, 1, 1, 8, 0, err, sizeof err);
    CHECK(a && b && c, "%s", err);
    if (!a || !b || !c) return;
    int32_t ia[8 * 15], la[8 * 15], ib[8 * 15], lb[8 * 15], ic[8 * 15], lc[8 * 15];
    unsigned char seen[2][312];
    memset(seen, 0, sizeof seen);
    int same_ab = 1, same_ac = 1, in_order = 1, epochs_same = 1;
    uint64_t order[2][312];
    for (int s = 0; s < 78; s++) {
        dl_next(a, ia, la);
        dl_next(b, ib, lb);
        dl_next(c, ic, lc);
        same_ab &= !memcmp(ia, ib, sizeof ia) && !memcmp(la, lb, sizeof la);
        same_ac &= !memcmp(ia, ic, sizeof ia);
        for (int k = 0; k < B; k++) {
            uint64_t w = first_token_window(ia[k * T], T);
            check_window(ia + k * T, la + k * T, T, w, 65536, "shuffled row is a window");
            int e = s / 39;
            if (w < 312) {
                seen[e][w]++;
                order[e][(s % 39) * B + k] = w;
            }
            in_order &= w == (uint64_t)((s % 39) * B + k);
        }
    }
    int perm_ok = 1;
    for (int e = 0; e < 2; e++)
        for (int w = 0; w < 312; w++) perm_ok &= seen[e][w] == 1;
    for (int i = 0; i < 312; i++) epochs_same &= order[0][i] == order[1][i];
    CHECK(same_ab, "same seed must give the same batches");
    CHECK(!same_ac, "different seeds must give different orders");
    CHECK(!in_order, "shuffled order must not be sequential");
    CHECK(perm_ok, "each epoch must visit every window exactly once");
    CHECK(!epochs_same, "epochs must be shuffled differently");
    dl_close(a);
    dl_close(b);
    dl_close(c);

    uint64_t ns[] = {1, 2, 3, 5, 17, 64, 1000, 4097};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        uint64_t n = ns[i];
        unsigned char *hit = calloc(n, 1);
        int ok = 1;
        for (uint64_t j = 0; j < n; j++) {
            uint64_t v = dl_permute(j, n, 99, 3);
            if (v >= n || hit[v]) ok = 0;
            else hit[v] = 1;
        }
        CHECK(ok, "dl_permute is not a bijection of 0..%llu", (unsigned long long)n - 1);
        free(hit);
    }
}

/* Save mid-run, reopen, restore: the next batches equal the uninterrupted run's. */
static void test_resume(void) {
    char err[512];
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/c1", g_root);
    const int T = 16, R = 2, B = 4, STEPS = 90, CUT = 33; /* W = 294, G = 8: crosses 2 epoch ends */
    int32_t *ref = malloc(sizeof(int32_t) * STEPS * R * B * T * 2);
    dl_loader *d[4];
    int32_t in[8 * 16], lab[8 * 16];
    for (int r = 0; r < R; r++) {
        d[r] = dl_open(dir, "train", T, B, r, R, 1, 42, 65536, err, sizeof err);
        CHECK(d[r] != NULL, "%s", err);
        if (!d[r]) return;
    }
    for (int s = 0; s < STEPS; s++)
        for (int r = 0; r < R; r++) {
            dl_next(d[r], in, lab);
            int32_t *o = ref + ((size_t)s * R + (size_t)r) * B * T * 2;
            memcpy(o, in, sizeof(int32_t) * B * T);
            memcpy(o + B * T, lab, sizeof(int32_t) * B * T);
        }
    for (int r = 0; r < R; r++) dl_close(d[r]);

    /* interrupted run: CUT steps, save, close */
    unsigned char st[2][DL_STATE_BYTES];
    for (int r = 0; r < R; r++) {
        d[r] = dl_open(dir, "train", T, B, r, R, 1, 42, 65536, err, sizeof err);
        for (int s = 0; s < CUT; s++) dl_next(d[r], in, lab);
        CHECK(dl_state_size(d[r]) == DL_STATE_BYTES, "state size");
        CHECK(dl_state_save(d[r], st[r], sizeof st[r]) == 0, "save");
        dl_close(d[r]);
    }
    CHECK(!memcmp(st[0], st[1], DL_STATE_BYTES), "the state is the same on every rank");

    /* resumed run, same layout */
    int ok = 1;
    for (int r = 0; r < R; r++) {
        d[r] = dl_open(dir, "train", T, B, r, R, 1, 42, 65536, err, sizeof err);
        CHECK(dl_state_load(d[r], st[r], DL_STATE_BYTES, err, sizeof err) == 0, "%s", err);
    }
    for (int s = CUT; s < STEPS; s++)
        for (int r = 0; r < R; r++) {
            dl_next(d[r], in, lab);
            int32_t *o = ref + ((size_t)s * R + (size_t)r) * B * T * 2;
            ok &= !memcmp(o, in, sizeof(int32_t) * B * T) && !memcmp(o + B * T, lab, sizeof(int32_t) * B * T);
        }
    CHECK(ok, "resumed batches differ from the uninterrupted run");
    printf("resume (2 ranks, shuffled, saved at step %d of %d, across epoch ends): %s\n", CUT, STEPS,
           ok ? "identical batches" : "DIFFERENT");
    for (int r = 0; r < R; r++) dl_close(d[r]);

    /* resumed under another DP degree (4 ranks x 2 rows): same global batches */
    ok = 1;
    for (int r = 0; r < 4; r++) {
        d[r] = dl_open(dir, "train", T, 2, r, 4, 1, 42, 65536, err, sizeof err);
        CHECK(dl_state_load(d[r], st[0], DL_STATE_BYTES, err, sizeof err) == 0, "%s", err);
    }
    for (int s = CUT; s < STEPS; s++)
        for (int r = 0; r < 4; r++) {
            dl_next(d[r], in, lab);
            for (int k = 0; k < 2; k++) {
                int g = k * 4 + r;          /* global row */
                int rr = g % R, kk = g / R; /* its place in the 2-rank run */
                int32_t *o = ref + ((size_t)s * R + (size_t)rr) * B * T * 2;
                ok &= !memcmp(o + kk * T, in + k * T, sizeof(int32_t) * T);
            }
        }
    CHECK(ok, "resume under a different DP degree must continue the same global batches");
    for (int r = 0; r < 4; r++) dl_close(d[r]);

    /* state mismatches */
    dl_loader *x = dl_open(dir, "train", 15, B, 0, R, 1, 42, 65536, err, sizeof err);
    CHECK(x && dl_state_load(x, st[0], DL_STATE_BYTES, err, sizeof err) != 0 && strstr(err, "seq_len"),
          "seq_len mismatch: %s", err);
    dl_close(x);
    x = dl_open(dir, "train", T, B, 0, R, 1, 43, 65536, err, sizeof err);
    CHECK(x && dl_state_load(x, st[0], DL_STATE_BYTES, err, sizeof err) != 0 && strstr(err, "seed"),
          "seed mismatch: %s", err);
    dl_close(x);
    x = dl_open(dir, "train", T, B, 0, R, 1, 42, 65536, err, sizeof err);
    unsigned char bad[DL_STATE_BYTES];
    memcpy(bad, st[0], sizeof bad);
    bad[17] ^= 1;
    CHECK(x && dl_state_load(x, bad, DL_STATE_BYTES, err, sizeof err) != 0 && strstr(err, "corrupt"),
          "corrupt state: %s", err);
    CHECK(x && dl_state_load(x, bad, 10, err, sizeof err) != 0, "short state");
    dl_close(x);
    free(ref);
}

static void copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    char buf[65536];
    size_t n;
    while (a && b && (n = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, n, b);
    if (a) fclose(a);
    if (b) fclose(b);
}

static void patch_byte(const char *path, long off, int xor_mask) {
    FILE *f = fopen(path, "r+b");
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ xor_mask, f);
    fclose(f);
}

static void test_errors(void) {
    char err[1024], good[4096];
    snprintf(good, sizeof good, "%s/c1", g_root);
    const uint64_t one[1] = {500};
    dl_loader *dl;

    /* missing index / folder */
    dl = dl_open(pathf("%s/nope", g_root), "train", 8, 1, 0, 1, 0, 0, 0, err, sizeof err);
    CHECK(!dl && strstr(err, "nope"), "missing folder: %s", err);
    mkdir(pathf("%s/empty", g_root), 0755);
    dl = dl_open(pathf("%s/empty", g_root), "train", 8, 1, 0, 1, 0, 0, 0, err, sizeof err);
    CHECK(!dl && strstr(err, "index.json"), "missing index: %s", err);

    /* vocab mismatch */
    dl = dl_open(good, "train", 8, 1, 0, 1, 0, 0, 32000, err, sizeof err);
    CHECK(!dl && strstr(err, "65536") && strstr(err, "32000") && strstr(err, "vocab"), "vocab mismatch: %s", err);

    /* no val split; split shorter than one window; bad geometry */
    dl = dl_open(good, "val", 8, 1, 0, 1, 0, 0, 0, err, sizeof err);
    CHECK(!dl && strstr(err, "val") && strstr(err, "--val-fraction"), "missing val split: %s", err);
    dl = dl_open(good, "train", 6000, 1, 0, 1, 0, 0, 0, err, sizeof err);
    CHECK(!dl && strstr(err, "fewer than one sequence"), "too short: %s", err);
    dl = dl_open(good, "train", 8, 1, 2, 2, 0, 0, 0, err, sizeof err);
    CHECK(!dl && strstr(err, "rank"), "bad rank: %s", err);

    /* a val split is read on its own */
    char wv[4096];
    snprintf(wv, sizeof wv, "%s/withval", g_root);
    make_corpus(wv, 65536, one, 1, 300);
    dl = dl_open(wv, "val", 9, 2, 0, 1, 0, 0, 65536, err, sizeof err);
    CHECK(dl && dl_num_tokens(dl) == 300, "val split: %s", dl ? "" : err);
    int32_t in[18], lab[18];
    if (dl) {
        dl_next(dl, in, lab);
        CHECK(in[0] == (int32_t)tok_at(1000000, 65536) && lab[0] == in[1], "val tokens");
    }
    dl_close(dl);

    /* corrupt shards: each case on a fresh copy of a one-shard corpus */
    struct {
        const char *name, *expect;
    } cases[] = {{"truncated", "truncated"}, {"magic", "wrong magic"}, {"payload", "checksum mismatch"},
                 {"header", "header"},       {"tiny", "truncated"},    {"missing", "cannot open"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/bad_%s", g_root, cases[i].name);
        make_corpus(dir, 65536, one, 1, 0);
        const char *shard = pathf("%s/train/shard_00000.bin", dir);
        if (!strcmp(cases[i].name, "truncated")) CHECK(truncate(shard, 64 + 2 * 500 - 3) == 0, "truncate");
        if (!strcmp(cases[i].name, "magic")) patch_byte(shard, 0, 0x20);
        if (!strcmp(cases[i].name, "payload")) patch_byte(shard, 64 + 123, 0x01);
        if (!strcmp(cases[i].name, "header")) patch_byte(shard, 24, 0x01); /* token count */
        if (!strcmp(cases[i].name, "tiny")) CHECK(truncate(shard, 20) == 0, "truncate");
        if (!strcmp(cases[i].name, "missing")) unlink(shard);
        dl = dl_open(dir, "train", 8, 1, 0, 1, 0, 0, 65536, err, sizeof err);
        CHECK(!dl && strstr(err, cases[i].expect) && strstr(err, "shard_00000.bin"), "%s shard: %s", cases[i].name,
              dl ? "(opened)" : err);
        dl_close(dl);
    }
    /* a shard replaced by another valid shard: caught by the index */
    char swp[4096];
    snprintf(swp, sizeof swp, "%s/swapped", g_root);
    make_corpus(swp, 65536, one, 1, 0);
    copy_file(pathf("%s/train/shard_00000.bin", good), pathf("%s/train/shard_00000.bin", swp));
    dl = dl_open(swp, "train", 8, 1, 0, 1, 0, 0, 0, err, sizeof err);
    CHECK(!dl && strstr(err, "index.json"), "swapped shard: %s", err);
    /* corrupt index */
    FILE *f = fopen(pathf("%s/index.json", swp), "w");
    fputs("{\"format\": \"tetra-token-shards\", \"version\": 1,", f);
    fclose(f);
    dl = dl_open(swp, "train", 8, 1, 0, 1, 0, 0, 0, err, sizeof err);
    CHECK(!dl && strstr(err, "index.json") && strstr(err, "invalid JSON"), "bad index: %s", err);
}

static void test_resolve(void) {
    char out[4096], err[1024];
    CHECK(dl_resolve_dataset("sample", "/some/where", out, sizeof out, err, sizeof err) == 0 &&
              !strcmp(out, "/some/where"),
          "dataset_path wins");
    int rc = dl_resolve_dataset("c4", NULL, out, sizeof out, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "tetra data prepare") && strstr(err, "c4"), "unknown dataset: %s", err);
    /* the sample corpus through TETRA_DATA_DIR */
    char data[4096];
    snprintf(data, sizeof data, "%s/datadir", g_root);
    mkdir(data, 0755);
    make_corpus(pathf("%s/sample", data), 65536, SIZES, 1, 0);
    char exe[4096];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[k > 0 ? k : 0] = 0;
    setenv("TETRA_DATA_DIR", data, 1);
    rc = dl_resolve_dataset("sample", "", out, sizeof out, err, sizeof err);
    CHECK(rc == 0, "sample: %s", err);
    /* either the build's own sample (next to this executable) or the env one */
    CHECK(rc != 0 || strstr(out, "/data/sample") || !strcmp(out, pathf("%s/sample", data)), "sample at %s", out);
    unsetenv("TETRA_DATA_DIR");
}

static void test_text_helpers(void) {
    const unsigned char ok[] = "plain \xe2\x80\x94 dash \xf0\x9f\x90\x8b whale";
    CHECK(data_prepare_utf8_check(ok, sizeof ok - 1) == sizeof ok - 1, "valid UTF-8");
    struct {
        const char *s;
        size_t len, bad;
    } bad[] = {{"abc\xff", 4, 3},          {"abcdefghij\xc3", 11, 10}, {"a\xc0\xaf", 3, 1},   {"ab\xed\xa0\x80", 5, 2},
               {"\xf4\x90\x80\x80", 4, 0}, {"xy\xe2\x28\xa1", 5, 2},   {"12345678\x80", 9, 8}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        size_t r = data_prepare_utf8_check((const unsigned char *)bad[i].s, bad[i].len);
        CHECK(r == bad[i].bad, "invalid UTF-8 case %zu: offset %zu, want %zu", i, r, bad[i].bad);
    }
    const char *t = "First paragraph line.\nSecond line.\n\nPara two is here.\n\nPara three, the end.";
    size_t len = strlen(t);
    size_t p = data_prepare_split_point(t, len, 0.3);
    CHECK(p > 0 && p < len && t[p - 1] == '\n' && t[p - 2] == '\n', "split at a paragraph start: %zu", p);
    CHECK(!strncmp(t + p, "Para three", 10), "nearest paragraph to 70%%: '%s'", t + p);
    CHECK(data_prepare_split_point("x", 1, 0.5) == 0, "too short to split");
    size_t q = data_prepare_split_point("no breaks at all here", 21, 0.5);
    CHECK(q > 0 && q < 21, "split without paragraphs: %zu", q);
    const char *w = "aaaa bbbb. Cccc  dddd 1234 .e";
    size_t e = data_prepare_piece_end(w, strlen(w), 0, 6);
    CHECK(e == 10 && w[e] == ' ' && w[e + 1] == 'C', "piece end before ' Cccc': %zu", e);
    e = data_prepare_piece_end(w, strlen(w), 0, 12);
    CHECK(e == strlen(w), "no boundary after a double space / before a digit: %zu", e);
}

/* A shard whose index, header and checksums are all valid but whose ids exceed the
 * vocabulary (another tool's, or hand-made) is caught as batches are read, naming the
 * shard and the token. */
static void test_out_of_vocab(void) {
    const char *dir = pathf("%s/oov", g_root);
    const uint64_t sizes[1] = {4000};
    make_corpus(dir, 1000, sizes, 1, 0);
    const char *path = pathf("%s/train/shard_00000.bin", dir);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL, "open %s", path);
    if (!f) return;
    unsigned char head[SHARD_HEADER_BYTES];
    uint16_t *payload = malloc(4000 * sizeof *payload);
    CHECK(fread(head, 1, sizeof head, f) == sizeof head && fread(payload, 2, 4000, f) == 4000, "read the shard");
    char err[512];
    shard_header h;
    CHECK(shard_header_decode(head, sizeof head, 0, path, &h, err, sizeof err) == 0, "%s", err);
    const uint32_t old_crc = h.crc32c;
    payload[1234] = 5000; /* >= vocab 1000, still a valid uint16 */
    h.crc32c = crc32c(0, payload, 4000 * sizeof *payload);
    shard_header_encode(&h, head);
    fseek(f, 0, SEEK_SET);
    CHECK(fwrite(head, 1, sizeof head, f) == sizeof head && fwrite(payload, 2, 4000, f) == 4000, "rewrite");
    fclose(f);
    free(payload);
    /* the index carries the shard's checksum: write the new one */
    const char *ix = pathf("%s/index.json", dir);
    FILE *fi = fopen(ix, "rb");
    char text[8192] = "", want[32], put[32];
    size_t n = fi ? fread(text, 1, sizeof text - 1, fi) : 0;
    if (fi) fclose(fi);
    text[n] = 0;
    snprintf(want, sizeof want, "%u", old_crc);
    snprintf(put, sizeof put, "%u", h.crc32c);
    char *at = strstr(text, want), out[8300];
    CHECK(at != NULL, "index.json holds the shard's checksum");
    if (!at) return;
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, put, at + strlen(want));
    fi = fopen(ix, "wb");
    CHECK(fi && fwrite(out, 1, strlen(out), fi) == strlen(out), "rewrite index.json");
    if (fi) fclose(fi);

    dl_loader *dl = dl_open(dir, "train", 63, 4, 0, 1, 0, 1, 1000, err, sizeof err);
    CHECK(dl != NULL, "the shard opens: its checksums are valid (%s)", err);
    if (!dl) return;
    int32_t in[4 * 63], lab[4 * 63];
    int rc = 1;
    for (int step = 0; step < 20 && rc == 1; step++) rc = dl_next(dl, in, lab);
    CHECK(rc == -1 && strstr(dl_error(dl), "shard_00000.bin: token 1234 holds id 5000") &&
              strstr(dl_error(dl), "vocabulary of 1000"),
          "the out-of-vocabulary id is named with its shard and offset (rc %d): %s", rc, dl_error(dl));
    dl_close(dl);
}

/* Document ids from BOS/EOS (block_causal attention): the rule on its own, then through
 * dl_next_docs on a corpus whose ids cycle 0..6 (BOS 1, EOS 2: a document starts at every
 * BOS and after every EOS). */
static void test_doc_ids(void) {
    static const int32_t tok[10] = {5, 2, 1, 7, 8, 2, 1, 9, 1, 4};
    static const int32_t both[10] = {0, 0, 1, 1, 1, 1, 2, 2, 3, 3}, eos_only[10] = {0, 0, 1, 1, 1, 1, 2, 2, 2, 2},
                         bos_only[10] = {0, 0, 1, 1, 1, 1, 2, 2, 3, 3}, none[10] = {0};
    int32_t ids[10];
    dl_doc_ids(tok, 10, 1, 2, ids);
    CHECK(!memcmp(ids, both, sizeof ids), "BOS and EOS: a BOS right after an EOS starts one document, not two");
    dl_doc_ids(tok, 10, -1, 2, ids);
    CHECK(!memcmp(ids, eos_only, sizeof ids), "EOS only: a document ends at its EOS");
    dl_doc_ids(tok, 10, 1, -1, ids);
    CHECK(!memcmp(ids, bos_only, sizeof ids), "BOS only: a document starts at its BOS");
    dl_doc_ids(tok, 10, -1, -1, ids);
    CHECK(!memcmp(ids, none, sizeof ids), "no BOS, no EOS: one document");

    char err[512], dir[4096];
    snprintf(dir, sizeof dir, "%s/docs", g_root);
    static const uint64_t sizes[2] = {300, 211};
    make_corpus(dir, 7, sizes, 2, 0);
    dl_config c;
    memset(&c, 0, sizeof c);
    c.seq_len = 15;
    c.local_batch_size = 3;
    c.dp_size = 1;
    c.expected_vocab_size = 7;
    c.shuffle = 1;
    c.seed = 5;
    dl_loader *dl = dl_open_config(dir, "train", &c, err, sizeof err);
    CHECK(dl != NULL && dl_has_documents(dl), "%s", err);
    if (!dl) return;
    int32_t in[45], lab[45], docs[45];
    int ok = 1;
    for (int step = 0; step < 10; step++) {
        ok &= dl_next_docs(dl, in, lab, docs) == 1;
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < 15; i++) { /* from the tokens themselves: starts at 1, after 2 */
                int32_t want = 0;
                for (int j = 1; j <= i; j++) want += in[k * 15 + j] == 1 || in[k * 15 + j - 1] == 2;
                ok &= docs[k * 15 + i] == want;
            }
    }
    CHECK(ok, "dl_next_docs: every row's ids follow its own tokens");
    dl_close(dl);
}

/* Document-length histograms (data/doclen.h): buckets, the expected visible pairs of a
 * packed sequence against the windows the loader cuts, and index.json's round trip. */
static void test_doclen(void) {
    int ok = 1;
    for (uint64_t len = 1; len < 200000; len++) { /* buckets rise with the length and start at their low end */
        const int b = doclen_bucket(len);
        ok &= doclen_bucket_low(b) <= len && doclen_bucket(doclen_bucket_low(b)) == b &&
            b >= doclen_bucket(len - 1 ? len - 1 : 1);
    }
    CHECK(ok && doclen_bucket(1ull << 40) == DOCLEN_BUCKETS - 1, "buckets of four per octave, from their low end");
    doclen_hist h;
    memset(&h, 0, sizeof h);
    for (int i = 0; i < 1000; i++) doclen_add(&h, 1);
    CHECK(doclen_expected_pairs(&h, 64) == 64.0, "one-token documents: each token sees itself");
    memset(&h, 0, sizeof h);
    doclen_add(&h, 1u << 30);
    const double causal = 64.0 * 65.0 / 2.0;
    CHECK(fabs(doclen_expected_pairs(&h, 64) - causal) < 1e-3 * causal, "a document far longer than T: causal");
    /* the stream of documents 8, 35, 12, ... repeated, cut into windows of 65 tokens as the loader does */
    static const int lens[10] = {8, 35, 12, 80, 20, 50, 9, 27, 64, 15};
    const int T = 64, n_docs = 20000;
    memset(&h, 0, sizeof h);
    int32_t *doc = malloc((size_t)n_docs * 80 * sizeof *doc);
    size_t n = 0;
    for (int d = 0; d < n_docs; d++) {
        doclen_add(&h, (uint64_t)lens[d % 10]);
        for (int i = 0; i < lens[d % 10]; i++) doc[n++] = d;
    }
    double pairs = 0.0;
    size_t windows = 0;
    for (size_t w = 0; (w + 1) * (size_t)(T + 1) <= n; w++, windows++) {
        const int32_t *x = doc + w * (size_t)(T + 1);
        for (int i = 0, start = 0; i < T; i++) {
            if (i && x[i] != x[i - 1]) start = i;
            pairs += i - start + 1;
        }
    }
    free(doc);
    const double want = pairs / (double)windows, got = doclen_expected_pairs(&h, T);
    CHECK(fabs(got - want) <= 0.03 * want, "expected pairs %.2f, the loader's windows hold %.2f on average", got, want);
    printf("doclen: expected pairs per 64-token sequence %.2f, measured %.2f (causal %.0f)\n", got, want, causal);

    char err[512], dir[4096];
    snprintf(dir, sizeof dir, "%s/doclen", g_root);
    mkdir(dir, 0755);
    shard_index ix, back;
    memset(&ix, 0, sizeof ix);
    ix.vocab_size = 7;
    ix.token_bytes = 2;
    ix.bos_id = ix.eos_id = -1;
    shard_index_split sp;
    memset(&sp, 0, sizeof sp);
    sp.name = "train";
    sp.doc_lengths = &h;
    ix.n_splits = 1;
    ix.splits = &sp;
    CHECK(shard_index_write(dir, &ix, err, sizeof err) == 0, "%s", err);
    CHECK(shard_index_read(dir, &back, err, sizeof err) == 0, "%s", err);
    const shard_index_split *bs = shard_index_find(&back, "train");
    CHECK(bs && bs->doc_lengths && !memcmp(bs->doc_lengths, &h, sizeof h), "document_lengths read back");
    shard_index_free(&back);
    FILE *f = fopen(pathf("%s/index.json", dir), "w"); /* a bucket that is not one */
    if (f) {
        fputs("{\"format\":\"tetra-token-shards\",\"version\":1,\"vocab_size\":7,\"token_bytes\":2,\"bos_id\":-1,"
              "\"eos_id\":-1,\"splits\":{\"train\":{\"documents\":1,\"tokens\":0,\"shards\":[],"
              "\"document_lengths\":[[9,1,9]]}}}\n",
              f);
        fclose(f);
    }
    CHECK(shard_index_read(dir, &back, err, sizeof err) != 0 && strstr(err, "document_lengths[0]"), "bad bucket: %s",
          err);
    shard_index_free(&back);
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_root, sizeof g_root, "%s/tetra_shard_test_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    test_crc();
    test_roundtrip();
    test_packing();
    test_epoch_wrap();
    test_dp_slices();
    test_shuffle();
    test_resume();
    test_errors();
    test_resolve();
    test_out_of_vocab();
    test_text_helpers();
    test_doc_ids();
    test_doclen();
    rm_tree(g_root);
    printf("test_shard_loader: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
