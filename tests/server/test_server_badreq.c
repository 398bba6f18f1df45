/*
 * A table of bad requests, each with the status and error code fuseboxd
 * must answer: malformed JSON, wrong types, huge numbers, unknown fields,
 * invalid UTF-8, deep nesting, oversized bodies (with a length, chunked, and
 * far over the limit), wrong media types, bad and missing keys, admin
 * routes, unknown routes and methods, bad ids and query parameters,
 * SQL-looking strings and path traversal in names and ids.  After every
 * request a fingerprint of every table must be unchanged.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "harness.h"

#define MAX_BODY 4096

enum { K_NONE, K_ALICE, K_ADMIN, K_MALFORMED, K_UNKNOWN, K_WRONG_SECRET, K_BASIC, K_TINY, K_SLOW };
enum { GEN_NONE, GEN_OVER, GEN_OVER_CHUNKED, GEN_WAY_OVER, GEN_DEEP, GEN_LONG_NAME };

typedef struct bad_case {
    const char *what;
    const char *method;
    const char
        *path; /* {J}: a job of alice's, {C}: her completed job, {A}: alice, {S}: her sweep */
    int key;
    const char *ctype; /* NULL: application/json when there is a body; "": none */
    const char *body;
    int gen;
    const char *header;
    int status;
    const char *code;
    const char *field; /* expected error.field, or NULL */
} bad_case;

#define MODEL                                                                                      \
    "\"model\": {\"input\": [1, 28, 28], \"layers\": [{\"type\": \"flatten\"}, {\"type\":"         \
    " \"linear\", \"out\": 10}]}"
#define OPT "\"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}"
#define SPEC(extra)                                                                                \
    "{\"dataset\": \"fashion-mnist\", " MODEL ", \"batch_size\": 32, \"steps\": 100, " OPT extra "}"
#define SPEC_BS(bs)                                                                                \
    "{\"dataset\": \"fashion-mnist\", " MODEL ", \"steps\": 100, " OPT ", \"batch_size\": " bs "}"
#define SPEC_NAME(n) SPEC(", \"name\": " n)
#define SWEEP(search) "{\"base\": " SPEC("") ", \"search\": " search "}"

