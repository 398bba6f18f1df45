/*
 * Tenant isolation.  Tenant A owns a job (with metrics, events and a
 * checkpoint), a sweep, a dataset and keys; tenant B, holding A's ids, gets 404 on
 * every endpoint that takes an id, exactly like an id that does not exist,
 * and the database is unchanged afterwards.  B's lists never show A's
 * objects, even when filtered by A's names and sweep.  A revoked key gets
 * 401 at once; a tenant's key gets 403 on every admin route.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "harness.h"

static fbt_server S;
static char a_id[64], a_key[128], b_id[64], b_key[128];
static char a_job[64], a_sweep[64], a_key_id[32];

static const char *jstr(json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

typedef struct probe {
    const char *method;
    const char *fmt; /* %s: the id */
    const char *id;
    const char *body;
} probe;

static void setup(void)
{
    fbt_tenant(&S, "tenant-a", "", a_id, sizeof a_id, a_key, sizeof a_key);
    fbt_tenant(&S, "tenant-b", "", b_id, sizeof b_id, b_key, sizeof b_key);
    snprintf(a_job, sizeof a_job, "%s", fbt_job(&S, a_key, "secret-job"));
    fbt_resp r = fbt_call(
        &S, "POST", "/v1/sweeps", a_key,
        "{\"name\": \"a-sweep\", \"base\": {\"dataset\": \"fashion-mnist\", \"model\": {\"input\":"
        " [4], \"layers\": [{\"type\": \"linear\", \"out\": 2}]}, \"batch_size\": 8, \"steps\":"
        " 10, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}, \"search\": {\"type\": \"grid\","
        " \"params\": {\"seed\": {\"values\": [1, 2]}}}}");
    fbt_expect(&r, 201, NULL, "A's sweep");
    snprintf(a_sweep, sizeof a_sweep, "%s", jstr(r.json, "id"));
    fbt_resp_free(&r);
    char path[200];
    snprintf(path, sizeof path, "/v1/tenants/%s/keys", a_id);
    r = fbt_call(&S, "GET", path, a_key, NULL);
    fbt_expect(&r, 200, NULL, "A's keys");
    snprintf(a_key_id, sizeof a_key_id, "%s",
             jstr(json_array_get(json_object_get(r.json, "keys"), 0), "id"));
    fbt_resp_free(&r);
    char sql[1024];
    snprintf(sql, sizeof sql,
             "INSERT INTO job_metrics (job_id, step, loss) VALUES ('%s', 1, 0.5);"
             " INSERT INTO checkpoints (job_id, step, path, bytes) VALUES ('%s', 1, 'x', 1);"
             " INSERT INTO datasets (tenant_id, name, source, state, manifest)"
             " VALUES ('%s', 'a-data', 'upload', 'ready', '{}')",
             a_job, a_job, a_id);
    PQclear(fbt_sql(&S, sql));
}

static void probe_404(const probe *p)
{
    char path[300];
    snprintf(path, sizeof path, p->fmt, p->id);
    fbt_resp r = fbt_call(&S, p->method, path, b_key, p->body);
    char what[400];
    snprintf(what, sizeof what, "B: %s %s", p->method, path);
    fbt_expect(&r, 404, NULL, what);
    const char *code = json_string_value(json_object_get(json_object_get(r.json, "error"), "code"));
    CHECK(strcmp(code, "not_found") == 0);
    /* the answer is the same as for an id that does not exist */
    char *b_text =
        strdup(json_string_value(json_object_get(json_object_get(r.json, "error"), "message")));
    fbt_resp_free(&r);
    if (strchr(p->fmt, '%') && strstr(p->id, "-")) {
        char ghost[300];
        snprintf(ghost, sizeof ghost, p->fmt, "00000000-0000-4000-8000-00000000beef");
        if (strcmp(p->id, a_key_id) != 0) {
            r = fbt_call(&S, p->method, ghost, b_key, p->body);
            fbt_expect(&r, 404, "not_found", "ghost id");
            CHECK_STR_EQ(
                json_string_value(json_object_get(json_object_get(r.json, "error"), "message")),
                b_text);
            fbt_resp_free(&r);
        }
    }
    free(b_text);
    printf("404 %s %s\n", p->method, path);
}

