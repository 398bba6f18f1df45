/*
 * The fused training array: B models built from job specs that share a fusion
 * key, trained as one.
 *
 * An array owns one slab each for parameters, gradients, optimizer state,
 * batch-norm running statistics and activations, with a table of layer nodes
 * pointing into them.  Parameters of one tensor are [B, ...] (member-major);
 * activations are [N, B, ...].  Activations, their gradients and what ops
 * save for backward share one slab, planned so that buffers never live at the
 * same step of a training pass share bytes (fb_array_plan).  The minibatch
 * [N, ...] is shared by every member and read once by the first layer.  The
 * loss is each member's mean over N, so member b's gradient is exactly its
 * own.  A member can leave at any time (fb_array_remove); the others keep
 * their state and slots are compacted.
 *
 * Tensor names follow PyTorch's nn.Sequential state dict: top-level layer i
 * is "i.weight"/"i.bias"; a residual block's body layer j is
 * "i.body.j.weight" and its shortcut layer k "i.shortcut.k.weight"; batch norm
 * adds "running_mean", "running_var" and "num_batches_tracked".  A token
 * model's layers are named as docs/jobspec.md ("Token models") lists:
 * "0.weight" for the embedding, "i.attn.in_proj_weight", "i.mlp.0.weight", ...
 * inside transformer block i.
 */
#ifndef FB_WORKERS_ARRAY_H
#define FB_WORKERS_ARRAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jobspec.h"
#include "kernels.h"

typedef struct fb_array fb_array;

/*
 * Builds an array of B members from specs[0..B) (equal fusion keys, else
 * FB_ERR_NOT_FUSIBLE) on backend be, with activations for up to max_n samples
 * per step.  Parameters are initialised as PyTorch initialises the same
 * modules, from each member's own seed, so a member starts identically alone
 * or fused; a spec's init file, when set, replaces that.  The array keeps
 * pointers to the specs, which must outlive it.  Returns FB_OK or a negative
 * fb_err with msg filled; *out is untouched on failure.
 */
int fb_array_new(fb_backend *be, const fb_job_spec *const *specs, int B, int max_n,
                 fb_array **out, char *msg, size_t msg_cap);

/* How an array lays out its activation slab (activations, their gradients
 * and what ops save for backward). */
typedef enum fb_array_plan {
    /* Buffers that are never live at the same step of a training pass share
     * bytes: what fb_array_new does. */
    FB_ARRAY_PLAN_SHARED = 0,
    /* Every buffer has bytes of its own: the reference a test compares the
     * shared plan with. */
    FB_ARRAY_PLAN_PRIVATE
} fb_array_plan;

/*
 * fb_array_new with a choice of activation plan (any other value of plan is
 * FB_ERR_OUT_OF_RANGE).  Both plans train identically; they differ only in
 * memory.
 */
int fb_array_new_planned(fb_backend *be, const fb_job_spec *const *specs, int B, int max_n,
                         fb_array_plan plan, fb_array **out, char *msg, size_t msg_cap);

/* Releases the array and all of its memory.  Accepts NULL. */
void fb_array_free(fb_array *a);

/* Current number of members. */
int fb_array_size(const fb_array *a);
/* The spec of the member in slot m. */
const fb_job_spec *fb_array_spec(const fb_array *a, int m);
/* Parameters of one member (every member has the same count). */
size_t fb_array_member_params(const fb_array *a);
/* Output features per sample (K). */
int fb_array_outputs(const fb_array *a);

/*
 * One buffer of the activation slab, for tests of the plan.  A training pass
 * is a sequence of steps (input, each forward op, loss, each backward op, and
 * INT_MAX for what the caller reads afterwards); the buffer is in use from
 * step first to step last, inclusive, and occupies floats floats at offset
 * (both in floats) of a slab of fb_array_slab_floats floats.  A buffer no
 * step uses has first = last = -1 and floats = 0.  grad marks an activation
 * gradient.
 */
typedef struct fb_array_buffer {
    size_t offset, floats;
    int first, last;
    bool grad;
} fb_array_buffer;

/* Number of buffers of the activation slab. */
int fb_array_buffer_count(const fb_array *a);
/* Buffer i, 0 <= i < fb_array_buffer_count. */
fb_array_buffer fb_array_buffer_at(const fb_array *a, int i);
/* Floats of the activation slab as planned. */
size_t fb_array_slab_floats(const fb_array *a);

