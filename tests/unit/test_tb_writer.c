/* TensorBoard event writer: CRC-32C vectors, varints, Event encoding byte by
 * byte, a written file re-read by a small TFRecord + protobuf reader (both
 * CRCs checked, corruption detected), error messages; and the metrics logger's
 * number formatting and metrics.jsonl (full precision, resume truncation). */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "telemetry/metrics.h"
#include "util/crc32c.h"
#include "telemetry/tb_writer.h"
#include "tests/check.h"

/* ---- helpers -------------------------------------------------------------- */

static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            remove_tree(sub);
        }
        closedir(d);
        rmdir(path);
    } else {
        remove(path);
    }
}

static uint8_t *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0, got;
    uint8_t *b = malloc(cap);
    while ((got = fread(b + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) b = realloc(b, cap *= 2);
    }
    fclose(f);
    *len = n;
    return b;
}

/* ---- a tiny independent reader ----------------------------------------------- */

static uint64_t rd_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Bitwise CRC-32C, independent of the writer's table. */
static uint32_t crc_bitwise(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    }
    return ~c;
}

static uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

typedef struct {
    double wall_time;
    int64_t step;
    char file_version[32];
    int session_status; /* -1: none */
    int n_values;
    char tags[16][256];
    float values[16];
} event;

static int get_varint(const uint8_t *p, size_t n, size_t *pos, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*pos >= n) return -1;
        uint8_t b = p[(*pos)++];
        *v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return 0;
    }
    return -1;
}

/* Decodes the fields of Event / Summary / Value / SessionLog the writer uses;
 * -1 on any malformed or unexpected field. */
static int parse_value(const uint8_t *p, size_t n, event *ev) {
    size_t pos = 0;
    int i = ev->n_values;
    if (i >= 16) return -1;
    ev->tags[i][0] = '\0';
    ev->values[i] = NAN;
    while (pos < n) {
        uint64_t key, len;
        if (get_varint(p, n, &pos, &key)) return -1;
        if (key == 0x0A) {
            if (get_varint(p, n, &pos, &len) || len >= 256 || pos + len > n) return -1;
            memcpy(ev->tags[i], p + pos, len);
            ev->tags[i][len] = '\0';
            pos += len;
        } else if (key == 0x15) {
            if (pos + 4 > n) return -1;
            uint32_t bits = (uint32_t)rd_le(p + pos, 4);
            memcpy(&ev->values[i], &bits, 4);
            pos += 4;
        } else {
            return -1;
        }
    }
    ev->n_values++;
    return 0;
}

static int parse_event(const uint8_t *p, size_t n, event *ev) {
    memset(ev, 0, sizeof *ev);
    ev->session_status = -1;
    size_t pos = 0;
    while (pos < n) {
        uint64_t key, v, len;
        if (get_varint(p, n, &pos, &key)) return -1;
        switch (key) {
        case 0x09: /* wall_time */
            if (pos + 8 > n) return -1;
            v = rd_le(p + pos, 8);
            memcpy(&ev->wall_time, &v, 8);
            pos += 8;
            break;
        case 0x10: /* step */
            if (get_varint(p, n, &pos, &v)) return -1;
            ev->step = (int64_t)v;
            break;
        case 0x1A: /* file_version */
            if (get_varint(p, n, &pos, &len) || len >= sizeof ev->file_version || pos + len > n) return -1;
            memcpy(ev->file_version, p + pos, len);
            ev->file_version[len] = '\0';
            pos += len;
            break;
        case 0x2A: { /* summary */
            if (get_varint(p, n, &pos, &len) || pos + len > n) return -1;
            size_t end = pos + len;
            while (pos < end) {
                uint64_t k2, l2;
                if (get_varint(p, end, &pos, &k2) || k2 != 0x0A) return -1;
                if (get_varint(p, end, &pos, &l2) || pos + l2 > end) return -1;
                if (parse_value(p + pos, l2, ev)) return -1;
                pos += l2;
            }
            break;
        }
        case 0x3A: { /* session_log */
            if (get_varint(p, n, &pos, &len) || pos + len > n) return -1;
            size_t q = 0;
            uint64_t k2, st;
            if (get_varint(p + pos, len, &q, &k2) || k2 != 0x08 || get_varint(p + pos, len, &q, &st) || q != len)
                return -1;
            ev->session_status = (int)st;
            pos += len;
            break;
        }
        default: return -1;
        }
    }
    return 0;
}

