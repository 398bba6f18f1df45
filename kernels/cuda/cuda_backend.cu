/*
 * The CUDA backend: creation, error recording, the device memory pool, host
 * argument staging, the memory functions of the interface and the op table.
 * The ops themselves live in cuda_blas.cu, cuda_conv.cu and cuda_ops.cu.
 *
 * Compiled as C++ by nvcc; everything public is extern "C".
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* ---- errors -------------------------------------------------------------- */

int fbc_fail(struct fbc_ctx *c, int err, const char *fmt, ...)
{
    if (c->err != FB_OK) return err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
    va_end(ap);
    c->err = err;
    fprintf(stderr, "fusebox cuda backend (device %d): %s\n", c->device, c->err_msg);
    return err;
}

/* Strips the directory from __FILE__ for messages. */
static const char *fbc_base(const char *file)
{
    const char *s = strrchr(file, '/');
    return s ? s + 1 : file;
}

bool fbc_cuda_ok(struct fbc_ctx *c, cudaError_t e, const char *what, const char *file, int line)
{
    if (e == cudaSuccess) return true;
    (void)cudaGetLastError();
    fbc_fail(c, e == cudaErrorMemoryAllocation ? FB_ERR_NOMEM : FB_ERR_IO, "%s:%d: %s: %s (%s)",
             fbc_base(file), line, what, cudaGetErrorName(e), cudaGetErrorString(e));
    return false;
}

bool fbc_blas_ok(struct fbc_ctx *c, cublasStatus_t s, const char *what, const char *file, int line)
{
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    fbc_fail(c, s == CUBLAS_STATUS_ALLOC_FAILED ? FB_ERR_NOMEM : FB_ERR_IO, "%s:%d: %s: %s",
             fbc_base(file), line, what, cublasGetStatusString(s));
    return false;
}

bool fbc_dnn_ok(struct fbc_ctx *c, cudnnStatus_t s, const char *what, const char *file, int line)
{
    if (s == CUDNN_STATUS_SUCCESS) return true;
    fbc_fail(c, s == CUDNN_STATUS_ALLOC_FAILED ? FB_ERR_NOMEM : FB_ERR_IO, "%s:%d: %s: %s",
             fbc_base(file), line, what, cudnnGetErrorString(s));
    return false;
}

struct fbc_ctx *fbc_begin(fb_backend *be)
{
    struct fbc_ctx *c = fbc_ctx_of(be);
    if (c->err != FB_OK) return NULL;
    if (!FBC_CUDA(c, cudaSetDevice(c->device))) return NULL;
    return c;
}

/* ---- grow-only buffers and staging ---------------------------------------- */

void *fbc_buf_get(struct fbc_ctx *c, struct fbc_buf *buf, size_t bytes, const char *what)
{
    if (bytes <= buf->bytes && buf->ptr) return buf->ptr;
    /* Grow by half again, so a slowly rising size does not reallocate every
     * time; round to 1 MiB. */
    size_t want = bytes + bytes / 2;
    want = (want + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
    if (want < bytes) return NULL; /* overflow */
    /* Queued kernels may still read the old buffer. */
    if (!FBC_CUDA(c, cudaStreamSynchronize(c->stream))) return NULL;
    if (buf->ptr) {
        if (!FBC_CUDA(c, cudaFree(buf->ptr))) return NULL;
        c->stats.bytes_scratch -= buf->bytes;
        buf->ptr = NULL;
        buf->bytes = 0;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        fbc_fail(c, FB_ERR_NOMEM, "cudaMalloc of %zu bytes for the %s failed: %s", want, what,
                 cudaGetErrorString(e));
        return NULL;
    }
    buf->ptr = p;
    buf->bytes = want;
    c->stats.bytes_scratch += want;
    c->stats.device_mallocs++;
    return p;
}

/* Queues a host-to-device copy on the compute stream.  The host memory may
 * be reused when this returns: from pageable memory the runtime has already
 * copied it into its own staging area; from page-locked memory (which the
 * DMA reads later) we wait for the copy. */
static bool fbc_h2d(struct fbc_ctx *c, void *dst, const void *host, size_t bytes)
{
    cudaPointerAttributes attr;
    bool locked = false;
    if (cudaPointerGetAttributes(&attr, host) == cudaSuccess)
        locked = attr.type == cudaMemoryTypeHost || attr.type == cudaMemoryTypeManaged;
    else
        (void)cudaGetLastError();
    if (!FBC_CUDA(c, cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, c->stream)))
        return false;
    if (locked && !FBC_CUDA(c, cudaStreamSynchronize(c->stream))) return false;
    return true;
}

