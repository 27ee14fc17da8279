/* linear.h — a model's linear layer as its converters see it: a descriptor (its weight,
 * sizes and tensor-parallel style) and an implementation slot. A model runs every
 * projection y[N, out] = x[N, in] W[out, in]^T through its descriptor; its own
 * implementation runs the gemm op in the compute dtype with fp32 weight gradients, and a
 * converter such as Float8 installs another on chosen linears without touching the
 * model's forward code or knowing which model it is.
 *
 * Each call hands the implementation what it may need of the model (model_linear_env):
 * the op table, the compute dtype, the tensor-parallel group, the model's own
 * implementation (to delegate to) and a way to find the weight.
 */
#ifndef TETRA_MODELS_LINEAR_H
#define TETRA_MODELS_LINEAR_H

#include <stdint.h>

#include "kernels/ops.h"
#include "parallel/comm.h"

typedef enum { MODEL_LINEAR_REPLICATED = 0, MODEL_LINEAR_COLWISE, MODEL_LINEAR_ROWWISE } model_linear_style;

/* Which operand of a linear a block of rows belongs to: the input x of forward or the
 * output gradient dy of backward_input. */
typedef enum { MODEL_OPERAND_X = 0, MODEL_OPERAND_DY = 1 } model_operand;

/* How this rank holds an operand whose rows are about to be consumed block by block:
 * WHOLE: `local` is the whole operand; ROW_SHARD: this rank's block of rows of an
 * operand whose full rows are every tensor-parallel rank's block in rank order (it is
 * being all-gathered); COL_SHARD: every row of this rank's block of columns, the other
 * columns are on the other ranks of the tensor-parallel group. */
typedef enum { MODEL_ROWS_WHOLE = 0, MODEL_ROWS_ROW_SHARD, MODEL_ROWS_COL_SHARD } model_rows_layout;

typedef struct model_linear model_linear;
typedef struct model_linear_impl model_linear_impl;

/* What one call of an implementation sees of the model. */
typedef struct {
    const tetra_ops *ops;
    tetra_dtype compute_dtype;         /* of x, dy, W and the activations */
    comm_group *tp;                    /* the tensor-parallel group (NULL: degree 1) */
    const model_linear_impl *fallback; /* the model's own implementation, to delegate to */
    const void *model;                 /* weight's argument */
    /* the linear's weight [out, in] in the compute dtype where it is now (the pointer
     * forward receives as w); stops with a message if it is not available */
    const void *(*weight)(const void *model, const model_linear *l);
} model_linear_env;

struct model_linear_impl {
    const char *name;
    /* y = x W^T + beta c, y of type y_type (compute dtype, or F32 for the logits); c is
     * c_in, or y itself when c_in is NULL (c_in: a residual added without copying it into
     * y first; ops.h ops_gemm_desc.c_in). row0 < 0: x is the whole operand. row0 >= 0: x
     * is rows [row0, row0 + n) of the operand announced by the last
     * begin_rows(MODEL_OPERAND_X) of this linear. */
    void (*forward)(const model_linear_env *e, const model_linear *l, tetra_dtype y_type, void *y, const void *x,
                    const void *w, int n, int row0, float beta, const void *c_in);
    /* dx = dy W + beta dx, dx of type dx_type (compute dtype, or F32 for a tensor-parallel
     * partial sum); row0 as in forward, for dy */
    void (*backward_input)(const model_linear_env *e, const model_linear *l, tetra_dtype dx_type, void *dx,
                           const void *dy, const void *w, int n, int row0, float beta);
    /* dW = dy^T x + beta dW (fp32), over every row of the microbatch: beta 1 accumulates,
     * 0 overwrites (the first write of a step whose gradients were not zeroed) */
    void (*backward_weight)(const model_linear_env *e, const model_linear *l, float *dw, const void *dy, const void *x,
                            int n, float beta);
    /* Optional (NULL: nothing to do). Under tensor parallel the forward and the input
     * gradient run one block of rows at a time (parallel/tp.h), possibly before the other
     * blocks have arrived. Before the blocks of an operand the model announces it here
     * (local [rows, cols] in the compute dtype, held as `layout` says; the group is
     * e->tp), so an implementation that scales by tensor or by row can take the
     * statistics of the whole operand, identical on every rank and to an unsplit run.
     * Every rank of the group calls it at the same point: it may run collectives. */
    void (*begin_rows)(const model_linear_env *e, const model_linear *l, model_operand which, const void *local,
                       int rows, int cols, model_rows_layout layout);
    /* Optional (NULL: never). The model is about to produce operand `which` of this linear
     * whole at t (rows x the operand's columns, compute dtype), with an op that can also
     * write max |t| (amax_bf16's bits) as it writes t. Returns the device float to write it
     * to, or NULL when the implementation does not want it. After a non-NULL answer the
     * model's next call of this linear that reads that operand (x: forward or
     * backward_weight; dy: backward_input) reads t whole (row0 < 0) with `rows` rows, and
     * t is unchanged until then. */
    float *(*amax_slot)(const model_linear_env *e, const model_linear *l, model_operand which, const void *t, int rows);
    /* Optional (NULL: never). As amax_slot, where the model owns the device float: max |t|
     * of operand `which` at t (amax_bf16's bits) is at `amax`, or will be once the op the
     * model is about to run writes t and it together; it stays with t (the model keeps it
     * with the activation, and every op that writes t writes it too). Returns 1 when the
     * implementation takes it: the model's next call of this linear that reads that
     * operand reads t whole (row0 < 0) with `rows` rows, t and *amax unchanged until then;
     * 0 when it does not want it. */
    int (*amax_from)(const model_linear_env *e, const model_linear *l, model_operand which, const void *t, int rows,
                     const float *amax);
};

struct model_linear {
    int param;                     /* the weight: its index among the stage's parameters */
    const char *name;              /* the weight's name, e.g. "layers.3.attention.wq.weight" */
    int64_t global_out, global_in; /* the whole weight's shape, over every tensor-parallel rank */
    int in, out;                   /* local sizes (this rank's box) */
    model_linear_style style;      /* how tensor parallel splits it */
    /* NULL, or the linear whose input this one reads: the model promises that whenever it
     * runs this linear's forward (or weight gradient) on the whole operand right after that
     * linear's forward (weight gradient) with the same pointer, the tensor is unchanged, so
     * an implementation may reuse what it derived from it (Float8's cast of x) */
    const model_linear *input_from;
    const model_linear_impl *impl; /* never NULL: the model's own unless a converter set one */
    void *impl_state;              /* the converter's per-linear state */
};

#endif
