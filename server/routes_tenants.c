/*
 * Tenants and their API keys.
 *
 * POST/GET /v1/tenants and PATCH /v1/tenants/{id} are admin routes.  A
 * tenant may read itself (GET /v1/tenant, GET /v1/tenants/{its id}) and
 * create, list and revoke its own keys; the admin may do so for any tenant.
 * Another tenant's id answers 404, exactly like an id that does not exist.
 */
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "routes.h"
#include "server_impl.h"

#define MAX_ACTIVE_KEYS 100
#define KEY_NAME_MAX 64

#define SQL_TENANT_JSON                                                                            \
    "json_build_object('id', t.id, 'name', t.name, 'admin', t.is_admin, 'weight', t.weight,"       \
    " 'share_arrays', t.share_arrays,"                                                             \
    " 'quotas', json_build_object('max_queued_jobs', t.max_queued_jobs,"                           \
    " 'max_devices', t.max_devices, 'max_dataset_bytes', t.max_dataset_bytes),"                    \
    " 'rate_limit', json_build_object('requests_per_second', t.rate_limit_rps,"                    \
    " 'burst', t.rate_limit_burst),"                                                               \
    " 'usage', json_build_object("                                                                 \
    " 'queued_jobs', (SELECT coalesce(sum(c.n), 0) FROM tenant_queued_counts c"                    \
    " WHERE c.tenant_id = t.id),"                                                                  \
    " 'active_jobs', (SELECT count(*) FROM jobs a WHERE a.tenant_id = t.id"                        \
    " AND a.state IN ('scheduled', 'running')),"                                                   \
    " 'devices_in_use', (SELECT count(*) FROM devices d WHERE d.tenant_id = t.id)),"               \
    " 'created_at', t.created_at, 'updated_at', t.updated_at)"

#define SQL_KEY_JSON                                                                               \
    "json_build_object('id', k.key_id, 'tenant_id', k.tenant_id, 'name', k.name,"                  \
    " 'created_at', k.created_at, 'revoked_at', k.revoked_at)"

/* Settings a tenant body may carry; text form for SQL parameters, NULL = keep. */
typedef struct tenant_settings {
    char weight[32], max_queued[32], max_devices[32], max_dataset[32], rps[32], burst[32];
    const char *vals[7]; /* ... and share_arrays ("true"/"false") */
} tenant_settings;

static int num_field(fb_req *req, json_t *obj, const char *key, const char *path, double lo,
                     bool lo_open, double hi, bool integer, char *out, size_t cap,
                     const char **slot)
{
    json_t *v = json_object_get(obj, key);
    *slot = NULL;
    if (!v) return FB_OK;
    if (integer ? !json_is_integer(v) : !json_is_number(v))
        return fb_req_fail(req, FB_ERR_WRONG_TYPE, path, "%s: expected %s", path,
                           integer ? "an integer" : "a number");
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
        return fb_req_fail(req, FB_ERR_OUT_OF_RANGE, path, "%s: %g is out of range %c%g, %g]", path,
                           x, lo_open ? '(' : '[', lo, hi);
    if (integer)
        snprintf(out, cap, "%lld", (long long)json_integer_value(v));
    else
        snprintf(out, cap, "%.17g", x);
    *slot = out;
    return FB_OK;
}

/* Rejects members of obj not in allowed (NULL-terminated). */
static int only_fields(fb_req *req, json_t *obj, const char *path, const char *const *allowed)
{
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val)
    {
        bool ok = false;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, key) == 0) ok = true;
        if (!ok) {
            char field[160];
            snprintf(field, sizeof field, "%s%s%.64s", path, path[0] ? "." : "", key);
            for (char *p = field; *p; p++)
                if ((unsigned char)*p < 0x20) *p = '?';
            return fb_req_fail(req, FB_ERR_UNKNOWN_FIELD, field, "%s: unknown field", field);
        }
    }
    return FB_OK;
}

