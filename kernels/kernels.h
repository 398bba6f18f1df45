/*
 * kernels: the math of a horizontally fused training array.
 *
 * Every op works on B models at once.  Parameters are [B, ...] (member-major);
 * activations are [N, B, ...] (sample-major, member-minor), so an image
 * activation [N, B, C, H, W] is also [N, B*C, H, W].  An op whose input is the
 * shared minibatch ("shared" = true) reads [N, ...] once for all members.
 *
 * Ops are reached through a backend handle (fb_backend): the plain-C
 * reference ("cpu-ref"), the fast CPU path ("cpu": OpenBLAS, vectorised loops)
 * and, where built, CUDA.  Pointers given to ops are memory of that backend
 * (fb_backend_alloc).  Argument order: outputs first, then inputs, then sizes.
 *
 * Backward ops ADD into their gradient outputs (din, dw, dbias, dgamma, ...)
 * so that branches and shards accumulate; the caller zeroes gradients before a
 * step.  A gradient pointer documented "may be NULL" is skipped when NULL.
 * The loss ops overwrite their outputs.
 */
#ifndef FB_KERNELS_H
#define FB_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_backend fb_backend;

/* Invariant check for fusebox code at and above the kernels: prints the
 * expression, file and line, then aborts.  Never compiled out. */
