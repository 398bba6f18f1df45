/*
 * Every fuseboxd endpoint's success path and its documented errors, against
 * the real binary and a fresh PostgreSQL database: health, readiness and
 * metrics; tenants and keys; jobs (idempotent submission, filters, cursor
 * pagination, cancel, metrics with since_step and fields, events,
 * checkpoints, model download); sweeps (grid and random expansion, best
 * trial, cancel); workers and cluster.  Then a graceful shutdown with a
 * request in flight, and a restart on the same database.  Every response is
 * checked against api/openapi.yaml when the node validator is installed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"

static fbt_server S;
static char alice_id[64], alice_key[128];

static const char *jstr(json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

/* The migrations in the source tree's schema/ (NNN_*.sql): the version the
 * server reports once it has applied them all. */
static int schema_files(void)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/schema", getenv("FB_SOURCE_DIR"));
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strlen(e->d_name) > 8 && e->d_name[0] >= '0' && e->d_name[0] <= '9' &&
             strcmp(e->d_name + strlen(e->d_name) - 4, ".sql") == 0;
    closedir(d);
    CHECK(n >= 1);
    return n;
}

static void test_health(void)
{
    fbt_resp r = fbt_call(&S, "GET", "/healthz", NULL, NULL);
    fbt_expect(&r, 200, NULL, "healthz");
    CHECK_STR_EQ(jstr(r.json, "status"), "ok");
    fbt_resp_free(&r);
    r = fbt_call(&S, "GET", "/readyz", NULL, NULL);
    fbt_expect(&r, 200, NULL, "readyz");
    CHECK_STR_EQ(jstr(r.json, "status"), "ready");
    CHECK_INT_EQ(json_integer_value(json_object_get(r.json, "schema_version")), schema_files());
    fbt_resp_free(&r);
}

static void test_admin_key_file(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/admin.key", S.data_dir);
    struct stat st;
    CHECK(stat(path, &st) == 0);
    CHECK_INT_EQ(st.st_mode & 0777, 0600);
    CHECK(strncmp(S.admin_key, "fbk_", 4) == 0);
    /* the log says where the key is */
    FILE *f = fopen(S.log_path, "r");
    CHECK(f != NULL);
    char line[4096];
    bool said = false;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "admin key") && strstr(line, path)) said = true;
    fclose(f);
    CHECK(said);
    /* the secret is stored only as a hash */
    const char *secret = S.admin_key + 4 + 16 + 1;
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM api_keys WHERE position('%s' in encode(secret_hash, 'hex')) > 0"
             " OR position('%s' in name) > 0",
             secret, secret);
    CHECK_STR_EQ(fbt_sql_value(&S, sql), "0");
}

static void test_tenants(void)
{
    fbt_tenant(&S, "alice", "\"weight\": 2, \"quotas\": {\"max_queued_jobs\": 500}", alice_id,
               sizeof alice_id, alice_key, sizeof alice_key);
    char path[200];
    snprintf(path, sizeof path, "/v1/tenants/%s", alice_id);
    fbt_resp r = fbt_call(&S, "GET", path, S.admin_key, NULL);
    fbt_expect(&r, 200, NULL, "admin reads alice");
    CHECK_STR_EQ(jstr(r.json, "name"), "alice");
    CHECK_NEAR(json_number_value(json_object_get(r.json, "weight")), 2.0, 1e-12);
    CHECK_INT_EQ(
        json_integer_value(json_object_get(json_object_get(r.json, "quotas"), "max_queued_jobs")),
        500);
    fbt_resp_free(&r);
    r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "alice reads herself");
    fbt_resp_free(&r);
    r = fbt_call(&S, "GET", "/v1/tenant", alice_key, NULL);
    fbt_expect(&r, 200, NULL, "GET /v1/tenant");
    CHECK_STR_EQ(jstr(r.json, "id"), alice_id);
    CHECK(json_is_false(json_object_get(r.json, "admin")));
    fbt_resp_free(&r);

    r = fbt_call(&S, "PATCH", path, S.admin_key,
                 "{\"weight\": 3.5, \"rate_limit\": {\"requests_per_second\": 400, \"burst\": 800},"
                 " \"quotas\": {\"max_devices\": 4}}");
    fbt_expect(&r, 200, NULL, "PATCH tenant");
    CHECK_NEAR(json_number_value(json_object_get(r.json, "weight")), 3.5, 1e-12);
    CHECK_INT_EQ(
        json_integer_value(json_object_get(json_object_get(r.json, "rate_limit"), "burst")), 800);
    CHECK_INT_EQ(
        json_integer_value(json_object_get(json_object_get(r.json, "quotas"), "max_queued_jobs")),
        500);
    fbt_resp_free(&r);

    char id2[64], key2[128];
    fbt_tenant(&S, "bob", "", id2, sizeof id2, key2, sizeof key2);
    r = fbt_call(&S, "POST", "/v1/tenants", S.admin_key, "{\"name\": \"bob\"}");
    fbt_expect(&r, 409, "already_exists", "duplicate tenant");
    fbt_resp_free(&r);
    /* pagination over names: admin, alice, bob */
    r = fbt_call(&S, "GET", "/v1/tenants?limit=2", S.admin_key, NULL);
    fbt_expect(&r, 200, NULL, "list tenants");
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "tenants")), 2);
    const char *next = jstr(r.json, "next_cursor");
    CHECK(next != NULL);
    char p2[200];
    snprintf(p2, sizeof p2, "/v1/tenants?limit=2&cursor=%s", next);
    fbt_resp_free(&r);
    r = fbt_call(&S, "GET", p2, S.admin_key, NULL);
    fbt_expect(&r, 200, NULL, "list tenants page 2");
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "tenants")), 1);
    CHECK_STR_EQ(jstr(json_array_get(json_object_get(r.json, "tenants"), 0), "name"), "bob");
    CHECK(json_is_null(json_object_get(r.json, "next_cursor")));
    fbt_resp_free(&r);
}

