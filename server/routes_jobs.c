/*
 * Jobs: submit, list, show, cancel, and the time series, events,
 * checkpoints and model that workers record for a job.
 *
 * A submission is validated by api/jobspec, then written in one transaction
 * that first locks the tenant's row, so that the tenant's submissions (and
 * sweeps) count the queue one after another and max_queued_jobs holds exactly
 * however many arrive at once; the job row, its "submitted" event and the
 * quota check are one statement, and a 201 always means the job is committed.  With
 * an Idempotency-Key, a retry of the same request returns the same job
 * (200, Idempotent-Replayed: true); the same key with a different spec is
 * refused with 422.  Jobs start queued, waiting for devices: the control
 * loop that schedules them is not part of this file and reads the table.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jobspec.h"
#include "paths.h"
#include "routes.h"
#include "server_impl.h"

static const char *const job_states[] = {"queued",    "scheduled", "running",
                                         "completed", "failed",    "cancelled"};

/* ---- submit ---- */

typedef struct job_create {
    const char *tenant_id;
    const char *vals[15];
    const char *idem_key;
    const char *hash_hex; /* without the \x prefix */
    json_t *out;
    bool replayed;
    bool quota;
    bool mismatch;
} job_create;

/* Taken before the queue is counted: under READ COMMITTED a count in the
 * INSERT itself would not see a concurrent submission that has not committed
 * yet, and both would pass.  The statement after the lock reads a snapshot
 * taken once the previous holder committed.  NO KEY UPDATE: it waits for this
 * tenant's other submissions, sweeps and quota changes, not for the foreign
 * key checks of rows that merely reference the tenant. */
static const char sql_tenant_lock[] = "SELECT 1 FROM tenants WHERE id = $1::uuid FOR NO KEY UPDATE";

static const char sql_job_insert[] =
    "WITH ins AS ("
    " INSERT INTO jobs (tenant_id, name, queue_reason, spec, fusion_key, dataset, n_params,"
    " flops_per_sample, priority, steps, epochs, max_restarts, idempotency_key, request_hash,"
    " init_path, created_at)"
    " SELECT $1::uuid, $2, 'waiting for devices', $3::jsonb, $4, $5, $6::bigint, $7::float8,"
    " $8::integer, $9::bigint, $10::bigint, $11::integer, $12, $13::bytea, $14,"
    " coalesce(to_timestamp($15::float8), now())"
    " WHERE (SELECT coalesce(sum(c.n), 0) FROM tenant_queued_counts c WHERE c.tenant_id = $1::uuid)"
    " < (SELECT t.max_queued_jobs FROM tenants t WHERE t.id = $1::uuid)"
    " ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
    " RETURNING *),"
    " ev AS (INSERT INTO job_events (job_id, kind, message)"
    " SELECT id, 'submitted', 'queued: waiting for devices' FROM ins)"
    " SELECT " FB_SQL_JOB_FULL("NULL") " FROM ins j";

static const char sql_job_by_idem[] = "SELECT encode(j.request_hash, 'hex'), " FB_SQL_JOB_FULL(
    "NULL") " FROM jobs j WHERE j.tenant_id = $1::uuid AND j.idempotency_key = $2";

/* Looks the key's job up; *found when it exists (then x->out holds it). */
static int job_by_idem(fb_db_conn *c, job_create *x, bool *found, char *msg, size_t msg_cap)
{
    int err;
    const char *v[2] = {x->tenant_id, x->idem_key};
    PGresult *r = fb_db_query(c, "job_by_idem", sql_job_by_idem, 2, v, &err, msg, msg_cap);
    if (!r) return err;
    *found = PQntuples(r) == 1;
    if (*found) {
        x->replayed = true;
        x->mismatch = strcmp(PQgetvalue(r, 0, 0), x->hash_hex) != 0;
        json_decref(x->out);
        x->out = fb_pg_json(r, 0, 1);
    }
    PQclear(r);
    return FB_OK;
}

