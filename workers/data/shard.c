/*
 * Shard writer and reader.  Layout (all integers little-endian; see
 * docs/data-format.md for the full description):
 *
 *   header, 64 bytes:
 *     0  magic "FBSHARD\0"        8  u32 version        12 u32 header bytes (64)
 *     16 u16 dtype  18 u16 codec  20 u32 flags          24 u64 sample numel
 *     32 u64 records              40 u64 chunks         48 u64 index offset
 *     56 u32 index CRC32C         60 u32 header CRC32C (of bytes 0..59)
 *   chunks, contiguous from byte 64: one zstd frame each
 *   index, chunks x 32 bytes, ending the file:
 *     u64 offset, u64 stored bytes, u64 decoded bytes, u32 records, u32 CRC32C
 *
 * A decoded chunk is the records' labels (i32 each), for variable records
 * their value counts (u32 each), then their values.
 */
#include "shard.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

#include "crc32c.h"

#define SHARD_IO_BLOCK ((size_t)1 << 20)

/* ------------------------------------------------------------ byte order */

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Converts n 4-byte host values to little-endian (or back): a no-op here
 * unless the host is big-endian. */
static void swap32_if_be(void *p, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++, b += 4) {
        uint8_t t0 = b[0], t1 = b[1];
        b[0] = b[3], b[1] = b[2], b[2] = t1, b[3] = t0;
    }
#else
    (void)p, (void)n;
#endif
}

/* ------------------------------------------------------------ files */

static int write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t k = write(fd, p, len);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

/* Reads exactly len bytes at off; returns the count read (less at EOF) or
 * -1 with errno set. */
static ssize_t pread_full(int fd, void *buf, size_t len, uint64_t off)
{
    uint8_t *p = buf;
    size_t have = 0;
    while (have < len) {
        ssize_t k = pread(fd, p + have, len - have, (off_t)(off + have));
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (k == 0) break;
        have += (size_t)k;
    }
    return (ssize_t)have;
}

static int fsync_parent(const char *path)
{
    char *copy = strdup(path);
    if (!copy) return -1;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(copy);
    if (fd < 0) return -1;
    int rc = fsync(fd) != 0 && errno != EINVAL ? -1 : 0;
    close(fd);
    return rc;
}

int fb_file_crc32c(uint32_t *crc, uint64_t *bytes, const char *path, char *msg, size_t msg_cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    uint8_t *buf = malloc(SHARD_IO_BLOCK);
    if (!buf) {
        close(fd);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    }
    uint32_t c = 0;
    uint64_t n = 0;
    int rc = 0;
    for (;;) {
        ssize_t k = read(fd, buf, SHARD_IO_BLOCK);
        if (k < 0) {
            if (errno == EINTR) continue;
            rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot read %s: %s", path, strerror(errno));
            break;
        }
        if (k == 0) break;
        c = fb_crc32c(c, buf, (size_t)k);
        n += (uint64_t)k;
    }
    free(buf);
    close(fd);
    if (rc) return rc;
    if (crc) *crc = c;
    if (bytes) *bytes = n;
    return 0;
}

/* ------------------------------------------------------------ writer */

struct fb_shard_writer {
    char *path, *tmp;
    int fd;
    fb_shard_params p;
    size_t esz;
    ZSTD_CCtx *cctx;
    /* the chunk being filled */
    int64_t n;
    int32_t *labels;
    uint32_t *lens;
    size_t rec_cap;
    uint8_t *values;
    size_t values_len, values_cap;
    /* staging for one chunk's decoded and compressed bytes */
    uint8_t *raw, *z;
    size_t raw_cap, z_cap;
    /* encoded index entries */
    uint8_t *index;
    size_t index_len, index_cap;
    int64_t chunks, records;
    uint64_t offset, raw_bytes;
    bool finished;
};

