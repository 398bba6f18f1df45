/*
 * The fused training array: a tree of layer nodes over five slabs.
 *
 * Building walks the spec's layers once, assigning every tensor an offset in
 * its slab (sized for the initial B and max_n); the slabs are allocated after
 * the walk and nodes address them by offset.  Activation gradients live in a
 * slab that mirrors the activation slab offset for offset, so an op's input
 * gradient is simply "the gradient slab at the input's offset".
 */
#include "array.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_backend.h"
#include "rng.h"
#include "safetensors.h"

#define NONE SIZE_MAX
#define MAX_PARAM_DIMS 4
#define NAME_CAP 96

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

/* An activation buffer of per_sample floats per (sample, member), at off. */
typedef struct grad_region {
    size_t off;
    int64_t per_sample;
    uint64_t gen;
} grad_region;

typedef struct node node;
struct node {
    node_kind kind;
    const fb_layer *L;
    int id;              /* position in traversal, mixed into dropout streams */
    bool shared_in;      /* input is the shared minibatch [N, ...] */
    int64_t in_numel, out_numel;
    size_t in, out;      /* activation offsets (floats) */
    size_t save1, save2; /* saved statistics / argmax */
    int w, b;            /* parameter tensors, -1 if none */
    int rm, rv;          /* batch-norm buffers, -1 if none */
    int bn_index;        /* index into num_batches_tracked */
    node *body, *sc;
    int n_body, n_sc;
    size_t sc_out;       /* residual: shortcut output (== in for identity) */
};

struct fb_array {
    fb_backend_t *be;
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
    float *act, *dact;      /* activations and their gradients */
    float *scratch;         /* conv workspace */
    size_t x_off, y_off, tgt_off, loss_off, correct_off, logits_off;
    int last_n;
    bool oom; /* an allocation failed while planning */

