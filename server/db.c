/*
 * Connection pool, statements and retried transactions over libpq.
 */
#include "db.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "errors.h"
#include "log.h"

#define MAX_PREPARED 64

struct fb_db_conn {
    PGconn *pg;
    int slot;
    bool broken;      /* close on release */
    bool retryable;   /* last failure may be retried on a new connection */
    bool commit_sent; /* a COMMIT went out: outcome of failures is unknown */
    char sqlstate[6];
    int n_prepared;
    const char *prepared[MAX_PREPARED]; /* statement names, string literals */
};

struct fb_db_pool {
    char *url;
    int size;
    int statement_timeout_ms;
    int wait_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fb_db_conn *conns; /* size entries */
    int *free_stack;   /* indices of idle connections */
    int n_free;
};

const char *fb_db_clock_now(char *buf, size_t cap)
{
    if (!fb_clock_is_manual()) return NULL;
    int64_t ms = fb_clock_ms();
    snprintf(buf, cap, "%lld.%03lld", (long long)(ms / 1000), (long long)(ms % 1000));
    return buf;
}

int64_t fb_db_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms)
{
    if (ms <= 0) return;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

fb_db_pool *fb_db_pool_new(const fb_db_options *opt, char *msg, size_t msg_cap)
{
    if (!opt || !opt->url || opt->size < 1) {
        fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "database pool: bad options");
        return NULL;
    }
    fb_db_pool *p = calloc(1, sizeof *p);
    if (!p) goto fail_nomem;
    p->size = opt->size;
    p->statement_timeout_ms = opt->statement_timeout_ms;
    p->wait_ms = opt->wait_ms;
    p->url = strdup(opt->url);
    p->conns = calloc((size_t)opt->size, sizeof *p->conns);
    p->free_stack = calloc((size_t)opt->size, sizeof *p->free_stack);
    if (!p->url || !p->conns || !p->free_stack) goto fail_nomem;
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    for (int i = 0; i < p->size; i++) {
        p->conns[i].slot = i;
        p->free_stack[i] = p->size - 1 - i;
    }
    p->n_free = p->size;
    return p;
fail_nomem:
    fb_errf(msg, msg_cap, FB_ERR_NOMEM, "database pool: out of memory");
    if (p) {
        free(p->url);
        free(p->conns);
        free(p->free_stack);
        free(p);
    }
    return NULL;
}

static void conn_close(fb_db_conn *c)
{
    if (c->pg) PQfinish(c->pg);
    c->pg = NULL;
    c->n_prepared = 0;
    c->broken = false;
}

void fb_db_pool_free(fb_db_pool *pool)
{
    if (!pool) return;
    for (int i = 0; i < pool->size; i++)
        conn_close(&pool->conns[i]);
    pthread_cond_destroy(&pool->cv);
    pthread_mutex_destroy(&pool->mu);
    free(pool->conns);
    free(pool->free_stack);
    free(pool->url);
    free(pool);
}

int fb_db_pool_wait_ms(const fb_db_pool *pool)
{
    return pool->wait_ms;
}

int fb_db_pool_open_count(fb_db_pool *pool)
{
    int n = 0;
    pthread_mutex_lock(&pool->mu);
    for (int i = 0; i < pool->size; i++)
        if (pool->conns[i].pg) n++;
    pthread_mutex_unlock(&pool->mu);
    return n;
}

/* Routes PostgreSQL's notices into the structured log instead of stderr. */
static void on_notice(void *arg, const char *message)
{
    (void)arg;
    char text[512];
    snprintf(text, sizeof text, "%s", message);
    text[strcspn(text, "\n")] = '\0';
    fb_log_json(FB_LOG_DEBUG, "postgresql notice", json_pack("{s:s}", "detail", text));
}

void fb_db_route_notices(PGconn *pg)
{
    PQsetNoticeProcessor(pg, on_notice, NULL);
}

/* Opens c's libpq connection with the session settings every request relies
 * on (UTC timestamps, statement and idle-transaction limits, no JIT).
 *
 * JIT is off because a request's statements are short and their plans are
 * costed on small or fresh tables, where the planner's default estimates
 * (hundreds of rows for an empty table) push the cluster query past
 * jit_above_cost: on a loaded two-core machine PostgreSQL 15 then spent 6 to
 * 9 s compiling it with LLVM (42 ms without JIT), and the request met its
 * statement timeout (503). */
