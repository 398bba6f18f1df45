/*
 * The workers' allow-list, kept in the database (schema 012): an
 * administrator registers a worker's public CURVE key, lists the keys and
 * revokes one.  The control loop (dispatch_keys.c) lets in the keys of the
 * worker-keys file and every registered key that is not revoked; a revoked
 * key's worker is dropped at the loop's next tick and cannot register again.
 *
 *   POST   /v1/workers/keys       {"public_key": Z85 (40), "name": "node-01"}
 *                                 201 with the new row; 200 with the live row
 *                                 when the key is registered already
 *   GET    /v1/workers/keys       {"keys": [...]}, live and revoked, oldest first
 *   DELETE /v1/workers/keys/{id}  200 with the row, revoked_at set (at once or
 *                                 earlier: revoking twice changes nothing)
 *
 * Only a secret key's public half is ever sent here: the secret stays on the
 * node that generated it.
 */
#include <stdio.h>
#include <string.h>

#include <zmq.h>

#include "routes.h"
#include "server_impl.h"

#define WORKER_KEY_NAME_MAX 64
/* the most a list shows (the control loop lets in at most 4096 keys in all) */
#define MAX_WORKER_KEYS_LISTED 10000
#define MAX_WORKER_KEYS_LISTED_S "10000"

/* what each answer carries of a worker_keys row (aliased k) */
#define SQL_WORKER_KEY_JSON                                                                        \
    "json_build_object('id', k.id, 'public_key', k.public_key, 'name', k.name,"                   \
    " 'created_at', k.created_at, 'revoked_at', k.revoked_at)"

static const char sql_key_find[] = "SELECT " SQL_WORKER_KEY_JSON " FROM worker_keys k"
                                   " WHERE k.public_key = $1 AND k.revoked_at IS NULL";
/* a racing registration of the same key meets the unique index and inserts nothing */
static const char sql_key_insert[] =
    "INSERT INTO worker_keys AS k (public_key, name) VALUES ($1, $2)"
    " ON CONFLICT (public_key) WHERE revoked_at IS NULL DO NOTHING RETURNING " SQL_WORKER_KEY_JSON;
static const char sql_key_list[] =
    "SELECT count(*), (SELECT json_agg(x.j ORDER BY x.created_at, x.id) FROM"
    " (SELECT " SQL_WORKER_KEY_JSON " AS j, k.created_at, k.id FROM worker_keys k"
    " ORDER BY k.created_at, k.id LIMIT " MAX_WORKER_KEYS_LISTED_S ") x) FROM worker_keys";
static const char sql_key_revoke[] =
    "UPDATE worker_keys k SET revoked_at = coalesce(k.revoked_at, now())"
    " WHERE k.id = $1::uuid RETURNING " SQL_WORKER_KEY_JSON;

typedef struct worker_key_write {
    const char *public_key, *name, *id;
    json_t *out;
    bool created;
    long long total;
} worker_key_write;

/* A Z85 public key: 40 characters of Z85's alphabet that decode to 32 bytes. */
static bool valid_public_key(const char *s, size_t len)
{
    if (len != 40 || strlen(s) != 40) return false;
    uint8_t raw[32];
    return zmq_z85_decode(raw, s) != NULL;
}

/* A key's name: 0-64 bytes of A-Z a-z 0-9 . _ - (a node's host name fits). */
static bool valid_key_name(const char *s, size_t len)
{
    if (len > WORKER_KEY_NAME_MAX || strlen(s) != len) return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-'))
            return false;
    return true;
}

static int key_create_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    worker_key_write *w = arg;
    int err;
    const char *v[2] = {w->public_key, w->name};
    json_decref(w->out);
    w->out = NULL;
    PGresult *r = fb_db_query(c, "worker_key_insert", sql_key_insert, 2, v, &err, msg, msg_cap);
    if (!r) return err;
    w->created = PQntuples(r) == 1;
    if (w->created) w->out = fb_pg_json(r, 0, 0);
    PQclear(r);
    if (w->created) return FB_OK;
    r = fb_db_query(c, "worker_key_find", sql_key_find, 1, v, &err, msg, msg_cap);
    if (!r) return err;
    if (PQntuples(r) == 1) w->out = fb_pg_json(r, 0, 0);
    PQclear(r);
    /* revoked between the insert and the read: the caller retries the transaction */
    if (!w->out)
        return fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE, "the key changed while it was registered");
    return FB_OK;
}

