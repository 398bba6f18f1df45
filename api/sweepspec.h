/*
 * The sweep spec: a base job spec, a search space over its fields, and an
 * optional early-stopping rule (ASHA), as sent to POST /v1/sweeps.
 *
 * fb_sweep_spec_parse() validates the sweep strictly (unknown fields, wrong
 * types and out-of-range values are refused with a code from errors.h and a
 * message naming the field), expands the search space into trials, writes
 * each trial's parameters into a copy of the base spec and validates every
 * resulting job spec with fb_job_spec_parse(), so a sweep that parses
 * expands only into jobs the server accepts.  Expansion is deterministic:
 * grid trials enumerate the parameters in sorted path order (the last path
 * varies fastest); random trials draw from a generator seeded by
 * search.seed, so the same spec always yields the same trials.
 *
 * Parameters are addressed by dotted paths into the job spec:
 * "optimizer.lr", "seed", "batch_size", "model.layers.2.p" (a number is an
 * array index).  Every parent on the path must exist in the base; the last
 * part may be a member the base leaves out (then it is added).  See
 * docs/api.md for the format.
 */
#ifndef FB_API_SWEEPSPEC_H
#define FB_API_SWEEPSPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "jobspec.h"

#define FB_SWEEP_MAX_TRIALS 1000 /* jobs one sweep may expand into */
#define FB_SWEEP_MAX_PARAMS 16   /* searched fields */
#define FB_SWEEP_MAX_VALUES 256  /* values of one grid or choice parameter */
#define FB_SWEEP_PATH_MAX 128    /* bytes of one parameter path */
#define FB_SWEEP_PATH_DEPTH 8    /* parts of one parameter path */

typedef enum fb_search_type { FB_SEARCH_GRID, FB_SEARCH_RANDOM } fb_search_type;

typedef enum fb_metric_mode { FB_METRIC_MIN, FB_METRIC_MAX } fb_metric_mode;

/* Asynchronous successive halving: at each rung (grace_steps times
 * reduction_factor^k steps, k < max_rungs) only the best 1/reduction_factor
 * of the trials that reached it continue. */
typedef struct fb_asha_spec {
    bool enabled;
    char metric[32]; /* the sweep's metric: loss, accuracy, val_loss or val_accuracy */
    fb_metric_mode mode;
    int64_t grace_steps;
    int reduction_factor;
    int max_rungs;
} fb_asha_spec;

typedef struct fb_sweep_spec fb_sweep_spec;

/*
 * Parses, validates and expands a sweep spec from len bytes of JSON.  On
 * success returns FB_OK and *out (free with fb_sweep_spec_free).  On failure
 * returns a negative fb_err (FB_ERR_TOO_MANY_TRIALS when the space expands
 * past FB_SWEEP_MAX_TRIALS), writes a message naming the field into msg
 * (for an invalid trial: the field inside "base" and the trial number) and
 * leaves *out untouched.  limits apply to every trial's job spec (NULL for
 * the defaults).
 */
int fb_sweep_spec_parse(const char *json, size_t len, const fb_spec_limits *limits,
                        fb_sweep_spec **out, char *msg, size_t msg_cap);

/* Frees a parsed sweep and its trials; accepts NULL. */
void fb_sweep_spec_free(fb_sweep_spec *s);

/* The sweep's name (the "name" field, else the base spec's name). */
const char *fb_sweep_spec_name(const fb_sweep_spec *s);

/* The search type. */
fb_search_type fb_sweep_spec_search_type(const fb_sweep_spec *s);

/* Number of trials, 1..FB_SWEEP_MAX_TRIALS. */
int fb_sweep_spec_n_trials(const fb_sweep_spec *s);

/* The parsed job spec of trial i (0-based); owned by the sweep. */
const fb_job_spec *fb_sweep_spec_trial(const fb_sweep_spec *s, int i);

/* Canonical JSON of trial i's job spec; owned by the sweep. */
const char *fb_sweep_spec_trial_json(const fb_sweep_spec *s, int i);

/* Trial i's parameter values as a JSON object text ({"optimizer.lr": 0.001});
 * owned by the sweep. */
const char *fb_sweep_spec_trial_params(const fb_sweep_spec *s, int i);

/* The early-stopping rule (enabled false when the spec has none). */
const fb_asha_spec *fb_sweep_spec_early_stopping(const fb_sweep_spec *s);

/* The metric that decides (ASHA's rungs and the best trial) and its mode: the
 * spec's "metric" (or early_stopping.metric), else val_accuracy maximised for
 * a cross-entropy base and val_loss minimised for an MSE one.  Never a test
 * metric: those are reported, and a spec naming one is refused. */
const char *fb_sweep_spec_metric(const fb_sweep_spec *s, fb_metric_mode *mode);

/*
 * Canonical JSON of the whole sweep (sorted keys, defaults filled), what the
 * server stores and hashes for idempotency.  Returns a malloc'd string the
 * caller frees, or NULL when out of memory.
 */
char *fb_sweep_spec_canonical(const fb_sweep_spec *s);

#endif
