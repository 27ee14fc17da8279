/* chart.c — text and raster drawings of a simulated pipeline timeline (see chart.h). */
#include "parallel/pp/chart.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static char type_letter(pp_action_type t) {
    switch (t) {
    case PP_F: return 'F';
    case PP_I: return 'I';
    case PP_W: return 'W';
    case PP_B: return 'B';
    default: return '?';
    }
}

static void slice_label(const pp_sim_result *r, const pp_sim_slice *sl, char *buf, size_t n) {
    char c = type_letter(sl->type);
    if (r->max_stages_per_rank > 2) snprintf(buf, n, "%d%c%d", sl->stage, c, sl->mb);
    else snprintf(buf, n, "%c%d", sl->chunk ? (char)tolower((unsigned char)c) : c, sl->mb);
}

static int column(double t, double scale, int width) {
    int c = (int)floor(t * scale + 0.5);
    return c < 0 ? 0 : c > width ? width : c;
}

int pp_chart_text(const pp_sim_result *r, int width, FILE *f) {
    if (width < 10) width = 10;
    char *row = malloc((size_t)width + 1);
    if (!row) return -1;
    double scale = r->makespan > 0 ? width / r->makespan : 0;
    int rw = snprintf(NULL, 0, "%d", r->n_ranks - 1);
    /* the scale line: 0 under the first column, the makespan ending at the last */
    char end[32];
    int el = snprintf(end, sizeof end, "%g", r->makespan);
    fprintf(f, "%*s  time 0%*s\n", rw + 4, "", width - 1 > el ? width - 1 : el, end);
    for (int k = 0; k < r->n_ranks; k++) {
        memset(row, '.', (size_t)width);
        row[width] = 0;
        for (int i = 0; i < r->n_slices[k]; i++) {
            const pp_sim_slice *sl = &r->slices[k][i];
            if (sl->end <= sl->start) continue; /* a zero-time computation has no columns */
            int c0 = column(sl->start, scale, width), c1 = column(sl->end, scale, width);
            if (c1 <= c0) c1 = c0 + 1 <= width ? c0 + 1 : width;
            if (c0 >= width) c0 = width - 1;
            char label[32];
            slice_label(r, sl, label, sizeof label);
            int ll = (int)strlen(label);
            for (int c = c0; c < c1; c++) row[c] = c - c0 < ll ? label[c - c0] : ' ';
        }
        fprintf(f, "rank %*d |%s|\n", rw, k, row);
    }
    fprintf(f,
            "%*s  1 column = %.4g time units; F forward, I backward-input, W backward-weight, B full backward, . idle",
            rw + 4, "", r->makespan > 0 ? r->makespan / width : 0.0);
    if (r->max_stages_per_rank == 2) fprintf(f, "; lower case: the rank's second stage");
    else if (r->max_stages_per_rank > 2) fprintf(f, "; labels are stage, type, microbatch");
    int bad = fprintf(f, "\n") < 0;
    free(row);
    return bad || ferror(f) ? -1 : 0;
}

/* ---- raster ---------------------------------------------------------------- */

/* 3x5 glyphs, one row per 3-bit number, most significant bit on the left: the
 * digits, then the four action letters for the legend. */
static const unsigned char font[14][5] = {
    {7, 5, 5, 5, 7}, {2, 6, 2, 2, 7}, {7, 1, 7, 4, 7}, {7, 1, 7, 1, 7}, {5, 5, 7, 1, 1},
    {7, 4, 7, 1, 7}, {7, 4, 7, 5, 7}, {7, 1, 2, 2, 2}, {7, 5, 7, 5, 7}, {7, 5, 7, 1, 7},
    {7, 4, 6, 4, 4}, {7, 2, 2, 2, 7}, {5, 5, 7, 7, 5}, {6, 5, 6, 5, 6},
};
static const char font_chars[] = "0123456789FIWB";
enum { FONT_SCALE = 2, GLYPH_W = 3 * FONT_SCALE, GLYPH_H = 5 * FONT_SCALE, GLYPH_GAP = FONT_SCALE };
enum { ROW_H = 22, ROW_GAP = 4, MARGIN = 8, AXIS_H = 6 + GLYPH_H + 4, LEGEND_H = GLYPH_H + 8 };

