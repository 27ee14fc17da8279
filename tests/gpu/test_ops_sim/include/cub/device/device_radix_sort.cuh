// tests/gpu/test_ops_sim/include/cub/device/device_radix_sort.cuh — CUB's stable radix sort of
// (key, value) pairs, for the CUDA simulator (sim.h): std::stable_sort on the host.
#pragma once
#include "sim.h"
#include <vector>
namespace cub {
struct DeviceRadixSort {
    // stable sort of (key, value) pairs by the key bits [begin, end)
    template <typename K, typename V>
    static cudaError_t SortPairs(void *temp, size_t &bytes, const K *kin, K *kout, const V *vin, V *vout, int n,
                                 int begin, int end, cudaStream_t) {
        if (!temp) {
            bytes = 1024;
            return cudaSuccess;
        } // the size query runs nothing
        sim_sorts++;
        if (end <= 0 || end > 32 || begin != 0) abort();
        if (sim_capturing()) { // runs at each launch of the graph
            sim_capture([=]() { sort(kin, kout, vin, vout, n, end); });
            return cudaSuccess;
        }
        sort(kin, kout, vin, vout, n, end);
        return cudaSuccess;
    }
    template <typename K, typename V> static void sort(const K *kin, K *kout, const V *vin, V *vout, int n, int end) {
        std::vector<int> idx(n);
        for (int i = 0; i < n; i++) idx[i] = i;
        uint32_t mask = end >= 32 ? 0xffffffffu : ((1u << end) - 1);
        std::stable_sort(idx.begin(), idx.end(),
                         [&](int a, int b) { return ((uint32_t)kin[a] & mask) < ((uint32_t)kin[b] & mask); });
        for (int i = 0; i < n; i++) {
            kout[i] = kin[idx[i]];
            vout[i] = vin[idx[i]];
        }
    }
};
} // namespace cub
