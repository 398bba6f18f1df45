/*
 * Public entry points of the kernels: each checks that the backend implements
 * the call, checks cheap invariants of its sizes, and forwards to the
 * backend's table (backend_impl.h).  Geometry helpers live here too, since
 * they are the same for every backend.
 */
#include "backend_impl.h"
#include "cuda/cuda_backend.h"

#include <string.h>

#include "errors.h"

#define FB_OP_FN(be, fn)                                                                           \
    do {                                                                                           \
        FB_ASSERT((be) != NULL);                                                                   \
        FB_ASSERT((be)->ops->fn != NULL);                                                          \
    } while (0)

/* ---- backends ------------------------------------------------------------ */

#ifndef FB_HAVE_CUDA
/* Without CUDA built in there is no CUDA backend; kernels/cuda provides this
 * function and those of cuda/cuda_backend.h when FB_HAVE_CUDA is defined.
 * These stand-ins let callers use them without #ifdef. */
fb_backend *fb_backend_cuda(int device)
{
    (void)device;
    return NULL;
}

/* No CUDA backend exists in this build: FB_ERR_UNSUPPORTED, *out untouched. */
int fb_cuda_backend_get(int device, fb_backend **out, char *msg, size_t msg_cap)
{
    (void)out;
    if (msg && msg_cap > 0)
        snprintf(msg, msg_cap, "CUDA device %d: fusebox was built without CUDA", device);
    return FB_ERR_UNSUPPORTED;
}

/* Always false: no backend of this build is CUDA. */
bool fb_backend_is_cuda(const fb_backend *be)
{
    (void)be;
    return false;
}

/* No stream outside CUDA. */
void *fb_cuda_backend_stream(fb_backend *be, int which)
{
    (void)be;
    (void)which;
    return NULL;
}

/* A backend that is not CUDA has no recorded error. */
int fb_cuda_backend_error(fb_backend *be, char *msg, size_t msg_cap)
{
    (void)be;
    (void)msg;
    (void)msg_cap;
    return FB_OK;
}

/* Nothing to clear outside CUDA. */
void fb_cuda_backend_clear_error(fb_backend *be)
{
    (void)be;
}

/* TF32 exists only on CUDA. */
void fb_cuda_backend_set_tf32(fb_backend *be, bool on)
{
    (void)be;
    (void)on;
}

/* Zero counters outside CUDA. */
void fb_cuda_backend_pool_stats(fb_backend *be, fb_cuda_pool_stats *out)
{
    (void)be;
    if (out) memset(out, 0, sizeof *out);
}

/* No pool to trim outside CUDA. */
void fb_cuda_backend_trim(fb_backend *be)
{
    (void)be;
}
#endif

/* The backend's short name ("cpu", "cpu-ref", "cuda"); "(null)" for NULL. */
const char *fb_backend_name(const fb_backend *be)
{
    return be ? be->name : "(null)";
}

/* Whether every table entry op needs is present. */
bool fb_backend_supports(const fb_backend *be, fb_op op)
{
    if (!be) return false;
    const struct fb_backend_ops *o = be->ops;
    switch (op) {
    case FB_OP_LINEAR:
        return o->linear_forward && o->linear_backward;
    case FB_OP_CONV2D:
        return o->conv2d_forward && o->conv2d_backward;
    case FB_OP_MAXPOOL2D:
        return o->maxpool2d_forward && o->maxpool2d_backward;
    case FB_OP_AVGPOOL2D:
        return o->avgpool2d_forward && o->avgpool2d_backward;
    case FB_OP_GLOBAL_AVGPOOL:
        return o->global_avgpool_forward && o->global_avgpool_backward;
    case FB_OP_ACT:
        return o->act_forward && o->act_backward;
    case FB_OP_DROPOUT:
        return o->dropout_forward && o->dropout_backward;
    case FB_OP_BATCHNORM:
        return o->batchnorm_forward_train && o->batchnorm_forward_eval && o->batchnorm_backward;
    case FB_OP_LAYERNORM:
        return o->layernorm_forward && o->layernorm_backward;
    case FB_OP_ADD:
        return o->add_forward && o->accumulate;
    case FB_OP_SOFTMAX_XENT:
        return o->softmax_xent != NULL;
    case FB_OP_MSE:
        return o->mse != NULL;
    case FB_OP_OPTIM:
        return o->optim_step != NULL;
    case FB_OP_BF16:
        return o->round_bf16 && o->grad_unscale && o->scale_members;
    case FB_OP_EMBEDDING:
        return o->embedding_forward && o->embedding_backward;
    case FB_OP_POSITIONAL:
        return o->positional_forward && o->positional_backward;
    case FB_OP_ATTENTION:
        return o->attention_forward && o->attention_backward;
    case FB_OP_SEQ_POOL:
        return o->seq_pool_forward && o->seq_pool_backward;
    case FB_OP_COUNT:
        break;
    }
    return false;
}

