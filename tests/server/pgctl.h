/*
 * A PostgreSQL cluster of a test's own, for the tests that stop and start
 * the database under fuseboxd: the shared server of FUSEBOX_TEST_DATABASE_URL
 * serves every other test at the same time and must never be restarted.
 * The cluster is made with initdb in a scratch directory under /tmp, listens
 * on a free loopback port only, and is driven with pg_ctl, run as the
 * postgres user when the test runs as root (PostgreSQL refuses to run as
 * root).  A machine without the PostgreSQL server programs skips the test
 * (exit 77); any other failure fails it.  A test that aborts does not leave
 * the cluster running: a watchdog process stops it when the test process is
 * gone, and keeps its directory (with server.log) for inspection.
 */
#ifndef FB_TESTS_SERVER_PGCTL_H
#define FB_TESTS_SERVER_PGCTL_H

#include <stdbool.h>

typedef struct fbt_pg {
    char bin[256];  /* the PostgreSQL server programs (initdb, pg_ctl) */
    char dir[256];  /* scratch directory: data/, server.log, initdb.log; "" when none */
    int port;       /* loopback TCP port */
    char url[256];  /* libpq conninfo of the cluster's "postgres" database */
    int watchdog_fd; /* write end of the watchdog's pipe, valid while watching */
    bool watching;   /* whether a watchdog guards the cluster */
} fbt_pg;

/* Runs a shell command; returns its exit status, or 128 when it did not exit
 * normally. */
int fbt_run(const char *cmd);

/*
 * Runs one PostgreSQL program of pg->bin with its arguments (a shell command
 * tail such as "pg_ctl -D dir status"), as the postgres user when the test
 * is root, from "/" (which that user can read).  Returns its exit status.
 */
int fbt_pg_cmd(const fbt_pg *pg, const char *args);

/*
 * Creates a fresh cluster (initdb, trust authentication, TCP on 127.0.0.1
 * only, fsync off for speed but synchronous commit on) and starts it on a
 * free port; fills all of *pg.  Exits 77 (skipped) when initdb is missing or
 * the test is root without a postgres user.
 */
void fbt_pg_create(fbt_pg *pg);

/* Starts the cluster and waits until it accepts connections. */
void fbt_pg_start(const fbt_pg *pg);

/* Stops the cluster with pg_ctl's mode ("smart", "fast" or "immediate", the
 * last one like a crash) and waits until it is down. */
void fbt_pg_stop(const fbt_pg *pg, const char *mode);

/* Stops the cluster (immediate) if it runs, ends the watchdog and removes
 * the scratch directory.  Accepts NULL and a cluster never created; a second
 * call does nothing. */
void fbt_pg_destroy(fbt_pg *pg);

#endif
