/* Device mesh: degree resolution (-1 takes the rest), errors for layouts that
 * do not fit the world, rank <-> coordinates with tp innermost, and the
 * membership and order of every process group; FSDP shard layout and the
 * sharded tensor descriptors (pure arithmetic: no MPI needed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/dtensor.h"
#include "parallel/mesh.h"
#include "tests/check.h"

static void test_resolve(void) {
    mesh m;
    char err[512];
    CHECK(mesh_init(&m, 8, 1, 1, -1, 1, 1, err, sizeof err) == 0, "%s", err);
    CHECK(m.size[MESH_DP_SHARD] == 8, "shard %d", m.size[MESH_DP_SHARD]);
    CHECK(mesh_init(&m, 8, 1, 2, -1, 1, 1, err, sizeof err) == 0, "%s", err);
    CHECK(m.size[MESH_DP_SHARD] == 4 && m.size[MESH_DP_REPLICATE] == 2, "hsdp 2x4");
    CHECK(mesh_init(&m, 16, 2, 1, -1, 2, 2, err, sizeof err) == 0, "%s", err);
    CHECK(m.size[MESH_DP_SHARD] == 2, "4d shard %d", m.size[MESH_DP_SHARD]);
    CHECK(mesh_init(&m, 1, 1, 1, -1, 1, 1, err, sizeof err) == 0 && m.size[MESH_DP_SHARD] == 1, "single rank");
    CHECK(mesh_init(&m, 4, 1, 4, 1, 1, 1, err, sizeof err) == 0, "ddp 4: %s", err);

    /* errors */
    CHECK(mesh_init(&m, 6, 1, 4, -1, 1, 1, err, sizeof err) == -1 && strstr(err, "not divisible"), "6 %% 4: %s", err);
    CHECK(mesh_init(&m, 8, 1, 1, 2, 1, 2, err, sizeof err) == -1 && strstr(err, "= 4 ranks, but the world size is 8"),
          "product: %s", err);
    CHECK(mesh_init(&m, 4, 1, 0, -1, 1, 1, err, sizeof err) == -1 && strstr(err, "dp_replicate degree must be >= 1"),
          "zero degree: %s", err);
    CHECK(mesh_init(&m, 4, 1, 1, -3, 1, 1, err, sizeof err) == -1 && strstr(err, "-1 or >= 1"), "bad shard: %s", err);
    CHECK(mesh_init(&m, 0, 1, 1, -1, 1, 1, err, sizeof err) == -1, "world 0");
}

static void test_coords(void) {
    mesh m;
    char err[256];
    /* pp 2, rep 2, shard 2, cp 1, tp 2: 16 ranks */
    CHECK(mesh_init(&m, 16, 2, 2, 2, 1, 2, err, sizeof err) == 0, "%s", err);
    for (int r = 0; r < 16; r++) {
        int c[MESH_NDIMS];
        mesh_coords(&m, r, c);
        CHECK(mesh_rank(&m, c) == r, "round trip %d", r);
        CHECK(c[MESH_TP] == r % 2, "tp innermost at %d", r);
        CHECK(c[MESH_PP] == r / 8, "pp outermost at %d", r);
        CHECK(c[MESH_DP_SHARD] == (r / 2) % 2 && c[MESH_DP_REPLICATE] == (r / 4) % 2, "dp coords at %d", r);
    }
    /* tp group: neighbours */
    int mem[16];
    mesh_group_members(&m, mesh_group_dims(MESH_G_TP), 5, mem);
    CHECK(mem[0] == 4 && mem[1] == 5, "tp group of 5: %d %d", mem[0], mem[1]);
    CHECK(mesh_group_rank(&m, mesh_group_dims(MESH_G_TP), 5) == 1, "tp rank");
    /* pp group of 3: 3 and 11 */
    mesh_group_members(&m, mesh_group_dims(MESH_G_PP), 3, mem);
    CHECK(mem[0] == 3 && mem[1] == 11, "pp group %d %d", mem[0], mem[1]);
    /* batch group (rep x shard) of rank 9 (pp 1, rep 0, shard 0, tp 1): 9, 11, 13, 15 */
    CHECK(mesh_group_size(&m, mesh_group_dims(MESH_G_BATCH)) == 4, "batch size");
    mesh_group_members(&m, mesh_group_dims(MESH_G_BATCH), 9, mem);
    CHECK(mem[0] == 9 && mem[1] == 11 && mem[2] == 13 && mem[3] == 15, "batch members %d %d %d %d", mem[0], mem[1],
          mem[2], mem[3]);
    CHECK(mesh_group_rank(&m, mesh_group_dims(MESH_G_BATCH), 13) == 2, "batch rank of 13 (rep 1, shard 0)");
    /* world */
    CHECK(mesh_group_size(&m, mesh_group_dims(MESH_G_WORLD)) == 16, "world size");
    CHECK(mesh_group_rank(&m, mesh_group_dims(MESH_G_WORLD), 13) == 13, "world rank");
    CHECK(mesh_group_color(&m, mesh_group_dims(MESH_G_WORLD), 13) == 0, "world colour");
}

/* Every group partitions the world; colours name the partition; group ranks are a
 * permutation inside each part and agree with mesh_group_members. */
