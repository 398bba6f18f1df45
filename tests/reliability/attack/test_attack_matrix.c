/*
 * The isolation matrix: every operation of api/openapi.yaml against a real
 * fuseboxd, called as five callers -- tenant A on its own objects, tenant B
 * on A's objects, A's revoked key, no key, and the admin.  Each cell has an
 * expected status: 404 (not_found) for another tenant's ids, exactly like an
 * id that does not exist; 401 (unauthorized) for a revoked key and for no
 * key; 403 (forbidden) for a tenant's key on an admin route.  Every refused
 * request, and every GET, leaves the database fingerprint unchanged.
 *
 * The rows are checked against the paths and methods of openapi.yaml in
 * both directions, so that an endpoint added to the API without a row here
 * fails this test.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"

enum caller { OWN, OTHER, REVOKED, NOKEY, ADMIN, N_CALLERS };
static const char *const caller_name[N_CALLERS] = {"own tenant", "other tenant", "revoked key",
                                                   "no key", "admin"};

/* What the objects a row names are, so that a destructive row gets a fresh
 * object for the callers allowed to destroy it. */
enum fresh { KEEP, FRESH_JOB, FRESH_SWEEP, FRESH_KEY, FRESH_DATASET, FRESH_WORKER_KEY };

typedef struct row {
    const char *method;
    const char *path;  /* openapi.yaml's form; {id} is the object of the path's collection */
    const char *query; /* appended to the path, or NULL */
    const char *body;  /* JSON, or a CSV for PUT, or NULL */
    bool public_route; /* no key needed */
    int own, other, admin;
    enum fresh fresh;
} row;

#define SPEC_BODY NULL /* replaced by a valid job spec */
#define SWEEP_BODY                                                                                 \
    "{\"name\": \"m-sweep\", \"base\": {\"dataset\": \"fashion-mnist\", \"model\": {\"input\":"    \
    " [4], \"layers\": [{\"type\": \"linear\", \"out\": 2}]}, \"batch_size\": 8, \"steps\":"       \
    " 10, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}, \"search\": {\"type\": \"grid\","      \
    " \"params\": {\"seed\": {\"values\": [1, 2]}}}}"
#define CSV_BODY "x,y\n1,0\n2,1\n3,0\n"
#define WORKER_KEY_BODY NULL /* replaced by a new worker public key */

/* Statuses: own tenant, other tenant (on A's ids), admin (on A's ids).  The
 * revoked key and no key answer 401 on every route that needs a key. */
