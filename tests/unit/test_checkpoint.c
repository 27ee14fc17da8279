/* Checkpoint format and I/O without MPI: CRC-32C vectors, float16/bfloat16
 * conversions, the resharding overlap math against a brute-force reference,
 * the metadata JSON round trip and its validation, gathering chunk lists, and
 * on disk: save (sync and async) and load under other partitions from a
 * hand-built two-file checkpoint, keep_latest_k, stale temporary folders, and
 * the refusals for a flipped byte, a truncated shard and a missing metadata
 * file (each naming the file and the tensor). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/ckpt_format.h"
#include "util/crc32c.h"
#include "kernels/ops.h"
#include "kernels/ops_math.h"
#include "tests/check.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* ---------------------------------------------------------------- CRC-32C */

static uint32_t crc_bitwise(const unsigned char *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}

static void test_crc(void) {
    CHECK(crc32c(0, "123456789", 9) == 0xE3069283u, "check value %08x", crc32c(0, "123456789", 9));
    CHECK(crc32c(0, "", 0) == 0, "empty");
    unsigned char buf[4099];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)rnd();
    uint32_t want = crc_bitwise(buf, sizeof buf);
    CHECK(crc32c(0, buf, sizeof buf) == want, "random 4099 bytes");
    int chain_ok = 1;
    for (size_t cut = 0; cut <= 17; cut++) {
        uint32_t a = crc32c(0, buf + 1, cut); /* unaligned start too */
        chain_ok &= crc32c(a, buf + 1 + cut, sizeof buf - 1 - cut) == crc_bitwise(buf + 1, sizeof buf - 1);
    }
    CHECK(chain_ok, "chained pieces equal the whole");
}

/* ---------------------------------------------------------------- dtypes */

static void test_dtypes(void) {
    CHECK(ck_f32_to_f16(1.0f) == 0x3c00, "1.0");
    CHECK(ck_f32_to_f16(-2.0f) == 0xc000, "-2.0");
    CHECK(ck_f32_to_f16(65504.0f) == 0x7bff, "max half");
    CHECK(ck_f32_to_f16(65519.0f) == 0x7bff, "rounds down to max");
    CHECK(ck_f32_to_f16(65520.0f) == 0x7c00, "overflow to inf");
    CHECK(ck_f32_to_f16(ldexpf(1.0f, -14)) == 0x0400, "smallest normal");
    CHECK(ck_f32_to_f16(ldexpf(1.0f, -24)) == 0x0001, "smallest subnormal");
    CHECK(ck_f32_to_f16(ldexpf(1.0f, -25)) == 0x0000, "half the smallest subnormal ties to even (0)");
    CHECK(ck_f32_to_f16(ldexpf(1.5f, -25)) == 0x0001, "above the tie rounds up");
    CHECK(ck_f32_to_f16(ldexpf(3.0f, -25)) == 0x0002, "1.5 units ties to even (2)");
    CHECK(ck_f32_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00, "tie to even at 1");
    CHECK(ck_f32_to_f16(1.0f + ldexpf(3.0f, -11)) == 0x3c02, "tie to even up");
    CHECK((ck_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (ck_f32_to_f16(NAN) & 0x3ff), "NaN stays NaN");
    CHECK(ck_f32_to_f16(-INFINITY) == 0xfc00, "-inf");
    int rt = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN payloads */
        if (ck_f32_to_f16(ck_f16_to_f32((uint16_t)h)) != h) rt = 0;
    }
    CHECK(rt, "every float16 survives decode -> encode");
    float src[5] = {1.0f, -3.140625f, 1e-3f, 70000.0f, 0.0f}, back[5];
    unsigned char enc[20];
    ck_encode(enc, src, 5, TETRA_BF16);
    ck_decode(back, enc, 5, TETRA_BF16);
    int ok = 1;
    for (int i = 0; i < 5; i++) ok &= back[i] == tetra_bf16_to_f32(tetra_f32_to_bf16(src[i]));
    CHECK(ok, "bfloat16 encode/decode is the RNE rounding");
    ck_encode(enc, src, 5, TETRA_F32);
    ck_decode(back, enc, 5, TETRA_F32);
    CHECK(!memcmp(back, src, sizeof src), "float32 is a copy");
    tetra_dtype t;
    CHECK(ck_dtype_parse("bfloat16", &t) == 0 && t == TETRA_BF16, "parse bfloat16");
    CHECK(ck_dtype_parse("F16", &t) == 0 && t == TETRA_F16, "parse F16");
    CHECK(ck_dtype_parse("int8", &t) == -1, "parse int8 fails");
}

