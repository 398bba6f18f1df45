/*
 * The control loop's planning adapter: a planning round reads the queue
 * (its copy, queue.h), the tenants and the running groups into the
 * planner's snapshot (planner.h), runs the policy, and applies its
 * decisions: new groups recorded in one transaction and their ASSIGNs sent
 * once it commits, time shares of running groups changed by co-location
 * sent as REBALANCE, and the queue reasons of the jobs that wait written,
 * the head of the queue with the plan and the rest a budget per tick.
 */
#include "dispatch_impl.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "db.h"
#include "errors.h"
#include "jobspec.h"
#include "log.h"
#include "metrics.h"
#include "planner.h"
#include "queue.h"
#include "wire.h"

#define MAX_QUEUE_READ 20000 /* queued jobs one plan looks at */
#define SLOW_PLAN_S 0.1      /* a plan this long is logged with where its time went */
/* time for writing queue reasons with the plan (the head of the queue); the tick writes
 * the rest (dispatch.c, REASONS_IN_TICK_S) */
#define REASONS_IN_PLAN_S 0.01
#define REASONS_PER_STATEMENT 50
/* time for starting new arrays in one plan; the rest start in the next one */
#define NEW_ARRAYS_IN_PLAN_S 0.02

/* A job's spec. */
static const char sql_job_spec[] = "SELECT spec::text FROM jobs WHERE id = $1::uuid";

/* A queued job whose init weights cannot be read fails ($2 why); its event. */
static const char sql_job_init_unreadable[] =
    "WITH upd AS (UPDATE jobs SET state = 'failed', error = $2,"
    " finished_at = now(), updated_at = now()"
    " WHERE id = $1::uuid AND state = 'queued' RETURNING id)"
    " INSERT INTO job_events (job_id, kind, message) SELECT id, 'failed', $2"
    " FROM upd";

/* A queued job whose checkpoint cannot be read restarts from step 0; its event. */
static const char sql_job_resume_unreadable[] =
    "WITH upd AS (UPDATE jobs SET resume_step = 0, resume_path = NULL, step = 0,"
    " queue_reason = 'its checkpoint could not be read; restarts from step 0'"
    " WHERE id = $1::uuid AND state = 'queued' RETURNING id)"
    " INSERT INTO job_events (job_id, kind, message) SELECT id, 'requeued',"
    " 'its checkpoint could not be read; restarts from step 0' FROM upd";

/* A new group ($1 fusion key, $2 its worker (the leader), $3 start step, $4 data, $5 pipeline,
 * $6 the leader's devices, $7 split, $8 memory per device, $9 time share, $11 the leader's
 * port of a group that spans workers); its id comes back, and $10. */
static const char sql_group_insert[] =
    "INSERT INTO groups (fusion_key, state, worker_id, generation, start_step,"
    " parallel_data, parallel_pipeline, device_idx, split, mem_per_device, time_share,"
    " comm_port)"
    " VALUES ($1, 'scheduled', $2::uuid, 1, $3::bigint, $4::int, $5::int, $6::int[],"
    " $7::bigint[], $8::bigint, $9::float8, $11::int) RETURNING id, $10::text";

/* A worker of a group that spans workers, with its ranks and devices. */
static const char sql_group_worker_insert[] =
    "INSERT INTO group_workers (group_id, worker_id, rank_base, n_ranks,"
    " device_idx) VALUES ($1::uuid, $2::uuid, $3::int, $4::int, $5::int[])";

/* The queued jobs ($1) scheduled in the new group ($2); what the ASSIGN needs of them comes
 * back. */
static const char sql_group_jobs_schedule[] =
    "UPDATE jobs SET state = 'scheduled', group_id = $2::uuid, in_group = true,"
    " scheduled_at = now(), queue_reason = NULL, updated_at = now()"
    " WHERE id = ANY($1::uuid[]) AND state = 'queued'"
    " RETURNING id, tenant_id, spec::text, resume_step";

/* The new group's member count and tenants ($2 the count). */
static const char sql_group_members[] =
    "UPDATE groups g SET n_members = $2::int, tenant_ids = (SELECT array_agg("
    " DISTINCT tenant_id) FROM jobs WHERE group_id = g.id AND in_group)"
    " WHERE g.id = $1::uuid";

/* The new group's devices name it, and the tenant it is charged to. */
static const char sql_group_devices_take[] =
    "UPDATE devices d SET group_id = $1::uuid, tenant_id = (SELECT tenant_ids[1]"
    " FROM groups WHERE id = $1::uuid) FROM group_devices gd"
    " WHERE gd.group_id = $1::uuid AND d.worker_id = gd.worker_id"
    " AND d.idx = gd.idx";

/* Each member's scheduled event ($1 group, $2 devices, $3 members, $4 worker, $5 the workers'
 * text). */
static const char sql_group_scheduled_events[] =
    "INSERT INTO job_events (job_id, kind, message, data) SELECT id, 'scheduled',"
    " 'fused into array ' || $1 || ' of ' || $3 || ' on ' || $5,"
    " jsonb_build_object('group_id', $1::text, 'members', $3::int, 'worker',"
    " $4::text, 'devices', $2::int[]) FROM jobs WHERE group_id = $1::uuid"
    " AND in_group";

/* The tenants, for the plan's snapshot. */
static const char sql_plan_tenants[] =
    "SELECT id::text, weight, share_arrays, max_devices FROM tenants";

/* The unfinished groups, for the plan's snapshot. */
static const char sql_plan_running[] =
    "SELECT g.id, coalesce(w.name, ''), g.device_idx::text, g.mem_per_device,"
    " g.tenant_ids::text, g.generation, g.split::text, g.time_share"
    " FROM groups g LEFT JOIN workers w ON w.id = g.worker_id"
    " WHERE g.state <> 'finished'";

