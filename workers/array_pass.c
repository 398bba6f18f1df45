/*
 * The fused training array's forward and backward passes (array.h): one
 * kernel call per node and direction for all B members, each step of the
 * pass checking that the buffers it touches are live (array.c plans them).
 */
#include <stdlib.h>
#include <string.h>

#include "array_impl.h"
#include "rng.h"

/* ---- forward and backward ------------------------------------------------ */

/* Buffer id of the activation slab, which the current step must be planned
 * to use: a use the plan missed would share bytes with another live buffer. */
static float *buf_at(const fb_array *a, int id)
{
    FB_ASSERT(id >= 0 && id < a->n_ab);
    const abuf *b = &a->ab[id];
    FB_ASSERT(b->first >= 0 && b->first <= a->step && a->step <= b->last);
    return a->act + b->off;
}

#define ACT(id) buf_at(a, (id))
#define DACT(id) buf_at(a, grad_of(a, (id)))
/* Tensor d of a parameter or buffer slab from the first member the pass runs
 * (a->m0: a tile of fb_array_train_step, else 0). */
static float *tensor_at(const fb_array *a, float *slab, const tensor_def *d)
{
    return slab + d->offset + (size_t)a->m0 * d->per_member;
}

#define PW(nd) tensor_at(a, a->p, &a->params[(nd)->w])
#define PB(nd) ((nd)->b >= 0 ? tensor_at(a, a->p, &a->params[(nd)->b]) : NULL)
#define GW(nd) tensor_at(a, a->g, &a->params[(nd)->w])
#define GB(nd) ((nd)->b >= 0 ? tensor_at(a, a->g, &a->params[(nd)->b]) : NULL)

static fb_conv_geom conv_geom(const fb_array *a, const node *nd, int N)
{
    const fb_layer *L = nd->L;
    fb_conv_geom g = {.N = N, .B = a->B, .C = (int)L->in.d[0], .H = (int)L->in.d[1],
                      .W = (int)L->in.d[2], .K = (int)L->out_features, .kh = L->kernel[0],
                      .kw = L->kernel[1], .sh = L->stride[0], .sw = L->stride[1],
                      .ph = L->padding[0], .pw = L->padding[1], .shared = nd->shared_in};
    fb_conv_geom_finish(&g);
    return g;
}

/* The conv workspace, after checking that it still fits g: a backend's need
 * grows with its thread count, which may have been raised since building. */
static float *conv_scratch(const fb_array *a, const fb_conv_geom *g)
{
    FB_ASSERT(fb_conv2d_scratch_floats(a->be, g) <= (a->scratch_floats ? a->scratch_floats : 16));
    return a->scratch;
}

/*
 * bf16 (docs/jobspec.md, "precision"): rounds the operands of a linear or
 * conv node's product into the array's bf16 scratch and points the operands
 * there: *in [N, Bi, in_numel], *w [B, per_member] and, for backward, *dout
 * [N, B, out_numel].  The activations and parameters themselves stay float
 * (other layers read them, and the optimizer updates float master weights).
 * The float products of bf16 values are exact, so a backend computes the
 * same thing whatever math it uses for the GEMM, up to summation order.
 */
static void bf16_operands(fb_array *a, const node *nd, int N, const float **in, const float **w,
                          const float **dout)
{
    size_t nin = (size_t)N * (nd->shared_in ? 1 : (size_t)a->B) * (size_t)nd->in_numel;
    size_t nw = (size_t)a->B * a->params[nd->w].per_member;
    float *s = a->bf16_scratch;
    FB_ASSERT(s != NULL && N <= a->max_n);
    fb_round_bf16(a->be, s, *in, nin);
    *in = s;
    s += pad16(nin);
    fb_round_bf16(a->be, s, *w, nw);
    *w = s;
    s += pad16(nw);
    if (dout) {
        fb_round_bf16(a->be, s, *dout, (size_t)N * (size_t)a->B * (size_t)nd->out_numel);
        *dout = s;
    }
}

