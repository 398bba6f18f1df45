/*
 * Job-spec parser, validator, canonical writer and fusion key.
 *
 * Parsing is strict: every object lists the fields it allows, every value has
 * a type and a range, and errors name the JSON path of the offending field.
 * The canonical form is written from the parsed struct, never from the input
 * text, so key order, number spelling and omitted defaults cannot change it.
 */
#include "jobspec.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPEC_MAX_BYTES (1 << 20)
#define MAX_ACT_NUMEL ((int64_t)1 << 28) /* elements of one sample's activation */
#define MAX_WINDOW 1024                  /* kernel, stride and padding bound */
#define MAX_STEPS 1000000000LL
#define MAX_EPOCHS 10000
#define MAX_SEED ((int64_t)1 << 53) /* exactly representable in any JSON reader */

/* Parser state: limits, running counts and the error sink. */
typedef struct parse_ctx {
    const fb_spec_limits *limits;
    int n_layers_total;
    /* token models: model.input's T and V (0 otherwise); at_input: the layer
     * being parsed is the model's first, which reads the input itself;
     * pooled: the path of the pool layer seen, "" before one */
    int64_t tokens, vocab;
    bool at_input;
    char pooled[128];
    char *msg;
    size_t cap;
} parse_ctx;

/* ---- field access -------------------------------------------------------- */

/* Rejects any key of obj that is not in the NULL-terminated allowed list. */
static int check_fields(parse_ctx *c, json_t *obj, const char *path, const char *const *allowed)
{
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val)
    {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(key, *a) == 0) ok = 1;
        if (!ok) {
            char list[512] = "";
            size_t used = 0;
            for (const char *const *a = allowed; *a && used < sizeof list; a++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
                                         a == allowed ? "" : ", ", *a);
            return fb_errf(c->msg, c->cap, FB_ERR_UNKNOWN_FIELD,
                           "%s%s%.64s: unknown field (allowed: %s)", path, *path ? "." : "", key,
                           list);
        }
    }
    return FB_OK;
}

static int get_object(parse_ctx *c, json_t *parent, const char *key, const char *path,
                      bool required, json_t **out)
{
    json_t *v = json_object_get(parent, key);
    *out = NULL;
    if (!v) {
        if (required)
            return fb_errf(c->msg, c->cap, FB_ERR_MISSING_FIELD, "%s%s%s: required field missing",
                           path, *path ? "." : "", key);
        return FB_OK;
    }
    if (!json_is_object(v))
        return fb_errf(c->msg, c->cap, FB_ERR_WRONG_TYPE, "%s%s%s: expected an object", path,
                       *path ? "." : "", key);
    *out = v;
    return FB_OK;
}

/* Reads an integer field in [lo, hi]; absent and not required -> def. */
static int get_int(parse_ctx *c, json_t *obj, const char *key, const char *path, bool required,
                   int64_t def, int64_t lo, int64_t hi, int64_t *out)
{
    json_t *v = json_object_get(obj, key);
    const char *dot = *path ? "." : "";
    if (!v) {
        if (required)
            return fb_errf(c->msg, c->cap, FB_ERR_MISSING_FIELD, "%s%s%s: required field missing",
                           path, dot, key);
        *out = def;
        return FB_OK;
    }
    if (!json_is_integer(v))
        return fb_errf(c->msg, c->cap, FB_ERR_WRONG_TYPE, "%s%s%s: expected an integer", path, dot,
                       key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return fb_errf(c->msg, c->cap, FB_ERR_OUT_OF_RANGE,
                       "%s%s%s: %lld is out of range [%lld, %lld]", path, dot, key, (long long)x,
                       (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return FB_OK;
}

/* Reads a number field in [lo, hi] (or (lo, hi] when lo_open). */
static int get_num(parse_ctx *c, json_t *obj, const char *key, const char *path, bool required,
                   double def, double lo, bool lo_open, double hi, double *out)
{
    json_t *v = json_object_get(obj, key);
    const char *dot = *path ? "." : "";
    if (!v) {
        if (required)
            return fb_errf(c->msg, c->cap, FB_ERR_MISSING_FIELD, "%s%s%s: required field missing",
                           path, dot, key);
        *out = def;
        return FB_OK;
    }
    if (!json_is_number(v))
        return fb_errf(c->msg, c->cap, FB_ERR_WRONG_TYPE, "%s%s%s: expected a number", path, dot,
                       key);
    double x = json_number_value(v);
    if (!isfinite(x) || x > hi || x < lo || (lo_open && x == lo))
        return fb_errf(c->msg, c->cap, FB_ERR_OUT_OF_RANGE, "%s%s%s: %g is out of range %c%g, %g]",
                       path, dot, key, x, lo_open ? '(' : '[', lo, hi);
    *out = x;
    return FB_OK;
}

static int get_bool(parse_ctx *c, json_t *obj, const char *key, const char *path, bool def,
                    bool *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v) {
        *out = def;
        return FB_OK;
    }
    if (!json_is_boolean(v))
        return fb_errf(c->msg, c->cap, FB_ERR_WRONG_TYPE, "%s%s%s: expected true or false", path,
                       *path ? "." : "", key);
    *out = json_is_true(v);
    return FB_OK;
}

/* Reads a string field; absent and not required -> *out = NULL. */
static int get_str(parse_ctx *c, json_t *obj, const char *key, const char *path, bool required,
                   const char **out)
{
    json_t *v = json_object_get(obj, key);
    const char *dot = *path ? "." : "";
    *out = NULL;
    if (!v) {
        if (required)
            return fb_errf(c->msg, c->cap, FB_ERR_MISSING_FIELD, "%s%s%s: required field missing",
                           path, dot, key);
        return FB_OK;
    }
    if (!json_is_string(v))
        return fb_errf(c->msg, c->cap, FB_ERR_WRONG_TYPE, "%s%s%s: expected a string", path, dot,
                       key);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return fb_errf(c->msg, c->cap, FB_ERR_BAD_NAME, "%s%s%s: contains a NUL byte", path, dot,
                       key);
    *out = json_string_value(v);
    return FB_OK;
}

/* Maps a string field to an index in names[]; absent -> def (or missing). */
static int get_enum(parse_ctx *c, json_t *obj, const char *key, const char *path, bool required,
                    int def, const char *const *names, int n_names, int *out)
{
    const char *s;
    int err = get_str(c, obj, key, path, required, &s);
    if (err) return err;
    if (!s) {
        *out = def;
        return FB_OK;
    }
    for (int i = 0; i < n_names; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return FB_OK;
        }
    }
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; i < n_names && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
    return fb_errf(c->msg, c->cap, FB_ERR_BAD_ENUM, "%s%s%s: \"%.64s\" is not one of: %s", path,
                   *path ? "." : "", key, s, list);
}

/* A name of 1..max bytes from [A-Za-z0-9._-] (lower case only when lower). */
static int check_name(parse_ctx *c, const char *s, const char *field, size_t max, bool lower)
{
    size_t n = strlen(s);
    if (n == 0 || n > max)
        return fb_errf(c->msg, c->cap, FB_ERR_BAD_NAME, "%s: length %zu, must be 1..%zu bytes",
                       field, n, max);
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' ||
                 ch == '-' || (!lower && ch >= 'A' && ch <= 'Z');
        if (!ok)
            return fb_errf(c->msg, c->cap, FB_ERR_BAD_NAME,
                           "%s: character %zu is not allowed (use %s, digits, '.', '_', '-')",
                           field, i, lower ? "a-z" : "letters");
    }
    return FB_OK;
}

/* Reads a window field: an integer or a [h, w] pair, each in [lo, MAX_WINDOW]. */
static int get_pair(parse_ctx *c, json_t *obj, const char *key, const char *path, bool required,
                    int def, int lo, int out[2])
{
    json_t *v = json_object_get(obj, key);
    const char *dot = *path ? "." : "";
    if (!v) {
        if (required)
            return fb_errf(c->msg, c->cap, FB_ERR_MISSING_FIELD, "%s%s%s: required field missing",
                           path, dot, key);
        out[0] = out[1] = def;
        return FB_OK;
    }
    json_int_t x[2];
    if (json_is_integer(v)) {
        x[0] = x[1] = json_integer_value(v);
    } else if (json_is_array(v) && json_array_size(v) == 2 &&
               json_is_integer(json_array_get(v, 0)) && json_is_integer(json_array_get(v, 1))) {
        x[0] = json_integer_value(json_array_get(v, 0));
        x[1] = json_integer_value(json_array_get(v, 1));
    } else {
        return fb_errf(c->msg, c->cap, FB_ERR_WRONG_TYPE,
                       "%s%s%s: expected an integer or an [h, w] pair of integers", path, dot,
                       key);
    }
    for (int i = 0; i < 2; i++)
        if (x[i] < lo || x[i] > MAX_WINDOW)
            return fb_errf(c->msg, c->cap, FB_ERR_OUT_OF_RANGE,
                           "%s%s%s: %lld is out of range [%d, %d]", path, dot, key,
                           (long long)x[i], lo, MAX_WINDOW);
    out[0] = (int)x[0];
    out[1] = (int)x[1];
    return FB_OK;
}

