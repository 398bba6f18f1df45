/*
 * fuseboxd's lifecycle: wait for PostgreSQL, migrate, bootstrap the admin
 * tenant, serve HTTP, and shut down gracefully on SIGTERM.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <microhttpd.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dispatch.h"
#include "db.h"
#include "errors.h"
#include "http.h"
#include "log.h"
#include "migrate.h"
#include "routes.h"
#include "server_impl.h"

#define AUTH_CACHE_TTL_MS 5000
#define ADMIN_KEY_FILE "admin.key"

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

void fb_server_block_signals(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

/* Creates dir (and nothing above it) with mode when it does not exist. */
static int ensure_dir(const char *dir, mode_t mode, char *msg, size_t msg_cap)
{
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return fb_errf(msg, msg_cap, FB_ERR_IO, "%s is not a directory", dir);
        return FB_OK;
    }
    if (mkdir(dir, mode) != 0 && errno != EEXIST)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
    return FB_OK;
}

/* Opens a libpq connection for start-up work, waiting up to the startup
 * wait for PostgreSQL to come up. */
static PGconn *connect_startup(const fb_config *cfg, char *msg, size_t msg_cap)
{
    time_t give_up = time(NULL) + cfg->startup_wait_s;
    long backoff = 100;
    bool said = false;
    for (;;) {
        const char *keys[] = {"dbname", "application_name", "connect_timeout", "options", NULL};
        const char *vals[] = {cfg->database_url, "fuseboxd-startup", "5", "-c TimeZone=UTC", NULL};
        PGconn *c = PQconnectdbParams(keys, vals, 1);
        if (c && PQstatus(c) == CONNECTION_OK) {
            fb_db_route_notices(c);
            return c;
        }
        char text[300];
        snprintf(text, sizeof text, "%s", c ? PQerrorMessage(c) : "out of memory");
        text[strcspn(text, "\n")] = '\0';
        PQfinish(c);
        if (time(NULL) >= give_up) {
            fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE, "cannot reach PostgreSQL: %s", text);
            return NULL;
        }
        if (!said) {
            fb_log_json(FB_LOG_WARN, "waiting for PostgreSQL", json_pack("{s:s}", "detail", text));
            said = true;
        }
        sleep_ms(backoff);
        backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
    }
}

static int exec_ok(PGconn *c, const char *sql, int n, const char *const *vals, PGresult **out)
{
    PGresult *r = PQexecParams(c, sql, n, NULL, vals, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        fb_logf(FB_LOG_ERROR, "start-up query failed: %s", PQresultErrorMessage(r));
        PQclear(r);
        return FB_ERR_UNAVAILABLE;
    }
    if (out)
        *out = r;
    else
        PQclear(r);
    return FB_OK;
}

/*
 * On first start, creates the admin tenant and its key and writes the key
 * to DATA_DIR/admin.key (0600).  The file is written and renamed into place
 * before COMMIT, so a crash leaves either no admin (and the next start makes
 * a new key) or a file whose key works.
 */