static const row rows[] = {
    {"GET", "/healthz", NULL, NULL, true, 200, 200, 200, KEEP},
    {"GET", "/readyz", NULL, NULL, true, 200, 200, 200, KEEP},
    {"GET", "/metrics", NULL, NULL, true, 200, 200, 200, KEEP},
    {"GET", "/", NULL, NULL, true, 200, 200, 200, KEEP},
    {"GET", "/static/{file}", NULL, NULL, true, 200, 200, 200, KEEP},

    {"POST", "/v1/tenants", NULL, "{\"name\": \"%s\"}", false, 403, 403, 201, KEEP},
    {"GET", "/v1/tenants", NULL, NULL, false, 403, 403, 200, KEEP},
    {"GET", "/v1/tenant", NULL, NULL, false, 200, 200, 200, KEEP},
    {"GET", "/v1/tenants/{id}", NULL, NULL, false, 200, 404, 200, KEEP},
    {"PATCH", "/v1/tenants/{id}", NULL, "{\"weight\": 3}", false, 403, 403, 200, KEEP},
    {"POST", "/v1/tenants/{id}/keys", NULL, "{\"name\": \"m\"}", false, 201, 404, 201, KEEP},
    {"GET", "/v1/tenants/{id}/keys", NULL, NULL, false, 200, 404, 200, KEEP},
    {"DELETE", "/v1/tenants/{id}/keys/{key_id}", NULL, NULL, false, 200, 404, 200, FRESH_KEY},

    {"POST", "/v1/jobs", NULL, SPEC_BODY, false, 201, 201, 201, KEEP},
    {"GET", "/v1/jobs", NULL, NULL, false, 200, 200, 200, KEEP},
    {"GET", "/v1/jobs/{id}", NULL, NULL, false, 200, 404, 404, KEEP},
    {"POST", "/v1/jobs/{id}/cancel", NULL, NULL, false, 200, 404, 404, FRESH_JOB},
    {"GET", "/v1/jobs/{id}/metrics", NULL, NULL, false, 200, 404, 404, KEEP},
    {"GET", "/v1/jobs/{id}/events", NULL, NULL, false, 200, 404, 404, KEEP},
    {"GET", "/v1/jobs/{id}/checkpoints", NULL, NULL, false, 200, 404, 404, KEEP},
    /* A's queued job has no model yet: its own 404 is no_model, not not_found */
    {"GET", "/v1/jobs/{id}/model", NULL, NULL, false, 404, 404, 404, KEEP},

    {"POST", "/v1/sweeps", NULL, SWEEP_BODY, false, 201, 201, 201, KEEP},
    {"GET", "/v1/sweeps", NULL, NULL, false, 200, 200, 200, KEEP},
    {"GET", "/v1/sweeps/{id}", NULL, NULL, false, 200, 404, 404, KEEP},
    {"POST", "/v1/sweeps/{id}/cancel", NULL, NULL, false, 200, 404, 404, FRESH_SWEEP},

    {"POST", "/v1/datasets", NULL,
     "{\"name\": \"%s\", \"source\": \"import\", \"path\": \"/etc\", \"format\": \"idx\"}", false,
     403, 403, 403, KEEP},
    {"GET", "/v1/datasets", NULL, NULL, false, 200, 200, 200, KEEP},
    {"GET", "/v1/datasets/{name}", NULL, NULL, false, 200, 404, 404, KEEP},
    {"DELETE", "/v1/datasets/{name}", NULL, NULL, false, 200, 404, 404, FRESH_DATASET},
    /* a first upload creates the dataset in the caller's own namespace: B and
     * the admin get a dataset of their own of that name, never A's */
    {"PUT", "/v1/datasets/{name}/splits/{split}", "label_column=y", CSV_BODY, false, 202, 202, 202,
     FRESH_DATASET},

    {"GET", "/v1/workers", NULL, NULL, false, 200, 200, 200, KEEP},
    /* the workers' allow-list is the operator's: no tenant reads or changes it */
    {"POST", "/v1/workers/keys", NULL, WORKER_KEY_BODY, false, 403, 403, 201, KEEP},
    {"GET", "/v1/workers/keys", NULL, NULL, false, 403, 403, 200, KEEP},
    {"DELETE", "/v1/workers/keys/{id}", NULL, NULL, false, 403, 403, 200, FRESH_WORKER_KEY},
    {"GET", "/v1/cluster", NULL, NULL, false, 200, 200, 200, KEEP},
};
#define N_ROWS (sizeof rows / sizeof rows[0])

static fbt_server S;
static char a_id[64], a_key[128], b_id[64], b_key[128];
static char a_job[64], a_sweep[64], a_key_id[40], revoked_key[128], a_worker_key[40];
static int serial;

/* A worker key body no earlier cell used: 40 digits are 40 characters of Z85. */
static const char *worker_key_body(void)
{
    static char body[160];
    int n = ++serial;
    snprintf(body, sizeof body, "{\"public_key\": \"%040d\", \"name\": \"m-%d\"}", n, n);
    return body;
}

static const char *jstr(json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

/* ---- openapi.yaml's operations ----------------------------------------- */

/* Every "METHOD path" of openapi.yaml's paths section: a path is a key
 * indented by two spaces, its operations keys indented by four. */
static int openapi_operations(char ops[][128], int cap)
{
    const char *src = getenv("FB_SOURCE_DIR");
    CHECK(src != NULL);
    char file[512];
    snprintf(file, sizeof file, "%s/api/openapi.yaml", src);
    FILE *f = fopen(file, "r");
    CHECK(f != NULL);
    char line[1024], path[256] = "";
    bool in_paths = false;
    int n = 0;
    static const char *const methods[] = {"get",    "post", "put",    "patch",
                                          "delete", "head", "options"};
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] && line[0] != ' ' && line[0] != '#') {
            in_paths = strcmp(line, "paths:") == 0;
            continue;
        }
        if (!in_paths) continue;
        if (strncmp(line, "  /", 3) == 0) {
            size_t len = strlen(line);
            CHECK(len > 3 && line[len - 1] == ':');
            snprintf(path, sizeof path, "%.*s", (int)(len - 3), line + 2);
            continue;
        }
        if (strncmp(line, "    ", 4) != 0 || line[4] == ' ') continue;
        for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++) {
            size_t ml = strlen(methods[m]);
            if (strncmp(line + 4, methods[m], ml) == 0 && line[4 + ml] == ':') {
                CHECK(path[0] != '\0' && n < cap);
                char upper[16];
                CHECK(ml < sizeof upper);
                for (size_t k = 0; k <= ml && k < sizeof upper; k++)
                    upper[k] = (char)(k < ml ? methods[m][k] - 'a' + 'A' : '\0');
                snprintf(ops[n++], 128, "%s %s", upper, path);
            }
        }
    }
    fclose(f);
    return n;
}