/* Writes a JSON path; a path too long for buf is cut (messages only). */
static void path_fmt(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void path_fmt(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

/* ---- shapes -------------------------------------------------------------- */

int64_t fb_shape_numel(const fb_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->d[i];
    return n;
}

static void shape_str(const fb_shape *s, char *buf, size_t cap)
{
    if (s->ndim == 1)
        snprintf(buf, cap, "(%lld)", (long long)s->d[0]);
    else if (s->ndim == 2)
        snprintf(buf, cap, "(%lld, %lld)", (long long)s->d[0], (long long)s->d[1]);
    else
        snprintf(buf, cap, "(%lld, %lld, %lld)", (long long)s->d[0], (long long)s->d[1],
                 (long long)s->d[2]);
}

static const char *const layer_names[FB_LAYER_TYPE_COUNT] = {
    [FB_LAYER_LINEAR] = "linear",
    [FB_LAYER_CONV2D] = "conv2d",
    [FB_LAYER_MAXPOOL2D] = "maxpool2d",
    [FB_LAYER_AVGPOOL2D] = "avgpool2d",
    [FB_LAYER_GLOBAL_AVGPOOL] = "global_avgpool",
    [FB_LAYER_FLATTEN] = "flatten",
    [FB_LAYER_RELU] = "relu",
    [FB_LAYER_GELU] = "gelu",
    [FB_LAYER_TANH] = "tanh",
    [FB_LAYER_SIGMOID] = "sigmoid",
    [FB_LAYER_DROPOUT] = "dropout",
    [FB_LAYER_BATCHNORM] = "batchnorm",
    [FB_LAYER_LAYERNORM] = "layernorm",
    [FB_LAYER_RESIDUAL] = "residual",
    [FB_LAYER_EMBEDDING] = "embedding",
    [FB_LAYER_POSITIONAL] = "positional",
    [FB_LAYER_TRANSFORMER_BLOCK] = "transformer_block",
    [FB_LAYER_POOL] = "pool",
};

static bool shape_eq(const fb_shape *x, const fb_shape *y)
{
    if (x->ndim != y->ndim) return false;
    for (int i = 0; i < x->ndim; i++)
        if (x->d[i] != y->d[i]) return false;
    return true;
}

bool fb_spec_dataset_builtin(const char *name)
{
    return strcmp(name, "fashion-mnist") == 0 || strcmp(name, "mnist") == 0;
}

const char *fb_layer_type_name(fb_layer_type t)
{
    return (t >= 0 && t < FB_LAYER_TYPE_COUNT) ? layer_names[t] : "unknown";
}

static int check_dim(parse_ctx *c, const char *path, const fb_shape *s)
{
    for (int i = 0; i < s->ndim; i++)
        if (s->d[i] > FB_SPEC_MAX_DIM)
            return fb_errf(c->msg, c->cap, FB_ERR_DIM_TOO_LARGE,
                           "%s: dimension %lld exceeds %d", path, (long long)s->d[i],
                           FB_SPEC_MAX_DIM);
    if (fb_shape_numel(s) > MAX_ACT_NUMEL)
        return fb_errf(c->msg, c->cap, FB_ERR_DIM_TOO_LARGE,
                       "%s: %lld elements per sample exceed %lld", path,
                       (long long)fb_shape_numel(s), (long long)MAX_ACT_NUMEL);
    return FB_OK;
}

/* ---- layers -------------------------------------------------------------- */

static void layers_free(fb_layer *layers, int n)
{
    if (!layers) return;
    for (int i = 0; i < n; i++) {
        layers_free(layers[i].body, layers[i].n_body);
        layers_free(layers[i].shortcut, layers[i].n_shortcut);
    }
    free(layers);
}

static int parse_layers(parse_ctx *c, json_t *arr, const char *path, int depth, fb_shape in,
                        fb_layer **out, int *n_out, fb_shape *shape_out);

/*
 * The layers of token models: shapes, parameters and FLOPs, with the rules
 * of where they may stand.  The embedding is the first layer and reads the
 * token input (T) into a sequence (T, D); positional, transformer_block and
 * pool need a sequence; pool turns it into (D) once.
 */
static int infer_token_layer(parse_ctx *c, fb_layer *L, const char *path)
{
    char a[96];
    const fb_shape *in = &L->in;
    const char *name = layer_names[L->type];
    if (L->type == FB_LAYER_EMBEDDING) {
        if (!c->tokens || !c->at_input)
            return fb_errf(c->msg, c->cap, FB_ERR_SHAPE_MISMATCH,
                           "%s (embedding): must be the first layer, over a token input "
                           "(model.input {\"tokens\": T, \"vocab\": V})",
                           path);
        int64_t T = c->tokens, D = L->out_features;
        L->out.ndim = 2;
        L->out.d[0] = T;
        L->out.d[1] = D;
        L->out.d[2] = 0;
        L->n_params = c->vocab * D;
        L->flops_fwd = (double)T * (double)D;
        L->flops_bwd = (double)T * (double)D;
        return FB_OK;
    }
    if (in->ndim != 2) {
        shape_str(in, a, sizeof a);
        return fb_errf(c->msg, c->cap, FB_ERR_SHAPE_MISMATCH,
                       "%s (%s): needs a sequence input (T, D) from an embedding, got %s%s", path,
                       name, a, c->pooled[0] ? " (after the pool layer)" : "");
    }
    int64_t T = in->d[0], D = in->d[1];
    double TD = (double)T * (double)D;
    switch (L->type) {
    case FB_LAYER_POSITIONAL:
        if (L->max_len == 0) L->max_len = T;
        if (L->max_len < T)
            return fb_errf(c->msg, c->cap, FB_ERR_SHAPE_MISMATCH,
                           "%s.max_len: %lld is below the sequence length %lld "
                           "(model.input.tokens)",
                           path, (long long)L->max_len, (long long)T);
        L->n_params = L->max_len * D;
        L->flops_fwd = TD;
        L->flops_bwd = TD;
        break;
    case FB_LAYER_TRANSFORMER_BLOCK: {
        if (D % L->heads != 0)
            return fb_errf(c->msg, c->cap, FB_ERR_SHAPE_MISMATCH,
                           "%s.heads: %d does not divide the model dimension %lld", path,
                           L->heads, (long long)D);
        if ((int64_t)L->heads * T * T > MAX_ACT_NUMEL)
            return fb_errf(c->msg, c->cap, FB_ERR_DIM_TOO_LARGE,
                           "%s: attention probabilities of %d heads over %lld positions are "
                           "%lld values per sample, more than %lld",
                           path, L->heads, (long long)T, (long long)L->heads * T * T,
                           (long long)MAX_ACT_NUMEL);
        int64_t M = (int64_t)L->mlp_ratio * D;
        /* ln1, qkv (D -> 3D), out (D -> D), ln2, mlp (D -> M -> D) */
        L->n_params = 2 * D + (3 * D * D + 3 * D) + (D * D + D) + 2 * D + (D * M + M) + (M * D + D);
        double gemm = 2.0 * TD * (double)(3 * D + D + 2 * M);
        double attn = 4.0 * (double)T * TD; /* q.k and probs.v */
        L->flops_fwd = gemm + attn + 20.0 * TD + 10.0 * (double)T * (double)M;
        L->flops_bwd = 2.0 * L->flops_fwd;
        break;
    }
    case FB_LAYER_POOL:
        if (c->pooled[0])
            return fb_errf(c->msg, c->cap, FB_ERR_SHAPE_MISMATCH,
                           "%s (pool): the model pools already at %s", path, c->pooled);
        snprintf(c->pooled, sizeof c->pooled, "%s", path);
        L->out.ndim = 1;
        L->out.d[0] = D;
        L->out.d[1] = 0;
        L->flops_fwd = TD;
        L->flops_bwd = TD;
        break;
    default:
        return fb_errf(c->msg, c->cap, FB_ERR_INTERNAL, "%s: not a token layer", path);
    }
    return FB_OK;
}

/* Infers out shape, parameter count and FLOPs of a parsed non-residual layer. */
static int infer_layer(parse_ctx *c, fb_layer *L, const char *path)
{
    char a[96], b[96];
    const fb_shape *in = &L->in;
    int64_t numel = fb_shape_numel(in);
    L->out = *in;
    switch (L->type) {
    case FB_LAYER_LINEAR: {
        if (in->ndim == 3) {
            shape_str(in, a, sizeof a);
            return fb_errf(c->msg, c->cap, FB_ERR_SHAPE_MISMATCH,
                           "%s (linear): needs a feature input (F), got %s; add a flatten "
                           "layer before it",
                           path, a);
        }
        /* on a sequence (T, D): the same linear map at every position */
        int64_t I = in->d[in->ndim - 1], T = in->ndim == 2 ? in->d[0] : 1;
        L->out.d[in->ndim - 1] = L->out_features;
        L->n_params = I * L->out_features + (L->bias ? L->out_features : 0);
        L->flops_fwd = 2.0 * (double)T * (double)I * (double)L->out_features;
        L->flops_bwd = 2.0 * L->flops_fwd;
        break;
    }
    case FB_LAYER_CONV2D:
    case FB_LAYER_MAXPOOL2D:
    case FB_LAYER_AVGPOOL2D: {
        if (in->ndim != 3) {
            shape_str(in, a, sizeof a);
            return fb_errf(c->msg, c->cap, FB_ERR_SHAPE_MISMATCH,
                           "%s (%s): needs an image input (C, H, W), got %s", path,
                           layer_names[L->type], a);
        }
        int64_t H = in->d[1], W = in->d[2];
        if (L->kernel[0] > H + 2 * L->padding[0] || L->kernel[1] > W + 2 * L->padding[1]) {
            shape_str(in, a, sizeof a);
            return fb_errf(c->msg, c->cap, FB_ERR_KERNEL_TOO_LARGE,
                           "%s (%s): kernel [%d, %d] with padding [%d, %d] is larger than the "
                           "input %s",
                           path, layer_names[L->type], L->kernel[0], L->kernel[1],
                           L->padding[0], L->padding[1], a);
        }
        int64_t Ho = (H + 2 * L->padding[0] - L->kernel[0]) / L->stride[0] + 1;
        int64_t Wo = (W + 2 * L->padding[1] - L->kernel[1]) / L->stride[1] + 1;
        double kk = (double)L->kernel[0] * L->kernel[1];
        L->out.d[1] = Ho;
        L->out.d[2] = Wo;
        if (L->type == FB_LAYER_CONV2D) {
            L->out.d[0] = L->out_features;
            L->n_params = L->out_features * in->d[0] * L->kernel[0] * L->kernel[1] +
                          (L->bias ? L->out_features : 0);
            L->flops_fwd = 2.0 * (double)in->d[0] * kk * (double)L->out_features * (double)Ho *
                           (double)Wo;
            L->flops_bwd = 2.0 * L->flops_fwd;
        } else {
            L->flops_fwd = kk * (double)fb_shape_numel(&L->out);
            L->flops_bwd = (double)numel + (double)fb_shape_numel(&L->out);
        }
        break;
    }
    case FB_LAYER_GLOBAL_AVGPOOL:
        if (in->ndim != 3) {
            shape_str(in, a, sizeof a);
            return fb_errf(c->msg, c->cap, FB_ERR_SHAPE_MISMATCH,
                           "%s (global_avgpool): needs an image input (C, H, W), got %s", path,
                           a);
        }
        L->out.ndim = 1;
        L->out.d[0] = in->d[0];
        L->out.d[1] = L->out.d[2] = 0;
        L->flops_fwd = (double)numel;
        L->flops_bwd = (double)numel;
        break;
    case FB_LAYER_FLATTEN:
        if (in->ndim == 2)
            return fb_errf(c->msg, c->cap, FB_ERR_SHAPE_MISMATCH,
                           "%s (flatten): a sequence (T, D) does not flatten; use a pool layer",
                           path);
        L->out.ndim = 1;
        L->out.d[0] = numel;
        L->out.d[1] = L->out.d[2] = 0;
        break;
    case FB_LAYER_RELU:
    case FB_LAYER_TANH:
    case FB_LAYER_SIGMOID:
    case FB_LAYER_DROPOUT:
        L->flops_fwd = (double)numel;
        L->flops_bwd = 2.0 * (double)numel;
        break;
    case FB_LAYER_GELU:
        L->flops_fwd = 10.0 * (double)numel;
        L->flops_bwd = 20.0 * (double)numel;
        break;
    case FB_LAYER_BATCHNORM:
        if (in->ndim == 2)
            return fb_errf(c->msg, c->cap, FB_ERR_SHAPE_MISMATCH,
                           "%s (batchnorm): not over a sequence (T, D); use layernorm", path);
        L->n_params = L->affine ? 2 * in->d[0] : 0;
        L->flops_fwd = 5.0 * (double)numel;
        L->flops_bwd = 8.0 * (double)numel;
        break;
    case FB_LAYER_LAYERNORM:
        /* over the whole sample, or over the last dimension of a sequence */
        L->n_params = L->affine ? 2 * (in->ndim == 2 ? in->d[1] : numel) : 0;
        L->flops_fwd = 5.0 * (double)numel;
        L->flops_bwd = 8.0 * (double)numel;
        break;
    case FB_LAYER_EMBEDDING:
    case FB_LAYER_POSITIONAL:
    case FB_LAYER_TRANSFORMER_BLOCK:
    case FB_LAYER_POOL: {
        int err = infer_token_layer(c, L, path);
        if (err) return err;
        break;
    }
    default:
        shape_str(in, b, sizeof b);
        return fb_errf(c->msg, c->cap, FB_ERR_INTERNAL, "%s: unexpected layer type at %s", path,
                       b);
    }
    return check_dim(c, path, &L->out);
}

/* The fields of the token-model layers (embedding, positional, transformer_block, pool). */
static int parse_token_fields(parse_ctx *c, json_t *obj, const char *path, fb_layer *L)
{
    static const char *const k_embed[] = {"type", "dim", NULL};
    static const char *const k_pos[] = {"type", "max_len", NULL};
    static const char *const k_block[] = {"type", "heads", "mlp_ratio", "causal", "dropout", NULL};
    static const char *const k_seqpool[] = {"type", "mode", NULL};
    static const char *const pool_names[] = {"mean", "first"};
    int err, t = 0;
    int64_t v;
    switch (L->type) {
    case FB_LAYER_EMBEDDING:
        if ((err = check_fields(c, obj, path, k_embed))) return err;
        return get_int(c, obj, "dim", path, true, 0, 1, 65536, &L->out_features);
    case FB_LAYER_POSITIONAL:
        if ((err = check_fields(c, obj, path, k_pos))) return err;
        return get_int(c, obj, "max_len", path, false, 0, 1, FB_SPEC_MAX_TOKENS, &L->max_len);
    case FB_LAYER_TRANSFORMER_BLOCK:
        if ((err = check_fields(c, obj, path, k_block))) return err;
        if ((err = get_int(c, obj, "heads", path, true, 0, 1, 1024, &v))) return err;
        L->heads = (int)v;
        if ((err = get_int(c, obj, "mlp_ratio", path, false, 4, 1, 16, &v))) return err;
        L->mlp_ratio = (int)v;
        if ((err = get_bool(c, obj, "causal", path, true, &L->causal))) return err;
        return get_num(c, obj, "dropout", path, false, 0.0, 0.0, false, 0.99, &L->p);
    default: /* pool */
        if ((err = check_fields(c, obj, path, k_seqpool))) return err;
        if ((err = get_enum(c, obj, "mode", path, false, FB_POOL_MEAN, pool_names, 2, &t)))
            return err;
        L->pool = (fb_pool_mode)t;
        return FB_OK;
    }
}

static int parse_layer(parse_ctx *c, json_t *obj, const char *path, int depth, fb_shape in,
                       fb_layer *L)
{
    static const char *const k_type[] = {"type", NULL};
    static const char *const k_linear[] = {"type", "out", "bias", NULL};
    static const char *const k_conv[] = {"type", "out", "kernel", "stride", "padding", "bias", NULL};
    static const char *const k_pool[] = {"type", "kernel", "stride", "padding", NULL};
    static const char *const k_gelu[] = {"type", "approximate", NULL};
    static const char *const k_dropout[] = {"type", "p", NULL};
    static const char *const k_bn[] = {"type", "eps", "momentum", "affine", NULL};
    static const char *const k_ln[] = {"type", "eps", "affine", NULL};
    static const char *const k_res[] = {"type", "body", "shortcut", NULL};
    static const char *const gelu_names[] = {"none", "tanh"};
    int err, t = 0;
    int64_t v;

    if (!json_is_object(obj))
        return fb_errf(c->msg, c->cap, FB_ERR_WRONG_TYPE, "%s: expected a layer object", path);
    if ((err = get_enum(c, obj, "type", path, true, 0, layer_names, FB_LAYER_TYPE_COUNT, &t)))
        return err;
    memset(L, 0, sizeof *L);
    L->type = (fb_layer_type)t;
    L->in = in;
    if (++c->n_layers_total > FB_SPEC_MAX_LAYERS)
        return fb_errf(c->msg, c->cap, FB_ERR_TOO_MANY_LAYERS,
                       "%s: the model has more than %d layers (nested ones included)", path,
                       FB_SPEC_MAX_LAYERS);
    if (c->tokens && c->at_input && L->type != FB_LAYER_EMBEDDING) /* the token input */
        return fb_errf(c->msg, c->cap, FB_ERR_SHAPE_MISMATCH,
                       "%s (%s): a token input (model.input.tokens) needs an embedding first",
                       path, layer_names[L->type]);

    switch (L->type) {
    case FB_LAYER_EMBEDDING:
    case FB_LAYER_POSITIONAL:
    case FB_LAYER_TRANSFORMER_BLOCK:
    case FB_LAYER_POOL:
        if ((err = parse_token_fields(c, obj, path, L))) return err;
        break;
    case FB_LAYER_LINEAR:
        if ((err = check_fields(c, obj, path, k_linear))) return err;
        if ((err = get_int(c, obj, "out", path, true, 0, 1, INT64_MAX, &v))) return err;
        if (v > FB_SPEC_MAX_DIM)
            return fb_errf(c->msg, c->cap, FB_ERR_DIM_TOO_LARGE, "%s.out: %lld exceeds %d", path,
                           (long long)v, FB_SPEC_MAX_DIM);
        L->out_features = v;
        if ((err = get_bool(c, obj, "bias", path, true, &L->bias))) return err;
        break;
    case FB_LAYER_CONV2D:
        if ((err = check_fields(c, obj, path, k_conv))) return err;
        if ((err = get_int(c, obj, "out", path, true, 0, 1, INT64_MAX, &v))) return err;
        if (v > FB_SPEC_MAX_DIM)
            return fb_errf(c->msg, c->cap, FB_ERR_DIM_TOO_LARGE, "%s.out: %lld exceeds %d", path,
                           (long long)v, FB_SPEC_MAX_DIM);
        L->out_features = v;
        if ((err = get_pair(c, obj, "kernel", path, true, 0, 1, L->kernel))) return err;
        if ((err = get_pair(c, obj, "stride", path, false, 1, 1, L->stride))) return err;
        if ((err = get_pair(c, obj, "padding", path, false, 0, 0, L->padding))) return err;
        if ((err = get_bool(c, obj, "bias", path, true, &L->bias))) return err;
        break;
    case FB_LAYER_MAXPOOL2D:
    case FB_LAYER_AVGPOOL2D:
        if ((err = check_fields(c, obj, path, k_pool))) return err;
        if ((err = get_pair(c, obj, "kernel", path, true, 0, 1, L->kernel))) return err;
        if ((err = get_pair(c, obj, "stride", path, false, 0, 1, L->stride))) return err;
        if (!json_object_get(obj, "stride")) {
            L->stride[0] = L->kernel[0];
            L->stride[1] = L->kernel[1];
        }
        if ((err = get_pair(c, obj, "padding", path, false, 0, 0, L->padding))) return err;
        if (2 * L->padding[0] > L->kernel[0] || 2 * L->padding[1] > L->kernel[1])
            return fb_errf(c->msg, c->cap, FB_ERR_OUT_OF_RANGE,
                           "%s.padding: [%d, %d] must be at most half the kernel [%d, %d]", path,
                           L->padding[0], L->padding[1], L->kernel[0], L->kernel[1]);
        break;
    case FB_LAYER_GELU:
        if ((err = check_fields(c, obj, path, k_gelu))) return err;
        if ((err = get_enum(c, obj, "approximate", path, false, FB_GELU_NONE, gelu_names, 2, &t)))
            return err;
        L->approximate = (fb_gelu_approx)t;
        break;
    case FB_LAYER_DROPOUT:
        if ((err = check_fields(c, obj, path, k_dropout))) return err;
        if ((err = get_num(c, obj, "p", path, false, 0.5, 0.0, false, 0.99, &L->p))) return err;
        break;
    case FB_LAYER_BATCHNORM:
        if ((err = check_fields(c, obj, path, k_bn))) return err;
        if ((err = get_num(c, obj, "eps", path, false, 1e-5, 0.0, true, 1.0, &L->eps))) return err;
        if ((err = get_num(c, obj, "momentum", path, false, 0.1, 0.0, false, 1.0, &L->momentum)))
            return err;
        if ((err = get_bool(c, obj, "affine", path, true, &L->affine))) return err;
        break;
    case FB_LAYER_LAYERNORM:
        if ((err = check_fields(c, obj, path, k_ln))) return err;
        if ((err = get_num(c, obj, "eps", path, false, 1e-5, 0.0, true, 1.0, &L->eps))) return err;
        if ((err = get_bool(c, obj, "affine", path, true, &L->affine))) return err;
        break;
    case FB_LAYER_RESIDUAL: {
        if ((err = check_fields(c, obj, path, k_res))) return err;
        if (depth + 1 > FB_SPEC_MAX_DEPTH)
            return fb_errf(c->msg, c->cap, FB_ERR_NESTING_TOO_DEEP,
                           "%s: residual blocks nest more than %d deep", path, FB_SPEC_MAX_DEPTH);
        json_t *body = json_object_get(obj, "body");
        json_t *sc = json_object_get(obj, "shortcut");
        char sub[256];
        fb_shape body_out, sc_out = in;
        if (!body)
            return fb_errf(c->msg, c->cap, FB_ERR_MISSING_FIELD, "%s.body: required field missing",
                           path);
        path_fmt(sub, sizeof sub, "%s.body", path);
        if ((err = parse_layers(c, body, sub, depth + 1, in, &L->body, &L->n_body, &body_out)))
            return err;
        if (sc) {
            path_fmt(sub, sizeof sub, "%s.shortcut", path);
            if (json_is_array(sc) && json_array_size(sc) == 0) {
                /* an empty shortcut is the identity */
            } else if ((err = parse_layers(c, sc, sub, depth + 1, in, &L->shortcut,
                                           &L->n_shortcut, &sc_out))) {
                return err;
            }
        }
        if (!shape_eq(&body_out, &sc_out)) {
            char x[96], y[96];
            shape_str(&body_out, x, sizeof x);
            shape_str(&sc_out, y, sizeof y);
            return fb_errf(c->msg, c->cap, FB_ERR_SHAPE_MISMATCH,
                           "%s (residual): body output %s does not match %s output %s", path, x,
                           L->n_shortcut ? "shortcut" : "identity shortcut", y);
        }
        L->out = body_out;
        for (int i = 0; i < L->n_body; i++) {
            L->n_params += L->body[i].n_params;
            L->flops_fwd += L->body[i].flops_fwd;
            L->flops_bwd += L->body[i].flops_bwd;
        }
        for (int i = 0; i < L->n_shortcut; i++) {
            L->n_params += L->shortcut[i].n_params;
            L->flops_fwd += L->shortcut[i].flops_fwd;
            L->flops_bwd += L->shortcut[i].flops_bwd;
        }
        L->flops_fwd += (double)fb_shape_numel(&L->out);
        L->flops_bwd += (double)fb_shape_numel(&L->out);
        return FB_OK;
    }
    default: /* flatten, relu, tanh, sigmoid, global_avgpool */
        if ((err = check_fields(c, obj, path, k_type))) return err;
        break;
    }
    return infer_layer(c, L, path);
}

/* Parses a non-empty array of layers starting from shape in. */
static int parse_layers(parse_ctx *c, json_t *arr, const char *path, int depth, fb_shape in,
                        fb_layer **out, int *n_out, fb_shape *shape_out)
{
    if (!json_is_array(arr))
        return fb_errf(c->msg, c->cap, FB_ERR_WRONG_TYPE, "%s: expected an array of layers", path);
    size_t n = json_array_size(arr);
    if (n == 0)
        return fb_errf(c->msg, c->cap, FB_ERR_OUT_OF_RANGE, "%s: must hold at least one layer",
                       path);
    if (n > FB_SPEC_MAX_LAYERS)
        return fb_errf(c->msg, c->cap, FB_ERR_TOO_MANY_LAYERS, "%s: %zu layers exceed %d", path,
                       n, FB_SPEC_MAX_LAYERS);
    fb_layer *layers = calloc(n, sizeof *layers);
    if (!layers) return fb_errf(c->msg, c->cap, FB_ERR_NOMEM, "out of memory");
    int err = FB_OK;
    fb_shape cur = in;
    size_t done = 0;
    for (size_t i = 0; i < n; i++) {
        char sub[256];
        path_fmt(sub, sizeof sub, "%s[%zu]", path, i);
        c->at_input = depth == 0 && i == 0;
        err = parse_layer(c, json_array_get(arr, i), sub, depth, cur, &layers[i]);
        c->at_input = false;
        done = i + 1;
        if (err) goto fail;
        cur = layers[i].out;
    }
    *out = layers;
    *n_out = (int)n;
    *shape_out = cur;
    return FB_OK;
fail:
    layers_free(layers, (int)done);
    return err;
}

/* ---- the spec ------------------------------------------------------------ */

fb_spec_limits fb_spec_limits_default(void)
{
    fb_spec_limits l = {.max_params = 100000000};
    return l;
}

static int parse_input(parse_ctx *c, json_t *model, fb_shape *s)
{
    static const char *const k_tokens[] = {"tokens", "vocab", NULL};
    json_t *v = json_object_get(model, "input");
    if (!v)
        return fb_errf(c->msg, c->cap, FB_ERR_MISSING_FIELD, "model.input: required field missing");
    if (json_is_object(v)) {
        /* token ids; the layers see (T) and the embedding makes it (T, D) */
        int err;
        if ((err = check_fields(c, v, "model.input", k_tokens))) return err;
        if ((err = get_int(c, v, "tokens", "model.input", true, 0, 1, FB_SPEC_MAX_TOKENS,
                           &c->tokens)))
            return err;
        if ((err = get_int(c, v, "vocab", "model.input", true, 0, 2, FB_SPEC_MAX_VOCAB,
                           &c->vocab)))
            return err;
        memset(s, 0, sizeof *s);
        s->ndim = 1;
        s->d[0] = c->tokens;
        return FB_OK;
    }
    if (!json_is_array(v))
        return fb_errf(c->msg, c->cap, FB_ERR_WRONG_TYPE,
                       "model.input: expected [F], [C, H, W] (an array of integers) or "
                       "{\"tokens\": T, \"vocab\": V}");
    size_t n = json_array_size(v);
    if (n != 1 && n != 3)
        return fb_errf(c->msg, c->cap, FB_ERR_OUT_OF_RANGE,
                       "model.input: has %zu dimensions; expected [F] or [C, H, W]", n);
    memset(s, 0, sizeof *s);
    s->ndim = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_t *d = json_array_get(v, i);
        if (!json_is_integer(d))
            return fb_errf(c->msg, c->cap, FB_ERR_WRONG_TYPE,
                           "model.input[%zu]: expected an integer", i);
        json_int_t x = json_integer_value(d);
        if (x < 1)
            return fb_errf(c->msg, c->cap, FB_ERR_OUT_OF_RANGE,
                           "model.input[%zu]: %lld must be at least 1", i, (long long)x);
        if (x > FB_SPEC_MAX_DIM)
            return fb_errf(c->msg, c->cap, FB_ERR_DIM_TOO_LARGE,
                           "model.input[%zu]: %lld exceeds %d", i, (long long)x, FB_SPEC_MAX_DIM);
        s->d[i] = x;
    }
    return check_dim(c, "model.input", s);
}

static int parse_optimizer(parse_ctx *c, json_t *root, fb_optim_spec *o)
{
    static const char *const names[] = {"sgd", "adam", "adamw"};
    static const char *const k_sgd[] = {"type", "lr", "momentum", "dampening", "nesterov",
                                        "weight_decay", NULL};
    static const char *const k_adam[] = {"type", "lr", "betas", "eps", "weight_decay", NULL};
    json_t *obj;
    int err, t;
    if ((err = get_object(c, root, "optimizer", "", true, &obj))) return err;
    if ((err = get_enum(c, obj, "type", "optimizer", true, 0, names, 3, &t))) return err;
    memset(o, 0, sizeof *o);
    o->type = (fb_optim_type)t;
    if ((err = check_fields(c, obj, "optimizer", o->type == FB_OPTIM_SGD ? k_sgd : k_adam)))
        return err;
    if ((err = get_num(c, obj, "lr", "optimizer", true, 0, 0.0, true, 100.0, &o->lr))) return err;
    double wd_def = o->type == FB_OPTIM_ADAMW ? 0.01 : 0.0;
    if ((err = get_num(c, obj, "weight_decay", "optimizer", false, wd_def, 0.0, false, 10.0,
                       &o->weight_decay)))
        return err;
    if (o->type == FB_OPTIM_SGD) {
        if ((err = get_num(c, obj, "momentum", "optimizer", false, 0.0, 0.0, false, 0.999999,
                           &o->momentum)))
            return err;
        if ((err = get_num(c, obj, "dampening", "optimizer", false, 0.0, 0.0, false, 1.0,
                           &o->dampening)))
            return err;
        if ((err = get_bool(c, obj, "nesterov", "optimizer", false, &o->nesterov))) return err;
        if (o->nesterov && (o->momentum <= 0.0 || o->dampening != 0.0))
            return fb_errf(c->msg, c->cap, FB_ERR_CONFLICT,
                           "optimizer.nesterov: needs momentum > 0 and dampening = 0");
        return FB_OK;
    }
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    json_t *betas = json_object_get(obj, "betas");
    if (betas) {
        if (!json_is_array(betas) || json_array_size(betas) != 2 ||
            !json_is_number(json_array_get(betas, 0)) || !json_is_number(json_array_get(betas, 1)))
            return fb_errf(c->msg, c->cap, FB_ERR_WRONG_TYPE,
                           "optimizer.betas: expected a pair of numbers [beta1, beta2]");
        double b[2] = {json_number_value(json_array_get(betas, 0)),
                       json_number_value(json_array_get(betas, 1))};
        for (int i = 0; i < 2; i++)
            if (!(b[i] >= 0.0 && b[i] < 1.0))
                return fb_errf(c->msg, c->cap, FB_ERR_OUT_OF_RANGE,
                               "optimizer.betas[%d]: %g is out of range [0, 1)", i, b[i]);
        o->beta1 = b[0];
        o->beta2 = b[1];
    }
    return get_num(c, obj, "eps", "optimizer", false, 1e-8, 0.0, true, 1.0, &o->eps);
}

static int parse_schedule(parse_ctx *c, json_t *root, fb_sched_spec *s)
{
    static const char *const names[] = {"constant", "step", "cosine"};
    static const char *const k_const[] = {"type", "warmup_steps", NULL};
    static const char *const k_step[] = {"type", "warmup_steps", "step_size", "gamma", NULL};
    static const char *const k_cos[] = {"type", "warmup_steps", "min_lr_factor", NULL};
    json_t *obj;
    int err, t;
    memset(s, 0, sizeof *s);
    s->type = FB_SCHED_CONSTANT;
    s->gamma = 0.1;
    if ((err = get_object(c, root, "schedule", "", false, &obj))) return err;
    if (!obj) return FB_OK;
    if ((err = get_enum(c, obj, "type", "schedule", false, FB_SCHED_CONSTANT, names, 3, &t)))
        return err;
    s->type = (fb_sched_type)t;
    const char *const *allowed =
        s->type == FB_SCHED_STEP ? k_step : s->type == FB_SCHED_COSINE ? k_cos : k_const;
    if ((err = check_fields(c, obj, "schedule", allowed))) return err;
    if ((err = get_int(c, obj, "warmup_steps", "schedule", false, 0, 0, MAX_STEPS,
                       &s->warmup_steps)))
        return err;
    if (s->type == FB_SCHED_STEP) {
        if ((err = get_int(c, obj, "step_size", "schedule", true, 0, 1, MAX_STEPS, &s->step_size)))
            return err;
        if ((err = get_num(c, obj, "gamma", "schedule", false, 0.1, 0.0, true, 1.0, &s->gamma)))
            return err;
    } else if (s->type == FB_SCHED_COSINE) {
        if ((err = get_num(c, obj, "min_lr_factor", "schedule", false, 0.0, 0.0, false, 1.0,
                           &s->min_lr_factor)))
            return err;
    }
    return FB_OK;
}

/* A job id as the server writes them: a canonical lower-case UUID. */
static bool uuid_ok(const char *s)
{
    if (strlen(s) != FB_SPEC_ID_LEN) return false;
    for (int i = 0; i < FB_SPEC_ID_LEN; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        char ch = s[i];
        if (dash ? ch != '-' : !((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
            return false;
    }
    return true;
}

/*
 * "init": an object {"job": id, "checkpoint": "final" | "latest" | step}
 * naming the tenant's artifact, or a string, a local file for fusebox-train
 * (whether a program accepts that form is its own decision).
 */
static int parse_init(parse_ctx *c, json_t *root, fb_job_spec *s)
{
    static const char *const k_init[] = {"job", "checkpoint", NULL};
    json_t *v = json_object_get(root, "init");
    s->init_checkpoint = FB_INIT_FINAL;
    if (!v) return FB_OK;
    if (json_is_string(v)) {
        const char *str = json_string_value(v);
        size_t n = strlen(str);
        if (n == 0 || n > FB_SPEC_PATH_MAX)
            return fb_errf(c->msg, c->cap, FB_ERR_BAD_NAME, "init: length %zu, must be 1..%d", n,
                           FB_SPEC_PATH_MAX);
        snprintf(s->init, sizeof s->init, "%s", str);
        return FB_OK;
    }
    if (!json_is_object(v))
        return fb_errf(c->msg, c->cap, FB_ERR_WRONG_TYPE,
                       "init: expected an object {\"job\": id, \"checkpoint\": ...}");
    int err;
    const char *job;
    if ((err = check_fields(c, v, "init", k_init))) return err;
    if ((err = get_str(c, v, "job", "init", true, &job))) return err;
    if (!uuid_ok(job))
        return fb_errf(c->msg, c->cap, FB_ERR_BAD_NAME,
                       "init.job: a job id (a lower-case UUID as the API writes them)");
    snprintf(s->init_job, sizeof s->init_job, "%s", job);
    json_t *ck = json_object_get(v, "checkpoint");
    if (!ck || (json_is_string(ck) && strcmp(json_string_value(ck), "final") == 0)) {
        s->init_checkpoint = FB_INIT_FINAL;
    } else if (json_is_string(ck) && strcmp(json_string_value(ck), "latest") == 0) {
        s->init_checkpoint = FB_INIT_LATEST;
    } else if (json_is_string(ck)) {
        return fb_errf(c->msg, c->cap, FB_ERR_BAD_ENUM,
                       "init.checkpoint: \"final\", \"latest\" or a step");
    } else {
        int64_t step;
        if ((err = get_int(c, v, "checkpoint", "init", true, 0, 0, MAX_STEPS, &step))) return err;
        s->init_checkpoint = step;
    }
    return FB_OK;
}

/*
 * A token model without a pool layer is a language model: logits (T, V)
 * against the next token of each position, from records of T + 1 tokens.
 */
static int check_lm(parse_ctx *c, fb_job_spec *s, const char *loss_name)
{
    s->lm = true;
    if (s->loss != FB_LOSS_CROSS_ENTROPY || s->output.ndim != 2 || s->output.d[1] != s->vocab) {
        char a[96];
        shape_str(&s->output, a, sizeof a);
        return fb_errf(c->msg, c->cap, FB_ERR_BAD_LOSS,
                       "loss: a token model without a pool layer is a language model: it needs "
                       "cross_entropy and a last layer of vocab (%lld) features per position, "
                       "the model ends in %s with loss %s",
                       (long long)s->vocab, a, loss_name);
    }
    s->input.d[0] = s->tokens + 1;
    return FB_OK;
}

/* What token models do not (yet) have: bf16 and more than one device. */
static int check_token_limits(parse_ctx *c, const fb_job_spec *s)
{
    if (s->tokens && s->precision == FB_PREC_BF16)
        return fb_errf(c->msg, c->cap, FB_ERR_UNSUPPORTED,
                       "precision: bf16 is not available for token models (model.input.tokens); "
                       "use fp32 or tf32");
    if (s->tokens && (s->parallel_data > 1 || s->parallel_pipeline > 1))
        return fb_errf(c->msg, c->cap, FB_ERR_UNSUPPORTED,
                       "parallel: token models (model.input.tokens) train on one device");
    return FB_OK;
}

static int parse_root(parse_ctx *c, json_t *root, fb_job_spec *s)
{
    static const char *const k_root[] = {
        "name", "dataset", "model", "loss", "batch_size", "steps", "epochs", "optimizer",
        "schedule", "seed", "data_seed", "eval_every", "val_fraction", "checkpoint_every",
        "parallel", "precision", "priority", "max_restarts", "init", "data", NULL};
    static const char *const k_model[] = {"input", "layers", NULL};
    static const char *const k_parallel[] = {"data", "pipeline", NULL};
    static const char *const k_data[] = {"shuffle", NULL};
    static const char *const loss_names[] = {"cross_entropy", "mse"};
    static const char *const prec_names[] = {"fp32", "tf32", "bf16"};
    const char *str;
    json_t *obj;
    int64_t v;
    int err, t;

    if (!json_is_object(root))
        return fb_errf(c->msg, c->cap, FB_ERR_NOT_OBJECT, "a job spec must be a JSON object");
    if ((err = check_fields(c, root, "", k_root))) return err;

    if ((err = get_str(c, root, "name", "", false, &str))) return err;
    if (!str) str = "job";
    if ((err = check_name(c, str, "name", FB_SPEC_NAME_MAX, false))) return err;
    snprintf(s->name, sizeof s->name, "%s", str);

    if ((err = get_str(c, root, "dataset", "", true, &str))) return err;
    if ((err = check_name(c, str, "dataset", FB_SPEC_DATASET_MAX, true))) return err;
    /* the datasets' own rule: "." and ".." are directories, not names */
    if (!((str[0] >= 'a' && str[0] <= 'z') || (str[0] >= '0' && str[0] <= '9')))
        return fb_errf(c->msg, c->cap, FB_ERR_BAD_NAME,
                       "dataset: must start with a letter a-z or a digit");
    snprintf(s->dataset, sizeof s->dataset, "%s", str);

    if ((err = get_object(c, root, "model", "", true, &obj))) return err;
    if ((err = check_fields(c, obj, "model", k_model))) return err;
    if ((err = parse_input(c, obj, &s->input))) return err;
    json_t *layers = json_object_get(obj, "layers");
    if (!layers)
        return fb_errf(c->msg, c->cap, FB_ERR_MISSING_FIELD,
                       "model.layers: required field missing");
    if ((err = parse_layers(c, layers, "model.layers", 0, s->input, &s->layers, &s->n_layers,
                            &s->output)))
        return err;
    s->n_layers_total = c->n_layers_total;
    for (int i = 0; i < s->n_layers; i++) {
        s->n_params += s->layers[i].n_params;
        s->flops_fwd += s->layers[i].flops_fwd;
        s->flops_bwd += s->layers[i].flops_bwd;
    }
    if (s->n_params > c->limits->max_params)
        return fb_errf(c->msg, c->cap, FB_ERR_TOO_MANY_PARAMS,
                       "model: %lld parameters exceed the bound of %lld", (long long)s->n_params,
                       (long long)c->limits->max_params);

    if ((err = get_enum(c, root, "loss", "", false, FB_LOSS_CROSS_ENTROPY, loss_names, 2, &t)))
        return err;
    s->loss = (fb_loss_type)t;
    s->tokens = c->tokens;
    s->vocab = c->vocab;
    if (s->tokens && !c->pooled[0]) {
        if ((err = check_lm(c, s, loss_names[s->loss]))) return err;
    } else if (s->output.ndim != 1 ||
               (s->loss == FB_LOSS_CROSS_ENTROPY && s->output.d[0] < 2)) {
        char a[96];
        shape_str(&s->output, a, sizeof a);
        return fb_errf(c->msg, c->cap, FB_ERR_BAD_LOSS,
                       "loss: %s needs a model output of %s features, the model ends in %s",
                       loss_names[s->loss], s->loss == FB_LOSS_CROSS_ENTROPY ? "(K >= 2)" : "(K)",
                       a);
    }

    if ((err = get_int(c, root, "batch_size", "", true, 0, 1, 65536, &s->batch_size))) return err;
    bool has_steps = json_object_get(root, "steps") != NULL;
    bool has_epochs = json_object_get(root, "epochs") != NULL;
    if (has_steps && has_epochs)
        return fb_errf(c->msg, c->cap, FB_ERR_CONFLICT, "steps, epochs: give one, not both");
    if (!has_steps && !has_epochs)
        return fb_errf(c->msg, c->cap, FB_ERR_MISSING_FIELD,
                       "steps: required field missing (or give epochs)");
    if (has_steps && (err = get_int(c, root, "steps", "", true, 0, 1, MAX_STEPS, &s->steps)))
        return err;
    if (has_epochs && (err = get_int(c, root, "epochs", "", true, 0, 1, MAX_EPOCHS, &s->epochs)))
        return err;

    if ((err = parse_optimizer(c, root, &s->optim))) return err;
    if ((err = parse_schedule(c, root, &s->sched))) return err;
    if (s->steps && s->sched.warmup_steps >= s->steps)
        return fb_errf(c->msg, c->cap, FB_ERR_CONFLICT,
                       "schedule.warmup_steps: %lld must be below steps (%lld)",
                       (long long)s->sched.warmup_steps, (long long)s->steps);

    if ((err = get_int(c, root, "seed", "", false, 0, 0, MAX_SEED, &v))) return err;
    s->seed = (uint64_t)v;
    if ((err = get_int(c, root, "data_seed", "", false, 0, 0, MAX_SEED, &v))) return err;
    s->data_seed = (uint64_t)v;
    if ((err = get_int(c, root, "eval_every", "", false, 0, 0, MAX_STEPS, &s->eval_every)))
        return err;
    if ((err = get_num(c, root, "val_fraction", "", false, FB_SPEC_DEFAULT_VAL_FRACTION, 0, false,
                       FB_SPEC_MAX_VAL_FRACTION, &s->val_fraction)))
        return err;
    if ((err = get_int(c, root, "checkpoint_every", "", false, 0, 0, MAX_STEPS,
                       &s->checkpoint_every)))
        return err;

    s->parallel_data = s->parallel_pipeline = 1;
    if ((err = get_object(c, root, "parallel", "", false, &obj))) return err;
    if (obj) {
        if ((err = check_fields(c, obj, "parallel", k_parallel))) return err;
        if ((err = get_int(c, obj, "data", "parallel", false, 1, 1, 1024, &v))) return err;
        s->parallel_data = (int)v;
        if ((err = get_int(c, obj, "pipeline", "parallel", false, 1, 1, 64, &v))) return err;
        s->parallel_pipeline = (int)v;
        if (s->parallel_pipeline > s->n_layers)
            return fb_errf(c->msg, c->cap, FB_ERR_CONFLICT,
                           "parallel.pipeline: %d stages for a model of %d top-level layers",
                           s->parallel_pipeline, s->n_layers);
        if (s->parallel_data > s->batch_size)
            return fb_errf(c->msg, c->cap, FB_ERR_CONFLICT,
                           "parallel.data: %d devices for a batch of %lld samples",
                           s->parallel_data, (long long)s->batch_size);
    }

    if ((err = get_enum(c, root, "precision", "", false, FB_PREC_FP32, prec_names, 3, &t)))
        return err;
    s->precision = (fb_precision)t;
    if ((err = check_token_limits(c, s))) return err;
    if ((err = get_int(c, root, "priority", "", false, 50, 0, 100, &v))) return err;
    s->priority = (int)v;
    if ((err = get_int(c, root, "max_restarts", "", false, 3, 0, 100, &v))) return err;
    s->max_restarts = (int)v;

    if ((err = parse_init(c, root, s))) return err;

    s->shuffle = true;
    if ((err = get_object(c, root, "data", "", false, &obj))) return err;
    if (obj) {
        if ((err = check_fields(c, obj, "data", k_data))) return err;
        if ((err = get_bool(c, obj, "shuffle", "data", true, &s->shuffle))) return err;
    }
    return FB_OK;
}

/* ---- canonical form ------------------------------------------------------ */

static json_t *pair_json(const int p[2])
{
    return json_pack("[ii]", p[0], p[1]);
}

static json_t *layers_json(const fb_layer *layers, int n);

static json_t *layer_json(const fb_layer *L)
{
    json_t *o = json_pack("{ss}", "type", layer_names[L->type]);
    if (!o) return NULL;
    int bad = 0;
    switch (L->type) {
    case FB_LAYER_LINEAR:
        bad |= json_object_set_new(o, "out", json_integer(L->out_features));
        bad |= json_object_set_new(o, "bias", json_boolean(L->bias));
        break;
    case FB_LAYER_CONV2D:
        bad |= json_object_set_new(o, "out", json_integer(L->out_features));
        bad |= json_object_set_new(o, "bias", json_boolean(L->bias));
        /* fall through */
    case FB_LAYER_MAXPOOL2D:
    case FB_LAYER_AVGPOOL2D:
        bad |= json_object_set_new(o, "kernel", pair_json(L->kernel));
        bad |= json_object_set_new(o, "stride", pair_json(L->stride));
        bad |= json_object_set_new(o, "padding", pair_json(L->padding));
        break;
    case FB_LAYER_GELU:
        bad |= json_object_set_new(o, "approximate",
                                   json_string(L->approximate == FB_GELU_TANH ? "tanh" : "none"));
        break;
    case FB_LAYER_DROPOUT:
        bad |= json_object_set_new(o, "p", json_real(L->p));
        break;
    case FB_LAYER_BATCHNORM:
        bad |= json_object_set_new(o, "momentum", json_real(L->momentum));
        /* fall through */
    case FB_LAYER_LAYERNORM:
        bad |= json_object_set_new(o, "eps", json_real(L->eps));
        bad |= json_object_set_new(o, "affine", json_boolean(L->affine));
        break;
    case FB_LAYER_EMBEDDING:
        bad |= json_object_set_new(o, "dim", json_integer(L->out_features));
        break;
    case FB_LAYER_POSITIONAL:
        bad |= json_object_set_new(o, "max_len", json_integer(L->max_len));
        break;
    case FB_LAYER_TRANSFORMER_BLOCK:
        bad |= json_object_set_new(o, "heads", json_integer(L->heads));
        bad |= json_object_set_new(o, "mlp_ratio", json_integer(L->mlp_ratio));
        bad |= json_object_set_new(o, "causal", json_boolean(L->causal));
        bad |= json_object_set_new(o, "dropout", json_real(L->p));
        break;
    case FB_LAYER_POOL:
        bad |= json_object_set_new(o, "mode", json_string(L->pool == FB_POOL_FIRST ? "first"
                                                                                   : "mean"));
        break;
    case FB_LAYER_RESIDUAL:
        bad |= json_object_set_new(o, "body", layers_json(L->body, L->n_body));
        bad |= json_object_set_new(o, "shortcut", layers_json(L->shortcut, L->n_shortcut));
        break;
    default:
        break;
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *layers_json(const fb_layer *layers, int n)
{
    json_t *a = json_array();
    if (!a) return NULL;
    for (int i = 0; i < n; i++) {
        if (json_array_append_new(a, layer_json(&layers[i]))) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

static json_t *model_json(const fb_job_spec *s)
{
    json_t *in;
    if (s->tokens) {
        in = json_pack("{s:I, s:I}", "tokens", (json_int_t)s->tokens, "vocab",
                       (json_int_t)s->vocab);
    } else {
        in = json_array();
        for (int i = 0; in && i < s->input.ndim; i++)
            json_array_append_new(in, json_integer(s->input.d[i]));
    }
    return json_pack("{s:o?, s:o?}", "input", in, "layers", layers_json(s->layers, s->n_layers));
}

static const char *const optim_names[] = {"sgd", "adam", "adamw"};
static const char *const sched_names[] = {"constant", "step", "cosine"};
static const char *const loss_names_c[] = {"cross_entropy", "mse"};
static const char *const prec_names_c[] = {"fp32", "tf32", "bf16"};

static char *dump(json_t *o)
{
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(o);
    return s;
}

char *fb_job_spec_fusion_canonical(const fb_job_spec *s)
{
    json_t *o = json_pack("{s:I, s:{s:b}, s:I, s:s, s:s, s:o?, s:{s:s}, s:{s:i, s:i}, s:s}",
                          "batch_size", (json_int_t)s->batch_size, "data", "shuffle", s->shuffle,
                          "data_seed", (json_int_t)s->data_seed, "dataset", s->dataset, "loss",
                          loss_names_c[s->loss], "model", model_json(s), "optimizer", "type",
                          optim_names[s->optim.type], "parallel", "data", s->parallel_data,
                          "pipeline", s->parallel_pipeline, "precision",
                          prec_names_c[s->precision]);
    /* val_fraction: the members of an array share their minibatches, so they hold out the
     * same records.  None held out (0) leaves the key as it was before validation existed,
     * so a job accepted then (schema 011 gives it 0) resumes from its checkpoints. */
    if (o && s->val_fraction > 0 &&
        json_object_set_new(o, "val_fraction", json_real(s->val_fraction)) != 0) {
        json_decref(o);
        o = NULL;
    }
    return dump(o);
}

/* init's service form, as written: "checkpoint" is "final", "latest" or the step. */
static json_t *init_json(const fb_job_spec *s)
{
    json_t *ck = s->init_checkpoint == FB_INIT_FINAL    ? json_string("final")
                 : s->init_checkpoint == FB_INIT_LATEST ? json_string("latest")
                                                        : json_integer(s->init_checkpoint);
    return json_pack("{s:s, s:o}", "job", s->init_job, "checkpoint", ck);
}

char *fb_job_spec_canonical(const fb_job_spec *s)
{
    json_t *o = json_pack("{s:s, s:s, s:o?, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:{s:i, s:i},"
                          " s:s, s:i, s:i, s:{s:b}}",
                          "name", s->name, "dataset", s->dataset, "model", model_json(s), "loss",
                          loss_names_c[s->loss], "batch_size", (json_int_t)s->batch_size, "seed",
                          (json_int_t)s->seed, "data_seed", (json_int_t)s->data_seed,
                          "eval_every", (json_int_t)s->eval_every, "checkpoint_every",
                          (json_int_t)s->checkpoint_every, s->steps ? "steps" : "epochs",
                          (json_int_t)(s->steps ? s->steps : s->epochs), "parallel", "data",
                          s->parallel_data, "pipeline", s->parallel_pipeline, "precision",
                          prec_names_c[s->precision], "priority", s->priority, "max_restarts",
                          s->max_restarts, "data", "shuffle", s->shuffle);
    if (!o) return NULL;
    const fb_optim_spec *op = &s->optim;
    json_t *opt = op->type == FB_OPTIM_SGD
                      ? json_pack("{s:s, s:f, s:f, s:f, s:f, s:b}", "type", optim_names[op->type],
                                  "lr", op->lr, "weight_decay", op->weight_decay, "momentum",
                                  op->momentum, "dampening", op->dampening, "nesterov",
                                  op->nesterov)
                      : json_pack("{s:s, s:f, s:f, s:[ff], s:f}", "type", optim_names[op->type],
                                  "lr", op->lr, "weight_decay", op->weight_decay, "betas",
                                  op->beta1, op->beta2, "eps", op->eps);
    const fb_sched_spec *sc = &s->sched;
    json_t *sched = json_pack("{s:s, s:I}", "type", sched_names[sc->type], "warmup_steps",
                              (json_int_t)sc->warmup_steps);
    if (sched && sc->type == FB_SCHED_STEP) {
        json_object_set_new(sched, "step_size", json_integer(sc->step_size));
        json_object_set_new(sched, "gamma", json_real(sc->gamma));
    } else if (sched && sc->type == FB_SCHED_COSINE) {
        json_object_set_new(sched, "min_lr_factor", json_real(sc->min_lr_factor));
    }
    if (!opt || !sched || json_object_set_new(o, "optimizer", opt) ||
        json_object_set_new(o, "schedule", sched) ||
        json_object_set_new(o, "val_fraction", json_real(s->val_fraction)) ||
        (s->init[0] && json_object_set_new(o, "init", json_string(s->init))) ||
        (s->init_job[0] && json_object_set_new(o, "init", init_json(s)))) {
        json_decref(o);
        return NULL;
    }
    return dump(o);
}

static int compute_fusion_key(fb_job_spec *s)
{
    static const char domain[] = "fusebox-fusion-key-v1\n";
    unsigned char h[FB_FUSION_KEY_HEX / 2];
    if (sodium_init() < 0) return FB_ERR_INTERNAL;
    char *canon = fb_job_spec_fusion_canonical(s);
    if (!canon) return FB_ERR_NOMEM;
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof h);
    crypto_generichash_update(&st, (const unsigned char *)domain, sizeof domain - 1);
    crypto_generichash_update(&st, (const unsigned char *)canon, strlen(canon));
    crypto_generichash_final(&st, h, sizeof h);
    free(canon);
    sodium_bin2hex(s->fusion_key, sizeof s->fusion_key, h, sizeof h);
    return FB_OK;
}

/* ---- public entry points ------------------------------------------------- */

int fb_job_spec_parse(const char *text, size_t len, const fb_spec_limits *limits,
                      fb_job_spec *out, char *msg, size_t msg_cap)
{
    fb_spec_limits def = fb_spec_limits_default();
    parse_ctx c = {.limits = limits ? limits : &def, .msg = msg, .cap = msg_cap};
    if (msg && msg_cap) msg[0] = '\0';
    if (!text)
        return fb_errf(msg, msg_cap, FB_ERR_JSON_SYNTAX, "empty job spec");
    if (len > SPEC_MAX_BYTES)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "job spec of %zu bytes exceeds %d",
                       len, SPEC_MAX_BYTES);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return fb_errf(msg, msg_cap, FB_ERR_JSON_SYNTAX, "invalid JSON at line %d column %d: %s",
                       jerr.line, jerr.column, jerr.text);
    fb_job_spec *s = calloc(1, sizeof *s);
    int err = FB_ERR_NOMEM;
    if (!s) {
        fb_errf(msg, msg_cap, err, "out of memory");
        goto fail;
    }
    if ((err = parse_root(&c, root, s))) goto fail;
    if ((err = compute_fusion_key(s))) {
        fb_errf(msg, msg_cap, err, "out of memory");
        goto fail;
    }
    json_decref(root);
    *out = *s;
    free(s);
    return FB_OK;
fail:
    json_decref(root);
    fb_job_spec_free(s);
    free(s);
    return err;
}

int fb_job_spec_load(const char *path, const fb_spec_limits *limits, fb_job_spec *out, char *msg,
                     size_t msg_cap)
{
    FILE *f = fopen(path, "rb");
    if (!f) return fb_errf(msg, msg_cap, FB_ERR_IO, "%s: cannot open", path);
    char *buf = malloc(SPEC_MAX_BYTES + 1);
    if (!buf) {
        fclose(f);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    }
    size_t n = fread(buf, 1, SPEC_MAX_BYTES + 1, f);
    int rd_err = ferror(f);
    fclose(f);
    int err;
    if (rd_err) {
        err = fb_errf(msg, msg_cap, FB_ERR_IO, "%s: read error", path);
    } else if (n > SPEC_MAX_BYTES) {
        err = fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s: larger than %d bytes", path,
                      SPEC_MAX_BYTES);
    } else {
        err = fb_job_spec_parse(buf, n, limits, out, msg, msg_cap);
        if (err && msg && msg_cap) {
            char tmp[1024];
            snprintf(tmp, sizeof tmp, "%s: %s", path, msg);
            snprintf(msg, msg_cap, "%s", tmp);
        }
    }
    free(buf);
    return err;
}

void fb_job_spec_free(fb_job_spec *spec)
{
    if (!spec) return;
    layers_free(spec->layers, spec->n_layers);
    spec->layers = NULL;
    spec->n_layers = 0;
}

bool fb_job_spec_fusible(const fb_job_spec *a, const fb_job_spec *b)
{
    return strcmp(a->fusion_key, b->fusion_key) == 0;
}

double fb_sched_lr_factor(const fb_sched_spec *s, int64_t t, int64_t total_steps)
{
    if (t < s->warmup_steps) return (double)(t + 1) / (double)s->warmup_steps;
    int64_t u = t - s->warmup_steps;
    switch (s->type) {
    case FB_SCHED_STEP:
        return pow(s->gamma, (double)(u / s->step_size));
    case FB_SCHED_COSINE: {
        int64_t T = total_steps - s->warmup_steps;
        if (T <= 0) return 1.0;
        if (u > T) u = T;
        double m = s->min_lr_factor;
        return m + (1.0 - m) * 0.5 * (1.0 + cos(M_PI * (double)u / (double)T));
    }
    default:
        return 1.0;
    }
}
