/* float8_capi.c — one Float8 linear on the CPU backend, for the Python reference test
 * (tests/py/test_float8.py): the forward, input-gradient and weight-gradient GEMMs of a
 * recipe on a one-linear model, exactly as the trainer runs them. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>

#include "float8/float8.h"
#include "kernels/ops.h"
#include "models/llama3/model.h"

/* Exported for ctypes only. y[n, out] = x W^T; dx[n, in] = dy W; dw[out, in] = dy^T x
 * (any of y, dx, dw may be NULL). 0, or -1 with err set. */
int float8_capi_linear(const char *recipe, int emulate, int n, int in, int out, const float *x, const float *w,
                       const float *dy, float *y, float *dx, float *dw, char *err, size_t errlen);

/* the one linear's weight: the model pointer is the weight itself */
static const void *weight_of(const void *model, const model_linear *l) {
    (void)l;
    return model;
}

int float8_capi_linear(const char *recipe, int emulate, int n, int in, int out, const float *x, const float *w,
                       const float *dy, float *y, float *dx, float *dw, char *err, size_t errlen) {
    const tetra_ops *ops = ops_get("cpu", err, errlen);
    if (!ops) return -1;
    float8_config c;
    memset(&c, 0, sizeof c);
    if (float8_parse_recipe(recipe, &c.recipe)) {
        snprintf(err, errlen, "unknown recipe \"%s\"", recipe);
        return -1;
    }
    c.emulate = emulate;
    /* one linear, and what its calls see of a model: the CPU ops in fp32, no tensor
     * parallel, the compute-dtype GEMM to fall back to */
    model_linear l;
    memset(&l, 0, sizeof l);
    l.param = 0;
    l.name = "layers.0.attention.wq.weight";
    l.global_out = out;
    l.global_in = in;
    l.in = in;
    l.out = out;
    l.style = MODEL_LINEAR_REPLICATED;
    l.impl = llama3_linear_default();
    model_linear *lp = &l;
    float8_model *f = float8_convert(&lp, 1, ops, TETRA_F32, &c, (size_t)n, NULL, NULL, 0, err, errlen);
    if (!f) return -1;
    if (float8_converted(f) != 1) {
        snprintf(err, errlen, "%d x %d is not converted (dims must divide by 16)", out, in);
        float8_free(f);
        return -1;
    }
    const model_linear_env e = {ops, TETRA_F32, NULL, llama3_linear_default(), w, weight_of};
    if (y) l.impl->forward(&e, &l, TETRA_F32, y, x, w, n, -1, 0.0f, NULL);
    if (dx) l.impl->backward_input(&e, &l, TETRA_F32, dx, dy, w, n, -1, 0.0f);
    if (dw) {
        memset(dw, 0, (size_t)out * (size_t)in * sizeof(float));
        l.impl->backward_weight(&e, &l, dw, dy, x, n, 1.0f);
    }
    float8_free(f);
    return 0;
}
