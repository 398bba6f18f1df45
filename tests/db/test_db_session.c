/*
 * The session settings of fuseboxd's request connections (server/db.c): every
 * connection the pool opens has UTC timestamps, the statement timeout it was
 * given, an idle-in-transaction limit above it, and JIT off (a request's short
 * statements were costed past jit_above_cost on fresh tables and spent
 * seconds in LLVM, meeting the statement timeout).  Each setting is read back
 * from PostgreSQL with SHOW on a connection of the pool, for two pools with
 * different timeouts.
 */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "db.h"

static void expect_setting(fb_db_conn *c, const char *name, const char *want)
{
    char sql[64];
    snprintf(sql, sizeof sql, "SHOW %s", name);
    PGresult *r = PQexec(fb_db_pg(c), sql);
    CHECK_INT_EQ(PQresultStatus(r), PGRES_TUPLES_OK);
    printf("%s = %s\n", name, PQgetvalue(r, 0, 0));
    CHECK_STR_EQ(PQgetvalue(r, 0, 0), want);
    PQclear(r);
}

static void check_pool(const char *url, int timeout_ms, const char *want_timeout,
                       const char *want_idle)
{
    char msg[256];
    fb_db_options o = {.url = url, .size = 1, .statement_timeout_ms = timeout_ms,
                       .wait_ms = 10000};
    fb_db_pool *pool = fb_db_pool_new(&o, msg, sizeof msg);
    if (!pool) fprintf(stderr, "pool: %s\n", msg);
    CHECK(pool != NULL);
    fb_db_conn *c = NULL;
    int rc = fb_db_acquire(pool, fb_db_now_ms() + 10000, &c, msg, sizeof msg);
    if (rc) fprintf(stderr, "acquire: %s\n", msg);
    CHECK_INT_EQ(rc, 0);
    expect_setting(c, "jit", "off");
    expect_setting(c, "TimeZone", "UTC");
    expect_setting(c, "statement_timeout", want_timeout);
    expect_setting(c, "idle_in_transaction_session_timeout", want_idle);
    fb_db_release(pool, c);
    fb_db_pool_free(pool);
}

int main(void)
{
    const char *url = getenv("FUSEBOX_TEST_DATABASE_URL");
    if (!url || !url[0])
        return fb_test_missing("FUSEBOX_TEST_DATABASE_URL is not set (scripts/test sets it)");
    check_pool(url, 5000, "5s", "11s");
    check_pool(url, 1234, "1234ms", "3468ms");
    printf("ok\n");
    return 0;
}
