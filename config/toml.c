/* toml.c — TOML 1.0.0 parser (see toml.h for the contract).
 *
 * Structure: one up-front pass validates the encoding (UTF-8, no bare CR, no
 * control characters other than tab) and records where every line starts, so
 * the recursive-descent parser that follows never has to think about bytes it
 * may not see and can turn any offset into "line:col" with a binary search.
 *
 * Key lookups during the parse go through one hash index shared by all tables
 * (keyed by table pointer and key), so building a table of n keys is O(n)
 * rather than O(n^2). The index is dropped after the parse; toml_table_find()
 * on the finished tree scans, which is fine for configuration-sized tables.
 *
 * Redefinition rules are tracked with per-value flags:
 *   F_EXPLICIT  table defined by a [header] (or an element of [[header]])
 *   F_DOTTED    table defined by dotted keys (a.b = 1)
 *   F_INLINE    inline table, or any table inside one: immutable
 *   F_AOT       array created by [[header]]: the only kind that can be appended to
 * A table with none of the first three is implicit (created as the parent of a
 * header such as [a.b.c]) and may still be defined once, by a header or by
 * dotted keys.
 */
#include "config/toml.h"

#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define TOML_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TOML_PRINTF(a, b)
#endif

enum {
    F_EXPLICIT = 1u << 0,
    F_DOTTED = 1u << 1,
    F_INLINE = 1u << 2,
    F_AOT = 1u << 3,
};
/* The nesting depth of a value lives in the upper bits of flags; it bounds the
 * recursion of the parser, of toml_free() and of any consumer walking the tree. */
#define DEPTH_SHIFT 8u

typedef struct {
    toml_value *table;
    size_t idx;
    uint64_t hash;
} key_slot;

typedef struct {
    const char *s;
    size_t len;
    size_t pos;
    size_t *lines; /* byte offset at which each line starts */
    size_t nlines, lines_cap;
    key_slot *slots; /* open addressing, power-of-two size */
    size_t nslots, nused;
    char *err;
    size_t errlen;
    int failed;
    char decimal_point; /* of the C library's current locale, for strtod */
} parser;

typedef struct {
    char *s;
    size_t len;
    size_t pos;
} key_part;

typedef struct {
    key_part *v;
    size_t n, cap;
} key_path;

typedef struct {
    char *p;
    size_t n, cap;
} strbuf;

/* ------------------------------------------------------------------------ */
/* positions and errors                                                      */

static void pos_to_linecol(const parser *p, size_t pos, int *line, int *col) {
    if (p->nlines == 0) {
        *line = 1;
        *col = pos < (size_t)INT_MAX ? (int)pos + 1 : INT_MAX;
        return;
    }
    size_t lo = 0, hi = p->nlines;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->lines[mid] <= pos) lo = mid;
        else hi = mid;
    }
    size_t c = pos >= p->lines[lo] ? pos - p->lines[lo] + 1 : 1;
    *line = lo + 1 < (size_t)INT_MAX ? (int)(lo + 1) : INT_MAX;
    *col = c < (size_t)INT_MAX ? (int)c : INT_MAX;
}