/* Reads every record of an event file; returns the count, or -1 (framing or
 * CRC error), -2 (protobuf error). */
static int read_events(const uint8_t *b, size_t n, event *evs, int max) {
    size_t pos = 0;
    int count = 0;
    while (pos < n) {
        if (pos + 12 > n) return -1;
        uint64_t len = rd_le(b + pos, 8);
        if ((uint32_t)rd_le(b + pos + 8, 4) != mask(crc_bitwise(b + pos, 8))) return -1;
        if (pos + 12 + len + 4 > n) return -1;
        const uint8_t *data = b + pos + 12;
        if ((uint32_t)rd_le(data + len, 4) != mask(crc_bitwise(data, len))) return -1;
        if (count < max && parse_event(data, len, &evs[count])) return -2;
        count++;
        pos += 12 + len + 4;
    }
    return count;
}

/* ---- tests ---------------------------------------------------------------- */

static void test_crc32c(void) {
    CHECK(crc32c(0, "123456789", 9) == 0xE3069283u, "check value %08x", crc32c(0, "123456789", 9));
    CHECK(crc32c(0, "", 0) == 0, "empty");
    uint8_t buf[32];
    /* RFC 3720 (iSCSI) B.4 vectors */
    memset(buf, 0, 32);
    CHECK(crc32c(0, buf, 32) == 0x8A9136AAu, "32 zeros %08x", crc32c(0, buf, 32));
    memset(buf, 0xFF, 32);
    CHECK(crc32c(0, buf, 32) == 0x62A8AB43u, "32 ones %08x", crc32c(0, buf, 32));
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)i;
    CHECK(crc32c(0, buf, 32) == 0x46DD794Eu, "ascending %08x", crc32c(0, buf, 32));
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)(31 - i);
    CHECK(crc32c(0, buf, 32) == 0x113FDB5Cu, "descending %08x", crc32c(0, buf, 32));
    CHECK(crc32c(0, "a", 1) == 0xC1D04330u, "'a' %08x", crc32c(0, "a", 1));
    /* table implementation == bitwise one, and extend composes */
    uint8_t big[1000];
    for (int i = 0; i < 1000; i++) big[i] = (uint8_t)(i * 131 + 7);
    CHECK(crc32c(0, big, 1000) == crc_bitwise(big, 1000), "table vs bitwise");
    CHECK(crc32c(crc32c(0, big, 377), big + 377, 623) == crc32c(0, big, 1000), "extend");
    /* masking */
    uint32_t c = 0xE3069283u;
    CHECK(tb_crc32c_mask(c) == (((c >> 15) | (c << 17)) + 0xa282ead8u), "mask");
    CHECK(tb_crc32c_unmask(tb_crc32c_mask(c)) == c, "unmask");
    CHECK(tb_crc32c_mask(0) == 0xa282ead8u, "mask(0)");
}

static int varint_is(uint64_t v, const uint8_t *want, size_t wn) {
    uint8_t out[16];
    memset(out, 0xEE, sizeof out);
    size_t n = tb_put_varint(out, v);
    return n == wn && !memcmp(out, want, wn) && out[n] == 0xEE;
}

