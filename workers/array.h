/*
 * The fused training array: B models built from job specs that share a fusion
 * key, trained as one.
 *
 * An array owns one slab each for parameters, gradients, optimizer state,
 * batch-norm running statistics and activations, with a table of layer nodes
 * pointing into them.  Parameters of one tensor are [B, ...] (member-major);
 * activations are [N, B, ...].  The minibatch [N, ...] is shared by every
 * member and read once by the first layer.  The loss is each member's mean
 * over N, so member b's gradient is exactly its own.  A member can leave at any
 * time (fb_array_remove); the others keep their state and slots are compacted.
 *
 * Tensor names follow PyTorch's nn.Sequential state dict: top-level layer i
 * is "i.weight"/"i.bias"; a residual block's body layer j is
 * "i.body.j.weight" and its shortcut layer k "i.shortcut.k.weight"; batch norm
 * adds "running_mean", "running_var" and "num_batches_tracked".
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
int fb_array_new(fb_backend_t *be, const fb_job_spec *const *specs, int B, int max_n,
                 fb_array **out, char *msg, size_t msg_cap);

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
 * Runs forward (and, when y is given and train is true, backward) on a
 * minibatch of N <= max_n samples: x [N, input numel] and y [N] labels in host
 * memory.  train selects batch statistics and dropout (stream mixes the
 * step into dropout masks); eval uses running statistics and no dropout.
 * Gradients are zeroed first and hold this batch's gradient afterwards.
 * loss [B] and correct [B] (may be NULL) receive each member's mean loss and
 * count of correct argmax predictions, in host memory.  For mse, y holds class
 * labels turned into one-hot targets when the output has K > 1 features, or
 * x-aligned float targets are not supported (FB_ERR_UNSUPPORTED).
 */
int fb_array_forward_backward(fb_array *a, const float *x, const int32_t *y, int N, bool train,
                              uint64_t stream, float *loss, float *correct, char *msg,
                              size_t msg_cap);

/* Copies the last forward's output of member m, [N, K], into host dst. */
void fb_array_logits(const fb_array *a, int m, int N, float *dst);

/*
 * One fused optimizer update of every member; hp[0..B) are per-slot
 * hyperparameters in host memory (lr with the schedule applied, t the 1-based
 * update count of that member).
 */
void fb_array_step(fb_array *a, const fb_optim_hparams *hp);

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
 * meta_key/meta_value (may be NULL) add one metadata entry.
 */
int fb_array_save(const fb_array *a, int m, const char *path, bool grads, const char *meta_key,
                  const char *meta_value, char *msg, size_t msg_cap);

/* Loads member m's parameters (and batch-norm buffers when present) from a
 * safetensors file; every parameter must be present with its exact shape and
 * no unknown tensor may appear.  On failure member m is unchanged. */
int fb_array_load(fb_array *a, int m, const char *path, char *msg, size_t msg_cap);

#endif