static TOML_PRINTF(3, 4) int fail(parser *p, size_t pos, const char *fmt, ...) {
    if (p->failed) return -1;
    p->failed = 1;
    if (p->err && p->errlen) {
        int line, col;
        pos_to_linecol(p, pos, &line, &col);
        int k = snprintf(p->err, p->errlen, "%d:%d: ", line, col);
        if (k >= 0 && (size_t)k < p->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(p->err + k, p->errlen - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

static int oom(parser *p) { return fail(p, p->pos, "out of memory"); }

static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    size_t len;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
        len = 2, v = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3, v = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

/* Human-readable name of the character at pos, for "expected X but found Y". */
static const char *describe_at(const parser *p, size_t pos, char buf[32]) {
    if (pos >= p->len) return "end of file";
    unsigned char c = (unsigned char)p->s[pos];
    if (c == '\n' || c == '\r') return "end of line";
    if (c == '\t') return "a tab";
    if (c == ' ') return "a space";
    if (c > 0x20 && c < 0x7F) {
        snprintf(buf, 32, "'%c'", c);
        return buf;
    }
    uint32_t cp = c;
    if (c >= 0x80) utf8_decode((const unsigned char *)p->s + pos, p->len - pos, &cp);
    snprintf(buf, 32, "U+%04X", (unsigned)cp);
    return buf;
}

static int is_bare_char(int c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

/* Render a dotted key for messages: bare parts as-is, others quoted and escaped;
 * long keys are shortened so a hostile document cannot flood the message. */
static const char *format_key(const key_path *k, size_t upto, char *buf, size_t size) {
    size_t o = 0;
    int truncated = 0;
    for (size_t i = 0; i < upto && !truncated; i++) {
        const key_part *kp = &k->v[i];
        int bare = kp->len > 0;
        for (size_t j = 0; j < kp->len && bare; j++) bare = is_bare_char((unsigned char)kp->s[j]);
        char piece[16];
        if (i > 0 && o + 1 < size) buf[o++] = '.';
        if (!bare && o + 1 < size) buf[o++] = '"';
        for (size_t j = 0; j < kp->len; j++) {
            unsigned char c = (unsigned char)kp->s[j];
            size_t pl;
            if (c == '"' || c == '\\') pl = (size_t)snprintf(piece, sizeof piece, "\\%c", c);
            else if (c < 0x20 || c == 0x7F) pl = (size_t)snprintf(piece, sizeof piece, "\\u%04X", c);
            else piece[0] = (char)c, pl = 1;
            if (o + pl + 5 >= size) {
                truncated = 1;
                break;
            }
            memcpy(buf + o, piece, pl);
            o += pl;
        }
        if (!bare && !truncated && o + 1 < size) buf[o++] = '"';
    }
    if (truncated) {
        if (o > size - 4) o = size - 4;
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o < size ? o : size - 1] = '\0';
    return buf;
}

static const char *describe_value(const toml_value *v) {
    switch (v->type) {
    case TOML_STRING: return "a string";
    case TOML_INTEGER: return "an integer";
    case TOML_FLOAT: return "a float";
    case TOML_BOOLEAN: return "a boolean";
    case TOML_OFFSET_DATETIME: return "an offset date-time";
    case TOML_LOCAL_DATETIME: return "a local date-time";
    case TOML_LOCAL_DATE: return "a local date";
    case TOML_LOCAL_TIME: return "a local time";
    case TOML_ARRAY: return (v->flags & F_AOT) ? "an array of tables" : "an array";
    case TOML_TABLE: return (v->flags & F_INLINE) ? "an inline table" : "a table";
    }
    return "a value";
}

/* ------------------------------------------------------------------------ */
/* the up-front pass                                                         */

static int push_line(parser *p, size_t start) {
    if (p->nlines == p->lines_cap) {
        size_t cap = p->lines_cap ? p->lines_cap * 2 : 64;
        size_t *n = realloc(p->lines, cap * sizeof *n);
        if (!n) return oom(p);
        p->lines = n;
        p->lines_cap = cap;
    }
    p->lines[p->nlines++] = start;
    return 0;
}

static int scan_document(parser *p, size_t start) {
    const unsigned char *s = (const unsigned char *)p->s;
    if (push_line(p, start)) return -1;
    if (p->len >= 2 && ((s[0] == 0xFE && s[1] == 0xFF) || (s[0] == 0xFF && s[1] == 0xFE)))
        return fail(p, 0, "document starts with a UTF-16 byte order mark; TOML must be UTF-8");
    size_t i = start;
    while (i < p->len) {
        unsigned c = s[i];
        if (c >= 0x20 && c < 0x7F) {
            i++;
            continue;
        }
        if (c == '\n') {
            if (push_line(p, i + 1)) return -1;
            i++;
        } else if (c == '\t') {
            i++;
        } else if (c == '\r') {
            if (i + 1 >= p->len || s[i + 1] != '\n')
                return fail(p, i, "carriage return not followed by a line feed (a bare CR is not allowed)");
            i++;
        } else if (c < 0x80) {
            if (c == 0)
                return fail(p, i,
                            "NUL byte (U+0000) is not allowed in a TOML document "
                            "(write \\u0000 inside a basic string)");
            return fail(p, i,
                        "control character U+%04X is not allowed (only tab is; write it as "
                        "an escape such as \\u%04X inside a basic string)",
                        c, c);
        } else {
            uint32_t cp;
            size_t n = utf8_decode(s + i, p->len - i, &cp);
            if (!n) return fail(p, i, "invalid UTF-8 byte sequence (starting with byte 0x%02X)", c);
            i += n;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* values                                                                    */

static int depth_of(const toml_value *v) { return (int)(v->flags >> DEPTH_SHIFT); }

static toml_value *new_value(parser *p, toml_type t, size_t pos, int depth) {
    if (depth > TOML_MAX_DEPTH) {
        fail(p, pos, "nesting too deep: values may be nested at most %d levels of tables and arrays", TOML_MAX_DEPTH);
        return NULL;
    }
    toml_value *v = calloc(1, sizeof *v);
    if (!v) {
        oom(p);
        return NULL;
    }
    v->type = t;
    v->flags = (unsigned)depth << DEPTH_SHIFT;
    pos_to_linecol(p, pos, &v->line, &v->col);
    return v;
}

void toml_free(toml_value *v) {
    if (!v) return;
    switch (v->type) {
    case TOML_STRING: free(v->u.s.ptr); break;
    case TOML_ARRAY:
        for (size_t i = 0; i < v->u.arr.n; i++) toml_free(v->u.arr.items[i]);
        free(v->u.arr.items);
        break;
    case TOML_TABLE:
        for (size_t i = 0; i < v->u.tab.n; i++) {
            free(v->u.tab.entries[i].key);
            toml_free(v->u.tab.entries[i].value);
        }
        free(v->u.tab.entries);
        break;
    default: break;
    }
    free(v);
}

/* Takes ownership of v; frees it on failure. */
static int array_push(parser *p, toml_value *arr, toml_value *v) {
    if (arr->u.arr.n == arr->u.arr.cap) {
        size_t cap = arr->u.arr.cap ? arr->u.arr.cap * 2 : 4;
        toml_value **n = realloc(arr->u.arr.items, cap * sizeof *n);
        if (!n) {
            toml_free(v);
            return oom(p);
        }
        arr->u.arr.items = n;
        arr->u.arr.cap = cap;
    }
    arr->u.arr.items[arr->u.arr.n++] = v;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* the parse-time key index                                                  */

static uint64_t key_hash(const toml_value *t, const char *k, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)k[i];
        h *= 1099511628211ull;
    }
    h ^= (uint64_t)(uintptr_t)t * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return h;
}

static toml_entry *lookup(parser *p, toml_value *t, const char *k, size_t n) {
    if (!p->nslots) return NULL;
    uint64_t h = key_hash(t, k, n);
    size_t mask = p->nslots - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        key_slot *s = &p->slots[i];
        if (!s->table) return NULL;
        if (s->hash == h && s->table == t) {
            toml_entry *e = &t->u.tab.entries[s->idx];
            if (e->key_len == n && memcmp(e->key, k, n) == 0) return e;
        }
    }
}

static void index_put(parser *p, toml_value *t, size_t idx, uint64_t h) {
    size_t mask = p->nslots - 1;
    size_t i = (size_t)h & mask;
    while (p->slots[i].table) i = (i + 1) & mask;
    p->slots[i].table = t;
    p->slots[i].idx = idx;
    p->slots[i].hash = h;
}

static int index_grow(parser *p) {
    size_t n = p->nslots ? p->nslots * 2 : 256;
    key_slot *old = p->slots;
    size_t oldn = p->nslots;
    p->slots = calloc(n, sizeof *p->slots);
    if (!p->slots) {
        p->slots = old;
        return oom(p);
    }
    p->nslots = n;
    for (size_t i = 0; i < oldn; i++)
        if (old[i].table) index_put(p, old[i].table, old[i].idx, old[i].hash);
    free(old);
    return 0;
}

/* Append key -> v to table t. Takes ownership of v (freed on failure).
 * The caller has already checked that the key is absent. */
static int add_entry(parser *p, toml_value *t, key_part *kp, toml_value *v) {
    if ((p->nused + 1) * 2 > p->nslots && index_grow(p)) {
        toml_free(v);
        return -1;
    }
    if (t->u.tab.n == t->u.tab.cap) {
        size_t cap = t->u.tab.cap ? t->u.tab.cap * 2 : 4;
        toml_entry *n = realloc(t->u.tab.entries, cap * sizeof *n);
        if (!n) {
            toml_free(v);
            return oom(p);
        }
        t->u.tab.entries = n;
        t->u.tab.cap = cap;
    }
    char *key = malloc(kp->len + 1);
    if (!key) {
        toml_free(v);
        return oom(p);
    }
    memcpy(key, kp->s, kp->len);
    key[kp->len] = '\0';
    toml_entry *e = &t->u.tab.entries[t->u.tab.n];
    e->key = key;
    e->key_len = kp->len;
    pos_to_linecol(p, kp->pos, &e->line, &e->col);
    e->value = v;
    index_put(p, t, t->u.tab.n, key_hash(t, e->key, e->key_len));
    p->nused++;
    t->u.tab.n++;
    return 0;
}

static toml_value *new_table_in(parser *p, toml_value *parent, key_part *kp, unsigned flags, size_t pos) {
    toml_value *v = new_value(p, TOML_TABLE, pos, depth_of(parent) + 1);
    if (!v) return NULL;
    v->flags |= flags;
    if (add_entry(p, parent, kp, v)) return NULL;
    return v;
}

/* ------------------------------------------------------------------------ */
/* lexical helpers                                                           */

static int peek(const parser *p, size_t off) {
    size_t i = p->pos + off;
    return i < p->len ? (unsigned char)p->s[i] : -1;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t')) p->pos++;
}

static void skip_comment(parser *p) {
    while (p->pos < p->len && p->s[p->pos] != '\n' && p->s[p->pos] != '\r') p->pos++;
}

/* Whitespace, newlines and comments, as allowed between array elements. */
static void skip_ws_nl_comments(parser *p) {
    for (;;) {
        skip_ws(p);
        int c = peek(p, 0);
        if (c == '#') skip_comment(p);
        else if (c == '\n' || c == '\r') p->pos++; /* a CR is always followed by LF (checked up front) */
        else return;
    }
}

static int at_newline(const parser *p) {
    int c = peek(p, 0);
    return c == '\n' || c == '\r';
}

static int sb_reserve(parser *p, strbuf *b, size_t extra) {
    if (b->cap - b->n > extra) return 0;
    size_t cap = b->cap ? b->cap : 32;
    while (cap - b->n <= extra) cap *= 2;
    char *n = realloc(b->p, cap);
    if (!n) return oom(p);
    b->p = n;
    b->cap = cap;
    return 0;
}

static int sb_put(parser *p, strbuf *b, const char *s, size_t n) {
    if (sb_reserve(p, b, n)) return -1;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

static int sb_put_utf8(parser *p, strbuf *b, uint32_t cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp, n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12)), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18)), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    }
    return sb_put(p, b, u, n);
}

/* Make sure even an empty buffer is a valid NUL-terminated string. */
static int sb_finish(parser *p, strbuf *b) { return sb_reserve(p, b, 0) ? -1 : (b->p[b->n] = '\0', 0); }

/* ------------------------------------------------------------------------ */
/* strings                                                                   */

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* p->pos is at the backslash. */
static int parse_escape(parser *p, strbuf *b, int multiline) {
    size_t start = p->pos;
    int c = peek(p, 1);
    char ch;
    char dbuf[32];
    switch (c) {
    case 'b': ch = '\b'; break;
    case 't': ch = '\t'; break;
    case 'n': ch = '\n'; break;
    case 'f': ch = '\f'; break;
    case 'r': ch = '\r'; break;
    case '"': ch = '"'; break;
    case '\\': ch = '\\'; break;
    case 'u':
    case 'U': {
        int ndig = c == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int i = 0; i < ndig; i++) {
            int h = hexval(peek(p, 2 + (size_t)i));
            if (h < 0)
                return fail(p, p->pos + 2 + (size_t)i, "invalid \\%c escape: expected %d hexadecimal digits, found %s",
                            c, ndig, describe_at(p, p->pos + 2 + (size_t)i, dbuf));
            cp = cp * 16 + (uint32_t)h;
        }
        if (cp >= 0xD800 && cp <= 0xDFFF)
            return fail(p, start, "invalid escape \\%c%0*X: surrogate code points are not Unicode scalar values", c,
                        ndig, (unsigned)cp);
        if (cp > 0x10FFFF)
            return fail(p, start, "invalid escape \\%c%0*X: beyond the last Unicode code point U+10FFFF", c, ndig,
                        (unsigned)cp);
        p->pos += 2 + (size_t)ndig;
        return sb_put_utf8(p, b, cp);
    }
    default:
        if (multiline && (c == ' ' || c == '\t' || c == '\n' || c == '\r')) {
            /* Line-ending backslash: trims the newline and all whitespace after it. */
            size_t q = p->pos + 1;
            while (q < p->len && (p->s[q] == ' ' || p->s[q] == '\t')) q++;
            if (q >= p->len || (p->s[q] != '\n' && p->s[q] != '\r'))
                return fail(p, start,
                            "a backslash followed by whitespace must be the last thing on the line "
                            "(line-ending backslash)");
            while (q < p->len && (p->s[q] == ' ' || p->s[q] == '\t' || p->s[q] == '\n' || p->s[q] == '\r')) q++;
            p->pos = q;
            return 0;
        }
        if (c < 0) return fail(p, start, "unterminated string: backslash at end of file");
        return fail(p, start,
                    "invalid escape sequence: backslash followed by %s (valid escapes are "
                    "\\b \\t \\n \\f \\r \\\" \\\\ \\uXXXX \\UXXXXXXXX)",
                    describe_at(p, p->pos + 1, dbuf));
    }
    p->pos += 2;
    return sb_put(p, b, &ch, 1);
}

/* Basic ("...", """...""") or literal ('...', '''...''') string; p->pos at the
 * opening quote. Multi-line forms drop a newline right after the opening
 * delimiter and normalise CRLF to LF. */
static int parse_string(parser *p, strbuf *b, int quote, int multiline) {
    size_t open = p->pos;
    int line, col;
    p->pos += multiline ? 3 : 1;
    if (multiline) {
        if (peek(p, 0) == '\n') p->pos++;
        else if (peek(p, 0) == '\r') p->pos += 2;
    }
    for (;;) {
        if (p->pos >= p->len) {
            pos_to_linecol(p, open, &line, &col);
            if (multiline)
                return fail(p, p->pos, "unterminated multi-line string: opened at %d:%d with %c%c%c, never closed",
                            line, col, quote, quote, quote);
            return fail(p, p->pos, "unterminated string opened at %d:%d", line, col);
        }
        char c = p->s[p->pos];
        if (c == quote) {
            if (!multiline) {
                p->pos++;
                return sb_finish(p, b);
            }
            size_t q = 0;
            while (p->pos + q < p->len && p->s[p->pos + q] == quote) q++;
            if (q >= 3) {
                if (q > 5)
                    return fail(p, p->pos + 5,
                                "too many quotes: at most two %c may directly precede the closing %c%c%c", quote, quote,
                                quote, quote);
                if (sb_put(p, b, p->s + p->pos, q - 3)) return -1;
                p->pos += q;
                return sb_finish(p, b);
            }
            if (sb_put(p, b, p->s + p->pos, q)) return -1;
            p->pos += q;
            continue;
        }
        if (c == '\\' && quote == '"') {
            if (parse_escape(p, b, multiline)) return -1;
            continue;
        }
        if (c == '\n' || c == '\r') {
            if (!multiline) {
                pos_to_linecol(p, open, &line, &col);
                return fail(p, p->pos,
                            "string opened at %d:%d is not closed before the end of the line "
                            "(use %c%c%c for multi-line strings)",
                            line, col, quote, quote, quote);
            }
            p->pos += c == '\r' ? 2 : 1;
            if (sb_put(p, b, "\n", 1)) return -1;
            continue;
        }
        size_t st = p->pos;
        while (p->pos < p->len) {
            char d = p->s[p->pos];
            if (d == quote || d == '\n' || d == '\r' || (d == '\\' && quote == '"')) break;
            p->pos++;
        }
        if (sb_put(p, b, p->s + st, p->pos - st)) return -1;
    }
}

/* ------------------------------------------------------------------------ */
/* keys                                                                      */

static void key_path_free(key_path *k) {
    for (size_t i = 0; i < k->n; i++) free(k->v[i].s);
    free(k->v);
    k->v = NULL;
    k->n = k->cap = 0;
}

static int parse_simple_key(parser *p, key_part *out) {
    char dbuf[32];
    int c = peek(p, 0);
    strbuf b = {0};
    out->pos = p->pos;
    if (is_bare_char(c)) {
        size_t st = p->pos;
        while (p->pos < p->len && is_bare_char((unsigned char)p->s[p->pos])) p->pos++;
        if (sb_put(p, &b, p->s + st, p->pos - st)) goto bad;
    } else if (c == '"' || c == '\'') {
        if (peek(p, 1) == c && peek(p, 2) == c) {
            fail(p, p->pos, "multi-line strings cannot be used as keys");
            goto bad;
        }
        if (parse_string(p, &b, c, 0)) goto bad;
    } else {
        const char *hint = "";
        if (c == '=') hint = " (the key is missing)";
        else if (c == '.') hint = " (a key cannot start or end with a dot)";
        else if (c >= 0x80) hint = " (keys with non-ASCII characters must be quoted)";
        fail(p, p->pos, "expected a key but found %s%s", describe_at(p, p->pos, dbuf), hint);
        goto bad;
    }
    out->s = b.p;
    out->len = b.n;
    return 0;
bad:
    free(b.p);
    return -1;
}

static int parse_key(parser *p, key_path *k) {
    for (;;) {
        if (k->n == k->cap) {
            size_t cap = k->cap ? k->cap * 2 : 4;
            key_part *n = realloc(k->v, cap * sizeof *n);
            if (!n) return oom(p);
            k->v = n;
            k->cap = cap;
        }
        if (k->n >= TOML_MAX_DEPTH)
            return fail(p, p->pos, "key has too many dotted parts (at most %d)", TOML_MAX_DEPTH);
        key_part *kp = &k->v[k->n];
        kp->s = NULL;
        if (parse_simple_key(p, kp)) return -1;
        k->n++;
        size_t save = p->pos;
        skip_ws(p);
        if (peek(p, 0) != '.') {
            p->pos = save;
            return 0;
        }
        p->pos++;
        skip_ws(p);
    }
}

/* ------------------------------------------------------------------------ */
/* numbers                                                                   */

static int is_digit_base(int c, int base) {
    switch (base) {
    case 2: return c == '0' || c == '1';
    case 8: return c >= '0' && c <= '7';
    case 10: return c >= '0' && c <= '9';
    default: return hexval(c) >= 0;
    }
}

/* Digits with single underscores between them; returns the number of digits,
 * or -1 after reporting a misplaced underscore. */
static long scan_digits(parser *p, size_t tok, const char *s, size_t n, size_t *i, int base) {
    long count = 0;
    while (*i < n) {
        int c = (unsigned char)s[*i];
        if (is_digit_base(c, base)) {
            count++;
            (*i)++;
        } else if (c == '_') {
            if (count == 0 || *i + 1 >= n || !is_digit_base((unsigned char)s[*i + 1], base)) {
                fail(p, tok + *i, "'_' in a number must be between two digits");
                return -1;
            }
            (*i)++;
        } else {
            break;
        }
    }
    return count;
}

static int is_number_char(int c) { return is_bare_char(c) || c == '.' || c == '+'; }

/* A number token: its text s[0..n) at offset tok, ending at end, read up to i. */
typedef struct {
    const char *s;
    size_t tok, end, n, i;
    int neg, depth;
} num_tok;

static const char *const base_names[] = {[2] = "binary", [8] = "octal", [16] = "hexadecimal"};

static toml_value *number_value(parser *p, const num_tok *t, toml_type type) {
    toml_value *v = new_value(p, type, t->tok, t->depth);
    if (v) p->pos = t->end;
    return v;
}

static int int_out_of_range(parser *p, const num_tok *t) {
    fail(p, t->tok, "integer %.*s is out of range (it does not fit in a signed 64-bit integer)",
         (int)(t->n < 64 ? t->n : 64), t->s);
    return -1;
}

/* inf, nan with an optional sign */
static toml_value *parse_special_float(parser *p, const num_tok *t) {
    toml_value *v = number_value(p, t, TOML_FLOAT);
    if (!v) return NULL;
    double x = t->s[t->i] == 'i' ? HUGE_VAL : NAN;
    v->u.f = t->neg ? -x : x;
    if (t->neg && isnan(x)) v->u.f = copysign(NAN, -1.0);
    return v;
}

/* 0x, 0o, 0b integers: no sign, '_' between digits */
static toml_value *parse_prefixed_int(parser *p, num_tok *t) {
    static const char *const articles[] = {[2] = "a", [8] = "an", [16] = "a"};
    const char *s = t->s;
    const size_t n = t->n, tok = t->tok;
    size_t i = t->i;
    char dbuf[32];
    int base = s[i + 1] == 'x' ? 16 : s[i + 1] == 'o' ? 8 : 2;
    if (i) {
        fail(p, tok, "%s integers cannot have a sign", base_names[base]);
        return NULL;
    }
    i += 2;
    if (i >= n || !is_digit_base((unsigned char)s[i], base)) {
        fail(p, tok + i, "expected %s %s digit after '0%c' but found %s", articles[base], base_names[base], s[1],
             describe_at(p, tok + i, dbuf));
        return NULL;
    }
    uint64_t acc = 0;
    for (; i < n; i++) {
        int c = (unsigned char)s[i];
        if (c == '_') {
            if (i + 1 >= n || !is_digit_base((unsigned char)s[i + 1], base)) {
                fail(p, tok + i, "'_' in a number must be between two digits");
                return NULL;
            }
            continue;
        }
        if (!is_digit_base(c, base)) {
            fail(p, tok + i, "invalid %s digit %s", base_names[base], describe_at(p, tok + i, dbuf));
            return NULL;
        }
        uint64_t d = (uint64_t)hexval(c);
        if (acc > ((uint64_t)INT64_MAX - d) / (uint64_t)base) {
            int_out_of_range(p, t);
            return NULL;
        }
        acc = acc * (uint64_t)base + d;
    }
    toml_value *v = number_value(p, t, TOML_INTEGER);
    if (v) v->u.i = (int64_t)acc;
    return v;
}

/* The syntax of a decimal integer or float from t->i (the integer part's start):
 * 1 for a float, 0 for an integer, -1 with the error set. */
static int scan_decimal(parser *p, num_tok *t) {
    const char *s = t->s;
    const size_t n = t->n, tok = t->tok, int_start = t->i;
    size_t i = t->i;
    char dbuf[32];
    long nd = scan_digits(p, tok, s, n, &i, 10);
    if (nd < 0) return -1;
    if (nd == 0) {
        const char *hint = i < n && s[i] == '.' ? " (a float needs a digit before the decimal point)" : "";
        fail(p, tok + i, "expected a digit but found %s%s", describe_at(p, tok + i, dbuf), hint);
        return -1;
    }
    if (s[int_start] == '0' && nd > 1) {
        fail(p, tok + int_start, "leading zeros are not allowed in numbers");
        return -1;
    }
    int is_float = 0;
    if (i < n && s[i] == '.') {
        is_float = 1;
        i++;
        if (i >= n || !(s[i] >= '0' && s[i] <= '9')) {
            fail(p, tok + i, "expected a digit after the decimal point but found %s", describe_at(p, tok + i, dbuf));
            return -1;
        }
        if (scan_digits(p, tok, s, n, &i, 10) < 0) return -1;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        is_float = 1;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || !(s[i] >= '0' && s[i] <= '9')) {
            fail(p, tok + i, "expected a digit in the exponent but found %s", describe_at(p, tok + i, dbuf));
            return -1;
        }
        if (scan_digits(p, tok, s, n, &i, 10) < 0) return -1;
    }
    if (i != n) {
        const char *hint = "";
        if (s[i] == 'X' || s[i] == 'O' || s[i] == 'B') hint = " (the prefixes are lowercase: 0x, 0o, 0b)";
        else if (s[i] == '.') hint = " (a number has at most one decimal point, before any exponent)";
        fail(p, tok + i, "invalid character %s in number%s", describe_at(p, tok + i, dbuf), hint);
        return -1;
    }
    if (t->end < p->len && p->s[t->end] == ':' && !is_float) {
        fail(p, tok, "invalid time: hours, minutes and seconds need two digits each (HH:MM:SS)");
        return -1;
    }
    return is_float;
}

