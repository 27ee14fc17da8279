/* loader_mix.c — a weighted mixture of corpora behind the loader's interface (loader.h).
 *
 * Each source is a loader of its own (token shards or a Megatron dataset), used only for
 * its windows: the mixture decides which source's which sample every global window is
 * (mixture.h), so the state is the one global position and resumes, under any
 * data-parallel degree, into the same sample stream. */
#include "util/crc32c.h"
#include "data/loader.h"
#include "data/loader_internal.h"
#include "util/err.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(void *user, uint64_t e, const char *msg) { (void)user, (void)e, (void)msg; }

void dl_mix_free(dl_loader *dl) {
    if (!dl->n_src) return;
    for (int i = 0; i < dl->n_src; i++) {
        if (dl->src) dl_close(dl->src[i]);
        if (dl->src_name) free(dl->src_name[i]);
    }
    free(dl->src);
    free(dl->src_name);
    free(dl->counted);
    mix_plan_free(&dl->mix);
    dl->n_src = 0;
}

/* Open the sources and check they speak one vocabulary. */
static int open_sources(dl_loader *dl, const char *const *entries, int n, const char *split, double *w, char *err,
                        size_t errlen) {
    char e[1024], path[PATH_MAX];
    for (int i = 0; i < n; i++) {
        if (mix_parse_entry(entries[i], path, sizeof path, &w[i], e, sizeof e) != 0) {
            util_set_err(err, errlen, "mixture source %d: %s", i + 1, e);
            return -1;
        }
        for (int k = 0; k < i; k++)
            if (!strcmp(dl->src_name[k], path)) {
                util_set_err(err, errlen, "mixture source %d: %s is listed twice (sources %d and %d)", i + 1, path,
                             k + 1, i + 1);
                return -1;
            }
        if (!(dl->src_name[i] = strdup(path))) {
            util_set_err(err, errlen, "out of memory");
            return -1;
        }
        dl_config sub = dl->cfg;
        sub.on_epoch = quiet; /* the mixture says when a source wraps around */
        if (!(dl->src[i] = dl_open_config(path, split, &sub, e, sizeof e))) {
            util_set_err(err, errlen, "mixture source %d (%s): %s", i + 1, path, e);
            return -1;
        }
        const dl_loader *s = dl->src[i], *s0 = dl->src[0];
        if (s->vocab != s0->vocab || (s->bos >= 0 && s0->bos >= 0 && s->bos != s0->bos) ||
            (s->eos >= 0 && s0->eos >= 0 && s->eos != s0->eos)) {
            util_set_err(err, errlen,
                         "mixture sources %s (vocab %u, BOS %lld, EOS %lld) and %s (vocab %u, BOS %lld, EOS %lld) "
                         "were tokenized differently",
                         dl->src_name[0], s0->vocab, (long long)s0->bos, (long long)s0->eos, path, s->vocab,
                         (long long)s->bos, (long long)s->eos);
            return -1;
        }
        if (dl->cfg.single_pass && s->W < s->G) {
            util_set_err(err, errlen,
                         "mixture source %s: its \"%s\" split holds %llu sequences of %d tokens, fewer than one "
                         "global batch of %llu",
                         path, split, (unsigned long long)s->W, dl->cfg.seq_len + 1, (unsigned long long)s->G);
            return -1;
        }
    }
    return 0;
}

