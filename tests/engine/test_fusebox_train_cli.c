/*
 * fusebox-train as a user runs it: the real binary, real files, exit codes,
 * stdout and stderr.
 *
 * A tiny Fashion-MNIST stand-in (IDX files of 64 + 32 images of 6x6, 4
 * classes) is written under a scratch FUSEBOX_DATA_DIR.  Checked:
 *   - three specs, two fusible and one not, train as two arrays; stdout (not
 *     a terminal) is JSON lines only, with the step, eval and done events each
 *     spec's cadence implies; each member's weights file lands in --out with
 *     PyTorch state-dict names and shapes;
 *   - the metric names are docs/jobspec.md's: every line of every event kind
 *     has exactly its documented keys (a table), evaluated or not, with or
 *     without --out; with --no-eval no eval event and no val_* or test_* key;
 *     done carries the final validation and the test evaluation;
 *   - "init" is honoured: one update at lr 1e-6 stays within 2e-6 of the init
 *     file (Adam's first step moves a parameter by at most lr), far from the
 *     seeded initialisation;
 *   - runs are reproducible: data.shuffle false follows the file order (the
 *     same losses whatever data_seed), data.shuffle true follows data_seed;
 *   - bad input changes nothing: a missing spec file, malformed JSON, an
 *     unknown field, a shape mismatch or a bad flag exit 2; an unknown dataset,
 *     missing dataset files, a dataset that does not fit the model, or a
 *     corrupt or mismatched init file exit 1; each with a message on stderr
 *     naming the problem and nothing written to --out.
 */
#include "engine_util.h"

#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <sys/wait.h>

#define SIDE 6
#define N_TRAIN 64
#define N_TEST 32
#define CLASSES 4

static char root[512], data_dir[1024], empty_dir[1024], bin[PATH_MAX];

typedef struct result {
    int rc;
    char *out, *err;
} result;

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    CHECK(buf != NULL);
    size_t k;
    while ((k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (cap - n - 1 == 0) {
            cap *= 2;
            buf = realloc(buf, cap);
            CHECK(buf != NULL);
        }
    }
    fclose(f);
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

static void spit(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(data, 1, len, f) == len);
    CHECK(fclose(f) == 0);
}

/*
 * Runs fusebox-train with the NULL-terminated arguments, FUSEBOX_DATA_DIR set
 * to env_data_dir (unset when NULL), stdin from /dev/null and stdout/stderr
 * captured.  rc is the exit status, or 128 + the signal.
 */
static result run(const char *env_data_dir, ...)
{
    const char *argv[32];
    int argc = 0;
    argv[argc++] = bin;
    va_list ap;
    va_start(ap, env_data_dir);
    const char *s;
    while ((s = va_arg(ap, const char *))) {
        CHECK(argc < 31);
        argv[argc++] = s;
    }
    va_end(ap);
    argv[argc] = NULL;

    char out_path[1024], err_path[1024];
    snprintf(out_path, sizeof out_path, "%s/stdout.txt", root);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", root);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int in = open("/dev/null", O_RDONLY);
        int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (in < 0 || out < 0 || err < 0 || dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0)
            _exit(126);
        if (env_data_dir)
            setenv(FB_DATASET_DIR_ENV, env_data_dir, 1);
        else
            unsetenv(FB_DATASET_DIR_ENV);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    result r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = slurp(out_path, NULL);
    r.err = slurp(err_path, NULL);
    return r;
}

static void result_free(result *r)
{
    free(r->out);
    free(r->err);
}

/* Each needle must occur in haystack. */
static void expect_text(const char *what, const char *haystack, const char *const *needles)
{
    for (; *needles; needles++)
        if (!strstr(haystack, *needles)) {
            fprintf(stderr, "%s: expected \"%s\" in:\n%s\n", what, *needles, haystack);
            abort();
        }
}

/* ---- files the tests feed it ------------------------------------------------ */

static void write_idx(const char *path, const uint8_t *data, int ndim, const uint32_t *dims)
{
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= dims[i];
    size_t len = 4 + 4 * (size_t)ndim + n;
    uint8_t *buf = malloc(len);
    CHECK(buf != NULL);
    buf[0] = buf[1] = 0;
    buf[2] = 0x08; /* unsigned byte */
    buf[3] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++)
        for (int k = 0; k < 4; k++)
            buf[4 + 4 * i + k] = (uint8_t)(dims[i] >> (24 - 8 * k));
    memcpy(buf + 4 + 4 * ndim, data, n);
    spit(path, buf, len);
    free(buf);
}

/* <dir>/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte from a synthetic rule. */
static void write_dataset(const char *dir)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/fashion-mnist", dir);
    CHECK(mkdir(path, 0755) == 0);
    const char *prefix[2] = {"train", "t10k"};
    int64_t n[2] = {N_TRAIN, N_TEST};
    fb_dataset ds = et_synthetic(N_TRAIN + N_TEST, SIDE, CLASSES, 99);
    int64_t off = 0;
    for (int s = 0; s < 2; s++) {
        uint8_t *img = malloc((size_t)n[s] * SIDE * SIDE), *lab = malloc((size_t)n[s]);
        CHECK(img && lab);
        for (int64_t i = 0; i < n[s] * SIDE * SIDE; i++)
            img[i] = (uint8_t)(ds.x[off * SIDE * SIDE + i] * 255.0f);
        for (int64_t i = 0; i < n[s]; i++)
            lab[i] = (uint8_t)ds.y[off + i];
        uint32_t dims[3] = {(uint32_t)n[s], SIDE, SIDE};
        snprintf(path, sizeof path, "%s/fashion-mnist/%s-images-idx3-ubyte", dir, prefix[s]);
        write_idx(path, img, 3, dims);
        snprintf(path, sizeof path, "%s/fashion-mnist/%s-labels-idx1-ubyte", dir, prefix[s]);
        write_idx(path, lab, 1, dims);
        off += n[s];
        free(img);
        free(lab);
    }
    fb_dataset_free(&ds);
}

