/*
 * The control loop's books of early stopping (asynchronous successive
 * halving, the pure policy of asha.h): a sweep trial's evaluation at a rung
 * is recorded as the rung's result (asha_rungs), the policy decides whether
 * the trial continues, and a trial it stops is detached from its array and
 * ends completed with the end reason early_stopped.  The records ride on
 * the event's transaction (dispatch_record.c, apply_event).
 */
#include "dispatch_impl.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "asha.h"
#include "log.h"
#include "wire.h"

/* A trial under an ASHA rule of an active sweep, not stopped yet: its sweep, index, steps and
 * the rule. */
static const char sql_asha_trial[] =
    "SELECT j.sweep_id, j.trial_index, j.steps, e.x->>'metric', e.x->>'mode',"
    " (e.x->>'grace_steps')::bigint, (e.x->>'reduction_factor')::int,"
    " (e.x->>'max_rungs')::int"
    " FROM jobs j JOIN sweeps s ON s.id = j.sweep_id"
    " CROSS JOIN LATERAL (SELECT s.spec->'early_stopping' AS x) e"
    " WHERE j.id = $1::uuid AND j.trial_index IS NOT NULL"
    " AND j.state IN ('scheduled', 'running') AND s.state = 'active'"
    " AND jsonb_typeof(e.x) = 'object' AND e.x->>'type' = 'asha'"
    " AND NOT EXISTS (SELECT 1 FROM asha_rungs a WHERE a.job_id = j.id"
    "  AND a.decision = 'stop')";

/* A training measure for a rung: the latest the worker reported up to step $2. */
static const char sql_asha_train_loss[] =
    "SELECT loss FROM job_metrics WHERE job_id = $1::uuid AND step <= $2::bigint"
    " AND loss IS NOT NULL ORDER BY step DESC LIMIT 1";
static const char sql_asha_train_accuracy[] =
    "SELECT accuracy FROM job_metrics WHERE job_id = $1::uuid"
    " AND step <= $2::bigint AND accuracy IS NOT NULL ORDER BY step DESC LIMIT 1";

/* A rung's result ($3 rung, $4 step, $5 metric), once: a row comes back when it is new. */
static const char sql_asha_rung_insert[] =
    "INSERT INTO asha_rungs (sweep_id, job_id, rung, step, metric, decision)"
    " VALUES ($1::uuid, $2::uuid, $3::int, $4::bigint, $5::float8, 'continue')"
    " ON CONFLICT (job_id, rung) DO NOTHING RETURNING seq";

/* Every result of a rung so far ($1 sweep, $2 rung), in order. */
static const char sql_asha_rung_results[] =
    "SELECT j.trial_index, a.metric FROM asha_rungs a JOIN jobs j ON j.id = a.job_id"
    " WHERE a.sweep_id = $1::uuid AND a.rung = $2::int ORDER BY a.seq";

/* The rung's decision ($3). */
static const char sql_asha_rung_decide[] =
    "UPDATE asha_rungs SET decision = $3 WHERE job_id = $1::uuid AND rung = $2::int"
    " AND decision <> $3";

/* The rung's event ($2 rung, $3 step, $4 value, $5 results, $6 decision, $7 metric). */
static const char sql_asha_rung_event[] =
    "INSERT INTO job_events (job_id, kind, message, data) VALUES ($1::uuid, 'rung',"
    " 'rung ' || $2 || ' at step ' || $3 || ': ' || $7 || ' ' || round($4::numeric, 6)"
    " || ' among ' || $5 || ' results; ' || CASE WHEN $6 = 'stop'"
    " THEN 'stops (early_stopped)' ELSE 'continues' END,"
    " jsonb_build_object('rung', $2::int, 'step', $3::bigint, 'metric', $7::text,"
    " 'value', $4::float8, 'results', $5::int, 'decision', $6::text))";

/* A member its rule stopped leaves its array: completed, end reason early_stopped, its
 * checkpoints kept; its event. */