static const bad_case cases[] = {
    /* JSON shape */
    {"malformed JSON", "POST", "/v1/jobs", K_ALICE, NULL, "{", 0, NULL, 400, "json_syntax", NULL},
    {"empty body", "POST", "/v1/jobs", K_ALICE, NULL, "", 0, NULL, 400, "json_syntax", NULL},
    {"array body", "POST", "/v1/jobs", K_ALICE, NULL, "[]", 0, NULL, 400, "not_object", NULL},
    {"string body", "POST", "/v1/jobs", K_ALICE, NULL, "\"job\"", 0, NULL, 400, "not_object", NULL},
    {"null body", "POST", "/v1/jobs", K_ALICE, NULL, "null", 0, NULL, 400, "not_object", NULL},
    {"duplicate keys", "POST", "/v1/jobs", K_ALICE, NULL, "{\"a\": 1, \"a\": 2}", 0, NULL, 400,
     "json_syntax", NULL},
    {"trailing garbage", "POST", "/v1/jobs", K_ALICE, NULL, SPEC("") " trailing", 0, NULL, 400,
     "json_syntax", NULL},
    {"single quotes", "POST", "/v1/jobs", K_ALICE, NULL, "{'dataset': 'x'}", 0, NULL, 400,
     "json_syntax", NULL},
    {"NaN literal", "POST", "/v1/jobs", K_ALICE, NULL,
     "{\"dataset\": \"fashion-mnist\", " MODEL ", \"batch_size\": 32, \"steps\": 100,"
     " \"optimizer\": {\"type\": \"sgd\", \"lr\": NaN}}",
     0, NULL, 400, "json_syntax", NULL},
    {"escaped NUL in a name", "POST", "/v1/jobs", K_ALICE, NULL, SPEC_NAME("\"a\\u0000b\""), 0,
     NULL, 400, "json_syntax", NULL},
    {"invalid UTF-8 byte", "POST", "/v1/jobs", K_ALICE, NULL, SPEC_NAME("\"caf\xff\""), 0, NULL,
     400, "bad_encoding", NULL},
    {"overlong UTF-8", "POST", "/v1/jobs", K_ALICE, NULL, SPEC_NAME("\"\xc0\xaf\""), 0, NULL, 400,
     "bad_encoding", NULL},
    {"UTF-8 surrogate", "POST", "/v1/jobs", K_ALICE, NULL, SPEC_NAME("\"\xed\xa0\x80\""), 0, NULL,
     400, "bad_encoding", NULL},
    {"truncated UTF-8", "POST", "/v1/jobs", K_ALICE, NULL, SPEC_NAME("\"\xe2\x82\""), 0, NULL, 400,
     "bad_encoding", NULL},
    {"nesting 200 deep", "POST", "/v1/jobs", K_ALICE, NULL, NULL, GEN_DEEP, NULL, 400,
     "json_too_deep", NULL},
    /* spec contents */
    {"unknown field", "POST", "/v1/jobs", K_ALICE, NULL, SPEC(", \"gpus\": 8"), 0, NULL, 400,
     "unknown_field", "gpus"},
    {"string for an integer", "POST", "/v1/jobs", K_ALICE, NULL, SPEC_BS("\"32\""), 0, NULL, 400,
     "wrong_type", "batch_size"},
    {"float for an integer", "POST", "/v1/jobs", K_ALICE, NULL, SPEC_BS("32.5"), 0, NULL, 400,
     "wrong_type", "batch_size"},
    {"boolean for an integer", "POST", "/v1/jobs", K_ALICE, NULL, SPEC_BS("true"), 0, NULL, 400,
     "wrong_type", "batch_size"},
    {"huge integer", "POST", "/v1/jobs", K_ALICE, NULL, SPEC_BS("123456789012345678901234567890"),
     0, NULL, 400, "json_syntax", NULL},
    {"huge real", "POST", "/v1/jobs", K_ALICE, NULL, SPEC_BS("1e400"), 0, NULL, 400, "json_syntax",
     NULL},
    {"batch size out of range", "POST", "/v1/jobs", K_ALICE, NULL, SPEC_BS("9007199254740993"), 0,
     NULL, 400, "out_of_range", "batch_size"},
    {"zero batch size", "POST", "/v1/jobs", K_ALICE, NULL, SPEC_BS("0"), 0, NULL, 400,
     "out_of_range", "batch_size"},
    {"negative batch size", "POST", "/v1/jobs", K_ALICE, NULL, SPEC_BS("-1"), 0, NULL, 400,
     "out_of_range", "batch_size"},
    {"missing dataset", "POST", "/v1/jobs", K_ALICE, NULL,
     "{" MODEL ", \"batch_size\": 32, \"steps\": 100, " OPT "}", 0, NULL, 400, "missing_field",
     "dataset"},
    {"unknown optimizer", "POST", "/v1/jobs", K_ALICE, NULL,
     "{\"dataset\": \"fashion-mnist\", " MODEL ", \"batch_size\": 32, \"steps\": 100,"
     " \"optimizer\": {\"type\": \"rmsprop\", \"lr\": 0.1}}",
     0, NULL, 400, "bad_enum", "optimizer.type"},
    {"unknown precision", "POST", "/v1/jobs", K_ALICE, NULL, SPEC(", \"precision\": \"fp16\""), 0,
     NULL, 400, "bad_enum", "precision"},
    {"SQL in a job name", "POST", "/v1/jobs", K_ALICE, NULL,
     SPEC_NAME("\"x'); DROP TABLE jobs; --\""), 0, NULL, 400, "bad_name", "name"},
    {"path traversal in a job name", "POST", "/v1/jobs", K_ALICE, NULL,
     SPEC_NAME("\"../../etc/passwd\""), 0, NULL, 400, "bad_name", "name"},
    {"path traversal in a dataset", "POST", "/v1/jobs", K_ALICE, NULL,
     "{\"dataset\": \"../secret\", " MODEL ", \"batch_size\": 32, \"steps\": 100, " OPT "}", 0,
     NULL, 400, "bad_name", "dataset"},
    {"absolute init path", "POST", "/v1/jobs", K_ALICE, NULL, SPEC(", \"init\": \"/etc/passwd\""),
     0, NULL, 400, "wrong_type", "init"},
    {"init path escaping", "POST", "/v1/jobs", K_ALICE, NULL,
     SPEC(", \"init\": \"runs/../../other-tenant/w.safetensors\""), 0, NULL, 400, "wrong_type",
     "init"},
    {"name too long", "POST", "/v1/jobs", K_ALICE, NULL, NULL, GEN_LONG_NAME, NULL, 400, "bad_name",
     "name"},
    /* media type and size */
    {"text/plain body", "POST", "/v1/jobs", K_ALICE, "Content-Type: text/plain", SPEC(""), 0, NULL,
     415, "unsupported_media_type", NULL},
    {"no Content-Type", "POST", "/v1/jobs", K_ALICE, "", SPEC(""), 0, NULL, 415,
     "unsupported_media_type", NULL},
    {"latin1 charset", "POST", "/v1/jobs", K_ALICE,
     "Content-Type: application/json; charset=latin1", SPEC(""), 0, NULL, 415,
     "unsupported_media_type", NULL},
    {"application/jsonx", "POST", "/v1/jobs", K_ALICE, "Content-Type: application/jsonx", SPEC(""),
     0, NULL, 415, "unsupported_media_type", NULL},
    {"form body", "POST", "/v1/tenants", K_ADMIN, "Content-Type: application/x-www-form-urlencoded",
     "name=eve", 0, NULL, 415, "unsupported_media_type", NULL},
    {"body one byte over the limit", "POST", "/v1/jobs", K_ALICE, NULL, NULL, GEN_OVER, NULL, 413,
     "payload_too_large", NULL},
    {"chunked body over the limit", "POST", "/v1/jobs", K_ALICE, NULL, NULL, GEN_OVER_CHUNKED,
     "Transfer-Encoding: chunked", 413, "payload_too_large", NULL},
    {"body of 1 MiB", "POST", "/v1/jobs", K_ALICE, NULL, NULL, GEN_WAY_OVER, NULL, 413,
     "payload_too_large", NULL},
    /* authentication and authorisation */
    {"no key", "GET", "/v1/jobs", K_NONE, NULL, NULL, 0, NULL, 401, "unauthorized", NULL},
    {"Basic auth", "GET", "/v1/jobs", K_BASIC, NULL, NULL, 0, NULL, 401, "unauthorized", NULL},
    {"malformed key", "GET", "/v1/jobs", K_MALFORMED, NULL, NULL, 0, NULL, 401, "unauthorized",
     NULL},
    {"unknown key", "GET", "/v1/jobs", K_UNKNOWN, NULL, NULL, 0, NULL, 401, "unauthorized", NULL},
    {"right id, wrong secret", "GET", "/v1/jobs", K_WRONG_SECRET, NULL, NULL, 0, NULL, 401,
     "unauthorized", NULL},
    {"no key on a write", "POST", "/v1/jobs", K_NONE, NULL, SPEC(""), 0, NULL, 401, "unauthorized",
     NULL},
    {"tenant creates a tenant", "POST", "/v1/tenants", K_ALICE, NULL, "{\"name\": \"eve\"}", 0,
     NULL, 403, "forbidden", NULL},
    {"tenant lists tenants", "GET", "/v1/tenants", K_ALICE, NULL, NULL, 0, NULL, 403, "forbidden",
     NULL},
    {"tenant changes her quota", "PATCH", "/v1/tenants/{A}", K_ALICE, NULL,
     "{\"quotas\": {\"max_queued_jobs\": 100000}}", 0, NULL, 403, "forbidden", NULL},
    {"over the rate limit", "GET", "/v1/jobs", K_SLOW, NULL, NULL, 0, NULL, 429, "rate_limited",
     NULL},
    {"over the queue quota", "POST", "/v1/jobs", K_TINY, NULL, SPEC(""), 0, NULL, 403,
     "quota_exceeded", NULL},
    /* routes, methods and ids */
    {"unknown route", "GET", "/v1/nothing", K_ALICE, NULL, NULL, 0, NULL, 404, "route_not_found",
     NULL},
    {"trailing slash", "GET", "/v1/jobs/", K_ALICE, NULL, NULL, 0, NULL, 404, "route_not_found",
     NULL},
    {"encoded traversal in the path", "GET", "/v1/jobs/..%2f..%2fetc%2fpasswd", K_ALICE, NULL, NULL,
     0, NULL, 404, "route_not_found", NULL},
    {"DELETE on a collection", "DELETE", "/v1/jobs", K_ALICE, NULL, NULL, 0, NULL, 405,
     "method_not_allowed", NULL},
    {"PUT on a job", "PUT", "/v1/jobs/{J}", K_ALICE, NULL, SPEC(""), 0, NULL, 405,
     "method_not_allowed", NULL},
    {"GET on cancel", "GET", "/v1/jobs/{J}/cancel", K_ALICE, NULL, NULL, 0, NULL, 405,
     "method_not_allowed", NULL},
    {"job id not a UUID", "GET", "/v1/jobs/12345", K_ALICE, NULL, NULL, 0, NULL, 404, "not_found",
     NULL},
    {"SQL in a job id", "GET", "/v1/jobs/1'%20OR%20'1'='1", K_ALICE, NULL, NULL, 0, NULL, 404,
     "not_found", NULL},
    {"unknown job", "GET", "/v1/jobs/00000000-0000-4000-8000-000000000000", K_ALICE, NULL, NULL, 0,
     NULL, 404, "not_found", NULL},
    {"cancel an unknown job", "POST", "/v1/jobs/00000000-0000-4000-8000-000000000000/cancel",
     K_ALICE, NULL, NULL, 0, NULL, 404, "not_found", NULL},
    {"cancel a completed job", "POST", "/v1/jobs/{C}/cancel", K_ALICE, NULL, NULL, 0, NULL, 409,
     "state_conflict", NULL},
    {"model of an untrained job", "GET", "/v1/jobs/{J}/model", K_ALICE, NULL, NULL, 0, NULL, 404,
     "no_model", NULL},
    {"unknown sweep", "GET", "/v1/sweeps/00000000-0000-4000-8000-000000000000", K_ALICE, NULL, NULL,
     0, NULL, 404, "not_found", NULL},
    {"revoke a key of the wrong form", "DELETE", "/v1/tenants/{A}/keys/..%2f..", K_ALICE, NULL,
     NULL, 0, NULL, 404, "route_not_found", NULL},
    {"revoke an unknown key", "DELETE", "/v1/tenants/{A}/keys/zzzz", K_ALICE, NULL, NULL, 0, NULL,
     404, "not_found", NULL},
    /* query parameters and headers */
    {"limit 0", "GET", "/v1/jobs?limit=0", K_ALICE, NULL, NULL, 0, NULL, 400, "bad_query", "limit"},
    {"limit not a number", "GET", "/v1/jobs?limit=ten", K_ALICE, NULL, NULL, 0, NULL, 400,
     "bad_query", "limit"},
    {"limit huge", "GET", "/v1/jobs?limit=99999999999999999999999", K_ALICE, NULL, NULL, 0, NULL,
     400, "bad_query", "limit"},
    {"unknown state", "GET", "/v1/jobs?state=paused", K_ALICE, NULL, NULL, 0, NULL, 400,
     "bad_query", "state"},
    {"unknown parameter", "GET", "/v1/jobs?owner=bob", K_ALICE, NULL, NULL, 0, NULL, 400,
     "bad_query", "owner"},
    {"parameter twice", "GET", "/v1/jobs?limit=5&limit=6", K_ALICE, NULL, NULL, 0, NULL, 400,
     "bad_query", "limit"},
    {"cursor not ours", "GET", "/v1/jobs?cursor=abc", K_ALICE, NULL, NULL, 0, NULL, 400,
     "bad_query", "cursor"},
    {"SQL in sweep_id", "GET", "/v1/jobs?sweep_id=x'%20OR%201=1--", K_ALICE, NULL, NULL, 0, NULL,
     400, "bad_query", "sweep_id"},
    {"SQL in metric fields", "GET", "/v1/jobs/{J}/metrics?fields=loss;DROP%20TABLE%20jobs", K_ALICE,
     NULL, NULL, 0, NULL, 400, "bad_query", "fields"},
    {"negative since_step", "GET", "/v1/jobs/{J}/metrics?since_step=-5", K_ALICE, NULL, NULL, 0,
     NULL, 400, "bad_query", "since_step"},
    {"Idempotency-Key with spaces", "POST", "/v1/jobs", K_ALICE, NULL, SPEC(""), 0,
     "Idempotency-Key: two words", 400, "bad_header", "Idempotency-Key"},
    {"Idempotency-Key too long", "POST", "/v1/jobs", K_ALICE, NULL, SPEC(""), 0,
     "Idempotency-Key: "
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
     400, "bad_header", "Idempotency-Key"},
    /* tenants and keys */
    {"tenant name with spaces", "POST", "/v1/tenants", K_ADMIN, NULL, "{\"name\": \"Bad Name\"}", 0,
     NULL, 400, "bad_name", "name"},
    {"SQL in a tenant name", "POST", "/v1/tenants", K_ADMIN, NULL,
     "{\"name\": \"eve'; DELETE FROM tenants; --\"}", 0, NULL, 400, "bad_name", "name"},
    {"tenant name missing", "POST", "/v1/tenants", K_ADMIN, NULL, "{\"weight\": 2}", 0, NULL, 400,
     "missing_field", "name"},
    {"negative weight", "POST", "/v1/tenants", K_ADMIN, NULL, "{\"name\": \"eve\", \"weight\": -1}",
     0, NULL, 400, "out_of_range", "weight"},
    {"quotas not an object", "POST", "/v1/tenants", K_ADMIN, NULL,
     "{\"name\": \"eve\", \"quotas\": 5}", 0, NULL, 400, "wrong_type", "quotas"},
    {"unknown quota", "POST", "/v1/tenants", K_ADMIN, NULL,
     "{\"name\": \"eve\", \"quotas\": {\"max_gpus\": 5}}", 0, NULL, 400, "unknown_field",
     "quotas.max_gpus"},
    {"huge quota", "POST", "/v1/tenants", K_ADMIN, NULL,
     "{\"name\": \"eve\", \"quotas\": {\"max_queued_jobs\": 1e300}}", 0, NULL, 400, "wrong_type",
     "quotas.max_queued_jobs"},
    {"existing tenant name", "POST", "/v1/tenants", K_ADMIN, NULL, "{\"name\": \"alice\"}", 0, NULL,
     409, "already_exists", "name"},
    {"key name with a newline", "POST", "/v1/tenants/{A}/keys", K_ALICE, NULL,
     "{\"name\": \"a\\nb\"}", 0, NULL, 400, "bad_name", "name"},
    {"PATCH the name", "PATCH", "/v1/tenants/{A}", K_ADMIN, NULL, "{\"name\": \"mallory\"}", 0,
     NULL, 400, "unknown_field", "name"},
    /* sweeps */
    {"sweep without search", "POST", "/v1/sweeps", K_ALICE, NULL, "{\"base\": " SPEC("") "}", 0,
     NULL, 400, "missing_field", "search"},
    {"grid of 1331 points", "POST", "/v1/sweeps", K_ALICE, NULL,
     SWEEP("{\"type\": \"grid\", \"params\": {\"seed\": {\"values\": [1,2,3,4,5,6,7,8,9,10,11]},"
           " \"data_seed\": {\"values\": [1,2,3,4,5,6,7,8,9,10,11]}, \"priority\": {\"values\":"
           " [1,2,3,4,5,6,7,8,9,10,11]}}}"),
     0, NULL, 400, "too_many_trials", NULL},
    {"random without count", "POST", "/v1/sweeps", K_ALICE, NULL,
     SWEEP("{\"type\": \"random\", \"params\": {\"seed\": {\"distribution\": \"int\", \"low\": 0,"
           " \"high\": 9}}}"),
     0, NULL, 400, "missing_field", "search.count"},
    {"empty path part", "POST", "/v1/sweeps", K_ALICE, NULL,
     SWEEP("{\"type\": \"grid\", \"params\": {\"optimizer..lr\": {\"values\": [0.1]}}}"), 0, NULL,
     400, "bad_name", "search.params"},
    {"traversal in a path", "POST", "/v1/sweeps", K_ALICE, NULL,
     SWEEP("{\"type\": \"grid\", \"params\": {\"../name\": {\"values\": [1]}}}"), 0, NULL, 400,
     "bad_name", "search.params"},
    {"distribution in a grid", "POST", "/v1/sweeps", K_ALICE, NULL,
     SWEEP("{\"type\": \"grid\", \"params\": {\"optimizer.lr\": {\"distribution\": \"uniform\","
           " \"low\": 0.1, \"high\": 0.2}}}"),
     0, NULL, 400, "conflicting_fields", "search.params.optimizer.lr"},
    {"log_uniform from 0", "POST", "/v1/sweeps", K_ALICE, NULL,
     SWEEP("{\"type\": \"random\", \"count\": 3, \"params\": {\"optimizer.lr\": {\"distribution\":"
           " \"log_uniform\", \"low\": 0, \"high\": 0.1}}}"),
     0, NULL, 400, "out_of_range", "search.params.optimizer.lr.low"},
    {"trial with an invalid value", "POST", "/v1/sweeps", K_ALICE, NULL,
     SWEEP("{\"type\": \"grid\", \"params\": {\"batch_size\": {\"values\": [32, -4]}}}"), 0, NULL,
     400, "out_of_range", "base.batch_size"},
    {"sweep of an unknown precision", "POST", "/v1/sweeps", K_ALICE, NULL,
     "{\"base\": " SPEC(", \"precision\": \"fp8\"") ", \"search\": {\"type\": \"grid\","
                                                    " \"params\": {\"seed\": {\"values\": [1]}}}}",
     0, NULL, 400, "bad_enum", "base.precision"},
    {"unknown early-stopping rule", "POST", "/v1/sweeps", K_ALICE, NULL,
     "{\"base\": " SPEC(
         "") ", \"search\": {\"type\": \"grid\", \"params\": {\"seed\": {\"values\":"
             " [1]}}}, \"early_stopping\": {\"type\": \"median\", \"metric\": \"loss\"}}",
     0, NULL, 400, "bad_enum", "early_stopping.type"},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

static fbt_server S;
static char alice_id[64], alice_key[128], tiny_key[128], slow_key[128];
static char job_id[64], done_id[64], sweep_id[64];

/* Replaces {J}, {C}, {A}, {S} in a path. */
static void fill_path(const char *in, char *out, size_t cap)
{
    const char *const vals[] = {job_id, done_id, alice_id, sweep_id};
    fbt_fill(in, out, cap, "JCAS", vals);
}

static char *make_body(const bad_case *c, size_t *len)
{
    char *b = NULL;
    switch (c->gen) {
    case GEN_NONE:
        if (!c->body) return NULL;
        *len = strlen(c->body);
        return strdup(c->body);
    case GEN_OVER:
    case GEN_WAY_OVER: {
        size_t n = c->gen == GEN_OVER ? MAX_BODY + 1 : (size_t)1 << 20;
        b = malloc(n + 1);
        memset(b, ' ', n);
        b[0] = '{';
        b[n - 1] = '}';
        b[n] = '\0';
        *len = n;
        return b;
    }
    case GEN_OVER_CHUNKED: {
        size_t n = MAX_BODY + 100;
        b = malloc(n + 64);
        int h = snprintf(b, 64, "%zx\r\n", n);
        memset(b + h, ' ', n);
        memcpy(b + h + n, "\r\n0\r\n\r\n", 7);
        *len = (size_t)h + n + 7;
        return b;
    }
    case GEN_DEEP: {
        size_t depth = 200;
        b = malloc(2 * depth + 16);
        size_t o = 0;
        o += (size_t)sprintf(b, "{\"a\": ");
        for (size_t i = 0; i < depth; i++)
            b[o++] = '[';
        for (size_t i = 0; i < depth; i++)
            b[o++] = ']';
        b[o++] = '}';
        b[o] = '\0';
        *len = o;
        return b;
    }
    case GEN_LONG_NAME: {
        char name[300];
        memset(name, 'n', 200);
        name[200] = '\0';
        b = malloc(4096);
        *len = (size_t)snprintf(b, 4096,
                                "{\"name\": \"%s\", \"dataset\": \"fashion-mnist\", " MODEL
                                ", \"batch_size\": 32, \"steps\": 100, " OPT "}",
                                name);
        return b;
    }
    }
    return NULL;
}

static void run_case(int i, const char *baseline)
{
    const bad_case *c = &cases[i];
    char path[512], auth[256];
    fill_path(c->path, path, sizeof path);
    const char *h[8];
    int n = 0;
    switch (c->key) {
    case K_ALICE:
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", alice_key);
        break;
    case K_ADMIN:
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", S.admin_key);
        break;
    case K_TINY:
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", tiny_key);
        break;
    case K_SLOW:
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", slow_key);
        break;
    case K_MALFORMED:
        snprintf(auth, sizeof auth, "Authorization: Bearer not-a-key");
        break;
    case K_UNKNOWN:
        snprintf(auth, sizeof auth, "Authorization: Bearer fbk_0123456789abcdef_%064d", 0);
        break;
    case K_WRONG_SECRET: /* alice's key id with another secret */
        snprintf(auth, sizeof auth, "Authorization: Bearer %.21s%064d", alice_key, 7);
        break;
    case K_BASIC:
        snprintf(auth, sizeof auth, "Authorization: Basic YWxpY2U6c2VjcmV0");
        break;
    default:
        auth[0] = '\0';
    }
    if (auth[0]) h[n++] = auth;
    size_t len = 0;
    char *body = make_body(c, &len);
    if (c->ctype && c->ctype[0])
        h[n++] = c->ctype;
    else if (!c->ctype && body)
        h[n++] = "Content-Type: application/json";
    if (c->header) h[n++] = c->header;
    h[n] = NULL;
    fbt_resp r;
    int rc = fbt_http(S.port, c->method, path, h, body, len, &r);
    free(body);
    if (rc != 0) {
        fprintf(stderr, "case %d (%s): no response\n", i, c->what);
        fbt_server_dump_log(&S);
        abort();
    }
    fbt_record(c->method, path, &r);
    char what[200];
    snprintf(what, sizeof what, "case %d (%s)", i, c->what);
    fbt_expect(&r, c->status, c->code, what);
    json_t *err = json_object_get(r.json, "error");
    CHECK(json_is_string(json_object_get(err, "message")));
    if (c->field) {
        const char *f = json_string_value(json_object_get(err, "field"));
        if (!f || strcmp(f, c->field) != 0) {
            fprintf(stderr, "%s: expected field %s, got %s\n%s\n", what, c->field, f ? f : "(none)",
                    r.body);
            abort();
        }
    }
    if (c->status == 429) CHECK(atoi(fbt_header(&r, "Retry-After")) >= 1);
    if (c->status == 405) CHECK(fbt_header(&r, "Allow") != NULL);
    if (c->status == 401) CHECK(fbt_header(&r, "WWW-Authenticate") != NULL);
    fbt_resp_free(&r);
    char *now = fbt_db_fingerprint(&S);
    if (strcmp(now, baseline) != 0) {
        fprintf(stderr, "%s changed the database:\n  before %s\n  after  %s\n", what, baseline,
                now);
        abort();
    }
    free(now);
    printf("ok %2d %d %-22s %s\n", i, c->status, c->code, c->what);
}

int main(void)
{
    fbt_require_database();
    fbt_db_create(&S);
    const char *args[] = {"--max-body-bytes", "4096", "--json-max-depth", "32", NULL};
    fbt_server_start(&S, args);
    char id[64];
    fbt_tenant(&S, "alice", "\"rate_limit\": {\"requests_per_second\": 1000, \"burst\": 1000}",
               alice_id, sizeof alice_id, alice_key, sizeof alice_key);
    fbt_tenant(&S, "tiny", "\"quotas\": {\"max_queued_jobs\": 0}", id, sizeof id, tiny_key,
               sizeof tiny_key);
    fbt_tenant(&S, "slow", "\"rate_limit\": {\"requests_per_second\": 0.001, \"burst\": 1}", id,
               sizeof id, slow_key, sizeof slow_key);
    snprintf(job_id, sizeof job_id, "%s", fbt_job(&S, alice_key, "target"));
    snprintf(done_id, sizeof done_id, "%s", fbt_job(&S, alice_key, "done"));
    char sql[256];
    snprintf(sql, sizeof sql, "UPDATE jobs SET state = 'completed' WHERE id = '%s'", done_id);
    PQclear(fbt_sql(&S, sql));
    fbt_resp r =
        fbt_call(&S, "POST", "/v1/sweeps", alice_key,
                 SWEEP("{\"type\": \"grid\", \"params\": {\"seed\": {\"values\": [1, 2]}}}"));
    fbt_expect(&r, 201, NULL, "sweep");
    snprintf(sweep_id, sizeof sweep_id, "%s", json_string_value(json_object_get(r.json, "id")));
    fbt_resp_free(&r);
    /* "slow" spends its only token */
    r = fbt_call(&S, "GET", "/v1/tenant", slow_key, NULL);
    fbt_expect(&r, 200, NULL, "slow's first request");
    fbt_resp_free(&r);

    char *baseline = fbt_db_fingerprint(&S);
    for (int i = 0; i < N_CASES; i++)
        run_case(i, baseline);
    free(baseline);
    printf("%d bad requests answered as documented, database unchanged\n", N_CASES);
    CHECK(N_CASES >= 50);

    /* the server is still healthy and counted every error by code */
    r = fbt_call(&S, "GET", "/metrics", NULL, NULL);
    fbt_expect(&r, 200, NULL, "metrics");
    CHECK(strstr(r.body, "fusebox_errors_total{code=\"bad_encoding\",status=\"400\"} 4"));
    CHECK(strstr(r.body, "fusebox_errors_total{code=\"payload_too_large\",status=\"413\"} 3"));
    fbt_resp_free(&r);
    CHECK_INT_EQ(fbt_server_stop(&S), 0);
    fbt_db_drop(&S);
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("ok\n");
    return 0;
}