static const char *mlp = "{\"input\":[1,6,6],\"layers\":[{\"type\":\"flatten\"},"
                         "{\"type\":\"linear\",\"out\":16},{\"type\":\"relu\"},"
                         "{\"type\":\"linear\",\"out\":4}]}";

/* Writes <root>/<file> from printf-formatted text; path receives its path. */
static void write_spec(char *path, size_t cap, const char *file, const char *fmt, ...)
{
    char text[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    CHECK(n > 0 && (size_t)n < sizeof text);
    snprintf(path, cap, "%s/%s", root, file);
    spit(path, text, (size_t)n);
}

/* ---- stdout as JSON lines ---------------------------------------------------- */

#define MAX_LINES 256

typedef struct events {
    json_t *e[MAX_LINES];
    int n;
} events;

/* Every line of stdout must be one JSON object with the common fields. */
static events parse_events(const char *out)
{
    events ev = {.n = 0};
    const char *p = out;
    while (*p) {
        const char *nl = strchr(p, '\n');
        CHECK(nl != NULL); /* every line ends with a newline */
        json_error_t jerr;
        json_t *o = json_loadb(p, (size_t)(nl - p), 0, &jerr);
        if (!o || !json_is_object(o)) {
            fprintf(stderr, "stdout line is not a JSON object: %.*s\n", (int)(nl - p), p);
            abort();
        }
        const char *const common[] = {"event",      "job",  "member", "group",
                                      "array_size", "step", "steps"};
        for (size_t i = 0; i < sizeof common / sizeof *common; i++)
            CHECK(json_object_get(o, common[i]) != NULL);
        CHECK(ev.n < MAX_LINES);
        ev.e[ev.n++] = o;
        p = nl + 1;
    }
    return ev;
}

static void events_free(events *ev)
{
    for (int i = 0; i < ev->n; i++)
        json_decref(ev->e[i]);
    ev->n = 0;
}

static const char *ev_str(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    CHECK(s != NULL);
    return s;
}

static long long ev_int(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    CHECK(json_is_integer(v));
    return (long long)json_integer_value(v);
}

static double ev_num(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    CHECK(json_is_number(v));
    return json_number_value(v);
}

/*
 * The keys of each event kind beyond the common ones: docs/jobspec.md's
 * "Metrics" tables, the one vocabulary of the CLI, the API and the dashboard.
 * evaluated: the run validates and tests (no --no-eval); weights: the kind also
 * carries "weights" when the run writes them (--out).
 */
static const struct {
    const char *event;
    bool evaluated, weights;
    const char *const keys[8];
} event_keys[] = {
    {"step", true, false, {"loss", "accuracy", "lr", "samples_per_s", "io_ms"}},
    {"step", false, false, {"loss", "accuracy", "lr", "samples_per_s", "io_ms"}},
    {"eval", true, false, {"val_loss", "val_accuracy"}},
    {"done", true, true, {"val_loss", "val_accuracy", "test_loss", "test_accuracy"}},
    {"done", false, true, {NULL}}, /* never a training value under an evaluation name */
    {"checkpoint", true, true, {NULL}},
    {"checkpoint", false, true, {NULL}},
};

/* Every line's keys are exactly the common ones plus its kind's row of event_keys (a kind
 * without a row must not occur: with --no-eval, "eval"); returns how many kinds were seen. */
static int check_event_keys(const events *ev, bool evaluated, bool weights)
{
    static const char *const common[] = {"event",      "job",  "member", "group",
                                         "array_size", "step", "steps"};
    const size_t n_common = sizeof common / sizeof *common;
    bool seen[sizeof event_keys / sizeof *event_keys] = {false};
    for (int i = 0; i < ev->n; i++) {
        const char *kind = ev_str(ev->e[i], "event");
        int row = -1;
        for (size_t r = 0; r < sizeof event_keys / sizeof *event_keys; r++)
            if (strcmp(event_keys[r].event, kind) == 0 && event_keys[r].evaluated == evaluated)
                row = (int)r;
        char *line = json_dumps(ev->e[i], JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (row < 0) {
            fprintf(stderr, "a \"%s\" event where none belongs (evaluated %d): %s\n", kind,
                    evaluated, line);
            abort();
        }
        seen[row] = true;
        size_t n_want = n_common;
        if (weights && event_keys[row].weights) {
            CHECK(json_is_string(json_object_get(ev->e[i], "weights")));
            n_want++;
        }
        for (const char *const *k = event_keys[row].keys; *k; k++, n_want++)
            if (!json_object_get(ev->e[i], *k)) {
                fprintf(stderr, "\"%s\" event lacks \"%s\": %s\n", kind, *k, line);
                abort();
            }
        for (size_t k = 0; k < n_common; k++)
            CHECK(json_object_get(ev->e[i], common[k]) != NULL);
        if (json_object_size(ev->e[i]) != n_want) {
            fprintf(stderr, "\"%s\" event has keys beyond the documented %zu: %s\n", kind, n_want,
                    line);
            abort();
        }
        /* the names before one vocabulary, and evaluation names without an evaluation */
        const char *key;
        json_t *val;
        json_object_foreach(ev->e[i], key, val)
        {
            bool old = strncmp(key, "eval_", 5) == 0 || strcmp(key, "train_accuracy") == 0 ||
                       strcmp(key, "io_wait_ms") == 0;
            if (old || (!evaluated && (strncmp(key, "val_", 4) == 0 ||
                                       strncmp(key, "test_", 5) == 0))) {
                fprintf(stderr, "key \"%s\" is not in the vocabulary of this run: %s\n", key, line);
                abort();
            }
            if (strcmp(key, "event") && strcmp(key, "job") && strcmp(key, "weights") &&
                strcmp(key, "error") && strcmp(key, "message"))
                CHECK(json_is_number(val));
        }
        free(line);
    }
    int n = 0;
    for (size_t r = 0; r < sizeof seen / sizeof *seen; r++)
        n += seen[r];
    return n;
}

/* The events of one job and kind, in order. */
static int select_events(const events *ev, const char *job, const char *kind, json_t **out)
{
    int n = 0;
    for (int i = 0; i < ev->n; i++)
        if (strcmp(ev_str(ev->e[i], "job"), job) == 0 &&
            strcmp(ev_str(ev->e[i], "event"), kind) == 0)
            out[n++] = ev->e[i];
    return n;
}

/* The "loss" of every step event, in order; returns the count. */
static int step_losses(const char *out, double *loss, int cap)
{
    events ev = parse_events(out);
    int n = 0;
    for (int i = 0; i < ev.n; i++)
        if (strcmp(ev_str(ev.e[i], "event"), "step") == 0) {
            CHECK(n < cap);
            loss[n++] = ev_num(ev.e[i], "loss");
        }
    events_free(&ev);
    return n;
}

/* ---- the checks --------------------------------------------------------------- */

static void check_tensor(const fb_st_file *f, const char *name, int ndim, int64_t d0, int64_t d1)
{
    const fb_st_tensor *t = fb_st_find(f, name);
    if (!t) {
        fprintf(stderr, "weights file lacks %s\n", name);
        abort();
    }
    CHECK_INT_EQ(t->dtype, FB_ST_F32);
    CHECK_INT_EQ(t->ndim, ndim);
    CHECK_INT_EQ(t->shape[0], d0);
    if (ndim > 1) CHECK_INT_EQ(t->shape[1], d1);
}

/* Two fusible specs and one that is not: two arrays, events and weights. */
static void test_good_run(void)
{
    char a[1200], b[1200], c[1200], out[1200];
    write_spec(a, sizeof a, "alpha.json",
               "{\"name\":\"alpha\",\"dataset\":\"fashion-mnist\",\"model\":%s,\"batch_size\":8,"
               "\"steps\":12,\"eval_every\":6,\"optimizer\":{\"type\":\"adam\",\"lr\":0.01},"
               "\"seed\":1,\"data_seed\":5}",
               mlp);
    write_spec(b, sizeof b, "beta.json",
               "{\"name\":\"beta\",\"dataset\":\"fashion-mnist\",\"model\":%s,\"batch_size\":8,"
               "\"steps\":8,\"optimizer\":{\"type\":\"adam\",\"lr\":0.005,\"betas\":[0.8,0.99]},"
               "\"schedule\":{\"type\":\"cosine\"},\"seed\":2,\"data_seed\":5}",
               mlp);
    write_spec(c, sizeof c, "gamma.json",
               "{\"name\":\"gamma\",\"dataset\":\"fashion-mnist\",\"model\":%s,\"batch_size\":8,"
               "\"steps\":10,\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1,\"momentum\":0.9},"
               "\"seed\":3,\"data_seed\":5}",
               mlp);
    snprintf(out, sizeof out, "%s/out-good", root);
    result r = run(data_dir, "--out", out, "--log-every", "4", a, b, c, NULL);
    if (r.rc != 0) fprintf(stderr, "stderr:\n%s\n", r.err);
    CHECK_INT_EQ(r.rc, 0);
    CHECK_STR_EQ(r.err, "");
    events ev = parse_events(r.out);

    const char *jobs[3] = {"alpha", "beta", "gamma"};
    const int group[3] = {0, 0, 1}, member[3] = {0, 1, 0};
    const int n_steps[3] = {3, 2, 3}; /* logged at 4, 8, and each member's last step */
    const int64_t last[3] = {12, 8, 10};
    const int n_evals[3] = {2, 1, 1}; /* alpha at 6 and 12; the others at their end */
    json_t *sel[MAX_LINES];
    for (int j = 0; j < 3; j++) {
        int n = select_events(&ev, jobs[j], "step", sel);
        CHECK_INT_EQ(n, n_steps[j]);
        for (int i = 0; i < n; i++) {
            long long step = ev_int(sel[i], "step");
            CHECK_INT_EQ(step, i + 1 < n ? 4 * (i + 1) : last[j]);
            CHECK_INT_EQ(ev_int(sel[i], "steps"), last[j]);
            CHECK_INT_EQ(ev_int(sel[i], "group"), group[j]);
            CHECK_INT_EQ(ev_int(sel[i], "member"), member[j]);
            /* beta leaves alpha's array after step 8 */
            CHECK_INT_EQ(ev_int(sel[i], "array_size"), group[j] == 1 ? 1 : step <= 8 ? 2 : 1);
            double loss = ev_num(sel[i], "loss");
            CHECK(isfinite(loss) && loss > 0);
            double acc = ev_num(sel[i], "accuracy");
            CHECK(acc >= 0 && acc <= 1);
            CHECK(ev_num(sel[i], "lr") > 0);
            CHECK(ev_num(sel[i], "samples_per_s") > 0);
        }
        n = select_events(&ev, jobs[j], "eval", sel);
        CHECK_INT_EQ(n, n_evals[j]);
        for (int i = 0; i < n; i++) {
            CHECK_INT_EQ(ev_int(sel[i], "step"), j == 0 ? 6 * (i + 1) : last[j]);
            double acc = ev_num(sel[i], "val_accuracy");
            CHECK(acc >= 0 && acc <= 1 && isfinite(ev_num(sel[i], "val_loss")));
        }
        json_t *evals[MAX_LINES];
        int n_ev = select_events(&ev, jobs[j], "eval", evals);
        n = select_events(&ev, jobs[j], "done", sel);
        CHECK_INT_EQ(n, 1);
        CHECK_INT_EQ(ev_int(sel[0], "step"), last[j]);
        /* done carries the final validation (the last eval event's values) and the test
         * evaluation, on other samples: another loss */
        CHECK(ev_num(sel[0], "val_loss") == ev_num(evals[n_ev - 1], "val_loss"));
        CHECK(ev_num(sel[0], "val_accuracy") == ev_num(evals[n_ev - 1], "val_accuracy"));
        double tacc = ev_num(sel[0], "test_accuracy");
        CHECK(tacc >= 0 && tacc <= 1 && isfinite(ev_num(sel[0], "test_loss")));
        CHECK(ev_num(sel[0], "test_loss") != ev_num(sel[0], "val_loss"));
        char want[1300];
        snprintf(want, sizeof want, "%s/%s.safetensors", out, jobs[j]);
        CHECK_STR_EQ(ev_str(sel[0], "weights"), want);
        fb_st_file *f = et_st_open(want);
        CHECK_INT_EQ(fb_st_count(f), 4);
        check_tensor(f, "1.weight", 2, 16, SIDE * SIDE);
        check_tensor(f, "1.bias", 1, 16, 0);
        check_tensor(f, "3.weight", 2, CLASSES, 16);
        check_tensor(f, "3.bias", 1, CLASSES, 0);
        char step[32];
        snprintf(step, sizeof step, "%lld", (long long)last[j]);
        CHECK_STR_EQ(fb_st_metadata_get(f, "step"), step);
        /* the file describes itself: the job, the preprocessing, the final metrics */
        json_t *spec = json_loads(fb_st_metadata_get(f, "spec"), 0, NULL);
        CHECK(json_is_object(spec));
        CHECK_STR_EQ(json_string_value(json_object_get(spec, "name")), jobs[j]);
        CHECK(json_is_array(json_object_get(json_object_get(spec, "model"), "layers")));
        json_decref(spec);
        CHECK_STR_EQ(fb_st_metadata_get(f, "preprocess"), "{\"uint8_scale\":0.00392156862745098}");
        CHECK(fb_st_metadata_get(f, "fusebox_version") != NULL);
        json_t *m = json_loads(fb_st_metadata_get(f, "metrics"), 0, NULL);
        CHECK(json_is_object(m));
        CHECK_INT_EQ(json_integer_value(json_object_get(m, "val_step")), last[j]);
        CHECK_NEAR(json_number_value(json_object_get(m, "val_loss")), ev_num(sel[0], "val_loss"),
                   1e-6 * ev_num(sel[0], "val_loss"));
        CHECK_NEAR(json_number_value(json_object_get(m, "val_accuracy")),
                   ev_num(sel[0], "val_accuracy"), 1e-5); /* printed in 6 digits */
        CHECK_NEAR(json_number_value(json_object_get(m, "test_loss")),
                   ev_num(sel[0], "test_loss"), 1e-6 * ev_num(sel[0], "test_loss"));
        CHECK_NEAR(json_number_value(json_object_get(m, "test_accuracy")),
                   ev_num(sel[0], "test_accuracy"), 1e-5);
        CHECK(json_is_number(json_object_get(m, "loss")) &&
              json_is_number(json_object_get(m, "accuracy")));
        json_decref(m);
        fb_st_close(f);
    }
    CHECK_INT_EQ(check_event_keys(&ev, true, true), 3); /* step, eval, done */
    /* the arrays run one after the other */
    for (int i = 1; i < ev.n; i++)
        CHECK(ev_int(ev.e[i], "group") >= ev_int(ev.e[i - 1], "group"));
    CHECK_INT_EQ(et_dir_entries(out), 3);
    printf("good run: %d JSON lines, 2 arrays, 3 weights files\n", ev.n);
    events_free(&ev);
    result_free(&r);
}

/* The same vocabulary with and without evaluation, with and without --out: each line's keys
 * are exactly its kind's (event_keys); with --no-eval no eval event and no val_* or test_*
 * key. */
static void test_metric_names(void)
{
    char a[1200], b[1200], out[1200];
    const char *fmt = "{\"name\":\"%s\",\"dataset\":\"fashion-mnist\",\"model\":%s,"
                      "\"batch_size\":8,\"steps\":%d,\"eval_every\":4,\"checkpoint_every\":3,"
                      "\"optimizer\":{\"type\":\"adam\",\"lr\":0.01},\"seed\":%d}";
    write_spec(a, sizeof a, "names-a.json", fmt, "names-a", mlp, 9, 1);
    write_spec(b, sizeof b, "names-b.json", fmt, "names-b", mlp, 6, 2);
    snprintf(out, sizeof out, "%s/out-names", root);
    const struct {
        bool eval, write;
        int kinds; /* event kinds the run must show */
    } runs[] = {
        {true, true, 4},  /* step, eval, checkpoint, done */
        {true, false, 4}, /* the same without weights */
        {false, true, 3}, /* step, checkpoint, done: no eval */
        {false, false, 3},
    };
    for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
        result r =
            runs[k].eval
                ? (runs[k].write ? run(data_dir, "--out", out, "--log-every", "2", a, b, NULL)
                                 : run(data_dir, "--no-out", "--log-every", "2", a, b, NULL))
                : (runs[k].write
                       ? run(data_dir, "--out", out, "--log-every", "2", "--no-eval", a, b, NULL)
                       : run(data_dir, "--no-out", "--log-every", "2", "--no-eval", a, b, NULL));
        if (r.rc != 0) fprintf(stderr, "stderr:\n%s\n", r.err);
        CHECK_INT_EQ(r.rc, 0);
        events ev = parse_events(r.out);
        CHECK_INT_EQ(check_event_keys(&ev, runs[k].eval, runs[k].write), runs[k].kinds);
        json_t *sel[MAX_LINES];
        CHECK_INT_EQ(select_events(&ev, "names-a", "done", sel), 1);
        CHECK_INT_EQ(select_events(&ev, "names-b", "done", sel), 1);
        CHECK_INT_EQ(select_events(&ev, "names-a", "eval", sel), runs[k].eval ? 3 : 0);
        if (runs[k].write) {
            /* the files' metrics use the same names: the checkpoint of step 6 has the
             * validation of step 4 and no test evaluation yet, the model the final ones;
             * without evaluation none */
            const char *files[] = {"names-a.checkpoint.safetensors", "names-a.safetensors"};
            const int eval_step[] = {4, 9};
            for (int i = 0; i < 2; i++) {
                char path[1300];
                snprintf(path, sizeof path, "%s/%s", out, files[i]);
                fb_st_file *f = et_st_open(path);
                json_t *m = json_loads(fb_st_metadata_get(f, "metrics"), 0, NULL);
                CHECK(json_is_object(m));
                CHECK(json_is_number(json_object_get(m, "loss")));
                CHECK(json_is_number(json_object_get(m, "accuracy")));
                if (runs[k].eval) {
                    CHECK_INT_EQ(json_integer_value(json_object_get(m, "val_step")),
                                 eval_step[i]);
                    CHECK(json_is_number(json_object_get(m, "val_loss")));
                    CHECK(json_is_number(json_object_get(m, "val_accuracy")));
                    CHECK_INT_EQ(json_is_number(json_object_get(m, "test_loss")), i == 1);
                    CHECK_INT_EQ(json_is_number(json_object_get(m, "test_accuracy")), i == 1);
                    CHECK_INT_EQ(json_object_size(m), i == 1 ? 7 : 5);
                } else {
                    CHECK_INT_EQ(json_object_size(m), 2); /* no val_* or test_* key at all */
                }
                json_decref(m);
                fb_st_close(f);
            }
        }
        printf("metric names: %s, %s: %d JSON lines, each with exactly its documented keys\n",
               runs[k].eval ? "evaluated" : "--no-eval", runs[k].write ? "--out" : "--no-out",
               ev.n);
        events_free(&ev);
        result_free(&r);
        if (runs[k].write) et_rmtree(out);
    }
}

/* Largest |a - b| over the tensors of file a (which b must hold with the same shapes). */
static double max_abs_diff(const char *pa, const char *pb)
{
    fb_st_file *fa = et_st_open(pa), *fb = et_st_open(pb);
    double worst = 0;
    for (size_t i = 0; i < fb_st_count(fa); i++) {
        const fb_st_tensor *ta = fb_st_at(fa, i), *tb = fb_st_find(fb, ta->name);
        CHECK(tb != NULL && tb->numel == ta->numel);
        double *va = et_st_values(ta), *vb = et_st_values(tb);
        for (int64_t k = 0; k < ta->numel; k++)
            worst = fmax(worst, fabs(va[k] - vb[k]));
        free(va);
        free(vb);
    }
    fb_st_close(fa);
    fb_st_close(fb);
    return worst;
}

/* Writes an init file for the MLP with a pattern no seeded initialisation produces. */
static void write_init(const char *path, bool wrong_shape)
{
    static float w1[16 * SIDE * SIDE], b1[16], w3[CLASSES * 16], b3[CLASSES];
    float *t[4] = {w1, b1, w3, b3};
    size_t n[4] = {16 * SIDE * SIDE, 16, CLASSES * 16, CLASSES};
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < n[k]; i++)
            t[k][i] = 0.3f * sinf(0.7f * (float)(i + 31 * k) + 1.0f);
    int64_t s1[2] = {16, SIDE * SIDE}, s2[1] = {16}, s3[2] = {CLASSES, 16}, s4[1] = {CLASSES};
    if (wrong_shape) s3[0] = CLASSES - 1;
    char msg[256];
    fb_st_writer *w = fb_st_writer_new();
    CHECK(w != NULL);
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "1.weight", s1, 2, w1, msg, sizeof msg), 0);
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "1.bias", s2, 1, b1, msg, sizeof msg), 0);
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "3.weight", s3, 2, w3, msg, sizeof msg), 0);
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "3.bias", s4, 1, b3, msg, sizeof msg), 0);
    CHECK_INT_EQ(fb_st_write(w, path, msg, sizeof msg), 0);
    fb_st_writer_free(w);
}

