// kernels/cuda/cuda_cudnn.cu — cuDNN in the CUDA backend: the version the process runs with,
// and cuDNN's fused attention (SDPA) as the fast path of the bf16 attention ops.
//
// Why this shape:
// - cuDNN's graph (backend) API, no frontend library: tensors, operations, an operation
//   graph, heuristics' engine configs and an execution plan, all built once per attention
//   shape and direction at start-up (cuda_cudnn_sdpa_workspace_size) and kept in a small
//   table; a call then only sets the stream and executes the plan with a variant pack.
// - The forward tries the single SDPA operation first (CUDNN_BACKEND_OPERATION_SDPA_FWD_
//   DESCRIPTOR: Q, K, V, O, Stats and the scale, nothing else): one node, one fused kernel.
//   In cuDNN 9.19 that operation has no mask attribute (causal masking comes with the
//   score-modifier subgraph attributes of later versions), and an operation graph holding
//   CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR does not finalize. So causal forwards and
//   every backward are described as the classic flash-attention graph of matmul /
//   pointwise / reduction / reshape operations that cuDNN's fused SDPA engines recognize
//   (the pattern its own frontend emits for these versions): the same fused kernels,
//   reached through a longer description. The single backward operation is tried last,
//   for non-causal shapes, should a later cuDNN run it.
// - Stats are cuDNN's softmax statistics max + log(sum exp), natural log, of the scaled and
//   masked scores, [B, H, Sq, 1] fp32: exactly the lse of the ops ([B, H, Sq]).
// - Nothing here is required: any shape cuDNN declines, or any failure at run time, is
//   reported (a status, a message naming the call and cuDNN's status string) and the
//   caller runs its own kernel. Built without cuDNN, every entry point answers "not supported".
#include "kernels/cuda/cuda_cudnn.h"

#include <stdio.h>
#include <string.h>

#ifdef TETRA_HAVE_CUDNN

#include <cuda_runtime.h>
#include <cudnn.h>
#include <float.h>
#include <math.h>

#include <mutex>
#include <vector>

#include "kernels/ops_paths.h"

namespace {

// UIDs of the tensors the variant pack names; virtual tensors are numbered from kUidVirtual.
enum : int64_t {
    kUidQ = 1,
    kUidK,
    kUidV,
    kUidO,
    kUidStats,
    kUidDO,
    kUidDQ,
    kUidDK,
    kUidDV,
    kUidScale,
    kUidNegInf,
    kUidOne,
    kUidSoftmaxSum, // rowsum(dO * O), [B, H, Sq, 1] fp32, in the workspace
    kUidDQAccum,    // fp32 dQ accumulator, [B, H, Sq, D], in the workspace
    kUidVirtual = 100
};

enum PlanKind { kFwdSingleOp, kFwdGraph, kBwdGraph, kBwdSingleOp };

const char *kind_name(PlanKind k) {
    switch (k) {
    case kFwdSingleOp: return "forward, single SDPA operation";
    case kFwdGraph: return "forward, operation graph";
    case kBwdGraph: return "backward, operation graph";
    case kBwdSingleOp: return "backward, single SDPA operation";
    }
    return "?";
}

struct PlanKey {
    int b, sq, sk, h, kv, d, causal, backward;
    int deterministic; // backward under training.deterministic (describe_bwd_graph)
    uint32_t scale_bits;
};

bool key_eq(const PlanKey &a, const PlanKey &b) {
    return a.b == b.b && a.sq == b.sq && a.sk == b.sk && a.h == b.h && a.kv == b.kv && a.d == b.d &&
        a.causal == b.causal && a.backward == b.backward && a.deterministic == b.deterministic &&
        a.scale_bits == b.scale_bits;
}

struct Plan {
    PlanKey key;
    bool ok = false; // false: no plan could be built (kept, so the build is not retried)
    PlanKind kind = kFwdGraph;
    cudnnBackendDescriptor_t plan = nullptr;
    std::vector<cudnnBackendDescriptor_t> keep; // everything the plan was built from
    std::vector<int64_t> uids;                  // the variant pack's tensors
    size_t cudnn_ws = 0;                        // the engine's own workspace
    size_t off_softmax_sum = 0, off_dq_accum = 0, dq_accum_bytes = 0;
    size_t ws_total = 0;
    // by-value scalars: the variant pack points at these (host memory, stable addresses)
    float scale = 0.f, neg_inf = 0.f, one = 1.f;
    char error[768] = {0};
};

const int kMaxPlans = 64;

struct State {
    std::mutex mu;
    cudnnHandle_t handle = nullptr;
    int device = -1;
    Plan *plans[kMaxPlans] = {};
    int nplans = 0;
    bool deterministic = false; // cuda_cudnn_set_deterministic
    char last_error[768] = {0};
};

State g;

size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

void put_status(char *buf, size_t len, const char *call, cudnnStatus_t st) {
    if (!buf || !len) return;
    char detail[512];
    detail[0] = 0;
    cudnnGetLastErrorString(detail, sizeof detail);
    if (detail[0]) snprintf(buf, len, "%s: %s (%s)", call, cudnnGetErrorString(st), detail);
    else snprintf(buf, len, "%s: %s", call, cudnnGetErrorString(st));
}

struct Dims {
    int64_t v[4];
};

Dims dims4(int64_t a, int64_t b, int64_t c, int64_t d) {
    Dims r = {{a, b, c, d}};
    return r;
}

// A tensor stored as [B, S, heads, D] (token-major, the ops' layout) seen as cuDNN's
// logical [B, heads, S, D].
void bshd(Dims *dim, Dims *str, int64_t b, int64_t heads, int64_t s, int64_t d) {
    *dim = dims4(b, heads, s, d);
    *str = dims4(s * heads * d, d, heads * d, 1);
}

// Builds descriptors; after the first failure every call is a no-op returning nullptr and
// `error` names the failing call. Destroys what it made unless release() hands it over.
class Builder {
  public:
    explicit Builder(cudnnHandle_t handle) : handle_(handle) {}
    ~Builder() {
        for (size_t i = descs_.size(); i > 0; i--) cudnnBackendDestroyDescriptor(descs_[i - 1]);
    }
    Builder(const Builder &) = delete;
    Builder &operator=(const Builder &) = delete;

