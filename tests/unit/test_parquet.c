/* test_parquet.c — the Thrift compact protocol reader and the Parquet reader's refusals.
 *
 * Checks: zigzag var ints (i16, i32, i64, their ranges), field headers in short and long
 * form, list headers in short and long form, skipping every value type (booleans, bytes,
 * doubles, UUIDs, strings, nested lists, sets, maps and structs), the nesting limit, var
 * ints over 10 bytes, and that every strict prefix of a valid struct is refused without a
 * read past its end. The Parquet reader on images in memory: too short, wrong magic, a
 * footer length past the start, a footer of garbage; every refusal names the file.
 * (tests/sh/test_data_parquet.sh reads real files written by pyarrow.)
 *
 *   test_parquet --bench FILE [COLUMN]   time pq_read_column over every row group
 */
#include "data/parquet.h"
#include "data/thrift.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tests/check.h"

static void test_ints(void) {
    thr_reader r;
    static const uint8_t b[] = {0x01, 0xAC, 0x02, 0xFE, 0xFF, 0x03, 0xFF, 0xFF, 0xFF, 0xFF,
                                0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01, 0x80, 0x80, 0x04};
    thr_init(&r, b, sizeof b);
    CHECK(thr_int(&r, THR_I32) == -1, "zigzag 1 is -1");
    CHECK(thr_int(&r, THR_I32) == 150, "zigzag 300 is 150");
    CHECK(thr_int(&r, THR_I32) == 32767, "65534 is 32767");
    CHECK(thr_int(&r, THR_I64) == INT64_MIN, "the largest zigzag is INT64_MIN");
    CHECK(!r.bad && thr_offset(&r) == 16, "offset %zu", thr_offset(&r));
    CHECK(thr_int(&r, THR_I16) == 0 && r.bad, "65536 is no i16");
    static const uint8_t eleven[] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01};
    thr_init(&r, eleven, sizeof eleven);
    (void)thr_int(&r, THR_I64);
    CHECK(r.bad, "an 11-byte var int is refused");
    static const uint8_t big32[] = {0x80, 0x80, 0x80, 0x80, 0x10};
    thr_init(&r, big32, sizeof big32);
    (void)thr_int(&r, THR_I32);
    CHECK(r.bad, "2^31 is no i32");
    thr_init(&r, b, 0);
    CHECK(thr_int(&r, THR_I32) == 0 && r.bad && !strcmp(r.why, "truncated"), "empty");
    CHECK(thr_int(&r, THR_I32) == 0 && r.bad, "stays bad");
}

/* struct { 1: i32 5; 2: true; 20: string "ab"; 21: list<i64> [1,-1]; 22: list<bool> x20;
 *          23: struct { 1: double; 2: uuid; 3: map<i32,string>{7:"x"}; 4: set<byte> {} };
 *          24: false } */
static const uint8_t g_struct[] = {
    0x15, 0x0A,                  /* 1: i32 5 */
    0x11,                        /* 2: true */
    0x08, 0x28, 0x02, 'a',  'b', /* long form: type 8, id zigzag(20) = 40 */
    0x19, 0x26, 0x02, 0x01,      /* 21: list of 2 i64 */
    0x19, 0xF1, 0x14, 1,    1,    1,   1, 1,    1,    1, 1,  1,  1,  1,  1,  1,  1,
    1,    1,    1,    1,    1,    1,                                                 /* 22: 20 bools */
    0x1C,                                                                            /* 23: struct */
    0x17, 0,    0,    0,    0,    0,   0, 0xF0, 0x3F,                                /*   1: double 1.0 */
    0x1D, 1,    2,    3,    4,    5,   6, 7,    8,    9, 10, 11, 12, 13, 14, 15, 16, /* 2: uuid */
    0x1B, 0x01, 0x58, 0x0E, 0x01, 'x',                                               /*   3: map {7: "x"} */
    0x1A, 0x03,                                                                      /*   4: empty set of bytes */
    0x00,                                                                            /*   stop */
    0x12,                                                                            /* 24: false */
    0x00};

