/*
 * Training through the loader: a small image dataset (IDX files of 6x6
 * images, 4 classes) is also imported as a shard dataset, then
 *   - with data.shuffle false, fb_train_run over the shards (loader) gives
 *     bit-identical losses and final test metrics to the in-memory IDX path
 *     (both read file order);
 *   - with data.shuffle true the result follows data_seed only: the same for
 *     1 and 3 reader threads and with staging, different for another seed;
 *   - every step event carries a finite, non-negative io_wait_ms;
 *   - fusebox-train trains a spec whose dataset names the shard directory,
 *     prints io_ms in its JSON lines, and stages with --stage.
 */
#include "data_util.h"

#include <math.h>
#include <sys/wait.h>

#include "jobspec.h"
#include "kernels.h"
#include "train.h"

#define SIDE 6
#define N_TRAIN 256
#define N_TEST 64
#define CLASSES 4
#define STEPS 24

static char g_dir[512], g_idx_root[1024], g_shard_root[1024];
static char g_msg[1024];

static void write_idx(const char *path, int ndim, const uint32_t *dims, const uint8_t *body,
                      size_t len)
{
    uint8_t hdr[16] = {0, 0, 0x08, (uint8_t)ndim};
    for (int i = 0; i < ndim; i++)
        for (int k = 0; k < 4; k++) hdr[4 + 4 * i + k] = (uint8_t)(dims[i] >> (24 - 8 * k));
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(hdr, 1, 4 + 4 * (size_t)ndim, f) == 4 + 4 * (size_t)ndim);
    CHECK(fwrite(body, 1, len, f) == len);
    CHECK(fclose(f) == 0);
}

/* Images whose class is the brightest quadrant, plus noise. */
static void make_split(const char *dir, const char *prefix, int n, uint64_t seed)
{
    uint8_t *px = malloc((size_t)n * SIDE * SIDE), *lab = malloc((size_t)n);
    CHECK(px && lab);
    uint64_t s = seed;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        int c = (int)(s >> 60) % CLASSES;
        lab[i] = (uint8_t)c;
        for (int y = 0; y < SIDE; y++)
            for (int x = 0; x < SIDE; x++) {
                s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                int q = (y >= SIDE / 2) * 2 + (x >= SIDE / 2);
                px[i * SIDE * SIDE + y * SIDE + x] =
                    (uint8_t)((q == c ? 150 : 20) + (int)(s >> 58));
            }
    }
    char p[1200];
    uint32_t di[3] = {(uint32_t)n, SIDE, SIDE}, dl[1] = {(uint32_t)n};
    snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", dir, prefix);
    write_idx(p, 3, di, px, (size_t)n * SIDE * SIDE);
    snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte", dir, prefix);
    write_idx(p, 1, dl, lab, (size_t)n);
    free(px);
    free(lab);
}

static fb_job_spec *spec(const char *dataset, bool shuffle, int data_seed)
{
    char json[2048];
    snprintf(json, sizeof json,
             "{\"name\": \"m\", \"dataset\": \"%s\", \"model\": {\"input\": [1, %d, %d], "
             "\"layers\": [{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 16}, "
             "{\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": %d}]}, "
             "\"batch_size\": 32, \"steps\": %d, \"optimizer\": {\"type\": \"adam\", \"lr\": "
             "0.01}, \"seed\": 3, \"data_seed\": %d, \"data\": {\"shuffle\": %s}, "
             "\"eval_every\": 0}",
             dataset, SIDE, SIDE, CLASSES, STEPS, data_seed, shuffle ? "true" : "false");
    fb_job_spec *s = calloc(1, sizeof *s);
    CHECK(s != NULL);
    int rc = fb_job_spec_parse(json, strlen(json), NULL, s, g_msg, sizeof g_msg);
    if (rc) fprintf(stderr, "spec: %s\n", g_msg);
    CHECK_INT_EQ(rc, 0);
    return s;
}

typedef struct trace {
    double loss[STEPS];
    double io[STEPS];
    int n;
} trace;

