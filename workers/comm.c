/*
 * The communication interface's dispatch and its shared-memory backend.
 *
 * The shared-memory backend needs no rendezvous: the one communication
 * thread that calls it holds every local rank's buffer, so a sum is a loop.
 * It adds in rank order and writes the one result to every rank, so that the
 * replicas' parameters, updated from it, stay bit-identical.
 */
#include "comm_impl.h"

#include <stdlib.h>

#include "errors.h"

static int shm_allreduce(fb_comm *c, float *const *bufs, size_t n, char *msg, size_t msg_cap)
{
    (void)msg;
    (void)msg_cap;
    int R = c->n_local;
    /* blocks of a few KiB keep the ranks' slices in cache between read and write */
    enum { BLOCK = 1024 };
    for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
        size_t i1 = i0 + BLOCK < n ? i0 + BLOCK : n;
        for (size_t i = i0; i < i1; i++) {
            float s = bufs[0][i];
            for (int r = 1; r < R; r++) s += bufs[r][i];
            for (int r = 0; r < R; r++) bufs[r][i] = s;
        }
    }
    return FB_OK;
}

static void shm_free(fb_comm *c)
{
    (void)c;
}

static const struct fb_comm_ops shm_ops = {
    .name = "shm",
    .host_memory = 1,
    .allreduce_sum = shm_allreduce,
    .free = shm_free,
};

int fb_comm_shm_new(int n_local, fb_comm **out, char *msg, size_t msg_cap)
{
    if (!out) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "no output pointer");
    if (n_local < 1 || n_local > FB_COMM_MAX_LOCAL)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "a shared-memory communicator holds 1..%d ranks, not %d",
                       FB_COMM_MAX_LOCAL, n_local);
    fb_comm *c = calloc(1, sizeof *c);
    if (!c) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    c->ops = &shm_ops;
    c->n_local = n_local;
    *out = c;
    return FB_OK;
}

int fb_comm_local_size(const fb_comm *c)
{
    return c ? c->n_local : 0;
}

const char *fb_comm_name(const fb_comm *c)
{
    return c ? c->ops->name : "(null)";
}

int fb_comm_host_memory(const fb_comm *c)
{
    return c ? c->ops->host_memory : 0;
}

int fb_comm_allreduce_sum(fb_comm *c, float *const *bufs, size_t n, char *msg,
                          size_t msg_cap)
{
    if (n == 0) return FB_OK;
    return c->ops->allreduce_sum(c, bufs, n, msg, msg_cap);
}

void fb_comm_layout(const fb_comm *c, int *base, int *world)
{
    int b = 0, w = c ? c->n_local : 0;
    /* shared memory: the local ranks are the whole world */
    if (c && fb_comm_tcp_layout(c, &b, &w, NULL, 0) != FB_OK &&
        fb_comm_nccl_layout(c, &b, &w, NULL, 0) != FB_OK) {
        b = 0;
        w = c->n_local;
    }
    if (base) *base = b;
    if (world) *world = w;
}

/* The id's status word as the leader sends it. */
enum { ID_VALID = 1, ID_MISSING = 2 };

int fb_comm_share_id(fb_comm *c, int leader_ok, unsigned char id[FB_COMM_ID_BYTES], char *msg,
                     size_t msg_cap)
{
    if (!c || !id) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "missing argument");
    if (!c->ops->host_memory)
        return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                       "the %s communicator sums device memory; an id goes through host memory",
                       c->ops->name);
    int base = 0;
    fb_comm_layout(c, &base, NULL);
    enum { NF = 1 + FB_COMM_ID_BYTES };
    float *all = calloc((size_t)c->n_local * NF, sizeof *all);
    float **bufs = calloc((size_t)c->n_local, sizeof *bufs);
    int err = FB_OK;
    char m[256] = "";
    if (!all || !bufs) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int r = 0; r < c->n_local; r++) bufs[r] = all + (size_t)r * NF;
    if (base == 0) {
        /* rank 0 alone contributes; every other rank adds zeros */
        all[0] = leader_ok ? ID_VALID : ID_MISSING;
        for (int i = 0; leader_ok && i < FB_COMM_ID_BYTES; i++) all[1 + i] = (float)id[i];
    }
    if ((err = fb_comm_allreduce_sum(c, bufs, NF, m, sizeof m))) {
        err = fb_errf(msg, msg_cap, err, "sharing the NCCL id: %s", m);
        goto done;
    }
    if (all[0] == ID_MISSING) {
        err = fb_errf(msg, msg_cap, FB_ERR_IO, "the leader (rank 0) could not make an NCCL id");
        goto done;
    }
    if (all[0] != ID_VALID) {
        err = fb_errf(msg, msg_cap, FB_ERR_IO,
                      "the id's status arrived as %g: another process contributed to it",
                      (double)all[0]);
        goto done;
    }
    for (int i = 0; i < FB_COMM_ID_BYTES; i++) {
        float f = all[1 + i];
        if (!(f >= 0 && f <= 255 && f == (float)(unsigned)f)) {
            err = fb_errf(msg, msg_cap, FB_ERR_IO,
                          "byte %d of the id arrived as %g: another process contributed to it",
                          i, (double)f);
            goto done;
        }
    }
    for (int i = 0; i < FB_COMM_ID_BYTES; i++) id[i] = (unsigned char)all[1 + i];