void *fbc_stage(struct fbc_ctx *c, size_t off, const void *host, size_t bytes)
{
    if (off % 16 != 0 || !c->stage.ptr || off > c->stage.bytes || bytes > c->stage.bytes - off) {
        fbc_fail(c, FB_ERR_INTERNAL, "staging %zu bytes at %zu overruns the %zu-byte buffer", bytes,
                 off, c->stage.bytes);
        return NULL;
    }
    char *dst = (char *)c->stage.ptr + off;
    if (bytes && !fbc_h2d(c, dst, host, bytes)) return NULL;
    return dst;
}

/* ---- memory pool ------------------------------------------------------------ */

/* Size class of a request: 256-byte granules up to 1 MiB, then 1 MiB
 * granules, so a freed block serves later requests of about its size. */
static size_t pool_class(size_t bytes)
{
    size_t g = bytes <= ((size_t)1 << 20) ? 256 : ((size_t)1 << 20);
    if (bytes == 0) return 256;
    if (bytes > SIZE_MAX - g) return 0;
    return (bytes + g - 1) / g * g;
}

static size_t pool_bucket(const void *p)
{
    return ((uintptr_t)p >> 8) % FBC_LIVE_BUCKETS;
}

/* Frees every cached block; the caller holds the lock and has synchronised. */
static void pool_release_cached(struct fbc_ctx *c)
{
    while (c->cached) {
        struct fbc_block *b = c->cached;
        c->cached = b->next;
        if (cudaFree(b->ptr) != cudaSuccess) (void)cudaGetLastError();
        c->stats.bytes_cached -= b->bytes;
        free(b);
    }
}

/* Zeroed device memory of `bytes` from the pool: a cached block of the same
 * class or at most a quarter larger when there is one, else a new cudaMalloc
 * (after returning the cache to the device if memory ran out).  NULL on
 * failure, which is not a sticky error: the caller reports it. */
