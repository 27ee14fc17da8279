// kernels/cuda/cuda_graph.cu — a training step recorded from the compute stream and
// launched as one CUDA graph (ops.h graph_begin, graph_end, graph_stats).
//
// Each step is captured anew (stream capture, thread-local mode) and the executable graph
// of the step before is updated with it (cudaGraphExecUpdate: the same kernels in the same
// order, new arguments), so whatever the host passes by value (the learning rate, the
// loss scale, pointers that alternate between steps) is the step's own, and a step whose
// work differs (another topology) builds a new executable graph instead of replaying a
// stale one. The host still issues every op, but into the recording: the device then runs
// the step's kernels back to back, with no launch gaps between them.
//
// Copies from the host (copy_h2d_async) read page-locked memory when the graph runs, not
// when they are recorded: each step stages them in one of two areas of the graph's own,
// which the host writes again only after the launch that read it has run (an event).
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace {
enum { AREAS = 2 };
struct area {
    char *p;
    size_t cap, used;
    cudaEvent_t ran; // recorded after the launch that read it
    int pending;     // ran has been recorded
};
area g_area[AREAS];
int g_cur = -1;  // the area of the step being captured (or last captured)
int g_capturing; // between graph_begin and graph_end
cudaGraphExec_t g_exec;
ops_graph_stats g_stats;

int fail(char *err, size_t errlen, const char *what, cudaError_t e) {
    snprintf(err, errlen, "cuda graph: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    cudaGetLastError();
    return -1;
}
} // namespace

int cuda_graph_capturing(void) { return g_capturing; }

void *cuda_graph_stage(size_t bytes) {
    area *a = &g_area[g_cur];
    const size_t need = (bytes + 255) & ~(size_t)255;
    if (a->used + need > a->cap) {
        fprintf(stderr,
                "cuda graph: the captured step stages more than the %zu bytes of host copies its caller announced "
                "(%zu more asked)\n",
                a->cap, bytes);
        abort();
    }
    char *p = a->p + a->used;
    a->used += need;
    return p;
}

extern "C" int cuda_graph_begin(size_t staging_bytes, char *err, size_t errlen) {
    cudaStream_t st = cuda_stream();
    if (g_capturing) {
        snprintf(err, errlen, "cuda graph: graph_begin while a step is already being captured");
        return -1;
    }
    g_cur = (g_cur + 1) % AREAS;
    area *a = &g_area[g_cur];
    if (!a->ran) CUDA_CHECK(cudaEventCreateWithFlags(&a->ran, cudaEventDisableTiming));
    if (a->pending) cuda_wait_event(a->ran); // the launch before last still reads it
    a->pending = 0;
    const size_t cap = (staging_bytes + 255) & ~(size_t)255;
    if (a->cap < cap) {
        if (a->p) CUDA_CHECK(cudaFreeHost(a->p));
        a->p = NULL;
        a->cap = 0;
        cudaError_t e = cudaHostAlloc((void **)&a->p, cap, cudaHostAllocDefault);
        if (e != cudaSuccess) return fail(err, errlen, "page-locked staging for the step's host copies", e);
        a->cap = cap;
    }
    a->used = 0;
    cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return fail(err, errlen, "cudaStreamBeginCapture", e);
    g_capturing = 1;
    return 0;
}

extern "C" int cuda_graph_end(char *err, size_t errlen) {
    cudaStream_t st = cuda_stream();
    if (!g_capturing) {
        snprintf(err, errlen, "cuda graph: graph_end without graph_begin");
        return -1;
    }
    g_capturing = 0;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(st, &graph);
    if (e != cudaSuccess) return fail(err, errlen, "the step's capture (cudaStreamEndCapture)", e);
    size_t nodes = 0;
    CUDA_CHECK(cudaGraphGetNodes(graph, NULL, &nodes));
    int updated = 0;
    if (g_exec) {
        cudaGraphExecUpdateResultInfo info;
        updated = cudaGraphExecUpdate(g_exec, graph, &info) == cudaSuccess;
        if (!updated) { // another topology: build it anew
            cudaGetLastError();
            CUDA_CHECK(cudaGraphExecDestroy(g_exec));
            g_exec = NULL;
        }
    }
    if (!g_exec) {
        e = cudaGraphInstantiate(&g_exec, graph, 0);
        if (e != cudaSuccess) {
            g_exec = NULL;
            CUDA_CHECK(cudaGraphDestroy(graph));
            return fail(err, errlen, "cudaGraphInstantiate", e);
        }
        g_stats.instantiations++;
    }
    CUDA_CHECK(cudaGraphDestroy(graph));
    e = cudaGraphLaunch(g_exec, st);
    if (e != cudaSuccess) return fail(err, errlen, "cudaGraphLaunch", e);
    CUDA_CHECK(cudaEventRecord(g_area[g_cur].ran, st));
    g_area[g_cur].pending = 1;
    g_stats.launches++;
    g_stats.updates += (uint64_t)updated;
    g_stats.nodes = nodes;
    return 0;
}

extern "C" void cuda_graph_stats(ops_graph_stats *out) { *out = g_stats; }
