// tests/gpu/test_ops_sim/sim.cpp — the CUDA simulator's runtime (see include/sim.h) and the
// fake cuBLASLt (include/cublasLt.h).
//
// Threads of a block are coroutines: created with makecontext, entered the first time
// with setcontext, then switched with _setjmp/_longjmp (no signal-mask system calls). A
// coroutine outlives its block: when the kernel body returns it parks at the top of its
// loop, and the next block (of any launch) that needs a thread of that index resumes it
// there, so a context is made once per thread index, not once per thread of every block.
// The scheduler resumes every runnable thread in turn; a thread runs until it waits at a
// barrier (block or warp) or returns. A barrier opens when every thread of its scope
// that has not returned has arrived. SIM_REVERSE=1 resumes threads in the opposite order,
// which shows reads that depend on the order of threads between two barriers.
#include <setjmp.h>
#include <ucontext.h>

#include <unordered_map>
#include <vector>

#include "cublasLt.h"
#include "kernels/ops_math.h"
#include "sim.h"

dim3 threadIdx, blockIdx, blockDim, gridDim;
extern "C" {
long sim_launches = 0, sim_gemm_calls = 0, sim_sorts = 0, sim_copies = 0;
}

// A simulated device of 16 GiB: a request beyond what is left fails as cudaMalloc would.
static const size_t SIM_TOTAL = (size_t)16 << 30;
static size_t sim_used;
static std::unordered_map<void *, size_t> sim_sizes;

// ---- CUDA graphs
struct SimGraph {
    std::vector<std::function<void()>> work;
};
static SimGraph *sim_cap;    // the graph the stream is capturing, or NULL
static bool sim_cap_invalid; // a forbidden call happened during the capture
bool sim_capturing() { return sim_cap != NULL; }
void sim_capture(std::function<void()> work) { sim_cap->work.push_back(std::move(work)); }
cudaError_t sim_capture_forbid(const char *what) {
    fprintf(stderr, "simulator: %s during stream capture (the capture is invalidated)\n", what);
    sim_cap_invalid = true;
    return cudaErrorStreamCaptureUnsupported;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
    if (sim_cap) return sim_capture_forbid("cudaStreamBeginCapture");
    sim_cap = new SimGraph();
    sim_cap_invalid = false;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g) {
    *g = NULL;
    if (!sim_cap) return cudaErrorStreamCaptureInvalidated;
    SimGraph *c = sim_cap;
    sim_cap = NULL;
    if (sim_cap_invalid) {
        delete c;
        return cudaErrorStreamCaptureInvalidated;
    }
    *g = c;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
    *e = new SimGraph(*g);
    return cudaSuccess;
}
// Parameters change in place; a different number of nodes is a new topology.
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t e, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info) {
    info->errorNode = info->errorFromNode = NULL;
    if (e->work.size() != g->work.size()) {
        info->result = cudaGraphExecUpdateErrorTopologyChanged;
        return cudaErrorGraphExecUpdateFailure;
    }
    e->work = g->work;
    info->result = cudaGraphExecUpdateSuccess;
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
    if (sim_cap) return sim_capture_forbid("cudaGraphLaunch");
    for (auto &w : e->work) w();
    return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n) {
    if (nodes) abort(); // the count is all the backend asks
    *n = g->work.size();
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    delete e;
    return cudaSuccess;
}

cudaError_t sim_malloc(void **p, size_t n) {
    *p = NULL;
    if (sim_cap) return sim_capture_forbid("cudaMalloc");
    size_t r = (n + 255) / 256 * 256 + 256;
    if (n > SIM_TOTAL || r > SIM_TOTAL - sim_used) return cudaErrorMemoryAllocation;
    *p = aligned_alloc(256, r);
    if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0xff, r); // garbage (NaN) like fresh device memory
    sim_sizes[*p] = r;
    sim_used += r;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (sim_cap) return sim_capture_forbid("cudaFree");
    auto it = sim_sizes.find(p);
    if (it != sim_sizes.end()) {
        sim_used -= it->second;
        sim_sizes.erase(it);
    }
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = SIM_TOTAL - sim_used;
    *total_bytes = SIM_TOTAL;
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) {
    if (sim_cap) return sim_capture_forbid("cudaMemcpy");
    memmove(d, s, n);
    return cudaSuccess;
}