/* A running group's time share changed by co-location. */
static const char sql_group_time_share[] =
    "UPDATE groups SET time_share = $2::float8 WHERE id = $1::uuid";

/* Queue reasons ($1 jobs, $2 texts) of jobs still queued, where they changed. */
static const char sql_queue_reasons[] =
    "UPDATE jobs j SET queue_reason = v.r FROM unnest($1::uuid[], $2::text[])"
    " AS v(id, r) WHERE j.id = v.id AND j.state = 'queued'"
    " AND j.queue_reason IS DISTINCT FROM v.r";

/* What the planner needs of a fusion key (memory, batch, parallelism), read from one of its
 * jobs' spec the first time and kept. */
static const keyinfo *key_info(fb_dispatch *d, const char *key, const char *job_id)
{
    for (int i = 0; i < d->n_kinfo; i++)
        if (strcmp(d->kinfo[i].key, key) == 0) return &d->kinfo[i];
    const char *v[1] = {job_id};
    PGresult *r = dsp_q(d, sql_job_spec, 1, v);
    if (!r) return NULL;
    fb_job_spec spec;
    char err[256];
    int e = PQntuples(r) == 1 ? fb_job_spec_parse(PQgetvalue(r, 0, 0),
                                                  (size_t)PQgetlength(r, 0, 0), NULL, &spec, err,
                                                  sizeof err)
                              : FB_ERR_NOT_FOUND;
    PQclear(r);
    if (e) return NULL;
    if (d->n_kinfo == d->cap_kinfo) {
        int cap = d->cap_kinfo ? 2 * d->cap_kinfo : 64;
        keyinfo *k = realloc(d->kinfo, (size_t)cap * sizeof *k);
        if (!k) {
            fb_job_spec_free(&spec);
            return NULL;
        }
        d->kinfo = k;
        d->cap_kinfo = cap;
    }
    keyinfo *k = &d->kinfo[d->n_kinfo++];
    snprintf(k->key, sizeof k->key, "%s", key);
    k->member = fb_plan_member_bytes(&spec, &k->shared);
    k->batch = spec.batch_size;
    k->data = spec.parallel_data;
    k->pipeline = spec.parallel_pipeline;
    fb_job_spec_free(&spec);
    return k;
}

typedef struct plan_ctx {
    const fb_queue_job *const *jobs; /* the queue in planning order, owned by d->queue */
    PGresult *tenants, *running;
    fb_plan_job *pj;
    int64_t *batch;
    fb_plan_tenant *pt;
    char **tenant_ids; /* sorted, pointing into tenants result */
    fb_plan_device *pd;
    int *dev_worker; /* device -> index into d->workers */
    fb_plan_running *pr;
    int *run_tenants;
    int *row;     /* snapshot job -> its place in jobs */
    int *run_row; /* snapshot running group -> row of the running result */
} plan_ctx;

static void plan_ctx_free(plan_ctx *c)
{
    PQclear(c->tenants);
    PQclear(c->running);
    free(c->pj);
    free(c->batch);
    free(c->pt);
    free(c->tenant_ids);
    free(c->pd);
    free(c->dev_worker);
    free(c->pr);
    free(c->run_tenants);
    free(c->row);
    free(c->run_row);
}

/* A new group recorded in the plan's transaction, and its ASSIGN, sent once
 * that transaction commits (deliver_groups). */
typedef struct assign_out {
    struct assign_out *next;
    char gid[FB_WIRE_ID_LEN + 1];
    char worker[FB_WIRE_NAME_MAX + 1];
    bool recorded;              /* its rows were written (its savepoint released) */
    bool sendable;              /* m is complete */
    fb_wire_msg m;
    const void **send_blobs;    /* [nb], pointing into blobs */
    size_t *send_lens;
    int nb;
    void **blobs;               /* [n_blobs], owned: the members' resume checkpoints */
    int n_blobs;
    double time_share;
    /* a group that spans workers: its workers (owned until the group is tracked) and what
     * every one of them is told besides its own ranks */
    span *span;
    char rendezvous[FB_WIRE_NAME_MAX * 2 + 8];
    char token[2 * FB_WIRE_TOKEN_BYTES + 1];
} assign_out;

static void assign_out_free(assign_out *a)
{
    if (!a) return;
    fb_wire_msg_free(&a->m);
    free(a->send_blobs);
    free(a->send_lens);
    if (a->blobs)
        for (int i = 0; i < a->n_blobs; i++) free(a->blobs[i]);
    free(a->blobs);
    free(a->span);
    sodium_memzero(a->token, sizeof a->token);
    free(a);
}

/*
 * A port of leader w's range for a new group that spans workers: one that
 * no live spanning group led by w holds (nor one of this plan's, outq),
 * searched round-robin from where the last search ended, so that a port the
 * leader could not bind (another program holds it) is the last one tried
 * again.  0 when every port of the range is taken.
 */
static int pick_port(fb_dispatch *d, worker *w, const assign_out *outq)
{
    int lo = w->comm_port_lo, hi = w->comm_port_hi;
    if (lo < 1 || hi < lo) return 0;
    for (int k = 0; k <= hi - lo; k++) {
        int port = lo + (w->next_port - lo + k) % (hi - lo + 1);
        bool used = false;
        for (int i = 0; i < d->n_groups && !used; i++)
            used = d->groups[i].span && d->groups[i].span->port == port &&
                   strcmp(d->groups[i].worker, w->name) == 0;
        for (const assign_out *a = outq; a && !used; a = a->next)
            used = a->span && a->span->port == port && strcmp(a->worker, w->name) == 0;
        if (used) continue;
        w->next_port = port == hi ? lo : port + 1;
        return port;
    }
    return 0;
}