static const char *one_step_spec = "{\"name\":\"%s\",\"dataset\":\"fashion-mnist\",\"model\":%s,"
                                   "\"batch_size\":8,\"steps\":1,\"optimizer\":{\"type\":\"adam\","
                                   "\"lr\":1e-6},\"seed\":4%s}";

static void test_init(void)
{
    char init[1200], spec[1200], plain[1200], out[1200], extra[1400];
    snprintf(init, sizeof init, "%s/init.safetensors", root);
    write_init(init, false);
    snprintf(extra, sizeof extra, ",\"init\":\"%s\"", init);
    write_spec(spec, sizeof spec, "init.json", one_step_spec, "fromfile", mlp, extra);
    write_spec(plain, sizeof plain, "plain.json", one_step_spec, "seeded", mlp, "");
    snprintf(out, sizeof out, "%s/out-init", root);
    result r = run(data_dir, "--out", out, "--no-eval", spec, plain, NULL);
    if (r.rc != 0) fprintf(stderr, "stderr:\n%s\n", r.err);
    CHECK_INT_EQ(r.rc, 0);
    char got[1300], seeded[1300];
    snprintf(got, sizeof got, "%s/fromfile.safetensors", out);
    snprintf(seeded, sizeof seeded, "%s/seeded.safetensors", out);
    double near = max_abs_diff(got, init), far = max_abs_diff(seeded, init);
    printf("init: one step at lr 1e-6 moved weights by %.3g from the init file; the seeded "
           "run is %.3g away\n",
           near, far);
    CHECK(near <= 2e-6);
    CHECK(near > 0); /* it did train */
    CHECK(far > 0.1);
    result_free(&r);
}

