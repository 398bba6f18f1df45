/*
 * The manifest as a file of a dataset directory: reading and parsing it,
 * writing it atomically, and comparing it with the shard files it lists.
 * The format itself (the structs, the strict parser, the canonical JSON) is
 * the contract in api/manifest.h, which fuseboxd shares.
 *
 * Functions that can fail return 0 or a negative fb_err and fill the
 * caller's message buffer (msg, msg_cap); on failure outputs are untouched.
 */
#ifndef FB_WORKERS_DATA_MANIFEST_FILE_H
#define FB_WORKERS_DATA_MANIFEST_FILE_H

#include <stddef.h>

#include "manifest.h"
#include "shard.h"

/* Reads and parses the manifest file at path (FB_ERR_IO when unreadable). */
int fb_manifest_read(fb_manifest *out, const char *path, char *msg, size_t msg_cap);

/*
 * Loads <dir>/manifest.json and checks it against the shard files of every
 * split (fb_manifest_check_files).
 */
int fb_manifest_open_dir(fb_manifest *out, const char *dir, char *msg, size_t msg_cap);

/* Writes m to path atomically (temporary file, fsync, rename). */
int fb_manifest_write(const char *path, const fb_manifest *m, char *msg, size_t msg_cap);

/*
 * Checks the shard files of split (every split when NULL) under dir against
 * m: each exists, has the manifest's size, and its header agrees on dtype,
 * sample size, records and chunks.  Does not read chunks or whole-file
 * checksums (fb_datadir_verify does).  FB_ERR_DATA naming the file; FB_ERR_IO.
 */
int fb_manifest_check_files(const fb_manifest *m, const char *dir, const char *split, char *msg,
                            size_t msg_cap);

/*
 * Checks the records of a decoded chunk ch of dataset m, read from the file
 * path: every label in [0, n_classes) (0 for a dataset without labels) and,
 * for a token dataset, every id in [0, vocab).  FB_ERR_DATA naming the file,
 * the chunk and the record (and, for an id, its position in the record).
 */
int fb_manifest_check_chunk(const fb_manifest *m, const fb_shard_chunk *ch, const char *path,
                            char *msg, size_t msg_cap);

/*
 * Converts n stored values of dtype to the floats the loader delivers:
 * uint8 as value / 255, float32 as stored, int32 token ids as exact float
 * values (ids of a checked chunk are below 2^24, so exact).
 */
void fb_data_values_to_float(float *dst, fb_data_dtype dtype, const void *src, int64_t n);

#endif
