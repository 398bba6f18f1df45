/*
 * Collective communication between the data-parallel replicas of a group,
 * behind one interface with three backends: shared memory, for devices that
 * live in one process (CPU devices, which are threads of the worker), TCP,
 * for CPU devices in several processes (workers), and NCCL, for CUDA devices
 * within a worker and across workers.
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
 * same float to every rank, so replicas stay bit-identical.  The TCP sum
 * does the same over the whole world, so it gives the very floats of the
 * shared-memory backend for the same world.
 *
 * A group whose ranks span processes uses TCP for everything on CPU
 * devices.  On CUDA devices it holds two communicators: TCP (host memory)
 * for the rendezvous, for the leader's per-step control vector, the step's
 * losses and for handing out the NCCL unique id (fb_comm_share_id), and
 * NCCL (device memory), joined with that id, for the gradient sums.
 */
#ifndef FB_WORKERS_COMM_H
#define FB_WORKERS_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fb_comm fb_comm;

/* The size of an NCCL unique id (ncclUniqueId), which the server hands every
 * worker of a multi-worker group so that they join one communicator. */
#define FB_COMM_ID_BYTES 128

/*
 * Opens a shared-memory communicator over n_local ranks (1..64) of one
 * process.  Returns FB_OK, FB_ERR_OUT_OF_RANGE (msg says why) or
 * FB_ERR_NOMEM; *out is untouched on failure.
 */
int fb_comm_shm_new(int n_local, fb_comm **out, char *msg, size_t msg_cap);

/*
 * Fills id with a fresh NCCL unique id (rank 0 of a group makes it; the
 * others receive it).  FB_ERR_UNSUPPORTED in a build without CUDA or where
 * NCCL cannot create one.
 */
int fb_comm_nccl_unique_id(unsigned char id[FB_COMM_ID_BYTES], char *msg, size_t msg_cap);

/* The longest wait of an NCCL communicator opened without options
 * (fb_comm_nccl_new): the worker's default --comm-timeout-ms. */
#define FB_COMM_NCCL_DEFAULT_TIMEOUT_MS 60000

/* The largest deadline any communicator accepts (one hour), as for TCP. */
#define FB_COMM_MAX_TIMEOUT_MS 3600000

/* How an NCCL communicator is opened (fb_comm_nccl_new_opts). */
typedef struct fb_comm_nccl_opts {
    /* The longest wait, in ms (1..FB_COMM_MAX_TIMEOUT_MS), of the join and
     * of each sum; zero and negative values are refused, not defaulted. */
    int timeout_ms;
} fb_comm_nccl_opts;

/*
 * Opens an NCCL communicator for n_local CUDA devices (devices[0..n_local),
 * distinct runtime ordinals) holding ranks base .. base + n_local - 1 of
 * world, all joined through id (non-blocking ncclCommInitRankConfig in one
 * group call).  Every worker of the group must call it with the same id and
 * world.  opts (NULL: a deadline of FB_COMM_NCCL_DEFAULT_TIMEOUT_MS) bounds
 * the join and, later, each sum: the thread polls NCCL's state, sleeping
 * between polls, and when a wait outlasts the deadline or NCCL reports an
 * error it aborts every communicator of this process (ncclCommAbort), so a
 * peer that never joins, or hangs with its connections open, costs at most
 * one deadline and never a hang.  The same must then hold between sums as
 * for TCP: the deadline has to exceed the longest time one process can
 * spend between two sums that another has already reached.
 *
 * Returns FB_OK; FB_ERR_INTERNAL (a missing argument); FB_ERR_OUT_OF_RANGE
 * (bad ranks, a negative or repeated device, a deadline out of range; msg
 * says which); FB_ERR_UNSUPPORTED in a build without CUDA (after the
 * checks); FB_ERR_IO when NCCL or CUDA fails or the join outlasts the
 * deadline (msg names the device and what it waited for).  *out is
 * untouched on failure.
 */
