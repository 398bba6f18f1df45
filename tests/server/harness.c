/*
 * The fuseboxd test harness: databases, the server process, HTTP, records.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static pthread_mutex_t record_mu = PTHREAD_MUTEX_INITIALIZER;

double fbt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

const char *fbt_require_database(void)
{
    const char *url = getenv("FUSEBOX_TEST_DATABASE_URL");
    if (!url || !url[0]) {
        exit(fb_test_missing("FUSEBOX_TEST_DATABASE_URL is not set (scripts/test sets it)"));
    }
    return url;
}

/* ---- database ---- */

static PGconn *connect_or_die(const char *conninfo)
{
    PGconn *c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "cannot connect to %s: %s", conninfo, PQerrorMessage(c));
        abort();
    }
    PQclear(PQexec(c, "SET client_min_messages = warning"));
    return c;
}

static void record_path(char *buf, size_t cap);

void fbt_db_create(fbt_server *s)
{
    const char *base = fbt_require_database();
    char rec[1024];
    record_path(rec, sizeof rec);
    unlink(rec);
    PGconn *c = connect_or_die(base);
    unsigned seed = (unsigned)(getpid() ^ (unsigned)time(NULL));
    FILE *ur = fopen("/dev/urandom", "rb");
    if (ur) {
        if (fread(&seed, sizeof seed, 1, ur) != 1) seed ^= 0x5eed;
        fclose(ur);
    }
    snprintf(s->dbname, sizeof s->dbname, "fbt_%d_%08x", (int)getpid(), seed);
    char sql[128];
    snprintf(sql, sizeof sql, "CREATE DATABASE %s", s->dbname);
    PGresult *r = NULL;
    for (int attempt = 0; attempt < 20; attempt++) {
        r = PQexec(c, sql);
        if (PQresultStatus(r) == PGRES_COMMAND_OK) break;
        /* template1 may be busy with a concurrent CREATE DATABASE */
        fprintf(stderr, "CREATE DATABASE: %s", PQresultErrorMessage(r));
        PQclear(r);
        r = NULL;
        sleep_ms(200);
    }
    CHECK(r != NULL);
    PQclear(r);
    const char *pass = PQpass(c);
    snprintf(s->db_url, sizeof s->db_url, "host=%s port=%s user=%s dbname=%s%s%s", PQhost(c),
             PQport(c), PQuser(c), s->dbname, pass && pass[0] ? " password=" : "",
             pass && pass[0] ? pass : "");
    PQfinish(c);
    s->sql = connect_or_die(s->db_url);
    printf("test database %s\n", s->dbname);
}

void fbt_remove_data_dir(fbt_server *s)
{
    if (!s->data_dir[0] || strncmp(s->data_dir, "/tmp/fbt-data-", 14) != 0) return;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->data_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", s->data_dir);
    s->data_dir[0] = '\0';
}

void fbt_db_drop(fbt_server *s)
{
    fbt_remove_data_dir(s);
    if (s->sql) PQfinish(s->sql);
    s->sql = NULL;
    PGconn *c = connect_or_die(getenv("FUSEBOX_TEST_DATABASE_URL"));
    char sql[160];
    snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s WITH (FORCE)", s->dbname);
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        fprintf(stderr, "DROP DATABASE: %s", PQresultErrorMessage(r));
    PQclear(r);
    PQfinish(c);
}

PGresult *fbt_sql(fbt_server *s, const char *sql)
{
    PGresult *r = PQexec(s->sql, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        fprintf(stderr, "SQL failed: %s\n%s", sql, PQresultErrorMessage(r));
        abort();
    }
    return r;
}

const char *fbt_sql_value(fbt_server *s, const char *sql)
{
    static char buf[4096];
    PGresult *r = fbt_sql(s, sql);
    CHECK_INT_EQ(PQntuples(r), 1);
    snprintf(buf, sizeof buf, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return buf;
}

char *fbt_db_fingerprint(fbt_server *s)
{
    static const char *const tables[] = {"tenants",          "api_keys",   "jobs",
                                         "sweeps",           "job_events", "job_metrics",
                                         "checkpoints",      "datasets",   "tenant_queued_counts",
                                         "schema_migrations"};
    size_t cap = 2048, used = 0;
    char *out = malloc(cap);
    CHECK(out != NULL);
    out[0] = '\0';
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        /* a queued job's reason is the control loop's to write, at its own pace */
        const char *row = strcmp(tables[i], "jobs") == 0 ? "(to_jsonb(t) - 'queue_reason')::text"
                                                        : "t::text";
        char sql[320];
        snprintf(sql, sizeof sql,
                 "SELECT count(*) || ':' || coalesce(md5(string_agg(%s, ',' ORDER BY"
                 " %s)), '-') FROM %s t",
                 row, row, tables[i]);
        used +=
            (size_t)snprintf(out + used, cap - used, "%s=%s;", tables[i], fbt_sql_value(s, sql));
        CHECK(used < cap);
    }
    return out;
}