#define FB_ASSERT(expr)                                                                            \
    do {                                                                                           \
        if (!(expr)) {                                                                             \
            fprintf(stderr, "%s:%d: FB_ASSERT(%s) failed\n", __FILE__, __LINE__, #expr);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Ops a backend may lack; see fb_backend_supports(). */
typedef enum fb_op {
    FB_OP_LINEAR,
    FB_OP_CONV2D,
    FB_OP_MAXPOOL2D,
    FB_OP_AVGPOOL2D,
    FB_OP_GLOBAL_AVGPOOL,
    FB_OP_ACT,
    FB_OP_DROPOUT,
    FB_OP_BATCHNORM,
    FB_OP_LAYERNORM,
    FB_OP_ADD,
    FB_OP_SOFTMAX_XENT,
    FB_OP_MSE,
    FB_OP_OPTIM,
    FB_OP_BF16, /* fb_round_bf16, fb_grad_unscale and fb_scale_members */
    FB_OP_EMBEDDING,
    FB_OP_POSITIONAL,
    FB_OP_ATTENTION,
    FB_OP_SEQ_POOL,
    FB_OP_COUNT
} fb_op;

/* Pooling of a sequence over its T positions (fb_seq_pool_forward). */
typedef enum fb_seq_pool {
    FB_SEQ_POOL_MEAN,  /* the mean over t */
    FB_SEQ_POOL_FIRST  /* position 0 alone (a classification token) */
} fb_seq_pool;

typedef enum fb_act {
    FB_ACT_RELU,
    FB_ACT_GELU,      /* exact: x * Phi(x) (PyTorch approximate='none') */
    FB_ACT_GELU_TANH, /* PyTorch approximate='tanh' */
    FB_ACT_TANH,
    FB_ACT_SIGMOID
} fb_act;

/* ---- backends ---------------------------------------------------------- */

/* The plain-C reference backend: short, readable loops; the ground truth. */
fb_backend *fb_backend_cpu_ref(void);
/* The fast CPU backend: OpenBLAS GEMMs and loops the compiler vectorises. */
fb_backend *fb_backend_cpu(void);
/* Whether the fast CPU backend's own vector kernels (the stride-1
 * convolutions, 2x2 max pooling) run as portable C loops instead of their
 * AVX2 form, process wide.  Both give the same bits; the switch lets a test
 * show it on any CPU.  Off by default. */
void fb_cpu_kernels_portable(bool on);
/* The CUDA backend on device `device`, or NULL where CUDA is not built or no
 * such device exists. */
fb_backend *fb_backend_cuda(int device);

const char *fb_backend_name(const fb_backend *be);
/* Whether the backend implements op; callers must not call a missing op. */
bool fb_backend_supports(const fb_backend *be, fb_op op);
/* Number of threads the backend's CPU work may use (OpenBLAS included). */
void fb_backend_set_threads(fb_backend *be, int n);
/* The count last set on be (fb_backend_set_threads, fb_backend_clone_threads); 0 when none
 * was, which means the backend's default. */
int fb_backend_threads(const fb_backend *be);
/*
 * A new handle on be's backend that differs only in its thread count, n as
 * fb_backend_set_threads takes it: the same ops and the same context (streams,
 * handles, memory), so memory of one is memory of the other, and be keeps its
 * own count.  It lets devices that share one backend compute with teams of
 * their own sizes.  be must outlive the clone, which the caller frees with
 * fb_backend_clone_free.  NULL when out of memory.
 */
fb_backend *fb_backend_clone_threads(const fb_backend *be, int n);
/* Frees a handle made by fb_backend_clone_threads (not its context, which be
 * owns); accepts NULL. */
void fb_backend_clone_free(fb_backend *clone);

/* Backend memory.  alloc returns zeroed memory aligned to 64 bytes or NULL. */
void *fb_backend_alloc(fb_backend *be, size_t bytes);
void fb_backend_free(fb_backend *be, void *p); /* accepts NULL */
void fb_backend_zero(fb_backend *be, void *p, size_t bytes);
void fb_backend_copy(fb_backend *be, void *dst, const void *src, size_t bytes);   /* within */
void fb_backend_upload(fb_backend *be, void *dst, const void *host, size_t bytes); /* host->be */
void fb_backend_download(fb_backend *be, void *host, const void *src, size_t bytes);
/* Waits for queued work (no-op on CPU). */
void fb_backend_sync(fb_backend *be);

/* ---- linear ------------------------------------------------------------ */

/*
 * out[N, B, O] = in[N, Bi, I] . w[B, O, I]^T + bias[B, O], Bi = shared ? 1 : B.
 * Each member is a GEMM of its solo shape, shared input or not (cpu/fast_linear.c).
 * bias may be NULL.
 */
void fb_linear_forward(fb_backend *be, float *out, const float *in, const float *w,
                       const float *bias, int N, int B, int I, int O, bool shared);
/* din[N, Bi, I] (may be NULL; shared: summed over members), dw[B, O, I],
 * dbias[B, O] (may be NULL); all accumulate. */
void fb_linear_backward(fb_backend *be, float *din, float *dw, float *dbias, const float *dout,
                        const float *in, const float *w, int N, int B, int I, int O, bool shared);

/* ---- conv2d ------------------------------------------------------------ */

/*
 * Geometry of a B-batched 2-D convolution (cross-correlation, as PyTorch).
 * in [N, Bi*C, H, W] with Bi = shared ? 1 : B; w [B, K, C, kh, kw];
 * bias [B, K]; out [N, B*K, Ho, Wo], Ho = (H + 2ph - kh) / sh + 1.
 * Not shared, this is a grouped convolution with groups = B.
 */
typedef struct fb_conv_geom {
    int N, B, C, H, W, K;
    int kh, kw, sh, sw, ph, pw;
    int Ho, Wo;
    bool shared;
} fb_conv_geom;

/* Fills Ho and Wo from the other fields. */
void fb_conv_geom_finish(fb_conv_geom *g);
/* Floats of scratch memory conv2d forward/backward need for this geometry.
 * On a multi-threaded backend the size grows with the thread count: size
 * scratch after fb_backend_set_threads, and again after raising the count. */
size_t fb_conv2d_scratch_floats(const fb_backend *be, const fb_conv_geom *g);
void fb_conv2d_forward(fb_backend *be, float *out, const float *in, const float *w,
                       const float *bias, const fb_conv_geom *g, float *scratch);
/* din may be NULL (and is NULL-only when shared), dbias may be NULL. */
void fb_conv2d_backward(fb_backend *be, float *din, float *dw, float *dbias, const float *dout,
                        const float *in, const float *w, const fb_conv_geom *g, float *scratch);

/* ---- pooling ----------------------------------------------------------- */

/* in [N, BC, H, W] -> out [N, BC, Ho, Wo]; BC = B*C. */
typedef struct fb_pool_geom {
    int N, BC, H, W;
    int kh, kw, sh, sw, ph, pw;
    int Ho, Wo;
} fb_pool_geom;

void fb_pool_geom_finish(fb_pool_geom *g);
/* Max pooling; padding counts as -inf.  argmax [N, BC, Ho, Wo] records the
 * winning input index within its (n, channel) plane, for backward. */
void fb_maxpool2d_forward(fb_backend *be, float *out, int32_t *argmax, const float *in,
                          const fb_pool_geom *g);
void fb_maxpool2d_backward(fb_backend *be, float *din, const float *dout,
                           const int32_t *argmax, const fb_pool_geom *g);
/* din = the gradient alone, as if din were zeroed and fb_maxpool2d_backward
 * added into it (bit for bit), without reading din first. */
void fb_maxpool2d_backward_set(fb_backend *be, float *din, const float *dout,
                               const int32_t *argmax, const fb_pool_geom *g);
/* Average pooling, padding counted in the divisor (count_include_pad). */
void fb_avgpool2d_forward(fb_backend *be, float *out, const float *in, const fb_pool_geom *g);
void fb_avgpool2d_backward(fb_backend *be, float *din, const float *dout,
                           const fb_pool_geom *g);
/* out [N, BC] = mean over HW of in [N, BC, HW]. */
void fb_global_avgpool_forward(fb_backend *be, float *out, const float *in, int N, int BC,
                               int HW);
void fb_global_avgpool_backward(fb_backend *be, float *din, const float *dout, int N, int BC,
                                int HW);

/* ---- elementwise ------------------------------------------------------- */

void fb_act_forward(fb_backend *be, fb_act act, float *out, const float *in, size_t n);
/* din += dout * act'(in); out is the forward output (used by tanh/sigmoid). */
void fb_act_backward(fb_backend *be, fb_act act, float *din, const float *dout,
                     const float *in, const float *out, size_t n);
/* din = dout * act'(in): as if din were zeroed and fb_act_backward added into
 * it (bit for bit), without reading din first. */
void fb_act_backward_set(fb_backend *be, fb_act act, float *din, const float *dout,
                         const float *in, const float *out, size_t n);
/* out = a + b over n floats (out may alias a or b). */
void fb_add_forward(fb_backend *be, float *out, const float *a, const float *b, size_t n);
/* y += x over n floats. */
void fb_accumulate(fb_backend *be, float *y, const float *x, size_t n);

/*
 * Inverted dropout over x [N, B, F]: member b keeps element (n, f) when
 * fb_rng_uniform(seeds[b], stream, (n_offset + n) * F + f) >= p, and scales
 * kept elements by 1 / (1 - p).  The mask depends only on the member's seed,
 * the stream (the caller mixes layer and step into it) and the element's
 * position in the global batch, never on B or the member's slot, so a member's
 * masks are the same fused or alone.  seeds is host memory [B].  Backward
 * regenerates the mask from the same arguments.
 */
void fb_dropout_forward(fb_backend *be, float *out, const float *in, const uint64_t *seeds,
                        uint64_t stream, float p, int N, int B, int F, int64_t n_offset);
void fb_dropout_backward(fb_backend *be, float *din, const float *dout, const uint64_t *seeds,
                         uint64_t stream, float p, int N, int B, int F, int64_t n_offset);

/* ---- normalisation ----------------------------------------------------- */

/*
 * Batch norm over channels of x [N, BC, HW] (HW = 1 for feature vectors):
 * statistics per channel over N*HW.  Training: normalise with the biased batch
 * variance, save mean and rstd [BC] for backward, and update running_mean and
 * running_var (unbiased variance) with PyTorch's momentum.  gamma and beta
 * [BC] may be NULL (no affine).
 */
void fb_batchnorm_forward_train(fb_backend *be, float *out, float *mean, float *rstd,
                                float *running_mean, float *running_var, const float *in,
                                const float *gamma, const float *beta, int N, int BC, int HW,
                                float eps, float momentum);
void fb_batchnorm_forward_eval(fb_backend *be, float *out, const float *in,
                               const float *gamma, const float *beta,
                               const float *running_mean, const float *running_var, int N,
                               int BC, int HW, float eps);
/* dgamma/dbeta may be NULL (no affine). */
void fb_batchnorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                           const float *dout, const float *in, const float *mean,
                           const float *rstd, const float *gamma, int N, int BC, int HW);

/* Layer norm of each x[n, b, :] over its F features; gamma, beta [B, F] or
 * NULL; mean and rstd [N, B] saved for backward. */
void fb_layernorm_forward(fb_backend *be, float *out, float *mean, float *rstd,
                          const float *in, const float *gamma, const float *beta, int N, int B,
                          int F, float eps);
void fb_layernorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                           const float *dout, const float *in, const float *mean,
                           const float *rstd, const float *gamma, int N, int B, int F);

/* ---- sequences --------------------------------------------------------- */

/*
 * Sequence activations are [N, T, B, D]: sample, position, member, feature.
 * A per-position op (linear, layer norm, an activation) is the ordinary op on
 * [N*T, B, D]; the ops below are the ones that mix positions or read tokens.
 */

/*
 * Token embedding: out[n, t, b, :] = table[b, ids[n*T + t], :].
 * ids [N*T] int32 (backend memory) is the shared input, read once for all
 * members; table [B, V, D]; out [N, T, B, D], overwritten.
 * Returns FB_OK, or FB_ERR_DATA (base/errors.h) when an id is outside
 * [0, V): then msg (may be NULL, cap bytes) names the first bad position and
 * out is left untouched.  The CUDA backend checks the ids on the device: it
 * returns FB_OK, leaves out untouched and records FB_ERR_DATA, which
 * fb_cuda_backend_error reports after the next fb_backend_sync.
 */
int fb_embedding_forward(fb_backend *be, float *out, const int32_t *ids, const float *table, int N,
                         int T, int B, int V, int D, char *msg, size_t msg_cap);
/* dtable[b, v, :] += dout[n, t, b, :] for every position whose id is v,
 * added in position order (n*T + t ascending) on every backend, so the
 * result is exact and the same run after run and backend to backend.  Bad
 * ids as for the forward (dtable untouched). */
int fb_embedding_backward(fb_backend *be, float *dtable, const float *dout, const int32_t *ids,
                          int N, int T, int B, int V, int D, char *msg, size_t msg_cap);

/*
 * Learned positional add: out[n, t, b, :] = in[n, t, b, :] + pos[b, t, :],
 * in and out [N, T, B, D] (out may equal in), pos [B, L, D] with T <= L.
 */
void fb_positional_forward(fb_backend *be, float *out, const float *in, const float *pos, int N,
                           int T, int B, int L, int D);
/* din [N, T, B, D] += dout (din may be NULL); dpos[b, t, :] += sum over n of
 * dout[n, t, b, :] for t < T (rows t >= T are not touched). */
void fb_positional_backward(fb_backend *be, float *din, float *dpos, const float *dout, int N,
                            int T, int B, int L, int D);

/*
 * Multi-head scaled dot-product self-attention of each member.
 * qkv [N, T, B, 3D] holds q, k and v of each position packed: q =
 * qkv[n, t, b, 0:D], k = [D:2D], v = [2D:3D]; head h (H heads, D % H == 0,
 * Dh = D / H) uses columns [h Dh, (h + 1) Dh) of each.
 *   probs[n, b, h, t, s] = softmax over s of (q_t . k_s) / sqrt(Dh), the
 *     maximum subtracted before exp; causal: s > t is masked (probability 0);
 *   out[n, t, b, h Dh + j] = sum over s of probs[n, b, h, t, s] v_s[h Dh + j].
 * probs [N, B, H, T, T] and out [N, T, B, D] are overwritten; probs is kept
 * for the backward.  scratch: fb_attention_scratch_floats floats (NULL when
 * that is 0), for the backward; as for conv2d, the size grows with the
 * thread count on a multi-threaded backend, so size it after
 * fb_backend_set_threads.
 */
size_t fb_attention_scratch_floats(const fb_backend *be, int N, int T, int B, int H);
void fb_attention_forward(fb_backend *be, float *out, float *probs, const float *qkv, int N, int T,
                          int B, int D, int H, bool causal, float *scratch);
/* dqkv [N, T, B, 3D] += the gradient of the forward with respect to qkv,
 * from dout [N, T, B, D] and the forward's probs and qkv.  Masked positions
 * have probability 0 and get no gradient, so no causal flag is needed. */
void fb_attention_backward(fb_backend *be, float *dqkv, const float *dout, const float *probs,
                           const float *qkv, int N, int T, int B, int D, int H, float *scratch);

/* out [N, B, D] = the mean over t of in [N, T, B, D] (FB_SEQ_POOL_MEAN), or
 * in[n, 0, b, :] (FB_SEQ_POOL_FIRST); overwritten. */
void fb_seq_pool_forward(fb_backend *be, fb_seq_pool kind, float *out, const float *in, int N,
                         int T, int B, int D);
/* din [N, T, B, D] += dout / T at every position (mean), or dout at t = 0
 * (first; the other positions are not touched). */
void fb_seq_pool_backward(fb_backend *be, fb_seq_pool kind, float *din, const float *dout, int N,
                          int T, int B, int D);

/* ---- losses ------------------------------------------------------------ */

/*
 * Softmax cross-entropy of logits [N, B, K] against labels [N] (shared by all
 * members, values in [0, K)).  loss[B] = mean over the N samples of member b.
 * dlogits [N, B, K] (may be NULL) is OVERWRITTEN with
 * (softmax - onehot) * grad_scale (grad_scale = 1/N for a whole batch, or
 * 1/global N for a data-parallel shard).  correct [B] (may be NULL) receives
 * the count of samples whose argmax equals the label.  loss and correct are
 * backend memory.
 */
void fb_softmax_xent(fb_backend *be, float *loss, float *dlogits, float *correct,
                     const float *logits, const int32_t *labels, int N, int B, int K,
                     float grad_scale);
/* Mean squared error of pred [N, B, K] against target [N, K]: loss[B] = mean
 * over N*K; dpred (may be NULL) OVERWRITTEN with 2 (pred - target) * grad_scale
 * / K (grad_scale = 1/N for a whole batch). */
void fb_mse(fb_backend *be, float *loss, float *dpred, const float *pred, const float *target,
            int N, int B, int K, float grad_scale);

/* ---- optimizers -------------------------------------------------------- */

typedef enum fb_optim_kind { FB_OPTIM_KIND_SGD, FB_OPTIM_KIND_ADAM, FB_OPTIM_KIND_ADAMW } fb_optim_kind;

/* One parameter tensor inside the parameter slab: floats [offset, offset +
 * B * per_member), laid out [B, per_member]. Gradient and state slabs share
 * the same offsets. */
typedef struct fb_param_block {
    size_t offset;
    size_t per_member;
} fb_param_block;

/* One member's hyperparameters for this update (host memory).  lr already has
 * the schedule applied; t is the member's 1-based update count. */
typedef struct fb_optim_hparams {
    float lr, weight_decay;
    float momentum, dampening; /* sgd */
    int nesterov;              /* sgd */
    float beta1, beta2, eps;   /* adam, adamw */
    int64_t t;
} fb_optim_hparams;

/*
 * One fused update of every parameter of every member, with torch.optim's
 * exact semantics:
 *   sgd:   g += wd p; buf = t == 1 ? g : momentum buf + (1 - dampening) g;
 *          g = nesterov ? g + momentum buf : buf (when momentum != 0); p -= lr g
 *   adam:  g += wd p; m, v moments; p -= lr/(1-beta1^t) m / (sqrt(v)/sqrt(1-beta2^t) + eps)
 *   adamw: p *= 1 - lr wd; then adam without the wd term.
 * state1 is the momentum buffer (sgd) or first moment; state2 the second
 * moment (adam/adamw; may be NULL for sgd).  A member whose hp.lr is 0 and
 * whose t is 0 is skipped (an empty slot).
 */
void fb_optim_step(fb_backend *be, fb_optim_kind kind, float *params, const float *grads,
                   float *state1, float *state2, const fb_param_block *blocks, int n_blocks,
                   int B, const fb_optim_hparams *hp);

/* ---- bf16 ------------------------------------------------------------- */

/*
 * out[i] = in[i] rounded to the nearest bfloat16 (kernels/bf16.h:
 * fb_bf16_round, ties to even, NaN stays NaN, infinities stay), stored as
 * float, over n floats.  out may equal in.  A bf16 array rounds the operands
 * of its linear and convolution products with this into its own scratch
 * before calling the float ops, so that every backend computes the same
 * thing: products of bf16 values accumulated in float.
 */
void fb_round_bf16(fb_backend *be, float *out, const float *in, size_t n);

/*
 * The unscaling of bf16 dynamic loss scaling, in one pass over the parameter
 * gradients: member b's part of every block (fb_optim_step's layout: block k
 * covers floats [offset, offset + B * per_member) of grads, member b's part
 * at offset + b * per_member) is multiplied by inv_scales[b], and flags[b]
 * becomes 1 when one of the products is a NaN or an infinity, else 0.
 * flags [B] is backend memory, overwritten; inv_scales [B] and blocks are
 * host memory.  Floats outside the blocks are neither read nor written.
 *
 * The flag is taken on the product.  Multiplying by a power of two keeps a
 * NaN or an infinity what it is, and keeps a finite value finite unless the
 * product overflows, which a factor of at most 1 (a loss scale of at least
 * 1) never does (at worst it underflows towards zero), so checking after the
 * multiply flags exactly what checking before it would.  The one difference
 * is a loss scale below 1, whose inverse above 1 can carry a huge finite
 * gradient to infinity: checking after flags that member too, so no
 * infinity reaches the optimizer.  On the device this is one launch; B
 * floats come back when the caller reads the flags.
 */
void fb_grad_unscale(fb_backend *be, float *flags, float *grads, const float *inv_scales,
                     const fb_param_block *blocks, int n_blocks, int B);

/*
 * x[n, b, f] *= scales[b] over x [N, B, F]: the per-member loss scale applied
 * to the loss gradient [N, B, K].  scales [B] is host memory.
 */
void fb_scale_members(fb_backend *be, float *x, const float *scales, int N, int B, size_t F);

/* ---- GEMM (benchmarks) ------------------------------------------------- */

/* C[M, N] = A[M, K] . B[K, N], row-major, float; the backend's best GEMM. */
void fb_sgemm(fb_backend *be, float *c, const float *a, const float *b, int M, int N, int K);

#ifdef __cplusplus
}
#endif

#endif
