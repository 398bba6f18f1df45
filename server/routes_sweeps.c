/*
 * Sweeps: a base spec plus a search space, expanded by api/sweepspec into
 * jobs that are inserted together with the sweep in one transaction, so a
 * sweep is either entirely queued or not at all.  GET shows every trial with
 * its parameters, its best value of the sweep's metric, its early-stopping
 * history (each rung's result and decision, which the control loop records
 * in asha_rungs) and why it ended; cancel cancels the sweep and all its
 * unfinished trials at once.
 */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "routes.h"
#include "server_impl.h"
#include "sweepspec.h"

#define SQL_SWEEP_JSON                                                                             \
    "json_build_object('id', s.id, 'name', s.name,"                                                \
    " 'state', CASE WHEN s.state = 'cancelled' THEN 'cancelled'"                                   \
    " WHEN EXISTS (SELECT 1 FROM jobs a WHERE a.sweep_id = s.id"                                   \
    " AND a.state IN ('queued', 'scheduled', 'running')) THEN 'active' ELSE 'finished' END,"       \
    " 'n_trials', s.n_trials,"                                                                     \
    " 'metric', json_build_object('name', s.metric, 'mode', s.metric_mode),"                       \
    " 'jobs_by_state', coalesce((SELECT json_object_agg(x.state, x.n) FROM (SELECT b.state,"       \
    " count(*) AS n FROM jobs b WHERE b.sweep_id = s.id GROUP BY b.state) x), '{}'::json),"        \
    " 'created_at', s.created_at, 'updated_at', s.updated_at"

/* Columns a sweep may rank by: sweepspec's metric names, the training and validation ones.
 * No test column: a test metric is reported, never a basis for choosing a trial. */
static const char *const rank_columns[] = {"loss", "accuracy", "val_loss", "val_accuracy"};

/* ---- read ---- */

typedef struct sweep_read {
    const char *id, *tenant_id;
    bool trials; /* include the trial list */
    json_t *out;
} sweep_read;

static int sweep_read_conn(fb_db_conn *c, sweep_read *x, char *msg, size_t msg_cap)
{
    int err;
    const char *v[2] = {x->id, x->tenant_id};
    PGresult *r = fb_db_query(c, "sweep_get",
                              "SELECT s.metric, s.metric_mode, " SQL_SWEEP_JSON ", 'spec', s.spec)"
                              " FROM sweeps s WHERE s.id = $1::uuid AND s.tenant_id = $2::uuid",
                              2, v, &err, msg, msg_cap);
    if (!r) return err;
    json_decref(x->out);
    x->out = NULL;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return FB_OK;
    }
    const char *col = NULL;
    for (size_t i = 0; i < sizeof rank_columns / sizeof rank_columns[0]; i++)
        if (strcmp(PQgetvalue(r, 0, 0), rank_columns[i]) == 0) col = rank_columns[i];
    bool max = strcmp(PQgetvalue(r, 0, 1), "max") == 0;
    x->out = fb_pg_json(r, 0, 2);
    PQclear(r);
    if (!x->out) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    if (!x->trials || !col) return FB_OK;
    char sql[2048];
    /* rungs: the trial's early-stopping results, rung by rung (asha_rungs) */
    snprintf(sql, sizeof sql,
             "SELECT json_build_object('index', j.trial_index, 'job_id', j.id, 'name', j.name,"
             " 'state', j.state, 'step', j.step, 'params', j.trial_params, 'best',"
             " (SELECT json_build_object('value', m.%s, 'step', m.step) FROM job_metrics m"
             " WHERE m.job_id = j.id AND m.%s IS NOT NULL ORDER BY m.%s %s, m.step LIMIT 1),"
             " 'end_reason', j.end_reason, 'rungs', coalesce((SELECT json_agg(json_build_object("
             " 'rung', a.rung, 'step', a.step, 'metric', a.metric, 'decision', a.decision,"
             " 'decided_at', a.decided_at) ORDER BY a.rung) FROM asha_rungs a"
             " WHERE a.job_id = j.id), '[]'::json))"
             " FROM jobs j WHERE j.sweep_id = $1::uuid ORDER BY j.trial_index",
             col, col, col, max ? "DESC" : "ASC");
    r = fb_db_query(c, NULL, sql, 1, v, &err, msg, msg_cap);
    if (!r) return err;
    json_t *trials = json_array();
    json_t *best = json_null();
    double best_value = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        json_t *t = fb_pg_json(r, i, 0);
        json_t *b = json_object_get(t, "best");
        if (json_is_object(b) && json_is_number(json_object_get(b, "value"))) {
            double val = json_number_value(json_object_get(b, "value"));
            if (json_is_null(best) || (max ? val > best_value : val < best_value)) {
                json_decref(best);
                best = json_pack("{s:O, s:O, s:O}", "job_id", json_object_get(t, "job_id"), "index",
                                 json_object_get(t, "index"), "value", json_object_get(b, "value"));
                if (!best) best = json_null();
                best_value = val;
            }
        }
        json_array_append_new(trials, t);
    }
    PQclear(r);
    json_object_set_new(x->out, "trials", trials);
    json_object_set_new(x->out, "best_trial", best);
    return FB_OK;
}

