/*
 * The control loop's rooms and what they share (private to server/).  The
 * loop of dispatch.c owns the workers' socket, the worker registry and the
 * groups it follows; the rooms beside it work on the same fb_dispatch from
 * the loop's one thread: dispatch_record.c writes what workers report
 * (progress, events, metrics, checkpoints and models), dispatch_asha.c keeps
 * the books of early stopping, dispatch_plan.c feeds the planner and applies
 * its decisions, dispatch_fair.c does the same for the fair-share
 * controller.  Nothing here is reachable outside server/: the interface of
 * the control loop is dispatch.h.
 */
#ifndef FB_SERVER_DISPATCH_IMPL_H
#define FB_SERVER_DISPATCH_IMPL_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <libpq-fe.h>

#include "config.h"
#include "dispatch.h"
#include "fairshare.h"
#include "jobspec.h"
#include "queue.h"
#include "wire.h"

typedef struct worker {
    char name[FB_WIRE_NAME_MAX + 1]; /* its routing id */
    char id[FB_WIRE_ID_LEN + 1];
    int64_t last_seen_ms;
    int seen_slot; /* its slot of fusebox_worker_last_seen_clock_ms (server/metrics.h) */
    bool draining;
    int n_devices;
    fb_wire_device devices[FB_WIRE_MAX_DEVICES];
    /* where the other workers of an array that spans workers reach it ("" = it takes no
     * part in such arrays), its port range, and where the next search for a free port of
     * the range starts (round-robin, so that a port another program holds is not tried
     * again and again) */
    char comm_host[FB_WIRE_NAME_MAX + 1];
    int comm_port_lo, comm_port_hi, next_port;
    /* the CURVE key it registered with: once revoked, the worker is dropped */
    char key[41];
    /* what its last HELLO wrote to the database, and when (hello_same) */
    char backend[FB_WIRE_NAME_MAX + 1], version[FB_WIRE_NAME_MAX + 1];
    int64_t hello_ms;
    /* the fair-share controller's memory of each device (its count of imbalanced periods),
     * handed back to it each period (the policy keeps no state) */
    fb_fair_device_memory fair[FB_WIRE_MAX_DEVICES];
} worker;

/* A worker of a group that spans workers, and its ranks. */
typedef struct span_member {
    char worker[FB_WIRE_NAME_MAX + 1];
    int rank_base, n_ranks;
    int dev[FB_WIRE_MAX_DEVICES]; /* its device indices, one per rank, in rank order */
    bool listed;                  /* it has listed the group as running since it was assigned */
    int64_t assigned_ms;          /* when the loop sent it the group, or found it at start */
    int64_t missing_since_ms;     /* as group.missing_since_ms, for this worker */
} span_member;

/* What the loop keeps of a group that spans workers. */
typedef struct span {
    int port;  /* where its leader listens for the others */
    int world; /* its data-parallel ranks */
    int n;     /* its workers; m[0] is the leader, the worker of rank 0 */
    span_member m[FB_WIRE_MAX_DEVICES];
    /* the latest breakdown of each rank, from the worker that holds it */
    bool has[FB_WIRE_MAX_DEVICES];
    fb_wire_device_step step[FB_WIRE_MAX_DEVICES];
} span;