static int parse_settings(fb_req *req, json_t *body, tenant_settings *s)
{
    int err;
    memset(s, 0, sizeof *s);
    json_t *share = json_object_get(body, "share_arrays");
    if (share) {
        if (!json_is_boolean(share))
            return fb_req_fail(req, FB_ERR_WRONG_TYPE, "share_arrays",
                               "share_arrays: expected true or false");
        s->vals[6] = json_is_true(share) ? "true" : "false";
    }
    if ((err = num_field(req, body, "weight", "weight", 0, true, 1000, false, s->weight,
                         sizeof s->weight, &s->vals[0])))
        return err;
    json_t *q = json_object_get(body, "quotas");
    if (q) {
        if (!json_is_object(q))
            return fb_req_fail(req, FB_ERR_WRONG_TYPE, "quotas", "quotas: expected an object");
        static const char *const allowed[] = {"max_queued_jobs", "max_devices", "max_dataset_bytes",
                                              NULL};
        if ((err = only_fields(req, q, "quotas", allowed))) return err;
        if ((err = num_field(req, q, "max_queued_jobs", "quotas.max_queued_jobs", 0, false, 1e7,
                             true, s->max_queued, sizeof s->max_queued, &s->vals[1])) ||
            (err = num_field(req, q, "max_devices", "quotas.max_devices", 0, false, 1e5, true,
                             s->max_devices, sizeof s->max_devices, &s->vals[2])) ||
            (err = num_field(req, q, "max_dataset_bytes", "quotas.max_dataset_bytes", 0, false,
                             9007199254740992.0, true, s->max_dataset, sizeof s->max_dataset,
                             &s->vals[3])))
            return err;
    }
    json_t *r = json_object_get(body, "rate_limit");
    if (r) {
        if (!json_is_object(r))
            return fb_req_fail(req, FB_ERR_WRONG_TYPE, "rate_limit",
                               "rate_limit: expected an object");
        static const char *const allowed[] = {"requests_per_second", "burst", NULL};
        if ((err = only_fields(req, r, "rate_limit", allowed))) return err;
        if ((err = num_field(req, r, "requests_per_second", "rate_limit.requests_per_second", 0,
                             true, 1e6, false, s->rps, sizeof s->rps, &s->vals[4])) ||
            (err = num_field(req, r, "burst", "rate_limit.burst", 1, false, 1e6, true, s->burst,
                             sizeof s->burst, &s->vals[5])))
            return err;
    }
    return FB_OK;
}

static bool valid_tenant_name(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 63) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok =
            (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (i > 0 && (c == '_' || c == '-'));
        if (!ok) return false;
    }
    return true;
}

/* ---- create / update ---- */

typedef struct tenant_write {
    const char *id;   /* update: the tenant; create: NULL */
    const char *name; /* create */
    tenant_settings s;
    json_t *out;
    bool found;
} tenant_write;

static const char sql_tenant_update[] =
    "UPDATE tenants t SET weight = coalesce($2::float8, weight),"
    " max_queued_jobs = coalesce($3::integer, max_queued_jobs),"
    " max_devices = coalesce($4::integer, max_devices),"
    " max_dataset_bytes = coalesce($5::bigint, max_dataset_bytes),"
    " rate_limit_rps = coalesce($6::float8, rate_limit_rps),"
    " rate_limit_burst = coalesce($7::integer, rate_limit_burst),"
    " share_arrays = coalesce($8::boolean, share_arrays), updated_at = now()"
    " WHERE t.id = $1::uuid RETURNING " SQL_TENANT_JSON;

static int tenant_write_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    tenant_write *w = arg;
    int err;
    if ((err = fb_db_begin(c, msg, msg_cap))) return err;
    char id[FB_UUID_LEN + 1];
    if (w->name) {
        const char *vals[1] = {w->name};
        PGresult *r = fb_db_query(c, NULL, "INSERT INTO tenants (name) VALUES ($1) RETURNING id", 1,
                                  vals, &err, msg, msg_cap);
        if (!r) {
            if (err == FB_ERR_ALREADY_EXISTS)
                fb_errf(msg, msg_cap, err, "name: a tenant named \"%s\" exists", w->name);
            return err;
        }
        snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
    } else {
        snprintf(id, sizeof id, "%s", w->id);
    }
    const char *vals[8] = {id,           w->s.vals[0], w->s.vals[1], w->s.vals[2],
                           w->s.vals[3], w->s.vals[4], w->s.vals[5], w->s.vals[6]};
    PGresult *r = fb_db_query(c, NULL, sql_tenant_update, 8, vals, &err, msg, msg_cap);
    if (!r) return err;
    w->found = PQntuples(r) == 1;
    if (w->found) {
        json_decref(w->out);
        w->out = fb_pg_json(r, 0, 0);
    }
    PQclear(r);
    if (!w->found) return FB_OK;
    return fb_db_commit(c, msg, msg_cap);
}

