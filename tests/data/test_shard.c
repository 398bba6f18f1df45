/*
 * Shards: CRC32C against published check values (table and hardware paths
 * agree), writer/reader round trips of fixed and variable records of both
 * dtypes over several chunk sizes, file and in-memory readers, writer
 * misuse, and a corruption table in which every damaged shard must be
 * FB_ERR_DATA with a message naming the file (and the chunk, where one is
 * at fault): flipped bytes in a chunk, in the header and in the index;
 * truncation at several lengths; index entries pointing outside the chunk
 * area (with valid checksums, so the bounds checks themselves are tested);
 * wrong magic and version; counts and sizes that lie; a frame that is not
 * zstd.
 */
#include "data_util.h"

#include <zstd.h>

#include "crc32c.h"

static char g_dir[512];
static char g_msg[1024];

/* ------------------------------------------------------------ CRC32C */

static void test_crc(void)
{
    /* the check value of CRC-32C (iSCSI, RFC 3720 appendix B.4) */
    CHECK_INT_EQ(fb_crc32c(0, "123456789", 9), 0xE3069283u);
    CHECK_INT_EQ(fb_crc32c_sw(0, "123456789", 9), 0xE3069283u);
    uint8_t zeros[32] = {0}, ones[32];
    memset(ones, 0xFF, sizeof ones);
    CHECK_INT_EQ(fb_crc32c(0, zeros, 32), 0x8A9136AAu); /* RFC 3720 B.4: 32 bytes of zeros */
    CHECK_INT_EQ(fb_crc32c(0, ones, 32), 0x62A8AB43u);  /* 32 bytes of ones */
    CHECK_INT_EQ(fb_crc32c(0, NULL, 0), 0);
    uint8_t buf[3000];
    uint64_t st = 1;
    for (size_t i = 0; i < sizeof buf; i++) {
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        buf[i] = (uint8_t)(st >> 56);
    }
    for (size_t off = 0; off < 9; off++)
        for (size_t len = 0; len < 200; len += 7) {
            uint32_t a = fb_crc32c(0, buf + off, len), b = fb_crc32c_sw(0, buf + off, len);
            CHECK_INT_EQ(a, b);
            /* incremental == one shot */
            uint32_t c = fb_crc32c(fb_crc32c(0, buf + off, len / 3), buf + off + len / 3,
                                   len - len / 3);
            CHECK_INT_EQ(c, a);
        }
    CHECK_INT_EQ(fb_crc32c(0, buf, sizeof buf), fb_crc32c_sw(0, buf, sizeof buf));
}

/* ------------------------------------------------------------ round trips */

/* Deterministic value of record i, element k. */
static uint8_t val_u8(int64_t i, int64_t k)
{
    return (uint8_t)(i * 31 + k * 7 + (i * k) % 13);
}
static float val_f32(int64_t i, int64_t k)
{
    return (float)i * 0.5f - (float)k * 0.25f;
}
static int64_t var_len(int64_t i)
{
    return (i * 7) % 11; /* includes empty records */
}

static void write_shard(const char *path, fb_data_dtype dt, int64_t numel, int64_t n,
                        int64_t chunk, fb_shard_info *info)
{
    fb_shard_writer *w = NULL;
    fb_shard_params p = {.dtype = dt, .sample_numel = numel, .chunk_records = chunk, .level = 3};
    CHECK_INT_EQ(fb_shard_writer_open(&w, path, &p, g_msg, sizeof g_msg), 0);
    uint8_t bu[64];
    float bf[64];
    for (int64_t i = 0; i < n; i++) {
        int64_t len = numel ? numel : var_len(i);
        for (int64_t k = 0; k < len; k++) {
            bu[k] = val_u8(i, k);
            bf[k] = val_f32(i, k);
        }
        int rc = fb_shard_writer_add(w, dt == FB_DTYPE_U8 ? (void *)bu : (void *)bf, len,
                                     (int32_t)(i % 5), g_msg, sizeof g_msg);
        CHECK_INT_EQ(rc, 0);
    }
    CHECK_INT_EQ(fb_shard_writer_finish(info, w, g_msg, sizeof g_msg), 0);
    fb_shard_writer_free(w);
}

