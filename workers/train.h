/*
 * The training loop of fusebox-train and the worker: trains 1..B fusible job
 * specs as one array over an in-memory dataset, evaluates, writes weights.
 *
 * Every member sees the same minibatches (drawn from data_seed; a fresh
 * permutation per epoch when data.shuffle is true, the file order otherwise;
 * the last partial batch of an epoch is dropped, so an epoch is
 * floor(n / batch_size) steps).  A member that reaches its step count leaves
 * the array and the others continue unchanged.
 *
 * With opts.loader set, minibatches come from a shard-dataset loader
 * (workers/data/loader.h) instead, in its order (docs/data-format.md; file
 * order too when data.shuffle is false), and each step reports how long the
 * loop waited for its minibatch.
 *
 * The loop itself is a session (session.h), which can also be stepped one
 * step at a time, checkpointed, resumed and shrunk; fb_train_run runs one
 * from opts.start_step to its end.
 */
#ifndef FB_WORKERS_TRAIN_H
#define FB_WORKERS_TRAIN_H

#include <stdbool.h>
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
struct fb_dp_opts; /* workers/dp.h */
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
    /* data parallelism (workers/dp.h): with n_devices > 1 the array is replicated on
     * devices[0..n_devices) (the backend given to the session is then not used) and each
     * batch is split over them by split[0..n_devices) (NULL: as evenly as possible); dp
     * (may be NULL) sets buckets, overlap and synchronised batch norm.  The pointers are
     * read while the session opens; none is kept. */
    const struct fb_device *devices;
    int n_devices;
    const int64_t *split;
    const struct fb_dp_opts *dp;
    /* pipeline parallelism (workers/pp.h): with pipeline = P > 1 the n_devices devices are
     * D = n_devices / P data shards x P stages (shard d, stage p: devices[d * P + p]) and
     * each batch flows through the stages as micro_batches micro-batches (0: 2 P, at most
     * batch / D); split then has D entries */
    int pipeline;
    int micro_batches;
    /* ranks in several processes (a group spanning workers): a TCP communicator (comm.h)
     * whose local ranks are the n_devices devices (n_devices may then be 1) and whose other
     * ranks live in other processes; split then has one entry per rank of its world (NULL:
     * even), and every process trains the same global batch (dp.h).  Borrowed, not kept
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
} fb_train_opts;

/* Total updates a spec trains on a dataset of n_train samples. */
int64_t fb_train_total_steps(const fb_job_spec *spec, int64_t n_train);

/*
 * Trains specs[0..n) (equal fusion keys) as one array on backend be over the
 * train split, validating on val (may be NULL or empty: no validation) at
 * each member's eval_every and at its end, and evaluating on opts->test (may
 * be NULL) once at its end.  Checks that the dataset fits the model (sample shape,
 * classes vs outputs).  With out_dir, each member's final weights go to
 * <name>.safetensors and its full-state checkpoints (session.h) to
 * <name>.checkpoint.safetensors.  A member whose loss turns non-finite fails
 * alone (an FB_TRAIN_FAILED event) and the run goes on.  final_loss/final_acc
 * [n] (may be NULL) receive each member's final validation loss and
 * accuracy (NaN without a validation set or for a member that failed).  Returns FB_OK or a
 * negative fb_err with msg filled.
 */
int fb_train_run(fb_backend *be, const fb_job_spec *const *specs, int n,
                 const fb_dataset *train, const fb_dataset *val, const fb_train_opts *opts,
                 double *final_loss, double *final_acc, char *msg, size_t msg_cap);

#endif
