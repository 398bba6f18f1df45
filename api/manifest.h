/*
 * The manifest of a shard dataset: manifest.json at the top of the dataset
 * directory (docs/data-format.md), the contract between fusebox-data, which
 * writes it, the workers, which train from it, and fuseboxd, which reads it
 * after an import to record and show the dataset.
 *
 * It names the dataset, gives the sample dtype and shape (or "variable"),
 * for token datasets (dtype int32) the vocabulary size, the label type and
 * class count (or null: a token dataset may have no labels), and for each split (train, test, ...) its
 * sample count and its shards in order, each with its path relative to the
 * directory, size in bytes, record and chunk counts and the CRC32C of the
 * whole file.  Parsing is strict: an unknown field, a missing field, a wrong
 * type, a value out of range, a path that could leave the directory, or
 * counts that disagree with each other is FB_ERR_DATA with a message naming
 * the manifest and the field.  This module works on bytes and structs only;
 * reading, writing and comparing with the shard files is the data store's
 * (workers/data/manifest_file.h).
 *
 * Functions that can fail return 0 or a negative fb_err and fill the
 * caller's message buffer (msg, msg_cap); on failure outputs are untouched.
 */
#ifndef FB_API_MANIFEST_H
#define FB_API_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define FB_MANIFEST_FILE "manifest.json"
#define FB_MANIFEST_FORMAT "fusebox-dataset"
#define FB_MANIFEST_VERSION 1
#define FB_MANIFEST_NAME_MAX 64      /* dataset name: a-z 0-9 . _ - */
#define FB_MANIFEST_SPLIT_MAX 32     /* split name: a-z 0-9 _ - */
#define FB_MANIFEST_PATH_MAX 255     /* shard path, relative */
#define FB_MANIFEST_MAX_SPLITS 8
#define FB_MANIFEST_MAX_SHARDS 65536 /* per split */
#define FB_MANIFEST_MAX_DIMS 3
#define FB_MANIFEST_MAX_CLASSES (1 << 24)
/* Token ids of an int32 dataset are in [0, vocab), vocab at most 2^24: every
 * id is then exact as a float32, which is how the loader delivers it. */
#define FB_MANIFEST_MAX_VOCAB ((int64_t)1 << 24)
#define FB_MANIFEST_MAX_BYTES ((size_t)64 << 20)

/* The shard format's limits as the manifest checks them (workers/data/shard.h
 * has the same values under FB_SHARD_*; manifest_file.c asserts that they
 * agree): records of a shard or a split, chunks of a shard, values of a
 * sample, and the smallest shard file (a header and one index entry). */
#define FB_MANIFEST_MAX_RECORDS ((int64_t)1 << 40)
#define FB_MANIFEST_MAX_CHUNKS ((int64_t)1 << 24)
#define FB_MANIFEST_MAX_SAMPLE_NUMEL ((int64_t)1 << 26)
#define FB_MANIFEST_MIN_SHARD_BYTES (64 + 32)

/* Sample value types; the enum value is the code stored in shard headers. */
typedef enum fb_data_dtype {
    FB_DTYPE_U8 = 1,  /* pixels: the loader delivers value / 255 */
    FB_DTYPE_F32 = 2, /* features: delivered as stored */
    FB_DTYPE_I32 = 3, /* token ids in [0, vocab): delivered as exact float values */
} fb_data_dtype;

/* Bytes per value of a dtype; 0 for a code that is not a dtype. */
size_t fb_data_dtype_size(int dtype);
/* "uint8", "float32", "int32", or NULL for a code that is not a dtype. */
const char *fb_data_dtype_name(int dtype);
/* Parses "uint8" / "float32" / "int32"; returns 1 and sets *out, or 0. */
int fb_data_dtype_parse(fb_data_dtype *out, const char *name);

typedef struct fb_manifest_shard {
    char path[FB_MANIFEST_PATH_MAX + 1]; /* relative to the dataset directory */
    uint64_t bytes;
    int64_t records, chunks;
    uint32_t crc32c; /* of the whole file */
} fb_manifest_shard;

typedef struct fb_manifest_split {
    char name[FB_MANIFEST_SPLIT_MAX + 1];
    int64_t samples; /* = sum of the shards' records */
    int n_shards;
    fb_manifest_shard *shards; /* owned */
} fb_manifest_split;

/*
 * A parsed manifest.  shape[0..ndim) is the per-sample shape ((F) or
 * (C, H, W)); ndim is 0 and sample_numel 0 for variable-size records.
 * A token dataset (dtype FB_DTYPE_I32) has records of shape (L), ids in
 * [0, vocab) with vocab in 1..FB_MANIFEST_MAX_VOCAB ("tokens": {"vocab": V}
 * in the JSON); every other dtype has vocab 0.  Labels are int32 class
 * indices in [0, n_classes); n_classes is 0 for a label-less dataset
 * ("label": null, allowed only for token datasets, whose shards then hold
 * label 0 for every record).  Splits are in the order the JSON lists them.
 */
typedef struct fb_manifest {
    char name[FB_MANIFEST_NAME_MAX + 1];
    fb_data_dtype dtype;
    int ndim;
    int64_t shape[FB_MANIFEST_MAX_DIMS];
    int64_t sample_numel;
    int64_t vocab; /* token datasets: ids in [0, vocab); 0 for the others */
    int n_classes; /* 0: no labels (token datasets only) */
    int n_splits;
    fb_manifest_split splits[FB_MANIFEST_MAX_SPLITS];
} fb_manifest;

/*
 * Parses len bytes of manifest JSON; source names it in messages.  *out
 * must be released with fb_manifest_free.  FB_ERR_DATA for anything outside
 * the format, FB_ERR_NOMEM.
 */
int fb_manifest_parse(fb_manifest *out, const char *json, size_t len, const char *source,
                      char *msg, size_t msg_cap);

/*
 * Serialises m (which must be valid: it is checked as fb_manifest_parse
 * would) as canonical JSON; *json is malloc'd, NUL-terminated.
 */
int fb_manifest_to_json(char **json, const fb_manifest *m, char *msg, size_t msg_cap);

/* The split called name, or NULL. */
const fb_manifest_split *fb_manifest_find_split(const fb_manifest *m, const char *name);

/* Total bytes of a split's shards. */
uint64_t fb_manifest_split_bytes(const fb_manifest_split *s);

/* Frees every split's shard list and zeroes *m.  Accepts NULL. */
void fb_manifest_free(fb_manifest *m);

/* 1 when name is a valid dataset name (1-64 of a-z 0-9 . _ -, not "." or ".."). */
int fb_manifest_valid_name(const char *name);

/* 1 when name is a valid split name (1-32 of a-z 0-9 _ -). */
int fb_manifest_valid_split_name(const char *name);

#endif
