/*
 * Private side of the CUDA backend: its context, error recording and launch
 * helpers, shared by the .cu files of kernels/cuda/ and by nothing else.
 *
 * Ops return nothing (backend_impl.h), so a failed call is recorded in the
 * context as a sticky error (cuda_backend.h, fb_cuda_backend_error) and every
 * later op returns at once.  All work is queued on one compute stream; memory
 * the ops need for themselves (cuDNN workspace, per-row partial sums, host
 * arguments copied to the device) lives in grow-only buffers of the context,
 * which only grow the first time a shape is seen, so a training step in
 * steady state makes no cudaMalloc.
 */
#ifndef FB_KERNELS_CUDA_INTERNAL_H
#define FB_KERNELS_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "errors.h"
}
#include "../backend_impl.h"
#include "cuda_backend.h"

/* A block handed out by the pool, or kept for reuse after fb_backend_free. */
struct fbc_block {
    void *ptr;
    size_t bytes; /* rounded size class */
    struct fbc_block *next;
};

/* A grow-only device buffer (the pool never hands these out). */
struct fbc_buf {
    void *ptr;
    size_t bytes;
};

/* The usable algorithms of one convolution direction, in cuDNN's heuristic
 * order, with the math type cuDNN ranked each with (set on the descriptor
 * before its workspace query and every run of it, as an algorithm's
 * workspace and kernels depend on both) and the workspace each needs; cur is
 * the one in use (the timed
 * search may move it to a faster one; the next is tried when cuDNN refuses
 * the current one for this shape at run time).  searched is set once the
 * timed search of this direction has run, so it runs once per plan. */
#define FBC_CONV_CANDIDATES 8
struct fbc_conv_algos {
    int n, cur;
    int searched;
    int algo[FBC_CONV_CANDIDATES];
    cudnnMathType_t math[FBC_CONV_CANDIDATES];
    size_t ws[FBC_CONV_CANDIDATES];
};

/* How a plan picks its algorithms (FUSEBOX_CUDNN_SEARCH): cuDNN's heuristic
 * ranking alone, or that ranking's candidates timed on the device. */
enum { FBC_SEARCH_HEURISTIC = 0, FBC_SEARCH_TIMED = 1 };

/* One cached convolution shape: descriptors and the chosen algorithms.
 * Keyed by the geometry, the TF32 setting and the search mode. */
struct fbc_conv_plan {
    fb_conv_geom g;
    int tf32;
    int search;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    struct fbc_conv_algos fwd, bwd_data, bwd_filter;
};

#define FBC_LIVE_BUCKETS 1024

/* Bits of the device flag (fbc_ctx.flag), set with atomicOr by a kernel that
 * met bad input and turned into FB_ERR_DATA by fb_backend_sync. */
#define FBC_FLAG_LABEL 1 /* softmax_xent: a label outside [0, K) */
#define FBC_FLAG_TOKEN 2 /* embedding: a token id outside [0, V) */

struct fbc_ctx {
    int device;
    int sm_count;
    cudaStream_t stream;      /* every op */
    cudaStream_t comm_stream; /* for collectives (fb_cuda_backend_stream) */
    cublasHandle_t blas;
    cudnnHandle_t dnn;
    int tf32;

    /* Sticky error: the first failure, its fb_err code and message. */
    int err;
    char err_msg[256];

    /* Memory pool: live blocks hashed by pointer, freed blocks in one list. */
    struct fbc_block *live[FBC_LIVE_BUCKETS];
    struct fbc_block *cached;
    fb_cuda_pool_stats stats;

    /* Grow-only buffers for the ops' own use. */
    struct fbc_buf ws;      /* cuDNN workspace */
    struct fbc_buf red;     /* partial sums of the loss reductions */
    struct fbc_buf stage;   /* host arguments (seeds, hparams, blocks) */
    int *flag;              /* device: FBC_FLAG_* bits set by kernels that met bad input */
    cudaEvent_t ev[2];      /* start and end of a timed convolution run */

    struct fbc_conv_plan *plans;
    int n_plans, cap_plans;

    /* Serialises the pool between threads (alloc and free may come from any
     * thread; ops of one backend come from one thread at a time). */
    pthread_mutex_t lock;
};

/* The context of a CUDA backend. */
static inline struct fbc_ctx *fbc_ctx_of(fb_backend *be)
{
    return (struct fbc_ctx *)be->ctx;
}

/* Records the first error (later ones are dropped: the first is the cause)
 * and prints it once to stderr.  Returns err. */
