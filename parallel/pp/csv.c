/* csv.c — schedules as PyTorch's CSV (see csv.h): what its csv.writer writes and
 * its csv.reader reads, for cells that never need quoting. */
#include "parallel/pp/csv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CELL_SHOW 48 /* a cell's text in messages, at most */

static char *read_file(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        char *nb = realloc(buf, 2 * cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    if (!buf) {
        fclose(f);
        snprintf(err, errlen, "%s: out of host memory", path);
        return NULL;
    }
    if (ferror(f)) {
        snprintf(err, errlen, "%s: read error: %s", path, strerror(errno));
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* One cell from *p up to a comma or the row's end; a quoted cell ("...", "" for a
 * quote) as csv.reader reads it. The text goes to out (NUL-terminated, cut at cap). */
static int next_cell(const char **p, const char *end, char *out, size_t cap) {
    const char *q = *p;
    size_t n = 0;
    if (q < end && *q == '"') {
        q++;
        for (;;) {
            if (q >= end) return -1; /* unterminated quote */
            if (*q == '"') {
                if (q + 1 < end && q[1] == '"') {
                    if (n + 1 < cap) out[n++] = '"';
                    q += 2;
                    continue;
                }
                q++;
                break;
            }
            if (n + 1 < cap) out[n++] = *q;
            q++;
        }
        /* text after the closing quote belongs to the cell too (csv.reader keeps it) */
    }
    while (q < end && *q != ',') {
        if (n + 1 < cap) out[n++] = *q;
        q++;
    }
    out[n] = '\0';
    *p = q;
    return 0;
}

typedef struct {
    const char *b, *e; /* one row, line end excluded */
} row_span;

pp_schedule *pp_csv_load(const char *path, int n_ranks, int n_microbatches, pp_csv_format *format, char *err,
                         size_t errlen) {
    size_t len = 0;
    char *text = read_file(path, &len, err, errlen);
    if (!text) return NULL;
    pp_schedule *s = NULL;
    row_span *rows = NULL;
    pp_action **cells = NULL;
    int *ncell = NULL, n_rows = 0;
    char cell[256];

    /* rows: LF or CRLF line ends; a final line end does not start another row */
    size_t cap_rows = 16;
    rows = malloc(cap_rows * sizeof *rows);
    if (!rows) goto oom;
    for (const char *p = text, *end = text + len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        if (e > p && e[-1] == '\r') e--;
        if ((size_t)n_rows == cap_rows) {
            row_span *nr = realloc(rows, 2 * cap_rows * sizeof *nr);
            if (!nr) goto oom;
            rows = nr;
            cap_rows *= 2;
        }
        rows[n_rows++] = (row_span){p, e};
        p = nl ? nl + 1 : end;
    }
    if (n_rows != n_ranks) {
        snprintf(err, errlen, "%s: %d rows, but a schedule has one row per pipeline rank (%d ranks)", path, n_rows,
                 n_ranks);
        goto fail;
    }
    if (n_microbatches < 1) {
        snprintf(err, errlen, "%s: the step's microbatches must be >= 1, got %d", path, n_microbatches);
        goto fail;
    }

    /* cells */
    cells = calloc((size_t)n_rows, sizeof *cells);
    ncell = calloc((size_t)n_rows, sizeof *ncell);
    if (!cells || !ncell) goto oom;
    int max_stage = -1, comms = 0;
    for (int r = 0; r < n_rows; r++) {
        const char *p = rows[r].b, *e = rows[r].e;
        int n = 1;
        for (const char *q = p; q < e; q++) n += *q == ',';
        if (p == e) n = 0; /* an empty line is a rank with no actions */
        cells[r] = malloc((size_t)(n ? n : 1) * sizeof **cells);
        if (!cells[r]) goto oom;
        for (int c = 0; n > 0; c++) {
            if (next_cell(&p, e, cell, sizeof cell)) {
                snprintf(err, errlen, "%s: rank %d (row %d), cell %d: a quote that is never closed", path, r, r + 1,
                         c + 1);
                goto fail;
            }
            pp_action *a = &cells[r][ncell[r]++];
            if (pp_action_parse(cell, a)) {
                snprintf(err, errlen,
                         "%s: rank %d (row %d), cell %d '%.*s': not an action (want {stage}{type}{microbatch} such as "
                         "0F3, {stage}{type} for UNSHARD/RESHARD/REDUCE_GRAD/WAIT_REDUCE_GRAD, "
                         "(a;b)OVERLAP_F_B, or an empty cell)",
                         path, r, r + 1, c + 1, CELL_SHOW, cell);
                goto fail;
            }
            if (a->type == PP_OVERLAP_F_B) {
                for (int k = 0; k < a->n_sub; k++)
                    if (a->sub[k].stage > max_stage) max_stage = a->sub[k].stage;
            } else if (a->stage > max_stage) {
                max_stage = a->stage;
            }
            if (a->type != PP_IDLE && !pp_action_is_compute(a->type)) comms = 1;
            if (a->type != PP_IDLE && a->type != PP_OVERLAP_F_B && a->mb >= n_microbatches) {
                snprintf(err, errlen,
                         "%s: rank %d (row %d), cell %d '%.*s': microbatch %d, but the step has %d (0..%d)", path, r,
                         r + 1, c + 1, CELL_SHOW, cell, a->mb, n_microbatches, n_microbatches - 1);
                goto fail;
            }
            if (p >= e) break;
            p++; /* the comma: another cell follows, empty if the row ends here */
        }
    }
    if (max_stage < 0) {
        snprintf(err, errlen, "%s: no actions in any row", path);
        goto fail;
    }
    if (comms) /* lowered lists hold no idle slots; empty cells at a row's end are tolerated */
        for (int r = 0; r < n_rows; r++) {
            while (ncell[r] > 0 && cells[r][ncell[r] - 1].type == PP_IDLE) ncell[r]--;
            for (int c = 0; c < ncell[r]; c++)
                if (cells[r][c].type == PP_IDLE) {
                    snprintf(err, errlen,
                             "%s: rank %d (row %d), cell %d '': an empty cell (idle slot) in a compute_comms schedule, "
                             "whose lists hold actions only",
                             path, r, r + 1, c + 1);
                    goto fail;
                }
        }

    s = pp_schedule_new(n_ranks, max_stage + 1, n_microbatches);
    if (!s) goto oom;
    for (int r = 0; r < n_rows; r++)
        for (int c = 0; c < ncell[r]; c++)
            if (pp_schedule_push_action(s, r, &cells[r][c])) goto oom;
    /* as PyTorch, either format goes through the schedule validator (it skips
     * communication and FSDP actions but for their stage) */
    int br, bp;
    char rule[300], txt[96];
    if (pp_schedule_validate_at(s, &br, &bp, rule, sizeof rule)) {
        if (br >= 0 && bp >= 0)
            snprintf(err, errlen, "%s: rank %d (row %d), cell %d '%.*s': %s", path, br, br + 1, bp + 1, CELL_SHOW,
                     pp_action_str(&s->acts[br][bp], txt, sizeof txt), rule);
        else if (br >= 0) snprintf(err, errlen, "%s: rank %d (row %d): %s", path, br, br + 1, rule);
        else snprintf(err, errlen, "%s: %s", path, rule);
        goto fail;
    }
    if (format) *format = comms ? PP_CSV_COMPUTE_COMMS : PP_CSV_COMPUTE_ONLY;
    goto done;
oom:
    snprintf(err, errlen, "%s: out of host memory", path);
fail:
    pp_schedule_free(s);
    s = NULL;
done:
    if (cells)
        for (int r = 0; r < n_rows; r++) free(cells[r]);
    free(cells);
    free(ncell);
    free(rows);
    free(text);
    return s;
}

int pp_csv_write(const pp_schedule *s, FILE *f) {
    char a[96];
    for (int r = 0; r < s->n_ranks; r++) {
        for (int i = 0; i < s->len[r]; i++) {
            if (i) fputc(',', f);
            fputs(pp_action_str(&s->acts[r][i], a, sizeof a), f);
        }
        fputc('\n', f);
    }
    return ferror(f) ? -1 : 0;
}

int pp_csv_dump(const pp_schedule *s, const char *path, char *err, size_t errlen) {
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (!tmp) {
        snprintf(err, errlen, "%s: out of host memory", path);
        return -1;
    }
    snprintf(tmp, n, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp); /* beside the target, so the rename stays on one file system */
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot create a temporary file beside it: %s", path, strerror(errno));
        free(tmp);
        return -1;
    }
    (void)fchmod(fd, 0644);
    FILE *f = fdopen(fd, "w");
    if (!f) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        free(tmp);
        return -1;
    }
    int bad = pp_csv_write(s, f);
    if (fflush(f) || fsync(fileno(f))) bad = 1;
    int e = errno;
    if (fclose(f)) bad = 1, e = errno;
    if (bad) {
        snprintf(err, errlen, "%s: write failed: %s", tmp, strerror(e));
        unlink(tmp);
        free(tmp);
        return -1;
    }
    if (rename(tmp, path)) {
        snprintf(err, errlen, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}