static void *cuda_alloc(fb_backend *be, size_t bytes)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c) return NULL;
    size_t need = pool_class(bytes);
    if (!need) return NULL;
    pthread_mutex_lock(&c->lock);
    struct fbc_block **best = NULL;
    for (struct fbc_block **pp = &c->cached; *pp; pp = &(*pp)->next) {
        size_t have = (*pp)->bytes;
        if (have >= need && have - need <= need / 4 && (!best || have < (*best)->bytes)) best = pp;
    }
    struct fbc_block *b = NULL;
    if (best) {
        b = *best;
        *best = b->next;
        c->stats.bytes_cached -= b->bytes;
        c->stats.reuses++;
    } else {
        b = (struct fbc_block *)malloc(sizeof *b);
        if (!b) goto fail;
        b->bytes = need;
        b->ptr = NULL;
        cudaError_t e = cudaMalloc(&b->ptr, need);
        if (e == cudaErrorMemoryAllocation && c->cached) {
            (void)cudaGetLastError();
            if (cudaStreamSynchronize(c->stream) != cudaSuccess) (void)cudaGetLastError();
            pool_release_cached(c);
            e = cudaMalloc(&b->ptr, need);
        }
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            free(b);
            b = NULL;
            goto fail;
        }
        c->stats.device_mallocs++;
    }
    if (cudaMemsetAsync(b->ptr, 0, need, c->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        b->next = c->cached;
        c->cached = b;
        c->stats.bytes_cached += b->bytes;
        goto fail;
    }
    b->next = c->live[pool_bucket(b->ptr)];
    c->live[pool_bucket(b->ptr)] = b;
    c->stats.bytes_live += b->bytes;
    pthread_mutex_unlock(&c->lock);
    return b->ptr;
fail:
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* Returns a block to the pool's cache.  Kernels still queued on the compute
 * stream that use it run before any later reuse, since every op is on that
 * stream.  A pointer the pool did not hand out is an invariant failure. */
static void cuda_free(fb_backend *be, void *p)
{
    struct fbc_ctx *c = fbc_ctx_of(be);
    pthread_mutex_lock(&c->lock);
    struct fbc_block **pp = &c->live[pool_bucket(p)];
    while (*pp && (*pp)->ptr != p)
        pp = &(*pp)->next;
    FB_ASSERT(*pp != NULL && "fb_backend_free: pointer not from this CUDA backend");
    struct fbc_block *b = *pp;
    *pp = b->next;
    c->stats.bytes_live -= b->bytes;
    b->next = c->cached;
    c->cached = b;
    c->stats.bytes_cached += b->bytes;
    pthread_mutex_unlock(&c->lock);
}

void *fbc_pool_alloc(fb_backend *be, size_t bytes)
{
    return cuda_alloc(be, bytes);
}

void fbc_pool_free(fb_backend *be, void *p)
{
    if (p) cuda_free(be, p);
}

static void cuda_zero(fb_backend *be, void *p, size_t bytes)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c) return;
    FBC_CUDA(c, cudaMemsetAsync(p, 0, bytes, c->stream));
}

static void cuda_copy(fb_backend *be, void *dst, const void *src, size_t bytes)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c) return;
    FBC_CUDA(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

static void cuda_upload(fb_backend *be, void *dst, const void *host, size_t bytes)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c) return;
    fbc_h2d(c, dst, host, bytes);
}

/* Waits for the copy (the caller reads host right after).  On a recorded
 * error host is left as it was. */
static void cuda_download(fb_backend *be, void *host, const void *src, size_t bytes)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c) return;
    if (!FBC_CUDA(c, cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, c->stream))) return;
    FBC_CUDA(c, cudaStreamSynchronize(c->stream));
}

/* Waits for queued work and turns a kernel's bad-input flag into an error
 * (the first bit names the cause; the flag is cleared). */
static void cuda_sync(fb_backend *be)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c) return;
    int flag = 0;
    if (!FBC_CUDA(c, cudaMemcpyAsync(&flag, c->flag, sizeof flag, cudaMemcpyDeviceToHost,
                                     c->stream)))
        return;
    if (!FBC_CUDA(c, cudaStreamSynchronize(c->stream))) return;
    if (flag) {
        if (flag & FBC_FLAG_LABEL)
            fbc_fail(c, FB_ERR_DATA, "softmax_xent: a label is outside [0, K)");
        else
            fbc_fail(c, FB_ERR_DATA, "embedding: a token id is outside [0, V)");
        FBC_CUDA(c, cudaMemsetAsync(c->flag, 0, sizeof *c->flag, c->stream));
    }
}

/* ---- the table -------------------------------------------------------------- */

