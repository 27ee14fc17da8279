/* prepare.c — `tetra data prepare`: tokenize a corpus into token shards (see prepare.h). */
#include "data/prepare.h"

#include "data/parquet.h"
#include "data/prepare_dist.h"
#include "data/prepare_spool.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "util/err.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#define DEFAULT_PIECE_BYTES ((size_t)256 << 10) /* tokenize long documents in pieces of about this size */
#define BATCH_BYTES ((size_t)16 << 20)          /* text handed to the threads at once */
#define BATCH_ITEMS 16384
#define DEFAULT_SHARD_TOKENS 100000000ull
#define DEFAULT_VAL_FRACTION 0.01

/* ---- text helpers (exported for tests) ------------------------------------------ */

size_t data_prepare_utf8_check(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        if (i + 8 <= len) { /* fast path: 8 ASCII bytes */
            uint64_t v;
            memcpy(&v, s + i, 8);
            if (!(v & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) n = 1;
        else if (c == 0xE0) n = 2, lo = 0xA0;
        else if (c >= 0xE1 && c <= 0xEC) n = 2;
        else if (c == 0xED) n = 2, hi = 0x9F;
        else if (c >= 0xEE && c <= 0xEF) n = 2;
        else if (c == 0xF0) n = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) n = 3;
        else if (c == 0xF4) n = 3, hi = 0x8F;
        else return i;
        if (i + n >= len) return i; /* truncated sequence */
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= n; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
        i += n + 1;
    }
    return len;
}

static int is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
static int is_alpha(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static int is_piece_boundary(const char *t, size_t len, size_t p) {
    return p > 0 && p + 1 < len && t[p] == ' ' && !is_space((unsigned char)t[p - 1]) &&
        is_alpha((unsigned char)t[p + 1]);
}

size_t data_prepare_piece_end(const char *text, size_t len, size_t start, size_t target) {
    if (start >= len || len - start <= target) return len;
    for (size_t p = start + (target ? target : 1); p < len; p++)
        if (is_piece_boundary(text, len, p)) return p;
    return len;
}

static int is_paragraph_start(const char *t, size_t len, size_t p) {
    if (p < 2 || p >= len || is_space((unsigned char)t[p]) || t[p - 1] != '\n') return 0;
    size_t q = p - 2;
    if (t[q] == '\r') {
        if (q == 0) return 0;
        q--;
    }
    return t[q] == '\n';
}

static int is_line_start(const char *t, size_t len, size_t p) {
    return p > 0 && p < len && t[p - 1] == '\n' && !is_space((unsigned char)t[p]);
}

static size_t nearest(const char *t, size_t len, size_t target, int (*ok)(const char *, size_t, size_t)) {
    for (size_t d = 0; d < len; d++) {
        if (target >= d && ok(t, len, target - d)) return target - d;
        if (target + d < len && ok(t, len, target + d)) return target + d;
        if (target < d && target + d >= len) break;
    }
    return 0;
}

size_t data_prepare_split_point(const char *text, size_t len, double val_fraction) {
    if (len < 2 || !(val_fraction > 0.0) || !(val_fraction < 1.0)) return 0;
    double tt = (1.0 - val_fraction) * (double)len;
    size_t target = tt < 1.0 ? 1 : (size_t)tt;
    if (target >= len) target = len - 1;
    size_t p = nearest(text, len, target, is_paragraph_start);
    if (!p) p = nearest(text, len, target, is_line_start);
    if (!p) p = nearest(text, len, target, is_piece_boundary);
    if (!p) { /* a UTF-8 character boundary */
        p = target;
        while (p > 0 && ((unsigned char)text[p] & 0xC0) == 0x80) p--;
        if (p == 0) {
            p = target;
            while (p < len && ((unsigned char)text[p] & 0xC0) == 0x80) p++;
        }
        if (p >= len) p = 0;
    }
    return p;
}

/* ---- messages ---------------------------------------------------------------------- */

static char *xstrdup_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* ---- interruption -------------------------------------------------------------------- */

static volatile sig_atomic_t g_interrupted;
static void on_signal(int sig) {
    (void)sig;
    g_interrupted = 1;
}

/* ---- input files ----------------------------------------------------------------------- */

enum { IN_TXT, IN_JSONL, IN_PARQUET };
/* compression of an input file, from its last suffix: C4's `en` files are .json.gz,
 * many exports are .jsonl.zst */
enum { COMP_NONE, COMP_GZ, COMP_ZST };

typedef struct {
    char *path;
    int kind;
    int comp;
    uint64_t size;
    uint64_t n_docs; /* pass 1 */
} in_file;

typedef struct {
    in_file *v;
    size_t n, cap;
    size_t ignored;
} in_list;

static int ends_with(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n >= k && strncasecmp(s + n - k, suffix, k) == 0;
}

/* .txt, .jsonl or .json (JSON lines, as C4's), each optionally .gz or .zst, or .parquet
 * (compressed inside, page by page); -1 otherwise */
static int kind_of(const char *path, int *comp) {
    size_t n = strlen(path);
    int c = COMP_NONE;
    if (comp) *comp = COMP_NONE;
    if (ends_with(path, n, ".parquet")) return IN_PARQUET;
    if (ends_with(path, n, ".gz")) {
        c = COMP_GZ;
        n -= 3;
    } else if (ends_with(path, n, ".zst")) {
        c = COMP_ZST;
        n -= 4;
    }
    if (comp) *comp = c;
    if (ends_with(path, n, ".txt")) return IN_TXT;
    if (ends_with(path, n, ".jsonl") || ends_with(path, n, ".json")) return IN_JSONL;
    return -1;
}

static int list_add(in_list *l, const char *path, int kind, int comp, uint64_t size) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        in_file *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    in_file *f = &l->v[l->n];
    memset(f, 0, sizeof *f);
    if (!(f->path = strdup(path))) return -1;
    f->kind = kind;
    f->comp = comp;
    f->size = size;
    l->n++;
    return 0;
}

static void list_free(in_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i].path);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int walk(in_list *l, const char *dir, int depth, char *err, size_t errlen) {
    if (depth > 64) {
        util_set_err(err, errlen, "%s: folders nested too deeply (a symlink loop?)", dir);
        return -1;
    }
    DIR *d = opendir(dir);
    if (!d) {
        util_set_err(err, errlen, "%s: cannot read folder: %s", dir, strerror(errno));
        return -1;
    }
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *p = xstrdup_printf("%s/%s", dir, e->d_name);
        struct stat st;
        if (!p) {
            util_set_err(err, errlen, "out of memory");
            rc = -1;
            break;
        }
        if (stat(p, &st) != 0) {
            util_set_err(err, errlen, "%s: %s", p, strerror(errno));
            rc = -1;
        } else if (S_ISDIR(st.st_mode)) {
            rc = walk(l, p, depth + 1, err, errlen);
        } else if (S_ISREG(st.st_mode) && kind_of(p, NULL) >= 0) {
            int comp;
            int kind = kind_of(p, &comp);
            if (list_add(l, p, kind, comp, (uint64_t)st.st_size) != 0) {
                util_set_err(err, errlen, "out of memory");
                rc = -1;
            }
        } else {
            l->ignored++;
        }
        free(p);
        if (rc) break;
    }
    closedir(d);
    return rc;
}

static int cmp_files(const void *a, const void *b) {
    return strcmp(((const in_file *)a)->path, ((const in_file *)b)->path);
}

