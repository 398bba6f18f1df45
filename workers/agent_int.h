/*
 * The worker agent's rooms (private to workers/): what agent.c (the public
 * entry and set-up), agent_data.c (the dataset cache), agent_group.c (the
 * group threads, spanning groups included) and agent_loop.c (the main
 * thread's socket loop) share: the agent's state, its groups and their
 * members, the messages a group thread hands the main thread, and the
 * functions one room calls in another.  The device turns are turns.h's.
 *
 * Ownership: the main thread owns the group list, the outbox and both
 * sockets.  A group's thread owns its session and its PUSH socket (created
 * by the main thread, handed over at pthread_create).  What both read is
 * guarded: a group's member states, step count and batch split by the
 * group's mutex, the device turns (turns.h: each group's virtual time and
 * share, each device's groups) by the turns' own lock, the dataset cache by
 * the agent's ds_mu, and the stop and drain requests are atomics.  A group
 * reports its end with an EXIT message through its PUSH socket; the main
 * thread joins it and frees it only then, so a group pointer in a message is
 * always valid.
 *
 * Functions shared between the rooms carry the prefix agent_ (fb_agent_ is
 * agent.h's, the public one).
 */
#ifndef FB_WORKERS_AGENT_INT_H
#define FB_WORKERS_AGENT_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "agent.h"
#include "comm.h"
#include "idx.h"
#include "jobspec.h"
#include "kernels.h"
#include "turns.h"
#include "wire.h"

#define POLL_MAX_MS 100 /* the loop wakes at least this often (drain requests) */

/*
 * A dataset shared by every group that trains on it with one val_fraction: an
 * IDX dataset's splits in memory (train without the records held out for
 * validation, which are val); a shard dataset's validation set and test split
 * in memory, its train split read by each group's own prefetching loader (as
 * fusebox-train reads it, so that a job trains on the same minibatches here
 * and there).
 */
typedef struct dataset_ref {
    char tenant[FB_WIRE_ID_LEN + 1]; /* owner of a private dataset, "" for a public one */
    char name[FB_SPEC_DATASET_MAX + 1];
    double val_fraction;             /* the specs' (part of the key) */
    char data_dir[1100];             /* where name is found: the data dir, or its tenant's */
    int refs;
    bool shard;
    fb_dataset train, val, test; /* train: IDX only; val: n 0 when there is none */
    bool has_test;
    struct dataset_ref *next;
} dataset_ref;

/* One device; the groups placed on it take turns (turns.h). */
typedef struct agent_device {
    fb_wire_device info;
    fb_backend *be;
    /* a CPU device with a thread count of its own: a clone of the CPU backend with that
     * count (fb_backend_clone_threads), which be then points to (the math ops size their
     * thread teams from a backend's count); NULL otherwise */
    fb_backend *own_be;
    int cpu_first, cpu_count; /* its cores when the worker pins devices (cpu_count 0: not) */
} agent_device;

/* A member of an assigned group. */
typedef struct member {
    char job_id[FB_WIRE_ID_LEN + 1];
    fb_job_spec spec;
    bool parsed;
    int sidx;         /* index in the session's specs, -1 when not trained here */
    zmq_msg_t resume; /* the checkpoint to resume from, when has_resume */
    bool has_resume;
    zmq_msg_t init; /* the weights its spec's init names, as the server sent them, when has_init */
    bool has_init;
    /* under the group's mutex */
    bool alive; /* in the array (or about to enter it) */
    bool detach_req;
    bool detach_keep; /* the DETACH wants its full state in the DETACHED event */
    /* the group thread's own */
    bool started;
    double loss, accuracy, lr;
    /* it finished at final_step: the next report still carries its last training values */
    bool final_report;
    int64_t final_step;
} member;