static const char sql_asha_stopped[] =
    "WITH stop AS (SELECT rung, step, metric FROM asha_rungs"
    "  WHERE job_id = $1::uuid AND decision = 'stop' ORDER BY rung LIMIT 1),"
    " upd AS (UPDATE jobs SET state = 'completed', end_reason = 'early_stopped',"
    "  in_group = false, queue_reason = NULL, step = $3::bigint,"
    "  finished_at = coalesce(finished_at, now()), updated_at = now()"
    "  WHERE id = $1::uuid AND state IN ('scheduled', 'running')"
    "  AND EXISTS (SELECT 1 FROM stop) RETURNING id)"
    " INSERT INTO job_events (job_id, kind, message, data)"
    " SELECT upd.id, 'early_stopped', 'stopped by the sweep''s early-stopping"
    " rule at rung ' || stop.rung || ' (step ' || stop.step || '); left its array"
    " at step ' || $3 || ', its checkpoints kept',"
    " jsonb_build_object('step', $3::bigint, 'group_id', $2::text, 'rung',"
    " stop.rung, 'rung_step', stop.step, 'value', stop.metric, 'end_reason',"
    " 'early_stopped') FROM upd, stop RETURNING job_id";

/*
 * Early stopping works inside apply_event's transaction behind a savepoint:
 * a failure of its own is logged and undone alone, so it never holds up the
 * record of the event it rides on (a rung it missed is taken by the trial's
 * next evaluation).  asha_end returns false only when the transaction itself
 * is lost.
 */
static bool asha_end(fb_dispatch *d, bool ok)
{
    return dsp_exec(d, ok ? "RELEASE SAVEPOINT asha" : "ROLLBACK TO SAVEPOINT asha", 0, NULL);
}

/* The rung result of an evaluation, and its decision (see dsp_asha_on_evaluated). */
static bool asha_rung(fb_dispatch *d, const fb_wire_msg *m, bool *stop)
{
    const char *v1[1] = {m->job_id};
    PGresult *r = dsp_q(d, sql_asha_trial, 1, v1);
    if (!r) return false;
    if (PQntuples(r) != 1) {
        /* not a trial under an early-stopping rule, or one stopped already that has not
         * left yet: its later evaluations weigh in no rung */
        PQclear(r);
        return true;
    }
    char sweep[FB_WIRE_ID_LEN + 1];
    snprintf(sweep, sizeof sweep, "%s", PQgetvalue(r, 0, 0));
    int64_t trial = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    int64_t total = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
    fb_asha_spec rule = {.enabled = true,
                         .mode = strcmp(PQgetvalue(r, 0, 4), "max") == 0 ? FB_METRIC_MAX
                                                                         : FB_METRIC_MIN,
                         .grace_steps = strtoll(PQgetvalue(r, 0, 5), NULL, 10),
                         .reduction_factor = (int)strtol(PQgetvalue(r, 0, 6), NULL, 10),
                         .max_rungs = (int)strtol(PQgetvalue(r, 0, 7), NULL, 10)};
    snprintf(rule.metric, sizeof rule.metric, "%s", PQgetvalue(r, 0, 3));
    PQclear(r);
    char err[256];
    if (fb_asha_check(&rule, err, sizeof err)) {
        fb_log_json(FB_LOG_WARN, "a sweep's early-stopping rule is unusable; its trials run on",
                    json_pack("{s:s, s:s}", "sweep_id", sweep, "error", err));
        return true;
    }
    /* a trial's last evaluation is no decision point: it ends there anyway */
    if (total > 0 && m->step >= total) return true;
    int rung = fb_asha_rung_at(&rule, m->step);
    if (rung < 0) return true;
    char step[24], rung_s[16], metric_s[40];
    snprintf(step, sizeof step, "%lld", (long long)m->step);
    snprintf(rung_s, sizeof rung_s, "%d", rung);
    double metric = NAN;
    /* an evaluated event is a validation: the sweep decides on it, never on a test value */
    if (strcmp(rule.metric, "val_loss") == 0) {
        metric = m->loss;
    } else if (strcmp(rule.metric, "val_accuracy") == 0) {
        metric = m->accuracy;
    } else if (strcmp(rule.metric, "loss") == 0 || strcmp(rule.metric, "accuracy") == 0) {
        /* a training measure: the latest the worker reported up to this step */
        const char *v2[2] = {m->job_id, step};
        const char *sql =
            strcmp(rule.metric, "loss") == 0 ? sql_asha_train_loss : sql_asha_train_accuracy;
        r = dsp_q(d, sql, 2, v2);
        if (!r) return false;
        if (PQntuples(r) == 1) metric = strtod(PQgetvalue(r, 0, 0), NULL);
        PQclear(r);
    }
    /* unknown (the wire's null): the trial's next evaluation may report for this rung */
    if (!isfinite(metric)) return true;
    snprintf(metric_s, sizeof metric_s, "%.17g", metric);
    const char *vi[5] = {sweep, m->job_id, rung_s, step, metric_s};
    r = dsp_q(d, sql_asha_rung_insert, 5, vi);
    if (!r) return false;
    bool fresh = PQntuples(r) == 1;
    PQclear(r);
    if (!fresh) return true; /* this rung has its result already */
    /* every result of the rung so far, this one included */
    const char *vr[2] = {sweep, rung_s};
    r = dsp_q(d, sql_asha_rung_results, 2, vr);
    if (!r) return false;
    int n = PQntuples(r);
    fb_asha_result *res = malloc((size_t)(n ? n : 1) * sizeof *res);
    if (!res) {
        PQclear(r);
        return false;
    }
    for (int i = 0; i < n; i++)
        res[i] = (fb_asha_result){.trial = strtoll(PQgetvalue(r, i, 0), NULL, 10),
                                  .metric = strtod(PQgetvalue(r, i, 1), NULL)};
    PQclear(r);
    fb_asha_decision dec;
    int e = fb_asha_decide(&rule, res, n, trial, &dec, err, sizeof err);
    free(res);
    if (e) {
        fb_log_json(FB_LOG_ERROR, "early stopping could not decide",
                    json_pack("{s:s, s:s, s:s}", "sweep_id", sweep, "job_id", m->job_id, "error",
                              err));
        return false;
    }
    char n_s[16];
    snprintf(n_s, sizeof n_s, "%d", n);
    const char *dname = fb_asha_decision_name(dec);
    const char *vu[3] = {m->job_id, rung_s, dname};
    const char *ve[7] = {m->job_id, rung_s, step, metric_s, n_s, dname, rule.metric};
    if (!dsp_exec(d, sql_asha_rung_decide, 3, vu) ||
        !dsp_exec(d, sql_asha_rung_event, 7, ve))
        return false;
    *stop = dec == FB_ASHA_STOP;
    return true;
}