int fb_comm_nccl_new_opts(int n_local, const int *devices, int base, int world,
                          const unsigned char id[FB_COMM_ID_BYTES], const fb_comm_nccl_opts *opts,
                          fb_comm **out, char *msg, size_t msg_cap);

/*
 * fb_comm_nccl_new_opts with the default deadline
 * (FB_COMM_NCCL_DEFAULT_TIMEOUT_MS).
 */
int fb_comm_nccl_new(int n_local, const int *devices, int base, int world,
                     const unsigned char id[FB_COMM_ID_BYTES], fb_comm **out, char *msg,
                     size_t msg_cap);

/* The size of a group's secret, which every process of a TCP communicator
 * presents when it joins (the server hands it out with the rendezvous). */
#define FB_COMM_TOKEN_BYTES 32

/* A listening socket of the process that holds rank 0 (TCP backend). */
typedef struct fb_comm_tcp_listener fb_comm_tcp_listener;

/*
 * Listens on addr ("host:port", "[v6 host]:port" or ":port" for every
 * address; port 0 lets the system choose one) for the members of a TCP
 * communicator.  *port (may be NULL) receives the port bound, which the
 * other processes then connect to.  Lets the process holding rank 0 bind
 * before it starts the others.  Returns FB_OK, FB_ERR_OUT_OF_RANGE (a
 * malformed address) or FB_ERR_IO (cannot resolve or bind; msg says why);
 * *out and *port are untouched on failure.
 */
int fb_comm_tcp_listen(const char *addr, fb_comm_tcp_listener **out, int *port, char *msg,
                       size_t msg_cap);

/* Closes the listening socket.  Accepts NULL. */
void fb_comm_tcp_listener_free(fb_comm_tcp_listener *l);

/*
 * Opens a TCP communicator for n_local ranks of this process, ranks base ..
 * base + n_local - 1 of a world of `world` (1..64) ranks spread over several
 * processes.  The process with base 0 (the root) listens on listener, or,
 * when listener is NULL, binds root_addr itself for the rendezvous; every
 * other process connects to root_addr ("host:port"; IPv4, IPv6 or a name,
 * through getaddrinfo), retrying until the root listens.  Each process
 * presents token, the group's secret; the root compares it in constant time
 * and refuses a wrong token, a world of another size and ranks that are out
 * of range or already held, with a reason that the refused process returns
 * (FB_ERR_UNAUTHORIZED, FB_ERR_OUT_OF_RANGE, FB_ERR_ALREADY_EXISTS) while
 * the root goes on waiting for the rightful members.  Returns when every
 * rank of the world is held exactly once.
 *
 * A sum sends every rank's values to the root, which adds them in rank
 * order and sends the one sum back (a star, not a ring: a ring adds in
 * another order on each rank, and the replicas must stay bit-identical; at
 * the speed of CPU devices the root's links are not the bottleneck).  Each
 * wait of a rendezvous or a sum lasts at most timeout_ms (1..3600000), so
 * it must exceed the longest time one process can spend between two sums
 * that another process has already reached (a step's imbalance, an
 * evaluation; a member waits twice as long for the root's answer, so that
 * the root, which waits for each peer, is the one to name a silent peer);
 * a dead, silent or misbehaving peer (a sum of another length,
 * say) gives FB_ERR_IO naming the peer's ranks, never a hang, and breaks
 * the communicator: every later sum fails at once.  Every process must be
 * of one byte order (checked at the rendezvous).
 *
 * Returns FB_OK, FB_ERR_OUT_OF_RANGE (bad ranks, timeout or address), a
 * refusal as above, FB_ERR_IO (the rendezvous failed or timed out) or
 * FB_ERR_NOMEM; *out is untouched on failure.  The caller keeps listener
 * and may free it once this returns.
 */
int fb_comm_tcp_new(int n_local, int base, int world, const char *root_addr,
                    fb_comm_tcp_listener *listener, const unsigned char token[FB_COMM_TOKEN_BYTES],
                    int timeout_ms, fb_comm **out, char *msg, size_t msg_cap);
