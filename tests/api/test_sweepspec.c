/*
 * The sweep spec: grid expansion order, random search determinism and
 * distributions, early-stopping defaults, canonical form, and a table of
 * invalid sweeps with their codes.  Every expanded trial must itself be a
 * valid job spec.
 */
#include <dirent.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "check.h"
#include "sweepspec.h"

#define BASE                                                                                       \
    "{\"name\": \"base\", \"dataset\": \"fashion-mnist\", \"model\": {\"input\": [1, 28, 28],"     \
    " \"layers\": [{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 32}, {\"type\":"       \
    " \"dropout\", \"p\": 0.1}, {\"type\": \"linear\", \"out\": 10}]}, \"batch_size\": 64,"        \
    " \"steps\": 100, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.001}}"

static fb_sweep_spec *parse_ok(const char *text)
{
    fb_sweep_spec *s = NULL;
    char msg[512];
    int err = fb_sweep_spec_parse(text, strlen(text), NULL, &s, msg, sizeof msg);
    if (err) fprintf(stderr, "unexpected error %s: %s\n", fb_err_code(err), msg);
    CHECK_INT_EQ(err, FB_OK);
    CHECK(s != NULL);
    return s;
}

static json_t *trial_params(const fb_sweep_spec *s, int i)
{
    json_t *p = json_loads(fb_sweep_spec_trial_params(s, i), 0, NULL);
    CHECK(p != NULL);
    return p;
}

static void test_grid(void)
{
    fb_sweep_spec *s = parse_ok("{\"name\": \"g\", \"base\": " BASE ", \"search\": {\"type\":"
                                " \"grid\", \"params\": {\"seed\": {\"values\": [1, 2, 3]},"
                                " \"optimizer.lr\": {\"values\": [0.1, 0.01]},"
                                " \"model.layers.2.p\": {\"values\": [0.0, 0.5]}}}}");
    CHECK_INT_EQ(fb_sweep_spec_n_trials(s), 12);
    CHECK_INT_EQ(fb_sweep_spec_search_type(s), FB_SEARCH_GRID);
    CHECK_STR_EQ(fb_sweep_spec_name(s), "g");
    /* sorted paths: model.layers.2.p, optimizer.lr, seed; the last fastest */
    for (int i = 0; i < 12; i++) {
        const fb_job_spec *j = fb_sweep_spec_trial(s, i);
        double p = j->layers[2].p;
        CHECK_NEAR(p, (i / 6) ? 0.5 : 0.0, 1e-15);
        CHECK_NEAR(j->optim.lr, ((i / 3) % 2) ? 0.01 : 0.1, 1e-15);
        CHECK_INT_EQ(j->seed, 1 + i % 3);
        char name[32];
        snprintf(name, sizeof name, "g-%02d", i);
        CHECK_STR_EQ(j->name, name);
        json_t *params = trial_params(s, i);
        CHECK_INT_EQ(json_object_size(params), 3);
        CHECK_INT_EQ(json_integer_value(json_object_get(params, "seed")), 1 + i % 3);
        json_decref(params);
        /* every trial round-trips through the job-spec parser */
        fb_job_spec again;
        char msg[256];
        const char *t = fb_sweep_spec_trial_json(s, i);
        CHECK_INT_EQ(fb_job_spec_parse(t, strlen(t), NULL, &again, msg, sizeof msg), FB_OK);
        CHECK_STR_EQ(again.fusion_key, j->fusion_key);
        fb_job_spec_free(&again);
    }
    /* lr, seed and dropout... dropout p is in the model, so it splits fusion keys */
    CHECK(strcmp(fb_sweep_spec_trial(s, 0)->fusion_key, fb_sweep_spec_trial(s, 5)->fusion_key) ==
          0);
    CHECK(strcmp(fb_sweep_spec_trial(s, 0)->fusion_key, fb_sweep_spec_trial(s, 6)->fusion_key) !=
          0);
    fb_metric_mode mode;
    /* without a metric named: the validation accuracy of a cross-entropy base, maximised */
    CHECK_STR_EQ(fb_sweep_spec_metric(s, &mode), "val_accuracy");
    CHECK_INT_EQ(mode, FB_METRIC_MAX);
    CHECK(!fb_sweep_spec_early_stopping(s)->enabled);
    fb_sweep_spec_free(s);
}

/* A small grid sweep with more top-level fields (no closing brace, for test_metric). */
#define METRIC_HEAD                                                                                \
    "{\"base\": " BASE ", \"search\": {\"type\": \"grid\", \"params\":"                       \
    " {\"seed\": {\"values\": [1]}}}"
