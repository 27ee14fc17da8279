/* ops_record.h — an op table that records what the CUDA backend would do.
 *
 * Every compute or copy member of the table describes its call with kernels/op_costs.h
 * (launches, bytes, FLOPs of the CUDA path these arguments take on `dev`) and, while
 * recording is on, appends it with the name of the innermost range open at the time
 * (range_push/range_pop: the trainer's trace spans, telemetry/trace.h). Then:
 * - without a base table it computes nothing: alloc hands out addresses from a reserved
 *   region that is never readable or writable (PROT_NONE: a host dereference crashes
 *   instead of reading made-up values), release forgets them, copy_d2h writes zeros,
 *   host_memory = 0 (the trainer treats the memory as a GPU's), select_device is NULL;
 *   the table is named "cuda", the backend it describes;
 * - with a base table every member also calls the base's (with its name, memory and
 *   host_memory): a counting wrapper around a real backend (the CPU's in the tests, the
 *   CUDA kernels on the simulator in tests/gpu).
 * One recorder per process: ops_record_table resets it. Not thread-safe (the trainer
 * issues ops from one thread). */
#ifndef TETRA_KERNELS_OPS_RECORD_H
#define TETRA_KERNELS_OPS_RECORD_H

#include <stddef.h>

#include "kernels/op_costs.h"
#include "kernels/ops.h"

typedef struct {
    op_cost cost;
    int span; /* ops_record_span_name(span): the innermost open range, -1 for none */
} ops_record_entry;

/* The recording table for device dev, around base (NULL: compute nothing). NULL when the
 * address region cannot be reserved. Resets the records, the spans and the region. */
const tetra_ops *ops_record_table(const op_cost_device *dev, const tetra_ops *base);

/* Records are kept only while on (off at first): the trainer's start-up, warm-up and
 * earlier steps run through the table unrecorded. */
void ops_record_set_active(int on);
/* The share of the causal (query, key) pairs an attention call with document ids leaves
 * visible (0 < share <= 1), which a shape-only record cannot read (the ids live in
 * backend memory): such a call's attention FLOPs are counted at this share of its causal
 * count. The plan sets it from the training corpus's document lengths; 1 (the default
 * and after ops_record_table) counts them as causal. */
void ops_record_set_doc_share(double share);
/* Drop the records (the spans' names stay). */
void ops_record_clear(void);

size_t ops_record_count(void);
const ops_record_entry *ops_record_entries(void);
const char *ops_record_span_name(int span);
/* The device the table describes now (set_deterministic changes it). */
const op_cost_device *ops_record_device(void);

/* Give the reserved address region back (the table must not be used after). */
void ops_record_release(void);

#endif