/* A bf16 spec trains to the end like its fp32 twin (same seed, same data) and
 * ends at other weights, close to the fp32 ones: the operands were rounded. */
static void test_bf16_run(void)
{
    char b16[1200], f32[1200], out[1200];
    const char *fmt = "{\"name\":\"%s\",\"dataset\":\"fashion-mnist\",\"model\":%s,"
                      "\"batch_size\":8,\"steps\":12,\"optimizer\":{\"type\":\"adam\","
                      "\"lr\":0.01},\"seed\":6,\"data_seed\":2%s}";
    write_spec(b16, sizeof b16, "b16.json", fmt, "b16", mlp, ",\"precision\":\"bf16\"");
    write_spec(f32, sizeof f32, "f32.json", fmt, "f32", mlp, "");
    snprintf(out, sizeof out, "%s/out-bf16", root);
    result r = run(data_dir, "--out", out, "--no-eval", b16, f32, NULL);
    if (r.rc != 0) fprintf(stderr, "stderr:\n%s\n", r.err);
    CHECK_INT_EQ(r.rc, 0);
    events ev = parse_events(r.out);
    json_t *sel[MAX_LINES];
    CHECK_INT_EQ(select_events(&ev, "b16", "done", sel), 1);
    CHECK_INT_EQ(ev_int(sel[0], "step"), 12);
    char pb[1300], pf[1300];
    snprintf(pb, sizeof pb, "%s/b16.safetensors", out);
    snprintf(pf, sizeof pf, "%s/f32.safetensors", out);
    double d = max_abs_diff(pb, pf);
    printf("bf16: 12 steps end %.3g away from the fp32 run's weights\n", d);
    CHECK(d > 1e-5 && d < 0.05);
    events_free(&ev);
    result_free(&r);
}

