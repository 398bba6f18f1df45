/*
 * Private side of the training session (session.h): the session's state,
 * what its files know of each member, and the engine it trains with.
 *
 * A session trains on one of three engines behind one table of functions:
 * one device (session_single.c: the array itself), data parallelism
 * (session_data_parallel.c: data_parallel.h's replicas, one per device or rank) and
 * pipeline parallelism (session_pipeline.c: pipeline_parallel.h's stages, with a whole
 * model beside them for evaluation and files).  session.c keeps what every
 * engine shares (the minibatches, the members' fates, the events);
 * session_checkpoint.c writes and restores members' files.  Only those
 * files include this header.
 */
#ifndef FB_WORKERS_SESSION_IMPL_H
#define FB_WORKERS_SESSION_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "array.h"
#include "data_parallel.h"
#include "loader.h"
#include "session.h"

#define FILE_CAP 160
#define PATH_CAP 1024
#define TEXT_CAP 128

/* The latest metrics known of a member, for its files' "metrics" entry. */
typedef struct member_metrics {
    bool trained;     /* loss and accuracy hold the step's training values */
    float loss;       /* as the step reported it */
    double accuracy;
    int64_t val_step; /* of the latest validation, or -1: none yet */
    double val_loss, val_accuracy;
    bool tested;      /* test_loss and test_accuracy hold the final test evaluation */
    double test_loss, test_accuracy;
} member_metrics;

/*
 * What trains a session's array: one table per engine, chosen when the
 * session opens (fb_session_new).  Every entry takes the session;
 * the engine's own object is s->ctx.  An entry an engine has no use for is
 * NULL, and the caller asks before calling it.
 */
typedef struct fb_session_engine_ops {
    const char *name;
    /* Builds the engine over specs[0..n) from s->opts: sets s->a (the array
     * that holds every member's whole state), s->ctx, s->shards and s->split.
     * On failure it may leave part of that set; free releases it. */
    int (*open)(fb_session *s, const fb_job_spec *const *specs, int n, char *msg, size_t msg_cap);
    /* Releases s->ctx and s->a, whatever open left.  Accepts a session whose
     * open failed. */
    void (*free)(fb_session *s);
    /* Forward and backward of the step's batch x, y [s->bs] over the split
     * in force, the step as the dropout stream; s->loss and s->correct
     * receive each slot's.  The pipeline updates here too, with s->hp. */
    int (*train)(fb_session *s, const float *x, const int32_t *y, char *msg, size_t msg_cap);
    /* k > 1 steps of train and update in one call, a window (fb_train_opts.window): step j
     * trains on x[j], y[j] with the hyperparameters s->whp + j * B, the step s->step + j as
     * its dropout stream, and leaves its losses and correct counts in s->wloss, s->wcorrect
     * + j * B (B: the array's size when the window starts).  NULL: one step a call. */
    int (*train_steps)(fb_session *s, int k, const float *const *x, const int32_t *const *y,
                       char *msg, size_t msg_cap);
    /* Applies the step's update with s->hp (the pipeline: brings s->a up
     * to the stages, which updated in train). */
    void (*update)(fb_session *s);
    /* Adds the step's compute, communication and idle time (wall_ms: train
     * and update) to s->times, and to the first n_dev entries of its
     * devices (0: none, the group is larger than FB_SESSION_MAX_DEVICES). */
    void (*account)(fb_session *s, double wall_ms, int n_dev);
    /* Takes slot b out; slots above it move down. */
    void (*remove)(fb_session *s, int b);
    /* Devices the engine trains on. */
    int (*devices)(const fb_session *s);
    /* Checks a split of s->shards entries and puts it in force (s->split). */
    int (*set_split)(fb_session *s, const int64_t *split, char *msg, size_t msg_cap);
    /* fb_session_broadcast across processes; NULL: the session is in one. */
    int (*broadcast)(fb_session *s, int64_t *v, int n, char *msg, size_t msg_cap);
    /* The arrays that each hold every member's whole state, d in
     * [0, replicas); NULL: s->a alone. */
    int (*replicas)(const fb_session *s);
    fb_array *(*replica)(const fb_session *s, int d);
    /* Copies slot b of s->a to the engine's own copies of it after s->a
     * changed outside a step (a restore); NULL: the engine has none beyond
     * its replicas. */
    void (*scatter)(fb_session *s, int b);
} fb_session_engine_ops;