static const struct fb_backend_ops fb_cuda_ops = {
    .alloc = cuda_alloc,
    .free = cuda_free,
    .zero = cuda_zero,
    .copy = cuda_copy,
    .upload = cuda_upload,
    .download = cuda_download,
    .sync = cuda_sync,
    .set_threads = NULL, /* the host side is one thread */
    .linear_forward = fbc_linear_forward,
    .linear_backward = fbc_linear_backward,
    .conv2d_scratch_floats = NULL, /* cuDNN workspace is the backend's own */
    .conv2d_forward = fbc_conv2d_forward,
    .conv2d_backward = fbc_conv2d_backward,
    .maxpool2d_forward = fbc_maxpool2d_forward,
    .maxpool2d_backward = fbc_maxpool2d_backward,
    .maxpool2d_backward_set = NULL, /* kernels.h: zeroed, then added into */
    .avgpool2d_forward = fbc_avgpool2d_forward,
    .avgpool2d_backward = fbc_avgpool2d_backward,
    .global_avgpool_forward = fbc_global_avgpool_forward,
    .global_avgpool_backward = fbc_global_avgpool_backward,
    .act_forward = fbc_act_forward,
    .act_backward = fbc_act_backward,
    .act_backward_set = NULL,
    .add_forward = fbc_add_forward,
    .accumulate = fbc_accumulate,
    .dropout_forward = fbc_dropout_forward,
    .dropout_backward = fbc_dropout_backward,
    .batchnorm_forward_train = fbc_batchnorm_forward_train,
    .batchnorm_forward_eval = fbc_batchnorm_forward_eval,
    .batchnorm_backward = fbc_batchnorm_backward,
    .layernorm_forward = fbc_layernorm_forward,
    .layernorm_backward = fbc_layernorm_backward,
    .embedding_forward = fbc_embedding_forward,
    .embedding_backward = fbc_embedding_backward,
    .positional_forward = fbc_positional_forward,
    .positional_backward = fbc_positional_backward,
    .attention_scratch_floats = fbc_attention_scratch_floats,
    .attention_forward = fbc_attention_forward,
    .attention_backward = fbc_attention_backward,
    .seq_pool_forward = fbc_seq_pool_forward,
    .seq_pool_backward = fbc_seq_pool_backward,
    .softmax_xent = fbc_softmax_xent,
    .mse = fbc_mse,
    .optim_step = fbc_optim_step,
    .round_bf16 = fbc_round_bf16,
    .grad_unscale = fbc_grad_unscale,
    .scale_members = fbc_scale_members,
    .sgemm = fbc_sgemm,
};

/* ---- creation ---------------------------------------------------------------- */

#define FBC_MAX_DEVICES 64

static pthread_mutex_t fbc_create_lock = PTHREAD_MUTEX_INITIALIZER;
static fb_backend *fbc_backends[FBC_MAX_DEVICES];

static int create_errf(char *msg, size_t msg_cap, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int create_errf(char *msg, size_t msg_cap, int err, const char *fmt, ...)
{
    if (msg && msg_cap > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msg_cap, fmt, ap);
        va_end(ap);
    }
    return err;
}

/* Destroys what create_backend made so far (ctx fields may be NULL). */
static void destroy_ctx(struct fbc_ctx *c)
{
    if (!c) return;
    if (c->dnn) cudnnDestroy(c->dnn);
    if (c->blas) cublasDestroy(c->blas);
    if (c->flag) cudaFree(c->flag);
    for (int i = 0; i < 2; i++)
        if (c->ev[i]) cudaEventDestroy(c->ev[i]);
    if (c->comm_stream) cudaStreamDestroy(c->comm_stream);
    if (c->stream) cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    pthread_mutex_destroy(&c->lock);
    free(c);
}