static void test_keys(void)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/tenants/%s/keys", alice_id);
    fbt_resp r = fbt_call(&S, "POST", path, alice_key, "{\"name\": \"ci runner\"}");
    fbt_expect(&r, 201, NULL, "alice makes a key");
    char key[128], key_id[32];
    snprintf(key, sizeof key, "%s", jstr(r.json, "key"));
    snprintf(key_id, sizeof key_id, "%s", jstr(r.json, "id"));
    CHECK_INT_EQ(strlen(key), 85);
    CHECK_STR_EQ(jstr(r.json, "name"), "ci runner");
    fbt_resp_free(&r);

    r = fbt_call(&S, "GET", "/v1/tenant", key, NULL);
    fbt_expect(&r, 200, NULL, "new key works");
    fbt_resp_free(&r);

    r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "list keys");
    json_t *keys = json_object_get(r.json, "keys");
    CHECK_INT_EQ(json_array_size(keys), 2);
    for (size_t i = 0; i < json_array_size(keys); i++)
        CHECK(json_object_get(json_array_get(keys, i), "key") == NULL); /* never the secret */
    fbt_resp_free(&r);

    char del[256];
    snprintf(del, sizeof del, "%s/%s", path, key_id);
    r = fbt_call(&S, "DELETE", del, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "revoke");
    CHECK(json_is_string(json_object_get(r.json, "revoked_at")));
    fbt_resp_free(&r);
    r = fbt_call(&S, "GET", "/v1/tenant", key, NULL);
    fbt_expect(&r, 401, "unauthorized", "revoked key");
    CHECK(fbt_header(&r, "WWW-Authenticate") != NULL);
    fbt_resp_free(&r);
    r = fbt_call(&S, "DELETE", del, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "revoke twice");
    fbt_resp_free(&r);
    snprintf(del, sizeof del, "%s/0123456789abcdef", path);
    r = fbt_call(&S, "DELETE", del, alice_key, NULL);
    fbt_expect(&r, 404, "not_found", "revoke unknown key");
    fbt_resp_free(&r);
}

static char job1[64], job2[64];

static void test_jobs(void)
{
    const char *hk[] = {"Idempotency-Key: submit-1", NULL};
    fbt_resp r = fbt_call_h(&S, "POST", "/v1/jobs", alice_key, fbt_spec("first", 0.1), hk);
    fbt_expect(&r, 201, NULL, "submit");
    snprintf(job1, sizeof job1, "%s", jstr(r.json, "id"));
    CHECK_STR_EQ(jstr(r.json, "state"), "queued");
    CHECK_STR_EQ(jstr(json_object_get(r.json, "queue"), "reason"), "waiting for devices");
    CHECK(json_is_object(json_object_get(r.json, "spec")));
    CHECK_INT_EQ(strlen(jstr(r.json, "fusion_key")), 32);
    char loc[128];
    snprintf(loc, sizeof loc, "/v1/jobs/%s", job1);
    CHECK_STR_EQ(fbt_header(&r, "Location"), loc);
    fbt_resp_free(&r);
    /* the same request again: the same job */
    r = fbt_call_h(&S, "POST", "/v1/jobs", alice_key, fbt_spec("first", 0.1), hk);
    fbt_expect(&r, 200, NULL, "idempotent retry");
    CHECK_STR_EQ(jstr(r.json, "id"), job1);
    CHECK_STR_EQ(fbt_header(&r, "Idempotent-Replayed"), "true");
    fbt_resp_free(&r);
    /* reformatted but the same spec is still the same request */
    r = fbt_call_h(&S, "POST", "/v1/jobs", alice_key,
                   "{\"optimizer\": {\"lr\": 1e-1, \"type\": \"sgd\"}, \"steps\": 100,"
                   " \"batch_size\": 32, \"name\": \"first\", \"dataset\": \"fashion-mnist\","
                   " \"model\": {\"layers\": [{\"type\": \"flatten\"}, {\"out\": 10, \"type\":"
                   " \"linear\"}], \"input\": [1, 28, 28]}}",
                   hk);
    fbt_expect(&r, 200, NULL, "idempotent retry, reformatted");
    CHECK_STR_EQ(jstr(r.json, "id"), job1);
    fbt_resp_free(&r);
    r = fbt_call_h(&S, "POST", "/v1/jobs", alice_key, fbt_spec("first", 0.2), hk);
    fbt_expect(&r, 422, "idempotency_conflict", "key reused for another spec");
    fbt_resp_free(&r);
    CHECK_STR_EQ(fbt_sql_value(&S, "SELECT count(*) FROM jobs"), "1");

    snprintf(job2, sizeof job2, "%s", fbt_job(&S, alice_key, "second"));
    char path[200];
    snprintf(path, sizeof path, "/v1/jobs/%s", job2);
    r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "get job");
    CHECK_INT_EQ(json_integer_value(json_object_get(json_object_get(r.json, "queue"), "position")),
                 2);
    CHECK_INT_EQ(json_integer_value(json_object_get(r.json, "step")), 0);
    CHECK_INT_EQ(json_integer_value(json_object_get(r.json, "restarts")), 0);
    CHECK(json_is_null(json_object_get(r.json, "slowdown")));
    CHECK(json_is_string(json_object_get(r.json, "created_at")));
    fbt_resp_free(&r);

    /* eight more, then walk the pages */
    for (int i = 0; i < 8; i++) {
        char name[32];
        snprintf(name, sizeof name, "page-%d", i);
        fbt_job(&S, alice_key, name);
    }
    char cursor[64] = "";
    int seen = 0, pages = 0;
    for (;;) {
        char p[256];
        snprintf(p, sizeof p, "/v1/jobs?limit=3%s%s", cursor[0] ? "&cursor=" : "", cursor);
        r = fbt_call(&S, "GET", p, alice_key, NULL);
        fbt_expect(&r, 200, NULL, "list page");
        seen += (int)json_array_size(json_object_get(r.json, "jobs"));
        pages++;
        const char *next = jstr(r.json, "next_cursor");
        if (!next) {
            fbt_resp_free(&r);
            break;
        }
        snprintf(cursor, sizeof cursor, "%s", next);
        fbt_resp_free(&r);
    }
    CHECK_INT_EQ(seen, 10);
    CHECK_INT_EQ(pages, 4);
    r = fbt_call(&S, "GET", "/v1/jobs?name=page-3", alice_key, NULL);
    fbt_expect(&r, 200, NULL, "filter by name");
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "jobs")), 1);
    fbt_resp_free(&r);

    /* cancel */
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", job2);
    r = fbt_call(&S, "POST", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "cancel");
    CHECK_STR_EQ(jstr(r.json, "state"), "cancelled");
    CHECK(json_is_string(json_object_get(r.json, "finished_at")));
    fbt_resp_free(&r);
    r = fbt_call(&S, "POST", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "cancel again");
    fbt_resp_free(&r);
    r = fbt_call(&S, "GET", "/v1/jobs?state=cancelled", alice_key, NULL);
    fbt_expect(&r, 200, NULL, "filter by state");
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "jobs")), 1);
    fbt_resp_free(&r);
    char sql[512];
    snprintf(sql, sizeof sql, "UPDATE jobs SET state = 'completed' WHERE name = 'page-0'");
    PQclear(fbt_sql(&S, sql));
    snprintf(sql, sizeof sql, "/v1/jobs/%s/cancel",
             fbt_sql_value(&S, "SELECT id FROM jobs WHERE name = 'page-0'"));
    r = fbt_call(&S, "POST", sql, alice_key, NULL);
    fbt_expect(&r, 409, "state_conflict", "cancel a completed job");
    fbt_resp_free(&r);

    /* events */
    snprintf(path, sizeof path, "/v1/jobs/%s/events", job2);
    r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "events");
    json_t *ev = json_object_get(r.json, "events");
    CHECK_INT_EQ(json_array_size(ev), 2);
    CHECK_STR_EQ(jstr(json_array_get(ev, 0), "kind"), "submitted");
    CHECK_STR_EQ(jstr(json_array_get(ev, 1), "kind"), "cancelled");
    fbt_resp_free(&r);
    snprintf(path, sizeof path, "/v1/jobs/%s/events?limit=1", job2);
    r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "events page");
    CHECK(json_is_integer(json_object_get(r.json, "next_after")));
    fbt_resp_free(&r);
}

