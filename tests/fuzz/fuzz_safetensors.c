/*
 * libFuzzer target for the safetensors reader: any input must be either
 * rejected with FB_ERR_CHECKPOINT and a message, or accepted with every
 * tensor readable within the file.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char msg[256];
    fb_st_file *f = NULL;
    int rc = fb_st_parse_buffer(data, size, &f, msg, sizeof msg);
    if (rc != 0) {
        if ((rc != FB_ERR_CHECKPOINT && rc != FB_ERR_NOMEM) || msg[0] == '\0') abort();
        return 0;
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < fb_st_count(f); i++) {
        const fb_st_tensor *t = fb_st_at(f, i);
        for (size_t b = 0; b < t->nbytes; b++)
            sum += t->data[b];
        if (t->dtype == FB_ST_F32 && t->numel <= 4096) {
            float *dst = malloc((size_t)t->numel * sizeof *dst + 1);
            if (dst && fb_st_get_f32(f, t->name, t->shape, t->ndim, dst, msg, sizeof msg) != 0)
                abort();
            free(dst);
        }
    }
    for (size_t i = 0; i < fb_st_metadata_count(f); i++) {
        const char *k, *v;
        if (fb_st_metadata_at(f, i, &k, &v) != 0 || fb_st_metadata_get(f, k) == NULL) abort();
    }
    fb_st_close(f);
    return (int)(sum & 0);
}
