/*
 * The fused training array's state (array.h): the fused optimizer update
 * with bf16 dynamic loss scaling, members leaving, and one member's
 * parameters, gradients, optimizer state and batch-norm statistics tensor by
 * tensor, which checkpoints read and write.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array_impl.h"

#ifdef _OPENMP
#include <omp.h>
#define LANE_ID() omp_get_thread_num()
#else
#define LANE_ID() 0 /* the pragmas unread: one thread runs every tile */
#endif

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

/* ---- one member's state, tensor by tensor ---------------------------------- */

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

int fb_array_set_loss_scale(fb_array *a, int m, float scale, int64_t good, char *msg,
                            size_t msg_cap)
{
    FB_ASSERT(m >= 0 && m < a->B);
    int e;
    if (!a->bf16)
        return fb_errf(msg, msg_cap, FB_ERR_CONFLICT, "only a bf16 array has a loss scale");
    if (!(scale >= FB_LOSS_SCALE_MIN && scale <= FB_LOSS_SCALE_MAX) || frexpf(scale, &e) != 0.5f)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "loss scale %g is not a power of two in [2^-24, 2^64]", (double)scale);
    if (good < 0 || good >= a->ls_interval)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
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

/* ---- one training step in tiles of members -------------------------------- */

/* Bytes of one tile's parameters, gradients, optimizer state and activations:
 * a solo MLP of the benchmark (3.8 MB of state, 0.5 MB of activations) keeps
 * its step in cache on the 2-core machine of bench/RESULTS.md, two members
 * (8.6 MB) did as well, four did not (0.94 of solo), sixteen 0.84. */
#define TILE_BYTES ((size_t)8 << 20)

/* Whether every op of nodes[0..n) gives each member the same result at any
 * thread count the backend's teams pick: the per-member GEMMs of linear
 * layers (whole members, dealt to threads), element-wise ops, pooling, the
 * sequence ops, whose teams split members, rows or (member, head) pairs and
 * never a sum (fast_seq.c, fast_norm.c), batch norm (one thread, channel
 * by channel), and convolutions, whose weight gradient is summed in fixed
 * chunks of samples (fast_conv.c).  A layer added later is not, until its
 * kernels are shown to be. */
static bool team_invariant(const node *nodes, int n)
{
    for (int i = 0; i < n; i++) {
        if (nodes[i].kind == NODE_EXPAND) continue;
        switch (nodes[i].L->type) {
        case FB_LAYER_LINEAR:
        case FB_LAYER_FLATTEN:
        case FB_LAYER_RELU:
        case FB_LAYER_GELU:
        case FB_LAYER_TANH:
        case FB_LAYER_SIGMOID:
        case FB_LAYER_DROPOUT:
        case FB_LAYER_EMBEDDING:
        case FB_LAYER_POSITIONAL:
        case FB_LAYER_TRANSFORMER_BLOCK:
        case FB_LAYER_LAYERNORM:
        case FB_LAYER_POOL:
        case FB_LAYER_CONV2D:
        case FB_LAYER_MAXPOOL2D:
        case FB_LAYER_AVGPOOL2D:
        case FB_LAYER_GLOBAL_AVGPOOL:
        case FB_LAYER_BATCHNORM:
            break;
        case FB_LAYER_RESIDUAL:
            if (!team_invariant(nodes[i].body, nodes[i].n_body) ||
                !team_invariant(nodes[i].sc, nodes[i].n_sc))
                return false;
            break;
        default:
            return false;
        }
    }
    return true;
}

/* Members per tile: all B unless the step is on the CPU backend with a set
 * thread count (its teams then never exceed it), in fp32 or tf32 (bf16's
 * unscale pass covers all members at once) and not a pipeline stage.  At one
 * thread the tiles run one after another; on more, the graph must give a
 * member the same result at any team size (team_invariant), and the tiles
 * are dealt to the threads, each running its tiles' kernels alone. */
static int tile_members(const fb_array *a)
{
    int nt = fb_backend_threads(a->be);
    if (nt < 1 || a->B < 2 || (nt > 1 && a->B < nt) || a->bf16 || a->prescaled ||
        strcmp(fb_backend_name(a->be), "cpu") != 0)
        return a->B;
    if (nt > 1 && !team_invariant(a->nodes, a->n_nodes)) return a->B;
    size_t slabs = 3 + (a->s2 != NULL); /* p, g, s1 (, s2) */
    size_t per = (a->params_floats * slabs + a->act_floats) / (size_t)a->Bcap * sizeof(float);
    int t = a->tile > 0 ? a->tile : per ? (int)(TILE_BYTES / per) : a->B;
    if (t < 1) t = 1;
    /* on several threads every thread gets a tile */
    if (nt > 1 && t > a->B / nt) t = a->B / nt;
    return t < a->B ? t : a->B;
}

bool fb_array_tiles(const fb_array *a)
{
    return tile_members(a) < a->B;
}

