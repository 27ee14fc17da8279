/* plan_calibrate.c — measure this machine as a hardware profile (plan_calibrate.h). */
#include "engine/plan_calibrate.h"

#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/metrics.h"
#include "kernels/ops.h"
#include "util/err.h"

/* Sizes: GEMMs big enough to leave the cache-bound regime on any CPU, arrays
 * several times any last-level cache, messages past MPI's eager/rendezvous
 * switch by orders of magnitude. */
static const int gemm_sizes[] = {1024, 1536, 2048};
enum { GEMM_REPS = 4, TRIAD_REPS = 5, MPI_REPS = 5 };
#define TRIAD_BYTES ((size_t)128 << 20) /* per array; three arrays */
#define P2P_BYTES ((size_t)32 << 20)
#define ALLREDUCE_BYTES ((size_t)64 << 20)

static void say(FILE *log, const char *fmt, ...) {
    if (!log) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("calibrate: ", log);
    vfprintf(log, fmt, ap);
    fputc('\n', log);
    fflush(log);
    va_end(ap);
}

/* Resident set size now, from /proc (getrusage only knows the peak). -1 when unknown. */
static double vm_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    double kib = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) {
            kib = strtod(line + 6, NULL);
            break;
        }
    fclose(f);
    return kib < 0 ? -1 : kib * 1024.0;
}

/* The slowest rank's rate: a synchronous step waits for it. Ranks that did not
 * measure (rate <= 0) pass +inf so they do not count. */
static double min_over_ranks(double rate) {
    double r = rate > 0 ? rate : INFINITY, out = 0;
    MPI_Allreduce(&r, &out, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    return isfinite(out) ? out : 0;
}

/* Best FLOP/s of an n^3 fp32 GEMM on this rank, every rank multiplying at once. */
static double gemm_rate(const tetra_ops *ops, float *a, float *b, float *c, int n) {
    ops_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.a_type = g.b_type = g.c_type = TETRA_F32;
    g.m = g.n = g.k = n;
    g.lda = g.ldb = g.ldc = n;
    g.alpha = 1.0f;
    double best = INFINITY;
    for (int rep = 0; rep <= GEMM_REPS; rep++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        ops->gemm(c, a, b, &g);
        ops->synchronize();
        double dt = MPI_Wtime() - t0;
        if (rep > 0 && dt < best) best = dt; /* the first call pages in C and wakes the threads */
    }
    return 2.0 * (double)n * (double)n * (double)n / best;
}

/* Best STREAM triad bytes/s (a = b + s c, 3 x 4 bytes an element, as STREAM counts). */
static double triad_rate(float *a, float *b, float *c, size_t n) {
    double best = INFINITY;
    const float s = 3.0f;
    for (int rep = 0; rep <= TRIAD_REPS; rep++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        double dt = MPI_Wtime() - t0;
        if (rep > 0 && dt < best) best = dt;
    }
    return 3.0 * sizeof(float) * (double)n / best;
}

/* Per-rank, per-direction bytes/s of a ring exchange in comm: each rank sends
 * `bytes` to the next and receives as many from the previous, all at once.
 * 0 when comm has one rank. */
static double ring_rate(MPI_Comm comm, const void *send, void *recv, size_t bytes) {
    int size = 1, rank = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank);
    if (size < 2) return 0;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    double best = INFINITY;
    for (int rep = 0; rep <= MPI_REPS; rep++) {
        MPI_Barrier(comm);
        double t0 = MPI_Wtime();
        MPI_Sendrecv(send, (int)bytes, MPI_BYTE, next, 0, recv, (int)bytes, MPI_BYTE, prev, 0, comm,
                     MPI_STATUS_IGNORE);
        double dt = MPI_Wtime() - t0;
        if (rep > 0 && dt < best) best = dt; /* the first maps the shared-memory segments */
    }
    return (double)bytes / best;
}

/* Best all-reduce time of `bytes` of fp32 over the world, in seconds. */
static double allreduce_time(float *buf, size_t bytes) {
    double best = INFINITY;
    for (int rep = 0; rep <= MPI_REPS; rep++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)(bytes / sizeof(float)), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double dt = MPI_Wtime() - t0;
        if (rep > 0 && dt < best) best = dt;
    }
    return best;
}

/* Host memory this process may use: physical memory, or a container's memory
 * limit (cgroup v2, then v1) when that is lower. 0 when unknown. */