static void test_metrics_series(void)
{
    char sql[1024], path[256];
    snprintf(sql, sizeof sql,
             "INSERT INTO job_metrics (job_id, step, loss, accuracy, samples_per_s, slowdown,"
             " compute_ms, comm_ms, io_ms, wait_ms)"
             " SELECT '%s', s * 10, 2.0 / (s + 1), s / 10.0, 1000 + s, 1.0 + s / 100.0, 5, 1, 0.5,"
             " 0.1 FROM generate_series(0, 9) s",
             job1);
    PQclear(fbt_sql(&S, sql));
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics", job1);
    fbt_resp r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "metrics");
    json_t *pts = json_object_get(r.json, "points");
    CHECK_INT_EQ(json_array_size(pts), 10);
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "fields")), 12);
    CHECK(json_is_null(json_object_get(json_array_get(pts, 0), "val_loss")));
    CHECK(json_is_null(json_object_get(json_array_get(pts, 0), "test_loss")));
    CHECK_NEAR(json_number_value(json_object_get(json_array_get(pts, 3), "loss")), 0.5, 1e-12);
    fbt_resp_free(&r);
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?since_step=40&fields=loss,slowdown", job1);
    r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "metrics since_step fields");
    pts = json_object_get(r.json, "points");
    CHECK_INT_EQ(json_array_size(pts), 5);
    json_t *p0 = json_array_get(pts, 0);
    CHECK_INT_EQ(json_integer_value(json_object_get(p0, "step")), 50);
    CHECK(json_object_get(p0, "loss") != NULL);
    CHECK(json_object_get(p0, "slowdown") != NULL);
    CHECK(json_object_get(p0, "accuracy") == NULL);
    CHECK_INT_EQ(json_object_size(p0), 4); /* step, time, loss, slowdown */
    fbt_resp_free(&r);
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?limit=4&fields=accuracy", job1);
    r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "metrics limit");
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "points")), 4);
    CHECK_INT_EQ(json_integer_value(json_object_get(r.json, "next_since_step")), 30);
    fbt_resp_free(&r);
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?fields=loss,bogus", job1);
    r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 400, "bad_query", "unknown metric field");
    fbt_resp_free(&r);
}

