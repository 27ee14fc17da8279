/* tb_writer.h — TensorBoard event files written by hand.
 *
 * A TensorBoard event file is a sequence of TFRecords
 *     u64 length (little endian) | u32 masked_crc32c(length bytes)
 *     | data[length] | u32 masked_crc32c(data)
 * with masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8 and CRC-32C
 * (Castagnoli). Each record's data is a protobuf `Event`:
 *     Event   { double wall_time = 1; int64 step = 2;
 *               oneof { string file_version = 3; Summary summary = 5;
 *                       SessionLog session_log = 7; } }
 *     Summary { repeated Value value = 1; }
 *     Value   { string tag = 1; float simple_value = 2; }
 *     SessionLog { SessionStatus status = 1; }   (START = 1)
 * The first record is Event{wall_time, file_version "brain.Event:2"}.
 *
 * The file is named events.out.tfevents.<unix time>.<hostname>.<pid>.<n>
 * (TensorBoard's pattern) inside the given folder, which is created if
 * missing. Records are flushed as they are written, so a crash loses at most
 * a partial last record, which TensorBoard skips. */
#ifndef TETRA_TB_WRITER_H
#define TETRA_TB_WRITER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct tb_writer tb_writer;

/* Creates `dir` (and its parents) if needed, opens a new event file there and
 * writes the file_version record. NULL on error, with a message naming the path. */
tb_writer *tb_writer_open(const char *dir, char *err, size_t errlen);
/* The event file's full path. */
const char *tb_writer_path(const tb_writer *w);
/* One Event holding n scalars (tags[i], values[i]) at `step`; wall_time in
 * seconds since the epoch (< 0: now). Returns 0, or -1 on an I/O error. */
int tb_writer_add_scalars(tb_writer *w, int64_t step, double wall_time, int n, const char *const *tags,
                          const float *values);
int tb_writer_add_scalar(tb_writer *w, int64_t step, double wall_time, const char *tag, float value);
/* Event{session_log{status START}} at `step`: on a restart, TensorBoard then
 * discards the events of earlier files whose step is >= step. */
int tb_writer_session_start(tb_writer *w, int64_t step, double wall_time);
int tb_writer_flush(tb_writer *w);
/* Flushes and closes; returns 0, or -1 if anything failed to reach the file. */
int tb_writer_close(tb_writer *w);

/* ---- building blocks (exposed for tests) ------------------------------- */
/* mkdir -p: 0, or -1 with errno set. */
int tb_make_dirs(const char *dir);
/* TFRecord's CRC mask over data/crc32c.h's CRC-32C, and its inverse. */
uint32_t tb_crc32c_mask(uint32_t crc);
uint32_t tb_crc32c_unmask(uint32_t masked);
/* Protobuf base-128 varint of v into out (at least 10 bytes); returns its length. */
size_t tb_put_varint(uint8_t *out, uint64_t v);
/* Writes one TFRecord framing `data`; 0 or -1. */
int tb_write_record(FILE *f, const void *data, size_t n);
/* Encodes the Event protos above into out (capacity cap); returns the encoded
 * length, which may exceed cap (then nothing beyond cap is written). */
size_t tb_encode_scalars_event(uint8_t *out, size_t cap, double wall_time, int64_t step, int n, const char *const *tags,
                               const float *values);

#endif
