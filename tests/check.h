/* check.h — the one CHECK of the C tests.
 *
 * CHECK(cond, fmt, ...) counts a check; a failed one is counted and printed with its
 * file, line, condition and message, naming the MPI rank once the test sets check_rank.
 * A test's main ends with `return check_summary("test_name");`: the tally on stdout and
 * the exit status (1 when any check failed). */
#ifndef TETRA_TESTS_CHECK_H
#define TETRA_TESTS_CHECK_H

#include <stdio.h>

static int checks, failures;
static int check_rank = -1; /* MPI tests: this process's rank in the world */

static inline void check_failed(const char *file, int line, const char *cond) {
    failures++;
    if (check_rank >= 0) fprintf(stderr, "FAIL rank %d %s:%d: %s: ", check_rank, file, line, cond);
    else fprintf(stderr, "FAIL %s:%d: %s: ", file, line, cond);
}

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        checks++;                                                                                                      \
        if (!(cond)) {                                                                                                 \
            check_failed(__FILE__, __LINE__, #cond);                                                                   \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
        }                                                                                                              \
    } while (0)

static inline int check_summary(const char *name) {
    printf("%s: %d checks, %d failed\n", name, checks, failures);
    return failures ? 1 : 0;
}

#endif
