/*
 * The worker agent: the part of fusebox-worker that talks to fuseboxd and
 * trains what it is told to.  It registers the machine's devices over
 * ZeroMQ (a DEALER socket, CURVE-encrypted, the server authenticates it by
 * its public key), receives group assignments, trains each group in a
 * thread of its own as one fused array (workers/session.h), streams
 * progress, sends checkpoints and final models as events, and obeys
 * detach, rebalance and drain.  When the server goes away it keeps
 * training and registers its running groups again when the server is back.
 *
 * Threads: the thread that calls fb_agent_run owns the DEALER socket and an
 * inproc PULL socket; each group thread PUSHes its outgoing messages there
 * (ZeroMQ sockets are never shared between threads), and the main thread
 * numbers events, keeps them until the server acknowledges them, and sends
 * them.  Groups placed on the same device take turns step by step (stride
 * scheduling weighted by each group's time share).  docs/worker.md
 * describes the command and what it reports; docs/wire.md the messages.
 */
#ifndef FB_WORKERS_AGENT_H
#define FB_WORKERS_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define FB_AGENT_DEFAULT_HEARTBEAT_MS 1000
#define FB_AGENT_DEFAULT_PROGRESS_MS 1000
#define FB_AGENT_DEFAULT_OUTBOX_BYTES ((uint64_t)1 << 30)
#define FB_AGENT_DEFAULT_STAGE_BYTES (16ULL << 30) /* as fusebox-train --stage-bytes */
#define FB_AGENT_DRAIN_WAIT_MS 10000               /* how long a drain waits for the last ACKs */
#define FB_AGENT_DEFAULT_COMM_TIMEOUT_MS 60000
#define FB_AGENT_COMM_PORTS 1024 /* ports of a worker's comm range, at most */
#define FB_AGENT_SCRIPT_MAX 64    /* entries of --test-step-ms */

typedef struct fb_agent fb_agent;

typedef struct fb_agent_opts {
    const char *server;     /* ZeroMQ endpoint of fuseboxd, e.g. "tcp://10.0.0.1:5555" */
    const char *server_key; /* the server's CURVE public key, 40 chars of Z85 */
    const char *public_key; /* the worker's CURVE keypair, 40 chars of Z85 each */
    const char *secret_key;
    const char *name;       /* [a-z0-9][a-z0-9._-]*, at most 63 chars; NULL = the host's */
    int cpu_devices;        /* CPU devices to offer; 0 = 1 */
    int threads_per_device; /* math threads of a group; 0 = cores / devices, at least 1 */
    /* math threads of CPU devices 0..n_device_threads-1 one by one (each 1..1024), in place
     * of threads_per_device; at most cpu_devices entries; NULL/0 = none */
    const int *device_threads;
    int n_device_threads;
    /* CPU devices own cores: device 0 the first as many as it has math threads, device 1 the
     * next ones, and so on (around the machine's cores), and the threads that compute for a
     * device run only there; false = the kernel places every thread */
    bool pin_devices;
    const char *data_dir; /* NULL = $FUSEBOX_DATA_DIR, else /usr/share/datasets */
    /* node-local staging (workers/data/stage.h): a shard dataset's training shards are
     * copied here before an array reads them and verified on every use; a copy that fails
     * (FB_ERR_IO while the dataset reads in place: the disk is full) is this node's fault:
     * the array leaves uncounted and the worker drains (fb_agent_run returns FB_ERR_IO).
     * NULL = shards are read in place */
    const char *stage_dir;
    uint64_t stage_bytes;  /* the cache's bound; 0 = FB_AGENT_DEFAULT_STAGE_BYTES */
    int heartbeat_ms;      /* cadence until the server's WELCOME sets it; 0 = default */
    int progress_ms;       /* PROGRESS at least this often per group; 0 = default */
    uint64_t outbox_bytes; /* blob bytes of unacknowledged events before it complains;
                              0 = default */
    bool sync_batchnorm;   /* data-parallel groups on CPU devices normalise batch norm over
                              the global batch (data_parallel.h); false = each device's
                              statistics */
    /* arrays that span workers: where the other workers reach this one, a host name or IP
     * address (IPv6 without brackets) and the ports comm_port_lo..comm_port_hi (at most
     * FB_AGENT_COMM_PORTS) that the server picks a group's rendezvous port from when this
     * worker leads it; NULL = the worker takes no part in them */
    const char *comm_host;
    int comm_port_lo, comm_port_hi;
    int comm_timeout_ms;    /* each wait of their rendezvous and sums; 0 = the default */
    /* which devices a group on several takes its turn on for each step (docs/worker.md):
     * FB_AGENT_TURNS_AUTO all of them on CUDA devices (a device's backend serves one group
     * at a time), the first on CPU devices (the others shared at the same time, so that a
     * shard on a shared device is slower and the batch split follows); _ALL, _FIRST */
    int device_turns;
    /* tests only: a directory of step holds (docs/worker.md, "Test step hook"), which lets a
     * test stop an array at an exact step boundary and let it go on; refused unless the
     * environment has FB_AGENT_TEST_HOOKS_ENV=1.  NULL = none */
    const char *test_step_hook;
    /* tests only: a clock file (base/clock.h) the worker reads its time from instead of the
     * monotonic clock, so that a test steps it; same rule.  NULL = the monotonic clock */
    const char *test_clock;
    /* tests only: scripted step times (docs/worker.md, "Test clock and scripted step times"),
     * "KEY=MS[,KEY=MS...]" with KEY a job's name or id or "*" (any other array) and MS in
     * [1, 3600000]: each step of an array lasts exactly MS on the clock and is charged and
     * reported as that, and turns are granted in an order that depends only on the script
     * and the clock's steps; same rule.  NULL = steps take what they take */
    const char *test_step_ms;
} fb_agent_opts;