int fb_route_tenant_create(fb_req *req)
{
    static const char *const allowed[] = {"name", "weight", "quotas", "rate_limit", "share_arrays",
                                          NULL};
    int err;
    if ((err = only_fields(req, req->json, "", allowed))) return err;
    json_t *name = json_object_get(req->json, "name");
    if (!name)
        return fb_req_fail(req, FB_ERR_MISSING_FIELD, "name", "name: required field missing");
    if (!json_is_string(name))
        return fb_req_fail(req, FB_ERR_WRONG_TYPE, "name", "name: expected a string");
    if (!valid_tenant_name(json_string_value(name)) ||
        strlen(json_string_value(name)) != json_string_length(name))
        return fb_req_fail(req, FB_ERR_BAD_NAME, "name",
                           "name: 1-63 bytes of a-z, 0-9, '_' and '-', starting with a letter "
                           "or digit");
    tenant_write w = {.name = json_string_value(name)};
    if ((err = parse_settings(req, req->json, &w.s))) return err;
    if ((err = fb_route_txn(req, tenant_write_txn, &w))) {
        json_decref(w.out);
        return err;
    }
    if (!w.out) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    char loc[96];
    snprintf(loc, sizeof loc, "/v1/tenants/%s", json_string_value(json_object_get(w.out, "id")));
    fb_req_add_header(req, "Location", loc);
    fb_req_reply_json(req, 201, w.out);
    return FB_OK;
}

int fb_route_tenant_update(fb_req *req)
{
    static const char *const allowed[] = {"weight", "quotas", "rate_limit", "share_arrays", NULL};
    int err;
    const char *id = fb_req_param(req, 0);
    if (!fb_is_uuid(id)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such tenant");
    if ((err = only_fields(req, req->json, "", allowed))) return err;
    tenant_write w = {.id = id};
    if ((err = parse_settings(req, req->json, &w.s))) return err;
    if ((err = fb_route_txn(req, tenant_write_txn, &w))) {
        json_decref(w.out);
        return err;
    }
    if (!w.found) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such tenant");
    if (!w.out) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    fb_auth_forget_tenant(req->srv->auth, id);
    fb_req_reply_json(req, 200, w.out);
    return FB_OK;
}

/* ---- reads ---- */

typedef struct tenant_read {
    const char *id;
    const char *after; /* list cursor (a name) */
    long long limit;
    json_t *out;
    bool more;
} tenant_read;

static int tenant_get_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    tenant_read *t = arg;
    int err;
    const char *vals[1] = {t->id};
    PGresult *r = fb_db_query(c, "tenant_get",
                              "SELECT " SQL_TENANT_JSON " FROM tenants t WHERE t.id = $1::uuid", 1,
                              vals, &err, msg, msg_cap);
    if (!r) return err;
    json_decref(t->out);
    t->out = PQntuples(r) == 1 ? fb_pg_json(r, 0, 0) : NULL;
    PQclear(r);
    return FB_OK;
}

static int reply_tenant(fb_req *req, const char *id)
{
    tenant_read t = {.id = id};
    int err;
    if ((err = fb_route_txn(req, tenant_get_txn, &t))) return err;
    if (!t.out) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such tenant");
    fb_req_reply_json(req, 200, t.out);
    return FB_OK;
}

int fb_route_tenant_self(fb_req *req)
{
    int err;
    static const char *const none[] = {NULL};
    if ((err = fb_req_check_query(req, none))) return err;
    return reply_tenant(req, req->key.tenant_id);
}

/* The admin may address any tenant; anyone else only their own. */
static bool may_address(const fb_req *req, const char *id)
{
    return fb_is_uuid(id) && (req->key.is_admin || strcasecmp(id, req->key.tenant_id) == 0);
}

int fb_route_tenant_get(fb_req *req)
{
    const char *id = fb_req_param(req, 0);
    if (!may_address(req, id)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such tenant");
    return reply_tenant(req, id);
}

static int tenant_list_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    tenant_read *t = arg;
    int err;
    char limit[24];
    snprintf(limit, sizeof limit, "%lld", t->limit + 1);
    const char *vals[2] = {t->after, limit};
    PGresult *r = fb_db_query(c, NULL,
                              "SELECT " SQL_TENANT_JSON " FROM tenants t"
                              " WHERE ($1::text IS NULL OR t.name > $1) ORDER BY t.name LIMIT $2",
                              2, vals, &err, msg, msg_cap);
    if (!r) return err;
    json_decref(t->out);
    t->out = json_array();
    int n = PQntuples(r);
    t->more = n > t->limit;
    for (int i = 0; i < n && i < t->limit; i++)
        json_array_append_new(t->out, fb_pg_json(r, i, 0));
    PQclear(r);
    return FB_OK;
}

