/*
 * Windows of steps (fb_train_opts.window, session.h): a session that trains
 * up to 8 steps a call gives every event and every byte a session of single
 * steps gives.
 *
 * Four MLP members with dropout under Adam, fused, on a shuffled in-memory
 * dataset with a validation set, at 1, 2 and 3 threads (on one the members
 * are too small to train in tiles, and a call trains one step): member 0 trains 23
 * steps (its last step inside what would be a window), member 1 30 with a
 * checkpoint every 10 and a validation every 7, member 2 30 with a learning
 * rate of 1e30 (past what a spec accepts, set in memory), so that its loss
 * turns non-finite inside a window, and member 3 30.  Both runs must record
 * the same losses (bit for bit), validations, checkpoints (bytes), final
 * models (bytes) and the failure (its step and text); the windowed run must
 * have taken fewer calls, and one whose windows are cut to a nanosecond
 * (window_ms) one call a step.  Windows past FB_SESSION_MAX_WINDOW, negative
 * ones and bounds that are negative, not finite or past 1e9 ms are refused
 * when the session opens.
 */
#include "session_util.h"

#define N_TRAIN 200
#define N_VAL 40
#define SIDE 8
#define CLASSES 5
#define BS 16
#define N 4

static fb_dataset train, val;

static fb_job_spec *member(int i)
{
    static const int steps[N] = {23, 30, 30, 30};
    return et_spec("{\"name\":\"w%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
                   "\"layers\":[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":24},"
                   "{\"type\":\"relu\"},{\"type\":\"dropout\",\"p\":0.2},"
                   "{\"type\":\"linear\",\"out\":5}]},\"batch_size\":%d,\"steps\":%d,"
                   "\"optimizer\":{\"type\":\"adam\",\"lr\":%g},"
                   "\"schedule\":{\"type\":\"cosine\"},\"seed\":%d,\"data_seed\":4%s}",
                   i, SIDE, SIDE, BS, steps[i], 0.004 * (1 + i), 40 + i,
                   i == 1 ? ",\"eval_every\":7,\"checkpoint_every\":10" : "");
}

/* Trains specs to the end with the given window and thread count; returns
 * the calls it took. */