static void test_struct(void) {
    thr_reader r;
    int16_t last, id;
    int t, n = 0;
    thr_init(&r, g_struct, sizeof g_struct);
    thr_struct_begin(&r, &last);
    while (thr_field(&r, &last, &id, &t)) {
        n++;
        if (id == 1) CHECK(t == THR_I32 && thr_int(&r, t) == 5, "field 1");
        else if (id == 2) CHECK(thr_bool_field(t), "field 2 true");
        else if (id == 20) {
            size_t len;
            const uint8_t *s = thr_binary(&r, &len);
            CHECK(s && len == 2 && !memcmp(s, "ab", 2), "field 20");
        } else if (id == 21) {
            int et;
            CHECK(thr_list(&r, &et) == 2 && et == THR_I64, "list header");
            CHECK(thr_int(&r, et) == 1 && thr_int(&r, et) == -1, "list values");
        } else if (id == 24) CHECK(!thr_bool_field(t), "field 24 false");
        else thr_skip(&r, t);
    }
    thr_struct_end(&r);
    CHECK(!r.bad && n == 7 && thr_offset(&r) == sizeof g_struct, "%d fields, offset %zu, bad %d (%s)", n,
          thr_offset(&r), r.bad, r.why ? r.why : "");
    /* every strict prefix is refused, and nothing is read past it (ASan builds check) */
    int refused = 0;
    for (size_t k = 0; k < sizeof g_struct; k++) {
        uint8_t *cut = malloc(k ? k : 1);
        memcpy(cut, g_struct, k);
        thr_init(&r, cut, k);
        thr_skip(&r, THR_STRUCT);
        refused += r.bad;
        free(cut);
    }
    CHECK(refused == (int)sizeof g_struct, "%d of %zu prefixes refused", refused, sizeof g_struct);
}

static void test_limits(void) {
    thr_reader r;
    uint8_t deep[200];
    memset(deep, 0x1C, sizeof deep); /* struct field 1 inside struct field 1 ... */
    thr_init(&r, deep, sizeof deep);
    thr_skip(&r, THR_STRUCT);
    CHECK(r.bad && strstr(r.why, "nested"), "nesting limit: %s", r.why ? r.why : "none");
    static const uint8_t longlist[] = {0xF5, 0xFF, 0xFF, 0x03, 0x02};
    thr_init(&r, longlist, sizeof longlist);
    thr_skip(&r, THR_LIST);
    CHECK(r.bad && strstr(r.why, "list longer"), "a list longer than its bytes: %s", r.why ? r.why : "none");
    static const uint8_t badtype[] = {0x1E, 0x00};
    thr_init(&r, badtype, sizeof badtype);
    thr_skip(&r, THR_STRUCT);
    CHECK(r.bad, "field type 14 is refused");
    static const uint8_t longstr[] = {0x18, 0x7F, 'a'};
    thr_init(&r, longstr, sizeof longstr);
    thr_skip(&r, THR_STRUCT);
    CHECK(r.bad && strstr(r.why, "string longer"), "a string longer than its bytes");
}

static void expect_refused(const void *img, size_t n, const char *want) {
    char err[512] = "";
    pq_file *f = pq_open_mem(img, n, "img.parquet", "text", NULL, err, sizeof err);
    CHECK(!f && strstr(err, "img.parquet") && strstr(err, want), "want '%s', got '%s'", want, err);
    pq_close(f);
}

static void test_refusals(void) {
    expect_refused("PAR1", 4, "not a Parquet file (4 bytes");
    expect_refused("PAR1\0\0\0\0PAR2", 12, "wrong magic");
    expect_refused("PAR1\x05\0\0\0PARE", 12, "encrypted");
    expect_refused("PAR1\x05\0\0\0PAR1", 12, "footer length 5 is more than the 0 bytes");
    expect_refused("PAR1\xff\xff\x02\0\0\0PAR1", 14, "corrupt footer");
    expect_refused("PAR1\x00\x01\0\0\0PAR1", 13, "corrupt footer: no schema");
    char err[256] = "";
    CHECK(!pq_open("/nonexistent/x.parquet", "text", NULL, err, sizeof err) && strstr(err, "/nonexistent/x.parquet"),
          "%s", err);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int bench(const char *path, const char *column) {
    char err[1024];
    double t0 = now_s();
    pq_file *f = pq_open(path, column, NULL, err, sizeof err);
    if (!f) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    pq_column col;
    memset(&col, 0, sizeof col);
    uint64_t text = 0, peak = 0;
    int64_t rows = 0;
    for (int g = 0; g < pq_num_row_groups(f); g++) {
        if (pq_read_column(f, g, &col, err, sizeof err) != 0) {
            fprintf(stderr, "%s\n", err);
            pq_close(f);
            return 1;
        }
        text += col.text_bytes;
        rows += col.n;
        if (col.mem > peak) peak = col.mem;
    }
    double dt = now_s() - t0;
    printf("%s: column '%s', %d row groups (%s), %lld rows, %.1f MB of text in %.3f s: %.0f MB/s, %.0f rows/s; "
           "largest chunk held %.1f MB\n",
           path, column, pq_num_row_groups(f), pq_codec_name(f, 0), (long long)rows, (double)text / 1e6, dt,
           (double)text / 1e6 / dt, (double)rows / dt, (double)peak / 1e6);
    pq_column_free(&col);
    pq_close(f);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "--bench")) return bench(argv[2], argc > 3 ? argv[3] : "text");
    test_ints();
    test_struct();
    test_limits();
    test_refusals();
    printf("test_parquet: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
