/*
 * Record shards: the on-disk unit of a fusebox dataset (docs/data-format.md).
 *
 * A shard holds records (a label and a sample of uint8 or float32 values)
 * grouped into chunks.  Each chunk is one zstd frame with a CRC32C of its
 * stored bytes; an index after the chunks gives every chunk's offset, sizes,
 * record count and checksum, so any chunk is read with one pread.  A 64-byte
 * header (magic, format version, sample type, counts, index position, and
 * CRC32Cs of itself and of the index) starts the file.  Records are either
 * all of one size (fixed, the form the loader trains from) or each of its own
 * size (variable).
 *
 * The writer writes to a temporary name, fsyncs and renames, so a shard that
 * exists is complete.  The reader trusts nothing in the file: every count,
 * size and offset is checked against the file and against the format's
 * limits before it is used, and every failure is FB_ERR_DATA with a message
 * naming the file and, where there is one, the chunk.  A reader is read-only
 * after opening and may be shared between threads; each thread decodes with
 * its own fb_shard_scratch.
 *
 * Functions that can fail return 0 or a negative fb_err and fill the
 * caller's message buffer (msg, msg_cap); on failure outputs are untouched.
 */
#ifndef FB_WORKERS_DATA_SHARD_H
#define FB_WORKERS_DATA_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "manifest.h" /* api/: the sample dtypes (fb_data_dtype) */

#define FB_SHARD_MAGIC "FBSHARD"           /* 7 characters and a NUL: bytes 0..7 */
#define FB_SHARD_VERSION 1
#define FB_SHARD_HEADER_BYTES 64
#define FB_SHARD_INDEX_ENTRY_BYTES 32
#define FB_SHARD_CODEC_ZSTD 1
#define FB_SHARD_FLAG_VARIABLE 1u             /* records have their own sizes */
#define FB_SHARD_MAX_CHUNKS ((int64_t)1 << 24)
#define FB_SHARD_MAX_CHUNK_RECORDS ((int64_t)1 << 20)
#define FB_SHARD_MAX_CHUNK_BYTES ((uint64_t)1 << 28) /* decoded bytes of one chunk */
#define FB_SHARD_MAX_SAMPLE_NUMEL ((int64_t)1 << 26)
#define FB_SHARD_MAX_RECORDS ((int64_t)1 << 40)

/* What a new shard holds and how it is packed. */
typedef struct fb_shard_params {
    fb_data_dtype dtype;
    int64_t sample_numel;  /* values per record; 0 = variable-size records */
    int64_t chunk_records; /* records per chunk, 1..FB_SHARD_MAX_CHUNK_RECORDS */
    int level;             /* zstd level (1..19; negative: faster levels) */
} fb_shard_params;

/* A finished shard: what the manifest records about it. */
typedef struct fb_shard_info {
    uint64_t bytes;     /* file size */
    uint64_t raw_bytes; /* decoded bytes of all chunks */
    int64_t records;
    int64_t chunks;
    uint32_t crc32c;    /* of the whole file */
} fb_shard_info;

typedef struct fb_shard_writer fb_shard_writer;

/*
 * Starts a shard that will appear at path when finished (it is written to a
 * temporary name in the same directory until then).  Rejects parameters
 * outside the format's limits with FB_ERR_OUT_OF_RANGE; FB_ERR_IO when the
 * temporary file cannot be created; FB_ERR_NOMEM.
 */
int fb_shard_writer_open(fb_shard_writer **out, const char *path, const fb_shard_params *p,
                         char *msg, size_t msg_cap);

/*
 * Appends one record: numel values of the writer's dtype at values, and its
 * label.  For fixed records numel must equal sample_numel.  A chunk is
 * compressed and written when it is full.  FB_ERR_OUT_OF_RANGE for a record
 * that does not fit the shard; FB_ERR_IO; FB_ERR_NOMEM.
 */
int fb_shard_writer_add(fb_shard_writer *w, const void *values, int64_t numel, int32_t label,
                        char *msg, size_t msg_cap);

/*
 * Writes the last chunk, the index and the header, fsyncs, checksums the
 * whole file, renames it to its final path and fsyncs the directory.  info
 * (may be NULL) receives what the manifest needs.  A shard needs at least
 * one record (FB_ERR_OUT_OF_RANGE).  The writer must still be freed.
 */
int fb_shard_writer_finish(fb_shard_info *info, fb_shard_writer *w, char *msg, size_t msg_cap);