    bool failed() const { return failed_; }
    const char *error() const { return error_; }
    // Deterministic reductions, and plan() takes no engine that cuDNN notes as
    // non-deterministic (set before describing the graph).
    void require_deterministic(bool on) { deterministic_ = on; }
    std::vector<cudnnBackendDescriptor_t> release() {
        std::vector<cudnnBackendDescriptor_t> r;
        r.swap(descs_);
        return r;
    }

    cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type, const char *what) {
        if (failed_) return nullptr;
        cudnnBackendDescriptor_t d = nullptr;
        cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d);
        if (st != CUDNN_STATUS_SUCCESS) {
            fail("cudnnBackendCreateDescriptor", what, st);
            return nullptr;
        }
        descs_.push_back(d);
        return d;
    }
    void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t n,
             const void *value, const char *what) {
        if (failed_) return;
        cudnnStatus_t st = cudnnBackendSetAttribute(d, name, type, n, value);
        if (st != CUDNN_STATUS_SUCCESS) fail("cudnnBackendSetAttribute", what, st);
    }
    void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t v,
                  const char *what) {
        set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
    }
    void finalize(cudnnBackendDescriptor_t d, const char *what) {
        if (failed_) return;
        cudnnStatus_t st = cudnnBackendFinalize(d);
        if (st != CUDNN_STATUS_SUCCESS) fail("cudnnBackendFinalize", what, st);
    }

    // A 4-d tensor, 16-byte aligned; `uid` < 0 numbers a virtual one.
    cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, Dims dim, Dims str, bool is_virtual,
                                    bool by_value, const char *what) {
        cudnnBackendDescriptor_t t = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
        if (uid < 0) uid = next_virtual_++;
        int64_t alignment = 16;
        set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what);
        set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim.v, what);
        set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str.v, what);
        set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
        set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, what);
        if (is_virtual) {
            bool yes = true;
            set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, what);
        }
        if (by_value) {
            bool yes = true;
            set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, what);
        }
        finalize(t, what);
        return failed_ ? nullptr : t;
    }
    cudnnBackendDescriptor_t io(int64_t uid, cudnnDataType_t type, Dims dim, Dims str, const char *what) {
        return tensor(uid, type, dim, str, false, false, what);
    }
    cudnnBackendDescriptor_t virt(cudnnDataType_t type, Dims dim, Dims str, const char *what) {
        return tensor(-1, type, dim, str, true, false, what);
    }
    // A by-value fp32 scalar, [1, 1, 1, 1] (its value is a host pointer in the variant pack).
    cudnnBackendDescriptor_t scalar(int64_t uid, const char *what) {
        return tensor(uid, CUDNN_DATA_FLOAT, dims4(1, 1, 1, 1), dims4(1, 1, 1, 1), false, true, what);
    }

    // y = mode(x[, b[, t]]); `axis` only for GEN_INDEX.
    void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, const char *what,
                   int64_t axis = -1) {
        cudnnBackendDescriptor_t pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
        set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
        set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, what);
        if (mode == CUDNN_POINTWISE_GEN_INDEX) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
        finalize(pw, what);
        cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, what);
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, what);
        if (b) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, what);
        if (t) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, what);
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, what);
        float alpha = 1.f;
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &alpha, what);
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha, what);
        finalize(op, what);
        if (!failed_) ops_.push_back(op);
    }
    // y = reduce(x) over the axes where y has extent 1 (or over head groups, H -> KV).
    void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                   const char *what) {
        cudnnBackendDescriptor_t rd = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
        cudnnDataType_t prec = CUDNN_DATA_FLOAT;
        set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, what);
        set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, what);
        if (cudnnGetVersion() >= 91100) {
            bool deterministic = deterministic_;
            set(rd, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic, what);
        }
        finalize(rd, what);
        cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
        set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd, what);
        set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, what);
        set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, what);
        finalize(op, what);
        if (!failed_) ops_.push_back(op);
    }
    // c = a @ b (batched over the first two axes; b's heads broadcast over groups of a's).
    void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c, const char *what) {
        cudnnBackendDescriptor_t mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
        cudnnDataType_t prec = CUDNN_DATA_FLOAT;
        set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, what);
        finalize(mm, what);
        cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, what);
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, what);
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, what);
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm, what);
        finalize(op, what);
        if (!failed_) ops_.push_back(op);
    }
    // y = x seen with y's shape and strides (a transposed view).
    void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y, const char *what) {
        cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what);
        set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, what);
        set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, what);
        finalize(op, what);
        if (!failed_) ops_.push_back(op);
    }
    void add_op(cudnnBackendDescriptor_t op) {
        if (!failed_) ops_.push_back(op);
    }

    // The operation graph, then heuristics (mode A, then the fallback list) and the first
    // engine config whose execution plan finalizes (under require_deterministic, the first
    // whose engine cuDNN does not note as non-deterministic). Returns the plan (owned by
    // this builder until release()), or nullptr with error() set.
    cudnnBackendDescriptor_t plan(int64_t *workspace) {
        cudnnBackendDescriptor_t graph = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
        set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_, "operation graph handle");
        set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)ops_.size(), ops_.data(),
            "operation graph operations");
        finalize(graph, "operation graph");
        if (failed_) return nullptr;
        const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
        char last[512];
        int64_t proposed = 0, viable = 0, nondeterministic = 0;
        last[0] = 0;
        for (int m = 0; m < 2; m++) {
            cudnnBackendDescriptor_t heur = nullptr;
            cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
            if (st != CUDNN_STATUS_SUCCESS) {
                put_status(last, sizeof last, "cudnnBackendCreateDescriptor(engine heuristics)", st);
                continue;
            }
            descs_.push_back(heur);
            st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                          &graph);
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
            if (st != CUDNN_STATUS_SUCCESS) {
                put_status(last, sizeof last, "cudnnBackendSetAttribute(engine heuristics)", st);
                continue;
            }
            st = cudnnBackendFinalize(heur);
            if (st != CUDNN_STATUS_SUCCESS) {
                put_status(last, sizeof last, "cudnnBackendFinalize(engine heuristics)", st);
                continue;
            }
            int64_t count = 0;
            st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                          nullptr);
            if (st != CUDNN_STATUS_SUCCESS) {
                put_status(last, sizeof last, "cudnnBackendGetAttribute(engine heuristics result count)", st);
                continue;
            }
            if (count <= 0) continue;
            proposed += count;
            std::vector<cudnnBackendDescriptor_t> cfgs;
            for (int64_t i = 0; i < count; i++) {
                cudnnBackendDescriptor_t cfg = nullptr;
                st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg);
                if (st != CUDNN_STATUS_SUCCESS) break;
                descs_.push_back(cfg);
                cfgs.push_back(cfg);
            }
            if (st != CUDNN_STATUS_SUCCESS) {
                put_status(last, sizeof last, "cudnnBackendCreateDescriptor(engine config)", st);
                continue;
            }
            int64_t got = 0;
            st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                          (int64_t)cfgs.size(), &got, cfgs.data());
            if (st != CUDNN_STATUS_SUCCESS) {
                put_status(last, sizeof last, "cudnnBackendGetAttribute(engine heuristics results)", st);
                continue;
            }
            if (got > 0) viable += got;
            for (int64_t i = 0; i < got && i < (int64_t)cfgs.size(); i++) {
                if (deterministic_ && !engine_deterministic(cfgs[(size_t)i])) {
                    nondeterministic++;
                    continue;
                }
                cudnnBackendDescriptor_t p = nullptr;
                st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p);
                if (st != CUDNN_STATUS_SUCCESS) {
                    put_status(last, sizeof last, "cudnnBackendCreateDescriptor(execution plan)", st);
                    continue;
                }
                st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
                if (st == CUDNN_STATUS_SUCCESS)
                    st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[(size_t)i]);
                if (st == CUDNN_STATUS_SUCCESS) {
                    st = cudnnBackendFinalize(p);
                    if (st != CUDNN_STATUS_SUCCESS)
                        put_status(last, sizeof last, "cudnnBackendFinalize(execution plan)", st);
                } else {
                    put_status(last, sizeof last, "cudnnBackendSetAttribute(execution plan)", st);
                }
                int64_t ws = 0;
                if (st == CUDNN_STATUS_SUCCESS) {
                    st = cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                                  nullptr, &ws);
                    if (st != CUDNN_STATUS_SUCCESS)
                        put_status(last, sizeof last, "cudnnBackendGetAttribute(execution plan workspace size)", st);
                }
                if (st == CUDNN_STATUS_SUCCESS && ws >= 0) {
                    descs_.push_back(p);
                    *workspace = ws;
                    return p;
                }
                cudnnBackendDestroyDescriptor(p);
            }
        }
        failed_ = true;
        if (last[0]) snprintf(error_, sizeof error_, "%s", last);
        else // cuDNN logs each engine's reason with CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr
            snprintf(error_, sizeof error_,
                     "engine heuristics: %lld engine configs proposed, %lld passed their support checks, "
                     "%lld of those noted non-deterministic%s (CUDNN_LOGLEVEL_DBG=2 logs why)",
                     (long long)proposed, (long long)viable, (long long)nondeterministic,
                     deterministic_ ? " and skipped" : "");
        return nullptr;
    }

  private:
    // false when the engine behind cfg carries CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC, or
    // when its notes cannot be read (unknown counts as non-deterministic)
    static bool engine_deterministic(cudnnBackendDescriptor_t cfg) {
        cudnnBackendDescriptor_t engine = nullptr;
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS)
            return false;
        int64_t n = 0;
        cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
        bool ok = cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                           &engine) == CUDNN_STATUS_SUCCESS &&
            cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                     CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) == CUDNN_STATUS_SUCCESS;
        for (int64_t i = 0; ok && i < n && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++)
            if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) ok = false;
        cudnnBackendDestroyDescriptor(engine);
        return ok;
    }

    void fail(const char *call, const char *what, cudnnStatus_t st) {
        failed_ = true;
        char c[160];
        snprintf(c, sizeof c, "%s(%s)", call, what);
        put_status(error_, sizeof error_, c, st);
    }

    cudnnHandle_t handle_;
    std::vector<cudnnBackendDescriptor_t> descs_;
    std::vector<cudnnBackendDescriptor_t> ops_;
    int64_t next_virtual_ = kUidVirtual;
    bool deterministic_ = false;
    bool failed_ = false;
    char error_[640] = {0};
};

