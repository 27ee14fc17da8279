/* shard.c — token shard files and index.json (format in shard.h). */
#include "data/shard.h"

#include "util/crc32c.h"
#include "util/err.h"
#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

uint32_t shard_token_bytes_for_vocab(uint32_t vocab_size) { return vocab_size <= 65536u ? 2u : 4u; }

/* ---- header ------------------------------------------------------------------ */

static void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}
static void put64(unsigned char *p, uint64_t v) {
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}
static uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t get64(const unsigned char *p) { return (uint64_t)get32(p) | ((uint64_t)get32(p + 4) << 32); }

static uint32_t id_to_u32(int64_t id) { return id < 0 ? SHARD_NO_ID : (uint32_t)id; }
static int64_t u32_to_id(uint32_t v) { return v == SHARD_NO_ID ? -1 : (int64_t)v; }

void shard_header_encode(const shard_header *h, unsigned char out[SHARD_HEADER_BYTES]) {
    memset(out, 0, SHARD_HEADER_BYTES);
    memcpy(out, SHARD_MAGIC, 8);
    put32(out + 8, SHARD_VERSION);
    put32(out + 12, SHARD_HEADER_BYTES);
    put32(out + 16, h->vocab_size);
    put32(out + 20, h->token_bytes);
    put64(out + 24, h->n_tokens);
    put32(out + 32, h->crc32c);
    put32(out + 36, id_to_u32(h->bos_id));
    put32(out + 40, id_to_u32(h->eos_id));
    put32(out + 60, crc32c(0, out, 60));
}

int shard_header_decode(const unsigned char *buf, size_t len, uint64_t file_size, const char *path, shard_header *h,
                        char *err, size_t errlen) {
    if (len < SHARD_HEADER_BYTES) {
        if (len >= 8 && memcmp(buf, SHARD_MAGIC, 8) != 0)
            util_set_err(err, errlen, "%s: not a tetra token shard (wrong magic; expected \"%s\")", path, SHARD_MAGIC);
        else
            util_set_err(err, errlen, "%s: truncated shard: %zu bytes, shorter than the %u-byte header", path, len,
                         SHARD_HEADER_BYTES);
        return -1;
    }
    if (memcmp(buf, SHARD_MAGIC, 8) != 0) {
        util_set_err(err, errlen, "%s: not a tetra token shard (wrong magic; expected \"%s\")", path, SHARD_MAGIC);
        return -1;
    }
    uint32_t version = get32(buf + 8);
    if (version != SHARD_VERSION) {
        util_set_err(err, errlen, "%s: shard format version %u is not supported (this build reads version %u)", path,
                     version, SHARD_VERSION);
        return -1;
    }
    if (get32(buf + 60) != crc32c(0, buf, 60) || get32(buf + 12) != SHARD_HEADER_BYTES) {
        util_set_err(err, errlen, "%s: corrupt shard header (header checksum mismatch)", path);
        return -1;
    }
    memset(h, 0, sizeof *h);
    h->version = version;
    h->vocab_size = get32(buf + 16);
    h->token_bytes = get32(buf + 20);
    h->n_tokens = get64(buf + 24);
    h->crc32c = get32(buf + 32);
    h->bos_id = u32_to_id(get32(buf + 36));
    h->eos_id = u32_to_id(get32(buf + 40));
    if (h->vocab_size == 0 || (h->token_bytes != 2 && h->token_bytes != 4) ||
        (h->token_bytes == 2 && h->vocab_size > 65536u)) {
        util_set_err(err, errlen, "%s: invalid shard header (vocab size %u, token width %u bytes)", path, h->vocab_size,
                     h->token_bytes);
        return -1;
    }
    if (h->n_tokens > (UINT64_MAX - SHARD_HEADER_BYTES) / h->token_bytes) {
        util_set_err(err, errlen, "%s: invalid shard header (token count %llu)", path, (unsigned long long)h->n_tokens);
        return -1;
    }
    if (file_size) {
        uint64_t want = SHARD_HEADER_BYTES + h->n_tokens * h->token_bytes;
        if (file_size < want) {
            util_set_err(err, errlen,
                         "%s: truncated shard: the header says %llu tokens (%llu bytes) but the file has %llu bytes",
                         path, (unsigned long long)h->n_tokens, (unsigned long long)want,
                         (unsigned long long)file_size);
            return -1;
        }
        if (file_size > want) {
            util_set_err(err, errlen, "%s: corrupt shard: %llu bytes after the %llu tokens the header announces", path,
                         (unsigned long long)(file_size - want), (unsigned long long)h->n_tokens);
            return -1;
        }
    }
    return 0;
}

