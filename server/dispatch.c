/*
 * The control loop: the workers' socket and its ZAP check, the registry of
 * workers and of the groups it follows, the loop and its tick (lost
 * workers, cancelled members).  Its rooms (dispatch_impl.h) do the rest on
 * the same thread: dispatch_record.c what workers report, dispatch_asha.c
 * early stopping, dispatch_plan.c the planner's rounds, dispatch_fair.c the
 * fair-share periods, dispatch_requeue.c the returns to the queue and the
 * stale-state check.  Everything runs on the loop's one thread; the only
 * shared state is the socket pair fb_dispatch_stop uses to wake it.
 *
 * PostgreSQL is reached through the loop's own connection.  When it is
 * away, the loop keeps running: heartbeats are answered, reports queue in
 * memory (events unacknowledged, so workers keep them too) and are written
 * once the connection is back.
 */
#include "dispatch.h"
#include "dispatch_impl.h"

#include <errno.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <limits.h>
#include <pthread.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "clock.h"
#include "db.h"
#include "errors.h"
#include "fairshare.h"
#include "log.h"
#include "metrics.h"
#include "queue.h"
#include "wire.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define CTL_ENDPOINT "inproc://fusebox-dispatch-ctl"
#define MAX_WORKERS 4096
#define MAX_PENDING_PROGRESS 100000 /* progress messages kept while PostgreSQL is away */
#define DETACH_RESEND_MS 5000
#define PLAN_MIN_GAP_MS 20
#define PLAN_EVERY_TICKS 10
/* time for writing queue reasons per tick: the ones the last plan left (dispatch_plan.c
 * writes the head of the queue with the plan) */
#define REASONS_IN_TICK_S 0.025
/* messages a tick may read to empty the worker socket before it judges workers lost; a
 * socket still not empty is judged by the census of those reads (peer_settled) */
#define SETTLE_READS 4096
/* and the turns of the socket's fair queue after which it stops reading anyway: enough to
 * settle every peer that had up to six messages waiting (peer_settled), few enough that a
 * flood costs a tick a few reads per peer rather than the whole budget, which at a
 * millisecond a message would make the tick seconds long */
#define SETTLE_TURNS 16
/* slots of the census: a power of two, twice the reads it can count */
#define CENSUS_SLOTS (2 * SETTLE_READS)
/* the stale-state check (dispatch_requeue.c) runs every this many ticks */
#define STALE_EVERY_TICKS 10

/* The loop's session: no statement may hold it longer than 10 s, and it hears of submitted and
 * cancelled jobs (the trigger of schema/002_dispatch.sql). */
static const char sql_session_timeout[] = "SET statement_timeout = 10000";
static const char sql_listen[] = "LISTEN fusebox_jobs";

/* The groups that are not finished, and their workers' names ("" when gone). */
static const char sql_groups_open[] =
    "SELECT g.id, g.generation, coalesce(w.name, '') FROM groups g"
    " LEFT JOIN workers w ON w.id = g.worker_id WHERE g.state <> 'finished'";

/* The workers of the unfinished groups that span several, leader (rank 0) first. */
static const char sql_group_workers_open[] =
    "SELECT gw.group_id, w.name, gw.rank_base, gw.n_ranks, gw.device_idx::text,"
    " g.parallel_data, coalesce(g.comm_port, 0) FROM group_workers gw"
    " JOIN groups g ON g.id = gw.group_id JOIN workers w ON w.id = gw.worker_id"
    " WHERE g.state <> 'finished' ORDER BY gw.group_id, gw.rank_base";

/* A worker's HELLO: registered (again) as ready; its id comes back. */
static const char sql_worker_upsert[] =
    "INSERT INTO workers (name, state, backend, version, last_seen_at)"
    " VALUES ($1, 'ready', $2, $3, now()) ON CONFLICT (name) DO UPDATE SET"
    " state = 'ready', backend = EXCLUDED.backend, version = EXCLUDED.version,"
    " registered_at = now(), last_seen_at = now() RETURNING id";

/* The devices a worker no longer has ($2: how many it has now). */
static const char sql_devices_trim[] =
    "DELETE FROM devices WHERE worker_id = $1::uuid AND idx >= $2::int";

/* One device of a worker's HELLO. */
static const char sql_device_upsert[] =
    "INSERT INTO devices (worker_id, idx, kind, name, memory_bytes)"
    " VALUES ($1::uuid, $2::int, $3, $4, $5::bigint) ON CONFLICT (worker_id, idx)"
    " DO UPDATE SET kind = EXCLUDED.kind, name = EXCLUDED.name,"
    " memory_bytes = EXCLUDED.memory_bytes";

/* The jobs training in a group ($1). */
static const char sql_group_jobs[] = "SELECT id FROM jobs WHERE group_id = $1::uuid AND in_group";

/* A worker that drains ($1 its name). */
static const char sql_worker_draining[] = "UPDATE workers SET state = 'draining' WHERE name = $1";

/* Cancelled jobs still inside an array, with the array's generation and worker. */
static const char sql_cancelled_members[] =
    "SELECT j.id, g.id, g.generation, coalesce(w.name, '') FROM jobs j"
    " JOIN groups g ON g.id = j.group_id LEFT JOIN workers w ON w.id = g.worker_id"
    " WHERE j.in_group AND j.state = 'cancelled'";

/* A worker silent for a heartbeat timeout ($1 its name). */
static const char sql_worker_lost[] = "UPDATE workers SET state = 'lost' WHERE name = $1";

/* The registered workers ($1 their names) seen now; a worker taken for lost is ready again. */
static const char sql_workers_seen[] =
    "UPDATE workers SET last_seen_at = now(), state = CASE WHEN state ="
    " 'lost' THEN 'ready' ELSE state END WHERE name = ANY($1::text[])";

/* ---- helpers the rooms share, and PostgreSQL ---------------------------------- */

/*
 * Real time, in seconds and milliseconds, for budgets alone: how long one pass of the
 * loop may spend on a flush, a plan's new arrays or queue reasons before it yields, and
 * how long a phase took (fb_metrics_control).  They bound the loop's real latency and
 * decide nothing a test asserts, and a manual clock, which stands still while the pass
 * runs, would never end a budget.  Every decision reads fb_clock_ms (base/clock.h).
 */
double dsp_real_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int64_t dsp_real_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Parses up to cap integers out of a PostgreSQL array literal ("{1,2}"). */
int dsp_parse_ints(const char *p, int64_t *out, int cap)
{
    int n = 0;
    while (*p && n < cap) {
        while (*p && *p != '-' && (*p < '0' || *p > '9'))
            p++;
        if (!*p) break;
        char *end;
        out[n++] = strtoll(p, &end, 10);
        if (end == p) break;
        p = end;
    }
    return n;
}

int dsp_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Index of uuid s among the sorted tenant ids, -1 when absent. */
int dsp_tenant_index(char **sorted, int n, const char *s)
{
    char **hit = bsearch(&s, sorted, (size_t)n, sizeof *sorted, dsp_cmp_str);
    return hit ? (int)(hit - sorted) : -1;
}

static bool load_groups(fb_dispatch *d);

/* Takes the control lock on a new connection, before anything is written through it: the
 * session that held it died with the old connection.  False when the lock is another
 * session's (the loop steps down) or the question failed (a retry later). */
static bool retake_lock(fb_dispatch *d, int64_t t)
{
    PGresult *r = PQexec(d->pg, FB_CONTROL_LOCK_SQL);
    bool answered = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
    bool held = answered && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    if (held) return true;
    PQfinish(d->pg);
    d->pg = NULL;
    d->pg_retry_ms = t + 1000;
    if (answered) {
        fb_logf(FB_LOG_WARN, "control loop: another fuseboxd holds the control lock; stepping "
                             "down");
        atomic_store(&d->lock_lost, true);
        if (d->on_step_down) d->on_step_down(d->step_down_arg);
    }
    return false;
}

