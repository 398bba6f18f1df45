/*
 * Memory of the CPU backends: plain host memory, 64-byte aligned and zeroed
 * on allocation, so that upload, download and copy are all memcpy.
 */
#include "cpu.h"

#include <string.h>

/* Zeroed host memory of `bytes` (at least one cache line), aligned to 64. */
void *fb_cpumem_alloc(fb_backend_t *be, size_t bytes)
{
    (void)be;
    size_t rounded = bytes ? (bytes + 63) / 64 * 64 : 64;
    if (rounded < bytes) return NULL; /* overflow */
    void *p = aligned_alloc(64, rounded);
    if (p) memset(p, 0, rounded);
    return p;
}

/* Releases memory from fb_cpumem_alloc (free accepts NULL). */
void fb_cpumem_free(fb_backend_t *be, void *p)
{
    (void)be;
    free(p);
}

/* Sets bytes at p to zero. */
void fb_cpumem_zero(fb_backend_t *be, void *p, size_t bytes)
{
    (void)be;
    memset(p, 0, bytes);
}

/* Copies bytes from src to dst; serves copy, upload and download alike,
 * since backend memory is host memory. */
void fb_cpumem_copy(fb_backend_t *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memmove(dst, src, bytes);
}