dl_loader *dl_open_mix(const char *const *entries, int n, const char *split, const dl_config *cfg, char *err,
                       size_t errlen) {
    if (n < 1 || n > MIX_MAX_SOURCES || !entries || !split || !cfg) {
        util_set_err(err, errlen, "a mixture needs 1 to %d sources (got %d)", MIX_MAX_SOURCES, n);
        return NULL;
    }
    dl_loader *dl = calloc(1, sizeof *dl);
    double *w = calloc((size_t)n, sizeof *w);
    if (!dl || !w) {
        free(dl);
        free(w);
        util_set_err(err, errlen, "out of memory");
        return NULL;
    }
    dl->cfg = *cfg;
    dl->n_src = n;
    dl->src = calloc((size_t)n, sizeof *dl->src);
    dl->src_name = calloc((size_t)n, sizeof *dl->src_name);
    dl->counted = calloc((size_t)n, sizeof *dl->counted);
    dl->dir = strdup("mixture");
    dl->split = strdup(split);
    dl->window = malloc(((size_t)cfg->seq_len + 1) * sizeof *dl->window);
    char e[1024];
    if (!dl->src || !dl->src_name || !dl->counted || !dl->dir || !dl->split || !dl->window) {
        util_set_err(err, errlen, "out of memory");
        goto fail;
    }
    if (open_sources(dl, entries, n, split, w, err, errlen) != 0) goto fail;
    if (mix_plan_init(&dl->mix, w, n, cfg->seed, e, sizeof e) != 0) {
        util_set_err(err, errlen, "mixture: %s", e);
        goto fail;
    }
    dl->vocab = dl->src[0]->vocab;
    dl->bos = dl->src[0]->bos;
    dl->eos = dl->src[0]->eos;
    dl->G = dl->src[0]->G;
    /* which mixture: its sources, their sizes and the quotas; the seed is checked apart */
    uint32_t fp = crc32c(0, "mixture", 7);
    for (int i = 0; i < n; i++) {
        const uint64_t rec[3] = {dl->src[i]->fingerprint, dl->src[i]->n_tokens, dl->mix.quota[i]};
        fp = crc32c(fp, rec, sizeof rec);
        dl->n_tokens += dl->src[i]->n_tokens;
        dl->W += dl->src[i]->W;
    }
    dl->fingerprint = fp;
    free(w);
    return dl;
fail:
    free(w);
    dl_close(dl);
    return NULL;
}

/* Single pass (validation): the sources one after another, each in whole global batches. */
static int next_in_turn(dl_loader *dl, int32_t *inputs, int32_t *labels, int32_t *docs) {
    while (dl->cur_src < dl->n_src) {
        int got = dl_next_docs(dl->src[dl->cur_src], inputs, labels, docs);
        if (got == 1) {
            dl->last_src = dl->cur_src;
            dl->position += dl->G;
            return 1;
        }
        if (got < 0) {
            snprintf(dl->error, sizeof dl->error, "%s", dl_error(dl->src[dl->cur_src]));
            return -1;
        }
        dl->cur_src++;
    }
    return 0;
}

/* Say which sources finished an epoch within this step's samples. */
static void report_epochs(dl_loader *dl, const uint64_t *after) {
    for (int i = 0; i < dl->n_src; i++) {
        const uint64_t W = dl->src[i]->W, before = dl->counted[i];
        if (!after[i]) continue;
        for (uint64_t e = before ? (before - 1) / W : 0; e < (after[i] - 1) / W; e++) {
            char msg[PATH_MAX + 256];
            snprintf(msg, sizeof msg,
                     "data: mixture source %s finished epoch %llu of its \"%s\" split (%llu sequences of %d tokens); "
                     "wrapping around to epoch %llu",
                     dl->src_name[i], (unsigned long long)(e + 1), dl->split, (unsigned long long)W,
                     dl->cfg.seq_len + 1, (unsigned long long)(e + 2));
            if (dl->cfg.on_epoch) dl->cfg.on_epoch(dl->cfg.on_epoch_user, e + 1, msg);
            else if (dl->cfg.dp_rank == 0) fprintf(stderr, "%s\n", msg);
        }
    }
}

int dl_mix_next(dl_loader *dl, int32_t *inputs, int32_t *labels, int32_t *docs) {
    if (dl->cfg.single_pass) return next_in_turn(dl, inputs, labels, docs);
    const size_t T = (size_t)dl->cfg.seq_len;
    const uint64_t R = (uint64_t)dl->cfg.dp_size, r = (uint64_t)dl->cfg.dp_rank;
    for (int k = 0; k < dl->cfg.local_batch_size; k++) {
        int i;
        uint64_t j;
        mix_map(&dl->mix, dl->position + (uint64_t)k * R + r, &i, &j);
        dl_loader *s = dl->src[i];
        const uint64_t first = dl_window_of(s, j) * (T + 1);
        if (dl_read_stream(s, first, T + 1, dl->window)) {
            snprintf(dl->error, sizeof dl->error, "%s", s->error);
            return -1;
        }
        memcpy(inputs + (size_t)k * T, dl->window, T * sizeof *inputs);
        memcpy(labels + (size_t)k * T, dl->window + 1, T * sizeof *labels);
        if (docs) dl_window_docs(s, first, dl->window, (int)T, docs + (size_t)k * T);
    }
    uint64_t after[MIX_MAX_SOURCES];
    mix_counts(&dl->mix, dl->position + dl->G, after);
    report_epochs(dl, after);
    memcpy(dl->counted, after, (size_t)dl->n_src * sizeof *after);
    dl->position += dl->G;
    return 1;
}