static int collect_inputs(in_list *l, const char *input, char *err, size_t errlen) {
    struct stat st;
    if (stat(input, &st) != 0) {
        util_set_err(err, errlen, "%s: cannot read input: %s", input, strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        if (walk(l, input, 0, err, errlen) != 0) return -1;
        if (l->n == 0) {
            util_set_err(err, errlen,
                         "%s: empty input: no .txt, .jsonl or .json files (optionally .gz or .zst) nor "
                         ".parquet files in the folder",
                         input);
            return -1;
        }
        qsort(l->v, l->n, sizeof *l->v, cmp_files);
        return 0;
    }
    int comp;
    int kind = kind_of(input, &comp);
    if (!S_ISREG(st.st_mode) || kind < 0) {
        util_set_err(
            err, errlen,
            "%s: unsupported input: expected a .txt, .jsonl or .json file (optionally .gz or .zst), a .parquet "
            "file or a folder",
            input);
        return -1;
    }
    if (list_add(l, input, kind, comp, (uint64_t)st.st_size) != 0) {
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

/* A read-only map of a whole file (NULL data for an empty file). */
typedef struct {
    const char *data;
    size_t len;
    int owned;      /* decompressed into the heap (free), else mapped (munmap) */
    pq_column *col; /* instead: a Parquet row group's text column, whose values items point into */
} fmap;

/* Append n bytes to a growing heap buffer. */
static int grow(char **buf, size_t *len, size_t *cap, const void *src, size_t n) {
    if (*len + n > *cap) {
        size_t c = *cap ? *cap : (size_t)1 << 20;
        while (c < *len + n) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return -1;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, src, n);
    *len += n;
    return 0;
}

/* The whole decompressed content of a .gz (every member) or .zst (every frame) file. */
static int inflate_file(const char *path, int comp, fmap *m, char *err, size_t errlen) {
    char *buf = NULL, chunk[1 << 16];
    size_t len = 0, cap = 0;
    int rc = 0;
    if (comp == COMP_GZ) {
        gzFile g = gzopen(path, "rb");
        if (!g) {
            util_set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
            return -1;
        }
        for (;;) {
            int k = gzread(g, chunk, sizeof chunk);
            if (k < 0) {
                int zerr = 0;
                const char *msg = gzerror(g, &zerr);
                util_set_err(err, errlen, "%s: corrupt gzip data after %zu bytes: %s", path, len, msg ? msg : "?");
                rc = -1;
                break;
            }
            if (gzdirect(g)) { /* zlib passes other data through: a .gz file must be gzip */
                util_set_err(err, errlen, "%s: not gzip data (the .gz suffix says it is)", path);
                rc = -1;
                break;
            }
            if (k == 0) {
                int zerr = 0;
                gzerror(g, &zerr);
                if (zerr == Z_BUF_ERROR) { /* the stream ended inside a member */
                    util_set_err(err, errlen, "%s: truncated gzip data (%zu bytes decompressed)", path, len);
                    rc = -1;
                }
                break;
            }
            if (grow(&buf, &len, &cap, chunk, (size_t)k)) {
                util_set_err(err, errlen, "%s: out of memory decompressing (%zu bytes so far)", path, len);
                rc = -1;
                break;
            }
        }
        gzclose(g);
    } else {
        fmap raw = {0};
        int fd = open(path, O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) {
            util_set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
            if (fd >= 0) close(fd);
            return -1;
        }
        if (st.st_size > 0) {
            void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
            if (p == MAP_FAILED) {
                util_set_err(err, errlen, "%s: cannot map: %s", path, strerror(errno));
                close(fd);
                return -1;
            }
            raw.data = p;
            raw.len = (size_t)st.st_size;
        }
        close(fd);
        ZSTD_DStream *z = ZSTD_createDStream();
        ZSTD_inBuffer in = {raw.data, raw.len, 0};
        size_t last = 0;
        while (z && in.pos < in.size) {
            ZSTD_outBuffer out = {chunk, sizeof chunk, 0};
            last = ZSTD_decompressStream(z, &out, &in);
            if (ZSTD_isError(last)) {
                util_set_err(err, errlen, "%s: corrupt zstd data after %zu bytes: %s", path, len,
                             ZSTD_getErrorName(last));
                rc = -1;
                break;
            }
            if (out.pos && grow(&buf, &len, &cap, chunk, out.pos)) {
                util_set_err(err, errlen, "%s: out of memory decompressing (%zu bytes so far)", path, len);
                rc = -1;
                break;
            }
        }
        if (!z) {
            util_set_err(err, errlen, "%s: cannot start zstd", path);
            rc = -1;
        } else if (rc == 0 && last != 0) {
            util_set_err(err, errlen, "%s: truncated zstd data (%zu bytes decompressed)", path, len);
            rc = -1;
        }
        ZSTD_freeDStream(z);
        if (raw.data) munmap((void *)raw.data, raw.len);
    }
    if (rc) {
        free(buf);
        return -1;
    }
    m->data = buf;
    m->len = len;
    m->owned = 1;
    return 0;
}

static int map_file(const char *path, int comp, fmap *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    if (comp != COMP_NONE) return inflate_file(path, comp, m, err, errlen);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        util_set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        util_set_err(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            util_set_err(err, errlen, "%s: cannot map: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        m->data = p;
        m->len = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

static void unmap_file(fmap *m) {
    if (m->col) {
        pq_column_free(m->col);
        free(m->col);
        m->col = NULL;
    } else if (m->owned) free((void *)m->data);
    else if (m->data) munmap((void *)m->data, m->len);
    m->data = NULL;
    m->len = 0;
}

static int blank_line(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_space((unsigned char)s[i])) return 0;
    return 1;
}

/* Pass 1: documents per file. */
static int count_docs(in_file *f, const char *field, char *err, size_t errlen) {
    if (f->kind == IN_TXT && f->comp == COMP_NONE) {
        f->n_docs = f->size > 0 ? 1 : 0;
        return 0;
    }
    if (f->kind == IN_PARQUET) { /* one document per row; the footer says how many */
        pq_file *pf = pq_open(f->path, field, NULL, err, errlen);
        if (!pf) return -1;
        f->n_docs = (uint64_t)pq_num_rows(pf);
        pq_close(pf);
        return 0;
    }
    fmap m;
    if (map_file(f->path, f->comp, &m, err, errlen) != 0) return -1;
    if (f->kind == IN_TXT) { /* compressed: one document unless it inflates to nothing */
        f->n_docs = m.len > 0;
        unmap_file(&m);
        return 0;
    }
    uint64_t n = 0;
    size_t pos = 0;
    while (pos < m.len) {
        const char *nl = memchr(m.data + pos, '\n', m.len - pos);
        size_t end = nl ? (size_t)(nl - m.data) : m.len;
        if (!blank_line(m.data + pos, end - pos)) n++;
        pos = end + 1;
    }
    unmap_file(&m);
    f->n_docs = n;
    return 0;
}

/* ---- work items and threads ------------------------------------------------------------------- */

enum { ITEM_TEXT, ITEM_JSON };

typedef struct {
    int kind;
    const char *data; /* text piece, or one JSON line */
    size_t len;
    size_t file;     /* index into the input list */
    uint64_t offset; /* byte offset of data in its file */
    uint64_t line;   /* ITEM_JSON: 1-based line number; ITEM_TEXT of a Parquet value: its row, from 1 */
    int rg;          /* ITEM_TEXT of a Parquet value: its row group, else -1 */
    int bos, eos;    /* first / last piece of its document */
    int split;       /* 0 train, 1 val */
    /* results */
    uint32_t *ids;
    size_t n_ids;
    size_t n_bytes; /* text bytes tokenized */
    int empty;      /* a JSON document with empty text */
    int failed;
    char *error; /* why it failed (NULL when out of memory) */
} item;

typedef struct {
    const tok_tokenizer *tok;
    const in_list *files;
    const char *field;
    item *items;
    size_t n;
    atomic_size_t next;
} batch_ctx;

static void work_item(const batch_ctx *c, item *it) {
    char err[512];
    const char *path = c->files->v[it->file].path;
    const char *text = it->data;
    size_t len = it->len;
    json_t *root = NULL;
    it->failed = 1; /* until it is done */
    if (it->kind == ITEM_JSON) {
        json_error_t jerr;
        root = json_loadb(it->data, it->len, JSON_ALLOW_NUL, &jerr);
        if (!root) {
            it->error = xstrdup_printf(
                "%s:%llu: invalid JSON at byte offset %llu: %s", path, (unsigned long long)it->line,
                (unsigned long long)(it->offset + (uint64_t)(jerr.position > 0 ? jerr.position : 0)), jerr.text);
            return;
        }
        json_t *v = json_is_object(root) ? json_object_get(root, c->field) : NULL;
        if (!json_is_string(v)) {
            it->error = xstrdup_printf("%s:%llu: expected a JSON object with a \"%s\" string field", path,
                                       (unsigned long long)it->line, c->field);
            json_decref(root);
            return;
        }
        text = json_string_value(v);
        len = json_string_length(v);
        if (len == 0) {
            it->empty = 1;
            it->failed = 0;
            json_decref(root);
            return;
        }
    } else {
        size_t bad = data_prepare_utf8_check((const unsigned char *)text, len);
        if (bad < len && it->rg >= 0)
            it->error = xstrdup_printf("%s: row group %d, row %llu: invalid UTF-8 at byte offset %llu of its text "
                                       "(byte 0x%02x)",
                                       path, it->rg, (unsigned long long)it->line,
                                       (unsigned long long)(it->offset + bad), (unsigned char)text[bad]);
        else if (bad < len)
            it->error = xstrdup_printf("%s: invalid UTF-8 at byte offset %llu (byte 0x%02x)", path,
                                       (unsigned long long)(it->offset + bad), (unsigned char)text[bad]);
        if (bad < len) return;
    }
    it->n_bytes = len;
    if (tok_encode(c->tok, text, len, 0, 0, 0, &it->ids, &it->n_ids, err, sizeof err) != 0) {
        if (it->kind == ITEM_JSON) it->error = xstrdup_printf("%s:%llu: %s", path, (unsigned long long)it->line, err);
        else if (it->rg >= 0)
            it->error =
                xstrdup_printf("%s: row group %d, row %llu: %s", path, it->rg, (unsigned long long)it->line, err);
        else it->error = xstrdup_printf("%s: at byte offset %llu: %s", path, (unsigned long long)it->offset, err);
        it->ids = NULL;
        it->n_ids = 0;
    } else {
        it->failed = 0;
    }
    if (root) json_decref(root);
}

static void *worker(void *arg) {
    batch_ctx *c = arg;
    for (;;) {
        if (g_interrupted) break;
        size_t i = atomic_fetch_add(&c->next, 1);
        if (i >= c->n) break;
        work_item(c, &c->items[i]);
    }
    return NULL;
}

/* ---- output ---------------------------------------------------------------------------------- */

typedef struct {
    char *tmpdir; /* the folder being written */
    uint32_t vocab;
    int64_t bos, eos;
    uint64_t shard_tokens;
    shard_writer *w; /* open shard or NULL */
    ps_spool *spool; /* several ranks: tokens go to this rank's spool instead */
    int cur_split;
    shard_index_split splits[2];
    int cap[2];
    int have_dir[2];
} out_state;

static const char *split_name(int s) { return s ? "val" : "train"; }

static int out_close_shard(out_state *o, char *err, size_t errlen) {
    if (!o->w) return 0;
    shard_header h;
    int rc = shard_writer_close(o->w, &h, err, errlen);
    o->w = NULL;
    if (rc != 0) return -1;
    shard_index_split *sp = &o->splits[o->cur_split];
    shard_index_shard *s = &sp->shards[sp->n_shards - 1];
    s->n_tokens = h.n_tokens;
    s->crc32c = h.crc32c;
    sp->n_tokens += h.n_tokens;
    return 0;
}

static int out_open_shard(out_state *o, int split, char *err, size_t errlen) {
    shard_index_split *sp = &o->splits[split];
    if (!o->have_dir[split]) {
        char *d = xstrdup_printf("%s/%s", o->tmpdir, split_name(split));
        if (!d || mkdir(d, 0755) != 0) {
            util_set_err(err, errlen, "%s: cannot create folder: %s", d ? d : o->tmpdir, strerror(errno));
            free(d);
            return -1;
        }
        free(d);
        o->have_dir[split] = 1;
    }
    if (sp->n_shards == o->cap[split]) {
        int cap = o->cap[split] ? 2 * o->cap[split] : 8;
        shard_index_shard *v = realloc(sp->shards, (size_t)cap * sizeof *v);
        if (!v) {
            util_set_err(err, errlen, "out of memory");
            return -1;
        }
        sp->shards = v;
        o->cap[split] = cap;
    }
    char *rel = xstrdup_printf("%s/shard_%05d.bin", split_name(split), sp->n_shards);
    char *path = rel ? xstrdup_printf("%s/%s", o->tmpdir, rel) : NULL;
    if (!path) {
        free(rel);
        util_set_err(err, errlen, "out of memory");
        return -1;
    }
    o->w = shard_writer_open(path, o->vocab, o->bos, o->eos, err, errlen);
    free(path);
    if (!o->w) {
        free(rel);
        return -1;
    }
    shard_index_shard *s = &sp->shards[sp->n_shards++];
    memset(s, 0, sizeof *s);
    s->file = rel;
    o->cur_split = split;
    return 0;
}

static int out_append(out_state *o, int split, const uint32_t *ids, size_t n, char *err, size_t errlen) {
    if (o->spool) return ps_spool_append(o->spool, split, ids, n, err, errlen);
    if (o->w && o->cur_split != split && out_close_shard(o, err, errlen) != 0) return -1;
    while (n) {
        if (!o->w && out_open_shard(o, split, err, errlen) != 0) return -1;
        uint64_t room = o->shard_tokens - shard_writer_tokens(o->w);
        size_t k = room < n ? (size_t)room : n;
        if (shard_writer_append(o->w, ids, k, err, errlen) != 0) return -1;
        ids += k;
        n -= k;
        if (shard_writer_tokens(o->w) >= o->shard_tokens && out_close_shard(o, err, errlen) != 0) return -1;
    }
    return 0;
}

static void out_free(out_state *o) {
    if (o->w) shard_writer_abort(o->w);
    o->w = NULL;
    for (int s = 0; s < 2; s++) {
        for (int k = 0; k < o->splits[s].n_shards; k++) free(o->splits[s].shards[k].file);
        free(o->splits[s].shards);
        o->splits[s].shards = NULL;
        o->splits[s].n_shards = 0;
    }
}

/* Remove a folder tree this run created. */
static void rm_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *p = xstrdup_printf("%s/%s", path, e->d_name);
            if (!p) continue;
            struct stat st;
            if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) rm_tree(p);
            else unlink(p);
            free(p);
        }
        closedir(d);
    }
    rmdir(path);
}

static int mkdir_parents(const char *path, char *err, size_t errlen) {
    char buf[PATH_MAX];
    if (strlen(path) >= sizeof buf) {
        util_set_err(err, errlen, "%s: path too long", path);
        return -1;
    }
    strcpy(buf, path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
            util_set_err(err, errlen, "%s: cannot create folder: %s", buf, strerror(errno));
            return -1;
        }
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
        util_set_err(err, errlen, "%s: cannot create folder: %s", buf, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---- the command ------------------------------------------------------------------------------ */

static void usage(FILE *f) {
    fprintf(f,
            "usage: tetra data prepare --tokenizer DIR --input PATH --output DIR [options]\n"
            "\n"
            "Tokenize a corpus once into binary token shards that training reads by memory map.\n"
            "\n"
            "  --tokenizer DIR     folder with tokenizer.json (Hugging Face) or tokenizer.model (tiktoken)\n"
            "  --input PATH        a .txt file (one document), a .jsonl or .json file (one document per line,\n"
            "                      in the \"text\" field of a JSON object; C4's en/*.json.gz), each\n"
            "                      optionally gzip (.gz) or zstd (.zst) compressed, a .parquet file (one\n"
            "                      document per row of its text column; FineWeb, DCLM), or a folder (every\n"
            "                      such file in it, recursively, in byte order of their paths)\n"
            "  --output DIR        the folder to create (refused when it exists): DIR/index.json,\n"
            "                      DIR/train/shard_*.bin, DIR/val/shard_*.bin\n"
            "  --val-fraction F    hold out the last F of the documents as the \"val\" split (default %g;\n"
            "                      0 = none); a single document is cut at the paragraph nearest to 1-F\n"
            "  --threads N         tokenizer threads (default 2); the output does not depend on N\n"
            "  --shard-tokens N    tokens per shard file (default %llu)\n"
            "  --text-field NAME   the JSON field (.jsonl) or the column (.parquet) holding the text\n"
            "                      (default \"text\")\n"
            "  --vocab-size N      fail unless the tokenizer's vocab size is N (the model's vocab_size)\n"
            "  --piece-bytes N     tokenize long documents in pieces of about N bytes, cut at pre-token\n"
            "                      boundaries so the ids equal whole-document encoding (default %zu)\n"
            "  --quiet             print nothing but errors\n"
            "  -h, --help          this help\n"
            "\n"
            "Each document is stored as BOS tokens EOS. Documents must be UTF-8; an error names the file\n"
            "and byte offset (or the .jsonl line). On any error nothing is left at --output.\n"
            "Under mpirun or srun the ranks divide the input files; the output is the same for any number\n"
            "of ranks (--output on a file system they all see).\n",
            DEFAULT_VAL_FRACTION, (unsigned long long)DEFAULT_SHARD_TOKENS, DEFAULT_PIECE_BYTES);
}

typedef struct {
    const char *tokenizer, *input, *output, *field;
    double val_fraction;
    int threads;
    uint64_t shard_tokens;
    long long vocab_check;
    uint64_t piece_bytes;
    int quiet;
    char *output_owned; /* --output without trailing slashes */
} prep_opts;

static int parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, prep_opts *o) {
    memset(o, 0, sizeof *o);
    o->val_fraction = DEFAULT_VAL_FRACTION;
    o->threads = 2;
    o->shard_tokens = DEFAULT_SHARD_TOKENS;
    o->field = "text";
    o->vocab_check = -1;
    o->piece_bytes = DEFAULT_PIECE_BYTES;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--quiet")) {
            o->quiet = 1;
            continue;
        }
        static const char *const names[] = {"--tokenizer",    "--input",      "--output",
                                            "--val-fraction", "--threads",    "--shard-tokens",
                                            "--text-field",   "--vocab-size", "--piece-bytes"};
        int which = -1;
        const char *val = NULL;
        for (int k = 0; k < (int)(sizeof names / sizeof *names); k++) {
            size_t n = strlen(names[k]);
            if (!strncmp(a, names[k], n) && (a[n] == 0 || a[n] == '=')) {
                which = k;
                val = a[n] == '=' ? a + n + 1 : (i + 1 < argc ? argv[++i] : NULL);
                break;
            }
        }
        if (which < 0) {
            fprintf(stderr, "tetra data prepare: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (!val) {
            fprintf(stderr, "tetra data prepare: %s needs a value\n", names[which]);
            return 2;
        }
        uint64_t u;
        char *end;
        switch (which) {
        case 0: o->tokenizer = val; break;
        case 1: o->input = val; break;
        case 2: o->output = val; break;
        case 3:
            errno = 0;
            o->val_fraction = strtod(val, &end);
            if (errno || *end || !*val || !(o->val_fraction >= 0.0) || !(o->val_fraction < 1.0)) {
                fprintf(stderr, "tetra data prepare: --val-fraction must be a number in [0, 1), not '%s'\n", val);
                return 2;
            }
            break;
        case 4:
            if (parse_u64(val, &u) != 0 || u < 1 || u > 256) {
                fprintf(stderr, "tetra data prepare: --threads must be 1..256, not '%s'\n", val);
                return 2;
            }
            o->threads = (int)u;
            break;
        case 5:
            if (parse_u64(val, &u) != 0 || u < 1) {
                fprintf(stderr, "tetra data prepare: --shard-tokens must be a positive integer, not '%s'\n", val);
                return 2;
            }
            o->shard_tokens = u;
            break;
        case 6: o->field = val; break;
        case 7:
            if (parse_u64(val, &u) != 0 || u < 1 || u > UINT32_MAX) {
                fprintf(stderr, "tetra data prepare: --vocab-size must be a positive integer, not '%s'\n", val);
                return 2;
            }
            o->vocab_check = (long long)u;
            break;
        case 8:
            if (parse_u64(val, &u) != 0 || u < 1) {
                fprintf(stderr, "tetra data prepare: --piece-bytes must be a positive integer, not '%s'\n", val);
                return 2;
            }
            o->piece_bytes = u;
            break;
        }
    }
    if (!o->tokenizer || !o->input || !o->output) {
        fprintf(stderr, "tetra data prepare: --tokenizer, --input and --output are required (see --help)\n");
        return 2;
    }
    size_t n = strlen(o->output);
    while (n > 1 && o->output[n - 1] == '/') n--;
    if (!n || !(o->output_owned = malloc(n + 1))) {
        fprintf(stderr, "tetra data prepare: bad --output\n");
        return 2;
    }
    memcpy(o->output_owned, o->output, n);
    o->output_owned[n] = 0;
    o->output = o->output_owned;
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void human_bytes(double b, char *buf, size_t n) {
    if (b >= 1e9) snprintf(buf, n, "%.2f GB", b / 1e9);
    else if (b >= 1e6) snprintf(buf, n, "%.1f MB", b / 1e6);
    else if (b >= 1e3) snprintf(buf, n, "%.1f kB", b / 1e3);
    else snprintf(buf, n, "%.0f B", b);
}

typedef struct {
    prep_opts o;
    tok_tokenizer *tok;
    in_list files;
    out_state out;
    item *items;
    size_t n_items, batch_bytes;
    fmap *pending; /* maps to release after the current batch */
    size_t n_pending, cap_pending;
    char *owned_text; /* single-document jsonl: the decoded text */
    uint64_t total_bytes, done_bytes, tokens, docs[2], empty_docs;
    doclen_hist doclen[2]; /* each split's document lengths (stored tokens, BOS and EOS included) */
    uint64_t cur_len[2];   /* tokens so far of each split's document being written */
    double t0, last_progress;
    int progress;
    pd_world w;    /* this rank among those of an mpirun; 1 rank otherwise */
    size_t f0, f1; /* the input files this rank tokenizes */
    ps_spool spool;
    char rule[256]; /* how the val split was chosen */
    int follower;   /* failed because another rank did: says nothing */
    char err[1024];
} prep;

static void release_pending(prep *p) {
    for (size_t i = 0; i < p->n_pending; i++) unmap_file(&p->pending[i]);
    p->n_pending = 0;
}

static int add_pending(prep *p, fmap m) {
    if (p->n_pending == p->cap_pending) {
        size_t cap = p->cap_pending ? 2 * p->cap_pending : 16;
        fmap *v = realloc(p->pending, cap * sizeof *v);
        if (!v) return -1;
        p->pending = v;
        p->cap_pending = cap;
    }
    p->pending[p->n_pending++] = m;
    return 0;
}

static void show_progress(prep *p, int final) {
    if (!p->progress) return;
    double t = now_s();
    if (!final && t - p->last_progress < 0.2) return;
    p->last_progress = t;
    char a[32], b[32], r[32];
    human_bytes((double)p->done_bytes, a, sizeof a);
    human_bytes((double)p->total_bytes, b, sizeof b);
    double dt = t - p->t0;
    human_bytes(dt > 0 ? (double)p->done_bytes / dt : 0, r, sizeof r);
    fprintf(stderr, "\rtokenizing: %s / %s (%3.0f%%), %llu tokens, %s/s   ", a, b,
            p->total_bytes ? 100.0 * (double)p->done_bytes / (double)p->total_bytes : 100.0,
            (unsigned long long)p->tokens, r);
    if (final) fputc('\n', stderr);
    fflush(stderr);
}

/* Tokenize the items of the current batch on the threads, then write them in order. */
/* A document's length is its pieces' tokens: a piece that starts a document closes one
 * left open (a document cut into the two splits ends without its EOS), one with the EOS
 * closes its own. */
static void count_length(prep *p, int split, int bos, int eos, size_t n) {
    if (bos && p->cur_len[split]) doclen_add(&p->doclen[split], p->cur_len[split]), p->cur_len[split] = 0;
    p->cur_len[split] += n;
    if (eos) doclen_add(&p->doclen[split], p->cur_len[split]), p->cur_len[split] = 0;
}

static int flush_batch(prep *p) {
    if (p->n_items == 0) {
        release_pending(p);
        return 0;
    }
    batch_ctx c;
    c.tok = p->tok;
    c.files = &p->files;
    c.field = p->o.field;
    c.items = p->items;
    c.n = p->n_items;
    atomic_init(&c.next, 0);
    int nt = p->o.threads;
    if ((size_t)nt > p->n_items) nt = (int)p->n_items;
    pthread_t th[256];
    int started = 0;
    for (int t = 1; t < nt; t++) {
        if (pthread_create(&th[started], NULL, worker, &c) != 0) break;
        started++;
    }
    worker(&c);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);

    int rc = 0;
    if (g_interrupted) {
        util_set_err(p->err, sizeof p->err, "interrupted");
        rc = -1;
    }
    uint32_t bos = (uint32_t)p->out.bos, eos = (uint32_t)p->out.eos;
    for (size_t i = 0; i < p->n_items && rc == 0; i++) {
        item *it = &p->items[i];
        if (it->error || it->failed) {
            util_set_err(p->err, sizeof p->err, "%s", it->error ? it->error : "out of memory");
            rc = -1;
            break;
        }
        if (it->empty) {
            p->empty_docs++;
            continue;
        }
        if (it->bos && p->out.bos >= 0 && out_append(&p->out, it->split, &bos, 1, p->err, sizeof p->err) != 0) rc = -1;
        if (!rc && out_append(&p->out, it->split, it->ids, it->n_ids, p->err, sizeof p->err) != 0) rc = -1;
        if (!rc && it->eos && p->out.eos >= 0 && out_append(&p->out, it->split, &eos, 1, p->err, sizeof p->err) != 0)
            rc = -1;
        if (rc) break;
        if (it->bos) p->docs[it->split]++;
        const size_t n = it->n_ids + (size_t)(it->bos && p->out.bos >= 0) + (size_t)(it->eos && p->out.eos >= 0);
        p->tokens += n;
        count_length(p, it->split, it->bos, it->eos, n);
    }
    for (size_t i = 0; i < p->n_items; i++) {
        p->done_bytes += p->items[i].kind == ITEM_TEXT ? p->items[i].len : p->items[i].len + 1;
        free(p->items[i].ids);
        free(p->items[i].error);
    }
    p->n_items = 0;
    p->batch_bytes = 0;
    release_pending(p);
    if (rc == 0) show_progress(p, 0);
    return rc;
}

static int push_item(prep *p, const item *it) {
    if (p->n_items == BATCH_ITEMS || p->batch_bytes >= BATCH_BYTES) {
        if (flush_batch(p) != 0) return -1;
    }
    p->items[p->n_items] = *it;
    p->n_items++;
    p->batch_bytes += it->len;
    return 0;
}

/* Queue text [a, b) of file f as one document (split into pieces); rg >= 0: a Parquet
 * value, the text of row `row` of row group rg. */
static int push_text_at(prep *p, size_t f, const char *base, size_t a, size_t b, int split, int rg, uint64_t row) {
    size_t pos = a;
    while (pos < b) {
        size_t end = a + data_prepare_piece_end(base + a, b - a, pos - a, (size_t)p->o.piece_bytes);
        item it;
        memset(&it, 0, sizeof it);
        it.kind = ITEM_TEXT;
        it.data = base + pos;
        it.len = end - pos;
        it.file = f;
        it.offset = pos;
        it.bos = pos == a;
        it.eos = end == b;
        it.split = split;
        it.rg = rg;
        it.line = row;
        if (push_item(p, &it) != 0) return -1;
        pos = end;
    }
    return 0;
}

static int push_text(prep *p, size_t f, const char *base, size_t a, size_t b, int split) {
    return push_text_at(p, f, base, a, b, split, -1, 0);
}

/* The one document of a corpus, cut for the val split: text is a copy owned by p. */
static int push_single(prep *p, size_t fi, const char *text, size_t len, const char *where, char *rule, size_t rn) {
    size_t cut = data_prepare_split_point(text, len, p->o.val_fraction);
    if (!cut) {
        util_set_err(
            p->err, sizeof p->err,
            "%s: a single document of %zu bytes is too short to hold out a validation part; use --val-fraction 0",
            where, len);
        return -1;
    }
    snprintf(rule, rn, "single document cut at byte %zu of %zu of its text", cut, len);
    if (push_text(p, fi, text, 0, cut, 0) != 0) return -1;
    return push_text(p, fi, text, cut, len, 1);
}

/* Queue every row of a Parquet file's text column, one row group at a time: a group's
 * decoded column stays until the batch holding its last value is written, and that batch
 * is written before the next group is read, so one column chunk is held at a time. A null
 * or empty value is a document without text (counted, skipped, as {"text": ""} in a
 * .jsonl). */
static int push_parquet(prep *p, size_t fi, int single, uint64_t *doc, uint64_t first_val, char *rule, size_t rn) {
    const in_file *f = &p->files.v[fi];
    pq_file *pf = pq_open(f->path, p->o.field, NULL, p->err, sizeof p->err);
    if (!pf) return -1;
    int rc = 0;
    uint64_t row = 0;
    for (int g = 0; g < pq_num_row_groups(pf) && rc == 0; g++) {
        if (g_interrupted) {
            util_set_err(p->err, sizeof p->err, "interrupted");
            rc = -1;
            break;
        }
        if (flush_batch(p) != 0) { /* the previous group's values, and its memory */
            rc = -1;
            break;
        }
        fmap m;
        memset(&m, 0, sizeof m);
        m.col = calloc(1, sizeof *m.col);
        if (!m.col) {
            util_set_err(p->err, sizeof p->err, "out of memory");
            rc = -1;
            break;
        }
        if (pq_read_column(pf, g, m.col, p->err, sizeof p->err) != 0) {
            free(m.col);
            rc = -1;
            break;
        }
        for (int64_t i = 0; i < m.col->n && rc == 0; i++, row++) {
            const pq_value *v = &m.col->values[i];
            const int split = *doc >= first_val ? 1 : 0;
            (*doc)++;
            if (single) {
                char where[PATH_MAX + 64];
                snprintf(where, sizeof where, "%s: row group %d, row %llu", f->path, g, (unsigned long long)row + 1);
                free(p->owned_text);
                p->owned_text = malloc(v->len ? v->len : 1);
                if (!p->owned_text) {
                    util_set_err(p->err, sizeof p->err, "out of memory");
                    rc = -1;
                } else {
                    if (v->len) memcpy(p->owned_text, v->ptr, v->len);
                    rc = push_single(p, fi, p->owned_text, v->len, where, rule, rn);
                }
            } else if (!v->ptr || v->len == 0) {
                p->empty_docs++;
            } else {
                rc = push_text_at(p, fi, v->ptr, 0, v->len, split, g, row + 1);
            }
        }
        if (add_pending(p, m) != 0) {
            unmap_file(&m);
            util_set_err(p->err, sizeof p->err, "out of memory");
            rc = -1;
        }
    }
    pq_close(pf);
    return rc;
}

/* Everything every rank does alike before reading its files: the output, the inputs, the
 * tokenizer; and which files are this rank's (consecutive ones, about as many bytes each). */
static int setup(prep *p) {
    prep_opts *o = &p->o;
    struct stat st;
    if (lstat(o->output, &st) == 0) {
        util_set_err(p->err, sizeof p->err,
                     "%s: already exists; refusing to overwrite it (remove it or choose another --output)", o->output);
        return -1;
    }
    if (collect_inputs(&p->files, o->input, p->err, sizeof p->err) != 0) return -1;
    p->tok = tok_load(o->tokenizer, p->err, sizeof p->err);
    if (!p->tok) return -1;
    uint32_t vocab = tok_vocab_size(p->tok);
    if (o->vocab_check >= 0 && (long long)vocab != o->vocab_check) {
        util_set_err(p->err, sizeof p->err,
                     "%s: the tokenizer's vocab size is %u but the model's vocab_size is %lld (--vocab-size)",
                     o->tokenizer, vocab, o->vocab_check);
        return -1;
    }
    p->out.vocab = vocab;
    p->out.bos = tok_bos_id(p->tok);
    p->out.eos = tok_eos_id(p->tok);
    if (p->out.bos < 0 && p->out.eos < 0) {
        util_set_err(p->err, sizeof p->err, "%s: the tokenizer has neither a BOS nor an EOS token to delimit documents",
                     o->tokenizer);
        return -1;
    }
    p->out.shard_tokens = o->shard_tokens;
    uint64_t total = 0, at = 0;
    for (size_t i = 0; i < p->files.n; i++) total += p->files.v[i].size;
    const uint64_t lo = total * (uint64_t)p->w.rank / (uint64_t)p->w.size;
    const uint64_t hi = total * ((uint64_t)p->w.rank + 1) / (uint64_t)p->w.size;
    p->f0 = p->f1 = p->files.n;
    for (size_t i = 0; i < p->files.n; i++) { /* a file is its first byte's rank's */
        if (at >= lo && p->f0 == p->files.n) p->f0 = i;
        if (at >= hi && p->f1 == p->files.n) p->f1 = i;
        at += p->files.v[i].size;
    }
    if (p->f1 < p->f0) p->f1 = p->f0;
    if (p->w.rank == p->w.size - 1) p->f1 = p->files.n;
    return 0;
}

/* A failure every rank reaches alike (it follows from what all of them know): rank 0 says it. */
static int fail_alike(prep *p) {
    if (p->w.rank != 0) p->follower = 1;
    return -1;
}

/* Collective: did any rank fail (rc)? A rank that failed says why, unless rank 0 failed too
 * (the ranks mostly fail alike: an existing output, a missing tokenizer): then rank 0 says
 * it for all. A rank that failed only because another did says nothing. */
static int agree(prep *p, int rc) {
    if (!pd_any(&p->w, rc)) return 0;
    uint64_t r0 = p->w.rank == 0 && rc != 0;
    pd_sum_u64(&p->w, &r0, 1);
    if (!rc || (p->w.rank != 0 && r0)) p->follower = 1;
    return -1;
}

/* The staging folder beside the output (rank 0 makes it and tells the others its name). */
static int make_staging(prep *p) {
    prep_opts *o = &p->o;
    char name[PATH_MAX + 64] = "";
    int rc = 0;
    if (p->w.rank == 0) {
        const char *slash = strrchr(o->output, '/');
        const char *base = slash ? slash + 1 : o->output;
        int plen = slash ? (int)(slash - o->output) : 0;
        if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
            util_set_err(p->err, sizeof p->err, "%s: --output must name a new folder", o->output);
            rc = -1;
        }
        if (!rc && plen > 0) {
            char *parent = xstrdup_printf("%.*s", plen, o->output);
            rc = parent ? mkdir_parents(parent, p->err, sizeof p->err) : -1;
            free(parent);
        }
        if (!rc) {
            snprintf(name, sizeof name, "%.*s%s.%s.partial-%ld", plen, o->output, slash ? "/" : "", base,
                     (long)getpid());
            /* a run killed before it finished left its staging folder: remove those whose
             * process is gone (a live one belongs to a run still going) */
            char *parent = plen > 0 ? xstrdup_printf("%.*s", plen, o->output) : xstrdup_printf(".");
            char *prefix = xstrdup_printf(".%s.partial-", base);
            DIR *d = parent && prefix ? opendir(parent) : NULL;
            struct dirent *e;
            while (d && (e = readdir(d))) {
                if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
                char *end = NULL;
                long pid = strtol(e->d_name + strlen(prefix), &end, 10);
                if (!end || *end || pid <= 0 || pid == (long)getpid()) continue;
                if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
                char *stale = xstrdup_printf("%s/%s", parent, e->d_name);
                if (stale) {
                    rm_tree(stale);
                    if (!o->quiet) printf("removed %s, left by an interrupted run (process %ld)\n", stale, pid);
                    free(stale);
                }
            }
            if (d) closedir(d);
            free(parent);
            free(prefix);
            if (mkdir(name, 0755) != 0) {
                util_set_err(p->err, sizeof p->err, "%s: cannot create folder: %s", name, strerror(errno));
                rc = -1;
            }
        }
    }
    if (agree(p, rc)) return -1;
    pd_bcast_str(&p->w, name, sizeof name);
    if (!(p->out.tmpdir = strdup(name))) {
        util_set_err(p->err, sizeof p->err, "out of memory");
        return -1;
    }
    return 0;
}

