/*
 * The control loop's in-memory queue (server/queue.c) equals a full read of
 * the queued jobs after every kind of change the rest of fusebox makes:
 * submissions, state changes in and out of the queue, priority, resume point
 * and dataset changes, deletions, datasets created and removed under queued
 * jobs, and transactions on other connections that commit in another order
 * than they wrote, or roll back.  Hundreds of random rounds, each compared
 * field by field and in planning order.  Also: a failed read leaves the copy
 * usable after a reconnect, and the limit of fb_queue_ordered holds.
 * Prints how long a full read and an incremental one take at 10,000 jobs.
 */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "harness.h"
#include "migrate.h"
#include "queue.h"

static unsigned long long rng = 0x9e3779b97f4a7c15ULL;

static unsigned rnd(unsigned n)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned)((rng >> 33) % n);
}

static void sql(PGconn *c, const char *q)
{
    PGresult *r = PQexec(c, q);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        fprintf(stderr, "%s\n-> %s", q, PQresultErrorMessage(r));
        CHECK(0);
    }
    PQclear(r);
}

static void sqlf(PGconn *c, const char *fmt, const char *a)
{
    char q[2048];
    snprintf(q, sizeof q, fmt, a);
    sql(c, q);
}

static char tenants[2][40];
static PGconn *own; /* the connection the copy is synced over, as the control loop's */
static PGconn *conns[3];

/* Each connection changes its own rows (jobs by seq modulo 3, its own dataset name), so
 * that transactions left open on one never block another: the test runs on one thread. */
static int part(PGconn *c)
{
    for (int i = 0; i < 3; i++)
        if (conns[i] == c) return i;
    CHECK(0);
    return -1;
}

/* Submits n queued jobs of tenant t (fusion keys from a small set, datasets mixed). */
static void submit(PGconn *c, int t, int n)
{
    char q[2048];
    snprintf(q, sizeof q,
             "INSERT INTO jobs (tenant_id, name, spec, fusion_key, dataset, n_params,"
             " flops_per_sample, priority, steps, epochs, max_restarts)"
             " SELECT '%s', 'j' || g, '{}', 'key' || (g %% 3),"
             " (ARRAY['fashion-mnist', 'mine0', 'mine1', 'mine2', 'other'])[1 + (g %% 5)], 1, 1,"
             " (g * 7) %% 4, 10, 1, 1 FROM generate_series(1, %d) g",
             tenants[t], n);
    sql(c, q);
}