int fb_route_tenant_list(fb_req *req)
{
    static const char *const allowed[] = {"limit", "cursor", NULL};
    int err;
    char cursor[80];
    tenant_read t = {0};
    if ((err = fb_req_check_query(req, allowed)) ||
        (err = fb_query_int(req, "limit", 50, 1, 200, &t.limit)) ||
        (err = fb_query_str(req, "cursor", cursor, sizeof cursor)))
        return err;
    if (cursor[0] && !valid_tenant_name(cursor))
        return fb_req_fail(req, FB_ERR_BAD_QUERY, "cursor", "cursor: not a cursor of this list");
    t.after = cursor[0] ? cursor : NULL;
    if ((err = fb_route_txn(req, tenant_list_txn, &t))) {
        json_decref(t.out);
        return err;
    }
    json_t *items = t.out;
    json_t *next = json_null();
    size_t n = json_array_size(items);
    if (t.more && n > 0) next = json_incref(json_object_get(json_array_get(items, n - 1), "name"));
    fb_req_reply_json(req, 200, json_pack("{s:o, s:o}", "tenants", items, "next_cursor", next));
    return FB_OK;
}

/* ---- keys ---- */

typedef struct key_write {
    const char *tenant_id;
    const char *name;
    const char *key_id; /* revoke */
    char key[FB_KEY_LEN + 1];
    json_t *out;
    int status; /* 0 ok, 1 no tenant/key, 2 too many keys */
} key_write;

static int key_create_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    key_write *k = arg;
    int err;
    if ((err = fb_db_begin(c, msg, msg_cap))) return err;
    const char *v1[1] = {k->tenant_id};
    /* The lock and the count are two statements: a count in the locking
     * statement reads the snapshot taken before the lock was granted, which
     * misses the keys the previous holder just committed, and 40 concurrent
     * requests then passed a limit of 100. */
    PGresult *r =
        fb_db_query(c, NULL, "SELECT 1 FROM tenants WHERE id = $1::uuid FOR NO KEY UPDATE", 1, v1,
                    &err, msg, msg_cap);
    if (!r) return err;
    bool exists = PQntuples(r) == 1;
    PQclear(r);
    if (!exists) {
        k->status = 1;
        return FB_OK;
    }
    r = fb_db_query(c, NULL,
                    "SELECT count(*) FROM api_keys WHERE tenant_id = $1::uuid"
                    " AND revoked_at IS NULL",
                    1, v1, &err, msg, msg_cap);
    if (!r) return err;
    k->status = atoi(PQgetvalue(r, 0, 0)) >= MAX_ACTIVE_KEYS ? 2 : 0;
    PQclear(r);
    if (k->status) return FB_OK;
    char key_id[FB_KEY_ID_LEN + 1], hash_hex[2 * FB_KEY_HASH_BYTES + 3];
    uint8_t hash[FB_KEY_HASH_BYTES];
    fb_auth_key_new(k->key, key_id, hash);
    hash_hex[0] = '\\';
    hash_hex[1] = 'x';
    sodium_bin2hex(hash_hex + 2, sizeof hash_hex - 2, hash, sizeof hash);
    const char *v2[4] = {key_id, k->tenant_id, k->name ? k->name : "", hash_hex};
    r = fb_db_query(c, NULL,
                    "INSERT INTO api_keys AS k (key_id, tenant_id, name, secret_hash)"
                    " VALUES ($1, $2::uuid, $3, $4::bytea) RETURNING " SQL_KEY_JSON,
                    4, v2, &err, msg, msg_cap);
    if (!r) return err;
    json_decref(k->out);
    k->out = fb_pg_json(r, 0, 0);
    PQclear(r);
    return fb_db_commit(c, msg, msg_cap);
}