/* Pass 2 over this rank's files: tokenize and write (or spool), in document order; doc0 is
 * the index of its first document among all. */
static int tokenize_range(prep *p, uint64_t doc0, uint64_t D, uint64_t V, int single) {
    prep_opts *o = &p->o;
    uint64_t doc = doc0;
    for (size_t fi = p->f0; fi < p->f1; fi++) {
        in_file *f = &p->files.v[fi];
        if (f->n_docs == 0) continue;
        if (g_interrupted) {
            util_set_err(p->err, sizeof p->err, "interrupted");
            return -1;
        }
        if (f->kind == IN_PARQUET) {
            if (push_parquet(p, fi, single, &doc, D - V, p->rule, sizeof p->rule) != 0) return -1;
            continue;
        }
        fmap m;
        if (map_file(f->path, f->comp, &m, p->err, sizeof p->err) != 0) return -1;
        int rc = 0;
        if (f->kind == IN_TXT) {
            if (single) {
                size_t bad = data_prepare_utf8_check((const unsigned char *)m.data, m.len);
                if (bad < m.len) {
                    util_set_err(p->err, sizeof p->err, "%s: invalid UTF-8 at byte offset %zu (byte 0x%02x)", f->path,
                                 bad, (unsigned char)m.data[bad]);
                    rc = -1;
                } else {
                    size_t cut = data_prepare_split_point(m.data, m.len, o->val_fraction);
                    if (!cut) {
                        util_set_err(p->err, sizeof p->err,
                                     "%s: a single document of %zu bytes is too short to hold out a validation part; "
                                     "use --val-fraction 0",
                                     f->path, m.len);
                        rc = -1;
                    } else {
                        snprintf(p->rule, sizeof p->rule, "single document cut at byte %zu of %zu (a paragraph start)",
                                 cut, m.len);
                        rc = push_text(p, fi, m.data, 0, cut, 0);
                        if (!rc) rc = push_text(p, fi, m.data, cut, m.len, 1);
                    }
                }
            } else {
                rc = push_text(p, fi, m.data, 0, m.len, doc >= D - V ? 1 : 0);
            }
            doc++;
        } else {
            size_t pos = 0;
            uint64_t line = 0;
            while (pos < m.len && rc == 0) {
                const char *nl = memchr(m.data + pos, '\n', m.len - pos);
                size_t end = nl ? (size_t)(nl - m.data) : m.len;
                line++;
                if (!blank_line(m.data + pos, end - pos)) {
                    if (single) {
                        /* One JSON document: decode it here and cut its text. */
                        json_error_t jerr;
                        json_t *root = json_loadb(m.data + pos, end - pos, JSON_ALLOW_NUL, &jerr);
                        json_t *v = root && json_is_object(root) ? json_object_get(root, o->field) : NULL;
                        if (!root) {
                            util_set_err(p->err, sizeof p->err, "%s:%llu: invalid JSON at byte offset %llu: %s",
                                         f->path, (unsigned long long)line,
                                         (unsigned long long)(pos + (size_t)(jerr.position > 0 ? jerr.position : 0)),
                                         jerr.text);
                            rc = -1;
                        } else if (!json_is_string(v)) {
                            util_set_err(p->err, sizeof p->err,
                                         "%s:%llu: expected a JSON object with a \"%s\" string field", f->path,
                                         (unsigned long long)line, o->field);
                            rc = -1;
                        } else {
                            size_t tl = json_string_length(v);
                            p->owned_text = malloc(tl ? tl : 1);
                            if (!p->owned_text) {
                                util_set_err(p->err, sizeof p->err, "out of memory");
                                rc = -1;
                            } else {
                                memcpy(p->owned_text, json_string_value(v), tl);
                                size_t cut = data_prepare_split_point(p->owned_text, tl, o->val_fraction);
                                if (!cut) {
                                    util_set_err(p->err, sizeof p->err,
                                                 "%s:%llu: a single document of %zu bytes is too short to hold out a "
                                                 "validation part; use --val-fraction 0",
                                                 f->path, (unsigned long long)line, tl);
                                    rc = -1;
                                } else {
                                    snprintf(p->rule, sizeof p->rule,
                                             "single document cut at byte %zu of %zu of its text", cut, tl);
                                    rc = push_text(p, fi, p->owned_text, 0, cut, 0);
                                    if (!rc) rc = push_text(p, fi, p->owned_text, cut, tl, 1);
                                }
                            }
                        }
                        if (root) json_decref(root);
                    } else {
                        item it;
                        memset(&it, 0, sizeof it);
                        it.kind = ITEM_JSON;
                        it.data = m.data + pos;
                        it.len = end - pos;
                        it.file = fi;
                        it.offset = pos;
                        it.line = line;
                        it.rg = -1;
                        it.bos = it.eos = 1;
                        it.split = doc >= D - V ? 1 : 0;
                        rc = push_item(p, &it);
                    }
                    doc++;
                }
                pos = end + 1;
            }
        }
        if (add_pending(p, m) != 0) {
            unmap_file(&m);
            util_set_err(p->err, sizeof p->err, "out of memory");
            return -1;
        }
        if (rc != 0) return -1;
    }
    return flush_batch(p);
}