done:
    free(all);
    free(bufs);
    return err;
}

void fb_comm_free(fb_comm *c)
{
    if (!c) return;
    c->ops->free(c);
    free(c);
}

int fb_comm_nccl_check_args(int n_local, const int *devices, int base, int world,
                            const unsigned char *id, const fb_comm_nccl_opts *opts,
                            fb_comm **out, int *timeout_ms, char *msg, size_t msg_cap)
{
    if (!out || !devices || !id || !timeout_ms)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "missing argument");
    if (n_local < 1 || n_local > FB_COMM_MAX_LOCAL)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "an NCCL communicator holds 1..%d local ranks, not %d", FB_COMM_MAX_LOCAL,
                       n_local);
    /* written so that no sum can overflow, whatever the caller passes */
    if (base < 0 || world < n_local || n_local > world - base)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "%d local ranks from rank %d do not fit a world of %d", n_local, base,
                       world);
    for (int i = 0; i < n_local; i++) {
        if (devices[i] < 0)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "local rank %d: device ordinal %d is negative", i, devices[i]);
        /* NCCL does not support two ranks of one communicator on one device (it may hang) */
        for (int j = 0; j < i; j++)
            if (devices[j] == devices[i])
                return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                               "local ranks %d and %d are both on device %d", j, i, devices[i]);
    }
    int t = opts ? opts->timeout_ms : FB_COMM_NCCL_DEFAULT_TIMEOUT_MS;
    if (t < 1 || t > FB_COMM_MAX_TIMEOUT_MS)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "an NCCL deadline of %d ms: it must be 1..%d ms", t,
                       FB_COMM_MAX_TIMEOUT_MS);
    *timeout_ms = t;
    return FB_OK;
}

int fb_comm_nccl_new(int n_local, const int *devices, int base, int world,
                     const unsigned char id[FB_COMM_ID_BYTES], fb_comm **out, char *msg,
                     size_t msg_cap)
{
    return fb_comm_nccl_new_opts(n_local, devices, base, world, id, NULL, out, msg, msg_cap);
}

#ifndef FB_HAVE_CUDA
/* Without CUDA there is no NCCL; comm_nccl.c provides these in CUDA builds. */
int fb_comm_nccl_unique_id(unsigned char id[FB_COMM_ID_BYTES], char *msg, size_t msg_cap)
{
    (void)id;
    return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED, "this build has no CUDA, hence no NCCL");
}

int fb_comm_nccl_layout(const fb_comm *c, int *base, int *world, char *msg, size_t msg_cap)
{
    (void)c;
    (void)base;
    (void)world;
    return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED, "this build has no CUDA, hence no NCCL");
}

int fb_comm_nccl_new_opts(int n_local, const int *devices, int base, int world,
                          const unsigned char id[FB_COMM_ID_BYTES], const fb_comm_nccl_opts *opts,
                          fb_comm **out, char *msg, size_t msg_cap)
{
    int timeout_ms = 0;
    int err = fb_comm_nccl_check_args(n_local, devices, base, world, id, opts, out, &timeout_ms,
                                      msg, msg_cap);
    if (err) return err;
    return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED, "this build has no CUDA, hence no NCCL");
}
#endif
