/*
 * Collective communication between the data-parallel replicas of a group,
 * behind one interface with two backends: shared memory, for devices that
 * live in one process (CPU devices, which are threads of the worker), and
 * NCCL, for CUDA devices within a worker and across workers.
 *
 * A communicator covers the local ranks of one worker (ranks base ..
 * base + n_local - 1 of a world of `world` ranks).  It is driven by ONE
 * thread per worker, the group's communication thread: each call passes the
 * buffers of every local rank at once (NCCL's one-thread-many-devices group
 * call), which is what lets a single thread overlap all of the worker's
 * gradient traffic with the devices' backward passes.  Buffers live in the
 * memory of the rank's device (host memory for the shared-memory backend).
 *
 * The shared-memory sum adds the ranks' values in rank order and writes the
 * same float to every rank, so replicas stay bit-identical.
 */
#ifndef FB_WORKERS_COMM_H
#define FB_WORKERS_COMM_H

#include <stddef.h>
#include <stdint.h>

typedef struct fb_comm fb_comm_t;

/* The size of an NCCL unique id (ncclUniqueId), which the server hands every
 * worker of a multi-worker group so that they join one communicator. */
#define FB_COMM_ID_BYTES 128

/*
 * Opens a shared-memory communicator over n_local ranks (1..64) of one
 * process.  Returns FB_OK, FB_ERR_OUT_OF_RANGE (msg says why) or
 * FB_ERR_NOMEM; *out is untouched on failure.
 */
int fb_comm_shm_new(int n_local, fb_comm_t **out, char *msg, size_t msg_cap);

/*
 * Fills id with a fresh NCCL unique id (rank 0 of a group makes it; the
 * others receive it).  FB_ERR_UNSUPPORTED in a build without CUDA or where
 * NCCL cannot create one.
 */
int fb_comm_nccl_unique_id(unsigned char id[FB_COMM_ID_BYTES], char *msg, size_t msg_cap);

/*
 * Opens an NCCL communicator for n_local CUDA devices (devices[0..n_local),
 * runtime ordinals) holding ranks base .. base + n_local - 1 of world, all
 * joined through id (ncclCommInitRank in one group call).  Every worker of
 * the group must call it with the same id and world.  FB_ERR_UNSUPPORTED in
 * a build without CUDA; FB_ERR_OUT_OF_RANGE for bad ranks; FB_ERR_IO when
 * NCCL fails (msg has NCCL's reason).  *out is untouched on failure.
 */
int fb_comm_nccl_new(int n_local, const int *devices, int base, int world,
                     const unsigned char id[FB_COMM_ID_BYTES], fb_comm_t **out, char *msg,
                     size_t msg_cap);

/* Number of local ranks. */
int fb_comm_local_size(const fb_comm_t *c);

/* The backend's name: "shm" or "nccl". */
const char *fb_comm_name(const fb_comm_t *c);

/* Whether the buffers are host memory (the shared-memory backend). */
int fb_comm_host_memory(const fb_comm_t *c);

/*
 * Sums bufs[r][0..n) over every rank of the world and leaves the sum in
 * every buffer.  bufs has one pointer per local rank, in rank order.
 * Returns when the sum is complete in every local buffer.  Returns FB_OK or
 * FB_ERR_IO (NCCL failed; msg says why).
 */
int fb_comm_allreduce_sum(fb_comm_t *c, float *const *bufs, size_t n, char *msg,
                          size_t msg_cap);

/* Closes the communicator.  Accepts NULL. */
void fb_comm_free(fb_comm_t *c);

#endif
