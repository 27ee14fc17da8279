/* comm.h over MPI and fsdp.h on top of it.
 *
 * Run directly (ctest) it is one rank: every group has one member and the
 * local paths are checked. tests/sh/test_comm_mpi.sh runs it under
 * `mpirun -np 4`, where every collective of every group of several meshes
 * (fsdp 4, hsdp 2 x 2, ddp 4, and a 2 x 2 cp x tp mesh) is checked against
 * closed-form values, blocking and asynchronous, and FSDP's all-gather,
 * reduce-scatter, HSDP all-reduce and global norm are checked on units whose
 * sizes do not divide by the shard degree.
 *
 * The same collectives then run on "device" buffers through the staging table (MPI
 * for ranks sharing a GPU), with the staged bytes and page-locked blocks counted.
 *
 * With TETRA_COMM_TEST_STUCK=1 (and at least 2 ranks) rank 1 skips an
 * all-gather that the others enter: the others must end the job within the
 * 2-second timeout with the message naming group, operation and rank.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/fsdp.h"
#include "parallel/mesh.h"
#include "tests/check.h"

/* value that world rank r contributes at element i: small integers, exact in fp32 sums */
static float val(int r, size_t i) { return (float)((r + 1) * 10 + (int)(i % 7)); }

static void test_group(comm_group *g, const char *mname) {
    const int n = comm_group_size(g), me = comm_group_rank(g);
    const char *gn = comm_group_name(g);
    const size_t cnt = 1000;
    float *a = malloc(cnt * (size_t)n * sizeof(float)), *b = malloc(cnt * (size_t)n * sizeof(float));
    double *d = malloc(cnt * sizeof(double));

    /* all-reduce sum / max / min / avg (blocking) */
    for (size_t i = 0; i < cnt; i++) a[i] = val(me, i);
    comm_all_reduce(g, a, cnt, COMM_F32, COMM_SUM, NULL);
    int bad = 0;
    for (size_t i = 0; i < cnt; i++) {
        float want = 0;
        for (int r = 0; r < n; r++) want += val(r, i);
        bad += a[i] != want;
    }
    CHECK(!bad, "%s %s all_reduce sum: %d wrong", mname, gn, bad);
    for (size_t i = 0; i < cnt; i++) d[i] = (double)val(me, i);
    comm_all_reduce(g, d, cnt, COMM_F64, COMM_MAX, NULL);
    CHECK(d[3] == (double)val(n - 1, 3), "%s %s max %g", mname, gn, d[3]);
    for (size_t i = 0; i < cnt; i++) d[i] = (double)val(me, i);
    comm_all_reduce(g, d, cnt, COMM_F64, COMM_MIN, NULL);
    CHECK(d[3] == (double)val(0, 3), "%s %s min %g", mname, gn, d[3]);
    for (size_t i = 0; i < cnt; i++) a[i] = val(me, i);
    comm_all_reduce(g, a, cnt, COMM_F32, COMM_AVG, NULL);
    {
        float want = 0;
        for (int r = 0; r < n; r++) want += val(r, 5);
        want /= (float)n;
        CHECK(fabsf(a[5] - want) <= 1e-6f * want, "%s %s avg %g want %g", mname, gn, a[5], want);
    }
    int64_t s = comm_all_reduce_i64(g, (int64_t)me + 1, COMM_SUM);
    CHECK(s == (int64_t)n * (n + 1) / 2, "%s %s i64 sum %lld", mname, gn, (long long)s);
    double mx = comm_all_reduce_f64(g, (double)me, COMM_MAX);
    CHECK(mx == n - 1, "%s %s f64 max %g", mname, gn, mx);

    /* reduce-scatter: block j of rank r is val(r, j*cnt + i) */
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < cnt; i++) a[(size_t)j * cnt + i] = val(me, (size_t)j * cnt + i) + (float)j;
    comm_reduce_scatter(g, b, a, cnt, COMM_F32, COMM_SUM, NULL);
    bad = 0;
    for (size_t i = 0; i < cnt; i++) {
        float want = 0;
        for (int r = 0; r < n; r++) want += val(r, (size_t)me * cnt + i) + (float)me;
        bad += b[i] != want;
    }
    CHECK(!bad, "%s %s reduce_scatter: %d wrong", mname, gn, bad);

    /* all-gather, out of place and in place */
    for (size_t i = 0; i < cnt; i++) a[i] = val(me, i);
    comm_all_gather(g, b, a, cnt, COMM_F32, NULL);
    bad = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < cnt; i++) bad += b[(size_t)r * cnt + i] != val(r, i);
    CHECK(!bad, "%s %s all_gather: %d wrong", mname, gn, bad);
    memset(b, 0, cnt * (size_t)n * sizeof(float));
    for (size_t i = 0; i < cnt; i++) b[(size_t)me * cnt + i] = val(me, i);
    comm_all_gather(g, b, b + (size_t)me * cnt, cnt, COMM_F32, NULL);
    bad = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < cnt; i++) bad += b[(size_t)r * cnt + i] != val(r, i);
    CHECK(!bad, "%s %s all_gather in place: %d wrong", mname, gn, bad);

    /* broadcast from the last rank */
    for (size_t i = 0; i < cnt; i++) a[i] = val(me, i);
    comm_broadcast(g, a, cnt, COMM_F32, n - 1, NULL);
    CHECK(a[11] == val(n - 1, 11), "%s %s broadcast %g", mname, gn, a[11]);

    /* all-to-all: rank r sends block j = 100 r + j */
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < cnt; i++) a[(size_t)j * cnt + i] = (float)(100 * me + j);
    comm_all_to_all(g, b, a, cnt, COMM_F32, NULL);
    bad = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < cnt; i++) bad += b[(size_t)r * cnt + i] != (float)(100 * r + me);
    CHECK(!bad, "%s %s all_to_all: %d wrong", mname, gn, bad);

    /* ring send / recv, asynchronous */
    if (n > 1) {
        comm_request *rs = NULL, *rr = NULL;
        for (size_t i = 0; i < cnt; i++) a[i] = val(me, i);
        comm_recv(g, b, cnt, COMM_F32, (me + n - 1) % n, &rr);
        comm_send(g, a, cnt, COMM_F32, (me + 1) % n, &rs);
        comm_wait(rs);
        comm_wait(rr);
        CHECK(b[2] == val((me + n - 1) % n, 2), "%s %s ring recv %g", mname, gn, b[2]);
    }

    /* two asynchronous collectives in flight, waited in reverse order */
    {
        comm_request *r1 = NULL, *r2 = NULL;
        for (size_t i = 0; i < cnt; i++) a[i] = val(me, i);
        for (size_t i = 0; i < cnt; i++) d[i] = (double)me;
        comm_all_reduce(g, a, cnt, COMM_F32, COMM_SUM, &r1);
        comm_all_reduce(g, d, cnt, COMM_F64, COMM_SUM, &r2);
        while (!comm_test(r1)) {
        }
        comm_wait(r2);
        comm_wait(r1);
        float want = 0;
        for (int r = 0; r < n; r++) want += val(r, 0);
        CHECK(a[0] == want && d[0] == (double)n * (n - 1) / 2, "%s %s async: %g %g", mname, gn, a[0], d[0]);
    }
    comm_barrier(g, NULL);
    free(a);
    free(b);
    free(d);
}