int fbc_fail(struct fbc_ctx *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Records a failed runtime call (clearing the runtime's last error); false
 * when e is an error. */
bool fbc_cuda_ok(struct fbc_ctx *c, cudaError_t e, const char *what, const char *file, int line);
bool fbc_blas_ok(struct fbc_ctx *c, cublasStatus_t s, const char *what, const char *file, int line);
bool fbc_dnn_ok(struct fbc_ctx *c, cudnnStatus_t s, const char *what, const char *file, int line);

#define FBC_CUDA(c, call) fbc_cuda_ok((c), (call), #call, __FILE__, __LINE__)
#define FBC_BLAS(c, call) fbc_blas_ok((c), (call), #call, __FILE__, __LINE__)
#define FBC_DNN(c, call) fbc_dnn_ok((c), (call), #call, __FILE__, __LINE__)
/* After a kernel launch: a bad configuration shows up here. */
#define FBC_LAUNCHED(c, name) fbc_cuda_ok((c), cudaGetLastError(), name, __FILE__, __LINE__)

/*
 * Every op starts with this: returns the context, or NULL when an earlier
 * error stopped the backend or the device cannot be made current on this
 * thread (then the op returns without doing anything).
 */
struct fbc_ctx *fbc_begin(fb_backend *be);

/* Device scratch of at least `bytes` in buf, grown (after waiting for queued
 * work that may still read the old one) when too small; NULL on failure. */
void *fbc_buf_get(struct fbc_ctx *c, struct fbc_buf *buf, size_t bytes, const char *what);

/* Device memory from the backend's pool (fb_backend_alloc's), for an op's
 * short-lived scratch; NULL when the device is out of memory (no error is
 * recorded).  fbc_pool_free returns it to the pool. */
void *fbc_pool_alloc(fb_backend *be, size_t bytes);
void fbc_pool_free(fb_backend *be, void *p);

/* Copies `bytes` of host memory into the staging buffer at byte offset `off`
 * (a multiple of 16) and returns the device address, or NULL.  The copy is
 * queued on the compute stream; the host memory may be reused on return. */
void *fbc_stage(struct fbc_ctx *c, size_t off, const void *host, size_t bytes);

/* Blocks of 256 threads for a grid-stride loop over n items: enough to fill
 * the device a few times over, never more than needed, at least one. */
static inline unsigned fbc_grid(const struct fbc_ctx *c, size_t n, unsigned threads)
{
    size_t want = (n + threads - 1) / threads;
    size_t cap = (size_t)(c->sm_count > 0 ? c->sm_count : 16) * 32;
    if (want > cap) want = cap;
    return want ? (unsigned)want : 1u;
}

/* ---- op entry points (one per table slot), by file ---- */

extern "C" {
/* cuda_blas.cu */
void fbc_linear_forward(fb_backend *be, float *out, const float *in, const float *w,
                        const float *bias, int N, int B, int I, int O, bool shared);
void fbc_linear_backward(fb_backend *be, float *din, float *dw, float *dbias, const float *dout,
                         const float *in, const float *w, int N, int B, int I, int O, bool shared);
void fbc_sgemm(fb_backend *be, float *c, const float *a, const float *b, int M, int N, int K);

/* cuda_conv.cu */
void fbc_conv2d_forward(fb_backend *be, float *out, const float *in, const float *w,
                        const float *bias, const fb_conv_geom *g, float *scratch);
void fbc_conv2d_backward(fb_backend *be, float *din, float *dw, float *dbias, const float *dout,
                         const float *in, const float *w, const fb_conv_geom *g, float *scratch);

/* cuda_ops.cu */
void fbc_maxpool2d_forward(fb_backend *be, float *out, int32_t *argmax, const float *in,
                           const fb_pool_geom *g);
void fbc_maxpool2d_backward(fb_backend *be, float *din, const float *dout, const int32_t *argmax,
                            const fb_pool_geom *g);
void fbc_avgpool2d_forward(fb_backend *be, float *out, const float *in, const fb_pool_geom *g);
void fbc_avgpool2d_backward(fb_backend *be, float *din, const float *dout,
                            const fb_pool_geom *g);
void fbc_global_avgpool_forward(fb_backend *be, float *out, const float *in, int N, int BC,
                                int HW);
void fbc_global_avgpool_backward(fb_backend *be, float *din, const float *dout, int N, int BC,
                                 int HW);
void fbc_act_forward(fb_backend *be, fb_act act, float *out, const float *in, size_t n);
void fbc_act_backward(fb_backend *be, fb_act act, float *din, const float *dout,
                      const float *in, const float *out, size_t n);
void fbc_add_forward(fb_backend *be, float *out, const float *a, const float *b, size_t n);
void fbc_accumulate(fb_backend *be, float *y, const float *x, size_t n);
void fbc_dropout_forward(fb_backend *be, float *out, const float *in, const uint64_t *seeds,
                         uint64_t stream, float p, int N, int B, int F, int64_t n_offset);
void fbc_dropout_backward(fb_backend *be, float *din, const float *dout, const uint64_t *seeds,
                          uint64_t stream, float p, int N, int B, int F, int64_t n_offset);
void fbc_batchnorm_forward_train(fb_backend *be, float *out, float *mean, float *rstd,
                                 float *running_mean, float *running_var, const float *in,
                                 const float *gamma, const float *beta, int N, int BC, int HW,
                                 float eps, float momentum);
void fbc_batchnorm_forward_eval(fb_backend *be, float *out, const float *in, const float *gamma,
                                const float *beta, const float *running_mean,
                                const float *running_var, int N, int BC, int HW, float eps);
void fbc_batchnorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                            const float *dout, const float *in, const float *mean,
                            const float *rstd, const float *gamma, int N, int BC, int HW);
void fbc_layernorm_forward(fb_backend *be, float *out, float *mean, float *rstd, const float *in,
                           const float *gamma, const float *beta, int N, int B, int F, float eps);
void fbc_layernorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                            const float *dout, const float *in, const float *mean,
                            const float *rstd, const float *gamma, int N, int B, int F);
void fbc_softmax_xent(fb_backend *be, float *loss, float *dlogits, float *correct,
                      const float *logits, const int32_t *labels, int N, int B, int K,
                      float grad_scale);
void fbc_mse(fb_backend *be, float *loss, float *dpred, const float *pred, const float *target,
             int N, int B, int K, float grad_scale);
void fbc_optim_step(fb_backend *be, fb_optim_kind kind, float *params, const float *grads,
                    float *state1, float *state2, const fb_param_block *blocks, int n_blocks,
                    int B, const fb_optim_hparams *hp);
void fbc_round_bf16(fb_backend *be, float *out, const float *in, size_t n);
void fbc_grad_unscale(fb_backend *be, float *flags, float *grads, const float *inv_scales,
                      const fb_param_block *blocks, int n_blocks, int B);
void fbc_scale_members(fb_backend *be, float *x, const float *scales, int N, int B, size_t F);

/* cuda_seq.cu */
int fbc_embedding_forward(fb_backend *be, float *out, const int32_t *ids, const float *table,
                          int N, int T, int B, int V, int D, char *msg, size_t msg_cap);
int fbc_embedding_backward(fb_backend *be, float *dtable, const float *dout, const int32_t *ids,
                           int N, int T, int B, int V, int D, char *msg, size_t msg_cap);
void fbc_positional_forward(fb_backend *be, float *out, const float *in, const float *pos, int N,
                            int T, int B, int L, int D);
void fbc_positional_backward(fb_backend *be, float *din, float *dpos, const float *dout, int N,
                             int T, int B, int L, int D);
size_t fbc_attention_scratch_floats(const fb_backend *be, int N, int T, int B, int H);
void fbc_attention_forward(fb_backend *be, float *out, float *probs, const float *qkv, int N,
                           int T, int B, int D, int H, bool causal, float *scratch);
void fbc_attention_backward(fb_backend *be, float *dqkv, const float *dout, const float *probs,
                            const float *qkv, int N, int T, int B, int D, int H, float *scratch);
void fbc_seq_pool_forward(fb_backend *be, fb_seq_pool kind, float *out, const float *in, int N,
                          int T, int B, int D);
void fbc_seq_pool_backward(fb_backend *be, fb_seq_pool kind, float *din, const float *dout, int N,
                           int T, int B, int D);

/* Launches the per-channel sum: out[c] += sum over n, i of x[n, c, i] for x
 * [N, C, HW] (dbias of linear with HW = 1, of conv2d with HW = Ho Wo). */
void fbc_channel_sum_acc(struct fbc_ctx *c, float *out, const float *x, int N, int C, int HW);
/* Launches out[n, c, i] += bias[c] over [N, C, HW]. */
void fbc_bias_add(struct fbc_ctx *c, float *out, const float *bias, int N, int C, int HW);
}

#endif
