/*
 * fusion_bench: fusebox's side of bench/fusion (run.sh drives it and PyTorch
 * side by side and prints the table).
 *
 *   fusion_bench train --model mlp|cnn|charlm --mode fused|solo|fused,solo --threads T
 *                      --B 1,2,4,... [--work K | --steps S] [--warmup W] [--window K]
 *                      [--data DIR]
 *     For each B, and for each mode in turn (the two are then measured a few
 *     seconds apart): fused trains one array of B members for W untimed
 *     steps, then S timed steps; solo trains B single-member arrays one after
 *     another, each for W untimed and S timed steps.  S is given, or
 *     max(2, ceil(K / B)), so that every B times about K member-steps
 *     (default K = 64).  A step is what the training loop does: gather the
 *     minibatch, forward, backward, one fused optimizer update; with --window
 *     K (1..16, default 1) the steps go K at a time, each tile of members
 *     through all K before the next (fb_array_train_steps, as the session
 *     trains with fb_train_opts.window).  Prints one
 *     line per B and mode:
 *       train impl=fusebox-fused model=mlp threads=1 B=16 sps=... gflops=...
 *     sps is samples x models per second over the timed steps (cpu_sps the
 *     same over the process CPU time, steadier on a loaded machine); gflops the
 *     training GEMM FLOP rate (see fb_bench_model_flops in bench/lib/models.h).
 *     charlm trains on the token dataset DIR (its split "train", as
 *     `fusebox-data import text --builtin licenses --context 64` makes it),
 *     its minibatches of LM_BATCH records in file order, used in turn.
 *
 *   fusion_bench tokens --data DIR --out FILE
 *     Writes the minibatches charlm trains on, in the order it uses them, as
 *     int32 little-endian [batches * LM_BATCH, LM_T + 1] to FILE, for
 *     torch_bench.py to train on the same data.
 *
 *   fusion_bench sgemm --threads T [--n 2048] [--reps 5]
 *     OpenBLAS SGEMM (cblas_sgemm with T OpenBLAS threads) on square n x n
 *     matrices: the machine's practical limit.
 *     Prints "sgemm threads=T n=... gflops=<median>".
 *
 *   fusion_bench rss --model mlp|cnn --B 16 [--threads T] [--steps S]
 *     Peak resident memory (ru_maxrss of child processes): one child trains a
 *     fused array of B members for S steps; then B children each train one
 *     member alone.  Prints "rss model=... B=... fused_kib=... solo_sum_kib=...
 *     solo_max_kib=...".
 *
 * The models (the same in torch_bench.py), batch 128, inputs [1, 28, 28] with
 * 10 classes (Fashion-MNIST's shape; synthetic values), AdamW:
 *   mlp: flatten, linear 256, relu, linear 128, relu, linear 10
 *   cnn: conv 3x3 16 pad 1, relu, maxpool 2, conv 3x3 32 pad 1, relu, maxpool 2,
 *        flatten, linear 10
 * and charlm (bench/lib/models.h), batch 32, Adam: embedding 128, positional,
 * 2 x transformer_block (4 heads, MLP 512, causal), layernorm, linear 256,
 * next-token cross-entropy at every position.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
/* cblas.h pulls in <complex.h>, whose macro I is not needed here. */
#undef I

#include "array.h"
#include "datadir.h"
#include "jobspec.h"
#include "kernels.h"
#include "models.h"

#define MAX_B 64
#define MAX_WINDOW 16
#define MSG_CAP 1024

/* CPU seconds of the whole process (all threads): on a loaded machine, a
 * one-thread run's CPU time is steadier than its wall time. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "fusion_bench: %s: %s\n", what, msg);
    exit(1);
}

/* A trainer: one array plus the per-step buffers the training loop keeps. */
typedef struct trainer {
    fb_array *a;
    fb_job_spec *specs[MAX_B];
    fb_optim_hparams hp[MAX_WINDOW * MAX_B];
    float loss[MAX_WINDOW * MAX_B], correct[MAX_WINDOW * MAX_B];
    float *x[MAX_WINDOW];
    int32_t *y[MAX_WINDOW];
    int B, window;
    int64_t t;
} trainer;