typedef struct group {
    struct fb_agent *a;
    char id[FB_WIRE_ID_LEN + 1];
    int64_t generation;
    char dataset[FB_WIRE_DATASET_MAX + 1]; /* as the specs name it */
    char dataset_tenant[FB_WIRE_ID_LEN + 1];
    /* the dataset it reads: dataset, or the public built-in a tenant's alias stands for */
    char source[FB_WIRE_DATASET_MAX + 1];
    int dev;
    int64_t start_step;
    int n_members;
    member *m;
    int n_sess;
    int *by_sidx;       /* session index -> member index */
    void *push;         /* PUSH to the main thread; the group thread's after start */
    struct outmsg *bye; /* its EXIT message, made up front so that it cannot be lost */
    pthread_t th;

    atomic_bool stop;  /* leave now, silently */
    atomic_bool drain; /* checkpoint everyone, report, leave */

    pthread_mutex_t mu;
    int64_t steps_done;
    bool detach_pending;
    int n_split;
    int64_t split[FB_WIRE_MAX_DEVICES];
    uint64_t split_gen; /* bumped by each REBALANCE that carries a split */

    /* its place in the device turns (under the agent's turns lock): its share, its virtual
     * times, the devices it takes a turn on for each step (every device of its layout once,
     * or its first only: a->device_turns) */
    fb_turn turn;

    /* hybrid parallelism, set at ASSIGN: n_dp data shards x pipeline stages on the worker's
     * devices dp_devs (shard d, stage p at d * pipeline + p); 1 x 1 = one device */
    int n_dp;
    int pipeline;
    int dp_devs[FB_WIRE_MAX_DEVICES];

    /* a group that spans workers (world >= 2; 0: it lives here only): this worker's n_dp
     * devices are ranks rank_base.. of world; the leader (rank_base 0) listens at
     * rendezvous, decides at each step boundary and alone reports the members; a follower
     * applies what the leader broadcasts and sends only its devices' PROGRESS */
    int world, rank_base;
    bool follower;
    char rendezvous[FB_WIRE_NAME_MAX * 2 + 8];
    unsigned char token[FB_COMM_TOKEN_BYTES];
    uint64_t members_hash; /* of the ASSIGN's job ids in order, which every worker compares */

    struct group *next; /* the main thread's list */
} group;

/* What a group thread hands the main thread (by pointer, through its PUSH socket). */
typedef enum out_kind { OUT_EVENT, OUT_PROGRESS, OUT_EXIT } out_kind;

typedef struct outmsg {
    out_kind kind;
    group *g;      /* the sender; NULL for events the main thread makes */
    fb_wire_msg w; /* EVENT or PROGRESS; seq is set by the main thread */
    void *blob;    /* the event's file, blob_len bytes, malloc'd */
    size_t blob_len;
    struct outmsg *next; /* outbox order, then a group thread's pending list */
} outmsg;

struct fb_agent {
    char server[1024];
    char server_key[41], public_key[41], secret_key[41];
    char name[FB_WIRE_NAME_MAX + 1];
    char data_dir[1024];
    char stage_dir[1024]; /* --stage-dir, "" = none */
    uint64_t stage_bytes;
    int threads, heartbeat_ms, progress_ms;
    uint64_t outbox_limit;
    int n_devices;
    agent_device dev[FB_WIRE_MAX_DEVICES];
    /* the device turns of every group: their order and shares (turns.h) */
    fb_turns_sync turns;
    bool turns_init;
    const char *backend;
    bool sync_bn; /* --sync-batchnorm */
    /* --comm-addr ("" = none) and --comm-timeout-ms */
    char comm_host[FB_WIRE_NAME_MAX + 1];
    int comm_port_lo, comm_port_hi, comm_timeout_ms;
    int device_turns; /* FB_AGENT_TURNS_* */
    char hook_dir[1024]; /* --test-step-hook, "" = none (tests only) */
    /* --test-step-ms (tests only): scripted step times by job name or id ("*": any other) */
    bool scripted;
    struct script_entry {
        char key[FB_SPEC_NAME_MAX + 1];
        int64_t ns;
    } script[FB_AGENT_SCRIPT_MAX];
    int n_script;
    int turns_log; /* scripted with a step hook: HOOK_DIR/turns.log, the turns' decisions; -1 */

