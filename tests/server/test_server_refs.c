/*
 * What a job or sweep spec names beyond itself, against a real fuseboxd and
 * PostgreSQL: its dataset and its init weights.  A spec may name only a
 * dataset the tenant registered or a public one (the built-ins and the
 * server's --public-datasets), and init only as the service's form naming
 * one of the tenant's own jobs that has the weights asked for.  A table of
 * bad references, for jobs and for sweeps, each answered 4xx with the code
 * and the field, the database unchanged after every one; then the good
 * ones, each resolved to the right artifact under the tenant's own
 * directory (jobs.init_path), and the rows a tampered checkpoint path would
 * lead outside the tenant refused.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "harness.h"

static fbt_server S;
static char alice_id[64], alice_key[128], bob_id[64], bob_key[128];
static char a_done[64], a_queued[64], a_tampered[64], b_done[64];

#define MODEL                                                                                      \
    "\"model\": {\"input\": [1, 28, 28], \"layers\": [{\"type\": \"flatten\"}, {\"type\":"         \
    " \"linear\", \"out\": 10}]}"

/* A job spec on dataset ds with extra members (init). */
static const char *spec(const char *ds, const char *extra)
{
    static char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"dataset\": \"%s\", " MODEL ", \"batch_size\": 32, \"steps\": 100,"
             " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}%s}",
             ds, extra);
    return buf;
}

/* Replaces {D} (alice's completed job), {Q} (her queued job), {T} (her job whose
 * checkpoint row was tampered with), {B} (bob's completed job). */
static void fill(const char *in, char *out, size_t cap)
{
    const char *const vals[] = {a_done, a_queued, a_tampered, b_done};
    fbt_fill(in, out, cap, "DQTB", vals);
}

typedef struct ref_case {
    const char *what;
    const char *dataset;
    const char *extra; /* more spec members, {X} filled */
    int status;
    const char *code;
    const char *field; /* without the sweep's "base." */
} ref_case;

static const ref_case bad[] = {
    /* datasets: a name must be the tenant's own or public */
    {"dataset .", ".", "", 400, "bad_name", "dataset"},
    {"dataset ..", "..", "", 400, "bad_name", "dataset"},
    {"dataset hidden", ".import-1", "", 400, "bad_name", "dataset"},
    {"dataset unregistered", "cifar10", "", 400, "unknown_reference", "dataset"},
    {"dataset a tenant id", "00000000-0000-4000-8000-000000000000", "", 400, "unknown_reference",
     "dataset"},
    {"dataset of another tenant", "bobs-data", "", 400, "unknown_reference", "dataset"},
    /* init: a path in any form is fusebox-train's, never the service's */
    {"init absolute path", "fashion-mnist", ", \"init\": \"/etc/passwd\"", 400, "wrong_type",
     "init"},
    {"init relative path", "fashion-mnist", ", \"init\": \"w.safetensors\"", 400, "wrong_type",
     "init"},
    {"init artifact path", "fashion-mnist", ", \"init\": \"{B}/model.safetensors\"", 400,
     "wrong_type", "init"},
    {"init number", "fashion-mnist", ", \"init\": 3", 400, "wrong_type", "init"},
    /* init: the job must be the tenant's and have the weights */
    {"init another tenant's job", "fashion-mnist", ", \"init\": {\"job\": \"{B}\"}", 400,
     "unknown_reference", "init.job"},
    {"init another tenant's checkpoint", "fashion-mnist",
     ", \"init\": {\"job\": \"{B}\", \"checkpoint\": 50}", 400, "unknown_reference", "init.job"},
    {"init no such job", "fashion-mnist",
     ", \"init\": {\"job\": \"0b6e1c2a-3f4d-4e5f-8a9b-0c1d2e3f4a5b\"}", 400, "unknown_reference",
     "init.job"},
    {"init job not a uuid", "fashion-mnist", ", \"init\": {\"job\": \"../../etc\"}", 400,
     "bad_name", "init.job"},
    {"init job without a model", "fashion-mnist", ", \"init\": {\"job\": \"{Q}\"}", 400,
     "unknown_reference", "init.checkpoint"},
    {"init job without weights", "fashion-mnist",
     ", \"init\": {\"job\": \"{Q}\", \"checkpoint\": \"latest\"}", 400, "unknown_reference",
     "init.checkpoint"},
    {"init no checkpoint at that step", "fashion-mnist",
     ", \"init\": {\"job\": \"{D}\", \"checkpoint\": 51}", 400, "unknown_reference",
     "init.checkpoint"},
    {"init checkpoint word", "fashion-mnist",
     ", \"init\": {\"job\": \"{D}\", \"checkpoint\": \"best\"}", 400, "bad_enum",
     "init.checkpoint"},
    {"init unknown field", "fashion-mnist",
     ", \"init\": {\"job\": \"{D}\", \"path\": \"/etc/passwd\"}", 400, "unknown_field", NULL},
    {"init row leading to another tenant", "fashion-mnist", ", \"init\": {\"job\": \"{T}\"}", 400,
     "unknown_reference", "init.checkpoint"},
    {"init row leaving the tenant", "fashion-mnist",
     ", \"init\": {\"job\": \"{T}\", \"checkpoint\": 20}", 400, "unknown_reference",
     "init.checkpoint"},
};
#define N_BAD ((int)(sizeof bad / sizeof bad[0]))

