// tests/unit/test_copy_2d.c — the CPU backend's copy_2d (one strided copy) against a
// copy per row (memcpy), byte for byte over the whole destination buffer:
// - odd widths and pitches, pitches larger than the width (gaps between rows), pitches
//   equal to it (one contiguous block), unaligned start addresses;
// - no rows or no width: nothing written;
// - bytes outside the copied rectangle (the gaps, before the first row, after the last)
//   keep their values, and the source is not written;
// - rows enough for the threaded path (OMP_NUM_THREADS from the test environment);
// - the two shapes tensor parallel uses (a rank's column block into the full rows, and
//   back), through the table that ops_get("cpu") returns.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/check.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static unsigned char rnd_byte(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (unsigned char)((rng_state * 2685821657736338717ull) >> 56);
}

static unsigned char *rnd_bytes(size_t n) {
    unsigned char *p = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) p[i] = rnd_byte();
    return p;
}

typedef struct {
    size_t width, dpitch, spitch, rows, doff, soff; // bytes; *off: start inside the buffer
} case_2d;

// Bytes a rectangle of `rows` rows at `pitch` apart touches, from its first byte.
static size_t span(size_t pitch, size_t width, size_t rows) { return rows ? (rows - 1) * pitch + width : 0; }

static void check_case(const tetra_ops *o, const case_2d *c) {
    const size_t guard = 67; // bytes after the last row that must stay as they were
    const size_t dn = c->doff + span(c->dpitch, c->width, c->rows) + guard;
    const size_t sn = c->soff + span(c->spitch, c->width, c->rows) + guard;
    unsigned char *src = rnd_bytes(sn), *src0 = malloc(sn), *dst = rnd_bytes(dn), *want = malloc(dn);
    memcpy(src0, src, sn);
    memcpy(want, dst, dn);
    for (size_t r = 0; r < c->rows; r++)
        memcpy(want + c->doff + r * c->dpitch, src + c->soff + r * c->spitch, c->width);
    o->copy_2d(dst + c->doff, c->dpitch, src + c->soff, c->spitch, c->width, c->rows);
    size_t diff = 0, first = dn;
    for (size_t i = 0; i < dn; i++)
        if (dst[i] != want[i]) {
            diff++;
            if (first == dn) first = i;
        }
    CHECK(diff == 0,
          "copy_2d width %zu dpitch %zu spitch %zu rows %zu (offsets %zu, %zu): %zu bytes differ, first at %zu",
          c->width, c->dpitch, c->spitch, c->rows, c->doff, c->soff, diff, first);
    CHECK(!memcmp(src, src0, sn), "copy_2d width %zu rows %zu wrote into its source", c->width, c->rows);
    free(src), free(src0), free(dst), free(want);
}

static void test_shapes(const tetra_ops *o) {
    const case_2d cases[] = {
        {1, 1, 1, 1, 0, 0},                                    // one byte
        {3, 7, 5, 11, 1, 3},                                   // odd everything, unaligned
        {13, 13, 29, 9, 0, 5},                                 // packed destination, gapped source
        {13, 31, 13, 9, 7, 0},                                 // gapped destination, packed source
        {100, 100, 100, 7, 2, 0},                              // both packed: one block
        {0, 16, 16, 5, 0, 0},                                  // no width
        {12, 16, 20, 0, 0, 0},                                 // no rows
        {0, 0, 0, 0, 0, 0},                                    // neither
        {4 * 129, 4 * 129 * 8, 4 * 129, 4099, 4 * 129 * 3, 0}, // a column block into full rows, threaded
        {4 * 129, 4 * 129, 4 * 129 * 8, 4099, 0, 4 * 129 * 5}, // and back
        {1001, 1027, 1003, 2111, 1, 1},                        // odd and threaded
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(o, &cases[i]);
}

// The tensor-parallel gather: each of P ranks' [N, Vl] blocks into columns of [N, P Vl],
// then a rank's columns taken back; floats reassemble exactly.
static void test_tp_shapes(const tetra_ops *o) {
    const size_t P = 3, N = 37, VL = 11, row = P * VL;
    float *staging = malloc(P * N * VL * 4), *full = malloc(N * row * 4), *back = malloc(N * VL * 4);
    for (size_t i = 0; i < P * N * VL; i++) staging[i] = (float)i;
    for (size_t q = 0; q < P; q++) o->copy_2d(full + q * VL, row * 4, staging + q * N * VL, VL * 4, VL * 4, N);
    int bad = 0;
    for (size_t i = 0; i < N; i++)
        for (size_t q = 0; q < P; q++)
            for (size_t j = 0; j < VL; j++) bad += full[i * row + q * VL + j] != staging[(q * N + i) * VL + j];
    CHECK(!bad, "column blocks gathered into full rows: %d values misplaced", bad);
    for (size_t q = 0; q < P; q++) {
        o->copy_2d(back, VL * 4, full + q * VL, row * 4, VL * 4, N);
        CHECK(!memcmp(back, staging + q * N * VL, N * VL * 4), "rank %zu's columns taken back", q);
    }
    free(staging), free(full), free(back);
}

int main(void) {
    char err[256] = "";
    const tetra_ops *o = ops_get("cpu", err, sizeof err);
    CHECK(o && o->copy_2d == cpu_copy_2d, "ops_get(cpu) has copy_2d: %s", err);
    if (!o || !o->copy_2d) return 1;
    test_shapes(o);
    test_tp_shapes(o);
    printf("test_copy_2d: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
