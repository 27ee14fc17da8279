/* attention.c — the attention `tetra plan` plans with: the (query, key) pairs a
 * sequence leaves visible under the configured mask. Causal: T(T+1)/2. block_causal: the
 * expected pairs of a sequence cut from the training corpus's documents packed end to end
 * (data/doclen.h), from the document lengths `tetra data prepare` recorded in index.json,
 * or those of a Megatron dataset's index. A corpus without them (an older index, a
 * mixture, a missing folder) is planned as causal, and the source says so. */
#include <stdio.h>
#include <string.h>

#include "data/doclen.h"
#include "data/loader.h"
#include "data/megatron.h"
#include "data/shard.h"
#include "plan/estimate.h"
#include "models/llama3/family.h"

/* The training corpus's document lengths into h: 0, or -1 with why not in why. */
static int corpus_lengths(const tetra_config_values *c, doclen_hist *h, char *dir, size_t dn, char *why, size_t wn) {
    char err[768];
    memset(h, 0, sizeof *h);
    if (c->training.dataset_mix.n > 0) {
        snprintf(why, wn, "training.dataset_mix: the mixture's document lengths are not combined");
        return -1;
    }
    if (dl_resolve_dataset(c->training.dataset, c->training.dataset_path, dir, dn, err, sizeof err)) {
        snprintf(why, wn, "training.dataset: %s", err);
        return -1;
    }
    if (dl_is_megatron(dir)) {
        mg_dataset d;
        if (mg_open(&d, dir, err, sizeof err)) {
            snprintf(why, wn, "%s", err);
            return -1;
        }
        mg_doc_lengths(&d, h);
        mg_close(&d);
        return 0;
    }
    shard_index ix;
    if (shard_index_read(dir, &ix, err, sizeof err)) {
        snprintf(why, wn, "%s", err);
        return -1;
    }
    const shard_index_split *sp = shard_index_find(&ix, "train");
    int rc = -1;
    if (!sp || !sp->doc_lengths)
        snprintf(why, wn,
                 "%s/index.json records no document lengths (prepared before "
                 "`tetra data prepare` recorded them: prepare it again)",
                 dir);
    else *h = *sp->doc_lengths, rc = 0;
    shard_index_free(&ix);
    return rc;
}

void plan_attention_pairs(plan_result *out, const tetra_config_values *c, int T) {
    const llama3_args a = *llama3_args_of(&out->job.model);
    const double causal = 0.5 * (double)T * (T + 1.0);
    out->block_causal = a.attn_mask_type == LLAMA3_MASK_BLOCK_CAUSAL;
    out->attn_pairs_per_seq = causal;
    if (!out->block_causal) {
        snprintf(out->attn_source, sizeof out->attn_source, "causal mask");
        return;
    }
    doclen_hist h;
    char dir[4096] = "", why[1024] = "";
    if (corpus_lengths(c, &h, dir, sizeof dir, why, sizeof why) != 0 || !doclen_documents(&h)) {
        snprintf(out->attn_source, sizeof out->attn_source, "block_causal planned as causal: %s",
                 why[0] ? why : "the corpus has no documents");
        return;
    }
    out->attn_pairs_per_seq = doclen_expected_pairs(&h, T);
    snprintf(out->attn_source, sizeof out->attn_source,
             "block_causal on %s: %llu documents, mean %.0f tokens; %.4g pairs a sequence, %.1f%% of causal", dir,
             (unsigned long long)doclen_documents(&h), (double)doclen_tokens(&h) / (double)doclen_documents(&h),
             out->attn_pairs_per_seq, 100.0 * out->attn_pairs_per_seq / causal);
}
