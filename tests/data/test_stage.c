/*
 * Node-local staging: first use copies and verifies, later uses hit the
 * cache; the byte bound holds, with least-recently-used eviction that never
 * evicts the split being staged; a corrupt or truncated cache entry is
 * copied afresh; a lost or garbled index is rebuilt from the files; a shard
 * that cannot get room is read in place; a source that does not match its
 * manifest is refused naming the file; and the loader reading through the
 * cache delivers exactly what it delivers without one, cold and warm.
 */
#include "data_util.h"

#include <inttypes.h>

static char g_dir[512], g_ds[1024], g_cache[1024];
static char g_msg[1024];
static char g_paths[8][FB_STAGE_PATH_MAX];

static fb_stage_stats stage(const char *split, uint64_t bound, int expect_rc)
{
    fb_manifest m;
    CHECK_INT_EQ(fb_manifest_open_dir(&m, g_ds, g_msg, sizeof g_msg), 0);
    fb_stage_stats st;
    memset(&st, 0, sizeof st);
    int rc = fb_stage_split(g_paths, &st, g_cache, bound, g_ds, &m, split, g_msg, sizeof g_msg);
    if (rc != expect_rc) fprintf(stderr, "stage %s: rc %d: %s\n", split, rc, g_msg);
    CHECK_INT_EQ(rc, expect_rc);
    fb_manifest_free(&m);
    return st;
}

static uint64_t split_bytes(const char *split)
{
    fb_manifest m;
    CHECK_INT_EQ(fb_manifest_open_dir(&m, g_ds, g_msg, sizeof g_msg), 0);
    uint64_t b = fb_manifest_split_bytes(fb_manifest_find_split(&m, split));
    fb_manifest_free(&m);
    return b;
}

static int n_cached(const char *split_tag)
{
    /* cache files are <crc>-<bytes>-<split>-<k>.fbs */
    DIR *d = opendir(g_cache);
    CHECK(d != NULL);
    struct dirent *de;
    int n = 0;
    char pat[64];
    snprintf(pat, sizeof pat, "-%s-", split_tag);
    while ((de = readdir(d)) != NULL) n += strstr(de->d_name, pat) != NULL;
    closedir(d);
    return n;
}

static bool in_cache(const char *p)
{
    return strncmp(p, g_cache, strlen(g_cache)) == 0;
}