static void check_shard(const fb_shard_reader *r, fb_data_dtype dt, int64_t numel, int64_t n,
                        int64_t chunk)
{
    const fb_shard_meta *m = fb_shard_get_meta(r);
    CHECK_INT_EQ(m->version, FB_SHARD_VERSION);
    CHECK_INT_EQ(m->dtype, dt);
    CHECK_INT_EQ(m->variable, numel == 0);
    CHECK_INT_EQ(m->sample_numel, numel);
    CHECK_INT_EQ(m->records, n);
    CHECK_INT_EQ(m->chunks, (n + chunk - 1) / chunk);
    fb_shard_scratch *s = fb_shard_scratch_new();
    CHECK(s != NULL);
    int64_t seen = 0;
    size_t esz = fb_data_dtype_size(dt);
    for (int64_t c = 0; c < m->chunks; c++) {
        fb_shard_chunk ch;
        /* odd chunks into a caller buffer, even ones into the scratch */
        const fb_shard_chunk_entry *e = fb_shard_get_chunk(r, c);
        CHECK(e != NULL);
        void *dst = c % 2 ? malloc((size_t)e->raw) : NULL;
        CHECK_INT_EQ(fb_shard_read_chunk(&ch, dst, dst ? (size_t)e->raw : 0, s, r, c, g_msg,
                                         sizeof g_msg),
                     0);
        CHECK_INT_EQ(ch.first_record, seen);
        CHECK_INT_EQ(ch.records, c + 1 < m->chunks ? chunk : n - seen);
        size_t at = 0;
        for (int64_t k = 0; k < ch.records; k++) {
            int64_t i = seen + k, len = numel ? numel : var_len(i);
            CHECK_INT_EQ(ch.labels[k], i % 5);
            if (!numel) CHECK_INT_EQ(ch.lens[k], len);
            for (int64_t v = 0; v < len; v++) {
                if (dt == FB_DTYPE_U8)
                    CHECK_INT_EQ(((const uint8_t *)ch.values)[at + (size_t)v], val_u8(i, v));
                else
                    CHECK(((const float *)ch.values)[at + (size_t)v] == val_f32(i, v));
            }
            at += (size_t)len;
        }
        CHECK_INT_EQ(at * esz, ch.values_bytes);
        seen += ch.records;
        free(dst);
    }
    CHECK_INT_EQ(seen, n);
    /* chunk numbers outside the shard are refused */
    fb_shard_chunk ch;
    CHECK_INT_EQ(fb_shard_read_chunk(&ch, NULL, 0, s, r, m->chunks, g_msg, sizeof g_msg),
                 FB_ERR_OUT_OF_RANGE);
    CHECK_INT_EQ(fb_shard_read_chunk(&ch, NULL, 0, s, r, -1, g_msg, sizeof g_msg),
                 FB_ERR_OUT_OF_RANGE);
    fb_shard_scratch_free(s);
}

static void test_round_trips(void)
{
    static const int64_t chunks[] = {1, 3, 64, 1000};
    static const struct {
        fb_data_dtype dt;
        int64_t numel;
    } kinds[] = {{FB_DTYPE_U8, 12}, {FB_DTYPE_F32, 5}, {FB_DTYPE_U8, 0}, {FB_DTYPE_F32, 0}};
    char path[1024];
    snprintf(path, sizeof path, "%s/rt.fbs", g_dir);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
            int64_t n = 200;
            fb_shard_info info;
            write_shard(path, kinds[k].dt, kinds[k].numel, n, chunks[c], &info);
            CHECK_INT_EQ(info.records, n);
            CHECK_INT_EQ(info.chunks, (n + chunks[c] - 1) / chunks[c]);
            uint32_t crc;
            uint64_t bytes;
            CHECK_INT_EQ(fb_file_crc32c(&crc, &bytes, path, g_msg, sizeof g_msg), 0);
            CHECK_INT_EQ(crc, info.crc32c);
            CHECK_INT_EQ(bytes, info.bytes);
            fb_shard_reader *r;
            CHECK_INT_EQ(fb_shard_open(&r, path, g_msg, sizeof g_msg), 0);
            CHECK_INT_EQ(fb_shard_get_meta(r)->bytes, info.bytes);
            CHECK_INT_EQ(fb_shard_get_meta(r)->raw_bytes, info.raw_bytes);
            check_shard(r, kinds[k].dt, kinds[k].numel, n, chunks[c]);
            fb_shard_close(r);
            size_t len;
            uint8_t *buf = du_read(path, &len);
            CHECK_INT_EQ(fb_shard_open_buffer(&r, buf, len, "mem", g_msg, sizeof g_msg), 0);
            check_shard(r, kinds[k].dt, kinds[k].numel, n, chunks[c]);
            fb_shard_close(r);
            free(buf);
        }
    /* no temporary file is left behind */
    DIR *d = opendir(g_dir);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) CHECK(strstr(de->d_name, ".tmp.") == NULL);
    closedir(d);
}