// The shapes every description shares.
struct Shapes {
    int64_t b, h, kv, sq, sk, d;
    Dims q_dim, q_str;     // q, out, dq, dout: [B, H, Sq, D] over [B, Sq, H, D]
    Dims kv_dim, kv_str;   // k, v, dk, dv: [B, KV, Sk, D] over [B, Sk, KV, D]
    Dims kt_dim, kt_str;   // k and v transposed: [B, KV, D, Sk]
    Dims st_dim, st_str;   // stats, row sums: [B, H, Sq, 1]
    Dims s_dim, s_str;     // scores: [B, H, Sq, Sk]
    Dims sT_dim, sT_str;   // transposed scores: [B, H, Sk, Sq]
    Dims hk_dim, hk_str;   // per-query-head dK/dV before the group sum: [B, H, Sk, D]
    Dims dqa_dim, dqa_str; // dQ accumulator: [B, H, Sq, D] contiguous
};

Shapes shapes_of(const PlanKey &k) {
    Shapes s;
    s.b = k.b, s.h = k.h, s.kv = k.kv, s.sq = k.sq, s.sk = k.sk, s.d = k.d;
    bshd(&s.q_dim, &s.q_str, s.b, s.h, s.sq, s.d);
    bshd(&s.kv_dim, &s.kv_str, s.b, s.kv, s.sk, s.d);
    s.kt_dim = dims4(s.b, s.kv, s.d, s.sk);
    s.kt_str = dims4(s.kv_str.v[0], s.kv_str.v[1], s.kv_str.v[3], s.kv_str.v[2]);
    s.st_dim = dims4(s.b, s.h, s.sq, 1);
    s.st_str = dims4(s.h * s.sq, s.sq, 1, 1);
    s.s_dim = dims4(s.b, s.h, s.sq, s.sk);
    s.s_str = dims4(s.h * s.sq * s.sk, s.sq * s.sk, s.sk, 1);
    s.sT_dim = dims4(s.b, s.h, s.sk, s.sq);
    s.sT_str = dims4(s.h * s.sq * s.sk, s.sq * s.sk, 1, s.sk);
    s.hk_dim = dims4(s.b, s.h, s.sk, s.d);
    s.hk_str = dims4(s.h * s.sk * s.d, s.sk * s.d, s.d, 1);
    s.dqa_dim = dims4(s.b, s.h, s.sq, s.d);
    s.dqa_str = dims4(s.h * s.sq * s.d, s.sq * s.d, s.d, 1);
    return s;
}