/* ---- small file helpers --------------------------------------------------------- */

int shard_write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int shard_fsync_parent(const char *path) {
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash) {
        strcpy(dir, ".");
    } else if (slash == path) {
        strcpy(dir, "/");
    } else {
        size_t n = (size_t)(slash - path);
        if (n >= sizeof dir) return -1;
        memcpy(dir, path, n);
        dir[n] = 0;
    }
    int fd = open(dir, O_RDONLY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    /* Some file systems refuse fsync on a directory; that is not an error here. */
    if (rc != 0 && (errno == EINVAL || errno == EBADF)) rc = 0;
    close(fd);
    return rc;
}

/* ---- writer ------------------------------------------------------------------------ */

#define WRITER_BUF (1u << 20)

struct shard_writer {
    char *path, *tmp;
    int fd;
    shard_header h;
    unsigned char *buf;
    size_t used;
};

shard_writer *shard_writer_open(const char *path, uint32_t vocab_size, int64_t bos_id, int64_t eos_id, char *err,
                                size_t errlen) {
    if (vocab_size == 0) {
        util_set_err(err, errlen, "%s: vocab size must be positive", path);
        return NULL;
    }
    shard_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(path);
    if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(n + 5)) || !(w->buf = malloc(WRITER_BUF))) {
        util_set_err(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    memcpy(w->tmp, path, n);
    memcpy(w->tmp + n, ".tmp", 5);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (w->fd < 0) {
        util_set_err(err, errlen, "%s: cannot create: %s", w->tmp, strerror(errno));
        goto fail;
    }
    w->h.version = SHARD_VERSION;
    w->h.vocab_size = vocab_size;
    w->h.token_bytes = shard_token_bytes_for_vocab(vocab_size);
    w->h.bos_id = bos_id;
    w->h.eos_id = eos_id;
    unsigned char hdr[SHARD_HEADER_BYTES];
    shard_header_encode(&w->h, hdr);
    /* The header goes in first with a blank magic and is rewritten whole when the writer
     * closes, after the data: a file cut short by a crash is never taken for a shard. */
    memset(hdr, 0, 8);
    if (shard_write_all(w->fd, hdr, sizeof hdr) != 0) {
        util_set_err(err, errlen, "%s: write failed: %s", w->tmp, strerror(errno));
        close(w->fd);
        unlink(w->tmp);
        goto fail;
    }
    return w;
fail:
    if (w) {
        free(w->path);
        free(w->tmp);
        free(w->buf);
        free(w);
    }
    return NULL;
}

static int writer_flush(shard_writer *w, char *err, size_t errlen) {
    if (!w->used) return 0;
    w->h.crc32c = crc32c(w->h.crc32c, w->buf, w->used);
    if (shard_write_all(w->fd, w->buf, w->used) != 0) {
        util_set_err(err, errlen, "%s: write failed: %s", w->tmp, strerror(errno));
        return -1;
    }
    w->used = 0;
    return 0;
}

int shard_writer_append(shard_writer *w, const uint32_t *ids, size_t n, char *err, size_t errlen) {
    const uint32_t tb = w->h.token_bytes;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = ids[i];
        if (v >= w->h.vocab_size) {
            util_set_err(err, errlen, "%s: token id %u is outside the vocabulary (size %u)", w->path, v,
                         w->h.vocab_size);
            return -1;
        }
        if (w->used + tb > WRITER_BUF && writer_flush(w, err, errlen) != 0) return -1;
        unsigned char *p = w->buf + w->used;
        p[0] = (unsigned char)v;
        p[1] = (unsigned char)(v >> 8);
        if (tb == 4) {
            p[2] = (unsigned char)(v >> 16);
            p[3] = (unsigned char)(v >> 24);
        }
        w->used += tb;
    }
    w->h.n_tokens += n;
    return 0;
}