static int grow(void **p, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 4096;
    while (nc < need) nc = nc > SIZE_MAX / 2 ? need : 2 * nc;
    void *q = realloc(*p, nc);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

int fb_shard_writer_open(fb_shard_writer **out, const char *path, const fb_shard_params *p,
                         char *msg, size_t msg_cap)
{
    if (!out || !path || !p)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_shard_writer_open: NULL argument");
    size_t esz = fb_data_dtype_size(p->dtype);
    if (!esz) return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "unknown sample dtype %d", p->dtype);
    if (p->sample_numel < 0 || p->sample_numel > FB_SHARD_MAX_SAMPLE_NUMEL)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "sample of %" PRId64 " values; a shard allows 0 (variable) to %" PRId64,
                       p->sample_numel, FB_SHARD_MAX_SAMPLE_NUMEL);
    if (p->chunk_records < 1 || p->chunk_records > FB_SHARD_MAX_CHUNK_RECORDS)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "chunk of %" PRId64 " records; allowed 1 to %" PRId64, p->chunk_records,
                       FB_SHARD_MAX_CHUNK_RECORDS);
    uint64_t rec_bytes = 4 + (uint64_t)p->sample_numel * esz;
    if (p->sample_numel > 0 && (uint64_t)p->chunk_records * rec_bytes > FB_SHARD_MAX_CHUNK_BYTES)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "a chunk of %" PRId64 " records of %" PRIu64
                       " bytes exceeds the %" PRIu64 "-byte chunk limit",
                       p->chunk_records, rec_bytes, FB_SHARD_MAX_CHUNK_BYTES);
    if (p->level < ZSTD_minCLevel() || p->level > ZSTD_maxCLevel())
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "zstd level %d; allowed %d to %d",
                       p->level, ZSTD_minCLevel(), ZSTD_maxCLevel());
    int rc;
    fb_shard_writer *w = calloc(1, sizeof *w);
    if (!w) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    w->fd = -1;
    w->p = *p;
    w->esz = esz;
    size_t tl = strlen(path) + 32;
    w->path = strdup(path);
    w->tmp = malloc(tl);
    w->cctx = ZSTD_createCCtx();
    if (!w->path || !w->tmp || !w->cctx) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    snprintf(w->tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    if (ZSTD_isError(ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, p->level))) {
        rc = fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "zstd rejects level %d", p->level);
        goto fail;
    }
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        rc = fb_errf(msg, msg_cap, fb_err_write_errno(errno), "cannot create %s: %s", w->tmp,
                     strerror(errno));
        goto fail;
    }
    /* the header is written last, over these zeros */
    uint8_t zero[FB_SHARD_HEADER_BYTES] = {0};
    if (write_all(w->fd, zero, sizeof zero) != 0) {
        rc = fb_errf(msg, msg_cap, fb_err_write_errno(errno), "cannot write %s: %s", w->tmp,
                     strerror(errno));
        goto fail;
    }
    w->offset = FB_SHARD_HEADER_BYTES;
    *out = w;
    return 0;
fail:
    fb_shard_writer_free(w);
    return rc;
}

/* Compresses and writes the records gathered so far as one chunk. */
static int writer_flush(fb_shard_writer *w, char *msg, size_t msg_cap)
{
    if (w->n == 0) return 0;
    if (w->chunks >= FB_SHARD_MAX_CHUNKS)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s: more than %" PRId64 " chunks",
                       w->path, FB_SHARD_MAX_CHUNKS);
    bool var = w->p.sample_numel == 0;
    size_t n = (size_t)w->n;
    size_t head = n * 4 * (var ? 2 : 1);
    size_t raw = head + w->values_len;
    size_t zb = ZSTD_compressBound(raw);
    if (grow((void **)&w->raw, &w->raw_cap, raw) || grow((void **)&w->z, &w->z_cap, zb) ||
        grow((void **)&w->index, &w->index_cap, w->index_len + FB_SHARD_INDEX_ENTRY_BYTES))
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    memcpy(w->raw, w->labels, n * 4);
    swap32_if_be(w->raw, n);
    if (var) {
        memcpy(w->raw + n * 4, w->lens, n * 4);
        swap32_if_be(w->raw + n * 4, n);
    }
    if (w->values_len) memcpy(w->raw + head, w->values, w->values_len);
    if (w->esz == 4) swap32_if_be(w->raw + head, w->values_len / 4);
    size_t zn = ZSTD_compress2(w->cctx, w->z, zb, w->raw, raw);
    if (ZSTD_isError(zn))
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "%s: zstd: %s", w->path,
                       ZSTD_getErrorName(zn));
    if (write_all(w->fd, w->z, zn) != 0)
        return fb_errf(msg, msg_cap, fb_err_write_errno(errno), "cannot write %s: %s", w->tmp,
                       strerror(errno));
    uint8_t *e = w->index + w->index_len;
    put_u64(e, w->offset);
    put_u64(e + 8, zn);
    put_u64(e + 16, raw);
    put_u32(e + 24, (uint32_t)n);
    put_u32(e + 28, fb_crc32c(0, w->z, zn));
    w->index_len += FB_SHARD_INDEX_ENTRY_BYTES;
    w->offset += zn;
    w->raw_bytes += raw;
    w->chunks++;
    w->n = 0;
    w->values_len = 0;
    return 0;
}

