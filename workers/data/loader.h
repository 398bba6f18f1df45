/*
 * The data loader: reader threads that turn a split of a shard dataset into
 * a stream of ready minibatches, in an order fixed by data_seed alone.
 *
 * Order (docs/data-format.md, "Sample order").  The split's chunks, in
 * manifest order (shard by shard, chunk by chunk), are numbered 0..G-1 and
 * its records 0..n-1.  Epoch e visits the chunks in a permutation drawn from
 * (data_seed, e); consecutive runs of W chunks of that sequence form
 * windows (the shuffle buffer: W = max(1, floor(shuffle_buffer * G / n)));
 * the records of each window are visited in a permutation drawn from
 * (data_seed, e, window).  Every epoch therefore visits every record exactly
 * once.  With shuffle false both permutations are the identity: file order.
 * Global batch k of an epoch is positions [k*N, (k+1)*N) of that order; with
 * drop_last the last partial batch is skipped (an epoch is floor(n/N)
 * batches), otherwise it is delivered short.  Nothing about the order
 * depends on the number of threads, the queue depth, staging or rank
 * splits, so it is the same on every rank and every run.
 *
 * Data parallelism.  Rank r of D reads only its part of each global batch:
 * with counts c[0..D) (summing to N) it gets positions
 * [floor(g*o_r/N), floor(g*(o_r+c_r)/N)) of a global batch of g samples,
 * o_r = c[0] + ... + c[r-1]; the parts of all ranks are disjoint and cover
 * the batch, for any split, even or not.  fb_loader_set_split changes the
 * split from the next batch on (a step boundary).
 *
 * Resuming.  fb_loader_position gives (epoch, offset): where the next global
 * batch starts.  A loader opened with that position as start delivers
 * exactly the batches the first one would have delivered next.
 *
 * Threads.  Reader threads read (one pread per chunk), check and decompress
 * the chunks of upcoming windows and assemble batches (uint8 values become
 * value / 255, float32 values are copied, int32 ids become exact floats)
 * into a bounded queue.  The caller's fb_loader_next waits only when the
 * next batch is not ready yet, and reports how long it waited.  With a cache directory the split's shards are
 * first staged there (stage.h) and read from the local copies.
 *
 * Validation.  With val_fraction f > 0 the records fb_data_held_out picks
 * (about a fraction f of them, by their split-wide index alone) are never
 * delivered: the order above is that of the remaining records (a window's
 * permutation permutes its remaining records), n counts only them, and a
 * window with none is skipped.  The held-out records are the validation set
 * (fb_datadir_load_split_part), the same for every data_seed, member, rank
 * split and thread count.  f = 0 gives exactly the order described above.
 *
 * Values arrive as floats: uint8 as value / 255, float32 as stored, int32
 * token ids as exact float values; a dataset without labels delivers y = 0.
 *
 * A bad chunk (checksum, truncation, labels outside [0, classes), a token id
 * outside [0, vocab)) stops the loader: fb_loader_next returns FB_ERR_DATA
 * naming the file, chunk and record.
 *
 * Functions that can fail return 0 or a negative fb_err and fill the
 * caller's message buffer (msg, msg_cap); on failure outputs are untouched.
 */
#ifndef FB_WORKERS_DATA_LOADER_H
#define FB_WORKERS_DATA_LOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "manifest.h"
#include "stage.h"

#define FB_LOADER_DEFAULT_SHUFFLE_BUFFER 16384
#define FB_LOADER_DEFAULT_QUEUE 8
#define FB_LOADER_MAX_THREADS 64
#define FB_LOADER_MAX_QUEUE 256
#define FB_LOADER_MAX_WORLD 4096
#define FB_DATA_MAX_VAL_FRACTION 0.5
/* the constant mixed with a record's index to decide whether it is held out: fixed, so
 * that every job on a dataset holds out the same records (docs/jobspec.md, val_fraction) */
#define FB_DATA_HOLDOUT_SALT 0x76616c73706c6974ULL /* "valsplit" */

/* A place in the sample stream: epoch, and the position in that epoch's
 * order where the next global batch starts. */
typedef struct fb_loader_pos {
    int64_t epoch;
    int64_t offset;
} fb_loader_pos;

typedef struct fb_loader_opts {
    const char *dir;         /* dataset directory (holds manifest.json) */
    const char *split;       /* e.g. "train" */
    int64_t batch_size;      /* global batch N */
    bool shuffle;
    uint64_t data_seed;
    int64_t shuffle_buffer;  /* samples; 0 = FB_LOADER_DEFAULT_SHUFFLE_BUFFER */
    bool drop_last;
    int threads;             /* reader threads, 1..FB_LOADER_MAX_THREADS; 0 = 1 */
    int queue_batches;       /* ready batches kept ahead; 0 = FB_LOADER_DEFAULT_QUEUE */
    int rank, world;         /* this reader is rank of world; world 0 = 1 */
    const int64_t *split_counts; /* [world], summing to batch_size; NULL = as even as possible */
    fb_loader_pos start;     /* where to begin: {0, 0} or a saved position */
    const char *cache_dir;   /* node-local staging cache; NULL = read shards in place */
    uint64_t cache_bytes;    /* its bound */
    double val_fraction;     /* [0, FB_DATA_MAX_VAL_FRACTION]: records held out, never delivered */
} fb_loader_opts;

