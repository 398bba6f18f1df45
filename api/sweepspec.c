/*
 * Sweep-spec parser, search-space expansion and canonical writer.
 *
 * Parsing is as strict as the job spec's: every object lists the members it
 * allows and every value has a type and a range.  Trials are made by writing
 * parameter values into a deep copy of the base and handing the result to
 * fb_job_spec_parse(); the canonical forms are written from what was parsed,
 * never from the input text.
 */
#include "sweepspec.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SWEEP_MAX_BYTES (1 << 20)
#define MAX_SEED ((int64_t)1 << 53)

typedef enum dist_type { DIST_CHOICE, DIST_UNIFORM, DIST_LOG_UNIFORM, DIST_INT } dist_type;
static const char *const dist_names[] = {"choice", "uniform", "log_uniform", "int"};

typedef struct param {
    char path[FB_SWEEP_PATH_MAX + 1];
    dist_type dist;
    json_t *values; /* choice: array of scalars */
    double low, high;
    int64_t ilow, ihigh;
} param;

typedef struct trial {
    fb_job_spec spec;
    char *json;
    char *params;
} trial;

struct fb_sweep_spec {
    char name[FB_SPEC_NAME_MAX + 1];
    json_t *base; /* as given, deep copy */
    fb_search_type type;
    int64_t count, seed; /* random */
    int n_params;
    param params[FB_SWEEP_MAX_PARAMS];
    fb_asha_spec asha;
    char metric[32]; /* the metric that decides: ASHA's rungs and the best trial */
    fb_metric_mode mode;
    int n_trials;
    trial *trials;
};

static int err_at(char *msg, size_t msg_cap, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int err_at(char *msg, size_t msg_cap, int err, const char *fmt, ...)
{
    if (msg && msg_cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msg_cap, fmt, ap);
        va_end(ap);
    }
    return err;
}

/* Refuses members of obj not in the NULL-terminated allowed list. */
static int only_fields(json_t *obj, const char *path, const char *const *allowed, char *msg,
                       size_t msg_cap)
{
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val)
    {
        bool ok = false;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(key, *a) == 0) ok = true;
        if (!ok) {
            char list[256] = "";
            size_t used = 0;
            for (const char *const *a = allowed; *a && used < sizeof list; a++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
                                         a == allowed ? "" : ", ", *a);
            return err_at(msg, msg_cap, FB_ERR_UNKNOWN_FIELD,
                          "%s%s%.64s: unknown field (allowed: %s)", path, path[0] ? "." : "", key,
                          list);
        }
    }
    return FB_OK;
}

static int get_int(json_t *obj, const char *key, const char *path, bool required, int64_t def,
                   int64_t lo, int64_t hi, int64_t *out, char *msg, size_t msg_cap)
{
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required)
            return err_at(msg, msg_cap, FB_ERR_MISSING_FIELD, "%s.%s: required field missing", path,
                          key);
        *out = def;
        return FB_OK;
    }
    if (!json_is_integer(v))
        return err_at(msg, msg_cap, FB_ERR_WRONG_TYPE, "%s.%s: expected an integer", path, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return err_at(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s.%s: %lld is out of range [%lld, %lld]",
                      path, key, (long long)x, (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return FB_OK;
}

static int get_num(json_t *obj, const char *key, const char *path, double *out, char *msg,
                   size_t msg_cap)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return err_at(msg, msg_cap, FB_ERR_MISSING_FIELD, "%s.%s: required field missing", path,
                      key);
    if (!json_is_number(v))
        return err_at(msg, msg_cap, FB_ERR_WRONG_TYPE, "%s.%s: expected a number", path, key);
    double x = json_number_value(v);
    if (!isfinite(x) || fabs(x) > 1e15)
        return err_at(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s.%s: %g is out of range [-1e15, 1e15]",
                      path, key, x);
    *out = x;
    return FB_OK;
}

static int get_enum(json_t *obj, const char *key, const char *path, bool required, int def,
                    const char *const *names, int n, int *out, char *msg, size_t msg_cap)
{
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required)
            return err_at(msg, msg_cap, FB_ERR_MISSING_FIELD, "%s.%s: required field missing", path,
                          key);
        *out = def;
        return FB_OK;
    }
    if (!json_is_string(v))
        return err_at(msg, msg_cap, FB_ERR_WRONG_TYPE, "%s.%s: expected a string", path, key);
    for (int i = 0; i < n; i++) {
        if (strcmp(json_string_value(v), names[i]) == 0 &&
            strlen(json_string_value(v)) == json_string_length(v)) {
            *out = i;
            return FB_OK;
        }
    }
    char list[200] = "";
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
    return err_at(msg, msg_cap, FB_ERR_BAD_ENUM, "%s.%s: \"%.64s\" is not one of: %s", path, key,
                  json_string_value(v), list);
}

