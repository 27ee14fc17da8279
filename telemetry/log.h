/* log.h — TorchTitan-style log lines, one prefix per rank.
 *
 * "[tetra] 2026-11-22 06:24:21,123 - INFO - message". Under several ranks the
 * prefix carries the rank ("[tetra|rank 3]"). Errors go to stderr, the rest
 * to stdout; colours only on a terminal unless disabled (log_color_wanted). */
#ifndef TETRA_LOG_H
#define TETRA_LOG_H

#include <stddef.h>

void log_init(int rank, int world);
void log_set_color(int enabled);
/* Colour for output on fd: never with NO_COLOR set (any non-empty value); else as the
 * launcher says with TETRA_COLOR=0|1 (under mpirun a rank's stdout can be a pty while the
 * launcher's own output goes to a file: run_train.sh decides from its own stdout); else
 * when fd is a terminal. */
int log_color_wanted(int fd);
/* Print nothing; keep the first error or warning in buf (NUL-terminated) until
 * log_capture(NULL, 0) — for callers that run the trainer's set-up many times and
 * report its refusals themselves (`tetra plan`). */
void log_capture(char *buf, size_t n);
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
