/*
 * The fused training array: a tree of layer nodes over five slabs.
 *
 * Building walks the spec's layers once, giving every parameter tensor an
 * offset in its slab (sized for the initial B and max_n) and every
 * activation, activation gradient and saved statistic a buffer of the
 * activation slab.  The buffers are then planned: one training pass (input,
 * forward, loss, backward) is walked step by step to find the steps that use
 * each buffer, and buffers that are never live at the same step share bytes
 * (plan_slab).  An activation lives from the op that writes it to the last op
 * that reads it, forward or backward; a gradient from the first backward op
 * that adds into it to the op that reads it, so a chain keeps about two
 * gradients at once and the early layers' large activations are reused for
 * the gradients of the late ones.  Every access checks that its buffer is
 * live at the current step, so a plan that missed a use fails loudly in every
 * test instead of silently sharing bytes.
 */
#include "array.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_backend.h"
#include "rng.h"
#include "safetensors.h"

#ifndef FB_VERSION_STRING
#define FB_VERSION_STRING "0.1.0"
#endif

#define MAX_PARAM_DIMS 4
#define NAME_CAP 96
/* The step after a pass: what the caller reads afterwards (logits, losses)
 * lives until here. */
#define STEP_END INT_MAX

/* A parameter tensor or batch-norm buffer: [B, per_member] at offset. */
typedef struct tensor_def {
    char name[NAME_CAP];
    size_t offset, per_member;
    int ndim;
    int64_t shape[MAX_PARAM_DIMS];
    int64_t fan_in; /* > 0: PyTorch's uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) init */
    float fill;     /* otherwise this constant */
} tensor_def;

typedef enum node_kind { NODE_LAYER, NODE_EXPAND } node_kind;

/*
 * A buffer of the activation slab: an activation [N, B, per_sample], the
 * gradient of one, or what an op saves for its backward.  Sizes are for
 * max_n samples and the initial B; a pass uses the first N*B rows.
 */
typedef struct abuf {
    size_t floats;
    int64_t per_sample; /* an activation or gradient: floats per (sample, member) */
    int grad;           /* an activation: the buffer of its gradient, -1 if none */
    bool is_grad;
    int first, last;    /* the steps of a pass that use it, -1 if none (plan_walk) */
    size_t off;         /* in the slab */
    uint64_t gen;       /* a gradient: the backward pass that zeroed it last */
} abuf;

typedef struct node node;
struct node {
    node_kind kind;
    const fb_layer *L;
    int id;              /* position in traversal, mixed into dropout streams */
    bool shared_in;      /* input is the shared minibatch [N, ...] */
    int64_t in_numel, out_numel;
    int in, out;         /* activation buffers */
    int save1, save2;    /* saved statistics / argmax buffers, -1 if none */
    int w, b;            /* parameter tensors, -1 if none */
    int rm, rv;          /* batch-norm buffers, -1 if none */
    int bn_index;        /* index into num_batches_tracked */
    node *body, *sc;
    int n_body, n_sc;
    int sc_out;          /* residual: shortcut output (== in for identity) */
};

struct fb_array {
    fb_backend *be;
    const fb_job_spec **specs; /* [Bcap], slot order */
    uint64_t *seeds;           /* [Bcap] */
    int64_t *bn_tracked;       /* [Bcap * n_bn] */
    int B, Bcap, max_n;
    int K;
    int64_t in_numel;

    node *nodes; /* top-level */
    int n_nodes;
    int n_ids, n_bn;

    tensor_def *params, *bufs;
    int n_params, n_bufs, cap_params, cap_bufs;
    size_t params_floats, bufs_floats, act_floats, scratch_floats;
    fb_param_block *blocks;

    float *p, *g, *s1, *s2; /* parameters, gradients, optimizer state */
    float *rb;              /* running statistics */
    float *act;             /* activations, their gradients, saved state */
    float *scratch;         /* conv workspace */
    /* bf16 arrays: the operands of linear and conv products rounded to bf16
     * (fb_round_bf16), [bf16_floats]; NULL in fp32 and tf32 arrays, which
     * make no extra pass. */
    bool bf16;
    float *bf16_scratch;
    size_t bf16_floats;
    /* bf16 dynamic loss scaling, per slot: the scale, the finite steps since
     * it last changed, whether the last update was skipped, and the growth
     * interval.  grads_scaled: the gradient slab holds each member's
     * gradient times its scale (from a training backward to the next
     * fb_array_step).  ls_force: the next update of a slot is skipped
     * whatever its own gradients hold (another pipeline stage's overflowed);
     * prescaled: the output gradient backward receives is already scaled
     * (a pipeline stage before the last), so backward does not scale it. */
    float *ls_scale, *ls_flags, *ls_host;
    int64_t *ls_good;
    bool *ls_skipped, *ls_force;
    bool prescaled;
    fb_optim_hparams *ls_hp;
    int64_t ls_interval;
    bool grads_scaled;
    int x_buf, y_buf, tgt_buf, loss_buf, correct_buf, logits_buf;
    bool oom; /* an allocation failed while planning */

    /* The activation slab's buffers.  A gradient buffer is zeroed (over the
     * batch's N*B rows only) by the first op of a backward pass that adds
     * into it, which is where its live range starts; gen counts passes. */
    abuf *ab;
    int n_ab, cap_ab;
    int step; /* the step of the pass being run, as plan_walk counts them */
    uint64_t gen;
};

/* ---- building ------------------------------------------------------------ */

static size_t take(size_t *used, size_t floats)
{
    size_t off = *used;
    *used += (floats + 15) & ~(size_t)15; /* keep 64-byte alignment */
    return off;
}

static int add_tensor(fb_array *a, bool buffer, const char *prefix, const char *leaf, int ndim,
                      const int64_t *shape, int64_t fan_in, float fill)
{
    tensor_def **arr = buffer ? &a->bufs : &a->params;
    int *n = buffer ? &a->n_bufs : &a->n_params;
    int *cap = buffer ? &a->cap_bufs : &a->cap_params;
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 16;
        tensor_def *t = realloc(*arr, (size_t)nc * sizeof *t);
        if (!t) {
            a->oom = true;
            return -1;
        }
        *arr = t;
        *cap = nc;
    }
    tensor_def *t = &(*arr)[*n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s.%s", prefix, leaf);
    t->ndim = ndim;
    t->per_member = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->per_member *= (size_t)shape[i];
    }
    t->fan_in = fan_in;
    t->fill = fill;
    t->offset = take(buffer ? &a->bufs_floats : &a->params_floats, t->per_member * (size_t)a->Bcap);
    return (*n)++;
}

static int build_layers(fb_array *a, const fb_layer *layers, int n, const char *prefix, int in,
                        bool shared, node **out, int *n_out, int *out_buf, char *msg, size_t cap);

/* Adds a buffer of the activation slab; returns its index, or -1 (and sets
 * a->oom) when out of memory. */
static int new_buf(fb_array *a, size_t floats, int64_t per_sample, bool is_grad)
{
    if (a->n_ab == a->cap_ab) {
        int nc = a->cap_ab ? 2 * a->cap_ab : 16;
        abuf *r = realloc(a->ab, (size_t)nc * sizeof *r);
        if (!r) {
            a->oom = true;
            return -1;
        }
        a->ab = r;
        a->cap_ab = nc;
    }
    a->ab[a->n_ab] = (abuf){.floats = floats, .per_sample = per_sample, .grad = -1,
                            .is_grad = is_grad, .first = -1, .last = -1};
    return a->n_ab++;
}

/* Adds an activation of per_sample floats per (sample, member) and the
 * buffer of its gradient; returns the activation's index or -1. */
static int new_act(fb_array *a, int64_t per_sample)
{
    size_t floats = (size_t)a->max_n * (size_t)a->Bcap * (size_t)per_sample;
    int x = new_buf(a, floats, per_sample, false);
    int g = x < 0 ? -1 : new_buf(a, floats, per_sample, true);
    if (g < 0) return -1;
    a->ab[x].grad = g;
    return x;
}