int fb_shard_writer_add(fb_shard_writer *w, const void *values, int64_t numel, int32_t label,
                        char *msg, size_t msg_cap)
{
    if (!w || (!values && numel > 0))
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_shard_writer_add: NULL argument");
    if (w->finished)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "%s: the shard is already finished",
                       w->path);
    bool var = w->p.sample_numel == 0;
    if (!var && numel != w->p.sample_numel)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "%s: record %" PRId64 " has %" PRId64 " values; this shard's records "
                       "have %" PRId64,
                       w->path, w->records, numel, w->p.sample_numel);
    if (numel < 0 || numel > FB_SHARD_MAX_SAMPLE_NUMEL)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "%s: record %" PRId64 " has %" PRId64 " values; allowed 0 to %" PRId64,
                       w->path, w->records, numel, FB_SHARD_MAX_SAMPLE_NUMEL);
    if (w->records >= FB_SHARD_MAX_RECORDS)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s: more than %" PRId64 " records",
                       w->path, FB_SHARD_MAX_RECORDS);
    size_t vb = (size_t)numel * w->esz;
    if (var && 8 + vb > FB_SHARD_MAX_CHUNK_BYTES)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "%s: record %" PRId64 " alone exceeds the %" PRIu64 "-byte chunk limit",
                       w->path, w->records, FB_SHARD_MAX_CHUNK_BYTES);
    /* a variable record that would push the chunk past the limit starts a new one */
    if (var && w->n > 0 &&
        (uint64_t)(w->n + 1) * 8 + w->values_len + vb > FB_SHARD_MAX_CHUNK_BYTES) {
        int rc = writer_flush(w, msg, msg_cap);
        if (rc) return rc;
    }
    size_t lab_cap = w->rec_cap * sizeof *w->labels, len_cap = w->rec_cap * sizeof *w->lens;
    if ((size_t)w->n == w->rec_cap) {
        size_t want = (size_t)w->n + 1;
        if (grow((void **)&w->labels, &lab_cap, want * sizeof *w->labels) ||
            grow((void **)&w->lens, &len_cap, want * sizeof *w->lens))
            return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        w->rec_cap = (lab_cap < len_cap ? lab_cap : len_cap) / sizeof *w->labels;
    }
    if (grow((void **)&w->values, &w->values_cap, w->values_len + vb))
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    w->labels[w->n] = label;
    w->lens[w->n] = (uint32_t)numel;
    if (vb) memcpy(w->values + w->values_len, values, vb);
    w->values_len += vb;
    w->n++;
    w->records++;
    if (w->n == w->p.chunk_records) return writer_flush(w, msg, msg_cap);
    return 0;
}

