/*
 * Helpers of the parallelism tests: B = 4 member specs (an MLP with dropout
 * and a conv + batch-norm net), a single-device reference trajectory, and a
 * data-parallel run of the same steps that the tests compare with it.
 */
#ifndef FB_TESTS_PAR_UTIL_H
#define FB_TESTS_PAR_UTIL_H

#include "check.h"
#include "engine/engine_util.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "device.h"
#include "data_parallel.h"
#include "errors.h"
#include "jobspec.h"
#include "kernels.h"

#define PU_B 4
#define PU_SIDE 6
#define PU_CLASSES 5
#define PU_BS 20
#define PU_STEPS 50
#define PU_MAX_RANKS 4

/* Member i of an MLP array (dropout included, so masks must follow samples),
 * global batch bs. */
static inline fb_job_spec *pu_mlp_bs(int i, int bs)
{
    return et_spec("{\"name\":\"mlp%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
                   "\"layers\":[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":32},"
                   "{\"type\":\"relu\"},{\"type\":\"dropout\",\"p\":0.2},"
                   "{\"type\":\"linear\",\"out\":16},{\"type\":\"tanh\"},"
                   "{\"type\":\"linear\",\"out\":%d}]},\"batch_size\":%d,\"steps\":%d,"
                   "\"optimizer\":{\"type\":\"adam\",\"lr\":%g},\"seed\":%d,\"data_seed\":3}",
                   i, PU_SIDE, PU_SIDE, PU_CLASSES, bs, PU_STEPS, 0.002 * (1 + i), 11 + i);
}

/* Member i of a conv + batch-norm array, global batch bs. */
static inline fb_job_spec *pu_cnn_bs(int i, int bs)
{
    return et_spec("{\"name\":\"cnn%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
                   "\"layers\":[{\"type\":\"conv2d\",\"out\":4,\"kernel\":3,\"padding\":1},"
                   "{\"type\":\"batchnorm\"},{\"type\":\"relu\"},"
                   "{\"type\":\"maxpool2d\",\"kernel\":2},{\"type\":\"flatten\"},"
                   "{\"type\":\"linear\",\"out\":%d}]},\"batch_size\":%d,\"steps\":%d,"
                   "\"optimizer\":{\"type\":\"sgd\",\"lr\":%g,\"momentum\":0.9},\"seed\":%d,"
                   "\"data_seed\":3}",
                   i, PU_SIDE, PU_SIDE, PU_CLASSES, bs, PU_STEPS, 0.02 * (1 + i), 21 + i);
}

static inline fb_job_spec *pu_mlp(int i)
{
    return pu_mlp_bs(i, PU_BS);
}

static inline fb_job_spec *pu_cnn(int i)
{
    return pu_cnn_bs(i, PU_BS);
}

/* The PU_B members' specs into s, global batch bs (the tests across
 * processes use a larger one than PU_BS). */
static inline void pu_make_bs(bool cnn, int bs, fb_job_spec **s)
{
    for (int i = 0; i < PU_B; i++) s[i] = cnn ? pu_cnn_bs(i, bs) : pu_mlp_bs(i, bs);
}

static inline void pu_free_specs(fb_job_spec **s)
{
    for (int i = 0; i < PU_B; i++) et_spec_free(s[i]);
}

typedef struct pu_specs {
    fb_job_spec *s[PU_B];
} pu_specs;

static inline pu_specs pu_make(bool cnn)
{
    pu_specs p;
    pu_make_bs(cnn, PU_BS, p.s);
    return p;
}

static inline void pu_free(pu_specs *p)
{
    pu_free_specs(p->s);
}

/* Step t's batch: PU_BS consecutive samples of ds, wrapping around. */
static inline void pu_batch(const fb_dataset *ds, int t, float *x, int32_t *y)
{
    int64_t F = (int64_t)ds->C * ds->H * ds->W;
    for (int i = 0; i < PU_BS; i++) {
        int64_t k = ((int64_t)t * PU_BS + i) % ds->n;
        memcpy(x + i * F, ds->x + k * F, (size_t)F * sizeof *x);
        y[i] = ds->y[k];
    }
}

