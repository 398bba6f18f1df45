/*
 * Data-parallel training of one fused array on D devices.
 *
 * Each device (a rank) holds a replica of the whole array and trains on a
 * share of every global batch: rank d takes the split[d] samples after those
 * of ranks 0..d-1.  The global gradient is exact for any split: each shard's
 * loss gradient is scaled by 1/N of the global batch instead of 1/n of the
 * shard (the grad_scale of fb_softmax_xent and fb_mse), so the sum of the
 * shards' gradients is the whole batch's, and uneven or changing splits do
 * not change training beyond float rounding.  Dropout masks follow each
 * sample's position in the global batch, so they do not depend on the split
 * either.
 *
 * Gradients are all-reduced in buckets of opts.bucket_bytes, filled in the
 * order backward produces them (reverse layer order).  A bucket is handed to
 * the group's one communication thread as soon as it is full, while the
 * ranks' backward passes go on, so communication overlaps computation; every
 * rank hands over the same buckets in the same order, and the communication
 * thread reduces bucket k only when every rank has handed it over.  The
 * communication backend is shared memory for CPU devices and NCCL for CUDA
 * devices (comm.h).
 *
 * Batch norm uses each device's own batch statistics by default (what
 * PyTorch's DistributedDataParallel does), which makes training depend on
 * the split; with opts.sync_bn the statistics (and their backward sums) are
 * all-reduced over the global batch, which reproduces single-device training
 * exactly.  Synchronised batch norm needs host-memory devices (CPU).
 *
 * Across processes: with opts.comm (a TCP communicator, comm.h) the D
 * devices are ranks base..base+D-1 of a world of W ranks whose other ranks
 * live in other processes.  Every process is handed the same global batch
 * and the same split of W entries, runs only its own ranks' shards, and
 * scales the loss gradient by the global batch, so training still equals
 * one device's for any split; each step's loss is summed over the world
 * too.  Pipeline stages do not span processes.  CPU devices use the one
 * TCP communicator for everything.  CUDA devices take two: opts.comm, an
 * NCCL communicator of the same ranks, for the gradients (device memory),
 * and opts.control_comm, the TCP one, for what lives in host memory: each
 * step's world loss and fb_dp_broadcast_i64 (the leader's control vector).
 *
 * The replicas are hooked without changing the array: each rank runs its
 * array on a thin backend that forwards every op to the device's backend and
 * additionally sees each parameter gradient as backward finishes it, scales
 * the loss gradient, offsets dropout masks and, with sync_bn, synchronises
 * batch norm.
 */
#ifndef FB_WORKERS_DP_H
#define FB_WORKERS_DP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "array.h"
#include "comm.h"
#include "device.h"

#define FB_DP_MAX_RANKS 64
/* The default bucket: big enough that a bucket's fixed cost is small, small
 * enough that the first bucket starts early in backward. */
#define FB_DP_DEFAULT_BUCKET_BYTES (1u << 20)

typedef struct fb_dp fb_dp;

typedef struct fb_dp_opts {
    size_t bucket_bytes; /* gradient bytes per all-reduce bucket; 0 = the default */
    bool no_overlap;     /* start all-reduces only after backward (a benchmark's baseline) */
    bool sync_bn;        /* synchronised batch norm (see above) */
    int threads;         /* compute threads per CPU device; 0 = the backend's setting */
    /* testing: rank slow_rank sleeps slow_us before each parameter gradient it hands over;
     * -1 (or slow_us 0) for none.  Proves a straggler delays but never changes a step. */
    int slow_rank;
    int slow_us;
    /* ranks in several processes: a communicator that spans them (TCP, comm.h),
     * holding D local ranks; dp borrows it (the caller frees it after fb_dp_free).
     * NULL: the D devices are the whole world, joined by shared memory or NCCL. */
    fb_comm *comm;
    /* ranks in several processes on CUDA devices: comm is then an NCCL communicator (the
     * gradient sums, device memory) and control_comm a TCP one over the same ranks (host
     * memory: the step's world loss and fb_dp_broadcast_i64), borrowed alike.  NULL: comm
     * carries both (CPU devices, or one process).  Not without comm. */
    fb_comm *control_comm;
} fb_dp_opts;