int fb_route_key_create(fb_req *req)
{
    const char *tid = fb_req_param(req, 0);
    if (!may_address(req, tid)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such tenant");
    key_write k = {.tenant_id = tid};
    if (req->json) {
        static const char *const allowed[] = {"name", NULL};
        int err = only_fields(req, req->json, "", allowed);
        if (err) return err;
        json_t *name = json_object_get(req->json, "name");
        if (name) {
            if (!json_is_string(name))
                return fb_req_fail(req, FB_ERR_WRONG_TYPE, "name", "name: expected a string");
            const char *s = json_string_value(name);
            size_t n = json_string_length(name);
            bool ok = n <= KEY_NAME_MAX && strlen(s) == n;
            for (size_t i = 0; ok && i < n; i++)
                if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ok = false;
            if (!ok)
                return fb_req_fail(req, FB_ERR_BAD_NAME, "name",
                                   "name: at most %d bytes, no control characters", KEY_NAME_MAX);
            k.name = s;
        }
    }
    int err = fb_route_txn(req, key_create_txn, &k);
    if (!err && k.status == 1) err = fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such tenant");
    if (!err && k.status == 2)
        err = fb_req_fail(req, FB_ERR_QUOTA_EXCEEDED, NULL,
                          "a tenant may hold at most %d active keys; revoke one first",
                          MAX_ACTIVE_KEYS);
    if (!err && !k.out) err = fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    if (err) {
        json_decref(k.out);
        sodium_memzero(k.key, sizeof k.key);
        return err;
    }
    json_object_set_new(k.out, "key", json_string(k.key));
    sodium_memzero(k.key, sizeof k.key);
    fb_req_reply_json(req, 201, k.out);
    return FB_OK;
}

static int key_list_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    key_write *k = arg;
    int err;
    const char *vals[1] = {k->tenant_id};
    PGresult *r = fb_db_query(c, NULL,
                              "SELECT t.id IS NOT NULL, (SELECT json_agg(" SQL_KEY_JSON
                              " ORDER BY k.created_at, k.key_id) FROM api_keys k"
                              " WHERE k.tenant_id = t.id) FROM tenants t WHERE t.id = $1::uuid",
                              1, vals, &err, msg, msg_cap);
    if (!r) return err;
    k->status = PQntuples(r) == 1 ? 0 : 1;
    json_decref(k->out);
    k->out = NULL;
    if (!k->status) {
        k->out = PQgetisnull(r, 0, 1) ? json_array() : fb_pg_json(r, 0, 1);
    }
    PQclear(r);
    return FB_OK;
}

int fb_route_key_list(fb_req *req)
{
    const char *tid = fb_req_param(req, 0);
    static const char *const none[] = {NULL};
    int err;
    if (!may_address(req, tid)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such tenant");
    if ((err = fb_req_check_query(req, none))) return err;
    key_write k = {.tenant_id = tid};
    if ((err = fb_route_txn(req, key_list_txn, &k))) {
        json_decref(k.out);
        return err;
    }
    if (k.status) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such tenant");
    if (!k.out) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    fb_req_reply_json(req, 200, json_pack("{s:o}", "keys", k.out));
    return FB_OK;
}

static int key_revoke_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    key_write *k = arg;
    int err;
    const char *vals[2] = {k->key_id, k->tenant_id};
    PGresult *r =
        fb_db_query(c, NULL,
                    "UPDATE api_keys k SET revoked_at = coalesce(revoked_at, now())"
                    " WHERE k.key_id = $1 AND k.tenant_id = $2::uuid RETURNING " SQL_KEY_JSON,
                    2, vals, &err, msg, msg_cap);
    if (!r) return err;
    k->status = PQntuples(r) == 1 ? 0 : 1;
    json_decref(k->out);
    k->out = k->status ? NULL : fb_pg_json(r, 0, 0);
    PQclear(r);
    return FB_OK;
}

int fb_route_key_revoke(fb_req *req)
{
    const char *tid = fb_req_param(req, 0), *kid = fb_req_param(req, 1);
    if (!may_address(req, tid)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such tenant");
    bool hex = strlen(kid) == FB_KEY_ID_LEN;
    for (size_t i = 0; hex && i < FB_KEY_ID_LEN; i++)
        hex = (kid[i] >= '0' && kid[i] <= '9') || (kid[i] >= 'a' && kid[i] <= 'f');
    if (!hex) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such key");
    key_write k = {.tenant_id = tid, .key_id = kid};
    int err;
    if ((err = fb_route_txn(req, key_revoke_txn, &k))) {
        json_decref(k.out);
        return err;
    }
    /* forget it even when absent: a stale cache entry must never outlive a revoke */
    fb_auth_forget_key(req->srv->auth, kid);
    if (k.status) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such key");
    if (!k.out) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    fb_req_reply_json(req, 200, k.out);
    return FB_OK;
}