static void test_varint(void) {
    CHECK(varint_is(0, (const uint8_t[]){0x00}, 1), "0");
    CHECK(varint_is(1, (const uint8_t[]){0x01}, 1), "1");
    CHECK(varint_is(127, (const uint8_t[]){0x7F}, 1), "127");
    CHECK(varint_is(128, (const uint8_t[]){0x80, 0x01}, 2), "128");
    CHECK(varint_is(300, (const uint8_t[]){0xAC, 0x02}, 2), "300");
    CHECK(varint_is(16383, (const uint8_t[]){0xFF, 0x7F}, 2), "16383");
    CHECK(varint_is(16384, (const uint8_t[]){0x80, 0x80, 0x01}, 3), "16384");
    CHECK(varint_is(0xFFFFFFFFu, (const uint8_t[]){0xFF, 0xFF, 0xFF, 0xFF, 0x0F}, 5), "2^32-1");
    CHECK(varint_is((uint64_t)INT64_MAX, (const uint8_t[]){0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F}, 9),
          "INT64_MAX");
    /* int64 -1 as protobuf encodes it: ten bytes */
    CHECK(varint_is((uint64_t)(int64_t)-1,
                    (const uint8_t[]){0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}, 10),
          "-1");
    CHECK(
        varint_is(UINT64_C(1) << 63, (const uint8_t[]){0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, 10),
        "2^63");
}

static void test_encoding(void) {
    /* Event{wall_time 1.5, step 300, summary{value{tag "a", simple_value 1.0}}} */
    static const uint8_t want[] = {0x09, 0,    0,    0,    0,    0,    0,   0xF8, 0x3F, 0x10, 0xAC, 0x02,
                                   0x2A, 0x0A, 0x0A, 0x08, 0x0A, 0x01, 'a', 0x15, 0x00, 0x00, 0x80, 0x3F};
    const char *tags[] = {"a"};
    float vals[] = {1.0f};
    uint8_t out[64];
    size_t n = tb_encode_scalars_event(out, sizeof out, 1.5, 300, 1, tags, vals);
    CHECK(n == sizeof want && !memcmp(out, want, n), "event bytes (len %zu)", n);

    /* step 0 is omitted (proto3 default) */
    n = tb_encode_scalars_event(out, sizeof out, 1.5, 0, 1, tags, vals);
    CHECK(n == sizeof want - 3 && out[9] == 0x2A, "step 0 omitted (len %zu)", n);

    /* a short buffer: the full length is reported, nothing written past cap */
    memset(out, 0xEE, sizeof out);
    n = tb_encode_scalars_event(out, 10, 1.5, 300, 1, tags, vals);
    CHECK(n == sizeof want, "length with short buffer %zu", n);
    CHECK(!memcmp(out, want, 10) && out[10] == 0xEE, "short buffer contents");

    /* several values, a long tag (two-byte length), negative step */
    char longtag[200];
    memset(longtag, 'x', 199);
    longtag[199] = '\0';
    const char *tags2[] = {"loss_metrics/global_avg_loss", longtag, "mfu(%)"};
    float vals2[] = {10.25f, -3.5f, NAN};
    uint8_t big[512];
    n = tb_encode_scalars_event(big, sizeof big, 1e9, -7, 3, tags2, vals2);
    event ev;
    CHECK(n < sizeof big && parse_event(big, n, &ev) == 0, "parse multi-value event");
    CHECK(ev.step == -7 && ev.wall_time == 1e9 && ev.n_values == 3, "step %lld n %d", (long long)ev.step, ev.n_values);
    CHECK(!strcmp(ev.tags[0], "loss_metrics/global_avg_loss") && ev.values[0] == 10.25f, "value 0");
    CHECK(!strcmp(ev.tags[1], longtag) && ev.values[1] == -3.5f, "value 1 (long tag)");
    CHECK(!strcmp(ev.tags[2], "mfu(%)") && isnan(ev.values[2]), "value 2 NaN");
}

/* lengths of 128 and more take two varint bytes at every nesting level */
static void test_long_tag_framing(void) {
    char longtag[200];
    memset(longtag, 'y', 199);
    longtag[199] = '\0';
    const char *tags[] = {longtag};
    float vals[] = {2.0f};
    uint8_t big[512];
    size_t n = tb_encode_scalars_event(big, sizeof big, 0.0, 1, 1, tags, vals);
    /* wall 9 + step 2 + summary header 3 + value header 3 + value 207 (tag 1+2+199, float 5) */
    CHECK(n == 224, "len %zu", n);
    CHECK(big[11] == 0x2A && big[12] == 0xD2 && big[13] == 0x01, "summary length 210 as varint");
    CHECK(big[14] == 0x0A && big[15] == 0xCF && big[16] == 0x01, "value length 207 as varint");
    CHECK(big[17] == 0x0A && big[18] == 0xC7 && big[19] == 0x01, "tag length 199 as varint");
    CHECK(big[20 + 199] == 0x15, "simple_value after the tag");
}

static void test_file(const char *root) {
    char dir[512], err[512];
    snprintf(dir, sizeof dir, "%s/a/b/tb", root);
    tb_writer *w = tb_writer_open(dir, err, sizeof err);
    CHECK(w != NULL, "open: %s", err);
    if (!w) return;
    const char *path = tb_writer_path(w);
    CHECK(strstr(path, "/a/b/tb/events.out.tfevents.") != NULL, "file name %s", path);
    CHECK(tb_writer_session_start(w, 5, 123.0) == 0, "session start");
    const char *tags[] = {"loss", "lr"};
    for (int s = 5; s <= 7; s++) {
        float vals[] = {10.0f / (float)s, 1e-4f * (float)s};
        CHECK(tb_writer_add_scalars(w, s, 1000.0 + s, 2, tags, vals) == 0, "add step %d", s);
    }
    CHECK(tb_writer_add_scalar(w, 8, -1, "validation_metrics/loss", 3.25f) == 0, "add one");
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", path);
    CHECK(tb_writer_close(w) == 0, "close");

    size_t len = 0;
    uint8_t *b = read_all(saved, &len);
    CHECK(b != NULL, "read back %s", saved);
    if (!b) return;
    event evs[16];
    int n = read_events(b, len, evs, 16);
    CHECK(n == 6, "records %d", n);
    if (n == 6) {
        CHECK(!strcmp(evs[0].file_version, "brain.Event:2") && evs[0].wall_time > 1e9, "file_version record");
        CHECK(evs[1].session_status == 1 && evs[1].step == 5, "session START at 5");
        for (int s = 5; s <= 7; s++) {
            event *e = &evs[s - 3];
            CHECK(e->step == s && e->wall_time == 1000.0 + s && e->n_values == 2, "step %d", s);
            CHECK(!strcmp(e->tags[0], "loss") && e->values[0] == 10.0f / (float)s, "loss %d", s);
            CHECK(!strcmp(e->tags[1], "lr") && e->values[1] == 1e-4f * (float)s, "lr %d", s);
        }
        CHECK(evs[5].step == 8 && evs[5].n_values == 1 && evs[5].values[0] == 3.25f &&
                  !strcmp(evs[5].tags[0], "validation_metrics/loss") && evs[5].wall_time > 1e9,
              "validation event");
    }
    /* any flipped bit is caught by one of the two CRCs */
    for (size_t i = 0; i < len; i += 7) {
        b[i] ^= 0x10;
        int r = read_events(b, len, evs, 16);
        b[i] ^= 0x10;
        if (r >= 0) {
            CHECK(0, "corruption at byte %zu not detected", i);
            break;
        }
    }
    /* a torn last record is a framing error, not a crash */
    CHECK(read_events(b, len - 3, evs, 16) == -1, "torn record");
    free(b);

    /* errors name the path */
    char file[512];
    snprintf(file, sizeof file, "%s/plainfile", root);
    FILE *f = fopen(file, "w");
    if (f) fclose(f);
    char bad[600];
    snprintf(bad, sizeof bad, "%s/sub", file);
    err[0] = '\0';
    w = tb_writer_open(bad, err, sizeof err);
    CHECK(w == NULL && strstr(err, bad) != NULL, "error names the path: %s", err);
    tb_writer_close(w);
}

static void test_grouping(void) {
    char b[64];
    CHECK(!strcmp(metrics_format_grouped(b, sizeof b, 1234567.0, 0), "1,234,567"), "%s", b);
    CHECK(!strcmp(metrics_format_grouped(b, sizeof b, 999.4, 0), "999"), "%s", b);
    CHECK(!strcmp(metrics_format_grouped(b, sizeof b, 999.5, 0), "1,000"), "%s", b);
    CHECK(!strcmp(metrics_format_grouped(b, sizeof b, 100000.0, 0), "100,000"), "%s", b);
    CHECK(!strcmp(metrics_format_grouped(b, sizeof b, 2.5, 0), "2"), "half to even like Python: %s", b);
    CHECK(!strcmp(metrics_format_grouped(b, sizeof b, 0.0, 2), "0.00"), "%s", b);
    CHECK(!strcmp(metrics_format_grouped(b, sizeof b, -1234.5678, 2), "-1,234.57"), "%s", b);
    CHECK(!strcmp(metrics_format_grouped(b, sizeof b, 123456.125, 2), "123,456.12"), "%s", b);
    CHECK(!strcmp(metrics_format_grouped(b, sizeof b, NAN, 0), "nan"), "%s", b);
    CHECK(!strcmp(metrics_format_grouped(b, sizeof b, -INFINITY, 2), "-inf"), "%s", b);
}

static int count_lines(const char *path, char lines[][512], int max) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0;
    char buf[512];
    while (fgets(buf, sizeof buf, f)) {
        if (n < max) snprintf(lines[n], 512, "%s", buf);
        n++;
    }
    fclose(f);
    return n;
}

