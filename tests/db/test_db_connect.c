/*
 * The test database is reachable through libpq: a parameterized query returns
 * the right answer, a bad parameter is an error that leaves the connection
 * usable, and malformed connection strings are reported as errors, not
 * crashes.  Skipped when FUSEBOX_TEST_DATABASE_URL is unset (scripts/test
 * sets it to its throwaway PostgreSQL).
 */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* Runs SELECT $1::int + 1 with one text parameter; returns the result, which
 * the caller clears. */
static PGresult *query_plus_one(PGconn *conn, const char *value)
{
    const char *params[1] = {value};
    PGresult *res = PQexecParams(conn, "SELECT $1::int + 1", 1, NULL, params, NULL, NULL, 0);
    CHECK(res != NULL);
    return res;
}

static void check_plus_one(PGconn *conn, const char *value, const char *want)
{
    PGresult *res = query_plus_one(conn, value);
    if (PQresultStatus(res) != PGRES_TUPLES_OK)
        fprintf(stderr, "query failed: %s", PQresultErrorMessage(res));
    CHECK_INT_EQ(PQresultStatus(res), PGRES_TUPLES_OK);
    CHECK_INT_EQ(PQntuples(res), 1);
    CHECK_INT_EQ(PQnfields(res), 1);
    CHECK(!PQgetisnull(res, 0, 0));
    CHECK_STR_EQ(PQgetvalue(res, 0, 0), want);
    PQclear(res);
}

/* A connection string libpq must refuse before it touches the network. */
static void check_malformed(const char *conninfo)
{
    char *err = NULL;
    PQconninfoOption *opts = PQconninfoParse(conninfo, &err);
    CHECK(opts == NULL);
    CHECK(err != NULL && err[0] != '\0');
    PQfreemem(err);

    PGconn *conn = PQconnectdb(conninfo);
    CHECK(conn != NULL);
    CHECK_INT_EQ(PQstatus(conn), CONNECTION_BAD);
    const char *msg = PQerrorMessage(conn);
    CHECK(msg != NULL && msg[0] != '\0');
    printf("malformed \"%s\" -> %s", conninfo, msg);
    PQfinish(conn);
}

int main(void)
{
    const char *url = getenv("FUSEBOX_TEST_DATABASE_URL");

    /* Malformed input is checked first: it needs no server. */
    check_malformed("this is not a conninfo");
    check_malformed("host=127.0.0.1 port='unterminated");
    check_malformed("postgresql://[::1");
    check_malformed("postgresql://127.0.0.1/db?no_such_option=1");

    /* Parses, but the port is no number: an error at connect time. */
    PGconn *bad = PQconnectdb("host=127.0.0.1 port=notaport connect_timeout=2");
    CHECK(bad != NULL);
    CHECK_INT_EQ(PQstatus(bad), CONNECTION_BAD);
    printf("bad port -> %s", PQerrorMessage(bad));
    PQfinish(bad);

    if (!url || !url[0]) {
        return fb_test_missing("FUSEBOX_TEST_DATABASE_URL is not set (scripts/test sets it)");
    }

    PGconn *conn = PQconnectdb(url);
    CHECK(conn != NULL);
    if (PQstatus(conn) != CONNECTION_OK)
        fprintf(stderr, "cannot connect to FUSEBOX_TEST_DATABASE_URL: %s", PQerrorMessage(conn));
    CHECK_INT_EQ(PQstatus(conn), CONNECTION_OK);
    printf("connected: server version %d\n", PQserverVersion(conn));

    check_plus_one(conn, "41", "42");
    check_plus_one(conn, "-1", "0");

    /* A value the server rejects is an error result; the session survives. */
    PGresult *res = query_plus_one(conn, "forty-one");
    CHECK_INT_EQ(PQresultStatus(res), PGRES_FATAL_ERROR);
    CHECK(PQresultErrorField(res, PG_DIAG_SQLSTATE) != NULL);
    CHECK_STR_EQ(PQresultErrorField(res, PG_DIAG_SQLSTATE),
                 "22P02"); /* invalid_text_representation */
    PQclear(res);
    res = query_plus_one(conn, "2147483647");
    CHECK_INT_EQ(PQresultStatus(res), PGRES_FATAL_ERROR);
    CHECK_STR_EQ(PQresultErrorField(res, PG_DIAG_SQLSTATE),
                 "22003"); /* numeric_value_out_of_range */
    PQclear(res);
    check_plus_one(conn, "1", "2");
    CHECK_INT_EQ(PQstatus(conn), CONNECTION_OK);

    PQfinish(conn);
    printf("ok\n");
    return 0;
}
