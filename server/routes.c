/*
 * The route table, and helpers every handler uses.
 */
#include "routes.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "paths.h"
#include "server_impl.h"

const fb_route fb_routes[] = {
    {"GET", "/healthz", FB_AUTH_NONE, FB_BODY_NONE, fb_route_healthz},
    {"GET", "/readyz", FB_AUTH_NONE, FB_BODY_NONE, fb_route_readyz},
    {"GET", "/metrics", FB_AUTH_NONE, FB_BODY_NONE, fb_route_metrics},
    {"GET", "/", FB_AUTH_NONE, FB_BODY_NONE, fb_route_static_index},
    {"GET", "/static/{file}", FB_AUTH_NONE, FB_BODY_NONE, fb_route_static_file},

    {"POST", "/v1/tenants", FB_AUTH_ADMIN, FB_BODY_JSON, fb_route_tenant_create},
    {"GET", "/v1/tenants", FB_AUTH_ADMIN, FB_BODY_NONE, fb_route_tenant_list},
    {"GET", "/v1/tenant", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_tenant_self},
    {"GET", "/v1/tenants/{id}", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_tenant_get},
    {"PATCH", "/v1/tenants/{id}", FB_AUTH_ADMIN, FB_BODY_JSON, fb_route_tenant_update},
    {"POST", "/v1/tenants/{id}/keys", FB_AUTH_TENANT, FB_BODY_JSON_OPTIONAL, fb_route_key_create},
    {"GET", "/v1/tenants/{id}/keys", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_key_list},
    {"DELETE", "/v1/tenants/{id}/keys/{key_id}", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_key_revoke},

    {"POST", "/v1/jobs", FB_AUTH_TENANT, FB_BODY_JSON, fb_route_job_create},
    {"GET", "/v1/jobs", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_job_list},
    {"GET", "/v1/jobs/{id}", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_job_get},
    {"POST", "/v1/jobs/{id}/cancel", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_job_cancel},
    {"GET", "/v1/jobs/{id}/metrics", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_job_metrics},
    {"GET", "/v1/jobs/{id}/events", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_job_events},
    {"GET", "/v1/jobs/{id}/checkpoints", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_job_checkpoints},
    {"GET", "/v1/jobs/{id}/model", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_job_model},

    {"POST", "/v1/sweeps", FB_AUTH_TENANT, FB_BODY_JSON, fb_route_sweep_create},
    {"GET", "/v1/sweeps", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_sweep_list},
    {"GET", "/v1/sweeps/{id}", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_sweep_get},
    {"POST", "/v1/sweeps/{id}/cancel", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_sweep_cancel},

    {"POST", "/v1/datasets", FB_AUTH_TENANT, FB_BODY_JSON, fb_route_dataset_create},
    {"GET", "/v1/datasets", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_dataset_list},
    {"GET", "/v1/datasets/{name}", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_dataset_get},
    {"DELETE", "/v1/datasets/{name}", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_dataset_delete},
    {"PUT", "/v1/datasets/{name}/splits/{split}", FB_AUTH_TENANT, FB_BODY_STREAM,
     fb_route_dataset_upload},

    {"GET", "/v1/workers", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_workers},
    {"GET", "/v1/cluster", FB_AUTH_TENANT, FB_BODY_NONE, fb_route_cluster},
    {"POST", "/v1/workers/keys", FB_AUTH_ADMIN, FB_BODY_JSON, fb_route_worker_key_create},
    {"GET", "/v1/workers/keys", FB_AUTH_ADMIN, FB_BODY_NONE, fb_route_worker_key_list},
    {"DELETE", "/v1/workers/keys/{id}", FB_AUTH_ADMIN, FB_BODY_NONE, fb_route_worker_key_revoke},
};
const int fb_n_routes = (int)(sizeof fb_routes / sizeof fb_routes[0]);

bool fb_is_uuid(const char *s)
{
    if (strlen(s) != 36) return false;
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-') return false;
        } else if (!isxdigit((unsigned char)s[i])) {
            return false;
        }
    }
    return true;
}

int fb_route_txn(fb_req *req, fb_db_fn fn, void *arg)
{
    char msg[FB_MSG_MAX] = "";
    int err = fb_db_run(req->srv->db, fn, arg, msg, sizeof msg);
    if (err) fb_req_fail_msg(req, err, msg, NULL);
    return err;
}

int fb_route_reply_page(fb_req *req, fb_db_fn fn, void *arg, json_t **items, const char *next,
                        const char *key)
{
    int err = fb_route_txn(req, fn, arg);
    if (err) {
        json_decref(*items);
        return err;
    }
    if (!*items) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    fb_req_reply_json(req, 200, json_pack("{s:o, s:o}", key, *items, "next_cursor",
                                          next[0] ? json_string(next) : json_null()));
    return FB_OK;
}

