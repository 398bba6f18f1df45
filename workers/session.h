/*
 * A training session: the training loop of train.h one step at a time, so
 * that the worker can interleave steps with its control messages, checkpoint
 * members, resume them, and let them leave while the others continue.
 * fb_train_run() is a session run to the end.
 *
 * Every member of a session has done the same number of updates (the
 * session's step): members share each minibatch, and the minibatch, the
 * dropout masks and the learning-rate schedule are functions of the step, so
 * a member resumed at step s from its checkpoint continues exactly as if it
 * had never stopped (bit-identical on the CPU when the array's composition
 * is the same).
 *
 * A checkpoint is one safetensors file with the member's full training
 * state: its parameters and batch-norm buffers under their PyTorch names
 * (as fb_array_save writes them), the optimizer state under
 * "optim.<slot>.<name>" (slot "momentum_buffer" for SGD, "exp_avg" and
 * "exp_avg_sq" for Adam/AdamW), and metadata: "format" =
 * "fusebox-checkpoint-1", "step", "fusion_key", "name", "seed",
 * "data_seed", and for a bf16 member its dynamic loss scale "loss_scale" and
 * "loss_scale_good" (docs/checkpoints.md).  The data position and the random
 * streams follow from the step and the seeds, so they need nothing more.
 */
#ifndef FB_WORKERS_SESSION_H
#define FB_WORKERS_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train_opts.h"

typedef struct fb_session fb_session;

/* Devices of a session whose times are kept one by one (a group has at most this many). */
#define FB_SESSION_MAX_DEVICES 64

/* One device's part of fb_session_times, ms summed over the interval's steps. */
typedef struct fb_session_device_times {
    double compute_ms; /* its forward, backward and update */
    double comm_ms;    /* its wait for all-reduces that backward did not hide */
    double io_ms;      /* waiting for minibatches (every device waits for the same ones) */
    double idle_ms;    /* the rest of its steps: waiting for slower devices, the bubble */
    double pass_ms;    /* of compute_ms: forward and backward over its shard, not the update */
    int64_t samples;   /* samples it trained on (its shard's; each stage of a shard alike) */
} fb_session_device_times;

/* Time spent inside fb_session_step since the session opened (or since the
 * last fb_session_take_times), ms; the caller's time between steps is not
 * counted. */
typedef struct fb_session_times {
    int64_t steps;      /* steps trained in the interval */
    double compute_ms;  /* forward, backward and update */
    double io_ms;       /* waiting for minibatches (assembling them, in memory) */
    double other_ms;    /* the rest of the step: evaluation, checkpoints, events, departures */
    /* data parallelism (0 on one device), means over the devices: */
    double comm_ms;     /* waiting for all-reduces that backward did not hide */
    double idle_ms;     /* waiting for a slower device (load imbalance) */
    int devices;        /* devices the session trains on */
    /* per device, in the order of fb_train_opts.devices (shard-major: device d * P + p);
     * evaluation, checkpoints and departures (other_ms) are in no device's entry */
    fb_session_device_times dev[FB_SESSION_MAX_DEVICES];
} fb_session_times;

/*
 * Opens a session over specs[0..n) (equal fusion keys) as fb_train_run
 * does, starting at step opts->start_step (every member has done that many
 * updates; 0 for a fresh start; below every member's total, else
 * FB_ERR_OUT_OF_RANGE).  In-memory data continues from that step by itself
 * (epoch = step / steps per epoch, offset = step % steps per epoch); a loader
 * must be opened positioned at that step by the caller (its start =
 * fb_loader_pos_at_step(n, batch_size, true, start_step)).  Members start from
 * their initialisation (or spec init file); fb_session_restore replaces that
 * with a checkpoint.  opts (may be NULL) is copied; the specs, datasets,
 * loader and opts->out_dir must outlive the session.  The out_dir is created
 * here.  Returns FB_OK or a negative fb_err with msg filled; *out untouched
 * on failure.
 */
int fb_session_new(fb_session **out, fb_backend *be, const fb_job_spec *const *specs, int n,
                   const fb_dataset *train, const fb_dataset *val, const fb_train_opts *opts,
                   char *msg, size_t msg_cap);

/*
 * Loads member i's full training state from checkpoint bytes (a file's
 * contents as fb_session_checkpoint produces them), normally before the
 * session's first step.  The checkpoint's "format" must be
 * "fusebox-checkpoint-1", its "step" the session's current step (the start
 * step before the first step), its "fusion_key", "seed" and "data_seed" the
 * spec's ("name" is not compared: a renamed job keeps its state); every
 * tensor of the member's state must be present with its exact shape and
 * dtype (F32; I64 for num_batches_tracked) and no other tensor may appear;
 * a bf16 member's loss scale, when present, must be a power of two in
 * [FB_LOSS_SCALE_MIN, FB_LOSS_SCALE_MAX] with a good-step count below the
 * growth interval (absent: it starts at FB_LOSS_SCALE_INIT); its "metrics",
 * when present, must be well formed (docs/checkpoints.md) and become the
 * member's latest known metrics, which its later files report.
 * FB_ERR_CHECKPOINT with a message naming the tensor or field (truncated or
 * garbage bytes: the parser's reason), FB_ERR_NOT_FOUND when member i has
 * left, FB_ERR_NOMEM; on failure member i (and every other) is unchanged,
 * since everything is read and checked before anything is written.
 */
int fb_session_restore(fb_session *s, int member, const void *buf, size_t len, char *msg,
                       size_t msg_cap);