/* A group that is not finished: whom its messages must come from. */
typedef struct group {
    char id[FB_WIRE_ID_LEN + 1];
    int64_t generation;
    char worker[FB_WIRE_NAME_MAX + 1]; /* of a group that spans workers: its leader */
    /* when its worker re-registered without it (0: not missing); its last events may still
     * be on their way, so it is re-queued only if it stays missing a heartbeat timeout */
    int64_t missing_since_ms;
    /* "the requeue waits for the array's events" logged (once per group) */
    bool requeue_wait_said;
    /* its worker has listed it as running since it was assigned (or found at start), and
     * when that was: a worker that stops listing it, or never does within a heartbeat
     * timeout, no longer runs it (reconcile), whether it says so in a HELLO or a heartbeat */
    bool listed;
    int64_t assigned_ms;
    /* the furthest step its members reported: whether a loss came after progress */
    int64_t high_step;
    /* its workers, when it spans several (malloc'd; NULL for a group on one worker) */
    span *span;
    /* its step time and the busy part of it (compute, communication, I/O: waiting for its
     * turn on a shared device left out), measured by dsp_note_step_time and smoothed as the
     * fair-share controller wants (fb_fair_ewma); 0 until measured */
    double step_ms, busy_ms;
    int64_t reports;   /* PROGRESS reports received since it was assigned (or found) */
    int64_t base_step; /* where the step being measured began: the furthest member step */
    int64_t base_ms;   /* and when that report arrived */
    /* each of its devices' speed by the worker's device index (of a group that spans
     * workers: by rank): samples per second of the
     * device's training passes, from the reports' per-device breakdown (dsp_note_device_steps),
     * smoothed as the fair-share controller wants; 0 until measured.  What splits its batch. */
    double dev_rate[FB_WIRE_MAX_DEVICES];
    /* the latest per-device breakdown, for the fair-share period's gauges */
    int n_dev;
    fb_wire_device_step dev[FB_WIRE_MAX_DEVICES];
    /* the fair-share controller's memory of a split gap that has not yet been closed
     * (fairshare.h), handed back to it each period; empty for a new group */
    fb_fair_memory fair;
} group;

typedef struct pending {
    struct pending *next;
    char worker[FB_WIRE_NAME_MAX + 1];
    fb_wire_msg m;
    void *blob; /* EVENT: the referenced blob, copied */
    size_t blob_len;
    /* EVENT: a checkpoint of an array that was no longer current when it arrived (its
     * jobs were requeued): apply_late_checkpoint decides whether it is kept */
    bool late;
    /* PROGRESS: the step's wall-clock time and busy part of the window it closed
     * (dsp_note_step_time), 0 when none; and the group's smoothed ones after it */
    double step_ms, busy_ms, smooth_step_ms, smooth_busy_ms;
    /* PROGRESS of a group that spans workers: its device breakdown over all ranks (JSON,
     * malloc'd), NULL when it has none */
    char *span_breakdown;
} pending;

typedef struct queue {
    pending *head, *tail;
    int n;
} queue;

/* How many messages one peer (by routing id) had read in a tick's drain. */
typedef struct peer_reads {
    char name[FB_WIRE_NAME_MAX + 1]; /* "" = a free slot */
    int reads;
} peer_reads;

typedef struct keyinfo {
    char key[FB_FUSION_KEY_HEX + 1];
    int64_t member, shared, batch;
    int data, pipeline;
} keyinfo;

/* A queue reason to write (write_reasons); reason is a static text of the planner's. */
typedef struct reason_todo {
    char job[FB_WIRE_ID_LEN + 1];
    const char *reason;
} reason_todo;

typedef struct detach_sent {
    char job[FB_WIRE_ID_LEN + 1];
    int64_t at_ms;
} detach_sent;

struct fb_dispatch {
    fb_config cfg;
    char artifacts[PATH_MAX];
    void *zctx, *router, *zap, *ctl_rx, *ctl_tx;
    char pub[41], sec[41];
    char (*keys)[41]; /* the worker-keys file's, DSP_MAX_KEYS */
    int n_keys;
    struct timespec keys_mtime;
    bool keys_missing_said;
    char (*db_keys)[41]; /* the live keys registered in worker_keys, DSP_MAX_KEYS */
    int n_db_keys;
    bool db_keys_full_said;
    char msg_key[41]; /* the CURVE key of the message being read ("" when unknown) */
    pthread_t thread;
    bool thread_started;

    PGconn *pg;
    bool pg_ready;                /* pg holds the control lock and its session is set up */
    atomic_bool lock_lost;        /* another session holds the control lock: the loop stopped */
    void (*on_step_down)(void *); /* told once, from the loop's thread (fb_dispatch_start) */
    void *step_down_arg;
    int64_t pg_retry_ms;
    int pg_backoff_ms;
    bool pg_down_said;
    bool artifact_fail_said; /* "cannot write an artifact" logged until one succeeds */
    bool groups_loaded;