/* ---- FSDP on a toy model: units of awkward sizes, values that sum exactly ---- */

typedef struct {
    int n_units;
    size_t unit_offset[4], unit_numel[4];
    dt_param_decl decl[6];
    int n_params;
    size_t total;
} toy;

static void toy_init(toy *t) {
    /* unit 0: one [7, 5] matrix; unit 1: [13] + [3, 9]; unit 2: [11, 3] + [5]; unit 3: [2] */
    static const int shapes[6][3] = {{0, 7, 5}, {1, 13, 0}, {1, 3, 9}, {2, 11, 3}, {2, 5, 0}, {3, 2, 0}};
    static const char *names[6] = {"emb", "b.norm", "b.w", "out.w", "out.norm", "tail"};
    memset(t, 0, sizeof *t);
    t->n_units = 4;
    t->n_params = 6;
    size_t off = 0;
    for (int i = 0; i < 6; i++) {
        dt_param_decl *d = &t->decl[i];
        int u = shapes[i][0];
        if (i == 0 || shapes[i - 1][0] != u) t->unit_offset[u] = off;
        d->name = names[i];
        d->unit = u;
        d->ndim = shapes[i][2] ? 2 : 1;
        d->shape[0] = shapes[i][1];
        d->shape[1] = shapes[i][2];
        d->numel = (size_t)shapes[i][1] * (size_t)(shapes[i][2] ? shapes[i][2] : 1);
        d->offset = off;
        off += d->numel;
        t->unit_numel[u] += d->numel;
    }
    t->total = off;
}

