/* test_mixture.c — weighted mixtures of corpora (mixture.h, dl_open_mix).
 *
 * Three sources, each a one-shard corpus whose ids say which source and which window a
 * sample is (source s holds ids s*20000 + position): A (weight 0.5, 300 windows), B (0.3,
 * 200), and C, a Megatron dataset (0.2, 150). Checked:
 *   - over 10,000 samples each source's share is within 1 percentage point of its weight
 *     (and dl_source_counts agrees with what was read), quotas add up to the block;
 *   - every source is read window after window, epoch after epoch, and says when it wraps;
 *   - the order is a function of the seed: the same seed gives the same stream, another
 *     seed another stream with the same shares;
 *   - a state saved at position 4,370 resumes at data-parallel sizes 1, 2 and 5 (every
 *     rank's rows put back in global order) into exactly the uninterrupted stream;
 *   - refused: an entry without a weight, a weight that is not a positive number, a source
 *     listed twice, a weight too small for one sample per block, sources of different
 *     vocabularies, a state saved with another seed or for other weights;
 *   - single pass (validation): the sources' val splits one after another in whole global
 *     batches, each batch's source told by dl_last_source.
 */
#include "data/loader.h"
#include "data/mixture.h"
#include "data/shard.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tests/check.h"

#define T 15 /* windows of 16 tokens */
#define VOCAB 65536u
#define N 10000 /* samples checked */
static char g_dir[256];

/* one split: n tokens base + p, in one shard */
static void write_split(const char *dir, const char *split, uint32_t vocab, uint32_t base, uint64_t n,
                        shard_index_shard *sh, shard_index_split *sp, char *name) {
    char err[512], path[600];
    snprintf(path, sizeof path, "%s/%s", dir, split);
    mkdir(path, 0755);
    snprintf(name, 64, "%s/shard_00000.bin", split);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    shard_writer *w = shard_writer_open(path, vocab, 1, 2, err, sizeof err);
    CHECK(w != NULL, "%s", err);
    for (uint64_t p = 0; p < n; p++) {
        uint32_t t = base + (uint32_t)p;
        shard_writer_append(w, &t, 1, err, sizeof err);
    }
    shard_header h;
    CHECK(shard_writer_close(w, &h, err, sizeof err) == 0, "%s", err);
    sh->file = name;
    sh->n_tokens = h.n_tokens;
    sh->crc32c = h.crc32c;
    sp->name = (char *)split;
    sp->shards = sh;
    sp->n_shards = 1;
    sp->n_tokens = h.n_tokens;
    sp->n_documents = 1;
}

static void make_corpus(const char *dir, uint32_t vocab, uint32_t base, uint64_t ntrain, uint64_t nval) {
    mkdir(dir, 0755);
    shard_index ix;
    memset(&ix, 0, sizeof ix);
    ix.vocab_size = vocab;
    ix.token_bytes = shard_token_bytes_for_vocab(vocab);
    ix.bos_id = 1;
    ix.eos_id = 2;
    shard_index_split sp[2];
    shard_index_shard sh[2];
    char names[2][64];
    memset(sp, 0, sizeof sp);
    write_split(dir, "train", vocab, base, ntrain, &sh[0], &sp[0], names[0]);
    ix.n_splits = 1;
    if (nval) {
        write_split(dir, "val", vocab, base + 10000, nval, &sh[1], &sp[1], names[1]);
        ix.n_splits = 2;
    }
    ix.splits = sp;
    char err[512];
    CHECK(shard_index_write(dir, &ix, err, sizeof err) == 0, "%s", err);
}

static void put(FILE *f, uint64_t v, int n) {
    for (int i = 0; i < n; i++) fputc((int)((v >> (8 * i)) & 0xFF), f);
}

/* a Megatron dataset of n uint16 ids base + p, as one sequence and one document */
static void make_megatron(const char *prefix, uint32_t base, uint64_t n) {
    char p[600];
    snprintf(p, sizeof p, "%s.bin", prefix);
    FILE *f = fopen(p, "wb");
    for (uint64_t i = 0; i < n; i++) put(f, base + i, 2);
    fclose(f);
    snprintf(p, sizeof p, "%s.idx", prefix);
    f = fopen(p, "wb");
    fwrite("MMIDIDX\0\0", 1, 9, f);
    put(f, 1, 8);
    put(f, 8, 1);
    put(f, 1, 8);
    put(f, 2, 8);
    put(f, n, 4);
    put(f, 0, 8);
    put(f, 0, 8);
    put(f, 1, 8);
    fclose(f);
}