// Top-left causal mask on scores x ([B, H, Sq, Sk] fp32): keep where row >= column,
// else the by-value neg_inf. Returns the masked scores.
cudnnBackendDescriptor_t causal_mask(Builder &bd, const Shapes &s, cudnnBackendDescriptor_t x,
                                     cudnnBackendDescriptor_t neg_inf) {
    cudnnBackendDescriptor_t row = bd.virt(CUDNN_DATA_INT32, s.s_dim, s.s_str, "mask row index");
    bd.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, nullptr, nullptr, row, "mask row index", 2);
    cudnnBackendDescriptor_t col = bd.virt(CUDNN_DATA_INT32, s.s_dim, s.s_str, "mask column index");
    bd.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, nullptr, nullptr, col, "mask column index", 3);
    cudnnBackendDescriptor_t keep = bd.virt(CUDNN_DATA_BOOLEAN, s.s_dim, s.s_str, "mask row >= column");
    bd.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep, "mask row >= column");
    cudnnBackendDescriptor_t y = bd.virt(CUDNN_DATA_FLOAT, s.s_dim, s.s_str, "masked scores");
    bd.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neg_inf, keep, y, "mask select");
    return y;
}

// Forward as one SDPA operation (non-causal).
void describe_fwd_single(Builder &bd, const Shapes &s, Plan *p) {
    cudnnBackendDescriptor_t q = bd.io(kUidQ, CUDNN_DATA_BFLOAT16, s.q_dim, s.q_str, "Q");
    cudnnBackendDescriptor_t k = bd.io(kUidK, CUDNN_DATA_BFLOAT16, s.kv_dim, s.kv_str, "K");
    cudnnBackendDescriptor_t v = bd.io(kUidV, CUDNN_DATA_BFLOAT16, s.kv_dim, s.kv_str, "V");
    cudnnBackendDescriptor_t o = bd.io(kUidO, CUDNN_DATA_BFLOAT16, s.q_dim, s.q_str, "O");
    cudnnBackendDescriptor_t st = bd.io(kUidStats, CUDNN_DATA_FLOAT, s.st_dim, s.st_str, "Stats");
    cudnnBackendDescriptor_t sc = bd.scalar(kUidScale, "attention scale");
    const char *w = "SDPA forward operation";
    cudnnBackendDescriptor_t op = bd.create(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, k, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, v, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, st, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, sc, w);
    bd.finalize(op, w);
    bd.add_op(op);
    p->uids = {kUidQ, kUidK, kUidV, kUidO, kUidStats, kUidScale};
}

// Forward as the flash-attention graph: S = (Q K^T) * scale, [causal mask], softmax with
// Stats = max + log(sum exp), O = P V.
void describe_fwd_graph(Builder &bd, const Shapes &s, bool causal, Plan *p) {
    cudnnBackendDescriptor_t q = bd.io(kUidQ, CUDNN_DATA_BFLOAT16, s.q_dim, s.q_str, "Q");
    cudnnBackendDescriptor_t kt = bd.io(kUidK, CUDNN_DATA_BFLOAT16, s.kt_dim, s.kt_str, "K transposed");
    cudnnBackendDescriptor_t v = bd.io(kUidV, CUDNN_DATA_BFLOAT16, s.kv_dim, s.kv_str, "V");
    cudnnBackendDescriptor_t o = bd.io(kUidO, CUDNN_DATA_BFLOAT16, s.q_dim, s.q_str, "O");
    cudnnBackendDescriptor_t stats = bd.io(kUidStats, CUDNN_DATA_FLOAT, s.st_dim, s.st_str, "Stats");
    cudnnBackendDescriptor_t scale = bd.scalar(kUidScale, "attention scale");
    cudnnBackendDescriptor_t neg_inf = causal ? bd.scalar(kUidNegInf, "mask value") : nullptr;

    cudnnBackendDescriptor_t s1 = bd.virt(CUDNN_DATA_FLOAT, s.s_dim, s.s_str, "Q K^T");
    bd.matmul(q, kt, s1, "Q K^T");
    cudnnBackendDescriptor_t s2 = bd.virt(CUDNN_DATA_FLOAT, s.s_dim, s.s_str, "scaled scores");
    bd.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s1, scale, nullptr, s2, "scale scores");
    if (causal) s2 = causal_mask(bd, s, s2, neg_inf);

    cudnnBackendDescriptor_t mx = bd.virt(CUDNN_DATA_FLOAT, s.st_dim, s.st_str, "row max");
    bd.reduction(CUDNN_REDUCE_TENSOR_MAX, s2, mx, "row max");
    cudnnBackendDescriptor_t sub = bd.virt(CUDNN_DATA_FLOAT, s.s_dim, s.s_str, "scores - max");
    bd.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s2, mx, nullptr, sub, "scores - max");
    cudnnBackendDescriptor_t ex = bd.virt(CUDNN_DATA_FLOAT, s.s_dim, s.s_str, "exp");
    bd.pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sub, nullptr, nullptr, ex, "exp");
    cudnnBackendDescriptor_t sum = bd.virt(CUDNN_DATA_FLOAT, s.st_dim, s.st_str, "row sum");
    bd.reduction(CUDNN_REDUCE_TENSOR_ADD, ex, sum, "row sum");
    cudnnBackendDescriptor_t lg = bd.virt(CUDNN_DATA_FLOAT, s.st_dim, s.st_str, "log row sum");
    bd.pointwise(CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, nullptr, nullptr, lg, "log row sum");
    bd.pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, mx, lg, nullptr, stats, "Stats = max + log sum");
    cudnnBackendDescriptor_t pr = bd.virt(CUDNN_DATA_BFLOAT16, s.s_dim, s.s_str, "probabilities");
    bd.pointwise(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, ex, sum, nullptr, pr, "probabilities");
    bd.matmul(pr, v, o, "P V");

    p->uids = {kUidQ, kUidK, kUidV, kUidO, kUidStats, kUidScale};
    if (causal) p->uids.push_back(kUidNegInf);
}

