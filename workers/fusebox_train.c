/*
 * fusebox-train: train one job spec, or many, locally without a server.
 *
 * Specs that share a fusion key train together as one fused array; groups
 * with different keys train one after another.  Progress goes to stdout: a
 * progress bar per member on a terminal, JSON lines (written by Jansson)
 * otherwise.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "data_parallel.h"
#include "datadir.h"
#include "device.h"
#include "idx.h"
#include "jobspec.h"
#include "kernels.h"
#include "train.h"
#include "utf8.h"

#define EXIT_USAGE 2

typedef struct cli {
    bool json;
    bool val, test; /* a validation set, a test split is evaluated: only then are its
                     * metrics reported */
    int group, n_groups;
    double *test_loss, *test_acc; /* [group member]: the final test evaluation */
} cli;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fusebox-train [options] SPEC.json [SPEC.json ...]\n"
            "\n"
            "Trains job specs locally. Specs with equal fusion keys train as one fused array.\n"
            "\n"
            "options:\n"
            "  --log-every N   report each member's step and loss every N steps (default 100;\n"
            "                  0 reports only the last step)\n"
            "  --out DIR       write final weights, and full-state checkpoints at each job's\n"
            "                  checkpoint_every, as safetensors to DIR\n"
            "                  (default: fusebox-out)\n"
            "  --no-out        do not write weights\n"
            "  --data-dir DIR  where datasets live (default: $FUSEBOX_DATA_DIR, else\n"
            "                  /usr/share/datasets); DIR/NAME/manifest.json makes NAME a shard\n"
            "                  dataset (docs/data-format.md), read by a prefetching loader\n"
            "  --data-threads N  loader reader threads for shard datasets (default 2)\n"
            "  --stage DIR     copy shard datasets to this node-local cache first, and read\n"
            "                  them from there (verified on every use)\n"
            "  --stage-bytes N  bound of the --stage cache in bytes (default 16 GiB)\n"
            "  --threads N     CPU threads for the math (default 1)\n"
            "  --window N      train up to N steps at a time, each few members through all\n"
            "                  of them while their state is in cache (default %d; 1 step at\n"
            "                  a time: 1); results and events are the same at every N\n"
            "  --devices N     train each array data-parallel over N CPU devices of this\n"
            "                  process, the batch split evenly, its gradients summed, as an\n"
            "                  array spanning N ranks of workers does (default 1: one device)\n"
            "  --backend NAME  cpu (default) or cpu-ref (the plain-C reference)\n"
            "  --json          JSON lines even on a terminal\n"
            "  --no-eval       skip validation and the test evaluation (no val_* or test_*\n"
            "                  metrics)\n"
            "  --version       print the version and exit\n"
            "  -h, --help      this text\n",
            FB_SESSION_DEFAULT_WINDOW);
}

/* Significant digits Jansson writes a number with: more than any format of
 * put_real keeps, fewer than a double's 17, so a value rounded to its
 * format reads as that format wrote it, without a binary tail. */
#define JSON_DIGITS 15

/* An integer member of a line.  Members keep the order they are added in
 * (Jansson keeps insertion order), which is the order of the event table. */
static void put_int(json_t *o, const char *key, long long v)
{
    json_object_set_new(o, key, json_integer(v));
}

/* A number rounded to the digits the printf format fmt keeps; null when it
 * is not finite, as JSON has no NaN or infinity. */
static void put_real(json_t *o, const char *key, double v, const char *fmt)
{
    if (!isfinite(v)) {
        json_object_set_new(o, key, json_null());
        return;
    }
    char buf[64];
    snprintf(buf, sizeof buf, fmt, v);
    json_object_set_new(o, key, json_real(strtod(buf, NULL)));
}

/* A string; a byte that is not UTF-8 (a path from the command line may hold
 * one, JSON text cannot) becomes U+FFFD. */
