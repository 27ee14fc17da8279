/* csv.h — schedules in PyTorch's CSV form (_dump_csv / _load_csv): one row per
 * rank, one cell per action in the string form of schedule.h, an empty cell for
 * an idle slot. compute_only holds compute actions and idle slots; compute_comms
 * is a lowered schedule (FSDP, send/receive and wait actions too). A schedule
 * written for TorchTitan (pipeline_parallel_schedule_csv) loads unchanged.
 */
#ifndef TETRA_PARALLEL_PP_CSV_H
#define TETRA_PARALLEL_PP_CSV_H

#include <stddef.h>
#include <stdio.h>

#include "parallel/pp/schedule.h"

typedef enum { PP_CSV_COMPUTE_ONLY = 0, PP_CSV_COMPUTE_COMMS } pp_csv_format;

/* Read `path`. The format is what the cells hold (any communication or FSDP
 * action makes it compute_comms), returned in *format. n_stages is the largest
 * stage + 1; n_microbatches must be given (the step's microbatches). Each row
 * must be a rank: exactly n_ranks rows. A compute_only schedule is validated
 * (pp_schedule_validate). NULL with an error naming the file, the rank (row), the
 * cell (1-based column) with its text, and the rule broken. */
pp_schedule *pp_csv_load(const char *path, int n_ranks, int n_microbatches, pp_csv_format *format, char *err,
                         size_t errlen);
/* Write every rank's list as one row (idle slots as empty cells). */
int pp_csv_write(const pp_schedule *s, FILE *f);
/* pp_csv_write to path through a temporary file and rename: a failed write
 * leaves an existing file as it was. 0, or -1 with the path and reason in err. */
int pp_csv_dump(const pp_schedule *s, const char *path, char *err, size_t errlen);

#endif