/*
 * Loads member i's initial weights from len bytes of a safetensors file (a
 * model file, or a full-state checkpoint whose parameters and buffers are
 * taken and optimizer state ignored, as fb_array_load reads them), in a
 * session that starts at step 0, before its first step, on every device.  The rules of
 * fb_array_load apply: every parameter present with its exact shape, no
 * tensor that is not the model's.  FB_ERR_CHECKPOINT naming the tensor,
 * FB_ERR_NOT_FOUND when member i has left, FB_ERR_STATE_CONFLICT when
 * the session is past step 0, FB_ERR_NOMEM; on failure the member is unchanged.
 */
int fb_session_load_weights(fb_session *s, int member, const void *buf, size_t len, char *msg,
                            size_t msg_cap);

/*
 * Trains one step of every member still in the array, then emits that
 * step's events (STEP on the log grid, EVAL, CHECKPOINT, DONE, FAILED) in
 * that order and removes members that finished or failed.  With
 * fb_train_opts.window > 1 on one device a call trains a window of up to
 * that many steps where the array trains in tiles (fb_array_tiles), cut to
 * about fb_train_opts.window_ms of training, ending at the first step at
 * which a member checkpoints, validates or ends, and then emits each step's
 * events in step order as single steps would (the same events, losses and
 * files; a member that fails inside the window leaves at its step);
 * fb_session_steps_done says how far it got.  A member whose
 * loss is not finite fails alone (FB_TRAIN_FAILED with FB_ERR_DIVERGED,
 * text "loss is NaN at step N"; its update of that step is skipped), as does
 * one whose parameters are not finite where they would be kept (at its
 * checkpoint steps and its last step: "parameters are not finite after step
 * N"); it gets no further event and writes no file.  The others continue
 * unchanged: every loss is its own member's mean, and no sum over members
 * feeds back into training.  CHECKPOINT comes at each multiple of a
 * member's checkpoint_every before its last step, with the file
 * out_dir/<name>.checkpoint.safetensors written atomically first (out_dir)
 * and the bytes in the event (blobs); DONE writes out_dir/<name>.safetensors
 * and, with blobs, carries fb_session_model's bytes.  Returns FB_OK, or a
 * negative fb_err when the session itself cannot continue (a loader error, a
 * file that cannot be written, out of memory).  Calling it on a finished
 * session is a no-op returning FB_OK.
 */
int fb_session_step(fb_session *s, char *msg, size_t msg_cap);

/* True when no member remains. */
bool fb_session_done(const fb_session *s);

/* Updates every remaining member has done. */
int64_t fb_session_steps_done(const fb_session *s);

/* Members still in the array. */
int fb_session_size(const fb_session *s);

/* Whether member i (index into the specs) is still in the array. */
bool fb_session_has(const fb_session *s, int member);

/* Member i's total updates (its steps, or epochs over the train split);
 * 0 for an index outside the specs. */
int64_t fb_session_total_steps(const fb_session *s, int member);

/*
 * Serialises member i's full training state at the current step as
 * checkpoint bytes (malloc'd into *buf, *len bytes; the caller frees; what
 * the file out_dir/<name>.checkpoint.safetensors would hold, byte for byte).
 * FB_ERR_NOT_FOUND when the member has left, FB_ERR_NOMEM; *buf and *len
 * are untouched on failure.
 */
int fb_session_checkpoint(const fb_session *s, int member, void **buf, size_t *len, char *msg,
                          size_t msg_cap);

/*
 * Member i's parameters and batch-norm buffers only (what PyTorch's
 * load_state_dict takes), as safetensors bytes (malloc'd), with metadata
 * "step".  FB_ERR_NOT_FOUND when the member has left.
 */
int fb_session_model(const fb_session *s, int member, void **buf, size_t *len, char *msg,
                     size_t msg_cap);

/* Removes member i from the array now (no event), between steps; the
 * others keep their state.  A no-op when it has left (or never was). */
void fb_session_detach(fb_session *s, int member);

/*
 * Sets the split of the global batch over the session's data shards from
 * the next step on: split[0..n) samples per shard, n the session's shard
 * count (fb_session_shards), every shard >= 1, the sum the batch size (one
 * device: n = 1 and the batch size).  Training does not change with the
 * split beyond float rounding (data_parallel.h).  Returns FB_OK or FB_ERR_OUT_OF_RANGE
 * with msg filled; the split in force is unchanged on failure.
 */
int fb_session_set_split(fb_session *s, const int64_t *split, int n, char *msg, size_t msg_cap);

/*
 * Gives every process of a session that spans processes (fb_train_opts.comm)
 * the values v[0..n) of the process that holds rank 0 (0 <= n <= 4096,
 * FB_DP_MAX_BROADCAST of data_parallel.h), through the session's host-memory
 * communicator (fb_train_opts.control_comm, else comm), between
 * two steps: what the other processes pass is ignored and overwritten.
 * Every process must call it at the same point with the same n; the group's
 * leader uses it to make every worker apply its decisions before the same
 * step.  A session in one process keeps v as it is.  Returns FB_OK, or
 * FB_ERR_IO when the communication fails (a peer died or timed out; the
 * communicator is then broken and the session cannot step on) with v
 * untouched, FB_ERR_OUT_OF_RANGE for a bad n.
 */
int fb_session_broadcast(fb_session *s, int64_t *v, int n, char *msg, size_t msg_cap);

/* Devices the session trains on (1 without data or pipeline parallelism). */
int fb_session_devices(const fb_session *s);

/* Data shards of the session: the entries a split has (1 without data parallelism; the
 * ranks of the whole world across processes). */
int fb_session_shards(const fb_session *s);

/* Returns the times accumulated since the last call (or the start) and resets them. */
fb_session_times fb_session_take_times(fb_session *s);

/* Frees the session (not the specs or datasets).  Accepts NULL. */
void fb_session_free(fb_session *s);

#endif