static void test_cross_tenant(void)
{
    char *before = fbt_db_fingerprint(&S);
    char a_keys_path[200], b_keys_path[200];
    snprintf(a_keys_path, sizeof a_keys_path, "/v1/tenants/%s/keys/%%s", a_id);
    snprintf(b_keys_path, sizeof b_keys_path, "/v1/tenants/%s/keys/%%s", b_id);
    const probe probes[] = {
        {"GET", "/v1/jobs/%s", a_job, NULL},
        {"POST", "/v1/jobs/%s/cancel", a_job, NULL},
        {"GET", "/v1/jobs/%s/metrics", a_job, NULL},
        {"GET", "/v1/jobs/%s/events", a_job, NULL},
        {"GET", "/v1/jobs/%s/checkpoints", a_job, NULL},
        {"GET", "/v1/jobs/%s/model", a_job, NULL},
        {"GET", "/v1/sweeps/%s", a_sweep, NULL},
        {"GET", "/v1/datasets/%s", "a-data", NULL},
        {"DELETE", "/v1/datasets/%s", "a-data", NULL},
        {"POST", "/v1/sweeps/%s/cancel", a_sweep, NULL},
        {"GET", "/v1/tenants/%s", a_id, NULL},
        {"GET", "/v1/tenants/%s/keys", a_id, NULL},
        {"POST", "/v1/tenants/%s/keys", a_id, "{\"name\": \"stolen\"}"},
        {"DELETE", a_keys_path, a_key_id, NULL},
        {"DELETE", b_keys_path, a_key_id, NULL},
    };
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++)
        probe_404(&probes[i]);

    /* lists and filters show nothing of A's */
    char path[300];
    const char *lists[] = {"/v1/jobs",
                           "/v1/jobs?name=secret-job",
                           "/v1/jobs?state=queued",
                           "/v1/sweeps",
                           "/v1/datasets",
                           NULL};
    for (int i = 0; lists[i]; i++) {
        fbt_resp r = fbt_call(&S, "GET", lists[i], b_key, NULL);
        fbt_expect(&r, 200, NULL, lists[i]);
        json_t *items = json_object_get(r.json, strstr(lists[i], "sweeps")     ? "sweeps"
                                                : strstr(lists[i], "datasets") ? "datasets"
                                                                               : "jobs");
        CHECK_INT_EQ(json_array_size(items), 0);
        fbt_resp_free(&r);
    }
    snprintf(path, sizeof path, "/v1/jobs?sweep_id=%s", a_sweep);
    fbt_resp r = fbt_call(&S, "GET", path, b_key, NULL);
    fbt_expect(&r, 200, NULL, "B filters by A's sweep");
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "jobs")), 0);
    fbt_resp_free(&r);
    /* the cluster view shows B only itself */
    r = fbt_call(&S, "GET", "/v1/cluster", b_key, NULL);
    fbt_expect(&r, 200, NULL, "B's cluster view");
    json_t *ts = json_object_get(r.json, "tenants");
    CHECK_INT_EQ(json_array_size(ts), 1);
    CHECK_STR_EQ(jstr(json_array_get(ts, 0), "tenant_id"), b_id);
    fbt_resp_free(&r);
    /* nothing B did changed anything */
    char *after = fbt_db_fingerprint(&S);
    CHECK_STR_EQ(after, before);
    free(after);
    free(before);

    /* B's Idempotency-Key namespace is its own: the same key makes B's own job */
    const char *hk[] = {"Idempotency-Key: shared-key", NULL};
    r = fbt_call_h(&S, "POST", "/v1/jobs", a_key, fbt_spec("a-idem", 0.1), hk);
    fbt_expect(&r, 201, NULL, "A with a key");
    char a_idem[64];
    snprintf(a_idem, sizeof a_idem, "%s", jstr(r.json, "id"));
    fbt_resp_free(&r);
    r = fbt_call_h(&S, "POST", "/v1/jobs", b_key, fbt_spec("a-idem", 0.1), hk);
    fbt_expect(&r, 201, NULL, "B with the same key");
    CHECK(strcmp(jstr(r.json, "id"), a_idem) != 0);
    fbt_resp_free(&r);

    /* A still has everything, untouched */
    snprintf(path, sizeof path, "/v1/jobs/%s", a_job);
    r = fbt_call(&S, "GET", path, a_key, NULL);
    fbt_expect(&r, 200, NULL, "A reads its job");
    CHECK_STR_EQ(jstr(r.json, "state"), "queued");
    fbt_resp_free(&r);
    snprintf(path, sizeof path, "/v1/sweeps/%s", a_sweep);
    r = fbt_call(&S, "GET", path, a_key, NULL);
    fbt_expect(&r, 200, NULL, "A reads its sweep");
    CHECK_STR_EQ(jstr(r.json, "state"), "active");
    fbt_resp_free(&r);
    r = fbt_call(&S, "GET", "/v1/tenant", a_key, NULL);
    fbt_expect(&r, 200, NULL, "A's key still works");
    fbt_resp_free(&r);
}

