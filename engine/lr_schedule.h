/* lr_schedule.h — TorchTitan's warmup-stable-decay learning-rate multiplier.
 *
 * Training step s (1-based) runs with lr * lr_factor(sched, s - 1). With
 * total = total_steps (or training.steps), warmup = min(warmup_steps, total),
 * decay = round(total * decay_ratio) capped at total - warmup (or all the steps
 * after warm-up when decay_ratio is not set) and stable = total + 1 - warmup - decay:
 * c < warmup: (c + 1) / warmup; then 1 for `stable` steps; then
 * min_lr_factor + (1 - min_lr_factor) * g(progress), progress = (c + 1 - warmup - stable) / decay,
 * g = 1 - p (linear), 1 - sqrt(p) (sqrt), (1 + cos(pi p)) / 2 (cosine). */
#ifndef TETRA_LR_SCHEDULE_H
#define TETRA_LR_SCHEDULE_H

#include <stdint.h>

typedef enum { LR_DECAY_LINEAR, LR_DECAY_SQRT, LR_DECAY_COSINE } lr_decay_type;

typedef struct {
    int64_t warmup;
    int64_t stable;
    int64_t decay;
    lr_decay_type type;
    double min_lr_factor;
} lr_schedule;

/* decay_ratio NAN = not set. Returns 0, or -1 for an unknown decay_type. */
int lr_schedule_init(lr_schedule *s, int64_t total_steps, int64_t warmup_steps, double decay_ratio,
                     const char *decay_type, double min_lr_factor);
/* Multiplier for the 0-based scheduler count c. */
double lr_factor(const lr_schedule *s, int64_t c);

#endif