/*
 * Runs forward (and, when y is given and train is true, backward) on a
 * minibatch of N <= max_n samples: x [N, input numel] and y [N] labels in host
 * memory.  train selects batch statistics and dropout (stream mixes the
 * step into dropout masks); eval uses running statistics and no dropout.
 * Gradients are zeroed first and hold this batch's gradient afterwards.
 * loss [B] and correct [B] (may be NULL) receive each member's mean loss and
 * count of correct argmax predictions, in host memory.  For mse, y holds class
 * labels turned into one-hot targets when the output has K > 1 features, or
 * x-aligned float targets are not supported (FB_ERR_UNSUPPORTED).  A token
 * model's x holds each record's ids as exact floats ([N, T + 1] for a language
 * model, whose targets are the last T of them and which ignores y; [N, T]
 * with pool); an id that is not an integer in [0, vocab) is FB_ERR_DATA
 * naming the sample and position, before anything runs.  A language model's
 * loss is the mean over the N*T positions and its correct count is per
 * sample the fraction of positions right.  On a CUDA
 * backend a failed device call anywhere since the backend was created (this
 * step, or an fb_array_step before it) is returned here (FB_ERR_IO,
 * FB_ERR_NOMEM or FB_ERR_DATA, see kernels/cuda/cuda_backend.h), and then
 * loss and correct hold nothing meaningful.
 */
int fb_array_forward_backward(fb_array *a, const float *x, const int32_t *y, int N, bool train,
                              uint64_t stream, float *loss, float *correct, char *msg,
                              size_t msg_cap);

/* Copies the last forward's output of member m, [N, K], into host dst (a
 * language model's K = T * V: its logits [N, T, V]). */
void fb_array_logits(const fb_array *a, int m, int N, float *dst);

/*
 * One fused optimizer update of every member; hp[0..B) are per-slot
 * hyperparameters in host memory (lr with the schedule applied, t the 1-based
 * update count of that member).
 */
void fb_array_step(fb_array *a, const fb_optim_hparams *hp);

/*
 * One training step: fb_array_forward_backward (train, y and loss required)
 * and then fb_array_step with hp, except that a member whose loss is not
 * finite is not updated (it gets an empty slot's hyperparameters, as the
 * session gives it).  Every member's parameters, optimizer state, loss,
 * correct count and gradients end exactly as those two calls leave them.  On
 * the CPU backend with a thread count set (fb_backend_set_threads) the
 * members run in tiles of a few, each tile's forward, backward and update
 * one after another, so that a tile's parameters, gradients and optimizer
 * state stay in cache across its step instead of all B members' being
 * streamed from memory in every pass; a member's kernels are the same calls
 * of the same shapes at any tile size, so nothing of a member depends on B.
 * On more than one thread (graphs of linear and element-wise layers) the
 * tiles are dealt to the threads, each running its tiles on one thread in a
 * slab of its own, so a member's result is also its one-thread result.
 * Where it tiled, fb_array_logits reads nothing meaningful afterwards (the
 * tiles' logits stay in their own slabs; fb_array_forward_backward gives
 * them).  Errors as fb_array_forward_backward's, found before anything is
 * updated.
 */
int fb_array_train_step(fb_array *a, const float *x, const int32_t *y, int N, uint64_t stream,
                        const fb_optim_hparams *hp, float *loss, float *correct, char *msg,
                        size_t msg_cap);

/*
 * K steps of fb_array_train_step in one call, a window: step k trains on
 * x[k], y[k] [N] with dropout stream stream[k], hyperparameters hp + k * B
 * and losses into loss + k * B (correct + k * B unless NULL).  Where the
 * step tiles, each tile runs all K steps before the next tile starts, so
 * that a tile's state is read from memory once per window, not once per
 * step.  A member whose loss is not finite at step k is not updated at k or
 * at any later step of the window (its parameters stay as they were before
 * k; its later losses are computed and mean nothing).  Every member ends
 * exactly as K calls of fb_array_train_step with those inputs would leave
 * it, at any tile size and thread count.  Every batch is checked before
 * anything trains (fb_array_forward_backward's errors; msg names the step
 * of the window); an error of the device or of memory in the middle leaves
 * the window partly trained, as it leaves a step.
 */
int fb_array_train_steps(fb_array *a, int K, const float *const *x, const int32_t *const *y,
                         int N, const uint64_t *stream, const fb_optim_hparams *hp, float *loss,
                         float *correct, char *msg, size_t msg_cap);

/* Members per tile of fb_array_train_step where it tiles at all: n >= 1
 * (lowered so that every thread gets a tile), or 0 for the default, as many as fit a few
 * MiB of cache.  Results are the same at every n; tests and benchmarks set
 * it to cut tiles of a given size. */