static char g_a[300], g_b[300], g_c[300];
static char g_ea[320], g_eb[320], g_ec[320];

static dl_config cfg(int B, int r, int R, uint64_t seed) {
    dl_config c;
    memset(&c, 0, sizeof c);
    c.seq_len = T;
    c.local_batch_size = B;
    c.dp_rank = r;
    c.dp_size = R;
    c.seed = seed;
    c.expected_vocab_size = VOCAB;
    return c;
}

typedef struct {
    int src;
    int window;
} sample;

static int g_wraps[3];
static void on_epoch(void *user, uint64_t e, const char *msg) {
    (void)e;
    (void)user;
    for (int i = 0; i < 3; i++) {
        const char *name = i == 0 ? g_a : i == 1 ? g_b : g_c;
        char want[400];
        snprintf(want, sizeof want, "source %s finished epoch", name);
        if (strstr(msg, want)) g_wraps[i]++;
    }
}

/* Which source and window a row is, from its first input id; -1 when not a window. */
static sample decode(const int32_t *in, const int32_t *lab) {
    sample s = {in[0] / 20000, -1};
    const int off = in[0] % 20000;
    if (off % (T + 1) == 0) s.window = off / (T + 1);
    for (int i = 1; i < T; i++)
        if (in[i] != in[0] + i || lab[i - 1] != in[i]) s.window = -1;
    return s;
}

/* Read samples [from, N) at data-parallel size R (B rows per rank), putting every rank's rows
 * back in global order, after loading `state` (NULL = from the start). */
static int run(sample *out, int from, int B, int R, uint64_t seed, const void *state, void *save_at_4370) {
    const char *e3[3] = {g_ea, g_eb, g_ec};
    char err[1024];
    dl_loader *dl[8];
    for (int r = 0; r < R; r++) {
        dl_config c = cfg(B, r, R, seed);
        c.on_epoch = on_epoch;
        dl[r] = dl_open_mix(e3, 3, "train", &c, err, sizeof err);
        CHECK(dl[r] != NULL, "%s", err);
        if (!dl[r]) return -1;
        if (state) CHECK(dl_state_load(dl[r], state, DL_STATE_BYTES, err, sizeof err) == 0, "%s", err);
    }
    int32_t in[16 * T], lab[16 * T];
    for (int g = from; g < N; g += B * R) {
        if (save_at_4370 && g == 4370) dl_state_save(dl[0], save_at_4370, DL_STATE_BYTES);
        for (int r = 0; r < R; r++) {
            CHECK(dl_next(dl[r], in, lab) == 1, "%s", dl_error(dl[r]));
            for (int k = 0; k < B; k++)
                if (g + k * R + r < N) out[g + k * R + r] = decode(in + k * T, lab + k * T);
        }
    }
    for (int r = 0; r < R; r++) dl_close(dl[r]);
    return 0;
}

