/* tb_writer.c — TensorBoard event files: TFRecord framing (masked CRC-32C) and the
 * few protobuf messages scalars need, encoded by hand (see tb_writer.h). */
#include "telemetry/tb_writer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "util/crc32c.h"

/* ---- TFRecord CRC masking ------------------------------------------------- */

uint32_t tb_crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint32_t tb_crc32c_unmask(uint32_t masked) {
    uint32_t rot = masked - 0xa282ead8u;
    return (rot >> 17) | (rot << 15);
}

/* ---- protobuf encoding -------------------------------------------------- */

size_t tb_put_varint(uint8_t *out, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* A bounded output cursor: counts every byte, stores those that fit. */
typedef struct {
    uint8_t *p;
    size_t cap, n;
} pb_out;

static void put_bytes(pb_out *o, const void *src, size_t len) {
    if (o->n < o->cap) {
        size_t room = o->cap - o->n;
        memcpy(o->p + o->n, src, len < room ? len : room);
    }
    o->n += len;
}

static void put_varint(pb_out *o, uint64_t v) {
    uint8_t tmp[10];
    put_bytes(o, tmp, tb_put_varint(tmp, v));
}

static void put_le(pb_out *o, uint64_t v, int nbytes) {
    uint8_t tmp[8];
    for (int i = 0; i < nbytes; i++) tmp[i] = (uint8_t)(v >> (8 * i));
    put_bytes(o, tmp, (size_t)nbytes);
}

static void put_double_field(pb_out *o, int field, double v) {
    uint64_t bits;
    memcpy(&bits, &v, 8);
    put_varint(o, ((uint64_t)field << 3) | 1); /* wire type 1: fixed64 */
    put_le(o, bits, 8);
}

static void put_float_field(pb_out *o, int field, float v) {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    put_varint(o, ((uint64_t)field << 3) | 5); /* wire type 5: fixed32 */
    put_le(o, bits, 4);
}

static void put_int_field(pb_out *o, int field, int64_t v) {
    put_varint(o, ((uint64_t)field << 3) | 0); /* wire type 0: varint (negatives take 10 bytes) */
    put_varint(o, (uint64_t)v);
}

static void put_len_header(pb_out *o, int field, size_t len) {
    put_varint(o, ((uint64_t)field << 3) | 2); /* wire type 2: length-delimited */
    put_varint(o, len);
}

static size_t value_msg_len(const char *tag) {
    size_t t = strlen(tag);
    return 1 + varint_len(t) + t + 5; /* tag (field 1) + simple_value (field 2, fixed32) */
}

static void put_event_head(pb_out *o, double wall_time, int64_t step) {
    put_double_field(o, 1, wall_time);
    if (step != 0) put_int_field(o, 2, step); /* proto3: a zero step is omitted */
}

size_t tb_encode_scalars_event(uint8_t *out, size_t cap, double wall_time, int64_t step, int n, const char *const *tags,
                               const float *values) {
    pb_out o = {out, cap, 0};
    put_event_head(&o, wall_time, step);
    size_t summary_len = 0;
    for (int i = 0; i < n; i++) {
        size_t vl = value_msg_len(tags[i]);
        summary_len += 1 + varint_len(vl) + vl;
    }
    put_len_header(&o, 5, summary_len); /* Event.summary */
    for (int i = 0; i < n; i++) {
        size_t t = strlen(tags[i]);
        put_len_header(&o, 1, value_msg_len(tags[i])); /* Summary.value */
        put_len_header(&o, 1, t);                      /* Value.tag */
        put_bytes(&o, tags[i], t);
        put_float_field(&o, 2, values[i]); /* Value.simple_value */
    }
    return o.n;
}

/* ---- TFRecord framing --------------------------------------------------- */

int tb_write_record(FILE *f, const void *data, size_t n) {
    uint8_t head[12], tail[4];
    uint64_t len = n;
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)(len >> (8 * i));
    uint32_t lc = tb_crc32c_mask(crc32c(0, head, 8));
    for (int i = 0; i < 4; i++) head[8 + i] = (uint8_t)(lc >> (8 * i));
    uint32_t dc = tb_crc32c_mask(crc32c(0, data, n));
    for (int i = 0; i < 4; i++) tail[i] = (uint8_t)(dc >> (8 * i));
    if (fwrite(head, 1, 12, f) != 12) return -1;
    if (n && fwrite(data, 1, n, f) != n) return -1;
    if (fwrite(tail, 1, 4, f) != 4) return -1;
    return 0;
}

