/*
 * The session's engine under pipeline parallelism (pipeline_parallel.h): D data shards of
 * P stages, micro-batches through the stages, each stage updating its part
 * of the model within the step.  Beside the stages the session keeps the
 * whole model as one array, brought up to the stages after every step, for
 * evaluation, checkpoints and weights.
 */
#include <string.h>

#include "pipeline_parallel.h"
#include "session_impl.h"

static int pipeline_open(fb_session *s, const fb_job_spec *const *specs, int n, char *msg,
                         size_t msg_cap)
{
    if (s->opts.comm || s->opts.control_comm)
        return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED, "pipeline stages do not span processes");
    int64_t bs = s->bs;
    int P = s->opts.pipeline, D = s->opts.n_devices / P;
    if (!s->opts.devices || D < 1 || D * P != s->opts.n_devices || D > FB_DP_MAX_RANKS || D > bs)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "%d pipeline stages need a multiple of %d devices (not %d) and a batch "
                       "of at least one sample per data shard",
                       P, P, s->opts.n_devices);
    int m = s->opts.micro_batches > 0 ? s->opts.micro_batches : 2 * P;
    if (m > bs / D) m = (int)(bs / D);
    if (m > 64) m = 64;
    fb_pp *pp = NULL;
    int err = fb_pp_new(s->opts.devices, D, P, m, specs, n, (int)bs, s->opts.dp, &pp, msg, msg_cap);
    if (err) return err;
    s->ctx = pp;
    /* the whole model, for evaluation, checkpoints and weights, kept equal to the stages */
    if ((err = fb_array_new(s->be, specs, n, (int)bs, &s->a, msg, msg_cap))) return err;
    s->shards = D;
    if (s->opts.split) {
        int64_t sum = 0;
        for (int d = 0; d < D; d++) {
            if (s->opts.split[d] < 1) sum = -1;
            if (sum >= 0) sum += s->opts.split[d];
        }
        if (sum != bs)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "the split of %d shards does not add up to the batch of %lld", D,
                           (long long)bs);
        memcpy(s->split, s->opts.split, (size_t)D * sizeof *s->split);
    } else {
        fb_dp_even_split(D, (int)bs, NULL, s->split);
    }
    return FB_OK;
}

static void pipeline_free(fb_session *s)
{
    fb_array_free(s->a);
    fb_pp_free(s->ctx);
}

/* The stages update within the step, with the hyperparameters the session
 * set before it. */
static int pipeline_train(fb_session *s, const float *x, const int32_t *y, char *msg,
                          size_t msg_cap)
{
    return fb_pp_train_step(s->ctx, x, y, (int)s->bs, s->split, (uint64_t)s->step, s->hp, s->loss,
                            s->correct, msg, msg_cap);
}

/* The whole model's view, for what follows the step. */
static void pipeline_update(fb_session *s)
{
    fb_pp_gather(s->ctx, s->a);
}

static void pipeline_account(fb_session *s, double wall, int n_dev)
{
    fb_session_device_times *dv = s->times.dev;
    /* the stages' mean busy time is compute; the rest of the step is the bubble */
    fb_pp_times pt = fb_pp_take_times(s->ctx);
    double busy = 0;
    for (int p = 0; p < pt.P; p++) busy += pt.busy_ms[p] / pt.P;
    s->times.compute_ms += busy;
    s->times.idle_ms += wall > busy ? wall - busy : 0;
    /* a device's own compute and exposed communication; the rest of the step it waited,
     * for its neighbours in the pipeline or the slower shard */
    for (int k = 0; k < n_dev && pt.D * pt.P == n_dev; k++) {
        double rest = wall - pt.compute_ms[k] - pt.comm_ms[k];
        dv[k].compute_ms += pt.compute_ms[k];
        dv[k].comm_ms += pt.comm_ms[k];
        dv[k].idle_ms += rest > 0 ? rest : 0;
        dv[k].samples += pt.samples[k];
        dv[k].pass_ms += pt.pass_ms[k];
    }
}

static void pipeline_remove(fb_session *s, int b)
{
    fb_array_remove(s->a, b);
    fb_pp_remove(s->ctx, b);
}

static int pipeline_devices(const fb_session *s)
{
    return s->shards * s->opts.pipeline;
}

static int pipeline_set_split(fb_session *s, const int64_t *split, char *msg, size_t msg_cap)
{
    int64_t sum = 0;
    for (int d = 0; d < s->shards; d++) {
        if (split[d] < 1)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "shard %d of the split has %lld samples (at least 1)", d,
                           (long long)split[d]);
        sum += split[d];
    }
    if (sum != s->bs)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "the split adds up to %lld samples, the batch has %lld", (long long)sum,
                       (long long)s->bs);
    memcpy(s->split, split, (size_t)s->shards * sizeof *split);
    return FB_OK;
}

static void pipeline_scatter(fb_session *s, int b)
{
    fb_pp_scatter(s->ctx, s->a, b);
}

const fb_session_engine_ops fb_session_engine_pipeline = {
    .name = "pipeline",
    .open = pipeline_open,
    .free = pipeline_free,
    .train = pipeline_train,
    .update = pipeline_update,
    .account = pipeline_account,
    .remove = pipeline_remove,
    .devices = pipeline_devices,
    .set_split = pipeline_set_split,
    .broadcast = NULL,
    .replicas = NULL,
    .replica = NULL,
    .scatter = pipeline_scatter,
};