/* A checked decimal float: its digits without '_', with the locale's decimal point, to strtod. */
static toml_value *decimal_float(parser *p, const num_tok *t) {
    const char *s = t->s;
    const size_t n = t->n;
    char small[64];
    char *buf = n < sizeof small ? small : malloc(n + 1);
    if (!buf) {
        oom(p);
        return NULL;
    }
    size_t o = 0;
    for (size_t k = 0; k < n; k++) {
        if (s[k] == '_') continue;
        buf[o++] = s[k] == '.' ? p->decimal_point : s[k];
    }
    buf[o] = '\0';
    char *endp;
    double x = strtod(buf, &endp);
    int ok = endp == buf + o;
    if (buf != small) free(buf);
    if (!ok) {
        fail(p, t->tok, "invalid float");
        return NULL;
    }
    if (isinf(x)) {
        fail(p, t->tok, "float %.*s is out of range (too large for a 64-bit float)", (int)(n < 64 ? n : 64), s);
        return NULL;
    }
    toml_value *v = number_value(p, t, TOML_FLOAT);
    if (v) v->u.f = x;
    return v;
}

/* A checked decimal integer from int_start, within int64 (INT64_MIN when negative). */
static toml_value *decimal_int(parser *p, const num_tok *t, size_t int_start) {
    uint64_t acc = 0, limit = t->neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (size_t k = int_start; k < t->n; k++) {
        if (t->s[k] == '_') continue;
        uint64_t d = (uint64_t)(t->s[k] - '0');
        if (acc > (limit - d) / 10) {
            int_out_of_range(p, t);
            return NULL;
        }
        acc = acc * 10 + d;
    }
    toml_value *v = number_value(p, t, TOML_INTEGER);
    if (v) v->u.i = t->neg ? (acc == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)acc) : (int64_t)acc;
    return v;
}