/* ---------------------------------------------------------------- overlap */

typedef struct {
    int64_t *dst_from_src; /* [dst count]: src_k that landed there, -1 none */
    int dup;
} runs_ctx;

static void rec_run(void *user, uint64_t sk, uint64_t dk, uint64_t n) {
    runs_ctx *c = user;
    for (uint64_t i = 0; i < n; i++) {
        if (c->dst_from_src[dk + i] >= 0) c->dup = 1;
        c->dst_from_src[dk + i] = (int64_t)(sk + i);
    }
}

/* global row-major index of element k of a region */
static int64_t region_global(int ndim, const int64_t *shape, const ck_region *r, uint64_t k) {
    uint64_t idx = r->start + k;
    int64_t coord[DT_MAX_DIMS];
    for (int d = ndim - 1; d >= 0; d--) {
        coord[d] = r->box_start[d] + (int64_t)(idx % (uint64_t)r->box_shape[d]);
        idx /= (uint64_t)r->box_shape[d];
    }
    int64_t g = 0;
    for (int d = 0; d < ndim; d++) g = g * shape[d] + coord[d];
    return g;
}

static ck_region random_region(int ndim, const int64_t *shape, int whole_box) {
    ck_region r;
    memset(&r, 0, sizeof r);
    uint64_t box = 1;
    for (int d = 0; d < ndim; d++) {
        if (whole_box) {
            r.box_start[d] = 0;
            r.box_shape[d] = shape[d];
        } else {
            r.box_start[d] = (int64_t)(rnd() % (uint64_t)shape[d]);
            r.box_shape[d] = 1 + (int64_t)(rnd() % (uint64_t)(shape[d] - r.box_start[d]));
        }
        box *= (uint64_t)r.box_shape[d];
    }
    r.start = rnd() % box;
    r.count = 1 + rnd() % (box - r.start);
    return r;
}

static void test_overlap(void) {
    int bad = 0, trials = 0;
    for (int trial = 0; trial < 3000; trial++) {
        int ndim = 1 + (int)(rnd() % 3);
        int64_t shape[DT_MAX_DIMS] = {0};
        for (int d = 0; d < ndim; d++) shape[d] = 1 + (int64_t)(rnd() % 7);
        int whole = trial % 3 == 0;
        ck_region src = random_region(ndim, shape, whole), dst = random_region(ndim, shape, whole);
        int64_t *got = malloc(sizeof(int64_t) * dst.count);
        for (uint64_t i = 0; i < dst.count; i++) got[i] = -1;
        runs_ctx ctx = {got, 0};
        uint64_t n = ck_overlap(ndim, &src, &dst, rec_run, &ctx);
        /* brute force: for each dst element, the src element with the same global index */
        uint64_t want_n = 0;
        int ok = !ctx.dup;
        for (uint64_t k = 0; k < dst.count; k++) {
            int64_t g = region_global(ndim, shape, &dst, k), match = -1;
            for (uint64_t j = 0; j < src.count; j++)
                if (region_global(ndim, shape, &src, j) == g) match = (int64_t)j;
            if (match >= 0) want_n++;
            if (got[k] != match) ok = 0;
        }
        if (!ok || n != want_n) bad++;
        trials++;
        free(got);
    }
    CHECK(bad == 0, "%d of %d random region pairs disagree with the brute-force overlap", bad, trials);
    /* the FSDP case: same box, ranges */
    ck_region a = {{0}, {10, 4}, 8, 16}, b = {{0}, {10, 4}, 20, 10};
    CHECK(ck_overlap(2, &a, &b, NULL, NULL) == 4, "[8,24) and [20,30) share 4");
    b.start = 24;
    CHECK(ck_overlap(2, &a, &b, NULL, NULL) == 0, "adjacent ranges share nothing");
}

/* ---------------------------------------------------------------- metadata */

