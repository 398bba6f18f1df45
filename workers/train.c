/*
 * The training loop run to its end: a session (session.h) stepped until every
 * member has left.
 */
#include "train.h"

#include <math.h>
#include <stddef.h>

#include "session.h"

/* What fb_train_run adds to the caller's callback: the final validation results. */
typedef struct run_ctx {
    const fb_train_opts *caller; /* may be NULL */
    bool evaluated;
    double *final_loss, *final_acc;
} run_ctx;

static void run_event(const fb_train_event *ev, void *user)
{
    run_ctx *c = user;
    /* with a validation set, a member's done event carries its final validation */
    if (ev->kind == FB_TRAIN_DONE && c->evaluated) {
        if (c->final_loss) c->final_loss[ev->member] = ev->loss;
        if (c->final_acc) c->final_acc[ev->member] = ev->accuracy;
    }
    if (c->caller && c->caller->cb) c->caller->cb(ev, c->caller->user);
}

int fb_train_run(fb_backend *be, const fb_job_spec *const *specs, int n, const fb_dataset *train,
                 const fb_dataset *val, const fb_train_opts *opts, double *final_loss,
                 double *final_acc, char *msg, size_t msg_cap)
{
    run_ctx c = {.caller = opts, .evaluated = val && val->n > 0, .final_loss = final_loss,
                 .final_acc = final_acc};
    fb_train_opts o = opts ? *opts : (fb_train_opts){0};
    o.cb = run_event;
    o.user = &c;
    fb_session *s = NULL;
    int err = fb_session_new(&s, be, specs, n, train, val, &o, msg, msg_cap);
    if (err) return err;
    for (int i = 0; i < n; i++) {
        if (final_loss) final_loss[i] = NAN;
        if (final_acc) final_acc[i] = NAN;
    }
    while (!fb_session_done(s))
        if ((err = fb_session_step(s, msg, msg_cap))) break;
    fb_session_free(s);
    return err;
}