/* ---- parameter paths ------------------------------------------------------ */

/* A path of 1..FB_SWEEP_PATH_DEPTH parts; each part a member name
 * ([a-z_][a-z0-9_]*) or an array index (0..1023). */
static bool valid_path(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || n > FB_SWEEP_PATH_MAX) return false;
    int parts = 0;
    const char *s = p;
    while (*s) {
        const char *e = strchr(s, '.');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == 0 || ++parts > FB_SWEEP_PATH_DEPTH) return false;
        bool digits = true, name = (s[0] >= 'a' && s[0] <= 'z') || s[0] == '_';
        for (size_t i = 0; i < len; i++) {
            char c = s[i];
            if (!(c >= '0' && c <= '9')) digits = false;
            if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) name = false;
        }
        if (digits && (len > 4 || atoi(s) > 1023)) return false;
        if (!digits && !name) return false;
        s += len;
        if (*s == '.') {
            s++;
            if (!*s) return false;
        }
    }
    return true;
}

/*
 * Writes value (a new reference, stolen) at path inside root.  Returns FB_OK
 * or an error naming the path when a parent is missing or of the wrong kind.
 */
static int set_path(json_t *root, const char *path, json_t *value, char *msg, size_t msg_cap)
{
    char buf[FB_SWEEP_PATH_MAX + 1];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = root;
    char *s = buf;
    for (;;) {
        char *dot = strchr(s, '.');
        if (dot) *dot = '\0';
        bool index = s[0] >= '0' && s[0] <= '9';
        if (!dot) {
            int bad;
            if (index && json_is_array(cur) && (size_t)atoi(s) < json_array_size(cur))
                bad = json_array_set_new(cur, (size_t)atoi(s), value);
            else if (!index && json_is_object(cur))
                bad = json_object_set_new(cur, s, value);
            else {
                json_decref(value);
                return err_at(msg, msg_cap, FB_ERR_MISSING_FIELD,
                              "search.params.%s: the base spec has no place for \"%s\"", path, s);
            }
            return bad ? err_at(msg, msg_cap, FB_ERR_NOMEM, "out of memory") : FB_OK;
        }
        json_t *next = NULL;
        if (index && json_is_array(cur))
            next = json_array_get(cur, (size_t)atoi(s));
        else if (!index && json_is_object(cur))
            next = json_object_get(cur, s);
        if (!next || !(json_is_object(next) || json_is_array(next))) {
            json_decref(value);
            return err_at(msg, msg_cap, FB_ERR_MISSING_FIELD,
                          "search.params.%s: the base spec has no object or array at \"%s\"", path,
                          s);
        }
        cur = next;
        s = dot + 1;
    }
}

/* ---- parsing ---------------------------------------------------------------- */