static void test_cache(void)
{
    uint64_t a = split_bytes("a"), b = split_bytes("b"), c = split_bytes("c");
    uint64_t big = (uint64_t)1 << 40;

    fb_stage_stats st = stage("a", big, 0);
    CHECK_INT_EQ(st.copied, 3);
    CHECK_INT_EQ(st.hits, 0);
    CHECK_INT_EQ(st.bytes_copied, a);
    for (int i = 0; i < 3; i++) CHECK(in_cache(g_paths[i]));
    CHECK_INT_EQ(fb_stage_cache_bytes(g_cache), a);

    st = stage("a", big, 0);
    CHECK_INT_EQ(st.copied, 0);
    CHECK_INT_EQ(st.hits, 3);
    CHECK_INT_EQ(st.bytes_verified, a);

    /* room for two splits: staging a third evicts the least recently used */
    uint64_t bound = a + b + c / 2;
    st = stage("b", bound, 0);
    CHECK_INT_EQ(st.copied, 3);
    CHECK_INT_EQ(st.evicted, 0);
    st = stage("c", bound, 0);
    CHECK_INT_EQ(st.copied, 3);
    CHECK(st.evicted >= 2);
    CHECK(fb_stage_cache_bytes(g_cache) <= bound);
    CHECK_INT_EQ(n_cached("c"), 3);
    CHECK(n_cached("a") < 3);
    CHECK_INT_EQ(n_cached("b"), 3); /* a was older than b */

    st = stage("b", bound, 0); /* b is now the most recently used */
    CHECK_INT_EQ(st.hits, 3);
    st = stage("a", bound, 0);
    CHECK(st.copied >= 1);
    CHECK_INT_EQ(n_cached("a"), 3);
    CHECK_INT_EQ(n_cached("b"), 3);
    CHECK(n_cached("c") < 3); /* c went, not b */
    CHECK(fb_stage_cache_bytes(g_cache) <= bound);

    /* a corrupt entry is caught and copied again */
    du_flip(g_paths[1], 100, 0x01);
    st = stage("a", bound, 0);
    CHECK_INT_EQ(st.restaged, 1);
    CHECK_INT_EQ(st.hits, 2);
    CHECK_INT_EQ(st.copied, 1);
    uint32_t crc;
    uint64_t bytes;
    fb_manifest m;
    CHECK_INT_EQ(fb_manifest_open_dir(&m, g_ds, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_file_crc32c(&crc, &bytes, g_paths[1], g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(crc, fb_manifest_find_split(&m, "a")->shards[1].crc32c);
    fb_manifest_free(&m);

    /* a truncated entry too */
    CHECK(truncate(g_paths[2], 10) == 0);
    st = stage("a", bound, 0);
    CHECK_INT_EQ(st.hits, 2);
    CHECK_INT_EQ(st.copied, 1);

    /* leftovers of a crash: a temporary file goes, a complete file is adopted */
    char tmp[FB_STAGE_PATH_MAX + 32], idx[FB_STAGE_PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.12345", g_paths[0]);
    du_write(tmp, "partial", 7);
    snprintf(idx, sizeof idx, "%s/%s", g_cache, FB_STAGE_INDEX);
    CHECK(unlink(idx) == 0);
    st = stage("a", bound, 0);
    CHECK_INT_EQ(st.hits, 3);
    struct stat sb;
    CHECK(stat(tmp, &sb) != 0);
    /* a garbled index is rebuilt the same way */
    du_write(idx, "{not json", 9);
    st = stage("a", bound, 0);
    CHECK_INT_EQ(st.hits, 3);
    CHECK(fb_stage_cache_bytes(g_cache) <= bound);

    /* no room at all: read in place, still verified; what else the cache
     * held was evicted trying to make room */
    st = stage("b", 10, 0);
    CHECK_INT_EQ(st.hits, 3); /* b is cached and pinned while it is staged */
    CHECK_INT_EQ(n_cached("a"), 0);
    du_rm_rf(g_cache);
    st = stage("c", 10, 0);
    CHECK_INT_EQ(st.uncached, 3);
    for (int i = 0; i < 3; i++) CHECK(!in_cache(g_paths[i]));
    CHECK_INT_EQ(n_cached("a"), 0);
    CHECK_INT_EQ(n_cached("b"), 0);
    CHECK_INT_EQ(fb_stage_cache_bytes(g_cache), 0);

    /* a source that does not match the manifest */
    char src[1200];
    snprintf(src, sizeof src, "%s/c/c-00001.fbs", g_ds);
    du_flip(src, 200, 0x80);
    stage("c", big, FB_ERR_DATA);
    CHECK_CONTAINS(g_msg, "c-00001.fbs: checksum mismatch");
    stage("c", 10, FB_ERR_DATA); /* in place too */
    CHECK_CONTAINS(g_msg, "c-00001.fbs");
    du_flip(src, 200, 0x80);
    stage("c", big, 0);

    stage("nope", big, FB_ERR_NOT_FOUND);
}

static void read_all(const char *cache, int nb, int64_t *ids, fb_loader_stats *st)
{
    fb_loader_opts o = {.dir = g_ds, .split = "a", .batch_size = 40, .shuffle = true,
                        .data_seed = 3, .shuffle_buffer = 64, .drop_last = true, .threads = 2,
                        .cache_dir = cache, .cache_bytes = (uint64_t)1 << 30};
    fb_loader *l = NULL;
    int rc = fb_loader_open(&l, &o, g_msg, sizeof g_msg);
    if (rc) fprintf(stderr, "%s\n", g_msg);
    CHECK_INT_EQ(rc, 0);
    for (int k = 0; k < nb; k++) {
        fb_loader_batch b;
        CHECK_INT_EQ(fb_loader_next(&b, l, g_msg, sizeof g_msg), 0);
        for (int64_t i = 0; i < b.n; i++) ids[k * 40 + i] = (int64_t)b.x[2 * i];
    }
    fb_loader_get_stats(st, l);
    fb_loader_free(l);
}

static void test_loader_cache(void)
{
    char cache2[1100];
    snprintf(cache2, sizeof cache2, "%s/cache2", g_dir);
    int nb = 40;
    int64_t ref[40 * 40], cold[40 * 40], warm[40 * 40];
    fb_loader_stats st;
    read_all(NULL, nb, ref, &st);
    CHECK_INT_EQ(st.stage.copied, 0);
    read_all(cache2, nb, cold, &st);
    CHECK_INT_EQ(st.stage.copied, 3);
    CHECK(memcmp(ref, cold, sizeof ref) == 0);
    read_all(cache2, nb, warm, &st);
    CHECK_INT_EQ(st.stage.hits, 3);
    CHECK(memcmp(ref, warm, sizeof ref) == 0);
    /* a damaged cached shard: re-staged at open, the data still right */
    char p[FB_STAGE_PATH_MAX];
    fb_manifest m;
    CHECK_INT_EQ(fb_manifest_open_dir(&m, g_ds, g_msg, sizeof g_msg), 0);
    const fb_manifest_shard *sh = &fb_manifest_find_split(&m, "a")->shards[0];
    snprintf(p, sizeof p, "%s/%08" PRIx32 "-%" PRIu64 "-a-00000.fbs", cache2, sh->crc32c,
             sh->bytes);
    fb_manifest_free(&m);
    du_flip(p, 300, 0x04);
    read_all(cache2, nb, warm, &st);
    CHECK_INT_EQ(st.stage.restaged, 1);
    CHECK(memcmp(ref, warm, sizeof ref) == 0);
}

int main(void)
{
    du_scratch(g_dir, sizeof g_dir, "stage");
    snprintf(g_ds, sizeof g_ds, "%s/ds", g_dir);
    snprintf(g_cache, sizeof g_cache, "%s/cache", g_dir);
    du_make_index_dataset(g_ds, "a", 600, 3, 16, 200);
    du_make_index_dataset(g_ds, "b", 600, 3, 16, 200);
    du_make_index_dataset(g_ds, "c", 600, 3, 16, 200);
    test_cache();
    test_loader_cache();
    du_rm_rf(g_dir);
    printf("test_stage: ok\n");
    return 0;
}