/* ---- server process ---- */

static const char *binary_dir(void)
{
    const char *b = getenv("FB_BINARY_DIR");
    if (!b || !b[0]) {
        fprintf(stderr, "FB_BINARY_DIR is not set; run the test through ctest\n");
        abort();
    }
    return b;
}

void fbt_server_dump_log(const fbt_server *s)
{
    FILE *f = fopen(s->log_path, "r");
    if (!f) return;
    fprintf(stderr, "---- fuseboxd log (%s) ----\n", s->log_path);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f) && n++ < 400)
        fputs(line, stderr);
    fclose(f);
    fprintf(stderr, "---- end of fuseboxd log ----\n");
}

static void read_admin_key(fbt_server *s)
{
    char path[300];
    snprintf(path, sizeof path, "%s/admin.key", s->data_dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    CHECK(fgets(s->admin_key, sizeof s->admin_key, f) != NULL);
    fclose(f);
    s->admin_key[strcspn(s->admin_key, "\n")] = '\0';
}

void fbt_server_start(fbt_server *s, const char *const *extra)
{
    if (!s->data_dir[0]) {
        snprintf(s->data_dir, sizeof s->data_dir, "/tmp/fbt-data-XXXXXX");
        CHECK(mkdtemp(s->data_dir) != NULL);
    }
    char port_file[300], exe[600];
    snprintf(port_file, sizeof port_file, "%s/port", s->data_dir);
    unlink(port_file);
    snprintf(s->log_path, sizeof s->log_path, "%s/fuseboxd.log", s->data_dir);
    snprintf(exe, sizeof exe, "%s/server/fuseboxd", binary_dir());
    const char *argv[64] = {exe, "--database-url", s->db_url, "--data-dir", s->data_dir, "--port",
                            "0", "--port-file",    port_file, "--listen",   "127.0.0.1",
                            /* tests run side by side: each control loop on a port of its own
                             * (an extra flag may still choose one) */
                            "--worker-listen", "tcp://127.0.0.1:0"};
    int argc = 13;
    for (int i = 0; extra && extra[i] && argc < 62; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* a test that aborts must not leave its server running */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        int fd = open(s->log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    s->pid = pid;
    double start = fbt_now_ms();
    s->port = 0;
    while (fbt_now_ms() - start < 60000) {
        FILE *f = fopen(port_file, "r");
        if (f) {
            if (fscanf(f, "%d", &s->port) != 1) s->port = 0;
            fclose(f);
            if (s->port > 0) break;
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "fuseboxd exited during start-up (status %d)\n", st);
            fbt_server_dump_log(s);
            abort();
        }
        sleep_ms(20);
    }
    if (s->port <= 0) {
        fbt_server_dump_log(s);
        abort();
    }
    for (;;) {
        fbt_resp r;
        int rc = fbt_http(s->port, "GET", "/readyz", NULL, NULL, 0, &r);
        int status = r.status;
        fbt_resp_free(&r);
        if (rc == 0 && status == 200) break;
        CHECK(fbt_now_ms() - start < 60000);
        sleep_ms(20);
    }
    read_admin_key(s);
    fbt_resp r = fbt_call(s, "GET", "/v1/tenant", s->admin_key, NULL);
    fbt_expect(&r, 200, NULL, "admin GET /v1/tenant");
    snprintf(s->admin_tenant, sizeof s->admin_tenant, "%s",
             json_string_value(json_object_get(r.json, "id")));
    fbt_resp_free(&r);
    printf("fuseboxd pid %d on port %d (log %s)\n", (int)s->pid, s->port, s->log_path);
}

int fbt_server_stop(fbt_server *s)
{
    if (s->pid <= 0) return 0;
    kill(s->pid, SIGTERM);
    double start = fbt_now_ms();
    int st = 0;
    for (;;) {
        pid_t w = waitpid(s->pid, &st, WNOHANG);
        if (w == s->pid) break;
        if (fbt_now_ms() - start > 30000) {
            fprintf(stderr, "fuseboxd did not stop within 30 s of SIGTERM\n");
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &st, 0);
            fbt_server_dump_log(s);
            abort();
        }
        sleep_ms(10);
    }
    s->pid = 0;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    return 128 + WTERMSIG(st);
}

/* ---- HTTP ---- */

int fbt_connect(int port, int timeout_ms)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

bool fbt_send_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        buf += n;
        len -= (size_t)n;
    }
    return true;
}

