/* registry.c — the model families model.name can name: the built-in ones, and those
 * registered before the config is validated (the tests add their own). A new built-in
 * family adds its folder and one line here. */
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
        const size_t left = n - o;
        const size_t w = strlen(families[i]->name) + (i ? 2 : 0);
        if (w >= left) break;
        if (i) memcpy(buf + o, ", ", 2);
        memcpy(buf + o + (i ? 2 : 0), families[i]->name, strlen(families[i]->name) + 1);
        o += w;
    }
}