static toml_value *parse_number(parser *p, int depth) {
    num_tok t = {p->s + p->pos, p->pos, p->pos, 0, 0, 0, depth};
    while (t.end < p->len && is_number_char((unsigned char)p->s[t.end])) t.end++;
    t.n = t.end - t.tok;
    if (t.n > 0 && (t.s[0] == '+' || t.s[0] == '-')) {
        t.neg = t.s[0] == '-';
        t.i = 1;
    }
    const char *s = t.s + t.i;
    if (t.n - t.i == 3 && (memcmp(s, "inf", 3) == 0 || memcmp(s, "nan", 3) == 0)) return parse_special_float(p, &t);
    if (t.i + 1 < t.n && s[0] == '0' && (s[1] == 'x' || s[1] == 'o' || s[1] == 'b')) return parse_prefixed_int(p, &t);
    const size_t int_start = t.i;
    const int is_float = scan_decimal(p, &t);
    if (is_float < 0) return NULL;
    return is_float ? decimal_float(p, &t) : decimal_int(p, &t, int_start);
}

/* ------------------------------------------------------------------------ */
/* date-times                                                                */

static int read_digits(const parser *p, size_t pos, int n, int *out) {
    int v = 0;
    for (int k = 0; k < n; k++) {
        size_t i = pos + (size_t)k;
        if (i >= p->len || p->s[i] < '0' || p->s[i] > '9') return -1;
        v = v * 10 + (p->s[i] - '0');
    }
    *out = v;
    return 0;
}

