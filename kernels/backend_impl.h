/*
 * Private side of the kernels backend interface.
 *
 * A backend is a name, a table of function pointers (one per op direction and
 * per memory function) and a context pointer the backend owns.  Each backend
 * fills one `static const struct fb_backend_ops` with designated initialisers;
 * an op it lacks is a NULL entry, which fb_backend_supports() reports and the
 * public wrappers in backend.c refuse to call.  Every entry receives the
 * backend handle first, then the arguments of the public function unchanged.
 * Only backend implementations include this header.
 */
#ifndef FB_KERNELS_BACKEND_IMPL_H
#define FB_KERNELS_BACKEND_IMPL_H

#include "kernels.h"

#include <stdio.h>
#include <stdlib.h>


struct fb_backend_ops {
    /* ---- memory and control ---- */
    void *(*alloc)(fb_backend *be, size_t bytes);
    void (*free)(fb_backend *be, void *p);
    void (*zero)(fb_backend *be, void *p, size_t bytes);
    void (*copy)(fb_backend *be, void *dst, const void *src, size_t bytes);
    void (*upload)(fb_backend *be, void *dst, const void *host, size_t bytes);
    void (*download)(fb_backend *be, void *host, const void *src, size_t bytes);
    void (*sync)(fb_backend *be);
    /* May be NULL: the wrapper then only records the count in be->threads. */
    void (*set_threads)(fb_backend *be, int n);

    /* ---- linear ---- */
    void (*linear_forward)(fb_backend *be, float *out, const float *in, const float *w,
                           const float *bias, int N, int B, int I, int O, bool shared);
    void (*linear_backward)(fb_backend *be, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w, int N, int B, int I,
                            int O, bool shared);

    /* ---- conv2d ---- */
    /* May be NULL: the backend needs no scratch memory. */
    size_t (*conv2d_scratch_floats)(const fb_backend *be, const fb_conv_geom *g);
    void (*conv2d_forward)(fb_backend *be, float *out, const float *in, const float *w,
                           const float *bias, const fb_conv_geom *g, float *scratch);
    void (*conv2d_backward)(fb_backend *be, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w,
                            const fb_conv_geom *g, float *scratch);

    /* ---- pooling ---- */
    void (*maxpool2d_forward)(fb_backend *be, float *out, int32_t *argmax, const float *in,
                              const fb_pool_geom *g);
    void (*maxpool2d_backward)(fb_backend *be, float *din, const float *dout,
                               const int32_t *argmax, const fb_pool_geom *g);
    /* optional: din = what zeroing it and maxpool2d_backward leave */
    void (*maxpool2d_backward_set)(fb_backend *be, float *din, const float *dout,
                                   const int32_t *argmax, const fb_pool_geom *g);
    void (*avgpool2d_forward)(fb_backend *be, float *out, const float *in, const fb_pool_geom *g);
    void (*avgpool2d_backward)(fb_backend *be, float *din, const float *dout,
                               const fb_pool_geom *g);
    void (*global_avgpool_forward)(fb_backend *be, float *out, const float *in, int N, int BC,
                                   int HW);
    void (*global_avgpool_backward)(fb_backend *be, float *din, const float *dout, int N, int BC,
                                    int HW);

    /* ---- elementwise ---- */
    void (*act_forward)(fb_backend *be, fb_act act, float *out, const float *in, size_t n);
    void (*act_backward)(fb_backend *be, fb_act act, float *din, const float *dout,
                         const float *in, const float *out, size_t n);
    /* optional: din = what zeroing it and act_backward leave */
    void (*act_backward_set)(fb_backend *be, fb_act act, float *din, const float *dout,
                             const float *in, const float *out, size_t n);
    void (*add_forward)(fb_backend *be, float *out, const float *a, const float *b, size_t n);
    void (*accumulate)(fb_backend *be, float *y, const float *x, size_t n);
    void (*dropout_forward)(fb_backend *be, float *out, const float *in, const uint64_t *seeds,
                            uint64_t stream, float p, int N, int B, int F, int64_t n_offset);
    void (*dropout_backward)(fb_backend *be, float *din, const float *dout, const uint64_t *seeds,
                             uint64_t stream, float p, int N, int B, int F, int64_t n_offset);

