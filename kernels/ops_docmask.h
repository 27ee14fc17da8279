// kernels/ops_docmask.h — the document mask of the attention op (ops_attn_shape.doc),
// shared by the CPU kernels, the CUDA kernels and the op cost model, so all of them agree
// on which keys a query sees.
//
// A packed sequence's document ids are nondecreasing, so a document is a contiguous range
// of positions and, under the causal document mask, query position p sees exactly the
// keys [ops_doc_first(p), p]. Both ends of a document are found by binary search over the
// ids: O(log S) per block of queries or keys, never per score.
#ifndef TETRA_KERNELS_OPS_DOCMASK_H
#define TETRA_KERNELS_OPS_DOCMASK_H

#include <stdint.h>

#include "kernels/ops.h"

#ifdef __CUDACC__
#define TETRA_DOC_HD static __host__ __device__ __forceinline__
#else
#define TETRA_DOC_HD static inline
#endif

// First position of position p's document (ids nondecreasing over [0, p]).
TETRA_DOC_HD int ops_doc_first(const int32_t *doc, int p) {
    const int32_t id = doc[p];
    int lo = 0, hi = p; // the answer lies in [lo, hi]
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (doc[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// One past the last position of position p's document, n the sequence's length.
TETRA_DOC_HD int ops_doc_end(const int32_t *doc, int p, int n) {
    const int32_t id = doc[p];
    int lo = p + 1, hi = n; // the answer lies in [lo, hi]
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (doc[mid] > id) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

// The first key row of the call (0..sk) that query row i may see under the document mask
// of sequence b (0 without one): its document's start, in the key block's coordinates.
TETRA_DOC_HD int ops_doc_key_begin(const ops_attn_shape *s, int b, int i) {
    if (!s->doc) return 0;
    long long f = (long long)ops_doc_first(s->doc + (long long)b * s->doc_len, s->q_offset + i) - s->k_offset;
    return f < 0 ? 0 : (f > s->sk ? s->sk : (int)f);
}

// One past the last query row of the call (0..sq) that may see key row j of sequence b
// under the document mask (sq without one): the end of the key's document.
TETRA_DOC_HD int ops_doc_query_end(const ops_attn_shape *s, int b, int j) {
    if (!s->doc) return s->sq;
    long long e = (long long)ops_doc_end(s->doc + (long long)b * s->doc_len, s->k_offset + j, s->doc_len) - s->q_offset;
    return e < 0 ? 0 : (e > s->sq ? s->sq : (int)e);
}

#endif