static int bootstrap_admin(PGconn *c, const fb_config *cfg, char *msg, size_t msg_cap)
{
    char path[FB_CONFIG_PATH_MAX + 32], tmp[FB_CONFIG_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", cfg->data_dir, ADMIN_KEY_FILE);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", cfg->data_dir, ADMIN_KEY_FILE);
    PGresult *r = NULL;
    if (exec_ok(c, "SELECT id FROM tenants WHERE is_admin ORDER BY created_at LIMIT 1", 0, NULL,
                &r))
        return fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE, "cannot read the tenants table");
    bool exists = PQntuples(r) > 0;
    PQclear(r);
    if (exists) {
        if (access(path, F_OK) == 0)
            fb_log_json(FB_LOG_INFO, "admin key file", json_pack("{s:s}", "path", path));
        else
            fb_log_json(FB_LOG_WARN, "the admin tenant exists but its key file is missing",
                        json_pack("{s:s}", "path", path));
        return FB_OK;
    }
    char key[FB_KEY_LEN + 1], key_id[FB_KEY_ID_LEN + 1], hash_hex[2 * FB_KEY_HASH_BYTES + 3];
    uint8_t hash[FB_KEY_HASH_BYTES];
    fb_auth_key_new(key, key_id, hash);
    hash_hex[0] = '\\';
    hash_hex[1] = 'x';
    sodium_bin2hex(hash_hex + 2, sizeof hash_hex - 2, hash, sizeof hash);
    int err = FB_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        err = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
        goto done;
    }
    char line[FB_KEY_LEN + 2];
    int n = snprintf(line, sizeof line, "%s\n", key);
    bool ok = fchmod(fd, 0600) == 0 && write(fd, line, (size_t)n) == n && fsync(fd) == 0;
    sodium_memzero(line, sizeof line);
    if (close(fd) != 0) ok = false;
    if (!ok) {
        err = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
        goto done;
    }
    if (exec_ok(c, "BEGIN", 0, NULL, NULL)) goto db_fail;
    r = NULL;
    if (exec_ok(c,
                "INSERT INTO tenants (name, is_admin, rate_limit_rps, rate_limit_burst)"
                " VALUES ('admin', true, 1000, 2000) RETURNING id",
                0, NULL, &r))
        goto db_fail;
    char tenant[FB_UUID_LEN + 1];
    snprintf(tenant, sizeof tenant, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    const char *vals[3] = {key_id, tenant, hash_hex};
    if (exec_ok(c,
                "INSERT INTO api_keys (key_id, tenant_id, name, secret_hash)"
                " VALUES ($1, $2::uuid, 'admin (first start)', $3::bytea)",
                3, vals, NULL))
        goto db_fail;
    if (rename(tmp, path) != 0) {
        err = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot rename %s to %s: %s", tmp, path,
                      strerror(errno));
        PQclear(PQexec(c, "ROLLBACK"));
        goto done;
    }
    int dfd = open(cfg->data_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    if (exec_ok(c, "COMMIT", 0, NULL, NULL)) goto db_fail;
    fb_log_json(FB_LOG_INFO, "created the admin tenant and wrote its admin key file",
                json_pack("{s:s, s:s}", "path", path, "tenant_id", tenant));
    goto done;
db_fail:
    PQclear(PQexec(c, "ROLLBACK"));
    err = fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE, "creating the admin tenant failed");
done:
    sodium_memzero(key, sizeof key);
    unlink(tmp);
    return err;
}

/* Writes the bound port to cfg->port_file via a temporary file and rename. */
static int write_port_file(const fb_config *cfg, int port, char *msg, size_t msg_cap)
{
    if (!cfg->port_file[0]) return FB_OK;
    char tmp[FB_CONFIG_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", cfg->port_file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, cfg->port_file) != 0)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot write the port file %s", cfg->port_file);
    return FB_OK;
}

/* ---- the control lock ------------------------------------------------------
 *
 * One fuseboxd of a database runs the control loop: the one whose session holds the
 * control lock (FB_CONTROL_LOCK_SQL, dispatch.h).  The others are standbys: they serve
 * HTTP, bind no worker socket, and ask for the lock every --control-lock-poll-ms on a
 * connection of their own.  The lock is released when its session ends, so a standby
 * takes over once the holder dies; a holder whose connection drops takes the lock again
 * on its next one, or steps down when a standby has it by then (dispatch.c).
 */

/* Asks for the lock on the standby connection (opened when needed); true with the
 * connection handed to *locked when this session holds it now. */
static bool ask_control_lock(fb_server *s, PGconn **locked)
{
    if (s->standby_pg && PQstatus(s->standby_pg) != CONNECTION_OK) {
        PQfinish(s->standby_pg);
        s->standby_pg = NULL;
    }
    if (!s->standby_pg) {
        const char *keys[] = {"dbname", "connect_timeout", "application_name", NULL};
        const char *vals[] = {s->cfg.database_url, "2", "fuseboxd-control", NULL};
        s->standby_pg = PQconnectdbParams(keys, vals, 1);
        if (PQstatus(s->standby_pg) != CONNECTION_OK) {
            PQfinish(s->standby_pg);
            s->standby_pg = NULL;
            return false;
        }
    }
    PGresult *r = PQexec(s->standby_pg, FB_CONTROL_LOCK_SQL);
    bool answered = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
    bool held = answered && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    if (!answered) {
        PQfinish(s->standby_pg);
        s->standby_pg = NULL;
    }
    if (!held) return false;
    *locked = s->standby_pg;
    s->standby_pg = NULL;
    return true;
}

/* From the control loop's thread, when it stepped down: this process is a standby from now
 * on (/readyz), and the keeper stops the loop now rather than at its next poll. */
static void on_step_down(void *arg)
{
    fb_server *s = arg;
    atomic_store(&s->control_active, false);
    pthread_mutex_lock(&s->keeper_mu);
    s->keeper_wake = true;
    pthread_cond_signal(&s->keeper_cv);
    pthread_mutex_unlock(&s->keeper_mu);
}

/* One turn of the keeper: a loop that stepped down is stopped; a standby asks for the
 * lock and starts the loop when it gets it.  An error only when the loop could not start
 * on the lock it got (msg filled; the lock is released again). */
