/*
 * IDX files and the image-classification datasets stored in them.
 *
 * IDX is the format of MNIST and Fashion-MNIST: two zero bytes, a type byte
 * (0x08 = unsigned byte), a dimension count, one big-endian u32 per
 * dimension, then the values in row-major order, big-endian.  Files may be
 * gzip-compressed; the reader detects that by itself.  Every file is checked
 * strictly (magic, type, 1 to 4 dimensions, no zero or oversized dimension,
 * at most FB_IDX_MAX_BYTES of values, exactly that many bytes present) and
 * every rejection is FB_ERR_DATA with a message naming the file.
 *
 * On top of it, fb_dataset holds a whole labelled split in memory as float
 * pixels in [0, 1] and int32 labels, the form the training runtime's data
 * loader samples minibatches from.  fb_dataset_open_named resolves the
 * dataset names of job specs ("fashion-mnist", "mnist") to files under a data
 * directory.
 *
 * Functions that can fail return 0 or a negative fb_err code and fill the
 * caller's message buffer (msg, msg_cap); on failure outputs are untouched.
 */
#ifndef FB_WORKERS_IO_IDX_H
#define FB_WORKERS_IO_IDX_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define FB_IDX_MAX_DIMS 4
#define FB_IDX_MAX_DIM 0x7FFFFFFF            /* any one dimension */
#define FB_IDX_MAX_BYTES ((uint64_t)1 << 30) /* all values of one file */
#define FB_DATASET_DEFAULT_DIR "/usr/share/datasets"
#define FB_DATASET_DIR_ENV "FUSEBOX_DATA_DIR"

/* IDX value types; the enum value is the type byte of the file. */
typedef enum fb_idx_type {
    FB_IDX_U8 = 0x08,
    FB_IDX_I8 = 0x09,
    FB_IDX_I16 = 0x0B,
    FB_IDX_I32 = 0x0C,
    FB_IDX_F32 = 0x0D,
    FB_IDX_F64 = 0x0E,
} fb_idx_type;

/*
 * A decoded IDX file.  data holds numel values of type, in host byte order
 * (nbytes bytes, owned, malloc-aligned); dims[0..ndim) is the shape.
 */
typedef struct fb_idx {
    fb_idx_type type;
    int ndim;
    int64_t dims[FB_IDX_MAX_DIMS];
    int64_t numel;
    void *data;
    size_t nbytes;
} fb_idx;

/* Bytes per value of an IDX type; 0 for a byte that is not a type. */
size_t fb_idx_type_size(int type);

/*
 * Reads the IDX file at path, raw or gzip-compressed, into *out (release
 * with fb_idx_free).  Returns FB_ERR_IO when the file cannot be opened or
 * read, FB_ERR_DATA when it is not a valid IDX file (also a corrupt or
 * truncated gzip stream), FB_ERR_NOMEM.
 */
int fb_idx_read(const char *path, fb_idx *out, char *msg, size_t msg_cap);

/*
 * Same as fb_idx_read for len uncompressed bytes in memory (copied; buf may
 * be freed afterwards).  The entry point for fuzzers.
 */
int fb_idx_parse_buffer(const uint8_t *buf, size_t len, fb_idx *out, char *msg, size_t msg_cap);

/* Frees idx->data and zeroes *idx.  Accepts NULL and a zeroed struct. */
void fb_idx_free(fb_idx *idx);

/*
 * A labelled image dataset split, in memory.  Sample i is the C*H*W floats
 * at x + i*C*H*W (pixel / 255, channel-major) with label y[i] in
 * [0, n_classes).  x and y are owned; release with fb_dataset_free.
 */
typedef struct fb_dataset {
    int64_t n;
    int C, H, W;
    float *x;
    int32_t *y;
    int n_classes;
} fb_dataset;

/*
 * Loads a split from an images file (unsigned-byte IDX of shape [N, H, W],
 * giving C = 1) and a labels file (unsigned-byte IDX of shape [N]), raw or
 * gzip.  The counts must match.  n_classes is the largest label + 1, but at
 * least 2.  Returns 0, FB_ERR_IO, FB_ERR_DATA, FB_ERR_NOMEM.
 */
int fb_dataset_load_idx(const char *images_path, const char *labels_path, fb_dataset *out,
                        char *msg, size_t msg_cap);

/*
 * Loads a named dataset split: name "fashion-mnist" or "mnist", split
 * "train" or "test", read from <data_dir>/<name>/{train,t10k}-images-idx3-
 * ubyte and -labels-idx1-ubyte, each uncompressed or with ".gz" appended
 * (the uncompressed file is preferred).  data_dir NULL means the environment
 * variable FUSEBOX_DATA_DIR when set and non-empty, else /usr/share/datasets.
 * An unknown name or split, or missing files, is FB_ERR_DATA with a message
 * listing the known names or the paths tried; other errors as
 * fb_dataset_load_idx.
 */
int fb_dataset_open_named(const char *name, const char *split, const char *data_dir,
                          fb_dataset *out, char *msg, size_t msg_cap);

/* Frees ds->x and ds->y and zeroes *ds.  Accepts NULL and a zeroed struct. */
void fb_dataset_free(fb_dataset *ds);

#endif