static void test_determinism(void)
{
    char spec[1200], out[1200];
    snprintf(out, sizeof out, "%s/out-det", root);
    double l[4][64];
    int n[4];
    /* 16 steps = two epochs of 8 batches; all steps logged */
    const char *fmt = "{\"name\":\"det\",\"dataset\":\"fashion-mnist\",\"model\":%s,"
                      "\"batch_size\":8,\"steps\":16,\"optimizer\":{\"type\":\"sgd\",\"lr\":0.05},"
                      "\"seed\":8,\"data_seed\":%d,\"data\":{\"shuffle\":%s}}";
    struct {
        int data_seed;
        const char *shuffle;
    } runs[4] = {{5, "false"}, {9, "false"}, {5, "true"}, {9, "true"}};
    for (int k = 0; k < 4; k++) {
        write_spec(spec, sizeof spec, "det.json", fmt, mlp, runs[k].data_seed, runs[k].shuffle);
        double again[64];
        for (int rep = 0; rep < 2; rep++) {
            result r = run(data_dir, "--out", out, "--log-every", "1", spec, NULL);
            CHECK_INT_EQ(r.rc, 0);
            int m = step_losses(r.out, rep ? again : l[k], 64);
            CHECK_INT_EQ(m, 16);
            n[k] = m;
            result_free(&r);
        }
        for (int i = 0; i < n[k]; i++)
            CHECK(again[i] == l[k][i]); /* bit for bit */
    }
    int same_false = 1, same_true = 1, same_mode = 1;
    for (int i = 0; i < 16; i++) {
        same_false &= l[0][i] == l[1][i];
        same_true &= l[2][i] == l[3][i];
        same_mode &= l[0][i] == l[2][i];
    }
    CHECK(same_false); /* no shuffling: data_seed plays no part */
    CHECK(!same_true); /* shuffling follows data_seed */
    CHECK(!same_mode); /* and differs from the file order */
    printf("determinism: repeated runs identical; shuffle=false ignores data_seed, "
           "shuffle=true follows it\n");
}