#define CREATE_CUDA(call)                                                                          \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            (void)cudaGetLastError();                                                              \
            rc = create_errf(                                                                      \
                msg, msg_cap, e_ == cudaErrorMemoryAllocation ? FB_ERR_NOMEM : FB_ERR_IO,          \
                "CUDA device %d: %s failed: %s", device, #call, cudaGetErrorString(e_));           \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

static int create_backend(int device, fb_backend **out, char *msg, size_t msg_cap)
{
    struct fbc_ctx *c = NULL;
    fb_backend *be = NULL;
    cudaDeviceProp prop;
    cublasStatus_t bs;
    cudnnStatus_t ds;
    int n = 0, rc = FB_OK;

    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return create_errf(msg, msg_cap,
                           e == cudaErrorNoDevice ? FB_ERR_NOT_FOUND : FB_ERR_UNSUPPORTED,
                           "CUDA: no usable device: %s", cudaGetErrorString(e));
    }
    if (device < 0 || device >= n || device >= FBC_MAX_DEVICES)
        return create_errf(msg, msg_cap, FB_ERR_NOT_FOUND,
                           "CUDA device %d does not exist (%d present)", device, n);
    /* the convolutions read it again at each call (cuda_conv.cu); a value they would refuse
     * stops the backend here, so that a worker with it does not start, rather than fail
     * every convolution job it takes */
    const char *search = getenv("FUSEBOX_CUDNN_SEARCH");
    if (search && *search && strcmp(search, "timed") != 0 && strcmp(search, "heuristic") != 0)
        return create_errf(msg, msg_cap, FB_ERR_BAD_ENUM,
                           "FUSEBOX_CUDNN_SEARCH=\"%.40s\": expected \"timed\" or \"heuristic\"",
                           search);

    c = (struct fbc_ctx *)calloc(1, sizeof *c);
    be = (fb_backend *)calloc(1, sizeof *be);
    if (!c || !be) {
        free(be);
        free(c);
        return create_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    }
    c->device = device;
    pthread_mutex_init(&c->lock, NULL);
    CREATE_CUDA(cudaSetDevice(device));
    CREATE_CUDA(cudaGetDeviceProperties(&prop, device));
    c->sm_count = prop.multiProcessorCount;
    CREATE_CUDA(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CREATE_CUDA(cudaStreamCreateWithFlags(&c->comm_stream, cudaStreamNonBlocking));
    CREATE_CUDA(cudaMalloc((void **)&c->flag, sizeof *c->flag));
    /* On the compute stream, which does not wait for the legacy default one. */
    CREATE_CUDA(cudaMemsetAsync(c->flag, 0, sizeof *c->flag, c->stream));
    CREATE_CUDA(cudaStreamSynchronize(c->stream));
    /* For timing cuDNN's candidates (cuda_conv.cu): made here so that the
     * timed search needs nothing new in a step. */
    CREATE_CUDA(cudaEventCreate(&c->ev[0]));
    CREATE_CUDA(cudaEventCreate(&c->ev[1]));
    bs = cublasCreate(&c->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        rc = create_errf(msg, msg_cap, bs == CUBLAS_STATUS_ALLOC_FAILED ? FB_ERR_NOMEM : FB_ERR_IO,
                         "cuBLAS: cublasCreate failed: %s", cublasGetStatusString(bs));
        goto fail;
    }
    bs = cublasSetStream(c->blas, c->stream);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        rc = create_errf(msg, msg_cap, FB_ERR_IO, "cuBLAS: setting stream or math mode failed: %s",
                         cublasGetStatusString(bs));
        goto fail;
    }
    ds = cudnnCreate(&c->dnn);
    if (ds != CUDNN_STATUS_SUCCESS) {
        c->dnn = NULL;
        rc = create_errf(msg, msg_cap, FB_ERR_IO, "cuDNN: cudnnCreate failed: %s",
                         cudnnGetErrorString(ds));
        goto fail;
    }
    ds = cudnnSetStream(c->dnn, c->stream);
    if (ds != CUDNN_STATUS_SUCCESS) {
        rc = create_errf(msg, msg_cap, FB_ERR_IO, "cuDNN: cudnnSetStream failed: %s",
                         cudnnGetErrorString(ds));
        goto fail;
    }
    be->name = "cuda";
    be->ops = &fb_cuda_ops;
    be->ctx = c;
    *out = be;
    return FB_OK;
fail:
    destroy_ctx(c);
    free(be);
    return rc;
}

