/*
 * Dataset directories as a whole: importing IDX and CSV files into shards
 * plus a manifest, verifying every checksum, loading a split into memory,
 * and resolving the dataset name of a job spec to either a shard directory
 * (<data dir>/<name>/manifest.json) or the IDX files fb_dataset_open_named
 * reads.  fusebox-data and the training runtime are built on it.
 *
 * An import writes one split: its shards go to <out>/<split>/, each written
 * atomically, then the manifest is rewritten atomically to list them (other
 * splits already in the manifest are kept; their dtype and shape must
 * agree), then shard files of that split the manifest no longer lists are
 * removed.
 *
 * Functions that can fail return 0 or a negative fb_err and fill the
 * caller's message buffer (msg, msg_cap); on failure outputs are untouched.
 */
#ifndef FB_WORKERS_DATA_DATADIR_H
#define FB_WORKERS_DATA_DATADIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "idx.h"
#include "loader.h"
#include "manifest_file.h"
#include "shard.h"

#define FB_IMPORT_DEFAULT_CHUNK_BYTES ((int64_t)256 << 10) /* decoded bytes per chunk */
#define FB_IMPORT_DEFAULT_SHARD_BYTES ((int64_t)64 << 20)  /* decoded bytes per shard */
#define FB_IMPORT_DEFAULT_LEVEL 3
#define FB_CSV_MAX_BYTES ((size_t)1 << 30)
#define FB_TEXT_MAX_BYTES ((size_t)1 << 30) /* the whole text of an import */
#define FB_TEXT_MAX_CONTEXT 65536            /* tokens a record predicts from */
#define FB_TEXT_MAX_STRIDE ((int64_t)1 << 30)
#define FB_TEXT_VOCAB 256 /* byte-level tokens */
#define FB_TEXT_MAX_FILES 64
#define FB_TEXT_PATH_MAX 4096
#define FB_TEXT_LICENSES_DIR "/usr/share/common-licenses"

typedef struct fb_import_opts {
    const char *out_dir;   /* the dataset directory (created if missing) */
    const char *name;      /* dataset name, a-z 0-9 . _ - */
    const char *split;     /* split name, a-z 0-9 _ - */
    int64_t chunk_records; /* 0 = about FB_IMPORT_DEFAULT_CHUNK_BYTES per chunk */
    int64_t shard_records; /* 0 = about FB_IMPORT_DEFAULT_SHARD_BYTES per shard */
    int level;             /* zstd level; 0 = FB_IMPORT_DEFAULT_LEVEL */
} fb_import_opts;

/* What an import wrote. */
typedef struct fb_import_result {
    int64_t samples, shards, chunks;
    uint64_t bytes, raw_bytes;
    int n_classes; /* 0: no labels */
    int64_t vocab; /* token datasets; 0 for the others */
} fb_import_result;

/*
 * Imports n records: values [n, numel] of dtype (numel the product of
 * shape[0..ndim), ndim 1 or 3) and labels [n] (each in [0, 2^24)) as split
 * o->split of the dataset in o->out_dir.  The manifest's class count
 * becomes the largest label + 1 (at least 2, and never less than before).
 * dtype is uint8 or float32 (token records: fb_datadir_import_tokens).
 * FB_ERR_OUT_OF_RANGE for bad options, FB_ERR_DATA for bad records or a
 * directory holding a different dataset, FB_ERR_IO, FB_ERR_NOMEM.
 */
int fb_datadir_import(fb_import_result *res, const fb_import_opts *o, fb_data_dtype dtype,
                      int ndim, const int64_t *shape, const void *values, const int32_t *labels,
                      int64_t n, char *msg, size_t msg_cap);

/*
 * Imports len bytes of text as byte-level tokens (vocab FB_TEXT_VOCAB, ids
 * 0..255): record i holds the context + 1 bytes from i * stride on, as int32
 * ids, so there are (len - context - 1) / stride + 1 records (bytes after
 * the last whole record are left out).  The dataset has no labels (label 0
 * in the shards, "label": null).  FB_ERR_OUT_OF_RANGE for a context outside
 * 1..FB_TEXT_MAX_CONTEXT or a stride outside 1..FB_TEXT_MAX_STRIDE,
 * FB_ERR_DATA for a text shorter than context + 1 or longer than
 * FB_TEXT_MAX_BYTES; others as fb_datadir_import.
 */
