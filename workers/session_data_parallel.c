/*
 * The session's engine under data parallelism (data_parallel.h): one replica of the
 * array per device, each batch split over the shards of the whole world
 * (this process's ranks and, for a group that spans workers, the others'),
 * gradients summed across them.  Replica 0 is the session's array.
 */
#include <string.h>

#include "session_impl.h"

static int dp_open(fb_session *s, const fb_job_spec *const *specs, int n, char *msg, size_t msg_cap)
{
    int D = s->opts.n_devices;
    int64_t bs = s->bs;
    if (!s->opts.devices || D < 1 || D > FB_DP_MAX_RANKS || D > bs)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "data parallelism over %d devices needs %d..%d devices and a batch of "
                       "at least that many samples (batch_size %lld)",
                       D, s->opts.comm ? 1 : 2, FB_DP_MAX_RANKS, (long long)bs);
    /* across processes the communicator joins the local ranks to the others */
    fb_dp_opts dpo = {.slow_rank = -1};
    if (s->opts.dp) dpo = *s->opts.dp;
    if (s->opts.comm) dpo.comm = s->opts.comm;
    if (s->opts.control_comm) dpo.control_comm = s->opts.control_comm;
    fb_dp *dp = NULL;
    int err = fb_dp_new(s->opts.devices, D, specs, n, (int)bs, &dpo, &dp, msg, msg_cap);
    if (err) return err;
    s->ctx = dp;
    /* the split covers every rank of the world, this process's and the others' */
    D = fb_dp_world(dp);
    s->shards = D;
    if (D > bs)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "a world of %d ranks needs a batch of at least that many samples "
                       "(batch_size %lld)",
                       D, (long long)bs);
    s->a = fb_dp_array(dp, 0);
    if (s->opts.split) {
        if ((err = fb_dp_check_split(dp, s->opts.split, (int)bs, msg, msg_cap))) return err;
        memcpy(s->split, s->opts.split, (size_t)D * sizeof *s->split);
    } else {
        fb_dp_even_split(D, (int)bs, NULL, s->split);
    }
    return FB_OK;
}

/* The replicas, the session's array among them, are dp's. */
static void dp_free(fb_session *s)
{
    fb_dp_free(s->ctx);
}

static int dp_train(fb_session *s, const float *x, const int32_t *y, char *msg, size_t msg_cap)
{
    return fb_dp_forward_backward(s->ctx, x, y, (int)s->bs, s->split, (uint64_t)s->step, s->loss,
                                  s->correct, msg, msg_cap);
}

static void dp_update(fb_session *s)
{
    fb_dp_step(s->ctx, s->hp);
}

/* The step's wall time, split into the devices' mean compute, their mean wait
 * for communication, and the rest: waiting for the slowest device. */
static void dp_account(fb_session *s, double wall, int n_dev)
{
    fb_session_device_times *dv = s->times.dev;
    fb_dp_times dt = fb_dp_take_times(s->ctx);
    double compute = 0, comm = 0;
    for (int d = 0; d < dt.D; d++) {
        compute += dt.compute_ms[d] / dt.D;
        comm += dt.comm_exposed_ms[d] / dt.D;
    }
    double idle = wall - compute - comm;
    s->times.compute_ms += compute;
    s->times.comm_ms += comm;
    s->times.idle_ms += idle > 0 ? idle : 0;
    for (int d = 0; d < n_dev && dt.D == n_dev; d++) {
        double rest = wall - dt.compute_ms[d] - dt.comm_exposed_ms[d];
        dv[d].compute_ms += dt.compute_ms[d];
        dv[d].comm_ms += dt.comm_exposed_ms[d];
        dv[d].idle_ms += rest > 0 ? rest : 0;
        dv[d].samples += dt.samples[d];
        dv[d].pass_ms += dt.pass_ms[d];
    }
}

static void dp_remove(fb_session *s, int b)
{
    fb_dp_remove(s->ctx, b);
}

static int dp_devices(const fb_session *s)
{
    return fb_dp_ranks(s->ctx);
}

static int dp_set_split(fb_session *s, const int64_t *split, char *msg, size_t msg_cap)
{
    int err = fb_dp_check_split(s->ctx, split, (int)s->bs, msg, msg_cap);
    if (err) return err;
    memcpy(s->split, split, (size_t)s->shards * sizeof *split);
    return FB_OK;
}

static int dp_broadcast(fb_session *s, int64_t *v, int n, char *msg, size_t msg_cap)
{
    return fb_dp_broadcast_i64(s->ctx, v, n, msg, msg_cap);
}

static int dp_replicas(const fb_session *s)
{
    return fb_dp_ranks(s->ctx);
}

static fb_array *dp_replica(const fb_session *s, int d)
{
    return fb_dp_array(s->ctx, d);
}

const fb_session_engine_ops fb_session_engine_data_parallel = {
    .name = "data-parallel",
    .open = dp_open,
    .free = dp_free,
    .train = dp_train,
    .update = dp_update,
    .account = dp_account,
    .remove = dp_remove,
    .devices = dp_devices,
    .set_split = dp_set_split,
    .broadcast = dp_broadcast,
    .replicas = dp_replicas,
    .replica = dp_replica,
    .scatter = NULL,
};
