/* dtype.h — the element types every module names: tensors in the op table
 * (kernels/ops.h), checkpoints, safetensors and communication buffers. */
#ifndef TETRA_UTIL_DTYPE_H
#define TETRA_UTIL_DTYPE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TETRA_F32 = 0,
    TETRA_BF16 = 1,
    TETRA_F16 = 2,
    TETRA_FP8_E4M3 = 3, // float8_e4m3fn: max 448, no inf, NaN = 0x7f/0xff
    TETRA_FP8_E5M2 = 4, // float8_e5m2: max 57344, inf, NaN = 0x7e/0xfe (as ml_dtypes/torch)
    TETRA_I32 = 5,
} tetra_dtype;

size_t tetra_dtype_size(tetra_dtype t);
/* PyTorch's name: float32, bfloat16, float16, float8_e4m3fn, float8_e5m2, int32 */
const char *tetra_dtype_name(tetra_dtype t);

#ifdef __cplusplus
}
#endif

#endif
