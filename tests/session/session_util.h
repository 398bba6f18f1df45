/*
 * Helpers of the session tests, on top of the engine tests' (synthetic
 * datasets, specs from JSON text, scratch directories): an event recorder
 * that keeps every loss and copies every checkpoint and model blob, and
 * comparison of two safetensors byte buffers.
 */
#ifndef FB_TESTS_SESSION_UTIL_H
#define FB_TESTS_SESSION_UTIL_H

#include "check.h"
#include "data/data_util.h"
#include "engine/engine_util.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idx.h"
#include "jobspec.h"
#include "kernels.h"
#include "safetensors.h"
#include "session.h"

#define SU_MAX_MEMBERS 4
#define SU_MAX_STEPS 64
#define SU_MAX_CKPTS 16

/* ---- recording events --------------------------------------------------------- */

typedef struct su_blob {
    void *data;
    size_t len;
    int64_t step;
    char path[512]; /* the event's weights_path, or "" */
} su_blob;

typedef struct su_log {
    double loss[SU_MAX_MEMBERS][SU_MAX_STEPS + 1]; /* step events, by member and step; NaN */
    int steps[SU_MAX_MEMBERS], evals[SU_MAX_MEMBERS], dones[SU_MAX_MEMBERS];
    int failures[SU_MAX_MEMBERS];
    su_blob ckpt[SU_MAX_MEMBERS][SU_MAX_CKPTS];
    int ckpts[SU_MAX_MEMBERS];
    su_blob done[SU_MAX_MEMBERS];
    int failed_err[SU_MAX_MEMBERS];
    int64_t failed_step[SU_MAX_MEMBERS];
    char failed_text[SU_MAX_MEMBERS][160];
    int64_t last_event_step; /* events come in step order, */
    int last_kind;           /* and within a step in the order of their kinds */
    /* optional: compare each checkpoint file with its blob while it is fresh */
    bool check_files;
} su_log;

static inline void su_log_init(su_log *l)
{
    memset(l, 0, sizeof *l);
    for (int m = 0; m < SU_MAX_MEMBERS; m++)
        for (int s = 0; s <= SU_MAX_STEPS; s++)
            l->loss[m][s] = NAN;
}

static inline void su_log_free(su_log *l)
{
    for (int m = 0; m < SU_MAX_MEMBERS; m++) {
        for (int k = 0; k < l->ckpts[m]; k++)
            free(l->ckpt[m][k].data);
        free(l->done[m].data);
    }
    su_log_init(l);
}

static inline void su_copy_blob(su_blob *b, const fb_train_event *ev)
{
    b->step = ev->step;
    b->len = ev->blob_len;
    b->data = NULL;
    if (ev->blob) {
        CHECK(ev->blob_len > 0);
        b->data = malloc(ev->blob_len);
        CHECK(b->data != NULL);
        memcpy(b->data, ev->blob, ev->blob_len);
    } else {
        CHECK_INT_EQ(ev->blob_len, 0);
    }
    snprintf(b->path, sizeof b->path, "%s", ev->weights_path ? ev->weights_path : "");
}

static inline void su_record(const fb_train_event *ev, void *user)
{
    su_log *l = user;
    int m = ev->member;
    CHECK(m >= 0 && m < SU_MAX_MEMBERS);
    /* session.h: step, eval, checkpoint, done, failed */
    static const int rank[] = {[FB_TRAIN_STEP] = 0,
                               [FB_TRAIN_EVAL] = 1,
                               [FB_TRAIN_CHECKPOINT] = 2,
                               [FB_TRAIN_DONE] = 3,
                               [FB_TRAIN_FAILED] = 4};
    CHECK(ev->step >= l->last_event_step);
    if (ev->step == l->last_event_step) CHECK(rank[ev->kind] >= l->last_kind);
    l->last_event_step = ev->step;
    l->last_kind = rank[ev->kind];
    CHECK(ev->spec != NULL);
    switch (ev->kind) {
    case FB_TRAIN_STEP:
        CHECK(ev->step >= 1 && ev->step <= SU_MAX_STEPS);
        l->loss[m][ev->step] = ev->loss;
        l->steps[m]++;
        break;
    case FB_TRAIN_EVAL:
        l->evals[m]++;
        break;
    case FB_TRAIN_CHECKPOINT: {
        CHECK(l->ckpts[m] < SU_MAX_CKPTS);
        su_blob *b = &l->ckpt[m][l->ckpts[m]++];
        su_copy_blob(b, ev);
        if (l->check_files && b->path[0] && b->data) {
            /* the file and the blob come from one serializer: the same bytes */
            size_t n;
            void *file = du_read(b->path, &n);
            CHECK_INT_EQ(n, b->len);
            CHECK(memcmp(file, b->data, n) == 0);
            free(file);
        }
        break;
    }
    case FB_TRAIN_DONE:
        CHECK_INT_EQ(l->dones[m], 0);
        l->dones[m]++;
        su_copy_blob(&l->done[m], ev);
        break;
    case FB_TRAIN_FAILED:
        l->failures[m]++;
        l->failed_err[m] = ev->err;
        l->failed_step[m] = ev->step;
        snprintf(l->failed_text[m], sizeof l->failed_text[m], "%s", ev->text ? ev->text : "");
        break;
    }
}

/* ---- sessions ----------------------------------------------------------------- */

