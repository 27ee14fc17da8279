/* The NCCL backend of comm.h on GPUs (see README.md in this folder).
 *
 *   build/tests/test_comm_nccl                        one GPU: every operation
 *                                                     on a one-rank NCCL communicator
 *   mpirun -np 4 build/tests/test_comm_nccl           one rank per GPU: every
 *                                                     collective of every group of
 *                                                     fsdp N, hsdp 2 x N/2, ddp N
 *   TETRA_COMM_TEST_STUCK=1 mpirun -np 2 ...          a stuck collective must end
 *                                                     the job within 2 s (the watchdog:
 *                                                     the host is blocked reading its result)
 *
 * Without a GPU (or with more ranks than GPUs) it says why and exits 0.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/comm.h"
#include "parallel/comm_nccl.h"
#include "parallel/mesh.h"
#include "tests/check.h"

static float val(int r, size_t i) { return (float)((r + 1) * 10 + (int)(i % 7)); }

static float *dev(size_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return p;
}
static void up(float *d, const float *h, size_t n) { cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice); }
static void down(float *h, const float *d, size_t n) { cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost); }

/* Every operation through the backend's C interface on a one-rank communicator. */
static void test_single_rank_nccl(void) {
    char err[512];
    unsigned char id[TETRA_NCCL_ID_BYTES];
    CHECK(tetra_nccl_set_device(0, err, sizeof err) == 0, "%s", err);
    CHECK(tetra_nccl_get_unique_id(id, err, sizeof err) == 0, "%s", err);
    void *c = tetra_nccl_comm_init(id, 1, 0, 60, err, sizeof err);
    CHECK(c != NULL, "%s", err);
    if (!c) return;
    const size_t n = 4096;
    float *h = malloc(n * sizeof(float)), *a = dev(n), *b = dev(n);
    for (size_t i = 0; i < n; i++) h[i] = val(0, i);
    up(a, h, n);
    const comm_kind kinds[] = {COMMK_ALL_REDUCE, COMMK_REDUCE_SCATTER, COMMK_ALL_GATHER, COMMK_BROADCAST,
                               COMMK_ALL_TO_ALL, COMMK_SENDRECV,       COMMK_BARRIER};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        cudaMemset(b, 0, n * sizeof(float));
        const int inplace = kinds[k] == COMMK_ALL_REDUCE || kinds[k] == COMMK_BROADCAST;
        if (inplace) cudaMemcpy(b, a, n * sizeof(float), cudaMemcpyDeviceToDevice);
        /* after the legacy default stream, where the copies above ran */
        void *ev =
            tetra_nccl_start(c, kinds[k], b, inplace ? b : a, n, COMM_F32, COMM_SUM, 0, 0, 1, NULL, err, sizeof err);
        CHECK(ev != NULL, "kind %d: %s", (int)kinds[k], err);
        int st = 0;
        while (ev && (st = tetra_nccl_poll(c, ev, err, sizeof err)) == 0) {
        }
        CHECK(st == 1, "kind %d poll: %s", (int)kinds[k], err);
        tetra_nccl_event_release(ev);
        if (kinds[k] != COMMK_BARRIER) {
            down(h, b, n);
            CHECK(h[123] == val(0, 123), "kind %d: %g", (int)kinds[k], h[123]);
        }
    }
    /* AVG on one rank is the identity */
    void *ev = tetra_nccl_start(c, COMMK_ALL_REDUCE, a, a, n, COMM_F32, COMM_AVG, 0, 0, 1, NULL, err, sizeof err);
    CHECK(ev != NULL, "%s", err);
    /* the legacy default stream (the blocking copy below) waits for it, the host does not */
    CHECK(ev && tetra_nccl_order(ev, NULL, err, sizeof err) == 0, "%s", err);
    down(h, a, n);
    CHECK(h[5] == val(0, 5), "avg %g", h[5]);
    CHECK(ev && tetra_nccl_poll(c, ev, err, sizeof err) == 1, "the ordered all-reduce is complete after the copy");
    tetra_nccl_event_release(ev);
    /* a grouped send and receive to itself: one group, an event per op */
    comm_p2p_op pair[2] = {{0, a, n, COMM_F32, 0}, {1, b, n, COMM_F32, 0}};
    void *evs[2] = {NULL, NULL};
    cudaMemset(b, 0, n * sizeof(float));
    CHECK(tetra_nccl_start_p2p(c, 2, pair, NULL, evs, err, sizeof err) == 0, "start_p2p: %s", err);
    for (int i = 0; i < 2; i++) {
        int st = 0;
        while (evs[i] && (st = tetra_nccl_poll(c, evs[i], err, sizeof err)) == 0) {
        }
        CHECK(st == 1, "p2p op %d poll: %s", i, err);
        tetra_nccl_event_release(evs[i]);
    }
    down(h, b, n);
    CHECK(h[77] == val(0, 77), "p2p to itself: %g", h[77]);
    cudaFree(a);
    cudaFree(b);
    free(h);
    tetra_nccl_comm_destroy(c);
}