void fb_array_set_tile(fb_array *a, int n);

/* Whether fb_array_train_step trains a in more than one tile as it stands
 * (its backend, thread count, size and precision). */
bool fb_array_tiles(const fb_array *a);

/* Sets hp from the spec of slot m for update t (1-based) of total updates. */
void fb_array_hparams(const fb_array *a, int m, int64_t t, int64_t total, fb_optim_hparams *hp);

/*
 * Removes the member in slot m: slots above it move down by one, with their
 * parameters, optimizer state and running statistics; nothing else changes.
 */
void fb_array_remove(fb_array *a, int m);

/*
 * Writes member m's parameters and batch-norm buffers as safetensors (what a
 * PyTorch user loads with load_state_dict), atomically.  With grads true,
 * writes the gradients of the last backward under the same names instead.
 * The metadata describes the member (fb_array_add_description);
 * meta_key/meta_value (may be NULL) add one more entry.  A device failure
 * on the CUDA backend fails the save before anything is written.
 */
int fb_array_save(const fb_array *a, int m, const char *path, bool grads, const char *meta_key,
                  const char *meta_value, char *msg, size_t msg_cap);

/* Loads member m's parameters (and batch-norm buffers when present) from a
 * safetensors file; every parameter must be present with its exact shape and
 * no unknown tensor may appear, except that a full-state checkpoint
 * (metadata "format" = FB_CHECKPOINT_FORMAT, session.h) may carry optimizer
 * state under "optim.", which is ignored: a checkpoint serves as an init
 * file for its model part.  On failure member m is unchanged, except that a
 * device failure on the CUDA backend (reported like fb_array_forward_backward)
 * leaves it undefined. */
int fb_array_load(fb_array *a, int m, const char *path, char *msg, size_t msg_cap);

/* As fb_array_load, from len bytes at buf holding such a file (buf is not kept); who names
 * the weights in messages.  A malformed file is FB_ERR_CHECKPOINT. */
int fb_array_load_buffer(fb_array *a, int m, const void *buf, size_t len, const char *who,
                         char *msg, size_t msg_cap);

/* ---- one member's state, tensor by tensor (checkpoints) ------------------- */

/* The "format" metadata of a full-state checkpoint (session.h). */
#define FB_CHECKPOINT_FORMAT "fusebox-checkpoint-1"

/* Which of a member's values fb_array_get and fb_array_set move. */
typedef enum fb_array_part {
    FB_ARRAY_PARAM,  /* parameter values */
    FB_ARRAY_GRAD,   /* parameter gradients of the last backward */
    FB_ARRAY_STATE1, /* per parameter: SGD's momentum buffer, Adam's first moment */
    FB_ARRAY_STATE2, /* per parameter: Adam's second moment (none for SGD) */
    FB_ARRAY_BUFFER  /* batch-norm running statistics, tensor by tensor */
} fb_array_part;

/* A tensor of one member: its PyTorch name and shape (without the B). */
typedef struct fb_array_tensor {
    const char *name;     /* lives as long as the array */
    int ndim;
    const int64_t *shape; /* [ndim] */
    size_t numel;
} fb_array_tensor;

/*
 * Number of tensors of a part: the parameter tensors for PARAM, GRAD and
 * STATE1 (and STATE2 when the optimizer keeps a second moment, else 0), the
 * batch-norm buffer tensors for BUFFER.  Tensor t of the optimizer parts
 * belongs to parameter tensor t.
 */
int fb_array_tensor_count(const fb_array *a, fb_array_part part);

/* Name and shape of tensor t (0 <= t < fb_array_tensor_count) of part. */
fb_array_tensor fb_array_tensor_at(const fb_array *a, fb_array_part part, int t);

/* Copies member m's tensor t of part into host dst [numel]. */
void fb_array_get(const fb_array *a, int m, fb_array_part part, int t, float *dst);

/* Replaces member m's tensor t of part with host src [numel]; no other
 * member or tensor changes.  Gradients are the batch's own, unscaled, as
 * fb_array_get returns them: in a bf16 array between a training backward and
 * its update they are stored times the member's loss scale. */
void fb_array_set(fb_array *a, int m, fb_array_part part, int t, const float *src);

