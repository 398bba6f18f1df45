/*
 * The CUDA backend's own controls, behind a plain C ABI.
 *
 * fb_backend_cuda(device) (kernels.h) returns the backend; these functions
 * reach what only a GPU has: its streams (the communication code enqueues
 * NCCL calls on the second one), the sticky error state (the backend's ops
 * return nothing, so a failed CUDA, cuBLAS or cuDNN call is recorded here and
 * the caller asks after each step), TF32 for GEMMs and convolutions, and the
 * memory pool's counters.  Every function accepts a backend that is not the
 * CUDA backend (or NULL) and then does nothing, so callers need no #ifdef.
 */
#ifndef FB_KERNELS_CUDA_BACKEND_H
#define FB_KERNELS_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The CUDA backend of device `device` (0-based), created on first use and
 * kept for the life of the process (as the CPU backends are): a compute and
 * a communication stream, a cuBLAS and a cuDNN handle and a memory pool.
 * fb_backend_cuda(device) is this without the reason.  Returns FB_OK and sets
 * *out; FB_ERR_NOT_FOUND (no such device), FB_ERR_UNSUPPORTED (CUDA not built
 * in, or no usable driver), FB_ERR_NOMEM or FB_ERR_IO (creating a stream or
 * handle failed) with the reason in msg, *out untouched.  A failed creation
 * is retried on the next call.
 */
int fb_cuda_backend_get(int device, fb_backend **out, char *msg, size_t msg_cap);

/* Whether be is a CUDA backend (false for NULL), or a wrapper that copied a
 * CUDA backend's table and context to override some of its ops. */
bool fb_backend_is_cuda(const fb_backend *be);

/* Which stream fb_cuda_backend_stream returns. */
enum { FB_CUDA_STREAM_COMPUTE = 0, FB_CUDA_STREAM_COMM = 1 };

/*
 * The cudaStream_t (as void *) of the CUDA backend be: FB_CUDA_STREAM_COMPUTE
 * runs every op; FB_CUDA_STREAM_COMM is created for collectives, so they can
 * overlap compute (the caller orders the two with events).  NULL when be is
 * not a CUDA backend or `which` is neither.  The stream belongs to the
 * backend; never destroy it.
 */
void *fb_cuda_backend_stream(fb_backend *be, int which);

/*
 * The first CUDA, cuBLAS or cuDNN failure since the backend was created (or
 * since fb_cuda_backend_clear_error): returns FB_OK when there was none, else
 * its fb_err code (FB_ERR_NOMEM when device memory ran out, FB_ERR_DATA when a
 * label was outside [0, K), FB_ERR_IO otherwise) with the message in msg
 * (capacity cap, NUL-terminated when cap > 0).  Once an error is recorded
 * every op of the backend does nothing, so a step that failed part-way never
 * reports a result as if it had succeeded: check after fb_backend_sync.
 * Synchronises the compute stream first, so errors of queued kernels are seen.
 * FB_OK for a backend that is not CUDA.
 */
int fb_cuda_backend_error(fb_backend *be, char *msg, size_t msg_cap);

/* Forgets a recorded error so the backend runs ops again (after an error
 * that left the device usable, such as an out-of-range label). */
void fb_cuda_backend_clear_error(fb_backend *be);

/*
 * Lets cuBLAS and cuDNN use TF32 tensor cores for float GEMMs and
 * convolutions (the job spec's precision "tf32"): inputs are rounded to 10
 * mantissa bits, accumulation stays float.  Off by default, which keeps every
 * product in full float precision (cuBLAS default math, cuDNN FMA math).
 */
void fb_cuda_backend_set_tf32(fb_backend *be, bool on);

/* Counters of the device memory pool, and of the convolution plans (one
 * per shape, TF32 setting and FUSEBOX_CUDNN_SEARCH mode) and their timed
 * algorithm searches (one per direction of a plan, on its first call). */
typedef struct fb_cuda_pool_stats {
    uint64_t device_mallocs; /* cudaMalloc calls made for pool blocks */
    uint64_t reuses;         /* allocations served from a freed block */
    uint64_t bytes_live;     /* bytes in blocks handed out and not freed */
    uint64_t bytes_cached;   /* bytes in freed blocks kept for reuse */
    uint64_t bytes_scratch;  /* workspace, reduction and staging buffers */
    uint64_t conv_plans;     /* convolution plans made */
    uint64_t conv_searches;  /* timed searches run (0 with FUSEBOX_CUDNN_SEARCH=heuristic) */
} fb_cuda_pool_stats;

/* Fills *out with the pool's counters; zeroes it for a non-CUDA backend. */
void fb_cuda_backend_pool_stats(fb_backend *be, fb_cuda_pool_stats *out);

/* Returns the freed blocks the pool keeps to the device (cudaFree), after
 * waiting for queued work.  Live allocations are not affected. */
void fb_cuda_backend_trim(fb_backend *be);

#ifdef __cplusplus
}
#endif

#endif
