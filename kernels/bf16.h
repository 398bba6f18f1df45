/*
 * bfloat16 rounding, the one definition every backend uses for a job spec's
 * "precision": "bf16".
 *
 * bf16 keeps float's sign and 8-bit exponent and the top 7 of its 23 mantissa
 * bits, so a bf16 value is a float whose low 16 bits are zero.  The engine
 * rounds the operands of linear and convolution products to bf16 and keeps
 * everything else in float (docs/jobspec.md, docs/cuda.md "Precision").  The
 * function is plain C on the bits and compiles for the host and, inside
 * kernels/cuda, for the device, so the CPU backends and CUDA round the same
 * way bit for bit.
 */
#ifndef FB_KERNELS_BF16_H
#define FB_KERNELS_BF16_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FB_BF16_HD __host__ __device__
#else
#define FB_BF16_HD
#endif

/*
 * x rounded to the nearest bfloat16, ties to even, returned as a float.
 * Subnormals round like any other value (the bits carry over); a value above
 * the largest bf16 rounds to infinity of its sign; infinities stay; a NaN
 * stays a NaN (made quiet, sign kept), since plain rounding could carry a NaN
 * whose payload lies only in the low bits into an infinity.
 */
static inline FB_BF16_HD float fb_bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        u = (u | 0x00400000u) & 0xffff0000u;
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        u &= 0xffff0000u;
    }
    memcpy(&x, &u, sizeof x);
    return x;
}

#endif