#define METRIC(fields) METRIC_HEAD ", " fields "}"

static const char *random_sweep(int seed)
{
    static char buf[4096];
    snprintf(
        buf, sizeof buf,
        "{\"base\": " BASE ", \"search\": {\"type\": \"random\", \"count\": 200, \"seed\": %d,"
        " \"params\": {\"optimizer.lr\": {\"distribution\": \"log_uniform\", \"low\": 1e-5,"
        " \"high\": 1e-1}, \"optimizer.weight_decay\": {\"distribution\": \"uniform\", \"low\":"
        " 0, \"high\": 0.2}, \"seed\": {\"distribution\": \"int\", \"low\": 5, \"high\": 9},"
        " \"batch_size\": {\"distribution\": \"choice\", \"values\": [16, 32, 64]}}},"
        " \"early_stopping\": {\"type\": \"asha\", \"metric\": \"val_accuracy\","
        " \"grace_steps\": 50}}",
        seed);
    return buf;
}

static void test_random(void)
{
    fb_sweep_spec *a = parse_ok(random_sweep(7)), *b = parse_ok(random_sweep(7)),
                  *c = parse_ok(random_sweep(8));
    CHECK_INT_EQ(fb_sweep_spec_n_trials(a), 200);
    int same_as_c = 0, seeds[10] = {0}, sizes[65] = {0}, low_lr = 0;
    for (int i = 0; i < 200; i++) {
        CHECK_STR_EQ(fb_sweep_spec_trial_params(a, i), fb_sweep_spec_trial_params(b, i));
        if (strcmp(fb_sweep_spec_trial_params(a, i), fb_sweep_spec_trial_params(c, i)) == 0)
            same_as_c++;
        const fb_job_spec *j = fb_sweep_spec_trial(a, i);
        CHECK(j->optim.lr >= 1e-5 && j->optim.lr <= 1e-1);
        if (j->optim.lr < 1e-3) low_lr++;
        CHECK(j->optim.weight_decay >= 0 && j->optim.weight_decay <= 0.2);
        CHECK(j->seed >= 5 && j->seed <= 9);
        seeds[j->seed]++;
        CHECK(j->batch_size == 16 || j->batch_size == 32 || j->batch_size == 64);
        sizes[j->batch_size]++;
        /* the parameter values recorded are the values in the spec */
        json_t *p = trial_params(a, i);
        CHECK_NEAR(json_number_value(json_object_get(p, "optimizer.lr")), j->optim.lr, 1e-15);
        json_decref(p);
    }
    CHECK(same_as_c < 5);
    for (int k = 5; k <= 9; k++)
        CHECK(seeds[k] > 15); /* every integer is drawn */
    CHECK(sizes[16] > 30 && sizes[32] > 30 && sizes[64] > 30);
    /* log-uniform over four decades: about half below 1e-3 */
    CHECK(low_lr > 70 && low_lr < 130);
    const fb_asha_spec *es = fb_sweep_spec_early_stopping(a);
    CHECK(es->enabled);
    CHECK_STR_EQ(es->metric, "val_accuracy");
    CHECK_INT_EQ(es->mode, FB_METRIC_MAX); /* accuracy is maximised by default */
    CHECK_INT_EQ(es->grace_steps, 50);
    CHECK_INT_EQ(es->reduction_factor, 3);
    CHECK_INT_EQ(es->max_rungs, 4);
    /* the name defaults to the base's */
    CHECK_STR_EQ(fb_sweep_spec_name(a), "base");
    CHECK_STR_EQ(fb_sweep_spec_trial(a, 7)->name, "base-007");

    /* canonical: key order and number spelling do not matter */
    char *ca = fb_sweep_spec_canonical(a), *cb = fb_sweep_spec_canonical(b);
    CHECK_STR_EQ(ca, cb);
    fb_sweep_spec *again = parse_ok(ca);
    char *cc = fb_sweep_spec_canonical(again);
    CHECK_STR_EQ(ca, cc);
    CHECK_STR_EQ(fb_sweep_spec_trial_params(again, 199), fb_sweep_spec_trial_params(a, 199));
    free(ca);
    free(cb);
    free(cc);
    fb_sweep_spec_free(again);
    fb_sweep_spec_free(a);
    fb_sweep_spec_free(b);
    fb_sweep_spec_free(c);
}

