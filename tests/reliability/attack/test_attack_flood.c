/*
 * Slow clients and floods against a real fuseboxd with its default limits.
 * 1,000 connections are opened and held: a quarter of them are slowloris
 * clients that send their headers one byte at a time and never finish, half
 * stop after the request line, a quarter never send a byte.  While they are
 * held, one thread keeps sending oversized requests (a 100 KB header, 2,000
 * headers, a 10 KB path, a declared 1 GiB body, a 2 MiB body, a chunked
 * body past the limit), each of which must be refused with a 4xx; a health
 * client measures GET /healthz, whose p99 must stay under 100 ms with
 * --strict (the objective, a wall-clock figure) and under ten times that
 * in ctest's run (a liveness bound: a server the flood blocks answers in
 * seconds or not at all; the p99 is printed either way); and a
 * tenant's client submits and lists jobs, every request of which must
 * succeed.  Afterwards the server must give back every connection (its
 * descriptor count returns to where it was), the test's own descriptors
 * must all be closed, and every acknowledged job must be in the database.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"

#define N_HELD 1000
#define N_SLOW 250    /* slowloris: one byte every SLOW_PERIOD_MS each */
#define N_PARTIAL 500 /* the request line, then silence */
#define SLOW_PERIOD_MS 250
#define ATTACK_S 15
#define HEALTH_PERIOD_MS 20
#define P99_OBJECTIVE_MS 100.0
#define RELEASE_S 45

static bool strict; /* --strict: /healthz's p99 held to the objective itself */

static fbt_server S;
static char t_id[64], t_key[128];
/* the oversized requests carry another tenant's key: a tenant that floods
 * uses up its own rate limit (429), not the flooded tenant's */
static char a_id[64], a_key[128];
static atomic_bool stop;

/* ---- descriptors ---------------------------------------------------------- */

static int count_fds(pid_t pid)
{
    char dir[64];
    if (pid)
        snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    else
        snprintf(dir, sizeof dir, "/proc/self/fd");
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - (pid ? 0 : 1); /* opendir's own descriptor */
}

static void raise_nofile(void)
{
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    rlim_t want = 4096;
    if (rl.rlim_cur < want) {
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) {
            printf("SKIP: RLIMIT_NOFILE's hard limit %llu is below %llu\n",
                   (unsigned long long)rl.rlim_max, (unsigned long long)want);
            exit(FB_TEST_SKIP);
        }
        rl.rlim_cur = want;
        CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    }
}

/* ---- a client with deadlines ---------------------------------------------- */

/* Reads until the server closes or the deadline passes; returns the status
 * of the response (0 when there was none). */
static int read_status(int fd)
{
    char buf[4096];
    size_t len = 0;
    for (;;) {
        ssize_t n = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        len += (size_t)n;
        if (len == sizeof buf - 1) len = 16; /* keep the status line only */
    }
    buf[len] = '\0';
    if (len < 12 || strncmp(buf, "HTTP/1.", 7) != 0) return 0;
    return atoi(buf + 9);
}

/* Sends raw bytes (then body_bytes of 'a', sent while the server reads
 * them) and returns the response's status, 0 for none within 5 s. */
static int exchange(const char *head, size_t head_len, size_t body_bytes)
{
    int fd = fbt_connect(S.port, 5000);
    if (fd < 0) return 0;
    bool ok = fbt_send_all(fd, head, head_len);
    static const char chunk[16384] = {0};
    while (ok && body_bytes > 0) {
        size_t n = body_bytes < sizeof chunk ? body_bytes : sizeof chunk;
        /* an early answer is the refusal: stop sending */
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 0) > 0) break;
        ok = fbt_send_all(fd, chunk, n);
        body_bytes -= n;
    }
    shutdown(fd, SHUT_WR);
    int st = read_status(fd);
    close(fd);
    return st;
}

/* ---- the health client ------------------------------------------------------ */

typedef struct samples {
    double ms[4096];
    int n, failed;
} samples;