static void on_event(const fb_train_event *ev, void *user)
{
    trace *t = user;
    if (ev->kind != FB_TRAIN_STEP) return;
    CHECK(t->n < STEPS);
    t->loss[t->n] = ev->loss;
    t->io[t->n] = ev->io_wait_ms;
    t->n++;
}

/* Trains one member (the spec's val_fraction held out of train); returns its loss trace and
 * final validation loss/accuracy. */
static trace train(const char *root, const char *dataset, bool shuffle, int seed, int threads,
                   const char *stage, double *tl, double *ta)
{
    fb_job_spec *s = spec(dataset, shuffle, seed);
    fb_dataset tr = {0}, va = {0}, te = {0};
    fb_loader *l = NULL;
    fb_data_source_opts so = {.batch_size = s->batch_size, .shuffle = s->shuffle,
                              .data_seed = s->data_seed, .threads = threads, .cache_dir = stage,
                              .cache_bytes = 1 << 30, .want_test = true, .want_val = true,
                              .val_fraction = s->val_fraction};
    int rc = fb_data_open_named(&tr, &va, &te, &l, dataset, root, &so, g_msg, sizeof g_msg);
    if (rc) fprintf(stderr, "open: %s\n", g_msg);
    CHECK_INT_EQ(rc, 0);
    CHECK(s->val_fraction == 0.1);
    CHECK_INT_EQ(tr.n, fb_data_kept_count(N_TRAIN, s->val_fraction));
    CHECK_INT_EQ(va.n, N_TRAIN - tr.n);
    CHECK(va.n > 0);
    CHECK_INT_EQ(te.n, N_TEST);
    trace t = {.n = 0};
    fb_train_opts o = {.log_every = 1, .cb = on_event, .user = &t, .loader = l, .test = &te};
    const fb_job_spec *specs[1] = {s};
    rc = fb_train_run(fb_backend_cpu_ref(), specs, 1, &tr, &va, &o, tl, ta, g_msg, sizeof g_msg);
    if (rc) fprintf(stderr, "train: %s\n", g_msg);
    CHECK_INT_EQ(rc, 0);
    CHECK_INT_EQ(t.n, STEPS);
    for (int i = 0; i < STEPS; i++) CHECK(isfinite(t.io[i]) && t.io[i] >= 0);
    fb_loader_free(l);
    fb_dataset_free(&tr);
    fb_dataset_free(&va);
    fb_dataset_free(&te);
    fb_job_spec_free(s);
    free(s);
    return t;
}

static void run_cli(const char *bin, const char *root, const char *specf, const char *stage,
                    char **out)
{
    char po[1200];
    snprintf(po, sizeof po, "%s/train-out.txt", g_dir);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int fd = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 1) < 0) _exit(126);
        if (stage)
            execl(bin, bin, "--json", "--no-out", "--log-every", "4", "--data-dir", root,
                  "--data-threads", "2", "--stage", stage, specf, (char *)NULL);
        else
            execl(bin, bin, "--json", "--no-out", "--log-every", "4", "--data-dir", root, specf,
                  (char *)NULL);
        _exit(127);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st));
    CHECK_INT_EQ(WEXITSTATUS(st), 0);
    size_t len;
    *out = (char *)du_read(po, &len);
}