typedef struct bad_sweep {
    const char *what;
    const char *json;
    int err;
    const char *msg_prefix;
} bad_sweep;

#define GRID(params)                                                                               \
    "{\"base\": " BASE ", \"search\": {\"type\": \"grid\", \"params\": " params "}}"
#define RANDOM(rest) "{\"base\": " BASE ", \"search\": {\"type\": \"random\", " rest "}}"

static const bad_sweep bad[] = {
    {"not JSON", "{", FB_ERR_JSON_SYNTAX, "invalid JSON"},
    {"not an object", "[]", FB_ERR_NOT_OBJECT, ""},
    {"unknown member",
     "{\"base\": " BASE ", \"search\": {\"type\": \"grid\", \"params\": {\"seed\":"
     " {\"values\": [1]}}}, \"trials\": 3}",
     FB_ERR_UNKNOWN_FIELD, "trials"},
    {"no base", "{\"search\": {\"type\": \"grid\", \"params\": {}}}", FB_ERR_MISSING_FIELD, "base"},
    {"base not an object", "{\"base\": 3, \"search\": {}}", FB_ERR_WRONG_TYPE, "base"},
    {"no search", "{\"base\": " BASE "}", FB_ERR_MISSING_FIELD, "search"},
    {"bad search type", "{\"base\": " BASE ", \"search\": {\"type\": \"bayes\", \"params\": {}}}",
     FB_ERR_BAD_ENUM, "search.type"},
    {"no params", "{\"base\": " BASE ", \"search\": {\"type\": \"grid\"}}", FB_ERR_MISSING_FIELD,
     "search.params"},
    {"empty params", GRID("{}"), FB_ERR_OUT_OF_RANGE, "search.params"},
    {"count in a grid",
     "{\"base\": " BASE ", \"search\": {\"type\": \"grid\", \"count\": 3,"
     " \"params\": {\"seed\": {\"values\": [1]}}}}",
     FB_ERR_CONFLICT, "search"},
    {"random without count", RANDOM("\"params\": {\"seed\": {\"values\": [1]}}"),
     FB_ERR_MISSING_FIELD, "search.count"},
    {"count 0", RANDOM("\"count\": 0, \"params\": {\"seed\": {\"values\": [1]}}"),
     FB_ERR_OUT_OF_RANGE, "search.count"},
    {"count 1001", RANDOM("\"count\": 1001, \"params\": {\"seed\": {\"values\": [1]}}"),
     FB_ERR_TOO_MANY_TRIALS, "search.count"},
    {"grid past 1000",
     GRID("{\"seed\": {\"values\": [1,2,3,4,5,6,7,8,9,10,11]}, \"data_seed\":"
          " {\"values\": [1,2,3,4,5,6,7,8,9,10,11]}, \"priority\": {\"values\":"
          " [1,2,3,4,5,6,7,8,9,10]}}"),
     FB_ERR_TOO_MANY_TRIALS, "search.params"},
    {"bad path", GRID("{\"optimizer..lr\": {\"values\": [1]}}"), FB_ERR_BAD_NAME, "search.params"},
    {"upper-case path", GRID("{\"Optimizer.lr\": {\"values\": [1]}}"), FB_ERR_BAD_NAME,
     "search.params"},
    {"name is not searchable", GRID("{\"name\": {\"values\": [\"a\"]}}"), FB_ERR_BAD_NAME,
     "search.params"},
    {"path too deep", GRID("{\"a.b.c.d.e.f.g.h.i\": {\"values\": [1]}}"), FB_ERR_BAD_NAME,
     "search.params"},
    {"nested paths",
     GRID("{\"optimizer\": {\"values\": [1]}, \"optimizer.lr\": {\"values\": [1]}}"),
     FB_ERR_CONFLICT, "search.params"},
    {"missing parent", GRID("{\"schedule.warmup_steps\": {\"values\": [1]}}"), FB_ERR_MISSING_FIELD,
     "search.params.schedule.warmup_steps"},
    {"index out of range", GRID("{\"model.layers.9.p\": {\"values\": [0.1]}}"),
     FB_ERR_MISSING_FIELD, "search.params.model.layers.9.p"},
    {"distribution in a grid",
     GRID("{\"optimizer.lr\": {\"distribution\": \"uniform\", \"low\":"
          " 0.1, \"high\": 0.2}}"),
     FB_ERR_CONFLICT, "search.params.optimizer.lr"},
    {"values not an array", GRID("{\"seed\": {\"values\": 3}}"), FB_ERR_WRONG_TYPE,
     "search.params.seed.values"},
    {"empty values", GRID("{\"seed\": {\"values\": []}}"), FB_ERR_OUT_OF_RANGE,
     "search.params.seed.values"},
    {"object value", GRID("{\"seed\": {\"values\": [{}]}}"), FB_ERR_WRONG_TYPE,
     "search.params.seed.values[0]"},
    {"unknown distribution",
     RANDOM("\"count\": 2, \"params\": {\"seed\": {\"distribution\":"
            " \"normal\", \"low\": 0, \"high\": 1}}"),
     FB_ERR_BAD_ENUM, "search.params.seed.distribution"},
    {"low above high",
     RANDOM("\"count\": 2, \"params\": {\"optimizer.lr\": {\"distribution\":"
            " \"uniform\", \"low\": 0.2, \"high\": 0.1}}"),
     FB_ERR_OUT_OF_RANGE, "search.params.optimizer.lr"},
    {"log_uniform from 0",
     RANDOM("\"count\": 2, \"params\": {\"optimizer.lr\": {\"distribution\":"
            " \"log_uniform\", \"low\": 0, \"high\": 0.1}}"),
     FB_ERR_OUT_OF_RANGE, "search.params.optimizer.lr.low"},
    {"int with reals",
     RANDOM("\"count\": 2, \"params\": {\"seed\": {\"distribution\": \"int\","
            " \"low\": 0.5, \"high\": 3}}"),
     FB_ERR_WRONG_TYPE, "search.params.seed.low"},
    {"values and low",
     RANDOM("\"count\": 2, \"params\": {\"seed\": {\"distribution\": \"int\","
            " \"low\": 0, \"high\": 3, \"values\": [1]}}"),
     FB_ERR_CONFLICT, "search.params.seed"},
    {"trial invalid", GRID("{\"optimizer.lr\": {\"values\": [0.1, -1]}}"), FB_ERR_OUT_OF_RANGE,
     "base.optimizer.lr"},
    {"uniform into an integer field",
     RANDOM("\"count\": 2, \"params\": {\"batch_size\":"
            " {\"distribution\": \"uniform\", \"low\": 8, \"high\":"
            " 64}}"),
     FB_ERR_WRONG_TYPE, "base.batch_size"},
    {"bad sweep name",
     "{\"name\": \"a b\", \"base\": " BASE ", \"search\": {\"type\": \"grid\","
     " \"params\": {\"seed\": {\"values\": [1]}}}}",
     FB_ERR_BAD_NAME, "name"},
    /* a test metric never decides: refused wherever it is named */
    {"metric test_accuracy", METRIC("\"metric\": \"test_accuracy\""), FB_ERR_BAD_ENUM,
     "metric: \"test_accuracy\" is measured on the test split"},
    {"metric test_loss", METRIC("\"metric\": \"test_loss\", \"mode\": \"min\""),
     FB_ERR_BAD_ENUM, "metric: \"test_loss\" is measured on the test split"},
    {"asha on test_accuracy",
     METRIC("\"early_stopping\": {\"type\": \"asha\", \"metric\": \"test_accuracy\"}"),
     FB_ERR_BAD_ENUM, "early_stopping.metric: \"test_accuracy\" is measured on the test split"},
    {"metric of the old vocabulary", METRIC("\"metric\": \"eval_accuracy\""), FB_ERR_BAD_ENUM,
     "metric: \"eval_accuracy\" is not one of"},
    {"metric a number", METRIC("\"metric\": 1"), FB_ERR_WRONG_TYPE, "metric"},
    {"mode unknown", METRIC("\"mode\": \"up\""), FB_ERR_BAD_ENUM, "mode"},
    {"asha on another metric",
     METRIC("\"metric\": \"val_loss\", \"early_stopping\": {\"type\": \"asha\","
            " \"metric\": \"val_accuracy\"}"),
     FB_ERR_CONFLICT, "early_stopping.metric"},
    {"asha in another mode",
     METRIC("\"mode\": \"min\", \"early_stopping\": {\"type\": \"asha\", \"mode\": \"max\"}"),
     FB_ERR_CONFLICT, "early_stopping.mode"},
    {"asha unknown metric",
     "{\"base\": " BASE ", \"search\": {\"type\": \"grid\", \"params\":"
     " {\"seed\": {\"values\": [1]}}}, \"early_stopping\": {\"type\": \"asha\", \"metric\":"
     " \"f1\"}}",
     FB_ERR_BAD_ENUM, "early_stopping.metric"},
    {"asha factor 1",
     "{\"base\": " BASE ", \"search\": {\"type\": \"grid\", \"params\":"
     " {\"seed\": {\"values\": [1]}}}, \"early_stopping\": {\"type\": \"asha\", \"metric\":"
     " \"loss\", \"reduction_factor\": 1}}",
     FB_ERR_OUT_OF_RANGE, "early_stopping.reduction_factor"},
    {"asha bad mode",
     "{\"base\": " BASE ", \"search\": {\"type\": \"grid\", \"params\":"
     " {\"seed\": {\"values\": [1]}}}, \"early_stopping\": {\"type\": \"asha\", \"metric\":"
     " \"loss\", \"mode\": \"lowest\"}}",
     FB_ERR_BAD_ENUM, "early_stopping.mode"},
};