static void trainer_init(trainer *tr, fb_backend *be, const char *model, int B, int window,
                         int first, const data_pool *d)
{
    char msg[MSG_CAP];
    memset(tr, 0, sizeof *tr);
    tr->B = B;
    for (int b = 0; b < B; b++)
        tr->specs[b] = fb_bench_spec("bench", model, first + b);
    if (fb_array_new(be, (const fb_job_spec *const *)tr->specs, B, d->N, &tr->a, msg, sizeof msg))
        die("array", msg);
    tr->window = window;
    for (int k = 0; k < window; k++) {
        tr->x[k] = malloc((size_t)d->N * d->F * sizeof *tr->x[k]);
        tr->y[k] = malloc((size_t)d->N * sizeof *tr->y[k]);
        if (!tr->x[k] || !tr->y[k]) die("trainer", "out of memory");
    }
}

static void trainer_free(trainer *tr)
{
    fb_array_free(tr->a);
    for (int b = 0; b < tr->B; b++) {
        fb_job_spec_free(tr->specs[b]);
        free(tr->specs[b]);
    }
    for (int k = 0; k < tr->window; k++) {
        free(tr->x[k]);
        free(tr->y[k]);
    }
}

/* K <= window training steps as the session runs them: gather K minibatches,
 * then forward+backward and one fused optimizer update per step, each tile
 * of members through all K before the next (fb_array_train_steps). */
static void trainer_steps(trainer *tr, const data_pool *d, int K)
{
    char msg[MSG_CAP];
    size_t F = (size_t)d->F, N = (size_t)d->N, B = (size_t)tr->B;
    uint64_t stream[MAX_WINDOW];
    for (int k = 0; k < K; k++) {
        size_t at = (size_t)((tr->t + k) % d->batches) * N;
        memcpy(tr->x[k], d->x + at * F, N * F * sizeof *tr->x[k]);
        memcpy(tr->y[k], d->y + at, N * sizeof *tr->y[k]);
        stream[k] = (uint64_t)(tr->t + k);
        for (size_t b = 0; b < B; b++)
            fb_array_hparams(tr->a, (int)b, tr->t + k + 1, 1000000, &tr->hp[k * B + b]);
    }
    if (fb_array_train_steps(tr->a, K, (const float *const *)tr->x, (const int32_t *const *)tr->y,
                             (int)N, stream, tr->hp, tr->loss, tr->correct, msg, sizeof msg))
        die("step", msg);
    tr->t += K;
}

/* n steps in windows of up to tr->window. */
static void trainer_run(trainer *tr, const data_pool *d, int n)
{
    for (int s = 0; s < n;) {
        int K = n - s < tr->window ? n - s : tr->window;
        trainer_steps(tr, d, K);
        s += K;
    }
}

/* Seconds spent in `steps` timed steps of B members (fused) or of B solo jobs
 * one after another (solo), warm-up steps excluded. */
static double run_train(fb_backend *be, const char *model, int B, bool fused, int steps,
                        int warmup, int window, const data_pool *d, double *cpu)
{
    double timed = 0;
    *cpu = 0;
    int jobs = fused ? 1 : B, per_job = fused ? B : 1;
    for (int j = 0; j < jobs; j++) {
        trainer tr;
        trainer_init(&tr, be, model, per_job, window, j, d);
        trainer_run(&tr, d, warmup);
        double t0 = fb_bench_now_s(), c0 = cpu_s();
        trainer_run(&tr, d, steps);
        timed += fb_bench_now_s() - t0;
        *cpu += cpu_s() - c0;
        trainer_free(&tr);
    }
    return timed;
}