static void *health_main(void *arg)
{
    samples *s = arg;
    static const char req[] =
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    while (!atomic_load(&stop) && s->n < 4096) {
        double t0 = fbt_now_ms();
        int fd = fbt_connect(S.port, 2000);
        int st = 0;
        if (fd >= 0) {
            if (fbt_send_all(fd, req, sizeof req - 1)) st = read_status(fd);
            close(fd);
        }
        double ms = fbt_now_ms() - t0;
        if (st != 200) s->failed++;
        s->ms[s->n++] = st == 200 ? ms : 1e9;
        usleep(HEALTH_PERIOD_MS * 1000);
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- a tenant's client -------------------------------------------------------- */

typedef struct tenant_client {
    int ok, failed, created;
} tenant_client;

static void *tenant_main(void *arg)
{
    tenant_client *t = arg;
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", t_key);
    const char *get_h[] = {auth, NULL};
    const char *post_h[] = {auth, "Content-Type: application/json", NULL};
    for (int i = 0; !atomic_load(&stop); i++) {
        fbt_resp r;
        int rc;
        if (i % 2 == 0) {
            char name[40];
            snprintf(name, sizeof name, "flood-%d", i);
            const char *spec = fbt_spec(name, 0.1);
            rc = fbt_http(S.port, "POST", "/v1/jobs", post_h, spec, strlen(spec), &r);
            if (rc == 0 && r.status == 201) t->created++;
            if (rc != 0 || r.status != 201) {
                fprintf(stderr, "POST /v1/jobs during the flood: %d %s\n", r.status,
                        r.body ? r.body : "(no response)");
                t->failed++;
            } else {
                t->ok++;
            }
        } else {
            rc = fbt_http(S.port, "GET", "/v1/jobs?limit=5", get_h, NULL, 0, &r);
            if (rc != 0 || r.status != 200) {
                fprintf(stderr, "GET /v1/jobs during the flood: %d %s\n", r.status,
                        r.body ? r.body : "(no response)");
                t->failed++;
            } else {
                t->ok++;
            }
        }
        fbt_resp_free(&r);
        usleep(100 * 1000);
    }
    return NULL;
}

/* ---- oversized requests -------------------------------------------------------- */

enum { BIG_HEADER, MANY_HEADERS, LONG_PATH, HUGE_DECLARED, BIG_BODY, BIG_CHUNKED, N_KINDS };
static const char *const kind_name[N_KINDS] = {"100 KB header", "2,000 headers",
                                               "10 KB path",    "declared 1 GiB body",
                                               "2 MiB body",    "3 MiB chunked body"};

typedef struct oversize {
    int sent[N_KINDS], refused[N_KINDS], other[N_KINDS], last_status[N_KINDS];
    double slowest_ms[N_KINDS];
} oversize;

static int oversized(int kind)
{
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", a_key);
    size_t cap = 256 * 1024;
    char *buf = malloc(cap);
    CHECK(buf != NULL);
    size_t n = 0, body = 0;
    switch (kind) {
    case BIG_HEADER:
        n = (size_t)snprintf(
            buf, cap,
            "GET /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\nX-Big: ", auth);
        memset(buf + n, 'a', 100000);
        n += 100000;
        n += (size_t)snprintf(buf + n, cap - n, "\r\n\r\n");
        break;
    case MANY_HEADERS:
        n = (size_t)snprintf(
            buf, cap, "GET /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n", auth);
        for (int i = 0; i < 2000; i++)
            n += (size_t)snprintf(buf + n, cap - n, "X-Many-%d: %032d\r\n", i, i);
        n += (size_t)snprintf(buf + n, cap - n, "\r\n");
        break;
    case LONG_PATH:
        n = (size_t)snprintf(buf, cap, "GET /v1/jobs/");
        memset(buf + n, 'a', 10000);
        n += 10000;
        n += (size_t)snprintf(buf + n, cap - n,
                              " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n\r\n", auth);
        break;
    case HUGE_DECLARED:
        n = (size_t)snprintf(
            buf, cap,
            "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\nContent-Type: "
            "application/json\r\nContent-Length: 1073741824\r\n\r\n",
            auth);
        body = 64 * 1024; /* the server must answer without waiting for the rest */
        break;
    case BIG_BODY:
        n = (size_t)snprintf(
            buf, cap,
            "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\nContent-Type: "
            "application/json\r\nContent-Length: 2097152\r\n\r\n",
            auth);
        body = 2097152;
        break;
    case BIG_CHUNKED: {
        n = (size_t)snprintf(
            buf, cap,
            "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\nContent-Type: "
            "application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
            auth);
        /* 48 chunks of 64 KiB: 3 MiB, three times the default limit */
        int st = 0;
        int fd = fbt_connect(S.port, 5000);
        if (fd >= 0) {
            bool ok = fbt_send_all(fd, buf, n);
            memset(buf, '[', 65536);
            for (int i = 0; ok && i < 48; i++) {
                struct pollfd p = {.fd = fd, .events = POLLIN};
                if (poll(&p, 1, 0) > 0) break;
                char line[32];
                int ln = snprintf(line, sizeof line, "10000\r\n");
                ok = fbt_send_all(fd, line, (size_t)ln) && fbt_send_all(fd, buf, 65536) &&
                     fbt_send_all(fd, "\r\n", 2);
            }
            if (ok) fbt_send_all(fd, "0\r\n\r\n", 5);
            shutdown(fd, SHUT_WR);
            st = read_status(fd);
            close(fd);
        }
        free(buf);
        return st;
    }
    default:
        abort();
    }
    int st = exchange(buf, n, body);
    free(buf);
    return st;
}

static void *oversize_main(void *arg)
{
    oversize *o = arg;
    while (!atomic_load(&stop)) {
        for (int k = 0; k < N_KINDS && !atomic_load(&stop); k++) {
            double t0 = fbt_now_ms();
            int st = oversized(k);
            double ms = fbt_now_ms() - t0;
            if (ms > o->slowest_ms[k]) o->slowest_ms[k] = ms;
            o->sent[k]++;
            o->last_status[k] = st;
            if (st >= 400 && st < 500)
                o->refused[k]++;
            else
                o->other[k]++;
        }
        usleep(50 * 1000);
    }
    return NULL;
}

/* ---- the held connections ------------------------------------------------------ */

static void test_flood(void)
{
    int self_before = count_fds(0);
    int server_before = count_fds(S.pid);
    int held[N_HELD];
    int opened = 0;
    for (int i = 0; i < N_HELD; i++) {
        held[i] = fbt_connect(S.port, 5000);
        if (held[i] < 0) {
            fprintf(stderr, "connection %d of %d could not be opened: %s\n", i, N_HELD,
                    strerror(errno));
            abort();
        }
        opened++;
        if (i >= N_SLOW && i < N_SLOW + N_PARTIAL)
            CHECK(fbt_send_all(held[i], "GET /v1/jobs HTTP/1.1\r\n", 23));
        else if (i < N_SLOW)
            CHECK(fbt_send_all(held[i], "G", 1));
    }
    /* the server holds them all: one descriptor each */
    int server_held = 0;
    for (int i = 0; i < 100; i++) {
        server_held = count_fds(S.pid) - server_before;
        if (server_held >= N_HELD) break;
        usleep(50 * 1000);
    }
    printf("flood: %d connections opened, the server holds %d more descriptors\n", opened,
           server_held);
    /* a few of the server's own descriptors (database, logs) come and go */
    CHECK(server_held >= N_HELD - 8);

    samples *hs = calloc(1, sizeof *hs);
    tenant_client tc = {0};
    oversize os = {0};
    CHECK(hs != NULL);
    pthread_t th, tt, to;
    CHECK(pthread_create(&th, NULL, health_main, hs) == 0);
    CHECK(pthread_create(&tt, NULL, tenant_main, &tc) == 0);
    CHECK(pthread_create(&to, NULL, oversize_main, &os) == 0);

    /* slowloris: each slow connection gets one more byte of a header that
     * never ends, every SLOW_PERIOD_MS */
    static const char script[] = "ET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    size_t pos[N_SLOW] = {0};
    int slow_bytes = 0, slow_closed = 0;
    double t_end = fbt_now_ms() + ATTACK_S * 1000.0;
    const int ticks = SLOW_PERIOD_MS / 10;
    for (int tick = 0; fbt_now_ms() < t_end; tick++) {
        for (int i = tick % ticks; i < N_SLOW; i += ticks) {
            if (held[i] < 0) continue;
            char c = pos[i] < sizeof script - 1 ? script[pos[i]] : 'a';
            if (send(held[i], &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
                pos[i]++;
                slow_bytes++;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
                close(held[i]);
                held[i] = -1;
                slow_closed++;
            }
        }
        usleep(10 * 1000);
    }
    atomic_store(&stop, true);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK(pthread_join(tt, NULL) == 0);
    CHECK(pthread_join(to, NULL) == 0);

    /* the connections were still open at the end (closed by the server = lost
     * for the attacker, not a failure; counted) */
    int still_open = 0;
    for (int i = 0; i < N_HELD; i++) {
        if (held[i] < 0) continue;
        struct pollfd p = {.fd = held[i], .events = POLLIN};
        char c;
        if (poll(&p, 1, 0) == 0 || recv(held[i], &c, 1, MSG_DONTWAIT) > 0) still_open++;
        close(held[i]);
    }
    printf("flood: slowloris sent %d bytes on %d connections (%d closed by the server);"
           " %d of %d connections still open after %d s\n",
           slow_bytes, N_SLOW, slow_closed, still_open, N_HELD, ATTACK_S);

    qsort(hs->ms, (size_t)hs->n, sizeof hs->ms[0], cmp_double);
    CHECK(hs->n >= 50);
    int i99 = (int)((hs->n * 99 + 99) / 100) - 1;
    double p50 = hs->ms[hs->n / 2], p99 = hs->ms[i99], max = hs->ms[hs->n - 1];
    printf("flood: /healthz %d checks, %d failed, p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", hs->n,
           hs->failed, p50, p99, hs->failed ? 0.0 : max);
    printf("flood: tenant client %d requests ok, %d failed, %d jobs created\n", tc.ok, tc.failed,
           tc.created);
    for (int k = 0; k < N_KINDS; k++)
        printf("flood: %-20s %3d sent, %3d refused with a 4xx, %d otherwise (last status %d,"
               " slowest answer %.0f ms)\n",
               kind_name[k], os.sent[k], os.refused[k], os.other[k], os.last_status[k],
               os.slowest_ms[k]);
    CHECK_INT_EQ(hs->failed, 0);
    printf("flood: /healthz p99 %.1f ms against %s %.0f ms\n", p99,
           strict ? "the objective" : "a liveness bound of ten times the objective,",
           strict ? P99_OBJECTIVE_MS : 10 * P99_OBJECTIVE_MS);
    CHECK(p99 < (strict ? P99_OBJECTIVE_MS : 10 * P99_OBJECTIVE_MS));
    CHECK_INT_EQ(tc.failed, 0);
    CHECK(tc.ok >= 10);
    for (int k = 0; k < N_KINDS; k++) {
        CHECK(os.sent[k] >= 1);
        CHECK_INT_EQ(os.other[k], 0);
    }
    free(hs);

    /* every job the tenant was told about is in the database */
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM jobs WHERE tenant_id = '%s'", t_id);
    CHECK_INT_EQ(atoi(fbt_sql_value(&S, sql)), tc.created);

    /* the server gives every connection back, and so does the test */
    int server_after = 0;
    double t_close = fbt_now_ms();
    for (int i = 0; i < RELEASE_S * 20; i++) {
        server_after = count_fds(S.pid);
        if (server_after <= server_before + 4) break;
        if (i % 20 == 0)
            printf("flood: %d server descriptors after %.1f s\n", server_after,
                   (fbt_now_ms() - t_close) / 1e3);
        usleep(50 * 1000);
    }
    printf("flood: server descriptors %d before, %d after %.1f s\n", server_before, server_after,
           (fbt_now_ms() - t_close) / 1e3);
    CHECK(server_after <= server_before + 4);
    CHECK_INT_EQ(count_fds(0), self_before);
    fbt_resp r = fbt_call(&S, "GET", "/healthz", NULL, NULL);
    fbt_expect(&r, 200, NULL, "healthz after the flood");
    fbt_resp_free(&r);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--strict") != 0) {
            fprintf(stderr, "usage: %s [--strict]\n", argv[0]);
            return 2;
        }
        strict = true;
    }
    fbt_require_database();
    raise_nofile();
    fbt_db_create(&S);
    fbt_server_start(&S, NULL);
    fbt_tenant(&S, "flooded", "", t_id, sizeof t_id, t_key, sizeof t_key);
    fbt_tenant(&S, "attacker", "", a_id, sizeof a_id, a_key, sizeof a_key);
    test_flood();
    CHECK_INT_EQ(fbt_server_stop(&S), 0);
    fbt_db_drop(&S);
    printf("ok\n");
    return 0;
}