/* ---- bf16 dynamic loss scaling ---------------------------------------------
 *
 * A bf16 array multiplies member m's loss gradient by its scale S_m (a power
 * of two, FB_LOSS_SCALE_INIT at first) and fb_array_step divides the
 * gradients by S_m before the update, so a finite step trains exactly the
 * bits it would unscaled.  A member whose gradients hold a NaN or an infinity
 * skips that update (parameters and optimizer state untouched) and halves
 * S_m; after FB_LOSS_SCALE_INTERVAL finite steps in a row S_m doubles.  S_m
 * stays within [FB_LOSS_SCALE_MIN, FB_LOSS_SCALE_MAX].  Each member has its
 * own scale: one member's overflow changes nothing of another's.  fp32 and
 * tf32 arrays do none of this.  Gradients read through fb_array_get or saved
 * with grads are always the batch's own, unscaled. */
#define FB_LOSS_SCALE_INIT 0x1p16f
#define FB_LOSS_SCALE_INTERVAL 2000 /* finite steps before doubling */
#define FB_LOSS_SCALE_MIN 0x1p-24f
#define FB_LOSS_SCALE_MAX 0x1p64f

/* Member m's loss scale (1 for fp32 and tf32 arrays) and its finite steps
 * since the scale last changed (0 for fp32 and tf32). */
float fb_array_loss_scale(const fb_array *a, int m);
int64_t fb_array_loss_scale_good(const fb_array *a, int m);
/* Whether member m's last update was skipped for a non-finite gradient. */
bool fb_array_update_skipped(const fb_array *a, int m);
/* Restores member m's scale and count (a checkpoint's): scale a power of two
 * in [FB_LOSS_SCALE_MIN, FB_LOSS_SCALE_MAX], 0 <= good < the growth interval;
 * otherwise FB_ERR_OUT_OF_RANGE (FB_ERR_CONFLICT for an array not in bf16)
 * with msg filled and nothing changed. */
int fb_array_set_loss_scale(fb_array *a, int m, float scale, int64_t good, char *msg,
                            size_t msg_cap);
/*
 * Loss scaling across arrays that each hold a part of one model (pipeline
 * stages, workers/pipeline_parallel.h), so that a member has one scale in all of them:
 * fb_array_set_grad_prescaled(a, true) says that the output gradient a's
 * backward receives is already multiplied by each member's scale (the input
 * gradient of the next stage, which scaled its loss gradient), so backward
 * does not scale it again; fb_array_skip_update(a, m) (bf16 only) skips
 * member m's next update as if its own gradients had overflowed, when
 * another part's did: the scale then halves once, as in every part.
 */
void fb_array_set_grad_prescaled(fb_array *a, bool prescaled);
void fb_array_skip_update(fb_array *a, int m);
/* Internal, for tests: the growth interval of every member (steps >= 1). */
void fb_array_set_loss_scale_interval(fb_array *a, int64_t steps);

/* Number of batch-norm layers (each has a num_batches_tracked counter). */
int fb_array_bn_count(const fb_array *a);

/* The state-dict name of batch norm k's counter ("1.num_batches_tracked")
 * into buf (truncated to cap). */
void fb_array_bn_name(const fb_array *a, int k, char *buf, size_t cap);

/* Member m's num_batches_tracked of batch norm k, and setting it. */
int64_t fb_array_bn_tracked(const fb_array *a, int m, int k);
void fb_array_set_bn_tracked(fb_array *a, int m, int k, int64_t value);

struct fb_st_writer; /* io/safetensors.h */

/*
 * Adds member m's parameters, batch-norm buffers and counters (or, with
 * grads, its gradients) to w under their PyTorch names: what fb_array_save
 * writes.  The writer references its data, so *hold receives one malloc'd
 * host block holding the values; the caller frees it after the writer's last
 * use.  Returns FB_OK or a negative fb_err (*hold untouched then; tensors
 * added before the failure stay in w).
 */
int fb_array_add_tensors(const fb_array *a, int m, bool grads, struct fb_st_writer *w,
                         void **hold, char *msg, size_t msg_cap);

/* The preprocessing the loaders apply to uint8 samples (workers/io/idx.h,
 * workers/data/loader.h: value / 255), as the JSON of the "preprocess" entry;
 * float32 samples are used as stored. */
#define FB_PREPROCESS_JSON "{\"uint8_scale\":0.00392156862745098}"

/*
 * Adds what describes member m's weights to w's metadata, so that a file
 * explains itself without its job: "spec" (the member's canonical job spec,
 * fb_job_spec_canonical), "preprocess" (FB_PREPROCESS_JSON) and
 * "fusebox_version".  fb_array_save adds them to every file it writes; the
 * session adds the step and the metrics.  Returns FB_OK or a negative fb_err.
 */
int fb_array_add_description(const fb_array *a, int m, struct fb_st_writer *w, char *msg,
                             size_t msg_cap);

#endif