static void test_rows_cover_openapi(void)
{
    char ops[128][128];
    int n = openapi_operations(ops, 128);
    CHECK(n >= 30);
    for (int i = 0; i < n; i++) {
        bool found = false;
        for (size_t r = 0; r < N_ROWS && !found; r++) {
            char op[128];
            snprintf(op, sizeof op, "%s %s", rows[r].method, rows[r].path);
            found = strcmp(op, ops[i]) == 0;
        }
        if (!found) {
            fprintf(stderr, "openapi.yaml has \"%s\" but the isolation matrix has no row for it\n",
                    ops[i]);
            abort();
        }
    }
    for (size_t r = 0; r < N_ROWS; r++) {
        char op[128];
        snprintf(op, sizeof op, "%s %s", rows[r].method, rows[r].path);
        bool found = false;
        for (int i = 0; i < n && !found; i++)
            found = strcmp(op, ops[i]) == 0;
        if (!found) {
            fprintf(stderr, "the matrix row \"%s\" is not in openapi.yaml\n", op);
            abort();
        }
    }
    printf("matrix: %zu rows cover the %d operations of openapi.yaml\n", N_ROWS, n);
}

/* ---- objects ------------------------------------------------------------ */

static void create_key(const char *key_for, char *id, size_t id_cap, char *secret, size_t cap)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/tenants/%s/keys", a_id);
    fbt_resp r = fbt_call(&S, "POST", path, key_for, "{\"name\": \"matrix\"}");
    fbt_expect(&r, 201, NULL, "a key for A");
    snprintf(id, id_cap, "%s", jstr(r.json, "id"));
    if (secret) snprintf(secret, cap, "%s", jstr(r.json, "key"));
    fbt_resp_free(&r);
}

static void create_sweep(char *id, size_t cap)
{
    fbt_resp r = fbt_call(&S, "POST", "/v1/sweeps", a_key, SWEEP_BODY);
    fbt_expect(&r, 201, NULL, "A's sweep");
    snprintf(id, cap, "%s", jstr(r.json, "id"));
    fbt_resp_free(&r);
}

static void create_worker_key(char *id, size_t cap)
{
    fbt_resp r = fbt_call(&S, "POST", "/v1/workers/keys", S.admin_key, worker_key_body());
    fbt_expect(&r, 201, NULL, "a worker key");
    snprintf(id, cap, "%s", jstr(r.json, "id"));
    fbt_resp_free(&r);
}

static void create_dataset(const char *name)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT INTO datasets (tenant_id, name, source, state, manifest)"
             " VALUES ('%s', '%s', 'upload', 'ready', '{}')",
             a_id, name);
    PQclear(fbt_sql(&S, sql));
}

static void setup(void)
{
    fbt_tenant(&S, "tenant-a", "", a_id, sizeof a_id, a_key, sizeof a_key);
    fbt_tenant(&S, "tenant-b", "", b_id, sizeof b_id, b_key, sizeof b_key);
    snprintf(a_job, sizeof a_job, "%s", fbt_job(&S, a_key, "a-job"));
    create_sweep(a_sweep, sizeof a_sweep);
    create_key(a_key, a_key_id, sizeof a_key_id, NULL, 0);
    char rid[40];
    create_key(a_key, rid, sizeof rid, revoked_key, sizeof revoked_key);
    char path[200];
    snprintf(path, sizeof path, "/v1/tenants/%s/keys/%s", a_id, rid);
    fbt_resp r = fbt_call(&S, "DELETE", path, a_key, NULL);
    fbt_expect(&r, 200, NULL, "A revokes a key");
    fbt_resp_free(&r);
    create_dataset("a-data");
    create_worker_key(a_worker_key, sizeof a_worker_key);
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT INTO job_metrics (job_id, step, loss) VALUES ('%s', 1, 0.5);"
             " INSERT INTO checkpoints (job_id, step, path, bytes) VALUES ('%s', 1, 'x', 1)",
             a_job, a_job);
    PQclear(fbt_sql(&S, sql));
}