static void test_stream(void) {
    static sample ref[N], again[N], other[N], resumed[N];
    unsigned char st[DL_STATE_BYTES];
    memset(g_wraps, 0, sizeof g_wraps);
    if (run(ref, 0, 10, 1, 7, NULL, st) != 0) return;
    int count[3] = {0, 0, 0}, next_window[3] = {0, 0, 0}, order_ok = 1;
    const int W[3] = {300, 200, 150};
    for (int g = 0; g < N; g++) {
        const sample s = ref[g];
        if (s.src < 0 || s.src > 2 || s.window < 0) {
            order_ok = 0;
            break;
        }
        order_ok &= s.window == next_window[s.src];
        next_window[s.src] = (next_window[s.src] + 1) % W[s.src];
        count[s.src]++;
    }
    CHECK(order_ok, "each source read window after window, epoch after epoch");
    const double w[3] = {0.5, 0.3, 0.2};
    for (int i = 0; i < 3; i++) {
        const double share = (double)count[i] / N;
        printf("source %c: weight %.2f, share over %d samples %.4f (%d samples, %.1f epochs)\n", 'A' + i, w[i], N,
               share, count[i], (double)count[i] / W[i]);
        CHECK(fabs(share - w[i]) < 0.01, "source %d: share %.4f, weight %.2f", i, share, w[i]);
        CHECK(g_wraps[i] == (count[i] - 1) / W[i], "source %d wrapped %d times, expected %d", i, g_wraps[i],
              (count[i] - 1) / W[i]);
    }
    /* the counts the loader reports are the ones read */
    const char *e3[3] = {g_ea, g_eb, g_ec};
    char err[1024];
    dl_config c = cfg(10, 0, 1, 7);
    dl_loader *dl = dl_open_mix(e3, 3, "train", &c, err, sizeof err);
    uint64_t cnt[3];
    dl_source_counts(dl, N, cnt);
    CHECK(cnt[0] == (uint64_t)count[0] && cnt[1] == (uint64_t)count[1] && cnt[2] == (uint64_t)count[2],
          "dl_source_counts %llu %llu %llu", (unsigned long long)cnt[0], (unsigned long long)cnt[1],
          (unsigned long long)cnt[2]);
    CHECK(dl_num_sources(dl) == 3 && fabs(dl_source_weight(dl, 1) - 0.3) < 1e-12 && dl_source_windows(dl, 2) == 150 &&
              dl_num_tokens(dl) == 4807 + 3200 + 2403,
          "facts");
    char line[2048];
    CHECK(dl_mix_summary(dl, N, line, sizeof line) == 0 &&
              strstr(line, "a: weight 0.5000, realised 0.4993 (4993 of 10000"),
          "%s", line);
    printf("summary: %s\n", line);
    dl_close(dl);

    run(again, 0, 10, 1, 7, NULL, NULL);
    CHECK(!memcmp(ref, again, sizeof ref), "the same seed, the same stream");
    run(other, 0, 10, 1, 8, NULL, NULL);
    int diff = 0, oc[3] = {0, 0, 0};
    for (int g = 0; g < N; g++) {
        diff += other[g].src != ref[g].src;
        if (other[g].src >= 0 && other[g].src < 3) oc[other[g].src]++;
    }
    CHECK(diff > N / 4 && fabs((double)oc[0] / N - 0.5) < 0.01 && fabs((double)oc[1] / N - 0.3) < 0.01 &&
              fabs((double)oc[2] / N - 0.2) < 0.01,
          "another seed: %d of %d samples from another source; counts %d %d %d", diff, N, oc[0], oc[1], oc[2]);

    /* resume at 4,370 under 1, 2 and 5 data-parallel ranks: the uninterrupted stream */
    static const int geo[3][2] = {{10, 1}, {5, 2}, {2, 5}};
    for (int k = 0; k < 3; k++) {
        memset(resumed, 0xff, sizeof resumed);
        memcpy(resumed, ref, 4370 * sizeof *ref);
        run(resumed, 4370, geo[k][0], geo[k][1], 7, st, NULL);
        CHECK(!memcmp(resumed, ref, sizeof ref), "resumed at sample 4370 under %d ranks x %d rows", geo[k][1],
              geo[k][0]);
    }
    /* refused: a state saved with another seed, or for other weights */
    dl_config c8 = cfg(10, 0, 1, 8);
    dl = dl_open_mix(e3, 3, "train", &c8, err, sizeof err);
    CHECK(dl && dl_state_load(dl, st, sizeof st, err, sizeof err) != 0 && strstr(err, "seed 7"), "%s", err);
    dl_close(dl);
    char e2[320];
    snprintf(e2, sizeof e2, "%s:0.6", g_a);
    const char *other_w[3] = {e2, g_eb, g_ec};
    dl = dl_open_mix(other_w, 3, "train", &c, err, sizeof err);
    CHECK(dl && dl_state_load(dl, st, sizeof st, err, sizeof err) != 0 && strstr(err, "another corpus"), "%s", err);
    dl_close(dl);
}

static void expect_refused(const char *const *e, int n, const char *want) {
    char err[1024] = "";
    dl_config c = cfg(2, 0, 1, 1);
    dl_loader *dl = dl_open_mix(e, n, "train", &c, err, sizeof err);
    CHECK(!dl && strstr(err, want), "want '%s', got '%s'", want, err);
    dl_close(dl);
}