static fb_pool_geom pool_geom(const fb_array *a, const node *nd, int N)
{
    const fb_layer *L = nd->L;
    fb_pool_geom g = {.N = N, .BC = a->B * (int)L->in.d[0], .H = (int)L->in.d[1],
                      .W = (int)L->in.d[2], .kh = L->kernel[0], .kw = L->kernel[1],
                      .sh = L->stride[0], .sw = L->stride[1], .ph = L->padding[0],
                      .pw = L->padding[1]};
    fb_pool_geom_finish(&g);
    return g;
}

static fb_act act_of(const fb_layer *L)
{
    switch (L->type) {
    case FB_LAYER_RELU: return FB_ACT_RELU;
    case FB_LAYER_TANH: return FB_ACT_TANH;
    case FB_LAYER_SIGMOID: return FB_ACT_SIGMOID;
    default: return L->approximate == FB_GELU_TANH ? FB_ACT_GELU_TANH : FB_ACT_GELU;
    }
}

static int bn_hw(const fb_layer *L)
{
    return L->in.ndim == 3 ? (int)(L->in.d[1] * L->in.d[2]) : 1;
}

/* Positions per sample of a layer's input: T for a sequence (T, D), whose
 * per-position ops run on N*T rows of [N*T, B, D], else 1. */
static int seq_len(const fb_layer *L)
{
    return L->in.ndim == 2 ? (int)L->in.d[0] : 1;
}

/* Features of one row of the input: D of a sequence, F of a feature vector. */
static int row_in(const fb_layer *L)
{
    return (int)L->in.d[L->in.ndim - 1];
}

/* The attention workspace, after checking that it still fits (as conv_scratch). */
static float *attn_scratch(const fb_array *a, int N, const fb_layer *L)
{
    size_t need = fb_attention_scratch_floats(a->be, N, (int)L->in.d[0], a->B, L->heads);
    FB_ASSERT(need <= (a->scratch_floats ? a->scratch_floats : 16));
    return need ? a->scratch : NULL;
}

/* The ids of the batch, which the embedding reads: checked on the host when
 * they arrived (fb_array_forward_backward), so a kernel cannot refuse them. */
static const int32_t *ids_of(const fb_array *a, const node *nd)
{
    return (const int32_t *)buf_at(a, nd->in);
}

static void forward_nodes(fb_array *a, node *nodes, int n, int N, bool train, uint64_t stream);

