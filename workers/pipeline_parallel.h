/*
 * Pipeline parallelism, combined with data parallelism: a fused array's
 * layers split into P stages balanced by FLOPs (pipeline_plan.h), every global
 * batch cut into m micro-batches that flow through the stages in the 1F1B
 * order, and each stage replicated on D data shards (data_parallel.h).  Device
 * (shard d, stage p) is devs[d * P + p], as ASSIGN lists a group's devices.
 *
 * Stage 0 is one fused array over the shared input.  A later stage's input
 * differs from member to member, so it runs one array per member (B = 1);
 * its first layer (a linear or conv2d: stages are cut only there) yields the
 * input gradient the previous stage's backward starts from.  Stages before
 * the last recompute a micro-batch's forward at its backward, since an array
 * keeps one batch's activations.  Gradients add up over the micro-batches
 * (each scaled by 1/N of the global batch), so a step is the same update as
 * on one device, within float rounding; parameters start as the whole
 * model's would.  Two things are not the same as on one device, by nature:
 * batch norm normalises each micro-batch on its own, and dropout masks
 * differ in stages after the first (they are drawn per stage).  Stages
 * exchange activations through host memory, so they run on CPU devices.
 */
#ifndef FB_WORKERS_PP_H
#define FB_WORKERS_PP_H

#include <stddef.h>
#include <stdint.h>

#include "data_parallel.h"
#include "pipeline_plan.h"

typedef struct fb_pp fb_pp;

/* Where a pipeline's time went since the last fb_pp_take_times, ms. */
typedef struct fb_pp_times {
    int64_t steps;
    int P;
    double wall_ms;                            /* the steps, start to end */
    double busy_ms[FB_PIPELINE_MAX_STAGES];    /* per stage: its devices computing */
    /* per device k = d * P + p (shard d, stage p), as fb_pp_new's devs, while D * P is at
     * most FB_DP_MAX_RANKS (else D is 0 and these are empty): */
    int D;
    double compute_ms[FB_DP_MAX_RANKS]; /* forward, backward and update of its replicas */
    double comm_ms[FB_DP_MAX_RANKS];    /* waiting for the stage's all-reduces */
    double pass_ms[FB_DP_MAX_RANKS];    /* of compute_ms: its training passes, not the update */
    int64_t samples[FB_DP_MAX_RANKS];   /* samples of its shard it trained on */
} fb_pp_times;

/*
 * Builds the pipeline for specs[0..B) (equal fusion keys) on devs[0..D*P)
 * with m micro-batches of a global batch of `batch` samples (at least m * D
 * of them).  opts as for fb_dp_new (may be NULL).  Returns FB_OK or a
 * negative fb_err with msg filled (FB_ERR_OUT_OF_RANGE for bad D, P, m or a
 * model with too few places to cut, FB_ERR_UNSUPPORTED for a CUDA device);
 * *out is untouched on failure.
 */
int fb_pp_new(const fb_device *devs, int D, int P, int m, const fb_job_spec *const *specs, int B,
              int batch, const fb_dp_opts *opts, fb_pp **out, char *msg, size_t msg_cap);

/* Releases the stages.  Accepts NULL. */
void fb_pp_free(fb_pp *pp);

/* Stage p's first top-level layer (p = P: the layer count). */
int fb_pp_stage_first(const fb_pp *pp, int p);

/*
 * One training step on x [batch, input numel] and y [batch] (host): forward
 * and backward of every micro-batch in 1F1B order, then each member's
 * update with hp[0..B).  split[0..D) (NULL: even) weighs the data shards;
 * every micro-batch is split in the same proportions.  loss [B] receives
 * each member's mean loss over the batch, correct [B] (may be NULL) its
 * count of correct predictions.  Returns FB_OK or a negative
 * fb_err (FB_ERR_OUT_OF_RANGE for another batch size or a bad split,
 * FB_ERR_DATA for a label outside the outputs: nothing ran then).
 */
int fb_pp_train_step(fb_pp *pp, const float *x, const int32_t *y, int N, const int64_t *split,
                     uint64_t stream, const fb_optim_hparams *hp, float *loss, float *correct,
                     char *msg, size_t msg_cap);

/*
 * The whole model's view of the stages, for what needs one array (a
 * session's checkpoints, evaluation and final weights): fb_pp_gather copies
 * every member's parameters, optimizer state, batch-norm buffers and counters
 * from the stages into full (an array of the same specs, members in the same
 * slots); fb_pp_scatter copies member m's from full into every stage and
 * replica.
 */
void fb_pp_gather(fb_pp *pp, fb_array *full);
void fb_pp_scatter(fb_pp *pp, const fb_array *full, int m);

/* Removes the member in slot m from every stage; slots above move down. */
void fb_pp_remove(fb_pp *pp, int m);

/* Members in the pipeline. */
int fb_pp_size(const fb_pp *pp);

/* Returns the times since the last call and resets them. */
fb_pp_times fb_pp_take_times(fb_pp *pp);

#endif