static void put_str(json_t *o, const char *key, const char *s)
{
    json_t *v = json_string(s);
    size_t n = strlen(s), at = 0, out = 0, bad;
    char *fixed = v ? NULL : malloc(3 * n + 1);
    if (fixed) {
        while (!fb_utf8_valid(s + at, n - at, &bad)) {
            memcpy(fixed + out, s + at, bad);
            memcpy(fixed + out + bad, "\xEF\xBF\xBD", 3);
            out += bad + 3;
            at += bad + 1;
        }
        memcpy(fixed + out, s + at, n - at + 1);
        v = json_string(fixed);
        free(fixed);
    }
    json_object_set_new(o, key, v);
}

/* One event as a JSON line: the keys of docs/jobspec.md's event table. */
static void print_json(const fb_train_event *ev, const cli *c, const char *kind)
{
    json_t *o = json_object();
    if (!o) return;
    put_str(o, "event", kind);
    put_str(o, "job", ev->spec->name);
    put_int(o, "member", ev->member);
    put_int(o, "group", c->group);
    put_int(o, "array_size", ev->array_size);
    put_int(o, "step", (long long)ev->step);
    put_int(o, "steps", (long long)ev->steps);
    /* the names of the metrics series (docs/jobspec.md, "Metrics"); without a
     * validation set a done event carries no val_*: its last step event has the
     * training values, and they must never pass for an evaluation */
    if (ev->kind == FB_TRAIN_STEP) {
        put_real(o, "loss", ev->loss, "%.9g");
        put_real(o, "accuracy", ev->accuracy, "%.6g");
        put_real(o, "lr", ev->lr, "%.9g");
        put_real(o, "samples_per_s", ev->samples_per_s, "%.1f");
        put_real(o, "io_ms", ev->io_wait_ms, "%.4f");
    } else if (ev->kind == FB_TRAIN_EVAL || (ev->kind == FB_TRAIN_DONE && c->val)) {
        put_real(o, "val_loss", ev->loss, "%.9g");
        put_real(o, "val_accuracy", ev->accuracy, "%.6g");
    }
    if (ev->kind == FB_TRAIN_DONE && c->test) {
        put_real(o, "test_loss", ev->test_loss, "%.9g");
        put_real(o, "test_accuracy", ev->test_accuracy, "%.6g");
    }
    if (ev->kind == FB_TRAIN_FAILED) {
        put_str(o, "error", fb_err_code(ev->err));
        put_str(o, "message", ev->text ? ev->text : "");
    }
    if (ev->weights_path) put_str(o, "weights", ev->weights_path);
    char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(JSON_DIGITS));
    json_decref(o);
    if (!line) {
        fprintf(stderr, "fusebox-train: out of memory writing an event\n");
        return;
    }
    puts(line);
    free(line);
}