uint64_t shard_writer_tokens(const shard_writer *w) { return w->h.n_tokens; }

static void writer_free(shard_writer *w) {
    free(w->path);
    free(w->tmp);
    free(w->buf);
    free(w);
}

void shard_writer_abort(shard_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    unlink(w->tmp);
    writer_free(w);
}

int shard_writer_close(shard_writer *w, shard_header *out, char *err, size_t errlen) {
    unsigned char hdr[SHARD_HEADER_BYTES];
    if (writer_flush(w, err, errlen) != 0) goto fail;
    shard_header_encode(&w->h, hdr);
    if (lseek(w->fd, 0, SEEK_SET) != 0 || shard_write_all(w->fd, hdr, sizeof hdr) != 0) {
        util_set_err(err, errlen, "%s: write failed: %s", w->tmp, strerror(errno));
        goto fail;
    }
    if (fsync(w->fd) != 0) {
        util_set_err(err, errlen, "%s: fsync failed: %s", w->tmp, strerror(errno));
        goto fail;
    }
    if (close(w->fd) != 0) {
        w->fd = -1;
        util_set_err(err, errlen, "%s: close failed: %s", w->tmp, strerror(errno));
        goto fail;
    }
    w->fd = -1;
    if (rename(w->tmp, w->path) != 0) {
        util_set_err(err, errlen, "%s: cannot rename to %s: %s", w->tmp, w->path, strerror(errno));
        goto fail;
    }
    shard_fsync_parent(w->path);
    if (out) *out = w->h;
    writer_free(w);
    return 0;
fail:
    shard_writer_abort(w);
    return -1;
}

/* ---- reader -------------------------------------------------------------------------- */