// ---- coroutine threads

namespace {
struct SimT {
    ucontext_t uc;
    jmp_buf jb;
    int state; // 0 runnable, 1 at a block barrier, 2 at a warp barrier, 3 returned
    int started;
};
std::vector<SimT> T;
std::vector<char *> stacks;
jmp_buf sched_jb;
int cur, nthr, block_arrived;
std::vector<int> warp_arrived;
std::function<void()> *body;
double slots[1024];
std::vector<char> dyn;
const size_t STACK = 256 * 1024;

// Threads not yet returned, in the block and per warp: kept as counts, because a barrier
// is checked at every arrival and a scan of the block there costs O(threads^2) a barrier.
int block_live;
std::vector<int> warp_live;
void check_block() {
    if (block_arrived > 0 && block_arrived >= block_live) {
        for (int i = 0; i < nthr; i++)
            if (T[i].state == 1) T[i].state = 0;
        block_arrived = 0;
    }
}
void check_warp(int w) {
    int lo = w * 32, hi = std::min(nthr, lo + 32);
    if (warp_arrived[w] > 0 && warp_arrived[w] >= warp_live[w]) {
        for (int i = lo; i < hi; i++)
            if (T[i].state == 2) T[i].state = 0;
        warp_arrived[w] = 0;
    }
}
void yield() {
    if (!_setjmp(T[cur].jb)) _longjmp(sched_jb, 1);
}
void tramp() {
    for (;;) { // never returns into makecontext's frame
        (*body)();
        T[cur].state = 3;
        block_live--;
        warp_live[cur / 32]--;
        check_block();
        check_warp(cur / 32);
        if (!_setjmp(T[cur].jb)) _longjmp(sched_jb, 2);
    }
}
} // namespace

double *sim_shfl_slots() { return slots; }
int sim_cur() { return cur; }
void *sim_dyn_smem() { return dyn.data(); }

void __syncthreads() {
    T[cur].state = 1;
    block_arrived++;
    check_block();
    yield();
}

void __syncwarp(unsigned) {
    int w = cur / 32;
    T[cur].state = 2;
    warp_arrived[w]++;
    check_warp(w);
    yield();
}

static void run_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> f);
void sim_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> f) {
    sim_launches++;
    if (sim_cap) {
        sim_capture([=]() { run_launch(grid, block, smem, f); });
        return;
    }
    run_launch(grid, block, smem, std::move(f));
}
static void run_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> f) {
    gridDim = grid;
    blockDim = block;
    nthr = (int)(block.x * block.y * block.z);
    if (nthr > 1024 || nthr % 32) {
        fprintf(stderr, "simulator: block of %d threads\n", nthr);
        abort();
    }
    if (smem > 227 * 1024) {
        fprintf(stderr, "simulator: %zu bytes of shared memory\n", smem);
        abort();
    }
    T.reserve(1024); // never moved: a made context points into itself (its saved FP state)
    while ((int)T.size() < nthr) {
        T.emplace_back();
        T.back().started = 0;
        stacks.push_back((char *)malloc(STACK));
    }
    warp_arrived.assign((nthr + 31) / 32, 0);
    body = &f;
    static const int rev = getenv("SIM_REVERSE") != NULL;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = dim3(x, y, z);
                dyn.assign(smem + 16, (char)0xff);
                block_arrived = 0;
                std::fill(warp_arrived.begin(), warp_arrived.end(), 0);
                block_live = nthr;
                warp_live.assign((nthr + 31) / 32, 0);
                for (int t = 0; t < nthr; t++) warp_live[t / 32]++;
                for (int t = 0; t < nthr; t++) {
                    if (!T[t].started) {
                        getcontext(&T[t].uc);
                        T[t].uc.uc_stack.ss_sp = stacks[t];
                        T[t].uc.uc_stack.ss_size = STACK;
                        T[t].uc.uc_link = NULL;
                        makecontext(&T[t].uc, tramp, 0);
                    }
                    T[t].state = 0;
                }
                for (;;) {
                    bool progress = false, all_done = true;
                    for (int i = 0; i < nthr; i++) {
                        int t = rev ? nthr - 1 - i : i;
                        if (T[t].state != 3) all_done = false;
                        if (T[t].state != 0) continue;
                        cur = t;
                        threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
                        progress = true;
                        if (!_setjmp(sched_jb)) {
                            if (!T[t].started) {
                                T[t].started = 1;
                                setcontext(&T[t].uc);
                            }
                            _longjmp(T[t].jb, 1);
                        }
                    }
                    if (all_done) break;
                    if (!progress) {
                        fprintf(stderr, "simulator: deadlock (threads wait at different barriers)\n");
                        abort();
                    }
                }
            }
}

