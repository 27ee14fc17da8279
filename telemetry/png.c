/* png.c — RGB raster to PNG through libpng's simplified write API (see png.h),
 * which reports errors in the image struct instead of longjmp. */
#include "telemetry/png.h"

#include <errno.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int png_file_write_rgb(const char *path, const unsigned char *rgb, int width, int height, char *err, size_t errlen) {
    if (width < 1 || height < 1 || !rgb) {
        snprintf(err, errlen, "%s: cannot write an empty %d x %d image", path, width, height);
        return -1;
    }
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (!tmp) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    snprintf(tmp, n, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        free(tmp);
        return -1;
    }
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)width;
    img.height = (png_uint_32)height;
    img.format = PNG_FORMAT_RGB;
    int ok = png_image_write_to_stdio(&img, f, 0, rgb, 0, NULL);
    if (!ok) snprintf(err, errlen, "cannot write %s: libpng: %s", path, img.message);
    png_image_free(&img);
    if (fclose(f) != 0 && ok) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        ok = 0;
    }
    if (ok && rename(tmp, path) != 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        ok = 0;
    }
    if (!ok) remove(tmp);
    free(tmp);
    return ok ? 0 : -1;
}
