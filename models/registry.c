/* registry.c — the model families model.name can name: the built-in ones, and those
 * registered before the config is validated (the tests add their own). A new built-in
 * family adds its folder and one line here. */
#include <stdio.h>
#include <string.h>

#include "models/llama3/family.h"
#include "models/model.h"

enum { MAX_FAMILIES = 16 };
static const model_family *families[MAX_FAMILIES] = {&llama3_family};
static int n_families = 1;

const model_family *model_family_find(const char *name) {
    for (int i = 0; name && i < n_families; i++)
        if (!strcmp(families[i]->name, name)) return families[i];
    return NULL;
}

int model_family_register(const model_family *f) {
    if (!f || !f->name || model_family_find(f->name) || n_families == MAX_FAMILIES) return -1;
    families[n_families++] = f;
    return 0;
}

void model_family_names(char *buf, size_t n) {
    size_t o = 0;
    if (n) buf[0] = 0;
    for (int i = 0; i < n_families && o < n; i++) {
        const int w = snprintf(buf + o, n - o, "%s%s", i ? ", " : "", families[i]->name);
        if (w < 0) break;
        o += (size_t)w;
    }
}
