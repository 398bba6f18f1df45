/*
 * The control loop's returns to the queue: an array whose worker is lost, or no longer
 * runs it, goes back to the queue from its members' resume points (of an array that
 * spans workers, stopped on all of them), with the streak of losses that makes a poison
 * array counted; and the stale-state check (docs/scheduling.md, "No job in limbo") puts
 * back what the loop's own rules cannot see.  The tick (dispatch.c) decides when.
 */
#include "dispatch_impl.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "log.h"
#include "wire.h"

/* a job stale once it has been scheduled or running outside every array the loop follows
 * for this many heartbeat timeouts (its updated_at): longer than any requeue the loop
 * makes itself */
#define STALE_GRACE_TIMEOUTS 2

/* a job whose arrays were lost on this many different workers in a row, without progress
 * in between, is a poison array: each further such loss is a job fault (docs/scheduling.md) */
#define POISON_WORKERS 3

/*
 * The streak of losses of the arrays that train a job (schema 009): a loss with no
 * progress since the previous one (the job's highest step, $2 the array's latest report,
 * not past the step of the previous loss) adds the worker $3 to the job's lost_workers; a
 * loss after progress starts the streak again with that worker alone.
 */
static const char sql_loss_streak[] =
    "UPDATE jobs SET lost_workers = CASE WHEN lost_step IS NULL"
    "   OR GREATEST(step, $2::bigint) > lost_step THEN ARRAY[$3::text]"
    "  WHEN $3::text = ANY(lost_workers) THEN lost_workers ELSE lost_workers || $3::text END,"
    " lost_step = GREATEST(coalesce(lost_step, 0), step, $2::bigint)"
    " WHERE group_id = $1::uuid AND in_group AND state IN ('scheduled', 'running')";

/*
 * Returns an array's jobs to the queue from their resume points ($2 says why), except a
 * poison array's ($3: the loss counts toward the streak, $4 = POISON_WORKERS): a job lost on
 * that many different workers in a row uses up one restart, or fails once it has none left.
 * Each job gets a requeued (or failed) event; the counts come back as (queued, failed).
 */
static const char sql_requeue_group[] =
    "WITH v AS (SELECT id, CASE WHEN state NOT IN ('scheduled', 'running') THEN 'keep'"
    "   WHEN NOT ($3::bool AND cardinality(lost_workers) >= $4::int) THEN 'requeue'"
    "   WHEN restarts < max_restarts THEN 'restart' ELSE 'fail' END AS verdict,"
    "  'its array was lost on ' || cardinality(lost_workers) || ' different workers in a row"
    " without progress (' || array_to_string(lost_workers, ', ') || '), last: ' || $2 AS poison"
    "  FROM jobs WHERE group_id = $1::uuid AND in_group FOR UPDATE),"
    " upd AS (UPDATE jobs j SET"
    "  state = CASE v.verdict WHEN 'keep' THEN j.state WHEN 'fail' THEN 'failed' ELSE 'queued' END,"
    "  restarts = j.restarts + (v.verdict = 'restart')::int,"
    "  step = CASE WHEN v.verdict IN ('requeue', 'restart') THEN j.resume_step ELSE j.step END,"
    "  queue_reason = CASE v.verdict"
    "   WHEN 'requeue' THEN $2 || '; resumes from step ' || j.resume_step"
    "   WHEN 'restart' THEN v.poison || '; restart ' || (j.restarts + 1) || ' of '"
    "    || j.max_restarts || ', resumes from step ' || j.resume_step"
    "   ELSE j.queue_reason END,"
    "  error = CASE WHEN v.verdict = 'fail' THEN v.poison ELSE j.error END,"
    "  finished_at = CASE WHEN v.verdict = 'fail' THEN coalesce(j.finished_at, now())"
    "   ELSE j.finished_at END,"
    "  in_group = false, updated_at = now()"
    "  FROM v WHERE j.id = v.id"
    "  RETURNING j.id, v.verdict, j.resume_step, j.restarts, j.max_restarts, j.lost_workers,"
    "  j.error, j.queue_reason),"
    " ev AS (INSERT INTO job_events (job_id, kind, message, data)"
    "  SELECT id, CASE verdict WHEN 'fail' THEN 'failed' ELSE 'requeued' END,"
    "  CASE verdict WHEN 'fail' THEN error ELSE queue_reason END,"
    "  jsonb_build_object('group_id', $1::text, 'resume_step', resume_step, 'fault',"
    "   CASE verdict WHEN 'requeue' THEN 'infrastructure' ELSE 'job' END, 'restarts', restarts,"
    "   'max_restarts', max_restarts, 'lost_workers', to_jsonb(lost_workers))"
    "  FROM upd WHERE verdict <> 'keep')"
    " SELECT count(*) FILTER (WHERE verdict IN ('requeue', 'restart')),"
    " count(*) FILTER (WHERE verdict = 'fail') FROM upd";