/* The single-device trajectory: loss[t][b] for t in 0..steps. */
static inline void pu_reference(const pu_specs *p, const fb_dataset *ds, int steps,
                                double loss[][PU_B])
{
    char msg[256];
    fb_array *a = NULL;
    CHECK_INT_EQ(fb_array_new(fb_backend_cpu(), (const fb_job_spec *const *)p->s, PU_B, PU_BS,
                              &a, msg, sizeof msg),
                 FB_OK);
    int64_t F = (int64_t)ds->C * ds->H * ds->W;
    float *x = malloc((size_t)(PU_BS * F) * sizeof *x);
    int32_t y[PU_BS];
    float l[PU_B];
    fb_optim_hparams hp[PU_B];
    CHECK(x != NULL);
    for (int t = 0; t < steps; t++) {
        pu_batch(ds, t, x, y);
        CHECK_INT_EQ(fb_array_forward_backward(a, x, y, PU_BS, true, (uint64_t)t, l, NULL, msg,
                                               sizeof msg),
                     FB_OK);
        for (int b = 0; b < PU_B; b++) {
            loss[t][b] = l[b];
            fb_array_hparams(a, b, t + 1, steps, &hp[b]);
        }
        fb_array_step(a, hp);
    }
    free(x);
    fb_array_free(a);
}

/* D CPU devices, one compute thread each. */
static inline void pu_devices(fb_device *devs, int D)
{
    char msg[128];
    CHECK_INT_EQ(fb_devices_discover(D, (uint64_t)1 << 30, devs, D, msg, sizeof msg), D);
}

/* split_at(t, split) fills step t's split; NULL = even. */
typedef void (*pu_split_fn)(int t, int64_t *split);

/* The same steps data-parallel: loss[t][b]. */
static inline void pu_dp_run(const pu_specs *p, const fb_dataset *ds, int steps, int D,
                             const fb_dp_opts *opts, pu_split_fn split_at, double loss[][PU_B],
                             fb_dp **keep)
{
    char msg[256];
    fb_device devs[PU_MAX_RANKS];
    pu_devices(devs, D);
    fb_dp *dp = NULL;
    int err = fb_dp_new(devs, D, (const fb_job_spec *const *)p->s, PU_B, PU_BS, opts, &dp, msg,
                        sizeof msg);
    if (err) fprintf(stderr, "fb_dp_new: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    int64_t F = (int64_t)ds->C * ds->H * ds->W;
    float *x = malloc((size_t)(PU_BS * F) * sizeof *x);
    int32_t y[PU_BS];
    float l[PU_B];
    fb_optim_hparams hp[PU_B];
    int64_t split[PU_MAX_RANKS];
    CHECK(x != NULL);
    for (int t = 0; t < steps; t++) {
        pu_batch(ds, t, x, y);
        if (split_at) split_at(t, split);
        err = fb_dp_forward_backward(dp, x, y, PU_BS, split_at ? split : NULL, (uint64_t)t, l,
                                     NULL, msg, sizeof msg);
        if (err) fprintf(stderr, "step %d: %s\n", t, msg);
        CHECK_INT_EQ(err, FB_OK);
        for (int b = 0; b < PU_B; b++) {
            loss[t][b] = l[b];
            fb_array_hparams(fb_dp_array(dp, 0), b, t + 1, steps, &hp[b]);
        }
        fb_dp_step(dp, hp);
    }
    free(x);
    if (keep)
        *keep = dp;
    else
        fb_dp_free(dp);
}

/* The worst relative loss error of run a against reference r. */
static inline double pu_worst(double a[][PU_B], double r[][PU_B], int steps)
{
    double worst = 0;
    for (int t = 0; t < steps; t++)
        for (int b = 0; b < PU_B; b++) {
            CHECK(isfinite(a[t][b]));
            double e = fabs(a[t][b] - r[t][b]) / fmax(fabs(r[t][b]), 1e-12);
            if (e > worst) worst = e;
        }
    return worst;
}

#endif
