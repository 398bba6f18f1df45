/* The throughput benchmarks' models, specs, FLOP count and data (models.h). */
#include "models.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MSG_CAP 1024

static const char *const MLP_LAYERS =
    "[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":256},{\"type\":\"relu\"},"
    "{\"type\":\"linear\",\"out\":128},{\"type\":\"relu\"},{\"type\":\"linear\",\"out\":10}]";
static const char *const CNN_LAYERS =
    "[{\"type\":\"conv2d\",\"out\":16,\"kernel\":3,\"padding\":1},{\"type\":\"relu\"},"
    "{\"type\":\"maxpool2d\",\"kernel\":2},"
    "{\"type\":\"conv2d\",\"out\":32,\"kernel\":3,\"padding\":1},{\"type\":\"relu\"},"
    "{\"type\":\"maxpool2d\",\"kernel\":2},{\"type\":\"flatten\"},"
    "{\"type\":\"linear\",\"out\":10}]";
static const char *const CHARLM_LAYERS =
    "[{\"type\":\"embedding\",\"dim\":128},{\"type\":\"positional\"},"
    "{\"type\":\"transformer_block\",\"heads\":4},{\"type\":\"transformer_block\",\"heads\":4},"
    "{\"type\":\"layernorm\"},{\"type\":\"linear\",\"out\":256}]";

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench: %s: %s\n", what, msg);
    exit(1);
}

uint64_t fb_bench_next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

int fb_bench_batch(const char *model)
{
    return strcmp(model, "charlm") == 0 ? LM_BATCH : BATCH;
}

fb_job_spec *fb_bench_spec(const char *prefix, const char *model, int i)
{
    const char *layers = strcmp(model, "mlp") == 0 ? MLP_LAYERS : CNN_LAYERS;
    char json[2048], msg[MSG_CAP];
    if (strcmp(model, "charlm") == 0)
        snprintf(json, sizeof json,
                 "{\"name\":\"%s-%s-%d\",\"dataset\":\"licenses\","
                 "\"model\":{\"input\":{\"tokens\":%d,\"vocab\":256},\"layers\":%s},"
                 "\"loss\":\"cross_entropy\",\"batch_size\":%d,\"steps\":1000000,"
                 "\"optimizer\":{\"type\":\"adam\",\"lr\":%.6g},\"seed\":%d,\"data_seed\":0}",
                 prefix, model, i, LM_T, CHARLM_LAYERS, LM_BATCH, 1e-3 * (1.0 + 0.1 * (i % 8)),
                 100 + i);
    else
        snprintf(json, sizeof json,
                 "{\"name\":\"%s-%s-%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
                 "\"layers\":%s},\"batch_size\":%d,\"steps\":1000000,"
                 "\"optimizer\":{\"type\":\"adamw\",\"lr\":%.6g,\"weight_decay\":0.01},"
                 "\"seed\":%d,\"data_seed\":0}",
                 prefix, model, i, SIDE, SIDE, layers, BATCH, 1e-3 * (1.0 + 0.1 * (i % 8)),
                 100 + i);
    fb_job_spec *s = calloc(1, sizeof *s);
    if (!s) die("spec", "out of memory");
    if (fb_job_spec_parse(json, strlen(json), NULL, s, msg, sizeof msg)) die("spec", msg);
    return s;
}

double fb_bench_model_flops(const fb_job_spec *s, int N)
{
    double total = 0;
    bool first = true;
    for (int i = 0; i < s->n_layers; i++) {
        const fb_layer *L = &s->layers[i];
        const double rows = L->in.ndim == 2 ? (double)L->in.d[0] : 1.0; /* positions */
        const double in_f = (double)L->in.d[L->in.ndim - 1];
        double f;
        if (L->type == FB_LAYER_EMBEDDING) {
            first = false;
            continue;
        }
        if (L->type == FB_LAYER_TRANSFORMER_BLOCK) {
            const double D = in_f, T = rows, lin = 2.0 * T * D * D * (4.0 + 2.0 * L->mlp_ratio);
            total += 3.0 * lin + 12.0 * T * T * D;
            first = false;
            continue;
        }
        if (L->type == FB_LAYER_LINEAR)
            f = 2.0 * rows * in_f * (double)L->out_features;
        else if (L->type == FB_LAYER_CONV2D)
            f = 2.0 * (double)L->in.d[0] * L->kernel[0] * L->kernel[1] *
                (double)fb_shape_numel(&L->out);
        else
            continue;
        total += f * (first ? 2.0 : 3.0);
        first = false;
    }
    return total * N;
}

data_pool fb_bench_make_data(void)
{
    data_pool d = {.batches = POOL, .N = BATCH, .F = SIDE * SIDE};
    size_t F = (size_t)SIDE * SIDE;
    d.x = malloc((size_t)POOL * BATCH * F * sizeof *d.x);
    d.y = malloc((size_t)POOL * BATCH * sizeof *d.y);
    if (!d.x || !d.y) die("data", "out of memory");
    uint64_t st = 42;
    for (size_t i = 0; i < (size_t)POOL * BATCH * F; i++)
        d.x[i] = (float)(fb_bench_next_u64(&st) >> 40) * (1.0f / 16777216.0f);
    for (size_t i = 0; i < (size_t)POOL * BATCH; i++)
        d.y[i] = (int32_t)(fb_bench_next_u64(&st) % CLASSES);
    return d;
}

double fb_bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int fb_bench_parse_list(const char *flag, const char *s, int max, int *out, int cap)
{
    int n = 0;
    while (*s && n < cap) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > max) {
            fprintf(stderr, "%s: expected a comma-separated list of 1..%d\n", flag, max);
            exit(1);
        }
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double fb_bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return v[n / 2];
}
