/* doclen.c — see doclen.h. */
#include "data/doclen.h"

#include <string.h>

int doclen_bucket(uint64_t n) {
    if (n == 0) n = 1;
    const int msb = 63 - __builtin_clzll(n);
    const int frac = (int)((msb >= 2 ? n >> (msb - 2) : n << (2 - msb)) & 3);
    const int b = 4 * msb + frac;
    return b < DOCLEN_BUCKETS ? b : DOCLEN_BUCKETS - 1;
}

uint64_t doclen_bucket_low(int b) {
    const int msb = b / 4, frac = b % 4;
    return msb >= 2 ? (uint64_t)(4 + frac) << (msb - 2) : (uint64_t)(4 + frac) >> (2 - msb);
}

void doclen_add(doclen_hist *h, uint64_t n) {
    if (!n) return;
    const int b = doclen_bucket(n);
    h->count[b]++;
    h->tokens[b] += n;
}

uint64_t doclen_documents(const doclen_hist *h) {
    uint64_t d = 0;
    for (int b = 0; b < DOCLEN_BUCKETS; b++) d += h->count[b];
    return d;
}

uint64_t doclen_tokens(const doclen_hist *h) {
    uint64_t t = 0;
    for (int b = 0; b < DOCLEN_BUCKETS; b++) t += h->tokens[b];
    return t;
}

double doclen_expected_pairs(const doclen_hist *h, int T) {
    const double total = (double)doclen_tokens(h);
    if (total <= 0.0 || T <= 0) return 0.0;
    double e = (double)T;
    for (int b = 0; b < DOCLEN_BUCKETS; b++) {
        if (!h->count[b]) continue;
        const double c = (double)h->count[b], m = (double)h->tokens[b] / c; /* the bucket's mean length */
        /* sum_{k=1}^{T-1} (T - k) c max(m - k, 0) / total, k up to min(T - 1, ceil(m) - 1) */
        const int kmax = m - 1.0 < T - 1 ? (int)(m - 1e-9) : T - 1;
        for (int k = 1; k <= kmax; k++) e += (double)(T - k) * c * (m - k) / total;
    }
    return e;
}