/* Floats of n values in a slab, keeping 64-byte alignment as take() does. */
static size_t pad16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Grows the bf16 scratch of a bf16 array to hold a linear or conv node's
 * rounded operands at the largest batch: its input [max_n, Bi, in_numel], its
 * weights [Bcap, w_per_member] and its output gradient [max_n, Bcap,
 * out_numel] (backward rounds all three). */
static void bf16_plan(fb_array *a, const node *nd, size_t w_per_member)
{
    if (!a->bf16) return;
    size_t Bi = nd->shared_in ? 1 : (size_t)a->Bcap;
    size_t need = pad16((size_t)a->max_n * Bi * (size_t)nd->in_numel) +
                  pad16((size_t)a->Bcap * w_per_member) +
                  pad16((size_t)a->max_n * (size_t)a->Bcap * (size_t)nd->out_numel);
    if (need > a->bf16_floats) a->bf16_floats = need;
}

/* Plans one layer: its output buffer, saved statistics and parameters.
 * numel > 0 runs an elementwise layer on numel values per sample instead of
 * its own shape (a relu moved behind a max pool, see build_layers). */
static int build_node(fb_array *a, node *nd, const fb_layer *L, const char *name, int in,
                      bool shared, int64_t numel, char *msg, size_t cap)
{
    size_t NB = (size_t)a->max_n * (size_t)a->Bcap;
    memset(nd, 0, sizeof *nd);
    nd->kind = NODE_LAYER;
    nd->L = L;
    nd->id = a->n_ids++;
    nd->shared_in = shared;
    nd->in_numel = numel > 0 ? numel : fb_shape_numel(&L->in);
    nd->out_numel = numel > 0 ? numel : fb_shape_numel(&L->out);
    nd->in = in;
    nd->save1 = nd->save2 = nd->sc_out = -1;
    nd->w = nd->b = nd->rm = nd->rv = nd->bn_index = -1;
    int64_t shp[MAX_PARAM_DIMS];

    switch (L->type) {
    case FB_LAYER_FLATTEN:
        nd->out = in; /* [N, B, C, H, W] is already [N, B, C*H*W] */
        return FB_OK;
    case FB_LAYER_LINEAR:
        shp[0] = L->out_features;
        shp[1] = L->in.d[0];
        nd->w = add_tensor(a, false, name, "weight", 2, shp, L->in.d[0], 0);
        if (L->bias) nd->b = add_tensor(a, false, name, "bias", 1, shp, L->in.d[0], 0);
        bf16_plan(a, nd, (size_t)(L->out_features * L->in.d[0]));
        break;
    case FB_LAYER_CONV2D: {
        int64_t fan = L->in.d[0] * L->kernel[0] * L->kernel[1];
        shp[0] = L->out_features;
        shp[1] = L->in.d[0];
        shp[2] = L->kernel[0];
        shp[3] = L->kernel[1];
        nd->w = add_tensor(a, false, name, "weight", 4, shp, fan, 0);
        if (L->bias) nd->b = add_tensor(a, false, name, "bias", 1, shp, fan, 0);
        fb_conv_geom g = {.N = a->max_n, .B = a->Bcap, .C = (int)L->in.d[0],
                          .H = (int)L->in.d[1], .W = (int)L->in.d[2], .K = (int)L->out_features,
                          .kh = L->kernel[0], .kw = L->kernel[1], .sh = L->stride[0],
                          .sw = L->stride[1], .ph = L->padding[0], .pw = L->padding[1],
                          .shared = shared};
        fb_conv_geom_finish(&g);
        size_t s = fb_conv2d_scratch_floats(a->be, &g);
        if (s > a->scratch_floats) a->scratch_floats = s;
        bf16_plan(a, nd, (size_t)(L->out_features * L->in.d[0] * L->kernel[0] * L->kernel[1]));
        break;
    }
    case FB_LAYER_MAXPOOL2D:
        nd->save1 = new_buf(a, NB * (size_t)nd->out_numel, 0, false); /* argmax, int32 */
        break;
    case FB_LAYER_BATCHNORM:
        shp[0] = L->in.d[0];
        if (L->affine) {
            nd->w = add_tensor(a, false, name, "weight", 1, shp, 0, 1.0f);
            nd->b = add_tensor(a, false, name, "bias", 1, shp, 0, 0.0f);
        }
        nd->rm = add_tensor(a, true, name, "running_mean", 1, shp, 0, 0.0f);
        nd->rv = add_tensor(a, true, name, "running_var", 1, shp, 0, 1.0f);
        nd->bn_index = a->n_bn++;
        nd->save1 = new_buf(a, (size_t)a->Bcap * (size_t)L->in.d[0], 0, false);
        nd->save2 = new_buf(a, (size_t)a->Bcap * (size_t)L->in.d[0], 0, false);
        break;
    case FB_LAYER_LAYERNORM:
        for (int i = 0; i < L->in.ndim; i++) shp[i] = L->in.d[i];
        if (L->affine) {
            nd->w = add_tensor(a, false, name, "weight", L->in.ndim, shp, 0, 1.0f);
            nd->b = add_tensor(a, false, name, "bias", L->in.ndim, shp, 0, 0.0f);
        }
        nd->save1 = new_buf(a, NB, 0, false);
        nd->save2 = new_buf(a, NB, 0, false);
        break;
    case FB_LAYER_RESIDUAL: {
        char sub[NAME_CAP];
        int body_out, sc_out = in;
        snprintf(sub, sizeof sub, "%s.body", name);
        int err = build_layers(a, L->body, L->n_body, sub, in, false, &nd->body, &nd->n_body,
                               &body_out, msg, cap);
        if (err) return err;
        if (L->n_shortcut) {
            snprintf(sub, sizeof sub, "%s.shortcut", name);
            err = build_layers(a, L->shortcut, L->n_shortcut, sub, in, false, &nd->sc, &nd->n_sc,
                               &sc_out, msg, cap);
            if (err) return err;
        }
        nd->save1 = body_out; /* the body's output */
        nd->sc_out = sc_out;
        break;
    }
    default:
        break;
    }
    nd->out = new_act(a, nd->out_numel);
    return a->oom ? fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory") : FB_OK;
}

static void nodes_free(node *nodes, int n)
{
    if (!nodes) return;
    for (int i = 0; i < n; i++) {
        nodes_free(nodes[i].body, nodes[i].n_body);
        nodes_free(nodes[i].sc, nodes[i].n_sc);
    }
    free(nodes);
}

/* Plans a chain of layers starting from activation buffer in; *out_buf
 * receives the buffer of the chain's output. */