static void add_chunk(ck_meta *m, int ti, int file, uint64_t off, uint64_t start, uint64_t count, uint32_t crc) {
    ck_tensor *t = &m->tensors[ti];
    ck_chunk c;
    memset(&c, 0, sizeof c);
    c.file = file;
    c.offset = off;
    c.length = count * tetra_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) c.box_shape[d] = t->shape[d];
    c.start = start;
    c.count = count;
    c.crc = crc;
    ck_tensor_add_chunk(t, &c);
}

static void test_metadata(void) {
    ck_meta m;
    ck_meta_init(&m);
    m.step = 42;
    int f0 = ck_meta_file(&m, "rank_00000.bin"), f1 = ck_meta_file(&m, "rank_00001.bin");
    m.files[f0].size = 1000;
    m.files[f1].size = 1000;
    int64_t s2[2] = {10, 8}, s1[1] = {8};
    int a = ck_meta_tensor(&m, "model/w", TETRA_F32, 2, s2);
    int b = ck_meta_tensor(&m, "model/n", TETRA_BF16, 1, s1);
    add_chunk(&m, a, f0, 0, 0, 40, 0xdeadbeef);
    add_chunk(&m, a, f1, 0, 40, 40, 0x01234567);
    add_chunk(&m, b, f1, 192, 0, 8, 7);
    json_object_set_new(m.state, "train_state", json_pack("{s:I}", "step", (json_int_t)42));
    json_t *j = ck_meta_to_json(&m);
    ck_meta back;
    ck_meta_init(&back);
    char err[1024];
    CHECK(ck_meta_from_json(&back, j, "t", err, sizeof err) == 0, "%s", err);
    CHECK(back.step == 42 && back.n_files == 2 && back.n_tensors == 2, "counts");
    const ck_tensor *w = ck_meta_find(&back, "model/w"), *nn = ck_meta_find(&back, "model/n");
    CHECK(w && w->n_chunks == 2 && w->chunks[1].crc == 0x01234567 && w->chunks[1].file == 1 && w->chunks[1].start == 40,
          "chunks survive");
    CHECK(nn && nn->dtype == TETRA_BF16 && nn->chunks[0].length == 16, "bf16 tensor");
    CHECK(json_integer_value(json_object_get(json_object_get(back.state, "train_state"), "step")) == 42, "state kept");
    ck_meta_free(&back);

    /* validation */
    json_t *bad = json_deep_copy(j);
    json_integer_set(
        json_object_get(
            json_array_get(json_object_get(json_object_get(json_object_get(bad, "tensors"), "model/w"), "chunks"), 1),
            "offset"),
        990);
    ck_meta_init(&back);
    CHECK(ck_meta_from_json(&back, bad, "t", err, sizeof err) == -1 && strstr(err, "model/w") &&
              strstr(err, "past the end of rank_00001.bin"),
          "chunk past the file end: %s", err);
    ck_meta_free(&back);
    json_decref(bad);
    bad = json_deep_copy(j);
    json_integer_set(
        json_object_get(
            json_array_get(json_object_get(json_object_get(json_object_get(bad, "tensors"), "model/w"), "chunks"), 0),
            "count"),
        41);
    ck_meta_init(&back);
    CHECK(ck_meta_from_json(&back, bad, "t", err, sizeof err) == -1 && strstr(err, "'model/w' chunk 0 is inconsistent"),
          "length vs count: %s", err);
    ck_meta_free(&back);
    json_decref(bad);
    bad = json_deep_copy(j);
    json_object_set_new(bad, "version", json_integer(99));
    ck_meta_init(&back);
    CHECK(ck_meta_from_json(&back, bad, "t", err, sizeof err) == -1 && strstr(err, "version 99"), "version: %s", err);
    ck_meta_free(&back);
    json_decref(bad);
    json_decref(j);

    /* gathering: two contributions and a failed one */
    ck_meta r0, r1, all;
    ck_meta_init(&r0);
    ck_meta_init(&r1);
    ck_meta_init(&all);
    int t0 = ck_meta_tensor(&r0, "model/w", TETRA_F32, 2, s2);
    int t1 = ck_meta_tensor(&r1, "model/w", TETRA_F32, 2, s2);
    add_chunk(&r0, t0, 0, 0, 0, 40, 1);
    add_chunk(&r1, t1, 0, 0, 40, 40, 2);
    char *x0 = ck_chunks_serialise(&r0, 160, NULL), *x1 = ck_chunks_serialise(&r1, 160, NULL);
    char *x2 = ck_chunks_serialise(&r1, 0, "cannot write 'x/rank_00002.bin': No space left on device");
    int failed = 0;
    CHECK(ck_chunks_merge(&all, x0, "rank_00000.bin", &failed, err, sizeof err) == 0, "%s", err);
    CHECK(ck_chunks_merge(&all, x1, "rank_00001.bin", &failed, err, sizeof err) == 0, "%s", err);
    CHECK(!failed && all.n_files == 2 && all.n_tensors == 1 && all.tensors[0].n_chunks == 2 &&
              all.tensors[0].chunks[1].file == 1 && all.files[1].size == 160,
          "merged chunk lists");
    ck_meta r3;
    ck_meta_init(&r3);
    ck_meta_tensor(&r3, "model/w", TETRA_F32, 2, s2);
    char *x3 = ck_chunks_serialise(&r3, 0, NULL);
    CHECK(ck_chunks_merge(&all, x3, "rank_00003.bin", &failed, err, sizeof err) == 0 && all.n_files == 2,
          "a rank without chunks adds no file");
    free(x3);
    ck_meta_free(&r3);
    CHECK(ck_chunks_merge(&all, x2, "rank_00002.bin", &failed, err, sizeof err) == 0 && failed &&
              strstr(err, "No space left"),
          "a failed rank's message: %s", err);
    free(x0);
    free(x1);
    free(x2);
    ck_meta_free(&r0);
    ck_meta_free(&r1);
    ck_meta_free(&all);
    ck_meta_free(&m);

    CHECK(ck_parse_step_dir("step-12") == 12 && ck_parse_step_dir("step-0") == 0, "step names");
    CHECK(ck_parse_step_dir("step-12.tmp-77") == -1 && ck_parse_step_dir("step-") == -1 &&
              ck_parse_step_dir("steps-1") == -1,
          "not step names");
}

