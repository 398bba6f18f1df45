/*
 * What the fuseboxd integration tests share: a fresh PostgreSQL database per
 * test (created with a random name on the server of
 * FUSEBOX_TEST_DATABASE_URL and dropped at the end), the real fuseboxd binary
 * started as a child process on a free loopback port, a small HTTP/1.1
 * client over sockets, and a record of every response so that the OpenAPI
 * validator (tests/server/openapi/validate.mjs, run with node when
 * tests/server/node_modules exists) can check each one against
 * api/openapi.yaml.
 */
#ifndef FB_TESTS_SERVER_HARNESS_H
#define FB_TESTS_SERVER_HARNESS_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct fbt_resp {
    int status; /* 0 when the connection failed */
    char *head; /* status line and headers */
    char *body; /* NUL-terminated */
    size_t body_len;
    json_t *json; /* parsed body, or NULL */
} fbt_resp;

typedef struct fbt_server {
    pid_t pid;
    int port;
    char dbname[64];
    char db_url[1024];
    char data_dir[256];
    char log_path[300];
    char admin_key[128];
    char admin_tenant[40];
    PGconn *sql; /* the test's own connection to the test database */
} fbt_server;

/* Skips the test (exit 77; under FUSEBOX_TEST_STRICT=1 fails it) unless
 * FUSEBOX_TEST_DATABASE_URL is set. */
const char *fbt_require_database(void);

/* Creates a database with a random name on the test server and fills
 * s->dbname, s->db_url and s->sql. */
void fbt_db_create(fbt_server *s);

/* Drops the database (the server must be stopped). */
void fbt_db_drop(fbt_server *s);

/* Starts fuseboxd on s's database with a fresh data directory (unless
 * s->data_dir is already set) plus extra flags (NULL-terminated, may be NULL);
 * waits for /readyz and reads the admin key. */
void fbt_server_start(fbt_server *s, const char *const *extra);

/* Sends SIGTERM and waits for the exit; returns the exit status (or 128 +
 * signal), failing the test after 30 s. */
int fbt_server_stop(fbt_server *s);

/* A TCP connection to the loopback port with send and receive timeouts of
 * timeout_ms; -1 when it cannot be made. */
int fbt_connect(int port, int timeout_ms);

/* Sends all of buf over fd (no SIGPIPE); false when the peer stopped reading. */
bool fbt_send_all(int fd, const char *buf, size_t len);

/* Prints the server's log (for failures). */
void fbt_server_dump_log(const fbt_server *s);

/* Removes the server's data directory (after a passing test; a failing one
 * aborts before and leaves it, with the server log, for inspection).
 * fbt_db_drop calls it. */
void fbt_remove_data_dir(fbt_server *s);

/* Runs SQL on the test's connection; fails the test on error. Returns the
 * result, which the caller PQclear()s. */
PGresult *fbt_sql(fbt_server *s, const char *sql);

/* First cell of a one-row query, copied into a static buffer. */
const char *fbt_sql_value(fbt_server *s, const char *sql);

/* A fingerprint of every table's contents (md5 per table). */
char *fbt_db_fingerprint(fbt_server *s);

/*
 * One HTTP request on a new connection.  headers is NULL or a
 * NULL-terminated list of "Name: value" lines.  A body is sent with
 * Content-Length unless a Transfer-Encoding header is given (then body is
 * sent as is).  Returns 0, or -1 when no response could be read.
 */
int fbt_http(int port, const char *method, const char *path, const char *const *headers,
             const char *body, size_t body_len, fbt_resp *out);

/* Reads the whole response on fd (the server closes after it), skipping an interim
 * 100 Continue, into *out; -1 when there was none, as when the connection was dropped. */
int fbt_read_response(int fd, fbt_resp *out);

/* Sends raw bytes and reads the response. */
int fbt_http_raw(int port, const char *raw, size_t len, fbt_resp *out);

/* A response header's value (copied into a static buffer), or NULL. */
const char *fbt_header(const fbt_resp *r, const char *name);

void fbt_resp_free(fbt_resp *r);

/*
 * Convenience: method, path, API key (NULL for none) and a JSON body (NULL
 * for none; sent as application/json).  Records the exchange for OpenAPI
 * validation.  The caller frees the response.
 */
fbt_resp fbt_call(fbt_server *s, const char *method, const char *path, const char *key,
                  const char *body);

/* Same with extra headers (NULL-terminated list). */
fbt_resp fbt_call_h(fbt_server *s, const char *method, const char *path, const char *key,
                    const char *body, const char *const *headers);

/* Records a response for OpenAPI validation (fbt_call does this). */
void fbt_record(const char *method, const char *path, const fbt_resp *r);

/* Checks status and, when code is not NULL, the error code; prints the body
 * on mismatch and aborts. */
void fbt_expect(const fbt_resp *r, int status, const char *code, const char *what);

/*
 * Validates every recorded response against api/openapi.yaml with the node
 * validator.  Returns 0 when all are valid, 1 when some are not, 77 when
 * node or tests/server/node_modules is missing (fb_test_missing: under
 * FUSEBOX_TEST_STRICT=1 that fails the test instead).
 */
int fbt_validate_recorded(void);

/* Creates a tenant (admin call) with extra JSON members (may be "") and a key
 * for it; fills id and key. */
void fbt_tenant(fbt_server *s, const char *name, const char *extra, char *id, size_t id_cap,
                char *key, size_t key_cap);

/* Submits a valid small job for key and returns its id (static buffer). */
const char *fbt_job(fbt_server *s, const char *key, const char *name);

/* A valid small job spec named name (static buffer). */
const char *fbt_spec(const char *name, double lr);

/* Copies in into out[cap], each "{X}" whose letter X is keys[i] replaced by vals[i] (a test's
 * ids in its table of paths and bodies). */
void fbt_fill(const char *in, char *out, size_t cap, const char *keys, const char *const *vals);

/* Milliseconds since an arbitrary start. */
double fbt_now_ms(void);

#endif
