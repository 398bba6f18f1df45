/*
 * Private side of the communication interface (comm.h): the table of
 * functions a backend fills, and the handle that carries it.  Only the
 * backends (comm.c, comm_nccl.c) include this header.
 */
#ifndef FB_WORKERS_COMM_IMPL_H
#define FB_WORKERS_COMM_IMPL_H

#include "comm.h"

/* The most local ranks of one communicator (one per device or CPU thread). */
#define FB_COMM_MAX_LOCAL 64

struct fb_comm_ops {
    const char *name;
    int host_memory;
    int (*allreduce_sum)(fb_comm *c, float *const *bufs, size_t n, char *msg, size_t msg_cap);
    void (*free)(fb_comm *c);
};

struct fb_comm {
    const struct fb_comm_ops *ops;
    int n_local;
    void *ctx; /* owned by the backend */
};

/*
 * Checks the arguments of fb_comm_nccl_new_opts and gives its deadline in
 * *timeout_ms (the default when opts is NULL).  Shared by the NCCL backend
 * and the stand-in of a build without CUDA, so that bad input is refused
 * alike in both.  Returns FB_OK, FB_ERR_INTERNAL or FB_ERR_OUT_OF_RANGE (msg
 * says why); *timeout_ms is untouched on failure.
 */
int fb_comm_nccl_check_args(int n_local, const int *devices, int base, int world,
                            const unsigned char *id, const fb_comm_nccl_opts *opts,
                            fb_comm **out, int *timeout_ms, char *msg, size_t msg_cap);

#endif