extern const fb_session_engine_ops fb_session_engine_single;
extern const fb_session_engine_ops fb_session_engine_data_parallel;
extern const fb_session_engine_ops fb_session_engine_pipeline;

struct fb_session {
    fb_backend *be;
    const fb_job_spec **specs; /* [n], by member index */
    int n;
    const fb_dataset *train;
    const fb_dataset *val;  /* evaluated at eval_every and at each member's end; or NULL */
    const fb_dataset *test; /* evaluated once, at each member's end; or NULL */
    fb_train_opts opts; /* a copy */
    fb_loader *loader;
    const fb_session_engine_ops *engine; /* NULL until the engine opens */
    void *ctx;    /* the engine's: fb_dp or fb_pp, NULL on one device */
    fb_array *a;  /* the array; with data parallelism, replica 0 of dp's; with the
                   * pipeline, the whole model's view of the stages */
    int shards;   /* data shards: dp's ranks, or pp's */
    int64_t split[FB_DP_MAX_RANKS];

    int *member;                /* [n]: slot -> member index, first B valid */
    int64_t *total;             /* [n] by member: updates in total */
    char (*files)[FILE_CAP];    /* [n] by member: file name stem in out_dir */
    int64_t *perm;              /* [train n]: this epoch's sample order (in memory) */
    float *x;                   /* [bs, in_numel]: the minibatch (in memory) */
    int32_t *y;                 /* [bs] */
    float *loss, *correct;      /* [n] by slot: this step's */
    double *eloss, *eacc;       /* [n] by slot: this step's validation */
    double *tloss, *tacc;       /* [n] by slot: this step's test evaluation */
    fb_optim_hparams *hp;       /* [n] by slot */
    bool *failed, *last, *ckpt; /* [n] by slot: this step's fate */
    char (*why)[TEXT_CAP];      /* [n] by member: why it failed */
    float *fail_loss;           /* [n] by member: the loss it failed with */
    int *fail_list;             /* [n]: members that failed this step */
    float *tmp;                 /* [the largest parameter tensor]: finiteness checks */
    /* [n] by member: what its files report; a restored member takes its checkpoint's, so
     * a resumed member writes the bytes it would have written without the interruption */
    member_metrics *known;

    /* a window of steps in one call (train_steps): window is its longest (1: none);
     * wx, wy [window] its minibatches, whp, wloss, wcorrect [window * n] by step and
     * by the slot at the window's start, worig [n] by slot: that slot */
    int window;
    float **wx;
    int32_t **wy;
    fb_optim_hparams *whp;
    float *wloss, *wcorrect;
    int *worig;
    double t_now;   /* the time a step ended, for its reported rate */
    double step_ms; /* training time of a step in the last call, 0 before the first */

    int64_t in_numel, bs, per_epoch, epoch; /* epoch: the one perm holds, or -1 */
    int64_t step, max_total;

    /* since the last logged step, for the reported rate and I/O wait */
    double t_log, wait_since;
    int64_t samples_since, steps_since;
    fb_session_times times; /* since the last fb_session_take_times */
};

/* The slot of member i, or -1 when it has left (or never was). */
int fb_session_slot(const fb_session *s, int member);

/*
 * Slot b's checkpoint (full) or model at this step, written atomically to
 * out_dir/<stem><suffix> when the session has an out_dir (path [PATH_CAP]
 * receives it, else "") and returned as bytes when it has blobs (*buf, else
 * NULL; the caller frees it).  session_checkpoint.c.
 */
int fb_session_member_output(const fb_session *s, int b, bool full, const char *suffix, char *path,
                             void **buf, size_t *len, char *msg, size_t msg_cap);

#endif