static int expect_char(parser *p, size_t pos, char c, const char *what) {
    char dbuf[32];
    if (pos < p->len && p->s[pos] == c) return 0;
    return fail(p, pos, "invalid %s: expected '%c' but found %s", what, c, describe_at(p, pos, dbuf));
}

static int read_field(parser *p, size_t pos, int n, int *out, const char *name, const char *what) {
    if (read_digits(p, pos, n, out) == 0) return 0;
    return fail(p, pos, "invalid %s: the %s must have exactly %d digits", what, name, n);
}

/* HH:MM:SS[.frac]; *i advances past it; frac receives up to 9 digits as written. */
static int parse_time_part(parser *p, size_t *i, toml_datetime *dt, char frac[10], const char *what) {
    if (read_field(p, *i, 2, &dt->hour, "hour", what) || expect_char(p, *i + 2, ':', what) ||
        read_field(p, *i + 3, 2, &dt->minute, "minute", what))
        return -1;
    if (*i + 5 >= p->len || p->s[*i + 5] != ':')
        return fail(p, *i + 5, "invalid %s: seconds are required (HH:MM:SS)", what);
    if (read_field(p, *i + 6, 2, &dt->second, "second", what)) return -1;
    if (dt->hour > 23) return fail(p, *i, "invalid %s: hour %02d is out of range (00-23)", what, dt->hour);
    if (dt->minute > 59) return fail(p, *i + 3, "invalid %s: minute %02d is out of range (00-59)", what, dt->minute);
    if (dt->second > 60) return fail(p, *i + 6, "invalid %s: second %02d is out of range (00-60)", what, dt->second);
    *i += 8;
    frac[0] = '\0';
    if (*i < p->len && p->s[*i] == '.') {
        size_t k = *i + 1, nd = 0;
        if (k >= p->len || p->s[k] < '0' || p->s[k] > '9')
            return fail(p, k, "invalid %s: expected digits after the decimal point in the seconds", what);
        int ns = 0;
        while (k < p->len && p->s[k] >= '0' && p->s[k] <= '9') {
            if (nd < 9) {
                frac[nd] = p->s[k];
                ns = ns * 10 + (p->s[k] - '0');
            }
            nd++;
            k++;
        }
        size_t kept = nd < 9 ? nd : 9;
        frac[kept] = '\0';
        for (size_t z = kept; z < 9; z++) ns *= 10;
        dt->nanosecond = ns;
        *i = k;
    }
    return 0;
}

/* Fixed-width decimal; callers have range-checked v, which keeps the output
 * within toml_datetime.text (longest: 1979-05-27T07:32:00.999999999-07:00). */
static char *put_digits(char *o, int v, int width) {
    for (int k = width - 1; k >= 0; k--) {
        o[k] = (char)('0' + v % 10);
        v /= 10;
    }
    return o + width;
}

static int days_in_month(int y, int m) {
    static const int d[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0)) return 29;
    return d[m - 1];
}

