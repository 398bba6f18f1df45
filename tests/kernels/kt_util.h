/*
 * Helpers shared by the kernel tests: reproducible random numbers (the
 * kernels' own counter-based generator with a fixed seed) and guarded
 * buffers, whose canary floats before and after the payload reveal any
 * out-of-bounds write by an op.
 */
#ifndef FB_TESTS_KT_UTIL_H
#define FB_TESTS_KT_UTIL_H

#include "check.h"
#include "kernels.h"
#include "rng.h"

#include <stdbool.h>
#include <stdint.h>

#define KT_SEED 20240611ULL
#define KT_GUARD 16           /* canary floats on each side (64 bytes keeps alignment) */
#define KT_CANARY 0x7fb1e55eu /* a NaN no op produces */

static uint64_t kt_counter;

/* Uniform float in [lo, hi) from the fixed-seed stream. */
static inline float kt_uniform(float lo, float hi)
{
    return lo + (hi - lo) * fb_rng_uniform(KT_SEED, 7, kt_counter++);
}

/* Uniform integer in [0, n). */
static inline int kt_int(int n)
{
    return (int)(fb_rng_u64(KT_SEED, 8, kt_counter++) % (uint64_t)n);
}

/* malloc'd array of n uniforms in [lo, hi). */
static inline float *kt_rand(size_t n, float lo, float hi)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    CHECK(p != NULL);
    for (size_t i = 0; i < n; i++)
        p[i] = kt_uniform(lo, hi);
    return p;
}

/* A payload of n floats between two canary regions; free with
 * kt_guarded_free.  The payload is zeroed. */
static inline float *kt_guarded_new(size_t n)
{
    size_t total = n + 2 * KT_GUARD, bytes = (total * sizeof(float) + 63) / 64 * 64;
    float *base = aligned_alloc(64, bytes);
    CHECK(base != NULL);
    uint32_t canary = KT_CANARY;
    for (size_t i = 0; i < KT_GUARD; i++) {
        memcpy(&base[i], &canary, 4);
        memcpy(&base[KT_GUARD + n + i], &canary, 4);
    }
    memset(base + KT_GUARD, 0, n * sizeof(float));
    return base + KT_GUARD;
}

/* Whether both canary regions of a guarded buffer are intact. */
static inline bool kt_guarded_ok(const float *p, size_t n)
{
    uint32_t canary = KT_CANARY, v;
    for (size_t i = 1; i <= KT_GUARD; i++) {
        memcpy(&v, p - i, 4);
        if (v != canary) return false;
        memcpy(&v, p + n + i - 1, 4);
        if (v != canary) return false;
    }
    return true;
}

static inline void kt_guarded_free(float *p)
{
    if (p) free(p - KT_GUARD);
}

/* max |a - b| / max(1, max |b|) over finite pairs; *nan_ok tells whether NaN
 * and +-Inf sit at the same positions with the same sign in both. */
static inline double kt_norm_err(const float *a, const float *b, size_t n, bool *nan_ok)
{
    double md = 0.0, mb = 1.0;
    *nan_ok = true;
    for (size_t i = 0; i < n; i++) {
        bool fa = isfinite(a[i]), fb = isfinite(b[i]);
        if (!fa || !fb) {
            if (fa != fb || isnan(a[i]) != isnan(b[i]) || (isinf(a[i]) && (a[i] > 0) != (b[i] > 0)))
                *nan_ok = false;
            continue;
        }
        double d = fabs((double)a[i] - b[i]);
        if (d > md) md = d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return md / mb;
}

#endif
