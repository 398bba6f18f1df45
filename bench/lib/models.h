/*
 * What the throughput benchmarks (bench/fusion on the CPU, bench/gpu on a
 * GPU) train, in one place so that their tables compare the same work: the
 * issue's MLP (784-256-128-10) and small CNN on Fashion-MNIST-shaped
 * synthetic data, batch 128, and a byte-level character language model
 * ("charlm": T = 64, D = 128, two pre-LayerNorm transformer blocks of 4
 * heads, batch 32, Adam) on a text corpus the caller loads; one spec per
 * member as a hyperparameter sweep makes them, and the training FLOPs both
 * count.  Every function exits the
 * program with a message on failure: these are benchmark programs.
 */
#ifndef FB_BENCH_MODELS_H
#define FB_BENCH_MODELS_H

#include <stdint.h>

#include "jobspec.h"

#define BATCH 128
#define SIDE 28
#define CLASSES 10
#define POOL 4      /* distinct synthetic minibatches, used in turn */
#define LM_T 64     /* charlm: positions per sample (records of LM_T + 1 tokens) */
#define LM_BATCH 32 /* charlm: samples per step */

/* splitmix64: the synthetic data and the members' hyperparameters. */
uint64_t fb_bench_next_u64(uint64_t *s);

/* Member i's spec of model "mlp", "cnn" or "charlm", named
 * "<prefix>-<model>-<i>": its own seed and learning rate, as a sweep makes
 * them.  The caller frees it with fb_job_spec_free and free. */
fb_job_spec *fb_bench_spec(const char *prefix, const char *model, int i);

/* Samples per step of a model: BATCH, or LM_BATCH for "charlm". */
int fb_bench_batch(const char *model);

/*
 * Multiply-add FLOPs (x2) of one training step of one member on N samples:
 * every linear and conv layer's forward GEMM, its weight-gradient GEMM, and
 * its input-gradient GEMM except for the first layer (its input is the data,
 * which needs no gradient; PyTorch skips it too).  A linear on a sequence
 * counts once per position; a transformer block counts its four linears
 * (qkv, out, the MLP's two) and its attention's GEMMs (Q K^T and P V forward,
 * four of the same size backward, over all T x T scores: the causal mask
 * does not shrink them).  An embedding is a gather, not a GEMM, and its
 * output needs a gradient, so the layers after it count three GEMMs.
 */
double fb_bench_model_flops(const fb_job_spec *s, int N);

/* Minibatches used in turn: x [batches * N, F], y [batches * N].
 * fb_bench_make_data's are POOL synthetic ones of N = BATCH, F = SIDE * SIDE,
 * x uniform in [0, 1), y in [0, CLASSES), the same in every run. */
typedef struct data_pool {
    float *x;
    int32_t *y;
    int batches, N, F;
} data_pool;

data_pool fb_bench_make_data(void);

/* Monotonic seconds. */
double fb_bench_now_s(void);

/* A comma-separated list of 1..max integers, at most cap of them, into out;
 * returns the count.  Exits with a message naming flag on anything else. */
int fb_bench_parse_list(const char *flag, const char *s, int max, int *out, int cap);

/* The median of v[0..n), n >= 1, which it sorts. */
double fb_bench_median(double *v, int n);

#endif