/* Whether the loop's connection is usable now; reconnects with backoff.  The connection
 * holds the control lock (dispatch.h): a new one takes it first. */
bool dsp_db_ok(fb_dispatch *d)
{
    if (atomic_load(&d->lock_lost)) return false;
    bool up = d->pg && PQstatus(d->pg) == CONNECTION_OK;
    if (up && d->pg_ready) return true;
    int64_t t = fb_clock_ms();
    if (!up) {
        if (t < d->pg_retry_ms) return false;
        if (d->pg) PQfinish(d->pg);
        d->pg_ready = false;
        /* what changed while the connection was away is read whole */
        fb_queue_invalidate(d->queue);
        const char *keys[] = {"dbname", "connect_timeout", "application_name", NULL};
        const char *vals[] = {d->cfg.database_url, "2", "fuseboxd-control", NULL};
        d->pg = PQconnectdbParams(keys, vals, 1);
        if (PQstatus(d->pg) != CONNECTION_OK) {
            if (!d->pg_down_said)
                fb_log_json(FB_LOG_WARN,
                            "control loop: PostgreSQL unreachable; reports wait in memory",
                            json_pack("{s:s}", "detail", PQerrorMessage(d->pg)));
            d->pg_down_said = true;
            d->pg_backoff_ms = d->pg_backoff_ms ? d->pg_backoff_ms * 2 : 200;
            if (d->pg_backoff_ms > 2000) d->pg_backoff_ms = 2000;
            d->pg_retry_ms = t + d->pg_backoff_ms;
            return false;
        }
        if (!retake_lock(d, t)) return false;
    }
    PQclear(PQexec(d->pg, sql_session_timeout));
    PGresult *r = PQexec(d->pg, sql_listen);
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (!ok) {
        PQfinish(d->pg);
        d->pg = NULL;
        d->pg_retry_ms = t + 1000;
        return false;
    }
    if (d->pg_down_said) fb_logf(FB_LOG_INFO, "control loop: PostgreSQL is back");
    d->pg_ready = true;
    d->pg_down_said = false;
    d->pg_backoff_ms = 0;
    d->plan_due = true;
    if (!d->groups_loaded && !load_groups(d)) return false;
    /* the whole queue once per connection, here rather than in the first plan: loading
     * state, like the groups, not a decision (at 10,000 queued jobs it takes about as long
     * as the 50 ms a decision has); a failure leaves it to the next plan */
    char msg[256];
    if (fb_queue_sync(d->queue, d->pg, NULL, msg, sizeof msg))
        fb_log_json(FB_LOG_WARN, "control loop: the queue could not be read",
                    json_pack("{s:s}", "error", msg));
    return true;
}

