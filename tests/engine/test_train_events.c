/*
 * What fb_train_run's events say about evaluation, with and without a
 * validation set and a test split: the values a worker sends in its
 * "evaluated" and "finished" events and the server stores as val_loss,
 * val_accuracy, test_loss and test_accuracy (docs/jobspec.md, "Metrics").
 * Checked, for an array of two members on a small synthetic dataset:
 *   - with a validation set: an eval event at each eval_every and at each
 *     member's end; the done event carries the final validation, the same
 *     values as the last eval event and as final_loss/final_acc;
 *   - without one: no eval event, and the done event carries no validation
 *     (NaN loss and accuracy), never the last step's training values, which
 *     the member's last step event reports;
 *   - with a test split: done carries test_loss and test_accuracy, the test
 *     split's (another set than the validation set gives other values; the
 *     same set as validation gives exactly the final validation's), and the
 *     test split never enters an eval event; without one they are NaN.
 */
#include "engine_util.h"

#include "train.h"

#define SIDE 4
#define CLASSES 3
#define MAX_EVENTS 64

typedef struct event_log {
    fb_train_event ev[MAX_EVENTS];
    int n;
} event_log;

static void on_event(const fb_train_event *ev, void *user)
{
    event_log *l = user;
    CHECK(l->n < MAX_EVENTS);
    l->ev[l->n] = *ev;
    l->ev[l->n].spec = NULL; /* only valid during the callback */
    l->ev[l->n].weights_path = NULL;
    l->ev[l->n].blob = NULL;
    l->ev[l->n].text = NULL;
    l->n++;
}

/* The last event of member m and kind, or NULL; *count receives how many there were. */
static const fb_train_event *last_of(const event_log *l, int m, fb_train_event_kind kind,
                                     int *count)
{
    const fb_train_event *e = NULL;
    *count = 0;
    for (int i = 0; i < l->n; i++)
        if (l->ev[i].member == m && l->ev[i].kind == kind) {
            e = &l->ev[i];
            ++*count;
        }
    return e;
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    fb_dataset train = et_synthetic(64, SIDE, CLASSES, 3),
               val = et_synthetic(20, SIDE, CLASSES, 5), test = et_synthetic(24, SIDE, CLASSES, 4);
    const char *fmt = "{\"name\":\"m%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
                      "\"layers\":[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":8},"
                      "{\"type\":\"relu\"},{\"type\":\"linear\",\"out\":%d}]},\"batch_size\":8,"
                      "\"steps\":%d,\"eval_every\":2,\"optimizer\":{\"type\":\"adam\",\"lr\":0.01},"
                      "\"seed\":%d}";
    const int steps[2] = {6, 4};
    fb_job_spec *specs[2];
    for (int m = 0; m < 2; m++)
        specs[m] = et_spec(fmt, m, SIDE, SIDE, CLASSES, steps[m], m + 1);
    const struct {
        const fb_dataset *val, *test;
        int evals[2]; /* eval events per member: at 2, 4, ... and at its end */
    } runs[] = {{&val, &test, {3, 2}}, {&val, NULL, {3, 2}}, {NULL, &test, {0, 0}},
                {NULL, NULL, {0, 0}}, {&test, &test, {3, 2}}};
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        static event_log l;
        l.n = 0;
        fb_train_opts o = {.log_every = 1, .cb = on_event, .user = &l, .test = runs[r].test};
        double final_loss[2], final_acc[2];
        char msg[512];
        int err = fb_train_run(fb_backend_cpu_ref(), (const fb_job_spec *const *)specs, 2, &train,
                               runs[r].val, &o, final_loss, final_acc, msg, sizeof msg);
        if (err) fprintf(stderr, "fb_train_run: %s\n", msg);
        CHECK_INT_EQ(err, 0);
        for (int m = 0; m < 2; m++) {
            int n_eval, n_done, n_step;
            const fb_train_event *eval = last_of(&l, m, FB_TRAIN_EVAL, &n_eval);
            const fb_train_event *done = last_of(&l, m, FB_TRAIN_DONE, &n_done);
            const fb_train_event *step = last_of(&l, m, FB_TRAIN_STEP, &n_step);
            CHECK_INT_EQ(n_eval, runs[r].evals[m]);
            CHECK_INT_EQ(n_done, 1);
            CHECK_INT_EQ(n_step, steps[m]);
            CHECK_INT_EQ(done->step, steps[m]);
            CHECK_INT_EQ(step->step, steps[m]);
            CHECK(isfinite(step->loss) && step->accuracy >= 0 && step->accuracy <= 1);
            if (runs[r].test) {
                CHECK(isfinite(done->test_loss) && done->test_accuracy >= 0 &&
                      done->test_accuracy <= 1);
                if (runs[r].val == runs[r].test)
                    CHECK(done->test_loss == done->loss && done->test_accuracy == done->accuracy);
                else if (runs[r].val)
                    CHECK(done->test_loss != done->loss);
            } else {
                CHECK(isnan(done->test_loss) && isnan(done->test_accuracy));
            }
            if (runs[r].val) {
                CHECK_INT_EQ(eval->step, steps[m]);
                CHECK(done->loss == eval->loss && done->accuracy == eval->accuracy);
                CHECK(final_loss[m] == eval->loss && final_acc[m] == eval->accuracy);
                CHECK(isfinite(done->loss) && done->accuracy >= 0 && done->accuracy <= 1);
            } else {
                if (!isnan(done->loss) || !isnan(done->accuracy)) {
                    fprintf(stderr,
                            "member %d finished without validation with loss %g, accuracy %g "
                            "(its last step: %g, %g)\n",
                            m, done->loss, done->accuracy, step->loss, step->accuracy);
                    abort();
                }
                CHECK(isnan(final_loss[m]) && isnan(final_acc[m]));
            }
        }
        printf("%s validation, %s test split: %d events; done carries %s and %s\n",
               runs[r].val ? (runs[r].val == runs[r].test ? "the test split as" : "with")
                           : "no",
               runs[r].test ? "a" : "no", l.n,
               runs[r].val ? "the final validation" : "no validation (NaN)",
               runs[r].test ? "the test evaluation" : "no test values (NaN)");
    }
    for (int m = 0; m < 2; m++)
        et_spec_free(specs[m]);
    fb_dataset_free(&train);
    fb_dataset_free(&val);
    fb_dataset_free(&test);
    return 0;
}
