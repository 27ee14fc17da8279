/* mixture.c — weighted, seeded interleaving of sources (see mixture.h). */
#include "data/mixture.h"

#include "data/loader.h"
#include "util/err.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* keeps the block orders apart from the shuffling permutations of the same seed */
#define MIX_KEY 0x6d69787475726573ull

int mix_parse_entry(const char *entry, char *path, size_t pathlen, double *weight, char *err, size_t errlen) {
    const char *colon = entry ? strrchr(entry, ':') : NULL;
    if (!colon || colon == entry || !colon[1]) {
        util_set_err(err, errlen, "\"%s\": expected \"PATH:WEIGHT\", e.g. \"data/fineweb:0.7\"", entry ? entry : "");
        return -1;
    }
    char *end;
    errno = 0;
    double w = strtod(colon + 1, &end);
    if (errno || *end || !isfinite(w) || !(w > 0)) {
        util_set_err(err, errlen, "\"%s\": the weight \"%s\" is not a positive number", entry, colon + 1);
        return -1;
    }
    size_t n = (size_t)(colon - entry);
    if (n >= pathlen) {
        util_set_err(err, errlen, "\"%s\": path too long", entry);
        return -1;
    }
    memcpy(path, entry, n);
    path[n] = 0;
    *weight = w;
    return 0;
}

void mix_plan_free(mix_plan *m) {
    free(m->table_src);
    free(m->table_rank);
    free(m->weight);
    free(m->quota);
    free(m->first);
    memset(m, 0, sizeof *m);
}

int mix_plan_init(mix_plan *m, const double *weights, int n, uint64_t seed, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    if (n < 1 || n > MIX_MAX_SOURCES) {
        util_set_err(err, errlen, "a mixture needs 1 to %d sources, not %d", MIX_MAX_SOURCES, n);
        return -1;
    }
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(weights[i]) || !(weights[i] > 0)) {
            util_set_err(err, errlen, "source %d: weight %g is not a positive number", i + 1, weights[i]);
            return -1;
        }
        sum += weights[i];
    }
    m->n = n;
    m->seed = seed;
    m->weight = malloc((size_t)n * sizeof *m->weight);
    m->quota = calloc((size_t)n, sizeof *m->quota);
    m->first = calloc((size_t)n + 1, sizeof *m->first);
    m->table_src = malloc(MIX_BLOCK * sizeof *m->table_src);
    m->table_rank = malloc(MIX_BLOCK * sizeof *m->table_rank);
    double *frac = malloc((size_t)n * sizeof *frac);
    if (!m->weight || !m->quota || !m->first || !m->table_src || !m->table_rank || !frac) {
        free(frac);
        mix_plan_free(m);
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    uint32_t dealt = 0;
    for (int i = 0; i < n; i++) {
        m->weight[i] = weights[i] / sum;
        const double exact = m->weight[i] * (double)MIX_BLOCK;
        m->quota[i] = (uint32_t)floor(exact);
        frac[i] = exact - floor(exact);
        dealt += m->quota[i];
    }
    /* largest remainder: the samples left go to the largest fractions (the first on ties) */
    while (dealt < MIX_BLOCK) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (frac[i] > frac[best]) best = i;
        m->quota[best]++;
        frac[best] = -1.0;
        dealt++;
    }
    free(frac);
    for (int i = 0; i < n; i++) {
        if (m->quota[i] == 0) {
            util_set_err(err, errlen, "source %d: weight %g is %.2g of the total, less than one sample in %u", i + 1,
                         weights[i], m->weight[i], MIX_BLOCK);
            mix_plan_free(m);
            return -1;
        }
        m->first[i + 1] = m->first[i] + m->quota[i];
    }
    return 0;
}

static int source_of_slot(const mix_plan *m, uint32_t s) {
    int lo = 0, hi = m->n - 1;
    while (lo < hi) { /* the last source whose first slot is at or before s */
        int mid = (lo + hi + 1) / 2;
        if (m->first[mid] <= s) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Sample p of block b is the sample in slot perm_b(p); the slots of source i are
 * first[i] .. first[i+1]-1. Its rank counts source i's samples before it in the block. */
static void fill_table(mix_plan *m, uint64_t b) {
    uint32_t seen[MIX_MAX_SOURCES];
    memset(seen, 0, (size_t)m->n * sizeof *seen);
    for (uint32_t p = 0; p < MIX_BLOCK; p++) {
        const int i = source_of_slot(m, (uint32_t)dl_permute(p, MIX_BLOCK, m->seed ^ MIX_KEY, b));
        m->table_src[p] = (uint8_t)i;
        m->table_rank[p] = (uint16_t)seen[i]++;
    }
    m->table_block = b;
    m->table_ready = 1;
}

void mix_map(mix_plan *m, uint64_t g, int *src, uint64_t *j) {
    const uint64_t b = g / MIX_BLOCK;
    if (!m->table_ready || m->table_block != b) fill_table(m, b);
    const int i = m->table_src[g % MIX_BLOCK];
    *src = i;
    *j = b * m->quota[i] + m->table_rank[g % MIX_BLOCK];
}

void mix_counts(const mix_plan *m, uint64_t n, uint64_t *counts) {
    const uint64_t b = n / MIX_BLOCK;
    for (int i = 0; i < m->n; i++) counts[i] = b * m->quota[i];
    for (uint64_t p = 0; p < n % MIX_BLOCK; p++)
        counts[source_of_slot(m, (uint32_t)dl_permute(p, MIX_BLOCK, m->seed ^ MIX_KEY, b))]++;
}
