/*
 * The job spec: the contract between a user, the server and a worker.
 *
 * fb_job_spec_parse() reads a JSON job spec, rejects anything outside the
 * contract with a code from errors.h and a message naming the field, fills
 * defaults, walks the model to infer every tensor shape, and counts parameters
 * and FLOPs.  A parsed spec can be written back in canonical form (sorted keys,
 * defaults filled, numbers printed round-trip exactly) and carries its fusion
 * key: a hash of the canonical form of the fields that must be equal for two
 * jobs to train inside one fused array (docs/architecture.md, "Job spec and
 * fusion key").
 *
 * Per-sample shapes are written (C, H, W) for images and (F) for features; the
 * batch dimensions N and B never appear in a spec.
 */
#ifndef FB_API_JOBSPEC_H
#define FB_API_JOBSPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define FB_SPEC_MAX_LAYERS 256     /* layers in the whole model, nested ones included */
#define FB_SPEC_MAX_DIM (1 << 20)  /* any one dimension of any shape */
#define FB_SPEC_MAX_DEPTH 4        /* residual blocks inside residual blocks */
#define FB_SPEC_NAME_MAX 128       /* job name, bytes */
#define FB_SPEC_DATASET_MAX 64     /* dataset name, bytes */
#define FB_SPEC_PATH_MAX 1024      /* init path (fusebox-train's local form), bytes */
#define FB_SPEC_ID_LEN 36          /* a job id in init: a canonical lower-case UUID */
#define FB_INIT_FINAL (-1)         /* init.checkpoint "final": the job's exported model */
#define FB_INIT_LATEST (-2)        /* init.checkpoint "latest": its newest weights */
#define FB_FUSION_KEY_HEX 32       /* hex digits in a fusion key */

typedef enum fb_layer_type {
    FB_LAYER_LINEAR,
    FB_LAYER_CONV2D,
    FB_LAYER_MAXPOOL2D,
    FB_LAYER_AVGPOOL2D,
    FB_LAYER_GLOBAL_AVGPOOL,
    FB_LAYER_FLATTEN,
    FB_LAYER_RELU,
    FB_LAYER_GELU,
    FB_LAYER_TANH,
    FB_LAYER_SIGMOID,
    FB_LAYER_DROPOUT,
    FB_LAYER_BATCHNORM,
    FB_LAYER_LAYERNORM,
    FB_LAYER_RESIDUAL,
    /* token models (docs/jobspec.md, "Token models"): sequence activations (T, D) */
    FB_LAYER_EMBEDDING,
    FB_LAYER_POSITIONAL,
    FB_LAYER_TRANSFORMER_BLOCK,
    FB_LAYER_POOL,
    FB_LAYER_TYPE_COUNT
} fb_layer_type;

#define FB_SPEC_DEFAULT_VAL_FRACTION 0.1
#define FB_SPEC_MAX_VAL_FRACTION 0.5

typedef enum fb_loss_type { FB_LOSS_CROSS_ENTROPY, FB_LOSS_MSE } fb_loss_type;
typedef enum fb_optim_type { FB_OPTIM_SGD, FB_OPTIM_ADAM, FB_OPTIM_ADAMW } fb_optim_type;
typedef enum fb_sched_type { FB_SCHED_CONSTANT, FB_SCHED_STEP, FB_SCHED_COSINE } fb_sched_type;
typedef enum fb_precision { FB_PREC_FP32, FB_PREC_TF32, FB_PREC_BF16 } fb_precision;
/* bf16: the operands of linear and conv products rounded to bfloat16, all
 * else float, with per-member dynamic loss scaling (docs/jobspec.md).  Every
 * backend and the training runtime train it. */
typedef enum fb_gelu_approx { FB_GELU_NONE, FB_GELU_TANH } fb_gelu_approx;
/* pool: how a sequence (T, D) becomes (D) */
typedef enum fb_pool_mode { FB_POOL_MEAN, FB_POOL_FIRST } fb_pool_mode;

