/* trace.h — profiling traces ([profiling] enable_profiling, save_traces_folder,
 * profile_freq, profiler_active), TorchTitan's layout: every profile_freq steps each rank
 * writes the last profiler_active steps to
 *   <dump_folder>/<save_traces_folder>/iteration_<step>/rank<r>_trace.json
 * in the Chrome trace format (Perfetto and chrome://tracing open it). Thread 0 holds the
 * nested spans of the training thread — the step, the schedule's actions, each block's
 * forward, input and weight gradient, FSDP's gather waits, the optimizer — and further
 * "comm" threads every collective this rank waited for (group, operation, bytes), one
 * lane per overlapping operation.
 *
 * On a GPU the ops are asynchronous: while a step is recorded, every span boundary
 * synchronises the device, so spans measure device time (the profiled step runs slower),
 * and every span is also an NVTX range of the same name (ops->range_push), for nsys.
 * Spans outside a recorded step cost one branch.
 */
#ifndef TETRA_TELEMETRY_TRACE_H
#define TETRA_TELEMETRY_TRACE_H

#include <stdint.h>

#include "kernels/ops.h"
#include "parallel/comm.h"

typedef struct trace trace;

/* NULL with err set on failure. dir: the traces folder (created when first written).
 * dir NULL or "": no file and no device synchronisation, only the spans' names go to the
 * backend's ranges (ops->range_push), as a recording op table wants them
 * (plan/ops.h). */
trace *trace_create(const char *dir, int rank, int64_t freq, int64_t active, const tetra_ops *ops, comm_world *cw,
                    char *err, size_t errlen);
void trace_free(trace *t);

/* Around each training step: whether it is recorded follows the window; the step that
 * closes a window writes its file. 0, or -1 with err (the file could not be written). */
void trace_step_begin(trace *t, int64_t step);
int trace_step_end(trace *t, int64_t step, char *err, size_t errlen);
/* 1 while the current step is recorded into a trace file and its spans synchronise the
 * device (a step captured as a CUDA graph cannot: training.cuda_graph runs it as it is) */
int trace_timing(const trace *t);

/* The backend's op table with its heavy ops wrapped: while a step is recorded, every GEMM
 * (span "gemm MxNxK dtype", its FLOPs in args), attention forward/backward (shape in the
 * name) and cross-entropy becomes a span of the trace created last, nested in the block
 * span that called it, and so does every host wait of a device backend (blocking copies
 * and synchronisations: "host wait: copy_d2h N B"), nested in the span that asked for it;
 * the trace's own synchronisations are not among them. Use it in place of base for a run
 * that profiles. */
const tetra_ops *trace_ops(const tetra_ops *base);

/* Nested spans on the training thread (no-ops on NULL or outside a recorded step). */
void trace_begin(trace *t, const char *cat, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void trace_end(trace *t);

#endif