/* Frees a writer; an unfinished shard's temporary file is removed.  Accepts
 * NULL. */
void fb_shard_writer_free(fb_shard_writer *w);

/* What an open shard's header and index say (all checked). */
typedef struct fb_shard_meta {
    int version;
    fb_data_dtype dtype;
    bool variable;
    int64_t sample_numel;      /* 0 for variable records */
    int64_t records;
    int64_t chunks;
    uint64_t bytes;            /* file size */
    uint64_t raw_bytes;        /* decoded bytes of all chunks */
    uint64_t max_chunk_raw;    /* largest decoded chunk */
    uint64_t max_chunk_stored; /* largest stored chunk */
    int64_t max_chunk_records;
} fb_shard_meta;

/* One index entry, as checked at open. */
typedef struct fb_shard_chunk_entry {
    uint64_t offset, stored, raw;
    int64_t first_record, records;
    uint32_t crc32c; /* of the stored bytes */
} fb_shard_chunk_entry;

typedef struct fb_shard_reader fb_shard_reader;

/*
 * Opens the shard at path: reads and checks the header and the whole index
 * (every entry lies inside the chunk area, chunks are contiguous, sizes agree
 * with the record counts, checksums match).  Chunk contents are checked when
 * read.  FB_ERR_IO when the file cannot be opened or read, FB_ERR_DATA for
 * anything wrong with it, FB_ERR_NOMEM.
 */
int fb_shard_open(fb_shard_reader **out, const char *path, char *msg, size_t msg_cap);

/*
 * The same over len bytes in memory (not copied: buf must outlive the
 * reader); name is used in messages.  The entry point for fuzzers.
 */
int fb_shard_open_buffer(fb_shard_reader **out, const uint8_t *buf, size_t len, const char *name,
                         char *msg, size_t msg_cap);

/* Closes the shard.  Accepts NULL. */
void fb_shard_close(fb_shard_reader *r);

/* The checked header and index summary. */
const fb_shard_meta *fb_shard_get_meta(const fb_shard_reader *r);
/* Index entry of chunk c, 0 <= c < chunks. */
const fb_shard_chunk_entry *fb_shard_get_chunk(const fb_shard_reader *r, int64_t c);
/* The path or name the shard was opened with. */
const char *fb_shard_name(const fb_shard_reader *r);

/* Per-thread decoding state: a zstd context and a buffer for stored bytes. */
typedef struct fb_shard_scratch fb_shard_scratch;

/* Returns a new scratch, or NULL when out of memory. */
fb_shard_scratch *fb_shard_scratch_new(void);
/* Frees a scratch.  Accepts NULL. */
void fb_shard_scratch_free(fb_shard_scratch *s);

/*
 * A decoded chunk.  labels [records]; for fixed records, record i's values
 * are sample_numel values at values + i * sample_numel * dtype size; for
 * variable records, lens [records] gives each record's value count and the
 * records' values follow one another from values.  The pointers lie in the
 * buffer the chunk was decoded into.
 */
typedef struct fb_shard_chunk {
    int64_t index, first_record, records;
    const int32_t *labels;
    const uint32_t *lens; /* NULL for fixed records */
    const void *values;
    size_t values_bytes;
} fb_shard_chunk;

/*
 * Reads chunk c with one pread, checks its CRC32C, decompresses it into dst
 * (dst_cap >= the entry's raw size, suitably aligned for float, e.g. from
 * malloc) or, when dst is NULL, into a buffer of the scratch that stays
 * valid until the scratch's next use, and checks the decoded layout.  out
 * describes the records.  FB_ERR_DATA naming the file and chunk for a
 * checksum mismatch, a corrupt frame, a size that disagrees with the index
 * or a truncated file; FB_ERR_IO; FB_ERR_NOMEM; FB_ERR_OUT_OF_RANGE for a bad
 * c or a dst too small.
 */
int fb_shard_read_chunk(fb_shard_chunk *out, void *dst, size_t dst_cap, fb_shard_scratch *s,
                        const fb_shard_reader *r, int64_t c, char *msg, size_t msg_cap);

/*
 * CRC32C of the whole file at path and its size.  FB_ERR_IO when it cannot
 * be read.
 */
int fb_file_crc32c(uint32_t *crc, uint64_t *bytes, const char *path, char *msg, size_t msg_cap);

#endif