void fb_array_set_tile(fb_array *a, int n)
{
    FB_ASSERT(n >= 0);
    a->tile = n;
}

/* hp with the members [m0, m0 + n) whose loss is not finite, at this step or
 * an earlier one of the window (a->tile_dead), made empty slots. */
static const fb_optim_hparams *finite_hp(fb_array *a, const fb_optim_hparams *hp, const float *loss,
                                         int m0, int n)
{
    for (int b = m0; b < m0 + n; b++) {
        a->tile_hp[b] = hp[b];
        a->tile_dead[b] |= !isfinite(loss[b]);
        if (a->tile_dead[b]) memset(&a->tile_hp[b], 0, sizeof a->tile_hp[b]);
    }
    return a->tile_hp;
}

void fb_array_lanes_free(fb_array *a)
{
    for (int i = 0; i < a->n_lanes; i++) {
        lane *l = &a->lanes[i];
        fb_backend_free(a->be, l->act);
        fb_backend_free(a->be, l->scratch);
        fb_backend_clone_free(l->be);
        free(l->ids_host);
        free(l->tgt_host);
        free(l->ab);
        free(l->blocks);
    }
    free(a->lanes);
    a->lanes = NULL;
    a->n_lanes = a->lane_cap = 0;
}

/* Makes n lanes for tiles of up to cap members, unless a has them already. */
static int lanes_make(fb_array *a, int n, int cap, char *msg, size_t msg_cap)
{
    if (a->n_lanes == n && a->lane_cap >= cap) return FB_OK;
    fb_array_lanes_free(a);
    a->lanes = calloc((size_t)n, sizeof *a->lanes);
    if (!a->lanes) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    a->n_lanes = n;
    a->lane_cap = cap;
    int err = FB_OK;
    for (int i = 0; i < n && !err; i++) {
        lane *l = &a->lanes[i];
        size_t act_floats = 0;
        l->be = fb_backend_clone_threads(a->be, 1);
        l->ab = malloc((size_t)a->n_ab * sizeof *l->ab);
        l->blocks = calloc((size_t)(a->n_params ? a->n_params : 1), sizeof *l->blocks);
        if (a->T) {
            l->ids_host = malloc((size_t)a->max_n * (size_t)a->T * sizeof *l->ids_host);
            l->tgt_host = malloc((size_t)a->max_n * (size_t)a->T * sizeof *l->tgt_host);
        }
        if (!l->be || !l->ab || !l->blocks || (a->T && (!l->ids_host || !l->tgt_host))) {
            err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
            break;
        }
        if ((err = fb_array_plan_lane(a, cap, l->ab, &act_floats, msg, msg_cap))) break;
        l->act = fb_backend_alloc(a->be, (act_floats ? act_floats : 16) * sizeof(float));
        l->scratch =
            fb_backend_alloc(a->be, (a->scratch_floats ? a->scratch_floats : 16) * sizeof(float));
        if (!l->act || !l->scratch)
            err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory for a lane's activations");
    }
    if (err) fb_array_lanes_free(a);
    return err;
}

static const fb_optim_kind optim_kinds[] = {[FB_OPTIM_SGD] = FB_OPTIM_KIND_SGD,
                                            [FB_OPTIM_ADAM] = FB_OPTIM_KIND_ADAM,
                                            [FB_OPTIM_ADAMW] = FB_OPTIM_KIND_ADAMW};

/* Trains the members [m0, m0 + n) of a as an array of their own: forward,
 * backward and update.  v is a view of a (a copy of its struct) that the
 * tile may change; with a lane, the view computes in the lane's slab on
 * its one-thread backend. */
static int train_tile(fb_array *a, lane *l, int m0, int n, const float *x, const int32_t *y,
                      int N, uint64_t stream, const fb_optim_hparams *hp, float *loss,
                      float *correct, char *msg, size_t msg_cap)
{
    fb_array v = *a;
    fb_param_block *blocks = a->tile_blocks;
    if (l) {
        v.be = l->be;
        v.ab = l->ab;
        v.act = l->act;
        v.scratch = l->scratch;
        v.gen = l->gen;
        if (a->T) {
            v.ids_host = l->ids_host;
            v.tgt_host = l->tgt_host;
        }
        blocks = l->blocks;
    }
    v.m0 = m0;
    v.B = n;
    int err = fb_array_forward_backward(&v, x, y, N, true, stream, loss + m0,
                                        correct ? correct + m0 : NULL, msg, msg_cap);
    if (l)
        l->gen = v.gen;
    else
        a->gen = v.gen;
    if (err || !a->n_params) return err;
    for (int t = 0; t < a->n_params; t++) {
        blocks[t].offset = a->blocks[t].offset + (size_t)m0 * a->blocks[t].per_member;
        blocks[t].per_member = a->blocks[t].per_member;
    }
    fb_optim_step(v.be, optim_kinds[a->specs[0]->optim.type], a->p, a->g, a->s1, a->s2, blocks,
                  a->n_params, n, finite_hp(a, hp, loss, m0, n) + m0);
    return FB_OK;
}