void fb_pg_page(PGresult *r, long long limit, json_t **items, char *next, size_t next_cap)
{
    json_decref(*items);
    *items = json_array();
    int n = PQntuples(r);
    next[0] = '\0';
    for (int i = 0; i < n && i < limit; i++) {
        json_array_append_new(*items, fb_pg_json(r, i, 1));
        if (n > limit && i == limit - 1) snprintf(next, next_cap, "%s", PQgetvalue(r, i, 0));
    }
    PQclear(r);
}

json_t *fb_pg_json(const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col)) return json_null();
    const char *v = PQgetvalue(r, row, col);
    return json_loadb(v, (size_t)PQgetlength(r, row, col), JSON_DECODE_ANY, NULL);
}

int fb_query_parse_int(const char *v, long long lo, long long hi, long long *out)
{
    errno = 0;
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    bool digits =
        v[0] && (isdigit((unsigned char)v[0]) || (v[0] == '-' && isdigit((unsigned char)v[1])));
    if (!digits || errno || !end || *end) return FB_ERR_BAD_QUERY;
    if (x < lo || x > hi) return FB_ERR_OUT_OF_RANGE;
    *out = x;
    return FB_OK;
}

int fb_query_int(fb_req *req, const char *name, long long def, long long lo, long long hi,
                 long long *out)
{
    const char *v = fb_req_query(req, name);
    if (!v) {
        *out = def;
        return FB_OK;
    }
    int err = fb_query_parse_int(v, lo, hi, out);
    if (err == FB_ERR_OUT_OF_RANGE)
        return fb_req_fail(req, FB_ERR_BAD_QUERY, name, "%s: %lld is out of range [%lld, %lld]",
                           name, strtoll(v, NULL, 10), lo, hi);
    if (err) return fb_req_fail(req, FB_ERR_BAD_QUERY, name, "%s: expected an integer", name);
    return FB_OK;
}

int fb_query_str(fb_req *req, const char *name, char *out, size_t cap)
{
    const char *v = fb_req_query(req, name);
    out[0] = '\0';
    if (!v) return FB_OK;
    size_t n = strlen(v);
    if (n == 0 || n >= cap)
        return fb_req_fail(req, FB_ERR_BAD_QUERY, name, "%s: must be 1..%zu bytes", name, cap - 1);
    memcpy(out, v, n + 1);
    return FB_OK;
}

int fb_idempotency_key(fb_req *req, char *buf, size_t cap, const char **out)
{
    const char *v = fb_req_header(req, "Idempotency-Key");
    *out = NULL;
    if (!v) return FB_OK;
    size_t n = strlen(v);
    if (n == 0 || n > 128 || n >= cap)
        return fb_req_fail(req, FB_ERR_BAD_HEADER, "Idempotency-Key",
                           "Idempotency-Key must be 1..128 bytes");
    for (size_t i = 0; i < n; i++) {
        char c = v[i];
        if (!(isalnum((unsigned char)c) || c == '.' || c == '_' || c == ':' || c == '-'))
            return fb_req_fail(req, FB_ERR_BAD_HEADER, "Idempotency-Key",
                               "Idempotency-Key may hold only letters, digits, '.', '_', ':', '-'");
    }
    memcpy(buf, v, n + 1);
    *out = buf;
    return FB_OK;
}

bool fb_cursor_seq_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 18) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

/* ---- what a spec names beyond itself ---- */

/* Whether the tenant has a dataset of this name (in any state). */
static const char sql_ref_dataset[] =
    "SELECT EXISTS (SELECT 1 FROM datasets d WHERE d.tenant_id = $1::uuid AND d.name = $2)";
/* The tenant's job and the artifact its init asks for ($3: -1 the final model, -2 the newest
 * weights, else the checkpoint at that step; a full state before a model at one step, since it
 * holds the same parameters).  No row: the job is not the tenant's. */
static const char sql_ref_init[] =
    "SELECT j.state, k.path FROM jobs j LEFT JOIN LATERAL (SELECT c.path FROM checkpoints c"
    " WHERE c.job_id = j.id AND CASE $3::bigint WHEN -1 THEN c.is_final WHEN -2 THEN true"
    " ELSE c.step = $3::bigint AND NOT c.is_final END"
    " ORDER BY c.is_final DESC, c.step DESC, (c.kind = 'state') DESC, c.id DESC LIMIT 1) k ON true"
    " WHERE j.id = $2::uuid AND j.tenant_id = $1::uuid";

typedef struct spec_refs {
    const char *tenant_id;
    const fb_job_spec *spec;
    const char *public_datasets; /* --public-datasets */
    bool dataset_known;
    bool init_owned;
    char init_state[16];
    char *init_path;
    size_t init_cap;
} spec_refs;