static double host_memory_bytes(void) {
    double mem = (double)metrics_host_memory_bytes();
    static const char *limits[] = {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        FILE *f = fopen(limits[i], "r");
        if (!f) continue;
        char line[64] = "";
        char *end = NULL;
        double lim = fgets(line, sizeof line, f) ? strtod(line, &end) : 0; /* "max" parses as no number */
        fclose(f);
        if (end != line && lim > 0 && (mem <= 0 || lim < mem)) mem = lim;
    }
    return mem > 0 ? mem : 0;
}

static double gib(double bytes) { return bytes / 1073741824.0; }

int plan_calibrate(plan_hw *out, const plan_hw *base, int threads, FILE *log, char *err, size_t errlen) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        util_set_err(err, errlen, "calibrate: MPI is not initialised");
        return -1;
    }
    /* Before any buffer of ours: what the process holds with nothing of the model in it. */
    const double rss0 = vm_rss_bytes();

    int world = 1, rank = 0, local = 1, local_rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm node, across;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local);
    MPI_Comm_rank(node, &local_rank);
    /* ranks with the same place on each node: the pairs that talk across the network */
    MPI_Comm_split(MPI_COMM_WORLD, local_rank, rank, &across);
    int nodes = 1;
    MPI_Comm_size(across, &nodes);

    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (threads <= 0) threads = (int)((cores > 0 ? cores : 1) / local);
    if (threads < 1) threads = 1;
    const int threads_before = omp_get_max_threads();
    omp_set_num_threads(threads);

    const double host = host_memory_bytes();
    say(log, "%d rank%s (%d per node, %d node%s), %d thread%s per rank, %ld cores per node", world,
        world > 1 ? "s" : "", local, nodes, nodes > 1 ? "s" : "", threads, threads > 1 ? "s" : "", cores);

    char why[256] = "";
    const tetra_ops *ops = ops_get("cpu", why, sizeof why);
    /* Arrays for the triad, reused as GEMM operands and MPI buffers; smaller on
     * a host where three of them per rank would crowd out the rest. */
    size_t triad_bytes = TRIAD_BYTES;
    while (host > 0 && triad_bytes > ((size_t)16 << 20) && 3.0 * (double)triad_bytes * local > host / 4)
        triad_bytes /= 2;
    const int nmax = gemm_sizes[sizeof gemm_sizes / sizeof gemm_sizes[0] - 1];
    size_t bytes = triad_bytes;
    if (bytes < (size_t)nmax * nmax * sizeof(float)) bytes = (size_t)nmax * nmax * sizeof(float);
    if (bytes < ALLREDUCE_BYTES) bytes = ALLREDUCE_BYTES;
    float *a = NULL, *b = NULL, *c = NULL;
    if (ops) {
        a = ops->alloc(bytes);
        b = ops->alloc(bytes);
        c = ops->alloc(bytes);
        if (!a || !b || !c) snprintf(why, sizeof why, "out of memory for 3 x %.0f MiB", bytes / 1048576.0);
    }
    int ok = ops && a && b && c, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    int rc = -1;
    if (!all_ok) {
        if (ok) util_set_err(err, errlen, "calibrate: another rank could not set up its buffers");
        else util_set_err(err, errlen, "calibrate: rank %d: %s", rank, why);
        goto done;
    }

    /* first touch by the threads that will stream them (NUMA placement) */
    const size_t n = bytes / sizeof(float);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        a[i] = 0.0f;
        b[i] = 1.0f / (float)(1 + i % 17);
        c[i] = 0.5f;
    }

    double flops = 0;
    for (size_t s = 0; s < sizeof gemm_sizes / sizeof gemm_sizes[0]; s++) {
        const int m = gemm_sizes[s];
        double r = min_over_ranks(gemm_rate(ops, b, c, a, m));
        say(log, "fp32 gemm %dx%dx%d: %.1f GFLOP/s per rank (slowest rank)", m, m, m, r / 1e9);
        if (r > flops) flops = r;
    }

    const size_t tn = triad_bytes / sizeof(float);
    const double mem_bw = min_over_ranks(triad_rate(a, b, c, tn));
    say(log, "memory (STREAM triad, 3 x %.0f MiB per rank): %.2f GB/s per rank", triad_bytes / 1048576.0,
        mem_bw / 1e9);

    double intra = min_over_ranks(ring_rate(node, b, a, P2P_BYTES));
    if (intra > 0)
        say(log, "point-to-point within a node (%.0f MiB messages, %d ranks at once): %.2f GB/s per rank per direction",
            P2P_BYTES / 1048576.0, local, intra / 1e9);
    double inter = min_over_ranks(ring_rate(across, b, a, P2P_BYTES));
    if (inter > 0)
        say(log, "point-to-point between nodes (%.0f MiB messages): %.2f GB/s per rank per direction",
            P2P_BYTES / 1048576.0, inter / 1e9);
    if (intra <= 0 && inter <= 0) {
        intra = inter = mem_bw / 2; /* one rank: a copy in memory reads and writes each byte */
        say(log, "one rank: link bandwidth taken as half the memory bandwidth, %.2f GB/s", intra / 1e9);
    } else if (intra <= 0) {
        intra = mem_bw / 2;
        say(log, "one rank per node: within-node bandwidth taken as half the memory bandwidth, %.2f GB/s",
            intra / 1e9);
    } else if (inter <= 0) {
        inter = intra;
        say(log, "one node: between-node bandwidth taken as the within-node one");
    }
    if (world > 1) {
        double t = allreduce_time(a, ALLREDUCE_BYTES);
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double algbw = (double)ALLREDUCE_BYTES / t, busbw = algbw * 2.0 * (world - 1) / world;
        say(log,
            "all-reduce (%.0f MiB fp32, %d ranks): algorithm bandwidth %.2f GB/s, bus bandwidth %.2f GB/s "
            "(%.2f of point-to-point; the profile's comm_efficiency is %.2f)",
            ALLREDUCE_BYTES / 1048576.0, world, algbw / 1e9, busbw / 1e9, busbw / (nodes > 1 ? inter : intra),
            nodes > 1 ? base->inter_node_comm_efficiency : base->comm_efficiency);
    }

    /* The reserve: what the process holds besides its buffers. On entry that is the
     * executable, its libraries and MPI; once the buffers are released, the thread
     * pool, OpenBLAS's buffers and MPI's shared-memory segments have joined it, as
     * they will in training. The largest rank's, so the plan is safe on all. */
    ops->release(a);
    ops->release(b);
    ops->release(c);
    a = b = c = NULL;
    const double rss1 = vm_rss_bytes();
    double reserved = rss1 > rss0 ? rss1 : rss0 > 0 ? rss0 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &reserved, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    say(log, "resident memory besides the buffers: %.1f MiB (largest rank; %.1f MiB on entry)", reserved / 1048576.0,
        (rss0 > 0 ? rss0 : 0) / 1048576.0);

    /* Nodes may differ: the fullest node's ranks, the smallest node's memory. */
    int most_local = local;
    MPI_Allreduce(MPI_IN_PLACE, &most_local, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    double host_min = host > 0 ? host : INFINITY;
    MPI_Allreduce(MPI_IN_PLACE, &host_min, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    if (!isfinite(host_min)) host_min = 0;

    say(log, "host memory: %.2f GiB (the smallest node's, or its container limit)", gib(host_min));
    if (!(flops > 0) || !(mem_bw > 0) || !(host_min > 0)) {
        util_set_err(err, errlen, "calibrate: a measurement failed (gemm %g FLOP/s, memory %g B/s, host memory %g B)",
                flops, mem_bw, host_min);
        goto done;
    }
    plan_hw hw = *base;
    snprintf(hw.name, sizeof hw.name, "cpu");
    char hostname[64] = "this host", date[32] = "";
    gethostname(hostname, sizeof hostname);
    hostname[sizeof hostname - 1] = 0;
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(date, sizeof date, "%Y-%m-%d", &tm);
    snprintf(hw.description, sizeof hw.description,
             "CPU backend measured by tetra on %s, %s: %d rank%s per node x %d thread%s, fp32", hostname, date,
             local, local > 1 ? "s" : "", threads, threads > 1 ? "s" : "");
    hw.path[0] = 0;
    hw.peak_bf16_flops = flops; /* the CPU computes bf16 in fp32 */
    hw.peak_fp32_flops = flops;
    hw.peak_fp8_flops = 0;
    /* gemm_efficiency stays the base's: the peak is a measured square GEMM, the factor is
     * what the models' thinner GEMMs reach of it */
    hw.memory_bytes = host_min;
    hw.memory_bandwidth = mem_bw;
    hw.intra_node_bandwidth = intra;
    hw.inter_node_bandwidth = inter;
    hw.gpus_per_node = most_local;
    hw.reserved_bytes = reserved;
    *out = hw;
    rc = 0;

done:
    if (ops) {
        ops->release(a);
        ops->release(b);
        ops->release(c);
    }
    MPI_Comm_free(&across);
    MPI_Comm_free(&node);
    omp_set_num_threads(threads_before);
    return rc;
}