static void test_group(comm_group *g, const char *mname) {
    const int n = comm_group_size(g), me = comm_group_rank(g);
    const char *gn = comm_group_name(g);
    const size_t cnt = 1000;
    float *h = malloc(cnt * (size_t)n * sizeof(float)), *a = dev(cnt * (size_t)n), *b = dev(cnt * (size_t)n);

    for (size_t i = 0; i < cnt; i++) h[i] = val(me, i);
    up(a, h, cnt);
    comm_all_reduce(g, a, cnt, COMM_F32, COMM_SUM, NULL);
    down(h, a, cnt);
    int bad = 0;
    for (size_t i = 0; i < cnt; i++) {
        float want = 0;
        for (int r = 0; r < n; r++) want += val(r, i);
        bad += h[i] != want;
    }
    CHECK(!bad, "%s %s all_reduce: %d wrong", mname, gn, bad);

    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < cnt; i++) h[(size_t)j * cnt + i] = val(me, (size_t)j * cnt + i);
    up(a, h, cnt * (size_t)n);
    comm_request *r = NULL;
    comm_reduce_scatter(g, b, a, cnt, COMM_F32, COMM_SUM, &r);
    comm_wait(r);
    down(h, b, cnt);
    bad = 0;
    for (size_t i = 0; i < cnt; i++) {
        float want = 0;
        for (int q = 0; q < n; q++) want += val(q, (size_t)me * cnt + i);
        bad += h[i] != want;
    }
    CHECK(!bad, "%s %s reduce_scatter: %d wrong", mname, gn, bad);

    for (size_t i = 0; i < cnt; i++) h[i] = val(me, i);
    up(a, h, cnt);
    comm_all_gather(g, b, a, cnt, COMM_F32, NULL);
    down(h, b, cnt * (size_t)n);
    bad = 0;
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++) bad += h[(size_t)q * cnt + i] != val(q, i);
    CHECK(!bad, "%s %s all_gather: %d wrong", mname, gn, bad);

    for (size_t i = 0; i < cnt; i++) h[i] = val(me, i);
    up(a, h, cnt);
    comm_broadcast(g, a, cnt, COMM_F32, n - 1, NULL);
    down(h, a, cnt);
    CHECK(h[11] == val(n - 1, 11), "%s %s broadcast %g", mname, gn, h[11]);

    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < cnt; i++) h[(size_t)j * cnt + i] = (float)(100 * me + j);
    up(a, h, cnt * (size_t)n);
    comm_all_to_all(g, b, a, cnt, COMM_F32, NULL);
    down(h, b, cnt * (size_t)n);
    bad = 0;
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++) bad += h[(size_t)q * cnt + i] != (float)(100 * q + me);
    CHECK(!bad, "%s %s all_to_all: %d wrong", mname, gn, bad);

    if (n > 1) {
        comm_request *rs = NULL, *rr = NULL;
        for (size_t i = 0; i < cnt; i++) h[i] = val(me, i);
        up(a, h, cnt);
        /* NCCL pairs a send and a receive only when both are in flight: issue both, then wait */
        if (me % 2 == 0) {
            comm_send(g, a, cnt, COMM_F32, (me + 1) % n, &rs);
            comm_recv(g, b, cnt, COMM_F32, (me + n - 1) % n, &rr);
        } else {
            comm_recv(g, b, cnt, COMM_F32, (me + n - 1) % n, &rr);
            comm_send(g, a, cnt, COMM_F32, (me + 1) % n, &rs);
        }
        comm_wait(rs);
        comm_wait(rr);
        down(h, b, cnt);
        CHECK(h[2] == val((me + n - 1) % n, 2), "%s %s ring %g", mname, gn, h[2]);
    }
    double mx = comm_all_reduce_f64(g, (double)me, COMM_MAX);
    CHECK(mx == n - 1, "%s %s host scalar max %g", mname, gn, mx);
    comm_barrier(g, NULL);
    cudaFree(a);
    cudaFree(b);
    free(h);
}