static int spec_refs_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    spec_refs *x = arg;
    int err;
    x->init_path[0] = '\0';
    if (!fb_config_dataset_public(x->public_datasets, x->spec->dataset)) {
        const char *v[2] = {x->tenant_id, x->spec->dataset};
        PGresult *r = fb_db_query(c, "ref_dataset", sql_ref_dataset, 2, v, &err, msg, msg_cap);
        if (!r) return err;
        x->dataset_known = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
        PQclear(r);
    } else {
        x->dataset_known = true;
    }
    if (x->spec->init_job[0]) {
        char step[24];
        snprintf(step, sizeof step, "%lld", (long long)x->spec->init_checkpoint);
        const char *v[3] = {x->tenant_id, x->spec->init_job, step};
        PGresult *r = fb_db_query(c, "ref_init", sql_ref_init, 3, v, &err, msg, msg_cap);
        if (!r) return err;
        x->init_owned = PQntuples(r) == 1;
        if (x->init_owned) {
            snprintf(x->init_state, sizeof x->init_state, "%s", PQgetvalue(r, 0, 0));
            if (!PQgetisnull(r, 0, 1))
                snprintf(x->init_path, x->init_cap, "%s", PQgetvalue(r, 0, 1));
        }
        PQclear(r);
    }
    return FB_OK;
}

int fb_route_spec_refs(fb_req *req, const fb_job_spec *spec, const char *prefix, char *init_path,
                       size_t cap)
{
    char field[64];
    const char *dot = *prefix ? "." : "";
    init_path[0] = '\0';
    if (spec->init[0]) {
        snprintf(field, sizeof field, "%s%sinit", prefix, dot);
        return fb_req_fail(req, FB_ERR_WRONG_TYPE, field,
                           "%s: a file path is fusebox-train's local form; the service starts a "
                           "job only from the tenant's own artifacts: {\"job\": id, "
                           "\"checkpoint\": \"final\" | \"latest\" | step}",
                           field);
    }
    /* a public dataset and no init: nothing to look up, no transaction */
    if (!spec->init_job[0] &&
        fb_config_dataset_public(req->srv->cfg.public_datasets, spec->dataset))
        return FB_OK;
    spec_refs x = {.tenant_id = req->key.tenant_id,
                   .spec = spec,
                   .public_datasets = req->srv->cfg.public_datasets,
                   .init_path = init_path,
                   .init_cap = cap};
    int err = fb_route_txn(req, spec_refs_txn, &x);
    if (err) return err;
    if (!x.dataset_known) {
        snprintf(field, sizeof field, "%s%sdataset", prefix, dot);
        return fb_req_fail(req, FB_ERR_UNKNOWN_REFERENCE, field,
                           "%s: the tenant has no dataset \"%s\" and it is not a public one "
                           "(fashion-mnist, mnist, or one the server lists); register it with "
                           "POST /v1/datasets",
                           field, spec->dataset);
    }
    if (!spec->init_job[0]) return FB_OK;
    if (!x.init_owned) {
        snprintf(field, sizeof field, "%s%sinit.job", prefix, dot);
        return fb_req_fail(req, FB_ERR_UNKNOWN_REFERENCE, field, "%s: no such job", field);
    }
    /* artifacts are written under <tenant id>/<job id>/: a path elsewhere is not the
     * tenant's, whatever its row says */
    size_t tl = strlen(req->key.tenant_id);
    bool own = init_path[0] && strncmp(init_path, req->key.tenant_id, tl) == 0 &&
               init_path[tl] == '/' && fb_path_safe_relative(init_path);
    if (!own) {
        init_path[0] = '\0';
        snprintf(field, sizeof field, "%s%sinit.checkpoint", prefix, dot);
        if (spec->init_checkpoint == FB_INIT_FINAL)
            return fb_req_fail(req, FB_ERR_UNKNOWN_REFERENCE, field,
                               "%s: job %s has no final model (it is %s); name a checkpoint "
                               "step or \"latest\"",
                               field, spec->init_job, x.init_state);
        if (spec->init_checkpoint == FB_INIT_LATEST)
            return fb_req_fail(req, FB_ERR_UNKNOWN_REFERENCE, field,
                               "%s: job %s has no weights yet (it is %s)", field, spec->init_job,
                               x.init_state);
        return fb_req_fail(req, FB_ERR_UNKNOWN_REFERENCE, field,
                           "%s: job %s has no checkpoint at step %lld (GET "
                           "/v1/jobs/%s/checkpoints lists them)",
                           field, spec->init_job, (long long)spec->init_checkpoint, spec->init_job);
    }
    return FB_OK;
}