int fb_shard_writer_finish(fb_shard_info *info, fb_shard_writer *w, char *msg, size_t msg_cap)
{
    if (!w) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_shard_writer_finish: NULL argument");
    if (w->finished)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "%s: the shard is already finished",
                       w->path);
    int rc = writer_flush(w, msg, msg_cap);
    if (rc) return rc;
    if (w->records == 0)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s: a shard needs at least one record",
                       w->path);
    uint64_t index_offset = w->offset;
    if (write_all(w->fd, w->index, w->index_len) != 0)
        return fb_errf(msg, msg_cap, fb_err_write_errno(errno), "cannot write %s: %s", w->tmp,
                       strerror(errno));
    uint8_t h[FB_SHARD_HEADER_BYTES] = {0};
    memcpy(h, FB_SHARD_MAGIC, 8);
    put_u32(h + 8, FB_SHARD_VERSION);
    put_u32(h + 12, FB_SHARD_HEADER_BYTES);
    put_u16(h + 16, (uint16_t)w->p.dtype);
    put_u16(h + 18, FB_SHARD_CODEC_ZSTD);
    put_u32(h + 20, w->p.sample_numel == 0 ? FB_SHARD_FLAG_VARIABLE : 0);
    put_u64(h + 24, (uint64_t)w->p.sample_numel);
    put_u64(h + 32, (uint64_t)w->records);
    put_u64(h + 40, (uint64_t)w->chunks);
    put_u64(h + 48, index_offset);
    put_u32(h + 56, fb_crc32c(0, w->index, w->index_len));
    put_u32(h + 60, fb_crc32c(0, h, 60));
    if (pwrite(w->fd, h, sizeof h, 0) != (ssize_t)sizeof h)
        return fb_errf(msg, msg_cap, fb_err_write_errno(errno), "cannot write %s: %s", w->tmp,
                       strerror(errno));
    if (fsync(w->fd) != 0)
        return fb_errf(msg, msg_cap, fb_err_write_errno(errno), "cannot fsync %s: %s", w->tmp,
                       strerror(errno));
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0)
        return fb_errf(msg, msg_cap, fb_err_write_errno(errno), "cannot close %s: %s", w->tmp,
                       strerror(errno));
    /* read back through the page cache: the whole-file checksum the manifest keeps */
    uint32_t crc;
    uint64_t bytes;
    if ((rc = fb_file_crc32c(&crc, &bytes, w->tmp, msg, msg_cap))) return rc;
    if (bytes != index_offset + w->index_len)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "%s: %" PRIu64 " bytes on disk, %" PRIu64
                       " written", w->tmp, bytes, index_offset + w->index_len);
    if (rename(w->tmp, w->path) != 0)
        return fb_errf(msg, msg_cap, fb_err_write_errno(errno), "cannot rename %s to %s: %s", w->tmp,
                       w->path, strerror(errno));
    w->finished = true;
    if (fsync_parent(w->path) != 0)
        return fb_errf(msg, msg_cap, fb_err_write_errno(errno),
                       "cannot fsync the directory of %s: %s", w->path, strerror(errno));
    if (info) {
        info->bytes = bytes;
        info->raw_bytes = w->raw_bytes;
        info->records = w->records;
        info->chunks = w->chunks;
        info->crc32c = crc;
    }
    return 0;
}

void fb_shard_writer_free(fb_shard_writer *w)
{
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (!w->finished && w->tmp) unlink(w->tmp);
    ZSTD_freeCCtx(w->cctx);
    free(w->path);
    free(w->tmp);
    free(w->labels);
    free(w->lens);
    free(w->values);
    free(w->raw);
    free(w->z);
    free(w->index);
    free(w);
}

/* ------------------------------------------------------------ reader */

struct fb_shard_reader {
    char *name;
    int fd;
    const uint8_t *mem;
    fb_shard_meta meta;
    fb_shard_chunk_entry *entries;
};

struct fb_shard_scratch {
    ZSTD_DCtx *dctx;
    uint8_t *z, *raw;
    size_t z_cap, raw_cap;
};

/* Reads len bytes at off; a short read means the file was cut short. */
static int rd_at(const fb_shard_reader *r, void *dst, size_t len, uint64_t off, const char *what,
                 char *msg, size_t msg_cap)
{
    if (r->mem) {
        if (off > r->meta.bytes || len > r->meta.bytes - off)
            return fb_errf(msg, msg_cap, FB_ERR_DATA,
                           "%s: truncated: %s needs bytes %" PRIu64 "..%" PRIu64
                           " but the shard has %" PRIu64,
                           r->name, what, off, off + len, r->meta.bytes);
        memcpy(dst, r->mem + off, len);
        return 0;
    }
    ssize_t k = pread_full(r->fd, dst, len, off);
    if (k < 0)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot read %s: %s", r->name, strerror(errno));
    if ((size_t)k < len)
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "%s: truncated: %s needs bytes %" PRIu64 "..%" PRIu64
                       " but the file ends at %" PRIu64,
                       r->name, what, off, off + len, off + (uint64_t)k);
    return 0;
}