/* "host:port", or "[host]:port" for an IPv6 literal. */
static void fmt_rendezvous(char *out, size_t cap, const char *host, int port)
{
    snprintf(out, cap, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

/*
 * The workers of a new group that spans workers, in rank order (the planner lists the
 * devices worker by worker), led by w, and the port w listens on for the others; *out is
 * NULL for a group on one worker.  False when no port of w's range is free (or memory
 * runs out): the group waits.
 */
static bool plan_span(fb_dispatch *d, const plan_ctx *c, const fb_plan_group *g, worker *w,
                      const assign_out *outq, span **out)
{
    *out = NULL;
    if (g->n_workers <= 1) return true;
    span *sp = NULL;
    int port = pick_port(d, w, outq);
    if (!port || !(sp = calloc(1, sizeof *sp))) {
        fb_log_json(FB_LOG_WARN, "no free port for an array that spans workers; it waits",
                    json_pack("{s:s, s:i, s:i}", "leader", w->name, "port_lo",
                              w->comm_port_lo, "port_hi", w->comm_port_hi));
        return false;
    }
    sp->world = g->parallel_data;
    sp->port = port;
    for (int i = 0; i < g->n_devices; i++) {
        const worker *wi = &d->workers[c->dev_worker[g->devices[i]]];
        if (sp->n == 0 || strcmp(sp->m[sp->n - 1].worker, wi->name) != 0) {
            span_member *sm = &sp->m[sp->n++];
            snprintf(sm->worker, sizeof sm->worker, "%s", wi->name);
            sm->rank_base = i;
        }
        span_member *sm = &sp->m[sp->n - 1];
        sm->dev[sm->n_ranks++] = c->pd[g->devices[i]].idx;
    }
    *out = sp;
    return true;
}

/*
 * What each member of new group g starts from: members that resume need their
 * checkpoint (one that cannot be read restarts), members that start from the tenant's
 * weights need those (without them the job cannot start as asked, and fails).  ids,
 * blobs and lens ([g->n_jobs]) receive the members that can start, in order, each with
 * its blob (malloc'd) or NULL; returns how many.
 */
static int read_members(fb_dispatch *d, const plan_ctx *c, const fb_plan_group *g,
                        const char **ids, void **blobs, size_t *lens)
{
    int n_ok = 0;
    for (int i = 0; i < g->n_jobs; i++) {
        const fb_queue_job *qj = c->jobs[c->row[g->jobs[i]]];
        const char *id = qj->id;
        if (qj->resume_step == 0 && qj->init_path) {
            size_t len = 0;
            void *b = dsp_read_tenant_artifact(d, qj->tenant_id, qj->init_path, &len);
            if (!b) {
                static const char why[] =
                    "init: the weights it names cannot be read from the tenant's artifacts";
                const char *v[2] = {id, why};
                fb_log_json(FB_LOG_ERROR, "a job's init weights cannot be read; the job fails",
                            json_pack("{s:s, s:s}", "job_id", id, "path", qj->init_path));
                dsp_exec(d, sql_job_init_unreadable, 2, v);
                continue;
            }
            blobs[n_ok] = b;
            lens[n_ok] = len;
        }
        if (qj->resume_step > 0) {
            const char *path = qj->resume_path ? qj->resume_path : "";
            size_t len = 0;
            void *b = qj->resume_path ? dsp_read_artifact(d, path, &len) : NULL;
            if (!b) {
                const char *v[1] = {id};
                fb_log_json(FB_LOG_ERROR, "a checkpoint cannot be read; the job restarts",
                            json_pack("{s:s, s:s}", "job_id", id, "path", path));
                dsp_exec(d, sql_job_resume_unreadable, 1, v);
                continue;
            }
            blobs[n_ok] = b;
            lens[n_ok] = len;
        }
        ids[n_ok++] = id;
    }
    return n_ok;
}

/*
 * What a new group records, inside the plan's transaction under a savepoint (so that a
 * group that fails leaves the others): its groups row (of a group that spans workers, sp,
 * the leader w's devices; group_workers holds every worker's ranks and devices), its
 * n_ok members (ids) scheduled in it, its devices naming it, and each member's scheduled
 * event.  gid receives the group's id and *jobs the members as the update returned them
 * (id, tenant, spec, start step), which the caller PQclear()s.  False, with the rows
 * undone, when a statement fails, memory runs out or no member was still queued.
 */
static bool record_group(fb_dispatch *d, const plan_ctx *c, const fb_plan_group *g,
                         const worker *w, const span *sp, const char **ids, int n_ok,
                         char gid[FB_WIRE_ID_LEN + 1], PGresult **jobs)
{
    *jobs = NULL;
    /* the leader's devices: those of the groups row (the others are in group_workers) */
    int n_local = sp ? sp->m[0].n_ranks : g->n_devices;
    PGresult *r = NULL;
    bool savepoint = false;
    char *ids_arr = fb_db_text_array(ids, n_ok);
    const char **dev_s = malloc((size_t)g->n_devices * sizeof *dev_s);
    char (*dev_buf)[16] = malloc((size_t)g->n_devices * sizeof *dev_buf);
    /* "worker w1", or "workers w1 (leads), w2" for a group that spans workers */
    char workers_text[FB_WIRE_TEXT_MAX + 1];
    snprintf(workers_text, sizeof workers_text, "%s %s", sp ? "workers" : "worker", w->name);
    for (int k = 1; sp && k < sp->n; k++) {
        size_t len = strlen(workers_text);
        snprintf(workers_text + len, sizeof workers_text - len, "%s%s",
                 k == 1 ? " (leads), " : ", ", sp->m[k].worker);
    }
    const char **split_s = malloc((size_t)g->parallel_data * sizeof *split_s);
    char (*split_buf)[24] = malloc((size_t)g->parallel_data * sizeof *split_buf);
    if (!ids_arr || !dev_s || !dev_buf || !split_s || !split_buf) {
        free(ids_arr);
        free(dev_s);
        free(dev_buf);
        free(split_s);
        free(split_buf);
        return false;
    }
    for (int i = 0; i < g->n_devices; i++) {
        snprintf(dev_buf[i], sizeof dev_buf[i], "%d", c->pd[g->devices[i]].idx);
        dev_s[i] = dev_buf[i];
    }
    for (int i = 0; i < g->parallel_data; i++) {
        snprintf(split_buf[i], sizeof split_buf[i], "%lld", (long long)g->split[i]);
        split_s[i] = split_buf[i];
    }
    char *dev_arr = fb_db_text_array(dev_s, n_local),
         *split_arr = fb_db_text_array(split_s, g->parallel_data);
    free(dev_s);
    free(split_s);
    char pd_s[16], pp_s[16], mem_s[24], share_s[40], port_s[16];
    snprintf(port_s, sizeof port_s, "%d", sp ? sp->port : 0);
    snprintf(pd_s, sizeof pd_s, "%d", g->parallel_data);
    snprintf(pp_s, sizeof pp_s, "%d", g->parallel_pipeline);
    snprintf(mem_s, sizeof mem_s, "%lld", (long long)g->mem_per_device);
    snprintf(share_s, sizeof share_s, "%.17g", g->time_share);
    const char *first = ids[0];
    const fb_queue_job *j0 = c->jobs[c->row[g->jobs[0]]];
    char rs0[24];
    snprintf(rs0, sizeof rs0, "%lld", (long long)j0->resume_step);
    bool ok = dev_arr && split_arr && (savepoint = dsp_exec(d, "SAVEPOINT start_group", 0, NULL));
    if (ok) {
        const char *v[11] = {j0->fusion_key, w->id, rs0,     pd_s,     pp_s, dev_arr,
                             split_arr,      mem_s, share_s, first, sp ? port_s : NULL};
        r = dsp_q(d, sql_group_insert, 11, v);
        ok = r != NULL;
        if (ok) snprintf(gid, FB_WIRE_ID_LEN + 1, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
        r = NULL;
    }
    /* every worker of a group that spans workers, with its ranks and devices; and those
     * devices name the group */
    for (int k = 0; ok && sp && k < sp->n; k++) {
        const span_member *sm = &sp->m[k];
        const worker *wk = dsp_find_worker(d, sm->worker);
        char base_s[16], n_s[16], devs[FB_WIRE_MAX_DEVICES * 12 + 3];
        size_t len = 0;
        devs[len++] = '{';
        for (int i = 0; i < sm->n_ranks; i++)
            len += (size_t)snprintf(devs + len, sizeof devs - len, "%s%d", i ? "," : "",
                                    sm->dev[i]);
        snprintf(devs + len, sizeof devs - len, "}");
        snprintf(base_s, sizeof base_s, "%d", sm->rank_base);
        snprintf(n_s, sizeof n_s, "%d", sm->n_ranks);
        const char *v[5] = {gid, wk ? wk->id : NULL, base_s, n_s, devs};
        ok = wk && dsp_exec(d, sql_group_worker_insert, 5, v);
    }
    if (ok) {
        const char *v[2] = {ids_arr, gid};
        r = dsp_q(d, sql_group_jobs_schedule, 2, v);
        ok = r != NULL && PQntuples(r) > 0;
    }
    char count_s[16];
    snprintf(count_s, sizeof count_s, "%d", r ? PQntuples(r) : 0);
    if (ok) {
        const char *v[5] = {gid, w->id, dev_arr, count_s, w->name};
        const char *vg[2] = {gid, count_s};
        const char *ve[5] = {gid, dev_arr, count_s, w->name, workers_text};
        ok = dsp_exec(d, sql_group_members, 2, vg) &&
             dsp_exec(d, sql_group_devices_take, 1, v) &&
             dsp_exec(d, sql_group_scheduled_events, 5, ve) &&
             dsp_exec(d, "RELEASE SAVEPOINT start_group", 0, NULL);
    }
    free(ids_arr);
    free(dev_arr);
    free(split_arr);
    free(dev_buf);
    free(split_buf);
    if (!ok) {
        if (savepoint) dsp_exec(d, "ROLLBACK TO SAVEPOINT start_group", 0, NULL);
        PQclear(r);
        return false;
    }
    *jobs = r;
    return true;
}

/*
 * The message a recorded group gid is assigned with: its dataset, devices, split and
 * time share, and its members in the order jobs (record_group's result) lists them, each
 * with its one blob (its state to resume from, or at step 0 its init weights), matched by
 * id among the n_ok members read_members found.  *send_blobs and *send_lens (malloc'd
 * here, [members]) point into blobs; *nb receives how many.  False when memory runs out;
 * the caller frees m either way.
 */
static bool build_assign(const plan_ctx *c, const fb_plan_group *g, const char *gid,
                         const PGresult *jobs, const char **ids, void **blobs,
                         const size_t *lens, int n_ok, fb_wire_msg *m,
                         const void ***send_blobs, size_t **send_lens, int *nb)
{
    const fb_queue_job *j0 = c->jobs[c->row[g->jobs[0]]];
    int n = PQntuples(jobs);
    m->members = calloc((size_t)n, sizeof *m->members);
    const void **sb = calloc((size_t)n, sizeof *sb);
    size_t *sl = calloc((size_t)n, sizeof *sl);
    if (!m->members || !sb || !sl) {
        free(sb);
        free(sl);
        return false;
    }
    int k_blob = 0;
    snprintf(m->group_id, sizeof m->group_id, "%s", gid);
    snprintf(m->fusion_key, sizeof m->fusion_key, "%s", j0->fusion_key);
    snprintf(m->dataset, sizeof m->dataset, "%s", j0->dataset);
    if (j0->builtin)
        snprintf(m->builtin, sizeof m->builtin, "%s", j0->builtin);
    else if (!j0->public_dataset)
        snprintf(m->dataset_tenant, sizeof m->dataset_tenant, "%s", j0->tenant_id);
    m->n_group_devices = g->n_devices;
    for (int i = 0; i < g->n_devices; i++) m->group_devices[i] = c->pd[g->devices[i]].idx;
    m->parallel_data = g->parallel_data;
    m->parallel_pipeline = g->parallel_pipeline;
    m->n_split = g->parallel_data;
    for (int i = 0; i < g->parallel_data; i++) m->split[i] = g->split[i];
    m->time_share = g->time_share;
    m->n_members = n;
    for (int i = 0; i < n; i++) {
        fb_wire_member *mm = &m->members[i];
        snprintf(mm->job_id, sizeof mm->job_id, "%s", PQgetvalue(jobs, i, 0));
        snprintf(mm->tenant_id, sizeof mm->tenant_id, "%s", PQgetvalue(jobs, i, 1));
        mm->spec = strdup(PQgetvalue(jobs, i, 2));
        mm->start_step = strtoll(PQgetvalue(jobs, i, 3), NULL, 10);
        /* a member's one blob: its state to resume from, or at step 0 its init weights */
        for (int k = 0; k < n_ok; k++)
            if (blobs[k] && strcmp(ids[k], mm->job_id) == 0) {
                sb[k_blob] = blobs[k];
                sl[k_blob] = lens[k];
                if (mm->start_step > 0)
                    mm->resume_blob = ++k_blob;
                else
                    mm->init_blob = ++k_blob;
            }
    }
    *send_blobs = sb;
    *send_lens = sl;
    *nb = k_blob;
    return true;
}

/*
 * Starts one new group of the plan: its span of workers (plan_span), what its members
 * start from (read_members), its rows in the plan's transaction (record_group), and its
 * ASSIGN (build_assign), queued on *outq to be sent once that transaction commits
 * (deliver_groups).  One transaction for all of a plan's new groups: each commit waits
 * for the disk, and a plan that started 67 arrays one transaction each took 300 ms.
 */
static void start_group(fb_dispatch *d, plan_ctx *c, const fb_plan_group *g, assign_out **outq)
{
    worker *w = &d->workers[c->dev_worker[g->devices[0]]];
    span *sp;
    if (!plan_span(d, c, g, w, *outq, &sp)) return;
    int B = g->n_jobs;
    const char **ids = malloc((size_t)B * sizeof *ids);
    void **blobs = calloc((size_t)B, sizeof *blobs);
    size_t *lens = calloc((size_t)B, sizeof *lens);
    assign_out *ao = calloc(1, sizeof *ao);
    fb_wire_msg m = {.type = FB_WIRE_ASSIGN, .generation = 1};
    PGresult *r = NULL;
    char gid[FB_WIRE_ID_LEN + 1] = "";
    if (!ids || !blobs || !lens || !ao) goto out;
    int n_ok = read_members(d, c, g, ids, blobs, lens);
    if (!n_ok || !record_group(d, c, g, w, sp, ids, n_ok, gid, &r)) goto out;
    /* recorded: from here the group is delivered (tracked) once the plan commits, with its
     * ASSIGN when the message can be made */
    ao->recorded = true;
    snprintf(ao->gid, sizeof ao->gid, "%s", gid);
    snprintf(ao->worker, sizeof ao->worker, "%s", w->name);
    ao->time_share = g->time_share;
    if (sp) {
        uint8_t raw[FB_WIRE_TOKEN_BYTES];
        randombytes_buf(raw, sizeof raw);
        sodium_bin2hex(ao->token, sizeof ao->token, raw, sizeof raw);
        sodium_memzero(raw, sizeof raw);
        fmt_rendezvous(ao->rendezvous, sizeof ao->rendezvous, w->comm_host, sp->port);
        ao->span = sp;
        sp = NULL;
    }
    ao->next = *outq;
    *outq = ao;
    const void **send_blobs = NULL;
    size_t *send_lens = NULL;
    int nb = 0;
    if (!build_assign(c, g, gid, r, ids, blobs, lens, n_ok, &m, &send_blobs, &send_lens, &nb)) {
        ao = NULL; /* queued: the worker never hears of it; requeued when found orphaned */
        goto out;
    }
    /* the message and the checkpoints it points into go with the queued ASSIGN */
    ao->m = m;
    memset(&m, 0, sizeof m);
    ao->send_blobs = send_blobs;
    ao->send_lens = send_lens;
    ao->nb = nb;
    ao->blobs = blobs;
    ao->n_blobs = B;
    ao->sendable = true;
    blobs = NULL;
    ao = NULL;
out:
    if (ao && !ao->recorded) assign_out_free(ao);
    free(sp);
    PQclear(r);
    fb_wire_msg_free(&m);
    if (blobs)
        for (int i = 0; i < B; i++) free(blobs[i]);
    free(blobs);
    free(lens);
    free(ids);
}

/* After the plan's transaction: when it committed, tracks every group it
 * recorded and sends their ASSIGNs; frees the queue either way (a group
 * that did not commit left its jobs queued for the next plan). */
static void deliver_groups(fb_dispatch *d, assign_out *q, bool committed)
{
    /* queued newest first: deliver in the order the plan made them */
    assign_out *rev = NULL;
    while (q) {
        assign_out *next = q->next;
        q->next = rev;
        rev = q;
        q = next;
    }
    for (assign_out *a = rev, *next; a; a = next) {
        next = a->next;
        if (committed && dsp_add_group(d, a->gid, 1, a->worker)) {
            group *g = &d->groups[d->n_groups - 1];
            g->span = a->span;
            a->span = NULL;
            if (a->sendable && !g->span) {
                fb_log_json(FB_LOG_INFO, "array assigned",
                            json_pack("{s:s, s:s, s:i, s:s, s:f}", "group_id", a->gid, "worker",
                                      a->worker, "members", a->m.n_members, "fusion_key",
                                      a->m.fusion_key, "time_share", a->time_share));
                dsp_send(d, a->worker, &a->m, a->send_blobs, a->send_lens, a->nb);
            } else if (a->sendable) {
                /* one ASSIGN per worker: its own ranks and devices, the same world, split,
                 * rendezvous and token */
                const span *sp = g->span;
                fb_log_json(FB_LOG_INFO, "array assigned across workers",
                            json_pack("{s:s, s:s, s:i, s:i, s:i, s:s, s:f}", "group_id", a->gid,
                                      "leader", a->worker, "workers", sp->n, "world", sp->world,
                                      "members", a->m.n_members, "rendezvous", a->rendezvous,
                                      "time_share", a->time_share));
                fb_wire_msg *m = &a->m;
                m->world = sp->world;
                snprintf(m->rendezvous, sizeof m->rendezvous, "%s", a->rendezvous);
                snprintf(m->token, sizeof m->token, "%s", a->token);
                for (int k = 0; k < sp->n; k++) {
                    span_member *sm = &g->span->m[k];
                    sm->assigned_ms = fb_clock_ms();
                    m->rank_base = sm->rank_base;
                    m->parallel_data = sm->n_ranks;
                    m->parallel_pipeline = 1;
                    m->n_group_devices = sm->n_ranks;
                    memcpy(m->group_devices, sm->dev, (size_t)sm->n_ranks * sizeof *sm->dev);
                    dsp_send(d, sm->worker, m, a->send_blobs, a->send_lens, a->nb);
                }
                sodium_memzero(m->token, sizeof m->token);
            }
        }
        assign_out_free(a);
    }
}

/* The plan's running groups (the rows of c->running, nr of them): their devices among
 * the snapshot's nd (when their worker is here) and their tenants among the nt sorted
 * ones.  Returns how many the snapshot holds (c->run_row maps them to their rows). */
static int plan_running(fb_dispatch *d, plan_ctx *c, int nr, int nd, int nt)
{
    int nrun = 0;
    for (int i = 0; i < nr; i++) {
        worker *w = dsp_find_worker(d, PQgetvalue(c->running, i, 1));
        if (!w) continue;
        fb_plan_running *pr = &c->pr[nrun];
        int widx = (int)(w - d->workers);
        const char *p = PQgetvalue(c->running, i, 2); /* "{0,1}" */
        while (*p && pr->n_devices < FB_PLAN_MAX_GROUP_DEVICES) {
            while (*p && (*p < '0' || *p > '9')) p++;
            if (!*p) break;
            int idx = (int)strtol(p, (char **)&p, 10);
            for (int k = 0; k < nd; k++)
                if (c->pd[k].worker == widx && c->pd[k].idx == idx)
                    pr->devices[pr->n_devices++] = k;
        }
        /* a group that spans workers holds the devices of each of its workers */
        const group *gg = dsp_find_group(d, PQgetvalue(c->running, i, 0));
        if (gg && gg->span) {
            pr->n_devices = 0;
            for (int s = 0; s < gg->span->n; s++) {
                const span_member *sm = &gg->span->m[s];
                worker *ws = dsp_find_worker(d, sm->worker);
                int wsi = ws ? (int)(ws - d->workers) : -1;
                for (int r = 0; r < sm->n_ranks && pr->n_devices < FB_PLAN_MAX_GROUP_DEVICES; r++)
                    for (int k = 0; k < nd; k++)
                        if (c->pd[k].worker == wsi && c->pd[k].idx == sm->dev[r])
                            pr->devices[pr->n_devices++] = k;
            }
        }
        pr->mem_per_device = strtoll(PQgetvalue(c->running, i, 3), NULL, 10);
        pr->time_share = strtod(PQgetvalue(c->running, i, 7), NULL);
        int *rt = &c->run_tenants[(size_t)nrun * 64];
        const char *t = PQgetvalue(c->running, i, 4); /* "{uuid,uuid}" */
        while (*t && pr->n_tenants < 64) {
            while (*t && (*t == '{' || *t == ',' || *t == '}')) t++;
            if (strlen(t) < FB_WIRE_ID_LEN) break;
            char id[FB_WIRE_ID_LEN + 1];
            memcpy(id, t, FB_WIRE_ID_LEN);
            id[FB_WIRE_ID_LEN] = '\0';
            t += FB_WIRE_ID_LEN;
            int k = dsp_tenant_index(c->tenant_ids, nt, id);
            if (k >= 0) rt[pr->n_tenants++] = k;
        }
        pr->tenants = rt;
        if (pr->n_devices > 0) c->run_row[nrun++] = i;
    }
    return nrun;
}

/* Time shares of running groups that the plan changed by co-location: written, and
 * sent as REBALANCE with the group's split. */
static void plan_shares(fb_dispatch *d, const plan_ctx *c, const fb_plan_result *res)
{
    for (int i = 0; i < res->n_shares; i++) {
        int row = c->run_row[res->shares[i].running];
        char share[40];
        snprintf(share, sizeof share, "%.17g", res->shares[i].time_share);
        const char *v[2] = {PQgetvalue(c->running, row, 0), share};
        dsp_exec(d, sql_group_time_share, 2, v);
        group *g = dsp_find_group(d, v[0]);
        if (!g) continue;
        fb_wire_msg m = {.type = FB_WIRE_REBALANCE, .generation = g->generation,
                         .time_share = res->shares[i].time_share};
        snprintf(m.group_id, sizeof m.group_id, "%s", g->id);
        const char *p = PQgetvalue(c->running, row, 6);
        while (*p && m.n_split < FB_WIRE_MAX_DEVICES) {
            while (*p && (*p < '0' || *p > '9')) p++;
            if (!*p) break;
            m.split[m.n_split++] = strtoll(p, (char **)&p, 10);
        }
        dsp_send(d, g->worker, &m, NULL, NULL, 0);
    }
}

/* The queue reasons the plan changed, of its nq snapshot jobs in planning order, listed
 * for dsp_write_reasons. */
static void plan_reasons(fb_dispatch *d, const plan_ctx *c, const fb_plan_result *res, int nq)
{
    d->n_reasons = 0;
    if (nq > d->cap_reasons) {
        reason_todo *rt = realloc(d->reasons, (size_t)nq * sizeof *rt);
        if (rt) {
            d->reasons = rt;
            d->cap_reasons = nq;
        }
    }
    for (int i = 0; i < nq && d->n_reasons < d->cap_reasons; i++) {
        if (res->reason[i] == FB_PLAN_PLACED) continue;
        const fb_queue_job *qj = c->jobs[c->row[i]];
        const char *text = fb_plan_reason_text(res->reason[i]);
        if (strcmp(qj->queue_reason, text) == 0) continue;
        reason_todo *rt = &d->reasons[d->n_reasons++];
        memcpy(rt->job, qj->id, sizeof rt->job);
        rt->reason = text;
    }
}

/* One planning round: snapshot, policy, decisions. */
static void plan_run(fb_dispatch *d)
{
    d->plan_due = false;
    d->last_plan_ms = fb_clock_ms();
    if (!dsp_db_ok(d)) return;
    plan_ctx c = {0};
    /* where a slow plan's time went: reading the queue, the snapshot and policy, the new
     * arrays, the reasons */
    double t_start = dsp_real_s(), t_read = 0, t_policy = 0, t_groups = 0;
    int n_read = 0, n_started = 0, n_reasons = 0;
    char err[256];
    if (fb_queue_sync(d->queue, d->pg, &n_read, err, sizeof err)) {
        fb_log_json(FB_LOG_WARN, "control loop: the queue could not be read",
                    json_pack("{s:s}", "error", err));
        goto out;
    }
    int nj = fb_queue_ordered(d->queue, MAX_QUEUE_READ, &c.jobs);
    if (nj < 0) goto out;
    t_read = dsp_real_s();
    c.tenants =
        dsp_q(d, sql_plan_tenants, 0, NULL);
    c.running = dsp_q(d, sql_plan_running, 0, NULL);
    if (!c.tenants || !c.running) goto out;
    int nt = PQntuples(c.tenants), nr = PQntuples(c.running);
    int nd = 0;
    for (int i = 0; i < d->n_workers; i++) nd += d->workers[i].n_devices;
    c.pj = calloc((size_t)(nj ? nj : 1), sizeof *c.pj);
    c.batch = calloc((size_t)(nj ? nj : 1), sizeof *c.batch);
    c.pt = calloc((size_t)(nt ? nt : 1), sizeof *c.pt);
    c.tenant_ids = calloc((size_t)(nt ? nt : 1), sizeof *c.tenant_ids);
    c.pd = calloc((size_t)(nd ? nd : 1), sizeof *c.pd);
    c.dev_worker = calloc((size_t)(nd ? nd : 1), sizeof *c.dev_worker);
    c.pr = calloc((size_t)(nr ? nr : 1), sizeof *c.pr);
    c.run_tenants = calloc((size_t)(nr ? nr : 1) * 64, sizeof *c.run_tenants);
    c.row = calloc((size_t)(nj ? nj : 1), sizeof *c.row);
    c.run_row = calloc((size_t)(nr ? nr : 1), sizeof *c.run_row);
    if (!c.pj || !c.batch || !c.pt || !c.tenant_ids || !c.pd || !c.dev_worker || !c.pr ||
        !c.run_tenants || !c.row || !c.run_row)
        goto out;
    /* tenants, sorted by id so that jobs find theirs by binary search */
    for (int i = 0; i < nt; i++) c.tenant_ids[i] = PQgetvalue(c.tenants, i, 0);
    qsort(c.tenant_ids, (size_t)nt, sizeof *c.tenant_ids, dsp_cmp_str);
    for (int i = 0; i < nt; i++) {
        int k = dsp_tenant_index(c.tenant_ids, nt, PQgetvalue(c.tenants, i, 0));
        c.pt[k].weight = strtod(PQgetvalue(c.tenants, i, 1), NULL);
        c.pt[k].share_arrays = PQgetvalue(c.tenants, i, 2)[0] == 't';
        c.pt[k].max_devices = (int)strtol(PQgetvalue(c.tenants, i, 3), NULL, 10);
    }
    /* devices of the registered workers */
    nd = 0;
    for (int i = 0; i < d->n_workers; i++)
        for (int k = 0; k < d->workers[i].n_devices; k++) {
            const fb_wire_device *dv = &d->workers[i].devices[k];
            c.pd[nd] = (fb_plan_device){.worker = i, .idx = dv->idx,
                                        .kind = strcmp(dv->kind, "cuda") == 0 ? FB_PLAN_CUDA
                                                                              : FB_PLAN_CPU,
                                        .memory_bytes = dv->memory_bytes,
                                        .ready = !d->workers[i].draining,
                                        .comm = d->workers[i].comm_host[0] != '\0' &&
                                                d->workers[i].comm_port_lo >= 1};
            c.dev_worker[nd++] = i;
        }
    /* running groups: their devices (when their worker is here) and tenants */
    int nrun = plan_running(d, &c, nr, nd, nt);
    /* the queue */
    int nq = 0;
    for (int i = 0; i < nj; i++) {
        const fb_queue_job *qj = c.jobs[i];
        const keyinfo *k = key_info(d, qj->fusion_key, qj->id);
        int t = dsp_tenant_index(c.tenant_ids, nt, qj->tenant_id);
        if (!k || t < 0) continue;
        c.pj[nq] = (fb_plan_job){.seq = qj->seq,
                                 .tenant = t,
                                 .fusion_key = qj->fusion_key,
                                 .start_step = qj->resume_step,
                                 .priority = qj->priority,
                                 .mem_member_bytes = k->member,
                                 .mem_shared_bytes = k->shared,
                                 .parallel_data = k->data,
                                 .parallel_pipeline = k->pipeline,
                                 .public_dataset = qj->public_dataset};
        c.batch[nq] = k->batch;
        c.row[nq++] = i;
    }
    if (nq != nj) fb_logf(FB_LOG_WARN, "%d queued jobs could not be read into the plan", nj - nq);
    fb_plan_snapshot snap = {.jobs = c.pj, .n_jobs = nq, .tenants = c.pt, .n_tenants = nt,
                             .devices = c.pd, .n_devices = nd, .running = c.pr, .n_running = nrun,
                             .max_b = d->cfg.max_array,
                             .max_groups_per_device = d->cfg.max_groups_per_device,
                             .keep_running_shares = d->cfg.rebalance_ms > 0};
    fb_plan_result res;
    if (fb_plan_run(&snap, c.batch, &res, err, sizeof err)) {
        fb_log_json(FB_LOG_ERROR, "the planner refused its snapshot",
                    json_pack("{s:s}", "error", err));
        goto out;
    }
    t_policy = dsp_real_s();
    if (res.n_groups > 0 && dsp_begin(d)) {
        assign_out *ready = NULL;
        for (int i = 0; i < res.n_groups; i++) {
            /* a plan that would start many arrays (a burst, a start-up) starts what fits in
             * its budget and plans again at once for the rest, so that no decision holds the
             * loop long: submissions and heartbeats wait behind it */
            if (i > 0 && dsp_real_s() - t_policy > NEW_ARRAYS_IN_PLAN_S) {
                d->plan_due = true;
                break;
            }
            start_group(d, &c, &res.groups[i], &ready);
            n_started++;
        }
        bool committed = dsp_commit(d);
        if (!committed) dsp_rollback(d);
        deliver_groups(d, ready, committed);
    }
    t_groups = dsp_real_s();
    /* time shares of running groups changed by co-location */
    plan_shares(d, &c, &res);
    /* reasons of the jobs that wait, where they changed: the head of the queue now, the
     * rest in later ticks (write_reasons) */
    plan_reasons(d, &c, &res, nq);
    d->next_reason = 0;
    n_reasons = dsp_write_reasons(d, REASONS_IN_PLAN_S);
    fb_plan_result_free(&res);
    double t_end = dsp_real_s();
    if (t_end - t_start > SLOW_PLAN_S)
        fb_log_json(FB_LOG_WARN, "a slow plan",
                    json_pack("{s:f, s:f, s:f, s:f, s:f, s:i, s:i, s:i, s:i}", "ms",
                              (t_end - t_start) * 1e3, "read_queue_ms", (t_read - t_start) * 1e3,
                              "policy_ms", (t_policy - t_read) * 1e3, "new_arrays_ms",
                              (t_groups - t_policy) * 1e3, "reasons_ms", (t_end - t_groups) * 1e3,
                              "jobs_read", n_read, "queued", nj, "arrays_started", n_started,
                              "reasons_written", n_reasons));
out:
    plan_ctx_free(&c);
}

/*
 * Writes the queue reasons the last plan left to write, in planning order,
 * REASONS_PER_STATEMENT to a statement, until budget_s has passed; returns how many it wrote.
 * A plan over 10,000 queued jobs can change the reason of all of them, and
 * writing them at once held the loop for a second: the head of the queue
 * gets its reasons with the plan, the rest a budget per tick.
 */
int dsp_write_reasons(fb_dispatch *d, double budget_s)
{
    double t0 = dsp_real_s();
    int written = 0;
    while (d->next_reason < d->n_reasons && dsp_real_s() - t0 < budget_s) {
        int n = d->n_reasons - d->next_reason;
        if (n > REASONS_PER_STATEMENT) n = REASONS_PER_STATEMENT;
        const char *ids[REASONS_PER_STATEMENT], *texts[REASONS_PER_STATEMENT];
        for (int i = 0; i < n; i++) {
            ids[i] = d->reasons[d->next_reason + i].job;
            texts[i] = d->reasons[d->next_reason + i].reason;
        }
        char *a = fb_db_text_array(ids, n), *b = fb_db_text_array(texts, n);
        const char *v[2] = {a, b};
        bool ok = a && b &&
                  dsp_exec(d, sql_queue_reasons, 2, v);
        free(a);
        free(b);
        if (!ok) break;
        for (int i = 0; i < n; i++) fb_queue_set_reason(d->queue, ids[i], texts[i]);
        d->next_reason += n;
        written += n;
    }
    return written;
}

/* The scheduling decision, timed for fusebox_control_loop_seconds{phase="plan"}. */
void dsp_plan(fb_dispatch *d)
{
    double t0 = dsp_real_s();
    plan_run(d);
    fb_metrics_control(FB_CONTROL_PLAN, dsp_real_s() - t0);
}
