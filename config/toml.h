/* toml.h — a TOML 1.0 parser (the whole spec) into an owned value tree.
 *
 * Contract:
 *   - toml_parse() takes a complete UTF-8 document (need not be NUL-terminated)
 *     and returns the root table, or NULL with "LINE:COL: message" in err.
 *     Lines and columns are 1-based; columns count bytes.
 *   - Every table entry remembers the line/column of its key, and every value
 *     the line/column where it starts, so callers (the config schema) can name
 *     "file:line" in their own errors.
 *   - Strings are stored decoded (escapes resolved), NUL-terminated, with an
 *     explicit length (they may contain U+0000 via \u0000).
 *   - Date-times keep their parsed fields and a canonical RFC 3339 rendering.
 *   - Table entries keep document order.
 */
#ifndef TETRA_TOML_H
#define TETRA_TOML_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    TOML_STRING,
    TOML_INTEGER,
    TOML_FLOAT,
    TOML_BOOLEAN,
    TOML_OFFSET_DATETIME, /* 1979-05-27T07:32:00Z, ...-07:00 */
    TOML_LOCAL_DATETIME,  /* 1979-05-27T07:32:00 */
    TOML_LOCAL_DATE,      /* 1979-05-27 */
    TOML_LOCAL_TIME,      /* 07:32:00.999 */
    TOML_ARRAY,
    TOML_TABLE,
} toml_type;

typedef struct {
    int year, month, day;     /* valid when the type has a date */
    int hour, minute, second; /* valid when the type has a time */
    int nanosecond;           /* fractional seconds, truncated to ns */
    int offset_minutes;       /* valid for TOML_OFFSET_DATETIME; Z = 0 */
    char text[48];            /* canonical RFC 3339 form, e.g. "1979-05-27T07:32:00.5-07:00" */
} toml_datetime;

typedef struct toml_value toml_value;

typedef struct {
    char *key; /* decoded key, NUL-terminated */
    size_t key_len;
    int line, col; /* position of the key in the document */
    toml_value *value;
} toml_entry;

struct toml_value {
    toml_type type;
    int line, col; /* where the value (or the table header) starts */
    union {
        struct {
            char *ptr;
            size_t len;
        } s;
        int64_t i;
        double f;
        int b;
        toml_datetime dt;
        struct {
            toml_value **items;
            size_t n, cap;
        } arr;
        struct {
            toml_entry *entries;
            size_t n, cap;
        } tab;
    } u;
    unsigned flags; /* parser-private bookkeeping (definition rules) */
};

/* Parse a document. Returns the root table, or NULL and an "L:C: message" in err. */
toml_value *toml_parse(const char *text, size_t len, char *err, size_t errlen);

/* Free a tree returned by toml_parse (NULL is fine). */
void toml_free(toml_value *v);

/* Table lookup by key (NULL when absent or v is not a table). A linear scan:
 * the parser indexes keys while it builds tables, but a finished tree is meant
 * for configuration-sized tables. Keys containing U+0000 cannot be found here;
 * walk u.tab.entries (key, key_len) for those. */
const toml_entry *toml_table_find(const toml_value *table, const char *key);
const toml_value *toml_table_get(const toml_value *table, const char *key);

/* Array access: length (0 when arr is not an array) and element i (NULL when
 * out of range or arr is not an array). */
size_t toml_array_len(const toml_value *arr);
const toml_value *toml_array_get(const toml_value *arr, size_t i);

/* Deepest nesting of tables and arrays a document may have; deeper documents
 * are rejected with an error instead of exhausting the stack. */
#define TOML_MAX_DEPTH 512

/* Write the shortest decimal text that reads back as exactly v and is itself a
 * valid TOML float ("0.1", "-0.0", "1e+300", "inf", "-inf", "nan"). Returns what
 * snprintf returns; 32 bytes are always enough. */
int toml_format_float(double v, char *buf, size_t n);

/* Name of a type as toml-test spells it ("string", "integer", "float", "bool",
 * "datetime", "datetime-local", "date-local", "time-local", "array", "table"). */
const char *toml_type_name(toml_type t);

#endif
