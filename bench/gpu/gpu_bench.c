/*
 * gpu_bench: fused arrays on a CUDA device against the same jobs run one
 * after another and as concurrent processes (tests/gpu/run.sh drives it and
 * prints the table).
 *
 *   gpu_bench train --model mlp|cnn --mode fused|serial --B 1,2,4,...
 *                   [--steps S] [--warmup W] [--device D]
 *     fused: one array of B members trains W untimed, then S timed steps.
 *     serial: B single-member arrays, one after another, each W untimed and
 *     max(3, S / B) timed steps (a job's rate does not depend on how many
 *     follow it, so fewer steps each keep the run short).  A step is what the
 *     training loop does: upload the minibatch, forward, backward, download
 *     the losses, one fused optimizer update.  Prints one line per B:
 *       train impl=fused model=mlp B=16 sps=... gflops=...
 *     sps: samples x models per second; gflops: the training GEMM FLOP rate.
 *
 *   gpu_bench proc --model mlp|cnn [--steps S] [--warmup W] --start-at T
 *     One solo job for the concurrent-process measurement: warms up, waits
 *     until the CLOCK_REALTIME second T, trains S timed steps and prints
 *       proc model=mlp start=... end=... samples=...
 *     run.sh starts B of these together and divides the samples by the span.
 *
 *   gpu_bench sgemm [--n 8192] [--reps 5]
 *     cuBLAS SGEMM (fb_sgemm on the CUDA backend, no TF32) on square n x n
 *     matrices: the device's practical float GEMM rate.
 *     Prints "sgemm n=... gflops=<median>".
 *
 * The models are bench/fusion's (batch 128, [1, 28, 28] inputs, 10 classes,
 * synthetic values, AdamW):
 *   mlp: flatten, linear 256, relu, linear 128, relu, linear 10
 *   cnn: conv 3x3 16 pad 1, relu, maxpool 2, conv 3x3 32 pad 1, relu, maxpool 2,
 *        flatten, linear 10
 * Exits 77 where no CUDA device is usable.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "array.h"
#include "cuda/cuda_backend.h"
#include "errors.h"
#include "jobspec.h"
#include "kernels.h"
#include "models.h"

#define MAX_B 64
#define MSG_CAP 1024

static fb_backend *g_be;

static double real_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "gpu_bench: %s: %s\n", what, msg);
    exit(1);
}

/* Stops on a device failure the backend recorded: a rate measured over
 * skipped ops would be meaningless. */
static void check_device(const char *what)
{
    char msg[MSG_CAP];
    if (fb_cuda_backend_error(g_be, msg, sizeof msg) != FB_OK) die(what, msg);
}

typedef struct trainer {
    fb_array *a;
    fb_job_spec *specs[MAX_B];
    fb_optim_hparams hp[MAX_B];
    float loss[MAX_B], correct[MAX_B];
    int B;
    int64_t t;
} trainer;

static void trainer_init(trainer *tr, const char *model, int B, int first)
{
    char msg[MSG_CAP];
    memset(tr, 0, sizeof *tr);
    tr->B = B;
    for (int b = 0; b < B; b++)
        tr->specs[b] = fb_bench_spec("gpubench", model, first + b);
    if (fb_array_new(g_be, (const fb_job_spec *const *)tr->specs, B, BATCH, &tr->a, msg,
                     sizeof msg))
        die("array", msg);
}

static void trainer_free(trainer *tr)
{
    fb_array_free(tr->a);
    for (int b = 0; b < tr->B; b++) {
        fb_job_spec_free(tr->specs[b]);
        free(tr->specs[b]);
    }
}

/* One training step as workers/train.c runs it. */
static void trainer_step(trainer *tr, const data_pool *d)
{
    char msg[MSG_CAP];
    size_t F = (size_t)SIDE * SIDE, k = (size_t)(tr->t % POOL) * BATCH;
    if (fb_array_forward_backward(tr->a, d->x + k * F, d->y + k, BATCH, true, (uint64_t)tr->t,
                                  tr->loss, tr->correct, msg, sizeof msg))
        die("step", msg);
    tr->t++;
    for (int b = 0; b < tr->B; b++)
        fb_array_hparams(tr->a, b, tr->t, 1000000, &tr->hp[b]);
    fb_array_step(tr->a, tr->hp);
}

/* Seconds of the timed steps: fused, one array of B; serial, B arrays of one
 * in turn, each `steps` timed steps.  Returns the member-steps in *msteps. */
static double run_train(const char *model, int B, bool fused, int steps, int warmup,
                        const data_pool *d, double *msteps)
{
    double timed = 0;
    int jobs = fused ? 1 : B, per_job = fused ? B : 1;
    *msteps = 0;
    for (int j = 0; j < jobs; j++) {
        trainer tr;
        trainer_init(&tr, model, per_job, j);
        for (int s = 0; s < warmup; s++)
            trainer_step(&tr, d);
        fb_backend_sync(g_be);
        double t0 = fb_bench_now_s();
        for (int s = 0; s < steps; s++)
            trainer_step(&tr, d);
        fb_backend_sync(g_be);
        timed += fb_bench_now_s() - t0;
        check_device("train");
        *msteps += (double)per_job * steps;
        trainer_free(&tr);
    }
    return timed;
}

/* GFLOP/s of cuBLAS SGEMM on n x n: the median of reps calls after one
 * warm-up call. */
