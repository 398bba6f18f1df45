/*
 * Helpers shared by the engine tests: job specs parsed from JSON text, a
 * small synthetic image dataset with a learnable rule, scratch directories,
 * and comparison of two safetensors weights files by normalised error.
 */
#ifndef FB_TESTS_ENGINE_UTIL_H
#define FB_TESTS_ENGINE_UTIL_H

#include "check.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "idx.h"
#include "jobspec.h"
#include "safetensors.h"

/* splitmix64: the tests' own reproducible generator, independent of the engine's. */
static inline uint64_t et_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Uniform float in [0, 1). */
static inline float et_uniform(uint64_t *state)
{
    return (float)(et_next(state) >> 40) * (1.0f / 16777216.0f);
}

static inline double et_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Parses a spec from printf-formatted JSON; a spec the test meant to be valid
 * that the parser rejects fails the test with the parser's message. */
static inline fb_job_spec *et_spec(const char *fmt, ...)
{
    char json[4096], msg[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(json, sizeof json, fmt, ap);
    va_end(ap);
    CHECK(n > 0 && (size_t)n < sizeof json);
    fb_job_spec *s = calloc(1, sizeof *s);
    CHECK(s != NULL);
    int err = fb_job_spec_parse(json, strlen(json), NULL, s, msg, sizeof msg);
    if (err) {
        fprintf(stderr, "spec rejected (%s): %s\n%s\n", fb_err_code(err), msg, json);
        abort();
    }
    return s;
}

static inline void et_spec_free(fb_job_spec *s)
{
    fb_job_spec_free(s);
    free(s);
}

/*
 * n samples of [1, side, side] in [0, 1) with labels in [0, classes): the
 * label is the argmax of a fixed random linear teacher, so the rule is
 * learnable by both an MLP and a CNN.
 */
static inline fb_dataset et_synthetic(int64_t n, int side, int classes, uint64_t seed)
{
    fb_dataset ds = {.n = n, .C = 1, .H = side, .W = side, .n_classes = classes};
    int64_t F = (int64_t)side * side;
    ds.x = malloc((size_t)(n * F) * sizeof *ds.x);
    ds.y = malloc((size_t)n * sizeof *ds.y);
    float *teacher = malloc((size_t)(classes * F) * sizeof *teacher);
    CHECK(ds.x && ds.y && teacher);
    uint64_t st = seed;
    for (int64_t i = 0; i < classes * F; i++)
        teacher[i] = et_uniform(&st) * 2.0f - 1.0f;
    for (int64_t i = 0; i < n; i++) {
        float *x = ds.x + i * F;
        for (int64_t f = 0; f < F; f++)
            x[f] = et_uniform(&st);
        int best = 0;
        double best_v = -INFINITY;
        for (int k = 0; k < classes; k++) {
            double v = 0;
            for (int64_t f = 0; f < F; f++)
                v += (double)teacher[k * F + f] * x[f];
            if (v > best_v) {
                best_v = v;
                best = k;
            }
        }
        ds.y[i] = best;
    }
    free(teacher);
    return ds;
}

/* A fresh scratch directory under TMPDIR (or /tmp); path receives it. */
static inline void et_tmpdir(char *path, size_t cap, const char *tag)
{
    const char *base = getenv("TMPDIR");
    snprintf(path, cap, "%s/fb-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    CHECK(mkdtemp(path) != NULL);
}

/* Removes a directory tree the test made (plain files and directories only). */
static inline void et_rmtree(const char *path)
{
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char sub[2048];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        struct stat st;
        if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode))
            et_rmtree(sub);
        else
            unlink(sub);
    }
    closedir(d);
    rmdir(path);
}

static inline bool et_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Number of entries (other than . and ..) in a directory; -1 if it is absent. */
static inline int et_dir_entries(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

static inline fb_st_file *et_st_open(const char *path)
{
    char msg[512];
    fb_st_file *f = NULL;
    int err = fb_st_open(path, &f, msg, sizeof msg);
    if (err) {
        fprintf(stderr, "fb_st_open(%s): %s (%s)\n", path, msg, fb_err_code(err));
        abort();
    }
    return f;
}

/* A tensor's values as floats (F32 copied, integers converted); malloc'd. */
static inline double *et_st_values(const fb_st_tensor *t)
{
    double *v = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *v);
    CHECK(v != NULL);
    for (int64_t i = 0; i < t->numel; i++) {
        if (t->dtype == FB_ST_F32) {
            float f;
            memcpy(&f, t->data + 4 * i, 4);
            v[i] = f;
        } else if (t->dtype == FB_ST_I64) {
            int64_t k;
            memcpy(&k, t->data + 8 * i, 8);
            v[i] = (double)k;
        } else {
            fprintf(stderr, "tensor %s: unexpected dtype %s\n", t->name,
                    fb_st_dtype_name(t->dtype));
            abort();
        }
    }
    return v;
}

/*
 * Compares two weights files tensor by tensor: the same names, dtypes and
 * shapes, integer tensors equal, and returns the largest normalised error
 * max|a - b| / max|b| over the float tensors (worst receives its name).
 */
static inline double et_st_compare(const char *path_a, const char *path_b, char *worst,
                                   size_t worst_cap)
{
    fb_st_file *fa = et_st_open(path_a), *fb = et_st_open(path_b);
    CHECK_INT_EQ(fb_st_count(fa), fb_st_count(fb));
    double max_err = 0;
    if (worst && worst_cap) worst[0] = '\0';
    for (size_t i = 0; i < fb_st_count(fa); i++) {
        const fb_st_tensor *ta = fb_st_at(fa, i);
        const fb_st_tensor *tb = fb_st_find(fb, ta->name);
        if (!tb) {
            fprintf(stderr, "%s has tensor %s, %s does not\n", path_a, ta->name, path_b);
            abort();
        }
        CHECK_INT_EQ(ta->dtype, tb->dtype);
        CHECK_INT_EQ(ta->ndim, tb->ndim);
        for (int d = 0; d < ta->ndim; d++)
            CHECK_INT_EQ(ta->shape[d], tb->shape[d]);
        double *va = et_st_values(ta), *vb = et_st_values(tb);
        double diff = 0, scale = 0;
        for (int64_t k = 0; k < ta->numel; k++) {
            if (ta->dtype == FB_ST_I64) CHECK_INT_EQ(va[k], vb[k]);
            CHECK(isfinite(va[k]) && isfinite(vb[k]));
            diff = fmax(diff, fabs(va[k] - vb[k]));
            scale = fmax(scale, fabs(vb[k]));
        }
        double err = diff / fmax(scale, 1e-12);
        if (diff == 0) err = 0;
        if (err > max_err) {
            max_err = err;
            if (worst && worst_cap) snprintf(worst, worst_cap, "%s", ta->name);
        }
        free(va);
        free(vb);
    }
    fb_st_close(fa);
    fb_st_close(fb);
    return max_err;
}

#endif