/* --devices 2: the array trains data-parallel over two CPU devices, the
 * batch's halves summed, so its losses follow one device's within rounding
 * but not bit for bit; repeated runs are bit for bit the same; a batch
 * smaller than the devices is refused with nothing written. */
static void test_devices(void)
{
    char spec[1200], out[1200];
    snprintf(out, sizeof out, "%s/out-devices", root);
    const char *fmt = "{\"name\":\"dev\",\"dataset\":\"fashion-mnist\",\"model\":%s,"
                      "\"batch_size\":%d,\"steps\":16,\"optimizer\":{\"type\":\"adam\","
                      "\"lr\":0.01},\"seed\":8}";
    write_spec(spec, sizeof spec, "dev.json", fmt, mlp, 8);
    double one[64], two[2][64];
    result r = run(data_dir, "--out", out, "--log-every", "1", spec, NULL);
    CHECK_INT_EQ(r.rc, 0);
    CHECK_INT_EQ(step_losses(r.out, one, 64), 16);
    result_free(&r);
    for (int rep = 0; rep < 2; rep++) {
        r = run(data_dir, "--out", out, "--log-every", "1", "--devices", "2", spec, NULL);
        CHECK_INT_EQ(r.rc, 0);
        CHECK_INT_EQ(step_losses(r.out, two[rep], 64), 16);
        result_free(&r);
    }
    bool differs = false;
    for (int i = 0; i < 16; i++) {
        CHECK(two[0][i] == two[1][i]);
        CHECK(fabs(two[0][i] - one[i]) <= 1e-4 * fabs(one[i]));
        differs |= two[0][i] != one[i];
    }
    CHECK(differs); /* the halves were summed: the run was data-parallel */
    write_spec(spec, sizeof spec, "dev-small.json", fmt, mlp, 2);
    char bad_out[1200];
    snprintf(bad_out, sizeof bad_out, "%s/out-devices-bad", root);
    r = run(data_dir, "--out", bad_out, "--devices", "4", spec, NULL);
    CHECK_INT_EQ(r.rc, 1);
    CHECK(strstr(r.err, "4 devices") != NULL && strstr(r.err, "batch_size 2") != NULL);
    CHECK(!et_exists(bad_out));
    result_free(&r);
    printf("--devices 2: losses within 1e-4 of one device, not equal, repeated runs identical; "
           "batch 2 on 4 devices refused\n");
}