static int conn_open(fb_db_pool *pool, fb_db_conn *c, char *msg, size_t msg_cap)
{
    char options[256];
    snprintf(options, sizeof options,
             "-c statement_timeout=%d -c idle_in_transaction_session_timeout=%d -c TimeZone=UTC"
             " -c jit=off",
             pool->statement_timeout_ms, pool->statement_timeout_ms * 2 + 1000);
    const char *keys[] = {"dbname", "application_name", "connect_timeout", "options", NULL};
    const char *vals[] = {pool->url, "fuseboxd", "3", options, NULL};
    conn_close(c);
    PGconn *pg = PQconnectdbParams(keys, vals, 1);
    if (!pg) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "database: out of memory");
    if (PQstatus(pg) != CONNECTION_OK) {
        char text[256];
        snprintf(text, sizeof text, "%s", PQerrorMessage(pg));
        text[strcspn(text, "\n")] = '\0';
        PQfinish(pg);
        fb_logf(FB_LOG_WARN, "database connection failed: %s", text);
        return fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE, "the database is unreachable");
    }
    fb_db_route_notices(pg);
    c->pg = pg;
    return FB_OK;
}

int fb_db_acquire(fb_db_pool *pool, int64_t deadline_ms, fb_db_conn **out, char *msg,
                  size_t msg_cap)
{
    pthread_mutex_lock(&pool->mu);
    while (pool->n_free == 0) {
        int64_t left = deadline_ms - fb_db_now_ms();
        if (left <= 0) {
            pthread_mutex_unlock(&pool->mu);
            return fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE,
                           "all database connections are busy; retry later");
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += left / 1000;
        ts.tv_nsec += (long)(left % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&pool->cv, &pool->mu, &ts);
    }
    fb_db_conn *c = &pool->conns[pool->free_stack[--pool->n_free]];
    pthread_mutex_unlock(&pool->mu);

    c->retryable = false;
    c->commit_sent = false;
    c->sqlstate[0] = '\0';
    if (c->pg && PQstatus(c->pg) != CONNECTION_OK) conn_close(c);
    int64_t backoff = 25;
    while (!c->pg) {
        int err = conn_open(pool, c, msg, msg_cap);
        if (err == FB_OK) break;
        int64_t left = deadline_ms - fb_db_now_ms();
        if (err != FB_ERR_UNAVAILABLE || left <= 0) {
            fb_db_release(pool, c);
            return err;
        }
        sleep_ms(backoff < left ? backoff : left);
        backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
    }
    *out = c;
    return FB_OK;
}

void fb_db_release(fb_db_pool *pool, fb_db_conn *c)
{
    if (!c) return;
    if (c->pg && !c->broken && PQstatus(c->pg) == CONNECTION_OK &&
        PQtransactionStatus(c->pg) != PQTRANS_IDLE) {
        PGresult *r = PQexec(c->pg, "ROLLBACK");
        if (PQresultStatus(r) != PGRES_COMMAND_OK) c->broken = true;
        PQclear(r);
    }
    if (c->broken || (c->pg && PQstatus(c->pg) != CONNECTION_OK)) conn_close(c);
    pthread_mutex_lock(&pool->mu);
    pool->free_stack[pool->n_free++] = c->slot;
    pthread_cond_signal(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
}

PGconn *fb_db_pg(fb_db_conn *c)
{
    return c->pg;
}

const char *fb_db_sqlstate(const fb_db_conn *c)
{
    return c->sqlstate;
}

/* Maps a failed result (or none) to an fb_err and records the SQLSTATE. */
static int classify(fb_db_conn *c, PGresult *res, char *msg, size_t msg_cap)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    snprintf(c->sqlstate, sizeof c->sqlstate, "%s", state ? state : "");
    bool conn_bad = PQstatus(c->pg) != CONNECTION_OK;
    if (conn_bad || !state || strncmp(state, "08", 2) == 0 || strncmp(state, "57P", 3) == 0 ||
        strncmp(state, "53", 2) == 0) {
        c->broken = true;
        c->retryable = !c->commit_sent;
        char text[256];
        snprintf(text, sizeof text, "%s", res ? PQresultErrorMessage(res) : PQerrorMessage(c->pg));
        text[strcspn(text, "\n")] = '\0';
        fb_logf(FB_LOG_WARN, "database connection lost (%s): %s", c->sqlstate, text);
        return fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE,
                       "the database is unreachable; retry later");
    }
    if (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0) {
        c->retryable = !c->commit_sent;
        return fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE, "a concurrent update interfered; retry");
    }
    if (strcmp(state, "57014") == 0)
        return fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE, "the database took too long; retry later");
    if (strcmp(state, "23505") == 0)
        return fb_errf(msg, msg_cap, FB_ERR_ALREADY_EXISTS, "an object with this name exists");
    char text[512];
    snprintf(text, sizeof text, "%s", PQresultErrorMessage(res));
    text[strcspn(text, "\n")] = '\0';
    fb_logf(FB_LOG_ERROR, "database error %s: %s", state, text);
    return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "internal database error (%s)", state);
}