/* ---------------------------------------------------------------- on disk */

static char root[256];

static void path_of(char *out, size_t n, const char *rel) { ck_snprintf(out, n, "%s/%s", root, rel); }

/* A tensor split as an FSDP range over `parts` ranks: piece of rank k. */
static dt_tensor fsdp_piece(const char *name, int ndim, const int64_t *shape, int parts, int k, size_t local_offset) {
    dt_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.dtype = TETRA_F32;
    t.ndim = ndim;
    t.numel = 1;
    for (int d = 0; d < ndim; d++) {
        t.shape[d] = t.box_shape[d] = shape[d];
        t.numel *= (size_t)shape[d];
    }
    size_t per = (t.numel + (size_t)parts - 1) / (size_t)parts, lo = (size_t)k * per;
    size_t hi = lo + per < t.numel ? lo + per : t.numel;
    if (hi > lo) {
        t.n_pieces = 1;
        t.piece.start = lo;
        t.piece.count = hi - lo;
        t.piece.local_offset = local_offset;
    }
    return t;
}

static float value_of(int tensor, size_t i) { return (float)tensor * 1000.0f + (float)i * 0.5f; }

static int write_whole(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int bad = fwrite(p, 1, n, f) != n;
    return fclose(f) != 0 || bad ? -1 : 0;
}

