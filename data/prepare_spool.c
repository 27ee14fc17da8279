/* prepare_spool.c — per-rank token spools and the shards cut from them (see
 * prepare_spool.h). */
#include "data/prepare_spool.h"
#include "util/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SPOOL_BUF ((size_t)4 << 20)
#define COPY_TOKENS ((size_t)1 << 20)

static const char *split_name(int s) { return s ? "val" : "train"; }

static void spool_path(char *out, size_t n, const char *dir, int rank, int split) {
    snprintf(out, n, "%s/.rank-%d.%s.ids", dir, rank, split_name(split));
}

void ps_spool_init(ps_spool *s, const char *dir, int rank, uint32_t width) {
    memset(s, 0, sizeof *s);
    s->dir = strdup(dir);
    s->rank = rank;
    s->width = width;
    s->fd[0] = s->fd[1] = -1;
}

static int spool_flush(ps_spool *s, char *err, size_t errlen) {
    if (!s->buf_n) return 0;
    const int sp = s->buf_split;
    if (s->fd[sp] < 0) {
        char path[4200];
        spool_path(path, sizeof path, s->dir, s->rank, sp);
        s->fd[sp] = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (s->fd[sp] < 0) {
            util_set_err(err, errlen, "%s: cannot create: %s", path, strerror(errno));
            return -1;
        }
    }
    if (shard_write_all(s->fd[sp], s->buf, s->buf_n) != 0) {
        util_set_err(err, errlen, "%s: cannot write the %s tokens of rank %d: %s", s->dir, split_name(sp), s->rank,
                     strerror(errno));
        return -1;
    }
    s->buf_n = 0;
    return 0;
}

