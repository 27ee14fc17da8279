// tests/gpu/test_ops_sim/include/cuda_runtime.h — the simulator stands in for the CUDA runtime.
#include "sim.h"