/* The concrete path of a row for a caller: A's objects, or fresh ones of
 * A's for the callers that would destroy them. */
static void concrete_path(const row *rw, enum caller c, char *out, size_t cap)
{
    const char *job = a_job, *sweep = a_sweep, *key_id = a_key_id, *dataset = "a-data";
    const char *worker_key = a_worker_key;
    static char fresh_id[64], fresh_name[64];
    bool destroys = rw->fresh != KEEP && (c == OWN || c == ADMIN || c == OTHER);
    if (destroys && rw->fresh == FRESH_JOB) {
        snprintf(fresh_id, sizeof fresh_id, "%s", fbt_job(&S, a_key, "a-victim"));
        job = fresh_id;
    } else if (destroys && rw->fresh == FRESH_SWEEP) {
        create_sweep(fresh_id, sizeof fresh_id);
        sweep = fresh_id;
    } else if (destroys && rw->fresh == FRESH_KEY) {
        create_key(a_key, fresh_id, sizeof fresh_id, NULL, 0);
        key_id = fresh_id;
    } else if (destroys && rw->fresh == FRESH_DATASET) {
        snprintf(fresh_name, sizeof fresh_name, "a-victim-%d", ++serial);
        /* an upload must find no dataset of its own; a delete must find one */
        if (strcmp(rw->method, "DELETE") == 0) create_dataset(fresh_name);
        dataset = fresh_name;
    } else if (destroys && rw->fresh == FRESH_WORKER_KEY) {
        create_worker_key(fresh_id, sizeof fresh_id);
        worker_key = fresh_id;
    }
    const char *id = strncmp(rw->path, "/v1/jobs", 8) == 0             ? job
                     : strncmp(rw->path, "/v1/sweeps", 10) == 0        ? sweep
                     : strncmp(rw->path, "/v1/workers/keys/", 17) == 0 ? worker_key
                                                                       : a_id;
    size_t used = 0;
    for (const char *p = rw->path; *p && used + 1 < cap;) {
        const char *sub = NULL;
        size_t skip = 0;
        if (strncmp(p, "{id}", 4) == 0)
            sub = id, skip = 4;
        else if (strncmp(p, "{key_id}", 8) == 0)
            sub = key_id, skip = 8;
        else if (strncmp(p, "{name}", 6) == 0)
            sub = dataset, skip = 6;
        else if (strncmp(p, "{split}", 7) == 0)
            sub = "train", skip = 7;
        else if (strncmp(p, "{file}", 6) == 0)
            sub = "app.js", skip = 6;
        if (sub) {
            used += (size_t)snprintf(out + used, cap - used, "%s", sub);
            p += skip;
        } else {
            out[used++] = *p++;
        }
        CHECK(used < cap);
    }
    out[used] = '\0';
    if (rw->query) snprintf(out + used, cap - used, "?%s", rw->query);
}

static int expected(const row *rw, enum caller c)
{
    if (rw->public_route) return 200;
    switch (c) {
    case OWN:
        return rw->own;
    case OTHER:
        return rw->other;
    case ADMIN:
        return rw->admin;
    default:
        return 401;
    }
}

static fbt_resp send_cell(const row *rw, enum caller c, const char *path)
{
    const char *key = c == OWN       ? a_key
                      : c == OTHER   ? b_key
                      : c == REVOKED ? revoked_key
                      : c == ADMIN   ? S.admin_key
                                     : NULL;
    char body[2048];
    const char *b = rw->body;
    if (strcmp(rw->method, "POST") == 0 && strcmp(rw->path, "/v1/jobs") == 0) {
        b = fbt_spec("m-job", 0.1);
    } else if (strcmp(rw->method, "POST") == 0 && strcmp(rw->path, "/v1/workers/keys") == 0) {
        b = worker_key_body();
    } else if (b && strstr(b, "%s")) {
        char name[40];
        snprintf(name, sizeof name, "m-%d", ++serial);
        snprintf(body, sizeof body, b, name);
        b = body;
    }
    if (strcmp(rw->method, "PUT") == 0) {
        char auth[200];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", key ? key : "");
        const char *h[] = {"Content-Type: text/csv", key ? auth : NULL, NULL};
        fbt_resp r;
        CHECK_INT_EQ(fbt_http(S.port, "PUT", path, h, b, strlen(b), &r), 0);
        fbt_record("PUT", path, &r);
        return r;
    }
    return fbt_call(&S, rw->method, path, key, b);
}