// Backward as the flash-attention backward graph, probabilities recomputed from Stats:
//   Dsum = rowsum(dO * O)                      (workspace, fp32)
//   P    = exp((Q K^T) * scale - Stats)        [causal mask before the exp]
//   dV   = P^T dO                              (summed over each head group for GQA)
//   dS   = P * (dO V^T - Dsum) * scale
//   dK   = dS^T Q                              (summed over each head group for GQA)
//   dQ   = dS K                                (fp32 accumulator in the workspace, then bf16)
// Deterministic (training.deterministic): dQ = dS K written directly, without the
// accumulator that the engine reaches with atomics (cuDNN frontend's deterministic variant
// of its SDPA backward on Hopper), and the head-group sums as deterministic reductions.
void describe_bwd_graph(Builder &bd, const Shapes &s, bool causal, bool deterministic, Plan *p) {
    cudnnBackendDescriptor_t q = bd.io(kUidQ, CUDNN_DATA_BFLOAT16, s.q_dim, s.q_str, "Q");
    cudnnBackendDescriptor_t kt = bd.io(kUidK, CUDNN_DATA_BFLOAT16, s.kt_dim, s.kt_str, "K transposed");
    cudnnBackendDescriptor_t vt = bd.io(kUidV, CUDNN_DATA_BFLOAT16, s.kt_dim, s.kt_str, "V transposed");
    cudnnBackendDescriptor_t o = bd.io(kUidO, CUDNN_DATA_BFLOAT16, s.q_dim, s.q_str, "O");
    cudnnBackendDescriptor_t d_o = bd.io(kUidDO, CUDNN_DATA_BFLOAT16, s.q_dim, s.q_str, "dO");
    cudnnBackendDescriptor_t stats = bd.io(kUidStats, CUDNN_DATA_FLOAT, s.st_dim, s.st_str, "Stats");
    cudnnBackendDescriptor_t dq = bd.io(kUidDQ, CUDNN_DATA_BFLOAT16, s.q_dim, s.q_str, "dQ");
    cudnnBackendDescriptor_t dk = bd.io(kUidDK, CUDNN_DATA_BFLOAT16, s.kv_dim, s.kv_str, "dK");
    cudnnBackendDescriptor_t dv = bd.io(kUidDV, CUDNN_DATA_BFLOAT16, s.kv_dim, s.kv_str, "dV");
    cudnnBackendDescriptor_t scale = bd.scalar(kUidScale, "attention scale");
    cudnnBackendDescriptor_t one = bd.scalar(kUidOne, "one");
    cudnnBackendDescriptor_t neg_inf = causal ? bd.scalar(kUidNegInf, "mask value") : nullptr;
    cudnnBackendDescriptor_t dsum =
        bd.io(kUidSoftmaxSum, CUDNN_DATA_FLOAT, s.st_dim, s.st_str, "rowsum(dO * O) (workspace)");
    cudnnBackendDescriptor_t dq_acc = deterministic
        ? nullptr
        : bd.io(kUidDQAccum, CUDNN_DATA_FLOAT, s.dqa_dim, s.dqa_str, "dQ accumulator (workspace)");

    // Dsum = rowsum(dO * O) * 1
    Dims prod_str = dims4(s.h * s.sq * s.d, s.sq * s.d, s.h * s.d, 1);
    cudnnBackendDescriptor_t prod = bd.virt(CUDNN_DATA_FLOAT, s.q_dim, prod_str, "dO * O");
    bd.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, d_o, o, nullptr, prod, "dO * O");
    cudnnBackendDescriptor_t rsum = bd.virt(CUDNN_DATA_FLOAT, s.st_dim, s.st_str, "rowsum(dO * O)");
    bd.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, rsum, "rowsum(dO * O)");
    bd.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, rsum, one, nullptr, dsum, "rowsum(dO * O) * 1");

    // P = exp(S * scale - Stats), masked
    cudnnBackendDescriptor_t sc = bd.virt(CUDNN_DATA_FLOAT, s.s_dim, s.s_str, "Q K^T");
    bd.matmul(q, kt, sc, "Q K^T");
    cudnnBackendDescriptor_t sc2 = bd.virt(CUDNN_DATA_FLOAT, s.s_dim, s.s_str, "scaled scores");
    bd.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, sc, scale, nullptr, sc2, "scale scores");
    cudnnBackendDescriptor_t sc3 = bd.virt(CUDNN_DATA_FLOAT, s.s_dim, s.s_str, "scores - Stats");
    bd.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, sc2, stats, nullptr, sc3, "scores - Stats");
    if (causal) sc3 = causal_mask(bd, s, sc3, neg_inf);
    cudnnBackendDescriptor_t pr = bd.virt(CUDNN_DATA_FLOAT, s.s_dim, s.s_str, "probabilities");
    bd.pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sc3, nullptr, nullptr, pr, "probabilities");

    // dV = P^T dO
    cudnnBackendDescriptor_t prT = bd.virt(CUDNN_DATA_BFLOAT16, s.sT_dim, s.sT_str, "P^T");
    bd.reshape(pr, prT, "P^T");
    if (s.h == s.kv) {
        bd.matmul(prT, d_o, dv, "P^T dO");
    } else {
        cudnnBackendDescriptor_t dvh = bd.virt(CUDNN_DATA_BFLOAT16, s.hk_dim, s.hk_str, "P^T dO per query head");
        bd.matmul(prT, d_o, dvh, "P^T dO");
        bd.reduction(CUDNN_REDUCE_TENSOR_ADD, dvh, dv, "dV head-group sum");
    }

    // dS = P * (dO V^T - Dsum) * scale
    cudnnBackendDescriptor_t dp = bd.virt(CUDNN_DATA_FLOAT, s.s_dim, s.s_str, "dO V^T");
    bd.matmul(d_o, vt, dp, "dO V^T");
    cudnnBackendDescriptor_t dp2 = bd.virt(CUDNN_DATA_FLOAT, s.s_dim, s.s_str, "dP - Dsum");
    bd.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, dsum, nullptr, dp2, "dP - Dsum");
    cudnnBackendDescriptor_t dp3 = bd.virt(CUDNN_DATA_FLOAT, s.s_dim, s.s_str, "P (dP - Dsum)");
    bd.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp2, pr, nullptr, dp3, "P (dP - Dsum)");
    cudnnBackendDescriptor_t ds = bd.virt(CUDNN_DATA_FLOAT, s.s_dim, s.s_str, "dS");
    bd.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp3, scale, nullptr, ds, "dS scale");

    // dK = dS^T Q
    cudnnBackendDescriptor_t dsT = bd.virt(CUDNN_DATA_BFLOAT16, s.sT_dim, s.sT_str, "dS^T");
    bd.reshape(ds, dsT, "dS^T");
    if (s.h == s.kv) {
        bd.matmul(dsT, q, dk, "dS^T Q");
    } else {
        cudnnBackendDescriptor_t dkh = bd.virt(CUDNN_DATA_BFLOAT16, s.hk_dim, s.hk_str, "dS^T Q per query head");
        bd.matmul(dsT, q, dkh, "dS^T Q");
        bd.reduction(CUDNN_REDUCE_TENSOR_ADD, dkh, dk, "dK head-group sum");
    }

    // dQ = dS K (K seen untransposed), through the fp32 accumulator
    cudnnBackendDescriptor_t k = bd.virt(CUDNN_DATA_BFLOAT16, s.kv_dim, s.kv_str, "K");
    bd.reshape(kt, k, "K untransposed");
    if (deterministic) {
        bd.matmul(ds, k, dq, "dS K");
    } else {
        bd.matmul(ds, k, dq_acc, "dS K");
        bd.pointwise(CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dq_acc, nullptr, nullptr, dq, "dQ from accumulator");
    }

    p->uids = {kUidQ,  kUidK,  kUidV,  kUidO,     kUidDO,  kUidStats,
               kUidDQ, kUidDK, kUidDV, kUidScale, kUidOne, kUidSoftmaxSum};
    if (!deterministic) p->uids.push_back(kUidDQAccum);
    if (causal) p->uids.push_back(kUidNegInf);
}