static int control_turn(fb_server *s, char *msg, size_t msg_cap)
{
    if (s->dispatch) {
        if (!fb_dispatch_stepped_down(s->dispatch)) return FB_OK;
        fb_dispatch_stop(s->dispatch);
        s->dispatch = NULL;
        atomic_store(&s->control_active, false);
        s->standby_said = false;
    }
    PGconn *locked = NULL;
    if (!ask_control_lock(s, &locked)) {
        if (!s->standby_said)
            fb_log_json(FB_LOG_INFO, "control loop: standby",
                        json_pack("{s:s, s:i}", "reason",
                                  "another fuseboxd holds the control lock, or PostgreSQL is "
                                  "unreachable",
                                  "poll_ms", s->cfg.control_lock_poll_ms));
        s->standby_said = true;
        return FB_OK;
    }
    /* the loop first: jobs accepted over HTTP find it running */
    if (!(s->dispatch = fb_dispatch_start(&s->cfg, s->artifacts_real, locked, on_step_down, s,
                                          msg, msg_cap)))
        return FB_ERR_UNAVAILABLE;
    atomic_store(&s->control_active, true);
    s->standby_said = false;
    fb_log_json(FB_LOG_INFO, "control loop: active",
                json_pack("{s:s}", "worker_listen", s->cfg.worker_listen));
    return FB_OK;
}

static void *keeper_thread(void *arg)
{
    fb_server *s = arg;
    pthread_mutex_lock(&s->keeper_mu);
    while (!s->keeper_stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        long long ns = until.tv_nsec + (long long)s->cfg.control_lock_poll_ms * 1000000LL;
        until.tv_sec += (time_t)(ns / 1000000000LL);
        until.tv_nsec = (long)(ns % 1000000000LL);
        while (!s->keeper_stop && !s->keeper_wake &&
               pthread_cond_timedwait(&s->keeper_cv, &s->keeper_mu, &until) != ETIMEDOUT) {
        }
        if (s->keeper_stop) break;
        s->keeper_wake = false;
        pthread_mutex_unlock(&s->keeper_mu);
        char why[512];
        if (control_turn(s, why, sizeof why))
            fb_log_json(FB_LOG_WARN, "control loop: cannot start; the control lock is released",
                        json_pack("{s:s}", "detail", why));
        pthread_mutex_lock(&s->keeper_mu);
    }
    pthread_mutex_unlock(&s->keeper_mu);
    return NULL;
}

/* The keeper's mutex and condition (on the monotonic clock), before any control loop can
 * call on_step_down; fb_server_free destroys them after the loop is stopped. */
static int keeper_init(fb_server *s, char *msg, size_t msg_cap)
{
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "cannot set up the control lock's keeper");
    bool ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
              pthread_cond_init(&s->keeper_cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!ok || pthread_mutex_init(&s->keeper_mu, NULL) != 0) {
        if (ok) pthread_cond_destroy(&s->keeper_cv);
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "cannot set up the control lock's keeper");
    }
    s->keeper_ready = true;
    return FB_OK;
}

static int keeper_start(fb_server *s, char *msg, size_t msg_cap)
{
    if (pthread_create(&s->keeper, NULL, keeper_thread, s) != 0)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "cannot start the control lock's keeper");
    s->keeper_started = true;
    return FB_OK;
}

/* Stops the keeper: from then on nothing else starts or stops the loop. */
static void keeper_join(fb_server *s)
{
    if (!s->keeper_started) return;
    pthread_mutex_lock(&s->keeper_mu);
    s->keeper_stop = true;
    pthread_cond_signal(&s->keeper_cv);
    pthread_mutex_unlock(&s->keeper_mu);
    pthread_join(s->keeper, NULL);
    s->keeper_started = false;
}

