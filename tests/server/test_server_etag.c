/*
 * Conditional reads: the reads dashboards poll (a job, the jobs list, a sweep, the sweeps
 * list, the workers, the cluster) carry an ETag of their bytes and Cache-Control
 * "private, no-cache"; a request whose If-None-Match names that tag (weakly, in a list, or
 * "*") gets 304 and no body, any other gets the whole answer; a change gives a new tag.
 * A tag never opens a door: another tenant, a missing key and a missing job still get
 * their 404 and 401, not 304, and writes are never conditional.  The reads are checked in a
 * state nothing else changes (every job cancelled, no workers), so that each answer's bytes
 * are the test's to know.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "harness.h"

static fbt_server S;

/* GET path with key and an If-None-Match header (NULL for none). */
static fbt_resp get_inm(const char *path, const char *key, const char *inm)
{
    char h[512];
    const char *headers[] = {h, NULL};
    if (!inm) return fbt_call(&S, "GET", path, key, NULL);
    snprintf(h, sizeof h, "If-None-Match: %s", inm);
    return fbt_call_h(&S, "GET", path, key, NULL, headers);
}

/* A 200 with its ETag (copied into tag) and the revalidation Cache-Control. */
static void expect_tagged(const fbt_resp *r, char *tag, size_t cap, const char *what)
{
    fbt_expect(r, 200, NULL, what);
    const char *et = fbt_header(r, "ETag");
    if (!et) {
        fprintf(stderr, "%s: no ETag\n%s\n", what, r->head);
        abort();
    }
    CHECK(et[0] == '"' && et[strlen(et) - 1] == '"');
    snprintf(tag, cap, "%s", et);
    const char *cc = fbt_header(r, "Cache-Control");
    CHECK(cc != NULL);
    CHECK_STR_EQ(cc, "private, no-cache");
    CHECK(r->body_len > 0);
}

/* The whole table of If-None-Match values against one read whose current tag is tag. */
static void check_inm_table(const char *path, const char *key, const char *tag)
{
    char weak[96], list[160], other[96], unquoted[96];
    snprintf(weak, sizeof weak, "W/%s", tag);
    snprintf(list, sizeof list, "\"0-0000000000000000\", W/\"x\" ,%s", tag);
    snprintf(other, sizeof other, "\"%s\"", "1-00000000deadbeef");
    snprintf(unquoted, sizeof unquoted, "%.*s", (int)strlen(tag) - 2, tag + 1);
    static const int N = 8;
    const struct {
        const char *inm;
        int status;
    } cases[] = {
        {tag, 304},        /* the tag itself */
        {weak, 304},       /* weak comparison, as If-None-Match asks */
        {list, 304},       /* one of a list */
        {"*", 304},        /* any representation */
        {other, 200},      /* another tag */
        {unquoted, 200},   /* not an entity tag: no match */
        {"", 200},         /* empty */
        {"W/", 200},       /* a prefix alone */
    };
    CHECK_INT_EQ((int)(sizeof cases / sizeof cases[0]), N);
    for (int i = 0; i < N; i++) {
        fbt_resp r = get_inm(path, key, cases[i].inm);
        if (r.status != cases[i].status) {
            fprintf(stderr, "GET %s If-None-Match: %s -> %d, expected %d\n%s\n", path,
                    cases[i].inm, r.status, cases[i].status, r.body ? r.body : "");
            abort();
        }
        const char *et = fbt_header(&r, "ETag");
        CHECK(et != NULL);
        CHECK_STR_EQ(et, tag);
        if (cases[i].status == 304) CHECK_INT_EQ((int)r.body_len, 0);
        else CHECK(r.body_len > 0);
        fbt_resp_free(&r);
    }
}

/* A read answered with a tag, then the table against that tag. */
static void check_read(const char *path, const char *key, char *tag, size_t cap)
{
    fbt_resp r = get_inm(path, key, NULL);
    expect_tagged(&r, tag, cap, path);
    fbt_resp_free(&r);
    check_inm_table(path, key, tag);
}

/* Cancels a job of key; a cancelled job's read no longer changes. */
static void cancel_job(const char *job, const char *key, const char *inm)
{
    char cancel[200], h[160];
    snprintf(cancel, sizeof cancel, "/v1/jobs/%s/cancel", job);
    snprintf(h, sizeof h, "If-None-Match: %s", inm ? inm : "*");
    const char *hs[] = {h, NULL};
    fbt_resp r = fbt_call_h(&S, "POST", cancel, key, NULL, hs);
    CHECK(r.status == 200 || r.status == 202);
    CHECK(fbt_header(&r, "ETag") == NULL); /* writes are not conditional */
    fbt_resp_free(&r);
}

int main(void)
{
    fbt_require_database();
    fbt_db_create(&S);
    fbt_server_start(&S, NULL);

    char alice[40], alice_key[128], bob[40], bob_key[128], tag[96], path[160];
    fbt_tenant(&S, "alice", "", alice, sizeof alice, alice_key, sizeof alice_key);
    fbt_tenant(&S, "bob", "", bob, sizeof bob, bob_key, sizeof bob_key);

    /* a change gives a new tag, and the old one gets the whole answer: a queued job (whose
     * queue reason the control loop may also change meanwhile), then cancelled */
    char job[64], job_tag[96];
    snprintf(job, sizeof job, "%s", fbt_job(&S, alice_key, "etag-job"));
    snprintf(path, sizeof path, "/v1/jobs/%s", job);
    fbt_resp r = get_inm(path, alice_key, NULL);
    expect_tagged(&r, job_tag, sizeof job_tag, "the queued job");
    fbt_resp_free(&r);
    cancel_job(job, alice_key, job_tag);
    r = get_inm(path, alice_key, job_tag);
    expect_tagged(&r, tag, sizeof tag, "the job after cancel");
    CHECK(strcmp(tag, job_tag) != 0);
    CHECK(strstr(r.body, "\"cancelled\"") != NULL);
    fbt_resp_free(&r);

    /* each polled read, in a state nothing else changes: every job cancelled, no workers */
    check_read(path, alice_key, job_tag, sizeof job_tag);
    check_read("/v1/jobs", alice_key, tag, sizeof tag);
    check_read("/v1/jobs?limit=1", alice_key, tag, sizeof tag);
    check_read("/v1/sweeps", alice_key, tag, sizeof tag);
    check_read("/v1/workers", S.admin_key, tag, sizeof tag);
    check_read("/v1/cluster", S.admin_key, tag, sizeof tag);

    /* a tag opens no door: another tenant, no key, a job that does not exist, a bad query */
    r = get_inm(path, bob_key, job_tag);
    fbt_expect(&r, 404, "not_found", "bob with alice's tag");
    CHECK(fbt_header(&r, "ETag") == NULL);
    fbt_resp_free(&r);
    r = get_inm(path, bob_key, "*");
    fbt_expect(&r, 404, "not_found", "bob, any");
    fbt_resp_free(&r);
    r = get_inm(path, NULL, job_tag);
    fbt_expect(&r, 401, NULL, "no key with a tag");
    fbt_resp_free(&r);
    r = get_inm("/v1/jobs/00000000-0000-4000-8000-000000000000", alice_key, "*");
    fbt_expect(&r, 404, "not_found", "a missing job, any");
    fbt_resp_free(&r);
    r = get_inm("/v1/jobs?limit=0", alice_key, "*");
    fbt_expect(&r, 400, NULL, "bad limit, any");
    fbt_resp_free(&r);

    CHECK_INT_EQ(fbt_server_stop(&S), 0);
    fbt_db_drop(&S);
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("ok\n");
    return 0;
}