// Backward as one SDPA operation (non-causal; tried when the graph finds no engine).
void describe_bwd_single(Builder &bd, const Shapes &s, Plan *p) {
    cudnnBackendDescriptor_t q = bd.io(kUidQ, CUDNN_DATA_BFLOAT16, s.q_dim, s.q_str, "Q");
    cudnnBackendDescriptor_t k = bd.io(kUidK, CUDNN_DATA_BFLOAT16, s.kv_dim, s.kv_str, "K");
    cudnnBackendDescriptor_t v = bd.io(kUidV, CUDNN_DATA_BFLOAT16, s.kv_dim, s.kv_str, "V");
    cudnnBackendDescriptor_t o = bd.io(kUidO, CUDNN_DATA_BFLOAT16, s.q_dim, s.q_str, "O");
    cudnnBackendDescriptor_t d_o = bd.io(kUidDO, CUDNN_DATA_BFLOAT16, s.q_dim, s.q_str, "dO");
    cudnnBackendDescriptor_t st = bd.io(kUidStats, CUDNN_DATA_FLOAT, s.st_dim, s.st_str, "Stats");
    cudnnBackendDescriptor_t dq = bd.io(kUidDQ, CUDNN_DATA_BFLOAT16, s.q_dim, s.q_str, "dQ");
    cudnnBackendDescriptor_t dk = bd.io(kUidDK, CUDNN_DATA_BFLOAT16, s.kv_dim, s.kv_str, "dK");
    cudnnBackendDescriptor_t dv = bd.io(kUidDV, CUDNN_DATA_BFLOAT16, s.kv_dim, s.kv_str, "dV");
    cudnnBackendDescriptor_t sc = bd.scalar(kUidScale, "attention scale");
    const char *w = "SDPA backward operation";
    cudnnBackendDescriptor_t op = bd.create(CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC, q, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC, k, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC, v, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC, o, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC, d_o, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC, st, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_SCALEDESC, sc, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC, dq, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC, dk, w);
    bd.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC, dv, w);
    bd.finalize(op, w);
    bd.add_op(op);
    p->uids = {kUidQ, kUidK, kUidV, kUidO, kUidDO, kUidStats, kUidDQ, kUidDK, kUidDV, kUidScale};
}

// Describes `kind` and builds its plan into p; false with p->error set when cuDNN declines.
bool try_build(PlanKind kind, Plan *p) {
    const Shapes s = shapes_of(p->key);
    const bool causal = p->key.causal != 0, deterministic = p->key.deterministic != 0;
    Builder bd(g.handle);
    bd.require_deterministic(deterministic);
    p->uids.clear();
    switch (kind) {
    case kFwdSingleOp: describe_fwd_single(bd, s, p); break;
    case kFwdGraph: describe_fwd_graph(bd, s, causal, p); break;
    case kBwdGraph: describe_bwd_graph(bd, s, causal, deterministic, p); break;
    case kBwdSingleOp: describe_bwd_single(bd, s, p); break;
    }
    int64_t ws = 0;
    cudnnBackendDescriptor_t plan = bd.failed() ? nullptr : bd.plan(&ws);
    if (!plan) {
        snprintf(p->error, sizeof p->error, "%s: %s", kind_name(kind), bd.error());
        return false;
    }
    p->kind = kind;
    p->plan = plan;
    p->keep = bd.release();
    p->cudnn_ws = (size_t)ws;
    p->ws_total = p->cudnn_ws;
    if (kind == kBwdGraph) {
        size_t rows = (size_t)s.b * (size_t)s.h * (size_t)s.sq;
        p->off_softmax_sum = align256(p->cudnn_ws);
        p->off_dq_accum = p->off_softmax_sum + align256(rows * sizeof(float));
        p->dq_accum_bytes = deterministic ? 0 : rows * (size_t)s.d * sizeof(float);
        p->ws_total = p->off_dq_accum + align256(p->dq_accum_bytes);
    }
    p->ok = true;
    return true;
}

void destroy_plan(Plan *p) {
    for (size_t i = p->keep.size(); i > 0; i--) cudnnBackendDestroyDescriptor(p->keep[i - 1]);
    delete p;
}

// Why the cuDNN version the process runs with cannot take this direction and shape (too
// old, or a known bug); nullptr when it can.
// (kernels/ops_paths.h: the description of the backend, kernels/op_costs.h, asks the same)
const char *version_problem(int backward, int sk) {
    return ops_path_cudnn_version_problem((int)cudnnGetVersion(), backward, sk);
}

// Shapes the fused kernels refuse although a plan might build.
const char *shape_problem(const ops_attn_shape *s, int backward) { return ops_path_cudnn_shape_problem(s, backward); }

