/*
 * A token model through fusebox-train end to end: the real binaries, real
 * files.
 *
 * fusebox-data imports the built-in licence corpus as a byte-level token
 * dataset (import text --builtin licenses: records of T + 1 = 17 bytes,
 * vocab 256, no labels) for training and the MPL-2.0 text as its test
 * split; the GPL-3 text also goes in as a CSV of ids with labels (a float32
 * dataset whose values are ids, which token models take too).  Then:
 *   - a two-block character language model trains 80 steps through
 *     fusebox-train: the mean loss of the last 10 steps is at least 1.0
 *     below the first step's (ln 256 = 5.5 at the start), the done event
 *     carries a finite test loss and accuracy, and the weights file carries
 *     PyTorch names and shapes ("2.attn.in_proj_weight" [96, 32], ...);
 *   - a dataset that does not fit the model exits 1 before training, with a
 *     message naming the problem: records of the wrong length for T (a
 *     language model reads T + 1), a vocabulary larger than the model's, ids
 *     at or beyond the model's vocab, an image (uint8) dataset of the right
 *     length, a pooled classifier on a dataset without labels.
 */
#include "engine_util.h"

#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <sys/wait.h>

#define T 16
#define CORPUS "/usr/share/common-licenses/GPL-3"

static char root[512], data_dir[1024], train_bin[PATH_MAX], data_bin[PATH_MAX];

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    CHECK(n >= 0);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    CHECK(buf);
    CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

typedef struct result {
    int rc;
    char *out, *err;
} result;

/* Runs argv[0] with FUSEBOX_DATA_DIR set, stdout and stderr into files. */
static result run(const char *const *argv)
{
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
        setenv(FB_DATASET_DIR_ENV, data_dir, 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    result r = {.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status),
                .out = slurp(out_path), .err = slurp(err_path)};
    return r;
}

static void result_free(result *r)
{
    free(r->out);
    free(r->err);
}

/* Records of T + 1 bytes of text from offset lo, every T bytes, up to hi, as a
 * CSV of ids and a label column, imported as split of dataset "licence-lm". */
/* The licence corpus (train) and another licence (test) as the token dataset "licenses". */
static void import_text(void)
{
    char out[1200], ctx[16];
    snprintf(out, sizeof out, "%s/licenses", data_dir);
    snprintf(ctx, sizeof ctx, "%d", T);
    const char *a1[] = {data_bin, "import", "text", "--builtin", "licenses", "--context", ctx,
                        "--out", out, "--name", "licenses", "--split", "train", NULL};
    const char *a2[] = {data_bin, "import", "text", "/usr/share/common-licenses/MPL-2.0",
                        "--context", ctx, "--out", out, "--name", "licenses", "--split", "test",
                        NULL};
    for (int k = 0; k < 2; k++) {
        result r = run(k ? a2 : a1);
        if (r.rc != 0) fprintf(stderr, "fusebox-data: %s\n", r.err);
        CHECK_INT_EQ(r.rc, 0);
        result_free(&r);
    }
}

static void import_split(const char *text, size_t lo, size_t hi, const char *split)
{
    char csv[1200], out[1200];
    snprintf(csv, sizeof csv, "%s/%s.csv", root, split);
    snprintf(out, sizeof out, "%s/licence-lm", data_dir);
    FILE *f = fopen(csv, "w");
    CHECK(f != NULL);
    int records = 0;
    for (size_t s = lo; s + T + 1 <= hi; s += T, records++) {
        for (int t = 0; t <= T; t++) fprintf(f, "%d,", (unsigned char)text[s + t]);
        fprintf(f, "%d\n", records % 2); /* labels the language model does not read */
    }
    CHECK(fclose(f) == 0);
    const char *argv[] = {data_bin, "import", "csv", csv, "--label-column", "17", "--no-header",
                          "--out", out, "--name", "licence-lm", "--split", split, NULL};
    result r = run(argv);
    if (r.rc != 0) fprintf(stderr, "fusebox-data: %s\n", r.err);
    CHECK_INT_EQ(r.rc, 0);
    printf("imported %s: %d records of %d tokens\n", split, records, T + 1);
    result_free(&r);
}

/* An image dataset of 1 x 17 uint8 pixels (IDX, imported as shards "images"): the right
 * length for T = 16, but images, not tokens. */