    int64_t start_ms;
    worker *workers;
    int n_workers;
    group *groups;
    int n_groups, cap_groups;
    queue events, progress;
    keyinfo *kinfo;
    int n_kinfo, cap_kinfo;
    detach_sent *detached;
    int n_detached, cap_detached;
    bool plan_due;
    int64_t last_plan_ms;
    int ticks;
    int64_t last_rebalance_ms;
    fb_fair_params fair;
    fb_queue *queue;      /* the queued jobs, kept between plans (queue.h) */
    reason_todo *reasons; /* queue reasons the last plan changed, in planning order */
    int n_reasons, cap_reasons, next_reason;
    /* the census of the tick's drain (drain_router_all, peer_settled): the reads of each
     * peer in CENSUS_SLOTS slots (open addressing), the slots in use, the most reads of one
     * peer; whether it counts now, whether it lost count, whether the socket was emptied */
    peer_reads *census;
    int *census_used;
    int n_census, census_max;
    int census_anon; /* reads from peers whose routing id is no worker's name, together */
    bool census_on, census_lost, router_emptied;
};

/*
 * Names shared between the rooms carry the prefix dsp_ (the rooms' own, as
 * libuv's uv__): they are the loop's internals, linked into fb_server only.
 * Everything here runs on the loop's thread.
 */

/* ---- dispatch_keys.c: who may connect ---------------------------------------- */

/* The most keys each source (the file, the database) holds at once. */
#define DSP_MAX_KEYS 4096
#define DSP_MAX_KEYS_S "4096"

/* Reads the worker-keys file again when it changed. */
void dsp_keys_reload_file(fb_dispatch *d);
/* Reads the registered keys again (when PostgreSQL answers), then the file. */
void dsp_keys_reload(fb_dispatch *d);
/* Whether key (Z85, 40) is allowed now: in the file's or the registered list, or, with
 * ask_db, registered and live in the database (then cached). */
bool dsp_key_allowed(fb_dispatch *d, const char *key, bool ask_db);
/* Answers one ZAP request waiting on d->zap. */
void dsp_on_zap(fb_dispatch *d);

/* ---- dispatch.c: the loop's connection, registry and socket ---------------- */

/* Real time in seconds and milliseconds, for budgets alone (dispatch.c says why). */
double dsp_real_s(void);
int64_t dsp_real_ms(void);

/* Parses up to cap integers out of a PostgreSQL array literal ("{1,2}"). */
int dsp_parse_ints(const char *p, int64_t *out, int cap);
/* strcmp of two char * (qsort, bsearch); the index of s among n sorted ids, -1 when absent. */
int dsp_cmp_str(const void *a, const void *b);
int dsp_tenant_index(char **sorted, int n, const char *s);

/* Whether the loop's PostgreSQL connection is usable now; reconnects with backoff. */
bool dsp_db_ok(fb_dispatch *d);
/* Runs one statement; NULL (logged) on failure.  The caller PQclear()s. */
PGresult *dsp_q(fb_dispatch *d, const char *sql, int n, const char *const *vals);
/* Runs one statement and drops its result; false (logged) on failure. */
bool dsp_exec(fb_dispatch *d, const char *sql, int n, const char *const *vals);
bool dsp_begin(fb_dispatch *d);
/* COMMIT; false also when PostgreSQL rolled the transaction back instead. */
bool dsp_commit(fb_dispatch *d);
void dsp_rollback(fb_dispatch *d);
/* Takes the PostgreSQL notifications that arrived: a plan is due. */
void dsp_take_notifies(fb_dispatch *d);

/* The registered worker of that routing id, or NULL. */
worker *dsp_find_worker(fb_dispatch *d, const char *name);
/* The followed group of that id, or NULL. */
group *dsp_find_group(fb_dispatch *d, const char *id);
/* Follows a new group (assigned now, on the clock); false when memory runs out. */
bool dsp_add_group(fb_dispatch *d, const char *id, int64_t gen, const char *worker_name);
/* Forgets a followed group (its span freed). */
void dsp_drop_group(fb_dispatch *d, const char *id);
/* The rank of worker name's device dev in a group that spans workers, or -1. */
int dsp_span_rank(const group *g, const char *name, int dev);

/* Sends m (plus blobs) to a worker; false when it cannot be delivered now. */
bool dsp_send(fb_dispatch *d, const char *name, const fb_wire_msg *m, const void *const *blobs,
              const size_t *lens, int n_blobs);
