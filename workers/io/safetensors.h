/*
 * safetensors: the file format of fusebox checkpoints and exported models.
 *
 * A safetensors file is an 8-byte little-endian header length, a JSON header
 * that maps each tensor name to {"dtype", "shape", "data_offsets": [begin,
 * end]} (plus an optional "__metadata__" object of string values), then the
 * raw little-endian tensor data.  fusebox names tensors after PyTorch's
 * nn.Sequential state-dict keys ("0.weight", "3.body.1.running_mean"), so a
 * user can load a checkpoint into the equivalent PyTorch model with any real
 * safetensors reader.
 *
 * The reader loads a whole file into memory and validates it strictly before
 * handing out anything: bounded header, known dtypes, sizes that match shapes,
 * offsets that tile the data section exactly, no duplicate names.  Every
 * rejection is FB_ERR_CHECKPOINT with a message naming the problem.  The
 * writer lays tensors out the way the reference implementation does (sorted
 * JSON keys, header padded with spaces to a multiple of 8 bytes, each tensor
 * aligned to its element size) and replaces the target file atomically.
 *
 * All functions that can fail return 0 or a negative fb_err code and fill the
 * caller's message buffer (msg, msg_cap); on failure outputs are untouched.
 */
#ifndef FB_WORKERS_IO_SAFETENSORS_H
#define FB_WORKERS_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define FB_ST_MAX_DIMS 8                               /* dimensions of one tensor */
#define FB_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* JSON header bytes, as the reference */

typedef enum fb_st_dtype {
    FB_ST_BOOL,
    FB_ST_U8,
    FB_ST_I8,
    FB_ST_F8_E5M2,
    FB_ST_F8_E4M3,
    FB_ST_I16,
    FB_ST_U16,
    FB_ST_F16,
    FB_ST_BF16,
    FB_ST_I32,
    FB_ST_U32,
    FB_ST_F32,
    FB_ST_F64,
    FB_ST_I64,
    FB_ST_U64,
    FB_ST_DTYPE_COUNT
} fb_st_dtype;

/* The header's name of a dtype ("F32"); "?" for a value outside the enum. */
const char *fb_st_dtype_name(fb_st_dtype dtype);

/* Bytes per element of a dtype; 0 for a value outside the enum. */
size_t fb_st_dtype_size(fb_st_dtype dtype);

/* Looks a header dtype name up; returns 1 and sets *out, or 0 if unknown. */
int fb_st_dtype_from_name(const char *name, fb_st_dtype *out);

/* ------------------------------------------------------------------ reader */

typedef struct fb_st_file fb_st_file;

/*
 * One tensor of an open file.  name and data point into the file and live as
 * long as it.  data holds nbytes = numel * fb_st_dtype_size(dtype) bytes of
 * little-endian values and is NOT necessarily aligned for its type: copy it
 * out (memcpy, fb_st_get_f32, fb_st_get_i64) rather than casting.  A scalar
 * has ndim 0 and numel 1.
 */
typedef struct fb_st_tensor {
    const char *name;
    fb_st_dtype dtype;
    int ndim;
    int64_t shape[FB_ST_MAX_DIMS];
    int64_t numel;
    const uint8_t *data;
    size_t nbytes;
} fb_st_tensor;

/*
 * Reads and validates the safetensors file at path.  On success *out owns
 * the whole file contents; release it with fb_st_close.  Returns FB_ERR_IO
 * when the file cannot be read, FB_ERR_CHECKPOINT when it is not a valid
 * safetensors file, FB_ERR_NOMEM.
 */
int fb_st_open(const char *path, fb_st_file **out, char *msg, size_t msg_cap);

/*
 * Validates len bytes at buf as a safetensors file and, on success, returns
 * in *out a file that owns a copy of them (buf may be freed afterwards).
 * Same checks and errors as fb_st_open without the file system; this is the
 * entry point for fuzzers.
 */
int fb_st_parse_buffer(const uint8_t *buf, size_t len, fb_st_file **out, char *msg, size_t msg_cap);

/* Releases a file and everything pointing into it.  Accepts NULL. */
void fb_st_close(fb_st_file *file);

/* Number of tensors in the file. */
size_t fb_st_count(const fb_st_file *file);

/* The i-th tensor, in byte order of names (strcmp); NULL when i >= count. */
const fb_st_tensor *fb_st_at(const fb_st_file *file, size_t i);

/* The tensor with this name, or NULL when the file has none. */
const fb_st_tensor *fb_st_find(const fb_st_file *file, const char *name);

/* Number of "__metadata__" entries. */
size_t fb_st_metadata_count(const fb_st_file *file);