static int build_layers(fb_array *a, const fb_layer *layers, int n, const char *prefix, int in,
                        bool shared, node **out, int *n_out, int *out_buf, char *msg, size_t cap)
{
    /* one extra slot for a broadcast of the shared input */
    node *nodes = calloc((size_t)n + 1, sizeof *nodes);
    if (!nodes) return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    int k = 0, err = FB_OK;
    int cur = in;
    for (int i = 0; i < n; i++) {
        const fb_layer *L = &layers[i];
        bool consumes_shared = L->type == FB_LAYER_LINEAR || L->type == FB_LAYER_CONV2D ||
                               L->type == FB_LAYER_FLATTEN;
        if (shared && !consumes_shared) {
            /* ops other than the first GEMM layer need one copy per member */
            node *e = &nodes[k++];
            memset(e, 0, sizeof *e);
            e->kind = NODE_EXPAND;
            e->id = a->n_ids++;
            e->shared_in = true;
            e->in_numel = e->out_numel = fb_shape_numel(&L->in);
            e->in = cur;
            e->w = e->b = e->rm = e->rv = e->bn_index = -1;
            e->save1 = e->save2 = e->sc_out = -1;
            e->out = new_act(a, e->out_numel);
            if (e->out < 0) {
                err = fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
                goto fail;
            }
            cur = e->out;
            shared = false;
        }
        char name[NAME_CAP];
        if (*prefix)
            snprintf(name, sizeof name, "%s.%d", prefix, i);
        else
            snprintf(name, sizeof name, "%d", i);
        if (!shared && L->type == FB_LAYER_RELU && i + 1 < n &&
            layers[i + 1].type == FB_LAYER_MAXPOOL2D) {
            /*
             * relu then max pool runs as max pool then relu: relu is
             * non-decreasing, so max(relu(x)) = relu(max(x)) value for value,
             * and the gradient is the same (a window whose maximum is positive
             * picks the same first maximum either way; one whose maximum is
             * not gets a zero gradient either way).  The relu then touches a
             * quarter of the data (2x2 pooling) and the full-size relu output
             * and its gradient are never stored.
             */
            char pname[NAME_CAP];
            if (*prefix)
                snprintf(pname, sizeof pname, "%s.%d", prefix, i + 1);
            else
                snprintf(pname, sizeof pname, "%d", i + 1);
            err = build_node(a, &nodes[k], &layers[i + 1], pname, cur, false, 0, msg, cap);
            k++;
            if (err) goto fail;
            cur = nodes[k - 1].out;
            err = build_node(a, &nodes[k], L, name, cur, false,
                             fb_shape_numel(&layers[i + 1].out), msg, cap);
            k++;
            if (err) goto fail;
            cur = nodes[k - 1].out;
            i++;
            continue;
        }
        err = build_node(a, &nodes[k], L, name, cur, shared, 0, msg, cap);
        k++;
        if (err) goto fail;
        cur = nodes[k - 1].out;
        if (L->type != FB_LAYER_FLATTEN) shared = false;
    }
    if (shared) {
        /* a model that never left the shared input (flatten only) */
        fb_errf(msg, cap, FB_ERR_UNSUPPORTED, "the model has no layer that computes anything");
        err = FB_ERR_UNSUPPORTED;
        goto fail;
    }
    *out = nodes;
    *n_out = k;
    *out_buf = cur;
    return FB_OK;
fail:
    nodes_free(nodes, k);
    return err;
}

static void init_member(fb_array *a, int m)
{
    uint64_t seed = a->seeds[m];
    for (int t = 0; t < a->n_params + a->n_bufs; t++) {
        bool is_buf = t >= a->n_params;
        const tensor_def *d = is_buf ? &a->bufs[t - a->n_params] : &a->params[t];
        float *host = malloc(d->per_member * sizeof *host);
        FB_ASSERT(host);
        if (d->fan_in > 0) {
            float bound = (float)(1.0 / sqrt((double)d->fan_in));
            for (size_t i = 0; i < d->per_member; i++)
                host[i] = (2.0f * fb_rng_uniform(seed, (uint64_t)t, i) - 1.0f) * bound;
        } else {
            for (size_t i = 0; i < d->per_member; i++) host[i] = d->fill;
        }
        float *dst = (is_buf ? a->rb : a->p) + d->offset + (size_t)m * d->per_member;
        fb_backend_upload(a->be, dst, host, d->per_member * sizeof *host);
        free(host);
    }
    for (int i = 0; i < a->n_bn; i++) a->bn_tracked[(size_t)m * a->n_bn + i] = 0;
}

/* ---- planning the activation slab ------------------------------------------
 *
 * One pass is a sequence of steps: step 0 receives the input, then every node
 * of the forward pass is one step (a residual block's own step, the sum,
 * comes after its body and shortcut), then the loss, then every node of the
 * backward pass (a residual block's step, which hands the output gradient to
 * both branches, comes before them), and STEP_END is what the caller reads
 * afterwards.  forward_node and backward_node advance a->step exactly as the
 * walk below does, and every buffer access asserts that its buffer is live.
 */

/* Buffer id is used at the walk's current step: written when write, read
 * otherwise.  A read needs a write before it in the same pass, since bytes
 * shared with other buffers keep nothing from one pass to the next. */
static void plan_use(fb_array *a, int id, bool write)
{
    FB_ASSERT(id >= 0 && id < a->n_ab);
    abuf *b = &a->ab[id];
    FB_ASSERT(write || b->first >= 0);
    if (b->first < 0) b->first = a->step;
    b->last = a->step;
}

/* The gradient of activation id. */
static int grad_of(const fb_array *a, int id)
{
    FB_ASSERT(id >= 0 && id < a->n_ab && a->ab[id].grad >= 0);
    return a->ab[id].grad;
}

static void plan_forward(fb_array *a, const node *nodes, int n)
{
    for (int i = 0; i < n; i++) {
        const node *nd = &nodes[i];
        bool residual = nd->kind == NODE_LAYER && nd->L->type == FB_LAYER_RESIDUAL;
        if (residual) {
            plan_forward(a, nd->body, nd->n_body);
            plan_forward(a, nd->sc, nd->n_sc);
        }
        a->step++;
        if (nd->kind == NODE_LAYER && nd->L->type == FB_LAYER_FLATTEN) continue;
        if (residual) {
            plan_use(a, nd->save1, false);
            plan_use(a, nd->sc_out, false);
        } else {
            plan_use(a, nd->in, false);
        }
        plan_use(a, nd->out, true);
        if (!residual && nd->save1 >= 0) plan_use(a, nd->save1, true);
        if (nd->save2 >= 0) plan_use(a, nd->save2, true);
    }
}

/* What each backward op reads besides its output's gradient is what its
 * kernel reads: max pooling only its argmax, relu, tanh and sigmoid only
 * their output, gelu only its input, linear and conv their input (for the
 * weight gradient), the norms their input and saved statistics. */
static void plan_backward(fb_array *a, const node *nodes, int n)
{
    for (int i = n - 1; i >= 0; i--) {
        const node *nd = &nodes[i];
        a->step++;
        if (nd->kind == NODE_EXPAND) continue; /* the shared input needs no gradient */
        const fb_layer *L = nd->L;
        if (L->type == FB_LAYER_FLATTEN) continue;
        plan_use(a, grad_of(a, nd->out), false);
        if (L->type == FB_LAYER_RESIDUAL) {
            plan_use(a, grad_of(a, nd->save1), true);
            plan_use(a, grad_of(a, nd->sc_out), true);
            plan_backward(a, nd->body, nd->n_body);
            plan_backward(a, nd->sc, nd->n_sc);
            continue;
        }
        if (!nd->shared_in) plan_use(a, grad_of(a, nd->in), true);
        switch (L->type) {
        case FB_LAYER_LINEAR:
        case FB_LAYER_CONV2D:
        case FB_LAYER_GELU:
            plan_use(a, nd->in, false);
            break;
        case FB_LAYER_MAXPOOL2D:
            plan_use(a, nd->save1, false);
            break;
        case FB_LAYER_RELU:
        case FB_LAYER_TANH:
        case FB_LAYER_SIGMOID:
            plan_use(a, nd->out, false);
            break;
        case FB_LAYER_BATCHNORM:
        case FB_LAYER_LAYERNORM:
            plan_use(a, nd->in, false);
            plan_use(a, nd->save1, false);
            plan_use(a, nd->save2, false);
            break;
        default:
            break;
        }
    }
}

/* Finds every buffer's live range: the steps of a training pass that use it. */
static void plan_walk(fb_array *a)
{
    a->step = 0;
    plan_use(a, a->x_buf, true);
    plan_forward(a, a->nodes, a->n_nodes);
    a->step++; /* the loss and the logits' gradient */
    plan_use(a, a->logits_buf, false);
    plan_use(a, a->specs[0]->loss == FB_LOSS_CROSS_ENTROPY ? a->y_buf : a->tgt_buf, true);
    plan_use(a, a->loss_buf, true);
    plan_use(a, a->correct_buf, true);
    plan_use(a, grad_of(a, a->logits_buf), true);
    plan_backward(a, a->nodes, a->n_nodes);
    a->step = STEP_END;
    plan_use(a, a->logits_buf, false);
    plan_use(a, a->loss_buf, false);
    plan_use(a, a->correct_buf, false);
}

