/* documents.h — a microbatch's document structure on the host: the checks and the RoPE
 * positions that document-masked attention and positions reset at document boundaries
 * need (llama3_acts_set_documents copies the results to the backend).
 *
 * doc [b, T] holds the document id of every GLOBAL position of each sequence (T = the
 * whole sequence; under context parallel every rank holds all of it, not only its
 * chunks). Ids are nondecreasing along a sequence: documents are packed end to end
 * (the loader's dl_next_docs gives them so). */
#ifndef TETRA_LLAMA3_DOCUMENTS_H
#define TETRA_LLAMA3_DOCUMENTS_H

#include <stddef.h>
#include <stdint.h>

/* 0 when every row of doc is nondecreasing; -1 with the row and position named. */
int llama3_doc_check(const int32_t *doc, int b, int T, char *err, size_t errlen);

/* pos[r, i] = the position of local row i of sequence r within its document: g minus the
 * first position of g's document, g = rows[i] (the row's global position; NULL: i). */
void llama3_doc_positions(const int32_t *doc, int b, int T, const int32_t *rows, int t, int32_t *pos);

/* The visible (query, key) pairs of one sequence under the causal document mask: the sum
 * of n(n+1)/2 over its documents (n their lengths in doc [T]). */
double llama3_doc_pairs(const int32_t *doc, int T);

#endif