static void post_bad(const ref_case *c, bool sweep, const char *baseline)
{
    char extra[512], body[4096], what[200], field[64];
    fill(c->extra, extra, sizeof extra);
    const char *js = spec(c->dataset, extra);
    if (sweep)
        snprintf(body, sizeof body,
                 "{\"base\": %s, \"search\": {\"type\": \"grid\", \"params\": {\"seed\":"
                 " {\"values\": [1, 2]}}}}",
                 js);
    else
        snprintf(body, sizeof body, "%s", js);
    snprintf(what, sizeof what, "%s (%s)", c->what, sweep ? "sweep" : "job");
    fbt_resp r = fbt_call(&S, "POST", sweep ? "/v1/sweeps" : "/v1/jobs", alice_key, body);
    fbt_expect(&r, c->status, c->code, what);
    if (c->field) {
        snprintf(field, sizeof field, "%s%s", sweep ? "base." : "", c->field);
        const char *f =
            json_string_value(json_object_get(json_object_get(r.json, "error"), "field"));
        if (!f || strcmp(f, field) != 0) {
            fprintf(stderr, "%s: expected field %s, got %s\n%s\n", what, field, f ? f : "(none)",
                    r.body);
            abort();
        }
    }
    fbt_resp_free(&r);
    char *now = fbt_db_fingerprint(&S);
    if (strcmp(now, baseline) != 0) {
        fprintf(stderr, "%s changed the database\n", what);
        abort();
    }
    free(now);
    printf("ok %-5s %d %-18s %s\n", sweep ? "sweep" : "job", c->status, c->code, c->what);
}

/* Submits a good job and returns the init_path its row holds ("" for NULL). */
static char last_good[64];

static const char *post_good(const char *ds, const char *extra_in)
{
    char extra[512], sql[256];
    static char path[512];
    fill(extra_in, extra, sizeof extra);
    fbt_resp r = fbt_call(&S, "POST", "/v1/jobs", alice_key, spec(ds, extra));
    fbt_expect(&r, 201, NULL, extra_in);
    const char *id = json_string_value(json_object_get(r.json, "id"));
    snprintf(last_good, sizeof last_good, "%s", id);
    snprintf(sql, sizeof sql, "SELECT coalesce(init_path, '') FROM jobs WHERE id = '%s'", id);
    snprintf(path, sizeof path, "%s", fbt_sql_value(&S, sql));
    fbt_resp_free(&r);
    return path;
}

static void add_checkpoint(const char *job, int step, const char *kind, bool final,
                           const char *path)
{
    char sql[1024];
    snprintf(sql, sizeof sql,
             "INSERT INTO checkpoints (job_id, step, path, bytes, kind, is_final)"
             " VALUES ('%s', %d, '%s', 100, '%s', %s)",
             job, step, path, kind, final ? "true" : "false");
    PQclear(fbt_sql(&S, sql));
}