/* The index of the splits written, then the rename that makes it all appear at once. */
static int publish(prep *p, shard_index_split sp_in[2], uint64_t docs[2]) {
    prep_opts *o = &p->o;
    shard_index ix;
    memset(&ix, 0, sizeof ix);
    ix.vocab_size = p->out.vocab;
    ix.token_bytes = shard_token_bytes_for_vocab(p->out.vocab);
    ix.bos_id = p->out.bos;
    ix.eos_id = p->out.eos;
    ix.tokenizer = (char *)o->tokenizer;
    char fingerprint[17];
    snprintf(fingerprint, sizeof fingerprint, "%016llx", (unsigned long long)tok_fingerprint(p->tok));
    ix.tokenizer_fingerprint = fingerprint;
    ix.input = (char *)o->input;
    ix.val_fraction = o->val_fraction;
    ix.val_rule = p->rule;
    shard_index_split sp[2];
    for (int s = 0; s < 2; s++) {
        sp[ix.n_splits] = sp_in[s];
        sp[ix.n_splits].name = (char *)split_name(s);
        sp[ix.n_splits].n_documents = docs[s];
        sp[ix.n_splits].doc_lengths = &p->doclen[s];
        if (s == 0 || sp_in[s].n_shards > 0) ix.n_splits++;
    }
    ix.splits = sp;
    if (shard_index_write(p->out.tmpdir, &ix, p->err, sizeof p->err) != 0) return -1;
    if (g_interrupted) {
        util_set_err(p->err, sizeof p->err, "interrupted");
        return -1;
    }
    if (rename(p->out.tmpdir, o->output) != 0) {
        util_set_err(p->err, sizeof p->err, "%s: cannot rename %s to it: %s", o->output, p->out.tmpdir,
                     strerror(errno));
        return -1;
    }
    shard_fsync_parent(o->output);
    free(p->out.tmpdir);
    p->out.tmpdir = NULL;
    show_progress(p, 1);
    if (!o->quiet) {
        double dt = now_s() - p->t0;
        char ranks[32] = "";
        if (p->w.size > 1) snprintf(ranks, sizeof ranks, " on %d ranks", p->w.size);
        printf("prepared %s: vocab %u (%s tokens), %zu input file%s, %.1f s%s\n", o->output, p->out.vocab,
               ix.token_bytes == 2 ? "uint16" : "uint32", p->files.n, p->files.n == 1 ? "" : "s", dt, ranks);
        for (int s = 0; s < ix.n_splits; s++)
            printf("  %-5s %llu document%s, %llu tokens in %d shard%s\n", sp[s].name,
                   (unsigned long long)sp[s].n_documents, sp[s].n_documents == 1 ? "" : "s",
                   (unsigned long long)sp[s].n_tokens, sp[s].n_shards, sp[s].n_shards == 1 ? "" : "s");
        printf("  val split: %s\n", p->rule);
        if (p->empty_docs)
            printf("  skipped %llu document%s with empty (or null) text\n", (unsigned long long)p->empty_docs,
                   p->empty_docs == 1 ? "" : "s");
        if (p->files.ignored)
            printf("  ignored %zu file%s that %s not .txt, .jsonl, .json or .parquet\n", p->files.ignored,
                   p->files.ignored == 1 ? "" : "s", p->files.ignored == 1 ? "is" : "are");
    }
    return 0;
}