/* Opens a session that records into log (log_every 1, blobs on). */
static inline fb_session *su_open(fb_job_spec *const *specs, int n, const fb_dataset *train,
                                  const fb_dataset *test, int64_t start, const char *out_dir,
                                  bool blobs, su_log *log)
{
    fb_train_opts o = {.log_every = 1,
                       .cb = su_record,
                       .user = log,
                       .start_step = start,
                       .out_dir = out_dir,
                       .blobs = blobs};
    fb_session *s = NULL;
    char msg[512];
    int err = fb_session_new(&s, fb_backend_cpu(), (const fb_job_spec *const *)specs, n, train,
                             test, &o, msg, sizeof msg);
    if (err) fprintf(stderr, "fb_session_new: %s (%s)\n", msg, fb_err_code(err));
    CHECK_INT_EQ(err, FB_OK);
    CHECK(s != NULL);
    return s;
}

/* Steps until the session has done `until` updates (or is done, for -1). */
static inline void su_step_to(fb_session *s, int64_t until)
{
    char msg[512];
    while (!fb_session_done(s) && (until < 0 || fb_session_steps_done(s) < until)) {
        int err = fb_session_step(s, msg, sizeof msg);
        if (err) fprintf(stderr, "fb_session_step: %s (%s)\n", msg, fb_err_code(err));
        CHECK_INT_EQ(err, FB_OK);
    }
}

static inline void *su_checkpoint(const fb_session *s, int member, size_t *len)
{
    char msg[512];
    void *buf = NULL;
    int err = fb_session_checkpoint(s, member, &buf, len, msg, sizeof msg);
    if (err) fprintf(stderr, "fb_session_checkpoint: %s (%s)\n", msg, fb_err_code(err));
    CHECK_INT_EQ(err, FB_OK);
    CHECK(buf != NULL && *len > 0);
    return buf;
}

static inline void su_restore(fb_session *s, int member, const void *buf, size_t len)
{
    char msg[512];
    int err = fb_session_restore(s, member, buf, len, msg, sizeof msg);
    if (err) fprintf(stderr, "fb_session_restore: %s (%s)\n", msg, fb_err_code(err));
    CHECK_INT_EQ(err, FB_OK);
}

/* Member 0 of s refuses bytes with FB_ERR_CHECKPOINT and a message holding
 * `names`; members 0 and 1 keep their state (checkpoint bytes) unchanged. */
static inline void su_expect_refused(fb_session *s, const void *bytes, size_t len,
                                     const char *names, const char *what)
{
    size_t l0, l1, m0, m1;
    void *b0 = su_checkpoint(s, 0, &l0), *b1 = su_checkpoint(s, 1, &l1);
    char msg[512] = "";
    int err = fb_session_restore(s, 0, bytes, len, msg, sizeof msg);
    printf("  %-34s -> %s: %s\n", what, fb_err_code(err), msg);
    CHECK_INT_EQ(err, FB_ERR_CHECKPOINT);
    if (!strstr(msg, names)) {
        fprintf(stderr, "message \"%s\" does not name \"%s\"\n", msg, names);
        abort();
    }
    void *a0 = su_checkpoint(s, 0, &m0), *a1 = su_checkpoint(s, 1, &m1);
    CHECK(l0 == m0 && memcmp(a0, b0, l0) == 0);
    CHECK(l1 == m1 && memcmp(a1, b1, l1) == 0);
    free(a0);
    free(a1);
    free(b0);
    free(b1);
}

static inline fb_st_file *su_parse(const void *buf, size_t len)
{
    char msg[512];
    fb_st_file *f = NULL;
    int err = fb_st_parse_buffer(buf, len, &f, msg, sizeof msg);
    if (err) fprintf(stderr, "fb_st_parse_buffer: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    return f;
}

/*
 * Compares two safetensors buffers tensor by tensor (the same names, dtypes and
 * shapes; integer tensors equal): returns the largest normalised error
 * max|a - b| / max|b| over the F32 tensors; *max_abs receives the largest
 * absolute difference.
 */
static inline double su_compare(const void *a, size_t alen, const void *b, size_t blen,
                                double *max_abs)
{
    fb_st_file *fa = su_parse(a, alen), *fb = su_parse(b, blen);
    CHECK_INT_EQ(fb_st_count(fa), fb_st_count(fb));
    double worst = 0, worst_abs = 0;
    for (size_t i = 0; i < fb_st_count(fa); i++) {
        const fb_st_tensor *ta = fb_st_at(fa, i), *tb = fb_st_find(fb, ta->name);
        CHECK(tb != NULL);
        CHECK_INT_EQ(ta->dtype, tb->dtype);
        CHECK_INT_EQ(ta->numel, tb->numel);
        if (ta->dtype == FB_ST_I64) {
            CHECK(memcmp(ta->data, tb->data, ta->nbytes) == 0);
            continue;
        }
        CHECK_INT_EQ(ta->dtype, FB_ST_F32);
        double diff = 0, scale = 0;
        for (int64_t k = 0; k < ta->numel; k++) {
            float x, y;
            memcpy(&x, ta->data + 4 * k, 4);
            memcpy(&y, tb->data + 4 * k, 4);
            CHECK(isfinite(x) && isfinite(y));
            diff = fmax(diff, fabs((double)x - y));
            scale = fmax(scale, fabs((double)y));
        }
        worst_abs = fmax(worst_abs, diff);
        if (diff > 0) worst = fmax(worst, diff / fmax(scale, 1e-12));
    }
    fb_st_close(fa);
    fb_st_close(fb);
    if (max_abs) *max_abs = worst_abs;
    return worst;
}

#endif