/* Tells a worker to detach a member (job_id) or, with job_id NULL, a whole group. */
void dsp_send_detach(fb_dispatch *d, const char *worker_name, const char *group_id, int64_t gen,
                     const char *job_id, const char *why, bool keep_state);

/* Whether a DETACH for key (a job id, or a group id) went out less than DETACH_RESEND_MS
 * before t; if not, records t as its last sending. */
bool dsp_detach_recent(fb_dispatch *d, const char *key, int64_t t);

/* ---- dispatch_record.c: what workers report --------------------------------- */

/* An artifact (path relative to the artifacts directory), or of the tenant's own
 * directory, read into memory; NULL when it cannot be or leads outside. */
void *dsp_read_artifact(fb_dispatch *d, const char *rel, size_t *len);
void *dsp_read_tenant_artifact(fb_dispatch *d, const char *tenant, const char *rel, size_t *len);

/* The reports that wait: a FIFO of malloc'd entries. */
void dsp_pending_free(pending *p);
void dsp_push(queue *qq, pending *p);
pending *dsp_pop(queue *qq);

/* Writes the queued events in order, acknowledging each once committed. */
void dsp_flush_events(fb_dispatch *d);
/* Writes queued progress reports within a budget, timed (fb_metrics_control). */
void dsp_flush_progress(fb_dispatch *d);
/* Recomputes the utilization of group_id's devices (after its report, or its end). */
bool dsp_update_utilization(fb_dispatch *d, const char *group_id);

/* What a PROGRESS report of a current group measures: its step time (*step_ms and
 * *busy_ms of the window it closes, 0 when none) and its devices' speeds. */
void dsp_note_step_time(fb_dispatch *d, const fb_wire_msg *m, double *step_ms, double *busy_ms);
void dsp_note_device_steps(fb_dispatch *d, const char *name, const fb_wire_msg *m);
/* The device breakdown of a group that spans workers as JSON (malloc'd), or NULL. */
char *dsp_span_breakdown_json(const group *g);

/* ---- dispatch_asha.c: early stopping ---------------------------------------- */

/*
 * In apply_event's transaction, behind a savepoint: a failure of their own is
 * undone alone; false only when the transaction is lost.  On an evaluation of
 * a trial under an ASHA rule, records its rung result and decides (*stop: the
 * member is to be detached once the transaction commits, dsp_asha_send_stop).
 * On a member's departure, ends it completed when its rule stopped it
 * (*stopped).
 */
bool dsp_asha_on_evaluated(fb_dispatch *d, const fb_wire_msg *m, bool *stop);
bool dsp_asha_on_detached(fb_dispatch *d, const fb_wire_msg *m, bool *stopped);
/* After COMMIT: detaches the member its rule stopped, if its array is still current. */
void dsp_asha_send_stop(fb_dispatch *d, const fb_wire_msg *m);

/* ---- dispatch_plan.c: the planning adapter ---------------------------------- */

/* One planning round (snapshot, planner.h, decisions), timed (fb_metrics_control). */
void dsp_plan(fb_dispatch *d);
/* Writes queue reasons the last plan left to write until budget_s has passed; returns
 * how many it wrote. */
int dsp_write_reasons(fb_dispatch *d, double budget_s);

/* ---- dispatch_fair.c: the fair-share adapter -------------------------------- */

/* One fair-share period (snapshot, fairshare.h, decisions), timed. */
void dsp_rebalance(fb_dispatch *d);

/* ---- dispatch_requeue.c: back to the queue ---------------------------------- */

/*
 * Returns group g's members to the queue, each from its resume point, and finishes it
 * (why says why; lost_on, the worker that was lost or dropped the array, counts the loss
 * toward the poison streak, NULL when it does not); of a group that spans workers, its
 * other workers still registered are told to stop it.  g is gone when this returns true.
 */
bool dsp_requeue_spanning(fb_dispatch *d, group *g, const char *why, const char *lost_on);
/* The stale-state check: jobs and arrays left outside every group the loop follows, past
 * a grace, back to the queue or finished. */
void dsp_check_stale(fb_dispatch *d);

#endif
