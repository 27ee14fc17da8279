#include "engine/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int log_rank = 0, log_world = 1, log_color = -1;
static char *cap_buf;
static size_t cap_n;

void log_capture(char *buf, size_t n) {
    cap_buf = n ? buf : NULL;
    cap_n = n;
    if (cap_buf) cap_buf[0] = 0;
}

void log_init(int rank, int world) {
    log_rank = rank;
    log_world = world;
}

void log_set_color(int enabled) { log_color = enabled; }

int log_color_wanted(int fd) {
    const char *no = getenv("NO_COLOR");
    if (no && no[0]) return 0;
    const char *tc = getenv("TETRA_COLOR");
    if (tc && (!strcmp(tc, "0") || !strcmp(tc, "1"))) return tc[0] == '1';
    return isatty(fd);
}

static void emit(FILE *f, const char *level, const char *color, const char *fmt, va_list ap) {
    if (cap_buf) {
        /* the first error or warning is the one that explains */
        if (f == stderr && !cap_buf[0]) vsnprintf(cap_buf, cap_n, fmt, ap);
        return;
    }
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    localtime_r(&tv.tv_sec, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &tm);
    int use_color = log_color < 0 ? log_color_wanted(fileno(f)) : log_color;
    char prefix[48];
    if (log_world > 1) snprintf(prefix, sizeof prefix, "[tetra|rank %d]", log_rank);
    else snprintf(prefix, sizeof prefix, "[tetra]");
    if (use_color) fprintf(f, "%s%s %s,%03d - %s - ", color, prefix, ts, (int)(tv.tv_usec / 1000), level);
    else fprintf(f, "%s %s,%03d - %s - ", prefix, ts, (int)(tv.tv_usec / 1000), level);
    vfprintf(f, fmt, ap);
    fputs(use_color ? "\033[0m\n" : "\n", f);
    fflush(f);
}

void log_info(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit(stdout, "INFO", "\033[0m", fmt, ap);
    va_end(ap);
}

void log_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit(stderr, "WARNING", "\033[33m", fmt, ap);
    va_end(ap);
}

void log_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit(stderr, "ERROR", "\033[31m", fmt, ap);
    va_end(ap);
}