PlanKey key_of(const ops_attn_shape *s, int backward) {
    PlanKey k;
    k.b = s->b, k.sq = s->sq, k.sk = s->sk, k.h = s->h, k.kv = s->kv, k.d = s->d;
    k.causal = s->causal ? 1 : 0;
    k.backward = backward ? 1 : 0;
    k.deterministic = backward && g.deterministic ? 1 : 0;
    memcpy(&k.scale_bits, &s->scale, sizeof k.scale_bits);
    return k;
}

bool ensure_handle(char *err, size_t errlen) {
    int dev = -1;
    cudaError_t ce = cudaGetDevice(&dev);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "cudaGetDevice: %s", cudaGetErrorString(ce));
        return false;
    }
    if (g.handle) {
        if (dev != g.device) {
            snprintf(err, errlen, "cuDNN plans were built on device %d, the current device is %d", g.device, dev);
            return false;
        }
        return true;
    }
    cudnnStatus_t st = cudnnCreate(&g.handle);
    if (st != CUDNN_STATUS_SUCCESS) {
        g.handle = nullptr;
        put_status(err, errlen, "cudnnCreate", st);
        return false;
    }
    g.device = dev;
    return true;
}

// The cached plan of this shape and direction, built on first use; nullptr with err set
// when there is none. Caller holds g.mu.
Plan *get_plan(const ops_attn_shape *s, int backward, char *err, size_t errlen) {
    if (!ensure_handle(err, errlen)) return nullptr;
    PlanKey key = key_of(s, backward);
    for (int i = 0; i < g.nplans; i++) {
        if (key_eq(g.plans[i]->key, key)) {
            Plan *p = g.plans[i];
            if (!p->ok) {
                snprintf(err, errlen, "%s", p->error);
                return nullptr;
            }
            return p;
        }
    }
    if (g.nplans == kMaxPlans) {
        snprintf(err, errlen, "cuDNN SDPA plan table full (%d shapes)", kMaxPlans);
        return nullptr;
    }
    Plan *p = new Plan;
    p->key = key;
    p->scale = s->scale;
    p->neg_inf = cudnnGetVersion() < 91000 ? -FLT_MAX : -INFINITY;
    p->one = 1.f;
    const char *vp = version_problem(backward, s->sk);
    if (!vp) vp = shape_problem(s, backward);
    if (vp) {
        snprintf(p->error, sizeof p->error, "not supported: %s", vp);
    } else {
        const bool single_ok = !s->causal && cudnnGetVersion() >= 91301;
        char first[768] = {0};
        bool built;
        if (!backward) {
            built = single_ok && try_build(kFwdSingleOp, p);
            if (!built && single_ok) snprintf(first, sizeof first, "%s", p->error);
            if (!built) built = try_build(kFwdGraph, p);
        } else {
            built = try_build(kBwdGraph, p);
            if (!built && single_ok) {
                snprintf(first, sizeof first, "%s", p->error);
                built = try_build(kBwdSingleOp, p);
            }
        }
        if (!built && first[0]) {
            // "first failure; second failure", truncated to fit
            char second[768];
            snprintf(second, sizeof second, "%s", p->error);
            snprintf(p->error, sizeof p->error, "%s", first);
            size_t n = strlen(p->error);
            for (const char *t = "; "; *t && n + 1 < sizeof p->error; t++) p->error[n++] = *t;
            for (const char *t = second; *t && n + 1 < sizeof p->error; t++) p->error[n++] = *t;
            p->error[n] = 0;
        }
    }
    g.plans[g.nplans++] = p;
    if (!p->ok) {
        snprintf(g.last_error, sizeof g.last_error, "%s", p->error);
        snprintf(err, errlen, "%s", p->error);
        return nullptr;
    }
    return p;
}

bool aligned16(const void *ptr) { return ((uintptr_t)ptr & 15) == 0; }

int execute(Plan *p, void *const *ptrs_by_uid, void *workspace, size_t workspace_bytes, void *stream, char *err,
            size_t errlen) {
    if (p->ws_total > 0 && (!workspace || workspace_bytes < p->ws_total)) {
        snprintf(err, errlen, "cuDNN SDPA needs %zu workspace bytes, got %zu", p->ws_total,
                 workspace ? workspace_bytes : (size_t)0);
        return -1;
    }
    if (workspace && !aligned16(workspace)) {
        snprintf(err, errlen, "cuDNN SDPA workspace is not 16-byte aligned");
        return -1;
    }
    std::vector<void *> ptrs;
    ptrs.reserve(p->uids.size());
    for (int64_t uid : p->uids) {
        void *ptr = nullptr;
        switch (uid) {
        case kUidScale: ptr = &p->scale; break;
        case kUidNegInf: ptr = &p->neg_inf; break;
        case kUidOne: ptr = &p->one; break;
        case kUidSoftmaxSum: ptr = (char *)workspace + p->off_softmax_sum; break;
        case kUidDQAccum: ptr = (char *)workspace + p->off_dq_accum; break;
        default:
            ptr = ptrs_by_uid[uid];
            if (!ptr || !aligned16(ptr)) {
                snprintf(err, errlen, "cuDNN SDPA tensor %lld is %s", (long long)uid,
                         ptr ? "not 16-byte aligned" : "NULL");
                return -1;
            }
        }
        ptrs.push_back(ptr);
    }
    cudnnStatus_t st = cudnnSetStream(g.handle, (cudaStream_t)stream);
    if (st != CUDNN_STATUS_SUCCESS) {
        put_status(err, errlen, "cudnnSetStream", st);
        return -1;
    }
    if (p->kind == kBwdGraph && p->dq_accum_bytes && ops_path_cudnn_zero_dq_accum((int)cudnnGetVersion())) {
        // before 9.6 the engine expects a zeroed dQ accumulator
        cudaError_t ce =
            cudaMemsetAsync((char *)workspace + p->off_dq_accum, 0, p->dq_accum_bytes, (cudaStream_t)stream);
        if (ce != cudaSuccess) {
            cudaGetLastError();
            snprintf(err, errlen, "cudaMemsetAsync(dQ accumulator): %s", cudaGetErrorString(ce));
            return -1;
        }
    }
    cudnnBackendDescriptor_t pack = nullptr;
    st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (st != CUDNN_STATUS_SUCCESS) {
        put_status(err, errlen, "cudnnBackendCreateDescriptor(variant pack)", st);
        return -1;
    }
    const char *call = "cudnnBackendSetAttribute(variant pack)";
    st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)p->uids.size(),
                                  p->uids.data());
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                      (int64_t)ptrs.size(), ptrs.data());
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendFinalize(variant pack)";
        st = cudnnBackendFinalize(pack);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendExecute";
        st = cudnnBackendExecute(g.handle, p->plan, pack);
    }
    if (st != CUDNN_STATUS_SUCCESS) {
        char c[200];
        snprintf(c, sizeof c, "%s [%s]", call, kind_name(p->kind));
        put_status(err, errlen, c, st);
    }
    cudnnBackendDestroyDescriptor(pack);
    return st == CUDNN_STATUS_SUCCESS ? 0 : -1;
}

