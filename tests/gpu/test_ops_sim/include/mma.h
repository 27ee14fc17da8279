// tests/gpu/test_ops_sim/include/mma.h — the simulator's stand-in for CUDA's warp matrix
// functions (nvcuda::wmma): 16 x 16 x 16 tiles, bf16 operands, fp32 accumulators, the
// subset kernels/cuda uses.
//
// On the device a fragment is spread over the 32 lanes of a warp in an order the API
// leaves unspecified, and every call is made by the whole warp. Here each lane (a
// coroutine of its own, include/sim.h) owns the accumulator elements e = lane + 32 m
// (m = 0..7) of the row-major 16 x 16 tile, i.e. column lane % 16 of the rows of parity
// lane / 16: a load or store moves only the lane's elements, and mma_sync computes them
// from the rows of A and the column of B it loaded. The 32 lanes together then read,
// compute and write every element exactly once, so no lane sees another's half-done work
// without a barrier, as on the device; a kernel that reads a fragment's elements directly
// (fragment::x) is not supported.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the simulator has 16 x 16 x 16 tiles only");
    float v[256]; // the logical tile, row-major (only the lane's part is meaningful)
};

inline int sim_lane() { return (int)(threadIdx.x & 31); }

inline float sim_bf16_to_f32(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

template <typename Use, typename T, typename L> inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, float x) {
    for (int i = 0; i < 256; i++) f.v[i] = x;
}

// A: the lane's rows (parity lane / 16), all 16 columns; element (i, k) of the tile.
template <typename L>
inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, __nv_bfloat16, L> &f, const __nv_bfloat16 *p,
                             unsigned ldm) {
    const bool col = std::is_same<L, col_major>::value;
    for (int i = sim_lane() / 16; i < 16; i += 2)
        for (int k = 0; k < 16; k++)
            f.v[i * 16 + k] = sim_bf16_to_f32(col ? p[(size_t)k * ldm + i] : p[(size_t)i * ldm + k]);
}

// B: the lane's column (lane % 16), all 16 rows; element (k, j) of the tile.
template <typename L>
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, __nv_bfloat16, L> &f, const __nv_bfloat16 *p,
                             unsigned ldm) {
    const bool col = std::is_same<L, col_major>::value;
    const int j = sim_lane() % 16;
    for (int k = 0; k < 16; k++)
        f.v[k * 16 + j] = sim_bf16_to_f32(col ? p[(size_t)j * ldm + k] : p[(size_t)k * ldm + j]);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm, layout_t l) {
    for (int e = sim_lane(); e < 256; e += 32) {
        const int i = e / 16, j = e % 16;
        f.v[e] = l == mem_row_major ? p[(size_t)i * ldm + j] : p[(size_t)j * ldm + i];
    }
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm, layout_t l) {
    for (int e = sim_lane(); e < 256; e += 32) {
        const int i = e / 16, j = e % 16;
        (l == mem_row_major ? p[(size_t)i * ldm + j] : p[(size_t)j * ldm + i]) = f.v[e];
    }
}

// d = a b + c over the lane's elements; products of bf16 values are exact in fp32.
template <typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c) {
    for (int e = sim_lane(); e < 256; e += 32) {
        const int i = e / 16, j = e % 16;
        float acc = c.v[e];
        for (int k = 0; k < 16; k++) acc += a.v[i * 16 + k] * b.v[k * 16 + j];
        d.v[e] = acc;
    }
}

} // namespace wmma
} // namespace nvcuda