extern "C" int fb_cuda_backend_get(int device, fb_backend **out, char *msg, size_t msg_cap)
{
    if (!out) return create_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_cuda_backend_get: out is NULL");
    if (device < 0 || device >= FBC_MAX_DEVICES)
        return create_errf(msg, msg_cap, FB_ERR_NOT_FOUND, "CUDA device %d does not exist", device);
    pthread_mutex_lock(&fbc_create_lock);
    int rc = FB_OK;
    if (!fbc_backends[device]) {
        fb_backend *be = NULL;
        int prev = -1;
        if (cudaGetDevice(&prev) != cudaSuccess) {
            (void)cudaGetLastError();
            prev = -1;
        }
        rc = create_backend(device, &be, msg, msg_cap);
        if (prev >= 0 && prev != device && cudaSetDevice(prev) != cudaSuccess)
            (void)cudaGetLastError();
        if (rc == FB_OK) fbc_backends[device] = be;
    }
    if (rc == FB_OK) *out = fbc_backends[device];
    pthread_mutex_unlock(&fbc_create_lock);
    return rc;
}

extern "C" fb_backend *fb_backend_cuda(int device)
{
    fb_backend *be = NULL;
    char msg[256];
    return fb_cuda_backend_get(device, &be, msg, sizeof msg) == FB_OK ? be : NULL;
}

/* By the table's memory functions rather than the table itself: a wrapper
 * that copies the table and the context to override a few ops (the
 * data-parallel ranks of workers/data_parallel.c do) is still this backend. */
extern "C" bool fb_backend_is_cuda(const fb_backend *be)
{
    return be && be->ops && be->ops->sync == cuda_sync && be->ops->alloc == cuda_alloc && be->ctx;
}

/* ---- the controls of cuda_backend.h ------------------------------------------ */

extern "C" void *fb_cuda_backend_stream(fb_backend *be, int which)
{
    if (!fb_backend_is_cuda(be)) return NULL;
    struct fbc_ctx *c = fbc_ctx_of(be);
    if (which == FB_CUDA_STREAM_COMPUTE) return (void *)c->stream;
    if (which == FB_CUDA_STREAM_COMM) return (void *)c->comm_stream;
    return NULL;
}

extern "C" int fb_cuda_backend_error(fb_backend *be, char *msg, size_t msg_cap)
{
    if (!fb_backend_is_cuda(be)) return FB_OK;
    struct fbc_ctx *c = fbc_ctx_of(be);
    cuda_sync(be);
    if (c->err == FB_OK) return FB_OK;
    return create_errf(msg, msg_cap, c->err, "%s", c->err_msg);
}

extern "C" void fb_cuda_backend_clear_error(fb_backend *be)
{
    if (!fb_backend_is_cuda(be)) return;
    struct fbc_ctx *c = fbc_ctx_of(be);
    c->err = FB_OK;
    c->err_msg[0] = '\0';
}

extern "C" void fb_cuda_backend_set_tf32(fb_backend *be, bool on)
{
    if (!fb_backend_is_cuda(be)) return;
    struct fbc_ctx *c = fbc_begin(be);
    if (!c) return;
    if (FBC_BLAS(c, cublasSetMathMode(c->blas, on ? CUBLAS_TF32_TENSOR_OP_MATH
                                                  : CUBLAS_DEFAULT_MATH)))
        c->tf32 = on ? 1 : 0; /* conv plans are keyed by it and made anew */
}

extern "C" void fb_cuda_backend_pool_stats(fb_backend *be, fb_cuda_pool_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!fb_backend_is_cuda(be)) return;
    struct fbc_ctx *c = fbc_ctx_of(be);
    pthread_mutex_lock(&c->lock);
    *out = c->stats;
    pthread_mutex_unlock(&c->lock);
}

extern "C" void fb_cuda_backend_trim(fb_backend *be)
{
    if (!fb_backend_is_cuda(be)) return;
    struct fbc_ctx *c = fbc_begin(be);
    if (!c) return;
    if (!FBC_CUDA(c, cudaStreamSynchronize(c->stream))) return;
    pthread_mutex_lock(&c->lock);
    pool_release_cached(c);
    pthread_mutex_unlock(&c->lock);
}
