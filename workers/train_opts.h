/*
 * What the training loop and the session share: the options of a training
 * run, the events it reports, and a spec's count of updates.  The session
 * (session.h) steps the loop; fb_train_run (train.h) runs a session to its
 * end; both take these options, so this header sits below both.
 */
#ifndef FB_WORKERS_TRAIN_OPTS_H
#define FB_WORKERS_TRAIN_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idx.h"
#include "jobspec.h"
#include "kernels.h"

typedef enum fb_train_event_kind {
    FB_TRAIN_STEP, /* a logged training step */
    FB_TRAIN_EVAL, /* a validation: an evaluation on the validation set */
    FB_TRAIN_DONE,       /* the member finished and left the array */
    FB_TRAIN_CHECKPOINT, /* the member reached a multiple of its checkpoint_every */
    FB_TRAIN_FAILED      /* the member failed by itself (err, text) and left the array */
} fb_train_event_kind;

typedef struct fb_train_event {
    fb_train_event_kind kind;
    int member;               /* index into the specs given to fb_train_run */
    const fb_job_spec *spec;
    int64_t step, steps;      /* updates done, updates in total */
    int array_size;           /* members in the array at this moment */
    double loss;              /* step, checkpoint, failed: the training loss; eval and done:
                               * the validation's (done without a validation set: NaN) */
    double accuracy;          /* the accuracy that goes with loss */
    double test_loss;         /* done: the final evaluation on the test split (NaN without) */
    double test_accuracy;
    double lr;
    double samples_per_s;     /* array throughput since the last log (samples x members) */
    double io_wait_ms;        /* step: mean wait per step for the minibatch since the last log */
    const char *weights_path; /* done, checkpoint: where the file went (out_dir), or NULL */
    /* with opts.blobs: checkpoint: the member's full state (session.h); done: its model
     * (parameters and buffers); valid during the callback only */
    const void *blob;
    size_t blob_len;
    int err;                  /* failed: the fb_err (FB_ERR_DIVERGED for a non-finite loss) */
    const char *text;         /* failed: why, one line */
} fb_train_event;

typedef void (*fb_train_cb)(const fb_train_event *ev, void *user);

struct fb_loader; /* workers/data/loader.h */
struct fb_device; /* workers/device.h */
struct fb_dp_opts; /* workers/data_parallel.h */
struct fb_comm;    /* workers/comm.h */

typedef struct fb_train_opts {
    int log_every;       /* report a step event every N steps (and the last); 0 = last only */
    const char *out_dir; /* final weights and checkpoints go here; NULL = not written */
    fb_train_cb cb;      /* may be NULL */
    void *user;
    /* when set, training minibatches come from it (batches of the spec's batch_size, last
     * partial batch dropped, from its start) and train->x, train->y are not read */
    struct fb_loader *loader;
    /* every member has already done this many updates (a resume); the data position, dropout
     * masks and schedule continue from there (session.h) */
    int64_t start_step;
    /* checkpoint and done events carry the files' bytes (event.blob) */
    bool blobs;
    /* data parallelism (workers/data_parallel.h): with n_devices > 1 the array is replicated on
     * devices[0..n_devices) (the backend given to the session is then not used) and each
     * batch is split over them by split[0..n_devices) (NULL: as evenly as possible); dp
     * (may be NULL) sets buckets, overlap and synchronised batch norm.  The pointers are
     * read while the session opens; none is kept. */
    const struct fb_device *devices;
    int n_devices;
    const int64_t *split;
    const struct fb_dp_opts *dp;
    /* pipeline parallelism (workers/pipeline_parallel.h): with pipeline = P > 1 the
     * n_devices devices are D = n_devices / P data shards x P stages (shard d, stage p:
     * devices[d * P + p]) and each batch flows through the stages as micro_batches
     * micro-batches (0: 2 P, at most batch / D); split then has D entries */
    int pipeline;
    int micro_batches;
    /* ranks in several processes (a group spanning workers): a TCP communicator (comm.h)
     * whose local ranks are the n_devices devices (n_devices may then be 1) and whose other
     * ranks live in other processes; split then has one entry per rank of its world (NULL:
     * even), and every process trains the same global batch (data_parallel.h).  Borrowed, not kept
     * past the session: it must outlive the session, and the caller frees it after
     * fb_session_free.  No pipeline with it. */
    struct fb_comm *comm;
    /* CUDA devices across processes: comm is then an NCCL communicator of the same ranks
     * (the gradient sums) and control_comm the TCP one (the control broadcast and the
     * step's losses; fb_dp_opts.control_comm).  NULL: comm carries both (CPU devices).
     * Borrowed like comm. */
    struct fb_comm *control_comm;
    /* the test split (may be NULL): evaluated once, at each member's end (the done event's
     * test_loss, test_accuracy), never during training; it must outlive the session */
    const fb_dataset *test;
    /* the most steps one fb_session_step may train, a window (0 or 1: one; at most
     * FB_SESSION_MAX_WINDOW): on one device the array then runs each tile of members
     * through the window's steps before the next tile (fb_array_train_steps), so that a
     * tile's state stays in cache across them.  A window ends at every step whose state a
     * member's files or evaluation read (its checkpoints, validations and last step), and
     * is shortened so that its minibatches take at most 16 MiB; results, events and files
     * are those of single steps.  Data and pipeline parallelism train one step a call. */
    int window;
    /* with window: each window is cut to about this many milliseconds of training, from
     * the step time of the call before (the first call trains one step), so that a caller
     * that must answer between calls (the worker: stops, drains, departures) is not kept
     * waiting; 0: no bound */
    double window_ms;
} fb_train_opts;

#define FB_SESSION_MAX_WINDOW 16
/* The window fusebox-train and the worker train with: on the benchmark's MLP of
 * bench/RESULTS.md (3.8 MB of state a member) eight steps bring a fused array of 16 from
 * 0.85-0.95 of its members' solo speed to 1.0. */
#define FB_SESSION_DEFAULT_WINDOW 8

/* Total updates a spec trains on a dataset of n_train samples. */
int64_t fb_train_total_steps(const fb_job_spec *spec, int64_t n_train);

#endif