int main(void)
{
    fbt_require_database();
    fbt_db_create(&S);
    const char *args[] = {"--public-datasets", "synth,shared-set", NULL};
    fbt_server_start(&S, args);
    const char *rl = "\"rate_limit\": {\"requests_per_second\": 1000, \"burst\": 1000}";
    fbt_tenant(&S, "alice", rl, alice_id, sizeof alice_id, alice_key, sizeof alice_key);
    fbt_tenant(&S, "bob", rl, bob_id, sizeof bob_id, bob_key, sizeof bob_key);

    /* alice: a completed job with a final model and checkpoints at 50 (state and model), a
     * queued one, and one whose rows were tampered with to lead into bob's directory */
    char path[512], sql[512];
    snprintf(a_done, sizeof a_done, "%s", fbt_job(&S, alice_key, "done"));
    snprintf(a_queued, sizeof a_queued, "%s", fbt_job(&S, alice_key, "queued"));
    snprintf(a_tampered, sizeof a_tampered, "%s", fbt_job(&S, alice_key, "tampered"));
    snprintf(b_done, sizeof b_done, "%s", fbt_job(&S, bob_key, "bobs"));
    snprintf(sql, sizeof sql, "UPDATE jobs SET state = 'completed' WHERE id IN ('%s', '%s', '%s')",
             a_done, a_tampered, b_done);
    PQclear(fbt_sql(&S, sql));
    char final_path[300], state50[300], model50[300];
    snprintf(final_path, sizeof final_path, "%s/%s/model.safetensors", alice_id, a_done);
    snprintf(state50, sizeof state50, "%s/%s/state-50.safetensors", alice_id, a_done);
    snprintf(model50, sizeof model50, "%s/%s/model-50.safetensors", alice_id, a_done);
    add_checkpoint(a_done, 50, "state", false, state50);
    add_checkpoint(a_done, 50, "model", false, model50);
    add_checkpoint(a_done, 100, "model", true, final_path);
    snprintf(path, sizeof path, "%s/%s/model.safetensors", bob_id, b_done);
    add_checkpoint(b_done, 50, "state", false, path);
    add_checkpoint(b_done, 100, "model", true, path);
    add_checkpoint(a_tampered, 100, "model", true, path); /* bob's file */
    snprintf(path, sizeof path, "%s/../%s/%s/model.safetensors", alice_id, bob_id, b_done);
    add_checkpoint(a_tampered, 20, "state", false, path);
    /* bob's own dataset, and alice's alias of a built-in */
    snprintf(sql, sizeof sql,
             "INSERT INTO datasets (tenant_id, name, source, state, bytes, manifest)"
             " VALUES ('%s', 'bobs-data', 'builtin', 'ready', 0, '{\"builtin\": \"mnist\"}')",
             bob_id);
    PQclear(fbt_sql(&S, sql));
    snprintf(sql, sizeof sql,
             "INSERT INTO datasets (tenant_id, name, source, state, bytes, manifest)"
             " VALUES ('%s', 'my-fm', 'builtin', 'ready', 0, '{\"builtin\": \"fashion-mnist\"}')",
             alice_id);
    PQclear(fbt_sql(&S, sql));

    char *baseline = fbt_db_fingerprint(&S);
    for (int i = 0; i < N_BAD; i++) {
        post_bad(&bad[i], false, baseline);
        post_bad(&bad[i], true, baseline);
    }
    free(baseline);
    printf("%d bad references refused for jobs and sweeps, database unchanged\n", N_BAD);

    /* the good ones resolve inside alice's own artifacts */
    CHECK_STR_EQ(post_good("fashion-mnist", ", \"init\": {\"job\": \"{D}\"}"), final_path);
    CHECK_STR_EQ(post_good("fashion-mnist", ", \"init\": {\"job\": \"{D}\", \"checkpoint\": "
                                            "\"final\"}"),
                 final_path);
    CHECK_STR_EQ(post_good("fashion-mnist", ", \"init\": {\"job\": \"{D}\", \"checkpoint\": "
                                            "\"latest\"}"),
                 final_path);
    CHECK_STR_EQ(post_good("fashion-mnist", ", \"init\": {\"job\": \"{D}\", \"checkpoint\": 50}"),
                 state50);
    /* the job shows init as written */
    char job_path[128];
    snprintf(job_path, sizeof job_path, "/v1/jobs/%s", last_good);
    fbt_resp r = fbt_call(&S, "GET", job_path, alice_key, NULL);
    fbt_expect(&r, 200, NULL, "job");
    json_t *init = json_object_get(json_object_get(r.json, "spec"), "init");
    CHECK_STR_EQ(json_string_value(json_object_get(init, "job")), a_done);
    CHECK_INT_EQ(json_integer_value(json_object_get(init, "checkpoint")), 50);
    fbt_resp_free(&r);
    CHECK_STR_EQ(post_good("fashion-mnist", ""), "");
    CHECK_STR_EQ(post_good("mnist", ""), "");
    CHECK_STR_EQ(post_good("my-fm", ""), "");
    CHECK_STR_EQ(post_good("synth", ""), "");
    CHECK_STR_EQ(post_good("shared-set", ""), "");
    /* a sweep resolves every trial's init */
    char extra[256], body[4096];
    fill(", \"init\": {\"job\": \"{D}\", \"checkpoint\": 50}", extra, sizeof extra);
    snprintf(body, sizeof body,
             "{\"base\": %s, \"search\": {\"type\": \"grid\", \"params\": {\"seed\":"
             " {\"values\": [1, 2, 3]}}}}",
             spec("my-fm", extra));
    r = fbt_call(&S, "POST", "/v1/sweeps", alice_key, body);
    fbt_expect(&r, 201, NULL, "sweep with init");
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM jobs WHERE sweep_id = '%s' AND init_path = '%s'",
             json_string_value(json_object_get(r.json, "id")), state50);
    CHECK_STR_EQ(fbt_sql_value(&S, sql), "3");
    fbt_resp_free(&r);

    CHECK_INT_EQ(fbt_server_stop(&S), 0);
    fbt_db_drop(&S);
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("ok\n");
    return 0;
}