/* The variable that must be "1" for a test hook (step hook, clock, scripted steps) to be
 * accepted, so that a stray flag or variable cannot switch one on in a deployment. */
#define FB_AGENT_TEST_HOOKS_ENV "FUSEBOX_TEST_HOOKS"

enum { FB_AGENT_TURNS_AUTO = 0, FB_AGENT_TURNS_ALL = 1, FB_AGENT_TURNS_FIRST = 2 };

/*
 * Creates an agent: checks the options (bounds, key lengths, the name),
 * finds the devices, sets up the CPU backend's threads and the sockets, and
 * starts connecting to the server (ZeroMQ retries in the background, so a
 * server that is not up yet is no error).  Returns FB_OK, or
 * FB_ERR_OUT_OF_RANGE for a bad option, FB_ERR_IO when a socket cannot be
 * set up, FB_ERR_NOMEM; msg says which.  *out is untouched on failure.
 */
int fb_agent_new(fb_agent **out, const fb_agent_opts *o, char *msg, size_t msg_cap);

/*
 * Runs the agent until it has drained (fb_agent_drain or a DRAIN from the
 * server): then every group has checkpointed and reported its members and
 * the server has acknowledged every event, or FB_AGENT_DRAIN_WAIT_MS have
 * passed.  Returns FB_OK after a drain, or a negative fb_err (FB_ERR_IO)
 * with msg filled when the sockets fail.  Call it once.
 */
int fb_agent_run(fb_agent *a, char *msg, size_t msg_cap);

/*
 * Asks a running agent to drain.  Only sets a flag, so a signal handler may
 * call it; fb_agent_run notices within 100 ms, at once when the signal
 * interrupts its poll: the agent's own threads (groups, ZeroMQ) block
 * SIGTERM and SIGINT, so those signals reach the thread that runs
 * fb_agent_run (or another thread of the application).
 */
void fb_agent_drain(fb_agent *a);

/* Stops whatever still runs, closes the sockets and frees the agent.  Accepts NULL. */
void fb_agent_free(fb_agent *a);

/*
 * Parses --comm-addr: "HOST:LO" or "HOST:LO-HI", HOST a host name or an IP
 * address (IPv6 in brackets, "[::1]:29500-29599"), 1 <= LO <= HI <= 65535
 * and at most FB_AGENT_COMM_PORTS ports.  host receives HOST without
 * brackets (host_cap bytes).  Returns FB_OK or FB_ERR_OUT_OF_RANGE with msg
 * saying why; the outputs are untouched on failure.
 */
int fb_agent_parse_comm_addr(const char *s, char *host, size_t host_cap, int *lo, int *hi,
                             char *msg, size_t msg_cap);

/* Whether name is a valid worker name: [a-z0-9][a-z0-9._-]*, 1..63 chars. */
bool fb_agent_name_valid(const char *name);

/*
 * Turns any text (a host name) into a valid worker name in out (cap >= 2):
 * lower case, every byte outside [a-z0-9._-] becomes '-', a leading '.',
 * '_' or '-' is dropped, at most 63 chars; "worker" when nothing is left.
 */
void fb_agent_name_sanitize(const char *in, char *out, size_t cap);

/*
 * The worker's name when none is given: the host name, sanitised.  out
 * receives at most cap - 1 chars (cap >= 2).
 */
void fb_agent_default_name(char *out, size_t cap);

#endif