/* A buffer's bytes in the slab, rounded up to keep 64-byte alignment. */
static size_t buf_span(const abuf *b)
{
    return b->first < 0 ? 0 : (b->floats + 15) & ~(size_t)15;
}

typedef struct plan_key {
    size_t span;
    int first, id;
} plan_key;

/* Largest first; among equals the earlier first, so a chain packs in order. */
static int plan_key_cmp(const void *x, const void *y)
{
    const plan_key *p = x, *q = y;
    if (p->span != q->span) return p->span > q->span ? -1 : 1;
    if (p->first != q->first) return p->first < q->first ? -1 : 1;
    return (p->id > q->id) - (p->id < q->id);
}

typedef struct plan_span {
    size_t lo, hi;
} plan_span;

static int plan_span_cmp(const void *x, const void *y)
{
    const plan_span *p = x, *q = y;
    return (p->lo > q->lo) - (p->lo < q->lo);
}

/*
 * Gives every used buffer an offset and sets a->act_floats to the slab's
 * size.  FB_ARRAY_PLAN_PRIVATE lays buffers one after another.  The shared
 * plan is greedy interval packing: buffers largest first, each at the lowest
 * offset where it overlaps in bytes no placed buffer whose live range
 * overlaps its own.  The slab is then never larger than the private one, and
 * a chain's gradients end up alternating between two places.
 */
static int plan_slab(fb_array *a, fb_array_plan plan, char *msg, size_t cap)
{
    plan_walk(a);
    size_t total = 0;
    if (plan == FB_ARRAY_PLAN_PRIVATE) {
        for (int i = 0; i < a->n_ab; i++) {
            a->ab[i].off = total;
            total += buf_span(&a->ab[i]);
        }
        a->act_floats = total;
        return FB_OK;
    }
    plan_key *keys = malloc(((size_t)a->n_ab + 1) * sizeof *keys);
    plan_span *busy = malloc(((size_t)a->n_ab + 1) * sizeof *busy);
    if (!keys || !busy) {
        free(keys);
        free(busy);
        return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory planning activations");
    }
    int n = 0;
    for (int i = 0; i < a->n_ab; i++) {
        a->ab[i].off = 0;
        if (buf_span(&a->ab[i]))
            keys[n++] = (plan_key){.span = buf_span(&a->ab[i]), .first = a->ab[i].first, .id = i};
    }
    qsort(keys, (size_t)n, sizeof *keys, plan_key_cmp);
    for (int k = 0; k < n; k++) {
        abuf *b = &a->ab[keys[k].id];
        int nb = 0;
        for (int j = 0; j < k; j++) {
            const abuf *o = &a->ab[keys[j].id];
            if (o->first <= b->last && b->first <= o->last)
                busy[nb++] = (plan_span){.lo = o->off, .hi = o->off + keys[j].span};
        }
        qsort(busy, (size_t)nb, sizeof *busy, plan_span_cmp);
        size_t off = 0;
        for (int j = 0; j < nb && busy[j].lo < off + keys[k].span; j++)
            if (busy[j].hi > off) off = busy[j].hi;
        b->off = off;
        if (off + keys[k].span > total) total = off + keys[k].span;
    }
    free(keys);
    free(busy);
    a->act_floats = total;
    return FB_OK;
}

int fb_array_new(fb_backend *be, const fb_job_spec *const *specs, int B, int max_n,
                 fb_array **out, char *msg, size_t cap)
{
    return fb_array_new_planned(be, specs, B, max_n, FB_ARRAY_PLAN_SHARED, out, msg, cap);
}

int fb_array_new_planned(fb_backend *be, const fb_job_spec *const *specs, int B, int max_n,
                         fb_array_plan plan, fb_array **out, char *msg, size_t cap)
{
    if (B < 1 || max_n < 1)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE, "an array needs B >= 1 and max_n >= 1");
    if (plan != FB_ARRAY_PLAN_SHARED && plan != FB_ARRAY_PLAN_PRIVATE)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE, "unknown activation plan %d", (int)plan);
    for (int b = 1; b < B; b++)
        if (!fb_job_spec_fusible(specs[0], specs[b]))
            return fb_errf(msg, cap, FB_ERR_NOT_FUSIBLE,
                           "specs '%s' and '%s' have different fusion keys (%s, %s)",
                           specs[0]->name, specs[b]->name, specs[0]->fusion_key,
                           specs[b]->fusion_key);
    fb_array *a = calloc(1, sizeof *a);
    if (!a) return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    int err = FB_ERR_NOMEM;
    a->be = be;
    a->B = a->Bcap = B;
    a->max_n = max_n;
    a->in_numel = fb_shape_numel(&specs[0]->input);
    a->K = (int)fb_shape_numel(&specs[0]->output);
    a->specs = calloc((size_t)B, sizeof *a->specs);
    a->seeds = calloc((size_t)B, sizeof *a->seeds);
    if (!a->specs || !a->seeds) goto nomem;
    for (int b = 0; b < B; b++) {
        a->specs[b] = specs[b];
        a->seeds[b] = specs[b]->seed;
    }

    a->bf16 = specs[0]->precision == FB_PREC_BF16;
    a->x_buf = new_buf(a, (size_t)max_n * (size_t)a->in_numel, 0, false);
    if (a->x_buf < 0) goto nomem;
    err = build_layers(a, specs[0]->layers, specs[0]->n_layers, "", a->x_buf, true, &a->nodes,
                       &a->n_nodes, &a->logits_buf, msg, cap);
    if (err) goto fail;
    a->y_buf = new_buf(a, (size_t)max_n, 0, false); /* int32 labels */
    a->tgt_buf = new_buf(a, (size_t)max_n * (size_t)a->K, 0, false);
    a->loss_buf = new_buf(a, (size_t)B, 0, false);
    a->correct_buf = new_buf(a, (size_t)B, 0, false);
    if (a->oom) goto nomem;
    if ((err = plan_slab(a, plan, msg, cap))) goto fail;
    err = FB_ERR_NOMEM;

    a->bn_tracked = calloc((size_t)B * (size_t)(a->n_bn ? a->n_bn : 1), sizeof *a->bn_tracked);
    a->blocks = calloc((size_t)(a->n_params ? a->n_params : 1), sizeof *a->blocks);
    if (!a->bn_tracked || !a->blocks) goto nomem;
    for (int t = 0; t < a->n_params; t++) {
        a->blocks[t].offset = a->params[t].offset;
        a->blocks[t].per_member = a->params[t].per_member;
    }
    size_t pb = (a->params_floats ? a->params_floats : 16) * sizeof(float);
    a->p = fb_backend_alloc(be, pb);
    a->g = fb_backend_alloc(be, pb);
    a->s1 = fb_backend_alloc(be, pb);
    a->s2 = specs[0]->optim.type == FB_OPTIM_SGD ? NULL : fb_backend_alloc(be, pb);
    a->rb = fb_backend_alloc(be, (a->bufs_floats ? a->bufs_floats : 16) * sizeof(float));
    a->act = fb_backend_alloc(be, (a->act_floats ? a->act_floats : 16) * sizeof(float));
    a->scratch = fb_backend_alloc(be, (a->scratch_floats ? a->scratch_floats : 16) * sizeof(float));
    if (a->bf16) {
        a->ls_scale = calloc((size_t)B, sizeof *a->ls_scale);
        a->ls_host = calloc((size_t)B, sizeof *a->ls_host);
        a->ls_good = calloc((size_t)B, sizeof *a->ls_good);
        a->ls_skipped = calloc((size_t)B, sizeof *a->ls_skipped);
        a->ls_force = calloc((size_t)B, sizeof *a->ls_force);
        a->ls_hp = calloc((size_t)B, sizeof *a->ls_hp);
        a->ls_flags = fb_backend_alloc(be, (size_t)B * sizeof(float));
        if (!a->ls_scale || !a->ls_host || !a->ls_good || !a->ls_skipped || !a->ls_force ||
            !a->ls_hp || !a->ls_flags)
            goto nomem;
        for (int b = 0; b < B; b++)
            a->ls_scale[b] = FB_LOSS_SCALE_INIT;
        a->ls_interval = FB_LOSS_SCALE_INTERVAL;
        if (!fb_backend_supports(be, FB_OP_BF16)) {
            err = fb_errf(msg, cap, FB_ERR_UNSUPPORTED, "backend %s cannot round to bf16",
                          fb_backend_name(be));
            goto fail;
        }
        a->bf16_scratch =
            fb_backend_alloc(be, (a->bf16_floats ? a->bf16_floats : 16) * sizeof(float));
        if (!a->bf16_scratch) goto nomem;
    }
    if (!a->p || !a->g || !a->s1 || (!a->s2 && specs[0]->optim.type != FB_OPTIM_SGD) || !a->rb ||
        !a->act || !a->scratch)
        goto nomem;

    for (int b = 0; b < B; b++) {
        init_member(a, b);
        if (specs[b]->init[0] && (err = fb_array_load(a, b, specs[b]->init, msg, cap))) goto fail;
    }
    *out = a;
    return FB_OK;