/* GFLOP/s of OpenBLAS's own SGEMM, with its own threads, on square n x n
 * matrices: the median of reps calls after one warm-up call. */
static double sgemm_gflops(fb_backend *be, int n, int reps, int threads)
{
    size_t nn = (size_t)n * n;
    float *a = fb_backend_alloc(be, nn * sizeof(float)), *b = fb_backend_alloc(be, nn * sizeof(float));
    float *c = fb_backend_alloc(be, nn * sizeof(float));
    if (!a || !b || !c) die("sgemm", "out of memory");
    uint64_t st = 7;
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)(fb_bench_next_u64(&st) >> 40) * (1.0f / 16777216.0f) - 0.5f;
        b[i] = (float)(fb_bench_next_u64(&st) >> 40) * (1.0f / 16777216.0f) - 0.5f;
    }
    openblas_set_num_threads(threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double r[64];
    if (reps > 64) reps = 64;
    for (int i = 0; i < reps; i++) {
        double t0 = fb_bench_now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f,
                    c, n);
        r[i] = 2.0 * n * (double)n * n / (fb_bench_now_s() - t0) / 1e9;
    }
    double median = fb_bench_median(r, reps);
    fb_backend_free(be, a);
    fb_backend_free(be, b);
    fb_backend_free(be, c);
    return median;
}

/* charlm's minibatches: the records of DIR's split "train" in file order,
 * cut into whole minibatches of LM_BATCH. */
static data_pool load_tokens(const char *dir)
{
    char msg[MSG_CAP];
    fb_dataset ds;
    if (!dir) die("charlm", "--data DIR is required (a token dataset of context 64)");
    if (fb_datadir_load_split(&ds, dir, "train", msg, sizeof msg)) die(dir, msg);
    const int F = ds.C * ds.H * ds.W;
    if (F != LM_T + 1) die(dir, "records are not of 65 tokens (import with --context 64)");
    if (ds.n < LM_BATCH) die(dir, "fewer records than one minibatch of 32");
    data_pool d = {.x = ds.x, .y = ds.y, .batches = (int)(ds.n / LM_BATCH), .N = LM_BATCH, .F = F};
    return d;
}

/* Peak RSS (KiB) of a child that trains B members fused (or 1 member). */
static long child_rss(fb_backend *be, const char *model, int B, int steps, int window,
                      const data_pool *d)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) die("fork", "failed");
    if (pid == 0) {
        trainer tr;
        trainer_init(&tr, be, model, B, window, 0, d);
        trainer_run(&tr, d, steps);
        trainer_free(&tr);
        _exit(0);
    }
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("rss", "child failed");
    return ru.ru_maxrss;
}