int main(void)
{
    du_scratch(g_dir, sizeof g_dir, "train");
    char p[1200];
    /* the IDX dataset must be called fashion-mnist for fb_dataset_open_named */
    snprintf(g_idx_root, sizeof g_idx_root, "%s/idx", g_dir);
    snprintf(p, sizeof p, "%s/fashion-mnist", g_idx_root);
    CHECK(mkdir(g_idx_root, 0755) == 0 && mkdir(p, 0755) == 0);
    make_split(p, "train", N_TRAIN, 1);
    make_split(p, "t10k", N_TEST, 2);
    snprintf(g_shard_root, sizeof g_shard_root, "%s/shards", g_dir);
    CHECK(mkdir(g_shard_root, 0755) == 0);
    static const char *const splits[][2] = {{"train", "train"}, {"t10k", "test"}};
    for (int i = 0; i < 2; i++) {
        char im[1300], lb[1300], out[1300];
        snprintf(im, sizeof im, "%s/%s-images-idx3-ubyte", p, splits[i][0]);
        snprintf(lb, sizeof lb, "%s/%s-labels-idx1-ubyte", p, splits[i][0]);
        snprintf(out, sizeof out, "%s/toy", g_shard_root);
        fb_import_opts o = {.out_dir = out, .name = "toy", .split = splits[i][1],
                            .chunk_records = 10, .shard_records = 100};
        CHECK_INT_EQ(fb_datadir_import_idx(NULL, &o, im, lb, g_msg, sizeof g_msg), 0);
    }

    /* file order: shards through the loader == IDX in memory, bit for bit */
    double l0, a0, l1, a1;
    trace ti = train(g_idx_root, "fashion-mnist", false, 0, 0, NULL, &l0, &a0);
    trace ts = train(g_shard_root, "toy", false, 0, 2, NULL, &l1, &a1);
    CHECK(memcmp(ti.loss, ts.loss, sizeof ti.loss) == 0);
    CHECK(l0 == l1 && a0 == a1);
    CHECK(ts.loss[STEPS - 1] < ts.loss[0]); /* it learns */

    /* shuffled: a function of data_seed only */
    char stage[1200];
    snprintf(stage, sizeof stage, "%s/stage", g_dir);
    trace s1 = train(g_shard_root, "toy", true, 5, 1, NULL, &l0, &a0);
    trace s3 = train(g_shard_root, "toy", true, 5, 3, stage, &l1, &a1);
    CHECK(memcmp(s1.loss, s3.loss, sizeof s1.loss) == 0);
    CHECK(l0 == l1 && a0 == a1);
    trace s6 = train(g_shard_root, "toy", true, 6, 2, stage, &l1, &a1);
    CHECK(memcmp(s1.loss, s6.loss, sizeof s1.loss) != 0);
    CHECK(memcmp(s1.loss, ts.loss, sizeof s1.loss) != 0);
    CHECK(fb_stage_cache_bytes(stage) > 0);

    /* an unknown name: the message names both kinds of dataset */
    fb_dataset tr = {0}, va = {0}, te = {0};
    fb_loader *l = NULL;
    fb_data_source_opts so = {.batch_size = 32};
    CHECK_INT_EQ(fb_data_open_named(&tr, &va, &te, &l, "cifar10", g_shard_root, &so, g_msg,
                                    sizeof g_msg),
                 FB_ERR_DATA);
    CHECK_CONTAINS(g_msg, "unknown dataset \"cifar10\"");
    CHECK_CONTAINS(g_msg, "manifest.json");

    /* the fusebox-train command */
    const char *bd = getenv("FB_BINARY_DIR");
    char bin[1200], specf[1200];
    snprintf(bin, sizeof bin, "%s/workers/fusebox-train", bd ? bd : ".");
    struct stat st;
    if (stat(bin, &st) == 0) {
        snprintf(specf, sizeof specf, "%s/spec.json", g_dir);
        char json[2048];
        snprintf(json, sizeof json,
                 "{\"name\": \"cli\", \"dataset\": \"toy\", \"model\": {\"input\": [1, %d, %d], "
                 "\"layers\": [{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": %d}]}, "
                 "\"batch_size\": 32, \"steps\": 12, \"optimizer\": {\"type\": \"sgd\", \"lr\": "
                 "0.1}}",
                 SIDE, SIDE, CLASSES);
        du_write(specf, json, strlen(json));
        char *out = NULL, stage2[1300];
        run_cli(bin, g_shard_root, specf, NULL, &out);
        CHECK_CONTAINS(out, "\"io_ms\":");
        CHECK_CONTAINS(out, "\"event\":\"done\"");
        free(out);
        snprintf(stage2, sizeof stage2, "%s/stage2", g_dir);
        run_cli(bin, g_shard_root, specf, stage2, &out);
        CHECK_CONTAINS(out, "\"io_ms\":");
        CHECK(fb_stage_cache_bytes(stage2) > 0);
        free(out);
    } else {
        fb_test_missing("the command part: %s is not built (ninja fusebox-train)", bin);
    }
    du_rm_rf(g_dir);
    printf("test_train_shards: ok\n");
    return 0;
}