static void test_checkpoints_model(void)
{
    char path[256], sql[1024];
    snprintf(path, sizeof path, "/v1/jobs/%s/model", job1);
    fbt_resp r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 404, "no_model", "model before any checkpoint");
    fbt_resp_free(&r);

    char dir[512], file[600];
    snprintf(dir, sizeof dir, "%s/artifacts/%s", S.data_dir, job1);
    CHECK(mkdir(dir, 0750) == 0);
    snprintf(file, sizeof file, "%s/final.safetensors", dir);
    static const char bytes[] = "\x10\0\0\0\0\0\0\0{\"__metadata__\":{}}  fake tensor bytes";
    FILE *f = fopen(file, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(bytes, 1, sizeof bytes - 1, f) == sizeof bytes - 1);
    fclose(f);
    snprintf(sql, sizeof sql,
             "INSERT INTO checkpoints (job_id, step, path, bytes, sha256, is_final) VALUES"
             " ('%s', 500, '%s/step500.safetensors', 10, 'aa', false),"
             " ('%s', 1000, '%s/final.safetensors', %zu, 'bb', true)",
             job1, job1, job1, job1, sizeof bytes - 1);
    PQclear(fbt_sql(&S, sql));
    snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", job1);
    r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "checkpoints");
    json_t *cks = json_object_get(r.json, "checkpoints");
    CHECK_INT_EQ(json_array_size(cks), 2);
    CHECK_INT_EQ(json_integer_value(json_object_get(json_array_get(cks, 1), "step")), 1000);
    CHECK(json_is_true(json_object_get(json_array_get(cks, 1), "final")));
    CHECK(json_object_get(json_array_get(cks, 0), "path") == NULL); /* server paths stay private */
    fbt_resp_free(&r);
    snprintf(path, sizeof path, "/v1/jobs/%s/model", job1);
    r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "model download");
    CHECK_INT_EQ(r.body_len, sizeof bytes - 1);
    CHECK(memcmp(r.body, bytes, sizeof bytes - 1) == 0);
    CHECK_STR_EQ(fbt_header(&r, "Content-Type"), "application/octet-stream");
    CHECK(strstr(fbt_header(&r, "Content-Disposition"), "first.safetensors") != NULL);
    fbt_resp_free(&r);
    /* a recorded path that escapes the artifacts directory is never served */
    snprintf(sql, sizeof sql,
             "INSERT INTO checkpoints (job_id, step, path, bytes, is_final) VALUES"
             " ('%s', 2000, '../../../../etc/passwd', 10, true)",
             job1);
    PQclear(fbt_sql(&S, sql));
    r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 404, "no_model", "model path escaping the artifacts directory");
    fbt_resp_free(&r);
}

static const char *sweep_body(const char *name, const char *search)
{
    static char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"name\": \"%s\", \"base\": {\"dataset\": \"fashion-mnist\", \"model\": {\"input\":"
             " [1, 28, 28], \"layers\": [{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\":"
             " 10}]}, \"batch_size\": 32, \"steps\": 200, \"optimizer\": {\"type\": \"adamw\","
             " \"lr\": 0.001}}, \"search\": %s, \"early_stopping\": {\"type\": \"asha\","
             " \"metric\": \"val_loss\", \"grace_steps\": 20}}",
             name, search);
    return buf;
}