static void test_disk(const tetra_ops *ops) {
    char err[2048], dir[512], step[600], p[700];
    path_of(dir, sizeof dir, "ck");
    const int64_t shA[2] = {6, 5}, shB[1] = {7};
    const char *names[2] = {"a.weight", "b.weight"};

    /* save from a single rank (sync), two tensors, model + one optimizer group */
    float *store = ops->alloc(64 * sizeof(float)), *store2 = ops->alloc(64 * sizeof(float));
    dt_tensor ts[2] = {fsdp_piece(names[0], 2, shA, 1, 0, 0), fsdp_piece(names[1], 1, shB, 1, 0, 32)};
    for (size_t i = 0; i < 30; i++) store[i] = value_of(0, i);
    for (size_t i = 0; i < 7; i++) store[32 + i] = value_of(1, i);
    for (size_t i = 0; i < 64; i++) store2[i] = -store[i];
    ckpt_group groups[2] = {{"model/", ts, 2, store, 0}, {"optimizer/exp_avg/", ts, 2, store2, 0}};
    ckpt_saver_options so;
    memset(&so, 0, sizeof so);
    so.dir = dir;
    so.ops = ops;
    so.world = 1;
    so.writer = 1;
    so.keep_latest_k = 2;
    ckpt_saver *sv = ckpt_saver_create(&so, err, sizeof err);
    CHECK(sv != NULL, "%s", err);
    json_t *state = NULL;
    for (int s = 1; s <= 3; s++) {
        ckpt_save_request rq;
        memset(&rq, 0, sizeof rq);
        rq.step = s;
        rq.groups = groups;
        rq.n_groups = 2;
        rq.dtype = TETRA_F32;
        json_decref(state);
        state = json_pack("{s:{s:I}}", "train_state", "step", (json_int_t)s); /* a save records its own step */
        rq.state = state;
        CHECK(ckpt_save(sv, &rq, err, sizeof err) == 0, "save %d: %s", s, err);
    }
    ckpt_saver_free(sv);
    ck_snprintf(p, sizeof p, "%s/step-1", dir);
    CHECK(access(p, F_OK) != 0, "keep_latest_k = 2 pruned step-1");
    ck_snprintf(p, sizeof p, "%s/step-2/metadata.json", dir);
    CHECK(access(p, F_OK) == 0, "step-2 kept");

    /* async save of step 4, bfloat16 model-only */
    so.async = 1;
    sv = ckpt_saver_create(&so, err, sizeof err);
    ckpt_save_request rq;
    memset(&rq, 0, sizeof rq);
    rq.step = 4;
    rq.groups = groups;
    rq.n_groups = 1;
    rq.dtype = TETRA_BF16;
    rq.model_only = 1;
    json_decref(state);
    state = json_pack("{s:{s:I}}", "train_state", "step", (json_int_t)4);
    rq.state = state;
    CHECK(ckpt_save(sv, &rq, err, sizeof err) == 0 && ckpt_in_flight(sv), "async save started: %s", err);
    int pr = ckpt_poll(sv, 1, err, sizeof err);
    CHECK(pr == 1 && !ckpt_in_flight(sv), "async save completed (%d): %s", pr, err);
    ckpt_saver_free(sv);
    json_decref(state);

    /* load step-3 into a 3-way partition; step-4 (bf16) into 1 rank */
    ck_snprintf(step, sizeof step, "%s/step-3", dir);
    int ok = 1;
    for (int k = 0; k < 3; k++) {
        float *dst = ops->alloc(64 * sizeof(float));
        ops->fill(dst, 0.0f, 64);
        dt_tensor pt[2] = {fsdp_piece(names[0], 2, shA, 3, k, 0), fsdp_piece(names[1], 1, shB, 3, k, 16)};
        ckpt_group g = {"optimizer/exp_avg/", pt, 2, dst, 0};
        ckpt_reader *r = ckpt_reader_open(step, err, sizeof err);
        CHECK(r && ckpt_reader_load(r, &g, ops, err, sizeof err) == 0, "load rank %d of 3: %s", k, err);
        for (int t = 0; t < 2; t++)
            for (size_t i = 0; i < pt[t].piece.count; i++)
                ok &= dst[pt[t].piece.local_offset + i] == -value_of(t, pt[t].piece.start + i);
        ckpt_reader_close(r);
        ops->release(dst);
    }
    CHECK(ok, "3-way resharded load gives the saved values");
    ck_snprintf(step, sizeof step, "%s/step-4", dir);
    {
        float *dst = ops->alloc(64 * sizeof(float));
        ckpt_group g = {"model/", ts, 2, dst, 0};
        ckpt_reader *r = ckpt_reader_open(step, err, sizeof err);
        CHECK(r && ckpt_reader_meta(r)->model_only && ckpt_reader_meta(r)->tensors[0].dtype == TETRA_BF16,
              "bf16 model-only: %s", err);
        CHECK(r && ckpt_reader_load(r, &g, ops, err, sizeof err) == 0, "%s", err);
        ok = 1;
        for (size_t i = 0; i < 30; i++) ok &= dst[i] == tetra_bf16_to_f32(tetra_f32_to_bf16(value_of(0, i)));
        CHECK(ok, "bf16 values");
        ckpt_group g2 = {"optimizer/exp_avg/", ts, 2, dst, 0};
        CHECK(r && ckpt_reader_load(r, &g2, ops, err, sizeof err) == -1 && strstr(err, "model weights only"),
              "optimizer from a model-only checkpoint: %s", err);
        ckpt_reader_close(r);
        ops->release(dst);
    }

    /* a hand-built two-file checkpoint (as fsdp 2 writes it) loads on one rank */
    {
        char hd[600];
        ck_snprintf(hd, sizeof hd, "%s/hand/step-9", root);
        char mk[700];
        ck_snprintf(mk, sizeof mk, "%s/hand", root);
        mkdir(mk, 0755);
        mkdir(hd, 0755);
        ck_meta m;
        ck_meta_init(&m);
        m.step = 9;
        float v[30];
        for (int i = 0; i < 30; i++) v[i] = value_of(0, (size_t)i);
        int ti = ck_meta_tensor(&m, "model/a.weight", TETRA_F32, 2, shA);
        int f0 = ck_meta_file(&m, "rank_00000.bin"), f1 = ck_meta_file(&m, "rank_00001.bin");
        /* rank 1 holds [13, 30) at offset 64, rank 0 [0, 13) at offset 0 */
        add_chunk(&m, ti, f1, 64, 13, 17, crc32c(0, v + 13, 17 * 4));
        add_chunk(&m, ti, f0, 0, 0, 13, crc32c(0, v, 13 * 4));
        unsigned char file1[64 + 68];
        memset(file1, 0, sizeof file1);
        memcpy(file1 + 64, v + 13, 68);
        ck_snprintf(mk, sizeof mk, "%s/rank_00000.bin", hd);
        CHECK(write_whole(mk, v, 52) == 0, "write rank 0 file");
        ck_snprintf(mk, sizeof mk, "%s/rank_00001.bin", hd);
        CHECK(write_whole(mk, file1, sizeof file1) == 0, "write rank 1 file");
        m.files[f0].size = 52;
        m.files[f1].size = sizeof file1;
        ck_snprintf(mk, sizeof mk, "%s/metadata.json", hd);
        CHECK(ck_meta_write(&m, mk, err, sizeof err) == 0, "%s", err);
        ck_meta_free(&m);
        float *dst = ops->alloc(64 * sizeof(float));
        dt_tensor one = fsdp_piece(names[0], 2, shA, 1, 0, 0);
        ckpt_group g = {"model/", &one, 1, dst, 0};
        ckpt_reader *r = ckpt_reader_open(hd, err, sizeof err);
        CHECK(r && ckpt_reader_load(r, &g, ops, err, sizeof err) == 0, "%s", err);
        CHECK(!memcmp(dst, v, sizeof v), "two files gathered into one piece");
        ckpt_reader_close(r);
        /* the same with a flipped byte in rank 1's chunk */
        ck_snprintf(mk, sizeof mk, "%s/rank_00001.bin", hd);
        file1[64 + 5] ^= 0x10;
        write_whole(mk, file1, sizeof file1);
        r = ckpt_reader_open(hd, err, sizeof err);
        CHECK(r && ckpt_reader_load(r, &g, ops, err, sizeof err) == -1 && strstr(err, "checksum mismatch") &&
                  strstr(err, "rank_00001.bin") && strstr(err, "'model/a.weight'"),
              "flipped byte named: %s", err);
        ckpt_reader_close(r);
        /* truncated */
        write_whole(mk, file1, 100);
        r = ckpt_reader_open(hd, err, sizeof err);
        CHECK(!r && strstr(err, "rank_00001.bin is truncated (100 of 132 bytes)") && strstr(err, "'model/a.weight'"),
              "truncated shard named: %s", err);
        ckpt_reader_close(r);
        /* missing metadata */
        ck_snprintf(mk, sizeof mk, "%s/metadata.json", hd);
        unlink(mk);
        r = ckpt_reader_open(hd, err, sizeof err);
        CHECK(!r && strstr(err, "metadata.json is missing"), "missing metadata named: %s", err);
        ckpt_reader_close(r);
        char found[700];
        ck_snprintf(mk, sizeof mk, "%s/hand", root);
        CHECK(ckpt_find(mk, -1, found, sizeof found, NULL, 0, err, sizeof err) == -1 &&
                  strstr(err, "step-9/metadata.json is missing"),
              "resume refuses a damaged newest folder: %s", err);
        CHECK(access(hd, F_OK) == 0, "and leaves it in place");
        ops->release(dst);
    }

    /* folders: temporary ones are ignored and cleaned; newest complete is found */
    ck_snprintf(p, sizeof p, "%s/step-7.tmp-12345", dir);
    mkdir(p, 0755);
    char found[700];
    char note[1024];
    CHECK(ckpt_find(dir, -1, found, sizeof found, note, sizeof note, err, sizeof err) == 1 && strstr(found, "step-3") &&
              strstr(note, "step-4 holds model weights only"),
          "the newest full-state checkpoint is preferred to a newer model-only one: %s (%s)", found, note);
    CHECK(ckpt_find(dir, 3, found, sizeof found, NULL, 0, err, sizeof err) == 1 && strstr(found, "step-3"),
          "load_step 3");
    ck_snprintf(p, sizeof p, "%s/step-2", dir);
    CHECK(access(p, F_OK) != 0, "the async save of step 4 pruned step-2 (keep 2)");
    ck_snprintf(p, sizeof p, "%s/step-7.tmp-12345", dir);
    CHECK(ckpt_find(dir, 7, found, sizeof found, NULL, 0, err, sizeof err) == -1 && strstr(err, "no "), "no step 7: %s",
          err);
    CHECK(ckpt_cleanup_stale(dir) == 1 && access(p, F_OK) != 0, "stale tmp folder removed");
    ops->release(store);
    ops->release(store2);
}