static int parse_param(json_t *v, const char *path, fb_search_type type, param *p, char *msg,
                       size_t msg_cap)
{
    char where[FB_SWEEP_PATH_MAX + 32];
    snprintf(where, sizeof where, "search.params.%s", path);
    if (!json_is_object(v))
        return err_at(msg, msg_cap, FB_ERR_WRONG_TYPE, "%s: expected an object", where);
    static const char *const allowed[] = {"distribution", "values", "low", "high", NULL};
    int err = only_fields(v, where, allowed, msg, msg_cap);
    if (err) return err;
    int dist = 0;
    int def = json_object_get(v, "values") ? DIST_CHOICE : -1;
    if ((err =
             get_enum(v, "distribution", where, def < 0, def, dist_names, 4, &dist, msg, msg_cap)))
        return err;
    p->dist = (dist_type)dist;
    if (type == FB_SEARCH_GRID && p->dist != DIST_CHOICE)
        return err_at(msg, msg_cap, FB_ERR_CONFLICT,
                      "%s: a grid search takes a list of values, not a distribution", where);
    json_t *values = json_object_get(v, "values");
    if (p->dist == DIST_CHOICE) {
        if (json_object_get(v, "low") || json_object_get(v, "high"))
            return err_at(msg, msg_cap, FB_ERR_CONFLICT, "%s: choice takes values, not low/high",
                          where);
        if (!values)
            return err_at(msg, msg_cap, FB_ERR_MISSING_FIELD, "%s.values: required field missing",
                          where);
        if (!json_is_array(values))
            return err_at(msg, msg_cap, FB_ERR_WRONG_TYPE, "%s.values: expected an array", where);
        size_t n = json_array_size(values);
        if (n < 1 || n > FB_SWEEP_MAX_VALUES)
            return err_at(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s.values: %zu values, allowed 1..%d",
                          where, n, FB_SWEEP_MAX_VALUES);
        for (size_t i = 0; i < n; i++) {
            json_t *x = json_array_get(values, i);
            if (!(json_is_number(x) || json_is_string(x) || json_is_boolean(x)))
                return err_at(msg, msg_cap, FB_ERR_WRONG_TYPE,
                              "%s.values[%zu]: expected a number, string or boolean", where, i);
        }
        p->values = json_incref(values);
        return FB_OK;
    }
    if (values)
        return err_at(msg, msg_cap, FB_ERR_CONFLICT, "%s: %s takes low and high, not values", where,
                      dist_names[p->dist]);
    if (p->dist == DIST_INT) {
        if ((err =
                 get_int(v, "low", where, true, 0, -MAX_SEED, MAX_SEED, &p->ilow, msg, msg_cap)) ||
            (err =
                 get_int(v, "high", where, true, 0, -MAX_SEED, MAX_SEED, &p->ihigh, msg, msg_cap)))
            return err;
        if (p->ilow > p->ihigh)
            return err_at(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s: low %lld is above high %lld",
                          where, (long long)p->ilow, (long long)p->ihigh);
        return FB_OK;
    }
    if ((err = get_num(v, "low", where, &p->low, msg, msg_cap)) ||
        (err = get_num(v, "high", where, &p->high, msg, msg_cap)))
        return err;
    if (!(p->low < p->high))
        return err_at(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s: low %g must be below high %g", where,
                      p->low, p->high);
    if (p->dist == DIST_LOG_UNIFORM && p->low <= 0)
        return err_at(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                      "%s.low: log_uniform needs low > 0, got %g", where, p->low);
    return FB_OK;
}

static int cmp_param(const void *a, const void *b)
{
    return strcmp(((const param *)a)->path, ((const param *)b)->path);
}