static void test_sweeps(void)
{
    fbt_resp r = fbt_call(&S, "POST", "/v1/sweeps", alice_key,
                          sweep_body("grid", "{\"type\": \"grid\", \"params\": {\"optimizer.lr\":"
                                             " {\"values\": [0.001, 0.01]}, \"seed\":"
                                             " {\"values\": [1, 2, 3]}}}"));
    fbt_expect(&r, 201, NULL, "grid sweep");
    char id[64];
    snprintf(id, sizeof id, "%s", jstr(r.json, "id"));
    CHECK_INT_EQ(json_integer_value(json_object_get(r.json, "n_trials")), 6);
    json_t *trials = json_object_get(r.json, "trials");
    CHECK_INT_EQ(json_array_size(trials), 6);
    /* sorted paths, last fastest: optimizer.lr outer, seed inner */
    json_t *t4 = json_array_get(trials, 4);
    CHECK_NEAR(json_number_value(json_object_get(json_object_get(t4, "params"), "optimizer.lr")),
               0.01, 1e-12);
    CHECK_INT_EQ(json_integer_value(json_object_get(json_object_get(t4, "params"), "seed")), 2);
    CHECK_STR_EQ(jstr(t4, "name"), "grid-4");
    CHECK(json_is_null(json_object_get(r.json, "best_trial")));
    fbt_resp_free(&r);

    char path[256], sql[1024];
    snprintf(path, sizeof path, "/v1/jobs?sweep_id=%s&limit=200", id);
    r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "jobs of a sweep");
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "jobs")), 6);
    fbt_resp_free(&r);
    /* trial 2 reaches the lowest val_loss, trial 4 the lowest test_loss (far lower): the best
     * trial is chosen on validation, the test values are only reported */
    snprintf(sql, sizeof sql,
             "INSERT INTO job_metrics (job_id, step, val_loss, test_loss) SELECT j.id, s * 20,"
             " 1.0 + abs(j.trial_index - 2) + 1.0 / (s + 1),"
             " CASE WHEN s = 3 THEN 0.01 + abs(j.trial_index - 4) END"
             " FROM jobs j, generate_series(1, 3) s WHERE j.sweep_id = '%s'",
             id);
    PQclear(fbt_sql(&S, sql));
    snprintf(path, sizeof path, "/v1/sweeps/%s", id);
    r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "get sweep");
    CHECK_STR_EQ(jstr(json_object_get(r.json, "metric"), "name"), "val_loss");
    json_t *best = json_object_get(r.json, "best_trial");
    CHECK_INT_EQ(json_integer_value(json_object_get(best, "index")), 2);
    CHECK_NEAR(json_number_value(json_object_get(best, "value")), 1.25, 1e-12);
    json_t *b0 = json_object_get(json_array_get(json_object_get(r.json, "trials"), 0), "best");
    CHECK_INT_EQ(json_integer_value(json_object_get(b0, "step")), 60);
    CHECK_STR_EQ(jstr(r.json, "state"), "active");
    fbt_resp_free(&r);

    /* random search is deterministic in its seed */
    const char *random = "{\"type\": \"random\", \"count\": 5, \"seed\": 7, \"params\":"
                         " {\"optimizer.lr\": {\"distribution\": \"log_uniform\", \"low\": 1e-4,"
                         " \"high\": 1e-1}, \"optimizer.weight_decay\": {\"distribution\":"
                         " \"uniform\", \"low\": 0, \"high\": 0.1}, \"batch_size\":"
                         " {\"distribution\": \"choice\", \"values\": [16, 32]}, \"seed\":"
                         " {\"distribution\": \"int\", \"low\": 0, \"high\": 1000}}}";
    char *params[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        r = fbt_call(&S, "POST", "/v1/sweeps", alice_key,
                     sweep_body(k ? "rnd-b" : "rnd-a", random));
        fbt_expect(&r, 201, NULL, "random sweep");
        CHECK_INT_EQ(json_integer_value(json_object_get(r.json, "n_trials")), 5);
        json_t *ps = json_array();
        json_t *ts = json_object_get(r.json, "trials");
        for (size_t i = 0; i < json_array_size(ts); i++) {
            json_t *p = json_object_get(json_array_get(ts, i), "params");
            double lr = json_number_value(json_object_get(p, "optimizer.lr"));
            CHECK(lr >= 1e-4 && lr <= 1e-1);
            json_array_append(ps, p);
        }
        params[k] = json_dumps(ps, JSON_SORT_KEYS | JSON_COMPACT);
        json_decref(ps);
        fbt_resp_free(&r);
    }
    CHECK_STR_EQ(params[0], params[1]);
    free(params[0]);
    free(params[1]);

    r = fbt_call(&S, "GET", "/v1/sweeps?limit=2", alice_key, NULL);
    fbt_expect(&r, 200, NULL, "list sweeps");
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "sweeps")), 2);
    CHECK(json_is_string(json_object_get(r.json, "next_cursor")));
    fbt_resp_free(&r);

    snprintf(path, sizeof path, "/v1/sweeps/%s/cancel", id);
    r = fbt_call(&S, "POST", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "cancel sweep");
    CHECK_STR_EQ(jstr(r.json, "state"), "cancelled");
    CHECK_INT_EQ(
        json_integer_value(json_object_get(json_object_get(r.json, "jobs_by_state"), "cancelled")),
        6);
    fbt_resp_free(&r);

    r = fbt_call(&S, "POST", "/v1/sweeps", alice_key,
                 sweep_body("big",
                            "{\"type\": \"grid\", \"params\": {\"seed\": {\"values\": [1,2,"
                            "3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,"
                            "26,27,28,29,30,31,32]}, \"optimizer.lr\": {\"values\": [0.1,"
                            "0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1,1.2,1.3,1.4,1.5,1.6,1.7,"
                            "1.8,1.9,2.0,2.1,2.2,2.3,2.4,2.5,2.6,2.7,2.8,2.9,3.0,3.1,3.2]}}}"));
    fbt_expect(&r, 400, "too_many_trials", "a grid of 1024 points");
    fbt_resp_free(&r);
    r = fbt_call(&S, "POST", "/v1/sweeps", alice_key,
                 sweep_body("bad-lr", "{\"type\": \"grid\", \"params\": {\"optimizer.lr\":"
                                      " {\"values\": [0.01, 0]}}}"));
    fbt_expect(&r, 400, "out_of_range", "a trial with lr 0");
    CHECK_STR_EQ(jstr(json_object_get(r.json, "error"), "field"), "base.optimizer.lr");
    fbt_resp_free(&r);
    /* a test metric never decides: refused as the sweep's metric and as ASHA's, nothing made */
    static const char *const test_metric[][2] = {
        {"{\"name\": \"peek\", \"metric\": \"test_accuracy\", \"base\": {\"dataset\":"
         " \"fashion-mnist\", \"model\": {\"input\": [1, 28, 28], \"layers\": [{\"type\":"
         " \"flatten\"}, {\"type\": \"linear\", \"out\": 10}]}, \"batch_size\": 32, \"steps\":"
         " 200, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}, \"search\": {\"type\":"
         " \"grid\", \"params\": {\"seed\": {\"values\": [1, 2]}}}}",
         "metric"},
        {"{\"name\": \"peek2\", \"base\": {\"dataset\": \"fashion-mnist\", \"model\":"
         " {\"input\": [1, 28, 28], \"layers\": [{\"type\": \"flatten\"}, {\"type\":"
         " \"linear\", \"out\": 10}]}, \"batch_size\": 32, \"steps\": 200, \"optimizer\":"
         " {\"type\": \"sgd\", \"lr\": 0.1}}, \"search\": {\"type\": \"grid\", \"params\":"
         " {\"seed\": {\"values\": [1, 2]}}}, \"early_stopping\": {\"type\": \"asha\","
         " \"metric\": \"test_loss\"}}",
         "early_stopping.metric"},
    };
    const char *count = "SELECT count(*) FROM sweeps";
    PGresult *before = fbt_sql(&S, count);
    long n_before = strtol(PQgetvalue(before, 0, 0), NULL, 10);
    PQclear(before);
    for (size_t i = 0; i < sizeof test_metric / sizeof test_metric[0]; i++) {
        r = fbt_call(&S, "POST", "/v1/sweeps", alice_key, test_metric[i][0]);
        fbt_expect(&r, 400, "bad_enum", "a sweep deciding on a test metric");
        CHECK_STR_EQ(jstr(json_object_get(r.json, "error"), "field"), test_metric[i][1]);
        CHECK(strstr(jstr(json_object_get(r.json, "error"), "message"), "test split") != NULL);
        fbt_resp_free(&r);
    }
    PGresult *after = fbt_sql(&S, count);
    CHECK_INT_EQ(strtol(PQgetvalue(after, 0, 0), NULL, 10), n_before);
    PQclear(after);
}

