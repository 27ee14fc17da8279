// tests/gpu/test_ops_sim/include/cuda_bf16.h — the simulator's bf16 type: the storage only
// (kernels/cuda convert bf16 through ops_math.h's bit operations, not through this type).
#pragma once
#include <cstdint>

struct __nv_bfloat16 {
    uint16_t bits;
};
