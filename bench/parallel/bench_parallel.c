/*
 * bench_parallel: data-parallel overlap and scaling, and the pipeline
 * bubble, on the CPU devices of this machine.
 *
 * One fused MLP array (B members) trains on synthetic data: on one device,
 * then data-parallel on two with the gradient all-reduce after backward
 * (overlap off) and bucketed during backward (overlap on).  For each it
 * prints the median step time over several steps, the devices' compute, the
 * communication thread's busy time, and the share of that communication
 * that backward hid; then the pipeline bubble for P stages and m
 * micro-batches: measured (the stage devices' idle share of a step; stages
 * before the last recompute their forward, which counts as busy), played by
 * 1F1B on the stage times the FLOPs partition gives, and (P-1)/(m+P-1).
 *
 * usage: bench_parallel [STEPS] [BATCH] [HIDDEN] [B] [BUCKET_KIB]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "array.h"
#include "device.h"
#include "data_parallel.h"
#include "errors.h"
#include "jobspec.h"
#include "kernels.h"
#include "pipeline_plan.h"
#include "pipeline_parallel.h"

#define MAX_B 16

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_parallel: %s: %s\n", what, msg);
    exit(1);
}

typedef struct result {
    double step_ms, compute_ms, comm_busy_ms, comm_exposed_ms;
} result;

static int F_IN = 784;

static void fill(float *x, int32_t *y, int N, uint64_t *st)
{
    for (int i = 0; i < N * F_IN; i++) {
        *st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)(*st >> 40) / (float)(1 << 24);
    }
    for (int i = 0; i < N; i++) y[i] = (int32_t)(((unsigned)i * 7u) % 10u);
}

/* D = 1: the plain array. */
static result run_single(fb_job_spec **specs, int B, int N, int steps)
{
    char msg[256];
    fb_backend *be = fb_backend_cpu();
    fb_backend_set_threads(be, 1);
    fb_array *a = NULL;
    if (fb_array_new(be, (const fb_job_spec *const *)specs, B, N, &a, msg, sizeof msg))
        die("array", msg);
    float *x = malloc((size_t)N * F_IN * sizeof *x), loss[MAX_B];
    int32_t *y = malloc((size_t)N * sizeof *y);
    fb_optim_hparams hp[MAX_B];
    double *t = malloc((size_t)steps * sizeof *t);
    uint64_t st = 1;
    for (int s = -2; s < steps; s++) {
        fill(x, y, N, &st);
        double t0 = now_ms();
        if (fb_array_forward_backward(a, x, y, N, true, (uint64_t)(s + 2), loss, NULL, msg,
                                      sizeof msg))
            die("step", msg);
        for (int b = 0; b < B; b++) fb_array_hparams(a, b, s + 3, steps + 2, &hp[b]);
        fb_array_step(a, hp);
        if (s >= 0) t[s] = now_ms() - t0;
    }
    result r = {.step_ms = median(t, steps)};
    r.compute_ms = r.step_ms;
    fb_array_free(a);
    free(x);
    free(y);
    free(t);
    return r;
}

