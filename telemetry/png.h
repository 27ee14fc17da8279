/* png.h — write an 8-bit RGB raster as a PNG file (libpng). The file appears
 * whole or not at all: it is written under a temporary name and renamed. */
#ifndef TETRA_TELEMETRY_PNG_H
#define TETRA_TELEMETRY_PNG_H

#include <stddef.h>

/* rgb: width * height * 3 bytes, rows top to bottom. 0, or -1 with the path and
 * libpng's or the system's reason in err. */
int png_file_write_rgb(const char *path, const unsigned char *rgb, int width, int height, char *err, size_t errlen);

#endif