/* The sweep's metric: named at the top, by early_stopping, or by default from the loss. */
static void test_metric(void)
{
    static const struct {
        const char *extra, *metric;
        fb_metric_mode mode;
        bool asha;
    } cases[] = {
        {"", "val_accuracy", FB_METRIC_MAX, false},
        {"\"metric\": \"val_loss\"", "val_loss", FB_METRIC_MIN, false},
        {"\"metric\": \"loss\", \"mode\": \"max\"", "loss", FB_METRIC_MAX, false},
        {"\"metric\": \"accuracy\"", "accuracy", FB_METRIC_MAX, false},
        {"\"early_stopping\": {\"type\": \"asha\"}", "val_accuracy", FB_METRIC_MAX, true},
        {"\"metric\": \"val_loss\", \"early_stopping\": {\"type\": \"asha\"}", "val_loss",
         FB_METRIC_MIN, true},
        {"\"early_stopping\": {\"type\": \"asha\", \"metric\": \"val_loss\"}", "val_loss",
         FB_METRIC_MIN, true},
        {"\"metric\": \"val_loss\", \"early_stopping\": {\"type\": \"asha\", \"metric\":"
         " \"val_loss\", \"mode\": \"min\"}",
         "val_loss", FB_METRIC_MIN, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[4096];
        snprintf(buf, sizeof buf, "%s%s%s}", METRIC_HEAD, cases[i].extra[0] ? ", " : "",
                 cases[i].extra);
        fb_sweep_spec *s = parse_ok(buf);
        fb_metric_mode mode;
        CHECK_STR_EQ(fb_sweep_spec_metric(s, &mode), cases[i].metric);
        CHECK_INT_EQ(mode, cases[i].mode);
        const fb_asha_spec *es = fb_sweep_spec_early_stopping(s);
        CHECK_INT_EQ(es->enabled, cases[i].asha);
        if (es->enabled) {
            CHECK_STR_EQ(es->metric, cases[i].metric); /* ASHA decides on the sweep's metric */
            CHECK_INT_EQ(es->mode, cases[i].mode);
        }
        char *canon = fb_sweep_spec_canonical(s);
        char want[96];
        snprintf(want, sizeof want, "\"metric\":\"%s\"", cases[i].metric);
        CHECK(canon && strstr(canon, want));
        free(canon);
        fb_sweep_spec_free(s);
    }
    /* an MSE base: its validation loss, minimised */
    fb_sweep_spec *s = parse_ok(
        "{\"base\": {\"dataset\": \"fashion-mnist\", \"loss\": \"mse\", \"model\": {\"input\":"
        " [1, 28, 28], \"layers\": [{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 10}]},"
        " \"batch_size\": 32, \"steps\": 10, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}},"
        " \"search\": {\"type\": \"grid\", \"params\": {\"seed\": {\"values\": [1, 2]}}}}");
    fb_metric_mode mode;
    CHECK_STR_EQ(fb_sweep_spec_metric(s, &mode), "val_loss");
    CHECK_INT_EQ(mode, FB_METRIC_MIN);
    fb_sweep_spec_free(s);
    printf("metric: %zu cases and an MSE base\n", sizeof cases / sizeof cases[0]);
}

static void test_bad(void)
{
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fb_sweep_spec *s = (fb_sweep_spec *)0x1;
        char msg[512] = "";
        int err = fb_sweep_spec_parse(bad[i].json, strlen(bad[i].json), NULL, &s, msg, sizeof msg);
        if (err != bad[i].err || strncmp(msg, bad[i].msg_prefix, strlen(bad[i].msg_prefix)) != 0) {
            fprintf(stderr, "%s: expected %s \"%s...\", got %s \"%s\"\n", bad[i].what,
                    fb_err_code(bad[i].err), bad[i].msg_prefix, fb_err_code(err), msg);
            abort();
        }
        CHECK(s == (fb_sweep_spec *)0x1); /* untouched on failure */
        printf("refused %-32s %s: %s\n", bad[i].what, fb_err_code(err), msg);
    }
    fb_sweep_spec_free(NULL);
}

