/*
 * The NCCL backend of the communication interface (comm.h), compiled only
 * in CUDA builds.  One communicator per local device, all created in one
 * ncclGroupStart/End so that a single thread can initialise several devices;
 * each rank gets its own stream, on which its all-reduces run while the
 * device's compute stream carries on with backward.
 *
 * Every wait has a deadline of ours.  The communicators are non-blocking
 * (ncclConfig_t.blocking = 0): the join and the launch of a sum return at
 * once, and the calling thread polls NCCL's state (ncclCommGetAsyncError)
 * and the streams (cudaStreamQuery), sleeping between polls.  A wait that
 * outlasts the deadline, or an error that NCCL reports, aborts every local
 * communicator (ncclCommAbort, which also stops kernels that wait for a
 * peer), so that a peer that never joins, or hangs with its connections
 * open, is a communication fault like a TCP one: FB_ERR_IO, and every later
 * sum fails at once.
 */
#ifdef FB_HAVE_CUDA

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_impl.h"
#include "errors.h"

/* The pause between two polls starts short, so that a sum that is nearly done when the
 * thread first looks costs little, and grows by a quarter each poll up to a millisecond,
 * so that a long wait wakes the thread about a thousand times a second, not flat out.
 * Since each pause is at most a quarter of the time already waited (plus the first
 * pause), a healthy sum is seen done at most 25% + 20 us after it completes, and never
 * more than 1 ms after (plus the kernel's timer slack, 50 us by default). */
#define POLL_FIRST_NS 20000L
#define POLL_MAX_NS 1000000L

typedef struct nccl_ctx {
    int n;
    int base, world; /* ranks base .. base + n - 1 of world */
    int timeout_ms;  /* the longest wait of the join and of each sum */
    int broken;      /* a wait failed and the communicators were aborted */
    int devices[FB_COMM_MAX_LOCAL];
    ncclComm_t comms[FB_COMM_MAX_LOCAL];
    cudaStream_t streams[FB_COMM_MAX_LOCAL];
} nccl_ctx;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Sleeps for *pause_ns and lengthens the next pause (see POLL_FIRST_NS). */
static void poll_pause(long *pause_ns)
{
    struct timespec ts = {0, *pause_ns};
    nanosleep(&ts, NULL);
    long next = *pause_ns + *pause_ns / 4;
    *pause_ns = next < POLL_MAX_NS ? next : POLL_MAX_NS;
}

/* Aborts every local communicator after a failure: NCCL's other ranks then fail too
 * instead of waiting for this one, kernels that wait for a peer stop, and every later sum
 * here fails at once.  ncclCommAbort is the one call NCCL allows on a communicator whose
 * join or sum is still in progress. */
static void nccl_abort(nccl_ctx *x)
{
    for (int i = 0; i < x->n; i++)
        if (x->comms[i]) {
            ncclCommAbort(x->comms[i]);
            x->comms[i] = NULL;
        }
    x->broken = 1;
}

/* NCCL's state of local rank i: ncclSuccess when idle, ncclInProgress while a
 * non-blocking call is under way, an error after a failure. */
static ncclResult_t nccl_state(const nccl_ctx *x, int i)
{
    if (!x->comms[i]) return ncclInternalError;
    ncclResult_t st = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(x->comms[i], &st);
    return r != ncclSuccess ? r : st;
}

/* "device 3 (rank 5 of 8)", for messages. */
static const char *rank_name(const nccl_ctx *x, int i, char *buf, size_t cap)
{
    snprintf(buf, cap, "device %d (rank %d of %d)", x->devices[i], x->base + i, x->world);
    return buf;
}

/*
 * Waits until every local communicator has finished joining.  Returns FB_OK, or
 * FB_ERR_IO when NCCL reports an error or the deadline passes first; the caller aborts.
 */
static int nccl_wait_join(nccl_ctx *x, double deadline, char *msg, size_t msg_cap)
{
    long pause = POLL_FIRST_NS;
    char who[64];
    for (;;) {
        int pending = -1;
        for (int i = 0; i < x->n; i++) {
            ncclResult_t st = nccl_state(x, i);
            if (st == ncclInProgress) {
                if (pending < 0) pending = i;
            } else if (st != ncclSuccess) {
                return fb_errf(msg, msg_cap, FB_ERR_IO, "%s joining NCCL: %s (%s)",
                               rank_name(x, i, who, sizeof who), ncclGetErrorString(st),
                               x->comms[i] ? ncclGetLastError(x->comms[i]) : "no communicator");
            }
        }
        if (pending < 0) return FB_OK;
        if (now_ms() >= deadline)
            return fb_errf(msg, msg_cap, FB_ERR_IO,
                           "%s waited %d ms to join NCCL, and not every rank of the %d joined "
                           "(a peer that never started, or one that hangs); NCCL aborted",
                           rank_name(x, pending, who, sizeof who), x->timeout_ms, x->world);
        poll_pause(&pause);
    }
}

/*
 * Waits for the sum of n floats just launched on every local rank: first for NCCL's
 * launch to leave ncclInProgress, then for the rank's stream.  A plain stream
 * synchronise would wait forever for a peer that died or hangs.  Returns FB_OK, or
 * FB_ERR_IO when CUDA or NCCL reports an error or the deadline passes first; the caller
 * aborts.
 */
