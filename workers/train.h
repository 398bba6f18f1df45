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
 * from opts.start_step to its end.  The options and events both take are in
 * train_opts.h, which this header includes.
 */
#ifndef FB_WORKERS_TRAIN_H
#define FB_WORKERS_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "idx.h"
#include "jobspec.h"
#include "kernels.h"
#include "train_opts.h"

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