static result run_dp(fb_job_spec **specs, int B, int N, int steps, int D, bool overlap,
                     size_t bucket)
{
    char msg[256];
    fb_device devs[4];
    if (fb_devices_discover(D, (uint64_t)1 << 32, devs, 4, msg, sizeof msg) != D)
        die("devices", msg);
    fb_dp_opts o = {.bucket_bytes = bucket, .no_overlap = !overlap, .threads = 1,
                    .slow_rank = -1};
    fb_dp *dp = NULL;
    if (fb_dp_new(devs, D, (const fb_job_spec *const *)specs, B, N, &o, &dp, msg, sizeof msg))
        die("dp", msg);
    float *x = malloc((size_t)N * F_IN * sizeof *x), loss[MAX_B];
    int32_t *y = malloc((size_t)N * sizeof *y);
    fb_optim_hparams hp[MAX_B];
    double *t = malloc((size_t)steps * sizeof *t), *c = malloc((size_t)steps * sizeof *c),
           *busy = malloc((size_t)steps * sizeof *busy),
           *exposed = malloc((size_t)steps * sizeof *exposed);
    uint64_t st = 1;
    for (int s = -2; s < steps; s++) {
        fill(x, y, N, &st);
        fb_dp_take_times(dp);
        double t0 = now_ms();
        if (fb_dp_forward_backward(dp, x, y, N, NULL, (uint64_t)(s + 2), loss, NULL, msg,
                                   sizeof msg))
            die("step", msg);
        for (int b = 0; b < B; b++)
            fb_array_hparams(fb_dp_array(dp, 0), b, s + 3, steps + 2, &hp[b]);
        fb_dp_step(dp, hp);
        double t1 = now_ms();
        fb_dp_times tm = fb_dp_take_times(dp);
        if (s < 0) continue;
        t[s] = t1 - t0;
        double cmax = 0, emax = 0;
        for (int d = 0; d < D; d++) {
            cmax = fmax(cmax, tm.compute_ms[d]);
            emax = fmax(emax, tm.comm_exposed_ms[d]);
        }
        c[s] = cmax;
        busy[s] = tm.comm_busy_ms;
        exposed[s] = emax;
    }
    result r = {.step_ms = median(t, steps),
                .compute_ms = median(c, steps),
                .comm_busy_ms = median(busy, steps),
                .comm_exposed_ms = median(exposed, steps)};
    fb_dp_free(dp);
    free(x);
    free(y);
    free(t);
    free(c);
    free(busy);
    free(exposed);
    return r;
}