static int job_create_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    job_create *x = arg;
    int err;
    bool found = false;
    /* A retry usually finds its job: look first, so that it never counts
     * against the quota a second time nor waits for the tenant's lock. */
    if (x->idem_key && ((err = job_by_idem(c, x, &found, msg, msg_cap)) || found)) return err;
    if ((err = fb_db_begin(c, msg, msg_cap))) return err;
    const char *v[1] = {x->tenant_id};
    PGresult *r = fb_db_query(c, "tenant_lock_jobs", sql_tenant_lock, 1, v, &err, msg, msg_cap);
    if (!r) return err;
    PQclear(r);
    r = fb_db_query(c, "job_insert", sql_job_insert, 15, x->vals, &err, msg, msg_cap);
    if (!r) return err;
    if (PQntuples(r) == 1) {
        json_decref(x->out);
        x->out = fb_pg_json(r, 0, 0);
        PQclear(r);
        return fb_db_commit(c, msg, msg_cap);
    }
    PQclear(r);
    /* Nothing inserted: either a request with the same key committed first
     * (its row is visible now), or the quota is full. */
    fb_db_rollback(c);
    if (x->idem_key && ((err = job_by_idem(c, x, &found, msg, msg_cap)) || found)) return err;
    x->quota = true;
    return FB_OK;
}

int fb_route_job_create(fb_req *req)
{
    static const char *const none[] = {NULL};
    char idem_buf[160];
    const char *idem;
    int err;
    if ((err = fb_req_check_query(req, none)) ||
        (err = fb_idempotency_key(req, idem_buf, sizeof idem_buf, &idem)))
        return err;
    fb_job_spec spec;
    char msg[FB_MSG_MAX];
    err = fb_job_spec_parse(req->body, req->body_len, NULL, &spec, msg, sizeof msg);
    if (err) return fb_req_fail_msg(req, err, msg, NULL);
    char init_path[1024];
    if ((err = fb_route_spec_refs(req, &spec, "", init_path, sizeof init_path))) {
        fb_job_spec_free(&spec);
        return err;
    }
    char *canon = fb_job_spec_canonical(&spec);
    if (!canon) {
        fb_job_spec_free(&spec);
        return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    }
    uint8_t hash[32];
    crypto_generichash(hash, sizeof hash, (const unsigned char *)canon, strlen(canon), NULL, 0);
    char hash_hex[2 + 64 + 1] = "\\x";
    sodium_bin2hex(hash_hex + 2, sizeof hash_hex - 2, hash, sizeof hash);
    char n_params[24], flops[40], priority[16], steps[24], epochs[24], restarts[16];
    snprintf(n_params, sizeof n_params, "%lld", (long long)spec.n_params);
    snprintf(flops, sizeof flops, "%.17g", spec.flops_fwd + spec.flops_bwd);
    snprintf(priority, sizeof priority, "%d", spec.priority);
    snprintf(steps, sizeof steps, "%lld", (long long)spec.steps);
    snprintf(epochs, sizeof epochs, "%lld", (long long)spec.epochs);
    snprintf(restarts, sizeof restarts, "%d", spec.max_restarts);
    /* its submission on the control loop's clock (db.h), from which its slowdown counts */
    char submitted[32];
    job_create x = {
        .tenant_id = req->key.tenant_id,
        .vals = {req->key.tenant_id, spec.name, canon, spec.fusion_key, spec.dataset, n_params,
                 flops, priority, steps, epochs, restarts, idem, idem ? hash_hex : NULL,
                 init_path[0] ? init_path : NULL, fb_db_clock_now(submitted, sizeof submitted)},
        .idem_key = idem,
        .hash_hex = hash_hex + 2,
    };
    err = fb_route_txn(req, job_create_txn, &x);
    free(canon);
    fb_job_spec_free(&spec);
    if (err) {
        json_decref(x.out);
        return err;
    }
    if (x.mismatch) {
        json_decref(x.out);
        return fb_req_fail(req, FB_ERR_IDEMPOTENCY_CONFLICT, "Idempotency-Key",
                           "this Idempotency-Key was used for a different job spec");
    }
    if (x.quota)
        return fb_req_fail(req, FB_ERR_QUOTA_EXCEEDED, NULL,
                           "the tenant's max_queued_jobs quota is reached; wait for jobs to "
                           "start or cancel some");
    if (!x.out) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    char loc[80];
    snprintf(loc, sizeof loc, "/v1/jobs/%s", json_string_value(json_object_get(x.out, "id")));
    fb_req_add_header(req, "Location", loc);
    if (x.replayed) fb_req_add_header(req, "Idempotent-Replayed", "true");
    fb_req_reply_json(req, x.replayed ? 200 : 201, x.out);
    return FB_OK;
}