static int sweep_get_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    return sweep_read_conn(c, arg, msg, msg_cap);
}

static int reply_sweep(fb_req *req, const char *id, int status)
{
    sweep_read x = {.id = id, .tenant_id = req->key.tenant_id, .trials = true};
    int err = fb_route_txn(req, sweep_get_txn, &x);
    if (err) {
        json_decref(x.out);
        return err;
    }
    if (!x.out) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such sweep");
    fb_req_reply_json(req, status, x.out);
    return FB_OK;
}

int fb_route_sweep_get(fb_req *req)
{
    static const char *const none[] = {NULL};
    const char *id = fb_req_param(req, 0);
    int err;
    if ((err = fb_req_check_query(req, none))) return err;
    if (!fb_is_uuid(id)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such sweep");
    err = reply_sweep(req, id, 200);
    if (!err) fb_req_revalidate(req);
    return err;
}

/* ---- create ---- */

typedef struct sweep_create {
    const char *tenant_id;
    const fb_sweep_spec *spec;
    const char *canonical;
    const char *idem_key;
    const char *hash_hex; /* \x-prefixed */
    json_t *trials;       /* array handed to the INSERT */
    char id[FB_UUID_LEN + 1];
    bool replayed, mismatch, quota;
} sweep_create;

static int sweep_by_idem(fb_db_conn *c, sweep_create *x, bool *found, char *msg, size_t msg_cap)
{
    int err;
    const char *v[2] = {x->tenant_id, x->idem_key};
    PGresult *r = fb_db_query(c, "sweep_by_idem",
                              "SELECT s.id, encode(s.request_hash, 'hex') FROM sweeps s"
                              " WHERE s.tenant_id = $1::uuid AND s.idempotency_key = $2",
                              2, v, &err, msg, msg_cap);
    if (!r) return err;
    *found = PQntuples(r) == 1;
    if (*found) {
        snprintf(x->id, sizeof x->id, "%s", PQgetvalue(r, 0, 0));
        x->replayed = true;
        x->mismatch = strcmp(PQgetvalue(r, 0, 1), x->hash_hex + 2) != 0;
    }
    PQclear(r);
    return FB_OK;
}

static int sweep_create_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    sweep_create *x = arg;
    int err;
    bool found = false;
    if (x->idem_key && ((err = sweep_by_idem(c, x, &found, msg, msg_cap)) || found)) return err;
    if ((err = fb_db_begin(c, msg, msg_cap))) return err;
    char n_trials[16];
    snprintf(n_trials, sizeof n_trials, "%d", fb_sweep_spec_n_trials(x->spec));
    const char *vq[2] = {x->tenant_id, n_trials};
    /* the tenant's submissions and sweeps count the queue one at a time
     * (see sql_tenant_lock in routes_jobs.c): the count below is a statement
     * of its own, so that it sees what the previous holder committed */
    PGresult *r = fb_db_query(c, "tenant_lock_sweeps",
                              "SELECT 1 FROM tenants WHERE id = $1::uuid FOR NO KEY UPDATE", 1, vq,
                              &err, msg, msg_cap);
    if (!r) return err;
    PQclear(r);
    r = fb_db_query(c, NULL,
                    "SELECT (SELECT coalesce(sum(q.n), 0) FROM tenant_queued_counts q"
                    " WHERE q.tenant_id = t.id) + $2::integer <= t.max_queued_jobs"
                    " FROM tenants t WHERE t.id = $1::uuid",
                    2, vq, &err, msg, msg_cap);
    if (!r) return err;
    x->quota = PQntuples(r) != 1 || PQgetvalue(r, 0, 0)[0] != 't';
    PQclear(r);
    if (x->quota) return FB_OK;
    fb_metric_mode mode;
    const char *metric = fb_sweep_spec_metric(x->spec, &mode);
    const char *vs[7] = {
        x->tenant_id, fb_sweep_spec_name(x->spec),           x->canonical, n_trials,
        metric,       mode == FB_METRIC_MIN ? "min" : "max", x->idem_key};
    const char *vs_all[8] = {vs[0], vs[1], vs[2], vs[3],
                             vs[4], vs[5], vs[6], x->idem_key ? x->hash_hex : NULL};
    r = fb_db_query(c, NULL,
                    "INSERT INTO sweeps (tenant_id, name, spec, n_trials, metric, metric_mode,"
                    " idempotency_key, request_hash) VALUES ($1::uuid, $2, $3::jsonb,"
                    " $4::integer, $5, $6, $7, $8::bytea)"
                    " ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL"
                    " DO NOTHING RETURNING id",
                    8, vs_all, &err, msg, msg_cap);
    if (!r) return err;
    if (PQntuples(r) != 1) {
        /* a concurrent request with this key committed first */
        PQclear(r);
        fb_db_rollback(c);
        return sweep_by_idem(c, x, &found, msg, msg_cap);
    }
    snprintf(x->id, sizeof x->id, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    char *trials = json_dumps(x->trials, JSON_COMPACT | JSON_REAL_PRECISION(17));
    if (!trials) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    /* the trials' submission on the control loop's clock (db.h) */
    char submitted[32];
    const char *vj[4] = {x->tenant_id, x->id, trials, fb_db_clock_now(submitted, sizeof submitted)};
    r = fb_db_query(
        c, NULL,
        "WITH ins AS (INSERT INTO jobs (tenant_id, name, queue_reason, spec, fusion_key,"
        " dataset, n_params, flops_per_sample, priority, steps, epochs, max_restarts,"
        " sweep_id, trial_index, trial_params, init_path, created_at)"
        " SELECT $1::uuid, e.t->>'name', 'waiting for devices', e.t->'spec',"
        " e.t->>'fusion_key', e.t->>'dataset', (e.t->>'n_params')::bigint,"
        " (e.t->>'flops')::float8, (e.t->>'priority')::integer,"
        " (e.t->>'steps')::bigint, (e.t->>'epochs')::bigint,"
        " (e.t->>'max_restarts')::integer, $2::uuid, (e.i - 1)::integer,"
        " e.t->'params', e.t->>'init_path', coalesce(to_timestamp($4::float8), now())"
        " FROM jsonb_array_elements($3::jsonb) WITH ORDINALITY AS e(t, i)"
        " RETURNING id)"
        " INSERT INTO job_events (job_id, kind, message)"
        " SELECT id, 'submitted', 'queued by a sweep: waiting for devices' FROM ins",
        4, vj, &err, msg, msg_cap);
    free(trials);
    if (!r) return err;
    PQclear(r);
    return fb_db_commit(c, msg, msg_cap);
}

#define SWEEP_INIT_PATH_MAX 1024

/* The rows the INSERT reads: one object per trial, with its resolved init artifact. */
static json_t *trial_rows(const fb_sweep_spec *s, const char (*init_paths)[SWEEP_INIT_PATH_MAX])
{
    json_t *rows = json_array();
    for (int i = 0; rows && i < fb_sweep_spec_n_trials(s); i++) {
        const fb_job_spec *j = fb_sweep_spec_trial(s, i);
        json_t *spec = json_loads(fb_sweep_spec_trial_json(s, i), 0, NULL);
        json_t *params = json_loads(fb_sweep_spec_trial_params(s, i), 0, NULL);
        json_t *row =
            json_pack("{s:s, s:o?, s:s, s:s, s:I, s:f, s:i, s:I, s:I, s:i, s:o?, s:s?}", "name",
                      j->name, "spec", spec, "fusion_key", j->fusion_key, "dataset", j->dataset,
                      "n_params", (json_int_t)j->n_params, "flops", j->flops_fwd + j->flops_bwd,
                      "priority", j->priority, "steps", (json_int_t)j->steps, "epochs",
                      (json_int_t)j->epochs, "max_restarts", j->max_restarts, "params", params,
                      "init_path", init_paths[i][0] ? init_paths[i] : NULL);
        if (!spec || !params || !row || json_array_append_new(rows, row)) {
            json_decref(rows);
            return NULL;
        }
    }
    return rows;
}

int fb_route_sweep_create(fb_req *req)
{
    static const char *const none[] = {NULL};
    char idem_buf[160];
    const char *idem;
    int err;
    if ((err = fb_req_check_query(req, none)) ||
        (err = fb_idempotency_key(req, idem_buf, sizeof idem_buf, &idem)))
        return err;
    fb_sweep_spec *spec = NULL;
    char msg[FB_MSG_MAX];
    err = fb_sweep_spec_parse(req->body, req->body_len, NULL, &spec, msg, sizeof msg);
    if (err) return fb_req_fail_msg(req, err, msg, NULL);
    /* each trial's dataset and init, checked once for each value a search space gives them
     * (most sweeps search neither: one check) */
    int n_trials = fb_sweep_spec_n_trials(spec);
    char(*init_paths)[SWEEP_INIT_PATH_MAX] = calloc((size_t)n_trials + 1, sizeof *init_paths);
    if (!init_paths) {
        fb_sweep_spec_free(spec);
        return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    }
    for (int i = 0; i < n_trials; i++) {
        const fb_job_spec *t = fb_sweep_spec_trial(spec, i), *p = NULL;
        if (i > 0) p = fb_sweep_spec_trial(spec, i - 1);
        if (p && strcmp(t->dataset, p->dataset) == 0 && strcmp(t->init, p->init) == 0 &&
            strcmp(t->init_job, p->init_job) == 0 && t->init_checkpoint == p->init_checkpoint) {
            memcpy(init_paths[i], init_paths[i - 1], sizeof init_paths[i]);
            continue;
        }
        if ((err = fb_route_spec_refs(req, t, "base", init_paths[i], sizeof init_paths[i]))) {
            free(init_paths);
            fb_sweep_spec_free(spec);
            return err;
        }
    }
    char *canon = fb_sweep_spec_canonical(spec);
    json_t *rows = trial_rows(spec, init_paths);
    free(init_paths);
    if (!canon || !rows) {
        free(canon);
        json_decref(rows);
        fb_sweep_spec_free(spec);
        return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    }
    uint8_t hash[32];
    crypto_generichash(hash, sizeof hash, (const unsigned char *)canon, strlen(canon), NULL, 0);
    char hash_hex[2 + 64 + 1] = "\\x";
    sodium_bin2hex(hash_hex + 2, sizeof hash_hex - 2, hash, sizeof hash);
    sweep_create x = {.tenant_id = req->key.tenant_id,
                      .spec = spec,
                      .canonical = canon,
                      .idem_key = idem,
                      .hash_hex = hash_hex,
                      .trials = rows};
    err = fb_route_txn(req, sweep_create_txn, &x);
    free(canon);
    json_decref(rows);
    fb_sweep_spec_free(spec);
    if (err) return err;
    if (x.mismatch)
        return fb_req_fail(req, FB_ERR_IDEMPOTENCY_CONFLICT, "Idempotency-Key",
                           "this Idempotency-Key was used for a different sweep");
    if (x.quota)
        return fb_req_fail(req, FB_ERR_QUOTA_EXCEEDED, NULL,
                           "the sweep's %d jobs would exceed the tenant's max_queued_jobs quota",
                           n_trials);
    char loc[80];
    snprintf(loc, sizeof loc, "/v1/sweeps/%s", x.id);
    fb_req_add_header(req, "Location", loc);
    if (x.replayed) fb_req_add_header(req, "Idempotent-Replayed", "true");
    return reply_sweep(req, x.id, x.replayed ? 200 : 201);
}

/* ---- list ---- */

typedef struct sweep_list {
    const char *vals[3];
    long long limit;
    json_t *items;
    char next[24];
} sweep_list;

static int sweep_list_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    sweep_list *x = arg;
    int err;
    PGresult *r = fb_db_query(c, NULL,
                              "SELECT s.seq, " SQL_SWEEP_JSON ") FROM sweeps s"
                              " WHERE s.tenant_id = $1::uuid"
                              " AND ($2::bigint IS NULL OR s.seq < $2::bigint)"
                              " ORDER BY s.seq DESC LIMIT $3::integer",
                              3, x->vals, &err, msg, msg_cap);
    if (!r) return err;
    fb_pg_page(r, x->limit, &x->items, x->next, sizeof x->next);
    return FB_OK;
}

