// kernels/ops.c — backend selection and the host-side helpers of ops.h.
#include "kernels/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TETRA_HAVE_CUDA
// Built with the CUDA backend: ops_cuda (kernels/cuda/cuda_backend.cu) is referenced
// strongly, so the static executables always link it in.
#include "kernels/cuda/cuda_device.h"
#endif

size_t ops_dtype_size(tetra_dtype t) {
    switch (t) {
    case TETRA_F32: return 4;
    case TETRA_BF16: return 2;
    case TETRA_F16: return 2;
    case TETRA_FP8_E4M3: return 1;
    case TETRA_FP8_E5M2: return 1;
    case TETRA_I32: return 4;
    }
    return 0;
}

const char *ops_dtype_name(tetra_dtype t) {
    switch (t) {
    case TETRA_F32: return "float32";
    case TETRA_BF16: return "bfloat16";
    case TETRA_F16: return "float16";
    case TETRA_FP8_E4M3: return "float8_e4m3fn";
    case TETRA_FP8_E5M2: return "float8_e5m2";
    case TETRA_I32: return "int32";
    }
    return "?";
}

static void set_err(char *err, size_t errlen, const char *msg) {
    if (err && errlen) snprintf(err, errlen, "%s", msg);
}

const tetra_ops *ops_get(const char *device, char *err, size_t errlen) {
    if (!device || !strcmp(device, "auto")) {
#ifdef TETRA_HAVE_CUDA
        if (cuda_device_count() > 0) {
            const tetra_ops *t = ops_cuda(err, errlen);
            if (t) return t;
        }
#endif
        return ops_cpu();
    }
    if (!strcmp(device, "cpu")) return ops_cpu();
    if (!strcmp(device, "cuda")) {
#ifdef TETRA_HAVE_CUDA
        if (cuda_device_count() <= 0) {
            set_err(err, errlen,
                    "device \"cuda\": no CUDA device is visible (cudaGetDeviceCount = 0); "
                    "use training.device = \"cpu\" or \"auto\"");
            return NULL;
        }
        return ops_cuda(err, errlen);
#else
        set_err(err, errlen,
                "device \"cuda\": this build has no CUDA backend (configure with nvcc available, -DTETRA_CUDA=ON)");
        return NULL;
#endif
    }
    if (err && errlen) snprintf(err, errlen, "unknown device \"%s\" (expected cpu, cuda or auto)", device);
    return NULL;
}

// ---- the planning table (dry runs): sizes only; any memory or compute call is a bug
// in the caller and stops with a message.

static void *plan_alloc(size_t bytes) {
    fprintf(stderr, "dry run: a backend allocation of %zu bytes was attempted (planning allocates nothing)\n",
            bytes);
    abort();
}

#ifdef TETRA_HAVE_CUDA
size_t cuda_attention_workspace_size(const ops_attn_shape *s);
#endif

const tetra_ops *ops_plan(const char *device, char *err, size_t errlen) {
    static tetra_ops cpu, cuda;
    if (!device || !strcmp(device, "auto")) {
#ifdef TETRA_HAVE_CUDA
        device = cuda_device_count() > 0 ? "cuda" : "cpu";
#else
        device = "cpu";
#endif
    }
    if (!strcmp(device, "cpu")) {
        if (!cpu.name) {
            const tetra_ops *c = ops_cpu();
            cpu.name = "cpu";
            cpu.alloc = plan_alloc;
            cpu.attention_workspace_size = c->attention_workspace_size;
            cpu.attention_workspace_size_bf16 = c->attention_workspace_size_bf16;
        }
        return &cpu;
    }
    if (!strcmp(device, "cuda")) {
#ifdef TETRA_HAVE_CUDA
        if (!cuda.name) {
            /* the built-in kernels' workspace: cuDNN's plan-dependent workspace is known only
             * on a device (it is of the same order) */
            cuda.name = "cuda";
            cuda.alloc = plan_alloc;
            cuda.attention_workspace_size = cuda_attention_workspace_size;
            cuda.attention_workspace_size_bf16 = cuda_attention_workspace_size;
        }
        return &cuda;
#else
        (void)cuda;
        set_err(err, errlen,
                "device \"cuda\": this build has no CUDA backend (configure with nvcc available, -DTETRA_CUDA=ON)");
        return NULL;
#endif
    }
    if (err && errlen) snprintf(err, errlen, "unknown device \"%s\" (expected cpu, cuda or auto)", device);
    return NULL;
}

// TorchTitan precompute_freqs_cis, step by step in fp32 (each torch op rounds to fp32;
// the comments name the torch expression each line reproduces).
void ops_rope_table(float *table, int d, int max_pos, float theta, int scaled, float factor,
                    float low_freq_factor, float high_freq_factor, int original_max_pos) {
    const int half = d / 2;
    const float two_pi = (float)(2.0 * 3.14159265358979323846);
    const double low_wavelen = (double)original_max_pos / low_freq_factor;
    const double high_wavelen = (double)original_max_pos / high_freq_factor;
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)d;                      // arange(0, d, 2).float() / d
        float p = (float)pow((double)theta, (double)e);           // theta ** e (fp32 result)
        float f = 1.0f / p;                                       // 1.0 / (...)
        if (scaled) {
            float wavelen = (1.0f / f) * two_pi;                  // 2 * math.pi / freqs
            float smooth = ((1.0f / wavelen) * (float)original_max_pos - low_freq_factor) /
                           (high_freq_factor - low_freq_factor);  // (orig / wavelen - lo) / (hi - lo)
            if ((double)wavelen > low_wavelen) {
                f = f / factor;                                   // low frequency: freqs / factor
            } else if (!((double)wavelen < high_wavelen)) {
                f = (1.0f - smooth) * f / factor + smooth * f;    // medium: interpolate
            }
        }
        for (int pos = 0; pos < max_pos; pos++) {
            float ang = (float)pos * f;                           // torch.outer(t, freqs)
            table[((size_t)pos * half + i) * 2 + 0] = cosf(ang);  // torch.polar
            table[((size_t)pos * half + i) * 2 + 1] = sinf(ang);
        }
    }
}