/* Several ranks: the shards from every rank's spool, then rank 0 publishes. */
static int finish_ranks(prep *p, uint64_t D) {
    const int R = p->w.size;
    const size_t nh = 2 * 2 * DOCLEN_BUCKETS; /* the splits' document-length histograms, summed */
    uint64_t *v = calloc((size_t)R * 2 + 4 + nh, sizeof *v);
    int rc = v ? 0 : -1;
    if (rc) util_set_err(p->err, sizeof p->err, "out of memory");
    if (agree(p, rc)) {
        free(v);
        return -1;
    }
    v[p->w.rank * 2] = p->spool.n[0];
    v[p->w.rank * 2 + 1] = p->spool.n[1];
    v[R * 2] = p->docs[0];
    v[R * 2 + 1] = p->docs[1];
    v[R * 2 + 2] = p->empty_docs;
    v[R * 2 + 3] = p->done_bytes;
    for (int s = 0; s < 2; s++) {
        if (p->cur_len[s]) doclen_add(&p->doclen[s], p->cur_len[s]), p->cur_len[s] = 0; /* a file ends a document */
        memcpy(v + R * 2 + 4 + (size_t)s * 2 * DOCLEN_BUCKETS, p->doclen[s].count, sizeof p->doclen[s].count);
        memcpy(v + R * 2 + 4 + (size_t)s * 2 * DOCLEN_BUCKETS + DOCLEN_BUCKETS, p->doclen[s].tokens,
               sizeof p->doclen[s].tokens);
    }
    pd_sum_u64(&p->w, v, (size_t)R * 2 + 4 + nh);
    for (int s = 0; s < 2; s++) {
        memcpy(p->doclen[s].count, v + R * 2 + 4 + (size_t)s * 2 * DOCLEN_BUCKETS, sizeof p->doclen[s].count);
        memcpy(p->doclen[s].tokens, v + R * 2 + 4 + (size_t)s * 2 * DOCLEN_BUCKETS + DOCLEN_BUCKETS,
               sizeof p->doclen[s].tokens);
    }
    uint64_t docs[2] = {v[R * 2], v[R * 2 + 1]};
    p->empty_docs = v[R * 2 + 2];
    p->done_bytes = v[R * 2 + 3];
    shard_index_split sp[2];
    rc = ps_write_shards(&p->w, p->out.tmpdir, p->out.vocab, p->out.bos, p->out.eos, p->out.shard_tokens, v, sp, p->err,
                         sizeof p->err);
    free(v);
    if (rc != 0) {
        if (!strcmp(p->err, "another rank failed writing shards")) p->follower = 1;
        return -1;
    }
    ps_spool_remove(&p->spool);
    if (pd_any(&p->w, 0)) return -1; /* every spool is gone before the rename */
    if (sp[0].n_tokens == 0 && sp[1].n_tokens == 0) {
        util_set_err(p->err, sizeof p->err, "%s: empty input: no text in its %llu documents", p->o.input,
                     (unsigned long long)D);
        ps_splits_free(sp);
        return fail_alike(p);
    }
    rc = p->w.rank == 0 ? publish(p, sp, docs) : 0;
    ps_splits_free(sp);
    if (agree(p, rc)) return -1;
    return 0;
}

