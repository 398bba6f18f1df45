/*
 * libFuzzer target for the shard reader: any input must be rejected with
 * FB_ERR_DATA and a message, or accepted with an index and chunks that agree
 * with the header.  Every chunk of an accepted shard is read.  (The manifest
 * parser has its own target, fuzz_manifest.)
 */
#include <stdint.h>
#include <stdlib.h>

#include "shard.h"

static void fail_unless(int ok)
{
    if (!ok) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char msg[256];
    fb_shard_reader *r = NULL;
    int rc = fb_shard_open_buffer(&r, data, size, "fuzz", msg, sizeof msg);
    if (rc) {
        fail_unless((rc == FB_ERR_DATA || rc == FB_ERR_NOMEM) && msg[0] != '\0');
        return 0;
    }
    const fb_shard_meta *m = fb_shard_get_meta(r);
    fail_unless(m->records >= m->chunks && m->chunks >= 1 && m->bytes == size);
    fb_shard_scratch *s = fb_shard_scratch_new();
    fail_unless(s != NULL);
    int64_t records = 0;
    for (int64_t c = 0; c < m->chunks; c++) {
        const fb_shard_chunk_entry *e = fb_shard_get_chunk(r, c);
        fail_unless(e != NULL && e->first_record == records && e->offset + e->stored <= size);
        records += e->records;
        fb_shard_chunk ch;
        rc = fb_shard_read_chunk(&ch, NULL, 0, s, r, c, msg, sizeof msg);
        if (rc) {
            fail_unless((rc == FB_ERR_DATA || rc == FB_ERR_NOMEM) && msg[0] != '\0');
            continue;
        }
        fail_unless(ch.records == e->records && ch.labels != NULL);
        if (m->variable) {
            uint64_t total = 0;
            for (int64_t i = 0; i < ch.records; i++) total += ch.lens[i];
            fail_unless(total * fb_data_dtype_size(m->dtype) == ch.values_bytes);
        } else {
            fail_unless(ch.values_bytes ==
                        (size_t)(ch.records * m->sample_numel) * fb_data_dtype_size(m->dtype));
        }
    }
    fail_unless(records == m->records);
    fb_shard_scratch_free(s);
    fb_shard_close(r);
    return 0;
}