static void test_refusals(void) {
    char tiny[320], dup[320], small[320], v2[320], neg[320], nan_[320];
    snprintf(tiny, sizeof tiny, "%s", g_a);
    const char *e1[2] = {tiny, g_eb};
    expect_refused(e1, 2, "expected \"PATH:WEIGHT\"");
    snprintf(neg, sizeof neg, "%s:-1", g_a);
    const char *e2[2] = {neg, g_eb};
    expect_refused(e2, 2, "is not a positive number");
    snprintf(nan_, sizeof nan_, "%s:half", g_a);
    const char *e3[2] = {nan_, g_eb};
    expect_refused(e3, 2, "the weight \"half\" is not a positive number");
    snprintf(dup, sizeof dup, "%s:2", g_a);
    const char *e4[2] = {g_ea, dup};
    expect_refused(e4, 2, "is listed twice");
    snprintf(small, sizeof small, "%s:0.00001", g_b);
    const char *e5[2] = {g_ea, small};
    expect_refused(e5, 2, "less than one sample in 4096");
    char d2[300];
    snprintf(d2, sizeof d2, "%s/v2", g_dir);
    make_corpus(d2, 50000, 30000, 800, 0);
    snprintf(v2, sizeof v2, "%s:1", d2);
    const char *e6[2] = {g_ea, v2};
    char err[1024] = "";
    dl_config c = cfg(2, 0, 1, 1);
    c.expected_vocab_size = 0;
    dl_loader *dl = dl_open_mix(e6, 2, "train", &c, err, sizeof err);
    CHECK(!dl && strstr(err, "were tokenized differently"), "%s", err);
    dl_close(dl);
    char missing[320];
    snprintf(missing, sizeof missing, "%s/nothing:1", g_dir);
    const char *e7[2] = {g_ea, missing};
    expect_refused(e7, 2, "mixture source 2 (");
    double wq[3] = {1, 1, 1};
    mix_plan m;
    CHECK(mix_plan_init(&m, wq, 3, 0, err, sizeof err) == 0 && m.quota[0] + m.quota[1] + m.quota[2] == MIX_BLOCK &&
              m.quota[0] == 1366 && m.quota[2] == 1365,
          "thirds: %u %u %u", m.quota[0], m.quota[1], m.quota[2]);
    mix_plan_free(&m);
}

static void test_single_pass(void) {
    const char *e2[2] = {g_ea, g_eb};
    char err[1024];
    dl_config c = cfg(2, 0, 2, 1);
    c.single_pass = 1;
    dl_loader *r0 = dl_open_mix(e2, 2, "val", &c, err, sizeof err);
    CHECK(r0 != NULL, "%s", err);
    if (!r0) return;
    int32_t in[2 * T], lab[2 * T];
    int per[2] = {0, 0}, ok = 1, got;
    for (int round = 0; round < 2; round++) {
        per[0] = per[1] = 0;
        while ((got = dl_next(r0, in, lab)) == 1) {
            const int s = dl_last_source(r0);
            per[s]++;
            ok &= in[0] / 20000 == s && (in[0] % 20000) >= 10000;
        }
        dl_rewind(r0);
    }
    /* A's val: 160 tokens = 10 windows = 2 batches of 4; B's: 96 tokens = 6 windows = 1 batch */
    CHECK(got == 0 && per[0] == 2 && per[1] == 1 && ok, "batches per source %d %d (ok %d)", per[0], per[1], ok);
    dl_close(r0);
    dl_config big = cfg(4, 0, 2, 1);
    big.single_pass = 1;
    CHECK(!dl_open_mix(e2, 2, "val", &big, err, sizeof err) && strstr(err, "fewer than one global batch"), "%s", err);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/tetra_test_mixture_%ld", (long)getpid());
    mkdir(g_dir, 0755);
    snprintf(g_a, sizeof g_a, "%s/a", g_dir);
    snprintf(g_b, sizeof g_b, "%s/b", g_dir);
    snprintf(g_c, sizeof g_c, "%s/c", g_dir);
    make_corpus(g_a, VOCAB, 0, 300 * (T + 1) + 7, 160);
    make_corpus(g_b, VOCAB, 20000, 200 * (T + 1), 96);
    make_megatron(g_c, 40000, 150 * (T + 1) + 3);
    snprintf(g_ea, sizeof g_ea, "%s:0.5", g_a);
    snprintf(g_eb, sizeof g_eb, "%s:0.3", g_b);
    snprintf(g_ec, sizeof g_ec, "%s:0.2", g_c);
    test_stream();
    test_refusals();
    test_single_pass();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    printf("test_mixture: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