#define FB_SPEC_MAX_TOKENS 8192       /* model.input.tokens: positions per record */
#define FB_SPEC_MAX_VOCAB (1 << 24)   /* model.input.vocab: ids are exact as float */

/* A per-sample shape: ndim 1 is (F), ndim 2 is a sequence (T, D) of T
 * positions of D features, ndim 3 is (C, H, W). */
typedef struct fb_shape {
    int ndim;
    int64_t d[3];
} fb_shape;

/* Number of elements in a per-sample shape. */
int64_t fb_shape_numel(const fb_shape *s);

typedef struct fb_layer fb_layer;

/*
 * One layer.  Only the fields of its type are meaningful; the parser sets the
 * others to zero.  in/out are the inferred per-sample shapes; n_params counts
 * one member's parameters (running statistics excluded); flops_fwd/bwd are
 * per sample and per member.
 */
struct fb_layer {
    fb_layer_type type;
    fb_shape in, out;
    int64_t n_params;
    double flops_fwd, flops_bwd;

    /* linear: out features; conv2d: out channels; embedding: dim */
    int64_t out_features;
    bool bias; /* linear, conv2d; default true */
    /* conv2d and pooling windows: [h, w] */
    int kernel[2], stride[2], padding[2];
    /* dropout probability; transformer_block: its dropout */
    double p;
    /* positional: rows of the learned table (>= T) */
    int64_t max_len;
    /* transformer_block: heads (dividing D), MLP width = mlp_ratio * D, causal mask */
    int heads, mlp_ratio;
    bool causal;
    /* pool */
    fb_pool_mode pool;
    /* gelu */
    fb_gelu_approx approximate;
    /* batchnorm, layernorm */
    double eps;
    double momentum;  /* batchnorm running-statistics momentum (PyTorch's meaning) */
    bool affine;      /* batchnorm affine / layernorm elementwise_affine; default true */
    /* residual: body and optional shortcut (an empty shortcut is identity) */
    fb_layer *body;
    int n_body;
    fb_layer *shortcut;
    int n_shortcut;
};

typedef struct fb_optim_spec {
    fb_optim_type type;
    double lr;
    double weight_decay;
    /* sgd */
    double momentum, dampening;
    bool nesterov;
    /* adam, adamw */
    double beta1, beta2, eps;
} fb_optim_spec;

/*
 * The learning rate at update t (0-based) is base lr times
 *   warmup:   (t + 1) / warmup_steps           while t < warmup_steps
 *   constant: 1
 *   step:     gamma ^ floor((t - warmup_steps) / step_size)
 *   cosine:   m + (1 - m) * (1 + cos(pi * (t - warmup_steps) / T)) / 2,
 *             T = total updates - warmup_steps, m = min_lr_factor
 * See fb_sched_lr_factor().
 */
typedef struct fb_sched_spec {
    fb_sched_type type;
    int64_t warmup_steps;
    int64_t step_size; /* step */
    double gamma;      /* step */
    double min_lr_factor; /* cosine: floor as a fraction of lr */
} fb_sched_spec;

