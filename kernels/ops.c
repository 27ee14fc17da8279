// kernels/ops.c — backend selection and the host-side helpers of ops.h.
#include "kernels/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_plugin.h"
#include "kernels/ops_shapes.h"

#if defined(TETRA_HAVE_CUDA) && defined(TETRA_CUDA_LINKED)
// The CUDA kernels are linked into this program (the kernel simulator's test): their
// table is built from the symbols instead of loading lib/libtetra_cuda.so. Their
// "device" memory is host memory, but the table says otherwise (host_memory = 0), so
// the trainer treats it as a GPU's and its collectives take the staged MPI path that
// ranks sharing a real GPU take.
#include "kernels/cuda/cuda_device.h"
static const tetra_ops *linked_ops(char *err, size_t errlen) {
    static tetra_ops t;
    if (!t.name) {
        const tetra_ops *o = ops_cuda(err, errlen);
        if (!o) return NULL;
        t = *o;
    }
    return &t;
}
static const cuda_kernels_api *kernels_api(char *err, size_t errlen) {
    (void)err;
    (void)errlen;
    static const cuda_kernels_api a = {CUDA_PLUGIN_ABI, linked_ops, cuda_device_count, cuda_device_describe,
                                       cuda_cudnn_version};
    return &a;
}
static int gpu_maybe_present(void) { return 1; }
#elif defined(TETRA_HAVE_CUDA)
static const cuda_kernels_api *kernels_api(char *err, size_t errlen) { return cuda_kernels(err, errlen); }
/* "auto" loads the CUDA library only where the driver reports a device */
static int gpu_maybe_present(void) { return cuda_driver_device_count() > 0; }
#endif

static void set_err(char *err, size_t errlen, const char *msg) {
    if (err && errlen) snprintf(err, errlen, "%s", msg);
}

const tetra_ops *ops_get(const char *device, char *err, size_t errlen) {
    if (!device || !strcmp(device, "auto")) {
#ifdef TETRA_HAVE_CUDA
        const cuda_kernels_api *k = gpu_maybe_present() ? kernels_api(NULL, 0) : NULL;
        if (k && k->device_count() > 0) {
            const tetra_ops *t = k->ops(err, errlen);
            if (t) return t;
        }
#endif
        return ops_cpu();
    }
    if (!strcmp(device, "cpu")) return ops_cpu();
    if (!strcmp(device, "cuda")) {
#ifdef TETRA_HAVE_CUDA
        char why[2048];
        const cuda_kernels_api *k = kernels_api(why, sizeof why);
        if (!k) {
            if (err && errlen) snprintf(err, errlen, "device \"cuda\": %s", why);
            return NULL;
        }
        if (k->device_count() <= 0) {
            set_err(err, errlen,
                    "device \"cuda\": no CUDA device is visible (cudaGetDeviceCount = 0); "
                    "use training.device = \"cpu\" or \"auto\"");
            return NULL;
        }
        return k->ops(err, errlen);
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
    fprintf(stderr, "dry run: a backend allocation of %zu bytes was attempted (planning allocates nothing)\n", bytes);
    abort();
}

const tetra_ops *ops_plan(const char *device, char *err, size_t errlen) {
    static tetra_ops cpu, cuda;
    if (!device || !strcmp(device, "auto")) {
#ifdef TETRA_HAVE_CUDA
        const cuda_kernels_api *k = gpu_maybe_present() ? kernels_api(NULL, 0) : NULL;
        device = k && k->device_count() > 0 ? "cuda" : "cpu";
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
        /* shapes only (kernels/ops_shapes.h): a plan for the GPU needs no CUDA backend. The
         * built-in kernels' workspace; cuDNN's plan-dependent one is known only on a device
         * (it is of the same order) */
        if (!cuda.name) {
            cuda.alloc = plan_alloc;
            cuda.attention_workspace_size = ops_shape_cuda_attention_workspace;
            cuda.attention_workspace_size_bf16 = ops_shape_cuda_attention_workspace;
            cuda.name = "cuda";
        }
        return &cuda;
    }
    if (err && errlen) snprintf(err, errlen, "unknown device \"%s\" (expected cpu, cuda or auto)", device);
    return NULL;
}

// TorchTitan precompute_freqs_cis, step by step in fp32 (each torch op rounds to fp32;
// the comments name the torch expression each line reproduces).
void ops_rope_table(float *table, int d, int max_pos, float theta, int scaled, float factor, float low_freq_factor,
                    float high_freq_factor, int original_max_pos) {
    const int half = d / 2;
    const float two_pi = (float)(2.0 * 3.14159265358979323846);
    const double low_wavelen = (double)original_max_pos / low_freq_factor;
    const double high_wavelen = (double)original_max_pos / high_freq_factor;
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)d;            // arange(0, d, 2).float() / d
        float p = (float)pow((double)theta, (double)e); // theta ** e (fp32 result)
        float f = 1.0f / p;                             // 1.0 / (...)
        if (scaled) {
            float wavelen = (1.0f / f) * two_pi; // 2 * math.pi / freqs
            float smooth = ((1.0f / wavelen) * (float)original_max_pos - low_freq_factor) /
                (high_freq_factor - low_freq_factor); // (orig / wavelen - lo) / (hi - lo)
            if ((double)wavelen > low_wavelen) {
                f = f / factor; // low frequency: freqs / factor
            } else if (!((double)wavelen < high_wavelen)) {
                f = (1.0f - smooth) * f / factor + smooth * f; // medium: interpolate
            }
        }
        for (int pos = 0; pos < max_pos; pos++) {
            float ang = (float)pos * f;                          // torch.outer(t, freqs)
            table[((size_t)pos * half + i) * 2 + 0] = cosf(ang); // torch.polar
            table[((size_t)pos * half + i) * 2 + 1] = sinf(ang);
        }
    }
}
