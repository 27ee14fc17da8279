/* ops.h — `tetra plan --ops`: every op one training step of a config issues on
 * the GPU, with its launches, bytes, FLOPs and roofline time, from the trainer's own op
 * sequence (docs/plan.md).
 *
 * The trainer itself runs the step, on one rank, through a recording op table
 * (kernels/ops_record.h) that describes each call as the CUDA backend would run it
 * (kernels/op_costs.h) and computes nothing; the trace's spans (telemetry/trace.h) name
 * the phase of each op. No GPU, CUDA toolkit or data is needed, and a fusion in the
 * model or the backend shows up as fewer launches and bytes before any device measures
 * it. The numbers are predictions. */
#ifndef TETRA_PLAN_OPS_H
#define TETRA_PLAN_OPS_H

#include <stddef.h>

#include "config/config.h"
#include "plan/hw.h"
#include "kernels/ops.h"

/* One training step of cfg on one rank through the op table `ops`: the trainer is set
 * up (external batches of made-up tokens; the config's parallel degrees must all be 1;
 * weights_per_use: the rank stands for one of an FSDP layout, whose converters treat
 * the weights as gathered and freed around each use),
 * runs its warm-up microbatch and one step, then mark(user, 1), one more step with a
 * trace whose spans go to ops->range_push (no file is written), and mark(user, 0).
 * init_weights: draw the initial weights (a table that computes needs them; a
 * recording one reads no value). MPI must be initialised (a world of one rank is
 * enough). 0, or -1 with err. */
int plan_ops_run(const tetra_config *cfg, const tetra_ops *ops, int init_weights, int weights_per_use,
                 void (*mark)(void *user, int on), void *user, char *err, size_t errlen);

/* The report of `tetra plan --job.config_file F ... --ops [--block N] [--json]` for the
 * hardware profile hw (its datasheet rates). block < 0: the middle one. Prints to
 * stdout; the exit status (0, 1 when the step cannot be recorded, 2 for a bad block). */
int plan_ops_main(const tetra_config *cfg, const plan_hw *hw, int block, int json);

/* The phases of a unit's work in one microbatch. */
enum { PLAN_FWD = 0, PLAN_BWD_I, PLAN_BWD_W, PLAN_PHASES };

/* One unit's time outside attention, from its recorded ops: each op at
 * max(FLOPs / its unit's achieved rate, bytes / achieved bandwidth), the profile's
 * datasheet rates times its efficiencies. per_row: seconds per row of a microbatch;
 * per_step: seconds once per optimizer step (float8's weight casts, taken at the first
 * use after an update). */
typedef struct {
    double per_row[PLAN_PHASES];
    double per_step[PLAN_PHASES];
} plan_unit_time;

/* What `tetra plan`'s step time takes from the op sequence of a GPU profile: one
 * transformer block (a middle one, AC none, one rank), the head (norm, output, loss) and
 * the embedding. */
typedef struct {
    plan_unit_time block, head, embedding;
    double block_gemm_flops_fwd_row; /* the block's forward GEMM FLOPs per row */
} plan_op_times;

/* cfg's block, head and embedding recorded on one rank at two row counts (the model cut
 * to 3 blocks, parallel degrees 1, AC none; sharded: as a rank of an FSDP layout, whose
 * weights are gathered and freed around each use, so that its per_step parts recur
 * every microbatch), each phase fitted as per_step + per_row x rows. Attention is left out: its cost grows with the keys a row sees (the caller's
 * model). The last few answers are kept by model, precision and profile, so a search
 * over layouts records each once. MPI is started if it is not. 0, or -1 with err. */
int plan_op_times_record(const tetra_config *cfg, const plan_hw *hw, int sharded, plan_op_times *out, char *err,
                         size_t errlen);

#endif