fb_server *fb_server_new(const fb_config *cfg, char *msg, size_t msg_cap)
{
    static const char *route_names[64], *route_methods[64];
    if (sodium_init() < 0) {
        fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "libsodium failed to initialise");
        return NULL;
    }
    if (fb_n_routes > 64) {
        fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "too many routes");
        return NULL;
    }
    for (int i = 0; i < fb_n_routes; i++) {
        route_names[i] = fb_routes[i].pattern;
        route_methods[i] = fb_routes[i].method;
    }
    fb_server *s = calloc(1, sizeof *s);
    PGconn *c = NULL;
    if (!s) {
        fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    /* the dashboard is optional: without its directory only the API is served */
    s->web_fd = cfg->web_dir[0] ? open(cfg->web_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (s->web_fd < 0)
        fb_log_json(FB_LOG_WARN, "no dashboard",
                    json_pack("{s:s}", "web_dir", cfg->web_dir[0] ? cfg->web_dir : "(none)"));
    uint8_t inst[4];
    randombytes_buf(inst, sizeof inst);
    sodium_bin2hex(s->instance, sizeof s->instance, inst, sizeof inst);
    if (ensure_dir(cfg->data_dir, 0700, msg, msg_cap) ||
        ensure_dir(cfg->artifacts_dir, 0750, msg, msg_cap))
        goto fail;
    if (!realpath(cfg->artifacts_dir, s->artifacts_real)) {
        fb_errf(msg, msg_cap, FB_ERR_IO, "cannot resolve %s: %s", cfg->artifacts_dir,
                strerror(errno));
        goto fail;
    }
    if (!(c = connect_startup(cfg, msg, msg_cap))) goto fail;
    int applied = 0;
    if (fb_migrate_apply(c, cfg->schema_dir, &applied, &s->schema_latest, msg, msg_cap)) goto fail;
    fb_log_json(FB_LOG_INFO, "schema ready",
                json_pack("{s:i, s:i}", "version", s->schema_latest, "applied_now", applied));
    if (bootstrap_admin(c, cfg, msg, msg_cap)) goto fail;
    PQfinish(c);
    c = NULL;
    fb_db_options dbo = {.url = cfg->database_url,
                         .size = cfg->db_pool,
                         .statement_timeout_ms = cfg->request_timeout_ms,
                         .wait_ms = cfg->db_wait_ms};
    if (!(s->db = fb_db_pool_new(&dbo, msg, msg_cap))) goto fail;
    s->auth = fb_auth_new(AUTH_CACHE_TTL_MS);
    s->metrics = fb_metrics_new(fb_n_routes, route_names, route_methods);
    if (!s->auth || !s->metrics) {
        fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* the control loop first when the lock is free (a loop that cannot start on it is a
     * start-up error, as a bad --worker-listen), then its keeper */
    if (keeper_init(s, msg, msg_cap) || control_turn(s, msg, msg_cap) ||
        keeper_start(s, msg, msg_cap))
        goto fail;
    fb_http_routes routes = {
        .routes = fb_routes, .n = fb_n_routes, .stream_open = fb_route_stream_open};
    if (!(s->mhd = fb_http_start(s, &routes, msg, msg_cap))) goto fail;
    s->port = fb_http_port(s->mhd);
    if (write_port_file(cfg, s->port, msg, msg_cap)) goto fail;
    fb_log_json(FB_LOG_INFO, "listening",
                json_pack("{s:s, s:i, s:i, s:i, s:i, s:I}", "address", cfg->listen, "port", s->port,
                          "threads", cfg->threads, "db_pool", cfg->db_pool, "pid", (int)getpid(),
                          "max_body_bytes", (json_int_t)cfg->max_body_bytes));
    return s;
fail:
    PQfinish(c);
    fb_server_free(s);
    return NULL;
}

int fb_server_run(fb_server *s)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    int sig = 0;
    while (sigwait(&set, &sig) != 0) {
    }
    atomic_store(&s->draining, true);
    fb_log_json(FB_LOG_INFO, "shutting down",
                json_pack("{s:s, s:i}", "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                          "in_flight", atomic_load(&s->in_flight)));
    MHD_socket fd = MHD_quiesce_daemon(s->mhd);
    if (fd != MHD_INVALID_SOCKET) close(fd);
    int64_t waited = 0, limit = (int64_t)s->cfg.shutdown_timeout_s * 1000;
    while (atomic_load(&s->in_flight) > 0 && waited < limit) {
        sleep_ms(10);
        waited += 10;
    }
    int left = atomic_load(&s->in_flight);
    MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
    keeper_join(s);
    fb_dispatch_stop(s->dispatch);
    s->dispatch = NULL;
    fb_log_json(
        FB_LOG_INFO, "stopped",
        json_pack("{s:i, s:I}", "unfinished_requests", left, "drain_ms", (json_int_t)waited));
    return left > 0;
}

void fb_server_free(fb_server *s)
{
    if (!s) return;
    if (s->mhd) MHD_stop_daemon(s->mhd);
    keeper_join(s);
    fb_dispatch_stop(s->dispatch);
    PQfinish(s->standby_pg);
    if (s->keeper_ready) {
        pthread_cond_destroy(&s->keeper_cv);
        pthread_mutex_destroy(&s->keeper_mu);
    }
    fb_db_pool_free(s->db);
    fb_auth_free(s->auth);
    fb_metrics_free(s->metrics);
    if (s->web_fd >= 0) close(s->web_fd);
    free(s);
}