/* A run that must fail: exit code rc, stderr naming the problem, --out untouched. */
static void expect_failure(const char *what, int rc, const char *const *needles,
                           const char *env_dir, const char *spec1, const char *spec2)
{
    char out[1200];
    snprintf(out, sizeof out, "%s/out-bad", root);
    result r = spec2 ? run(env_dir, "--out", out, spec1, spec2, NULL)
                     : run(env_dir, "--out", out, spec1, NULL);
    if (r.rc != rc) fprintf(stderr, "%s: stdout:\n%s\nstderr:\n%s\n", what, r.out, r.err);
    CHECK_INT_EQ(r.rc, rc);
    expect_text(what, r.err, needles);
    if (et_exists(out)) {
        fprintf(stderr, "%s: %s was created (%d entries)\n", what, out, et_dir_entries(out));
        abort();
    }
    CHECK_STR_EQ(r.out, "");
    char first[200];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(r.err, "\n"), r.err);
    printf("%-28s exit %d: %s\n", what, r.rc, first);
    result_free(&r);
}

static void test_bad_specs(void)
{
    char good[1200], path[1200], missing[1200];
    write_spec(good, sizeof good, "good.json",
               "{\"name\":\"good\",\"dataset\":\"fashion-mnist\",\"model\":%s,\"batch_size\":8,"
               "\"steps\":2,\"optimizer\":{\"type\":\"adam\",\"lr\":0.01}}",
               mlp);

    snprintf(missing, sizeof missing, "%s/no-such-spec.json", root);
    const char *n1[] = {"no-such-spec.json", "cannot open", NULL};
    expect_failure("missing spec file", 2, n1, data_dir, missing, NULL);
    expect_failure("good + missing spec file", 2, n1, data_dir, good, missing);

    write_spec(path, sizeof path, "malformed.json", "{\"name\": \"x\", \"dataset\": ");
    const char *n2[] = {"malformed.json", "json_syntax", NULL};
    expect_failure("malformed JSON", 2, n2, data_dir, path, NULL);
    expect_failure("good + malformed JSON", 2, n2, data_dir, good, path);

    write_spec(path, sizeof path, "unknown.json",
               "{\"name\":\"u\",\"dataset\":\"fashion-mnist\",\"model\":%s,\"batch_size\":8,"
               "\"steps\":2,\"optimizer\":{\"type\":\"adam\",\"lr\":0.01},\"colour\":\"red\"}",
               mlp);
    const char *n3[] = {"unknown.json", "colour", "unknown_field", NULL};
    expect_failure("unknown field", 2, n3, data_dir, path, NULL);

    write_spec(path, sizeof path, "shape.json",
               "{\"name\":\"s\",\"dataset\":\"fashion-mnist\",\"model\":{\"input\":[1,6,6],"
               "\"layers\":[{\"type\":\"linear\",\"out\":4}]},\"batch_size\":8,\"steps\":2,"
               "\"optimizer\":{\"type\":\"adam\",\"lr\":0.01}}");
    const char *n4[] = {"shape.json", "shape_mismatch", "layers[0]", NULL};
    expect_failure("shape mismatch", 2, n4, data_dir, path, NULL);

    /* valid specs the data cannot serve */
    write_spec(path, sizeof path, "cifar.json",
               "{\"name\":\"c\",\"dataset\":\"cifar10\",\"model\":%s,\"batch_size\":8,"
               "\"steps\":2,\"optimizer\":{\"type\":\"adam\",\"lr\":0.01}}",
               mlp);
    const char *n5[] = {"unknown dataset", "cifar10", NULL};
    expect_failure("unknown dataset", 1, n5, data_dir, path, NULL);

    const char *n6[] = {"not found", empty_dir, NULL};
    expect_failure("missing dataset files", 1, n6, empty_dir, good, NULL);

    write_spec(path, sizeof path, "misfit.json",
               "{\"name\":\"m\",\"dataset\":\"fashion-mnist\",\"model\":{\"input\":[1,5,5],"
               "\"layers\":[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":4}]},"
               "\"batch_size\":8,\"steps\":2,\"optimizer\":{\"type\":\"adam\",\"lr\":0.01}}");
    const char *n7[] = {"6 x 6", "25", NULL};
    expect_failure("dataset does not fit", 1, n7, data_dir, path, NULL);

    write_spec(path, sizeof path, "few.json",
               "{\"name\":\"f\",\"dataset\":\"fashion-mnist\",\"model\":{\"input\":[1,6,6],"
               "\"layers\":[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":3}]},"
               "\"batch_size\":8,\"steps\":2,\"optimizer\":{\"type\":\"adam\",\"lr\":0.01}}");
    const char *n8[] = {"4 classes", "3 outputs", NULL};
    expect_failure("too few outputs", 1, n8, data_dir, path, NULL);

    /* init files that cannot be used */
    char init[1200], extra[1400];
    snprintf(init, sizeof init, "%s/corrupt.safetensors", root);
    spit(init, "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":", 13);
    snprintf(extra, sizeof extra, ",\"init\":\"%s\"", init);
    write_spec(path, sizeof path, "corrupt-init.json", one_step_spec, "ci", mlp, extra);
    const char *n9[] = {"corrupt.safetensors", "bad_checkpoint", NULL};
    expect_failure("corrupt init file", 1, n9, data_dir, path, NULL);

    snprintf(init, sizeof init, "%s/wrong-shape.safetensors", root);
    write_init(init, true);
    snprintf(extra, sizeof extra, ",\"init\":\"%s\"", init);
    write_spec(path, sizeof path, "shape-init.json", one_step_spec, "si", mlp, extra);
    const char *n10[] = {"3.weight", "[3, 16]", "[4, 16]", NULL};
    expect_failure("init with a wrong shape", 1, n10, data_dir, path, NULL);

    snprintf(init, sizeof init, "%s/absent.safetensors", root);
    snprintf(extra, sizeof extra, ",\"init\":\"%s\"", init);
    write_spec(path, sizeof path, "absent-init.json", one_step_spec, "ai", mlp, extra);
    const char *n11[] = {"absent.safetensors", NULL};
    expect_failure("missing init file", 1, n11, data_dir, path, NULL);
}