static toml_value *parse_datetime(parser *p, int depth, int time_only) {
    size_t start = p->pos, i = start;
    toml_datetime dt;
    char frac[10] = "";
    char off_sign = 0; /* '+' or '-' as written; 0 for Z */
    memset(&dt, 0, sizeof dt);
    toml_type type;
    if (time_only) {
        if (parse_time_part(p, &i, &dt, frac, "local time")) return NULL;
        type = TOML_LOCAL_TIME;
    } else {
        const char *what = "date";
        if (read_field(p, i, 4, &dt.year, "year", what) || expect_char(p, i + 4, '-', what) ||
            read_field(p, i + 5, 2, &dt.month, "month", what) || expect_char(p, i + 7, '-', what) ||
            read_field(p, i + 8, 2, &dt.day, "day", what))
            return NULL;
        if (dt.month < 1 || dt.month > 12) {
            fail(p, i + 5, "invalid date: month %02d is out of range (01-12)", dt.month);
            return NULL;
        }
        if (dt.day < 1 || dt.day > days_in_month(dt.year, dt.month)) {
            fail(p, i + 8, "invalid date: day %02d is out of range for %04d-%02d (01-%02d)", dt.day, dt.year, dt.month,
                 days_in_month(dt.year, dt.month));
            return NULL;
        }
        i += 10;
        type = TOML_LOCAL_DATE;
        int c = i < p->len ? (unsigned char)p->s[i] : -1;
        /* A space separates date and time only when a time follows; otherwise
         * the date ends there (e.g. before a comment). */
        int has_time = c == 'T' || c == 't' ||
            (c == ' ' && i + 3 < p->len && p->s[i + 1] >= '0' && p->s[i + 1] <= '9' && p->s[i + 2] >= '0' &&
             p->s[i + 2] <= '9' && p->s[i + 3] == ':');
        if (has_time) {
            i++;
            if (parse_time_part(p, &i, &dt, frac, "date-time")) return NULL;
            type = TOML_LOCAL_DATETIME;
            c = i < p->len ? (unsigned char)p->s[i] : -1;
            if (c == 'Z' || c == 'z') {
                i++;
                type = TOML_OFFSET_DATETIME;
            } else if (c == '+' || c == '-') {
                int oh = 0, om = 0;
                if (read_field(p, i + 1, 2, &oh, "offset hour", "date-time offset") ||
                    expect_char(p, i + 3, ':', "date-time offset") ||
                    read_field(p, i + 4, 2, &om, "offset minute", "date-time offset"))
                    return NULL;
                if (oh > 23 || om > 59) {
                    fail(p, i, "invalid date-time offset: %c%02d:%02d is out of range", c, oh, om);
                    return NULL;
                }
                dt.offset_minutes = (c == '-' ? -1 : 1) * (oh * 60 + om);
                off_sign = (char)c;
                i += 6;
                type = TOML_OFFSET_DATETIME;
            }
        }
    }
    toml_value *v = new_value(p, type, start, depth);
    if (!v) return NULL;
    char *o = dt.text;
    if (type != TOML_LOCAL_TIME) {
        o = put_digits(o, dt.year, 4);
        *o++ = '-';
        o = put_digits(o, dt.month, 2);
        *o++ = '-';
        o = put_digits(o, dt.day, 2);
        if (type != TOML_LOCAL_DATE) *o++ = 'T';
    }
    if (type != TOML_LOCAL_DATE) {
        o = put_digits(o, dt.hour, 2);
        *o++ = ':';
        o = put_digits(o, dt.minute, 2);
        *o++ = ':';
        o = put_digits(o, dt.second, 2);
        if (frac[0]) {
            *o++ = '.';
            for (const char *f = frac; *f; f++) *o++ = *f;
        }
    }
    if (type == TOML_OFFSET_DATETIME) {
        if (off_sign) {
            *o++ = off_sign;
            o = put_digits(o, abs(dt.offset_minutes) / 60, 2);
            *o++ = ':';
            o = put_digits(o, abs(dt.offset_minutes) % 60, 2);
        } else {
            *o++ = 'Z';
        }
    }
    *o = '\0';
    v->u.dt = dt;
    p->pos = i;
    return v;
}

/* ------------------------------------------------------------------------ */
/* values, arrays, inline tables                                             */

static toml_value *parse_value(parser *p, int depth);
static int parse_keyval(parser *p, toml_value *table);

static toml_value *parse_array(parser *p, int depth) {
    char dbuf[32];
    size_t open = p->pos;
    toml_value *arr = new_value(p, TOML_ARRAY, open, depth);
    if (!arr) return NULL;
    p->pos++;
    for (;;) {
        skip_ws_nl_comments(p);
        if (peek(p, 0) == ']') break;
        if (p->pos >= p->len) goto unterminated;
        toml_value *v = parse_value(p, depth + 1);
        if (!v || array_push(p, arr, v)) goto bad;
        skip_ws_nl_comments(p);
        int c = peek(p, 0);
        if (c == ',') {
            p->pos++;
            continue;
        }
        if (c == ']') break;
        if (c < 0) goto unterminated;
        fail(p, p->pos, "expected ',' or ']' after an array element but found %s", describe_at(p, p->pos, dbuf));
        goto bad;
    }
    p->pos++;
    return arr;
unterminated : {
    int line, col;
    pos_to_linecol(p, open, &line, &col);
    fail(p, p->pos, "unterminated array: '[' at %d:%d is never closed", line, col);
}
bad:
    toml_free(arr);
    return NULL;
}

static void seal_inline(toml_value *t) {
    t->flags |= F_INLINE;
    for (size_t i = 0; i < t->u.tab.n; i++) {
        toml_value *v = t->u.tab.entries[i].value;
        if (v->type == TOML_TABLE && !(v->flags & F_INLINE)) seal_inline(v);
    }
}

static toml_value *parse_inline_table(parser *p, int depth) {
    char dbuf[32];
    size_t open = p->pos;
    toml_value *t = new_value(p, TOML_TABLE, open, depth);
    if (!t) return NULL;
    p->pos++;
    skip_ws(p);
    if (peek(p, 0) == '}') {
        p->pos++;
        seal_inline(t);
        return t;
    }
    for (;;) {
        skip_ws(p);
        if (at_newline(p)) {
            fail(p, p->pos, "inline tables must be on a single line (use a [table] header for multi-line tables)");
            goto bad;
        }
        if (peek(p, 0) == '}') {
            fail(p, p->pos, "trailing comma in inline table (not allowed in TOML 1.0)");
            goto bad;
        }
        if (parse_keyval(p, t)) goto bad;
        skip_ws(p);
        int c = peek(p, 0);
        if (c == ',') {
            p->pos++;
            continue;
        }
        if (c == '}') {
            p->pos++;
            break;
        }
        if (c < 0) {
            int line, col;
            pos_to_linecol(p, open, &line, &col);
            fail(p, p->pos, "unterminated inline table: '{' at %d:%d is never closed", line, col);
        } else if (c == '\n' || c == '\r') {
            fail(p, p->pos, "inline tables must be on a single line (use a [table] header for multi-line tables)");
        } else {
            fail(p, p->pos, "expected ',' or '}' after a key/value pair in an inline table but found %s",
                 describe_at(p, p->pos, dbuf));
        }
        goto bad;
    }
    seal_inline(t);
    return t;
bad:
    toml_free(t);
    return NULL;
}

static toml_value *parse_string_value(parser *p, int depth) {
    int q = peek(p, 0);
    size_t start = p->pos;
    int multiline = peek(p, 1) == q && peek(p, 2) == q;
    strbuf b = {0};
    if (parse_string(p, &b, q, multiline)) {
        free(b.p);
        return NULL;
    }
    toml_value *v = new_value(p, TOML_STRING, start, depth);
    if (!v) {
        free(b.p);
        return NULL;
    }
    v->u.s.ptr = b.p;
    v->u.s.len = b.n;
    return v;
}