/* The idle share of a P-stage pipeline's devices over steps, measured. */
static double measure_pp(fb_job_spec **specs, int B, int N, int P, int m, int steps)
{
    char msg[256];
    fb_device devs[4];
    if (fb_devices_discover(P, (uint64_t)1 << 32, devs, 4, msg, sizeof msg) != P)
        die("devices", msg);
    fb_dp_opts o = {.threads = 1, .slow_rank = -1};
    fb_pp *pp = NULL;
    if (fb_pp_new(devs, 1, P, m, (const fb_job_spec *const *)specs, B, N, &o, &pp, msg,
                  sizeof msg))
        die("pipeline", msg);
    float *x = malloc((size_t)N * F_IN * sizeof *x), loss[MAX_B];
    int32_t *y = malloc((size_t)N * sizeof *y);
    fb_optim_hparams hp[MAX_B];
    memset(hp, 0, sizeof hp);
    uint64_t st = 1;
    for (int s = -1; s < steps; s++) {
        fill(x, y, N, &st);
        if (s == 0) fb_pp_take_times(pp);
        if (fb_pp_train_step(pp, x, y, N, NULL, (uint64_t)(s + 1), hp, loss, NULL, msg, sizeof msg))
            die("pipeline step", msg);
    }
    fb_pp_times t = fb_pp_take_times(pp);
    double busy = 0;
    for (int p = 0; p < P; p++) busy += t.busy_ms[p];
    fb_pp_free(pp);
    free(x);
    free(y);
    return 1 - busy / (P * t.wall_ms);
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 15;
    int N = argc > 2 ? atoi(argv[2]) : 64;
    int hidden = argc > 3 ? atoi(argv[3]) : 1024;
    int B = argc > 4 ? atoi(argv[4]) : 4;
    int bucket_kib = argc > 5 ? atoi(argv[5]) : 1024;
    int pp_steps = steps / 3 > 2 ? steps / 3 : 2;
    if (steps < 3 || N < 2 || hidden < 1 || B < 1 || B > MAX_B || bucket_kib < 1) {
        fprintf(stderr, "usage: bench_parallel [STEPS>=3] [BATCH>=2] [HIDDEN] [B<=16] "
                        "[BUCKET_KIB]\n");
        return 2;
    }
    fb_job_spec *specs[MAX_B];
    for (int b = 0; b < B; b++) {
        char json[1024], msg[256];
        snprintf(json, sizeof json,
                 "{\"name\":\"b%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":[%d],"
                 "\"layers\":[{\"type\":\"linear\",\"out\":%d},{\"type\":\"relu\"},"
                 "{\"type\":\"linear\",\"out\":%d},{\"type\":\"relu\"},"
                 "{\"type\":\"linear\",\"out\":10}]},\"batch_size\":%d,\"steps\":100,"
                 "\"optimizer\":{\"type\":\"adamw\",\"lr\":%g},\"seed\":%d}",
                 b, F_IN, hidden, hidden, N, 1e-3 * (b + 1), b + 1);
        specs[b] = calloc(1, sizeof *specs[b]);
        if (!specs[b] || fb_job_spec_parse(json, strlen(json), NULL, specs[b], msg, sizeof msg))
            die("spec", msg);
    }
    size_t grad_floats = 0;
    {
        char msg[256];
        fb_array *a = NULL;
        if (fb_array_new(fb_backend_cpu(), (const fb_job_spec *const *)specs, B, 2, &a, msg,
                         sizeof msg))
            die("array", msg);
        grad_floats = fb_array_member_params(a) * (size_t)B;
        fb_array_free(a);
    }
    printf("# fused MLP %d-%d-%d-10, B=%d, global batch %d, gradients %.1f MB, bucket %d KiB, "
           "%d steps (median)\n",
           F_IN, hidden, hidden, B, N, grad_floats * 4.0 / 1e6, bucket_kib, steps);
    size_t bucket = (size_t)bucket_kib * 1024;
    result one = run_single(specs, B, N, steps);
    result off = run_dp(specs, B, N, steps, 2, false, bucket);
    result on = run_dp(specs, B, N, steps, 2, true, bucket);

    printf("\n| run | step ms | compute ms (slowest device) | comm busy ms | comm exposed ms "
           "| comm hidden |\n|---|---|---|---|---|---|\n");
    printf("| D=1 | %.2f | %.2f | - | - | - |\n", one.step_ms, one.compute_ms);
    const result *rs[2] = {&off, &on};
    const char *names[2] = {"D=2 overlap off", "D=2 overlap on"};
    for (int k = 0; k < 2; k++) {
        const result *r = rs[k];
        double hidden_share =
            r->comm_busy_ms > 0 ? fmax(0, 1 - r->comm_exposed_ms / r->comm_busy_ms) : 0;
        printf("| %s | %.2f | %.2f | %.2f | %.2f | %.0f%% |\n", names[k], r->step_ms,
               r->compute_ms, r->comm_busy_ms, r->comm_exposed_ms, 100 * hidden_share);
    }
    double bound = fmax(on.compute_ms, on.comm_busy_ms);
    printf("\n| ratio | value | target |\n|---|---|---|\n");
    printf("| overlap on / overlap off (step) | %.3f | < 1 |\n", on.step_ms / off.step_ms);
    printf("| overlap on / max(compute, comm) | %.3f | <= 1.1 |\n", on.step_ms / bound);
    printf("| speed-up D=1 -> D=2 (samples/s) | %.3f | 2 on 2 free cores |\n",
           one.step_ms / on.step_ms);

    /* the pipeline bubble: measured (stage devices' idle share of the step),
     * 1F1B played on the FLOPs partition's stage times, and the formula */
    printf("\n| P | m | measured idle share | 1F1B on FLOPs-balanced stages | (P-1)/(m+P-1) "
           "|\n|---|---|---|---|---|\n");
    for (int P = 2; P <= 3; P++) {
        int first[4];
        char msg[256];
        if (fb_pipeline_partition(specs[0], P, first, msg, sizeof msg)) die("partition", msg);
        double tf[4], tb[4];
        for (int p = 0; p < P; p++) {
            tf[p] = tb[p] = 0;
            for (int i = first[p]; i < first[p + 1]; i++) {
                tf[p] += specs[0]->layers[i].flops_fwd;
                tb[p] += specs[0]->layers[i].flops_bwd;
            }
        }
        for (int m = 1; m <= 8; m *= 2) {
            double span, bubble;
            if (fb_pipeline_simulate(P, m, tf, tb, &span, &bubble)) die("simulate", "failed");
            double measured = measure_pp(specs, B, N, P, m, pp_steps);
            printf("| %d | %d | %.3f | %.3f | %.3f |\n", P, m, measured, bubble,
                   fb_pipeline_bubble_formula(P, m));
        }
    }
    for (int b = 0; b < B; b++) {
        fb_job_spec_free(specs[b]);
        free(specs[b]);
    }
    return 0;
}