static float toy_value(size_t global_flat) { return 0.25f * (float)(global_flat % 97) - 3.0f; }

static int toy_fill(void *user, int param, size_t start, size_t count, float *out) {
    const toy *t = user;
    for (size_t j = 0; j < count; j++) out[j] = toy_value(t->decl[param].offset + start + j);
    return 0;
}

/* Units whose parameters are gathered now, beyond the ones the policy keeps. */
static int transient_gathered(void *const *up, const fsdp *f, int n_units) {
    int n = 0;
    for (int u = 0; u < n_units; u++) n += up[u] != NULL && fsdp_reshards_after_forward(f, u);
    return n;
}

/* accumulate = 1: gradients stay unsharded over the microbatches (pipeline parallel's
 * mode) and are reduce-scattered after each unit's last W pass. */
static void test_fsdp(comm_world *w, const char *mname, fsdp_reshard_mode mode, int accumulate) {
    const tetra_ops *ops = ops_cpu();
    toy t;
    toy_init(&t);
    void *up[4] = {0};
    float *ug[4] = {0};
    fsdp_config c;
    memset(&c, 0, sizeof c);
    c.ops = ops;
    c.shard = comm_get(w, MESH_G_FSDP);
    c.replicate = comm_get(w, MESH_G_DP_REPLICATE);
    c.reshard = mode;
    c.reduce_at_last_microbatch = accumulate;
    c.pipeline_parallel = accumulate;
    c.compute_dtype = TETRA_F32;
    c.n_units = t.n_units;
    c.unit_offset = t.unit_offset;
    c.unit_numel = t.unit_numel;
    c.n_params = t.n_params;
    c.params_decl = t.decl;
    c.unit_params = up;
    c.unit_grads = ug;
    char err[256];
    fsdp *f = fsdp_create(&c, err, sizeof err);
    CHECK(f != NULL, "%s", err);
    if (!f) return;
    const int S = fsdp_shard_degree(f), R = fsdp_replicate_degree(f);
    const int batch_rank = comm_group_rank(comm_get(w, MESH_G_BATCH));
    char tag[96];
    snprintf(tag, sizeof tag, "%s reshard %d%s", mname, (int)mode, accumulate ? " accumulate" : "");

    /* the pieces tile every parameter exactly once across the shard group */
    const dt_tensor *ts = fsdp_tensors(f);
    for (int i = 0; i < t.n_params; i++) {
        double mine = ts[i].n_pieces ? (double)ts[i].piece.count : 0.0;
        double total = comm_all_reduce_f64(c.shard, mine, COMM_SUM);
        CHECK(total == (double)t.decl[i].numel, "%s %s: pieces cover %g of %zu", tag, t.decl[i].name, total,
              t.decl[i].numel);
    }
    CHECK(fsdp_init_shards(f, toy_fill, &t) == 0, "init");
    size_t local = fsdp_local_numel(f);
    CHECK(S == 1 ? local == t.total : local < t.total, "%s local %zu of %zu", tag, local, t.total);
    for (int u = 0; u < t.n_units && S > 1; u++)
        CHECK(up[u] == NULL && ug[u] == NULL, "%s unit %d bound before any gather", tag, u);

    /* forward: every unit gathered equals the full init; never more than two transient
     * units gathered at once */
    int worst = 0;
    fsdp_begin_step(f);
    for (int u = 0; u < t.n_units; u++) {
        fsdp_pre_forward(f, u);
        CHECK(up[u] != NULL, "%s unit %d bound in forward", tag, u);
        int bad = 0;
        for (size_t j = 0; up[u] && j < t.unit_numel[u]; j++)
            bad += ((float *)up[u])[j] != toy_value(t.unit_offset[u] + j);
        CHECK(!bad, "%s unit %d gathered: %d wrong", tag, u, bad);
        int g = transient_gathered(up, f, t.n_units);
        if (g > worst) worst = g;
        fsdp_post_forward(f, u);
        if (S > 1 && fsdp_reshards_after_forward(f, u)) CHECK(up[u] == NULL, "%s unit %d resharded", tag, u);
    }
    /* backward: grads of batch rank b are (b + 1) * value; two microbatches */
    for (int mb = 0; mb < 2; mb++) {
        for (int u = t.n_units - 1; u >= 0; u--) {
            fsdp_pre_backward(f, u);
            fsdp_pre_backward_weight(f, u);
            CHECK(up[u] != NULL && ug[u] != NULL, "%s unit %d bound in backward", tag, u);
            int g = transient_gathered(up, f, t.n_units);
            if (g > worst) worst = g;
            for (size_t j = 0; ug[u] && j < t.unit_numel[u]; j++)
                ug[u][j] += (float)(batch_rank + 1) * toy_value(t.unit_offset[u] + j);
            fsdp_post_backward_weight(f, u, mb == 1);
        }
    }
    fsdp_finish_grads(f);
    CHECK(worst <= 2, "%s %d transient units gathered at once", tag, worst);
    /* the global gradient: 2 microbatches x sum over batch ranks (b + 1) */
    const int nb = S * R;
    const float factor = 2.0f * (float)(nb * (nb + 1) / 2);
    const float *g = fsdp_grad(f);
    int bad = 0;
    double sq = 0.0;
    for (int i = 0; i < t.n_params; i++) {
        if (!ts[i].n_pieces) continue;
        for (size_t k = 0; k < ts[i].piece.count; k++) {
            float want = factor * toy_value(t.decl[i].offset + ts[i].piece.start + k);
            bad += g[ts[i].piece.local_offset + k] != want;
        }
    }
    for (size_t j = 0; j < t.total; j++) sq += (double)(factor * toy_value(j)) * (double)(factor * toy_value(j));
    CHECK(!bad, "%s reduced gradient: %d wrong", tag, bad);
    double norm2 = fsdp_grad_sq_norm(f);
    CHECK(fabs(norm2 - sq) <= 1e-6 * sq, "%s grad norm^2 %.9g want %.9g", tag, norm2, sq);

    /* an update of the master shard reaches the gathered copy */
    float *m = fsdp_master(f);
    for (size_t j = 0; j < local; j++) m[j] *= 2.0f;
    fsdp_params_updated(f);
    fsdp_pre_forward(f, 2);
    bad = 0;
    for (size_t j = 0; j < t.unit_numel[2]; j++) bad += ((float *)up[2])[j] != 2.0f * toy_value(t.unit_offset[2] + j);
    CHECK(!bad, "%s regathered after update: %d wrong", tag, bad);
    fsdp_post_forward(f, 2);
    CHECK(fsdp_reshards_after_forward(f, t.n_units - 1) == (S > 1 && mode == FSDP_RESHARD_ALWAYS),
          "%s last unit reshard rule", tag);

    /* memory: the working parameters are the resident units plus two slots of the
     * largest transient unit, never the whole model (unless every unit is resident) */
    fsdp_memory mr = fsdp_memory_report(f);
    CHECK(mr.param_bytes == local * sizeof(float) && mr.optim_bytes == 2 * mr.param_bytes, "memory report");
    if (S > 1) {
        size_t resident = 0, max_transient = 0;
        int n_resident = 0;
        for (int u = 0; u < t.n_units; u++) {
            size_t padded = (t.unit_numel[u] + (size_t)S - 1) / (size_t)S * (size_t)S * sizeof(float);
            if (!fsdp_reshards_after_forward(f, u)) {
                resident += (padded + 63) & ~(size_t)63;
                n_resident++;
            } else if (padded > max_transient) {
                max_transient = padded;
            }
        }
        size_t want = resident + 2 * ((max_transient + 63) & ~(size_t)63) * (max_transient > 0);
        CHECK(mr.work_param_bytes == want && mr.resident_units == n_resident,
              "%s working parameters %zu bytes (%d resident), want %zu (%d)", tag, mr.work_param_bytes,
              mr.resident_units, want, n_resident);
    } else {
        CHECK(mr.work_param_bytes == 0 && mr.work_grad_bytes == 0, "%s no working buffers at shard degree 1", tag);
    }
    fsdp_free(f);
}