/* Records n and passes it to the backend (on the fast CPU backend, the
 * OpenMP threads its ops use, with OpenBLAS single-threaded inside each).
 * n <= 0 asks for the backend's default. */
void fb_backend_set_threads(fb_backend *be, int n)
{
    FB_ASSERT(be != NULL);
    be->threads = n > 0 ? n : 0;
    if (be->ops->set_threads) be->ops->set_threads(be, be->threads);
}

int fb_backend_threads(const fb_backend *be)
{
    FB_ASSERT(be != NULL);
    return be->threads;
}

/* A copy of the handle: a backend's state lives behind ctx, which the copy
 * shares, so that the thread count is all that tells the two apart. */
fb_backend *fb_backend_clone_threads(const fb_backend *be, int n)
{
    FB_ASSERT(be != NULL);
    fb_backend *c = malloc(sizeof *c);
    if (!c) return NULL;
    *c = *be;
    c->clone = true;
    fb_backend_set_threads(c, n);
    return c;
}

void fb_backend_clone_free(fb_backend *clone)
{
    if (!clone) return;
    FB_ASSERT(clone->clone); /* a backend's own handle is not the caller's to free */
    free(clone);
}

/* ---- memory -------------------------------------------------------------- */

/* Zeroed, 64-byte aligned backend memory of `bytes`, or NULL. */
void *fb_backend_alloc(fb_backend *be, size_t bytes)
{
    FB_OP_FN(be, alloc);
    return be->ops->alloc(be, bytes);
}

/* Releases memory from fb_backend_alloc; accepts NULL. */
void fb_backend_free(fb_backend *be, void *p)
{
    if (!p) return;
    FB_OP_FN(be, free);
    be->ops->free(be, p);
}

/* Sets `bytes` of backend memory at p to zero. */
void fb_backend_zero(fb_backend *be, void *p, size_t bytes)
{
    FB_OP_FN(be, zero);
    if (bytes) be->ops->zero(be, p, bytes);
}

/* Copies within backend memory; the ranges must not overlap. */
void fb_backend_copy(fb_backend *be, void *dst, const void *src, size_t bytes)
{
    FB_OP_FN(be, copy);
    if (bytes) be->ops->copy(be, dst, src, bytes);
}

/* Copies host memory into backend memory. */
void fb_backend_upload(fb_backend *be, void *dst, const void *host, size_t bytes)
{
    FB_OP_FN(be, upload);
    if (bytes) be->ops->upload(be, dst, host, bytes);
}

/* Copies backend memory into host memory. */
void fb_backend_download(fb_backend *be, void *host, const void *src, size_t bytes)
{
    FB_OP_FN(be, download);
    if (bytes) be->ops->download(be, host, src, bytes);
}

/* Waits until queued work has finished (no-op on the CPU). */
void fb_backend_sync(fb_backend *be)
{
    FB_ASSERT(be != NULL);
    if (be->ops->sync) be->ops->sync(be);
}

