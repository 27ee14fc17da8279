/* chart.h — a simulated pipeline timeline (sim.h) drawn two ways: as text, one
 * row per rank, and as an RGB raster for an image file (the file format is the
 * caller's business).
 *
 * Text: each computation is its type letter and microbatch ("F3", "B0"), drawn
 * from its start column for as many columns as it lasts; idle time is '.'. On
 * ranks with two stages the second stage's letters are lower case ("f3"); with
 * more, each label carries its stage ("5F3"). Labels longer than their box are
 * cut.
 *
 * Raster: one row per rank, rank number on the left, a time axis and a colour
 * legend below; a box per computation in the colour of its type (F blue,
 * I orange, W green, B red), lighter for a rank's later stages, the microbatch
 * number inside when it fits, idle time light grey, parts of an OVERLAP_F_B
 * underlined in black.
 */
#ifndef TETRA_PARALLEL_PP_CHART_H
#define TETRA_PARALLEL_PP_CHART_H

#include <stddef.h>
#include <stdio.h>

#include "parallel/pp/sim.h"

/* The text chart, `width` columns of timeline (at least 10), with a time scale
 * line above and a legend below. 0, or -1 on a write error. */
int pp_chart_text(const pp_sim_result *r, int width, FILE *f);

typedef struct {
    int width, height;
    unsigned char *rgb; /* width * height * 3 bytes, rows top to bottom */
} pp_chart_image;

/* Draw the timeline with px_per_unit pixels per time unit (0: chosen so the
 * shortest computation is wide enough for a two-digit microbatch, and the image
 * at most 6000 pixels wide). 0, or -1 with the reason in err. */
int pp_chart_raster(const pp_sim_result *r, int px_per_unit, pp_chart_image *out, char *err, size_t errlen);
void pp_chart_image_free(pp_chart_image *img);

#endif