/* ---- show ---- */

typedef struct job_read {
    const char *tenant_id;
    const char *id;
    char *text; /* the job as PostgreSQL rendered it; sent as is */
    size_t len;
} job_read;

static int job_get_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    job_read *x = arg;
    int err;
    const char *v[2] = {x->id, x->tenant_id};
    PGresult
        *r =
            fb_db_query(
                c, "job_get",
                /* fair_share: what the fair-share controller set for the array the job trains in;
                 * device_breakdown: that array's latest step time breakdown per device */
                "SELECT " FB_SQL_JOB_JSON(
                    FB_SQL_QUEUE_POSITION,
                    ", 'trial_params', j.trial_params, 'spec', j.spec, 'fair_share', (SELECT"
                    " json_build_object('time_share', g.time_share, 'split', to_json(g.split))"
                    " FROM groups g WHERE g.id = j.group_id AND j.in_group AND g.state <> "
                    "'finished'),"
                    " 'device_breakdown', (SELECT g.device_breakdown"
                    " FROM groups g WHERE g.id = j.group_id AND j.in_group AND g.state <> "
                    "'finished')") " FROM jobs j WHERE j.id = $1::uuid AND j.tenant_id = $2::uuid",
                2, v, &err, msg, msg_cap);
    if (!r) return err;
    free(x->text);
    x->text = NULL;
    if (PQntuples(r) == 1) {
        x->len = (size_t)PQgetlength(r, 0, 0);
        x->text = malloc(x->len + 1);
        if (x->text) memcpy(x->text, PQgetvalue(r, 0, 0), x->len + 1);
    }
    bool found = PQntuples(r) == 1;
    PQclear(r);
    if (found && !x->text) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    return FB_OK;
}

int fb_route_job_get(fb_req *req)
{
    static const char *const none[] = {NULL};
    const char *id = fb_req_param(req, 0);
    int err;
    if ((err = fb_req_check_query(req, none))) return err;
    if (!fb_is_uuid(id)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such job");
    job_read x = {.tenant_id = req->key.tenant_id, .id = id};
    if ((err = fb_route_txn(req, job_get_txn, &x))) {
        free(x.text);
        return err;
    }
    if (!x.text) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such job");
    fb_req_reply_owned(req, 200, "application/json", x.text, x.len);
    fb_req_revalidate(req);
    return FB_OK;
}

/* ---- list ---- */

typedef struct job_list {
    const char *vals[6];
    json_t *items;
    long long limit;
    char next[24];
} job_list;

static int job_list_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    job_list *x = arg;
    int err;
    PGresult *r = fb_db_query(
        c, NULL,
        "SELECT j.seq, " FB_SQL_JOB_JSON(
            "NULL", "") " FROM jobs j"
                        " WHERE j.tenant_id = $1::uuid AND ($2::text IS NULL OR j.state = $2)"
                        " AND ($3::uuid IS NULL OR j.sweep_id = $3::uuid)"
                        " AND ($4::text IS NULL OR j.name = $4)"
                        " AND ($5::bigint IS NULL OR j.seq < $5::bigint)"
                        " ORDER BY j.seq DESC LIMIT $6::integer",
        6, x->vals, &err, msg, msg_cap);
    if (!r) return err;
    fb_pg_page(r, x->limit, &x->items, x->next, sizeof x->next);
    return FB_OK;
}

/* Cursors are the seq of the last item, as decimal digits. */
static int parse_cursor(fb_req *req, const char *name, char *out, size_t cap)
{
    int err = fb_query_str(req, name, out, cap);
    if (err || !out[0]) return err;
    if (!fb_cursor_seq_ok(out)) return fb_req_fail(req, FB_ERR_BAD_QUERY, name, "%s: not a cursor of this list", name);
    return FB_OK;
}

