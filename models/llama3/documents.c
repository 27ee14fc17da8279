/* documents.c — see documents.h. */
#include "models/llama3/documents.h"

#include <stdio.h>

#include "kernels/ops_docmask.h"

int llama3_doc_check(const int32_t *doc, int b, int T, char *err, size_t errlen) {
    for (int r = 0; r < b; r++)
        for (int i = 1; i < T; i++)
            if (doc[(size_t)r * T + i] < doc[(size_t)r * T + i - 1]) {
                snprintf(err, errlen,
                         "document ids of sequence %d fall at position %d (%d after %d): ids must be "
                         "nondecreasing along a packed sequence",
                         r, i, doc[(size_t)r * T + i], doc[(size_t)r * T + i - 1]);
                return -1;
            }
    return 0;
}

double llama3_doc_pairs(const int32_t *doc, int T) {
    double p = 0.0;
    for (int i = 0, start = 0; i < T; i++) {
        if (i > 0 && doc[i] != doc[i - 1]) start = i;
        p += (double)(i - start + 1); /* token i sees its document's tokens up to itself */
    }
    return p;
}

void llama3_doc_positions(const int32_t *doc, int b, int T, const int32_t *rows, int t, int32_t *pos) {
    for (int r = 0; r < b; r++) {
        const int32_t *d = doc + (size_t)r * T;
        for (int i = 0; i < t; i++) {
            const int g = rows ? rows[i] : i;
            pos[(size_t)r * t + i] = g - ops_doc_first(d, g);
        }
    }
}