static void test_partitions(void) {
    const int layouts[][6] = {
        /* world, pp, rep, shard, cp, tp */
        {8, 1, 1, -1, 1, 1}, {8, 1, 2, -1, 1, 1}, {8, 1, 2, 2, 1, 2},  {16, 2, 1, 2, 2, 2},
        {24, 2, 3, 2, 1, 2}, {4, 1, 4, 1, 1, 1},  {12, 1, 1, 3, 2, 2},
    };
    for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++) {
        const int *L = layouts[li];
        mesh m;
        char err[256];
        CHECK(mesh_init(&m, L[0], L[1], L[2], L[3], L[4], L[5], err, sizeof err) == 0, "%s", err);
        for (int g = 0; g < MESH_N_GROUPS; g++) {
            const unsigned dims = mesh_group_dims((mesh_group_id)g);
            const int n = mesh_group_size(&m, dims), ngroups = m.world / n;
            CHECK(n * ngroups == m.world, "layout %zu group %s size %d", li, mesh_group_name((mesh_group_id)g), n);
            int *seen = calloc((size_t)m.world, sizeof *seen), *mem = malloc((size_t)n * sizeof *mem);
            for (int r = 0; r < m.world; r++) {
                const int color = mesh_group_color(&m, dims, r), gr = mesh_group_rank(&m, dims, r);
                CHECK(color >= 0 && color < ngroups && gr >= 0 && gr < n, "range");
                mesh_group_members(&m, dims, r, mem);
                CHECK(mem[gr] == r, "layout %zu %s: rank %d is member %d", li, mesh_group_name((mesh_group_id)g), r,
                      gr);
                for (int i = 0; i < n; i++) {
                    CHECK(mesh_group_color(&m, dims, mem[i]) == color, "same colour");
                    CHECK(mesh_group_rank(&m, dims, mem[i]) == i, "member order");
                }
                seen[color * n + gr]++;
            }
            for (int i = 0; i < m.world; i++)
                CHECK(seen[i] == 1, "layout %zu %s: slot %d seen %d times", li, mesh_group_name((mesh_group_id)g), i,
                      seen[i]);
            free(seen);
            free(mem);
        }
        /* FSDP = dp_shard x cp; loss = batch x cp */
        CHECK(mesh_group_size(&m, mesh_group_dims(MESH_G_FSDP)) == m.size[MESH_DP_SHARD] * m.size[MESH_CP], "fsdp");
        CHECK(mesh_group_size(&m, mesh_group_dims(MESH_G_LOSS)) ==
                  m.size[MESH_DP_REPLICATE] * m.size[MESH_DP_SHARD] * m.size[MESH_CP],
              "loss");
    }
    char buf[128];
    mesh m;
    char err[64];
    mesh_init(&m, 8, 1, 2, -1, 1, 1, err, sizeof err);
    mesh_describe(&m, buf, sizeof buf);
    CHECK(!strcmp(buf, "world 8 = pp 1 x dp_replicate 2 x dp_shard 4 x cp 1 x tp 1"), "%s", buf);
    CHECK(!strcmp(mesh_group_name(MESH_G_FSDP), "dp_shard_cp") && !strcmp(mesh_group_name(MESH_G_LOSS), "dp_cp"),
          "names");
}

static void test_dtensor(void) {
    dt_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "w");
    t.dtype = TETRA_F32;
    t.ndim = 2;
    t.shape[0] = 6;
    t.shape[1] = 4;
    t.numel = 24;
    t.box_shape[0] = 6;
    t.box_shape[1] = 4;
    t.n_pieces = 1;
    t.piece.start = 10;
    t.piece.count = 5;
    t.piece.local_offset = 3;
    int64_t c[DT_MAX_DIMS];
    dt_piece_coords(&t, 0, c);
    CHECK(c[0] == 2 && c[1] == 2, "element 10 is (2, 2): (%lld, %lld)", (long long)c[0], (long long)c[1]);
    CHECK(dt_piece_global_index(&t, 4) == 14, "global index");
    /* a TP box: rows 3..5 of the tensor */
    t.box_start[0] = 3;
    t.box_shape[0] = 3;
    t.piece.start = 5;
    dt_piece_coords(&t, 0, c);
    CHECK(c[0] == 4 && c[1] == 1, "box element 5 is (4, 1): (%lld, %lld)", (long long)c[0], (long long)c[1]);
    CHECK(dt_piece_global_index(&t, 0) == 17, "global index in the box");
    char buf[256];
    dt_describe(&t, buf, sizeof buf);
    CHECK(strstr(buf, "w [6, 4] float32") != NULL, "%s", buf);

    /* runs contiguous in the global order: a box of whole rows is one run ... */
    size_t run = 0;
    CHECK(dt_piece_global_run(&t, 0, &run) == 17 && run == 5, "whole rows: one run of 5, got %zu", run);
    /* ... a column block is one run per box row: columns 1..2 of rows 3..5 */
    t.box_start[1] = 1;
    t.box_shape[1] = 2;
    t.piece.start = 1; /* box elements 1..4: (3,2) | (4,1) (4,2) | (5,1) */
    t.piece.count = 4;
    size_t want_g[] = {14, 17, 18, 21}, want_run[] = {1, 2, 1, 1};
    for (size_t k = 0; k < 4; k++) {
        size_t g = dt_piece_global_run(&t, k, &run);
        CHECK(g == want_g[k] && run == want_run[k], "column block element %zu: global %zu run %zu", k, g, run);
    }
}

int main(void) {
    test_resolve();
    test_coords();
    test_partitions();
    test_dtensor();
    printf("test_mesh: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
