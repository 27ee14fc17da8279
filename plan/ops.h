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
 * up (external batches of made-up tokens; the config's parallel degrees must all be 1),
 * runs its warm-up microbatch and one step, then mark(user, 1), one more step with a
 * trace whose spans go to ops->range_push (no file is written), and mark(user, 0).
 * init_weights: draw the initial weights (a table that computes needs them; a
 * recording one reads no value). MPI must be initialised (a world of one rank is
 * enough). 0, or -1 with err. */
int plan_ops_run(const tetra_config *cfg, const tetra_ops *ops, int init_weights, void (*mark)(void *user, int on),
                 void *user, char *err, size_t errlen);

/* The report of `tetra plan --job.config_file F ... --ops [--block N] [--json]` for the
 * hardware profile hw (its datasheet rates). block < 0: the middle one. Prints to
 * stdout; the exit status (0, 1 when the step cannot be recorded, 2 for a bad block). */
int plan_ops_main(const tetra_config *cfg, const plan_hw *hw, int block, int json);

#endif