static double sgemm_gflops(int n, int reps)
{
    size_t nn = (size_t)n * n;
    float *h = malloc(nn * sizeof *h);
    float *a = fb_backend_alloc(g_be, nn * sizeof(float));
    float *b = fb_backend_alloc(g_be, nn * sizeof(float));
    float *c = fb_backend_alloc(g_be, nn * sizeof(float));
    if (!h || !a || !b || !c) die("sgemm", "out of memory");
    uint64_t st = 7;
    for (size_t i = 0; i < nn; i++)
        h[i] = (float)(fb_bench_next_u64(&st) >> 40) * (1.0f / 16777216.0f) - 0.5f;
    fb_backend_upload(g_be, a, h, nn * sizeof *h);
    fb_backend_upload(g_be, b, h, nn * sizeof *h);
    fb_sgemm(g_be, c, a, b, n, n, n);
    fb_backend_sync(g_be);
    double r[64];
    if (reps > 64) reps = 64;
    for (int i = 0; i < reps; i++) {
        double t0 = fb_bench_now_s();
        fb_sgemm(g_be, c, a, b, n, n, n);
        fb_backend_sync(g_be);
        r[i] = 2.0 * n * (double)n * n / (fb_bench_now_s() - t0) / 1e9;
    }
    check_device("sgemm");
    double median = fb_bench_median(r, reps);
    fb_backend_free(g_be, a);
    fb_backend_free(g_be, b);
    fb_backend_free(g_be, c);
    free(h);
    return median;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: gpu_bench train --model mlp|cnn --mode fused|serial --B LIST [--steps S] "
            "[--warmup W] [--device D]\n"
            "       gpu_bench proc --model mlp|cnn --start-at T [--steps S] [--warmup W] "
            "[--device D]\n"
            "       gpu_bench sgemm [--n N] [--reps R] [--device D]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 2) usage();
    const char *cmd = argv[1], *model = "mlp", *mode = "fused";
    int steps = 40, warmup = 3, n = 8192, reps = 5, device = 0, Bs[16] = {1}, nB = 1;
    double start_at = 0;
    for (int i = 2; i < argc; i += 2) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage();
        if (strcmp(k, "--model") == 0)
            model = v;
        else if (strcmp(k, "--mode") == 0)
            mode = v;
        else if (strcmp(k, "--steps") == 0)
            steps = atoi(v);
        else if (strcmp(k, "--warmup") == 0)
            warmup = atoi(v);
        else if (strcmp(k, "--n") == 0)
            n = atoi(v);
        else if (strcmp(k, "--reps") == 0)
            reps = atoi(v);
        else if (strcmp(k, "--device") == 0)
            device = atoi(v);
        else if (strcmp(k, "--start-at") == 0)
            start_at = atof(v);
        else if (strcmp(k, "--B") == 0)
            nB = fb_bench_parse_list("--B", v, MAX_B, Bs, 16);
        else
            usage();
    }
    if (strcmp(model, "mlp") != 0 && strcmp(model, "cnn") != 0) usage();
    if (steps < 1 || warmup < 0 || n < 1 || reps < 1 || device < 0) usage();
    char msg[MSG_CAP];
    if (fb_cuda_backend_get(device, &g_be, msg, sizeof msg) != FB_OK) {
        printf("SKIPPED: %s\n", msg);
        return 77;
    }

    if (strcmp(cmd, "sgemm") == 0) {
        printf("sgemm n=%d gflops=%.1f\n", n, sgemm_gflops(n, reps));
        return 0;
    }
    data_pool d = fb_bench_make_data();
    fb_job_spec *s = fb_bench_spec("gpubench", model, 0);
    double flops = fb_bench_model_flops(s, BATCH);
    fb_job_spec_free(s);
    free(s);
    if (strcmp(cmd, "train") == 0) {
        bool fused = strcmp(mode, "fused") == 0;
        if (!fused && strcmp(mode, "serial") != 0) usage();
        for (int i = 0; i < nB; i++) {
            int S = fused ? steps : (steps / Bs[i] > 3 ? steps / Bs[i] : 3);
            double msteps, t = run_train(model, Bs[i], fused, S, warmup, &d, &msteps);
            printf("train impl=%s model=%s B=%d sps=%.1f gflops=%.2f\n", mode, model, Bs[i],
                   msteps * BATCH / t, flops * msteps / t / 1e9);
            fflush(stdout);
        }
    } else if (strcmp(cmd, "proc") == 0) {
        if (start_at <= 0) usage();
        trainer tr;
        trainer_init(&tr, model, 1, 0);
        for (int k = 0; k < warmup; k++)
            trainer_step(&tr, &d);
        fb_backend_sync(g_be);
        double wait = start_at - real_s();
        if (wait > 0) {
            struct timespec ts = {.tv_sec = (time_t)wait,
                                  .tv_nsec = (long)((wait - (double)(time_t)wait) * 1e9)};
            nanosleep(&ts, NULL);
        }
        double t0 = real_s();
        for (int k = 0; k < steps; k++)
            trainer_step(&tr, &d);
        fb_backend_sync(g_be);
        double t1 = real_s();
        check_device("proc");
        printf("proc model=%s start=%.6f end=%.6f samples=%d gflop=%.3f\n", model, t0, t1,
               steps * BATCH, flops * steps / 1e9);
        trainer_free(&tr);
    } else {
        usage();
    }
    free(d.x);
    free(d.y);
    return 0;
}
