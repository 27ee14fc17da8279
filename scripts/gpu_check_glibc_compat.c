/* scripts/gpu_check_glibc_compat.c — arc4random, arc4random_buf and arc4random_uniform for
 * a machine whose glibc is older than 2.36, where they first appeared.
 *
 * Debian 12's libevent (which Open MPI links, so every tetra process loads it) calls them.
 * scripts/gpu_check --prepare marks the carried libevent's GLIBC_2.36 version reference weak
 * (a missing weak version is not an error for the dynamic loader) and builds this file into
 * compat/libtetra_glibc_compat.so; .gpu/env.sh preloads it where the machine's glibc is older
 * than 2.36. An unversioned definition satisfies the versioned reference once libc has none.
 * The bytes come from getrandom(2) (glibc 2.25), as glibc's own arc4random does. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

void arc4random_buf(void *buf, size_t n) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t k = getrandom(p, n, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            /* a kernel without getrandom: the device file */
            int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
            if (fd < 0) abort();
            while (n > 0) {
                k = read(fd, p, n);
                if (k <= 0) {
                    if (k < 0 && errno == EINTR) continue;
                    abort();
                }
                p += k;
                n -= (size_t)k;
            }
            close(fd);
            return;
        }
        p += k;
        n -= (size_t)k;
    }
}

uint32_t arc4random(void) {
    uint32_t x;
    arc4random_buf(&x, sizeof x);
    return x;
}

uint32_t arc4random_uniform(uint32_t upper) {
    if (upper < 2) return 0;
    uint32_t min = -upper % upper; /* 2^32 mod upper: below it, r % upper would be biased */
    for (;;) {
        uint32_t r = arc4random();
        if (r >= min) return r % upper;
    }
}