/* ---- linear -------------------------------------------------------------- */

/* See kernels.h: out[N, B, O] = in[N, Bi, I] . w[B, O, I]^T + bias[B, O]. */
void fb_linear_forward(fb_backend *be, float *out, const float *in, const float *w,
                       const float *bias, int N, int B, int I, int O, bool shared)
{
    FB_OP_FN(be, linear_forward);
    FB_ASSERT(N >= 0 && B >= 1 && I >= 1 && O >= 1);
    be->ops->linear_forward(be, out, in, w, bias, N, B, I, O, shared);
}

/* See kernels.h: accumulates din (may be NULL), dw and dbias (may be NULL). */
void fb_linear_backward(fb_backend *be, float *din, float *dw, float *dbias, const float *dout,
                        const float *in, const float *w, int N, int B, int I, int O, bool shared)
{
    FB_OP_FN(be, linear_backward);
    FB_ASSERT(N >= 0 && B >= 1 && I >= 1 && O >= 1);
    FB_ASSERT(dw != NULL);
    be->ops->linear_backward(be, din, dw, dbias, dout, in, w, N, B, I, O, shared);
}

/* ---- conv2d -------------------------------------------------------------- */

/* Output size of a window of k with stride s and padding p over n, as in
 * PyTorch (floor mode). */
static int fb_window_out(int n, int k, int s, int p)
{
    FB_ASSERT(k >= 1 && s >= 1 && p >= 0);
    FB_ASSERT(n + 2 * p >= k);
    return (n + 2 * p - k) / s + 1;
}

/* Fills g->Ho and g->Wo from the input size, window, stride and padding. */
void fb_conv_geom_finish(fb_conv_geom *g)
{
    FB_ASSERT(g != NULL);
    g->Ho = fb_window_out(g->H, g->kh, g->sh, g->ph);
    g->Wo = fb_window_out(g->W, g->kw, g->sw, g->pw);
}

static void fb_conv_geom_check(const fb_conv_geom *g)
{
    FB_ASSERT(g != NULL);
    FB_ASSERT(g->N >= 0 && g->B >= 1 && g->C >= 1 && g->K >= 1 && g->H >= 1 && g->W >= 1);
    FB_ASSERT(g->Ho == fb_window_out(g->H, g->kh, g->sh, g->ph));
    FB_ASSERT(g->Wo == fb_window_out(g->W, g->kw, g->sw, g->pw));
}

/* Floats of scratch the backend's conv2d needs for g (0: pass NULL). */
size_t fb_conv2d_scratch_floats(const fb_backend *be, const fb_conv_geom *g)
{
    FB_ASSERT(be != NULL);
    fb_conv_geom_check(g);
    return be->ops->conv2d_scratch_floats ? be->ops->conv2d_scratch_floats(be, g) : 0;
}

/* See kernels.h: B-batched (grouped, or shared-input) 2-D convolution. */
void fb_conv2d_forward(fb_backend *be, float *out, const float *in, const float *w,
                       const float *bias, const fb_conv_geom *g, float *scratch)
{
    FB_OP_FN(be, conv2d_forward);
    fb_conv_geom_check(g);
    be->ops->conv2d_forward(be, out, in, w, bias, g, scratch);
}

/* See kernels.h: accumulates din (NULL when shared), dw and dbias (may be
 * NULL). */
void fb_conv2d_backward(fb_backend *be, float *din, float *dw, float *dbias, const float *dout,
                        const float *in, const float *w, const fb_conv_geom *g, float *scratch)
{
    FB_OP_FN(be, conv2d_backward);
    fb_conv_geom_check(g);
    FB_ASSERT(!(g->shared && din != NULL));
    FB_ASSERT(dw != NULL);
    be->ops->conv2d_backward(be, din, dw, dbias, dout, in, w, g, scratch);
}

/* ---- pooling ------------------------------------------------------------- */