    void *ctx, *dealer, *pull, *mon;
    char inproc[64], mon_ep[64];
    atomic_bool drain_req;
    /* staging failed on this node (a group thread sets it, with stage_fault_msg written
     * first): the worker drains and fb_agent_run reports it */
    atomic_bool stage_fault;
    char stage_fault_msg[1024];

    /* the main thread's */
    bool welcomed, draining, drain_sent;
    bool connected, auth_logged; /* what the connection monitor last said */
    char worker_id[FB_WIRE_ID_LEN + 1];
    double last_rx, last_beat, drained_at;
    bool drain_timed; /* drained_at is set (a manual clock may read 0) */
    group *groups;
    uint64_t next_ticket;
    outmsg *outbox, *outbox_tail, *unsent; /* unsent: the first one not yet on the wire */
    int64_t next_seq;
    uint64_t outbox_bytes;
    double last_outbox_warn;

    pthread_mutex_t ds_mu;
    bool ds_mu_init;
    dataset_ref *datasets;
};

/* ---- agent.c: logging, time, messages ----------------------------------------------------- */

/* One line to stderr, with a UTC timestamp; formatted first so that lines from
 * different threads do not interleave. */
void agent_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Milliseconds on the process clock (base/clock.h), which every time decision of the
 * worker reads. */
double agent_now_ms(void);

/* Frees a message and its blob; accepts NULL. */
void agent_outmsg_free(outmsg *o);
/* A zeroed message of a kind from g (NULL: the main thread); the caller fills it.  NULL
 * when out of memory. */
outmsg *agent_outmsg_new(out_kind kind, group *g);
/* An EVENT about job_id of group (group_id, generation) from g; unknown numbers are NaN.
 * NULL when out of memory. */
outmsg *agent_event_new(group *g, const char *group_id, int64_t generation,
                        fb_wire_event_kind kind, const char *job_id, int64_t step);
/* Sets an event's text, printable ASCII only; o may be NULL. */
void agent_event_text(outmsg *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- agent_data.c: the dataset cache ------------------------------------------------------ */

/* The named dataset of tenant ("" for a public one) with that val_fraction, loaded on first
 * use and shared by the groups that train on it; NULL with msg filled when it cannot be.
 * Any thread; each acquire is matched by a release. */
dataset_ref *agent_dataset_acquire(fb_agent *a, const char *tenant, const char *name,
                                   double val_fraction, char *msg, size_t msg_cap);
/* Drops a reference; the last one frees the data.  Accepts NULL. */
void agent_dataset_release(fb_agent *a, dataset_ref *r);

/* ---- agent_group.c: the group threads ----------------------------------------------------- */

/* The thread of a group (arg: the group), from its start to its EXIT message. */
void *agent_group_thread(void *arg);
/* Wakes the groups waiting for their turns, after a stop or drain request. */
void agent_turns_wake(fb_agent *a);
/* The turns' event hook (fb_turns_sync_init) when the agent keeps a turns log; user is
 * the agent. */
void agent_turn_logged(void *user, fb_turn_event ev, const fb_turn *t, int64_t at_ns,
                       double value);

/* ---- agent_loop.c: the main thread -------------------------------------------------------- */

/* Asks a group to leave without reporting anything (its events are dropped too). */
void agent_stop_group(fb_agent *a, group *g);
/* Takes what the group threads handed the main thread, a bounded number per call. */
void agent_recv_pull(fb_agent *a);
/* Unlinks o from the outbox (prev is its predecessor or NULL) and frees it. */
void agent_outbox_remove(fb_agent *a, outmsg *prev, outmsg *o);

#endif