static int run(prep *p) {
    prep_opts *o = &p->o;
    int rc = setup(p);
    if (agree(p, rc)) return -1;

    /* Pass 1: count documents (each rank its files; then every rank knows every count). */
    uint64_t *nd = calloc(p->files.n + 1, sizeof *nd);
    rc = nd ? 0 : -1;
    if (!nd) util_set_err(p->err, sizeof p->err, "out of memory");
    for (size_t i = p->f0; i < p->f1 && rc == 0; i++) {
        rc = count_docs(&p->files.v[i], o->field, p->err, sizeof p->err);
        if (!rc) nd[i] = p->files.v[i].n_docs;
    }
    if (agree(p, rc)) {
        free(nd);
        return -1;
    }
    pd_sum_u64(&p->w, nd, p->files.n);
    uint64_t D = 0, doc0 = 0;
    for (size_t i = 0; i < p->files.n; i++) {
        p->files.v[i].n_docs = nd[i];
        if (i < p->f0) doc0 += nd[i];
        D += nd[i];
        p->total_bytes += p->files.v[i].size;
    }
    free(nd);
    if (D == 0) {
        if (p->files.n == 1)
            util_set_err(p->err, sizeof p->err, "%s: empty input (%llu bytes, no documents)", p->files.v[0].path,
                         (unsigned long long)p->files.v[0].size);
        else
            util_set_err(p->err, sizeof p->err, "%s: empty input: its %zu files hold no documents", o->input,
                         p->files.n);
        return fail_alike(p);
    }
    int single = D == 1 && o->val_fraction > 0;
    uint64_t V = 0;
    if (!single && o->val_fraction > 0) {
        V = (uint64_t)llround(o->val_fraction * (double)D);
        if (V < 1) V = 1;
        if (V > D - 1) V = D - 1;
    }
    if (make_staging(p) != 0) return -1;
    p->items = malloc(BATCH_ITEMS * sizeof *p->items);
    rc = p->items ? 0 : -1;
    if (rc) util_set_err(p->err, sizeof p->err, "out of memory");
    p->t0 = p->last_progress = now_s();
    snprintf(p->rule, sizeof p->rule, "none");
    if (p->w.size > 1) {
        ps_spool_init(&p->spool, p->out.tmpdir, p->w.rank, shard_token_bytes_for_vocab(p->out.vocab));
        p->out.spool = &p->spool;
    }

    /* Pass 2: tokenize this rank's files. */
    if (!rc) rc = tokenize_range(p, doc0, D, V, single);
    if (!rc && p->w.size > 1) rc = ps_spool_close(&p->spool, p->err, sizeof p->err);
    if (agree(p, rc)) return -1;
    /* the rule is the same on every rank but the one that cut a single document */
    if (V > 0)
        snprintf(p->rule, sizeof p->rule, "last %llu of %llu documents", (unsigned long long)V, (unsigned long long)D);
    else if (single && p->w.size > 1) { /* the rank that cut the one document says where */ uint64_t c[sizeof p->rule];
        const int mine = strcmp(p->rule, "none") != 0;
        for (size_t i = 0; i < sizeof p->rule; i++) c[i] = mine ? (unsigned char)p->rule[i] : 0;
        pd_sum_u64(&p->w, c, sizeof p->rule);
        for (size_t i = 0; i < sizeof p->rule; i++) p->rule[i] = (char)c[i];
        p->rule[sizeof p->rule - 1] = 0;
    }
    if (p->w.size > 1) return finish_ranks(p, D);

    if (out_close_shard(&p->out, p->err, sizeof p->err) != 0) return -1;
    if (p->out.splits[0].n_tokens == 0 && p->out.splits[1].n_tokens == 0) {
        util_set_err(p->err, sizeof p->err, "%s: empty input: no text in its %llu documents", o->input,
                     (unsigned long long)D);
        return -1;
    }
    for (int s = 0; s < 2; s++)
        if (p->cur_len[s]) doclen_add(&p->doclen[s], p->cur_len[s]), p->cur_len[s] = 0;
    return publish(p, p->out.splits, p->docs);
}