static int shard_bad(const fb_shard_reader *r, char *msg, size_t msg_cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int shard_bad(const fb_shard_reader *r, char *msg, size_t msg_cap, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: %s", r->name, what);
}

/* Checks index entry c (the bytes at p) of a shard whose header says records records of
 * numel values of esz bytes (var: of variable size), chunks ending at index_off: the chunk
 * starts at pos, right after the one before, and holds records from first on.  Fills *e. */
static int shard_check_entry(const fb_shard_reader *r, uint64_t c, const uint8_t *p, uint64_t pos,
                             uint64_t index_off, uint64_t records, int64_t first, uint64_t numel,
                             size_t esz, bool var, fb_shard_chunk_entry *e, char *msg,
                             size_t msg_cap)
{
    uint64_t off = get_u64(p), stored = get_u64(p + 8), raw = get_u64(p + 16);
    uint64_t n = get_u32(p + 24);
    if (off != pos)
        return shard_bad(r, msg, msg_cap,
                         "chunk %" PRIu64 ": index gives offset %" PRIu64
                         ", but the chunk must start at %" PRIu64,
                         c, off, pos);
    if (stored < 1 || stored > index_off - off)
        return shard_bad(r, msg, msg_cap,
                         "chunk %" PRIu64 ": index entry points outside the "
                         "chunk area (%" PRIu64 " bytes at offset %" PRIu64
                         ", chunks end at %" PRIu64 ")",
                         c, stored, off, index_off);
    if (n < 1 || n > (uint64_t)FB_SHARD_MAX_CHUNK_RECORDS || n > records - (uint64_t)first)
        return shard_bad(r, msg, msg_cap,
                         "chunk %" PRIu64 ": %" PRIu64 " records is out of range "
                         "(the header promises %" PRIu64 " in all, %" PRId64 " before this "
                         "chunk)",
                         c, n, records, first);
    bool raw_ok;
    if (raw > FB_SHARD_MAX_CHUNK_BYTES)
        raw_ok = false;
    else if (var)
        raw_ok = raw >= 8 * n && (raw - 8 * n) % esz == 0;
    else
        raw_ok = raw == n * (4 + numel * esz);
    if (!raw_ok)
        return shard_bad(r, msg, msg_cap,
                         "chunk %" PRIu64 ": decoded size %" PRIu64 " bytes does "
                         "not fit %" PRIu64 " %s records",
                         c, raw, n, var ? "variable" : "fixed");
    if (stored > ZSTD_compressBound((size_t)raw))
        return shard_bad(r, msg, msg_cap,
                         "chunk %" PRIu64 ": %" PRIu64 " stored bytes cannot "
                         "decode to %" PRIu64 " bytes",
                         c, stored, raw);
    *e = (fb_shard_chunk_entry){.offset = off,
                                .stored = stored,
                                .raw = raw,
                                .first_record = first,
                                .records = (int64_t)n,
                                .crc32c = get_u32(p + 28)};
    return FB_OK;
}

/* Checks the header and the index; fills r->meta and r->entries. */
static int shard_load(fb_shard_reader *r, char *msg, size_t msg_cap)
{
    uint64_t size = r->meta.bytes;
    uint8_t h[FB_SHARD_HEADER_BYTES];
    if (size < FB_SHARD_HEADER_BYTES)
        return shard_bad(r, msg, msg_cap,
                         "truncated: %" PRIu64 " bytes is too short for the %d-byte "
                         "shard header",
                         size, FB_SHARD_HEADER_BYTES);
    int rc = rd_at(r, h, sizeof h, 0, "the header", msg, msg_cap);
    if (rc) return rc;
    if (memcmp(h, FB_SHARD_MAGIC, 8) != 0)
        return shard_bad(r, msg, msg_cap,
                         "not a fusebox shard (bad magic %02x %02x %02x %02x %02x "
                         "%02x %02x %02x; a shard starts with \"FBSHARD\\0\")",
                         h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
    uint32_t version = get_u32(h + 8);
    if (version != FB_SHARD_VERSION)
        return shard_bad(r, msg, msg_cap,
                         "shard format version %" PRIu32 "; this fusebox reads "
                         "version %d",
                         version, FB_SHARD_VERSION);
    uint32_t hcrc = fb_crc32c(0, h, 60);
    if (hcrc != get_u32(h + 60))
        return shard_bad(r, msg, msg_cap,
                         "header checksum mismatch (stored %08" PRIx32 ", computed %08" PRIx32 ")",
                         get_u32(h + 60), hcrc);
    if (get_u32(h + 12) != FB_SHARD_HEADER_BYTES)
        return shard_bad(r, msg, msg_cap, "header size %" PRIu32 ", expected %d", get_u32(h + 12),
                         FB_SHARD_HEADER_BYTES);
    int dtype = get_u16(h + 16);
    size_t esz = fb_data_dtype_size(dtype);
    if (!esz)
        return shard_bad(r, msg, msg_cap,
                         "unknown sample dtype code %d (1 uint8, 2 float32, 3 int32)", dtype);
    if (get_u16(h + 18) != FB_SHARD_CODEC_ZSTD)
        return shard_bad(r, msg, msg_cap, "unknown codec %d (1 zstd)", get_u16(h + 18));
    uint32_t flags = get_u32(h + 20);
    if (flags & ~FB_SHARD_FLAG_VARIABLE)
        return shard_bad(r, msg, msg_cap, "unknown flags 0x%08" PRIx32, flags);
    bool var = flags & FB_SHARD_FLAG_VARIABLE;
    uint64_t numel = get_u64(h + 24), records = get_u64(h + 32), chunks = get_u64(h + 40);
    uint64_t index_off = get_u64(h + 48);
    if (var ? numel != 0 : (numel < 1 || numel > (uint64_t)FB_SHARD_MAX_SAMPLE_NUMEL))
        return shard_bad(r, msg, msg_cap,
                         "sample size %" PRIu64 " values is not allowed for %s "
                         "records",
                         numel, var ? "variable" : "fixed");
    if (records < 1 || records > (uint64_t)FB_SHARD_MAX_RECORDS)
        return shard_bad(r, msg, msg_cap, "record count %" PRIu64 " out of range 1..%" PRId64,
                         records, FB_SHARD_MAX_RECORDS);
    if (chunks < 1 || chunks > (uint64_t)FB_SHARD_MAX_CHUNKS || chunks > records)
        return shard_bad(
            r, msg, msg_cap, "chunk count %" PRIu64 " out of range 1..%" PRIu64, chunks,
            records < (uint64_t)FB_SHARD_MAX_CHUNKS ? records : (uint64_t)FB_SHARD_MAX_CHUNKS);
    uint64_t index_len = chunks * FB_SHARD_INDEX_ENTRY_BYTES;
    if (index_off < FB_SHARD_HEADER_BYTES || index_off > size || size - index_off != index_len)
        return shard_bad(r, msg, msg_cap,
                         "the index of %" PRIu64 " chunks (%" PRIu64 " bytes at "
                         "offset %" PRIu64 ") does not end the %" PRIu64 "-byte file%s",
                         chunks, index_len, index_off, size,
                         index_off <= size && size - index_off < index_len ? " (truncated?)" : "");
    uint8_t *idx = malloc((size_t)index_len);
    fb_shard_chunk_entry *e = calloc((size_t)chunks, sizeof *e);
    if (!idx || !e) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((rc = rd_at(r, idx, (size_t)index_len, index_off, "the chunk index", msg, msg_cap)))
        goto fail;
    uint32_t icrc = fb_crc32c(0, idx, (size_t)index_len);
    if (icrc != get_u32(h + 56)) {
        rc = shard_bad(r, msg, msg_cap,
                       "chunk index checksum mismatch (stored %08" PRIx32 ", computed %08" PRIx32
                       ")",
                       get_u32(h + 56), icrc);
        goto fail;
    }
    uint64_t pos = FB_SHARD_HEADER_BYTES, raw_total = 0, max_raw = 0, max_stored = 0;
    int64_t first = 0, max_rec = 0;
    for (uint64_t c = 0; c < chunks; c++) {
        const uint8_t *p = idx + c * FB_SHARD_INDEX_ENTRY_BYTES;
        if ((rc = shard_check_entry(r, c, p, pos, index_off, records, first, numel, esz, var, &e[c],
                                    msg, msg_cap)))
            goto fail;
        uint64_t off = e[c].offset, stored = e[c].stored, raw = e[c].raw;
        uint64_t n = (uint64_t)e[c].records;
        pos = off + stored;
        first += (int64_t)n;
        raw_total += raw;
        if (raw > max_raw) max_raw = raw;
        if (stored > max_stored) max_stored = stored;
        if ((int64_t)n > max_rec) max_rec = (int64_t)n;
    }
    if (pos != index_off) {
        rc = shard_bad(r, msg, msg_cap,
                       "%" PRIu64 " unaccounted bytes between the last chunk and "
                       "the index",
                       index_off - pos);
        goto fail;
    }
    if ((uint64_t)first != records) {
        rc = shard_bad(r, msg, msg_cap,
                       "the chunks hold %" PRId64 " records; the header promises %" PRIu64, first,
                       records);
        goto fail;
    }
    free(idx);
    r->entries = e;
    r->meta.version = (int)version;
    r->meta.dtype = (fb_data_dtype)dtype;
    r->meta.variable = var;
    r->meta.sample_numel = (int64_t)numel;
    r->meta.records = (int64_t)records;
    r->meta.chunks = (int64_t)chunks;
    r->meta.raw_bytes = raw_total;
    r->meta.max_chunk_raw = max_raw;
    r->meta.max_chunk_stored = max_stored;
    r->meta.max_chunk_records = max_rec;
    return 0;
fail:
    free(idx);
    free(e);
    return rc;
}

int fb_shard_open(fb_shard_reader **out, const char *path, char *msg, size_t msg_cap)
{
    if (!out || !path) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_shard_open: NULL argument");
    fb_shard_reader *r = calloc(1, sizeof *r);
    if (!r) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    int rc;
    r->fd = -1;
    if (!(r->name = strdup(path))) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(r->fd, &st) != 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: not a regular file", path);
        goto fail;
    }
    r->meta.bytes = (uint64_t)st.st_size;
    if ((rc = shard_load(r, msg, msg_cap))) goto fail;
    *out = r;
    return 0;
fail:
    fb_shard_close(r);
    return rc;
}

int fb_shard_open_buffer(fb_shard_reader **out, const uint8_t *buf, size_t len, const char *name,
                         char *msg, size_t msg_cap)
{
    if (!out || (!buf && len))
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_shard_open_buffer: NULL argument");
    static const uint8_t empty[1];
    fb_shard_reader *r = calloc(1, sizeof *r);
    if (!r) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    int rc;
    r->fd = -1;
    r->mem = buf ? buf : empty;
    r->meta.bytes = len;
    if (!(r->name = strdup(name ? name : "<buffer>"))) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((rc = shard_load(r, msg, msg_cap))) goto fail;
    *out = r;
    return 0;
fail:
    fb_shard_close(r);
    return rc;
}

void fb_shard_close(fb_shard_reader *r)
{
    if (!r) return;
    if (r->fd >= 0) close(r->fd);
    free(r->name);
    free(r->entries);
    free(r);
}

const fb_shard_meta *fb_shard_get_meta(const fb_shard_reader *r)
{
    return &r->meta;
}

const fb_shard_chunk_entry *fb_shard_get_chunk(const fb_shard_reader *r, int64_t c)
{
    return c >= 0 && c < r->meta.chunks ? &r->entries[c] : NULL;
}

const char *fb_shard_name(const fb_shard_reader *r)
{
    return r->name;
}

fb_shard_scratch *fb_shard_scratch_new(void)
{
    fb_shard_scratch *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (!(s->dctx = ZSTD_createDCtx())) {
        free(s);
        return NULL;
    }
    return s;
}

void fb_shard_scratch_free(fb_shard_scratch *s)
{
    if (!s) return;
    ZSTD_freeDCtx(s->dctx);
    free(s->z);
    free(s->raw);
    free(s);
}

int fb_shard_read_chunk(fb_shard_chunk *out, void *dst, size_t dst_cap, fb_shard_scratch *s,
                        const fb_shard_reader *r, int64_t c, char *msg, size_t msg_cap)
{
    if (!out || !s || !r)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_shard_read_chunk: NULL argument");
    if (c < 0 || c >= r->meta.chunks)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s: chunk %" PRId64
                       " does not exist (the shard has %" PRId64 ")", r->name, c, r->meta.chunks);
    const fb_shard_chunk_entry *e = &r->entries[c];
    size_t raw = (size_t)e->raw, stored = (size_t)e->stored;
    if (dst && dst_cap < raw)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "%s: chunk %" PRId64 " decodes to %zu bytes; the buffer holds %zu", r->name,
                       c, raw, dst_cap);
    if (grow((void **)&s->z, &s->z_cap, stored))
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    char what[64];
    snprintf(what, sizeof what, "chunk %" PRId64, c);
    int rc = rd_at(r, s->z, stored, e->offset, what, msg, msg_cap);
    if (rc) return rc;
    uint32_t crc = fb_crc32c(0, s->z, stored);
    if (crc != e->crc32c)
        return shard_bad(r, msg, msg_cap, "chunk %" PRId64 ": checksum mismatch (index %08" PRIx32
                         ", data %08" PRIx32 ")", c, e->crc32c, crc);
    /* the frame states its size: a disagreement is caught before any allocation */
    unsigned long long fcs = ZSTD_getFrameContentSize(s->z, stored);
    if (fcs == ZSTD_CONTENTSIZE_ERROR)
        return shard_bad(r, msg, msg_cap, "chunk %" PRId64 ": corrupt zstd frame header", c);
    if (fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs != raw)
        return shard_bad(r, msg, msg_cap, "chunk %" PRId64 ": decodes to %llu bytes; the index "
                         "says %zu", c, fcs, raw);
    if (!dst && grow((void **)&s->raw, &s->raw_cap, raw))
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    uint8_t *d = dst ? dst : s->raw;
    size_t got = ZSTD_decompressDCtx(s->dctx, d, raw, s->z, stored);
    if (ZSTD_isError(got))
        return shard_bad(r, msg, msg_cap, "chunk %" PRId64 ": corrupt zstd frame: %s", c,
                         ZSTD_getErrorName(got));
    if (got != raw)
        return shard_bad(r, msg, msg_cap, "chunk %" PRId64 ": decodes to %zu bytes; the index "
                         "says %zu", c, got, raw);
    size_t n = (size_t)e->records, esz = fb_data_dtype_size(r->meta.dtype);
    size_t head = n * 4 * (r->meta.variable ? 2 : 1);
    swap32_if_be(d, head / 4);
    if (r->meta.variable) {
        const uint32_t *lens = (const uint32_t *)(d + n * 4);
        uint64_t total = 0;
        for (size_t i = 0; i < n; i++) {
            if (lens[i] > (uint64_t)FB_SHARD_MAX_SAMPLE_NUMEL)
                return shard_bad(r, msg, msg_cap, "chunk %" PRId64 ": record %zu claims %" PRIu32
                                 " values", c, i, lens[i]);
            total += lens[i];
        }
        if (total * esz != raw - head)
            return shard_bad(r, msg, msg_cap, "chunk %" PRId64 ": record sizes add up to %" PRIu64
                             " values, the chunk holds %zu", c, total, (raw - head) / esz);
    }
    if (esz == 4) swap32_if_be(d + head, (raw - head) / 4);
    out->index = c;
    out->first_record = e->first_record;
    out->records = e->records;
    out->labels = (const int32_t *)d;
    out->lens = r->meta.variable ? (const uint32_t *)(d + n * 4) : NULL;
    out->values = d + head;
    out->values_bytes = raw - head;
    return 0;
}
