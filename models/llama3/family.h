/* family.h — Llama 3 as a model family (models/model.h): the table the trainer runs it
 * through, and the conversions between the generic handles and Llama's own types for
 * the code that knows it is Llama (the planner, the Float8 converter, tools). */
#ifndef TETRA_LLAMA3_FAMILY_H
#define TETRA_LLAMA3_FAMILY_H

#include "models/llama3/llama3_args.h"
#include "models/llama3/model.h"
#include "models/model.h"

extern const model_family llama3_family;

/* The generic arguments holding a (by value). */
model_args llama3_model_args(const llama3_args *a);
/* Llama's arguments in a, or NULL when a is another family's. */
const llama3_args *llama3_args_of(const model_args *a);
/* The Llama model of a stage, or NULL when the stage is another family's. */
llama3_model *llama3_stage_model(const model_stage *s);

#endif