int data_prepare_main(int argc, char **argv) {
    prep *p = calloc(1, sizeof *p);
    if (!p) {
        fprintf(stderr, "tetra data prepare: out of memory\n");
        return 1;
    }
    int prc = parse_args(argc, argv, &p->o);
    if (prc != 0) {
        free(p->o.output_owned);
        free(p);
        return prc == 1 ? 0 : prc;
    }
    pd_init(&p->w, NULL, NULL); /* one of several ranks under mpirun / srun */
    if (p->w.rank != 0) p->o.quiet = 1;
    p->progress = !p->o.quiet && isatty(STDERR_FILENO);

    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    g_interrupted = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    int rc = run(p);

    for (size_t i = 0; i < p->n_items; i++) {
        free(p->items[i].ids);
        free(p->items[i].error);
    }
    release_pending(p);
    free(p->pending);
    out_free(&p->out);
    if (p->spool.dir) ps_spool_remove(&p->spool);
    if (p->out.tmpdir) { /* every rank is past its last write: the ranks agreed on the failure */
        if (p->w.rank == 0) rm_tree(p->out.tmpdir);
        free(p->out.tmpdir);
    }
    int interrupted = g_interrupted;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (p->tok) tok_free(p->tok);
    list_free(&p->files);
    free(p->items);
    free(p->owned_text);
    if (rc != 0 && !p->follower) {
        char who[32] = "";
        if (p->w.size > 1) snprintf(who, sizeof who, " (rank %d of %d)", p->w.rank, p->w.size);
        if (p->progress) fputc('\n', stderr);
        fprintf(stderr, "tetra data prepare: error%s: %s\n", who, p->err);
        if (interrupted) fprintf(stderr, "tetra data prepare: nothing was written to %s\n", p->o.output);
    }
    pd_finalize(&p->w);
    free(p->o.output_owned);
    free(p);
    return rc == 0 ? 0 : interrupted ? 130 : 1;
}