// ---- fake cuBLASLt
const char *cublasLtGetStatusString(cublasStatus_t s) { return s ? "sim: not supported" : "ok"; }
const char *cublasLtGetStatusName(cublasStatus_t s) { return s ? "SIM_ERR" : "OK"; }
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = (void *)1;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t ct, cudaDataType st) {
    if (st != CUDA_R_32F) abort();
    *d = new SimDesc();
    (*d)->ct = ct;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v,
                                              size_t n) {
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
        if (n != sizeof(cublasOperation_t)) abort();
        d->transa = *(const int *)v;
        break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if (n != sizeof(cublasOperation_t)) abort();
        d->transb = *(const int *)v;
        break;
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM:
        if (n != 1) abort();
        d->fast = *(const int8_t *)v;
        break;
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE:
        if (n != 4) abort();
        d->amode = *(const int32_t *)v;
        break;
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE:
        if (n != 4) abort();
        d->bmode = *(const int32_t *)v;
        break;
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
        if (n != sizeof(void *)) abort();
        d->as = *(const float *const *)v;
        break;
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
        if (n != sizeof(void *)) abort();
        d->bs = *(const float *const *)v;
        break;
    }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t r, uint64_t c,
                                          int64_t ld) {
    *l = new SimLayout{t, r, c, ld, 1, 0};
    if (ld < (int64_t)std::max<uint64_t>(1, r)) {
        fprintf(stderr, "fake lt: ld %ld < rows %lu\n", (long)ld, (unsigned long)r);
        abort();
    }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a,
                                                const void *v, size_t n) {
    if (a == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) {
        if (n != 4) abort();
        l->batch = *(const int32_t *)v;
    } else {
        if (n != 8) abort();
        l->stride = *(const int64_t *)v;
    }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new SimPref();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a, const void *v, size_t n) {
    if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (n != 8) abort();
        return CUBLAS_STATUS_SUCCESS;
    }
    if (n != 4) abort();
    p->al[a - 1] = *(const uint32_t *)v;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}