static void import_images(void)
{
    enum { n = 64, W = T + 1 };
    char img[1200], lab[1200], out[1200];
    snprintf(img, sizeof img, "%s/img.idx", root);
    snprintf(lab, sizeof lab, "%s/lab.idx", root);
    snprintf(out, sizeof out, "%s/images", data_dir);
    uint8_t hi[16] = {0, 0, 8, 3, 0, 0, 0, n, 0, 0, 0, 1, 0, 0, 0, W}, hl[8] = {0, 0, 8, 1, 0, 0, 0, n};
    FILE *f = fopen(img, "wb");
    CHECK(f && fwrite(hi, 1, sizeof hi, f) == sizeof hi);
    for (int i = 0; i < n * W; i++) fputc((i * 37) & 0xff, f);
    CHECK(fclose(f) == 0);
    f = fopen(lab, "wb");
    CHECK(f && fwrite(hl, 1, sizeof hl, f) == sizeof hl);
    for (int i = 0; i < n; i++) fputc(i % 2, f);
    CHECK(fclose(f) == 0);
    for (int k = 0; k < 2; k++) {
        const char *argv[] = {data_bin, "import", "idx", "--images", img, "--labels", lab,
                              "--out", out, "--name", "images", "--split", k ? "test" : "train",
                              NULL};
        result r = run(argv);
        if (r.rc != 0) fprintf(stderr, "fusebox-data: %s\n", r.err);
        CHECK_INT_EQ(r.rc, 0);
        result_free(&r);
    }
}

static void write_spec_on(const char *path, const char *dataset, int tokens, int vocab, int steps)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fprintf(f,
            "{\"name\":\"charlm\",\"dataset\":\"%s\",\"model\":{\"input\":{\"tokens\":%d,"
            "\"vocab\":%d},\"layers\":[{\"type\":\"embedding\",\"dim\":32},"
            "{\"type\":\"positional\"},{\"type\":\"transformer_block\",\"heads\":4},"
            "{\"type\":\"transformer_block\",\"heads\":4},{\"type\":\"layernorm\"},"
            "{\"type\":\"linear\",\"out\":%d}]},\"batch_size\":16,\"steps\":%d,"
            "\"optimizer\":{\"type\":\"adamw\",\"lr\":0.003},\"schedule\":{\"warmup_steps\":5},"
            "\"seed\":1,\"val_fraction\":0.1}",
            dataset, tokens, vocab, vocab, steps);
    CHECK(fclose(f) == 0);
}

static void write_spec(const char *path, int tokens, int vocab, int steps)
{
    write_spec_on(path, "licenses", tokens, vocab, steps);
}

static void test_train(void)
{
    char spec[1200], out[1200], weights[1400];
    snprintf(spec, sizeof spec, "%s/charlm.json", root);
    snprintf(out, sizeof out, "%s/out", root);
    write_spec(spec, T, 256, 80);
    const char *argv[] = {train_bin, spec, "--log-every", "1", "--out", out, NULL};
    result r = run(argv);
    if (r.rc != 0) fprintf(stderr, "fusebox-train: %s\n", r.err);
    CHECK_INT_EQ(r.rc, 0);
    double loss[80];
    int n = 0;
    json_t *done = NULL;
    for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t jerr;
        json_t *o = json_loads(line, 0, &jerr);
        CHECK(o != NULL);
        const char *ev = json_string_value(json_object_get(o, "event"));
        if (ev && strcmp(ev, "step") == 0 && n < 80) {
            loss[n++] = json_number_value(json_object_get(o, "loss"));
            json_decref(o);
        } else if (ev && strcmp(ev, "done") == 0) {
            done = o;
        } else {
            json_decref(o);
        }
    }
    CHECK(n >= 60);
    double last = 0;
    for (int i = n - 10; i < n; i++) last += loss[i] / 10;
    printf("loss %.4f at step 1, %.4f over the last 10 of %d steps\n", loss[0], last, n);
    CHECK(loss[0] > 4.5 && loss[0] < 6.5); /* about ln 256 from a fresh model */
    CHECK(last < loss[0] - 1.0);
    CHECK(done != NULL);
    double tl = json_number_value(json_object_get(done, "test_loss"));
    double ta = json_number_value(json_object_get(done, "test_accuracy"));
    printf("test loss %.4f, test accuracy %.4f\n", tl, ta);
    CHECK(isfinite(tl) && tl > 0 && tl < loss[0]);
    CHECK(ta > 0 && ta <= 1);
    json_decref(done);
    result_free(&r);

    snprintf(weights, sizeof weights, "%s/charlm.safetensors", out);
    fb_st_file *f = et_st_open(weights);
    static const struct {
        const char *name;
        int64_t d0, d1;
    } want[] = {{"0.weight", 256, 32},          {"1.weight", 16, 32},
                {"2.ln1.weight", 32, 0},        {"2.attn.in_proj_weight", 96, 32},
                {"2.attn.in_proj_bias", 96, 0}, {"3.attn.out_proj.weight", 32, 32},
                {"3.mlp.0.weight", 128, 32},    {"3.mlp.2.weight", 32, 128},
                {"4.weight", 32, 0},            {"5.weight", 256, 32}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const fb_st_tensor *t = fb_st_find(f, want[i].name);
        if (!t) fprintf(stderr, "weights file lacks %s\n", want[i].name);
        CHECK(t != NULL);
        CHECK_INT_EQ(t->ndim, want[i].d1 ? 2 : 1);
        CHECK_INT_EQ(t->shape[0], want[i].d0);
        if (want[i].d1) CHECK_INT_EQ(t->shape[1], want[i].d1);
    }
    fb_st_close(f);
}

