/*
 * fusebox-train: train one job spec, or many, locally without a server.
 *
 * Specs that share a fusion key train together as one fused array; groups
 * with different keys train one after another.  Progress goes to stdout: a
 * progress bar per member on a terminal, JSON lines otherwise.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "datadir.h"
#include "idx.h"
#include "jobspec.h"
#include "kernels.h"
#include "train.h"

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
            "  --backend NAME  cpu (default) or cpu-ref (the plain-C reference)\n"
            "  --json          JSON lines even on a terminal\n"
            "  --no-eval       skip validation and the test evaluation (no val_* or test_*\n"
            "                  metrics)\n"
            "  -h, --help      this text\n");
}

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    }
    putchar('"');
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
        printf("{\"event\":\"%s\",\"job\":", kinds[ev->kind]);
        json_str(ev->spec->name);
        printf(",\"member\":%d,\"group\":%d,\"array_size\":%d,\"step\":%lld,\"steps\":%lld",
               ev->member, c->group, ev->array_size, (long long)ev->step, (long long)ev->steps);
        /* the names of the metrics series (docs/jobspec.md, "Metrics"); without a
         * validation set a done event carries no val_*: its last step event has the
         * training values, and they must never pass for an evaluation */
        if (ev->kind == FB_TRAIN_STEP)
            printf(",\"loss\":%.9g,\"accuracy\":%.6g,\"lr\":%.9g,\"samples_per_s\":%.1f"
                   ",\"io_ms\":%.4f",
                   ev->loss, ev->accuracy, ev->lr, ev->samples_per_s, ev->io_wait_ms);
        else if (ev->kind == FB_TRAIN_EVAL || (ev->kind == FB_TRAIN_DONE && c->val))
            printf(",\"val_loss\":%.9g,\"val_accuracy\":%.6g", ev->loss, ev->accuracy);
        if (ev->kind == FB_TRAIN_DONE && c->test)
            printf(",\"test_loss\":%.9g,\"test_accuracy\":%.6g", ev->test_loss,
                   ev->test_accuracy);
        if (ev->kind == FB_TRAIN_FAILED) {
            printf(",\"error\":\"%s\",\"message\":", fb_err_code(ev->err));
            json_str(ev->text ? ev->text : "");
        }
        if (ev->weights_path) {
            printf(",\"weights\":");
            json_str(ev->weights_path);
        }
        printf("}\n");
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

int main(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"log-every", required_argument, NULL, 'l'}, {"out", required_argument, NULL, 'o'},
        {"no-out", no_argument, NULL, 'O'},          {"data-dir", required_argument, NULL, 'd'},
        {"threads", required_argument, NULL, 't'},   {"backend", required_argument, NULL, 'b'},
        {"json", no_argument, NULL, 'j'},            {"no-eval", no_argument, NULL, 'E'},
        {"data-threads", required_argument, NULL, 'D'}, {"stage", required_argument, NULL, 'S'},
        {"stage-bytes", required_argument, NULL, 'B'},
        {"help", no_argument, NULL, 'h'},            {NULL, 0, NULL, 0}};
    int data_threads = 2;
    const char *stage_dir = NULL;
    unsigned long long stage_bytes = 16ULL << 30;
    char *end;
    int log_every = 100, threads = 1, opt;
    const char *out_dir = "fusebox-out", *data_dir = NULL, *backend = "cpu";
    bool force_json = false, eval = true;
    while ((opt = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        switch (opt) {
        case 'l':
            if (parse_int(optarg, 0, 1000000000, &log_every)) {
                fprintf(stderr, "fusebox-train: --log-every needs an integer >= 0\n");
                return EXIT_USAGE;
            }
            break;
        case 'o': out_dir = optarg; break;
        case 'O': out_dir = NULL; break;
        case 'd': data_dir = optarg; break;
        case 't':
            if (parse_int(optarg, 1, 1024, &threads)) {
                fprintf(stderr, "fusebox-train: --threads needs an integer in [1, 1024]\n");
                return EXIT_USAGE;
            }
            break;
        case 'b': backend = optarg; break;
        case 'j': force_json = true; break;
        case 'E': eval = false; break;
        case 'D':
            if (parse_int(optarg, 1, FB_LOADER_MAX_THREADS, &data_threads)) {
                fprintf(stderr, "fusebox-train: --data-threads needs an integer in [1, %d]\n",
                        FB_LOADER_MAX_THREADS);
                return EXIT_USAGE;
            }
            break;
        case 'S': stage_dir = optarg; break;
        case 'B':
            errno = 0;
            stage_bytes = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end || stage_bytes == 0 || optarg[0] == '-') {
                fprintf(stderr, "fusebox-train: --stage-bytes needs a positive integer\n");
                return EXIT_USAGE;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return EXIT_USAGE;
        }
    }
    int n = argc - optind;
    if (n < 1) {
        usage(stderr);
        return EXIT_USAGE;
    }
    fb_backend *be = strcmp(backend, "cpu") == 0       ? fb_backend_cpu()
                       : strcmp(backend, "cpu-ref") == 0 ? fb_backend_cpu_ref()
                                                          : NULL;
    if (!be) {
        fprintf(stderr, "fusebox-train: unknown backend '%s' (cpu, cpu-ref)\n", backend);
        return EXIT_USAGE;
    }
    fb_backend_set_threads(be, threads);

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
    bool json = force_json || !isatty(STDOUT_FILENO);
    cli c = {.json = json, .n_groups = n_groups, .test_loss = tloss, .test_acc = tacc};
    fb_train_opts o = {.log_every = log_every, .out_dir = out_dir, .cb = on_event, .user = &c};
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
                                  .data_seed = group[0]->data_seed, .threads = data_threads,
                                  .cache_dir = stage_dir, .cache_bytes = stage_bytes,
                                  .want_test = eval, .want_val = eval,
                                  .val_fraction = group[0]->val_fraction};
        int err = fb_data_open_named(&train, &val, &test, &loader, ds, data_dir, &so, msg,
                                     sizeof msg);
        o.loader = loader;
        o.test = eval ? &test : NULL;
        c.val = eval && val.n > 0;
        c.test = eval;
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
        err = fb_train_run(be, group, B, &train, eval ? &val : NULL, &o, floss, facc, msg,
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
    if (!json && eval) {
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