static void test_bad_flags(void)
{
    char good[1200], out[1200];
    snprintf(good, sizeof good, "%s/good.json", root);
    snprintf(out, sizeof out, "%s/out-flags", root);
    const struct {
        const char *a, *b, *needle;
    } cases[] = {
        {"--threads", "0", "--threads"},     {"--threads", "many", "--threads"},
        {"--log-every", "x", "--log-every"}, {"--log-every", "-1", "--log-every"},
        {"--backend", "tpu", "tpu"},         {"--frobnicate", NULL, "usage"},
        {"--devices", "0", "--devices"},     {"--devices", "65", "--devices"},
        {"--devices", "two", "--devices"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        result r = cases[i].b ? run(data_dir, "--out", out, cases[i].a, cases[i].b, good, NULL)
                              : run(data_dir, "--out", out, cases[i].a, good, NULL);
        if (r.rc != 2) fprintf(stderr, "%s %s: stderr:\n%s\n", cases[i].a, cases[i].b, r.err);
        CHECK_INT_EQ(r.rc, 2);
        const char *needles[] = {cases[i].needle, NULL};
        expect_text(cases[i].a, r.err, needles);
        CHECK(!et_exists(out));
        result_free(&r);
    }
    result r = run(data_dir, "--out", out, NULL); /* no spec */
    CHECK_INT_EQ(r.rc, 2);
    CHECK(strstr(r.err, "usage") != NULL);
    result_free(&r);
    r = run(data_dir, "--help", NULL);
    CHECK_INT_EQ(r.rc, 0);
    CHECK(strstr(r.out, "usage") != NULL);
    result_free(&r);
    CHECK(!et_exists(out));
    printf("bad flags: --threads 0/many, --log-every x/-1, --backend tpu, --devices 0/65/two, "
           "unknown option, no spec: exit 2\n");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    double t0 = et_now();
    const char *bdir = getenv("FB_BINARY_DIR");
    if (bdir && *bdir) {
        snprintf(bin, sizeof bin, "%s/workers/fusebox-train", bdir);
    } else {
        /* run by hand: <build>/tests/engine/this -> <build>/workers/fusebox-train */
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        CHECK(n > 0);
        self[n] = '\0';
        for (int k = 0; k < 3; k++)
            *strrchr(self, '/') = '\0';
        snprintf(bin, sizeof bin, "%s/workers/fusebox-train", self);
    }
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "%s is not an executable; build the fusebox-train target\n", bin);
        return 1;
    }
    et_tmpdir(root, sizeof root, "cli");
    snprintf(data_dir, sizeof data_dir, "%s/data", root);
    snprintf(empty_dir, sizeof empty_dir, "%s/empty-data", root);
    CHECK(mkdir(data_dir, 0755) == 0 && mkdir(empty_dir, 0755) == 0);
    write_dataset(data_dir);
    /* the run must not depend on where it is started from */
    CHECK(chdir(root) == 0);

    test_good_run();
    test_metric_names();
    test_init();
    test_bf16_run();
    test_determinism();
    test_devices();
    test_bad_specs();
    test_bad_flags();

    CHECK(chdir("/") == 0);
    et_rmtree(root);
    printf("total %.2f s\n", et_now() - t0);
    (void)argc;
    (void)argv;
    return 0;
}
