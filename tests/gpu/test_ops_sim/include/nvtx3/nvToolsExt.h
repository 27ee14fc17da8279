/* The simulator's NVTX: ranges are a profiler's business, so they do nothing here. */
#pragma once
static inline int nvtxRangePushA(const char *name) {
    (void)name;
    return 0;
}
static inline int nvtxRangePop(void) { return 0; }