typedef struct fb_job_spec {
    char name[FB_SPEC_NAME_MAX + 1];
    char dataset[FB_SPEC_DATASET_MAX + 1];
    /*
     * Per-sample input shape: what one record of the dataset holds.  A token
     * model (tokens > 0) reads records of tokens ids given as exact floats:
     * T + 1 of them for a language model (input the first T, targets the
     * last T), T for one that pools to a classification head; input is then
     * (T + 1) or (T).
     */
    fb_shape input;
    int64_t tokens, vocab; /* model.input {"tokens": T, "vocab": V}; 0 for other inputs */
    bool lm;               /* a token model without pool: next-token cross-entropy */
    fb_layer *layers;   /* top-level layers; nested ones hang off residual layers */
    int n_layers;       /* top-level count */
    int n_layers_total; /* including nested */
    fb_shape output;    /* per-sample output shape of the model */
    fb_loss_type loss;
    int64_t batch_size;
    int64_t steps;  /* 0 when epochs is given */
    int64_t epochs; /* 0 when steps is given */
    fb_optim_spec optim;
    fb_sched_spec sched;
    uint64_t seed, data_seed;
    int64_t eval_every, checkpoint_every; /* 0 = never */
    /* part of the train split held out for validation when the dataset has no validation
     * split, [0, FB_SPEC_MAX_VAL_FRACTION] (default FB_SPEC_DEFAULT_VAL_FRACTION; 0 = none);
     * a fusion-key field: the members of an array train on the same records */
    double val_fraction;
    int parallel_data, parallel_pipeline;
    fb_precision precision;
    int priority;      /* 0..100, higher first */
    int max_restarts;  /* 0..100 */
    /*
     * Initial weights, in one of two forms (docs/jobspec.md, "init").  The
     * service's form names an artifact of the tenant: init_job, a job of the
     * same tenant, and init_checkpoint, FB_INIT_FINAL, FB_INIT_LATEST or a
     * step of one of that job's checkpoints; the server resolves it inside
     * the tenant's artifacts and sends the weights themselves to the worker.
     * The local form, init, is a file path for fusebox-train on the user's
     * own machine; fuseboxd refuses it and a worker never opens it.  At most
     * one of init and init_job is set.
     */
    char init[FB_SPEC_PATH_MAX + 1]; /* local file of initial weights, "" = none */
    char
        init_job[FB_SPEC_ID_LEN + 1]; /* the tenant's job whose weights start this one, "" = none */
    int64_t init_checkpoint;          /* with init_job: FB_INIT_FINAL, FB_INIT_LATEST or a step */
    bool shuffle;      /* data.shuffle */

    int64_t n_params;        /* per member */
    double flops_fwd;        /* per sample per member */
    double flops_bwd;        /* per sample per member */
    char fusion_key[FB_FUSION_KEY_HEX + 1];
} fb_job_spec;

/* Bounds the parser enforces beyond the fixed ones above. */
typedef struct fb_spec_limits {
    int64_t max_params; /* per member; default 1e8 */
} fb_spec_limits;

/* The default limits. */
fb_spec_limits fb_spec_limits_default(void);

/*
 * Parses and validates a job spec from JSON text of len bytes.  On success
 * returns FB_OK and fills *out (free with fb_job_spec_free).  On failure
 * returns a negative fb_err, writes a message naming the field (and the layer
 * index and shapes for shape errors) into msg, and leaves *out untouched.
 * limits may be NULL for the defaults.
 */
int fb_job_spec_parse(const char *json, size_t len, const fb_spec_limits *limits,
                      fb_job_spec *out, char *msg, size_t msg_cap);

/* Reads and parses a spec file; file errors return FB_ERR_IO. */
int fb_job_spec_load(const char *path, const fb_spec_limits *limits, fb_job_spec *out,
                     char *msg, size_t msg_cap);

/* Releases what a parsed spec owns; accepts NULL and zeroed specs. */
void fb_job_spec_free(fb_job_spec *spec);

/*
 * Writes the canonical JSON form of the spec (sorted keys, every default
 * filled, compact, doubles printed so that they parse back to the same value).
 * Returns a malloc'd NUL-terminated string the caller frees, or NULL on
 * allocation failure.
 */
char *fb_job_spec_canonical(const fb_job_spec *spec);

/* Canonical JSON of only the fused fields (what the fusion key hashes). */
char *fb_job_spec_fusion_canonical(const fb_job_spec *spec);

/* True when two parsed specs may train in one array (equal fusion keys). */
bool fb_job_spec_fusible(const fb_job_spec *a, const fb_job_spec *b);

/* LR multiplier at update t (0-based) of a job with total_steps updates. */
double fb_sched_lr_factor(const fb_sched_spec *s, int64_t t, int64_t total_steps);

/*
 * Whether name is one of the public built-in datasets every server knows
 * (fashion-mnist, mnist): a spec may name one without registering it, and
 * jobs on it may share arrays across tenants.
 */
bool fb_spec_dataset_builtin(const char *name);

/* Name of a layer type as written in specs ("linear", "conv2d", ...). */
const char *fb_layer_type_name(fb_layer_type t);

#endif