static void test_writer_misuse(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/bad.fbs", g_dir);
    fb_shard_writer *w = NULL;
    fb_shard_params p = {.dtype = FB_DTYPE_U8, .sample_numel = 4, .chunk_records = 2, .level = 3};
    fb_shard_params bad = p;
    bad.chunk_records = 0;
    CHECK_INT_EQ(fb_shard_writer_open(&w, path, &bad, g_msg, sizeof g_msg), FB_ERR_OUT_OF_RANGE);
    bad = p;
    bad.dtype = (fb_data_dtype)9;
    CHECK_INT_EQ(fb_shard_writer_open(&w, path, &bad, g_msg, sizeof g_msg), FB_ERR_OUT_OF_RANGE);
    bad = p;
    bad.level = 99;
    CHECK_INT_EQ(fb_shard_writer_open(&w, path, &bad, g_msg, sizeof g_msg), FB_ERR_OUT_OF_RANGE);
    bad = p;
    bad.sample_numel = 1 << 24;
    bad.chunk_records = 1 << 10; /* 16 GiB chunks */
    CHECK_INT_EQ(fb_shard_writer_open(&w, path, &bad, g_msg, sizeof g_msg), FB_ERR_OUT_OF_RANGE);
    CHECK(w == NULL);
    char nodir[1024];
    snprintf(nodir, sizeof nodir, "%s/missing/x.fbs", g_dir);
    CHECK_INT_EQ(fb_shard_writer_open(&w, nodir, &p, g_msg, sizeof g_msg), FB_ERR_IO);
    CHECK_CONTAINS(g_msg, "missing/x.fbs");

    CHECK_INT_EQ(fb_shard_writer_open(&w, path, &p, g_msg, sizeof g_msg), 0);
    uint8_t v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK_INT_EQ(fb_shard_writer_add(w, v, 3, 0, g_msg, sizeof g_msg), FB_ERR_OUT_OF_RANGE);
    CHECK_CONTAINS(g_msg, "has 3 values");
    /* an empty shard cannot be finished */
    CHECK_INT_EQ(fb_shard_writer_finish(NULL, w, g_msg, sizeof g_msg), FB_ERR_OUT_OF_RANGE);
    CHECK_INT_EQ(fb_shard_writer_add(w, v, 4, 1, g_msg, sizeof g_msg), 0);
    /* freed unfinished: neither the shard nor its temporary file exists */
    fb_shard_writer_free(w);
    struct stat st;
    CHECK(stat(path, &st) != 0);
    DIR *d = opendir(g_dir);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) CHECK(strstr(de->d_name, "bad.fbs") == NULL);
    closedir(d);
    fb_shard_writer_free(NULL);
    fb_shard_close(NULL);
    fb_shard_scratch_free(NULL);
}

/* ------------------------------------------------------------ corruption */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Recomputes the index and header checksums after an edit, so that the
 * reader's structural checks, not its checksums, must catch the lie. */
static void reseal(uint8_t *b, size_t len)
{
    uint64_t index_off = get64(b + 48);
    if (index_off <= len) put32(b + 56, fb_crc32c(0, b + index_off, len - (size_t)index_off));
    put32(b + 60, fb_crc32c(0, b, 60));
}

typedef struct corrupt_case {
    const char *what;
    const char *expect; /* in the message, besides the file name */
} corrupt_case;

/* Writes bytes to a file, opens it and reads every chunk; the first error
 * must be FB_ERR_DATA naming the file and containing expect. */
