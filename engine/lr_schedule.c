#include "engine/lr_schedule.h"

#include <math.h>
#include <string.h>

int lr_schedule_init(lr_schedule *s, int64_t total, int64_t warmup_steps, double decay_ratio, const char *decay_type,
                     double min_lr_factor) {
    if (!strcmp(decay_type, "linear")) s->type = LR_DECAY_LINEAR;
    else if (!strcmp(decay_type, "sqrt")) s->type = LR_DECAY_SQRT;
    else if (!strcmp(decay_type, "cosine")) s->type = LR_DECAY_COSINE;
    else return -1;
    s->warmup = warmup_steps < total ? warmup_steps : total;
    if (!isnan(decay_ratio)) {
        /* Python's round(): halves go to the even neighbour */
        double d = nearbyint((double)total * decay_ratio);
        s->decay = (int64_t)d;
        if (s->decay > total - s->warmup) s->decay = total - s->warmup;
    } else {
        s->decay = total - s->warmup;
    }
    /* The +1 is a virtual last step: the lr never reaches the floor during training. */
    s->stable = total + 1 - s->warmup - s->decay;
    s->min_lr_factor = min_lr_factor;
    return 0;
}

double lr_factor(const lr_schedule *s, int64_t c) {
    if (c < s->warmup) return (double)(c + 1) / (double)s->warmup;
    if (c < s->warmup + s->stable) return 1.0;
    double p = (double)(c + 1 - s->warmup - s->stable) / (double)s->decay;
    double g;
    switch (s->type) {
    case LR_DECAY_SQRT: g = 1.0 - sqrt(p); break;
    case LR_DECAY_COSINE: g = 0.5 * (1.0 + cos(3.14159265358979323846 * p)); break;
    default: g = 1.0 - p; break;
    }
    return s->min_lr_factor + (1.0 - s->min_lr_factor) * g;
}