/* Fills g->Ho and g->Wo from the input size, window, stride and padding. */
void fb_pool_geom_finish(fb_pool_geom *g)
{
    FB_ASSERT(g != NULL);
    g->Ho = fb_window_out(g->H, g->kh, g->sh, g->ph);
    g->Wo = fb_window_out(g->W, g->kw, g->sw, g->pw);
}

static void fb_pool_geom_check(const fb_pool_geom *g)
{
    FB_ASSERT(g != NULL);
    FB_ASSERT(g->N >= 0 && g->BC >= 1 && g->H >= 1 && g->W >= 1);
    FB_ASSERT(g->Ho == fb_window_out(g->H, g->kh, g->sh, g->ph));
    FB_ASSERT(g->Wo == fb_window_out(g->W, g->kw, g->sw, g->pw));
}

/* See kernels.h: max pooling with -inf padding and argmax for backward. */
void fb_maxpool2d_forward(fb_backend *be, float *out, int32_t *argmax, const float *in,
                          const fb_pool_geom *g)
{
    FB_OP_FN(be, maxpool2d_forward);
    fb_pool_geom_check(g);
    be->ops->maxpool2d_forward(be, out, argmax, in, g);
}

/* Accumulates dout into din at the positions argmax recorded. */
void fb_maxpool2d_backward(fb_backend *be, float *din, const float *dout, const int32_t *argmax,
                           const fb_pool_geom *g)
{
    FB_OP_FN(be, maxpool2d_backward);
    fb_pool_geom_check(g);
    be->ops->maxpool2d_backward(be, din, dout, argmax, g);
}

/* din = dout at the positions argmax recorded, 0 elsewhere; a backend
 * without its own form zeroes din and accumulates. */
void fb_maxpool2d_backward_set(fb_backend *be, float *din, const float *dout, const int32_t *argmax,
                               const fb_pool_geom *g)
{
    FB_OP_FN(be, maxpool2d_backward);
    fb_pool_geom_check(g);
    if (be->ops->maxpool2d_backward_set) {
        be->ops->maxpool2d_backward_set(be, din, dout, argmax, g);
        return;
    }
    fb_backend_zero(be, din, (size_t)g->N * g->BC * g->H * g->W * sizeof(float));
    be->ops->maxpool2d_backward(be, din, dout, argmax, g);
}

/* See kernels.h: average pooling, padding counted in the divisor. */
void fb_avgpool2d_forward(fb_backend *be, float *out, const float *in, const fb_pool_geom *g)
{
    FB_OP_FN(be, avgpool2d_forward);
    fb_pool_geom_check(g);
    be->ops->avgpool2d_forward(be, out, in, g);
}

/* Accumulates dout / (kh kw) into every input of each window. */
void fb_avgpool2d_backward(fb_backend *be, float *din, const float *dout, const fb_pool_geom *g)
{
    FB_OP_FN(be, avgpool2d_backward);
    fb_pool_geom_check(g);
    be->ops->avgpool2d_backward(be, din, dout, g);
}

/* out [N, BC] = mean over HW of in [N, BC, HW]. */
void fb_global_avgpool_forward(fb_backend *be, float *out, const float *in, int N, int BC, int HW)
{
    FB_OP_FN(be, global_avgpool_forward);
    FB_ASSERT(N >= 0 && BC >= 1 && HW >= 1);
    be->ops->global_avgpool_forward(be, out, in, N, BC, HW);
}

/* din [N, BC, HW] += dout [N, BC] / HW. */
void fb_global_avgpool_backward(fb_backend *be, float *din, const float *dout, int N, int BC,
                                int HW)
{
    FB_OP_FN(be, global_avgpool_backward);
    FB_ASSERT(N >= 0 && BC >= 1 && HW >= 1);
    be->ops->global_avgpool_backward(be, din, dout, N, BC, HW);
}

/* ---- elementwise --------------------------------------------------------- */