int fb_route_job_list(fb_req *req)
{
    static const char *const allowed[] = {"state", "sweep_id", "name", "limit", "cursor", NULL};
    char state[16], sweep[40], name[FB_SPEC_NAME_MAX + 1], cursor[24], limit_s[16];
    job_list x = {0};
    int err;
    if ((err = fb_req_check_query(req, allowed)) ||
        (err = fb_query_str(req, "state", state, sizeof state)) ||
        (err = fb_query_str(req, "sweep_id", sweep, sizeof sweep)) ||
        (err = fb_query_str(req, "name", name, sizeof name)) ||
        (err = fb_query_int(req, "limit", 50, 1, 200, &x.limit)) ||
        (err = parse_cursor(req, "cursor", cursor, sizeof cursor)))
        return err;
    if (state[0]) {
        bool ok = false;
        for (size_t i = 0; i < sizeof job_states / sizeof job_states[0]; i++)
            if (strcmp(state, job_states[i]) == 0) ok = true;
        if (!ok)
            return fb_req_fail(req, FB_ERR_BAD_QUERY, "state",
                               "state: one of queued, scheduled, running, completed, failed, "
                               "cancelled");
    }
    if (sweep[0] && !fb_is_uuid(sweep))
        return fb_req_fail(req, FB_ERR_BAD_QUERY, "sweep_id", "sweep_id: not a sweep id");
    snprintf(limit_s, sizeof limit_s, "%lld", x.limit + 1);
    x.vals[0] = req->key.tenant_id;
    x.vals[1] = state[0] ? state : NULL;
    x.vals[2] = sweep[0] ? sweep : NULL;
    x.vals[3] = name[0] ? name : NULL;
    x.vals[4] = cursor[0] ? cursor : NULL;
    x.vals[5] = limit_s;
    err = fb_route_reply_page(req, job_list_txn, &x, &x.items, x.next, "jobs");
    if (!err) fb_req_revalidate(req);
    return err;
}

/* ---- cancel ---- */

typedef struct job_cancel {
    const char *vals[2];
    json_t *out;
    char state[16]; /* when nothing was cancelled: the job's state, "" if absent */
} job_cancel;

static int job_cancel_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    job_cancel *x = arg;
    int err;
    fb_db_autocommit(c);
    PGresult *r =
        fb_db_query(c, "job_cancel",
                    "WITH upd AS (UPDATE jobs SET state = 'cancelled', queue_reason = NULL,"
                    " finished_at = now(), updated_at = now()"
                    " WHERE id = $1::uuid AND tenant_id = $2::uuid"
                    " AND state IN ('queued', 'scheduled', 'running') RETURNING *),"
                    " ev AS (INSERT INTO job_events (job_id, kind, message)"
                    " SELECT id, 'cancelled', 'cancelled by the tenant' FROM upd)"
                    " SELECT " FB_SQL_JOB_FULL("NULL") " FROM upd j",
                    2, x->vals, &err, msg, msg_cap);
    if (!r) return err;
    json_decref(x->out);
    x->out = NULL;
    if (PQntuples(r) == 1) {
        x->out = fb_pg_json(r, 0, 0);
        PQclear(r);
        return FB_OK;
    }
    PQclear(r);
    r = fb_db_query(c, "job_get_plain",
                    "SELECT j.state, " FB_SQL_JOB_FULL(
                        "NULL") " FROM jobs j WHERE j.id = $1::uuid AND j.tenant_id = $2::uuid",
                    2, x->vals, &err, msg, msg_cap);
    if (!r) return err;
    x->state[0] = '\0';
    if (PQntuples(r) == 1) {
        snprintf(x->state, sizeof x->state, "%s", PQgetvalue(r, 0, 0));
        x->out = fb_pg_json(r, 0, 1);
    }
    PQclear(r);
    return FB_OK;
}