int fb_datadir_import_tokens(fb_import_result *res, const fb_import_opts *o, const uint8_t *text,
                             size_t len, int64_t context, int64_t stride, char *msg,
                             size_t msg_cap);

/*
 * fb_datadir_import_tokens of the n_files files (1..FB_TEXT_MAX_FILES), read
 * whole and joined in the order given; a newline is put after a file that
 * does not end with one, so that two files never share a line.  A file that
 * is missing, unreadable or empty is an error naming it (FB_ERR_DATA for
 * missing or empty, FB_ERR_IO for unreadable).
 */
int fb_datadir_import_text(fb_import_result *res, const fb_import_opts *o,
                           const char *const *files, int n_files, int64_t context, int64_t stride,
                           char *msg, size_t msg_cap);

/*
 * The built-in text corpora: "licenses", the licence texts every Debian
 * system has under dir (FB_TEXT_LICENSES_DIR when NULL): GPL-3, GPL-2,
 * LGPL-3, LGPL-2.1, Apache-2.0, Artistic, BSD, in that order.  Fills
 * paths[0..*n) and returns 0; FB_ERR_OUT_OF_RANGE for an
 * unknown corpus name, FB_ERR_DATA naming the first file that is missing.
 */
int fb_datadir_builtin_text(char paths[][FB_TEXT_PATH_MAX], int *n, const char *corpus,
                            const char *dir, char *msg, size_t msg_cap);

/*
 * Imports an IDX pair (raw or gzip): images of unsigned bytes [N, H, W]
 * (stored as [1, H, W]) or [N, C, H, W], or float32 [N, F] / [N, C, H, W];
 * labels of any integer IDX type, shape [N].  Errors as fb_datadir_import
 * and fb_idx_read, naming the file.
 */
int fb_datadir_import_idx(fb_import_result *res, const fb_import_opts *o, const char *images,
                          const char *labels, char *msg, size_t msg_cap);

/* Whether the first CSV line is a header. */
typedef enum fb_csv_header { FB_CSV_HEADER_AUTO, FB_CSV_HEADER_YES, FB_CSV_HEADER_NO } fb_csv_header;

/*
 * Imports a CSV file of numeric features and one integer label column
 * (label_column: a header name, or a 0-based column index) as float32
 * records of shape [F].  With FB_CSV_HEADER_AUTO the first line is a header
 * when one of its fields is not a number.  Fields may be double-quoted.
 * Every row must have the header's field count; every feature must be a
 * finite number and every label an integer in [0, 2^24).  FB_ERR_DATA
 * naming the file, line and column; others as fb_datadir_import.
 */
int fb_datadir_import_csv(fb_import_result *res, const fb_import_opts *o, const char *csv_path,
                          const char *label_column, fb_csv_header header, char *msg,
                          size_t msg_cap);

/* What verifying one shard found. */
typedef struct fb_verify_result {
    int64_t records, chunks;
    uint64_t bytes, raw_bytes;
} fb_verify_result;

/*
 * Verifies shard sh of dataset m in dir completely: size and whole-file
 * CRC32C against the manifest, header and index checksums, agreement of the
 * header with the manifest, then every chunk (checksum, decompression,
 * layout, labels within the manifest's classes).  FB_ERR_DATA naming the
 * file (and chunk), FB_ERR_IO, FB_ERR_NOMEM.
 */
int fb_datadir_verify_shard(fb_verify_result *res, const fb_manifest *m, const char *dir,
                            const fb_manifest_shard *sh, char *msg, size_t msg_cap);

/*
 * Loads a whole split of a fixed-record dataset into memory, in file order,
 * as an fb_dataset (uint8 values become value / 255, int32 token ids exact
 * float values, y 0 for a dataset without labels; shape [F] becomes
 * C = 1, H = 1, W = F).  FB_ERR_NOT_FOUND for an unknown split,
 * FB_ERR_UNSUPPORTED for variable records, FB_ERR_DATA, FB_ERR_IO,
 * FB_ERR_NOMEM.
 */
int fb_datadir_load_split(fb_dataset *out, const char *dir, const char *split, char *msg,
                          size_t msg_cap);

