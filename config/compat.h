/* compat.h — TorchTitan's other spellings of tetra's keys.
 *
 * A TorchTitan config carries keys from three eras: the 2024 argparse names
 * ([training] batch_size, [float8], [experimental] pipeline_parallel_degree), the
 * v0.2 TOML schema (tetra's own spelling, schema.def) and the 2026 Python
 * configs (training.num_tokens_per_microbatch_per_dp_rank, ...). This module holds
 * the table between them (docs/configs.md prints it):
 *
 *   - a key TorchTitan renamed or removed is refused by name, with its new home;
 *   - a key v0.2 moved is accepted in both places (debug.seed = training.seed), and
 *     a 2026 name is accepted where it converts exactly into tetra's keys;
 *   - a key with no meaning in C (data-loader workers, compile, TorchFT settings)
 *     is accepted and named in one notice line at start-up when it is set;
 *   - a key whose feature tetra does not have is refused when set, with the reason.
 */
#ifndef TETRA_CONFIG_COMPAT_H
#define TETRA_CONFIG_COMPAT_H

#include <stddef.h>

#include "config/config.h"

/* The message for a key tetra does not know but TorchTitan had ("section.key"): its
 * new home, or why it is gone. NULL when the key never existed in TorchTitan. */
const char *cfg_compat_renamed(const char *full_key);

/* A key tetra knows that a config must not carry in any form (TorchTitan deprecated it
 * and tetra has nothing to map it to): the reason, else NULL. */
const char *cfg_compat_retired(const char *full_key);

/* After the file and the command line: the moved keys and the 2026 names written into
 * tetra's keys. A moved key set in both places to different values, or a 2026 name
 * that does not convert exactly, is an error. */
int cfg_compat_resolve(tetra_config *c, char *err, size_t errlen);

/* The keys of TorchTitan features tetra does not have: refused when set, with why. */
int cfg_compat_check(const tetra_config *c, char *err, size_t errlen);

/* One line per key that is set but has no effect in tetra, e.g.
 * "training.dataloader.num_workers = 4 has no effect: ...": emit(line, ctx) each. */
void cfg_compat_notices(const tetra_config *c, void (*emit)(const char *line, void *ctx), void *ctx);

#endif