int fbt_read_response(int fd, fbt_resp *out)
{
    memset(out, 0, sizeof *out);
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    CHECK(buf != NULL);
    for (;;) {
        if (len == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
            CHECK(buf != NULL);
        }
        ssize_t n = recv(fd, buf + len, cap - len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    /* an interim 100 Continue (to a client that sent Expect) comes before the answer */
    char *start = buf;
    while (strncmp(start, "HTTP/1.1 100", 12) == 0 && strstr(start, "\r\n\r\n"))
        start = strstr(start, "\r\n\r\n") + 4;
    char *sep = strstr(start, "\r\n\r\n");
    if (!sep || strncmp(start, "HTTP/1.", 7) != 0) {
        free(buf);
        return -1;
    }
    size_t head_len = (size_t)(sep - start);
    out->head = strndup(start, head_len);
    out->status = atoi(start + 9);
    size_t body_len = len - (size_t)(start - buf) - head_len - 4;
    const char *cl = fbt_header(out, "Content-Length");
    if (cl && (size_t)atoll(cl) < body_len) body_len = (size_t)atoll(cl);
    out->body = malloc(body_len + 1);
    CHECK(out->body != NULL);
    memcpy(out->body, sep + 4, body_len);
    out->body[body_len] = '\0';
    out->body_len = body_len;
    free(buf);
    out->json = json_loadb(out->body, out->body_len, 0, NULL);
    return 0;
}

int fbt_http(int port, const char *method, const char *path, const char *const *headers,
             const char *body, size_t body_len, fbt_resp *out)
{
    memset(out, 0, sizeof *out);
    int fd = fbt_connect(port, 60000);
    if (fd < 0) return -1;
    size_t cap = 8192 + strlen(path), used = 0;
    char *head = malloc(cap);
    CHECK(head != NULL);
    used += (size_t)snprintf(head + used, cap - used,
                             "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n",
                             method, path, port);
    bool te = false;
    for (int i = 0; headers && headers[i]; i++) {
        if (strncasecmp(headers[i], "Transfer-Encoding:", 18) == 0) te = true;
        used += (size_t)snprintf(head + used, cap - used, "%s\r\n", headers[i]);
    }
    if (body && !te)
        used += (size_t)snprintf(head + used, cap - used, "Content-Length: %zu\r\n", body_len);
    used += (size_t)snprintf(head + used, cap - used, "\r\n");
    CHECK(used < cap);
    bool ok = fbt_send_all(fd, head, used);
    free(head);
    if (ok && body && body_len) {
        /* like Expect: 100-continue: an early refusal arrives before we send */
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (body_len < 65536 || poll(&p, 1, 150) == 0) fbt_send_all(fd, body, body_len);
    }
    shutdown(fd, SHUT_WR);
    int rc = fbt_read_response(fd, out);
    close(fd);
    return rc;
}

int fbt_http_raw(int port, const char *raw, size_t len, fbt_resp *out)
{
    memset(out, 0, sizeof *out);
    int fd = fbt_connect(port, 60000);
    if (fd < 0) return -1;
    fbt_send_all(fd, raw, len);
    shutdown(fd, SHUT_WR);
    int rc = fbt_read_response(fd, out);
    close(fd);
    return rc;
}

const char *fbt_header(const fbt_resp *r, const char *name)
{
    static __thread char buf[512];
    if (!r->head) return NULL;
    size_t n = strlen(name);
    const char *p = strstr(r->head, "\r\n");
    while (p) {
        p += 2;
        if (strncasecmp(p, name, n) == 0 && p[n] == ':') {
            const char *v = p + n + 1;
            while (*v == ' ')
                v++;
            size_t len = strcspn(v, "\r\n");
            if (len >= sizeof buf) len = sizeof buf - 1;
            memcpy(buf, v, len);
            buf[len] = '\0';
            return buf;
        }
        p = strstr(p, "\r\n");
    }
    return NULL;
}

void fbt_resp_free(fbt_resp *r)
{
    free(r->head);
    free(r->body);
    json_decref(r->json);
    memset(r, 0, sizeof *r);
}

/* ---- records and validation ---- */

static void record_path(char *buf, size_t cap)
{
    char exe[512] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    snprintf(buf, cap, "%s/tests/server/responses-%s.jsonl", binary_dir(), basename(exe));
}

void fbt_record(const char *method, const char *path, const fbt_resp *r)
{
    char file[1024];
    record_path(file, sizeof file);
    const char *ct = fbt_header(r, "Content-Type");
    char query_free[1024];
    snprintf(query_free, sizeof query_free, "%s", path);
    query_free[strcspn(query_free, "?")] = '\0';
    json_t *rec = json_pack("{s:s, s:s, s:i, s:s, s:O?}", "method", method, "path", query_free,
                            "status", r->status, "content_type", ct ? ct : "", "body", r->json);
    char *line = json_dumps(rec, JSON_COMPACT);
    json_decref(rec);
    if (!line) return;
    pthread_mutex_lock(&record_mu);
    FILE *f = fopen(file, "a");
    if (f) {
        fprintf(f, "%s\n", line);
        fclose(f);
    }
    pthread_mutex_unlock(&record_mu);
    free(line);
}

int fbt_validate_recorded(void)
{
    const char *src = getenv("FB_SOURCE_DIR");
    char mod[1024], file[1024], cmd[4096];
    CHECK(src != NULL);
    snprintf(mod, sizeof mod, "%s/tests/server/node_modules/ajv/package.json", src);
    record_path(file, sizeof file);
    if (access(mod, R_OK) != 0 || system("node --version > /dev/null 2>&1") != 0)
        return fb_test_missing("OpenAPI validation: run `npm ci` in %s/tests/server (needs node)",
                               src);
    snprintf(cmd, sizeof cmd,
             "node '%s/tests/server/openapi/validate.mjs' '%s/api/openapi.yaml' '%s'", src, src,
             file);
    int rc = system(cmd);
    return (rc == 0) ? 0 : 1;
}

/* ---- conveniences ---- */

fbt_resp fbt_call_h(fbt_server *s, const char *method, const char *path, const char *key,
                    const char *body, const char *const *headers)
{
    const char *h[16];
    int n = 0;
    char auth[200];
    if (key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
        h[n++] = auth;
    }
    if (body) h[n++] = "Content-Type: application/json";
    for (int i = 0; headers && headers[i] && n < 15; i++)
        h[n++] = headers[i];
    h[n] = NULL;
    fbt_resp r;
    int rc = fbt_http(s->port, method, path, h, body, body ? strlen(body) : 0, &r);
    if (rc != 0) {
        fprintf(stderr, "%s %s: no response\n", method, path);
        fbt_server_dump_log(s);
        abort();
    }
    fbt_record(method, path, &r);
    return r;
}

fbt_resp fbt_call(fbt_server *s, const char *method, const char *path, const char *key,
                  const char *body)
{
    return fbt_call_h(s, method, path, key, body, NULL);
}

void fbt_expect(const fbt_resp *r, int status, const char *code, const char *what)
{
    const char *got = NULL;
    json_t *e = r->json ? json_object_get(r->json, "error") : NULL;
    if (e) got = json_string_value(json_object_get(e, "code"));
    if (r->status != status || (code && (!got || strcmp(got, code) != 0))) {
        fprintf(stderr, "%s: expected %d %s, got %d %s\n%s\n", what, status, code ? code : "",
                r->status, got ? got : "", r->body ? r->body : "(no body)");
        abort();
    }
}

void fbt_tenant(fbt_server *s, const char *name, const char *extra, char *id, size_t id_cap,
                char *key, size_t key_cap)
{
    char body[1024], path[128];
    snprintf(body, sizeof body, "{\"name\": \"%s\"%s%s}", name, extra && extra[0] ? ", " : "",
             extra ? extra : "");
    fbt_resp r = fbt_call(s, "POST", "/v1/tenants", s->admin_key, body);
    fbt_expect(&r, 201, NULL, "create tenant");
    snprintf(id, id_cap, "%s", json_string_value(json_object_get(r.json, "id")));
    fbt_resp_free(&r);
    snprintf(path, sizeof path, "/v1/tenants/%s/keys", id);
    r = fbt_call(s, "POST", path, s->admin_key, NULL);
    fbt_expect(&r, 201, NULL, "create key");
    snprintf(key, key_cap, "%s", json_string_value(json_object_get(r.json, "key")));
    fbt_resp_free(&r);
}

const char *fbt_spec(const char *name, double lr)
{
    static __thread char buf[1024];
    snprintf(
        buf, sizeof buf,
        "{\"name\": \"%s\", \"dataset\": \"fashion-mnist\", \"model\": {\"input\": [1, 28, 28],"
        " \"layers\": [{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 10}]},"
        " \"batch_size\": 32, \"steps\": 100, \"optimizer\": {\"type\": \"sgd\", \"lr\": %g}}",
        name, lr);
    return buf;
}

const char *fbt_job(fbt_server *s, const char *key, const char *name)
{
    static char id[64];
    fbt_resp r = fbt_call(s, "POST", "/v1/jobs", key, fbt_spec(name, 0.01));
    fbt_expect(&r, 201, NULL, "submit job");
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(r.json, "id")));
    fbt_resp_free(&r);
    return id;
}

void fbt_fill(const char *in, char *out, size_t cap, const char *keys, const char *const *vals)
{
    size_t o = 0;
    for (const char *p = in; *p && o + 64 < cap; p++) {
        const char *rep = NULL;
        const char *k = p[0] == '{' && p[1] && p[2] == '}' ? strchr(keys, p[1]) : NULL;
        if (k) rep = vals[k - keys];
        if (rep) {
            o += (size_t)snprintf(out + o, cap - o, "%s", rep);
            p += 2;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
}