static bool is_prepared(const fb_db_conn *c, const char *name)
{
    for (int i = 0; i < c->n_prepared; i++)
        if (c->prepared[i] == name || strcmp(c->prepared[i], name) == 0) return true;
    return false;
}

PGresult *fb_db_query(fb_db_conn *c, const char *name, const char *sql, int n,
                      const char *const *vals, int *err, char *msg, size_t msg_cap)
{
    PGresult *res;
    *err = FB_OK;
    if (name && !is_prepared(c, name) && c->n_prepared < MAX_PREPARED) {
        res = PQprepare(c->pg, name, sql, n, NULL);
        if (PQresultStatus(res) != PGRES_COMMAND_OK) {
            *err = classify(c, res, msg, msg_cap);
            PQclear(res);
            return NULL;
        }
        PQclear(res);
        c->prepared[c->n_prepared++] = name;
    }
    if (name && is_prepared(c, name))
        res = PQexecPrepared(c->pg, name, n, vals, NULL, NULL, 0);
    else
        res = PQexecParams(c->pg, sql, n, NULL, vals, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(res);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        *err = classify(c, res, msg, msg_cap);
        PQclear(res);
        return NULL;
    }
    return res;
}

static int simple(fb_db_conn *c, const char *sql, char *msg, size_t msg_cap)
{
    PGresult *res = PQexec(c->pg, sql);
    int err = FB_OK;
    if (PQresultStatus(res) != PGRES_COMMAND_OK) err = classify(c, res, msg, msg_cap);
    PQclear(res);
    return err;
}

int fb_db_begin(fb_db_conn *c, char *msg, size_t msg_cap)
{
    return simple(c, "BEGIN", msg, msg_cap);
}

int fb_db_commit(fb_db_conn *c, char *msg, size_t msg_cap)
{
    c->commit_sent = true;
    return simple(c, "COMMIT", msg, msg_cap);
}

void fb_db_autocommit(fb_db_conn *c)
{
    c->commit_sent = true;
}

void fb_db_rollback(fb_db_conn *c)
{
    if (c->pg && PQtransactionStatus(c->pg) != PQTRANS_IDLE) {
        PGresult *res = PQexec(c->pg, "ROLLBACK");
        if (PQresultStatus(res) != PGRES_COMMAND_OK) c->broken = true;
        PQclear(res);
    }
}

int fb_db_run(fb_db_pool *pool, fb_db_fn fn, void *arg, char *msg, size_t msg_cap)
{
    int64_t deadline = fb_db_now_ms() + pool->wait_ms;
    int64_t backoff = 25;
    for (;;) {
        fb_db_conn *c = NULL;
        int err = fb_db_acquire(pool, deadline, &c, msg, msg_cap);
        if (err) return err;
        err = fn(c, arg, msg, msg_cap);
        bool retry = err == FB_ERR_UNAVAILABLE && c->retryable;
        fb_db_release(pool, c);
        int64_t left = deadline - fb_db_now_ms();
        if (!retry || left <= 0) return err;
        sleep_ms(backoff < left ? backoff : left);
        backoff = backoff * 2 > 500 ? 500 : backoff * 2;
    }
}

char *fb_db_text_array(const char *const *items, int n)
{
    size_t cap = 3;
    for (int i = 0; i < n; i++) cap += strlen(items[i]) * 2 + 3;
    char *s = malloc(cap), *p = s;
    if (!s) return NULL;
    *p++ = '{';
    for (int i = 0; i < n; i++) {
        if (i) *p++ = ',';
        *p++ = '"';
        for (const char *c = items[i]; *c; c++) {
            if (*c == '"' || *c == '\\') *p++ = '\\';
            *p++ = *c;
        }
        *p++ = '"';
    }
    *p++ = '}';
    *p = '\0';
    return s;
}