/* A delivered batch; x and y stay valid until the next fb_loader_next or
 * fb_loader_free. */
typedef struct fb_loader_batch {
    const float *x;     /* [n, sample numel] */
    const int32_t *y;   /* [n] */
    int64_t n;          /* this rank's samples (0 when its share is empty) */
    int64_t global_n;   /* samples in the whole global batch */
    int64_t first;      /* position of this rank's first sample in the epoch order */
    fb_loader_pos pos;  /* where the global batch starts */
    int64_t seq;        /* batches delivered before this one since open */
    double wait_s;      /* how long the fb_loader_next call took (waiting for it, mostly) */
} fb_loader_batch;

typedef struct fb_loader_stats {
    int64_t batches, samples;
    double wait_s;           /* total time in fb_loader_next */
    double max_wait_s;       /* longest single wait */
    int64_t stalls;          /* calls that found their batch not ready yet */
    int64_t chunks;          /* chunks decoded */
    uint64_t bytes_read;     /* stored (compressed) bytes read */
    uint64_t bytes_decoded;  /* decoded bytes */
    double decode_s;         /* thread-seconds spent reading, checking and decompressing */
    double assemble_s;       /* thread-seconds spent filling batches */
    fb_stage_stats stage;    /* staging at open (zero without a cache) */
    double open_s;           /* fb_loader_open, staging included */
} fb_loader_stats;

typedef struct fb_loader fb_loader;

/*
 * Whether record `record` (its index in its split's file order, from 0) of a
 * training split is held out for validation under val_fraction: a hash of the
 * index and FB_DATA_HOLDOUT_SALT, as a number in [0, 1), below val_fraction.
 * Never for val_fraction <= 0 (or NaN).
 */
bool fb_data_held_out(int64_t record, double val_fraction);

/* How many of records 0..n-1 are not held out (the ones that train). */
int64_t fb_data_kept_count(int64_t n, double val_fraction);

/*
 * Opens a loader on o->split of the dataset in o->dir: reads and checks the
 * manifest against the shard files (staging them first when o->cache_dir
 * is set), then starts the reader threads, which begin filling the queue at
 * o->start.  The dataset must have fixed-size records (FB_ERR_UNSUPPORTED
 * otherwise).  FB_ERR_OUT_OF_RANGE for bad options (val_fraction outside
 * [0, FB_DATA_MAX_VAL_FRACTION] included), FB_ERR_NOT_FOUND for an
 * unknown split, FB_ERR_DATA / FB_ERR_IO for the dataset, FB_ERR_NOMEM.
 */
int fb_loader_open(fb_loader **out, const fb_loader_opts *o, char *msg, size_t msg_cap);

/*
 * Delivers the next batch (waiting while it is not ready) and releases the
 * previous one.  Returns 0, or the error that stopped a reader thread
 * (FB_ERR_DATA naming the file and chunk, FB_ERR_IO, FB_ERR_NOMEM); after an
 * error every later call returns it again.
 */
int fb_loader_next(fb_loader_batch *out, fb_loader *l, char *msg, size_t msg_cap);

/* Where the next batch starts: the position to save in a checkpoint. */
fb_loader_pos fb_loader_position(const fb_loader *l);

/*
 * Changes this reader's share of the global batches from the next batch on:
 * it is rank of world with counts[world] (NULL = even).  Batches already
 * prepared under the old split are discarded.  FB_ERR_OUT_OF_RANGE for a
 * bad split; the loader is unchanged then.
 */
int fb_loader_set_split(fb_loader *l, int rank, int world, const int64_t *counts, char *msg,
                        size_t msg_cap);

/* Counters since open. */
void fb_loader_get_stats(fb_loader_stats *out, const fb_loader *l);

/* The manifest the loader reads (valid until fb_loader_free). */
const fb_manifest *fb_loader_manifest(const fb_loader *l);
/* Samples in the split that train (held-out records not counted). */
int64_t fb_loader_samples(const fb_loader *l);
/* Global batch size N. */
int64_t fb_loader_batch_size(const fb_loader *l);

/*
 * Fills order[0..n) (n = fb_loader_samples) with the split-wide indices of the
 * records that train, in the order epoch
 * visits them (what the loader delivers).  FB_ERR_NOMEM.
 */
int fb_loader_epoch_order(int64_t *order, const fb_loader *l, int64_t epoch, char *msg,
                          size_t msg_cap);

/*
 * The position of global batch `step` counted from {0, 0}: with drop_last
 * an epoch is floor(n/N) batches, else ceil(n/N).  What a training loop
 * that starts from the beginning saves after `step` batches.
 */
fb_loader_pos fb_loader_pos_at_step(int64_t n, int64_t batch_size, bool drop_last, int64_t step);

/* Stops the threads and frees everything.  Accepts NULL. */
void fb_loader_free(fb_loader *l);

#endif