typedef struct {
    unsigned char c[3];
} rgb;

static void fill(pp_chart_image *im, int x0, int y0, int x1, int y1, rgb col) {
    if (x0 < 0) x0 = 0;
    if (y0 < 0) y0 = 0;
    if (x1 > im->width) x1 = im->width;
    if (y1 > im->height) y1 = im->height;
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) memcpy(im->rgb + 3 * ((size_t)y * im->width + x), col.c, 3);
}

static int number_width(int v) {
    char buf[16];
    int n = snprintf(buf, sizeof buf, "%d", v);
    return n * GLYPH_W + (n - 1) * GLYPH_GAP;
}

static void draw_text(pp_chart_image *im, int x, int y, const char *text, rgb col) {
    for (; *text; text++, x += GLYPH_W + GLYPH_GAP) {
        const char *at = strchr(font_chars, *text);
        if (!at) continue;
        const unsigned char *g = font[at - font_chars];
        for (int gy = 0; gy < 5; gy++)
            for (int gx = 0; gx < 3; gx++)
                if (g[gy] & (4 >> gx))
                    fill(im, x + gx * FONT_SCALE, y + gy * FONT_SCALE, x + (gx + 1) * FONT_SCALE,
                         y + (gy + 1) * FONT_SCALE, col);
    }
}

static void draw_number(pp_chart_image *im, int x, int y, int v, rgb col) {
    char buf[16];
    snprintf(buf, sizeof buf, "%d", v);
    draw_text(im, x, y, buf, col);
}

static rgb type_colour(pp_action_type t, int chunk, int n_chunks) {
    rgb base;
    switch (t) {
    case PP_F: base = (rgb){{58, 118, 216}}; break;
    case PP_I: base = (rgb){{240, 140, 30}}; break;
    case PP_W: base = (rgb){{46, 160, 80}}; break;
    case PP_B: base = (rgb){{210, 60, 60}}; break;
    default: base = (rgb){{128, 128, 128}}; break;
    }
    /* later stages of a rank mix toward white; the last one halfway */
    double k = n_chunks > 1 ? 0.5 * chunk / (n_chunks - 1) : 0;
    for (int i = 0; i < 3; i++) base.c[i] = (unsigned char)(base.c[i] + (255 - base.c[i]) * k + 0.5);
    return base;
}

static rgb text_colour(rgb bg) {
    double lum = 0.299 * bg.c[0] + 0.587 * bg.c[1] + 0.114 * bg.c[2];
    return lum > 150 ? (rgb){{20, 20, 20}} : (rgb){{255, 255, 255}};
}