/* A random queued (or any) job id into buf; false when none. */
static bool pick(PGconn *c, const char *where, char *buf, size_t cap)
{
    char q[512];
    snprintf(q, sizeof q,
             "SELECT id FROM jobs WHERE %s AND seq %% 3 = %d ORDER BY seq OFFSET %u LIMIT 1",
             where, part(c), rnd(50));
    PGresult *r = PQexec(c, q);
    CHECK(PQresultStatus(r) == PGRES_TUPLES_OK);
    bool ok = PQntuples(r) == 1;
    if (ok) snprintf(buf, cap, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return ok;
}

/* One random change made on connection c. */
static void change(PGconn *c, fb_queue *q)
{
    char id[64], ds[256];
    switch (rnd(11)) {
    case 0:
        submit(c, (int)rnd(2), 1 + (int)rnd(5));
        break;
    case 1:
        if (pick(c, "state = 'queued'", id, sizeof id))
            sqlf(c, "UPDATE jobs SET state = 'scheduled' WHERE id = '%s'", id);
        break;
    case 2:
        if (pick(c, "state = 'scheduled'", id, sizeof id))
            sqlf(c, "UPDATE jobs SET state = 'queued', resume_step = 5, resume_path = 'a/b'"
                    " WHERE id = '%s'", id);
        break;
    case 3:
        if (pick(c, "state = 'queued'", id, sizeof id))
            sqlf(c, "UPDATE jobs SET priority = (priority + 1) %% 100 WHERE id = '%s'", id);
        break;
    case 4:
        if (pick(c, "state = 'queued'", id, sizeof id))
            sqlf(c, "UPDATE jobs SET state = 'cancelled' WHERE id = '%s'", id);
        break;
    case 5:
        if (pick(c, "true", id, sizeof id)) sqlf(c, "DELETE FROM jobs WHERE id = '%s'", id);
        break;
    case 6:
        snprintf(ds, sizeof ds,
                 "INSERT INTO datasets (tenant_id, name, source, manifest) VALUES ('%s', 'mine%d',"
                 " 'builtin', '{\"builtin\": \"fashion-mnist\"}') ON CONFLICT DO NOTHING",
                 tenants[rnd(2)], part(c));
        sql(c, ds);
        break;
    case 7:
        snprintf(ds, sizeof ds, "DELETE FROM datasets WHERE tenant_id = '%s' AND name = 'mine%d'",
                 tenants[rnd(2)], part(c));
        sql(c, ds);
        break;
    case 8:
        snprintf(ds, sizeof ds,
                 "UPDATE datasets SET source = CASE source WHEN 'builtin' THEN 'upload'"
                 " ELSE 'builtin' END WHERE tenant_id = '%s' AND name = 'mine%d'",
                 tenants[rnd(2)], part(c));
        sql(c, ds);
        break;
    case 9:
        /* the control loop's own reason writes (on its own connection, committed) are not
         * changes: it records them */
        if (c == own && pick(c, "state = 'queued'", id, sizeof id)) {
            char reason[32];
            snprintf(reason, sizeof reason, "waiting %u", rnd(1000));
            char qq[256];
            snprintf(qq, sizeof qq, "UPDATE jobs SET queue_reason = '%s' WHERE id = '%s'", reason,
                     id);
            sql(c, qq);
            fb_queue_set_reason(q, id, reason);
        }
        break;
    default:
        /* progress of a running job: not the queue's business */
        if (pick(c, "state = 'scheduled'", id, sizeof id))
            sqlf(c, "UPDATE jobs SET step = step + 1, updated_at = now() WHERE id = '%s'", id);
        break;
    }
}

/* The copy, in planning order, equals a full read of the queue. */
static void compare(PGconn *c, fb_queue *q)
{
    PGresult *r = PQexec(
        c, "SELECT j.id, j.seq, j.tenant_id, j.fusion_key, j.resume_step, j.priority,"
           /* public: an unregistered built-in or listed name, or a built-in under its name */
           " CASE WHEN ds.source IS NULL THEN j.dataset IN ('fashion-mnist', 'mnist', 'other')"
           "  ELSE ds.source = 'builtin' AND ds.manifest->>'builtin' = j.dataset END,"
           " coalesce(j.queue_reason, ''), j.resume_path, j.dataset,"
           /* a built-in under another name: read as the built-in */
           " CASE WHEN ds.source = 'builtin' AND ds.manifest->>'builtin' <> j.dataset"
           "  THEN ds.manifest->>'builtin' END"
           " FROM jobs j LEFT JOIN datasets ds ON ds.tenant_id = j.tenant_id"
           "  AND ds.name = j.dataset WHERE j.state = 'queued' ORDER BY j.priority DESC, j.seq");
    CHECK(PQresultStatus(r) == PGRES_TUPLES_OK);
    const fb_queue_job *const *o;
    int n = fb_queue_ordered(q, 1 << 30, &o);
    CHECK_INT_EQ(n, PQntuples(r));
    CHECK_INT_EQ(fb_queue_count(q), n);
    for (int i = 0; i < n; i++) {
        CHECK_STR_EQ(o[i]->id, PQgetvalue(r, i, 0));
        CHECK_INT_EQ(o[i]->seq, strtoll(PQgetvalue(r, i, 1), NULL, 10));
        CHECK_STR_EQ(o[i]->tenant_id, PQgetvalue(r, i, 2));
        CHECK_STR_EQ(o[i]->fusion_key, PQgetvalue(r, i, 3));
        CHECK_INT_EQ(o[i]->resume_step, strtoll(PQgetvalue(r, i, 4), NULL, 10));
        CHECK_INT_EQ(o[i]->priority, strtol(PQgetvalue(r, i, 5), NULL, 10));
        CHECK_INT_EQ(o[i]->public_dataset, PQgetvalue(r, i, 6)[0] == 't');
        CHECK_STR_EQ(o[i]->queue_reason, PQgetvalue(r, i, 7));
        if (PQgetisnull(r, i, 8))
            CHECK(o[i]->resume_path == NULL);
        else
            CHECK_STR_EQ(o[i]->resume_path, PQgetvalue(r, i, 8));
        CHECK_STR_EQ(o[i]->dataset, PQgetvalue(r, i, 9));
        if (PQgetisnull(r, i, 10))
            CHECK(o[i]->builtin == NULL);
        else
            CHECK_STR_EQ(o[i]->builtin, PQgetvalue(r, i, 10));
    }
    PQclear(r);
}

static void sync_ok(fb_queue *q, PGconn *c, int *rows)
{
    char msg[512];
    int err = fb_queue_sync(q, c, rows, msg, sizeof msg);
    if (err) fprintf(stderr, "sync: %s\n", msg);
    CHECK_INT_EQ(err, 0);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(void)
{
    /* a new sequence of changes each run, repeatable from the printed seed */
    const char *seed_env = getenv("FUSEBOX_TEST_SEED");
    rng = seed_env ? strtoull(seed_env, NULL, 10) : (unsigned long long)time(NULL);
    printf("seed %llu (FUSEBOX_TEST_SEED repeats it)\n", rng);
    fbt_server s = {0};
    fbt_db_create(&s);
    char msg[512];
    int applied = 0, latest = 0;
    if (fb_migrate_apply(s.sql, FBT_SCHEMA_DIR, &applied, &latest, msg, sizeof msg)) {
        fprintf(stderr, "migrations: %s\n", msg);
        CHECK(0);
    }
    PGconn *other = PQconnectdb(s.db_url), *third = PQconnectdb(s.db_url);
    CHECK(PQstatus(other) == CONNECTION_OK && PQstatus(third) == CONNECTION_OK);
    for (int t = 0; t < 2; t++) {
        char q[128];
        snprintf(q, sizeof q, "INSERT INTO tenants (name) VALUES ('t%d') RETURNING id", t);
        PGresult *r = PQexec(s.sql, q);
        CHECK(PQresultStatus(r) == PGRES_TUPLES_OK);
        snprintf(tenants[t], sizeof tenants[t], "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
    }
    submit(s.sql, 0, 40);
    submit(s.sql, 1, 40);

    own = s.sql;
    /* a test that would wait on a lock fails instead of hanging */
    for (int i = 0; i < 3; i++)
        sql(i == 0 ? own : i == 1 ? other : third, "SET lock_timeout = '5s'");
    conns[0] = own;
    conns[1] = other;
    conns[2] = third;
    fb_queue *q = fb_queue_new("other");
    CHECK(q != NULL);
    int rows = -1;
    sync_ok(q, s.sql, &rows);
    CHECK_INT_EQ(rows, 80);
    compare(s.sql, q);
    /* nothing changed: nothing read */
    sync_ok(q, s.sql, &rows);
    CHECK_INT_EQ(rows, 0);

    /* random changes, some in transactions on other connections that commit out of order
     * or roll back */
    int rounds = 400, in_txn = 0;
    for (int round = 0; round < rounds; round++) {
        int kind = (int)rnd(4);
        if (kind == 0) {
            sql(other, "BEGIN");
            change(other, q);
            sql(third, "BEGIN");
            change(third, q);
            change(s.sql, q);
            sync_ok(q, s.sql, NULL); /* sees neither open transaction */
            compare(s.sql, q);
            sql(third, rnd(4) ? "COMMIT" : "ROLLBACK");
            sync_ok(q, s.sql, NULL);
            compare(s.sql, q);
            sql(other, "COMMIT");
            in_txn++;
        } else {
            for (int k = 1 + (int)rnd(3); k > 0; k--) change(s.sql, q);
        }
        sync_ok(q, s.sql, NULL);
        compare(s.sql, q);
    }
    printf("%d rounds (%d with transactions on other connections) matched a full read; %d"
           " queued\n",
           rounds, in_txn, fb_queue_count(q));

    /* the limit of the planning order */
    const fb_queue_job *const *o;
    int n = fb_queue_count(q);
    CHECK(n > 3);
    CHECK_INT_EQ(fb_queue_ordered(q, 3, &o), 3);
    CHECK_INT_EQ(fb_queue_ordered(q, n + 10, &o), n);

    /* a failed read: the connection is gone; the change rows stay for the next one */
    PGconn *dead = PQconnectdb(s.db_url);
    CHECK(PQstatus(dead) == CONNECTION_OK);
    PQfinish(other);
    other = NULL;
    char kill[160];
    snprintf(kill, sizeof kill, "SELECT pg_terminate_backend(%d)", PQbackendPID(dead));
    sql(s.sql, kill);
    submit(s.sql, 0, 3);
    CHECK(fb_queue_sync(q, dead, NULL, msg, sizeof msg) < 0);
    printf("sync over a dead connection: %s\n", msg);
    PQfinish(dead);
    sync_ok(q, s.sql, &rows);
    CHECK_INT_EQ(rows, 3);
    compare(s.sql, q);
    /* an invalidated copy reads everything again and still matches */
    fb_queue_invalidate(q);
    sync_ok(q, s.sql, &rows);
    CHECK_INT_EQ(rows, fb_queue_count(q));
    compare(s.sql, q);

    /* what a plan pays: a full read at 10,000 queued jobs against an incremental one */
    submit(s.sql, 0, 10000 - fb_queue_count(q));
    fb_queue_invalidate(q);
    double t0 = now_s();
    sync_ok(q, s.sql, &rows);
    double full = now_s() - t0;
    CHECK(rows >= 10000);
    /* a burst's dead change rows are vacuumed away, and the copy stays right */
    for (int k = 0; k < 3; k++) sql(s.sql, "UPDATE jobs SET priority = (priority + 1) % 100"
                                           " WHERE state = 'queued'");
    sync_ok(q, s.sql, &rows);
    fb_queue_maintain(q, s.sql);
    compare(s.sql, q);
    submit(s.sql, 1, 10);
    t0 = now_s();
    sync_ok(q, s.sql, &rows);
    double inc = now_s() - t0;
    CHECK_INT_EQ(rows, 10);
    t0 = now_s();
    CHECK(fb_queue_ordered(q, 20000, &o) >= 10000);
    double order = now_s() - t0;
    compare(s.sql, q);
    printf("at %d queued jobs: full read %.1f ms, incremental read of 10 changes %.2f ms,"
           " planning order %.2f ms\n",
           fb_queue_count(q), full * 1e3, inc * 1e3, order * 1e3);

    fb_queue_free(q);
    PQfinish(third);
    fbt_db_drop(&s);
    printf("ok\n");
    return 0;
}
