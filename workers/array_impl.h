/*
 * Private side of the fused training array (array.h): the layer nodes, the
 * five slabs and the buffers of the activation slab, shared by the files
 * that implement the array.  array.c builds an array and plans its
 * activation slab, array_pass.c runs forward and backward, array_state.c
 * holds the optimizer update, membership and one member's state tensor by
 * tensor, array_file.c reads and writes weights files.  Only those files
 * include this header.
 */
#ifndef FB_WORKERS_ARRAY_IMPL_H
#define FB_WORKERS_ARRAY_IMPL_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "array.h"
#include "cuda/cuda_backend.h"

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
    float bound;    /* > 0: uniform(-bound, bound) instead (xavier_uniform_) */
    float std;      /* > 0: normal(0, std) instead (nn.Embedding: 1) */
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

/*
 * A lane of fb_array_train_step on more than one thread: what one thread
 * needs to run tiles of members while the other threads run theirs, so that
 * the threads share no mutable state.  be is a one-thread handle on the
 * array's backend (its kernels then run as teams of one, as at one thread);
 * ab and act the activation slab planned for cap members; scratch the conv
 * and attention workspace; blocks the tile's optimizer blocks; gen its own
 * count of backward passes (abuf.gen).
 */
typedef struct lane {
    fb_backend *be;
    abuf *ab;
    float *act, *scratch;
    fb_param_block *blocks;
    uint64_t gen;
    int32_t *ids_host, *tgt_host; /* a token model's own batch buffers [max_n * T] */
} lane;

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
    /* A transformer block runs as two residual nodes whose layers the array
     * makes itself (array.c, build_block); the first owns them.  The node
     * whose L is the block itself is the block's attention op: in is qkv
     * [N, T, B, 3D], save1 the probabilities [N, B, H, T, T]. */
    fb_layer *own;
};

struct fb_array {
    fb_backend *be;
    const fb_job_spec **specs; /* [Bcap], slot order */
    uint64_t *seeds;           /* [Bcap] */
    int64_t *bn_tracked;       /* [Bcap * n_bn] */
    int B, Bcap, max_n;
    int K;
    int64_t in_numel;
    /* token models: T positions, vocabulary V, a language model's next-token
     * targets; out_rows rows of K_row logits per sample (T rows of V for a
     * language model, else one row of K); ids_host and tgt_host [max_n * T]
     * hold a batch's ids and targets on their way to the device */
    int T, V;
    bool lm;
    int out_rows, K_row;
    int32_t *ids_host, *tgt_host;

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
    float *scratch;         /* conv and attention workspace */
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
    /* fb_array_train_step runs the members in tiles [m0, m0 + B) one after
     * another (B is the tile's size meanwhile); m0 is 0 outside a tile.
     * tile_blocks [n_params], tile_hp [Bcap] and tile_dead [Bcap] (the
     * members whose loss was not finite at an earlier step of the window of
     * fb_array_train_steps) are its workspace. */
    int m0, tile; /* tile: fb_array_set_tile's n */
    fb_param_block *tile_blocks;
    fb_optim_hparams *tile_hp;
    bool *tile_dead;
    uint64_t gen;
    /* lanes [n_lanes], each planned for lane_cap members (fb_array_train_step
     * on several threads); plan: the activation plan the array was made with */
    lane *lanes;
    int n_lanes, lane_cap;
    fb_array_plan plan;
};

/* Plans a slab for tiles of at most cap <= Bcap members of a: ab [n_ab]
 * receives a's buffers sized for cap members and placed by a's plan,
 * *act_floats the slab's size (array.c). */
int fb_array_plan_lane(const fb_array *a, int cap, abuf *ab, size_t *act_floats, char *msg,
                       size_t msg_cap);
/* Checks a batch x, y [N] as fb_array_forward_backward does before it
 * computes anything: N in [1, max_n], a token model's ids, the labels
 * (array_pass.c). */
int fb_array_check_batch(const fb_array *a, const float *x, const int32_t *y, int N, char *msg,
                         size_t msg_cap);
/* Frees a's lanes (array_state.c). */
void fb_array_lanes_free(fb_array *a);

/* Floats of n values in a slab, keeping 64-byte alignment as take() (array.c) does. */
static inline size_t pad16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* The gradient of activation id. */
static inline int grad_of(const fb_array *a, int id)
{
    FB_ASSERT(id >= 0 && id < a->n_ab && a->ab[id].grad >= 0);
    return a->ab[id].grad;
}

/* FB_OK, or the device failure the backend recorded since it was created
 * (a CUDA backend's ops return nothing and record their first failure; see
 * kernels/cuda/cuda_backend.h).  Free on the CPU backends; on CUDA it waits
 * for queued work, which the caller's downloads have mostly done already. */
static inline int device_status(const fb_array *a, char *msg, size_t msg_cap)
{
    return fb_cuda_backend_error(a->be, msg, msg_cap);
}

/* Divides n host floats of member m's gradient by its loss scale when the
 * slab holds scaled gradients, so that readers see the batch's gradient. */
static inline void unscale_host(const fb_array *a, int m, float *v, size_t n)
{
    if (!a->grads_scaled) return;
    float inv = 1.0f / a->ls_scale[m];
    for (size_t i = 0; i < n; i++)
        v[i] *= inv;
}

#endif