/* Which records of a split a load takes (fb_data_held_out decides). */
typedef enum fb_data_part {
    FB_PART_ALL,      /* every record */
    FB_PART_KEPT,     /* the records that train */
    FB_PART_HELD_OUT  /* the records held out for validation */
} fb_data_part;

/*
 * fb_datadir_load_split of the records in `part` under val_fraction only, in
 * file order (n may be 0).  Errors as fb_datadir_load_split.
 */
int fb_datadir_load_split_part(fb_dataset *out, const char *dir, const char *split,
                               fb_data_part part, double val_fraction, char *msg,
                               size_t msg_cap);

/*
 * Holds records out of an in-memory training split: the records
 * fb_data_held_out picks under val_fraction go, in order, into *val (owned,
 * n may be 0), and the others move down in place, in order, so *train then
 * holds only them (train->n shrinks; its buffers keep their size).
 * FB_ERR_NOMEM, with train unchanged.
 */
int fb_dataset_holdout(fb_dataset *train, fb_dataset *val, double val_fraction, char *msg,
                       size_t msg_cap);

/* The name of a dataset's validation split: "val" or "validation" when the
 * manifest has one (in that order), else NULL. */
const char *fb_datadir_val_split(const fb_manifest *m);

/*
 * The validation set of the shard dataset in dir: its validation split
 * (fb_datadir_val_split) when it has one, else the records of its train split
 * held out under val_fraction (none when it is 0).  *held_fraction receives
 * the fraction the training loader must hold out: 0 with a validation split,
 * else val_fraction.  With load false nothing is read but the manifest and
 * *val stays empty (n 0).  Errors as fb_datadir_load_split.
 */
int fb_datadir_load_val(fb_dataset *val, double *held_fraction, const char *dir,
                        double val_fraction, bool load, char *msg, size_t msg_cap);

/*
 * Resolves a dataset name: dir receives <data_dir>/<name> and the result is
 * 1 when it holds a manifest.json (a shard dataset), 0 otherwise.  data_dir
 * NULL means $FUSEBOX_DATA_DIR when set and non-empty, else
 * /usr/share/datasets.  -1 for a name that is not a valid dataset name or a
 * path that does not fit dir_cap.
 */
int fb_datadir_resolve(char *dir, size_t dir_cap, const char *name, const char *data_dir);

/* How fb_data_open_named reads a shard dataset's training split. */
typedef struct fb_data_source_opts {
    int64_t batch_size;
    bool shuffle;
    uint64_t data_seed;
    int threads;            /* loader reader threads; 0 = 2 */
    const char *cache_dir;  /* staging cache, or NULL */
    uint64_t cache_bytes;
    bool want_test;         /* also load the test split into memory */
    bool want_val;          /* also load the validation set into memory */
    /* [0, FB_DATA_MAX_VAL_FRACTION]: the spec's val_fraction, the part of train held out for
     * validation when the dataset has no validation split */
    double val_fraction;
    /* a shard dataset's loader begins where a run from the start would be after this many
     * batches (a resume; fb_loader_pos_at_step); 0 = from the start */
    int64_t start_step;
} fb_data_source_opts;

/*
 * Opens a named dataset for training.  A shard dataset (see
 * fb_datadir_resolve) gets a loader over its train split (*loader; batches
 * of o->batch_size, drop_last, from position {0, 0}, or from batch
 * o->start_step's position on a resume) that holds out the validation
 * records when the dataset has no validation split (fb_datadir_load_val);
 * *train then describes what trains (n, C, H, W, n_classes) with x and y
 * NULL.  Otherwise the IDX files are loaded by fb_dataset_open_named, the
 * validation records held out of train (fb_dataset_holdout: IDX datasets
 * have no validation split), and *loader is NULL.  val (the validation set,
 * n 0 when there is none) is loaded into memory when o->want_val and test
 * when o->want_test (left zeroed otherwise).  Release with fb_dataset_free
 * and fb_loader_free.  FB_ERR_OUT_OF_RANGE for a bad val_fraction; others as
 * the functions named.
 */
int fb_data_open_named(fb_dataset *train, fb_dataset *val, fb_dataset *test, fb_loader **loader,
                       const char *name, const char *data_dir, const fb_data_source_opts *o,
                       char *msg, size_t msg_cap);

#endif