nomem:
    err = fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory allocating the array");
fail:
    fb_array_free(a);
    return err;
}

void fb_array_free(fb_array *a)
{
    if (!a) return;
    nodes_free(a->nodes, a->n_nodes);
    fb_backend_free(a->be, a->p);
    fb_backend_free(a->be, a->g);
    fb_backend_free(a->be, a->s1);
    fb_backend_free(a->be, a->s2);
    fb_backend_free(a->be, a->rb);
    fb_backend_free(a->be, a->act);
    fb_backend_free(a->be, a->scratch);
    fb_backend_free(a->be, a->bf16_scratch);
    fb_backend_free(a->be, a->ls_flags);
    free(a->ls_scale);
    free(a->ls_host);
    free(a->ls_good);
    free(a->ls_skipped);
    free(a->ls_force);
    free(a->ls_hp);
    free(a->params);
    free(a->bufs);
    free(a->ab);
    free(a->blocks);
    free(a->specs);
    free(a->seeds);
    free(a->bn_tracked);
    free(a);
}

int fb_array_size(const fb_array *a)
{
    return a->B;
}

const fb_job_spec *fb_array_spec(const fb_array *a, int m)
{
    return a->specs[m];
}

size_t fb_array_member_params(const fb_array *a)
{
    size_t n = 0;
    for (int t = 0; t < a->n_params; t++) n += a->params[t].per_member;
    return n;
}

int fb_array_outputs(const fb_array *a)
{
    return a->K;
}

int fb_array_buffer_count(const fb_array *a)
{
    return a->n_ab;
}

fb_array_buffer fb_array_buffer_at(const fb_array *a, int i)
{
    FB_ASSERT(i >= 0 && i < a->n_ab);
    const abuf *b = &a->ab[i];
    return (fb_array_buffer){.offset = b->off, .floats = b->first < 0 ? 0 : b->floats,
                             .first = b->first, .last = b->last, .grad = b->is_grad};
}