/* ---- the writer ----------------------------------------------------------- */

struct tb_writer {
    FILE *f;
    char *path;
    uint8_t *buf;
    size_t cap;
    int failed;
};

static double now_seconds(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

int tb_make_dirs(const char *dir) {
    size_t n = strlen(dir);
    char *p = malloc(n + 1);
    if (!p) return -1;
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            int e = errno;
            free(p);
            errno = e;
            return -1;
        }
        p[i] = c;
    }
    free(p);
    struct stat st;
    if (stat(dir, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

static int emit(tb_writer *w, const uint8_t *data, size_t n) {
    if (w->failed) return -1;
    if (tb_write_record(w->f, data, n) != 0 || fflush(w->f) != 0) {
        w->failed = 1;
        return -1;
    }
    return 0;
}

static int reserve(tb_writer *w, size_t need) {
    if (need <= w->cap) return 0;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < need) cap *= 2;
    uint8_t *b = realloc(w->buf, cap);
    if (!b) return -1;
    w->buf = b;
    w->cap = cap;
    return 0;
}

tb_writer *tb_writer_open(const char *dir, char *err, size_t errlen) {
    static unsigned serial; /* TensorBoard's per-process uid suffix */
    if (tb_make_dirs(dir) != 0) {
        snprintf(err, errlen, "cannot create TensorBoard folder %s: %s", dir, strerror(errno));
        return NULL;
    }
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    size_t plen = strlen(dir) + strlen(host) + 96;
    tb_writer *w = calloc(1, sizeof *w);
    char *path = malloc(plen);
    if (!w || !path) {
        free(w);
        free(path);
        snprintf(err, errlen, "out of memory opening a TensorBoard file in %s", dir);
        return NULL;
    }
    snprintf(path, plen, "%s%sevents.out.tfevents.%lld.%s.%ld.%u", dir,
             dir[0] && dir[strlen(dir) - 1] == '/' ? "" : "/", (long long)time(NULL), host, (long)getpid(), serial++);
    w->path = path;
    w->f = fopen(path, "wb");
    if (!w->f) {
        snprintf(err, errlen, "cannot create TensorBoard event file %s: %s", path, strerror(errno));
        free(path);
        free(w);
        return NULL;
    }
    /* Event{wall_time, file_version "brain.Event:2"} */
    static const char version[] = "brain.Event:2";
    uint8_t rec[64];
    pb_out o = {rec, sizeof rec, 0};
    put_double_field(&o, 1, now_seconds());
    put_len_header(&o, 3, sizeof version - 1);
    put_bytes(&o, version, sizeof version - 1);
    if (emit(w, rec, o.n) != 0) {
        snprintf(err, errlen, "cannot write TensorBoard event file %s: %s", path, strerror(errno));
        fclose(w->f);
        free(path);
        free(w);
        return NULL;
    }
    return w;
}

const char *tb_writer_path(const tb_writer *w) { return w->path; }

int tb_writer_add_scalars(tb_writer *w, int64_t step, double wall_time, int n, const char *const *tags,
                          const float *values) {
    if (wall_time < 0) wall_time = now_seconds();
    size_t need = tb_encode_scalars_event(w->buf, w->cap, wall_time, step, n, tags, values);
    if (need > w->cap) {
        if (reserve(w, need) != 0) return -1;
        tb_encode_scalars_event(w->buf, w->cap, wall_time, step, n, tags, values);
    }
    return emit(w, w->buf, need);
}

int tb_writer_add_scalar(tb_writer *w, int64_t step, double wall_time, const char *tag, float value) {
    return tb_writer_add_scalars(w, step, wall_time, 1, &tag, &value);
}

int tb_writer_session_start(tb_writer *w, int64_t step, double wall_time) {
    if (wall_time < 0) wall_time = now_seconds();
    uint8_t rec[48];
    pb_out o = {rec, sizeof rec, 0};
    put_event_head(&o, wall_time, step);
    put_len_header(&o, 7, 2); /* Event.session_log */
    put_int_field(&o, 1, 1);  /* SessionLog.status = START */
    return emit(w, rec, o.n);
}

int tb_writer_flush(tb_writer *w) {
    if (w->failed) return -1;
    return fflush(w->f) == 0 ? 0 : -1;
}

int tb_writer_close(tb_writer *w) {
    if (!w) return 0;
    int rc = w->failed ? -1 : 0;
    if (fclose(w->f) != 0) rc = -1;
    free(w->path);
    free(w->buf);
    free(w);
    return rc;
}