/* The K steps of the window for the members [m0, m0 + n), one after another:
 * a tile's state stays in cache across them.  Step k's batch is x[k], y[k],
 * its dropout stream stream[k], its hyperparameters hp + k * B, its losses
 * loss + k * B. */
static int train_tile_steps(fb_array *a, lane *l, int m0, int n, int K, const float *const *x,
                            const int32_t *const *y, int N, const uint64_t *stream,
                            const fb_optim_hparams *hp, float *loss, float *correct, char *msg,
                            size_t msg_cap)
{
    const size_t B = (size_t)a->B;
    int err = FB_OK;
    for (int k = 0; k < K && !err; k++)
        err = train_tile(a, l, m0, n, x[k], y[k], N, stream[k], hp + (size_t)k * B,
                         loss + (size_t)k * B, correct ? correct + (size_t)k * B : NULL, msg,
                         msg_cap);
    return err;
}

int fb_array_train_steps(fb_array *a, int K, const float *const *x, const int32_t *const *y,
                         int N, const uint64_t *stream, const fb_optim_hparams *hp, float *loss,
                         float *correct, char *msg, size_t msg_cap)
{
    FB_ASSERT(K >= 1 && x != NULL && y != NULL && stream != NULL && loss != NULL && hp != NULL &&
              a->m0 == 0);
    if (!a->tile_hp) {
        a->tile_hp = calloc((size_t)a->Bcap, sizeof *a->tile_hp);
        a->tile_dead = calloc((size_t)a->Bcap, sizeof *a->tile_dead);
        a->tile_blocks = calloc((size_t)(a->n_params ? a->n_params : 1), sizeof *a->tile_blocks);
        if (!a->tile_hp || !a->tile_dead || !a->tile_blocks)
            return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    }
    const int B = a->B, tile = tile_members(a), nt = fb_backend_threads(a->be);
    const size_t Bs = (size_t)B;
    int err = FB_OK;
    /* every batch is checked before any step trains */
    for (int k = 0; k < K && !err; k++)
        if ((err = fb_array_check_batch(a, x[k], y[k], N, msg, msg_cap)) && K > 1) {
            size_t len = strlen(msg);
            if (len < msg_cap) snprintf(msg + len, msg_cap - len, " (step %d of the window)", k + 1);
        }
    if (err) return err;
    memset(a->tile_dead, 0, Bs * sizeof *a->tile_dead);
    if (tile >= B) {
        for (int k = 0; k < K && !err; k++) {
            float *lk = loss + (size_t)k * Bs;
            err = fb_array_forward_backward(a, x[k], y[k], N, true, stream[k], lk,
                                            correct ? correct + (size_t)k * Bs : NULL, msg,
                                            msg_cap);
            if (!err) fb_array_step(a, finite_hp(a, hp + (size_t)k * Bs, lk, 0, B));
        }
        return err;
    }
    /* ceil(B / tile) tiles of near-equal sizes, in member order */
    const int n_tiles = (B + tile - 1) / tile, cap = (B + n_tiles - 1) / n_tiles;
    if (nt <= 1) {
        for (int i = 0; i < n_tiles && !err; i++) {
            int m0 = (int)((int64_t)B * i / n_tiles), m1 = (int)((int64_t)B * (i + 1) / n_tiles);
            err = train_tile_steps(a, NULL, m0, m1 - m0, K, x, y, N, stream, hp, loss, correct,
                                   msg, msg_cap);
        }
        return err;
    }
    /* Several threads: each takes the next tile left, on its own lane.  A
     * member's result does not depend on which thread ran it, so the tiles
     * can go to whichever thread is free (a core another process holds
     * delays only its own thread's tiles). */
    if ((err = lanes_make(a, nt, cap, msg, msg_cap))) return err;
    int first_err = n_tiles, err_code = FB_OK;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
#endif
    for (int i = 0; i < n_tiles; i++) {
        int m0 = (int)((int64_t)B * i / n_tiles), m1 = (int)((int64_t)B * (i + 1) / n_tiles);
        char m[256];
        int e = train_tile_steps(a, &a->lanes[LANE_ID()], m0, m1 - m0, K, x, y, N, stream, hp,
                                 loss, correct, m, sizeof m);
        if (e) {
#ifdef _OPENMP
#pragma omp critical(fb_array_train_step)
#endif
            if (i < first_err) {
                first_err = i;
                err_code = e;
                snprintf(msg, msg_cap, "%s", m);
            }
        }
    }
    return err_code;
}

int fb_array_train_step(fb_array *a, const float *x, const int32_t *y, int N, uint64_t stream,
                        const fb_optim_hparams *hp, float *loss, float *correct, char *msg,
                        size_t msg_cap)
{
    return fb_array_train_steps(a, 1, &x, &y, N, &stream, hp, loss, correct, msg, msg_cap);
}
