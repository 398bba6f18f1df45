/*
 * End-to-end training on Fashion-MNIST through fb_train_run, the loop that
 * fusebox-train and the worker use.
 *
 * Two fused members: "main", an MLP 784-256-10 trained one epoch (1875 steps
 * of batch 32, Adam lr 3e-3 with cosine decay), must reach a test accuracy of
 * at least 0.85; "short" (Adam lr 1e-3, 400 steps, evaluated every 200)
 * leaves the array early.  The events must tell the story exactly: step
 * events every log_every steps and at each member's last step, evaluations at
 * eval_every and at the end, one done event per member as it leaves (with
 * its weights file), reported learning rates that follow the schedules, and
 * final results equal to the last evaluation.
 *
 * Skipped (77) when the dataset is not installed: FUSEBOX_DATA_DIR, else
 * /usr/share/datasets, must hold fashion-mnist/.
 */
#include "engine_util.h"

#include "kernels.h"
#include "train.h"

#define BS 32
#define LOG_EVERY 500
#define MAIN_STEPS (60000 / BS) /* one epoch, the partial batch dropped */
#define SHORT_STEPS 400
#define SHORT_EVAL 200
#define MIN_ACCURACY 0.85

#define MAX_EVENTS 64

typedef struct recorded {
    fb_train_event ev;
    char weights[1024];
} recorded;

typedef struct event_log {
    recorded e[MAX_EVENTS];
    int n;
} event_log;

static void on_event(const fb_train_event *ev, void *user)
{
    event_log *log = user;
    CHECK(log->n < MAX_EVENTS);
    recorded *r = &log->e[log->n++];
    r->ev = *ev;
    r->weights[0] = '\0';
    if (ev->weights_path) snprintf(r->weights, sizeof r->weights, "%s", ev->weights_path);
    r->ev.weights_path = ev->weights_path ? r->weights : NULL;
    printf("event %-4s member %d step %5lld/%lld B=%d loss %.4f acc %.4f lr %.6g %.0f samples/s\n",
           ev->kind == FB_TRAIN_STEP   ? "step"
           : ev->kind == FB_TRAIN_EVAL ? "eval"
                                       : "done",
           ev->member, (long long)ev->step, (long long)ev->steps, ev->array_size, ev->loss,
           ev->accuracy, ev->lr, ev->samples_per_s);
}

/* The events of one member and kind, in order. */
static int select_events(const event_log *log, int member, fb_train_event_kind kind,
                         const fb_train_event **out, int cap)
{
    int n = 0;
    for (int i = 0; i < log->n; i++)
        if (log->e[i].ev.member == member && log->e[i].ev.kind == kind) {
            CHECK(n < cap);
            out[n++] = &log->e[i].ev;
        }
    return n;
}