/*
 * The stale-state check: jobs scheduled or running for longer than the grace ($2 ms)
 * outside every array the loop follows ($1, its groups) go back to the queue from their
 * resume points, each with a requeued event (an infrastructure fault: nothing counted).
 */
static const char sql_stale_jobs[] =
    "WITH s AS (SELECT j.id, j.group_id, j.state FROM jobs j"
    " LEFT JOIN groups g ON g.id = j.group_id"
    "  WHERE j.state IN ('scheduled', 'running')"
    "  AND j.updated_at < now() - $2::bigint * interval '1 millisecond'"
    "  AND (j.group_id IS NULL OR NOT j.in_group OR g.state = 'finished'"
    "   OR NOT (j.group_id = ANY($1::uuid[])))"
    "  FOR UPDATE OF j SKIP LOCKED),"
    " upd AS (UPDATE jobs j SET state = 'queued', in_group = false, step = j.resume_step,"
    "  queue_reason = 'found ' || s.state || ' without a live array; resumes from step '"
    "   || j.resume_step, updated_at = now()"
    "  FROM s WHERE j.id = s.id RETURNING j.id, s.group_id, s.state, j.resume_step,"
    "  j.queue_reason),"
    " ev AS (INSERT INTO job_events (job_id, kind, message, data)"
    "  SELECT id, 'requeued', queue_reason, jsonb_build_object('group_id', group_id::text,"
    "  'resume_step', resume_step, 'fault', 'infrastructure', 'stale', state) FROM upd)"
    " SELECT id::text, coalesce(group_id::text, ''), state FROM upd";

/* And arrays the database holds unfinished that the loop does not follow (they would keep
 * their devices' time share on the cluster view): finished, their devices freed. */
static const char sql_stale_groups[] =
    "WITH f AS (UPDATE groups SET state = 'finished', finished_at = now(), n_members = 0,"
    "  updated_at = now() WHERE state <> 'finished' AND NOT (id = ANY($1::uuid[]))"
    "  AND updated_at < now() - $2::bigint * interval '1 millisecond' RETURNING id),"
    " dev AS (UPDATE devices SET group_id = NULL, tenant_id = NULL"
    "  WHERE group_id IN (SELECT id FROM f))"
    " SELECT id::text FROM f";

/* A group finished, its members gone ($1 the group). */
static const char sql_group_finish[] =
    "UPDATE groups SET state = 'finished', finished_at = now(), n_members = 0,"
    " updated_at = now() WHERE id = $1::uuid AND state <> 'finished'";

/* The devices a group held, freed ($1 the group). */
static const char sql_group_devices_free[] =
    "UPDATE devices SET group_id = NULL, tenant_id = NULL WHERE group_id = $1::uuid";

/*
 * Returns a group's members to the queue, each from its last checkpoint, and
 * finishes the group.  An infrastructure fault: no restart is counted, unless
 * lost_on (the worker that was lost, or that dropped the array; NULL when the
 * fault is not a loss of the array's worker) makes the job's losses without
 * progress reach POISON_WORKERS different workers in a row: then it is a job
 * fault (sql_requeue_group).
 */
static bool requeue_group(fb_dispatch *d, const char *group_id, const char *why,
                          const char *lost_on)
{
    const group *g = dsp_find_group(d, group_id);
    char high[24], poison[16];
    snprintf(high, sizeof high, "%lld", (long long)(g ? g->high_step : 0));
    snprintf(poison, sizeof poison, "%d", POISON_WORKERS);
    if (!dsp_db_ok(d) || !dsp_begin(d)) return false;
    const char *vl[3] = {group_id, high, lost_on};
    if (lost_on && !dsp_exec(d, sql_loss_streak, 3, vl)) goto fail;
    const char *v[4] = {group_id, why, lost_on ? "true" : "false", poison};
    PGresult *r = dsp_q(d, sql_requeue_group, 4, v);
    if (!r) goto fail;
    long n = strtol(PQgetvalue(r, 0, 0), NULL, 10);
    long failed = strtol(PQgetvalue(r, 0, 1), NULL, 10);
    PQclear(r);
    if (!dsp_exec(d, sql_group_finish, 1, v) ||
        !dsp_exec(d, sql_group_devices_free,
               1, v) ||
        !dsp_update_utilization(d, group_id) || !dsp_commit(d))
        goto fail;
    fb_log_json(FB_LOG_INFO, "requeued an array's jobs",
                json_pack("{s:s, s:s, s:i, s:i}", "group_id", group_id, "why", why, "jobs", (int)n,
                          "failed", (int)failed));
    if (failed)
        fb_log_json(FB_LOG_WARN, "a poison array: jobs lost on too many workers in a row failed",
                    json_pack("{s:s, s:i, s:i}", "group_id", group_id, "jobs", (int)failed,
                              "workers", POISON_WORKERS));
    dsp_drop_group(d, group_id);
    d->plan_due = true;
    return true;
fail:
    dsp_rollback(d);
    return false;
}