bool valid_shape(const ops_attn_shape *s) {
    return s && s->b > 0 && s->sq > 0 && s->sk > 0 && s->h > 0 && s->kv > 0 && s->d > 0 && s->h % s->kv == 0;
}

} // namespace

extern "C" int cuda_cudnn_version(void) { return (int)cudnnGetVersion(); }

// The shape rules live in kernels/ops_paths.h, shared with the backend's description.
extern "C" int cuda_cudnn_sdpa_supported(const ops_attn_shape *s) {
    if (!valid_shape(s)) return 0;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return ops_path_cudnn_sdpa_shape(s, major, (int)cudnnGetVersion());
}

extern "C" size_t cuda_cudnn_sdpa_workspace_size(const ops_attn_shape *s, int backward) {
    std::lock_guard<std::mutex> lock(g.mu);
    if (!cuda_cudnn_sdpa_supported(s)) {
        snprintf(g.last_error, sizeof g.last_error, "cuDNN SDPA: shape not supported");
        return (size_t)-1;
    }
    char err[768];
    Plan *p = get_plan(s, backward, err, sizeof err);
    if (!p) {
        snprintf(g.last_error, sizeof g.last_error, "%s", err);
        return (size_t)-1;
    }
    return p->ws_total;
}

extern "C" int cuda_cudnn_sdpa_forward(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                       const uint16_t *v, const ops_attn_shape *s, void *workspace,
                                       size_t workspace_bytes, void *stream, char *err, size_t errlen) {
    char local[768];
    if (!err || !errlen) err = local, errlen = sizeof local;
    std::lock_guard<std::mutex> lock(g.mu);
    if (!cuda_cudnn_sdpa_supported(s)) {
        snprintf(err, errlen, "cuDNN SDPA: shape not supported");
        return -1;
    }
    Plan *p = get_plan(s, 0, err, errlen);
    if (!p) return -1;
    void *by_uid[kUidVirtual] = {};
    by_uid[kUidQ] = (void *)q;
    by_uid[kUidK] = (void *)k;
    by_uid[kUidV] = (void *)v;
    by_uid[kUidO] = out;
    by_uid[kUidStats] = lse;
    return execute(p, by_uid, workspace, workspace_bytes, stream, err, errlen);
}

extern "C" int cuda_cudnn_sdpa_backward(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout,
                                        const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *out,
                                        const float *lse, const ops_attn_shape *s, void *workspace,
                                        size_t workspace_bytes, void *stream, char *err, size_t errlen) {
    char local[768];
    if (!err || !errlen) err = local, errlen = sizeof local;
    std::lock_guard<std::mutex> lock(g.mu);
    if (!cuda_cudnn_sdpa_supported(s)) {
        snprintf(err, errlen, "cuDNN SDPA: shape not supported");
        return -1;
    }
    Plan *p = get_plan(s, 1, err, errlen);
    if (!p) return -1;
    void *by_uid[kUidVirtual] = {};
    by_uid[kUidQ] = (void *)q;
    by_uid[kUidK] = (void *)k;
    by_uid[kUidV] = (void *)v;
    by_uid[kUidO] = (void *)out;
    by_uid[kUidDO] = (void *)dout;
    by_uid[kUidStats] = (void *)lse;
    by_uid[kUidDQ] = dq;
    by_uid[kUidDK] = dk;
    by_uid[kUidDV] = dv;
    return execute(p, by_uid, workspace, workspace_bytes, stream, err, errlen);
}

extern "C" void cuda_cudnn_set_deterministic(int on) {
    std::lock_guard<std::mutex> lock(g.mu);
    g.deterministic = on != 0;
}

extern "C" const char *cuda_cudnn_last_error(void) {
    // read without the lock: a diagnostic string, written only under it
    return g.last_error;
}

extern "C" void cuda_cudnn_shutdown(void) {
    std::lock_guard<std::mutex> lock(g.mu);
    for (int i = 0; i < g.nplans; i++) destroy_plan(g.plans[i]);
    g.nplans = 0;
    if (g.handle) cudnnDestroy(g.handle);
    g.handle = nullptr;
    g.device = -1;
    g.last_error[0] = 0;
}

#else // built without cuDNN: nothing is supported, the caller always runs its own kernels

static void no_cudnn(char *err, size_t errlen) {
    if (err && errlen) snprintf(err, errlen, "built without cuDNN");
}

extern "C" int cuda_cudnn_version(void) { return 0; }

extern "C" int cuda_cudnn_sdpa_supported(const ops_attn_shape *s) {
    (void)s;
    return 0;
}

extern "C" size_t cuda_cudnn_sdpa_workspace_size(const ops_attn_shape *s, int backward) {
    (void)s, (void)backward;
    return (size_t)-1;
}

extern "C" int cuda_cudnn_sdpa_forward(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                       const uint16_t *v, const ops_attn_shape *s, void *workspace,
                                       size_t workspace_bytes, void *stream, char *err, size_t errlen) {
    (void)out, (void)lse, (void)q, (void)k, (void)v, (void)s, (void)workspace, (void)workspace_bytes, (void)stream;
    no_cudnn(err, errlen);
    return -1;
}

extern "C" int cuda_cudnn_sdpa_backward(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout,
                                        const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *out,
                                        const float *lse, const ops_attn_shape *s, void *workspace,
                                        size_t workspace_bytes, void *stream, char *err, size_t errlen) {
    (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)s;
    (void)workspace, (void)workspace_bytes, (void)stream;
    no_cudnn(err, errlen);
    return -1;
}

extern "C" void cuda_cudnn_set_deterministic(int on) { (void)on; }

extern "C" const char *cuda_cudnn_last_error(void) { return "built without cuDNN"; }

extern "C" void cuda_cudnn_shutdown(void) {}

#endif