int fb_route_sweep_list(fb_req *req)
{
    static const char *const allowed[] = {"limit", "cursor", NULL};
    char cursor[24], limit_s[16];
    sweep_list x = {0};
    int err;
    if ((err = fb_req_check_query(req, allowed)) ||
        (err = fb_query_int(req, "limit", 50, 1, 200, &x.limit)) ||
        (err = fb_query_str(req, "cursor", cursor, sizeof cursor)))
        return err;
    if (cursor[0] && !fb_cursor_seq_ok(cursor))
        return fb_req_fail(req, FB_ERR_BAD_QUERY, "cursor", "cursor: not a cursor of this list");
    snprintf(limit_s, sizeof limit_s, "%lld", x.limit + 1);
    x.vals[0] = req->key.tenant_id;
    x.vals[1] = cursor[0] ? cursor : NULL;
    x.vals[2] = limit_s;
    err = fb_route_reply_page(req, sweep_list_txn, &x, &x.items, x.next, "sweeps");
    if (!err) fb_req_revalidate(req);
    return err;
}

/* ---- cancel ---- */

typedef struct sweep_cancel {
    const char *id, *tenant_id;
    bool found;
} sweep_cancel;

static int sweep_cancel_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    sweep_cancel *x = arg;
    int err;
    if ((err = fb_db_begin(c, msg, msg_cap))) return err;
    const char *v[2] = {x->id, x->tenant_id};
    PGresult *r = fb_db_query(c, NULL,
                              "UPDATE sweeps SET state = 'cancelled', updated_at = now()"
                              " WHERE id = $1::uuid AND tenant_id = $2::uuid RETURNING id",
                              2, v, &err, msg, msg_cap);
    if (!r) return err;
    x->found = PQntuples(r) == 1;
    PQclear(r);
    if (!x->found) return FB_OK;
    r = fb_db_query(c, NULL,
                    "WITH upd AS (UPDATE jobs SET state = 'cancelled', queue_reason = NULL,"
                    " finished_at = now(), updated_at = now()"
                    " WHERE sweep_id = $1::uuid AND tenant_id = $2::uuid"
                    " AND state IN ('queued', 'scheduled', 'running') RETURNING id)"
                    " INSERT INTO job_events (job_id, kind, message)"
                    " SELECT id, 'cancelled', 'the sweep was cancelled' FROM upd",
                    2, v, &err, msg, msg_cap);
    if (!r) return err;
    PQclear(r);
    return fb_db_commit(c, msg, msg_cap);
}

int fb_route_sweep_cancel(fb_req *req)
{
    static const char *const none[] = {NULL};
    const char *id = fb_req_param(req, 0);
    int err;
    if ((err = fb_req_check_query(req, none))) return err;
    if (!fb_is_uuid(id)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such sweep");
    sweep_cancel x = {.id = id, .tenant_id = req->key.tenant_id};
    if ((err = fb_route_txn(req, sweep_cancel_txn, &x))) return err;
    if (!x.found) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such sweep");
    return reply_sweep(req, id, 200);
}