int fb_route_job_cancel(fb_req *req)
{
    static const char *const none[] = {NULL};
    const char *id = fb_req_param(req, 0);
    int err;
    if ((err = fb_req_check_query(req, none))) return err;
    if (!fb_is_uuid(id)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such job");
    job_cancel x = {.vals = {id, req->key.tenant_id}};
    if ((err = fb_route_txn(req, job_cancel_txn, &x))) {
        json_decref(x.out);
        return err;
    }
    if (!x.out && !x.state[0]) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such job");
    if (x.state[0] && strcmp(x.state, "cancelled") != 0) {
        json_decref(x.out);
        return fb_req_fail(req, FB_ERR_STATE_CONFLICT, NULL, "the job is already %s", x.state);
    }
    if (!x.out) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    fb_req_reply_json(req, 200, x.out);
    return FB_OK;
}

/* ---- metrics, events, checkpoints ---- */

/* Series a worker may report per step; the names are also column names. */
static const char *const metric_fields[] = {
    "loss",          "accuracy", "val_loss",   "val_accuracy", "test_loss", "test_accuracy",
    "samples_per_s", "slowdown", "compute_ms", "comm_ms",      "io_ms",     "wait_ms"};
#define N_METRIC_FIELDS ((int)(sizeof metric_fields / sizeof metric_fields[0]))
_Static_assert(N_METRIC_FIELDS == FB_METRIC_FIELDS, "routes.h counts the metric series");

const char *fb_metric_field_name(int i)
{
    return i >= 0 && i < N_METRIC_FIELDS ? metric_fields[i] : NULL;
}

bool fb_metric_fields_parse(const char *list, int sel[FB_METRIC_FIELDS], int *n_sel)
{
    int n = 0;
    for (const char *p = list;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        int found = -1;
        for (int i = 0; i < N_METRIC_FIELDS; i++)
            if (strlen(metric_fields[i]) == len && strncmp(metric_fields[i], p, len) == 0)
                found = i;
        if (found < 0) return false;
        bool dup = false;
        for (int i = 0; i < n; i++)
            if (sel[i] == found) dup = true;
        if (!dup) sel[n++] = found;
        if (!end) break;
        p = end + 1;
    }
    *n_sel = n;
    return true;
}

/* Does the tenant own the job? */
static int job_owned(fb_db_conn *c, const char *id, const char *tenant_id, bool *owned, char *msg,
                     size_t msg_cap)
{
    int err;
    const char *v[2] = {id, tenant_id};
    PGresult *r = fb_db_query(c, "job_owned",
                              "SELECT 1 FROM jobs WHERE id = $1::uuid AND tenant_id = $2::uuid", 2,
                              v, &err, msg, msg_cap);
    if (!r) return err;
    *owned = PQntuples(r) == 1;
    PQclear(r);
    return FB_OK;
}

typedef struct job_series {
    const char *id, *tenant_id;
    bool owned;
    int n_sel;
    int sel[FB_METRIC_FIELDS];
    long long since, limit, after;
    json_t *items;
    bool more;
    char last[24];
    char model_path[PATH_MAX];
    char model_name[FB_SPEC_NAME_MAX + 1];
    bool have_model;
} job_series;

static int job_metrics_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    job_series *x = arg;
    int err = job_owned(c, x->id, x->tenant_id, &x->owned, msg, msg_cap);
    if (err || !x->owned) return err;
    char sql[1024];
    size_t used = (size_t)snprintf(sql, sizeof sql, "SELECT step, recorded_at");
    for (int i = 0; i < x->n_sel; i++)
        used += (size_t)snprintf(sql + used, sizeof sql - used, ", %s", metric_fields[x->sel[i]]);
    snprintf(sql + used, sizeof sql - used,
             " FROM job_metrics WHERE job_id = $1::uuid AND step > $2::bigint"
             " ORDER BY step LIMIT $3::integer");
    char since[24], limit[24];
    snprintf(since, sizeof since, "%lld", x->since);
    snprintf(limit, sizeof limit, "%lld", x->limit + 1);
    const char *v[3] = {x->id, since, limit};
    PGresult *r = fb_db_query(c, NULL, sql, 3, v, &err, msg, msg_cap);
    if (!r) return err;
    json_decref(x->items);
    x->items = json_array();
    int n = PQntuples(r);
    x->more = n > x->limit;
    x->last[0] = '\0';
    for (int i = 0; i < n && i < x->limit; i++) {
        json_t *p = json_object();
        json_object_set_new(p, "step", json_integer(strtoll(PQgetvalue(r, i, 0), NULL, 10)));
        json_t *t = json_string(PQgetvalue(r, i, 1));
        json_object_set_new(p, "time", t ? t : json_null());
        for (int k = 0; k < x->n_sel; k++) {
            json_t *val = PQgetisnull(r, i, 2 + k)
                              ? json_null()
                              : json_real(strtod(PQgetvalue(r, i, 2 + k), NULL));
            json_object_set_new(p, metric_fields[x->sel[k]], val ? val : json_null());
        }
        json_array_append_new(x->items, p);
        snprintf(x->last, sizeof x->last, "%s", PQgetvalue(r, i, 0));
    }
    PQclear(r);
    return FB_OK;
}