static int nccl_wait_sum(nccl_ctx *x, size_t n, double deadline, char *msg, size_t msg_cap)
{
    unsigned char done[FB_COMM_MAX_LOCAL] = {0};
    int left = x->n;
    long pause = POLL_FIRST_NS;
    char who[64];
    for (;;) {
        int pending = -1;
        for (int i = 0; i < x->n; i++) {
            if (done[i]) continue;
            ncclResult_t st = nccl_state(x, i);
            if (st != ncclSuccess && st != ncclInProgress)
                return fb_errf(msg, msg_cap, FB_ERR_IO, "all-reduce of %zu floats on %s: %s (%s)",
                               n, rank_name(x, i, who, sizeof who), ncclGetErrorString(st),
                               x->comms[i] ? ncclGetLastError(x->comms[i]) : "no communicator");
            if (st == ncclSuccess) {
                /* the query needs the stream's device current on this thread */
                cudaError_t e = cudaSetDevice(x->devices[i]);
                if (e == cudaSuccess) e = cudaStreamQuery(x->streams[i]);
                if (e == cudaSuccess) {
                    done[i] = 1;
                    left--;
                    continue;
                }
                if (e != cudaErrorNotReady)
                    return fb_errf(msg, msg_cap, FB_ERR_IO, "all-reduce of %zu floats on %s: %s", n,
                                   rank_name(x, i, who, sizeof who), cudaGetErrorString(e));
            }
            if (pending < 0) pending = i;
        }
        if (left == 0) return FB_OK;
        if (now_ms() >= deadline)
            return fb_errf(msg, msg_cap, FB_ERR_IO,
                           "all-reduce of %zu floats on %s not done after %d ms (a peer that "
                           "stopped summing, or one that hangs); NCCL aborted",
                           n, rank_name(x, pending, who, sizeof who), x->timeout_ms);
        poll_pause(&pause);
    }
}

static int nccl_allreduce(fb_comm *c, float *const *bufs, size_t n, char *msg, size_t msg_cap)
{
    nccl_ctx *x = c->ctx;
    if (x->broken) return fb_errf(msg, msg_cap, FB_ERR_IO, "the NCCL communicator failed before");
    double deadline = now_ms() + x->timeout_ms;
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; r == ncclSuccess && i < x->n; i++)
        r = ncclAllReduce(bufs[i], bufs[i], n, ncclFloat, ncclSum, x->comms[i], x->streams[i]);
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess) r = r2;
    /* non-blocking: the launch may still be under way, which the wait watches */
    if (r != ncclSuccess && r != ncclInProgress) {
        nccl_abort(x);
        return fb_errf(msg, msg_cap, FB_ERR_IO, "ncclAllReduce of %zu floats: %s; NCCL aborted", n,
                       ncclGetErrorString(r));
    }
    int err = nccl_wait_sum(x, n, deadline, msg, msg_cap);
    if (err) nccl_abort(x);
    return err;
}

static void nccl_release(nccl_ctx *x)
{
    for (int i = 0; i < x->n; i++) {
        /* every sum was waited for, so no kernel of a healthy communicator is in flight */
        if (x->comms[i]) ncclCommDestroy(x->comms[i]);
        if (x->streams[i]) {
            cudaSetDevice(x->devices[i]);
            cudaStreamDestroy(x->streams[i]);
        }
    }
    free(x);
}

static void nccl_free(fb_comm *c)
{
    if (c->ctx) nccl_release(c->ctx);
}

static const struct fb_comm_ops nccl_ops = {
    .name = "nccl",
    .host_memory = 0,
    .allreduce_sum = nccl_allreduce,
    .free = nccl_free,
};

int fb_comm_nccl_layout(const fb_comm *c, int *base, int *world, char *msg, size_t msg_cap)
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

int fb_comm_nccl_new_opts(int n_local, const int *devices, int base, int world,
                          const unsigned char id[FB_COMM_ID_BYTES], const fb_comm_nccl_opts *opts,
                          fb_comm **out, char *msg, size_t msg_cap)
{
    int timeout_ms = 0;
    int err = fb_comm_nccl_check_args(n_local, devices, base, world, id, opts, out, &timeout_ms,
                                      msg, msg_cap);
    if (err) return err;
    int prev = 0;
    cudaGetDevice(&prev);
    fb_comm *c = calloc(1, sizeof *c);
    nccl_ctx *x = calloc(1, sizeof *x);
    if (!c || !x) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    x->n = n_local;
    x->base = base;
    x->world = world;
    x->timeout_ms = timeout_ms;
    for (int i = 0; i < n_local; i++) {
        x->devices[i] = devices[i];
        /* a switch that failed unnoticed would put the stream on another device */
        cudaError_t e = cudaSetDevice(devices[i]);
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&x->streams[i], cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            err = fb_errf(msg, msg_cap, FB_ERR_IO, "stream on device %d: %s", devices[i],
                          cudaGetErrorString(e));
            goto fail;
        }
    }
    /* the join counts from here: stream creation above is local and cannot hang on a peer */
    double deadline = now_ms() + timeout_ms;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; (r == ncclSuccess || r == ncclInProgress) && i < n_local; i++) {
        /* NCCL binds the communicator to the current device */
        if (cudaSetDevice(devices[i]) != cudaSuccess) {
            r = ncclInvalidUsage;
            break;
        }
        r = ncclCommInitRankConfig(&x->comms[i], world, u, base + i, &cfg);
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = r2;
    if (r != ncclSuccess && r != ncclInProgress) {
        err = fb_errf(msg, msg_cap, FB_ERR_IO, "ncclCommInitRankConfig for ranks %d..%d of %d: %s",
                      base, base + n_local - 1, world, ncclGetErrorString(r));
        goto fail;
    }
    if ((err = nccl_wait_join(x, deadline, msg, msg_cap))) goto fail;
    c->ops = &nccl_ops;
    c->n_local = n_local;
    c->ctx = x;
    cudaSetDevice(prev);
    *out = c;
    return FB_OK;

fail:
    if (x) {
        /* a join still in progress, or one that failed half-way, can only be aborted */
        nccl_abort(x);
        nccl_release(x);
    }
    free(c);
    cudaSetDevice(prev);
    return err;
}

#endif