static int parse_search(fb_sweep_spec *s, json_t *search, char *msg, size_t msg_cap)
{
    if (!json_is_object(search))
        return err_at(msg, msg_cap, FB_ERR_WRONG_TYPE, "search: expected an object");
    static const char *const allowed[] = {"type", "params", "count", "seed", NULL};
    int err = only_fields(search, "search", allowed, msg, msg_cap);
    if (err) return err;
    static const char *const types[] = {"grid", "random"};
    int type = 0;
    if ((err = get_enum(search, "type", "search", true, 0, types, 2, &type, msg, msg_cap)))
        return err;
    s->type = (fb_search_type)type;
    if (s->type == FB_SEARCH_GRID) {
        if (json_object_get(search, "count") || json_object_get(search, "seed"))
            return err_at(msg, msg_cap, FB_ERR_CONFLICT,
                          "search: count and seed belong to random search, not grid");
    } else {
        if ((err = get_int(search, "count", "search", true, 0, 1, INT64_MAX, &s->count, msg,
                           msg_cap)) ||
            (err =
                 get_int(search, "seed", "search", false, 0, 0, MAX_SEED, &s->seed, msg, msg_cap)))
            return err;
        if (s->count > FB_SWEEP_MAX_TRIALS)
            return err_at(msg, msg_cap, FB_ERR_TOO_MANY_TRIALS,
                          "search.count: %lld trials, at most %d", (long long)s->count,
                          FB_SWEEP_MAX_TRIALS);
    }
    json_t *params = json_object_get(search, "params");
    if (!params)
        return err_at(msg, msg_cap, FB_ERR_MISSING_FIELD, "search.params: required field missing");
    if (!json_is_object(params))
        return err_at(msg, msg_cap, FB_ERR_WRONG_TYPE, "search.params: expected an object");
    size_t n = json_object_size(params);
    if (n < 1 || n > FB_SWEEP_MAX_PARAMS)
        return err_at(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                      "search.params: %zu parameters, allowed 1..%d", n, FB_SWEEP_MAX_PARAMS);
    const char *key;
    json_t *val;
    json_object_foreach(params, key, val)
    {
        if (!valid_path(key) || strcmp(key, "name") == 0)
            return err_at(msg, msg_cap, FB_ERR_BAD_NAME,
                          "search.params: \"%.64s\" is not a field path (parts of a-z, 0-9, '_' "
                          "joined by '.', at most %d parts; \"name\" is set per trial)",
                          key, FB_SWEEP_PATH_DEPTH);
        param *p = &s->params[s->n_params++];
        snprintf(p->path, sizeof p->path, "%s", key);
        if ((err = parse_param(val, key, s->type, p, msg, msg_cap))) return err;
    }
    qsort(s->params, (size_t)s->n_params, sizeof s->params[0], cmp_param);
    for (int i = 1; i < s->n_params; i++) {
        size_t l = strlen(s->params[i - 1].path);
        if (strncmp(s->params[i - 1].path, s->params[i].path, l) == 0 &&
            s->params[i].path[l] == '.')
            return err_at(msg, msg_cap, FB_ERR_CONFLICT, "search.params: \"%s\" lies inside \"%s\"",
                          s->params[i].path, s->params[i - 1].path);
    }
    if (s->type == FB_SEARCH_GRID) {
        int64_t total = 1;
        for (int i = 0; i < s->n_params; i++) {
            total *= (int64_t)json_array_size(s->params[i].values);
            if (total > FB_SWEEP_MAX_TRIALS)
                return err_at(msg, msg_cap, FB_ERR_TOO_MANY_TRIALS,
                              "search.params: the grid has more than %d points",
                              FB_SWEEP_MAX_TRIALS);
        }
        s->count = total;
    }
    return FB_OK;
}

/* The metrics a sweep may decide on: the training ones and the validation ones.  The test
 * metrics (test_loss, test_accuracy) are reported, never a basis for a decision. */
static const char *const metric_names[] = {"loss", "accuracy", "val_loss", "val_accuracy"};
static const char *const modes[] = {"min", "max"};

/* Reads the metric named at obj.key (field, its full name, for messages) into *metric: its
 * index in metric_names, or -1 when absent.  A test metric is refused by name. */
static int get_metric(json_t *obj, const char *key, const char *field, int *metric, char *msg,
                      size_t msg_cap)
{
    json_t *v = json_object_get(obj, key);
    *metric = -1;
    if (!v) return FB_OK;
    if (json_is_string(v) && strncmp(json_string_value(v), "test_", 5) == 0)
        return err_at(msg, msg_cap, FB_ERR_BAD_ENUM,
                      "%s: \"%.64s\" is measured on the test split, which is reported but never "
                      "decides; name a validation metric (val_loss, val_accuracy) or a training "
                      "one (loss, accuracy)",
                      field, json_string_value(v));
    if (!json_is_string(v))
        return err_at(msg, msg_cap, FB_ERR_WRONG_TYPE, "%s: expected a string", field);
    for (int i = 0; i < 4; i++)
        if (strcmp(json_string_value(v), metric_names[i]) == 0 &&
            strlen(json_string_value(v)) == json_string_length(v)) {
            *metric = i;
            return FB_OK;
        }
    return err_at(msg, msg_cap, FB_ERR_BAD_ENUM,
                  "%s: \"%.64s\" is not one of: loss, accuracy, val_loss, val_accuracy", field,
                  json_string_value(v));
}