/* Parses ?fields=a,b into x->sel (all when absent). */
static int parse_fields(fb_req *req, job_series *x)
{
    const char *v = fb_req_query(req, "fields");
    x->n_sel = 0;
    if (!v) {
        for (int i = 0; i < N_METRIC_FIELDS; i++)
            x->sel[x->n_sel++] = i;
        return FB_OK;
    }
    if (!fb_metric_fields_parse(v, x->sel, &x->n_sel))
        return fb_req_fail(req, FB_ERR_BAD_QUERY, "fields",
                           "fields: a comma-separated list of loss, accuracy, val_loss, "
                           "val_accuracy, test_loss, test_accuracy, samples_per_s, slowdown, "
                           "compute_ms, comm_ms, io_ms, wait_ms");
    return FB_OK;
}

int fb_route_job_metrics(fb_req *req)
{
    static const char *const allowed[] = {"since_step", "fields", "limit", NULL};
    const char *id = fb_req_param(req, 0);
    job_series x = {.id = id, .tenant_id = req->key.tenant_id};
    int err;
    if ((err = fb_req_check_query(req, allowed)) ||
        (err = fb_query_int(req, "since_step", -1, -1, 1000000000000LL, &x.since)) ||
        (err = fb_query_int(req, "limit", 1000, 1, 10000, &x.limit)) ||
        (err = parse_fields(req, &x)))
        return err;
    if (!fb_is_uuid(id)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such job");
    if ((err = fb_route_txn(req, job_metrics_txn, &x))) {
        json_decref(x.items);
        return err;
    }
    if (!x.owned) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such job");
    json_t *fields = json_array();
    for (int i = 0; i < x.n_sel; i++)
        json_array_append_new(fields, json_string(metric_fields[x.sel[i]]));
    json_t *next = x.more ? json_integer(strtoll(x.last, NULL, 10)) : json_null();
    fb_req_reply_json(req, 200,
                      json_pack("{s:s, s:o, s:o, s:o}", "job_id", id, "fields", fields, "points",
                                x.items ? x.items : json_array(), "next_since_step", next));
    return FB_OK;
}

static int job_events_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    job_series *x = arg;
    int err = job_owned(c, x->id, x->tenant_id, &x->owned, msg, msg_cap);
    if (err || !x->owned) return err;
    char after[24], limit[24];
    snprintf(after, sizeof after, "%lld", x->after);
    snprintf(limit, sizeof limit, "%lld", x->limit + 1);
    const char *v[3] = {x->id, after, limit};
    PGresult *r = fb_db_query(c, "job_events",
                              "SELECT e.id, json_build_object('id', e.id, 'time', e.recorded_at,"
                              " 'kind', e.kind, 'message', e.message, 'data', e.data)"
                              " FROM job_events e WHERE e.job_id = $1::uuid AND e.id > $2::bigint"
                              " ORDER BY e.id LIMIT $3::integer",
                              3, v, &err, msg, msg_cap);
    if (!r) return err;
    json_decref(x->items);
    x->items = json_array();
    int n = PQntuples(r);
    x->more = n > x->limit;
    for (int i = 0; i < n && i < x->limit; i++) {
        json_array_append_new(x->items, fb_pg_json(r, i, 1));
        snprintf(x->last, sizeof x->last, "%s", PQgetvalue(r, i, 0));
    }
    PQclear(r);
    return FB_OK;
}