static void run_mesh(int world, int rep, int shard, int cp, int tp, const char *mname) {
    mesh m;
    char err[512];
    if (mesh_init(&m, world, 1, rep, shard, cp, tp, err, sizeof err)) {
        CHECK(0, "%s", err);
        return;
    }
    comm_options o;
    memset(&o, 0, sizeof o);
    o.backend = COMM_BACKEND_MPI;
    o.init_timeout_s = 60;
    o.train_timeout_s = 60;
    comm_world *w = comm_world_create(&m, check_rank, &o, err, sizeof err);
    CHECK(w != NULL, "%s", err);
    if (!w) return;
    for (int g = 0; g < MESH_N_GROUPS; g++) test_group(comm_get(w, (mesh_group_id)g), mname);
    if (cp == 1 && tp == 1) {
        test_fsdp(w, mname, FSDP_RESHARD_DEFAULT, 0);
        test_fsdp(w, mname, FSDP_RESHARD_ALWAYS, 0);
        test_fsdp(w, mname, FSDP_RESHARD_NEVER, 0);
        test_fsdp(w, mname, FSDP_RESHARD_DEFAULT, 1);
        test_fsdp(w, mname, FSDP_RESHARD_ALWAYS, 1);
    }
    comm_world_free(w);
}

/* ---- MPI on "device" buffers: the staging table's copies, counted. Here the device is
 * host memory, so every check of test_group holds as it is; the counters show that the
 * staged path moved the bytes, that the page-locked blocks are reused and all released. */