static void run_mesh(int world, int rep, int shard, const char *mname) {
    mesh m;
    char err[512];
    if (mesh_init(&m, world, 1, rep, shard, 1, 1, err, sizeof err)) {
        CHECK(0, "%s", err);
        return;
    }
    comm_options o;
    memset(&o, 0, sizeof o);
    o.backend = COMM_BACKEND_NCCL;
    o.init_timeout_s = 120;
    o.train_timeout_s = 120;
    o.cuda_device = -1;
    comm_world *w = comm_world_create(&m, check_rank, &o, err, sizeof err);
    CHECK(w != NULL, "%s", err);
    if (!w) return;
    for (int g = 0; g < MESH_N_GROUPS; g++) test_group(comm_get(w, (mesh_group_id)g), mname);
    comm_world_free(w);
}

static int stuck_test(int world) {
    mesh m;
    char err[512];
    if (world < 2 || mesh_init(&m, world, 1, 1, -1, 1, 1, err, sizeof err)) return 2;
    comm_options o;
    memset(&o, 0, sizeof o);
    o.backend = COMM_BACKEND_NCCL;
    o.init_timeout_s = 60;
    o.train_timeout_s = 2;
    o.cuda_device = -1;
    comm_world *w = comm_world_create(&m, check_rank, &o, err, sizeof err);
    if (!w) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    comm_set_phase_training(w);
    comm_set_step(w, 7);
    float *a = dev(4 * (size_t)world);
    comm_group *g = comm_get(w, MESH_G_FSDP);
    if (check_rank != 1) {
        /* comm_wait only orders the compute stream (here the legacy one) after it: the
         * host goes on, and blocks for ever at the first read of the result, unless the
         * watchdog ends the job */
        comm_all_gather(g, a, a, 4, COMM_F32, NULL);
        float h[4];
        down(h, a, 4);
    } else {
        sleep(60);
    }
    fprintf(stderr, "rank %d: the stuck collective returned\n", check_rank);
    return 3;
}

int main(int argc, char **argv) {
    int provided = 0, world = 1;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &check_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int ndev = tetra_nccl_built() ? tetra_nccl_device_count() : 0;
    int min_dev = ndev;
    MPI_Allreduce(&ndev, &min_dev, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!tetra_nccl_built() || min_dev == 0 || world > min_dev) {
        if (check_rank == 0)
            printf("test_comm_nccl: SKIP: %s\n",
                   !tetra_nccl_built() ? "this build has no NCCL backend"
                       : min_dev == 0  ? "no CUDA device visible"
                                       : "more ranks than GPUs on a host (NCCL needs one GPU per rank)");
        MPI_Finalize();
        return 0;
    }
    const char *stuck = getenv("TETRA_COMM_TEST_STUCK");
    if (stuck && !strcmp(stuck, "1")) {
        int rc = stuck_test(world);
        MPI_Finalize();
        return rc;
    }
    if (world == 1) test_single_rank_nccl();
    run_mesh(world, 1, -1, "fsdp");
    run_mesh(world, world, 1, "ddp");
    if (world % 2 == 0 && world > 2) run_mesh(world, 2, -1, "hsdp");
    int f = failures, all = 0;
    MPI_Allreduce(&f, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (check_rank == 0) printf("test_comm_nccl: %d ranks, %d checks per rank, %d failures\n", world, checks, all);
    MPI_Finalize();
    return all ? 1 : 0;
}