size_t fb_array_slab_floats(const fb_array *a)
{
    return a->act_floats;
}

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
#define PW(nd) (a->p + a->params[(nd)->w].offset)
#define PB(nd) ((nd)->b >= 0 ? a->p + a->params[(nd)->b].offset : NULL)
#define GW(nd) (a->g + a->params[(nd)->w].offset)
#define GB(nd) ((nd)->b >= 0 ? a->g + a->params[(nd)->b].offset : NULL)

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
    switch (L->type) {
    case FB_LAYER_FLATTEN:
        break;
    case FB_LAYER_LINEAR: {
        const float *in = ACT(nd->in), *w = PW(nd);
        if (a->bf16) bf16_operands(a, nd, N, &in, &w, NULL);
        fb_linear_forward(be, ACT(nd->out), in, w, PB(nd), N, B, (int)L->in.d[0],
                          (int)L->out_features, nd->shared_in);
        break;
    }
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
            fb_dropout_forward(be, ACT(nd->out), ACT(nd->in), a->seeds,
                               fb_rng_mix64(stream ^ ((uint64_t)nd->id << 32)), (float)L->p, N,
                               B, (int)nd->in_numel, 0);
        else
            fb_backend_copy(be, ACT(nd->out), ACT(nd->in), count * sizeof(float));
        break;
    case FB_LAYER_BATCHNORM: {
        int C = (int)L->in.d[0];
        float *gamma = nd->w >= 0 ? PW(nd) : NULL, *beta = PB(nd);
        float *rm = a->rb + a->bufs[nd->rm].offset, *rv = a->rb + a->bufs[nd->rv].offset;
        if (train) {
            fb_batchnorm_forward_train(be, ACT(nd->out), ACT(nd->save1), ACT(nd->save2), rm, rv,
                                       ACT(nd->in), gamma, beta, N, B * C, bn_hw(L),
                                       (float)L->eps, (float)L->momentum);
            for (int b = 0; b < B; b++) a->bn_tracked[(size_t)b * a->n_bn + nd->bn_index]++;
        } else {
            fb_batchnorm_forward_eval(be, ACT(nd->out), ACT(nd->in), gamma, beta, rm, rv, N,
                                      B * C, bn_hw(L), (float)L->eps);
        }
        break;
    }
    case FB_LAYER_LAYERNORM:
        fb_layernorm_forward(be, ACT(nd->out), ACT(nd->save1), ACT(nd->save2), ACT(nd->in),
                             nd->w >= 0 ? PW(nd) : NULL, PB(nd), N, B, (int)nd->in_numel,
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

/* Zeroes the current members' part of parameter tensor t's gradient. */
static void zero_param_grad(fb_array *a, int t)
{
    if (t < 0) return;
    fb_backend_zero(a->be, a->g + a->params[t].offset,
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
    /* a residual block's input gradient comes from its branches' first ops */
    float *din = nd->shared_in || L->type == FB_LAYER_FLATTEN || L->type == FB_LAYER_RESIDUAL
                     ? NULL
                     : grad_buf(a, nd->in, N);
    switch (L->type) {
    case FB_LAYER_FLATTEN:
        break;
    case FB_LAYER_LINEAR: {
        const float *in = ACT(nd->in), *w = PW(nd), *dout = DACT(nd->out);
        if (a->bf16) bf16_operands(a, nd, N, &in, &w, &dout);
        fb_linear_backward(be, din, GW(nd), GB(nd), dout, in, w, N, B, (int)L->in.d[0],
                           (int)L->out_features, nd->shared_in);
        break;
    }
    case FB_LAYER_CONV2D: {
        fb_conv_geom g = conv_geom(a, nd, N);
        const float *in = ACT(nd->in), *w = PW(nd), *dout = DACT(nd->out);
        if (a->bf16) bf16_operands(a, nd, N, &in, &w, &dout);
        fb_conv2d_backward(be, din, GW(nd), GB(nd), dout, in, w, &g, conv_scratch(a, &g));
        break;
    }
    case FB_LAYER_MAXPOOL2D: {
        fb_pool_geom g = pool_geom(a, nd, N);
        fb_maxpool2d_backward(be, din, DACT(nd->out), (const int32_t *)ACT(nd->save1), &g);
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
        fb_act_backward(be, FB_ACT_RELU, din, DACT(nd->out), ACT(nd->out), NULL, count);
        break;
    case FB_LAYER_GELU:
        fb_act_backward(be, act_of(L), din, DACT(nd->out), ACT(nd->in), NULL, count);
        break;
    case FB_LAYER_TANH:
    case FB_LAYER_SIGMOID:
        fb_act_backward(be, act_of(L), din, DACT(nd->out), NULL, ACT(nd->out), count);
        break;
    case FB_LAYER_DROPOUT:
        if (L->p > 0)
            fb_dropout_backward(be, din, DACT(nd->out), a->seeds,
                                fb_rng_mix64(stream ^ ((uint64_t)nd->id << 32)), (float)L->p, N,
                                B, (int)nd->in_numel, 0);
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
                              nd->w >= 0 ? PW(nd) : NULL, N, B, (int)nd->in_numel);
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

/* FB_OK, or the device failure the backend recorded since it was created
 * (a CUDA backend's ops return nothing and record their first failure; see
 * kernels/cuda/cuda_backend.h).  Free on the CPU backends; on CUDA it waits
 * for queued work, which the caller's downloads have mostly done already. */
static int device_status(const fb_array *a, char *msg, size_t cap)
{
    return fb_cuda_backend_error(a->be, msg, cap);
}

int fb_array_forward_backward(fb_array *a, const float *x, const int32_t *y, int N, bool train,
                              uint64_t stream, float *loss, float *correct, char *msg,
                              size_t cap)
{
    if (N < 1 || N > a->max_n)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE, "batch of %d samples, the array holds %d",
                       N, a->max_n);
    const fb_job_spec *s = a->specs[0];
    int K = a->K, B = a->B;
    if (y) {
        for (int n = 0; n < N; n++) {
            bool ok = s->loss == FB_LOSS_CROSS_ENTROPY || K > 1 ? (y[n] >= 0 && y[n] < K)
                                                                : y[n] >= 0;
            if (!ok)
                return fb_errf(msg, cap, FB_ERR_DATA,
                               "label %d of sample %d is outside the model's %d outputs", y[n],
                               n, K);
        }
    }
    a->step = 0; /* the steps of plan_walk */
    fb_backend_upload(a->be, ACT(a->x_buf), x, (size_t)N * (size_t)a->in_numel * sizeof(float));
    forward_nodes(a, a->nodes, a->n_nodes, N, train, stream);
    if (!y) return device_status(a, msg, cap);

    bool grad = train;
    a->step++; /* the loss */
    float *dlogits = NULL;
    if (grad) {
        a->gen++; /* a new backward pass: every gradient buffer starts unzeroed */
        dlogits = DACT(a->logits_buf);
    }
    float *dev_loss = ACT(a->loss_buf), *dev_correct = ACT(a->correct_buf);
    if (s->loss == FB_LOSS_CROSS_ENTROPY) {
        fb_backend_upload(a->be, ACT(a->y_buf), y, (size_t)N * sizeof(int32_t));
        fb_softmax_xent(a->be, dev_loss, dlogits, dev_correct, ACT(a->logits_buf),
                        (const int32_t *)ACT(a->y_buf), N, B, K, 1.0f / (float)N);
    } else {
        float *tgt = calloc((size_t)N * (size_t)K, sizeof *tgt);
        if (!tgt) return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
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
        if (!a->prescaled) fb_scale_members(a->be, dlogits, a->ls_scale, N, B, (size_t)K);
        a->grads_scaled = true;
    }
    if (grad) backward_nodes(a, a->nodes, a->n_nodes, N, stream);
    a->step = STEP_END;
    if (loss) fb_backend_download(a->be, loss, dev_loss, (size_t)B * sizeof(float));
    if (correct) fb_backend_download(a->be, correct, dev_correct, (size_t)B * sizeof(float));
    return device_status(a, msg, cap);
}

void fb_array_logits(const fb_array *a, int m, int N, float *dst)
{
    const size_t K = (size_t)a->K, B = (size_t)a->B;
    const float *src = a->act + a->ab[a->logits_buf].off; /* live until STEP_END */
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

/* ---- optimisation and membership ------------------------------------------ */

void fb_array_hparams(const fb_array *a, int m, int64_t t, int64_t total, fb_optim_hparams *hp)
{
    const fb_job_spec *s = a->specs[m];
    double f = fb_sched_lr_factor(&s->sched, t - 1, total);
    memset(hp, 0, sizeof *hp);
    hp->lr = (float)(s->optim.lr * f);
    hp->weight_decay = (float)s->optim.weight_decay;
    hp->momentum = (float)s->optim.momentum;
    hp->dampening = (float)s->optim.dampening;
    hp->nesterov = s->optim.nesterov;
    hp->beta1 = (float)s->optim.beta1;
    hp->beta2 = (float)s->optim.beta2;
    hp->eps = (float)s->optim.eps;
    hp->t = t;
}

/*
 * bf16 dynamic loss scaling, before the update: one pass (fb_grad_unscale)
 * divides each member's gradients by its scale (exact: a power of two) and
 * finds the members whose scaled gradients overflowed (on the device: one
 * launch, B floats come back).  A member that overflowed, or whose update
 * fb_array_skip_update asked to skip (another pipeline stage of it
 * overflowed), gets an empty slot's hyperparameters (lr 0, t 0), which fb_optim_step skips, so its
 * parameters and optimizer state stay as they were, and its scale halves; a
 * member that did not counts the step, and doubles its scale after
 * ls_interval finite steps in a row.  Members never see each other's flags
 * or scales.  Returns the hyperparameters to update with.
 */
static const fb_optim_hparams *unscale_grads(fb_array *a, const fb_optim_hparams *hp)
{
    int B = a->B;
    float *inv = a->ls_host; /* reused: the inverses go in, the flags come back */
    for (int b = 0; b < B; b++)
        inv[b] = 1.0f / a->ls_scale[b];
    fb_grad_unscale(a->be, a->ls_flags, a->g, inv, a->blocks, a->n_params, B);
    fb_backend_download(a->be, a->ls_host, a->ls_flags, (size_t)B * sizeof(float));
    for (int b = 0; b < B; b++) {
        a->ls_skipped[b] = a->ls_host[b] != 0.0f || a->ls_force[b];
        a->ls_force[b] = false;
    }
    a->grads_scaled = false;
    for (int b = 0; b < B; b++) {
        a->ls_hp[b] = hp[b];
        if (a->ls_skipped[b]) {
            a->ls_hp[b].lr = 0.0f;
            a->ls_hp[b].t = 0;
            a->ls_good[b] = 0;
            if (a->ls_scale[b] > FB_LOSS_SCALE_MIN) a->ls_scale[b] *= 0.5f;
        } else if (++a->ls_good[b] >= a->ls_interval) {
            a->ls_good[b] = 0;
            if (a->ls_scale[b] < FB_LOSS_SCALE_MAX) a->ls_scale[b] *= 2.0f;
        }
    }
    return a->ls_hp;
}

void fb_array_step(fb_array *a, const fb_optim_hparams *hp)
{
    static const fb_optim_kind kinds[] = {[FB_OPTIM_SGD] = FB_OPTIM_KIND_SGD,
                                          [FB_OPTIM_ADAM] = FB_OPTIM_KIND_ADAM,
                                          [FB_OPTIM_ADAMW] = FB_OPTIM_KIND_ADAMW};
    if (a->n_params == 0) return;
    if (a->grads_scaled) hp = unscale_grads(a, hp);
    fb_optim_step(a->be, kinds[a->specs[0]->optim.type], a->p, a->g, a->s1, a->s2, a->blocks,
                  a->n_params, a->B, hp);
}

static void shift_slots(fb_array *a, float *slab, const tensor_def *defs, int n, int m)
{
    if (!slab) return;
    for (int t = 0; t < n; t++) {
        size_t pm = defs[t].per_member;
        for (int b = m; b + 1 < a->B; b++)
            fb_backend_copy(a->be, slab + defs[t].offset + (size_t)b * pm,
                            slab + defs[t].offset + (size_t)(b + 1) * pm, pm * sizeof(float));
    }
}

void fb_array_remove(fb_array *a, int m)
{
    FB_ASSERT(m >= 0 && m < a->B);
    shift_slots(a, a->p, a->params, a->n_params, m);
    shift_slots(a, a->s1, a->params, a->n_params, m);
    shift_slots(a, a->s2, a->params, a->n_params, m);
    shift_slots(a, a->rb, a->bufs, a->n_bufs, m);
    for (int b = m; b + 1 < a->B; b++) {
        a->specs[b] = a->specs[b + 1];
        a->seeds[b] = a->seeds[b + 1];
        memcpy(a->bn_tracked + (size_t)b * a->n_bn, a->bn_tracked + (size_t)(b + 1) * a->n_bn,
               (size_t)a->n_bn * sizeof *a->bn_tracked);
        if (a->bf16) {
            a->ls_scale[b] = a->ls_scale[b + 1];
            a->ls_good[b] = a->ls_good[b + 1];
            a->ls_skipped[b] = a->ls_skipped[b + 1];
            a->ls_force[b] = a->ls_force[b + 1];
        }
    }
    a->B--;
}

/* ---- weights files --------------------------------------------------------- */

/* Batch norm k's running_mean buffer: counters follow the batch norms' order,
 * which is the order of their running_mean buffers. */
static const tensor_def *bn_mean_def(const fb_array *a, int k)
{
    for (int t = 0, seen = 0; t < a->n_bufs; t++) {
        const char *dot = strrchr(a->bufs[t].name, '.');
        if (strcmp(dot, ".running_mean") != 0) continue;
        if (seen++ == k) return &a->bufs[t];
    }
    FB_ASSERT(!"batch norm index out of range");
    return NULL;
}

int fb_array_bn_count(const fb_array *a)
{
    return a->n_bn;
}

void fb_array_bn_name(const fb_array *a, int k, char *buf, size_t cap)
{
    const tensor_def *d = bn_mean_def(a, k);
    const char *dot = strrchr(d->name, '.');
    snprintf(buf, cap, "%.*s.num_batches_tracked", (int)(dot - d->name), d->name);
}

int64_t fb_array_bn_tracked(const fb_array *a, int m, int k)
{
    FB_ASSERT(m >= 0 && m < a->B && k >= 0 && k < a->n_bn);
    return a->bn_tracked[(size_t)m * a->n_bn + k];
}

void fb_array_set_bn_tracked(fb_array *a, int m, int k, int64_t value)
{
    FB_ASSERT(m >= 0 && m < a->B && k >= 0 && k < a->n_bn);
    a->bn_tracked[(size_t)m * a->n_bn + k] = value;
}

int fb_array_tensor_count(const fb_array *a, fb_array_part part)
{
    switch (part) {
    case FB_ARRAY_BUFFER: return a->n_bufs;
    case FB_ARRAY_STATE2: return a->s2 ? a->n_params : 0;
    default: return a->n_params;
    }
}

/* The definition and slab of tensor t of part. */
static const tensor_def *part_def(const fb_array *a, fb_array_part part, int t, float **slab)
{
    FB_ASSERT(t >= 0 && t < fb_array_tensor_count(a, part));
    switch (part) {
    case FB_ARRAY_PARAM: *slab = a->p; break;
    case FB_ARRAY_GRAD: *slab = a->g; break;
    case FB_ARRAY_STATE1: *slab = a->s1; break;
    case FB_ARRAY_STATE2: *slab = a->s2; break;
    case FB_ARRAY_BUFFER: *slab = a->rb; return &a->bufs[t];
    default: FB_ASSERT(!"a part of fb_array_part"); /* never returns */
    }
    return &a->params[t];
}

fb_array_tensor fb_array_tensor_at(const fb_array *a, fb_array_part part, int t)
{
    float *slab;
    const tensor_def *d = part_def(a, part, t, &slab);
    return (fb_array_tensor){.name = d->name, .ndim = d->ndim, .shape = d->shape,
                             .numel = d->per_member};
}

/* Divides n host floats of member m's gradient by its loss scale when the
 * slab holds scaled gradients, so that readers see the batch's gradient. */
static void unscale_host(const fb_array *a, int m, float *v, size_t n)
{
    if (!a->grads_scaled) return;
    float inv = 1.0f / a->ls_scale[m];
    for (size_t i = 0; i < n; i++)
        v[i] *= inv;
}

void fb_array_get(const fb_array *a, int m, fb_array_part part, int t, float *dst)
{
    FB_ASSERT(m >= 0 && m < a->B);
    float *slab;
    const tensor_def *d = part_def(a, part, t, &slab);
    fb_backend_download(a->be, dst, slab + d->offset + (size_t)m * d->per_member,
                        d->per_member * sizeof(float));
    if (part == FB_ARRAY_GRAD) unscale_host(a, m, dst, d->per_member);
}

void fb_array_set(fb_array *a, int m, fb_array_part part, int t, const float *src)
{
    FB_ASSERT(m >= 0 && m < a->B);
    float *slab;
    const tensor_def *d = part_def(a, part, t, &slab);
    float *dst = slab + d->offset + (size_t)m * d->per_member;
    if (part == FB_ARRAY_GRAD && a->grads_scaled) {
        /* the mirror of fb_array_get: src is the batch's gradient, the slab
         * holds it times the member's scale until the update */
        float *v = malloc(d->per_member * sizeof *v);
        FB_ASSERT(v != NULL);
        for (size_t i = 0; i < d->per_member; i++)
            v[i] = src[i] * a->ls_scale[m];
        fb_backend_upload(a->be, dst, v, d->per_member * sizeof(float));
        free(v);
        return;
    }
    fb_backend_upload(a->be, dst, src, d->per_member * sizeof(float));
}

float fb_array_loss_scale(const fb_array *a, int m)
{
    FB_ASSERT(m >= 0 && m < a->B);
    return a->bf16 ? a->ls_scale[m] : 1.0f;
}

int64_t fb_array_loss_scale_good(const fb_array *a, int m)
{
    FB_ASSERT(m >= 0 && m < a->B);
    return a->bf16 ? a->ls_good[m] : 0;
}

bool fb_array_update_skipped(const fb_array *a, int m)
{
    FB_ASSERT(m >= 0 && m < a->B);
    return a->bf16 && a->ls_skipped[m];
}

int fb_array_set_loss_scale(fb_array *a, int m, float scale, int64_t good, char *msg, size_t cap)
{
    FB_ASSERT(m >= 0 && m < a->B);
    int e;
    if (!a->bf16) return fb_errf(msg, cap, FB_ERR_CONFLICT, "only a bf16 array has a loss scale");
    if (!(scale >= FB_LOSS_SCALE_MIN && scale <= FB_LOSS_SCALE_MAX) || frexpf(scale, &e) != 0.5f)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                       "loss scale %g is not a power of two in [2^-24, 2^64]", (double)scale);
    if (good < 0 || good >= a->ls_interval)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                       "loss scale step count %lld is outside [0, %lld)", (long long)good,
                       (long long)a->ls_interval);
    a->ls_scale[m] = scale;
    a->ls_good[m] = good;
    return FB_OK;
}

void fb_array_set_grad_prescaled(fb_array *a, bool prescaled)
{
    a->prescaled = prescaled;
}

void fb_array_skip_update(fb_array *a, int m)
{
    FB_ASSERT(m >= 0 && m < a->B && a->bf16);
    a->ls_force[m] = true;
}

void fb_array_set_loss_scale_interval(fb_array *a, int64_t steps)
{
    FB_ASSERT(steps >= 1);
    a->ls_interval = steps;
    for (int b = 0; a->bf16 && b < a->B; b++)
        if (a->ls_good[b] >= steps) a->ls_good[b] = steps - 1;
}

int fb_array_add_tensors(const fb_array *a, int m, bool grads, fb_st_writer *w, void **hold,
                         char *msg, size_t cap)
{
    FB_ASSERT(m >= 0 && m < a->B);
    int n_total = a->n_params + (grads ? 0 : a->n_bufs);
    int n_bn = grads ? 0 : a->n_bn;
    size_t floats = 0;
    for (int t = 0; t < n_total; t++)
        floats += t < a->n_params ? a->params[t].per_member : a->bufs[t - a->n_params].per_member;
    floats += floats & 1; /* the counters that follow need 8-byte alignment */
    /* one block: every tensor's floats, then the int64 counters */
    char *block = malloc(floats * sizeof(float) + (size_t)n_bn * sizeof(int64_t) + 8);
    if (!block) return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    float *at = (float *)block;
    int64_t *tracked = (int64_t *)(block + floats * sizeof(float));
    int err;
    for (int t = 0; t < n_total; t++) {
        bool is_buf = t >= a->n_params;
        const tensor_def *d = is_buf ? &a->bufs[t - a->n_params] : &a->params[t];
        const float *slab = is_buf ? a->rb : grads ? a->g : a->p;
        fb_backend_download(a->be, at, slab + d->offset + (size_t)m * d->per_member,
                            d->per_member * sizeof(float));
        if (grads && !is_buf) unscale_host(a, m, at, d->per_member);
        if ((err = fb_st_writer_add_f32(w, d->name, d->shape, d->ndim, at, msg, cap))) goto fail;
        at += d->per_member;
    }
    /* num_batches_tracked sits beside each batch norm's running statistics */
    for (int k = 0; k < n_bn; k++) {
        char name[NAME_CAP + 32];
        fb_array_bn_name(a, k, name, sizeof name);
        tracked[k] = a->bn_tracked[(size_t)m * a->n_bn + k];
        if ((err = fb_st_writer_add_i64(w, name, NULL, 0, &tracked[k], msg, cap))) goto fail;
    }
    if ((err = device_status(a, msg, cap))) goto fail; /* the downloads may not have happened */
    *hold = block;
    return FB_OK;
fail:
    free(block);
    return err;
}

int fb_array_add_description(const fb_array *a, int m, fb_st_writer *w, char *msg, size_t cap)
{
    FB_ASSERT(m >= 0 && m < a->B);
    char *spec = fb_job_spec_canonical(a->specs[m]);
    if (!spec) return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    int err = fb_st_writer_set_metadata(w, "spec", spec, msg, cap);
    free(spec);
    if (!err) err = fb_st_writer_set_metadata(w, "preprocess", FB_PREPROCESS_JSON, msg, cap);
    if (!err) err = fb_st_writer_set_metadata(w, "fusebox_version", FB_VERSION_STRING, msg, cap);
    return err;
}

int fb_array_save(const fb_array *a, int m, const char *path, bool grads, const char *meta_key,
                  const char *meta_value, char *msg, size_t cap)
{
    int err;
    void *hold = NULL;
    fb_st_writer *w = fb_st_writer_new();
    if (!w) return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    if ((err = fb_array_add_tensors(a, m, grads, w, &hold, msg, cap))) goto done;
    if ((err = fb_array_add_description(a, m, w, msg, cap))) goto done;
    if (meta_key && (err = fb_st_writer_set_metadata(w, meta_key, meta_value, msg, cap)))
        goto done;
    err = fb_st_write(w, path, msg, cap);
done:
    /* the writer references hold's data until here */
    fb_st_writer_free(w);
    free(hold);
    return err;
}

/* Loads member m's parameters and buffers from the parsed file f (path names it in
 * messages); takes f. */
static int load_member(fb_array *a, int m, fb_st_file *f, const char *path, char *msg, size_t cap)
{
    int err;
    int n_total = a->n_params + a->n_bufs;
    float **host = calloc((size_t)n_total + 1, sizeof *host);
    int64_t *tracked = calloc((size_t)a->n_bn + 1, sizeof *tracked);
    bool *present = calloc((size_t)n_total + 1, sizeof *present);
    if (!host || !tracked || !present) {
        err = fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* a full-state checkpoint's optimizer state is not part of the model */
    const char *format = fb_st_metadata_get(f, "format");
    bool checkpoint = format && strcmp(format, FB_CHECKPOINT_FORMAT) == 0;
    /* every tensor in the file must be one of ours */
    for (size_t i = 0; i < fb_st_count(f); i++) {
        const char *name = fb_st_at(f, i)->name;
        if (checkpoint && strncmp(name, "optim.", 6) == 0) continue;
        bool known = false;
        for (int t = 0; t < n_total && !known; t++) {
            const tensor_def *d = t < a->n_params ? &a->params[t] : &a->bufs[t - a->n_params];
            known = strcmp(d->name, name) == 0;
        }
        const char *dot = strrchr(name, '.');
        if (!known && dot && strcmp(dot, ".num_batches_tracked") == 0) {
            /* a batch norm's counter is ours only when that batch norm is */
            size_t len = (size_t)(dot - name);
            for (int t = 0; t < a->n_bufs && !known; t++)
                known = strncmp(a->bufs[t].name, name, len) == 0 &&
                        strcmp(a->bufs[t].name + len, ".running_mean") == 0;
        }
        if (!known) {
            err = fb_errf(msg, cap, FB_ERR_CHECKPOINT,
                          "%s: tensor %s is not a parameter of this model", path, name);
            goto done;
        }
    }
    for (int t = 0; t < n_total; t++) {
        bool is_buf = t >= a->n_params;
        const tensor_def *d = is_buf ? &a->bufs[t - a->n_params] : &a->params[t];
        if (!fb_st_find(f, d->name)) {
            if (is_buf) continue; /* running statistics keep their initial values */
            err = fb_errf(msg, cap, FB_ERR_CHECKPOINT, "%s: parameter %s is missing", path,
                          d->name);
            goto done;
        }
        host[t] = malloc(d->per_member * sizeof(float));
        if (!host[t]) {
            err = fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
            goto done;
        }
        if ((err = fb_st_get_f32(f, d->name, d->shape, d->ndim, host[t], msg, cap))) goto done;
        present[t] = true;
    }
    for (int t = 0, k = 0; t < a->n_bufs; t++) {
        const char *dot = strrchr(a->bufs[t].name, '.');
        if (strcmp(dot, ".running_mean") != 0) continue;
        char name[NAME_CAP];
        snprintf(name, sizeof name, "%.*s.num_batches_tracked", (int)(dot - a->bufs[t].name),
                 a->bufs[t].name);
        tracked[k] = a->bn_tracked[(size_t)m * a->n_bn + k];
        if (fb_st_find(f, name) && (err = fb_st_get_i64(f, name, NULL, 0, &tracked[k], msg, cap)))
            goto done;
        k++;
    }
    /* everything validated: now change the member */
    for (int t = 0; t < n_total; t++) {
        if (!present[t]) continue;
        bool is_buf = t >= a->n_params;
        const tensor_def *d = is_buf ? &a->bufs[t - a->n_params] : &a->params[t];
        fb_backend_upload(a->be, (is_buf ? a->rb : a->p) + d->offset + (size_t)m * d->per_member,
                          host[t], d->per_member * sizeof(float));
    }
    memcpy(a->bn_tracked + (size_t)m * a->n_bn, tracked, (size_t)a->n_bn * sizeof *tracked);
    err = device_status(a, msg, cap);
done:
    if (host)
        for (int t = 0; t < n_total; t++) free(host[t]);
    free(host);
    free(tracked);
    free(present);
    fb_st_close(f);
    return err;
}

int fb_array_load(fb_array *a, int m, const char *path, char *msg, size_t cap)
{
    fb_st_file *f = NULL;
    int err = fb_st_open(path, &f, msg, cap);
    if (err) return err;
    return load_member(a, m, f, path, msg, cap);
}

int fb_array_load_buffer(fb_array *a, int m, const void *buf, size_t len, const char *who,
                         char *msg, size_t cap)
{
    fb_st_file *f = NULL;
    char inner[512];
    int err = fb_st_parse_buffer(buf, len, &f, inner, sizeof inner);
    if (err == FB_ERR_NOMEM) return fb_errf(msg, cap, err, "%s", inner);
    if (err) return fb_errf(msg, cap, FB_ERR_CHECKPOINT, "%s: %s", who, inner);
    return load_member(a, m, f, who, msg, cap);
}