/* Reads a mode at obj.key into *mode (-1 when absent). */
static int get_mode(json_t *obj, const char *key, const char *field, int *mode, char *msg,
                    size_t msg_cap)
{
    json_t *v = json_object_get(obj, key);
    *mode = -1;
    if (!v) return FB_OK;
    if (!json_is_string(v))
        return err_at(msg, msg_cap, FB_ERR_WRONG_TYPE, "%s: expected a string", field);
    for (int i = 0; i < 2; i++)
        if (strcmp(json_string_value(v), modes[i]) == 0 &&
            strlen(json_string_value(v)) == json_string_length(v)) {
            *mode = i;
            return FB_OK;
        }
    return err_at(msg, msg_cap, FB_ERR_BAD_ENUM, "%s: \"%.64s\" is not one of: min, max", field,
                  json_string_value(v));
}

/*
 * The sweep's metric and mode: the top-level "metric" and "mode", else early_stopping's,
 * else val_accuracy (max) for a cross-entropy base and val_loss (min) for an MSE one.  Where
 * both name one they must agree: ASHA decides on the sweep's metric.
 */
static int parse_metric(fb_sweep_spec *s, json_t *root, char *msg, size_t msg_cap)
{
    json_t *es = json_object_get(root, "early_stopping");
    if (!json_is_object(es)) es = NULL;
    int metric, mode, es_metric = -1, es_mode = -1, err;
    if ((err = get_metric(root, "metric", "metric", &metric, msg, msg_cap)) ||
        (err = get_mode(root, "mode", "mode", &mode, msg, msg_cap)) ||
        (es &&
         (err = get_metric(es, "metric", "early_stopping.metric", &es_metric, msg, msg_cap))) ||
        (es && (err = get_mode(es, "mode", "early_stopping.mode", &es_mode, msg, msg_cap))))
        return err;
    if (metric >= 0 && es_metric >= 0 && metric != es_metric)
        return err_at(msg, msg_cap, FB_ERR_CONFLICT,
                      "early_stopping.metric: %s differs from the sweep's metric %s (ASHA "
                      "decides on the sweep's metric; give one)",
                      metric_names[es_metric], metric_names[metric]);
    if (metric < 0) metric = es_metric;
    if (metric < 0) {
        json_t *loss = json_object_get(s->base, "loss");
        bool mse = json_is_string(loss) && strcmp(json_string_value(loss), "mse") == 0;
        metric = mse ? 2 : 3; /* val_loss, val_accuracy */
    }
    int def_mode = strstr(metric_names[metric], "accuracy") ? FB_METRIC_MAX : FB_METRIC_MIN;
    if (mode >= 0 && es_mode >= 0 && mode != es_mode)
        return err_at(msg, msg_cap, FB_ERR_CONFLICT,
                      "early_stopping.mode: %s differs from the sweep's mode %s", modes[es_mode],
                      modes[mode]);
    if (mode < 0) mode = es_mode >= 0 ? es_mode : def_mode;
    snprintf(s->metric, sizeof s->metric, "%s", metric_names[metric]);
    s->mode = (fb_metric_mode)mode;
    return FB_OK;
}