static struct {
    long allocs, releases;
    size_t to_host, to_device, device_copies;
} staged;

static void *st_alloc(size_t bytes) {
    staged.allocs++;
    return malloc(bytes);
}
static void st_release(void *p) {
    staged.releases++;
    free(p);
}
static void st_to_host(void *dst, const void *src, size_t bytes) {
    staged.to_host += bytes;
    memcpy(dst, src, bytes);
}
static void st_to_device(void *dst, const void *src, size_t bytes) {
    staged.to_device += bytes;
    memcpy(dst, src, bytes);
}
static void st_device_copy(void *dst, const void *src, size_t bytes) {
    staged.device_copies += bytes;
    memmove(dst, src, bytes);
}
static const comm_device_staging staging_table = {st_alloc, st_release, st_to_host, st_to_device, st_device_copy};

static void run_mesh_staged(int world, int rep, int shard, int cp, int tp, const char *mname) {
    mesh m;
    char err[512];
    if (mesh_init(&m, world, 1, rep, shard, cp, tp, err, sizeof err)) {
        CHECK(0, "%s", err);
        return;
    }
    comm_options o;
    memset(&o, 0, sizeof o);
    o.backend = COMM_BACKEND_MPI;
    o.staging = &staging_table;
    o.init_timeout_s = 60;
    o.train_timeout_s = 60;
    memset(&staged, 0, sizeof staged);
    comm_world *w = comm_world_create(&m, check_rank, &o, err, sizeof err);
    CHECK(w != NULL, "%s", err);
    if (!w) return;
    for (int g = 0; g < MESH_N_GROUPS; g++) test_group(comm_get(w, (mesh_group_id)g), mname);
    /* a batch of sends and receives around the world ring, both directions at once */
    comm_group *gw = comm_get(w, MESH_G_WORLD);
    const int n = comm_group_size(gw), me = comm_group_rank(gw);
    if (n > 1) {
        float out[3][64], in[2][64];
        for (int i = 0; i < 64; i++) out[0][i] = out[1][i] = val(me, (size_t)i);
        comm_p2p_op ops[4] = {{0, out[0], 64, COMM_F32, (me + 1) % n},
                              {1, in[0], 64, COMM_F32, (me + n - 1) % n},
                              {1, in[1], 64, COMM_F32, (me + 1) % n},
                              {0, out[1], 64, COMM_F32, (me + n - 1) % n}};
        comm_batch_p2p(gw, ops, 4, NULL);
        CHECK(in[0][5] == val((me + n - 1) % n, 5) && in[1][5] == val((me + 1) % n, 5), "%s batch_p2p: %g %g", mname,
              in[0][5], in[1][5]);
    }
    const long allocs = staged.allocs;
    comm_world_free(w);
    if (world > 1) {
        CHECK(staged.to_host > 0 && staged.to_device > 0, "%s: staged %zu bytes out, %zu back", mname, staged.to_host,
              staged.to_device);
        /* test_group keeps at most two operations in flight: blocks are reused */
        CHECK(allocs >= 1 && allocs <= 4, "%s: %ld page-locked blocks for the whole test", mname, allocs);
    }
    CHECK(staged.releases == staged.allocs, "%s: %ld blocks allocated, %ld released", mname, staged.allocs,
          staged.releases);
    /* groups of one copy on the device, never through the host */
    CHECK(world > 1 || (staged.to_host == 0 && staged.device_copies > 0), "%s: one rank staged %zu bytes", mname,
          staged.to_host);
}