/* Reads examples/NAME of the source tree into buf (NUL-terminated); returns
 * its length. */
static size_t read_example(const char *name, char *buf, size_t cap)
{
    const char *src = getenv("FB_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/examples/%s", src && *src ? src : "..", name);
    FILE *f = fopen(path, "rb");
    if (!f) fprintf(stderr, "cannot open %s\n", path);
    CHECK(f != NULL);
    size_t n = fread(buf, 1, cap - 1, f);
    CHECK(feof(f)); /* the whole file fitted */
    fclose(f);
    buf[n] = '\0';
    return n;
}

/* Every file of examples/ is a valid spec: a sweep (an object with "base")
 * by the sweep parser, anything else by the job parser. */
static void test_all_examples(void)
{
    const char *src = getenv("FB_SOURCE_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/examples", src && *src ? src : "..");
    DIR *d = opendir(dir);
    if (!d) fprintf(stderr, "cannot open %s\n", dir);
    CHECK(d != NULL);
    static char buf[1 << 16];
    int files = 0, sweeps = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0) continue;
        size_t n = read_example(e->d_name, buf, sizeof buf);
        json_t *root = json_loadb(buf, n, 0, NULL);
        if (!root) fprintf(stderr, "examples/%s: not JSON\n", e->d_name);
        CHECK(root != NULL);
        bool sweep = json_object_get(root, "base") != NULL;
        json_decref(root);
        char msg[512] = "";
        int err;
        if (sweep) {
            fb_sweep_spec *s = NULL;
            err = fb_sweep_spec_parse(buf, n, NULL, &s, msg, sizeof msg);
            if (!err) CHECK(fb_sweep_spec_n_trials(s) >= 2);
            fb_sweep_spec_free(s);
            sweeps++;
        } else {
            fb_job_spec js;
            err = fb_job_spec_parse(buf, n, NULL, &js, msg, sizeof msg);
            if (!err) fb_job_spec_free(&js);
        }
        if (err) fprintf(stderr, "examples/%s: %s\n", e->d_name, msg);
        CHECK_INT_EQ(err, FB_OK);
        printf("examples/%-28s valid %s\n", e->d_name, sweep ? "sweep" : "job");
        files++;
    }
    closedir(d);
    CHECK(files >= 2 && sweeps >= 1);
}