static int parse_asha(fb_sweep_spec *s, json_t *es, char *msg, size_t msg_cap)
{
    if (!json_is_object(es))
        return err_at(msg, msg_cap, FB_ERR_WRONG_TYPE, "early_stopping: expected an object");
    static const char *const allowed[] = {
        "type", "metric", "mode", "grace_steps", "reduction_factor", "max_rungs", NULL};
    int err = only_fields(es, "early_stopping", allowed, msg, msg_cap);
    if (err) return err;
    static const char *const types[] = {"asha"};
    int type;
    int64_t grace, factor, rungs;
    /* metric and mode: the sweep's (parse_metric read and checked them) */
    if ((err = get_enum(es, "type", "early_stopping", true, 0, types, 1, &type, msg, msg_cap)) ||
        (err = get_int(es, "grace_steps", "early_stopping", false, 1, 1, 1000000000, &grace, msg,
                       msg_cap)) ||
        (err = get_int(es, "reduction_factor", "early_stopping", false, 3, 2, 16, &factor, msg,
                       msg_cap)) ||
        (err = get_int(es, "max_rungs", "early_stopping", false, 4, 1, 32, &rungs, msg, msg_cap)))
        return err;
    s->asha.enabled = true;
    snprintf(s->asha.metric, sizeof s->asha.metric, "%s", s->metric);
    s->asha.mode = s->mode;
    s->asha.grace_steps = grace;
    s->asha.reduction_factor = (int)factor;
    s->asha.max_rungs = (int)rungs;
    return FB_OK;
}

/* ---- expansion ---------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_unit(uint64_t *state)
{
    return (double)(splitmix64(state) >> 11) * 0x1.0p-53;
}

/* The value of parameter p in trial t (a new reference). */
static json_t *trial_value(const fb_sweep_spec *s, const param *p, int pi, int t, uint64_t *rng)
{
    if (s->type == FB_SEARCH_GRID) {
        /* mixed radix over the sorted parameters, last fastest */
        int64_t stride = 1;
        for (int k = s->n_params - 1; k > pi; k--)
            stride *= (int64_t)json_array_size(s->params[k].values);
        size_t n = json_array_size(p->values);
        return json_deep_copy(json_array_get(p->values, (size_t)((t / stride) % (int64_t)n)));
    }
    double u = next_unit(rng);
    switch (p->dist) {
    case DIST_CHOICE: {
        size_t n = json_array_size(p->values);
        size_t i = (size_t)(u * (double)n);
        return json_deep_copy(json_array_get(p->values, i < n ? i : n - 1));
    }
    case DIST_UNIFORM:
        return json_real(p->low + u * (p->high - p->low));
    case DIST_LOG_UNIFORM:
        return json_real(exp(log(p->low) + u * (log(p->high) - log(p->low))));
    case DIST_INT: {
        double span = (double)(p->ihigh - p->ilow) + 1.0;
        int64_t off = (int64_t)(u * span);
        if (off > p->ihigh - p->ilow) off = p->ihigh - p->ilow;
        return json_integer(p->ilow + off);
    }
    }
    return NULL;
}