/* The array with this id in a /v1/cluster answer; fails the test without it. */
static json_t *array_by_id(json_t *cluster, const char *id)
{
    json_t *all = json_object_get(cluster, "arrays");
    for (size_t i = 0; i < json_array_size(all); i++)
        if (strcmp(jstr(json_array_get(all, i), "id"), id) == 0) return json_array_get(all, i);
    fprintf(stderr, "array %s is not in the answer\n", id);
    CHECK(0);
    return NULL;
}

/* The arrays in the cluster (as the control loop records them): two on one
 * device, one of them shared by two tenants.  Everyone sees every array that
 * is not finished; a tenant sees itself among an array's tenants and only a
 * count of the others, the admin sees them all. */
static void test_cluster_arrays(void)
{
    char bob_id[64], sql[1024];
    snprintf(bob_id, sizeof bob_id, "%s",
             fbt_sql_value(&S, "SELECT id FROM tenants WHERE name = 'bob'"));
    const char *shared = "00000000-0000-4000-8000-0000000000a1";
    const char *bobs = "00000000-0000-4000-8000-0000000000a2";
    snprintf(sql, sizeof sql,
             "INSERT INTO groups (id, fusion_key, state, worker_id, n_members, tenant_ids,"
             " device_idx, time_share, samples_per_s, breakdown, created_at) VALUES"
             " ('%s', 'k1', 'running', '00000000-0000-4000-8000-000000000001', 2,"
             " ARRAY['%s', '%s']::uuid[], '{0}', 0.5, 120.5, '{\"compute_ms\": 3, \"comm_ms\": 0,"
             " \"io_ms\": 0.5, \"idle_ms\": 2}', now() - interval '1 minute'),"
             " ('%s', 'k2', 'scheduled', '00000000-0000-4000-8000-000000000001', 1,"
             " ARRAY['%s']::uuid[], '{0}', 0.5, NULL, NULL, now()),"
             " ('00000000-0000-4000-8000-0000000000a3', 'k3', 'finished',"
             " '00000000-0000-4000-8000-000000000001', 0, ARRAY['%s']::uuid[], '{1}', 1, 9, NULL,"
             " now())",
             shared, alice_id, bob_id, bobs, bob_id, alice_id);
    PQclear(fbt_sql(&S, sql));

    /* per device: the arrays placed there, oldest first; a finished one is gone */
    fbt_resp r = fbt_call(&S, "GET", "/v1/workers", alice_key, NULL);
    fbt_expect(&r, 200, NULL, "workers with arrays");
    json_t *w = json_array_get(json_object_get(r.json, "workers"), 0);
    CHECK_STR_EQ(jstr(w, "backend"), "cpu");
    json_t *d0 = json_array_get(json_object_get(w, "devices"), 0);
    json_t *d1 = json_array_get(json_object_get(w, "devices"), 1);
    CHECK(json_is_true(json_object_get(d0, "busy")));
    CHECK(json_is_false(json_object_get(d1, "busy")));
    CHECK_INT_EQ(json_array_size(json_object_get(d1, "arrays")), 0);
    json_t *on0 = json_object_get(d0, "arrays");
    CHECK_INT_EQ(json_array_size(on0), 2);
    CHECK_STR_EQ(jstr(json_array_get(on0, 0), "id"), shared);
    CHECK_STR_EQ(jstr(json_array_get(on0, 1), "id"), bobs);
    CHECK_INT_EQ(json_integer_value(json_object_get(json_array_get(on0, 0), "members")), 2);
    CHECK_NEAR(json_number_value(json_object_get(json_array_get(on0, 1), "time_share")), 0.5,
               1e-12);
    CHECK_STR_EQ(jstr(json_array_get(on0, 1), "state"), "scheduled");
    fbt_resp_free(&r);

    /* alice: both arrays, herself in the shared one, bob only as a count */
    r = fbt_call(&S, "GET", "/v1/cluster", alice_key, NULL);
    fbt_expect(&r, 200, NULL, "cluster arrays (tenant)");
    CHECK(strstr(r.body, bob_id) == NULL && strstr(r.body, "\"bob\"") == NULL);
    CHECK_INT_EQ(json_integer_value(json_object_get(json_object_get(r.json, "devices"), "busy")),
                 1);
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "arrays")), 2);
    json_t *a = array_by_id(r.json, shared);
    CHECK_STR_EQ(jstr(a, "worker"), "node-a");
    CHECK_STR_EQ(jstr(a, "worker_id"), "00000000-0000-4000-8000-000000000001");
    CHECK_STR_EQ(jstr(a, "state"), "running");
    CHECK_INT_EQ(json_array_size(json_object_get(a, "devices")), 1);
    CHECK_INT_EQ(json_integer_value(json_array_get(json_object_get(a, "devices"), 0)), 0);
    CHECK_INT_EQ(json_integer_value(json_object_get(a, "members")), 2);
    CHECK_INT_EQ(json_array_size(json_object_get(a, "tenants")), 1);
    CHECK_STR_EQ(jstr(json_array_get(json_object_get(a, "tenants"), 0), "name"), "alice");
    CHECK_STR_EQ(jstr(json_array_get(json_object_get(a, "tenants"), 0), "tenant_id"), alice_id);
    CHECK_INT_EQ(json_integer_value(json_object_get(a, "other_tenants")), 1);
    CHECK_NEAR(json_number_value(json_object_get(a, "time_share")), 0.5, 1e-12);
    CHECK_NEAR(json_number_value(json_object_get(a, "samples_per_s")), 120.5, 1e-12);
    CHECK_NEAR(json_number_value(json_object_get(json_object_get(a, "breakdown"), "idle_ms")), 2,
               1e-12);
    a = array_by_id(r.json, bobs);
    CHECK_INT_EQ(json_array_size(json_object_get(a, "tenants")), 0);
    CHECK_INT_EQ(json_integer_value(json_object_get(a, "other_tenants")), 1);
    CHECK(json_is_null(json_object_get(a, "samples_per_s")));
    CHECK(json_is_null(json_object_get(a, "breakdown")));
    json_t *t = json_array_get(json_object_get(r.json, "tenants"), 0);
    CHECK_INT_EQ(json_integer_value(json_object_get(t, "devices_in_use")), 1);
    fbt_resp_free(&r);

    /* the admin: every tenant by name */
    r = fbt_call(&S, "GET", "/v1/cluster", S.admin_key, NULL);
    fbt_expect(&r, 200, NULL, "cluster arrays (admin)");
    a = array_by_id(r.json, shared);
    CHECK_INT_EQ(json_array_size(json_object_get(a, "tenants")), 2);
    CHECK_STR_EQ(jstr(json_array_get(json_object_get(a, "tenants"), 0), "name"), "alice");
    CHECK_STR_EQ(jstr(json_array_get(json_object_get(a, "tenants"), 1), "name"), "bob");
    CHECK_INT_EQ(json_integer_value(json_object_get(a, "other_tenants")), 0);
    json_t *bob_row = NULL, *rows = json_object_get(r.json, "tenants");
    for (size_t i = 0; i < json_array_size(rows); i++)
        if (strcmp(jstr(json_array_get(rows, i), "name"), "bob") == 0)
            bob_row = json_array_get(rows, i);
    CHECK(bob_row != NULL);
    CHECK_INT_EQ(json_integer_value(json_object_get(bob_row, "devices_in_use")), 1);
    fbt_resp_free(&r);

    /* a query parameter these views do not take is refused */
    r = fbt_call(&S, "GET", "/v1/cluster?tenant=bob", alice_key, NULL);
    fbt_expect(&r, 400, "bad_query", "cluster with a query");
    fbt_resp_free(&r);
    r = fbt_call(&S, "GET", "/v1/workers?all=1", alice_key, NULL);
    fbt_expect(&r, 400, "bad_query", "workers with a query");
    fbt_resp_free(&r);

    /* finished arrays leave the views and free their devices */
    PQclear(fbt_sql(&S, "UPDATE groups SET state = 'finished' WHERE fusion_key IN ('k1', 'k2')"));
    r = fbt_call(&S, "GET", "/v1/cluster", S.admin_key, NULL);
    fbt_expect(&r, 200, NULL, "cluster after the arrays finished");
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "arrays")), 0);
    CHECK_INT_EQ(json_integer_value(json_object_get(json_object_get(r.json, "devices"), "busy")),
                 0);
    fbt_resp_free(&r);
}

