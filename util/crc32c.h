/* crc32c.h — CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the one
 * checksum of token shards, checkpoint chunks and TensorBoard records.
 *
 * crc32c(0, "123456789", 9) == 0xE3069283. Pieces chain: crc32c(crc32c(0, a,
 * na), b, nb) is the CRC of a ++ b. Uses the SSE4.2 instruction when the CPU
 * has it, else a slicing-by-8 table; both give the same value. Thread-safe. */
#ifndef TETRA_CRC32C_H
#define TETRA_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t crc32c(uint32_t crc, const void *data, size_t n);
/* The portable table path alone (tests compare it with the hardware path). */
uint32_t crc32c_sw(uint32_t crc, const void *data, size_t n);

#endif