    /* Activation buffers whose gradients a backward pass accumulates into,
     * each zeroed (over the batch's N*B rows only) by the first op of a
     * backward pass that adds into it; gen says which pass zeroed it last. */
    grad_region *regions;
    int n_regions, cap_regions;
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

static int build_layers(fb_array *a, const fb_layer *layers, int n, const char *prefix,
                        size_t in, bool shared, node **out, int *n_out, size_t *out_off,
                        char *msg, size_t cap);

/* Records an activation buffer that backward may accumulate into. */
static bool add_region(fb_array *a, size_t off, int64_t per_sample)
{
    if (a->n_regions == a->cap_regions) {
        int nc = a->cap_regions ? 2 * a->cap_regions : 16;
        grad_region *r = realloc(a->regions, (size_t)nc * sizeof *r);
        if (!r) return false;
        a->regions = r;
        a->cap_regions = nc;
    }
    a->regions[a->n_regions++] = (grad_region){.off = off, .per_sample = per_sample, .gen = 0};
    return true;
}

/* Plans one layer: its output buffer, saved statistics and parameters.
 * numel > 0 runs an elementwise layer on numel values per sample instead of
 * its own shape (a relu moved behind a max pool, see build_layers). */
static int build_node(fb_array *a, node *nd, const fb_layer *L, const char *name, size_t in,
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
    nd->save1 = nd->save2 = nd->sc_out = NONE;
    nd->w = nd->b = nd->rm = nd->rv = nd->bn_index = -1;
    size_t *A = &a->act_floats;
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
        break;
    }
    case FB_LAYER_MAXPOOL2D:
        nd->save1 = take(A, NB * (size_t)nd->out_numel); /* argmax, int32 */
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
        nd->save1 = take(A, (size_t)a->Bcap * (size_t)L->in.d[0]);
        nd->save2 = take(A, (size_t)a->Bcap * (size_t)L->in.d[0]);
        break;
    case FB_LAYER_LAYERNORM:
        for (int i = 0; i < L->in.ndim; i++) shp[i] = L->in.d[i];
        if (L->affine) {
            nd->w = add_tensor(a, false, name, "weight", L->in.ndim, shp, 0, 1.0f);
            nd->b = add_tensor(a, false, name, "bias", L->in.ndim, shp, 0, 0.0f);
        }
        nd->save1 = take(A, NB);
        nd->save2 = take(A, NB);
        break;
    case FB_LAYER_RESIDUAL: {
        char sub[NAME_CAP];
        size_t body_out, sc_out = in;
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
    if (a->oom) return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    nd->out = take(A, NB * (size_t)nd->out_numel);
    return add_region(a, nd->out, nd->out_numel) ? FB_OK
                                                 : fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
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

/* Plans a chain of layers starting from activation offset in. */
static int build_layers(fb_array *a, const fb_layer *layers, int n, const char *prefix,
                        size_t in, bool shared, node **out, int *n_out, size_t *out_off,
                        char *msg, size_t cap)
{
    /* one extra slot for a broadcast of the shared input */
    node *nodes = calloc((size_t)n + 1, sizeof *nodes);
    if (!nodes) return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    int k = 0, err = FB_OK;
    size_t cur = in;
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
            e->save1 = e->save2 = e->sc_out = NONE;
            e->out = take(&a->act_floats, (size_t)a->max_n * a->Bcap * (size_t)e->out_numel);
            if (!add_region(a, e->out, e->out_numel)) {
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
    *out_off = cur;
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

int fb_array_new(fb_backend_t *be, const fb_job_spec *const *specs, int B, int max_n,
                 fb_array **out, char *msg, size_t cap)
{
    if (B < 1 || max_n < 1)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE, "an array needs B >= 1 and max_n >= 1");
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

    a->x_off = take(&a->act_floats, (size_t)max_n * (size_t)a->in_numel);
    size_t last;
    err = build_layers(a, specs[0]->layers, specs[0]->n_layers, "", a->x_off, true, &a->nodes,
                       &a->n_nodes, &last, msg, cap);
    if (err) goto fail;
    err = FB_ERR_NOMEM;
    a->logits_off = last;
    a->y_off = take(&a->act_floats, (size_t)max_n);
    a->tgt_off = take(&a->act_floats, (size_t)max_n * (size_t)a->K);
    a->loss_off = take(&a->act_floats, (size_t)B);
    a->correct_off = take(&a->act_floats, (size_t)B);

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
    a->act = fb_backend_alloc(be, a->act_floats * sizeof(float));
    a->dact = fb_backend_alloc(be, a->act_floats * sizeof(float));
    a->scratch = fb_backend_alloc(be, (a->scratch_floats ? a->scratch_floats : 16) * sizeof(float));
    if (!a->p || !a->g || !a->s1 || (!a->s2 && specs[0]->optim.type != FB_OPTIM_SGD) || !a->rb ||
        !a->act || !a->dact || !a->scratch)
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
    fb_backend_free(a->be, a->dact);
    fb_backend_free(a->be, a->scratch);
    free(a->params);
    free(a->bufs);
    free(a->regions);
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

/* ---- forward and backward ------------------------------------------------ */

#define ACT(off) (a->act + (off))
#define DACT(off) (a->dact + (off))
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
    fb_backend_t *be = a->be;
    int B = a->B;
    size_t count = (size_t)N * (size_t)B * (size_t)nd->out_numel;
    if (nd->kind == NODE_EXPAND) {
        size_t row = (size_t)nd->in_numel * sizeof(float);
        for (int n = 0; n < N; n++)
            for (int b = 0; b < B; b++)
                fb_backend_copy(be, ACT(nd->out) + ((size_t)n * B + b) * nd->in_numel,
                                ACT(nd->in) + (size_t)n * nd->in_numel, row);
        return;
    }
    const fb_layer *L = nd->L;
    switch (L->type) {
    case FB_LAYER_FLATTEN:
        break;
    case FB_LAYER_LINEAR:
        fb_linear_forward(be, ACT(nd->out), ACT(nd->in), PW(nd), PB(nd), N, B,
                          (int)L->in.d[0], (int)L->out_features, nd->shared_in);
        break;
    case FB_LAYER_CONV2D: {
        fb_conv_geom g = conv_geom(a, nd, N);
        fb_conv2d_forward(be, ACT(nd->out), ACT(nd->in), PW(nd), PB(nd), &g, conv_scratch(a, &g));
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
        forward_nodes(a, nd->body, nd->n_body, N, train, stream);
        forward_nodes(a, nd->sc, nd->n_sc, N, train, stream);
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

/* The gradient of the activation buffer at off, zeroed over the batch's rows
 * if this backward pass has not added into it yet.  Zeroing here, just before
 * the first op that accumulates into the buffer, touches only what the pass
 * uses and finds it in cache more often than zeroing the whole slab would. */
static float *grad_buf(fb_array *a, size_t off, int N)
{
    for (int r = 0; r < a->n_regions; r++) {
        grad_region *g = &a->regions[r];
        if (g->off != off) continue;
        if (g->gen != a->gen) {
            g->gen = a->gen;
            fb_backend_zero(a->be, DACT(off),
                            (size_t)N * (size_t)a->B * (size_t)g->per_sample * sizeof(float));
        }
        return DACT(off);
    }
    FB_ASSERT(!"an activation buffer without a gradient region");
    return NULL;
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
    fb_backend_t *be = a->be;
    int B = a->B;
    size_t count = (size_t)N * (size_t)B * (size_t)nd->out_numel;
    if (nd->kind == NODE_EXPAND) return; /* the shared input needs no gradient */
    const fb_layer *L = nd->L;
    /* each parameter belongs to one node, which is its gradient's only writer */
    zero_param_grad(a, nd->w);
    zero_param_grad(a, nd->b);
    float *din = nd->shared_in || L->type == FB_LAYER_FLATTEN ? NULL : grad_buf(a, nd->in, N);
    switch (L->type) {
    case FB_LAYER_FLATTEN:
        break;
    case FB_LAYER_LINEAR:
        fb_linear_backward(be, din, GW(nd), GB(nd), DACT(nd->out), ACT(nd->in), PW(nd), N, B,
                           (int)L->in.d[0], (int)L->out_features, nd->shared_in);
        break;
    case FB_LAYER_CONV2D: {
        fb_conv_geom g = conv_geom(a, nd, N);
        fb_conv2d_backward(be, din, GW(nd), GB(nd), DACT(nd->out), ACT(nd->in), PW(nd), &g,
                           conv_scratch(a, &g));
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
    case FB_LAYER_GELU:
    case FB_LAYER_TANH:
    case FB_LAYER_SIGMOID:
        fb_act_backward(be, act_of(L), din, DACT(nd->out), ACT(nd->in), ACT(nd->out), count);
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
    fb_backend_upload(a->be, ACT(a->x_off), x, (size_t)N * (size_t)a->in_numel * sizeof(float));
    forward_nodes(a, a->nodes, a->n_nodes, N, train, stream);
    a->last_n = N;
    if (!y) return device_status(a, msg, cap);

    bool grad = train;
    float *dlogits = NULL;
    if (grad) {
        a->gen++; /* a new backward pass: every gradient buffer starts unzeroed */
        dlogits = DACT(a->logits_off);
    }
    float *dev_loss = ACT(a->loss_off), *dev_correct = ACT(a->correct_off);
    if (s->loss == FB_LOSS_CROSS_ENTROPY) {
        fb_backend_upload(a->be, ACT(a->y_off), y, (size_t)N * sizeof(int32_t));
        fb_softmax_xent(a->be, dev_loss, dlogits, dev_correct, ACT(a->logits_off),
                        (const int32_t *)ACT(a->y_off), N, B, K, 1.0f / (float)N);
    } else {
        float *tgt = calloc((size_t)N * (size_t)K, sizeof *tgt);
        if (!tgt) return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
        for (int n = 0; n < N; n++) {
            if (K > 1)
                tgt[(size_t)n * K + y[n]] = 1.0f;
            else
                tgt[n] = (float)y[n];
        }
        fb_backend_upload(a->be, ACT(a->tgt_off), tgt, (size_t)N * (size_t)K * sizeof(float));
        free(tgt);
        fb_mse(a->be, dev_loss, dlogits, ACT(a->logits_off), ACT(a->tgt_off), N, B, K,
               1.0f / (float)N);
        fb_backend_zero(a->be, dev_correct, (size_t)B * sizeof(float));
    }
    if (grad) backward_nodes(a, a->nodes, a->n_nodes, N, stream);
    if (loss) fb_backend_download(a->be, loss, dev_loss, (size_t)B * sizeof(float));
    if (correct) fb_backend_download(a->be, correct, dev_correct, (size_t)B * sizeof(float));
    return device_status(a, msg, cap);
}

void fb_array_logits(const fb_array *a, int m, int N, float *dst)
{
    const size_t K = (size_t)a->K, B = (size_t)a->B;
    const float *src = a->act + a->logits_off;
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

void fb_array_step(fb_array *a, const fb_optim_hparams *hp)
{
    static const fb_optim_kind kinds[] = {[FB_OPTIM_SGD] = FB_OPTIM_KIND_SGD,
                                          [FB_OPTIM_ADAM] = FB_OPTIM_KIND_ADAM,
                                          [FB_OPTIM_ADAMW] = FB_OPTIM_KIND_ADAMW};
    if (a->n_params == 0) return;
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

void fb_array_get(const fb_array *a, int m, fb_array_part part, int t, float *dst)
{
    FB_ASSERT(m >= 0 && m < a->B);
    float *slab;
    const tensor_def *d = part_def(a, part, t, &slab);
    fb_backend_download(a->be, dst, slab + d->offset + (size_t)m * d->per_member,
                        d->per_member * sizeof(float));
}

void fb_array_set(fb_array *a, int m, fb_array_part part, int t, const float *src)
{
    FB_ASSERT(m >= 0 && m < a->B);
    float *slab;
    const tensor_def *d = part_def(a, part, t, &slab);
    fb_backend_upload(a->be, slab + d->offset + (size_t)m * d->per_member, src,
                      d->per_member * sizeof(float));
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

int fb_array_save(const fb_array *a, int m, const char *path, bool grads, const char *meta_key,
                  const char *meta_value, char *msg, size_t cap)
{
    int err;
    void *hold = NULL;
    fb_st_writer *w = fb_st_writer_new();
    if (!w) return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    if ((err = fb_array_add_tensors(a, m, grads, w, &hold, msg, cap))) goto done;
    if (meta_key && (err = fb_st_writer_set_metadata(w, meta_key, meta_value, msg, cap)))
        goto done;
    err = fb_st_write(w, path, msg, cap);
done:
    /* the writer references hold's data until here */
    fb_st_writer_free(w);
    free(hold);
    return err;
}

int fb_array_load(fb_array *a, int m, const char *path, char *msg, size_t cap)
{
    fb_st_file *f = NULL;
    int err = fb_st_open(path, &f, msg, cap);
    if (err) return err;
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