static void test_cluster(void)
{
    fbt_resp r = fbt_call(&S, "GET", "/v1/workers", alice_key, NULL);
    fbt_expect(&r, 200, NULL, "workers (none)");
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "workers")), 0);
    fbt_resp_free(&r);
    PQclear(fbt_sql(&S, "INSERT INTO workers (id, name) VALUES"
                        " ('00000000-0000-4000-8000-000000000001', 'node-a')"));
    PQclear(fbt_sql(&S, "INSERT INTO devices (worker_id, idx, kind, name, memory_bytes,"
                        " utilization) VALUES ('00000000-0000-4000-8000-000000000001', 0, 'cpu',"
                        " 'cpu0', 1024, 0.5), ('00000000-0000-4000-8000-000000000001', 1, 'cpu',"
                        " 'cpu1', 1024, 0.25)"));
    char sql[256];
    snprintf(sql, sizeof sql, "UPDATE jobs SET state = 'running', slowdown = 1.5 WHERE id = '%s'",
             job1);
    PQclear(fbt_sql(&S, sql));
    r = fbt_call(&S, "GET", "/v1/workers", alice_key, NULL);
    fbt_expect(&r, 200, NULL, "workers");
    json_t *w = json_array_get(json_object_get(r.json, "workers"), 0);
    CHECK_STR_EQ(jstr(w, "name"), "node-a");
    CHECK_INT_EQ(json_array_size(json_object_get(w, "devices")), 2);
    fbt_resp_free(&r);
    r = fbt_call(&S, "GET", "/v1/cluster", alice_key, NULL);
    fbt_expect(&r, 200, NULL, "cluster");
    CHECK_INT_EQ(json_integer_value(json_object_get(json_object_get(r.json, "devices"), "total")),
                 2);
    CHECK_NEAR(json_number_value(json_object_get(r.json, "utilization")), 0.375, 1e-9);
    CHECK_NEAR(json_number_value(json_object_get(json_object_get(r.json, "slowdown"), "max")), 1.5,
               1e-12);
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "tenants")), 1); /* only herself */
    fbt_resp_free(&r);
    r = fbt_call(&S, "GET", "/v1/cluster", S.admin_key, NULL);
    fbt_expect(&r, 200, NULL, "cluster (admin)");
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "tenants")), 3);
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "arrays")), 0);
    fbt_resp_free(&r);
    test_cluster_arrays();
}