static void on_event(const fb_train_event *ev, void *user)
{
    const cli *c = user;
    if (ev->kind == FB_TRAIN_DONE) {
        c->test_loss[ev->member] = ev->test_loss;
        c->test_acc[ev->member] = ev->test_accuracy;
    }
    static const char *const kinds[] = {[FB_TRAIN_STEP] = "step", [FB_TRAIN_EVAL] = "eval",
                                        [FB_TRAIN_DONE] = "done",
                                        [FB_TRAIN_CHECKPOINT] = "checkpoint",
                                        [FB_TRAIN_FAILED] = "failed"};
    if (c->json) {
        print_json(ev, c, kinds[ev->kind]);
        fflush(stdout);
        return;
    }
    if (ev->kind == FB_TRAIN_STEP) {
        int width = 24, fill = (int)(width * ev->step / (ev->steps ? ev->steps : 1));
        char bar[32];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '-';
        bar[width] = '\0';
        printf("%-20.20s [%s] %3d%%  step %lld/%lld  loss %.4f  lr %.3g  B=%d  %.0f samples/s"
               "  io %.2f ms\n",
               ev->spec->name, bar, (int)(100 * ev->step / (ev->steps ? ev->steps : 1)),
               (long long)ev->step, (long long)ev->steps, ev->loss, ev->lr, ev->array_size,
               ev->samples_per_s, ev->io_wait_ms);
    } else if (ev->kind == FB_TRAIN_EVAL) {
        printf("%-20.20s validation at step %lld: val_loss %.4f, val_accuracy %.4f\n",
               ev->spec->name, (long long)ev->step, ev->loss, ev->accuracy);
    } else if (ev->kind == FB_TRAIN_CHECKPOINT) {
        printf("%-20.20s checkpoint at step %lld%s%s\n", ev->spec->name, (long long)ev->step,
               ev->weights_path ? ": " : "", ev->weights_path ? ev->weights_path : "");
    } else if (ev->kind == FB_TRAIN_FAILED) {
        printf("%-20.20s failed at step %lld: %s (%s)\n", ev->spec->name, (long long)ev->step,
               ev->text ? ev->text : "", fb_err_code(ev->err));
    } else {
        printf("%-20.20s done after %lld steps%s%s\n", ev->spec->name, (long long)ev->step,
               ev->weights_path ? "; weights: " : "", ev->weights_path ? ev->weights_path : "");
    }
    fflush(stdout);
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

/* The command line's options, with their defaults. */
typedef struct options {
    int log_every, threads, data_threads, devices, window;
    const char *out_dir, *data_dir, *backend, *stage_dir;
    unsigned long long stage_bytes;
    bool force_json, eval;
} options;

/* Reads the options into *o (the specs are what is left from optind on).
 * Returns -1 to go on, or the exit status: 0 after --help, EXIT_USAGE for
 * a bad option. */
static int parse_options(int argc, char **argv, options *o)
{
    static const struct option long_opts[] = {
        {"log-every", required_argument, NULL, 'l'}, {"out", required_argument, NULL, 'o'},
        {"no-out", no_argument, NULL, 'O'},          {"data-dir", required_argument, NULL, 'd'},
        {"threads", required_argument, NULL, 't'},   {"backend", required_argument, NULL, 'b'},
        {"json", no_argument, NULL, 'j'},            {"no-eval", no_argument, NULL, 'E'},
        {"data-threads", required_argument, NULL, 'D'}, {"stage", required_argument, NULL, 'S'},
        {"stage-bytes", required_argument, NULL, 'B'}, {"devices", required_argument, NULL, 'P'},
        {"version", no_argument, NULL, 'V'},          {"window", required_argument, NULL, 'W'},
        {"help", no_argument, NULL, 'h'},            {NULL, 0, NULL, 0}};
    *o = (options){.log_every = 100, .threads = 1, .data_threads = 2, .devices = 1,
                   .window = FB_SESSION_DEFAULT_WINDOW,
                   .out_dir = "fusebox-out",
                   .backend = "cpu", .stage_bytes = 16ULL << 30, .eval = true};
    char *end;
    int opt;
    while ((opt = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        switch (opt) {
        case 'l':
            if (parse_int(optarg, 0, 1000000000, &o->log_every)) {
                fprintf(stderr, "fusebox-train: --log-every needs an integer >= 0\n");
                return EXIT_USAGE;
            }
            break;
        case 'o': o->out_dir = optarg; break;
        case 'O': o->out_dir = NULL; break;
        case 'd': o->data_dir = optarg; break;
        case 't':
            if (parse_int(optarg, 1, 1024, &o->threads)) {
                fprintf(stderr, "fusebox-train: --threads needs an integer in [1, 1024]\n");
                return EXIT_USAGE;
            }
            break;
        case 'P':
            if (parse_int(optarg, 1, FB_DP_MAX_RANKS, &o->devices)) {
                fprintf(stderr, "fusebox-train: --devices needs an integer in [1, %d]\n",
                        FB_DP_MAX_RANKS);
                return EXIT_USAGE;
            }
            break;
        case 'W':
            if (parse_int(optarg, 1, FB_SESSION_MAX_WINDOW, &o->window)) {
                fprintf(stderr, "fusebox-train: --window needs an integer in [1, %d]\n",
                        FB_SESSION_MAX_WINDOW);
                return EXIT_USAGE;
            }
            break;
        case 'b': o->backend = optarg; break;
        case 'j': o->force_json = true; break;
        case 'E': o->eval = false; break;
        case 'D':
            if (parse_int(optarg, 1, FB_LOADER_MAX_THREADS, &o->data_threads)) {
                fprintf(stderr, "fusebox-train: --data-threads needs an integer in [1, %d]\n",
                        FB_LOADER_MAX_THREADS);
                return EXIT_USAGE;
            }
            break;
        case 'S': o->stage_dir = optarg; break;
        case 'B':
            errno = 0;
            o->stage_bytes = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end || o->stage_bytes == 0 || optarg[0] == '-') {
                fprintf(stderr, "fusebox-train: --stage-bytes needs a positive integer\n");
                return EXIT_USAGE;
            }
            break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("fusebox-train %s\n", FB_VERSION_STRING); return 0;
        default: usage(stderr); return EXIT_USAGE;
        }
    }
    return -1;
}

/* --devices N > 1: the arrays train data-parallel over N CPU devices on be. */
static void use_devices(const options *op, fb_backend *be, fb_device *devices, fb_train_opts *o)
{
    if (op->devices < 2) return;
    fb_devices_cpu(op->devices, (uint64_t)1 << 34, be, devices);
    o->devices = devices;
    o->n_devices = op->devices;
}

int main(int argc, char **argv)
{
    options op;
    int status = parse_options(argc, argv, &op);
    if (status >= 0) return status;
    int n = argc - optind;
    if (n < 1) {
        usage(stderr);
        return EXIT_USAGE;
    }
    fb_backend *be = strcmp(op.backend, "cpu") == 0       ? fb_backend_cpu()
                       : strcmp(op.backend, "cpu-ref") == 0 ? fb_backend_cpu_ref()
                                                          : NULL;
    if (!be) {
        fprintf(stderr, "fusebox-train: unknown backend '%s' (cpu, cpu-ref)\n", op.backend);
        return EXIT_USAGE;
    }
    fb_backend_set_threads(be, op.threads);

    int rc = 0;
    char msg[1024];
    fb_job_spec *specs = calloc((size_t)n, sizeof *specs);
    const fb_job_spec **group = calloc((size_t)n, sizeof *group);
    int *group_of = calloc((size_t)n, sizeof *group_of), *index = calloc((size_t)n, sizeof *index);
    double *floss = calloc((size_t)n, sizeof *floss), *facc = calloc((size_t)n, sizeof *facc);
    double *all_loss = calloc((size_t)n, sizeof *all_loss);
    double *all_acc = calloc((size_t)n, sizeof *all_acc);
    double *tloss = calloc((size_t)n, sizeof *tloss), *tacc = calloc((size_t)n, sizeof *tacc);
    double *all_tloss = calloc((size_t)n, sizeof *all_tloss);
    double *all_tacc = calloc((size_t)n, sizeof *all_tacc);
    fb_dataset train = {0}, val = {0}, test = {0};
    fb_loader *loader = NULL;
    int loaded = 0;
    if (!specs || !group || !group_of || !index || !floss || !facc || !all_loss || !all_acc ||
        !tloss || !tacc || !all_tloss || !all_tacc) {
        fprintf(stderr, "fusebox-train: out of memory\n");
        rc = 1;
        goto done;
    }
    for (int i = 0; i < n; i++, loaded++) {
        int err = fb_job_spec_load(argv[optind + i], NULL, &specs[i], msg, sizeof msg);
        if (err) {
            fprintf(stderr, "fusebox-train: %s (%s)\n", msg, fb_err_code(err));
            rc = EXIT_USAGE;
            goto done;
        }
        if (specs[i].init_job[0]) {
            loaded++;
            fprintf(stderr,
                    "fusebox-train: %s: init names job %s of the service; fusebox-train starts "
                    "from a local file, the path of a safetensors file as init (download the "
                    "job's model with GET /v1/jobs/%s/model)\n",
                    argv[optind + i], specs[i].init_job, specs[i].init_job);
            rc = EXIT_USAGE;
            goto done;
        }
    }
    /* groups by fusion key, in order of first appearance */
    int n_groups = 0;
    for (int i = 0; i < n; i++) {
        group_of[i] = -1;
        for (int j = 0; j < i; j++)
            if (fb_job_spec_fusible(&specs[i], &specs[j])) group_of[i] = group_of[j];
        if (group_of[i] < 0) group_of[i] = n_groups++;
    }
    bool json = op.force_json || !isatty(STDOUT_FILENO);
    cli c = {.json = json, .n_groups = n_groups, .test_loss = tloss, .test_acc = tacc};
    fb_train_opts o = {.log_every = op.log_every, .out_dir = op.out_dir, .cb = on_event,
                       .user = &c, .window = op.window};
    fb_device devices[FB_DP_MAX_RANKS];
    use_devices(&op, be, devices, &o);
    for (int g = 0; g < n_groups; g++) {
        int B = 0;
        for (int i = 0; i < n; i++)
            if (group_of[i] == g) {
                index[B] = i;
                group[B++] = &specs[i];
            }
        const char *ds = group[0]->dataset;
        fb_dataset_free(&train);
        fb_dataset_free(&val);
        fb_dataset_free(&test);
        fb_loader_free(loader);
        loader = NULL;
        /* a shard dataset trains through the loader; an IDX dataset from memory */
        fb_data_source_opts so = {.batch_size = group[0]->batch_size,
                                  .shuffle = group[0]->shuffle,
                                  .data_seed = group[0]->data_seed, .threads = op.data_threads,
                                  .cache_dir = op.stage_dir, .cache_bytes = op.stage_bytes,
                                  .want_test = op.eval, .want_val = op.eval,
                                  .val_fraction = group[0]->val_fraction};
        int err = fb_data_open_named(&train, &val, &test, &loader, ds, op.data_dir, &so, msg,
                                     sizeof msg);
        o.loader = loader;
        o.test = op.eval ? &test : NULL;
        c.val = op.eval && val.n > 0;
        c.test = op.eval;
        if (err) {
            fprintf(stderr, "fusebox-train: %s (%s)\n", msg, fb_err_code(err));
            rc = 1;
            goto done;
        }
        c.group = g;
        if (!json)
            printf("array %d/%d: %d member%s, fusion key %s, dataset %s (%lld training, %lld "
                   "validation samples)\n",
                   g + 1, n_groups, B, B == 1 ? "" : "s", group[0]->fusion_key, ds,
                   (long long)train.n, (long long)val.n);
        for (int b = 0; b < B; b++) tloss[b] = tacc[b] = NAN;
        err = fb_train_run(be, group, B, &train, op.eval ? &val : NULL, &o, floss, facc, msg,
                           sizeof msg);
        if (err) {
            fprintf(stderr, "fusebox-train: %s (%s)\n", msg, fb_err_code(err));
            rc = 1;
            goto done;
        }
        for (int b = 0; b < B; b++) {
            all_loss[index[b]] = floss[b];
            all_acc[index[b]] = facc[b];
            all_tloss[index[b]] = tloss[b];
            all_tacc[index[b]] = tacc[b];
        }
    }
    if (!json && op.eval) {
        printf("\n%-24s %10s %12s %10s %13s\n", "job", "val_loss", "val_accuracy", "test_loss",
               "test_accuracy");
        for (int i = 0; i < n; i++)
            printf("%-24.24s %10.4f %12.4f %10.4f %13.4f\n", specs[i].name, all_loss[i],
                   all_acc[i], all_tloss[i], all_tacc[i]);
    }
done:
    fb_loader_free(loader);
    fb_dataset_free(&train);
    fb_dataset_free(&val);
    fb_dataset_free(&test);
    for (int i = 0; i < loaded; i++) fb_job_spec_free(&specs[i]);
    free(specs);
    free(group);
    free(group_of);
    free(index);
    free(floss);
    free(facc);
    free(all_loss);
    free(all_acc);
    free(tloss);
    free(tacc);
    free(all_tloss);
    free(all_tacc);
    return rc;
}