static void usage(void)
{
    fprintf(stderr, "usage: fusion_bench train --model mlp|cnn|charlm --mode fused|solo|fused,solo "
                    "--threads T --B LIST [--work K | --steps S] [--warmup W] [--window K] [--data DIR]\n"
                    "       fusion_bench tokens --data DIR --out FILE\n"
                    "       fusion_bench sgemm --threads T [--n N] [--reps R]\n"
                    "       fusion_bench rss --model mlp|cnn --B B [--threads T] [--steps S]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 2) usage();
    const char *cmd = argv[1], *model = "mlp", *mode = "fused", *data = NULL, *out = NULL;
    int threads = 1, steps = 0, work = 64, warmup = 3, n = 2048, reps = 5, Bs[16] = {1}, nB = 1;
    int window = 1;
    for (int i = 2; i < argc; i += 2) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage();
        if (strcmp(k, "--model") == 0)
            model = v;
        else if (strcmp(k, "--mode") == 0)
            mode = v;
        else if (strcmp(k, "--threads") == 0)
            threads = atoi(v);
        else if (strcmp(k, "--steps") == 0)
            steps = atoi(v);
        else if (strcmp(k, "--work") == 0)
            work = atoi(v);
        else if (strcmp(k, "--warmup") == 0)
            warmup = atoi(v);
        else if (strcmp(k, "--window") == 0)
            window = atoi(v);
        else if (strcmp(k, "--n") == 0)
            n = atoi(v);
        else if (strcmp(k, "--reps") == 0)
            reps = atoi(v);
        else if (strcmp(k, "--data") == 0)
            data = v;
        else if (strcmp(k, "--out") == 0)
            out = v;
        else if (strcmp(k, "--B") == 0)
            nB = fb_bench_parse_list("--B", v, MAX_B, Bs, 16);
        else
            usage();
    }
    if (strcmp(model, "mlp") != 0 && strcmp(model, "cnn") != 0 && strcmp(model, "charlm") != 0)
        usage();
    if (threads < 1 || steps < 0 || work < 1 || warmup < 0 || n < 1 || reps < 1 ||
        window < 1 || window > MAX_WINDOW)
        usage();
    fb_backend *be = fb_backend_cpu();
    fb_backend_set_threads(be, threads);

    if (strcmp(cmd, "sgemm") == 0) {
        printf("sgemm threads=%d n=%d gflops=%.2f\n", threads, n, sgemm_gflops(be, n, reps, threads));
        return 0;
    }
    if (strcmp(cmd, "tokens") == 0) {
        if (!out) usage();
        data_pool d = load_tokens(data);
        FILE *f = fopen(out, "wb");
        if (!f) die(out, "cannot create");
        size_t n = (size_t)d.batches * d.N * d.F;
        for (size_t i = 0; i < n; i++) {
            int32_t v = (int32_t)d.x[i];
            if (fwrite(&v, sizeof v, 1, f) != 1) die(out, "write failed");
        }
        if (fclose(f)) die(out, "write failed");
        return 0;
    }
    data_pool d = strcmp(model, "charlm") == 0 ? load_tokens(data) : fb_bench_make_data();
    if (strcmp(cmd, "train") == 0) {
        static const char *const modes[] = {"fused", "solo"};
        bool run_mode[2] = {false, false};
        if (strcmp(mode, "fused") == 0) run_mode[0] = true;
        else if (strcmp(mode, "solo") == 0) run_mode[1] = true;
        else if (strcmp(mode, "fused,solo") == 0) run_mode[0] = run_mode[1] = true;
        else usage();
        fb_job_spec *s = fb_bench_spec("bench", model, 0);
        double flops = fb_bench_model_flops(s, d.N);
        fb_job_spec_free(s);
        free(s);
        for (int i = 0; i < nB; i++) {
            int S = steps ? steps : (work + Bs[i] - 1) / Bs[i];
            if (S < 2) S = 2;
            for (int m = 0; m < 2; m++) {
                if (!run_mode[m]) continue;
                double cpu, t = run_train(be, model, Bs[i], m == 0, S, warmup, window, &d, &cpu);
                double sps = (double)Bs[i] * S * d.N / t;
                printf("train impl=fusebox-%s model=%s threads=%d B=%d sps=%.1f gflops=%.2f "
                       "cpu_sps=%.1f\n",
                       modes[m], model, threads, Bs[i], sps, flops * Bs[i] * S / t / 1e9,
                       (double)Bs[i] * S * d.N / cpu);
                fflush(stdout);
            }
        }
    } else if (strcmp(cmd, "rss") == 0) {
        int B = Bs[0], S = steps ? steps : 3;
        long fused = child_rss(be, model, B, S, window, &d), sum = 0, mx = 0;
        for (int b = 0; b < B; b++) {
            long r = child_rss(be, model, 1, S, window, &d);
            sum += r;
            if (r > mx) mx = r;
        }
        printf("rss model=%s B=%d fused_kib=%ld solo_sum_kib=%ld solo_max_kib=%ld\n", model, B,
               fused, sum, mx);
    } else {
        usage();
    }
    free(d.x);
    free(d.y);
    return 0;
}
