/* thrift.c — the Thrift compact protocol reader (see thrift.h). */
#include "data/thrift.h"

#include <string.h>

void thr_init(thr_reader *r, const void *data, size_t len) {
    memset(r, 0, sizeof *r);
    r->start = r->p = data;
    r->end = r->p + len;
}

size_t thr_offset(const thr_reader *r) { return (size_t)(r->p - r->start); }

void thr_fail(thr_reader *r, const char *why) {
    if (r->bad) return;
    r->bad = 1;
    r->why = why;
    r->bad_at = thr_offset(r);
    r->p = r->end; /* nothing more is read */
}

static uint8_t get_byte(thr_reader *r) {
    if (r->bad) return 0;
    if (r->p >= r->end) {
        thr_fail(r, "truncated");
        return 0;
    }
    return *r->p++;
}

/* Unsigned LEB128 of at most 10 bytes (64 bits). */
static uint64_t varint(thr_reader *r) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        uint8_t b = get_byte(r);
        if (r->bad) return 0;
        if (shift == 63 && (b & 0x7E)) {
            thr_fail(r, "var int longer than 64 bits");
            return 0;
        }
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return v;
    }
    thr_fail(r, "var int longer than 10 bytes");
    return 0;
}

static int64_t zigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

int64_t thr_int(thr_reader *r, int type) {
    switch (type) {
    case THR_I8: return (int8_t)get_byte(r);
    case THR_I16: {
        int64_t v = zigzag(varint(r));
        if (v < INT16_MIN || v > INT16_MAX) thr_fail(r, "i16 out of range");
        return r->bad ? 0 : v;
    }
    case THR_I32: {
        int64_t v = zigzag(varint(r));
        if (v < INT32_MIN || v > INT32_MAX) thr_fail(r, "i32 out of range");
        return r->bad ? 0 : v;
    }
    case THR_I64: return zigzag(varint(r));
    default: thr_fail(r, "an integer field has another type"); return 0;
    }
}

int thr_bool_field(int type) { return type == THR_TRUE; }

const uint8_t *thr_binary(thr_reader *r, size_t *len) {
    uint64_t n = varint(r);
    *len = 0;
    if (r->bad) return NULL;
    if (n > (uint64_t)(r->end - r->p)) {
        thr_fail(r, "string longer than the bytes left");
        return NULL;
    }
    const uint8_t *s = r->p;
    r->p += n;
    *len = (size_t)n;
    return s;
}

int64_t thr_list(thr_reader *r, int *elem_type) {
    uint8_t h = get_byte(r);
    *elem_type = h & 0x0F;
    uint64_t n = h >> 4;
    if (n == 15) n = varint(r);
    if (r->bad) return 0;
    /* every element but a zero-size struct takes at least one byte; an empty struct takes
     * one (its stop byte) too */
    if (n > (uint64_t)(r->end - r->p)) {
        thr_fail(r, "list longer than the bytes left");
        return 0;
    }
    return (int64_t)n;
}

void thr_struct_begin(thr_reader *r, int16_t *last_id) {
    *last_id = 0;
    if (++r->depth > THR_MAX_DEPTH) thr_fail(r, "structs nested too deeply");
}

void thr_struct_end(thr_reader *r) {
    if (r->depth > 0) r->depth--;
}

int thr_field(thr_reader *r, int16_t *last_id, int16_t *id, int *type) {
    uint8_t h = get_byte(r);
    if (r->bad || h == 0) return 0;
    *type = h & 0x0F;
    unsigned delta = h >> 4;
    int64_t fid = delta ? (int64_t)*last_id + delta : thr_int(r, THR_I16);
    if (r->bad) return 0;
    if (fid < INT16_MIN || fid > INT16_MAX) {
        thr_fail(r, "field id out of range");
        return 0;
    }
    if (*type == THR_STOP || *type > THR_UUID) {
        thr_fail(r, "unknown field type");
        return 0;
    }
    *id = (int16_t)fid;
    *last_id = (int16_t)fid;
    return 1;
}

/* An element inside a list or map: booleans are one byte there. */
static void skip_elem(thr_reader *r, int type) {
    if (type == THR_TRUE || type == THR_FALSE) (void)get_byte(r);
    else thr_skip(r, type);
}

void thr_skip(thr_reader *r, int type) {
    if (r->bad) return;
    switch (type) {
    case THR_TRUE:
    case THR_FALSE: return;
    case THR_I8:
    case THR_I16:
    case THR_I32:
    case THR_I64: (void)thr_int(r, type); return;
    case THR_DOUBLE:
        if (r->end - r->p < 8) thr_fail(r, "truncated");
        else r->p += 8;
        return;
    case THR_UUID:
        if (r->end - r->p < 16) thr_fail(r, "truncated");
        else r->p += 16;
        return;
    case THR_BINARY: {
        size_t n;
        (void)thr_binary(r, &n);
        return;
    }
    case THR_LIST:
    case THR_SET: {
        int et;
        int64_t n = thr_list(r, &et);
        if (++r->depth > THR_MAX_DEPTH) thr_fail(r, "values nested too deeply");
        for (int64_t i = 0; i < n && !r->bad; i++) skip_elem(r, et);
        r->depth--;
        return;
    }
    case THR_MAP: {
        uint64_t n = varint(r);
        if (r->bad || n == 0) return;
        if (n > (uint64_t)(r->end - r->p)) {
            thr_fail(r, "map longer than the bytes left");
            return;
        }
        uint8_t kv = get_byte(r);
        if (++r->depth > THR_MAX_DEPTH) thr_fail(r, "values nested too deeply");
        for (uint64_t i = 0; i < n && !r->bad; i++) {
            skip_elem(r, kv >> 4);
            skip_elem(r, kv & 0x0F);
        }
        r->depth--;
        return;
    }
    case THR_STRUCT: {
        int16_t last, id;
        int t;
        thr_struct_begin(r, &last);
        while (thr_field(r, &last, &id, &t)) thr_skip(r, t);
        thr_struct_end(r);
        return;
    }
    default: thr_fail(r, "unknown value type"); return;
    }
}