static void forward_node(fb_array *a, node *nd, int N, bool train, uint64_t stream)
{
    fb_backend *be = a->be;
    int B = a->B;
    size_t count = (size_t)N * (size_t)B * (size_t)nd->out_numel;
    /* a residual block's step is its sum, after its branches (plan_forward) */
    if (nd->kind == NODE_LAYER && nd->L->type == FB_LAYER_RESIDUAL) {
        forward_nodes(a, nd->body, nd->n_body, N, train, stream);
        forward_nodes(a, nd->sc, nd->n_sc, N, train, stream);
    }
    a->step++;
    if (nd->kind == NODE_EXPAND) {
        size_t row = (size_t)nd->in_numel * sizeof(float);
        float *out = ACT(nd->out);
        const float *in = ACT(nd->in);
        for (int n = 0; n < N; n++)
            for (int b = 0; b < B; b++)
                fb_backend_copy(be, out + ((size_t)n * B + b) * nd->in_numel,
                                in + (size_t)n * nd->in_numel, row);
        return;
    }
    const fb_layer *L = nd->L;
    int T = seq_len(L), NT = N * T;
    switch (L->type) {
    case FB_LAYER_FLATTEN:
        break;
    case FB_LAYER_LINEAR: {
        const float *in = ACT(nd->in), *w = PW(nd);
        if (a->bf16) bf16_operands(a, nd, N, &in, &w, NULL);
        fb_linear_forward(be, ACT(nd->out), in, w, PB(nd), NT, B, row_in(L),
                          (int)L->out_features, nd->shared_in);
        break;
    }
    case FB_LAYER_EMBEDDING: {
        int err = fb_embedding_forward(be, ACT(nd->out), ids_of(a, nd), PW(nd), N, a->T, B, a->V,
                                       (int)L->out_features, NULL, 0);
        FB_ASSERT(err == FB_OK);
        break;
    }
    case FB_LAYER_POSITIONAL:
        fb_positional_forward(be, ACT(nd->out), ACT(nd->in), PW(nd), N, T, B, (int)L->max_len,
                              row_in(L));
        break;
    case FB_LAYER_TRANSFORMER_BLOCK: /* the block's attention op (array_impl.h) */
        fb_attention_forward(be, ACT(nd->out), ACT(nd->save1), ACT(nd->in), N, T, B, row_in(L),
                             L->heads, L->causal, attn_scratch(a, N, L));
        break;
    case FB_LAYER_POOL:
        fb_seq_pool_forward(be, L->pool == FB_POOL_FIRST ? FB_SEQ_POOL_FIRST : FB_SEQ_POOL_MEAN,
                            ACT(nd->out), ACT(nd->in), N, T, B, row_in(L));
        break;
    case FB_LAYER_CONV2D: {
        fb_conv_geom g = conv_geom(a, nd, N);
        const float *in = ACT(nd->in), *w = PW(nd);
        if (a->bf16) bf16_operands(a, nd, N, &in, &w, NULL);
        fb_conv2d_forward(be, ACT(nd->out), in, w, PB(nd), &g, conv_scratch(a, &g));
        break;
    }
    case FB_LAYER_MAXPOOL2D: {
        fb_pool_geom g = pool_geom(a, nd, N);
        fb_maxpool2d_forward(be, ACT(nd->out), (int32_t *)ACT(nd->save1), ACT(nd->in), &g);
        break;
    }
    case FB_LAYER_AVGPOOL2D: {
        fb_pool_geom g = pool_geom(a, nd, N);
        fb_avgpool2d_forward(be, ACT(nd->out), ACT(nd->in), &g);
        break;
    }
    case FB_LAYER_GLOBAL_AVGPOOL:
        fb_global_avgpool_forward(be, ACT(nd->out), ACT(nd->in), N, B * (int)L->in.d[0],
                                  (int)(L->in.d[1] * L->in.d[2]));
        break;
    case FB_LAYER_RELU:
    case FB_LAYER_GELU:
    case FB_LAYER_TANH:
    case FB_LAYER_SIGMOID:
        fb_act_forward(be, act_of(L), ACT(nd->out), ACT(nd->in), count);
        break;
    case FB_LAYER_DROPOUT:
        if (train && L->p > 0)
            fb_dropout_forward(be, ACT(nd->out), ACT(nd->in), a->seeds + a->m0,
                               fb_rng_mix64(stream ^ ((uint64_t)nd->id << 32)), (float)L->p, NT, B,
                               (int)nd->in_numel / T, 0);
        else
            fb_backend_copy(be, ACT(nd->out), ACT(nd->in), count * sizeof(float));
        break;
    case FB_LAYER_BATCHNORM: {
        int C = (int)L->in.d[0];
        float *gamma = nd->w >= 0 ? PW(nd) : NULL, *beta = PB(nd);
        float *rm = tensor_at(a, a->rb, &a->bufs[nd->rm]);
        float *rv = tensor_at(a, a->rb, &a->bufs[nd->rv]);
        if (train) {
            fb_batchnorm_forward_train(be, ACT(nd->out), ACT(nd->save1), ACT(nd->save2), rm, rv,
                                       ACT(nd->in), gamma, beta, N, B * C, bn_hw(L),
                                       (float)L->eps, (float)L->momentum);
            for (int b = a->m0; b < a->m0 + B; b++)
                a->bn_tracked[(size_t)b * a->n_bn + nd->bn_index]++;
        } else {
            fb_batchnorm_forward_eval(be, ACT(nd->out), ACT(nd->in), gamma, beta, rm, rv, N,
                                      B * C, bn_hw(L), (float)L->eps);
        }
        break;
    }
    case FB_LAYER_LAYERNORM:
        fb_layernorm_forward(be, ACT(nd->out), ACT(nd->save1), ACT(nd->save2), ACT(nd->in),
                             nd->w >= 0 ? PW(nd) : NULL, PB(nd), NT, B, (int)nd->in_numel / T,
                             (float)L->eps);
        break;
    case FB_LAYER_RESIDUAL:
        fb_add_forward(be, ACT(nd->out), ACT(nd->save1), ACT(nd->sc_out), count);
        break;
    default:
        break;
    }
}