static const char *layers = "[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":256},"
                            "{\"type\":\"relu\"},{\"type\":\"linear\",\"out\":10}]";

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    double t0 = et_now();
    const char *dir = getenv(FB_DATASET_DIR_ENV);
    if (!dir || !*dir) dir = FB_DATASET_DEFAULT_DIR;
    char ds_dir[1024];
    snprintf(ds_dir, sizeof ds_dir, "%s/fashion-mnist", dir);
    if (!et_exists(ds_dir)) {
        return fb_test_missing(
            "Fashion-MNIST not found at %s (install dataset-fashion-mnist or set %s)", ds_dir,
            FB_DATASET_DIR_ENV);
    }
    char msg[1024];
    fb_dataset train = {0}, test = {0};
    int err = fb_dataset_open_named("fashion-mnist", "train", NULL, &train, msg, sizeof msg);
    if (!err) err = fb_dataset_open_named("fashion-mnist", "test", NULL, &test, msg, sizeof msg);
    if (err) fprintf(stderr, "loading Fashion-MNIST: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    CHECK_INT_EQ(train.n, 60000);
    CHECK_INT_EQ(test.n, 10000);
    CHECK_INT_EQ(train.C * train.H * train.W, 784);
    CHECK_INT_EQ(train.n_classes, 10);
    double t_load = et_now() - t0;

    fb_job_spec *main_spec =
        et_spec("{\"name\":\"main\",\"dataset\":\"fashion-mnist\",\"model\":{\"input\":[1,28,28],"
                "\"layers\":%s},\"batch_size\":%d,\"epochs\":1,\"optimizer\":{\"type\":\"adam\","
                "\"lr\":0.003},\"schedule\":{\"type\":\"cosine\"},\"seed\":1,\"data_seed\":1}",
                layers, BS);
    fb_job_spec *short_spec =
        et_spec("{\"name\":\"short\",\"dataset\":\"fashion-mnist\",\"model\":{\"input\":[1,28,28],"
                "\"layers\":%s},\"batch_size\":%d,\"steps\":%d,\"eval_every\":%d,"
                "\"optimizer\":{\"type\":\"adam\",\"lr\":0.001},\"seed\":2,\"data_seed\":1}",
                layers, BS, SHORT_STEPS, SHORT_EVAL);
    const fb_job_spec *specs[2] = {main_spec, short_spec};
    CHECK_INT_EQ(fb_train_total_steps(main_spec, train.n), MAIN_STEPS);
    CHECK_INT_EQ(fb_train_total_steps(short_spec, train.n), SHORT_STEPS);

    char out_dir[512];
    et_tmpdir(out_dir, sizeof out_dir, "accuracy");
    static event_log events;
    fb_train_opts opts = {
        .log_every = LOG_EVERY, .out_dir = out_dir, .cb = on_event, .user = &events};
    double final_loss[2], final_acc[2];
    double t1 = et_now();
    err = fb_train_run(fb_backend_cpu(), specs, 2, &train, &test, &opts, final_loss, final_acc, msg,
                       sizeof msg);
    double t_train = et_now() - t1;
    if (err) fprintf(stderr, "fb_train_run: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);

    /* step events: every LOG_EVERY steps while a member trains, and at its last step */
    const fb_train_event *ev[MAX_EVENTS];
    int64_t totals[2] = {MAIN_STEPS, SHORT_STEPS};
    for (int m = 0; m < 2; m++) {
        int n = select_events(&events, m, FB_TRAIN_STEP, ev, MAX_EVENTS);
        int64_t want = totals[m] / LOG_EVERY + (totals[m] % LOG_EVERY ? 1 : 0);
        CHECK_INT_EQ(n, want);
        for (int i = 0; i < n; i++) {
            int64_t step = i + 1 < n ? (int64_t)(i + 1) * LOG_EVERY : totals[m];
            CHECK_INT_EQ(ev[i]->step, step);
            CHECK_INT_EQ(ev[i]->steps, totals[m]);
            CHECK(ev[i]->spec == specs[m]);
            CHECK_INT_EQ(ev[i]->array_size, step <= SHORT_STEPS ? 2 : 1);
            CHECK(isfinite(ev[i]->loss) && ev[i]->loss > 0);
            CHECK(ev[i]->accuracy >= 0 && ev[i]->accuracy <= 1);
            CHECK(ev[i]->samples_per_s > 0);
            CHECK(ev[i]->weights_path == NULL);
            /* the reported lr is the one of that update (t = step, 0-based step - 1) */
            double lr =
                specs[m]->optim.lr * fb_sched_lr_factor(&specs[m]->sched, step - 1, totals[m]);
            CHECK(fabs(ev[i]->lr - lr) <= 1e-6 * specs[m]->optim.lr);
        }
        CHECK(ev[n - 1]->loss < 1.0);
    }

    /* evaluations: main only at its end, short every 200 steps */
    int n_eval = select_events(&events, 0, FB_TRAIN_EVAL, ev, MAX_EVENTS);
    CHECK_INT_EQ(n_eval, 1);
    CHECK_INT_EQ(ev[0]->step, MAIN_STEPS);
    CHECK_INT_EQ(ev[0]->array_size, 1);
    CHECK_NEAR(ev[0]->loss, final_loss[0], 1e-12);
    CHECK_NEAR(ev[0]->accuracy, final_acc[0], 1e-12);
    n_eval = select_events(&events, 1, FB_TRAIN_EVAL, ev, MAX_EVENTS);
    CHECK_INT_EQ(n_eval, SHORT_STEPS / SHORT_EVAL);
    for (int i = 0; i < n_eval; i++) {
        CHECK_INT_EQ(ev[i]->step, (int64_t)(i + 1) * SHORT_EVAL);
        CHECK_INT_EQ(ev[i]->array_size, 2);
        CHECK(isfinite(ev[i]->loss) && ev[i]->accuracy > 0.5 && ev[i]->accuracy <= 1);
        /* test accuracy is a whole number of correct samples out of 10000 */
        double correct = ev[i]->accuracy * (double)test.n;
        CHECK_NEAR(correct, round(correct), 1e-6);
    }
    CHECK_NEAR(ev[n_eval - 1]->loss, final_loss[1], 1e-12);
    CHECK_NEAR(ev[n_eval - 1]->accuracy, final_acc[1], 1e-12);

    /* one done event per member, its last event, with the final weights on disk */
    for (int m = 0; m < 2; m++) {
        int n = select_events(&events, m, FB_TRAIN_DONE, ev, MAX_EVENTS);
        CHECK_INT_EQ(n, 1);
        CHECK_INT_EQ(ev[0]->step, totals[m]);
        CHECK_INT_EQ(ev[0]->array_size, m == 0 ? 1 : 2);
        CHECK_NEAR(ev[0]->accuracy, final_acc[m], 1e-12);
        CHECK_NEAR(ev[0]->loss, final_loss[m], 1e-12);
        char want[1100];
        snprintf(want, sizeof want, "%s/%s.safetensors", out_dir, specs[m]->name);
        CHECK_STR_EQ(ev[0]->weights_path, want);
        fb_st_file *f = et_st_open(want);
        CHECK_INT_EQ(fb_st_count(f), 4);
        CHECK_STR_EQ(fb_st_metadata_get(f, "step"), m == 0 ? "1875" : "400");
        const fb_st_tensor *w = fb_st_find(f, "1.weight");
        CHECK(w && w->ndim == 2 && w->shape[0] == 256 && w->shape[1] == 784);
        w = fb_st_find(f, "3.weight");
        CHECK(w && w->ndim == 2 && w->shape[0] == 10 && w->shape[1] == 256);
        fb_st_close(f);
        int last = -1;
        for (int i = 0; i < events.n; i++)
            if (events.e[i].ev.member == m) last = i;
        CHECK(events.e[last].ev.kind == FB_TRAIN_DONE);
    }
    CHECK_INT_EQ(et_dir_entries(out_dir), 2); /* no checkpoints were asked for */

    printf("Fashion-MNIST MLP 784-256-10, 1 epoch, batch %d, adam 3e-3 cosine: test accuracy "
           "%.4f (loss %.4f); short member (%d steps): %.4f\n",
           BS, final_acc[0], final_loss[0], SHORT_STEPS, final_acc[1]);
    printf("load %.2f s, train %.2f s, total %.2f s\n", t_load, t_train, et_now() - t0);
    if (!(final_acc[0] >= MIN_ACCURACY)) {
        fprintf(stderr, "FAIL: test accuracy %.4f < %.2f\n", final_acc[0], MIN_ACCURACY);
        abort();
    }
    CHECK(final_acc[1] >= 0.75);

    et_rmtree(out_dir);
    et_spec_free(main_spec);
    et_spec_free(short_spec);
    fb_dataset_free(&train);
    fb_dataset_free(&test);
    return 0;
}