static int stuck_test(int world) {
    mesh m;
    char err[512];
    if (world < 2 || mesh_init(&m, world, 1, 1, -1, 1, 1, err, sizeof err)) {
        fprintf(stderr, "stuck test needs at least 2 ranks\n");
        return 2;
    }
    comm_options o;
    memset(&o, 0, sizeof o);
    o.init_timeout_s = 2;
    o.train_timeout_s = 2;
    comm_world *w = comm_world_create(&m, check_rank, &o, err, sizeof err);
    if (!w) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    comm_group *g = comm_get(w, MESH_G_FSDP);
    float x[4] = {1, 2, 3, 4}, y[64];
    comm_set_step(w, 7);
    comm_all_gather(g, y, x, 4, COMM_F32, NULL); /* everybody */
    if (check_rank != 1) {
        comm_all_gather(g, y, x, 4, COMM_F32, NULL); /* rank 1 never arrives */
        fprintf(stderr, "rank %d: the stuck collective returned\n", check_rank);
    } else {
        sleep(60); /* stuck elsewhere (a hung kernel, a dead host): the others must end the job */
    }
    comm_world_free(w);
    return 3;
}

int main(int argc, char **argv) {
    int provided = 0, world = 1;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &check_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const char *stuck = getenv("TETRA_COMM_TEST_STUCK");
    if (stuck && !strcmp(stuck, "1")) {
        int rc = stuck_test(world);
        MPI_Finalize();
        return rc;
    }
    if (world == 1) {
        run_mesh(1, 1, -1, 1, 1, "single");
        run_mesh_staged(1, 1, -1, 1, 1, "single staged");
    } else if (world == 4) {
        run_mesh(4, 1, -1, 1, 1, "fsdp4");
        run_mesh(4, 2, 2, 1, 1, "hsdp2x2");
        run_mesh(4, 4, 1, 1, 1, "ddp4");
        run_mesh(4, 1, 1, 2, 2, "cp2xtp2");
        run_mesh(4, 1, 2, 1, 2, "fsdp2xtp2");
        run_mesh_staged(4, 2, 2, 1, 1, "hsdp2x2 staged");
        run_mesh_staged(4, 1, 1, 2, 2, "cp2xtp2 staged");
    } else {
        run_mesh(world, 1, -1, 1, 1, "fsdp");
        run_mesh(world, world, 1, 1, 1, "ddp");
        run_mesh_staged(world, 1, -1, 1, 1, "fsdp staged");
    }
    int f = failures, all = 0, c = checks;
    MPI_Allreduce(&f, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (check_rank == 0) printf("test_comm_mpi: %d ranks, %d checks per rank, %d failures\n", world, c, all);
    MPI_Finalize();
    return all ? 1 : 0;
}
