/* calibrate.c — measure this machine as a hardware profile (calibrate.h). */
#include "plan/calibrate.h"

#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "telemetry/metrics.h"
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
        MPI_Sendrecv(send, (int)bytes, MPI_BYTE, next, 0, recv, (int)bytes, MPI_BYTE, prev, 0, comm, MPI_STATUS_IGNORE);
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

/* What the phases of plan_calibrate share: the job's layout, the buffers and the measurements. */
typedef struct calib {
    FILE *log;
    int world, rank, local, local_rank, nodes, threads;
    MPI_Comm node, across;
    long cores;
    double host; /* this host's memory, 0 when unknown */
    const tetra_ops *ops;
    float *a, *b, *c;
    size_t bytes, triad_bytes; /* each buffer; the triad's share of it */
    double flops, mem_bw, intra, inter;
} calib;

/* Ranks, ranks per node and nodes; the communicators within a node and across nodes. */
static void calib_layout(calib *C) {
    MPI_Comm_size(MPI_COMM_WORLD, &C->world);
    MPI_Comm_rank(MPI_COMM_WORLD, &C->rank);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, C->rank, MPI_INFO_NULL, &C->node);
    MPI_Comm_size(C->node, &C->local);
    MPI_Comm_rank(C->node, &C->local_rank);
    /* ranks with the same place on each node: the pairs that talk across the network */
    MPI_Comm_split(MPI_COMM_WORLD, C->local_rank, C->rank, &C->across);
    MPI_Comm_size(C->across, &C->nodes);
}

/* The three buffers on the CPU backend, first touched by the threads that will stream them. Collective:
 * -1 with err on every rank when any rank could not set up. */
static int calib_buffers(calib *C, char *err, size_t errlen) {
    char why[256] = "";
    C->ops = ops_get("cpu", why, sizeof why);
    /* Arrays for the triad, reused as GEMM operands and MPI buffers; smaller on
     * a host where three of them per rank would crowd out the rest. */
    size_t triad_bytes = TRIAD_BYTES;
    while (C->host > 0 && triad_bytes > ((size_t)16 << 20) && 3.0 * (double)triad_bytes * C->local > C->host / 4)
        triad_bytes /= 2;
    const int nmax = gemm_sizes[sizeof gemm_sizes / sizeof gemm_sizes[0] - 1];
    size_t bytes = triad_bytes;
    if (bytes < (size_t)nmax * nmax * sizeof(float)) bytes = (size_t)nmax * nmax * sizeof(float);
    if (bytes < ALLREDUCE_BYTES) bytes = ALLREDUCE_BYTES;
    C->triad_bytes = triad_bytes;
    C->bytes = bytes;
    if (C->ops) {
        C->a = C->ops->alloc(bytes);
        C->b = C->ops->alloc(bytes);
        C->c = C->ops->alloc(bytes);
        if (!C->a || !C->b || !C->c) snprintf(why, sizeof why, "out of memory for 3 x %.0f MiB", bytes / 1048576.0);
    }
    int ok = C->ops && C->a && C->b && C->c, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        if (ok) util_set_err(err, errlen, "calibrate: another rank could not set up its buffers");
        else util_set_err(err, errlen, "calibrate: rank %d: %s", C->rank, why);
        return -1;
    }

    /* first touch by the threads that will stream them (NUMA placement) */
    float *a = C->a, *b = C->b, *c = C->c;
    const size_t n = bytes / sizeof(float);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        a[i] = 0.0f;
        b[i] = 1.0f / (float)(1 + i % 17);
        c[i] = 0.5f;
    }
    return 0;
}

/* The best GEMM rate over the sizes, and the STREAM triad. */
static void measure_compute(calib *C) {
    C->flops = 0;
    for (size_t s = 0; s < sizeof gemm_sizes / sizeof gemm_sizes[0]; s++) {
        const int m = gemm_sizes[s];
        double r = min_over_ranks(gemm_rate(C->ops, C->b, C->c, C->a, m));
        say(C->log, "fp32 gemm %dx%dx%d: %.1f GFLOP/s per rank (slowest rank)", m, m, m, r / 1e9);
        if (r > C->flops) C->flops = r;
    }

    const size_t tn = C->triad_bytes / sizeof(float);
    C->mem_bw = min_over_ranks(triad_rate(C->a, C->b, C->c, tn));
    say(C->log, "memory (STREAM triad, 3 x %.0f MiB per rank): %.2f GB/s per rank", C->triad_bytes / 1048576.0,
        C->mem_bw / 1e9);
}

/* Point-to-point bandwidth within and between nodes (stand-ins where a level has one rank), and an
 * all-reduce logged against it. */