/*
 * When the evaluation m of a sweep trial under an ASHA rule is the trial's
 * first at or past a rung it has not reported for, records it as the rung's
 * result (asha_rungs) and decides with server/asha whether the trial goes
 * on; *stop says whether to detach the member once the transaction commits
 * (dsp_asha_send_stop).  A trial's last evaluation is not a rung result.  Runs
 * in apply_event's transaction; false when that is lost.
 */
bool dsp_asha_on_evaluated(fb_dispatch *d, const fb_wire_msg *m, bool *stop)
{
    *stop = false;
    if (!dsp_exec(d, "SAVEPOINT asha", 0, NULL)) return false;
    bool ok = asha_rung(d, m, stop);
    if (!ok) *stop = false;
    return asha_end(d, ok);
}

/* Detaches a member its rule stopped; after COMMIT, so that the decision is on
 * record before the member leaves.  The array must still be the one the
 * evaluation came from: a member that moved since has left that one. */
void dsp_asha_send_stop(fb_dispatch *d, const fb_wire_msg *m)
{
    group *g = dsp_find_group(d, m->group_id);
    if (!g || g->generation != m->generation || !dsp_find_worker(d, g->worker)) {
        fb_log_json(FB_LOG_WARN, "an early-stopped trial's array is gone; not detached",
                    json_pack("{s:s, s:s}", "job_id", m->job_id, "group_id", m->group_id));
        return;
    }
    dsp_send_detach(d, g->worker, g->id, g->generation, m->job_id, "early_stopped", false);
    fb_log_json(FB_LOG_INFO, "early stopping: a trial leaves its array",
                json_pack("{s:s, s:s, s:I}", "job_id", m->job_id, "group_id", g->id, "step",
                          (json_int_t)m->step));
}

/*
 * A member that leaves its array after its rule stopped it ends completed,
 * with the end reason early_stopped and its checkpoints and resume point
 * kept, where any other departure of a running job goes back to the queue.
 * *stopped says whether m was such a departure.  Runs in apply_event's
 * transaction; false when that is lost.
 */
bool dsp_asha_on_detached(fb_dispatch *d, const fb_wire_msg *m, bool *stopped)
{
    *stopped = false;
    if (!dsp_exec(d, "SAVEPOINT asha", 0, NULL)) return false;
    char step[24];
    snprintf(step, sizeof step, "%lld", (long long)m->step);
    const char *v[3] = {m->job_id, m->group_id, step};
    PGresult *r = dsp_q(d, sql_asha_stopped, 3, v);
    bool ok = r != NULL;
    if (ok) *stopped = PQntuples(r) == 1;
    PQclear(r);
    return asha_end(d, ok);
}