static void forward_nodes(fb_array *a, node *nodes, int n, int N, bool train, uint64_t stream)
{
    for (int i = 0; i < n; i++) forward_node(a, &nodes[i], N, train, stream);
}

static void backward_nodes(fb_array *a, node *nodes, int n, int N, uint64_t stream);

/* The gradient of activation id, zeroed over the batch's rows if this
 * backward pass has not added into it yet.  Zeroing here, just before the
 * first op that accumulates into the buffer, touches only what the pass uses
 * and finds it in cache more often than zeroing the whole slab would; it is
 * also where the buffer's live range starts, so whatever another buffer left
 * in shared bytes is cleared before anything adds into them. */
static float *grad_buf(fb_array *a, int id, int N)
{
    abuf *g = &a->ab[grad_of(a, id)];
    float *p = DACT(id);
    if (g->gen != a->gen) {
        g->gen = a->gen;
        fb_backend_zero(a->be, p, (size_t)N * (size_t)a->B * (size_t)g->per_sample * sizeof(float));
    }
    return p;
}

/* The gradient of activation id for an op that can write its whole
 * contribution instead of adding it (the `_set` kernels): *set is true when
 * this backward pass has not added into the buffer yet, and the buffer is
 * then the op's to write, unzeroed; else the op adds as usual. */
static float *grad_buf_or_set(fb_array *a, int id, bool *set)
{
    abuf *g = &a->ab[grad_of(a, id)];
    *set = g->gen != a->gen;
    g->gen = a->gen;
    return DACT(id);
}

/* Zeroes the current members' part of parameter tensor t's gradient. */
static void zero_param_grad(fb_array *a, int t)
{
    if (t < 0) return;
    fb_backend_zero(a->be, tensor_at(a, a->g, &a->params[t]),
                    (size_t)a->B * a->params[t].per_member * sizeof(float));
}

