/*
 * Pipeline parallelism's plan: the model's top-level layers split into P
 * contiguous stages balanced by FLOPs (from the spec's inferred shapes), and
 * the 1F1B schedule each stage follows over m micro-batches.
 *
 * In 1F1B stage s (0-based, of P) first runs min(P - 1 - s, m) forward
 * micro-batches (the warm-up), then alternates one forward and one backward
 * until every forward has run, then runs the remaining backwards (the
 * cool-down).  It keeps at most P - s micro-batches' activations alive,
 * instead of m for GPipe, with the same bubble: with equal stage times the
 * idle share of the devices is (P - 1) / (m + P - 1).
 *
 * fb_pipeline_simulate plays a schedule against per-stage forward and
 * backward times, which the benchmark compares with the formula and with
 * measured runs.
 */
#ifndef FB_WORKERS_PIPELINE_H
#define FB_WORKERS_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>

#include "jobspec.h"

#define FB_PIPELINE_MAX_STAGES 64

/*
 * Whether a stage may start at top-level layer j (0 < j < layers): only
 * before a linear or conv2d layer, whose backward yields the stage's input
 * gradient for the previous stage, and not where the first stage would be
 * flattens only.
 */
bool fb_pipeline_can_cut(const fb_job_spec *spec, int j);

/*
 * Splits spec's top-level layers into P (1..FB_PIPELINE_MAX_STAGES, at most
 * the layer count) contiguous non-empty stages, cut only where
 * fb_pipeline_can_cut allows, so that the largest stage's
 * forward + backward FLOPs is as small as possible; stage p gets layers
 * first[p] .. first[p + 1] - 1 (first has P + 1 entries; first[P] is the
 * layer count).  Ties go to the earliest split.  Returns FB_OK, or
 * FB_ERR_OUT_OF_RANGE with msg filled (first untouched).
 */
int fb_pipeline_partition(const fb_job_spec *spec, int P, int *first, char *msg,
                          size_t msg_cap);

/* One slot of a stage's schedule: a forward or backward of a micro-batch. */
typedef struct fb_pipe_op {
    int backward; /* 0 forward, 1 backward */
    int micro;    /* 0 .. m - 1 */
} fb_pipe_op;

/*
 * The 1F1B order of stage s of P over m micro-batches into ops[0 .. 2m)
 * (cap must be at least 2m).  Returns 2m, or FB_ERR_OUT_OF_RANGE for bad
 * arguments (ops untouched).
 */
int fb_pipeline_1f1b(int P, int m, int s, fb_pipe_op *ops, int cap);

/* The bubble of 1F1B (and GPipe) with equal stage times: (P-1)/(m+P-1). */
double fb_pipeline_bubble_formula(int P, int m);

/*
 * Plays the 1F1B schedule with stage s's forward taking tf[s] and backward
 * tb[s] (any unit), a forward waiting for the previous stage's forward of the
 * same micro-batch and a backward for the next stage's backward.  Writes the
 * makespan and the idle share of P devices over it (the bubble).  Returns
 * FB_OK or FB_ERR_OUT_OF_RANGE / FB_ERR_NOMEM.
 */
int fb_pipeline_simulate(int P, int m, const double *tf, const double *tb, double *makespan,
                         double *bubble);

#endif
