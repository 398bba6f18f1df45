/*
 * The NCCL backend of the communication interface (comm.h), compiled only
 * in CUDA builds.  One communicator per local device, all created in one
 * ncclGroupStart/End so that a single thread can initialise several devices;
 * each rank gets its own stream, on which its all-reduces run while the
 * device's compute stream carries on with backward.  A sum is one group call
 * over the local ranks, then a wait on their streams that also watches NCCL's
 * asynchronous error; a failed sum aborts the communicators, so that it is a
 * communication fault like a TCP one (every later sum fails at once).  NCCL
 * has no timeout of ours: a peer that hangs without its connection closing
 * can still hold a sum.
 */
#ifdef FB_HAVE_CUDA

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_impl.h"
#include "errors.h"

#define FB_COMM_MAX_LOCAL 64

typedef struct nccl_ctx {
    int n;
    int base, world; /* ranks base .. base + n - 1 of world */
    int broken; /* a sum failed and the communicators were aborted */
    int devices[FB_COMM_MAX_LOCAL];
    ncclComm_t comms[FB_COMM_MAX_LOCAL];
    cudaStream_t streams[FB_COMM_MAX_LOCAL];
} nccl_ctx;

/* Aborts every local communicator after a failure: NCCL's other ranks then fail too
 * instead of waiting for this one, and every later sum here fails at once. */
static void nccl_abort(nccl_ctx *x)
{
    for (int i = 0; i < x->n; i++)
        if (x->comms[i]) {
            ncclCommAbort(x->comms[i]);
            x->comms[i] = NULL;
        }
    x->broken = 1;
}

/* Waits for rank i's sum.  A plain stream synchronise would wait forever for a peer that
 * died; polling lets NCCL's asynchronous error (a closed connection to a peer) end the
 * wait with an error, as a TCP peer's failure does. */
static int nccl_wait(nccl_ctx *x, int i, char *msg, size_t cap)
{
    cudaSetDevice(x->devices[i]);
    for (;;) {
        cudaError_t e = cudaStreamQuery(x->streams[i]);
        if (e == cudaSuccess) return FB_OK;
        if (e != cudaErrorNotReady)
            return fb_errf(msg, cap, FB_ERR_IO, "all-reduce on device %d: %s", x->devices[i],
                           cudaGetErrorString(e));
        ncclResult_t ae = ncclSuccess;
        if (ncclCommGetAsyncError(x->comms[i], &ae) == ncclSuccess && ae != ncclSuccess &&
            ae != ncclInProgress)
            return fb_errf(msg, cap, FB_ERR_IO, "all-reduce on device %d: %s (a peer failed?)",
                           x->devices[i], ncclGetErrorString(ae));
        struct timespec ts = {0, 20 * 1000};
        nanosleep(&ts, NULL);
    }
}

static int nccl_allreduce(fb_comm_t *c, float *const *bufs, size_t n, char *msg, size_t cap)
{
    nccl_ctx *x = c->ctx;
    if (x->broken)
        return fb_errf(msg, cap, FB_ERR_IO, "the NCCL communicator failed before");
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; r == ncclSuccess && i < x->n; i++)
        r = ncclAllReduce(bufs[i], bufs[i], n, ncclFloat, ncclSum, x->comms[i], x->streams[i]);
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess) r = r2;
    if (r != ncclSuccess) {
        nccl_abort(x);
        return fb_errf(msg, cap, FB_ERR_IO, "ncclAllReduce: %s", ncclGetErrorString(r));
    }
    for (int i = 0; i < x->n; i++) {
        int err = nccl_wait(x, i, msg, cap);
        if (err) {
            nccl_abort(x);
            return err;
        }
    }
    return FB_OK;
}

static void nccl_release(nccl_ctx *x)
{
    for (int i = 0; i < x->n; i++) {
        if (x->comms[i]) ncclCommDestroy(x->comms[i]);
        if (x->streams[i]) {
            cudaSetDevice(x->devices[i]);
            cudaStreamDestroy(x->streams[i]);
        }
    }
    free(x);
}

static void nccl_free(fb_comm_t *c)
{
    if (c->ctx) nccl_release(c->ctx);
}

static const struct fb_comm_ops nccl_ops = {
    .name = "nccl",
    .host_memory = 0,
    .allreduce_sum = nccl_allreduce,
    .free = nccl_free,
};

int fb_comm_nccl_layout(const fb_comm_t *c, int *base, int *world, char *msg, size_t msg_cap)
{
    if (!c || c->ops != &nccl_ops)
        return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED, "the %s communicator is not NCCL's",
                       c ? c->ops->name : "(null)");
    const nccl_ctx *x = c->ctx;
    if (base) *base = x->base;
    if (world) *world = x->world;
    return FB_OK;
}

int fb_comm_nccl_unique_id(unsigned char id[FB_COMM_ID_BYTES], char *msg, size_t msg_cap)
{
    ncclUniqueId u;
    _Static_assert(sizeof u == FB_COMM_ID_BYTES, "NCCL's unique id changed size");
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED, "ncclGetUniqueId: %s",
                       ncclGetErrorString(r));
    memcpy(id, &u, sizeof u);
    return FB_OK;
}

int fb_comm_nccl_new(int n_local, const int *devices, int base, int world,
                     const unsigned char id[FB_COMM_ID_BYTES], fb_comm_t **out, char *msg,
                     size_t msg_cap)
{
    if (!out || !devices || !id)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "missing argument");
    if (n_local < 1 || n_local > FB_COMM_MAX_LOCAL || world < n_local || base < 0 ||
        base + n_local > world)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "ranks %d..%d do not fit a world of %d", base, base + n_local - 1, world);
    int prev = 0;
    cudaGetDevice(&prev);
    fb_comm_t *c = calloc(1, sizeof *c);
    nccl_ctx *x = calloc(1, sizeof *x);
    int err = FB_OK;
    if (!c || !x) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    x->n = n_local;
    x->base = base;
    x->world = world;
    for (int i = 0; i < n_local; i++) {
        x->devices[i] = devices[i];
        cudaSetDevice(devices[i]);
        cudaError_t e = cudaStreamCreateWithFlags(&x->streams[i], cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            err = fb_errf(msg, msg_cap, FB_ERR_IO, "stream on device %d: %s", devices[i],
                          cudaGetErrorString(e));
            goto fail;
        }
    }
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; r == ncclSuccess && i < n_local; i++) {
        cudaSetDevice(devices[i]);
        r = ncclCommInitRank(&x->comms[i], world, u, base + i);
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess) r = r2;
    if (r != ncclSuccess) {
        err = fb_errf(msg, msg_cap, FB_ERR_IO, "ncclCommInitRank: %s", ncclGetErrorString(r));
        goto fail;
    }
    c->ops = &nccl_ops;
    c->n_local = n_local;
    c->ctx = x;
    cudaSetDevice(prev);
    *out = c;
    return FB_OK;

fail:
    if (x) nccl_release(x);
    free(c);
    cudaSetDevice(prev);
    return err;
}

#endif