static void backward_node(fb_array *a, node *nd, int N, uint64_t stream)
{
    fb_backend *be = a->be;
    int B = a->B;
    size_t count = (size_t)N * (size_t)B * (size_t)nd->out_numel;
    a->step++;
    if (nd->kind == NODE_EXPAND) return; /* the shared input needs no gradient */
    const fb_layer *L = nd->L;
    /* each parameter belongs to one node, which is its gradient's only writer */
    zero_param_grad(a, nd->w);
    zero_param_grad(a, nd->b);
    /* a residual block's input gradient comes from its branches' first ops;
     * pooling and activations write theirs when they are its first writer */
    bool writes = L->type == FB_LAYER_MAXPOOL2D || L->type == FB_LAYER_RELU ||
                  L->type == FB_LAYER_GELU || L->type == FB_LAYER_TANH ||
                  L->type == FB_LAYER_SIGMOID,
         set = false;
    float *din = nd->shared_in || L->type == FB_LAYER_FLATTEN || L->type == FB_LAYER_RESIDUAL
                     ? NULL
                 : writes ? grad_buf_or_set(a, nd->in, &set)
                          : grad_buf(a, nd->in, N);
    void (*act_bwd)(fb_backend *, fb_act, float *, const float *, const float *, const float *,
                    size_t) = set ? fb_act_backward_set : fb_act_backward;
    int T = seq_len(L), NT = N * T;
    switch (L->type) {
    case FB_LAYER_FLATTEN:
        break;
    case FB_LAYER_LINEAR: {
        const float *in = ACT(nd->in), *w = PW(nd), *dout = DACT(nd->out);
        if (a->bf16) bf16_operands(a, nd, N, &in, &w, &dout);
        fb_linear_backward(be, din, GW(nd), GB(nd), dout, in, w, NT, B, row_in(L),
                           (int)L->out_features, nd->shared_in);
        break;
    }
    case FB_LAYER_EMBEDDING: {
        int err = fb_embedding_backward(be, GW(nd), DACT(nd->out), ids_of(a, nd), N, a->T, B,
                                        a->V, (int)L->out_features, NULL, 0);
        FB_ASSERT(err == FB_OK);
        break;
    }
    case FB_LAYER_POSITIONAL:
        fb_positional_backward(be, din, GW(nd), DACT(nd->out), N, T, B, (int)L->max_len,
                               row_in(L));
        break;
    case FB_LAYER_TRANSFORMER_BLOCK:
        fb_attention_backward(be, din, DACT(nd->out), ACT(nd->save1), ACT(nd->in), N, T, B,
                              row_in(L), L->heads, attn_scratch(a, N, L));
        break;
    case FB_LAYER_POOL:
        fb_seq_pool_backward(be, L->pool == FB_POOL_FIRST ? FB_SEQ_POOL_FIRST : FB_SEQ_POOL_MEAN,
                             din, DACT(nd->out), N, T, B, row_in(L));
        break;
    case FB_LAYER_CONV2D: {
        fb_conv_geom g = conv_geom(a, nd, N);
        const float *in = ACT(nd->in), *w = PW(nd), *dout = DACT(nd->out);
        if (a->bf16) bf16_operands(a, nd, N, &in, &w, &dout);
        fb_conv2d_backward(be, din, GW(nd), GB(nd), dout, in, w, &g, conv_scratch(a, &g));
        break;
    }
    case FB_LAYER_MAXPOOL2D: {
        fb_pool_geom g = pool_geom(a, nd, N);
        (set ? fb_maxpool2d_backward_set : fb_maxpool2d_backward)(
            be, din, DACT(nd->out), (const int32_t *)ACT(nd->save1), &g);
        break;
    }
    case FB_LAYER_AVGPOOL2D: {
        fb_pool_geom g = pool_geom(a, nd, N);
        fb_avgpool2d_backward(be, din, DACT(nd->out), &g);
        break;
    }
    case FB_LAYER_GLOBAL_AVGPOOL:
        fb_global_avgpool_backward(be, din, DACT(nd->out), N, B * (int)L->in.d[0],
                                   (int)(L->in.d[1] * L->in.d[2]));
        break;
    case FB_LAYER_RELU:
        /* relu(x) > 0 exactly where x > 0 (a NaN passes through both), so the
         * output serves as the input and the input need not outlive the
         * forward pass */
        act_bwd(be, FB_ACT_RELU, din, DACT(nd->out), ACT(nd->out), NULL, count);
        break;
    case FB_LAYER_GELU:
        act_bwd(be, act_of(L), din, DACT(nd->out), ACT(nd->in), NULL, count);
        break;
    case FB_LAYER_TANH:
    case FB_LAYER_SIGMOID:
        act_bwd(be, act_of(L), din, DACT(nd->out), NULL, ACT(nd->out), count);
        break;
    case FB_LAYER_DROPOUT:
        if (L->p > 0)
            fb_dropout_backward(be, din, DACT(nd->out), a->seeds + a->m0,
                                fb_rng_mix64(stream ^ ((uint64_t)nd->id << 32)), (float)L->p, NT, B,
                                (int)nd->in_numel / T, 0);
        else
            fb_accumulate(be, din, DACT(nd->out), count);
        break;
    case FB_LAYER_BATCHNORM:
        fb_batchnorm_backward(be, din, nd->w >= 0 ? GW(nd) : NULL, GB(nd), DACT(nd->out),
                              ACT(nd->in), ACT(nd->save1), ACT(nd->save2),
                              nd->w >= 0 ? PW(nd) : NULL, N, B * (int)L->in.d[0], bn_hw(L));
        break;
    case FB_LAYER_LAYERNORM:
        fb_layernorm_backward(be, din, nd->w >= 0 ? GW(nd) : NULL, GB(nd), DACT(nd->out),
                              ACT(nd->in), ACT(nd->save1), ACT(nd->save2),
                              nd->w >= 0 ? PW(nd) : NULL, NT, B, (int)nd->in_numel / T);
        break;
    case FB_LAYER_RESIDUAL:
        /* out = body(x) + shortcut(x): the output gradient reaches both */
        fb_accumulate(be, grad_buf(a, nd->save1, N), DACT(nd->out), count);
        fb_accumulate(be, grad_buf(a, nd->sc_out, N), DACT(nd->out), count);
        backward_nodes(a, nd->body, nd->n_body, N, stream);
        backward_nodes(a, nd->sc, nd->n_sc, N, stream);
        break;
    default:
        break;
    }
}

