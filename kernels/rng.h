/*
 * Counter-based random numbers shared by every backend.
 *
 * A value depends only on (seed, stream, counter), so a CPU and a GPU, or a
 * member trained alone and inside an array, draw exactly the same numbers.
 * The mixer is SplitMix64's finaliser applied to a combination of the three.
 */
#ifndef FB_KERNELS_RNG_H
#define FB_KERNELS_RNG_H

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define FB_RNG_FN static __host__ __device__ inline
#else
#define FB_RNG_FN static inline
#endif

FB_RNG_FN uint64_t fb_rng_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

FB_RNG_FN uint64_t fb_rng_u64(uint64_t seed, uint64_t stream, uint64_t counter)
{
    return fb_rng_mix64(fb_rng_mix64(fb_rng_mix64(seed) ^ stream) + counter);
}

/* Uniform float in [0, 1) with 24 random bits. */
FB_RNG_FN float fb_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter)
{
    return (float)(fb_rng_u64(seed, stream, counter) >> 40) * (1.0f / 16777216.0f);
}

/* Standard normal by Box-Muller from two uniforms drawn at counters
 * 2*counter and 2*counter + 1. */
FB_RNG_FN float fb_rng_normal(uint64_t seed, uint64_t stream, uint64_t counter)
{
    float u1 = fb_rng_uniform(seed, stream, 2 * counter) + (1.0f / 33554432.0f);
    float u2 = fb_rng_uniform(seed, stream, 2 * counter + 1);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

#endif