/* examples/charlm-sweep.json: a sweep over learning rate and warmup of
 * examples/charlm.json's byte-level language model, every trial one fusion
 * key (one array). */
static void test_charlm_example(void)
{
    static char buf[1 << 16];
    size_t n = read_example("charlm-sweep.json", buf, sizeof buf);
    char path[] = "examples/charlm-sweep.json";
    fb_sweep_spec *s = NULL;
    char msg[512];
    int err = fb_sweep_spec_parse(buf, n, NULL, &s, msg, sizeof msg);
    if (err) fprintf(stderr, "%s: %s\n", path, msg);
    CHECK_INT_EQ(err, FB_OK);
    CHECK_INT_EQ(fb_sweep_spec_n_trials(s), 12);
    const fb_job_spec *t0 = fb_sweep_spec_trial(s, 0);
    CHECK(t0->lm);
    CHECK_INT_EQ(t0->tokens, 64);
    CHECK_INT_EQ(t0->vocab, 256);
    for (int i = 1; i < 12; i++)
        CHECK_STR_EQ(fb_sweep_spec_trial(s, i)->fusion_key, t0->fusion_key);
    /* the sweep is of examples/charlm.json's model: the same fusion key */
    static char job[1 << 16];
    size_t jn = read_example("charlm.json", job, sizeof job);
    fb_job_spec js;
    CHECK_INT_EQ(fb_job_spec_parse(job, jn, NULL, &js, msg, sizeof msg), FB_OK);
    CHECK_STR_EQ(js.fusion_key, t0->fusion_key);
    fb_job_spec_free(&js);
    fb_sweep_spec_free(s);
}

int main(void)
{
    test_all_examples();
    test_charlm_example();
    test_grid();
    test_random();
    test_metric();
    test_bad();
    printf("ok\n");
    return 0;
}