int shard_open(shard_file *s, const char *path, int verify, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        util_set_err(err, errlen, "%s: cannot open shard: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        util_set_err(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        util_set_err(err, errlen, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    if (size < SHARD_HEADER_BYTES) {
        unsigned char buf[SHARD_HEADER_BYTES];
        ssize_t k = size ? read(fd, buf, size) : 0;
        close(fd);
        shard_header h;
        shard_header_decode(buf, k > 0 ? (size_t)k : 0, 0, path, &h, err, errlen);
        return -1;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        util_set_err(err, errlen, "%s: cannot map: %s", path, strerror(errno));
        return -1;
    }
    s->map = map;
    s->map_len = size;
    if (shard_header_decode(s->map, size, size, path, &s->h, err, errlen) != 0) goto fail;
    s->tokens = s->map + SHARD_HEADER_BYTES;
    if (verify) {
        uint32_t c = crc32c(0, s->tokens, (size_t)(s->h.n_tokens * s->h.token_bytes));
        if (c != s->h.crc32c) {
            util_set_err(err, errlen,
                         "%s: checksum mismatch: payload CRC-32C is %08x, the header says %08x (corrupt shard)", path,
                         c, s->h.crc32c);
            goto fail;
        }
    }
    if (!(s->path = strdup(path))) {
        util_set_err(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    return 0;
fail:
    munmap((void *)s->map, s->map_len);
    memset(s, 0, sizeof *s);
    return -1;
}

void shard_close(shard_file *s) {
    if (s->map) munmap((void *)s->map, s->map_len);
    free(s->path);
    memset(s, 0, sizeof *s);
}

void shard_read_tokens(const shard_file *s, uint64_t first, size_t n, int32_t *out) {
    const unsigned char *p = s->tokens + first * s->h.token_bytes;
    if (s->h.token_bytes == 2) {
        for (size_t i = 0; i < n; i++, p += 2) out[i] = (int32_t)((uint32_t)p[0] | ((uint32_t)p[1] << 8));
    } else {
        for (size_t i = 0; i < n; i++, p += 4)
            out[i] =
                (int32_t)((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24));
    }
}

/* ---- index.json ------------------------------------------------------------------------ */

/* A split's optional "document_lengths": its buckets must be bucket starts, each with
 * tokens between count x its shortest and count x the next bucket's start. */
static int read_doc_lengths(json_t *dl, shard_index_split *sp, const char *path, char *err, size_t errlen) {
    if (!dl) return 0;
    if (!json_is_array(dl) || !(sp->doc_lengths = calloc(1, sizeof *sp->doc_lengths))) {
        util_set_err(err, errlen, "%s: split \"%s\": \"document_lengths\" is not an array (or out of memory)", path,
                     sp->name);
        return -1;
    }
    for (size_t i = 0; i < json_array_size(dl); i++) {
        json_int_t low = 0, count = 0, tokens = 0;
        if (json_unpack(json_array_get(dl, i), "[I, I, I]", &low, &count, &tokens) != 0 || low < 1 || count < 1) {
            util_set_err(err, errlen, "%s: split \"%s\": document_lengths[%zu] is not [length, documents, tokens]",
                         path, sp->name, i);
            return -1;
        }
        const int b = doclen_bucket((uint64_t)low);
        const double hi = b + 1 < DOCLEN_BUCKETS ? (double)doclen_bucket_low(b + 1) : 1e300;
        if (doclen_bucket_low(b) != (uint64_t)low || (double)tokens < (double)count * (double)low ||
            (double)tokens >= (double)count * hi) {
            util_set_err(err, errlen,
                         "%s: split \"%s\": document_lengths[%zu] = [%lld, %lld, %lld] is not a bucket of "
                         "lengths from %lld",
                         path, sp->name, i, (long long)low, (long long)count, (long long)tokens, (long long)low);
            return -1;
        }
        sp->doc_lengths->count[b] = (uint64_t)count;
        sp->doc_lengths->tokens[b] = (uint64_t)tokens;
    }
    return 0;
}

int shard_index_write(const char *dir, const shard_index *ix, char *err, size_t errlen) {
    int rc = -1;
    char *path = util_path_join(dir, "index.json"), *tmp = NULL, *text = NULL;
    json_t *root = json_object(), *splits = json_object();
    if (!path || !root || !splits) {
        util_set_err(err, errlen, "%s/index.json: out of memory", dir);
        goto out;
    }
    json_object_set_new(root, "format", json_string(SHARD_INDEX_FORMAT));
    json_object_set_new(root, "version", json_integer(SHARD_INDEX_VERSION));
    json_object_set_new(root, "vocab_size", json_integer(ix->vocab_size));
    json_object_set_new(root, "token_bytes", json_integer(ix->token_bytes));
    json_object_set_new(root, "bos_id", json_integer(ix->bos_id));
    json_object_set_new(root, "eos_id", json_integer(ix->eos_id));
    if (ix->tokenizer) json_object_set_new(root, "tokenizer", json_string(ix->tokenizer));
    if (ix->tokenizer_fingerprint)
        json_object_set_new(root, "tokenizer_fingerprint", json_string(ix->tokenizer_fingerprint));
    if (ix->input) json_object_set_new(root, "input", json_string(ix->input));
    json_object_set_new(root, "val_fraction", json_real(ix->val_fraction));
    if (ix->val_rule) json_object_set_new(root, "val_rule", json_string(ix->val_rule));
    for (int i = 0; i < ix->n_splits; i++) {
        const shard_index_split *sp = &ix->splits[i];
        json_t *o = json_object(), *arr = json_array();
        json_object_set_new(o, "documents", json_integer((json_int_t)sp->n_documents));
        json_object_set_new(o, "tokens", json_integer((json_int_t)sp->n_tokens));
        for (int k = 0; k < sp->n_shards; k++) {
            json_t *s = json_object();
            json_object_set_new(s, "file", json_string(sp->shards[k].file));
            json_object_set_new(s, "tokens", json_integer((json_int_t)sp->shards[k].n_tokens));
            json_object_set_new(s, "crc32c", json_integer(sp->shards[k].crc32c));
            json_array_append_new(arr, s);
        }
        json_object_set_new(o, "shards", arr);
        if (sp->doc_lengths) {
            json_t *dl = json_array();
            for (int b = 0; b < DOCLEN_BUCKETS; b++)
                if (sp->doc_lengths->count[b])
                    json_array_append_new(dl,
                                          json_pack("[I, I, I]", (json_int_t)doclen_bucket_low(b),
                                                    (json_int_t)sp->doc_lengths->count[b],
                                                    (json_int_t)sp->doc_lengths->tokens[b]));
            json_object_set_new(o, "document_lengths", dl);
        }
        json_object_set_new(splits, sp->name, o);
    }
    json_object_set_new(root, "splits", splits);
    splits = NULL;
    text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    size_t n = strlen(path);
    tmp = malloc(n + 5);
    if (!text || !tmp) {
        util_set_err(err, errlen, "%s: out of memory", path);
        goto out;
    }
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp", 5);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        util_set_err(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    size_t len = strlen(text);
    text[len] = '\n'; /* json_dumps leaves room for the NUL; reuse it */
    if (shard_write_all(fd, text, len + 1) != 0 || fsync(fd) != 0) {
        util_set_err(err, errlen, "%s: write failed: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        goto out;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        util_set_err(err, errlen, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        goto out;
    }
    shard_fsync_parent(path);
    rc = 0;
out:
    json_decref(root);
    json_decref(splits);
    free(path);
    free(tmp);
    free(text);
    return rc;
}

static int get_uint(json_t *o, const char *key, uint64_t maxv, uint64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > maxv) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static char *dup_opt_string(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

int shard_index_read(const char *dir, shard_index *ix, char *err, size_t errlen) {
    memset(ix, 0, sizeof *ix);
    char *path = util_path_join(dir, "index.json");
    if (!path) {
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    int rc = -1;
    json_error_t jerr;
    json_t *root = NULL;
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) { /* e.g. its index.json, or a text corpus */
        util_set_err(
            err, errlen,
            "%s is a file, not a corpus folder: name the folder `tetra data prepare` wrote (the one "
            "holding index.json and the token shards), or prepare one from this file with `tetra data prepare`",
            dir);
        goto out;
    }
    if (stat(dir, &st) != 0) {
        util_set_err(err, errlen, "%s: no such corpus folder (prepare one with `tetra data prepare`)", dir);
        goto out;
    }
    if (access(path, F_OK) != 0) {
        util_set_err(err, errlen, "%s: not found; %s is not a prepared corpus (make one with `tetra data prepare`)",
                     path, dir);
        goto out;
    }
    root = json_load_file(path, 0, &jerr);
    if (!root) {
        util_set_err(err, errlen, "%s:%d: invalid JSON: %s", path, jerr.line, jerr.text);
        goto out;
    }
    json_t *fmt = json_object_get(root, "format");
    if (!json_is_object(root) || !json_is_string(fmt) || strcmp(json_string_value(fmt), SHARD_INDEX_FORMAT) != 0) {
        util_set_err(err, errlen, "%s: not a tetra token-shard index (\"format\" is not \"%s\")", path,
                     SHARD_INDEX_FORMAT);
        goto out;
    }
    uint64_t version, vocab, tb;
    if (get_uint(root, "version", INT32_MAX, &version) != 0 || version != SHARD_INDEX_VERSION) {
        util_set_err(err, errlen, "%s: index version is not supported (this build reads version %d)", path,
                     SHARD_INDEX_VERSION);
        goto out;
    }
    if (get_uint(root, "vocab_size", UINT32_MAX, &vocab) != 0 || vocab == 0 ||
        get_uint(root, "token_bytes", 4, &tb) != 0 || tb != shard_token_bytes_for_vocab((uint32_t)vocab)) {
        util_set_err(err, errlen, "%s: bad \"vocab_size\" or \"token_bytes\"", path);
        goto out;
    }
    ix->vocab_size = (uint32_t)vocab;
    ix->token_bytes = (uint32_t)tb;
    json_t *b = json_object_get(root, "bos_id"), *e = json_object_get(root, "eos_id");
    ix->bos_id = json_is_integer(b) ? json_integer_value(b) : -1;
    ix->eos_id = json_is_integer(e) ? json_integer_value(e) : -1;
    ix->tokenizer = dup_opt_string(root, "tokenizer");
    ix->tokenizer_fingerprint = dup_opt_string(root, "tokenizer_fingerprint");
    if (ix->tokenizer_fingerprint &&
        (strlen(ix->tokenizer_fingerprint) != 16 || strspn(ix->tokenizer_fingerprint, "0123456789abcdef") != 16)) {
        util_set_err(err, errlen, "%s: \"tokenizer_fingerprint\" must be 16 lowercase hex digits, got \"%.40s\"", path,
                     ix->tokenizer_fingerprint);
        goto out;
    }
    ix->input = dup_opt_string(root, "input");
    ix->val_rule = dup_opt_string(root, "val_rule");
    json_t *vf = json_object_get(root, "val_fraction");
    ix->val_fraction = json_is_number(vf) ? json_number_value(vf) : 0.0;
    json_t *splits = json_object_get(root, "splits");
    if (!json_is_object(splits)) {
        util_set_err(err, errlen, "%s: no \"splits\" object", path);
        goto out;
    }
    size_t ns = json_object_size(splits);
    ix->splits = calloc(ns ? ns : 1, sizeof *ix->splits);
    if (!ix->splits) {
        util_set_err(err, errlen, "%s: out of memory", path);
        goto out;
    }
    const char *name;
    json_t *so;
    json_object_foreach(splits, name, so) {
        shard_index_split *sp = &ix->splits[ix->n_splits++];
        sp->name = strdup(name);
        json_t *arr = json_object_get(so, "shards");
        if (!sp->name || !json_is_object(so) || !json_is_array(arr) ||
            get_uint(so, "tokens", UINT64_MAX >> 1, &sp->n_tokens) != 0 ||
            get_uint(so, "documents", UINT64_MAX >> 1, &sp->n_documents) != 0) {
            util_set_err(err, errlen, "%s: split \"%s\" lacks \"documents\", \"tokens\" or \"shards\"", path, name);
            goto out;
        }
        size_t nk = json_array_size(arr);
        sp->shards = calloc(nk ? nk : 1, sizeof *sp->shards);
        if (!sp->shards) {
            util_set_err(err, errlen, "%s: out of memory", path);
            goto out;
        }
        uint64_t sum = 0;
        for (size_t k = 0; k < nk; k++) {
            json_t *sh = json_array_get(arr, k), *f = json_object_get(sh, "file");
            uint64_t nt, crc;
            if (!json_is_string(f) || get_uint(sh, "tokens", UINT64_MAX >> 1, &nt) != 0 ||
                get_uint(sh, "crc32c", UINT32_MAX, &crc) != 0) {
                util_set_err(err, errlen, "%s: split \"%s\" shard %zu lacks \"file\", \"tokens\" or \"crc32c\"", path,
                             name, k);
                goto out;
            }
            const char *fs = json_string_value(f);
            if (fs[0] == '/' || strstr(fs, "..")) {
                util_set_err(err, errlen, "%s: shard file \"%s\" must be a path inside the corpus folder", path, fs);
                goto out;
            }
            shard_index_shard *s = &sp->shards[sp->n_shards++];
            s->file = strdup(fs);
            s->n_tokens = nt;
            s->crc32c = (uint32_t)crc;
            if (!s->file) {
                util_set_err(err, errlen, "%s: out of memory", path);
                goto out;
            }
            sum += nt;
        }
        if (sum != sp->n_tokens) {
            util_set_err(err, errlen, "%s: split \"%s\" says %llu tokens but its shards hold %llu", path, name,
                         (unsigned long long)sp->n_tokens, (unsigned long long)sum);
            goto out;
        }
        if (read_doc_lengths(json_object_get(so, "document_lengths"), sp, path, err, errlen) != 0) goto out;
    }
    rc = 0;
out:
    if (root) json_decref(root);
    free(path);
    if (rc != 0) shard_index_free(ix);
    return rc;
}

void shard_index_free(shard_index *ix) {
    for (int i = 0; i < ix->n_splits; i++) {
        for (int k = 0; k < ix->splits[i].n_shards; k++) free(ix->splits[i].shards[k].file);
        free(ix->splits[i].shards);
        free(ix->splits[i].name);
        free(ix->splits[i].doc_lengths);
    }
    free(ix->splits);
    free(ix->tokenizer);
    free(ix->tokenizer_fingerprint);
    free(ix->input);
    free(ix->val_rule);
    memset(ix, 0, sizeof *ix);
}

const shard_index_split *shard_index_find(const shard_index *ix, const char *split) {
    for (int i = 0; i < ix->n_splits; i++)
        if (strcmp(ix->splits[i].name, split) == 0) return &ix->splits[i];
    return NULL;
}
