/* err.h — the error message of a failed call: every module reports failure as
 * "return -1 with a message in err[errlen]", written by this one function. */
#ifndef TETRA_UTIL_ERR_H
#define TETRA_UTIL_ERR_H

#include <stddef.h>

/* printf into err (cut to errlen, always terminated); NULL or errlen 0: nothing */
void util_set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