static void backward_nodes(fb_array *a, node *nodes, int n, int N, uint64_t stream)
{
    for (int i = n - 1; i >= 0; i--) backward_node(a, &nodes[i], N, stream);
}

/*
 * A token model's batch: x [N, rec] holds ids as exact floats (rec = T + 1
 * for a language model, T otherwise), checked by fb_array_check_batch.
 * Fills a->ids_host [N*T] with the first T of each record and, for a
 * language model, a->tgt_host [N*T] with the last T (the next token of each
 * position).
 */
static void token_batch(fb_array *a, const float *x, int N)
{
    int T = a->T, rec = (int)a->in_numel;
    for (int n = 0; n < N; n++) {
        for (int t = 0; t < rec; t++) {
            int32_t v = (int32_t)x[(size_t)n * rec + t];
            if (t < T) a->ids_host[(size_t)n * T + t] = v;
            if (a->lm && t >= 1) a->tgt_host[(size_t)n * T + t - 1] = v;
        }
    }
}

int fb_array_check_batch(const fb_array *a, const float *x, const int32_t *y, int N, char *msg,
                         size_t msg_cap)
{
    if (N < 1 || N > a->max_n)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "batch of %d samples, the array holds %d",
                       N, a->max_n);
    if (a->T) {
        int rec = (int)a->in_numel;
        for (int n = 0; n < N; n++) {
            for (int t = 0; t < rec; t++) {
                float v = x[(size_t)n * rec + t];
                if (!(v >= 0 && v < (float)a->V && v == (float)(int32_t)v))
                    return fb_errf(msg, msg_cap, FB_ERR_DATA,
                                   "token %g at position %d of sample %d is not an id in [0, %d) "
                                   "(model.input.vocab)",
                                   (double)v, t, n, a->V);
            }
        }
    }
    const fb_job_spec *s = a->specs[0];
    int K = a->K_row;
    if (y && !a->lm) {
        for (int n = 0; n < N; n++) {
            bool ok = s->loss == FB_LOSS_CROSS_ENTROPY || K > 1 ? (y[n] >= 0 && y[n] < K)
                                                                : y[n] >= 0;
            if (!ok)
                return fb_errf(msg, msg_cap, FB_ERR_DATA,
                               "label %d of sample %d is outside the model's %d outputs", y[n], n,
                               K);
        }
    }
    return FB_OK;
}