/* out[i] = act(in[i]) over n floats (out may equal in). */
void fb_act_forward(fb_backend *be, fb_act act, float *out, const float *in, size_t n)
{
    FB_OP_FN(be, act_forward);
    FB_ASSERT(act >= FB_ACT_RELU && act <= FB_ACT_SIGMOID);
    be->ops->act_forward(be, act, out, in, n);
}

/* din += dout * act'(in); relu and gelu read in, tanh and sigmoid read out. */
void fb_act_backward(fb_backend *be, fb_act act, float *din, const float *dout, const float *in,
                     const float *out, size_t n)
{
    FB_OP_FN(be, act_backward);
    FB_ASSERT(act >= FB_ACT_RELU && act <= FB_ACT_SIGMOID);
    FB_ASSERT(act == FB_ACT_TANH || act == FB_ACT_SIGMOID ? out != NULL : in != NULL);
    be->ops->act_backward(be, act, din, dout, in, out, n);
}

/* din = dout * act'(in or out); a backend without its own form zeroes din
 * and accumulates. */
void fb_act_backward_set(fb_backend *be, fb_act act, float *din, const float *dout, const float *in,
                         const float *out, size_t n)
{
    FB_OP_FN(be, act_backward);
    FB_ASSERT(act >= FB_ACT_RELU && act <= FB_ACT_SIGMOID);
    FB_ASSERT(act == FB_ACT_TANH || act == FB_ACT_SIGMOID ? out != NULL : in != NULL);
    if (be->ops->act_backward_set) {
        be->ops->act_backward_set(be, act, din, dout, in, out, n);
        return;
    }
    fb_backend_zero(be, din, n * sizeof(float));
    be->ops->act_backward(be, act, din, dout, in, out, n);
}

/* out = a + b over n floats (out may alias a or b). */
void fb_add_forward(fb_backend *be, float *out, const float *a, const float *b, size_t n)
{
    FB_OP_FN(be, add_forward);
    be->ops->add_forward(be, out, a, b, n);
}

/* y += x over n floats; y and x must not overlap. */
void fb_accumulate(fb_backend *be, float *y, const float *x, size_t n)
{
    FB_OP_FN(be, accumulate);
    be->ops->accumulate(be, y, x, n);
}

/* See kernels.h: inverted dropout with a per-member counter-based mask. */
void fb_dropout_forward(fb_backend *be, float *out, const float *in, const uint64_t *seeds,
                        uint64_t stream, float p, int N, int B, int F, int64_t n_offset)
{
    FB_OP_FN(be, dropout_forward);
    FB_ASSERT(seeds != NULL && p >= 0.0f && p <= 1.0f);
    FB_ASSERT(N >= 0 && B >= 1 && F >= 0 && n_offset >= 0);
    be->ops->dropout_forward(be, out, in, seeds, stream, p, N, B, F, n_offset);
}

/* din += dout * mask * scale, the mask regenerated from the same arguments. */
void fb_dropout_backward(fb_backend *be, float *din, const float *dout, const uint64_t *seeds,
                         uint64_t stream, float p, int N, int B, int F, int64_t n_offset)
{
    FB_OP_FN(be, dropout_backward);
    FB_ASSERT(seeds != NULL && p >= 0.0f && p <= 1.0f);
    FB_ASSERT(N >= 0 && B >= 1 && F >= 0 && n_offset >= 0);
    be->ops->dropout_backward(be, din, dout, seeds, stream, p, N, B, F, n_offset);
}

/* ---- normalisation ------------------------------------------------------- */

/* See kernels.h: batch statistics per channel; running_mean and running_var
 * may be NULL (not updated). */
void fb_batchnorm_forward_train(fb_backend *be, float *out, float *mean, float *rstd,
                                float *running_mean, float *running_var, const float *in,
                                const float *gamma, const float *beta, int N, int BC, int HW,
                                float eps, float momentum)
{
    FB_OP_FN(be, batchnorm_forward_train);
    FB_ASSERT(N >= 1 && BC >= 1 && HW >= 1 && mean != NULL && rstd != NULL);
    be->ops->batchnorm_forward_train(be, out, mean, rstd, running_mean, running_var, in, gamma,
                                     beta, N, BC, HW, eps, momentum);
}