/* The i-th metadata entry (sorted by key) in *key and *value; returns 0, or
 * FB_ERR_NOT_FOUND when i >= count (outputs untouched). */
int fb_st_metadata_at(const fb_st_file *file, size_t i, const char **key, const char **value);

/* The metadata value stored under key, or NULL. */
const char *fb_st_metadata_get(const fb_st_file *file, const char *key);

/*
 * Copies tensor name into dst as float32, after checking that it exists and
 * that its shape is exactly expected_shape[0..ndim) (ndim 0: a scalar).  dst
 * must hold the product of expected_shape floats.  F32 is copied; F64, F16
 * and BF16 are converted (F64 rounds to nearest).  Any other dtype, a missing
 * tensor or a different shape is FB_ERR_CHECKPOINT with a message such as
 * "tensor 0.weight has shape [256, 784], expected [128, 784]".
 */
int fb_st_get_f32(const fb_st_file *file, const char *name, const int64_t *expected_shape, int ndim,
                  float *dst, char *msg, size_t msg_cap);

/*
 * Same as fb_st_get_f32 for int64: I64 is copied; I32, I16, I8, U8, U16,
 * U32 and BOOL are widened; U64 is accepted only where every value fits.
 */
int fb_st_get_i64(const fb_st_file *file, const char *name, const int64_t *expected_shape, int ndim,
                  int64_t *dst, char *msg, size_t msg_cap);

/* ------------------------------------------------------------------ writer */

typedef struct fb_st_writer fb_st_writer;

/* A new, empty writer, or NULL when out of memory. */
fb_st_writer *fb_st_writer_new(void);

/* Releases a writer (not the tensor data it references).  Accepts NULL. */
void fb_st_writer_free(fb_st_writer *w);

/*
 * Adds a tensor: name (non-empty valid UTF-8, not "__metadata__", not added
 * before), dtype, shape[0..ndim) with 0 <= ndim <= FB_ST_MAX_DIMS and every
 * dimension >= 0, and data holding numel * fb_st_dtype_size(dtype) bytes in
 * host (little-endian) order.  The writer copies name and shape but only
 * REFERENCES data: it must stay valid and unchanged until fb_st_write has
 * returned.  data may be NULL only when the tensor has no elements.
 * Returns 0, FB_ERR_CHECKPOINT for an invalid tensor, FB_ERR_NOMEM.
 */
int fb_st_writer_add(fb_st_writer *w, const char *name, fb_st_dtype dtype, const int64_t *shape,
                     int ndim, const void *data, char *msg, size_t msg_cap);

/* Shorthand for fb_st_writer_add with FB_ST_F32. */
int fb_st_writer_add_f32(fb_st_writer *w, const char *name, const int64_t *shape, int ndim,
                         const float *data, char *msg, size_t msg_cap);

/* Shorthand for fb_st_writer_add with FB_ST_I64. */
int fb_st_writer_add_i64(fb_st_writer *w, const char *name, const int64_t *shape, int ndim,
                         const int64_t *data, char *msg, size_t msg_cap);

/*
 * Sets "__metadata__"[key] = value (both copied, valid UTF-8), replacing an
 * earlier value of the same key.  Returns 0, FB_ERR_CHECKPOINT, FB_ERR_NOMEM.
 */
int fb_st_writer_set_metadata(fb_st_writer *w, const char *key, const char *value, char *msg,
                              size_t msg_cap);

/*
 * Writes everything added so far to path, atomically: the bytes go to
 * "<path>.tmp.<pid>", which is fsynced, renamed over path, and then the
 * directory is fsynced.  On failure the temporary file is removed and an
 * existing file at path is left as it was, except when only the final
 * directory fsync fails (the new file is then in place; FB_ERR_IO is still
 * returned because durability is not guaranteed).  The writer can be written
 * again or extended afterwards.  The temporary name is per process, so two
 * threads of one process must not write the same path at the same time.
 * Returns 0, FB_ERR_IO, FB_ERR_NOMEM.
 */
int fb_st_write(const fb_st_writer *w, const char *path, char *msg, size_t msg_cap);

/*
 * Serialises everything added so far into memory: *buf receives a malloc'd
 * block of *len bytes (the caller frees it), byte for byte what fb_st_write
 * would put in a file (both use one serializer), and readable back with
 * fb_st_parse_buffer.  This is how checkpoints travel without a file system
 * (worker messages, tests).  Returns 0, FB_ERR_CHECKPOINT (header over
 * FB_ST_MAX_HEADER), FB_ERR_NOMEM; *buf and *len are untouched on failure.
 */
int fb_st_write_buffer(const fb_st_writer *w, void **buf, size_t *len, char *msg,
                       size_t msg_cap);

#endif
