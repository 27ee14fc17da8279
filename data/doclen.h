/* doclen.h — a corpus's document-length distribution, as `tetra data prepare` records it
 * in index.json (per split, "document_lengths"), and what it implies for attention under
 * a document mask: the expected (query, key) pairs a packed sequence leaves visible, which
 * `tetra plan` uses for block_causal models.
 *
 * Lengths count stored tokens (BOS and EOS included). They go into buckets of four per
 * octave (bucket b holds the lengths whose top three bits give b = 4 floor(log2 n) + the
 * next two bits), each with its document count and token sum, so the mean length in a
 * bucket is exact and its spread at most a quarter octave. */
#ifndef TETRA_DOCLEN_H
#define TETRA_DOCLEN_H

#include <stdint.h>

#define DOCLEN_BUCKETS 128 /* lengths 1 .. 2^32 */

typedef struct {
    uint64_t count[DOCLEN_BUCKETS];
    uint64_t tokens[DOCLEN_BUCKETS];
} doclen_hist;

int doclen_bucket(uint64_t n);
/* The smallest length bucket b holds. */
uint64_t doclen_bucket_low(int b);
void doclen_add(doclen_hist *h, uint64_t n);
uint64_t doclen_documents(const doclen_hist *h);
uint64_t doclen_tokens(const doclen_hist *h);

/* The expected visible (query, key) pairs of one sequence of T tokens under the causal
 * document mask, the documents packed end to end and the sequence cut from the stream at
 * an arbitrary offset (the loader's windows), each bucket's documents taken at its mean
 * length. A token i places into its sequence sees min(A, i) + 1 keys, A its offset in its
 * document, whose distribution over the stream is P(A >= k) = sum over documents of
 * max(n - k, 0) / tokens; so E = T + sum_{k=1}^{T-1} (T - k) P(A >= k). T(T+1)/2 for
 * documents much longer than T, T for documents of one token. 0 for an empty histogram. */
double doclen_expected_pairs(const doclen_hist *h, int T);

#endif
