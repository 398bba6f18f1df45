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
 *
 * The rest of the array is in its siblings behind array_impl.h: the passes
 * (array_pass.c), the update, membership and state tensor by tensor
 * (array_state.c), weights files (array_file.c).
 */
#include "array_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"

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
                        bool shared, node **out, int *n_out, int *out_buf, char *msg,
                        size_t msg_cap);
static int build_block(fb_array *a, node *r, const fb_layer *L, const char *prefix, int in,
                       char *msg, size_t msg_cap);

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
                      bool shared, int64_t numel, char *msg, size_t msg_cap)
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

    /* a sequence (T, D) runs per-position ops on N*T rows */
    size_t T = L->in.ndim == 2 ? (size_t)L->in.d[0] : 1;
    int64_t last = L->in.d[L->in.ndim - 1];
    switch (L->type) {
    case FB_LAYER_FLATTEN:
        nd->out = in; /* [N, B, C, H, W] is already [N, B, C*H*W] */
        return FB_OK;
    case FB_LAYER_LINEAR:
        shp[0] = L->out_features;
        shp[1] = last;
        nd->w = add_tensor(a, false, name, "weight", 2, shp, last, 0);
        if (L->bias) nd->b = add_tensor(a, false, name, "bias", 1, shp, last, 0);
        bf16_plan(a, nd, (size_t)(L->out_features * last));
        break;
    case FB_LAYER_EMBEDDING:
        shp[0] = a->V;
        shp[1] = L->out_features;
        nd->w = add_tensor(a, false, name, "weight", 2, shp, 0, 0);
        if (nd->w >= 0) a->params[nd->w].std = 1.0f; /* nn.Embedding */
        break;
    case FB_LAYER_POSITIONAL:
        shp[0] = L->max_len;
        shp[1] = last;
        nd->w = add_tensor(a, false, name, "weight", 2, shp, 0, 0);
        if (nd->w >= 0) a->params[nd->w].std = 0.02f; /* GPT-2's learned positions */
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
    case FB_LAYER_LAYERNORM: {
        /* a sequence normalises each position over its D features */
        int nd_w = L->in.ndim == 2 ? 1 : L->in.ndim;
        for (int i = 0; i < nd_w; i++) shp[i] = L->in.d[L->in.ndim - nd_w + i];
        if (L->affine) {
            nd->w = add_tensor(a, false, name, "weight", nd_w, shp, 0, 1.0f);
            nd->b = add_tensor(a, false, name, "bias", nd_w, shp, 0, 0.0f);
        }
        nd->save1 = new_buf(a, NB * T, 0, false);
        nd->save2 = new_buf(a, NB * T, 0, false);
        break;
    }
    case FB_LAYER_RESIDUAL: {
        char sub[NAME_CAP];
        int body_out, sc_out = in;
        snprintf(sub, sizeof sub, "%s.body", name);
        int err = build_layers(a, L->body, L->n_body, sub, in, false, &nd->body, &nd->n_body,
                               &body_out, msg, msg_cap);
        if (err) return err;
        if (L->n_shortcut) {
            snprintf(sub, sizeof sub, "%s.shortcut", name);
            err = build_layers(a, L->shortcut, L->n_shortcut, sub, in, false, &nd->sc, &nd->n_sc,
                               &sc_out, msg, msg_cap);
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
    return a->oom ? fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory") : FB_OK;
}

static void nodes_free(node *nodes, int n)
{
    if (!nodes) return;
    for (int i = 0; i < n; i++) {
        nodes_free(nodes[i].body, nodes[i].n_body);
        nodes_free(nodes[i].sc, nodes[i].n_sc);
        free(nodes[i].own);
    }
    free(nodes);
}

/* The layers of one transformer block, which the array makes itself. */
enum {
    BL_RES1, BL_LN1, BL_QKV, BL_PROJ, BL_DROP1, BL_RES2, BL_LN2, BL_FC1, BL_GELU, BL_FC2,
    BL_DROP2, BL_COUNT
};

/* A layer of a block: type, features in and out per position (T positions). */
static void block_layer(fb_layer *l, fb_layer_type type, int64_t T, int64_t in, int64_t out)
{
    memset(l, 0, sizeof *l);
    l->type = type;
    l->in = (fb_shape){.ndim = 2, .d = {T, in, 0}};
    l->out = (fb_shape){.ndim = 2, .d = {T, out, 0}};
    l->out_features = out;
    l->bias = true;
    l->affine = true;
    l->eps = 1e-5;
}

/* Renames parameter t to prefix.leaf (MultiheadAttention's names). */
static void rename_param(fb_array *a, int t, const char *prefix, const char *leaf)
{
    if (t >= 0) snprintf(a->params[t].name, sizeof a->params[t].name, "%s.%s", prefix, leaf);
}

/* Builds the nodes of a chain of layers ls[0..n) (NULL: the attention op) as
 * the body of residual node r, whose input is in. */
static int build_body(fb_array *a, node *r, fb_layer *const *ls, const char *const *names, int n,
                      const fb_layer *block, int in, char *msg, size_t msg_cap)
{
    r->body = calloc((size_t)n, sizeof *r->body);
    if (!r->body) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    int cur = in, err;
    for (int i = 0; i < n; i++) {
        node *nd = &r->body[i];
        r->n_body = i + 1;
        if (ls[i]) {
            if ((err = build_node(a, nd, ls[i], names[i], cur, false, 0, msg, msg_cap)))
                return err;
        } else {
            /* the attention op: qkv [N, T, B, 3D] -> [N, T, B, D], probs saved */
            int64_t T = block->in.d[0], D = block->in.d[1];
            memset(nd, 0, sizeof *nd);
            nd->kind = NODE_LAYER;
            nd->L = block;
            nd->id = a->n_ids++;
            nd->in_numel = 3 * T * D;
            nd->out_numel = T * D;
            nd->in = cur;
            nd->save2 = nd->sc_out = -1;
            nd->w = nd->b = nd->rm = nd->rv = nd->bn_index = -1;
            nd->save1 = new_buf(a, (size_t)a->max_n * (size_t)a->Bcap * (size_t)block->heads *
                                       (size_t)(T * T),
                                0, false);
            nd->out = new_act(a, T * D);
            size_t s = fb_attention_scratch_floats(a->be, a->max_n, (int)T, a->Bcap, block->heads);
            if (s > a->scratch_floats) a->scratch_floats = s;
            if (a->oom) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        }
        cur = nd->out;
    }
    r->save1 = cur; /* the body's output */
    r->sc_out = in; /* identity shortcut */
    r->out = new_act(a, r->out_numel);
    return a->oom ? fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory") : FB_OK;
}

/*
 * A transformer block (pre-LayerNorm, as docs/jobspec.md describes it) as two
 * residual nodes r[0] and r[1] over sequence activations [N, T, B, D]:
 *   x + drop(out_proj(attention(in_proj(ln1(x)))))
 *   x + drop(mlp.2(gelu(mlp.0(ln2(x)))))
 * with the parameters of torch's module of that shape: prefix.ln1, prefix.attn
 * (nn.MultiheadAttention: in_proj_weight [3D, D], in_proj_bias [3D],
 * out_proj.weight, out_proj.bias), prefix.ln2, prefix.mlp.0 and prefix.mlp.2.
 * The dropout layers exist only when the block's dropout is above 0.
 */
static int build_block(fb_array *a, node *r, const fb_layer *L, const char *prefix, int in,
                       char *msg, size_t msg_cap)
{
    int64_t T = L->in.d[0], D = L->in.d[1], M = (int64_t)L->mlp_ratio * D;
    fb_layer *ls = calloc(BL_COUNT, sizeof *ls);
    if (!ls) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    block_layer(&ls[BL_RES1], FB_LAYER_RESIDUAL, T, D, D);
    block_layer(&ls[BL_LN1], FB_LAYER_LAYERNORM, T, D, D);
    block_layer(&ls[BL_QKV], FB_LAYER_LINEAR, T, D, 3 * D);
    block_layer(&ls[BL_PROJ], FB_LAYER_LINEAR, T, D, D);
    block_layer(&ls[BL_DROP1], FB_LAYER_DROPOUT, T, D, D);
    block_layer(&ls[BL_RES2], FB_LAYER_RESIDUAL, T, D, D);
    block_layer(&ls[BL_LN2], FB_LAYER_LAYERNORM, T, D, D);
    block_layer(&ls[BL_FC1], FB_LAYER_LINEAR, T, D, M);
    block_layer(&ls[BL_GELU], FB_LAYER_GELU, T, M, M);
    block_layer(&ls[BL_FC2], FB_LAYER_LINEAR, T, M, D);
    block_layer(&ls[BL_DROP2], FB_LAYER_DROPOUT, T, D, D);
    ls[BL_DROP1].p = ls[BL_DROP2].p = L->p;
    char n_ln1[NAME_CAP], n_attn[NAME_CAP], n_proj[NAME_CAP], n_ln2[NAME_CAP], n_fc1[NAME_CAP],
        n_fc2[NAME_CAP];
    snprintf(n_ln1, sizeof n_ln1, "%s.ln1", prefix);
    snprintf(n_attn, sizeof n_attn, "%s.attn", prefix);
    snprintf(n_proj, sizeof n_proj, "%s.attn.out_proj", prefix);
    snprintf(n_ln2, sizeof n_ln2, "%s.ln2", prefix);
    snprintf(n_fc1, sizeof n_fc1, "%s.mlp.0", prefix);
    snprintf(n_fc2, sizeof n_fc2, "%s.mlp.2", prefix);
    int nb = L->p > 0 ? 5 : 4;
    fb_layer *body1[5] = {&ls[BL_LN1], &ls[BL_QKV], NULL, &ls[BL_PROJ], &ls[BL_DROP1]};
    const char *names1[5] = {n_ln1, n_attn, "", n_proj, ""};
    fb_layer *body2[5] = {&ls[BL_LN2], &ls[BL_FC1], &ls[BL_GELU], &ls[BL_FC2], &ls[BL_DROP2]};
    const char *names2[5] = {n_ln2, n_fc1, "", n_fc2, ""};
    for (int i = 0; i < 2; i++) {
        node *nd = &r[i];
        memset(nd, 0, sizeof *nd);
        nd->kind = NODE_LAYER;
        nd->L = &ls[i ? BL_RES2 : BL_RES1];
        nd->id = a->n_ids++;
        nd->in_numel = nd->out_numel = T * D;
        nd->in = in;
        nd->save2 = -1;
        nd->w = nd->b = nd->rm = nd->rv = nd->bn_index = -1;
        if (i == 0) nd->own = ls;
        int err = build_body(a, nd, i ? body2 : body1, i ? names2 : names1, nb, L, in, msg,
                             msg_cap);
        if (err) return err;
        in = nd->out;
    }
    /* torch.nn.MultiheadAttention: xavier_uniform_ in_proj_weight, zero biases */
    node *qkv = &r[0].body[1], *proj = &r[0].body[3];
    rename_param(a, qkv->w, n_attn, "in_proj_weight");
    rename_param(a, qkv->b, n_attn, "in_proj_bias");
    a->params[qkv->w].bound = (float)sqrt(6.0 / (double)(D + 3 * D));
    a->params[qkv->b].fan_in = 0;
    a->params[proj->b].fan_in = 0;
    return FB_OK;
}

/* Plans a chain of layers starting from activation buffer in; *out_buf
 * receives the buffer of the chain's output. */
static int build_layers(fb_array *a, const fb_layer *layers, int n, const char *prefix, int in,
                        bool shared, node **out, int *n_out, int *out_buf, char *msg,
                        size_t msg_cap)
{
    /* one extra slot for a broadcast of the shared input; a transformer
     * block is two nodes */
    node *nodes = calloc(2 * (size_t)n + 1, sizeof *nodes);
    if (!nodes) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    int k = 0, err = FB_OK;
    int cur = in;
    for (int i = 0; i < n; i++) {
        const fb_layer *L = &layers[i];
        bool consumes_shared = L->type == FB_LAYER_LINEAR || L->type == FB_LAYER_CONV2D ||
                               L->type == FB_LAYER_FLATTEN || L->type == FB_LAYER_EMBEDDING;
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
                err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
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
            err = build_node(a, &nodes[k], &layers[i + 1], pname, cur, false, 0, msg, msg_cap);
            k++;
            if (err) goto fail;
            cur = nodes[k - 1].out;
            err = build_node(a, &nodes[k], L, name, cur, false, fb_shape_numel(&layers[i + 1].out),
                             msg, msg_cap);
            k++;
            if (err) goto fail;
            cur = nodes[k - 1].out;
            i++;
            continue;
        }
        if (L->type == FB_LAYER_TRANSFORMER_BLOCK) {
            err = build_block(a, &nodes[k], L, name, cur, msg, msg_cap);
            k += 2;
            if (err) goto fail;
            cur = nodes[k - 1].out;
            continue;
        }
        err = build_node(a, &nodes[k], L, name, cur, shared, 0, msg, msg_cap);
        k++;
        if (err) goto fail;
        cur = nodes[k - 1].out;
        if (L->type != FB_LAYER_FLATTEN) shared = false;
    }
    if (shared) {
        /* a model that never left the shared input (flatten only) */
        fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED, "the model has no layer that computes anything");
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
        if (d->std > 0) {
            /* Box-Muller over two uniforms of the counter stream */
            for (size_t i = 0; i < d->per_member; i++) {
                double u1 = 1.0 - (double)fb_rng_uniform(seed, (uint64_t)t, 2 * i);
                double u2 = (double)fb_rng_uniform(seed, (uint64_t)t, 2 * i + 1);
                host[i] = (float)((double)d->std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
            }
        } else if (d->bound > 0 || d->fan_in > 0) {
            float bound = d->bound > 0 ? d->bound : (float)(1.0 / sqrt((double)d->fan_in));
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
        case FB_LAYER_EMBEDDING: /* the ids */
            plan_use(a, nd->in, false);
            break;
        case FB_LAYER_TRANSFORMER_BLOCK: /* the attention op: qkv and probs */
            plan_use(a, nd->in, false);
            plan_use(a, nd->save1, false);
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
static int plan_slab(fb_array *a, fb_array_plan plan, char *msg, size_t msg_cap)
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
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory planning activations");
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

int fb_array_plan_lane(const fb_array *a, int cap, abuf *ab, size_t *act_floats, char *msg,
                       size_t msg_cap)
{
    FB_ASSERT(cap >= 1 && cap <= a->Bcap);
    fb_array t = *a;
    memcpy(ab, a->ab, (size_t)a->n_ab * sizeof *ab);
    t.ab = ab;
    /* every buffer but the batch's inputs and targets holds Bcap members */
    for (int i = 0; i < a->n_ab; i++) {
        if (i == a->x_buf || i == a->y_buf || i == a->tgt_buf) continue;
        FB_ASSERT(ab[i].floats % (size_t)a->Bcap == 0);
        ab[i].floats = ab[i].floats / (size_t)a->Bcap * (size_t)cap;
        ab[i].gen = 0;
    }
    int err = plan_slab(&t, a->plan, msg, msg_cap);
    *act_floats = t.act_floats;
    return err;
}

int fb_array_new(fb_backend *be, const fb_job_spec *const *specs, int B, int max_n, fb_array **out,
                 char *msg, size_t msg_cap)
{
    return fb_array_new_planned(be, specs, B, max_n, FB_ARRAY_PLAN_SHARED, out, msg, msg_cap);
}

int fb_array_new_planned(fb_backend *be, const fb_job_spec *const *specs, int B, int max_n,
                         fb_array_plan plan, fb_array **out, char *msg, size_t msg_cap)
{
    if (B < 1 || max_n < 1)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "an array needs B >= 1 and max_n >= 1");
    if (plan != FB_ARRAY_PLAN_SHARED && plan != FB_ARRAY_PLAN_PRIVATE)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "unknown activation plan %d", (int)plan);
    for (int b = 1; b < B; b++)
        if (!fb_job_spec_fusible(specs[0], specs[b]))
            return fb_errf(msg, msg_cap, FB_ERR_NOT_FUSIBLE,
                           "specs '%s' and '%s' have different fusion keys (%s, %s)",
                           specs[0]->name, specs[b]->name, specs[0]->fusion_key,
                           specs[b]->fusion_key);
    fb_array *a = calloc(1, sizeof *a);
    if (!a) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    int err = FB_ERR_NOMEM;
    a->be = be;
    a->B = a->Bcap = B;
    a->max_n = max_n;
    a->plan = plan;
    a->in_numel = fb_shape_numel(&specs[0]->input);
    a->K = (int)fb_shape_numel(&specs[0]->output);
    a->T = (int)specs[0]->tokens;
    a->V = (int)specs[0]->vocab;
    a->lm = specs[0]->lm;
    a->out_rows = a->lm ? a->T : 1;
    a->K_row = a->K / a->out_rows;
    size_t label_rows = (size_t)max_n * (size_t)a->out_rows;
    a->specs = calloc((size_t)B, sizeof *a->specs);
    a->seeds = calloc((size_t)B, sizeof *a->seeds);
    if (!a->specs || !a->seeds) goto nomem;
    for (int b = 0; b < B; b++) {
        a->specs[b] = specs[b];
        a->seeds[b] = specs[b]->seed;
    }

    if (a->T) {
        static const fb_op need[] = {FB_OP_EMBEDDING, FB_OP_POSITIONAL, FB_OP_ATTENTION,
                                     FB_OP_SEQ_POOL, FB_OP_LAYERNORM};
        for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
            if (!fb_backend_supports(be, need[i])) {
                err = fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                              "backend %s lacks the sequence ops of token models",
                              fb_backend_name(be));
                goto fail;
            }
    }
    a->bf16 = specs[0]->precision == FB_PREC_BF16;
    a->x_buf = new_buf(a, (size_t)max_n * (size_t)a->in_numel, 0, false);
    if (a->x_buf < 0) goto nomem;
    err = build_layers(a, specs[0]->layers, specs[0]->n_layers, "", a->x_buf, true, &a->nodes,
                       &a->n_nodes, &a->logits_buf, msg, msg_cap);
    if (err) goto fail;
    a->y_buf = new_buf(a, label_rows, 0, false); /* int32 labels (a language model's targets) */
    if (a->T) {
        a->ids_host = malloc((size_t)max_n * (size_t)a->T * sizeof *a->ids_host);
        a->tgt_host = malloc((size_t)max_n * (size_t)a->T * sizeof *a->tgt_host);
        if (!a->ids_host || !a->tgt_host) goto nomem;
    }
    a->tgt_buf = new_buf(a, (size_t)max_n * (size_t)a->K, 0, false);
    a->loss_buf = new_buf(a, (size_t)B, 0, false);
    a->correct_buf = new_buf(a, (size_t)B, 0, false);
    if (a->oom) goto nomem;
    if ((err = plan_slab(a, plan, msg, msg_cap))) goto fail;
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
            err = fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED, "backend %s cannot round to bf16",
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
        if (specs[b]->init[0] && (err = fb_array_load(a, b, specs[b]->init, msg, msg_cap)))
            goto fail;
    }
    *out = a;
    return FB_OK;
nomem:
    err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory allocating the array");
fail:
    fb_array_free(a);
    return err;
}

void fb_array_free(fb_array *a)
{
    if (!a) return;
    fb_array_lanes_free(a);
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
    free(a->ids_host);
    free(a->tgt_host);
    free(a->params);
    free(a->bufs);
    free(a->ab);
    free(a->blocks);
    free(a->tile_blocks);
    free(a->tile_hp);
    free(a->tile_dead);
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