static void test_prometheus(void)
{
    fbt_resp r = fbt_call(&S, "GET", "/metrics", NULL, NULL);
    fbt_expect(&r, 200, NULL, "metrics");
    CHECK(strncmp(fbt_header(&r, "Content-Type"), "text/plain; version=0.0.4", 25) == 0);
    CHECK(strstr(r.body,
                 "fusebox_http_requests_total{route=\"/v1/jobs\",method=\"POST\",code=\"201\"}"));
    CHECK(strstr(r.body, "fusebox_http_request_duration_seconds_bucket{route=\"/v1/jobs/{id}\""));
    CHECK(strstr(r.body, "fusebox_errors_total{code=\"idempotency_conflict\",status=\"422\"} 1"));
    CHECK(strstr(r.body, "fusebox_jobs{state=\"queued\"}"));
    CHECK(strstr(r.body, "fusebox_queue_depth "));
    CHECK(strstr(r.body, "fusebox_database_up 1"));
    fbt_resp_free(&r);
}

/* A request whose body is still arriving when SIGTERM comes is served. */
/* Every precision of the contract is taken and kept, bf16 included (it was refused until
 * the engine trained it), and a bf16 job is its own fusion key, apart from the same job in
 * fp32: their arrays round differently, so they must never be fused. */
static void test_precision(void)
{
    char fp32[1200], bf16[1200], key32[40] = "";
    snprintf(fp32, sizeof fp32, "%s", fbt_spec("precise", 0.01));
    snprintf(bf16, sizeof bf16, "%.*s, \"precision\": \"bf16\"}", (int)strlen(fp32) - 1, fp32);
    fbt_resp r = fbt_call(&S, "POST", "/v1/jobs", alice_key, fp32);
    fbt_expect(&r, 201, NULL, "submit fp32");
    snprintf(key32, sizeof key32, "%s", jstr(r.json, "fusion_key"));
    fbt_resp_free(&r);
    r = fbt_call(&S, "POST", "/v1/jobs", alice_key, bf16);
    fbt_expect(&r, 201, NULL, "submit bf16");
    CHECK_STR_EQ(jstr(json_object_get(r.json, "spec"), "precision"), "bf16");
    CHECK_INT_EQ(strlen(jstr(r.json, "fusion_key")), 32);
    CHECK(strcmp(jstr(r.json, "fusion_key"), key32) != 0);
    char path[200];
    snprintf(path, sizeof path, "/v1/jobs/%s", jstr(r.json, "id"));
    fbt_resp_free(&r);
    r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "get bf16 job");
    CHECK_STR_EQ(jstr(json_object_get(r.json, "spec"), "precision"), "bf16");
    fbt_resp_free(&r);
}

static void test_graceful_shutdown(void)
{
    const char *body = fbt_spec("in-flight", 0.05);
    size_t len = strlen(body), half = len / 2;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)S.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    char head[512];
    int n = snprintf(head, sizeof head,
                     "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     alice_key, len);
    CHECK(send(fd, head, (size_t)n, MSG_NOSIGNAL) == n);
    CHECK(send(fd, body, half, MSG_NOSIGNAL) == (ssize_t)half);
    usleep(300 * 1000);
    kill(S.pid, SIGTERM);
    usleep(300 * 1000);
    /* new connections are refused while draining */
    fbt_resp r;
    int rc = fbt_http(S.port, "GET", "/healthz", NULL, NULL, 0, &r);
    CHECK(rc != 0 || r.status == 503 || r.status == 200);
    fbt_resp_free(&r);
    CHECK(send(fd, body + half, len - half, MSG_NOSIGNAL) == (ssize_t)(len - half));
    char buf[8192];
    size_t got = 0;
    ssize_t k;
    while ((k = recv(fd, buf + got, sizeof buf - 1 - got, 0)) > 0)
        got += (size_t)k;
    buf[got] = '\0';
    close(fd);
    if (strncmp(buf, "HTTP/1.1 201", 12) != 0) {
        fprintf(stderr, "in-flight request got: %s\n", buf);
        fbt_server_dump_log(&S);
        abort();
    }
    S.pid = S.pid; /* still ours to reap */
    int status = fbt_server_stop(&S);
    CHECK_INT_EQ(status, 0);
    CHECK_STR_EQ(fbt_sql_value(&S, "SELECT count(*) FROM jobs WHERE name = 'in-flight'"), "1");
}

static void test_restart(void)
{
    char key_before[128];
    snprintf(key_before, sizeof key_before, "%s", S.admin_key);
    fbt_server_start(&S, NULL);
    CHECK_STR_EQ(S.admin_key, key_before);
    char n_schema[16];
    snprintf(n_schema, sizeof n_schema, "%d", schema_files());
    CHECK_STR_EQ(fbt_sql_value(&S, "SELECT count(*) FROM schema_migrations"), n_schema);
    CHECK_STR_EQ(fbt_sql_value(&S, "SELECT count(*) FROM tenants WHERE is_admin"), "1");
    char path[200];
    snprintf(path, sizeof path, "/v1/jobs/%s", job1);
    fbt_resp r = fbt_call(&S, "GET", path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "job survives a restart");
    fbt_resp_free(&r);
    CHECK_INT_EQ(fbt_server_stop(&S), 0);
}

int main(void)
{
    fbt_require_database();
    fbt_db_create(&S);
    const char *args[] = {"--max-body-bytes", "65536", NULL};
    fbt_server_start(&S, args);
    test_health();
    test_admin_key_file();
    test_tenants();
    test_keys();
    test_jobs();
    test_metrics_series();
    test_checkpoints_model();
    test_sweeps();
    test_cluster();
    test_prometheus();
    test_precision();
    test_graceful_shutdown();
    test_restart();
    fbt_db_drop(&S);
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("ok\n");
    return 0;
}