int fb_route_job_events(fb_req *req)
{
    static const char *const allowed[] = {"after", "limit", NULL};
    const char *id = fb_req_param(req, 0);
    job_series x = {.id = id, .tenant_id = req->key.tenant_id};
    int err;
    if ((err = fb_req_check_query(req, allowed)) ||
        (err = fb_query_int(req, "after", 0, 0, 999999999999999999LL, &x.after)) ||
        (err = fb_query_int(req, "limit", 100, 1, 1000, &x.limit)))
        return err;
    if (!fb_is_uuid(id)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such job");
    if ((err = fb_route_txn(req, job_events_txn, &x))) {
        json_decref(x.items);
        return err;
    }
    if (!x.owned) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such job");
    json_t *next = x.more ? json_integer(strtoll(x.last, NULL, 10)) : json_null();
    fb_req_reply_json(req, 200,
                      json_pack("{s:s, s:o, s:o}", "job_id", id, "events",
                                x.items ? x.items : json_array(), "next_after", next));
    return FB_OK;
}

static int job_checkpoints_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    job_series *x = arg;
    int err = job_owned(c, x->id, x->tenant_id, &x->owned, msg, msg_cap);
    if (err || !x->owned) return err;
    const char *v[1] = {x->id};
    PGresult *r = fb_db_query(c, "job_checkpoints",
                              "SELECT json_build_object('step', k.step, 'time', k.created_at,"
                              " 'bytes', k.bytes, 'sha256', k.sha256, 'final', k.is_final)"
                              " FROM checkpoints k WHERE k.job_id = $1::uuid"
                              " ORDER BY k.step, k.id LIMIT 1000",
                              1, v, &err, msg, msg_cap);
    if (!r) return err;
    json_decref(x->items);
    x->items = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(x->items, fb_pg_json(r, i, 0));
    PQclear(r);
    return FB_OK;
}

int fb_route_job_checkpoints(fb_req *req)
{
    static const char *const none[] = {NULL};
    const char *id = fb_req_param(req, 0);
    job_series x = {.id = id, .tenant_id = req->key.tenant_id};
    int err;
    if ((err = fb_req_check_query(req, none))) return err;
    if (!fb_is_uuid(id)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such job");
    if ((err = fb_route_txn(req, job_checkpoints_txn, &x))) {
        json_decref(x.items);
        return err;
    }
    if (!x.owned) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such job");
    fb_req_reply_json(
        req, 200,
        json_pack("{s:s, s:o}", "job_id", id, "checkpoints", x.items ? x.items : json_array()));
    return FB_OK;
}

/* ---- model download ---- */

static int job_model_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    job_series *x = arg;
    int err;
    const char *v[2] = {x->id, x->tenant_id};
    PGresult *r = fb_db_query(c, "job_model",
                              "SELECT j.name, (SELECT k.path FROM checkpoints k"
                              " WHERE k.job_id = j.id ORDER BY k.is_final DESC, k.step DESC,"
                              " k.id DESC LIMIT 1) FROM jobs j"
                              " WHERE j.id = $1::uuid AND j.tenant_id = $2::uuid",
                              2, v, &err, msg, msg_cap);
    if (!r) return err;
    x->owned = PQntuples(r) == 1;
    x->have_model = x->owned && !PQgetisnull(r, 0, 1);
    if (x->owned) snprintf(x->model_name, sizeof x->model_name, "%s", PQgetvalue(r, 0, 0));
    if (x->have_model) snprintf(x->model_path, sizeof x->model_path, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    return FB_OK;
}

int fb_route_job_model(fb_req *req)
{
    static const char *const none[] = {NULL};
    const char *id = fb_req_param(req, 0);
    job_series x = {.id = id, .tenant_id = req->key.tenant_id};
    int err;
    if ((err = fb_req_check_query(req, none))) return err;
    if (!fb_is_uuid(id)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such job");
    if ((err = fb_route_txn(req, job_model_txn, &x))) return err;
    if (!x.owned) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such job");
    if (!x.have_model)
        return fb_req_fail(req, FB_ERR_NO_MODEL, NULL,
                           "the job has no checkpoint yet; a model exists once it has trained");
    /* every link resolved and the result checked to be a regular file inside
     * the artifacts directory: a tampered row or a planted link or FIFO
     * never reaches another file or blocks this thread */
    int fd = req->srv->artifacts_real[0]
                 ? fb_path_open_under(req->srv->artifacts_real, x.model_path)
                 : -1;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        return fb_req_fail(req, FB_ERR_NO_MODEL, NULL,
                           "the job's model file is missing from the artifacts directory");
    }
    char filename[FB_SPEC_NAME_MAX + 32];
    snprintf(filename, sizeof filename, "%s.safetensors", x.model_name);
    fb_req_reply_file(req, fd, (uint64_t)st.st_size, "application/octet-stream", filename);
    return FB_OK;
}