/* Normalises with the running statistics. */
void fb_batchnorm_forward_eval(fb_backend *be, float *out, const float *in, const float *gamma,
                               const float *beta, const float *running_mean,
                               const float *running_var, int N, int BC, int HW, float eps)
{
    FB_OP_FN(be, batchnorm_forward_eval);
    FB_ASSERT(N >= 0 && BC >= 1 && HW >= 1 && running_mean != NULL && running_var != NULL);
    be->ops->batchnorm_forward_eval(be, out, in, gamma, beta, running_mean, running_var, N, BC, HW,
                                    eps);
}

/* Accumulates din, dgamma and dbeta (the last two may be NULL). */
void fb_batchnorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                           const float *dout, const float *in, const float *mean, const float *rstd,
                           const float *gamma, int N, int BC, int HW)
{
    FB_OP_FN(be, batchnorm_backward);
    FB_ASSERT(N >= 1 && BC >= 1 && HW >= 1 && din != NULL);
    be->ops->batchnorm_backward(be, din, dgamma, dbeta, dout, in, mean, rstd, gamma, N, BC, HW);
}

/* See kernels.h: layer norm of each [n, b] row of F features. */
void fb_layernorm_forward(fb_backend *be, float *out, float *mean, float *rstd, const float *in,
                          const float *gamma, const float *beta, int N, int B, int F, float eps)
{
    FB_OP_FN(be, layernorm_forward);
    FB_ASSERT(N >= 0 && B >= 1 && F >= 1 && mean != NULL && rstd != NULL);
    be->ops->layernorm_forward(be, out, mean, rstd, in, gamma, beta, N, B, F, eps);
}

/* Accumulates din, dgamma and dbeta (the last two may be NULL). */
void fb_layernorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                           const float *dout, const float *in, const float *mean, const float *rstd,
                           const float *gamma, int N, int B, int F)
{
    FB_OP_FN(be, layernorm_backward);
    FB_ASSERT(N >= 0 && B >= 1 && F >= 1 && din != NULL);
    be->ops->layernorm_backward(be, din, dgamma, dbeta, dout, in, mean, rstd, gamma, N, B, F);
}

/* ---- sequences ----------------------------------------------------------- */

/* The sizes every sequence op shares: N may be 0 (nothing to do), T, B and D
 * are at least 1. */
static void fb_seq_check(int N, int T, int B, int D)
{
    FB_ASSERT(N >= 0 && T >= 1 && B >= 1 && D >= 1);
}

/* See kernels.h: out[n, t, b, :] = table[b, ids[n T + t], :]; FB_ERR_DATA on
 * an id outside [0, V). */
int fb_embedding_forward(fb_backend *be, float *out, const int32_t *ids, const float *table, int N,
                         int T, int B, int V, int D, char *msg, size_t msg_cap)
{
    FB_OP_FN(be, embedding_forward);
    fb_seq_check(N, T, B, D);
    FB_ASSERT(V >= 1 && (N == 0 || (out != NULL && ids != NULL && table != NULL)));
    if (N == 0) return FB_OK;
    return be->ops->embedding_forward(be, out, ids, table, N, T, B, V, D, msg, msg_cap);
}

/* See kernels.h: dtable += dout at each position's id, in position order. */
int fb_embedding_backward(fb_backend *be, float *dtable, const float *dout, const int32_t *ids,
                          int N, int T, int B, int V, int D, char *msg, size_t msg_cap)
{
    FB_OP_FN(be, embedding_backward);
    fb_seq_check(N, T, B, D);
    FB_ASSERT(V >= 1 && (N == 0 || (dtable != NULL && dout != NULL && ids != NULL)));
    if (N == 0) return FB_OK;
    return be->ops->embedding_backward(be, dtable, dout, ids, N, T, B, V, D, msg, msg_cap);
}