static int run(fb_job_spec *const *specs, int window, double window_ms, int threads,
               su_log *log)
{
    fb_backend *be = fb_backend_clone_threads(fb_backend_cpu(), threads);
    CHECK(be != NULL);
    su_log_init(log);
    fb_train_opts o = {.log_every = 1, .cb = su_record, .user = log, .blobs = true,
                       .window = window, .window_ms = window_ms};
    fb_session *s = NULL;
    char msg[512];
    int err = fb_session_new(&s, be, (const fb_job_spec *const *)specs, N, &train, &val, &o, msg,
                             sizeof msg);
    if (err) fprintf(stderr, "fb_session_new: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    int calls = 0;
    while (!fb_session_done(s)) {
        int64_t before = fb_session_steps_done(s);
        CHECK_INT_EQ(fb_session_step(s, msg, sizeof msg), FB_OK);
        int64_t did = fb_session_steps_done(s) - before;
        CHECK(did >= 1 && did <= (window > 1 ? window : 1));
        calls++;
    }
    fb_session_times t = fb_session_take_times(s);
    CHECK_INT_EQ(t.steps, 30);
    fb_session_free(s);
    fb_backend_clone_free(be);
    return calls;
}

static bool same_blob(const su_blob *a, const su_blob *b)
{
    return a->step == b->step && a->len == b->len &&
           (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}

static void test_same_events(int threads)
{
    fb_job_spec *specs[N];
    for (int i = 0; i < N; i++)
        specs[i] = member(i);
    specs[2]->optim.lr = 1e30;
    static su_log one, win, cut;
    int calls1 = run(specs, 1, 0, threads, &one), calls8 = run(specs, 8, 0, threads, &win);
    /* a bound far below any step's time: every window is one step */
    int calls_cut = run(specs, 8, 1e-6, threads, &cut);
    printf("threads=%d: 30 steps in %d calls one step a call, %d in windows of up to 8, %d "
           "in windows cut to 1 ns\n",
           threads, calls1, calls8, calls_cut);
    CHECK_INT_EQ(calls1, 30);
    CHECK_INT_EQ(calls_cut, 30);
    /* windows where the array trains in tiles (on more threads than one here: the members
     * are too small to tile on one) */
    if (threads > 1)
        CHECK(calls8 < calls1 / 2);
    else
        CHECK_INT_EQ(calls8, 30);
    for (int m = 0; m < N; m++) {
        CHECK(memcmp(one.loss[m], cut.loss[m], sizeof one.loss[m]) == 0);
        CHECK(memcmp(one.loss[m], win.loss[m], sizeof one.loss[m]) == 0);
        CHECK_INT_EQ(win.steps[m], one.steps[m]);
        CHECK_INT_EQ(win.evals[m], one.evals[m]);
        CHECK_INT_EQ(win.dones[m], one.dones[m]);
        CHECK_INT_EQ(win.failures[m], one.failures[m]);
        CHECK_INT_EQ(win.ckpts[m], one.ckpts[m]);
        for (int k = 0; k < one.ckpts[m]; k++)
            CHECK(same_blob(&one.ckpt[m][k], &win.ckpt[m][k]));
        if (one.dones[m]) CHECK(same_blob(&one.done[m], &win.done[m]));
        CHECK_INT_EQ(win.failed_step[m], one.failed_step[m]);
        CHECK(strcmp(win.failed_text[m], one.failed_text[m]) == 0);
    }
    /* what the run holds: member 0 ends at 23, member 1 checkpoints and validates, member
     * 2 fails after its first step (not on a window's edge) */
    CHECK_INT_EQ(one.steps[0], 23);
    CHECK_INT_EQ(one.ckpts[1], 2);
    CHECK_INT_EQ(one.evals[1], 5); /* steps 7, 14, 21, 28 and its last */
    CHECK_INT_EQ(one.failures[2], 1);
    CHECK(one.failed_step[2] > 1 && one.failed_step[2] < 7);
    CHECK_INT_EQ(one.dones[2], 0);
    CHECK_INT_EQ(one.dones[3], 1);
    printf("threads=%d: losses, %d validations, %d checkpoints, 3 models and the failure at "
           "step %lld (\"%s\") identical\n",
           threads, one.evals[0] + one.evals[1] + one.evals[3], one.ckpts[1],
           (long long)one.failed_step[2], one.failed_text[2]);
    su_log_free(&one);
    su_log_free(&win);
    su_log_free(&cut);
    for (int i = 0; i < N; i++)
        et_spec_free(specs[i]);
}

static void test_bad_window(void)
{
    fb_job_spec *specs[1] = {member(3)};
    static const struct {
        int window;
        double ms;
    } bad[] = {{-1, 0}, {FB_SESSION_MAX_WINDOW + 1, 0}, {1 << 30, 0}, {8, -1}, {8, NAN},
               {8, INFINITY}, {8, 1e10}};
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        fb_train_opts o = {.window = bad[c].window, .window_ms = bad[c].ms};
        fb_session *s = NULL;
        char msg[512] = "";
        int err = fb_session_new(&s, fb_backend_cpu(), (const fb_job_spec *const *)specs, 1,
                                 &train, &val, &o, msg, sizeof msg);
        printf("window %d, %g ms: %s: %s\n", bad[c].window, bad[c].ms, fb_err_code(err), msg);
        CHECK_INT_EQ(err, FB_ERR_OUT_OF_RANGE);
        CHECK(strstr(msg, "window of") != NULL);
        CHECK(s == NULL);
    }
    et_spec_free(specs[0]);
}

int main(void)
{
    train = et_synthetic(N_TRAIN, SIDE, CLASSES, 21);
    val = et_synthetic(N_VAL, SIDE, CLASSES, 22);
    test_same_events(1);
    test_same_events(2);
    test_same_events(3);
    test_bad_window();
    fb_dataset_free(&train);
    fb_dataset_free(&val);
    return 0;
}
