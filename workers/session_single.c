/*
 * The session's engine on one device: the array itself, on the session's
 * backend, trained and updated in place.
 */
#include "session_impl.h"

static int single_open(fb_session *s, const fb_job_spec *const *specs, int n, char *msg,
                       size_t msg_cap)
{
    s->shards = 1;
    return fb_array_new(s->be, specs, n, (int)s->bs, &s->a, msg, msg_cap);
}

static void single_free(fb_session *s)
{
    fb_array_free(s->a);
}

/* The update is part of the step (fb_array_train_step: members in tiles
 * that stay in cache) with the hyperparameters the session set before it; a
 * member whose loss is not finite is not updated, as the session wants. */
static int single_train(fb_session *s, const float *x, const int32_t *y, char *msg, size_t msg_cap)
{
    return fb_array_train_step(s->a, x, y, (int)s->bs, (uint64_t)s->step, s->hp, s->loss,
                               s->correct, msg, msg_cap);
}

static int single_train_steps(fb_session *s, int k, const float *const *x,
                              const int32_t *const *y, char *msg, size_t msg_cap)
{
    uint64_t stream[FB_SESSION_MAX_WINDOW];
    for (int j = 0; j < k; j++)
        stream[j] = (uint64_t)(s->step + j);
    return fb_array_train_steps(s->a, k, x, y, (int)s->bs, stream, s->whp, s->wloss, s->wcorrect,
                                msg, msg_cap);
}

static void single_update(fb_session *s)
{
    (void)s; /* done in single_train */
}

static void single_account(fb_session *s, double wall, int n_dev)
{
    fb_session_device_times *dv = s->times.dev;
    s->times.compute_ms += wall;
    if (n_dev == 1) {
        dv[0].compute_ms += wall;
        dv[0].samples += s->bs;
        dv[0].pass_ms += wall; /* one device: no split to tell the update from */
    }
}

static void single_remove(fb_session *s, int b)
{
    fb_array_remove(s->a, b);
}

static int single_devices(const fb_session *s)
{
    (void)s;
    return 1;
}

static int single_set_split(fb_session *s, const int64_t *split, char *msg, size_t msg_cap)
{
    if (split[0] != s->bs)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "the split adds up to %lld samples, the batch has %lld", (long long)split[0],
                       (long long)s->bs);
    return FB_OK;
}

const fb_session_engine_ops fb_session_engine_single = {
    .name = "one device",
    .open = single_open,
    .free = single_free,
    .train = single_train,
    .train_steps = single_train_steps,
    .update = single_update,
    .account = single_account,
    .remove = single_remove,
    .devices = single_devices,
    .set_split = single_set_split,
    .broadcast = NULL,
    .replicas = NULL,
    .replica = NULL,
    .scatter = NULL,
};