/* Where a group's time went since the last fb_dp_take_times, ms, summed over steps. */
typedef struct fb_dp_times {
    int64_t steps;
    int D;
    double wall_ms;                       /* the steps from start to all ranks done */
    double compute_ms[FB_DP_MAX_RANKS];   /* per rank: forward, backward and update */
    double comm_exposed_ms[FB_DP_MAX_RANKS]; /* per rank: waiting for collectives */
    /* per rank: its training passes (forward and backward over its shard), part of
     * compute_ms: the time that grows with its share of the batch, where the update does not */
    double pass_ms[FB_DP_MAX_RANKS];
    int64_t samples[FB_DP_MAX_RANKS];     /* per rank: samples of its shards in training
                                             passes (forward and backward; a pipeline stage's
                                             forward-only passes are not counted) */
    double comm_busy_ms;                  /* the communication thread reducing */
} fb_dp_times;

/*
 * Builds D (1..FB_DP_MAX_RANKS) replicas of the array of specs[0..B) (as
 * fb_array_new), replica d on devs[d], each able to take a shard of up to
 * max_n samples, and starts D rank threads and one communication thread.
 * All devices must be of one kind; CUDA devices talk through NCCL (one
 * worker), CPU devices through shared memory.  opts may be NULL (defaults:
 * 1 MiB buckets, overlap on, per-device batch norm).  Replicas start
 * identical (same seeds).  Returns FB_OK or a negative fb_err with msg
 * filled (FB_ERR_OUT_OF_RANGE for a bad D or bucket size, FB_ERR_UNSUPPORTED
 * for sync_bn on CUDA devices or mixed kinds); *out is untouched on failure.
 * With opts->comm alone, the devices must be CPU devices and the
 * communicator a TCP one holding D local ranks of a world of at most
 * FB_DP_MAX_RANKS (else FB_ERR_UNSUPPORTED or FB_ERR_OUT_OF_RANGE).  With
 * opts->control_comm too, CUDA devices take opts->comm as their NCCL
 * communicator (device memory; CPU devices need a host-memory one) and
 * control_comm must be a TCP communicator over the very same ranks (base,
 * world and D local ranks), else FB_ERR_UNSUPPORTED or FB_ERR_OUT_OF_RANGE.
 * Every process of the world must build the same array with the same max_n.
 */
int fb_dp_new(const fb_device *devs, int D, const fb_job_spec *const *specs, int B, int max_n,
              const fb_dp_opts *opts, fb_dp **out, char *msg, size_t msg_cap);

/* Releases the replicas and stops the threads.  Accepts NULL. */
void fb_dp_free(fb_dp *dp);

/* Number of ranks in this process (D). */
int fb_dp_ranks(const fb_dp *dp);

/* Number of ranks in the world (W): D, or the communicator's world with opts.comm. */
int fb_dp_world(const fb_dp *dp);

/* Replica d's array (owned by dp).  Replica 0 is the one to evaluate, save
 * and checkpoint; after changing its state directly, call fb_dp_broadcast. */
fb_array *fb_dp_array(fb_dp *dp, int d);

/*
 * Checks that split[0..W) (W = fb_dp_world) is a valid split of a global
 * batch of N samples: every shard 1..max_n samples and the sum N.  Returns FB_OK or
 * FB_ERR_OUT_OF_RANGE with msg naming the shard.
 */
int fb_dp_check_split(const fb_dp *dp, const int64_t *split, int N, char *msg, size_t msg_cap);

/*
 * Fills split[0..D) with N samples spread as evenly as possible (the first
 * N % D shards one larger), or proportionally to weights[0..D) when weights
 * is not NULL (largest remainders; every shard at least 1).
 */
void fb_dp_even_split(int D, int N, const double *weights, int64_t *split);

/*
 * One training forward and backward of the global batch x [N, input numel]
 * and y [N] (host memory) split over the ranks by split[0..W) (NULL: even),
 * with gradients all-reduced, so that every replica holds the global batch's
 * gradient afterwards.  Across processes, every process passes the same
 * x, y, N and split and runs only its own ranks' shards.  stream as for
 * fb_array_forward_backward.  loss [B] receives each member's mean loss over
 * the global batch (of every process's shards) and correct [B] (may be NULL)
 * its count of correct predictions.  Returns FB_OK or a
 * negative fb_err (a bad split: FB_ERR_OUT_OF_RANGE, nothing ran; a rank's
 * error, e.g. a bad label, FB_ERR_DATA; a communication failure,
 * FB_ERR_IO); loss and correct are untouched on failure.
 */