static int cells;

/* An accepted upload imports in the background and then writes its
 * dataset's row; the cells after it compare fingerprints, so wait for it. */
static void settle_imports(void)
{
    for (int i = 0; i < 300; i++) {
        if (strcmp(fbt_sql_value(&S, "SELECT count(*) FROM datasets WHERE state = 'importing'"),
                   "0") == 0)
            return;
        usleep(50 * 1000);
    }
    fprintf(stderr, "an upload is still importing after 15 s\n");
    abort();
}

static void run_cell(const row *rw, enum caller c)
{
    char path[512];
    concrete_path(rw, c, path, sizeof path);
    int want = expected(rw, c);
    bool refused = want >= 400;
    bool reads = strcmp(rw->method, "GET") == 0;
    char *before = refused || reads ? fbt_db_fingerprint(&S) : NULL;
    fbt_resp r = send_cell(rw, c, path);
    char what[700];
    snprintf(what, sizeof what, "%s %s as %s", rw->method, path, caller_name[c]);
    const char *code = c == OWN                                                     ? NULL
                       : want == 404                                                ? "not_found"
                       : want == 401                                                ? "unauthorized"
                       : want == 403 && c == OTHER && !strstr(rw->path, "datasets") ? "forbidden"
                                                                                    : NULL;
    fbt_expect(&r, want, code, what);
    fbt_resp_free(&r);
    if (want == 202) settle_imports();
    if (before) {
        char *after = fbt_db_fingerprint(&S);
        if (strcmp(before, after) != 0) {
            fprintf(stderr, "%s changed the database:\n%s\n%s\n", what, before, after);
            abort();
        }
        free(after);
        free(before);
    }
    cells++;
}

static void test_matrix(void)
{
    /* callers that must be refused first, so that A's objects are intact */
    static const enum caller order[] = {OTHER, REVOKED, NOKEY, ADMIN, OWN};
    int refused = 0;
    for (size_t i = 0; i < N_ROWS; i++) {
        for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) {
            run_cell(&rows[i], order[k]);
            int want = expected(&rows[i], order[k]);
            if (want >= 400) refused++;
        }
    }
    printf("matrix: %d cells, %d refused with the database unchanged\n", cells, refused);

    /* A's objects are still there and untouched by everyone else */
    char path[200];
    snprintf(path, sizeof path, "/v1/jobs/%s", a_job);
    fbt_resp r = fbt_call(&S, "GET", path, a_key, NULL);
    fbt_expect(&r, 200, NULL, "A's job afterwards");
    CHECK_STR_EQ(jstr(r.json, "state"), "queued");
    fbt_resp_free(&r);
    char sql[300];
    snprintf(sql, sizeof sql, "SELECT revoked_at IS NULL FROM api_keys WHERE key_id = '%s'",
             a_key_id);
    CHECK_STR_EQ(fbt_sql_value(&S, sql), "t");
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM datasets WHERE tenant_id = '%s' AND name = 'a-data'", a_id);
    CHECK_STR_EQ(fbt_sql_value(&S, sql), "1");
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
}

int main(void)
{
    test_rows_cover_openapi();
    fbt_require_database();
    fbt_db_create(&S);
    char web[] = "/tmp/fbt-matrix-web-XXXXXX";
    CHECK(mkdtemp(web) != NULL);
    write_file(web, "index.html", "<!doctype html><title>fusebox</title>\n");
    write_file(web, "app.js", "console.log('fusebox');\n");
    const char *extra[] = {"--web-dir", web, NULL};
    fbt_server_start(&S, extra);
    setup();
    test_matrix();
    CHECK_INT_EQ(fbt_server_stop(&S), 0);
    fbt_db_drop(&S);
    char path[600];
    snprintf(path, sizeof path, "%s/index.html", web);
    unlink(path);
    snprintf(path, sizeof path, "%s/app.js", web);
    unlink(path);
    rmdir(web);
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("ok\n");
    return 0;
}