static void measure_links(calib *C, const plan_hw *base) {
    double intra = min_over_ranks(ring_rate(C->node, C->b, C->a, P2P_BYTES));
    if (intra > 0)
        say(C->log,
            "point-to-point within a node (%.0f MiB messages, %d ranks at once): %.2f GB/s per rank per direction",
            P2P_BYTES / 1048576.0, C->local, intra / 1e9);
    double inter = min_over_ranks(ring_rate(C->across, C->b, C->a, P2P_BYTES));
    if (inter > 0)
        say(C->log, "point-to-point between nodes (%.0f MiB messages): %.2f GB/s per rank per direction",
            P2P_BYTES / 1048576.0, inter / 1e9);
    if (intra <= 0 && inter <= 0) {
        intra = inter = C->mem_bw / 2; /* one rank: a copy in memory reads and writes each byte */
        say(C->log, "one rank: link bandwidth taken as half the memory bandwidth, %.2f GB/s", intra / 1e9);
    } else if (intra <= 0) {
        intra = C->mem_bw / 2;
        say(C->log, "one rank per node: within-node bandwidth taken as half the memory bandwidth, %.2f GB/s",
            intra / 1e9);
    } else if (inter <= 0) {
        inter = intra;
        say(C->log, "one node: between-node bandwidth taken as the within-node one");
    }
    C->intra = intra;
    C->inter = inter;
    const int world = C->world, nodes = C->nodes;
    if (world > 1) {
        double t = allreduce_time(C->a, ALLREDUCE_BYTES);
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double algbw = (double)ALLREDUCE_BYTES / t, busbw = algbw * 2.0 * (world - 1) / world;
        say(C->log,
            "all-reduce (%.0f MiB fp32, %d ranks): algorithm bandwidth %.2f GB/s, bus bandwidth %.2f GB/s "
            "(%.2f of point-to-point; the profile's comm_efficiency is %.2f)",
            ALLREDUCE_BYTES / 1048576.0, world, algbw / 1e9, busbw / 1e9, busbw / (nodes > 1 ? inter : intra),
            nodes > 1 ? base->inter_node_comm_efficiency : base->comm_efficiency);
    }
}

/* Releases the buffers and returns the reserve, the largest rank's (rss0: VmRSS on entry). */
static double measure_reserve(calib *C, double rss0) {
    /* The reserve: what the process holds besides its buffers. On entry that is the
     * executable, its libraries and MPI; once the buffers are released, the thread
     * pool, OpenBLAS's buffers and MPI's shared-memory segments have joined it, as
     * they will in training. The largest rank's, so the plan is safe on all. */
    C->ops->release(C->a);
    C->ops->release(C->b);
    C->ops->release(C->c);
    C->a = C->b = C->c = NULL;
    const double rss1 = vm_rss_bytes();
    double reserved = rss1 > rss0 ? rss1 : rss0 > 0 ? rss0 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &reserved, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    say(C->log, "resident memory besides the buffers: %.1f MiB (largest rank; %.1f MiB on entry)", reserved / 1048576.0,
        (rss0 > 0 ? rss0 : 0) / 1048576.0);
    return reserved;
}

/* The profile: base with the measured rates, memory and layout, named "cpu" with a description of
 * the host, the date and the layout. */
static plan_hw calib_profile(const calib *C, const plan_hw *base, double host_min, int most_local, double reserved) {
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
             C->local, C->local > 1 ? "s" : "", C->threads, C->threads > 1 ? "s" : "");
    hw.path[0] = 0;
    hw.peak_bf16_flops = C->flops; /* the CPU computes bf16 in fp32 */
    hw.peak_fp32_flops = C->flops;
    hw.peak_fp8_flops = 0;
    /* gemm_efficiency stays the base's: the peak is a measured square GEMM, the factor is
     * what the models' thinner GEMMs reach of it */
    hw.memory_bytes = host_min;
    hw.memory_bandwidth = C->mem_bw;
    hw.intra_node_bandwidth = C->intra;
    hw.inter_node_bandwidth = C->inter;
    hw.gpus_per_node = most_local;
    hw.reserved_bytes = reserved;
    return hw;
}

int plan_calibrate(plan_hw *out, const plan_hw *base, int threads, FILE *log, char *err, size_t errlen) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        util_set_err(err, errlen, "calibrate: MPI is not initialised");
        return -1;
    }
    /* Before any buffer of ours: what the process holds with nothing of the model in it. */
    const double rss0 = vm_rss_bytes();

    calib C = {.log = log, .world = 1, .local = 1, .nodes = 1};
    calib_layout(&C);

    C.cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (threads <= 0) threads = (int)((C.cores > 0 ? C.cores : 1) / C.local);
    if (threads < 1) threads = 1;
    C.threads = threads;
    const int threads_before = omp_get_max_threads();
    omp_set_num_threads(threads);

    C.host = host_memory_bytes();
    say(log, "%d rank%s (%d per node, %d node%s), %d thread%s per rank, %ld cores per node", C.world,
        C.world > 1 ? "s" : "", C.local, C.nodes, C.nodes > 1 ? "s" : "", threads, threads > 1 ? "s" : "", C.cores);

    int rc = -1;
    if (calib_buffers(&C, err, errlen)) goto done;
    measure_compute(&C);
    measure_links(&C, base);
    const double reserved = measure_reserve(&C, rss0);

    /* Nodes may differ: the fullest node's ranks, the smallest node's memory. */
    int most_local = C.local;
    MPI_Allreduce(MPI_IN_PLACE, &most_local, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    double host_min = C.host > 0 ? C.host : INFINITY;
    MPI_Allreduce(MPI_IN_PLACE, &host_min, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    if (!isfinite(host_min)) host_min = 0;

    say(log, "host memory: %.2f GiB (the smallest node's, or its container limit)", gib(host_min));
    if (!(C.flops > 0) || !(C.mem_bw > 0) || !(host_min > 0)) {
        util_set_err(err, errlen, "calibrate: a measurement failed (gemm %g FLOP/s, memory %g B/s, host memory %g B)",
                     C.flops, C.mem_bw, host_min);
        goto done;
    }
    *out = calib_profile(&C, base, host_min, most_local, reserved);
    rc = 0;

done:
    if (C.ops) {
        C.ops->release(C.a);
        C.ops->release(C.b);
        C.ops->release(C.c);
    }
    MPI_Comm_free(&C.across);
    MPI_Comm_free(&C.node);
    omp_set_num_threads(threads_before);
    return rc;
}
