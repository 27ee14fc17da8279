/* thrift.h — a reader of the Thrift compact protocol over a bounded buffer.
 *
 * Parquet writes its footer (FileMetaData) and page headers in this encoding. The reader
 * never reads past its end, bounds every length and element count by the bytes left, and
 * limits nesting, so any byte string is safe to hand it: a malformed one sets `bad` and a
 * short reason, and every later call returns zero values without reading.
 *
 * Wire format (Apache Thrift, doc/specs/thrift-compact-protocol.md):
 *   - i16/i32/i64: zigzag, then unsigned LEB128 (var int);
 *   - binary/string: var int length, then the bytes;
 *   - double: 8 bytes little-endian;
 *   - struct: fields, each a header byte ddddtttt (dddd = field id delta 1..15; 0 = the
 *     id follows as a zigzag var int), then the value; a 0 byte ends the struct. Booleans
 *     live in the type nibble (1 true, 2 false) and have no value bytes;
 *   - list/set: a header byte sssstttt (ssss = size 0..14; 15 = a var int size follows),
 *     then the elements (booleans one byte each);
 *   - map: var int size, then (when not 0) a byte kkkkvvvv, then the pairs.
 */
#ifndef TETRA_THRIFT_H
#define TETRA_THRIFT_H

#include <stddef.h>
#include <stdint.h>

enum {
    THR_STOP = 0,
    THR_TRUE = 1,
    THR_FALSE = 2,
    THR_I8 = 3,
    THR_I16 = 4,
    THR_I32 = 5,
    THR_I64 = 6,
    THR_DOUBLE = 7,
    THR_BINARY = 8,
    THR_LIST = 9,
    THR_SET = 10,
    THR_MAP = 11,
    THR_STRUCT = 12,
    THR_UUID = 13
};

#define THR_MAX_DEPTH 64

typedef struct {
    const uint8_t *start, *p, *end;
    int bad;         /* set on the first malformed byte; sticky */
    const char *why; /* what was malformed (static text) */
    size_t bad_at;   /* offset from start where it was found */
    int depth;       /* structs entered and not yet left */
} thr_reader;

void thr_init(thr_reader *r, const void *data, size_t len);
size_t thr_offset(const thr_reader *r);

/* A struct's fields: thr_struct_begin, then thr_field until it returns 0 (the stop byte or
 * an error), then thr_struct_end. *id and *type describe the field; its value must be read
 * with the functions below or passed to thr_skip. A boolean field's value is its type
 * (THR_TRUE / THR_FALSE): read it with thr_bool_field. */
void thr_struct_begin(thr_reader *r, int16_t *last_id);
int thr_field(thr_reader *r, int16_t *last_id, int16_t *id, int *type);
void thr_struct_end(thr_reader *r);

/* An integer value of the field's type (i8, i16, i32 or i64); another type is malformed. */
int64_t thr_int(thr_reader *r, int type);
int thr_bool_field(int type); /* 1 for THR_TRUE, else 0 */
/* A binary value: pointer into the buffer and its length (NULL, 0 when malformed). */
const uint8_t *thr_binary(thr_reader *r, size_t *len);
/* A list or set header: element type and count (bounded by the bytes left). */
int64_t thr_list(thr_reader *r, int *elem_type);
/* Skip one value of the given type (structs, lists and maps recursively). */
void thr_skip(thr_reader *r, int type);

/* Mark the reader malformed with a reason (the caller's own checks). */
void thr_fail(thr_reader *r, const char *why);

#endif