/* See kernels.h: out = in + pos[b, t] at every sample. */
void fb_positional_forward(fb_backend *be, float *out, const float *in, const float *pos, int N,
                           int T, int B, int L, int D)
{
    FB_OP_FN(be, positional_forward);
    fb_seq_check(N, T, B, D);
    FB_ASSERT(L >= T);
    if (N) be->ops->positional_forward(be, out, in, pos, N, T, B, L, D);
}

/* See kernels.h: din += dout (may be NULL), dpos[b, t] += sum over n. */
void fb_positional_backward(fb_backend *be, float *din, float *dpos, const float *dout, int N,
                            int T, int B, int L, int D)
{
    FB_OP_FN(be, positional_backward);
    fb_seq_check(N, T, B, D);
    FB_ASSERT(L >= T && dpos != NULL);
    if (N) be->ops->positional_backward(be, din, dpos, dout, N, T, B, L, D);
}

/* Floats of scratch the backend's attention needs (0: pass NULL). */
size_t fb_attention_scratch_floats(const fb_backend *be, int N, int T, int B, int H)
{
    FB_ASSERT(be != NULL);
    FB_ASSERT(N >= 0 && T >= 1 && B >= 1 && H >= 1);
    return be->ops->attention_scratch_floats ? be->ops->attention_scratch_floats(be, N, T, B, H)
                                             : 0;
}

/* See kernels.h: multi-head scaled dot-product attention of each member. */
void fb_attention_forward(fb_backend *be, float *out, float *probs, const float *qkv, int N, int T,
                          int B, int D, int H, bool causal, float *scratch)
{
    FB_OP_FN(be, attention_forward);
    fb_seq_check(N, T, B, D);
    FB_ASSERT(H >= 1 && D % H == 0 && probs != NULL);
    if (N) be->ops->attention_forward(be, out, probs, qkv, N, T, B, D, H, causal, scratch);
}

/* See kernels.h: dqkv += the attention's gradient. */
void fb_attention_backward(fb_backend *be, float *dqkv, const float *dout, const float *probs,
                           const float *qkv, int N, int T, int B, int D, int H, float *scratch)
{
    FB_OP_FN(be, attention_backward);
    fb_seq_check(N, T, B, D);
    FB_ASSERT(H >= 1 && D % H == 0 && dqkv != NULL && probs != NULL);
    FB_ASSERT(scratch != NULL || fb_attention_scratch_floats(be, N, T, B, H) == 0);
    if (N) be->ops->attention_backward(be, dqkv, dout, probs, qkv, N, T, B, D, H, scratch);
}

/* See kernels.h: the mean over t, or position 0. */
void fb_seq_pool_forward(fb_backend *be, fb_seq_pool kind, float *out, const float *in, int N,
                         int T, int B, int D)
{
    FB_OP_FN(be, seq_pool_forward);
    fb_seq_check(N, T, B, D);
    FB_ASSERT(kind == FB_SEQ_POOL_MEAN || kind == FB_SEQ_POOL_FIRST);
    if (N) be->ops->seq_pool_forward(be, kind, out, in, N, T, B, D);
}

/* See kernels.h: din += dout / T everywhere (mean), or dout at t = 0. */
void fb_seq_pool_backward(fb_backend *be, fb_seq_pool kind, float *din, const float *dout, int N,
                          int T, int B, int D)
{
    FB_OP_FN(be, seq_pool_backward);
    fb_seq_check(N, T, B, D);
    FB_ASSERT(kind == FB_SEQ_POOL_MEAN || kind == FB_SEQ_POOL_FIRST);
    if (N) be->ops->seq_pool_backward(be, kind, din, dout, N, T, B, D);
}

/* ---- losses -------------------------------------------------------------- */