/* A copy of state object `obj` key `key` of step_dir/metadata.json (new reference). */
static json_t *state_value(const char *step_dir, const char *obj, const char *key) {
    char p[700], err[1024];
    ck_snprintf(p, sizeof p, "%s/metadata.json", step_dir);
    ck_meta m;
    ck_meta_init(&m);
    CHECK(ck_meta_read(&m, p, err, sizeof err) == 0, "%s", err);
    json_t *v = json_deep_copy(json_object_get(json_object_get(m.state, obj), key));
    ck_meta_free(&m);
    return v;
}

/* Rewrite step_dir/metadata.json with state object `obj` key `key` set to v (its checksum
 * recomputed, as a careful hand edit would), or removed when v is NULL. */
static void edit_state(const char *step_dir, const char *obj, const char *key, json_t *v) {
    char p[700], err[1024];
    ck_snprintf(p, sizeof p, "%s/metadata.json", step_dir);
    ck_meta m;
    ck_meta_init(&m);
    CHECK(ck_meta_read(&m, p, err, sizeof err) == 0, "%s", err);
    json_t *o = json_object_get(m.state, obj);
    if (v) json_object_set_new(o, key, v);
    else json_object_del(o, key);
    CHECK(ck_meta_write(&m, p, err, sizeof err) == 0, "%s", err);
    ck_meta_free(&m);
}