int ps_spool_append(ps_spool *s, int split, const uint32_t *ids, size_t n, char *err, size_t errlen) {
    if (!s->buf && !(s->buf = malloc(SPOOL_BUF))) {
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    if (s->buf_n && s->buf_split != split && spool_flush(s, err, errlen) != 0) return -1;
    s->buf_split = split;
    for (size_t i = 0; i < n; i++) {
        if (s->buf_n + s->width > SPOOL_BUF && spool_flush(s, err, errlen) != 0) return -1;
        for (uint32_t b = 0; b < s->width; b++) s->buf[s->buf_n++] = (unsigned char)(ids[i] >> (8 * b));
    }
    s->n[split] += n;
    return 0;
}

int ps_spool_close(ps_spool *s, char *err, size_t errlen) {
    int rc = spool_flush(s, err, errlen);
    for (int sp = 0; sp < 2; sp++)
        if (s->fd[sp] >= 0) {
            if (close(s->fd[sp]) != 0 && rc == 0) {
                util_set_err(err, errlen, "%s: cannot close the spool of rank %d: %s", s->dir, s->rank,
                             strerror(errno));
                rc = -1;
            }
            s->fd[sp] = -1;
        }
    return rc;
}

void ps_spool_remove(ps_spool *s) {
    for (int sp = 0; sp < 2; sp++) {
        if (s->fd[sp] >= 0) close(s->fd[sp]);
        char path[4200];
        if (s->dir) {
            spool_path(path, sizeof path, s->dir, s->rank, sp);
            unlink(path);
        }
    }
    free(s->buf);
    free(s->dir);
    memset(s, 0, sizeof *s);
    s->fd[0] = s->fd[1] = -1;
}

/* Append stream tokens [a, b) of a split, read from the spools that hold them. */
static int copy_range(const char *dir, int split, uint32_t width, const uint64_t *counts, int size, uint64_t a,
                      uint64_t b, shard_writer *w, uint32_t *ids, unsigned char *raw, char *err, size_t errlen) {
    uint64_t start = 0;
    for (int r = 0; r < size && a < b; r++) {
        const uint64_t n = counts[r * 2 + split], end = start + n;
        if (a < end) {
            char path[4200];
            spool_path(path, sizeof path, dir, r, split);
            int fd = open(path, O_RDONLY);
            if (fd < 0) {
                util_set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
                return -1;
            }
            while (a < b && a < end) {
                size_t k = (size_t)((b < end ? b : end) - a);
                if (k > COPY_TOKENS) k = COPY_TOKENS;
                const size_t bytes = k * width;
                size_t got = 0;
                while (got < bytes) {
                    ssize_t m = pread(fd, raw + got, bytes - got, (off_t)((a - start) * width + got));
                    if (m < 0 && errno == EINTR) continue;
                    if (m <= 0) {
                        util_set_err(err, errlen, "%s: read error: %s", path,
                                     m < 0 ? strerror(errno) : "file too short");
                        close(fd);
                        return -1;
                    }
                    got += (size_t)m;
                }
                for (size_t i = 0; i < k; i++) {
                    uint32_t v = 0;
                    for (uint32_t q = 0; q < width; q++) v |= (uint32_t)raw[i * width + q] << (8 * q);
                    ids[i] = v;
                }
                if (shard_writer_append(w, ids, k, err, errlen) != 0) {
                    close(fd);
                    return -1;
                }
                a += k;
            }
            close(fd);
        }
        start = end;
    }
    return 0;
}

void ps_splits_free(shard_index_split out[2]) {
    for (int sp = 0; sp < 2; sp++) {
        for (int k = 0; k < out[sp].n_shards; k++) free(out[sp].shards[k].file);
        free(out[sp].shards);
        memset(&out[sp], 0, sizeof out[sp]);
    }
}

int ps_write_shards(const pd_world *w, const char *dir, uint32_t vocab, int64_t bos, int64_t eos, uint64_t shard_tokens,
                    const uint64_t *counts, shard_index_split out[2], char *err, size_t errlen) {
    const uint32_t width = shard_token_bytes_for_vocab(vocab);
    uint32_t *ids = malloc(COPY_TOKENS * sizeof *ids);
    unsigned char *raw = malloc(COPY_TOKENS * width);
    int rc = ids && raw ? 0 : -1;
    if (rc) util_set_err(err, errlen, "out of memory");
    memset(out, 0, 2 * sizeof *out);
    for (int sp = 0; sp < 2 && rc == 0; sp++) {
        uint64_t total = 0;
        for (int r = 0; r < w->size; r++) total += counts[r * 2 + sp];
        const uint64_t n_shards = (total + shard_tokens - 1) / shard_tokens;
        out[sp].name = (char *)split_name(sp);
        out[sp].n_tokens = total;
        if (!n_shards) continue;
        out[sp].shards = calloc((size_t)n_shards, sizeof *out[sp].shards);
        if (!out[sp].shards) {
            util_set_err(err, errlen, "out of memory");
            rc = -1;
            break;
        }
        out[sp].n_shards = (int)n_shards;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, split_name(sp));
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            util_set_err(err, errlen, "%s: cannot create folder: %s", path, strerror(errno));
            rc = -1;
            break;
        }
        for (uint64_t k = 0; k < n_shards; k++) {
            shard_index_shard *e = &out[sp].shards[k];
            char name[64];
            snprintf(name, sizeof name, "%s/shard_%05llu.bin", split_name(sp), (unsigned long long)k);
            if (!(e->file = strdup(name))) {
                util_set_err(err, errlen, "out of memory");
                rc = -1;
                break;
            }
            if ((int)(k % (uint64_t)w->size) != w->rank) continue; /* another rank's shard */
            snprintf(path, sizeof path, "%s/%s", dir, name);
            shard_writer *sw = shard_writer_open(path, vocab, bos, eos, err, errlen);
            const uint64_t a = k * shard_tokens, b = a + shard_tokens < total ? a + shard_tokens : total;
            if (!sw || copy_range(dir, sp, width, counts, w->size, a, b, sw, ids, raw, err, errlen) != 0) {
                if (sw) shard_writer_abort(sw);
                rc = -1;
                break;
            }
            shard_header h;
            if (shard_writer_close(sw, &h, err, errlen) != 0) {
                rc = -1;
                break;
            }
            e->n_tokens = h.n_tokens;
            e->crc32c = h.crc32c;
        }
    }
    free(ids);
    free(raw);
    if (pd_any(w, rc)) {
        if (!rc) util_set_err(err, errlen, "another rank failed writing shards");
        ps_splits_free(out);
        return -1;
    }
    /* every rank learns every shard's count and CRC (each was written by one rank) */
    for (int sp = 0; sp < 2; sp++) {
        const int n = out[sp].n_shards;
        uint64_t *v = calloc((size_t)(2 * n + 1), sizeof *v);
        if (pd_any(w, v == NULL)) {
            util_set_err(err, errlen, "out of memory");
            free(v);
            ps_splits_free(out);
            return -1;
        }
        for (int k = 0; k < n; k++) {
            v[2 * k] = out[sp].shards[k].n_tokens;
            v[2 * k + 1] = out[sp].shards[k].crc32c;
        }
        pd_sum_u64(w, v, (size_t)(2 * n));
        for (int k = 0; k < n; k++) {
            out[sp].shards[k].n_tokens = v[2 * k];
            out[sp].shards[k].crc32c = (uint32_t)v[2 * k + 1];
        }
        free(v);
    }
    return 0;
}