int pp_chart_raster(const pp_sim_result *r, int px_per_unit, pp_chart_image *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    double ppu = px_per_unit;
    if (ppu <= 0) {
        double shortest = 0;
        for (int k = 0; k < r->n_ranks; k++)
            for (int i = 0; i < r->n_slices[k]; i++) {
                double d = r->slices[k][i].end - r->slices[k][i].start;
                if (d > 0 && (shortest == 0 || d < shortest)) shortest = d;
            }
        ppu = shortest > 0 ? (number_width(88) + 6) / shortest : 20;
        if (r->makespan > 0 && ppu * r->makespan > 6000) ppu = 6000 / r->makespan;
        if (ppu < 1) ppu = 1;
    }
    int left = MARGIN + number_width(r->n_ranks - 1) + MARGIN;
    int plot_w = (int)ceil(r->makespan * ppu);
    int shades = r->max_stages_per_rank > 1 ? r->max_stages_per_rank : 1;
    int legend_w = 4 * (shades * (GLYPH_H + 2) + GLYPH_W + 18);
    out->width = left + (plot_w > legend_w ? plot_w : legend_w) + MARGIN + number_width((int)ceil(r->makespan)) / 2;
    out->height = MARGIN + r->n_ranks * (ROW_H + ROW_GAP) - ROW_GAP + AXIS_H + LEGEND_H + MARGIN;
    if (out->width > 20000 || out->height > 20000) {
        snprintf(err, errlen, "chart of %d x %d pixels is too large", out->width, out->height);
        return -1;
    }
    out->rgb = malloc((size_t)out->width * out->height * 3);
    if (!out->rgb) {
        snprintf(err, errlen, "out of memory for a %d x %d chart", out->width, out->height);
        return -1;
    }
    const rgb white = {{255, 255, 255}}, idle = {{226, 226, 226}}, ink = {{20, 20, 20}}, axis = {{110, 110, 110}};
    fill(out, 0, 0, out->width, out->height, white);
    for (int k = 0; k < r->n_ranks; k++) {
        int y0 = MARGIN + k * (ROW_H + ROW_GAP), y1 = y0 + ROW_H;
        draw_number(out, left - MARGIN - number_width(k), y0 + (ROW_H - GLYPH_H) / 2, k, ink);
        fill(out, left, y0, left + plot_w, y1, idle);
        for (int i = 0; i < r->n_slices[k]; i++) {
            const pp_sim_slice *sl = &r->slices[k][i];
            int x0 = left + (int)floor(sl->start * ppu + 0.5), x1 = left + (int)floor(sl->end * ppu + 0.5);
            if (x1 <= x0) continue;
            rgb col = type_colour(sl->type, sl->chunk, r->rank_stages[k]);
            /* a one-pixel white seam keeps back-to-back boxes apart */
            fill(out, x0, y0, x1 - (x1 - x0 >= 3), y1, col);
            if (sl->overlapped) fill(out, x0, y1 - 3, x1 - (x1 - x0 >= 3), y1, ink);
            int tw = number_width(sl->mb);
            if (tw + 2 <= x1 - x0 - 1)
                draw_number(out, x0 + (x1 - x0 - 1 - tw) / 2, y0 + (ROW_H - GLYPH_H) / 2, sl->mb, text_colour(col));
        }
    }
    /* time axis: a tick every 1, 2, 5, 10, ... units, at least 40 pixels apart */
    int ya = MARGIN + r->n_ranks * (ROW_H + ROW_GAP) - ROW_GAP + 2;
    fill(out, left, ya, left + plot_w, ya + 1, axis);
    double step = 1;
    for (int i = 0; step * ppu < 40 && i < 30; i++) step *= (i % 3 == 1) ? 2.5 : 2;
    for (double t = 0; t <= r->makespan + 1e-9; t += step) {
        int x = left + (int)floor(t * ppu + 0.5);
        fill(out, x, ya, x + 1, ya + 5, axis);
        if (t == floor(t)) draw_number(out, x - number_width((int)t) / 2, ya + 6, (int)t, axis);
    }
    /* legend: a swatch per type (and per later stage when ranks have several), then its letter */
    int yl = ya + AXIS_H + 4, xl = left;
    const pp_action_type types[4] = {PP_F, PP_I, PP_W, PP_B};
    for (int i = 0; i < 4; i++) {
        for (int c = 0; c < shades; c++, xl += GLYPH_H + 2)
            fill(out, xl, yl, xl + GLYPH_H, yl + GLYPH_H, type_colour(types[i], c, shades));
        char letter[2] = {type_letter(types[i]), 0};
        draw_text(out, xl + 2, yl, letter, ink);
        xl += GLYPH_W + 2 + 16;
    }
    return 0;
}

void pp_chart_image_free(pp_chart_image *img) {
    if (!img) return;
    free(img->rgb);
    img->rgb = NULL;
}