static toml_value *parse_word(parser *p, int depth) {
    size_t start = p->pos, end = start;
    while (end < p->len && is_bare_char((unsigned char)p->s[end])) end++;
    size_t n = end - start;
    const char *w = p->s + start;
    if ((n == 4 && memcmp(w, "true", 4) == 0) || (n == 5 && memcmp(w, "false", 5) == 0)) {
        toml_value *v = new_value(p, TOML_BOOLEAN, start, depth);
        if (!v) return NULL;
        v->u.b = n == 4;
        p->pos = end;
        return v;
    }
    if ((n == 3 && (memcmp(w, "inf", 3) == 0 || memcmp(w, "nan", 3) == 0))) return parse_number(p, depth);
    const char *hint = "strings must be quoted";
    char lw[8] = "";
    if (n < sizeof lw) {
        for (size_t k = 0; k < n; k++) lw[k] = (char)(w[k] >= 'A' && w[k] <= 'Z' ? w[k] - 'A' + 'a' : w[k]);
        lw[n] = '\0';
        if (!strcmp(lw, "true") || !strcmp(lw, "false")) hint = "booleans are written in lowercase: true, false";
        else if (!strcmp(lw, "inf") || !strcmp(lw, "nan")) hint = "special floats are written in lowercase: inf, nan";
    }
    fail(p, start, "invalid value '%.*s' (%s)", (int)(n < 40 ? n : 40), w, hint);
    return NULL;
}

static toml_value *parse_value(parser *p, int depth) {
    char dbuf[32];
    int c = peek(p, 0);
    if (depth > TOML_MAX_DEPTH) {
        fail(p, p->pos, "nesting too deep: values may be nested at most %d levels of tables and arrays",
             TOML_MAX_DEPTH);
        return NULL;
    }
    if (c == '"' || c == '\'') return parse_string_value(p, depth);
    if (c == '[') return parse_array(p, depth);
    if (c == '{') return parse_inline_table(p, depth);
    if (c >= '0' && c <= '9') {
        int d;
        if (read_digits(p, p->pos, 4, &d) == 0 && peek(p, 4) == '-') return parse_datetime(p, depth, 0);
        if (read_digits(p, p->pos, 2, &d) == 0 && peek(p, 2) == ':') return parse_datetime(p, depth, 1);
        return parse_number(p, depth);
    }
    if (c == '+' || c == '-') return parse_number(p, depth);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return parse_word(p, depth);
    const char *hint = "";
    if (c == '.') hint = " (a float needs a digit before the decimal point)";
    fail(p, p->pos, "expected a value but found %s%s", describe_at(p, p->pos, dbuf), hint);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* key/value pairs and table headers                                         */

/* Step into (or create) the table named by part i of a dotted key. */
static toml_value *descend_dotted(parser *p, toml_value *t, key_path *k, size_t i) {
    char kb[160], tb[160];
    key_part *kp = &k->v[i];
    toml_entry *e = lookup(p, t, kp->s, kp->len);
    if (!e) return new_table_in(p, t, kp, F_DOTTED, kp->pos);
    toml_value *v = e->value;
    if (v->type == TOML_TABLE) {
        if (v->flags & F_INLINE) {
            fail(p, kp->pos, "cannot add keys to inline table '%s' defined at %d:%d (inline tables are immutable)",
                 format_key(k, i + 1, kb, sizeof kb), e->line, e->col);
            return NULL;
        }
        if (v->flags & F_EXPLICIT) {
            fail(p, kp->pos, "cannot use dotted key '%s' to add to table '%s' already defined by a header at %d:%d",
                 format_key(k, k->n, kb, sizeof kb), format_key(k, i + 1, tb, sizeof tb), v->line, v->col);
            return NULL;
        }
        v->flags |= F_DOTTED;
        return v;
    }
    fail(p, kp->pos, "key '%s' is already defined as %s at %d:%d, so it cannot hold sub-keys",
         format_key(k, i + 1, kb, sizeof kb), describe_value(v), e->line, e->col);
    return NULL;
}

static int parse_keyval(parser *p, toml_value *table) {
    char kb[160], dbuf[32];
    key_path k = {0};
    int rc = -1;
    if (parse_key(p, &k)) goto out;
    skip_ws(p);
    if (peek(p, 0) != '=') {
        const char *hint = "";
        if (peek(p, 0) >= 0 && is_bare_char(peek(p, 0))) hint = " (bare keys cannot contain spaces; quote the key)";
        fail(p, p->pos, "expected '=' after key '%s' but found %s%s", format_key(&k, k.n, kb, sizeof kb),
             describe_at(p, p->pos, dbuf), hint);
        goto out;
    }
    p->pos++;
    skip_ws(p);
    toml_value *t = table;
    for (size_t i = 0; i + 1 < k.n; i++)
        if (!(t = descend_dotted(p, t, &k, i))) goto out;
    key_part *last = &k.v[k.n - 1];
    toml_entry *e = lookup(p, t, last->s, last->len);
    if (e) {
        fail(p, last->pos, "duplicate key '%s' (first defined at %d:%d)", format_key(&k, k.n, kb, sizeof kb), e->line,
             e->col);
        goto out;
    }
    if (p->pos >= p->len || at_newline(p)) {
        fail(p, p->pos, "expected a value after '=' for key '%s' but found %s", format_key(&k, k.n, kb, sizeof kb),
             describe_at(p, p->pos, dbuf));
        goto out;
    }
    toml_value *v = parse_value(p, depth_of(t) + 1);
    if (!v || add_entry(p, t, last, v)) goto out;
    rc = 0;
out:
    key_path_free(&k);
    return rc;
}

/* [a.b.c] or [[a.b.c]]: returns the table that following key/values go into. */
static toml_value *parse_header(parser *p, toml_value *root) {
    char kb[160], pb[160], dbuf[32];
    size_t start = p->pos;
    int is_array = peek(p, 1) == '[';
    const char *open = is_array ? "[[" : "[", *close = is_array ? "]]" : "]";
    key_path k = {0};
    toml_value *result = NULL;
    p->pos += is_array ? 2 : 1;
    skip_ws(p);
    if (peek(p, 0) == ']') {
        fail(p, p->pos, "empty table name in header");
        goto out;
    }
    if (parse_key(p, &k)) goto out;
    skip_ws(p);
    if (peek(p, 0) != ']' || (is_array && peek(p, 1) != ']')) {
        size_t at = peek(p, 0) == ']' ? p->pos + 1 : p->pos;
        fail(p, at, "expected '%s' to close the header %s%s but found %s", close, open,
             format_key(&k, k.n, kb, sizeof kb), describe_at(p, at, dbuf));
        goto out;
    }
    p->pos += is_array ? 2 : 1;

    toml_value *t = root;
    for (size_t i = 0; i + 1 < k.n; i++) {
        key_part *kp = &k.v[i];
        toml_entry *e = lookup(p, t, kp->s, kp->len);
        if (!e) {
            if (!(t = new_table_in(p, t, kp, 0, kp->pos))) goto out;
            continue;
        }
        toml_value *v = e->value;
        if (v->type == TOML_TABLE && !(v->flags & F_INLINE)) {
            t = v;
        } else if (v->type == TOML_ARRAY && (v->flags & F_AOT)) {
            t = v->u.arr.items[v->u.arr.n - 1];
        } else {
            const char *why = v->type == TOML_TABLE ? " (inline tables are immutable)"
                : v->type == TOML_ARRAY             ? " (only arrays of tables defined with [[...]] can be extended)"
                                                    : "";
            fail(p, kp->pos, "cannot define %s%s%s: '%s' is already defined as %s at %d:%d%s", open,
                 format_key(&k, k.n, kb, sizeof kb), close, format_key(&k, i + 1, pb, sizeof pb), describe_value(v),
                 e->line, e->col, why);
            goto out;
        }
    }
    key_part *last = &k.v[k.n - 1];
    toml_entry *e = lookup(p, t, last->s, last->len);
    format_key(&k, k.n, kb, sizeof kb);
    if (!is_array) {
        if (!e) {
            result = new_table_in(p, t, last, F_EXPLICIT, start);
            goto out;
        }
        toml_value *v = e->value;
        if (v->type == TOML_TABLE) {
            if (v->flags & F_INLINE)
                fail(p, start, "table [%s] is already defined as an inline table at %d:%d", kb, e->line, e->col);
            else if (v->flags & F_EXPLICIT)
                fail(p, start, "table [%s] is already defined at %d:%d", kb, v->line, v->col);
            else if (v->flags & F_DOTTED)
                fail(p, start, "table [%s] is already defined by dotted keys at %d:%d", kb, e->line, e->col);
            else {
                /* An implicit table (parent of an earlier header) is defined now. */
                v->flags |= F_EXPLICIT;
                pos_to_linecol(p, start, &v->line, &v->col);
                pos_to_linecol(p, last->pos, &e->line, &e->col);
                result = v;
            }
        } else if (v->type == TOML_ARRAY && (v->flags & F_AOT)) {
            fail(p, start, "table [%s] conflicts with the array of tables [[%s]] defined at %d:%d", kb, kb, v->line,
                 v->col);
        } else {
            fail(p, start, "cannot define table [%s]: the key is already defined as %s at %d:%d", kb, describe_value(v),
                 e->line, e->col);
        }
        goto out;
    }
    toml_value *arr;
    if (!e) {
        arr = new_value(p, TOML_ARRAY, start, depth_of(t) + 1);
        if (!arr) goto out;
        arr->flags |= F_AOT;
        if (add_entry(p, t, last, arr)) goto out;
    } else {
        arr = e->value;
        if (arr->type != TOML_ARRAY || !(arr->flags & F_AOT)) {
            const char *why = arr->type == TOML_ARRAY ? " (a static array cannot be appended to with [[...]])" : "";
            fail(p, start, "cannot define array of tables [[%s]]: the key is already defined as %s at %d:%d%s", kb,
                 describe_value(arr), e->line, e->col, why);
            goto out;
        }
    }
    toml_value *elem = new_value(p, TOML_TABLE, start, depth_of(arr) + 1);
    if (!elem) goto out;
    elem->flags |= F_EXPLICIT;
    if (array_push(p, arr, elem)) goto out;
    result = elem;
out:
    key_path_free(&k);
    return result;
}

static int expect_eol(parser *p, const char *what) {
    char dbuf[32];
    skip_ws(p);
    if (peek(p, 0) == '#') skip_comment(p);
    if (p->pos >= p->len || at_newline(p)) return 0;
    return fail(p, p->pos, "expected end of line after %s but found %s", what, describe_at(p, p->pos, dbuf));
}

static int parse_document(parser *p, toml_value *root) {
    toml_value *cur = root;
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len) return 0;
        int c = peek(p, 0);
        if (c == '\n' || c == '\r') {
            p->pos += c == '\r' ? 2 : 1;
            continue;
        }
        if (c == '#') {
            skip_comment(p);
            continue;
        }
        if (c == '[') {
            if (!(cur = parse_header(p, root)) || expect_eol(p, "the table header")) return -1;
        } else {
            if (parse_keyval(p, cur) || expect_eol(p, "the value")) return -1;
        }
    }
}