static void test_nothing_changed_by_b(void)
{
    /* every probe above ran between two fingerprints inside test_cross_tenant;
     * here the direct check that none of A's rows moved */
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM jobs WHERE tenant_id = '%s' AND state <> 'queued'", a_id);
    CHECK_STR_EQ(fbt_sql_value(&S, sql), "0");
    snprintf(sql, sizeof sql, "SELECT count(*) FROM jobs WHERE tenant_id = '%s'", a_id);
    CHECK_STR_EQ(fbt_sql_value(&S, sql), "4"); /* the job, two trials, the idempotent one */
    snprintf(sql, sizeof sql, "SELECT count(*) FROM api_keys WHERE tenant_id = '%s'", a_id);
    CHECK_STR_EQ(fbt_sql_value(&S, sql), "1");
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM datasets WHERE tenant_id = '%s' AND state = 'ready'", a_id);
    CHECK_STR_EQ(fbt_sql_value(&S, sql), "1");
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM api_keys WHERE tenant_id = '%s' AND revoked_at IS NOT NULL",
             a_id);
    CHECK_STR_EQ(fbt_sql_value(&S, sql), "0");
}

static void test_revoked_and_admin(void)
{
    char path[256], new_key[128], new_id[32];
    snprintf(path, sizeof path, "/v1/tenants/%s/keys", b_id);
    fbt_resp r = fbt_call(&S, "POST", path, b_key, NULL);
    fbt_expect(&r, 201, NULL, "B's second key");
    snprintf(new_key, sizeof new_key, "%s", jstr(r.json, "key"));
    snprintf(new_id, sizeof new_id, "%s", jstr(r.json, "id"));
    fbt_resp_free(&r);
    r = fbt_call(&S, "GET", "/v1/jobs", new_key, NULL); /* now cached by the server */
    fbt_expect(&r, 200, NULL, "second key works");
    fbt_resp_free(&r);
    snprintf(path, sizeof path, "/v1/tenants/%s/keys/%s", b_id, new_id);
    r = fbt_call(&S, "DELETE", path, S.admin_key, NULL);
    fbt_expect(&r, 200, NULL, "admin revokes B's key");
    fbt_resp_free(&r);
    const char *routes[][2] = {
        {"GET", "/v1/jobs"}, {"GET", "/v1/tenant"}, {"POST", "/v1/jobs"}, {"GET", "/v1/cluster"}};
    for (int i = 0; i < 4; i++) {
        r = fbt_call(&S, routes[i][0], routes[i][1], new_key,
                     strcmp(routes[i][0], "POST") == 0 ? fbt_spec("x", 0.1) : NULL);
        fbt_expect(&r, 401, "unauthorized", "revoked key");
        fbt_resp_free(&r);
    }
    snprintf(path, sizeof path, "/v1/tenants/%s", b_id);
    const char *admin[][3] = {{"POST", "/v1/tenants", "{\"name\": \"carol\"}"},
                              {"GET", "/v1/tenants", NULL},
                              {"PATCH", path, "{\"weight\": 100}"}};
    for (int i = 0; i < 3; i++) {
        r = fbt_call(&S, admin[i][0], admin[i][1], b_key, admin[i][2]);
        fbt_expect(&r, 403, "forbidden", "non-admin on an admin route");
        fbt_resp_free(&r);
    }
    CHECK_STR_EQ(fbt_sql_value(&S, "SELECT count(*) FROM tenants WHERE name = 'carol'"), "0");
    CHECK_STR_EQ(fbt_sql_value(&S, "SELECT weight FROM tenants WHERE name = 'tenant-b'"), "1");
}

int main(void)
{
    fbt_require_database();
    fbt_db_create(&S);
    fbt_server_start(&S, NULL);
    setup();
    test_cross_tenant();
    test_nothing_changed_by_b();
    test_revoked_and_admin();
    CHECK_INT_EQ(fbt_server_stop(&S), 0);
    fbt_db_drop(&S);
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("ok\n");
    return 0;
}