static void expect_bad(const uint8_t *b, size_t len, const char *what, const char *expect)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/corrupt-%s.fbs", g_dir, what);
    for (char *q = path + strlen(g_dir) + 1; *q; q++)
        if (*q == ' ') *q = '_';
    du_write(path, b, len);
    fb_shard_reader *r = NULL;
    g_msg[0] = '\0';
    int rc = fb_shard_open(&r, path, g_msg, sizeof g_msg);
    if (rc == 0) {
        fb_shard_scratch *s = fb_shard_scratch_new();
        for (int64_t c = 0; c < fb_shard_get_meta(r)->chunks && rc == 0; c++) {
            fb_shard_chunk ch;
            rc = fb_shard_read_chunk(&ch, NULL, 0, s, r, c, g_msg, sizeof g_msg);
        }
        fb_shard_scratch_free(s);
        fb_shard_close(r);
    }
    if (rc != FB_ERR_DATA || !du_contains(g_msg, path) || !du_contains(g_msg, expect)) {
        fprintf(stderr, "case \"%s\": rc %d, message \"%s\", expected FB_ERR_DATA with \"%s\"\n",
                what, rc, g_msg, expect);
        abort();
    }
    /* the same bytes from memory: the same verdict */
    rc = fb_shard_open_buffer(&r, len ? b : NULL, len, "mem", g_msg, sizeof g_msg);
    if (rc == 0) {
        fb_shard_scratch *s = fb_shard_scratch_new();
        for (int64_t c = 0; c < fb_shard_get_meta(r)->chunks && rc == 0; c++) {
            fb_shard_chunk ch;
            rc = fb_shard_read_chunk(&ch, NULL, 0, s, r, c, g_msg, sizeof g_msg);
        }
        fb_shard_scratch_free(s);
        fb_shard_close(r);
    }
    CHECK_INT_EQ(rc, FB_ERR_DATA);
    unlink(path);
}

/* Re-encodes the single chunk of shard `good` after adding 1 to decoded
 * byte bump_at (when nonzero) and dropping `cut` bytes from its end, keeps
 * the index's decoded size, fixes every checksum, and expects the result to
 * be rejected. */
static void reencode_single(const uint8_t *good, size_t bump_at, size_t cut, const char *what,
                            const char *expect)
{
    uint64_t ioff = get64(good + 48), raw = get64(good + ioff + 16);
    uint8_t *dec = malloc((size_t)raw);
    CHECK(dec != NULL);
    CHECK_INT_EQ(ZSTD_decompress(dec, (size_t)raw, good + 64, (size_t)(ioff - 64)), raw);
    if (bump_at) dec[bump_at] += 1;
    size_t zb = ZSTD_compressBound((size_t)raw);
    uint8_t *out = malloc(64 + zb + 32);
    CHECK(out != NULL);
    size_t zn = ZSTD_compress(out + 64, zb, dec, (size_t)raw - cut, 3);
    CHECK(!ZSTD_isError(zn));
    memcpy(out, good, 64);
    uint8_t *e = out + 64 + zn;
    memcpy(e, good + ioff, 32);
    put64(e, 64);
    put64(e + 8, zn);
    put32(e + 28, fb_crc32c(0, out + 64, zn));
    put64(out + 48, 64 + zn);
    reseal(out, 64 + zn + 32);
    expect_bad(out, 64 + zn + 32, what, expect);
    free(out);
    free(dec);
}

