/* toml_fuzz.c — libFuzzer target for the TOML parser.
 *
 * For every input: parse it; on failure the message must be "LINE:COL: ..."
 * with a position inside the document; on success the tree must satisfy the
 * invariants below, and writing it back out as TOML (every table inline) must
 * parse again to an identical tree. Any violation aborts, which libFuzzer
 * reports as a crash with the input saved.
 */
#include "config/toml.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond)                                                                                                  \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);                               \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

static int valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (n - i < len) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((u[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (u[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

static int cmp_entries(const void *a, const void *b) {
    const toml_entry *x = *(const toml_entry *const *)a, *y = *(const toml_entry *const *)b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);
    return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

static void check_tree(const toml_value *v, int depth) {
    REQUIRE(depth <= TOML_MAX_DEPTH);
    REQUIRE(v->line >= 1 && v->col >= 1);
    switch (v->type) {
    case TOML_STRING:
        REQUIRE(v->u.s.ptr && v->u.s.ptr[v->u.s.len] == '\0');
        REQUIRE(valid_utf8(v->u.s.ptr, v->u.s.len));
        break;
    case TOML_INTEGER:
    case TOML_FLOAT:
    case TOML_BOOLEAN: REQUIRE(v->type != TOML_BOOLEAN || v->u.b == 0 || v->u.b == 1); break;
    case TOML_OFFSET_DATETIME:
    case TOML_LOCAL_DATETIME:
    case TOML_LOCAL_DATE:
    case TOML_LOCAL_TIME: {
        const toml_datetime *d = &v->u.dt;
        REQUIRE(memchr(d->text, '\0', sizeof d->text) != NULL);
        if (v->type != TOML_LOCAL_TIME)
            REQUIRE(d->year >= 0 && d->year <= 9999 && d->month >= 1 && d->month <= 12 && d->day >= 1 && d->day <= 31);
        if (v->type != TOML_LOCAL_DATE)
            REQUIRE(d->hour >= 0 && d->hour <= 23 && d->minute >= 0 && d->minute <= 59 && d->second >= 0 &&
                    d->second <= 60 && d->nanosecond >= 0 && d->nanosecond < 1000000000);
        if (v->type == TOML_OFFSET_DATETIME) REQUIRE(d->offset_minutes > -24 * 60 && d->offset_minutes < 24 * 60);
        break;
    }
    case TOML_ARRAY:
        REQUIRE(v->u.arr.n <= v->u.arr.cap);
        REQUIRE(toml_array_len(v) == v->u.arr.n && toml_array_get(v, v->u.arr.n) == NULL);
        for (size_t i = 0; i < v->u.arr.n; i++) {
            REQUIRE(v->u.arr.items[i] != NULL);
            REQUIRE(toml_array_get(v, i) == v->u.arr.items[i]);
            check_tree(v->u.arr.items[i], depth + 1);
        }
        break;
    case TOML_TABLE: {
        size_t n = v->u.tab.n;
        REQUIRE(n <= v->u.tab.cap);
        for (size_t i = 0; i < n; i++) {
            const toml_entry *e = &v->u.tab.entries[i];
            REQUIRE(e->key && e->key[e->key_len] == '\0' && e->value);
            REQUIRE(valid_utf8(e->key, e->key_len));
            REQUIRE(e->line >= 1 && e->col >= 1);
            if (strlen(e->key) == e->key_len) REQUIRE(toml_table_find(v, e->key) == e);
            check_tree(e->value, depth + 1);
        }
        if (n > 1) {
            const toml_entry **sorted = malloc(n * sizeof *sorted);
            REQUIRE(sorted != NULL);
            for (size_t i = 0; i < n; i++) sorted[i] = &v->u.tab.entries[i];
            qsort(sorted, n, sizeof *sorted, cmp_entries);
            for (size_t i = 1; i < n; i++)
                REQUIRE(cmp_entries(&sorted[i - 1], &sorted[i]) != 0); /* no duplicate keys */
            free(sorted);
        }
        break;
    }
    default: REQUIRE(!"unknown value type");
    }
}

/* ---- writing the tree back out as TOML ---------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
} out_buf;

static void put(out_buf *o, const char *s, size_t n) {
    if (o->cap - o->n < n + 1) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap - o->n < n + 1) cap *= 2;
        o->p = realloc(o->p, cap);
        REQUIRE(o->p != NULL);
        o->cap = cap;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
    o->p[o->n] = '\0';
}

static void puts_(out_buf *o, const char *s) { put(o, s, strlen(s)); }

static void put_quoted(out_buf *o, const char *s, size_t n) {
    put(o, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c;
            put(o, esc, 2);
        } else if (c < 0x20 || c == 0x7F) {
            snprintf(esc, sizeof esc, "\\u%04X", c);
            put(o, esc, 6);
        } else {
            put(o, (const char *)&s[i], 1);
        }
    }
    put(o, "\"", 1);
}

static void put_value(out_buf *o, const toml_value *v) {
    char buf[64];
    switch (v->type) {
    case TOML_STRING: put_quoted(o, v->u.s.ptr, v->u.s.len); break;
    case TOML_INTEGER:
        snprintf(buf, sizeof buf, "%" PRId64, v->u.i);
        puts_(o, buf);
        break;
    case TOML_FLOAT:
        toml_format_float(v->u.f, buf, sizeof buf);
        puts_(o, buf);
        break;
    case TOML_BOOLEAN: puts_(o, v->u.b ? "true" : "false"); break;
    case TOML_OFFSET_DATETIME:
    case TOML_LOCAL_DATETIME:
    case TOML_LOCAL_DATE:
    case TOML_LOCAL_TIME: puts_(o, v->u.dt.text); break;
    case TOML_ARRAY:
        puts_(o, "[");
        for (size_t i = 0; i < v->u.arr.n; i++) {
            if (i) puts_(o, ", ");
            put_value(o, v->u.arr.items[i]);
        }
        puts_(o, "]");
        break;
    case TOML_TABLE:
        puts_(o, "{");
        for (size_t i = 0; i < v->u.tab.n; i++) {
            if (i) puts_(o, ", ");
            put_quoted(o, v->u.tab.entries[i].key, v->u.tab.entries[i].key_len);
            puts_(o, " = ");
            put_value(o, v->u.tab.entries[i].value);
        }
        puts_(o, "}");
        break;
    }
}

static void write_doc(out_buf *o, const toml_value *root) {
    for (size_t i = 0; i < root->u.tab.n; i++) {
        put_quoted(o, root->u.tab.entries[i].key, root->u.tab.entries[i].key_len);
        puts_(o, " = ");
        put_value(o, root->u.tab.entries[i].value);
        puts_(o, "\n");
    }
}

static void same_tree(const toml_value *a, const toml_value *b) {
    REQUIRE(a->type == b->type);
    switch (a->type) {
    case TOML_STRING: REQUIRE(a->u.s.len == b->u.s.len && memcmp(a->u.s.ptr, b->u.s.ptr, a->u.s.len) == 0); break;
    case TOML_INTEGER: REQUIRE(a->u.i == b->u.i); break;
    case TOML_FLOAT:
        REQUIRE((isnan(a->u.f) && isnan(b->u.f)) || a->u.f == b->u.f);
        REQUIRE(!signbit(a->u.f) == !signbit(b->u.f));
        break;
    case TOML_BOOLEAN: REQUIRE(a->u.b == b->u.b); break;
    case TOML_OFFSET_DATETIME:
    case TOML_LOCAL_DATETIME:
    case TOML_LOCAL_DATE:
    case TOML_LOCAL_TIME:
        REQUIRE(strcmp(a->u.dt.text, b->u.dt.text) == 0);
        REQUIRE(a->u.dt.year == b->u.dt.year && a->u.dt.month == b->u.dt.month && a->u.dt.day == b->u.dt.day &&
                a->u.dt.hour == b->u.dt.hour && a->u.dt.minute == b->u.dt.minute && a->u.dt.second == b->u.dt.second &&
                a->u.dt.nanosecond == b->u.dt.nanosecond && a->u.dt.offset_minutes == b->u.dt.offset_minutes);
        break;
    case TOML_ARRAY:
        REQUIRE(a->u.arr.n == b->u.arr.n);
        for (size_t i = 0; i < a->u.arr.n; i++) same_tree(a->u.arr.items[i], b->u.arr.items[i]);
        break;
    case TOML_TABLE:
        REQUIRE(a->u.tab.n == b->u.tab.n);
        for (size_t i = 0; i < a->u.tab.n; i++) {
            const toml_entry *x = &a->u.tab.entries[i], *y = &b->u.tab.entries[i];
            REQUIRE(x->key_len == y->key_len && memcmp(x->key, y->key, x->key_len) == 0);
            same_tree(x->value, y->value);
        }
        break;
    }
}

static void check_error(const char *err, const uint8_t *data, size_t size) {
    /* "LINE:COL: message" with the position inside (or just past) the document. */
    char *end;
    long line = strtol(err, &end, 10);
    REQUIRE(end != err && *end == ':' && line >= 1);
    const char *c = end + 1;
    long col = strtol(c, &end, 10);
    REQUIRE(end != c && end[0] == ':' && end[1] == ' ' && end[2] != '\0' && col >= 1);
    long lines = 1;
    for (size_t i = 0; i < size; i++) lines += data[i] == '\n';
    REQUIRE(line <= lines);
    REQUIRE((size_t)col <= size + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    memset(err, 0x55, sizeof err);
    toml_value *root = toml_parse((const char *)data, size, err, sizeof err);
    if (!root) {
        REQUIRE(memchr(err, '\0', sizeof err) != NULL);
        check_error(err, data, size);
        return 0;
    }
    REQUIRE(root->type == TOML_TABLE);
    check_tree(root, 0);

    out_buf o = {0};
    write_doc(&o, root);
    char err2[256];
    toml_value *again = toml_parse(o.p ? o.p : "", o.n, err2, sizeof err2);
    if (!again) {
        fprintf(stderr, "re-parse of the written document failed: %s\n--- document ---\n%.*s\n", err2,
                (int)(o.n < 4000 ? o.n : 4000), o.p ? o.p : "");
        abort();
    }
    same_tree(root, again);
    toml_free(again);
    toml_free(root);
    free(o.p);
    return 0;
}