void dl_mix_rewind(dl_loader *dl) {
    for (int i = 0; i < dl->n_src; i++) dl_rewind(dl->src[i]);
    memset(dl->counted, 0, (size_t)dl->n_src * sizeof *dl->counted);
    dl->cur_src = dl->last_src = 0;
}

/* ---- facts ------------------------------------------------------------------------------ */

int dl_num_sources(const dl_loader *dl) { return dl->n_src ? dl->n_src : 1; }
const char *dl_source_name(const dl_loader *dl, int i) { return dl->n_src ? dl->src_name[i] : dl->dir; }
double dl_source_weight(const dl_loader *dl, int i) { return dl->n_src ? dl->mix.weight[i] : 1.0; }
uint64_t dl_source_windows(const dl_loader *dl, int i) { return dl->n_src ? dl->src[i]->W : dl->W; }
int dl_last_source(const dl_loader *dl) { return dl->n_src ? dl->last_src : 0; }
void dl_skip_source(dl_loader *dl) {
    if (dl->n_src && dl->cur_src < dl->n_src) dl->cur_src++;
}

void dl_source_counts(const dl_loader *dl, uint64_t n, uint64_t *counts) {
    if (dl->n_src) mix_counts(&dl->mix, n, counts);
    else counts[0] = n;
}

int dl_mix_summary(const dl_loader *dl, uint64_t n, char *buf, size_t len) {
    uint64_t c[MIX_MAX_SOURCES];
    const int k = dl_num_sources(dl);
    dl_source_counts(dl, n, c);
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < k && at < len; i++) {
        const double share = n ? (double)c[i] / (double)n : 0.0;
        int w = snprintf(buf + at, len - at, "%s%s: weight %.4f, realised %.4f (%llu of %llu samples, %.2f epochs)",
                         i ? "; " : "", dl_source_name(dl, i), dl_source_weight(dl, i), share, (unsigned long long)c[i],
                         (unsigned long long)n, (double)c[i] / (double)dl_source_windows(dl, i));
        if (w < 0) break;
        at += (size_t)w;
    }
    return at < len ? 0 : -1;
}

int dl_mix_json(const dl_loader *dl, char *buf, size_t len) {
    uint64_t c[MIX_MAX_SOURCES];
    const int k = dl_num_sources(dl);
    const uint64_t n = dl->position;
    dl_source_counts(dl, n, c);
    size_t at = 0;
    int w = snprintf(buf, len, "{\"samples\":%llu,\"sources\":{", (unsigned long long)n);
    for (int i = 0; w >= 0 && i < k; i++) {
        at += (size_t)w;
        if (at >= len) return -1;
        char name[1024];
        size_t q = 0;
        for (const char *p = dl_source_name(dl, i); *p && q + 2 < sizeof name; p++) { /* JSON-escape the path */
            if (*p == '"' || *p == '\\') name[q++] = '\\';
            name[q++] = (char)((unsigned char)*p < 0x20 ? '?' : *p);
        }
        name[q] = 0;
        w = snprintf(buf + at, len - at, "%s\"%s\":{\"weight\":%.17g,\"samples\":%llu,\"share\":%.17g}", i ? "," : "",
                     name, dl_source_weight(dl, i), (unsigned long long)c[i], n ? (double)c[i] / (double)n : 0.0);
    }
    if (w < 0) return -1;
    at += (size_t)w;
    if (at >= len) return -1;
    w = snprintf(buf + at, len - at, "}}");
    return w < 0 || at + (size_t)w >= len ? -1 : 0;
}
