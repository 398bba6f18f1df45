/*
 * Private side of the communication interface (comm.h): the table of
 * functions a backend fills, and the handle that carries it.  Only the
 * backends (comm.c, comm_nccl.c) include this header.
 */
#ifndef FB_WORKERS_COMM_IMPL_H
#define FB_WORKERS_COMM_IMPL_H

#include "comm.h"

struct fb_comm_ops {
    const char *name;
    int host_memory;
    int (*allreduce_sum)(fb_comm_t *c, float *const *bufs, size_t n, char *msg, size_t msg_cap);
    void (*free)(fb_comm_t *c);
};

struct fb_comm {
    const struct fb_comm_ops *ops;
    int n_local;
    void *ctx; /* owned by the backend */
};

#endif