static void test_corruption(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/good.fbs", g_dir);
    fb_shard_info info;
    write_shard(path, FB_DTYPE_U8, 12, 50, 8, &info); /* 7 chunks */
    size_t len;
    uint8_t *good = du_read(path, &len), *b = malloc(len + 64);
    CHECK(b != NULL);
    uint64_t index_off = get64(good + 48);
    const uint8_t *e2 = good + index_off + 2 * 32; /* chunk 2's index entry */
    uint64_t c2_off = get64(e2), c2_stored = get64(e2 + 8);

#define FRESH() memcpy(b, good, len)
    FRESH();
    b[c2_off + c2_stored / 2] ^= 0x40;
    expect_bad(b, len, "flipped byte in chunk 2", "chunk 2: checksum mismatch");

    FRESH();
    b[c2_off] ^= 0x01;
    expect_bad(b, len, "flipped first byte of chunk 2", "chunk 2");

    FRESH();
    b[33] ^= 0x01; /* record count, checksum not updated */
    expect_bad(b, len, "flipped header byte", "header checksum mismatch");

    FRESH();
    b[index_off + 3 * 32 + 26] ^= 0x01; /* chunk 3's record count */
    expect_bad(b, len, "flipped index byte", "chunk index checksum mismatch");

    static const size_t cuts[] = {0, 1, 10, 63, 64, 100};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
        expect_bad(good, cuts[i], "short", cuts[i] < 64 ? "too short" : "does not end");
    expect_bad(good, len - 1, "truncated by one byte", "truncated");
    expect_bad(good, len - 32, "truncated by one index entry", "truncated");

    FRESH();
    b[len] = 0;
    expect_bad(b, len + 1, "trailing byte", "does not end");

    FRESH();
    memcpy(b, "GARBAGE!", 8);
    expect_bad(b, len, "wrong magic", "not a fusebox shard");

    FRESH();
    put32(b + 8, 2);
    reseal(b, len);
    expect_bad(b, len, "wrong version", "version 2");

    FRESH();
    put32(b + 16, 7u); /* dtype 7, codec 0 */
    reseal(b, len);
    expect_bad(b, len, "unknown dtype", "dtype");

    FRESH();
    put64(b + 32, 51); /* one record more than the chunks hold */
    reseal(b, len);
    expect_bad(b, len, "header lies about records", "records");

    FRESH();
    put64(b + 40, 8); /* one chunk more: the index would need 32 more bytes */
    reseal(b, len);
    expect_bad(b, len, "header lies about chunks", "does not end");

    FRESH();
    put64(b + 48, index_off + 32);
    reseal(b, len);
    expect_bad(b, len, "index offset beyond the file", "does not end");

    FRESH();
    put64(b + index_off + 2 * 32 + 8, len * 4); /* chunk 2's stored size far past the area */
    reseal(b, len);
    expect_bad(b, len, "index entry points outside", "chunk 2: index entry points outside");

    FRESH();
    put64(b + index_off + 2 * 32, c2_off + 1); /* chunk 2 does not follow chunk 1 */
    reseal(b, len);
    expect_bad(b, len, "index offset skips bytes", "chunk 2: index gives offset");

    FRESH();
    put64(b + index_off + 2 * 32, UINT64_MAX - 4); /* an offset that overflows */
    reseal(b, len);
    expect_bad(b, len, "index offset overflows", "chunk 2");

    FRESH();
    put64(b + index_off + 4 * 32 + 16, 8 * 16 + 4); /* 8 records of 12 bytes decode to 128 */
    reseal(b, len);
    expect_bad(b, len, "index lies about decoded size", "chunk 4: decoded size");

    FRESH();
    put64(b + index_off + 1 * 32 + 16, ((uint64_t)1 << 40)); /* absurd decoded size */
    reseal(b, len);
    expect_bad(b, len, "huge decoded size", "chunk 1");

    FRESH();
    put32(b + index_off + 5 * 32 + 24, 0); /* chunk 5 holds no records */
    reseal(b, len);
    expect_bad(b, len, "chunk of zero records", "chunk 5");

    FRESH();
    /* chunk 2's bytes replaced by garbage with a matching checksum */
    for (uint64_t i = 0; i < c2_stored; i++) b[c2_off + i] = (uint8_t)(i * 37 + 11);
    put32(b + index_off + 2 * 32 + 28, fb_crc32c(0, b + c2_off, (size_t)c2_stored));
    reseal(b, len);
    expect_bad(b, len, "not a zstd frame", "chunk 2: corrupt zstd frame");

#undef FRESH
    free(good);
    free(b);

    /* a valid frame, every checksum valid, but it decodes to 16 bytes less
     * than the index says */
    snprintf(path, sizeof path, "%s/one.fbs", g_dir);
    write_shard(path, FB_DTYPE_U8, 12, 8, 8, &info);
    good = du_read(path, &len);
    reencode_single(good, 0, 16, "short frame", "chunk 0: decodes to 112 bytes");
    free(good);

    /* variable records whose sizes do not add up: record 0 claims one value
     * more than the chunk holds */
    snprintf(path, sizeof path, "%s/var.fbs", g_dir);
    write_shard(path, FB_DTYPE_U8, 0, 20, 20, &info);
    good = du_read(path, &len);
    reencode_single(good, 20 * 4, 0, "variable sizes lie", "chunk 0: record sizes add up");
    free(good);

    /* a directory, a missing file */
    fb_shard_reader *r = NULL;
    CHECK_INT_EQ(fb_shard_open(&r, g_dir, g_msg, sizeof g_msg), FB_ERR_DATA);
    snprintf(path, sizeof path, "%s/nope.fbs", g_dir);
    CHECK_INT_EQ(fb_shard_open(&r, path, g_msg, sizeof g_msg), FB_ERR_IO);
    CHECK_CONTAINS(g_msg, "nope.fbs");
}

int main(void)
{
    du_scratch(g_dir, sizeof g_dir, "shard");
    test_crc();
    test_round_trips();
    test_writer_misuse();
    test_corruption();
    du_rm_rf(g_dir);
    printf("test_shard: ok\n");
    return 0;
}