/*
 * Re-queues group g like requeue_group; when g spans workers, its other
 * workers still registered are told to stop it (DETACH of the whole group),
 * since one worker's fault stops the whole group.  g is gone afterwards
 * when this returns true.
 */
bool dsp_requeue_spanning(fb_dispatch *d, group *g, const char *why, const char *lost_on)
{
    char id[FB_WIRE_ID_LEN + 1];
    snprintf(id, sizeof id, "%s", g->id);
    int64_t gen = g->generation;
    span *sp = g->span;
    g->span = NULL; /* kept past dsp_drop_group, for the DETACHes */
    if (!requeue_group(d, id, why, lost_on)) {
        g = dsp_find_group(d, id);
        if (g) g->span = sp;
        else free(sp);
        return false;
    }
    for (int k = 0; sp && k < sp->n; k++)
        if (dsp_find_worker(d, sp->m[k].worker))
            dsp_send_detach(d, sp->m[k].worker, id, gen, NULL, why, false);
    if (sp)
        fb_log_json(FB_LOG_INFO, "stopped an array that spans workers on all of them",
                    json_pack("{s:s, s:s, s:i}", "group_id", id, "why", why, "workers", sp->n));
    free(sp);
    return true;
}

/*
 * The stale-state check (docs/scheduling.md, "No job in limbo"): the loop's
 * own rules re-queue every array it follows whose worker is lost or no
 * longer runs it; this finds what they cannot see, whatever left it so (a
 * bug, a write that half happened, a row changed by hand): jobs scheduled
 * or running outside every array the loop follows, and arrays unfinished in
 * the database that it does not follow, past a grace of a few heartbeat
 * timeouts.  The jobs go back to the queue with a reason and an event, the
 * arrays are finished and their devices freed, and each is logged.
 */
void dsp_check_stale(fb_dispatch *d)
{
    const char **ids = malloc((size_t)(d->n_groups ? d->n_groups : 1) * sizeof *ids);
    if (!ids) return;
    for (int i = 0; i < d->n_groups; i++) ids[i] = d->groups[i].id;
    char *live = fb_db_text_array(ids, d->n_groups);
    free(ids);
    if (!live) return;
    char grace[24];
    snprintf(grace, sizeof grace, "%lld",
             (long long)STALE_GRACE_TIMEOUTS * (long long)d->cfg.heartbeat_timeout_ms);
    const char *v[2] = {live, grace};
    PGresult *rj = NULL, *rg = NULL;
    bool ok = dsp_begin(d) && (rj = dsp_q(d, sql_stale_jobs, 2, v)) &&
              (rg = dsp_q(d, sql_stale_groups, 2, v));
    for (int i = 0; ok && rg && i < PQntuples(rg); i++)
        ok = dsp_update_utilization(d, PQgetvalue(rg, i, 0));
    if (ok && dsp_commit(d)) {
        for (int i = 0; i < PQntuples(rj); i++)
            fb_log_json(FB_LOG_WARN, "a job was found without a live array; requeued",
                        json_pack("{s:s, s:s, s:s}", "job_id", PQgetvalue(rj, i, 0), "group_id",
                                  PQgetvalue(rj, i, 1), "state", PQgetvalue(rj, i, 2)));
        for (int i = 0; i < PQntuples(rg); i++)
            fb_log_json(FB_LOG_WARN, "an unfinished array no worker runs was finished",
                        json_pack("{s:s}", "group_id", PQgetvalue(rg, i, 0)));
        if (PQntuples(rj) || PQntuples(rg)) d->plan_due = true;
    } else {
        dsp_rollback(d);
    }
    PQclear(rj);
    PQclear(rg);
    free(live);
}
