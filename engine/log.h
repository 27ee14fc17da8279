/* log.h — TorchTitan-style log lines, one prefix per rank.
 *
 * "[tetra] 2026-11-22 06:24:21,123 - INFO - message". Under several ranks the
 * prefix carries the rank ("[tetra|rank 3]"). Errors go to stderr, the rest
 * to stdout; colours only on a terminal unless disabled. */
#ifndef TETRA_LOG_H
#define TETRA_LOG_H

void log_init(int rank, int world);
void log_set_color(int enabled);
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