int fb_route_worker_key_create(fb_req *req)
{
    static const char *const allowed[] = {"public_key", "name", NULL};
    const char *field;
    json_t *val;
    json_object_foreach(req->json, field, val)
    {
        bool ok = false;
        for (const char *const *a = allowed; *a; a++) ok = ok || strcmp(*a, field) == 0;
        if (!ok) {
            char f[80];
            snprintf(f, sizeof f, "%.64s", field);
            for (char *p = f; *p; p++)
                if ((unsigned char)*p < 0x20) *p = '?';
            return fb_req_fail(req, FB_ERR_UNKNOWN_FIELD, f, "%s: unknown field", f);
        }
    }
    json_t *pk = json_object_get(req->json, "public_key"), *name = json_object_get(req->json, "name");
    if (!pk)
        return fb_req_fail(req, FB_ERR_MISSING_FIELD, "public_key",
                           "public_key: required field missing");
    if (!json_is_string(pk))
        return fb_req_fail(req, FB_ERR_WRONG_TYPE, "public_key", "public_key: expected a string");
    if (!valid_public_key(json_string_value(pk), json_string_length(pk)))
        return fb_req_fail(req, FB_ERR_OUT_OF_RANGE, "public_key",
                           "public_key: a CURVE public key is 40 characters of Z85 (the public "
                           "line of a key file written by fusebox-worker --gen-key)");
    if (name && !json_is_string(name))
        return fb_req_fail(req, FB_ERR_WRONG_TYPE, "name", "name: expected a string");
    if (name && !valid_key_name(json_string_value(name), json_string_length(name)))
        return fb_req_fail(req, FB_ERR_BAD_NAME, "name",
                           "name: at most 64 bytes of A-Z, a-z, 0-9, '.', '_' and '-'");
    worker_key_write w = {.public_key = json_string_value(pk),
                          .name = name ? json_string_value(name) : ""};
    int err;
    if ((err = fb_route_txn(req, key_create_txn, &w))) {
        json_decref(w.out);
        return err;
    }
    if (!w.out) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    if (w.created) {
        char loc[96];
        snprintf(loc, sizeof loc, "/v1/workers/keys/%s",
                 json_string_value(json_object_get(w.out, "id")));
        fb_req_add_header(req, "Location", loc);
    }
    fb_req_reply_json(req, w.created ? 201 : 200, w.out);
    return FB_OK;
}

static int key_list_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    worker_key_write *w = arg;
    int err;
    PGresult *r = fb_db_query(c, "worker_key_list", sql_key_list, 0, NULL, &err, msg, msg_cap);
    if (!r) return err;
    json_decref(w->out);
    w->total = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    w->out = PQgetisnull(r, 0, 1) ? json_array() : fb_pg_json(r, 0, 1);
    PQclear(r);
    return FB_OK;
}

int fb_route_worker_key_list(fb_req *req)
{
    static const char *const none[] = {NULL};
    int err;
    if ((err = fb_req_check_query(req, none))) return err;
    worker_key_write w = {0};
    if ((err = fb_route_txn(req, key_list_txn, &w))) {
        json_decref(w.out);
        return err;
    }
    if (!w.out) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    fb_req_reply_json(req, 200,
                      json_pack("{s:o, s:b}", "keys", w.out, "truncated",
                                w.total > MAX_WORKER_KEYS_LISTED));
    return FB_OK;
}

static int key_revoke_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    worker_key_write *w = arg;
    int err;
    const char *v[1] = {w->id};
    PGresult *r = fb_db_query(c, "worker_key_revoke", sql_key_revoke, 1, v, &err, msg, msg_cap);
    if (!r) return err;
    json_decref(w->out);
    w->out = PQntuples(r) == 1 ? fb_pg_json(r, 0, 0) : NULL;
    w->created = PQntuples(r) == 1; /* here: found */
    PQclear(r);
    return FB_OK;
}

int fb_route_worker_key_revoke(fb_req *req)
{
    const char *id = fb_req_param(req, 0);
    if (!fb_is_uuid(id)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such worker key");
    worker_key_write w = {.id = id};
    int err;
    if ((err = fb_route_txn(req, key_revoke_txn, &w))) {
        json_decref(w.out);
        return err;
    }
    if (!w.created) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such worker key");
    if (!w.out) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    fb_req_reply_json(req, 200, w.out);
    return FB_OK;
}
