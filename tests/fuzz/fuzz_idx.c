/*
 * libFuzzer target for the IDX reader: any input must be either rejected
 * with FB_ERR_DATA and a message, or accepted with a consistent shape.
 */
#include <stdint.h>
#include <stdlib.h>

#include "idx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char msg[256];
    fb_idx idx;
    int rc = fb_idx_parse_buffer(data, size, &idx, msg, sizeof msg);
    if (rc != 0) {
        if ((rc != FB_ERR_DATA && rc != FB_ERR_NOMEM) || msg[0] == '\0') abort();
        return 0;
    }
    int64_t n = 1;
    for (int i = 0; i < idx.ndim; i++)
        n *= idx.dims[i];
    if (n != idx.numel || idx.nbytes != (size_t)n * fb_idx_type_size(idx.type)) abort();
    fb_idx_free(&idx);
    return 0;
}
