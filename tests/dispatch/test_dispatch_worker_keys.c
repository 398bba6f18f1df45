/*
 * The workers' allow-list in the database (POST/GET /v1/workers/keys,
 * DELETE /v1/workers/keys/{id}), end to end on real processes: fuseboxd on a
 * fresh database, fusebox-worker with a key that is in no file.
 *
 *   1. Bad input, as a table: every malformed registration is refused with
 *      its code and field, and the list stays empty; tenants cannot use the
 *      routes at all.
 *   2. A registered key lets its worker in (no file names it); registering
 *      it again answers the same row.
 *   3. The worker trains a job, held at step 5 by the step hook; the key is
 *      revoked: the worker is taken for lost, its array goes back to the
 *      queue, its HELLO is refused from then on, and a worker of the file's
 *      key trains the job to completion.
 *   4. The revoked key registered again is a new row, and its worker gets in.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "e2e.h"
#include "wire.h"

static e2e T;

static int list_count(void)
{
    fbt_resp r = fbt_call(&T.s, "GET", "/v1/workers/keys", T.s.admin_key, NULL);
    fbt_expect(&r, 200, NULL, "list worker keys");
    json_t *keys = json_object_get(r.json, "keys");
    CHECK(json_is_array(keys));
    CHECK(json_is_false(json_object_get(r.json, "truncated")));
    int n = (int)json_array_size(keys);
    fbt_resp_free(&r);
    return n;
}

typedef struct bad_case {
    const char *what, *body;
    int status;
    const char *code, *field;
} bad_case;

static void bad_input(const char *pub)
{
    char long_name[200], bad_z85[64], short_key[64];
    snprintf(long_name, sizeof long_name, "{\"public_key\": \"%s\", \"name\": \"%065d\"}", pub, 0);
    snprintf(bad_z85, sizeof bad_z85, "{\"public_key\": \"%.39s~\"}", pub);
    snprintf(short_key, sizeof short_key, "{\"public_key\": \"%.39s\"}", pub);
    char unknown[160], name_type[160], name_bad[160];
    snprintf(unknown, sizeof unknown, "{\"public_key\": \"%s\", \"secret_key\": \"x\"}", pub);
    snprintf(name_type, sizeof name_type, "{\"public_key\": \"%s\", \"name\": 5}", pub);
    snprintf(name_bad, sizeof name_bad, "{\"public_key\": \"%s\", \"name\": \"node 1\"}", pub);
    const bad_case cases[] = {
        {"malformed JSON", "{\"public_key\": ", 400, "json_syntax", NULL},
        {"not an object", "[1]", 400, "not_object", NULL},
        {"no key", "{}", 400, "missing_field", "public_key"},
        {"key not a string", "{\"public_key\": 5}", 400, "wrong_type", "public_key"},
        {"39 characters", short_key, 400, "out_of_range", "public_key"},
        {"not Z85", bad_z85, 400, "out_of_range", "public_key"},
        {"unknown field", unknown, 400, "unknown_field", "secret_key"},
        {"name not a string", name_type, 400, "wrong_type", "name"},
        {"name with a space", name_bad, 400, "bad_name", "name"},
        {"name of 65 bytes", long_name, 400, "bad_name", "name"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case *c = &cases[i];
        fbt_resp r = fbt_call(&T.s, "POST", "/v1/workers/keys", T.s.admin_key, c->body);
        fbt_expect(&r, c->status, c->code, c->what);
        if (c->field) {
            json_t *err = json_object_get(r.json, "error");
            const char *f = json_string_value(json_object_get(err, "field"));
            if (!f || strcmp(f, c->field) != 0) fprintf(stderr, "%s: %s\n", c->what, r.body);
            CHECK(f && strcmp(f, c->field) == 0);
        }
        fbt_resp_free(&r);
        CHECK_INT_EQ(list_count(), 0);
    }
    /* a tenant's key may not list, register or revoke worker keys */
    char body[128];
    snprintf(body, sizeof body, "{\"public_key\": \"%s\"}", pub);
    fbt_resp r = fbt_call(&T.s, "POST", "/v1/workers/keys", T.key, body);
    fbt_expect(&r, 403, "forbidden", "a tenant registers a worker key");
    fbt_resp_free(&r);
    r = fbt_call(&T.s, "GET", "/v1/workers/keys", T.key, NULL);
    fbt_expect(&r, 403, "forbidden", "a tenant lists worker keys");
    fbt_resp_free(&r);
    r = fbt_call(&T.s, "POST", "/v1/workers/keys", NULL, body);
    fbt_expect(&r, 401, "unauthorized", "no key registers a worker key");
    fbt_resp_free(&r);
    r = fbt_call(&T.s, "DELETE", "/v1/workers/keys/not-a-uuid", T.s.admin_key, NULL);
    fbt_expect(&r, 404, "not_found", "revoke a malformed id");
    fbt_resp_free(&r);
    r = fbt_call(&T.s, "DELETE", "/v1/workers/keys/00000000-0000-4000-8000-000000000000",
                 T.s.admin_key, NULL);
    fbt_expect(&r, 404, "not_found", "revoke an unknown id");
    fbt_resp_free(&r);
    r = fbt_call(&T.s, "GET", "/v1/workers/keys?limit=5", T.s.admin_key, NULL);
    fbt_expect(&r, 400, "bad_query", "an unknown query parameter");
    fbt_resp_free(&r);
    CHECK_INT_EQ(list_count(), 0);
}

