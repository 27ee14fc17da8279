/* test_float8_ring.c — Float8 tensorwise casts each output gradient once, with its
 * transpose, for both its gradients: the input-gradient call leaves dy^T's codes in the
 * converter's ring, and the weight-gradient call takes them while the ring still holds
 * them. On the CPU backend, three converted linears (two of block 0, one of block 1, so
 * the ring holds block 0's two):
 *   - input gradients of block 0, then its weight gradients: no weight-gradient call
 *     casts dy again, and every dW has the bits of a weight-gradient call that saw no
 *     input gradient (dy cast on its own);
 *   - input gradients of block 0 and then block 1 (as a zero-bubble schedule defers a
 *     weight pass): block 1's codes take the ring's start, where the first linear's
 *     were, so that weight gradient casts dy again (one cast) and the others do not;
 *     every dW still has the reference bits;
 *   - a weight-gradient call on another dy (same rows) casts that dy itself. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "float8/float8.h"
#include "kernels/ops.h"
#include "models/llama3/model.h"
#include "tests/check.h"

enum { N = 32, IN = 64, NL = 3 };
static const int OUT[NL] = {48, 32, 48};
static const char *const NAME[NL] = {"layers.0.a.weight", "layers.0.b.weight", "layers.1.a.weight"};

static const tetra_ops *cpu;
static int dy_casts_alone; /* dy cast transposed by a weight-gradient call (e5m2, no row-major codes) */

static void counting_quantize(uint8_t *out, uint8_t *out_t, float *inv, const void *x, tetra_dtype xt,
                              const float *amax, int rows, int cols, tetra_dtype fmt) {
    if (!out && out_t && fmt == TETRA_FP8_E5M2) dy_casts_alone++;
    cpu->fp8_quantize(out, out_t, inv, x, xt, amax, rows, cols, fmt);
}

typedef struct {
    float w[NL][48 * IN];
} weights;

static const void *weight_of(const void *model, const model_linear *l) { return ((const weights *)model)->w[l->param]; }

static float frand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* the converted linears, a float8 model over them and the env their calls see */
typedef struct {
    model_linear l[NL];
    float8_model *f;
    model_linear_env e;
} setup;

static int make(setup *s, const tetra_ops *ops, const weights *w) {
    memset(s, 0, sizeof *s);
    model_linear *lp[NL];
    for (int i = 0; i < NL; i++) {
        s->l[i] = (model_linear){.param = i,
                                 .name = NAME[i],
                                 .global_out = OUT[i],
                                 .global_in = IN,
                                 .in = IN,
                                 .out = OUT[i],
                                 .style = MODEL_LINEAR_REPLICATED,
                                 .impl = llama3_linear_default()};
        lp[i] = &s->l[i];
    }
    float8_config c;
    memset(&c, 0, sizeof c);
    c.recipe = FLOAT8_TENSORWISE;
    char err[256];
    s->f = float8_convert(lp, NL, ops, TETRA_F32, &c, N, NULL, NULL, 0, err, sizeof err);
    CHECK(s->f && float8_converted(s->f) == NL, "float8_convert: %s", s->f ? "not all converted" : err);
    s->e = (model_linear_env){ops, TETRA_F32, NULL, llama3_linear_default(), w, weight_of};
    return s->f && float8_converted(s->f) == NL ? 0 : -1;
}

static void input_grad(setup *s, int i, const float *dy, const weights *w) {
    float dx[N * IN];
    s->l[i].impl->backward_input(&s->e, &s->l[i], TETRA_F32, dx, dy, w->w[i], N, -1, 0.0f);
}

static void weight_grad(setup *s, int i, float *dw, const float *dy, const float *x) {
    memset(dw, 0, sizeof(float) * (size_t)OUT[i] * IN);
    s->l[i].impl->backward_weight(&s->e, &s->l[i], dw, dy, x, N, 0.0f);
}

int main(void) {
    char err[256];
    cpu = ops_get("cpu", err, sizeof err);
    CHECK(cpu != NULL, "ops_get: %s", err);
    if (!cpu) return check_summary("test_float8_ring");
    tetra_ops counting = *cpu;
    counting.fp8_quantize = counting_quantize;

    static weights w;
    static float x[NL][N * IN], dy[NL][N * 48], dy2[N * 48], ref[NL][48 * IN], dw[48 * IN];
    uint32_t seed = 7;
    for (int i = 0; i < NL; i++) {
        for (int k = 0; k < OUT[i] * IN; k++) w.w[i][k] = 0.1f * frand(&seed);
        for (int k = 0; k < N * IN; k++) x[i][k] = frand(&seed);
        for (int k = 0; k < N * OUT[i]; k++) dy[i][k] = (k % 7 ? 1e-3f : 3e-2f) * frand(&seed);
    }

    /* the reference: each weight gradient alone, dy cast by the call itself */
    setup s;
    if (make(&s, &counting, &w)) return check_summary("test_float8_ring");
    for (int i = 0; i < NL; i++) weight_grad(&s, i, ref[i], dy[i], x[i]);
    CHECK(dy_casts_alone == NL, "a weight gradient without its input gradient casts dy itself (%d of %d)",
          dy_casts_alone, NL);
    float8_free(s.f);

    /* block 0: input gradients, then weight gradients */
    if (make(&s, &counting, &w)) return check_summary("test_float8_ring");
    dy_casts_alone = 0;
    input_grad(&s, 0, dy[0], &w);
    input_grad(&s, 1, dy[1], &w);
    for (int i = 0; i < 2; i++) {
        weight_grad(&s, i, dw, dy[i], x[i]);
        CHECK(!memcmp(dw, ref[i], sizeof(float) * (size_t)OUT[i] * IN), "linear %d: dW from the ring's codes differs",
              i);
    }
    CHECK(dy_casts_alone == 0, "the weight gradients take dy^T from the ring (%d casts of their own)", dy_casts_alone);

    /* block 0's and block 1's input gradients before any weight gradient: block 1's codes
     * overwrite the first linear's */
    dy_casts_alone = 0;
    for (int i = 0; i < NL; i++) input_grad(&s, i, dy[i], &w);
    for (int i = 0; i < NL; i++) {
        weight_grad(&s, i, dw, dy[i], x[i]);
        CHECK(!memcmp(dw, ref[i], sizeof(float) * (size_t)OUT[i] * IN), "linear %d after a wrapped ring: dW differs",
              i);
    }
    CHECK(dy_casts_alone == 1, "only the overwritten codes are cast again (%d casts, want 1)", dy_casts_alone);

    /* a weight gradient on another dy casts it */
    dy_casts_alone = 0;
    input_grad(&s, 0, dy[0], &w);
    memcpy(dy2, dy[0], sizeof(float) * N * OUT[0]);
    weight_grad(&s, 0, dw, dy2, x[0]);
    CHECK(dy_casts_alone == 1 && !memcmp(dw, ref[0], sizeof(float) * (size_t)OUT[0] * IN),
          "a weight gradient on another dy casts it itself (%d casts) with the same bits", dy_casts_alone);
    float8_free(s.f);
    return check_summary("test_float8_ring");
}