/* fb_comm_tcp_new, except that the rendezvous gives up, with FB_ERR_IO ("called off"),
 * within about 50 ms of give_up(give_up_arg) returning true: a worker's group that the
 * server stops while it waits for another worker's ranks does not wait out timeout_ms.
 * give_up is called from this thread only. */
int fb_comm_tcp_new_until(int n_local, int base, int world, const char *root_addr,
                          fb_comm_tcp_listener *listener,
                          const unsigned char token[FB_COMM_TOKEN_BYTES], int timeout_ms,
                          bool (*give_up)(void *), void *give_up_arg, fb_comm **out, char *msg,
                          size_t msg_cap);

/*
 * The place of a TCP communicator's ranks: *base, its first local rank, and
 * *world (either may be NULL).  Returns FB_OK, or FB_ERR_UNSUPPORTED for a
 * communicator of another backend (its ranks are all in this process).
 */
int fb_comm_tcp_layout(const fb_comm *c, int *base, int *world, char *msg, size_t msg_cap);

/*
 * The place of an NCCL communicator's ranks, as fb_comm_tcp_layout: *base
 * and *world as given to fb_comm_nccl_new.  FB_ERR_UNSUPPORTED for another
 * backend, or in a build without CUDA.
 */
int fb_comm_nccl_layout(const fb_comm *c, int *base, int *world, char *msg, size_t msg_cap);

/*
 * The place of any communicator's ranks: *base, its first local rank, and
 * *world (either may be NULL).  A shared-memory communicator is its whole
 * world (base 0, world = its local ranks).
 */
void fb_comm_layout(const fb_comm *c, int *base, int *world);

/*
 * Gives every process of c the FB_COMM_ID_BYTES bytes of id held by the
 * process of rank 0 (the group's leader), bit for bit; what the others pass
 * is overwritten.  c must sum host memory (TCP, or shared memory, where
 * nothing moves); every process must call it at the same point, between
 * sums.  The leader passes leader_ok = 1 when its id is valid, 0 when it
 * could not make one (NCCL failed): every process then gets FB_ERR_IO at
 * once instead of waiting in NCCL for a peer that never joins.  It is one
 * sum in which only rank 0 contributes a status and one float per byte
 * (integers below 256 add exactly with zeros), and the result is checked to
 * be such bytes, so a process that contributed something else is caught.
 * This is how a CUDA group that spans workers joins one NCCL communicator:
 * the id holds the address of the process that made it, so the leader makes
 * it (fb_comm_nccl_unique_id) and the others receive it here, then every
 * process calls fb_comm_nccl_new with it.  Returns FB_OK,
 * FB_ERR_UNSUPPORTED (c sums device memory), FB_ERR_INTERNAL (a missing
 * argument), FB_ERR_NOMEM or FB_ERR_IO (the sum failed, the leader had no
 * id, or the result is not an id); id is untouched on failure.
 */
int fb_comm_share_id(fb_comm *c, int leader_ok, unsigned char id[FB_COMM_ID_BYTES], char *msg,
                     size_t msg_cap);

/* Number of local ranks. */
int fb_comm_local_size(const fb_comm *c);

/* The backend's name: "shm", "tcp" or "nccl". */
const char *fb_comm_name(const fb_comm *c);

/* Whether the buffers are host memory (the shared-memory backend). */
int fb_comm_host_memory(const fb_comm *c);

/*
 * Sums bufs[r][0..n) over every rank of the world and leaves the sum in
 * every buffer.  bufs has one pointer per local rank, in rank order.
 * Returns when the sum is complete in every local buffer.  Returns FB_OK or
 * FB_ERR_IO (NCCL failed, a TCP or NCCL peer failed or the sum outlasted the
 * communicator's deadline; msg says why).  After FB_ERR_IO from TCP or NCCL
 * the communicator is broken: every later sum fails at once.
 */
int fb_comm_allreduce_sum(fb_comm *c, float *const *bufs, size_t n, char *msg,
                          size_t msg_cap);

/* Closes the communicator.  Accepts NULL. */
void fb_comm_free(fb_comm *c);

#endif