/* See kernels.h: per-member mean softmax cross-entropy; overwrites outputs. */
void fb_softmax_xent(fb_backend *be, float *loss, float *dlogits, float *correct,
                     const float *logits, const int32_t *labels, int N, int B, int K,
                     float grad_scale)
{
    FB_OP_FN(be, softmax_xent);
    FB_ASSERT(N >= 1 && B >= 1 && K >= 1 && loss != NULL && labels != NULL);
    be->ops->softmax_xent(be, loss, dlogits, correct, logits, labels, N, B, K, grad_scale);
}

/* See kernels.h: per-member mean squared error; overwrites outputs. */
void fb_mse(fb_backend *be, float *loss, float *dpred, const float *pred, const float *target,
            int N, int B, int K, float grad_scale)
{
    FB_OP_FN(be, mse);
    FB_ASSERT(N >= 1 && B >= 1 && K >= 1 && loss != NULL);
    be->ops->mse(be, loss, dpred, pred, target, N, B, K, grad_scale);
}

/* ---- optimizers ---------------------------------------------------------- */

/* See kernels.h: one fused torch.optim update of all members.  Active members
 * must have t >= 1; the state buffers a kind reads must be present. */
void fb_optim_step(fb_backend *be, fb_optim_kind kind, float *params, const float *grads,
                   float *state1, float *state2, const fb_param_block *blocks, int n_blocks, int B,
                   const fb_optim_hparams *hp)
{
    FB_OP_FN(be, optim_step);
    FB_ASSERT(kind == FB_OPTIM_KIND_SGD || kind == FB_OPTIM_KIND_ADAM ||
              kind == FB_OPTIM_KIND_ADAMW);
    FB_ASSERT(B >= 1 && n_blocks >= 0 && hp != NULL && (n_blocks == 0 || blocks != NULL));
    for (int b = 0; b < B; b++) {
        if (hp[b].lr == 0.0f && hp[b].t == 0) continue;
        FB_ASSERT(hp[b].t >= 1);
        if (kind == FB_OPTIM_KIND_SGD)
            FB_ASSERT(hp[b].momentum == 0.0f || state1 != NULL);
        else
            FB_ASSERT(state1 != NULL && state2 != NULL);
    }
    be->ops->optim_step(be, kind, params, grads, state1, state2, blocks, n_blocks, B, hp);
}

/* ---- bf16 ---------------------------------------------------------------- */

/* See kernels.h: out = in rounded to bfloat16, elementwise. */
void fb_round_bf16(fb_backend *be, float *out, const float *in, size_t n)
{
    FB_OP_FN(be, round_bf16);
    if (n) be->ops->round_bf16(be, out, in, n);
}

/* See kernels.h: each member's gradients times its inverse scale, and
 * flags[b] = 1 when member b's gradients were not all finite. */
void fb_grad_unscale(fb_backend *be, float *flags, float *grads, const float *inv_scales,
                     const fb_param_block *blocks, int n_blocks, int B)
{
    FB_OP_FN(be, grad_unscale);
    FB_ASSERT(B >= 1 && n_blocks >= 0 && flags != NULL && inv_scales != NULL &&
              (n_blocks == 0 || blocks != NULL));
    be->ops->grad_unscale(be, flags, grads, inv_scales, blocks, n_blocks, B);
}

/* See kernels.h: x [N, B, F] times scales[b] per member. */
void fb_scale_members(fb_backend *be, float *x, const float *scales, int N, int B, size_t F)
{
    FB_OP_FN(be, scale_members);
    FB_ASSERT(N >= 0 && B >= 1 && scales != NULL);
    if (N && F) be->ops->scale_members(be, x, scales, N, B, F);
}

/* ---- GEMM ---------------------------------------------------------------- */

/* C[M, N] = A[M, K] . B[K, N], row-major; the backend's best GEMM. */
void fb_sgemm(fb_backend *be, float *c, const float *a, const float *b, int M, int N, int K)
{
    FB_OP_FN(be, sgemm);
    FB_ASSERT(M >= 0 && N >= 0 && K >= 0);
    be->ops->sgemm(be, c, a, b, M, N, K);
}
