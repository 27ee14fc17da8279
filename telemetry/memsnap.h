/* memsnap.h — memory snapshots (TorchTitan's profiling.enable_memory_snapshot): one JSON
 * file per rank with what the rank planned to hold, by category, next to what the
 * backend holds and the process's peak. tetra allocates everything at start-up (one
 * allocation per category), so the categories are the allocations.
 *
 * File: <folder>/rank<r>_memory_snapshot.json, written under a temporary name and
 * renamed:
 *   {"format": "tetra-memory-snapshot", "version": 1, "rank", "step", "reason",
 *    "backend", "bf16_compute",
 *    "categories": [{"name", "bytes", "what"}, ...],   (their sum is "planned_bytes")
 *    "planned_bytes", "allocated_bytes", "allocations", "peak_rss_bytes",
 *    "host_memory_bytes", "device_free_bytes", "device_total_bytes" (0 on the CPU)}
 * tools/plot_memory draws snapshots as a PNG. */
#ifndef TETRA_TELEMETRY_MEMSNAP_H
#define TETRA_TELEMETRY_MEMSNAP_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

/* One planned allocation category: its name in the file, its bytes, what it holds. */
typedef struct {
    const char *name;
    double bytes;
    const char *what;
} memsnap_category;

/* What the rank planned to hold: the categories the caller (the trainer) adds up. */
typedef struct {
    const memsnap_category *cat; /* [n] */
    int n;
    int bf16_compute;
} memsnap_plan;

/* Write rank's snapshot into folder (created if missing). ops may be NULL (nothing
 * allocated yet). 0, or -1 with the path and the reason in err. */
int memsnap_write(const char *folder, int rank, int64_t step, const char *reason, const memsnap_plan *p,
                  const tetra_ops *ops, char *err, size_t errlen);

#endif