/* Registers pub; the row's id into id; expects status (201 new, 200 found). */
static void register_key(const char *pub, int status, char *id, size_t id_cap)
{
    char body[160];
    snprintf(body, sizeof body, "{\"public_key\": \"%s\", \"name\": \"node-2\"}", pub);
    fbt_resp r = fbt_call(&T.s, "POST", "/v1/workers/keys", T.s.admin_key, body);
    fbt_expect(&r, status, NULL, "register a worker key");
    CHECK(strcmp(json_string_value(json_object_get(r.json, "public_key")), pub) == 0);
    CHECK(strcmp(json_string_value(json_object_get(r.json, "name")), "node-2") == 0);
    CHECK(json_is_null(json_object_get(r.json, "revoked_at")));
    snprintf(id, id_cap, "%s", json_string_value(json_object_get(r.json, "id")));
    fbt_resp_free(&r);
}

static bool log_has(const char *path, const char *text)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, text) != NULL;
    fclose(f);
    return found;
}

/* Waits up to timeout_s (a liveness bound) for fuseboxd's log to say text. */
static void wait_log(const char *text, int timeout_s)
{
    const struct timespec pause = {0, 50 * 1000 * 1000};
    for (int i = 0; i < timeout_s * 20 && !log_has(T.s.log_path, text); i++)
        nanosleep(&pause, NULL);
    if (!log_has(T.s.log_path, text)) {
        fprintf(stderr, "fuseboxd never logged \"%s\"\n", text);
        e2e_dump(&T);
    }
    CHECK(log_has(T.s.log_path, text));
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    e2e_start(&T, NULL);
    char msg[256], key2[400], pub2[41];
    snprintf(key2, sizeof key2, "%s/node-2.key", T.root);
    CHECK(fb_wire_key_generate(key2, msg, sizeof msg) == 0);
    CHECK(fb_wire_key_load(key2, pub2, NULL, msg, sizeof msg) == 0);

    bad_input(pub2);

    char id[64], again[64];
    register_key(pub2, 201, id, sizeof id);
    register_key(pub2, 200, again, sizeof again);
    CHECK(strcmp(id, again) == 0);
    CHECK_INT_EQ(list_count(), 1);

    const char *const node2[] = {"--key", key2, NULL};
    pid_t w2 = e2e_worker_args(&T, "node-2", node2);
    e2e_wait_sql(&T, "SELECT count(*) = 1 FROM workers WHERE name = 'node-2' AND state <> 'lost'",
                 60, "node-2 registered with its database key");

    /* a job trains on node-2, held at step 5 */
    e2e_hold(&T, "revoked", 5);
    char job[64];
    snprintf(job, sizeof job, "%s", e2e_submit(&T, T.key, e2e_spec("revoked", 1e-2, 300, 50)));
    CHECK_INT_EQ((int)e2e_wait_held(&T, "revoked", 60), 5);

    char path[128];
    snprintf(path, sizeof path, "/v1/workers/keys/%s", id);
    fbt_resp r = fbt_call(&T.s, "DELETE", path, T.s.admin_key, NULL);
    fbt_expect(&r, 200, NULL, "revoke node-2's key");
    CHECK(json_is_string(json_object_get(r.json, "revoked_at")));
    char revoked_at[64];
    snprintf(revoked_at, sizeof revoked_at, "%s",
             json_string_value(json_object_get(r.json, "revoked_at")));
    fbt_resp_free(&r);
    /* revoking again changes nothing */
    r = fbt_call(&T.s, "DELETE", path, T.s.admin_key, NULL);
    fbt_expect(&r, 200, NULL, "revoke node-2's key again");
    CHECK(strcmp(json_string_value(json_object_get(r.json, "revoked_at")), revoked_at) == 0);
    fbt_resp_free(&r);

    e2e_wait_sql(&T, "SELECT state = 'lost' FROM workers WHERE name = 'node-2'", 60,
                 "node-2 dropped once its key was revoked");
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) = 1 FROM job_events WHERE job_id = '%s' AND kind = 'requeued'", job);
    e2e_wait_sql(&T, sql, 60, "the job requeued off node-2");
    e2e_release(&T, "revoked");
    /* node-2 goes on saying HELLO (its heartbeats are answered "unknown"): refused */
    wait_log("whose key was revoked; dropped", 60);
    CHECK(log_has(T.s.log_path, "worker dropped: its key was revoked"));

    /* a worker of the file's key trains the job to its end */
    pid_t w1 = e2e_worker(&T, "node-1");
    e2e_wait_state(&T, T.key, job, "completed", 300);
    snprintf(sql, sizeof sql,
             "SELECT w.name = 'node-1' AND (SELECT state = 'lost' FROM workers WHERE name ="
             " 'node-2') FROM jobs j JOIN groups g ON g.id = j.group_id"
             " JOIN workers w ON w.id = g.worker_id WHERE j.id = '%s'",
             job);
    e2e_wait_sql(&T, sql, 10, "node-1 ran the job's last array; node-2 stayed out");

    /* the key registered again is a new row; node-2 gets in again */
    char id3[64];
    register_key(pub2, 201, id3, sizeof id3);
    CHECK(strcmp(id3, id) != 0);
    CHECK_INT_EQ(list_count(), 2);
    e2e_wait_sql(&T, "SELECT state <> 'lost' FROM workers WHERE name = 'node-2'", 60,
                 "node-2 back with its key registered again");

    e2e_kill(w1, SIGTERM);
    e2e_kill(w2, SIGTERM);
    printf("result: worker_keys bad_inputs=10 revoked_requeues=1\n");
    e2e_finish(&T);
    /* every answer above, against api/openapi.yaml */
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("ok\n");
    return 0;
}