toml_value *toml_parse(const char *text, size_t len, char *err, size_t errlen) {
    parser p;
    memset(&p, 0, sizeof p);
    p.s = text ? text : "";
    p.len = text ? len : 0;
    p.err = err;
    p.errlen = errlen;
    if (err && errlen) err[0] = '\0';
    const char *dp = localeconv()->decimal_point;
    p.decimal_point = dp && dp[0] ? dp[0] : '.';

    size_t start = 0;
    if (p.len >= 3 && memcmp(p.s, "\xEF\xBB\xBF", 3) == 0) start = 3;
    toml_value *root = NULL;
    if (scan_document(&p, start) == 0) {
        p.pos = start;
        root = new_value(&p, TOML_TABLE, start, 0);
        if (root) parse_document(&p, root);
    }
    free(p.lines);
    free(p.slots);
    if (p.failed) {
        toml_free(root);
        return NULL;
    }
    return root;
}

/* ------------------------------------------------------------------------ */
/* accessors                                                                 */

const toml_entry *toml_table_find(const toml_value *table, const char *key) {
    if (!table || table->type != TOML_TABLE || !key) return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < table->u.tab.n; i++) {
        const toml_entry *e = &table->u.tab.entries[i];
        if (e->key_len == n && memcmp(e->key, key, n) == 0) return e;
    }
    return NULL;
}

const toml_value *toml_table_get(const toml_value *table, const char *key) {
    const toml_entry *e = toml_table_find(table, key);
    return e ? e->value : NULL;
}

size_t toml_array_len(const toml_value *arr) { return arr && arr->type == TOML_ARRAY ? arr->u.arr.n : 0; }

const toml_value *toml_array_get(const toml_value *arr, size_t i) {
    return arr && arr->type == TOML_ARRAY && i < arr->u.arr.n ? arr->u.arr.items[i] : NULL;
}

const char *toml_type_name(toml_type t) {
    switch (t) {
    case TOML_STRING: return "string";
    case TOML_INTEGER: return "integer";
    case TOML_FLOAT: return "float";
    case TOML_BOOLEAN: return "bool";
    case TOML_OFFSET_DATETIME: return "datetime";
    case TOML_LOCAL_DATETIME: return "datetime-local";
    case TOML_LOCAL_DATE: return "date-local";
    case TOML_LOCAL_TIME: return "time-local";
    case TOML_ARRAY: return "array";
    case TOML_TABLE: return "table";
    }
    return "unknown";
}

int toml_format_float(double v, char *buf, size_t n) {
    char tmp[40];
    if (isnan(v)) snprintf(tmp, sizeof tmp, "%s", signbit(v) ? "-nan" : "nan");
    else if (isinf(v)) snprintf(tmp, sizeof tmp, "%s", v < 0 ? "-inf" : "inf");
    else {
        /* Shortest %g precision that reads back as exactly v. */
        int prec = 1;
        for (; prec <= 17; prec++) {
            snprintf(tmp, sizeof tmp, "%.*g", prec, v);
            if (strtod(tmp, NULL) == v) break;
        }
        /* %g switches to an exponent at 10^prec ("1e+02" for 100); write
         * magnitudes below 1e16 positionally instead, with the same digits. */
        char *e = strchr(tmp, 'e');
        if (e && prec <= 17) {
            int x = atoi(e + 1);
            if (x >= 0 && x < 16) {
                char fixed[40];
                snprintf(fixed, sizeof fixed, "%.*f", prec - 1 - x > 0 ? prec - 1 - x : 0, v);
                if (strtod(fixed, NULL) == v) memcpy(tmp, fixed, sizeof tmp);
            }
        }
        /* Whatever the locale's decimal separator, TOML wants '.'. */
        int has_mark = 0;
        for (char *c = tmp; *c; c++) {
            if (*c == ',') *c = '.';
            if (*c == '.' || *c == 'e') has_mark = 1;
        }
        if (!has_mark) strcat(tmp, ".0");
    }
    return snprintf(buf, n, "%s", tmp);
}
