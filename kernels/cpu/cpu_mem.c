/*
 * Memory of the CPU backends: plain host memory, 64-byte aligned and zeroed
 * on allocation, so that upload, download and copy are all memcpy.
 *
 * Zeroed memory comes from calloc, which gets large blocks straight from the
 * kernel as pages that are already zero and are not resident until first
 * written: parts of a slab that a run never touches (a slab sized for larger
 * batches than the run trains on, say) cost no memory, and allocating costs
 * no pass over it.
 * The block is over-allocated by one cache line and the pointer calloc gave
 * is kept just below the aligned one, for free.
 */
#include "cpu.h"

#include <stdint.h>
#include <string.h>

/* Zeroed host memory of `bytes` (at least one cache line), aligned to 64. */
void *fb_cpumem_alloc(fb_backend *be, size_t bytes)
{
    (void)be;
    size_t rounded = bytes ? (bytes + 63) / 64 * 64 : 64;
    if (rounded < bytes || rounded > SIZE_MAX - 64 - sizeof(void *)) return NULL; /* overflow */
    void *raw = calloc(1, rounded + 64 + sizeof(void *));
    if (!raw) return NULL;
    uintptr_t p = ((uintptr_t)raw + sizeof(void *) + 63) & ~(uintptr_t)63;
    memcpy((char *)p - sizeof(void *), &raw, sizeof raw);
    return (void *)p;
}

/* Releases memory from fb_cpumem_alloc; accepts NULL. */
void fb_cpumem_free(fb_backend *be, void *p)
{
    (void)be;
    if (!p) return;
    void *raw;
    memcpy(&raw, (char *)p - sizeof(void *), sizeof raw);
    free(raw);
}

/* Sets bytes at p to zero. */
void fb_cpumem_zero(fb_backend *be, void *p, size_t bytes)
{
    (void)be;
    memset(p, 0, bytes);
}

/* Copies bytes from src to dst; serves copy, upload and download alike,
 * since backend memory is host memory. */
void fb_cpumem_copy(fb_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memmove(dst, src, bytes);
}