static int expand(fb_sweep_spec *s, const fb_spec_limits *limits, char *msg, size_t msg_cap)
{
    s->trials = calloc((size_t)s->count, sizeof *s->trials);
    if (!s->trials) return err_at(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    uint64_t rng = (uint64_t)s->seed ^ 0x6675736562787377ULL; /* "fusebxsw" */
    int digits = s->count > 100 ? 3 : s->count > 10 ? 2 : 1;
    for (int t = 0; t < (int)s->count; t++) {
        json_t *job = json_deep_copy(s->base);
        json_t *values = json_object();
        if (!job || !values) {
            json_decref(job);
            json_decref(values);
            return err_at(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        }
        int err = FB_OK;
        for (int i = 0; i < s->n_params && !err; i++) {
            json_t *v = trial_value(s, &s->params[i], i, t, &rng);
            if (!v) {
                err = err_at(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
                break;
            }
            json_object_set(values, s->params[i].path, v);
            err = set_path(job, s->params[i].path, v, msg, msg_cap);
        }
        char name[FB_SPEC_NAME_MAX + 1];
        size_t base_len = strlen(s->name);
        if (base_len > FB_SPEC_NAME_MAX - 6) base_len = FB_SPEC_NAME_MAX - 6;
        snprintf(name, sizeof name, "%.*s-%0*d", (int)base_len, s->name, digits, t);
        if (!err && json_object_set_new(job, "name", json_string(name)))
            err = err_at(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        char *text = err ? NULL : json_dumps(job, JSON_COMPACT | JSON_REAL_PRECISION(17));
        if (!err && !text) err = err_at(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        json_decref(job);
        if (!err) {
            char inner[400];
            err = fb_job_spec_parse(text, strlen(text), limits, &s->trials[t].spec, inner,
                                    sizeof inner);
            if (err) {
                char *vals = json_dumps(values, JSON_COMPACT | JSON_SORT_KEYS);
                err_at(msg, msg_cap, err, "base.%s (in trial %d, %s)", inner, t, vals ? vals : "");
                free(vals);
            }
        }
        free(text);
        if (!err) {
            s->trials[t].json = fb_job_spec_canonical(&s->trials[t].spec);
            s->trials[t].params =
                json_dumps(values, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
            if (!s->trials[t].json || !s->trials[t].params)
                err = err_at(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
            s->n_trials = t + 1;
        }
        json_decref(values);
        if (err) return err;
    }
    return FB_OK;
}

/* ---- public ---------------------------------------------------------------------- */

void fb_sweep_spec_free(fb_sweep_spec *s)
{
    if (!s) return;
    for (int t = 0; t < s->n_trials; t++) {
        fb_job_spec_free(&s->trials[t].spec);
        free(s->trials[t].json);
        free(s->trials[t].params);
    }
    free(s->trials);
    for (int i = 0; i < s->n_params; i++)
        json_decref(s->params[i].values);
    json_decref(s->base);
    free(s);
}

static bool valid_job_name(const char *n)
{
    size_t len = strlen(n);
    if (len < 1 || len > FB_SPEC_NAME_MAX) return false;
    for (size_t i = 0; i < len; i++) {
        char c = n[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

int fb_sweep_spec_parse(const char *text, size_t len, const fb_spec_limits *limits,
                        fb_sweep_spec **out, char *msg, size_t msg_cap)
{
    if (msg && msg_cap) msg[0] = '\0';
    if (!text) return err_at(msg, msg_cap, FB_ERR_JSON_SYNTAX, "empty sweep spec");
    if (len > SWEEP_MAX_BYTES)
        return err_at(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "sweep spec of %zu bytes exceeds %d", len,
                      SWEEP_MAX_BYTES);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return err_at(msg, msg_cap, FB_ERR_JSON_SYNTAX, "invalid JSON at line %d column %d: %s",
                      jerr.line, jerr.column, jerr.text);
    fb_sweep_spec *s = calloc(1, sizeof *s);
    int err;
    if (!s) {
        err = err_at(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (!json_is_object(root)) {
        err = err_at(msg, msg_cap, FB_ERR_NOT_OBJECT, "a sweep spec is a JSON object");
        goto fail;
    }
    static const char *const allowed[] = {"name", "base",           "search",
                                          "metric", "mode", "early_stopping", NULL};
    if ((err = only_fields(root, "", allowed, msg, msg_cap))) goto fail;
    json_t *base = json_object_get(root, "base");
    if (!base) {
        err = err_at(msg, msg_cap, FB_ERR_MISSING_FIELD, "base: required field missing");
        goto fail;
    }
    if (!json_is_object(base)) {
        err = err_at(msg, msg_cap, FB_ERR_WRONG_TYPE, "base: expected an object (a job spec)");
        goto fail;
    }
    s->base = json_deep_copy(base);
    json_t *name = json_object_get(root, "name");
    json_t *base_name = json_object_get(base, "name");
    if (name && !json_is_string(name)) {
        err = err_at(msg, msg_cap, FB_ERR_WRONG_TYPE, "name: expected a string");
        goto fail;
    }
    if (!name && base_name && json_is_string(base_name)) name = base_name;
    const char *nm = name ? json_string_value(name) : "sweep";
    if (!valid_job_name(nm) || (name && strlen(nm) != json_string_length(name))) {
        err = err_at(msg, msg_cap, FB_ERR_BAD_NAME,
                     "name: 1..%d bytes of letters, digits, '.', '_', '-'", FB_SPEC_NAME_MAX);
        goto fail;
    }
    snprintf(s->name, sizeof s->name, "%s", nm);
    json_t *search = json_object_get(root, "search");
    if (!search) {
        err = err_at(msg, msg_cap, FB_ERR_MISSING_FIELD, "search: required field missing");
        goto fail;
    }
    if ((err = parse_search(s, search, msg, msg_cap))) goto fail;
    if ((err = parse_metric(s, root, msg, msg_cap))) goto fail;
    json_t *es = json_object_get(root, "early_stopping");
    if (es && !json_is_null(es) && (err = parse_asha(s, es, msg, msg_cap))) goto fail;
    if ((err = expand(s, limits, msg, msg_cap))) goto fail;
    json_decref(root);
    *out = s;
    return FB_OK;
fail:
    json_decref(root);
    fb_sweep_spec_free(s);
    return err;
}

const char *fb_sweep_spec_name(const fb_sweep_spec *s)
{
    return s->name;
}

fb_search_type fb_sweep_spec_search_type(const fb_sweep_spec *s)
{
    return s->type;
}

int fb_sweep_spec_n_trials(const fb_sweep_spec *s)
{
    return s->n_trials;
}

const fb_job_spec *fb_sweep_spec_trial(const fb_sweep_spec *s, int i)
{
    return (i >= 0 && i < s->n_trials) ? &s->trials[i].spec : NULL;
}

const char *fb_sweep_spec_trial_json(const fb_sweep_spec *s, int i)
{
    return (i >= 0 && i < s->n_trials) ? s->trials[i].json : NULL;
}

const char *fb_sweep_spec_trial_params(const fb_sweep_spec *s, int i)
{
    return (i >= 0 && i < s->n_trials) ? s->trials[i].params : NULL;
}

const fb_asha_spec *fb_sweep_spec_early_stopping(const fb_sweep_spec *s)
{
    return &s->asha;
}

const char *fb_sweep_spec_metric(const fb_sweep_spec *s, fb_metric_mode *mode)
{
    if (mode) *mode = s->mode;
    return s->metric;
}

char *fb_sweep_spec_canonical(const fb_sweep_spec *s)
{
    json_t *params = json_object();
    for (int i = 0; params && i < s->n_params; i++) {
        const param *p = &s->params[i];
        json_t *o = p->dist == DIST_CHOICE
                        ? json_pack("{s:s, s:O}", "distribution", "choice", "values", p->values)
                    : p->dist == DIST_INT
                        ? json_pack("{s:s, s:I, s:I}", "distribution", "int", "low",
                                    (json_int_t)p->ilow, "high", (json_int_t)p->ihigh)
                        : json_pack("{s:s, s:f, s:f}", "distribution", dist_names[p->dist], "low",
                                    p->low, "high", p->high);
        if (!o || json_object_set_new(params, p->path, o)) {
            json_decref(params);
            return NULL;
        }
    }
    json_t *search = json_pack("{s:s, s:o?}", "type", s->type == FB_SEARCH_GRID ? "grid" : "random",
                               "params", params);
    if (search && s->type == FB_SEARCH_RANDOM) {
        json_object_set_new(search, "count", json_integer(s->count));
        json_object_set_new(search, "seed", json_integer(s->seed));
    }
    json_t *es =
        s->asha.enabled
            ? json_pack("{s:s, s:s, s:s, s:I, s:i, s:i}", "type", "asha", "metric", s->asha.metric,
                        "mode", s->asha.mode == FB_METRIC_MIN ? "min" : "max", "grace_steps",
                        (json_int_t)s->asha.grace_steps, "reduction_factor",
                        s->asha.reduction_factor, "max_rungs", s->asha.max_rungs)
            : json_null();
    json_t *root = json_pack("{s:s, s:O, s:o?, s:o?, s:s, s:s}", "name", s->name, "base", s->base,
                             "search", search, "early_stopping", es, "metric", s->metric, "mode",
                             s->mode == FB_METRIC_MIN ? "min" : "max");
    if (!root) return NULL;
    char *text = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(root);
    return text;
}