int fb_dp_forward_backward(fb_dp *dp, const float *x, const int32_t *y, int N,
                           const int64_t *split, uint64_t stream, float *loss, float *correct,
                           char *msg, size_t msg_cap);

/* ---- pipeline stages (pipeline_parallel.h) -------------------------------------------------- */

/*
 * A pipeline stage's forward of x [N, input numel] (host), split over the
 * ranks, without backward: out [B][N][K] (host, member-major) receives each
 * member's outputs.  Returns FB_OK or a negative fb_err (nothing ran;
 * FB_ERR_UNSUPPORTED across processes).
 */
int fb_dp_stage_forward(fb_dp *dp, const float *x, int N, const int64_t *split, uint64_t stream,
                        float *out, char *msg, size_t msg_cap);

/*
 * A pipeline stage's forward and backward of x [N, input numel]: with y
 * (the last stage) from the loss of the labels; without, from dout
 * [N, B, K] (host), the next stage's input gradient, which replaces the
 * loss's.  din [N, input numel] (host; may be NULL) receives the input's
 * gradient, which needs one member (B = 1) and a linear or conv2d first
 * layer (else FB_ERR_UNSUPPORTED).  Gradients are all-reduced as for
 * fb_dp_forward_backward; loss and correct [B] (may be NULL) as there.
 * Across processes only without dout and din (else FB_ERR_UNSUPPORTED).
 */
int fb_dp_stage_backward(fb_dp *dp, const float *x, const int32_t *y, int N,
                         const int64_t *split, uint64_t stream, const float *dout, float *din,
                         float *loss, float *correct, char *msg, size_t msg_cap);

/*
 * Makes the next calls part of a bigger batch (a micro-batch of it): the
 * loss gradient is scaled by 1/whole_n instead of 1/N of the call, and
 * dropout masks count samples from base.  whole_n 0 and base 0 restore the
 * default.
 */
void fb_dp_set_scale(fb_dp *dp, int whole_n, int64_t base);

/* One fused optimizer update on every replica (in parallel); hp[0..B) as
 * for fb_array_step. */
void fb_dp_step(fb_dp *dp, const fb_optim_hparams *hp);

/* Removes the member in slot m from every replica. */
void fb_dp_remove(fb_dp *dp, int m);

/*
 * Copies replica 0's full state (parameters, optimizer state, batch-norm
 * buffers and counters) of every member to the other replicas of this
 * process; across processes, every process must make the same change.  Returns
 * FB_OK or FB_ERR_NOMEM (then nothing changed).
 */
int fb_dp_broadcast(fb_dp *dp, char *msg, size_t msg_cap);

/* The most values fb_dp_broadcast_i64 takes at once. */
#define FB_DP_MAX_BROADCAST 4096

/*
 * Gives every process of the world the values v[0..n) (0 <= n <=
 * FB_DP_MAX_BROADCAST) of the process holding rank 0; what the others pass
 * is overwritten.  It is one sum over the host-memory communicator
 * (opts.control_comm, else opts.comm) in which rank 0
 * contributes the values, 16 bits per float (exact in any order of
 * addition), and every other rank zeros, so each value arrives bit for bit.
 * Call it between steps only, from the thread that drives the steps, at the
 * same point in every process with the same n: the sum then never
 * interleaves with the communication thread's.  In one process (no
 * opts.comm) v stays as it is.  Returns FB_OK, FB_ERR_OUT_OF_RANGE for a bad
 * n, FB_ERR_NOMEM, or FB_ERR_IO when the sum fails (a peer died, timed out
 * or misbehaved; the communicator is then broken); v is untouched on
 * failure.
 */
int fb_dp_broadcast_i64(fb_dp *dp, int64_t *v, int n, char *msg, size_t msg_cap);

/*
 * The collectives rank d ran in its last training step, in order: their
 * sizes in floats into sizes[0..cap); returns how many there were.  Every
 * rank must show the same list (the bucketing tests check this).
 */
int fb_dp_last_collectives(const fb_dp *dp, int d, size_t *sizes, int cap);

/* Returns the times since the last call (or the start) and resets them. */
fb_dp_times fb_dp_take_times(fb_dp *dp);

#endif