static void test_jsonl(const char *root) {
    char dump[512], err[512], path[600];
    snprintf(dump, sizeof dump, "%s/run", root);
    metrics_logger *m = metrics_open_at(dump, 0, "tb", 0, 1, err, sizeof err);
    CHECK(m != NULL, "metrics_open: %s", err);
    if (!m) return;
    snprintf(path, sizeof path, "%s", metrics_jsonl_path(m));
    CHECK(metrics_tb_path(m) == NULL, "no TensorBoard file when off");
    for (int s = 1; s <= 6; s++) {
        metrics_step st = {.step = s,
                           .loss = 10.0 / 3.0 + s,
                           .max_loss = NAN,
                           .grad_norm = 0.1,
                           .lr = 8e-4,
                           .tps = 1234.5,
                           .tflops = 0.5,
                           .mfu = 1.0,
                           .mem_gib = 0.25,
                           .mem_pct = 1.5,
                           .step_time_s = 0.2,
                           .data_time_s = 0.01,
                           .tokens_seen = 2048 * s};
        metrics_log_step(m, &st);
    }
    metrics_log_validation(m, 6, 2.0 / 3.0, 0.5);
    metrics_close(m);

    char lines[16][512];
    int n = count_lines(path, lines, 16);
    CHECK(n == 7, "7 records, got %d", n);
    if (n == 7) {
        const char *lp = strstr(lines[0], "{\"step\":1,\"loss\":");
        CHECK(lp == lines[0] && strtod(lp + 17, NULL) == 10.0 / 3.0 + 1, "full precision: %s", lines[0]);
        CHECK(strstr(lines[0], "\"max_loss\":null") != NULL, "NaN as null: %s", lines[0]);
        CHECK(strstr(lines[0], "\"tokens_seen\":2048,") != NULL, "tokens_seen: %s", lines[0]);
        CHECK(strstr(lines[0], "\"lr\":0.0008,") != NULL, "shortest round trip: %s", lines[0]);
        const char *vp = strstr(lines[6], "{\"step\":6,\"validation_loss\":");
        CHECK(vp == lines[6] && strtod(vp + 28, NULL) == 2.0 / 3.0, "%s", lines[6]);
    }

    /* a torn trailing line from a crash */
    FILE *f = fopen(path, "a");
    if (f) {
        fputs("{\"step\":7,\"lo", f);
        fclose(f);
    }
    /* resume from a checkpoint at step 4: steps >= 5 are run again */
    m = metrics_open_at(dump, 0, "tb", 0, 5, err, sizeof err);
    CHECK(m != NULL, "reopen: %s", err);
    if (!m) return;
    metrics_step st = {.step = 5, .loss = 1.0, .max_loss = 1.0, .grad_norm = 1, .lr = 1, .tokens_seen = 1};
    metrics_log_step(m, &st);
    metrics_close(m);
    n = count_lines(path, lines, 16);
    CHECK(n == 5, "4 kept + 1 new, got %d", n);
    if (n == 5) {
        CHECK(strstr(lines[3], "{\"step\":4,") == lines[3], "%s", lines[3]);
        CHECK(strstr(lines[4], "{\"step\":5,\"loss\":1.0,\"max_loss\":1.0,") == lines[4], "%s", lines[4]);
    }
    /* plain metrics_open appends */
    m = metrics_open(dump, 0, NULL, 0, err, sizeof err);
    CHECK(m != NULL, "append open: %s", err);
    metrics_close(m);
    CHECK(count_lines(path, lines, 16) == 5, "append keeps records");

    /* a dump folder that cannot be created */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/plainfile/x", root);
    err[0] = '\0';
    m = metrics_open(bad, 1, "tb", 0, err, sizeof err);
    CHECK(m == NULL && strstr(err, bad), "error names the folder: %s", err);
    metrics_close(m);

    CHECK(metrics_peak_rss_bytes() > (1 << 20), "peak RSS %lld", (long long)metrics_peak_rss_bytes());
    CHECK(metrics_host_memory_bytes() > metrics_peak_rss_bytes(), "host memory %lld",
          (long long)metrics_host_memory_bytes());
}

int main(void) {
    const char *tmpdir = getenv("TMPDIR");
    char root[512];
    snprintf(root, sizeof root, "%s/tetra_tb_test_XXXXXX", tmpdir && tmpdir[0] ? tmpdir : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    test_crc32c();
    test_varint();
    test_encoding();
    test_long_tag_framing();
    test_file(root);
    test_grouping();
    test_jsonl(root);
    remove_tree(root);
    printf("test_tb_writer: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