/* The reader checks what every save guarantees before anything is loaded: each shard file
 * has exactly its recorded size, a step-N folder holds step N, and the training counters are
 * integers >= 0 with train_state.step equal to the step. Each refusal names the file and the
 * field; `tetra checkpoint inspect` opens checkpoints through the same reader. */
static void test_consistency(const tetra_ops *ops) {
    char err[2048], dir[512], step[600], p[700], q[700];
    path_of(dir, sizeof dir, "cons");
    const int64_t sh[1] = {40};
    float *store = ops->alloc(64 * sizeof(float));
    for (size_t i = 0; i < 40; i++) store[i] = value_of(2, i);
    dt_tensor t = fsdp_piece("w", 1, sh, 1, 0, 0);
    ckpt_group g = {"model/", &t, 1, store, 0};
    ckpt_saver_options so;
    memset(&so, 0, sizeof so);
    so.dir = dir;
    so.ops = ops;
    so.world = 1;
    so.writer = 1;
    ckpt_saver *sv = ckpt_saver_create(&so, err, sizeof err);
    CHECK(sv != NULL, "%s", err);
    json_t *state = json_pack("{s:{s:I,s:I}, s:{s:I}, s:{s:I}, s:{s:I}}", "train_state", "step", (json_int_t)5,
                              "tokens_seen", (json_int_t)1280, "lr_scheduler", "count", (json_int_t)5, "optimizer",
                              "step", (json_int_t)4, "dataloader", "position", (json_int_t)20);
    ckpt_save_request rq;
    memset(&rq, 0, sizeof rq);
    rq.step = 5;
    rq.groups = &g;
    rq.n_groups = 1;
    rq.dtype = TETRA_F32;
    rq.state = state;
    CHECK(sv && ckpt_save(sv, &rq, err, sizeof err) == 0, "save: %s", err);
    ckpt_saver_free(sv);
    json_decref(state);
    ck_snprintf(step, sizeof step, "%s/step-5", dir);
    ckpt_reader *r = ckpt_reader_open(step, err, sizeof err);
    CHECK(r != NULL, "a consistent checkpoint opens: %s", err);
    ckpt_reader_close(r);

    /* bytes appended after the last chunk */
    ck_snprintf(p, sizeof p, "%s/rank_00000.bin", step);
    struct stat st;
    CHECK(stat(p, &st) == 0, "shard file");
    FILE *f = fopen(p, "ab");
    CHECK(f && fwrite("garbage", 1, 7, f) == 7 && fclose(f) == 0, "append");
    r = ckpt_reader_open(step, err, sizeof err);
    CHECK(!r && strstr(err, "rank_00000.bin has") && strstr(err, "(files[0].size): 7 bytes after its last chunk") &&
              strstr(err, "refusing to load"),
          "appended bytes refused naming the file and files[0].size: %s", err);
    ckpt_reader_close(r);
    CHECK(truncate(p, st.st_size) == 0, "restore the shard");

    /* a folder renamed to another step */
    ck_snprintf(q, sizeof q, "%s/step-6", dir);
    CHECK(rename(step, q) == 0, "rename");
    r = ckpt_reader_open(q, err, sizeof err);
    CHECK(!r && strstr(err, "step-6/metadata.json records \"step\": 5 but its folder is named step-6"),
          "step vs folder name: %s", err);
    ckpt_reader_close(r);
    char found[700];
    CHECK(ckpt_find(dir, -1, found, sizeof found, NULL, 0, err, sizeof err) == 1 && strstr(found, "step-6") &&
              (r = ckpt_reader_open(found, err, sizeof err)) == NULL,
          "the resume finds the renamed folder and the reader refuses it");
    ckpt_reader_close(r);
    CHECK(rename(q, step) == 0, "rename back");

    /* counters: negative, past AdamW's int step, not an integer, a train_state step that is not the step */
    const struct {
        const char *obj, *key;
        json_t *v;
        const char *want;
    } bad[] = {
        {"lr_scheduler", "count", json_integer(-3), "lr_scheduler.count is -3"},
        {"optimizer", "step", json_integer(-1), "optimizer.step is -1"},
        {"optimizer", "step", json_integer(2147483648LL),
         "optimizer.step is 2147483648; it counts steps or tokens, "
         "so it lies in [0, 2147483647]"},
        {"train_state", "tokens_seen", json_string("1280"), "train_state.tokens_seen is not an integer"},
        {"dataloader", "position", json_integer(-20), "dataloader.position is -20"},
        {"train_state", "step", json_integer(4), "train_state.step is 4 but \"step\" is 5"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *orig = state_value(step, bad[i].obj, bad[i].key);
        edit_state(step, bad[i].obj, bad[i].key, bad[i].v);
        r = ckpt_reader_open(step, err, sizeof err);
        CHECK(!r && strstr(err, "step-5/metadata.json: ") && strstr(err, bad[i].want) &&
                  strstr(err, "refusing to load"),
              "%s.%s refused by name: %s", bad[i].obj, bad[i].key, err);
        ckpt_reader_close(r);
        edit_state(step, bad[i].obj, bad[i].key, orig);
    }
    r = ckpt_reader_open(step, err, sizeof err);
    CHECK(r != NULL, "restored: %s", err);
    ckpt_reader_close(r);
    /* a model-only save has no scheduler or optimizer: nothing to check there */
    edit_state(step, "optimizer", "step", NULL);
    r = ckpt_reader_open(step, err, sizeof err);
    CHECK(r != NULL, "absent counters are fine: %s", err);
    ckpt_reader_close(r);
    ops->release(store);
}

int main(void) {
    char err[256];
    const tetra_ops *ops = ops_get("cpu", err, sizeof err);
    if (!ops) {
        fprintf(stderr, "no cpu backend: %s\n", err);
        return 1;
    }
    const char *tmpdir = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/tetra_test_checkpoint_XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    test_crc();
    test_dtypes();
    test_overlap();
    test_metadata();
    test_disk(ops);
    test_consistency(ops);
    ckpt_remove_tree(root);
    printf("test_checkpoint: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