static void test_mismatch(void)
{
    static const struct {
        const char *what, *dataset;
        int tokens, vocab;
        const char *needle;
    } cases[] = {
        {"T + 1 != record", "licence-lm", 20, 256, "reads records of 21 tokens"},
        {"T + 1 = 18", "licence-lm", 17, 256, "reads records of 18 tokens"},
        {"vocab too small", "licenses", T, 100,
         "dataset licenses has a vocabulary of 256 tokens; the model's model.input.vocab is 100"},
        {"ids beyond vocab (float32 ids)", "licence-lm", T, 100,
         "not a token id below the model's vocab 100"},
        {"image dataset", "images", T, 256, "dataset images holds uint8 samples (images)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char spec[1200], out[1200];
        snprintf(spec, sizeof spec, "%s/bad.json", root);
        snprintf(out, sizeof out, "%s/bad-out", root);
        write_spec_on(spec, cases[i].dataset, cases[i].tokens, cases[i].vocab, 10);
        const char *argv[] = {train_bin, spec, "--log-every", "1", "--out", out, NULL};
        result r = run(argv);
        printf("%s -> exit %d: %s", cases[i].what, r.rc, r.err);
        CHECK_INT_EQ(r.rc, 1);
        CHECK(strstr(r.err, cases[i].needle) != NULL);
        CHECK(!et_exists(out) || et_dir_entries(out) == 0);
        result_free(&r);
    }
}

/* A pooled classifier on the label-less corpus. */
static void test_pool_without_labels(void)
{
    char spec[1200], out[1200];
    snprintf(spec, sizeof spec, "%s/pool.json", root);
    snprintf(out, sizeof out, "%s/pool-out", root);
    FILE *f = fopen(spec, "w");
    CHECK(f != NULL);
    fprintf(f, "{\"dataset\":\"licenses\",\"model\":{\"input\":{\"tokens\":17,\"vocab\":256},"
               "\"layers\":[{\"type\":\"embedding\",\"dim\":8},{\"type\":\"pool\"},"
               "{\"type\":\"linear\",\"out\":2}]},\"batch_size\":4,\"steps\":2,"
               "\"optimizer\":{\"type\":\"adam\",\"lr\":0.001}}");
    CHECK(fclose(f) == 0);
    const char *argv[] = {train_bin, spec, "--out", out, NULL};
    result r = run(argv);
    printf("pool on a label-less dataset -> exit %d: %s", r.rc, r.err);
    CHECK_INT_EQ(r.rc, 1);
    CHECK(strstr(r.err, "dataset licenses (train) has no labels") != NULL);
    result_free(&r);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *bdir = getenv("FB_BINARY_DIR");
    char self[PATH_MAX];
    if (bdir && *bdir) {
        snprintf(self, sizeof self, "%s", bdir);
    } else {
        /* run by hand: <build>/tests/engine/this */
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        CHECK(n > 0);
        self[n] = '\0';
        for (int k = 0; k < 3; k++) *strrchr(self, '/') = '\0';
    }
    snprintf(train_bin, sizeof train_bin, "%s/workers/fusebox-train", self);
    snprintf(data_bin, sizeof data_bin, "%s/workers/data/fusebox-data", self);
    CHECK(access(train_bin, X_OK) == 0 && access(data_bin, X_OK) == 0);
    et_tmpdir(root, sizeof root, "tokens-cli");
    snprintf(data_dir, sizeof data_dir, "%s/data", root);
    CHECK(mkdir(data_dir, 0755) == 0);

    char *text = slurp(CORPUS);
    size_t len = strlen(text);
    CHECK(len > 20000);
    import_split(text, 0, len * 9 / 10, "train");
    import_split(text, len * 9 / 10, len, "test");
    import_images();
    import_text();
    free(text);
    CHECK(chdir(root) == 0);

    test_train();
    test_mismatch();
    test_pool_without_labels();

    CHECK(chdir("/") == 0);
    et_rmtree(root);
    return 0;
}
