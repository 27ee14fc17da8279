/* cuda_plugin.c — find and load lib/libtetra_cuda.so on first use (see cuda_plugin.h). */
#define _GNU_SOURCE /* dladdr */
#include "kernels/cuda_plugin.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TETRA_HAVE_CUDA

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void *handle;
static char why[2048];

static void *try_open(const char *path, char *tried, size_t n) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        size_t used = strlen(tried);
        if (used < n) snprintf(tried + used, n - used, "%s%s: %s", used ? "; " : "", path, e ? e : "not loadable");
    }
    return h;
}

static void load(void) {
    char tried[1800] = "";
    const char *env = getenv("TETRA_CUDA_LIBRARY");
    if (env && *env) {
        handle = try_open(env, tried, sizeof tried);
    } else {
        Dl_info info;
        char dir[1024] = "";
        if (dladdr((void *)cuda_plugin_symbol, &info) && info.dli_fname) {
            snprintf(dir, sizeof dir, "%s", info.dli_fname);
            char *slash = strrchr(dir, '/');
            if (slash) *slash = '\0';
            else snprintf(dir, sizeof dir, ".");
        }
        char path[1200];
        if (dir[0]) {
            snprintf(path, sizeof path, "%s/libtetra_cuda.so", dir);
            handle = try_open(path, tried, sizeof tried);
            if (!handle) {
                snprintf(path, sizeof path, "%s/../lib/libtetra_cuda.so", dir);
                handle = try_open(path, tried, sizeof tried);
            }
        }
        if (!handle) handle = try_open("libtetra_cuda.so", tried, sizeof tried);
    }
    if (!handle) snprintf(why, sizeof why, "the CUDA backend library could not be loaded (%s)", tried);
}

void *cuda_plugin_symbol(const char *name, char *err, size_t errlen) {
    pthread_once(&once, load);
    if (!handle) {
        if (err && errlen) snprintf(err, errlen, "%s", why);
        return NULL;
    }
    void *s = dlsym(handle, name);
    if (!s && err && errlen) snprintf(err, errlen, "the CUDA backend library has no symbol %s (a stale build?)", name);
    return s;
}

int cuda_driver_device_count(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return 0;
    /* CUresult cuInit(unsigned), cuDeviceGetCount(int *): 0 is CUDA_SUCCESS */
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    int n = 0;
    if (!init || !count || init(0) != 0 || count(&n) != 0) n = 0;
    return n; /* the driver stays loaded: cudart will use it */
}

const cuda_kernels_api *cuda_kernels(char *err, size_t errlen) {
    const cuda_kernels_api *(*get)(void) =
        (const cuda_kernels_api *(*)(void))cuda_plugin_symbol("tetra_cuda_kernels_v1", err, errlen);
    if (!get) return NULL;
    const cuda_kernels_api *a = get();
    if (!a || a->abi != CUDA_PLUGIN_ABI) {
        if (err && errlen)
            snprintf(err, errlen, "the CUDA backend library speaks ABI %d, this build %d (a stale build?)",
                     a ? a->abi : -1, CUDA_PLUGIN_ABI);
        return NULL;
    }
    return a;
}

#else

int cuda_driver_device_count(void) { return 0; }

void *cuda_plugin_symbol(const char *name, char *err, size_t errlen) {
    (void)name;
    if (err && errlen)
        snprintf(err, errlen, "this build has no CUDA backend (configure with nvcc available, -DTETRA_CUDA=ON)");
    return NULL;
}

const cuda_kernels_api *cuda_kernels(char *err, size_t errlen) { return cuda_plugin_symbol("", err, errlen); }

#endif