static bool is8(cudaDataType t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
static size_t esz(cudaDataType t) { return t == CUDA_R_32F ? 4 : (t == CUDA_R_16BF ? 2 : 1); }

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t p, int req,
                                              cublasLtMatmulHeuristicResult_t *res, int *found) {
    *found = 0;
    if (req < 1 || c != dd) abort();
    uint64_t m = c->rows, n = c->cols, k = d->transa ? a->rows : a->cols;
    if ((d->transa ? a->cols : a->rows) != m || (d->transb ? b->rows : b->cols) != n ||
        (d->transb ? b->cols : b->rows) != k) {
        fprintf(stderr, "fake lt: inconsistent layouts\n");
        abort();
    }
    if (a->batch != b->batch || a->batch != c->batch) abort();
    if (is8(a->t) || is8(b->t)) {
        if (!is8(a->t) || !is8(b->t)) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (a->t == CUDA_R_8F_E5M2 && b->t == CUDA_R_8F_E5M2) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (!d->transa || d->transb) return CUBLAS_STATUS_NOT_SUPPORTED; // TN only
        if (k % 16 || a->ld % 16 || b->ld % 16 || p->al[0] < 16 || p->al[1] < 16) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (c->t != CUDA_R_32F && c->t != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
        if ((d->amode || d->bmode) && getenv("SIM_NO_OUTER")) return CUBLAS_STATUS_NOT_SUPPORTED;
    } else {
        if (d->amode || d->bmode) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (a->t != b->t) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (a->t == CUDA_R_32F && c->t != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    memset(res, 0, sizeof *res);
    memcpy(res->algo.al, p->al, sizeof p->al);
    res->state = CUBLAS_STATUS_SUCCESS;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static float ld_el(const void *p, cudaDataType t, size_t i) {
    switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_16BF: return tetra_bf16_to_f32(((const uint16_t *)p)[i]);
    case CUDA_R_8F_E4M3: return tetra_e4m3_to_f32(((const uint8_t *)p)[i]);
    case CUDA_R_8F_E5M2: return tetra_e5m2_to_f32(((const uint8_t *)p)[i]);
    default: abort();
    }
}

static void matmul_run(const SimDesc *d, const SimLayout *la, const SimLayout *lb, const SimLayout *lc, float al,
                       float be, const void *A, const void *B, const void *C, void *D);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb, const void *beta,
                              const void *C, cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *, size_t, cudaStream_t) {
    sim_gemm_calls++;
    // C may be another buffer than D (a residual add), in D's layout; an overlap that is
    // not the whole of D would depend on cuBLASLt's order of work
    if (lc != ld) abort();
    if (C != D) {
        const size_t bytes = ((size_t)(lc->batch - 1) * lc->stride + (lc->cols - 1) * lc->ld + lc->rows) * esz(lc->t);
        const char *c0 = (const char *)C, *d0 = (const char *)D;
        if (c0 < d0 + bytes && d0 < c0 + bytes) {
            fprintf(stderr, "fake lt: C overlaps D without being D\n");
            abort();
        }
    }
    // the algorithm's alignment assumptions must hold for every batch item
    const void *ptrs[4] = {A, B, C, D};
    cublasLtMatrixLayout_t ls[4] = {la, lb, lc, ld};
    for (int i = 0; i < 4; i++) {
        uint32_t al = algo->al[i < 3 ? i : 2]; // D takes C's
        for (int bi = 0; bi < ls[i]->batch; bi++) {
            uintptr_t u = (uintptr_t)ptrs[i] + (uintptr_t)(bi * ls[i]->stride * (int64_t)esz(ls[i]->t));
            if (al && u % al) {
                fprintf(stderr, "fake lt: operand %d misaligned for the algorithm (%u)\n", i, al);
                abort();
            }
        }
    }
    // alpha and beta are host values: a capture keeps them, and the descriptors, as they are now
    const float al = *(const float *)alpha, be = *(const float *)beta;
    if (sim_capturing()) {
        const SimDesc dc = *d;
        const SimLayout a = *la, b = *lb, c = *lc;
        sim_capture([=]() { matmul_run(&dc, &a, &b, &c, al, be, A, B, C, D); });
        return CUBLAS_STATUS_SUCCESS;
    }
    matmul_run(d, la, lb, lc, al, be, A, B, C, D);
    return CUBLAS_STATUS_SUCCESS;
}
static void matmul_run(const SimDesc *d, const SimLayout *la, const SimLayout *lb, const SimLayout *lc, float al,
                       float be, const void *A, const void *B, const void *C, void *D) {
    uint64_t m = lc->rows, n = lc->cols, k = d->transa ? la->rows : la->cols;
    for (int bi = 0; bi < lc->batch; bi++) {
        for (uint64_t j = 0; j < n; j++) {
            for (uint64_t i = 0; i < m; i++) {
                double acc = 0;
                for (uint64_t p = 0; p < k; p++) {
                    size_t ia = (size_t)bi * la->stride + (d->transa ? p + i * la->ld : i + p * la->ld);
                    size_t ib = (size_t)bi * lb->stride + (d->transb ? j + p * lb->ld : p + j * lb->ld);
                    acc += (double)ld_el(A, la->t, ia) * (double)ld_el(B, lb->t, ib);
                }
                float sa = 1, sb = 1;
                if (d->as) sa = d->amode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F ? d->as[i] : d->as[0];
                if (d->bs) sb = d->bmode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F ? d->bs[j] : d->bs[0];
                float r = al * sa * sb * (float)acc;
                size_t ic = (size_t)bi * lc->stride + i + j * lc->ld;
                if (be != 0.0f) r += be * ld_el(C, lc->t, ic); // C's layout is D's
                if (lc->t == CUDA_R_32F) ((float *)D)[ic] = r;
                else if (lc->t == CUDA_R_16BF) ((uint16_t *)D)[ic] = tetra_f32_to_bf16(r);
                else abort();
            }
        }
    }
}