    /* ---- normalisation ---- */
    void (*batchnorm_forward_train)(fb_backend *be, float *out, float *mean, float *rstd,
                                    float *running_mean, float *running_var, const float *in,
                                    const float *gamma, const float *beta, int N, int BC, int HW,
                                    float eps, float momentum);
    void (*batchnorm_forward_eval)(fb_backend *be, float *out, const float *in,
                                   const float *gamma, const float *beta, const float *running_mean,
                                   const float *running_var, int N, int BC, int HW, float eps);
    void (*batchnorm_backward)(fb_backend *be, float *din, float *dgamma, float *dbeta,
                               const float *dout, const float *in, const float *mean,
                               const float *rstd, const float *gamma, int N, int BC, int HW);
    void (*layernorm_forward)(fb_backend *be, float *out, float *mean, float *rstd,
                              const float *in, const float *gamma, const float *beta, int N, int B,
                              int F, float eps);
    void (*layernorm_backward)(fb_backend *be, float *din, float *dgamma, float *dbeta,
                               const float *dout, const float *in, const float *mean,
                               const float *rstd, const float *gamma, int N, int B, int F);

    /* ---- sequences ---- */
    int (*embedding_forward)(fb_backend *be, float *out, const int32_t *ids, const float *table,
                             int N, int T, int B, int V, int D, char *msg, size_t msg_cap);
    int (*embedding_backward)(fb_backend *be, float *dtable, const float *dout, const int32_t *ids,
                              int N, int T, int B, int V, int D, char *msg, size_t msg_cap);
    void (*positional_forward)(fb_backend *be, float *out, const float *in, const float *pos,
                               int N, int T, int B, int L, int D);
    void (*positional_backward)(fb_backend *be, float *din, float *dpos, const float *dout, int N,
                                int T, int B, int L, int D);
    /* May be NULL: the backend needs no scratch memory. */
    size_t (*attention_scratch_floats)(const fb_backend *be, int N, int T, int B, int H);
    void (*attention_forward)(fb_backend *be, float *out, float *probs, const float *qkv, int N,
                              int T, int B, int D, int H, bool causal, float *scratch);
    void (*attention_backward)(fb_backend *be, float *dqkv, const float *dout, const float *probs,
                               const float *qkv, int N, int T, int B, int D, int H,
                               float *scratch);
    void (*seq_pool_forward)(fb_backend *be, fb_seq_pool kind, float *out, const float *in, int N,
                             int T, int B, int D);
    void (*seq_pool_backward)(fb_backend *be, fb_seq_pool kind, float *din, const float *dout,
                              int N, int T, int B, int D);

    /* ---- losses ---- */
    void (*softmax_xent)(fb_backend *be, float *loss, float *dlogits, float *correct,
                         const float *logits, const int32_t *labels, int N, int B, int K,
                         float grad_scale);
    void (*mse)(fb_backend *be, float *loss, float *dpred, const float *pred, const float *target,
                int N, int B, int K, float grad_scale);

    /* ---- optimizers ---- */
    void (*optim_step)(fb_backend *be, fb_optim_kind kind, float *params, const float *grads,
                       float *state1, float *state2, const fb_param_block *blocks, int n_blocks,
                       int B, const fb_optim_hparams *hp);

    /* ---- bf16 ---- */
    void (*round_bf16)(fb_backend *be, float *out, const float *in, size_t n);
    void (*grad_unscale)(fb_backend *be, float *flags, float *grads, const float *inv_scales,
                         const fb_param_block *blocks, int n_blocks, int B);
    void (*scale_members)(fb_backend *be, float *x, const float *scales, int N, int B, size_t F);

    /* ---- GEMM ---- */
    void (*sgemm)(fb_backend *be, float *c, const float *a, const float *b, int M, int N, int K);
};

struct fb_backend {
    const char *name;
    const struct fb_backend_ops *ops;
    void *ctx;   /* owned by the backend (streams, handles); NULL on the CPU */
    int threads; /* last count given to fb_backend_set_threads; 0 = default */
    bool clone;  /* made by fb_backend_clone_threads: its struct alone is malloc'd */
};

#endif