/* Runs one statement; NULL (logged) on failure.  The caller PQclear()s. */
PGresult *dsp_q(fb_dispatch *d, const char *sql, int n, const char *const *vals)
{
    if (!d->pg) return NULL;
    PGresult *r = PQexecParams(d->pg, sql, n, NULL, vals, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return r;
    fb_log_json(FB_LOG_WARN, "control loop: query failed",
                json_pack("{s:s, s:s}", "error", PQresultErrorMessage(r), "sql",
                          strlen(sql) > 80 ? "(long)" : sql));
    PQclear(r);
    return NULL;
}

bool dsp_exec(fb_dispatch *d, const char *sql, int n, const char *const *vals)
{
    PGresult *r = dsp_q(d, sql, n, vals);
    PQclear(r);
    return r != NULL;
}

bool dsp_begin(fb_dispatch *d)
{
    return dsp_exec(d, "BEGIN", 0, NULL);
}
/* COMMIT; false also when PostgreSQL rolled the transaction back instead (a
 * statement of it had failed), which it reports as a successful ROLLBACK. */
bool dsp_commit(fb_dispatch *d)
{
    PGresult *r = dsp_q(d, "COMMIT", 0, NULL);
    bool ok = r && strcmp(PQcmdStatus(r), "COMMIT") == 0;
    if (r && !ok)
        fb_log_json(FB_LOG_WARN, "control loop: a transaction was rolled back at its commit",
                    json_pack("{s:s}", "status", PQcmdStatus(r)));
    PQclear(r);
    return ok;
}
void dsp_rollback(fb_dispatch *d)
{
    if (d->pg && PQstatus(d->pg) == CONNECTION_OK) PQclear(PQexec(d->pg, "ROLLBACK"));
}

/* ---- registry of workers and groups -------------------------------------- */

worker *dsp_find_worker(fb_dispatch *d, const char *name)
{
    for (int i = 0; i < d->n_workers; i++)
        if (strcmp(d->workers[i].name, name) == 0) return &d->workers[i];
    return NULL;
}

static void drop_worker(fb_dispatch *d, worker *w)
{
    int i = (int)(w - d->workers);
    fb_metrics_worker_remove(w->seen_slot);
    d->workers[i] = d->workers[--d->n_workers];
}

group *dsp_find_group(fb_dispatch *d, const char *id)
{
    for (int i = 0; i < d->n_groups; i++)
        if (strcmp(d->groups[i].id, id) == 0) return &d->groups[i];
    return NULL;
}

bool dsp_add_group(fb_dispatch *d, const char *id, int64_t gen, const char *worker_name)
{
    if (d->n_groups == d->cap_groups) {
        int cap = d->cap_groups ? 2 * d->cap_groups : 64;
        group *g = realloc(d->groups, (size_t)cap * sizeof *g);
        if (!g) return false;
        d->groups = g;
        d->cap_groups = cap;
    }
    group *g = &d->groups[d->n_groups++];
    snprintf(g->id, sizeof g->id, "%s", id);
    g->generation = gen;
    snprintf(g->worker, sizeof g->worker, "%s", worker_name);
    g->missing_since_ms = 0;
    g->requeue_wait_said = false;
    g->listed = false;
    g->assigned_ms = fb_clock_ms();
    g->high_step = 0;
    fb_fair_memory_init(&g->fair);
    g->span = NULL;
    g->step_ms = g->busy_ms = 0;
    g->reports = g->base_step = g->base_ms = 0;
    memset(g->dev_rate, 0, sizeof g->dev_rate);
    g->n_dev = 0;
    return true;
}

void dsp_drop_group(fb_dispatch *d, const char *id)
{
    group *g = dsp_find_group(d, id);
    if (!g) return;
    free(g->span);
    *g = d->groups[--d->n_groups];
}

/* The entry of worker name in a group that spans workers, or NULL. */
static span_member *span_find(const group *g, const char *name)
{
    if (!g->span) return NULL;
    for (int i = 0; i < g->span->n; i++)
        if (strcmp(g->span->m[i].worker, name) == 0) return &g->span->m[i];
    return NULL;
}

/* Whether worker name runs (a part of) group g. */
static bool group_has_worker(const group *g, const char *name)
{
    return g->span ? span_find(g, name) != NULL : strcmp(g->worker, name) == 0;
}

/* The rank of worker name's device dev in a group that spans workers, or -1. */
int dsp_span_rank(const group *g, const char *name, int dev)
{
    const span_member *sm = span_find(g, name);
    for (int i = 0; sm && i < sm->n_ranks; i++)
        if (sm->dev[i] == dev) return sm->rank_base + i;
    return -1;
}

/* Adds worker name with its ranks to group g's span (made on first use); false when memory
 * runs out or the ranks do not fit. */
static bool span_add(group *g, int world, int port, const char *name, int rank_base, const int *dev,
                     int n_ranks)
{
    if (world < 2 || world > FB_WIRE_MAX_DEVICES || rank_base < 0 || n_ranks < 1 ||
        rank_base + n_ranks > world)
        return false;
    if (!g->span) {
        g->span = calloc(1, sizeof *g->span);
        if (!g->span) return false;
        g->span->world = world;
        g->span->port = port;
    }
    span *sp = g->span;
    if (sp->n == FB_WIRE_MAX_DEVICES || span_find(g, name)) return false;
    span_member *sm = &sp->m[sp->n++];
    memset(sm, 0, sizeof *sm);
    snprintf(sm->worker, sizeof sm->worker, "%s", name);
    sm->assigned_ms = fb_clock_ms();
    sm->rank_base = rank_base;
    sm->n_ranks = n_ranks;
    memcpy(sm->dev, dev, (size_t)n_ranks * sizeof *dev);
    return true;
}

/* The groups that are not finished, from the database (once per start). */
static bool load_groups(fb_dispatch *d)
{
    PGresult *r = dsp_q(d, sql_groups_open, 0, NULL);
    if (!r) return false;
    d->n_groups = 0;
    for (int i = 0; i < PQntuples(r); i++)
        dsp_add_group(d, PQgetvalue(r, i, 0), strtoll(PQgetvalue(r, i, 1), NULL, 10),
                      PQgetvalue(r, i, 2));
    fb_log_json(FB_LOG_INFO, "control loop: groups to follow",
                json_pack("{s:i}", "groups", PQntuples(r)));
    PQclear(r);
    /* the workers of the groups that span several, leader (rank 0) first */
    r = dsp_q(d, sql_group_workers_open, 0, NULL);
    if (!r) return false;
    for (int i = 0; i < PQntuples(r); i++) {
        group *g = dsp_find_group(d, PQgetvalue(r, i, 0));
        int64_t dev[FB_WIRE_MAX_DEVICES];
        int devs[FB_WIRE_MAX_DEVICES];
        int n = dsp_parse_ints(PQgetvalue(r, i, 4), dev, FB_WIRE_MAX_DEVICES);
        for (int k = 0; k < n; k++)
            devs[k] = (int)dev[k];
        int n_ranks = (int)strtol(PQgetvalue(r, i, 3), NULL, 10);
        if (!g || n != n_ranks ||
            !span_add(g, (int)strtol(PQgetvalue(r, i, 5), NULL, 10),
                      (int)strtol(PQgetvalue(r, i, 6), NULL, 10), PQgetvalue(r, i, 1),
                      (int)strtol(PQgetvalue(r, i, 2), NULL, 10), devs, n))
            fb_log_json(FB_LOG_ERROR, "control loop: a worker of a spanning array is unreadable",
                        json_pack("{s:s, s:s}", "group_id", PQgetvalue(r, i, 0), "worker",
                                  PQgetvalue(r, i, 1)));
    }
    PQclear(r);
    d->groups_loaded = true;
    return true;
}

/* ---- sending ------------------------------------------------------------- */

/* Sends m (plus blobs) to a worker; false when it cannot be delivered now. */
bool dsp_send(fb_dispatch *d, const char *name, const fb_wire_msg *m, const void *const *blobs,
              const size_t *lens, int n_blobs)
{
    char err[256];
    char *json = fb_wire_encode(m, err, sizeof err);
    if (!json) {
        fb_log_json(FB_LOG_ERROR, "control loop: refusing to send an invalid message",
                    json_pack("{s:s, s:s}", "type", fb_wire_type_name(m->type), "error", err));
        return false;
    }
    bool ok = zmq_send(d->router, name, strlen(name), ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
              zmq_send(d->router, json, strlen(json), n_blobs ? ZMQ_SNDMORE : 0) >= 0;
    for (int i = 0; ok && i < n_blobs; i++)
        ok = zmq_send(d->router, blobs[i], lens[i], i + 1 < n_blobs ? ZMQ_SNDMORE : 0) >= 0;
    if (!ok)
        fb_log_json(FB_LOG_WARN, "control loop: could not send",
                    json_pack("{s:s, s:s, s:s}", "worker", name, "type", fb_wire_type_name(m->type),
                              "error", zmq_strerror(errno)));
    free(json);
    return ok;
}

void dsp_send_detach(fb_dispatch *d, const char *worker_name, const char *group_id, int64_t gen,
                     const char *job_id, const char *why, bool keep_state)
{
    fb_wire_msg m = {.type = FB_WIRE_DETACH, .generation = gen, .keep_state = keep_state};
    snprintf(m.group_id, sizeof m.group_id, "%s", group_id);
    snprintf(m.job_id, sizeof m.job_id, "%s", job_id ? job_id : "");
    snprintf(m.text, sizeof m.text, "%s", why);
    dsp_send(d, worker_name, &m, NULL, NULL, 0);
}

/* ---- messages from workers ----------------------------------------------- */

/* Whether m's group is live, of m's generation, and run (in part) by this worker. */
static bool group_current(fb_dispatch *d, const char *name, const fb_wire_msg *m)
{
    group *g = dsp_find_group(d, m->group_id);
    return g && g->generation == m->generation && group_has_worker(g, name);
}

/*
 * Compares the groups a worker says it runs with the ones assigned to it:
 * any it should not run are stopped, and the ones it no longer runs are
 * marked missing (the tick re-queues them if they stay so).  A HELLO judges
 * at once; a heartbeat only a group the worker has listed before, or one a
 * heartbeat timeout after it was assigned (a heartbeat may have left before
 * the ASSIGN arrived).  A worker stops listing a group when the group's
 * thread ended without its members' events (a spanning group's
 * communication failed, or a failure that no event reported), and one that
 * never lists it did not start it: either way no job may stay scheduled or
 * running in it.  now is the clock when the message was read: the answer to
 * it goes out first, and a test's manual clock may move once it is answered.
 */
static void reconcile(fb_dispatch *d, const char *name, const fb_wire_msg *m, bool full,
                      int64_t now)
{
    for (int i = 0; i < m->n_running; i++) {
        const fb_wire_running *r = &m->running[i];
        group *g = dsp_find_group(d, r->group_id);
        if (g && g->generation == r->generation && group_has_worker(g, name)) {
            span_member *sm = span_find(g, name);
            if (sm) {
                sm->listed = true;
                sm->missing_since_ms = 0;
            } else {
                g->listed = true;
                g->missing_since_ms = 0;
            }
        } else if (!dsp_detach_recent(d, r->group_id, now)) {
            /* once per DETACH_RESEND_MS: a worker whose link comes back reports the same
             * stale array in every HELLO and heartbeat it queued meanwhile */
            fb_log_json(FB_LOG_WARN, "a worker runs a stale array; stopping it",
                        json_pack("{s:s, s:s, s:I}", "worker", name, "group_id", r->group_id,
                                  "generation", (json_int_t)r->generation));
            dsp_send_detach(d, name, r->group_id, r->generation, NULL, "stale array", false);
        }
    }
    for (int i = 0; i < d->n_groups; i++) {
        group *g = &d->groups[i];
        span_member *sm = span_find(g, name);
        if (!sm && (g->span || strcmp(g->worker, name) != 0)) continue;
        /* a heartbeat may have left before the ASSIGN arrived; but a worker that never lists
         * the group (its leader could not bind the port, or it did not start) must not hold
         * it for ever */
        bool listed = sm ? sm->listed : g->listed;
        int64_t assigned = sm ? sm->assigned_ms : g->assigned_ms;
        if (!full && !listed && now - assigned <= d->cfg.heartbeat_timeout_ms) continue;
        bool runs = false;
        for (int k = 0; k < m->n_running; k++)
            runs |= strcmp(m->running[k].group_id, g->id) == 0 &&
                    m->running[k].generation == g->generation;
        int64_t *since = sm ? &sm->missing_since_ms : &g->missing_since_ms;
        if (!runs && !*since) *since = now;
    }
}

/*
 * Whether HELLO m of registered worker w says what w's last HELLO wrote to
 * the database (backend, version, devices; free memory aside, which the
 * database does not keep), less than a heartbeat timeout ago.  A worker that
 * hears nothing from a busy loop says HELLO every heartbeat; each HELLO
 * written again cost a transaction of round trips to PostgreSQL, so a loop
 * that fell behind fell further behind with every HELLO it took (a stall of
 * a second grew to seconds, and the worker's groups looked lost).
 */
static bool hello_same(const fb_dispatch *d, const worker *w, const fb_wire_msg *m)
{
    if (!w->id[0] || fb_clock_ms() - w->hello_ms > d->cfg.heartbeat_timeout_ms ||
        strcmp(w->backend, m->backend) != 0 || strcmp(w->version, m->version) != 0 ||
        w->n_devices != m->n_devices)
        return false;
    for (int i = 0; i < m->n_devices; i++) {
        const fb_wire_device *a = &w->devices[i], *b = &m->devices[i];
        if (a->idx != b->idx || strcmp(a->kind, b->kind) != 0 || strcmp(a->name, b->name) != 0 ||
            a->memory_bytes != b->memory_bytes)
            return false;
    }
    return true;
}

static void on_hello(fb_dispatch *d, const char *name, const fb_wire_msg *m, int64_t now)
{
    if (strcmp(m->worker, name) != 0) {
        fb_log_json(FB_LOG_WARN, "HELLO names another worker than its socket; dropped",
                    json_pack("{s:s, s:s}", "routing_id", name, "worker", m->worker));
        return;
    }
    if (!dsp_key_allowed(d, d->msg_key, false)) {
        /* let in at its handshake, revoked since: it never registers again */
        fb_log_json(FB_LOG_WARN, "HELLO from a worker whose key was revoked; dropped",
                    json_pack("{s:s}", "worker", name));
        return;
    }
    worker *w = dsp_find_worker(d, name);
    char id[FB_WIRE_ID_LEN + 1];
    if (w && hello_same(d, w, m)) {
        /* the database already says all of it: only the answer and the running groups */
        snprintf(id, sizeof id, "%s", w->id);
        goto registered;
    }
    if (!dsp_db_ok(d) || !dsp_begin(d)) return; /* no WELCOME: the worker says HELLO again */
    const char *v[3] = {name, m->backend, m->version};
    PGresult *r = dsp_q(d, sql_worker_upsert, 3, v);
    if (!r) goto fail;
    snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    char n_dev[16];
    snprintf(n_dev, sizeof n_dev, "%d", m->n_devices);
    const char *vd[2] = {id, n_dev};
    if (!dsp_exec(d, sql_devices_trim, 2, vd)) goto fail;
    for (int i = 0; i < m->n_devices; i++) {
        char idx[16], mem[24];
        snprintf(idx, sizeof idx, "%d", m->devices[i].idx);
        snprintf(mem, sizeof mem, "%lld", (long long)m->devices[i].memory_bytes);
        const char *vv[5] = {id, idx, m->devices[i].kind, m->devices[i].name, mem};
        if (!dsp_exec(d, sql_device_upsert, 5, vv)) goto fail;
    }
    if (!dsp_commit(d)) goto fail;
    w = dsp_find_worker(d, name);
    if (!w) {
        if (d->n_workers == MAX_WORKERS) {
            fb_logf(FB_LOG_ERROR, "too many workers; %s refused", name);
            return;
        }
        w = &d->workers[d->n_workers++];
        memset(w, 0, sizeof *w);
        snprintf(w->name, sizeof w->name, "%s", name);
        w->seen_slot = fb_metrics_worker_add(name, now);
    }
    snprintf(w->id, sizeof w->id, "%s", id);
    snprintf(w->backend, sizeof w->backend, "%s", m->backend);
    snprintf(w->version, sizeof w->version, "%s", m->version);
    w->hello_ms = now;
registered:
    snprintf(w->key, sizeof w->key, "%s", d->msg_key);
    w->last_seen_ms = now;
    fb_metrics_worker_seen(w->seen_slot, now);
    w->draining = false;
    w->n_devices = m->n_devices;
    memcpy(w->devices, m->devices, (size_t)m->n_devices * sizeof w->devices[0]);
    snprintf(w->comm_host, sizeof w->comm_host, "%s", m->comm_host);
    w->comm_port_lo = m->comm_host[0] ? m->comm_port_lo : 0;
    w->comm_port_hi = m->comm_host[0] ? m->comm_port_hi : 0;
    if (w->next_port < w->comm_port_lo || w->next_port > w->comm_port_hi)
        w->next_port = w->comm_port_lo;
    fb_log_json(FB_LOG_INFO, "worker registered",
                json_pack("{s:s, s:s, s:i, s:i, s:s}", "worker", name, "backend", m->backend,
                          "devices", m->n_devices, "running_groups", m->n_running, "comm_host",
                          m->comm_host));
    fb_wire_msg welcome = {.type = FB_WIRE_WELCOME, .heartbeat_ms = d->cfg.heartbeat_ms};
    snprintf(welcome.worker_id, sizeof welcome.worker_id, "%s", id);
    dsp_send(d, name, &welcome, NULL, NULL, 0);
    reconcile(d, name, m, true, now);
    d->plan_due = true;
    return;
fail:
    dsp_rollback(d);
}

/*
 * A worker that drains while it follows arrays that span workers: each such
 * array moves, every member leaving with its full state (DETACH keep_state
 * to the leader, which alone speaks for the members), so that it resumes
 * elsewhere from the step it left at.  The leader's own drain is the
 * worker's business, as for an array on one worker.
 */
static void drain_follower(fb_dispatch *d, const char *name)
{
    if (!dsp_db_ok(d)) return;
    for (int i = 0; i < d->n_groups; i++) {
        const group *g = &d->groups[i];
        if (!g->span || !span_find(g, name) || strcmp(g->worker, name) == 0 ||
            !dsp_find_worker(d, g->worker))
            continue;
        const char *v[1] = {g->id};
        PGresult *r = dsp_q(d, sql_group_jobs, 1, v);
        if (!r) return;
        for (int k = 0; k < PQntuples(r); k++) {
            dsp_send_detach(d, g->worker, g->id, g->generation, PQgetvalue(r, k, 0),
                            "a worker of the array drains", true);
            dsp_detach_recent(d, PQgetvalue(r, k, 0), fb_clock_ms());
        }
        fb_log_json(FB_LOG_INFO, "a follower drains: its spanning array moves",
                    json_pack("{s:s, s:s, s:s, s:i}", "group_id", g->id, "worker", name, "leader",
                              g->worker, "members", PQntuples(r)));
        PQclear(r);
    }
}

/* ---- the census of a tick's drain ------------------------------------------ */

static uint32_t census_hash(const char *name)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h;
}

static peer_reads *census_slot(const fb_dispatch *d, const char *name)
{
    uint32_t h = census_hash(name) & (CENSUS_SLOTS - 1);
    while (d->census[h].name[0] && strcmp(d->census[h].name, name) != 0)
        h = (h + 1) & (CENSUS_SLOTS - 1);
    return &d->census[h];
}

/* Counts a read from peer name, while the tick's drain takes its census. */
static void census_count(fb_dispatch *d, const char *name)
{
    if (!d->census_on) return;
    peer_reads *p = census_slot(d, name);
    if (!p->name[0]) {
        /* the drain reads at most SETTLE_READS messages, so this is a safeguard */
        if (d->n_census == SETTLE_READS) {
            d->census_lost = true;
            return;
        }
        snprintf(p->name, sizeof p->name, "%s", name);
        p->reads = 0;
        d->census_used[d->n_census++] = (int)(p - d->census);
    }
    if (++p->reads > d->census_max) d->census_max = p->reads;
}

static void census_reset(fb_dispatch *d)
{
    for (int i = 0; i < d->n_census; i++)
        d->census[d->census_used[i]].name[0] = '\0';
    d->n_census = d->census_max = d->census_anon = 0;
    d->census_lost = false;
}

/*
 * Whether nothing that peer `name` sent before the tick's drain began can
 * still wait unread on the worker socket, so that the tick may judge it
 * silent, or requeue an array whose events it sends (docs/wire.md,
 * "Re-queueing").  True when the drain emptied the socket.  Otherwise the
 * answer comes from how the ROUTER reads: libzmq fair-queues the peers'
 * pipes, one whole message from each pipe that holds one, in turn.  A pipe
 * found empty leaves the turn and the last pipe of the turn takes its
 * place, so a peer may be read twice before a pipe of the same turn comes
 * up, but not three times: between two reads of any peer X that still has
 * messages waiting, any other peer is read at most twice, and at most
 * twice before its first read.  So if `name` was read r times and its pipe
 * never ran empty, no peer was read more than 2r + 2 times.  A pipe that
 * leaves the turn before its own (a worker that reconnects under the same
 * name takes over its routing id) may put the last pipe of the turn back
 * by one turn: one read more is asked for that.  When some peer was read
 * 2r + 4 times, the pipe of `name` ran empty during the drain, and what it
 * had sent before was read; a silent peer (r = 0) needs a peer read four
 * times.  A flood (one peer sending faster than the loop reads) thus
 * settles every other peer within four of its turns, but never itself: a
 * flooding worker is not judged lost, and its own arrays wait while it
 * floods.  Messages still in ZeroMQ's I/O thread are as unseen here as they
 * are beside an empty socket; a pipe holds up to RCVHWM messages of its own
 * peer only, so a flood fills only the flooder's.  Counting reads by sender
 * needs no count of the connected peers, which the loop does not have (a
 * peer with a valid key need not have registered).
 */
static bool peer_settled(const fb_dispatch *d, const char *name)
{
    if (d->router_emptied) return true;
    if (d->census_lost) return false;
    const peer_reads *p = census_slot(d, name);
    int reads = p->name[0] ? p->reads : 0;
    return d->census_max >= 2 * reads + 4;
}

/* A PROGRESS report of worker name: queued for the flush (dispatch_record.c) with what it
 * measures of its group; a follower's of an array that spans workers only adds its devices'
 * breakdown.  Takes m's contents when it queues them. */
static void on_progress(fb_dispatch *d, const char *name, fb_wire_msg *m)
{
    if (!group_current(d, name, m)) {
        fb_log_json(FB_LOG_DEBUG, "stale progress dropped",
                    json_pack("{s:s, s:s}", "worker", name, "group_id", m->group_id));
        return;
    }
    if (d->progress.n >= MAX_PENDING_PROGRESS) {
        pending *old = dsp_pop(&d->progress);
        dsp_pending_free(old);
        fb_logf(FB_LOG_WARN, "progress backlog full; the oldest report was dropped");
    }
    group *g = dsp_find_group(d, m->group_id);
    if (g->span && strcmp(g->worker, name) != 0) {
        /* a follower reports only its own devices' breakdown, written with the
         * leader's next report */
        dsp_note_device_steps(d, name, m);
        return;
    }
    for (int k = 0; k < m->n_progress; k++)
        if (m->progress[k].step > g->high_step) g->high_step = m->progress[k].step;
    double step_ms, busy_ms;
    dsp_note_step_time(d, m, &step_ms, &busy_ms);
    dsp_note_device_steps(d, name, m);
    pending *p = calloc(1, sizeof *p);
    if (!p) return;
    if (g->span) p->span_breakdown = dsp_span_breakdown_json(g);
    p->step_ms = step_ms;
    p->busy_ms = busy_ms;
    p->smooth_step_ms = g->step_ms;
    p->smooth_busy_ms = g->busy_ms;
    snprintf(p->worker, sizeof p->worker, "%s", name);
    p->m = *m;
    memset(m, 0, sizeof *m);
    dsp_push(&d->progress, p);
}

/* An EVENT of worker name, with its frames fr (the blob it references): queued and written
 * at once after the progress that came first, or acknowledged and dropped when its array
 * is gone (a late checkpoint aside) or it comes from a follower.  Takes m's contents when
 * it queues them. */
static void on_event(fb_dispatch *d, const char *name, fb_wire_msg *m, zmq_msg_t *fr)
{
    /* a checkpoint of an array requeued before it arrived may still be the job's best
     * resume point (apply_late_checkpoint); it is acknowledged once decided */
    bool late = !group_current(d, name, m) && m->event == FB_EV_CHECKPOINTED && m->blob;
    if (!late && !group_current(d, name, m)) {
        /* acknowledged anyway: the array it came from is gone, and the worker
         * must not keep resending it */
        fb_log_json(FB_LOG_INFO, "stale event dropped",
                    json_pack("{s:s, s:s, s:s}", "worker", name, "group_id", m->group_id, "event",
                              fb_wire_event_name(m->event)));
        fb_wire_msg ack = {.type = FB_WIRE_ACK, .seq = m->seq, .generation = m->generation};
        snprintf(ack.group_id, sizeof ack.group_id, "%s", m->group_id);
        dsp_send(d, name, &ack, NULL, NULL, 0);
        return;
    }
    const group *eg = late ? NULL : dsp_find_group(d, m->group_id);
    if (eg && eg->span && strcmp(eg->worker, name) != 0) {
        /* only the leader of an array that spans workers speaks for its members */
        fb_log_json(FB_LOG_WARN, "a member event from a follower of a spanning array; ignored",
                    json_pack("{s:s, s:s, s:s, s:s}", "worker", name, "leader", eg->worker,
                              "group_id", m->group_id, "event", fb_wire_event_name(m->event)));
        fb_wire_msg ack = {.type = FB_WIRE_ACK, .seq = m->seq, .generation = m->generation};
        snprintf(ack.group_id, sizeof ack.group_id, "%s", m->group_id);
        dsp_send(d, name, &ack, NULL, NULL, 0);
        return;
    }
    /* a worker that registers again resends every unacknowledged event: one still
     * waiting here is acknowledged when it is written, not recorded twice */
    bool queued = false;
    for (pending *o = d->events.head; o && !queued; o = o->next)
        queued = o->m.seq == m->seq && o->m.event == m->event && o->m.step == m->step &&
                 strcmp(o->worker, name) == 0 && strcmp(o->m.group_id, m->group_id) == 0 &&
                 strcmp(o->m.job_id, m->job_id) == 0;
    if (queued) return;
    pending *p = calloc(1, sizeof *p);
    if (!p) return;
    snprintf(p->worker, sizeof p->worker, "%s", name);
    p->late = late;
    if (m->blob) {
        size_t len = zmq_msg_size(&fr[1 + m->blob]);
        p->blob = malloc(len ? len : 1);
        if (!p->blob) {
            free(p);
            return;
        }
        memcpy(p->blob, zmq_msg_data(&fr[1 + m->blob]), len);
        p->blob_len = len;
    }
    p->m = *m;
    memset(m, 0, sizeof *m);
    dsp_push(&d->events, p);
    /* progress that came first is written first: a member's last report must not find
     * it already gone from its array */
    dsp_flush_progress(d);
    dsp_flush_events(d);
}

/* Receives one multipart message from the ROUTER and acts on it. */
static void on_message(fb_dispatch *d)
{
    enum { MAX_FRAMES = 2 + FB_WIRE_MAX_BLOBS };
    zmq_msg_t *fr = malloc(MAX_FRAMES * sizeof *fr);
    if (!fr) return;
    int n = 0;
    bool more = true, overflow = false;
    while (more) {
        zmq_msg_t tmp;
        zmq_msg_init(&tmp);
        if (zmq_msg_recv(&tmp, d->router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&tmp);
            break;
        }
        more = zmq_msg_more(&tmp);
        if (n < MAX_FRAMES)
            fr[n++] = tmp;
        else {
            overflow = true;
            zmq_msg_close(&tmp);
        }
    }
    char name[FB_WIRE_NAME_MAX + 1] = "";
    bool named = false;
    if (n >= 1 && zmq_msg_size(&fr[0]) <= FB_WIRE_NAME_MAX) {
        memcpy(name, zmq_msg_data(&fr[0]), zmq_msg_size(&fr[0]));
        name[zmq_msg_size(&fr[0])] = '\0';
        named = name[0] && strlen(name) == zmq_msg_size(&fr[0]);
    }
    /* every read counts, a message that turns out malformed too: it was its turn.  Peers
     * whose routing id can be no worker's (empty, too long, with a NUL) are never judged,
     * so their reads only count together, toward the early stop of the drain: counted
     * as one peer they would break peer_settled's bound */
    if (named)
        census_count(d, name);
    else if (d->census_on)
        d->census_anon++;
    fb_wire_msg m;
    char err[256];
    if (n < 2 || overflow || !name[0] || strlen(name) != zmq_msg_size(&fr[0])) {
        fb_log_json(FB_LOG_WARN, "dropped a malformed worker message",
                    json_pack("{s:i, s:b}", "frames", n, "overflow", overflow));
        goto done;
    }
    if (fb_wire_decode(zmq_msg_data(&fr[1]), zmq_msg_size(&fr[1]), n - 2, &m, err, sizeof err)) {
        fb_log_json(FB_LOG_WARN, "dropped an invalid worker message",
                    json_pack("{s:s, s:s}", "worker", name, "error", err));
        goto done;
    }
    /* the CURVE key of its connection (the user id the ZAP handler gave it) */
    const char *uid = zmq_msg_gets(&fr[1], "User-Id");
    snprintf(d->msg_key, sizeof d->msg_key, "%s", uid && strlen(uid) == 40 ? uid : "");
    worker *w = dsp_find_worker(d, name);
    /* the time it was read, for every decision on it (reconcile), taken before any answer */
    int64_t now = fb_clock_ms();
    if (w) {
        w->last_seen_ms = now;
        fb_metrics_worker_seen(w->seen_slot, now);
    }
    if (!w && m.type != FB_WIRE_HELLO && m.type != FB_WIRE_HEARTBEAT) {
        /* a worker this server does not know (it restarted): it must say HELLO first, and
         * it keeps its unacknowledged events until then */
        fb_wire_msg reply = {.type = FB_WIRE_HEARTBEAT, .reply = true, .known = false};
        dsp_send(d, name, &reply, NULL, NULL, 0);
        goto free_msg;
    }
    switch (m.type) {
    case FB_WIRE_HELLO:
        on_hello(d, name, &m, now);
        break;
    case FB_WIRE_HEARTBEAT: {
        if (m.reply) break; /* only the server answers heartbeats */
        fb_wire_msg reply = {.type = FB_WIRE_HEARTBEAT, .reply = true, .known = w != NULL};
        dsp_send(d, name, &reply, NULL, NULL, 0);
        if (w) reconcile(d, name, &m, false, now);
        break;
    }
    case FB_WIRE_PROGRESS:
        on_progress(d, name, &m);
        break;
    case FB_WIRE_EVENT:
        on_event(d, name, &m, fr);
        break;
    case FB_WIRE_DRAIN:
        if (w && !w->draining) {
            w->draining = true;
            fb_log_json(FB_LOG_INFO, "worker draining", json_pack("{s:s}", "worker", name));
            const char *v[1] = {name};
            if (dsp_db_ok(d)) dsp_exec(d, sql_worker_draining, 1, v);
            drain_follower(d, name);
        }
        break;
    default:
        fb_log_json(FB_LOG_WARN, "a worker sent a server-only message; dropped",
                    json_pack("{s:s, s:s}", "worker", name, "type", fb_wire_type_name(m.type)));
        break;
    }
free_msg:
    fb_wire_msg_free(&m);
done:
    for (int i = 0; i < n; i++)
        zmq_msg_close(&fr[i]);
    free(fr);
}

/* ---- the tick ------------------------------------------------------------ */

/*
 * Whether a DETACH for key (a job id, or a group id for a whole stale array)
 * went out less than DETACH_RESEND_MS before t; if not, records t as its
 * last sending.  Entries ten periods old are forgotten when the list is
 * full, so that it stays as long as the DETACHes of the last minute.
 */
bool dsp_detach_recent(fb_dispatch *d, const char *key, int64_t t)
{
    for (int i = 0; i < d->n_detached; i++)
        if (strcmp(d->detached[i].job, key) == 0) {
            if (t - d->detached[i].at_ms < DETACH_RESEND_MS) return true;
            d->detached[i].at_ms = t;
            return false;
        }
    if (d->n_detached == d->cap_detached) {
        int kept = 0;
        for (int i = 0; i < d->n_detached; i++)
            if (t - d->detached[i].at_ms < 10 * DETACH_RESEND_MS)
                d->detached[kept++] = d->detached[i];
        d->n_detached = kept;
    }
    if (d->n_detached == d->cap_detached) {
        int cap = d->cap_detached ? 2 * d->cap_detached : 16;
        detach_sent *n = realloc(d->detached, (size_t)cap * sizeof *n);
        if (!n) return false;
        d->detached = n;
        d->cap_detached = cap;
    }
    snprintf(d->detached[d->n_detached].job, sizeof d->detached[0].job, "%s", key);
    d->detached[d->n_detached++].at_ms = t;
    return false;
}

/* Cancelled jobs still inside a running array are detached from it. */
static void detach_cancelled(fb_dispatch *d)
{
    PGresult *r = dsp_q(d, sql_cancelled_members, 0, NULL);
    if (!r) return;
    int64_t t = fb_clock_ms();
    for (int i = 0; i < PQntuples(r); i++) {
        const char *w = PQgetvalue(r, i, 3);
        if (!dsp_find_worker(d, w) || dsp_detach_recent(d, PQgetvalue(r, i, 0), t)) continue;
        dsp_send_detach(d, w, PQgetvalue(r, i, 1), strtoll(PQgetvalue(r, i, 2), NULL, 10),
                        PQgetvalue(r, i, 0), "cancelled", false);
    }
    /* forget old entries */
    for (int i = 0; i < d->n_detached; i++)
        if (t - d->detached[i].at_ms > 10 * DETACH_RESEND_MS)
            d->detached[i--] = d->detached[--d->n_detached];
    PQclear(r);
}

/* ---- timed phases ---------------------------------------------------------- */

/* Whether a message waits on the worker socket. */
static bool router_readable(fb_dispatch *d)
{
    int ev = 0;
    size_t sz = sizeof ev;
    return zmq_getsockopt(d->router, ZMQ_EVENTS, &ev, &sz) == 0 && (ev & ZMQ_POLLIN);
}

/* Handles the messages waiting on the worker socket, at most 256 at a time so
 * that the loop's other duties keep their turn. */
static void drain_router(fb_dispatch *d)
{
    for (int k = 0; k < 256 && router_readable(d); k++)
        on_message(d);
}

/* Handles every message waiting on the worker socket, up to SETTLE_READS of
 * them or until one peer (or the peers without a worker's routing id,
 * together) has had SETTLE_TURNS reads (a flood), and takes the census of
 * those reads that peer_settled judges by. */
static void drain_router_all(fb_dispatch *d)
{
    census_reset(d);
    d->census_on = true;
    for (int k = 0; k < SETTLE_READS && d->census_max < SETTLE_TURNS &&
                    d->census_anon < SETTLE_TURNS && router_readable(d);
         k++)
        on_message(d);
    d->census_on = false;
    d->router_emptied = !router_readable(d);
}

/* Whether an event of group_id's current assignment waits to be written. */
static bool events_waiting(const fb_dispatch *d, const char *group_id)
{
    for (const pending *e = d->events.head; e; e = e->next)
        if (!e->late && strcmp(e->m.group_id, group_id) == 0) return true;
    return false;
}

static void tick(fb_dispatch *d)
{
    int64_t t = fb_clock_ms();
    d->ticks++;
    dsp_keys_reload(d);
    /* what waits on the socket first, all of it: a busy loop must not call a worker silent
     * whose heartbeats are queued here, nor requeue an array whose last checkpoint is; when
     * a flood keeps the socket from emptying, each worker is judged only once its own
     * messages are known read (peer_settled), so that one flooding worker does not hold
     * back the judgement of all the others */
    drain_router_all(d);
    /* and every event received is written before a requeue reads the resume point: a
     * checkpoint, a detachment with its state or a finished job that arrived before the
     * decision must count in it (docs/wire.md, "Re-queueing") */
    dsp_flush_events(d);
    /* workers whose key was revoked are lost at once */
    for (int i = 0; i < d->n_workers; i++) {
        worker *w = &d->workers[i];
        if (dsp_key_allowed(d, w->key, false)) continue;
        fb_log_json(FB_LOG_WARN, "worker dropped: its key was revoked",
                    json_pack("{s:s}", "worker", w->name));
        const char *v[1] = {w->name};
        if (dsp_db_ok(d)) dsp_exec(d, sql_worker_lost, 1, v);
        drop_worker(d, w);
        i--;
    }
    /* silent workers are lost */
    for (int i = 0; i < d->n_workers; i++) {
        worker *w = &d->workers[i];
        if (t - w->last_seen_ms <= d->cfg.heartbeat_timeout_ms || !peer_settled(d, w->name))
            continue;
        fb_log_json(FB_LOG_WARN, "worker lost: no heartbeat",
                    json_pack("{s:s, s:I}", "worker", w->name, "silent_ms",
                              (json_int_t)(t - w->last_seen_ms)));
        const char *v[1] = {w->name};
        if (dsp_db_ok(d)) dsp_exec(d, sql_worker_lost, 1, v);
        drop_worker(d, w);
        i--;
    }
    /* arrays whose worker is gone go back to the queue (after a grace period at start, so
     * that workers can re-register after a restart of fuseboxd) */
    if (t - d->start_ms > d->cfg.heartbeat_timeout_ms && d->groups_loaded) {
        for (int i = 0; i < d->n_groups; i++) {
            group *g = &d->groups[i];
            const char *why = NULL, *who = g->worker;
            /* whether the loss counts toward the poison streak (sql_loss_streak): a worker
             * that died or dropped the array does; a draining worker and a spanning
             * array's broken communication (its rendezvous port taken, a partition between
             * its workers) are the infrastructure's alone */
            bool lossy = true;
            const worker *gw = dsp_find_worker(d, g->worker);
            if (!gw) {
                why = "worker lost";
            } else if (g->missing_since_ms &&
                       t - g->missing_since_ms > d->cfg.heartbeat_timeout_ms) {
                why = "the worker no longer runs the array";
                lossy = !gw->draining;
            }
            for (int k = 0; !why && g->span && k < g->span->n; k++) {
                const span_member *sm = &g->span->m[k];
                who = sm->worker;
                if (!dsp_find_worker(d, sm->worker)) {
                    why = "a worker of the array was lost";
                } else if (sm->missing_since_ms &&
                           t - sm->missing_since_ms > d->cfg.heartbeat_timeout_ms) {
                    why = "a worker of the array no longer runs it";
                    lossy = false;
                }
            }
            /* the array's events come from its worker (of a spanning one: its leader), and a
             * heartbeat of the worker it is missing from may list it again: neither may wait
             * unread, nor the HELLO of a worker not registered since fuseboxd started */
            if (!why || !peer_settled(d, g->worker) || !peer_settled(d, who)) continue;
            if (events_waiting(d, g->id)) {
                /* they could not be written (PostgreSQL away, the artifacts unwritable):
                 * the array waits for them rather than resume from an older point */
                if (!g->requeue_wait_said)
                    fb_log_json(FB_LOG_WARN, "the requeue of an array waits for its events",
                                json_pack("{s:s, s:s}", "group_id", g->id, "why", why));
                g->requeue_wait_said = true;
                continue;
            }
            char lost_on[FB_WIRE_NAME_MAX + 1];
            snprintf(lost_on, sizeof lost_on, "%s", who);
            if (!dsp_requeue_spanning(d, g, why, lossy ? lost_on : NULL)) break;
            i--;
        }
    }
    dsp_flush_progress(d);
    if (dsp_db_ok(d)) {
        detach_cancelled(d);
        /* after the same grace at start as the requeues: the groups are loaded, and the
         * workers had their chance to list theirs */
        if (d->groups_loaded && t - d->start_ms > d->cfg.heartbeat_timeout_ms &&
            d->ticks % STALE_EVERY_TICKS == 0)
            dsp_check_stale(d);
        if (d->n_workers) {
            const char **names = malloc((size_t)d->n_workers * sizeof *names);
            if (names) {
                for (int i = 0; i < d->n_workers; i++)
                    names[i] = d->workers[i].name;
                char *a = fb_db_text_array(names, d->n_workers);
                const char *v[1] = {a};
                if (a) dsp_exec(d, sql_workers_seen, 1, v);
                free(a);
                free(names);
            }
        }
    }
    if (d->plan_due || d->ticks % PLAN_EVERY_TICKS == 0) dsp_plan(d);
    if (dsp_db_ok(d)) {
        dsp_write_reasons(d, REASONS_IN_TICK_S);
        fb_queue_maintain(d->queue, d->pg);
    }
    if (d->cfg.rebalance_ms > 0 && t - d->last_rebalance_ms >= d->cfg.rebalance_ms)
        dsp_rebalance(d);
    fb_metrics_tick(t);
}

/* A submission or cancellation was notified: plan soon. */
void dsp_take_notifies(fb_dispatch *d)
{
    if (!d->pg) return;
    PGnotify *nt;
    while ((nt = PQnotifies(d->pg))) {
        d->plan_due = true;
        PQfreemem(nt);
    }
}

static void *loop(void *arg)
{
    fb_dispatch *d = arg;
    d->start_ms = fb_clock_ms();
    int64_t next_tick = d->start_ms;
    dsp_db_ok(d);
    for (;;) {
        zmq_pollitem_t items[4] = {{d->router, 0, ZMQ_POLLIN, 0},
                                   {d->zap, 0, ZMQ_POLLIN, 0},
                                   {d->ctl_rx, 0, ZMQ_POLLIN, 0},
                                   {NULL, -1, ZMQ_POLLIN, 0}};
        int n = 3;
        if (d->pg && PQstatus(d->pg) == CONNECTION_OK) {
            items[3].fd = PQsocket(d->pg);
            n = 4;
        }
        /* libpq also takes notifications in while it reads the results of the loop's own
         * statements, and the socket then has nothing left to wake the poll: look for
         * queued ones before every wait, or a submission would wait for the next tick */
        dsp_take_notifies(d);
        /* until the next tick or the planning gap's end: the time left on the monotonic
         * clock; on a test's manual clock, a short poll, as only the test moves it */
        long timeout = fb_clock_wait_ms(next_tick, d->cfg.tick_ms);
        if (d->plan_due) {
            long gap = fb_clock_wait_ms(d->last_plan_ms + PLAN_MIN_GAP_MS, PLAN_MIN_GAP_MS);
            if (gap < timeout) timeout = gap;
        }
        if (zmq_poll(items, n, timeout) < 0 && errno != EINTR) break;
        if (items[2].revents & ZMQ_POLLIN) break;
        /* another fuseboxd's loop runs now: this one decides nothing more */
        if (atomic_load(&d->lock_lost)) break;
        if (items[1].revents & ZMQ_POLLIN) dsp_on_zap(d);
        if (items[0].revents & ZMQ_POLLIN) drain_router(d);
        if (n == 4 && (items[3].revents & ZMQ_POLLIN)) {
            PQconsumeInput(d->pg);
            dsp_take_notifies(d);
        }
        int64_t t = fb_clock_ms();
        if (t >= next_tick) {
            tick(d);
            next_tick = fb_clock_ms() + d->cfg.tick_ms;
        } else if (d->plan_due && t - d->last_plan_ms >= PLAN_MIN_GAP_MS) {
            dsp_flush_events(d);
            dsp_plan(d);
        }
    }
    /* last words: what is already received gets written when possible */
    dsp_flush_events(d);
    for (int n = -1; d->progress.head && d->progress.n != n;) {
        n = d->progress.n;
        dsp_flush_progress(d);
    }
    return NULL;
}

/* ---- start and stop -------------------------------------------------------- */

static int server_keys(fb_dispatch *d, char *msg, size_t msg_cap)
{
    const char *path = d->cfg.server_key;
    if (access(path, F_OK) != 0) {
        int err = fb_wire_key_generate(path, msg, msg_cap);
        if (err) return err;
        fb_log_json(FB_LOG_INFO, "created the server's CURVE keypair",
                    json_pack("{s:s}", "path", path));
    }
    int err = fb_wire_key_load(path, d->pub, d->sec, msg, msg_cap);
    if (err) return err;
    /* the public half beside it, for workers (--server-key) */
    char pub_path[FB_CONFIG_PATH_MAX + 8], tmp[FB_CONFIG_PATH_MAX + 16];
    snprintf(pub_path, sizeof pub_path, "%s.pub", path);
    snprintf(tmp, sizeof tmp, "%s.pub.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "public: %s\n", d->pub) < 0 || fclose(f) != 0 ||
        rename(tmp, pub_path) != 0)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot write %s", pub_path);
    return FB_OK;
}

bool fb_dispatch_stepped_down(fb_dispatch *d)
{
    return d && atomic_load(&d->lock_lost);
}

fb_dispatch *fb_dispatch_start(const fb_config *cfg, const char *artifacts, PGconn *locked,
                               void (*on_step_down)(void *arg), void *arg, char *msg,
                               size_t msg_cap)
{
    fb_dispatch *d = calloc(1, sizeof *d);
    if (!d) {
        PQfinish(locked);
        fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        return NULL;
    }
    d->pg = locked;
    d->on_step_down = on_step_down;
    d->step_down_arg = arg;
    d->cfg = *cfg;
    d->fair = fb_fair_params_default();
    if (cfg->rebalance_ms > 0) d->fair.period_s = cfg->rebalance_ms / 1000.0;
    snprintf(d->artifacts, sizeof d->artifacts, "%s", artifacts);
    d->workers = calloc(MAX_WORKERS, sizeof *d->workers);
    d->keys = calloc(DSP_MAX_KEYS, sizeof *d->keys);
    d->db_keys = calloc(DSP_MAX_KEYS, sizeof *d->db_keys);
    d->queue = fb_queue_new(cfg->public_datasets);
    d->census = calloc(CENSUS_SLOTS, sizeof *d->census);
    d->census_used = calloc(SETTLE_READS, sizeof *d->census_used);
    if (!d->workers || !d->keys || !d->db_keys || !d->queue || !d->census || !d->census_used) {
        fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (server_keys(d, msg, msg_cap)) goto fail;
    dsp_keys_reload_file(d); /* the registered keys at the first tick, on the loop's thread */
    if (!(d->zctx = zmq_ctx_new())) {
        fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "cannot create a ZeroMQ context");
        goto fail;
    }
    /* the ZAP handler must be bound before any CURVE socket accepts */
    d->zap = zmq_socket(d->zctx, ZMQ_REP);
    d->ctl_rx = zmq_socket(d->zctx, ZMQ_PAIR);
    d->ctl_tx = zmq_socket(d->zctx, ZMQ_PAIR);
    d->router = zmq_socket(d->zctx, ZMQ_ROUTER);
    if (!d->zap || !d->ctl_rx || !d->ctl_tx || !d->router || zmq_bind(d->zap, ZAP_ENDPOINT) != 0 ||
        zmq_bind(d->ctl_rx, CTL_ENDPOINT) != 0 || zmq_connect(d->ctl_tx, CTL_ENDPOINT) != 0) {
        fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "cannot set up the control sockets: %s",
                zmq_strerror(errno));
        goto fail;
    }
    int one = 1, linger = 1000, hwm = 100000;
    int64_t maxmsg = (int64_t)FB_WIRE_MAX_BLOB + ((int64_t)1 << 20);
    if (zmq_setsockopt(d->router, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(d->router, ZMQ_CURVE_SECRETKEY, d->sec, 40) != 0 ||
        zmq_setsockopt(d->router, ZMQ_ZAP_DOMAIN, "fusebox", 7) != 0 ||
        zmq_setsockopt(d->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one) != 0 ||
        zmq_setsockopt(d->router, ZMQ_ROUTER_HANDOVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(d->router, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(d->router, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(d->router, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(d->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0) {
        fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "cannot configure the worker socket: %s",
                zmq_strerror(errno));
        goto fail;
    }
    if (zmq_bind(d->router, cfg->worker_listen) != 0) {
        fb_errf(msg, msg_cap, FB_ERR_IO, "cannot listen for workers on %s: %s", cfg->worker_listen,
                zmq_strerror(errno));
        goto fail;
    }
    char endpoint[256] = "";
    size_t len = sizeof endpoint;
    zmq_getsockopt(d->router, ZMQ_LAST_ENDPOINT, endpoint, &len);
    const char *colon = strrchr(endpoint, ':');
    int port = colon ? atoi(colon + 1) : 0;
    if (cfg->worker_port_file[0]) {
        char tmp[FB_CONFIG_PATH_MAX + 8];
        snprintf(tmp, sizeof tmp, "%s.tmp", cfg->worker_port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 ||
            rename(tmp, cfg->worker_port_file) != 0) {
            fb_errf(msg, msg_cap, FB_ERR_IO, "cannot write %s", cfg->worker_port_file);
            goto fail;
        }
    }
    if (pthread_create(&d->thread, NULL, loop, d) != 0) {
        fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "cannot start the control loop");
        goto fail;
    }
    d->thread_started = true;
    fb_log_json(FB_LOG_INFO, "listening for workers",
                json_pack("{s:s, s:s, s:s, s:i}", "endpoint", endpoint, "server_key",
                          cfg->server_key, "worker_keys", cfg->worker_keys, "max_array",
                          cfg->max_array));
    return d;
fail:
    fb_dispatch_stop(d);
    return NULL;
}

void fb_dispatch_stop(fb_dispatch *d)
{
    if (!d) return;
    if (d->thread_started) {
        zmq_send(d->ctl_tx, "stop", 4, 0);
        pthread_join(d->thread, NULL);
    }
    if (d->router) zmq_close(d->router);
    if (d->zap) zmq_close(d->zap);
    if (d->ctl_rx) zmq_close(d->ctl_rx);
    if (d->ctl_tx) zmq_close(d->ctl_tx);
    if (d->zctx) zmq_ctx_term(d->zctx);
    if (d->pg) PQfinish(d->pg);
    pending *p;
    while ((p = dsp_pop(&d->events)))
        dsp_pending_free(p);
    while ((p = dsp_pop(&d->progress)))
        dsp_pending_free(p);
    sodium_memzero(d->sec, sizeof d->sec);
    for (int i = 0; d->workers && i < d->n_workers; i++)
        fb_metrics_worker_remove(d->workers[i].seen_slot);
    free(d->workers);
    free(d->keys);
    free(d->db_keys);
    free(d->census);
    free(d->census_used);
    for (int i = 0; i < d->n_groups; i++)
        free(d->groups[i].span);
    free(d->groups);
    free(d->kinfo);
    free(d->detached);
    fb_queue_free(d->queue);
    free(d->reasons);
    free(d);
}
