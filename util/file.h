/* file.h — the file helpers several folders need, written once. */
#ifndef TETRA_UTIL_FILE_H
#define TETRA_UTIL_FILE_H

#include <stddef.h>
#include <stdint.h>

/* n bytes at offset off of fd, through short reads and EINTR: 0, or -1 on an error or
 * the end of the file before n bytes. */
int util_pread_all(int fd, void *buf, size_t n, uint64_t off);
/* "dir/name" in malloc'd memory; NULL when out of memory. */
char *util_path_join(const char *dir, const char *name);
/* mkdir -p (mode 0755): 0 when path is a folder afterwards, else -1 with errno set. */
int util_mkdir_p(const char *path);

#endif
