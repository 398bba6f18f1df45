/*
 * The PostgreSQL side of fuseboxd: a fixed-size pool of libpq connections,
 * parameterized statements (prepared once per connection where the caller
 * names them), transactions that are retried with backoff when PostgreSQL
 * goes away before COMMIT, and the mapping of SQL failures onto fb_err codes.
 *
 * A request borrows one connection for the span of one transaction.  While
 * PostgreSQL is down or restarting, requests wait up to the pool's wait time
 * for a reconnect and then fail with FB_ERR_UNAVAILABLE (HTTP 503); nothing
 * crashes and nothing is acknowledged that was not committed: a COMMIT whose
 * outcome is unknown is reported as FB_ERR_UNAVAILABLE, never retried here,
 * and a client's retry with the same Idempotency-Key finds the row if it did
 * commit.  Every function here is safe to call from any HTTP thread.
 */
#ifndef FB_SERVER_DB_H
#define FB_SERVER_DB_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fb_db_pool fb_db_pool;
typedef struct fb_db_conn fb_db_conn;

typedef struct fb_db_options {
    const char *url;          /* libpq URI or conninfo; copied */
    int size;                 /* connections, >= 1 */
    int statement_timeout_ms; /* set on every connection */
    int wait_ms;              /* how long fb_db_run waits for a connection or reconnect */
} fb_db_options;

/*
 * Creates a pool.  Connections are opened lazily, by the first request that
 * needs one, so a pool can be created while PostgreSQL is still down.
 * Returns NULL with a message on bad options or allocation failure.
 */
fb_db_pool *fb_db_pool_new(const fb_db_options *opt, char *msg, size_t msg_cap);

/* Closes every connection and frees the pool; accepts NULL.  No connection
 * may be borrowed. */
void fb_db_pool_free(fb_db_pool *pool);

/*
 * Borrows a connection, opening or reopening it as needed, waiting until
 * deadline_ms (a fb_db_now_ms() value) with exponential backoff.  Returns
 * FB_OK and *out, or FB_ERR_UNAVAILABLE with a message.
 */
int fb_db_acquire(fb_db_pool *pool, int64_t deadline_ms, fb_db_conn **out, char *msg,
                  size_t msg_cap);

/* Returns a connection to the pool, rolling back any transaction left open;
 * a broken connection is closed so that the next borrower reconnects. */
void fb_db_release(fb_db_pool *pool, fb_db_conn *c);

/* Milliseconds on the monotonic clock.  Real time on purpose, not base/clock.h's: it
 * bounds how long a request waits for a connection or a reconnect (real latency, which
 * a test's manual clock would stretch for ever), and decides nothing a test steps. */
int64_t fb_db_now_ms(void);

/*
 * The process clock (base/clock.h) as the time that decisions compare with
 * the database's timestamps, for a statement parameter written
 * coalesce(to_timestamp($n::float8), now()): NULL on the monotonic clock
 * (the database's now(), as ever); on a test's manual clock its time read as
 * Unix time in seconds (text in buf, cap >= 32), so that what is measured
 * from such a timestamp (a job's time since submission, which its
 * created_at records in the same way) moves only when the test moves the
 * clock.
 */
const char *fb_db_clock_now(char *buf, size_t cap);

/* The pool's configured wait, in milliseconds. */
int fb_db_pool_wait_ms(const fb_db_pool *pool);

/* Connections currently open (for /metrics). */
int fb_db_pool_open_count(fb_db_pool *pool);

/*
 * Runs one statement with text parameters (vals[i] NULL is SQL NULL).  When
 * name is not NULL the statement is prepared on this connection the first
 * time and executed by name afterwards; name must be a string literal that
 * always goes with the same sql.  Returns a result with status COMMAND_OK or
 * TUPLES_OK that the caller PQclear()s, or NULL with *err set:
 * FB_ERR_UNAVAILABLE for lost connections, timeouts, shutdowns and
 * serialization failures, FB_ERR_ALREADY_EXISTS for unique violations,
 * FB_ERR_INTERNAL for anything else (the server's message goes to the log,
 * not to msg, which gets a generic text).
 */
PGresult *fb_db_query(fb_db_conn *c, const char *name, const char *sql, int n,
                      const char *const *vals, int *err, char *msg, size_t msg_cap);

/* BEGIN, COMMIT and ROLLBACK.  fb_db_commit marks the connection so that a
 * failure from here on is never retried (its outcome is unknown). */
int fb_db_begin(fb_db_conn *c, char *msg, size_t msg_cap);
int fb_db_commit(fb_db_conn *c, char *msg, size_t msg_cap);
void fb_db_rollback(fb_db_conn *c);

/* Marks the next statement as one that commits by itself (a single write
 * outside BEGIN): like fb_db_commit, failures from here on are never retried. */
void fb_db_autocommit(fb_db_conn *c);

/* SQLSTATE of the connection's last failed statement ("" if none). */
const char *fb_db_sqlstate(const fb_db_conn *c);

/* Sends a connection's NOTICE messages to the JSON log (debug level). */
void fb_db_route_notices(PGconn *pg);

/* A PostgreSQL array literal of n strings ('{"a","b"}', quotes and backslashes
 * escaped), to pass as one text parameter; malloc'd, NULL when out of memory. */
char *fb_db_text_array(const char *const *items, int n);

/* The raw libpq connection, for code that needs libpq directly. */
PGconn *fb_db_pg(fb_db_conn *c);

/*
 * Body of a transaction: runs statements on c (typically fb_db_begin ...
 * fb_db_commit) and returns FB_OK or a negative fb_err with msg filled.
 * Must have no effect outside the database until its commit succeeds,
 * because fb_db_run may call it again on a fresh connection.
 */
typedef int (*fb_db_fn)(fb_db_conn *c, void *arg, char *msg, size_t msg_cap);

/*
 * Borrows a connection and runs fn on it.  When fn fails with
 * FB_ERR_UNAVAILABLE because the connection broke (or the transaction was a
 * serialization victim) before COMMIT was sent, it is run again on a new
 * connection with backoff until the pool's wait time is spent.  Returns fn's
 * result or FB_ERR_UNAVAILABLE.
 */
int fb_db_run(fb_db_pool *pool, fb_db_fn fn, void *arg, char *msg, size_t msg_cap);

#endif