int fb_array_forward_backward(fb_array *a, const float *x, const int32_t *y, int N, bool train,
                              uint64_t stream, float *loss, float *correct, char *msg,
                              size_t msg_cap)
{
    int err = fb_array_check_batch(a, x, y, N, msg, msg_cap);
    if (err) return err;
    const fb_job_spec *s = a->specs[0];
    int K = a->K_row, B = a->B;
    if (a->T) token_batch(a, x, N);
    a->step = 0; /* the steps of plan_walk */
    if (a->T)
        fb_backend_upload(a->be, ACT(a->x_buf), a->ids_host,
                          (size_t)N * (size_t)a->T * sizeof(int32_t));
    else
        fb_backend_upload(a->be, ACT(a->x_buf), x,
                          (size_t)N * (size_t)a->in_numel * sizeof(float));
    forward_nodes(a, a->nodes, a->n_nodes, N, train, stream);
    if (!y) return device_status(a, msg, msg_cap);

    bool grad = train;
    a->step++; /* the loss */
    float *dlogits = NULL;
    if (grad) {
        a->gen++; /* a new backward pass: every gradient buffer starts unzeroed */
        dlogits = DACT(a->logits_buf);
    }
    float *dev_loss = ACT(a->loss_buf), *dev_correct = ACT(a->correct_buf);
    if (s->loss == FB_LOSS_CROSS_ENTROPY) {
        /* a language model: every position of every sample against its next
         * token, the mean over the N*T rows of logits [N*T, B, V] */
        int rows = N * a->out_rows;
        fb_backend_upload(a->be, ACT(a->y_buf), a->lm ? a->tgt_host : y,
                          (size_t)rows * sizeof(int32_t));
        fb_softmax_xent(a->be, dev_loss, dlogits, dev_correct, ACT(a->logits_buf),
                        (const int32_t *)ACT(a->y_buf), rows, B, K, 1.0f / (float)rows);
    } else {
        float *tgt = calloc((size_t)N * (size_t)K, sizeof *tgt);
        if (!tgt) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        for (int n = 0; n < N; n++) {
            if (K > 1)
                tgt[(size_t)n * K + y[n]] = 1.0f;
            else
                tgt[n] = (float)y[n];
        }
        fb_backend_upload(a->be, ACT(a->tgt_buf), tgt, (size_t)N * (size_t)K * sizeof(float));
        free(tgt);
        fb_mse(a->be, dev_loss, dlogits, ACT(a->logits_buf), ACT(a->tgt_buf), N, B, K,
               1.0f / (float)N);
        fb_backend_zero(a->be, dev_correct, (size_t)B * sizeof(float));
    }
    /* bf16: each member's loss gradient times its own loss scale; the
     * losses themselves stay unscaled.  fb_array_step divides it out.  A
     * pipeline stage before the last receives its output gradient already
     * scaled by the last stage, which holds the same scales. */
    if (grad && a->bf16) {
        if (!a->prescaled) fb_scale_members(a->be, dlogits, a->ls_scale + a->m0, N, B, (size_t)K);
        a->grads_scaled = true;
    }
    if (grad) backward_nodes(a, a->nodes, a->n_nodes, N, stream);
    a->step = STEP_END;
    if (loss) fb_backend_download(a->be, loss, dev_loss, (size_t)B * sizeof(float));
    if (correct) {
        fb_backend_download(a->be, correct, dev_correct, (size_t)B * sizeof(float));
        /* a language model counts positions: per sample, the fraction right */
        if (a->lm)
            for (int b = 0; b < B; b++) correct[b] /= (float)a->T;
    }
    return device_status(a, msg, msg_cap);
}

void fb_array_logits(const fb_array *a, int m, int N, float *dst)
{
    /* a language model's logits [N, T, B, V] are N*T rows of V */
    const size_t K = (size_t)a->K_row, B = (size_t)a->B;
    const float *src = a->act + a->ab[a->logits_buf].off; /* live until STEP_END */
    N *= a->out_rows;
    /* One download of all members' rows, then a host gather: on a GPU every
     * download waits for the device, so N row-sized ones would cost N waits.
     * Row by row only when the host buffer cannot be had. */
    if (B == 1) {
        fb_backend_download(a->be, dst, src, (size_t)N * K * sizeof(float));
        return;
    }
    float *all = malloc((size_t)N * B * K * sizeof *all);
    if (!all) {
        for (int n = 0; n < N; n++)
            fb_backend_download(a->be, dst + (size_t)n * K, src + ((size_t)n * B + m) * K,
                                K * sizeof(float));
        return;
    }
    fb_backend_download(a->be, all, src, (size_t)N * B * K * sizeof *all);
    for (int n = 0; n < N; n++)
        memcpy(dst + (size_t)n * K, all + ((size_t)n * B + m) * K, K * sizeof *all);
    free(all);
}
