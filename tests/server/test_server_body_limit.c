/*
 * Bodies over a limit are answered with the documented 413 JSON error, whatever
 * their size and transfer encoding: a JSON route (POST /v1/jobs, limit
 * --max-body-bytes) and a dataset upload (PUT /v1/datasets/{name}/splits/{split},
 * limit what the tenant's max_dataset_bytes leaves), each with Content-Length
 * and chunked, just over the limit, 8 times and 64 times it.  The client sends
 * the whole body before it reads, as a client that does not watch for an
 * early answer does; a case with "Expect: 100-continue" waits for the answer
 * first, as curl does for large bodies, and must get the 413 without sending
 * the body.  After every case the database and the tenant's datasets
 * directory are as they were.
 */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"

#define LIMIT 4096 /* --max-body-bytes, and the uploading tenant's max_dataset_bytes */
#define CHUNK 1000 /* bytes per chunk of a chunked body */

static fbt_server S;
static char t_id[64], t_key[128];

typedef enum { ROUTE_JSON, ROUTE_UPLOAD } route_kind;
typedef enum { SEND_ALL, EXPECT_CONTINUE } client_kind;

typedef struct body_case {
    route_kind route;
    bool chunked;
    size_t bytes;
    client_kind client;
} body_case;

static const body_case cases[] = {
    {ROUTE_JSON, false, LIMIT + 1, SEND_ALL},
    {ROUTE_JSON, false, 8 * LIMIT + 1, SEND_ALL},
    {ROUTE_JSON, false, 64 * LIMIT, SEND_ALL},
    {ROUTE_JSON, true, LIMIT + 1, SEND_ALL},
    {ROUTE_JSON, true, 8 * LIMIT + 1, SEND_ALL},
    {ROUTE_JSON, true, 64 * LIMIT, SEND_ALL},
    {ROUTE_JSON, false, 64 * LIMIT, EXPECT_CONTINUE},
    {ROUTE_UPLOAD, false, LIMIT + 1, SEND_ALL},
    {ROUTE_UPLOAD, false, 8 * LIMIT + 1, SEND_ALL},
    {ROUTE_UPLOAD, false, 64 * LIMIT, SEND_ALL},
    {ROUTE_UPLOAD, true, LIMIT + 1, SEND_ALL},
    {ROUTE_UPLOAD, true, 8 * LIMIT + 1, SEND_ALL},
    {ROUTE_UPLOAD, true, 64 * LIMIT, SEND_ALL},
    {ROUTE_UPLOAD, false, 64 * LIMIT, EXPECT_CONTINUE},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* A body of n bytes: a JSON object padded with spaces, or CSV rows. */
static char *make_body(route_kind route, size_t n)
{
    char *b = malloc(n + 1);
    CHECK(b != NULL);
    if (route == ROUTE_JSON) {
        memset(b, ' ', n);
        b[0] = '{';
        b[n - 1] = '}';
    } else {
        static const char head[] = "a,label\n";
        memcpy(b, head, sizeof head - 1);
        for (size_t i = sizeof head - 1; i < n; i++)
            b[i] = (i % 4 == 3) ? '\n' : (i % 4 == 1) ? ',' : '1';
    }
    b[n] = '\0';
    return b;
}

/* Sends the case's request and reads its answer; false when none came. */
static bool exchange(const body_case *c, const char *path, fbt_resp *r, size_t *sent_body)
{
    char *body = make_body(c->route, c->bytes);
    char head[1024];
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                      "Authorization: Bearer %s\r\nContent-Type: %s\r\n%s",
                      c->route == ROUTE_JSON ? "POST" : "PUT", path, t_key,
                      c->route == ROUTE_JSON ? "application/json" : "text/csv",
                      c->client == EXPECT_CONTINUE ? "Expect: 100-continue\r\n" : "");
    if (c->chunked)
        hn += snprintf(head + hn, sizeof head - (size_t)hn, "Transfer-Encoding: chunked\r\n\r\n");
    else
        hn +=
            snprintf(head + hn, sizeof head - (size_t)hn, "Content-Length: %zu\r\n\r\n", c->bytes);
    CHECK(hn > 0 && (size_t)hn < sizeof head);
    int fd = fbt_connect(S.port, 20000);
    CHECK(fd >= 0);
    bool ok = fbt_send_all(fd, head, (size_t)hn);
    *sent_body = 0;
    bool send_body = true;
    if (ok && c->client == EXPECT_CONTINUE) {
        /* wait for 100 Continue or the final answer, whichever comes */
        struct pollfd p = {.fd = fd, .events = POLLIN};
        CHECK(poll(&p, 1, 20000) == 1);
        char peek[16] = "";
        ssize_t n = recv(fd, peek, sizeof peek - 1, MSG_PEEK);
        send_body = n >= 12 && strncmp(peek, "HTTP/1.1 100", 12) == 0;
        if (send_body) {
            char line[64];
            CHECK(recv(fd, line, 25, 0) == 25); /* "HTTP/1.1 100 Continue\r\n\r\n" */
        }
    }
    for (size_t off = 0; ok && send_body && off < c->bytes;) {
        size_t n = c->chunked ? (c->bytes - off < CHUNK ? c->bytes - off : CHUNK) : c->bytes - off;
        if (c->chunked) {
            char line[32];
            int ln = snprintf(line, sizeof line, "%zx\r\n", n);
            ok = fbt_send_all(fd, line, (size_t)ln);
        }
        ok = ok && fbt_send_all(fd, body + off, n);
        if (c->chunked) ok = ok && fbt_send_all(fd, "\r\n", 2);
        if (ok) *sent_body += n;
        off += n;
    }
    if (ok && send_body && c->chunked) ok = fbt_send_all(fd, "0\r\n\r\n", 5);
    free(body);
    shutdown(fd, SHUT_WR);
    int rc = fbt_read_response(fd, r);
    close(fd);
    return rc == 0;
}

static int not_dots(const struct dirent *d)
{
    return strcmp(d->d_name, ".") != 0 && strcmp(d->d_name, "..") != 0;
}

/* The names in the tenant's datasets directory, sorted, one string. */
static char *tenant_entries(void)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/datasets/%s", S.data_dir, t_id);
    char *out = calloc(1, 8192);
    CHECK(out != NULL);
    struct dirent **names = NULL;
    int n = scandir(dir, &names, not_dots, alphasort);
    for (int i = 0; i < n; i++) {
        if (strlen(out) + strlen(names[i]->d_name) + 2 < 8192) {
            strcat(out, names[i]->d_name);
            strcat(out, " ");
        }
        free(names[i]);
    }
    free(names);
    return out;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* the case lines before an abort */
    fbt_require_database();
    fbt_db_create(&S);
    char limit[16];
    snprintf(limit, sizeof limit, "%d", LIMIT);
    const char *args[] = {"--max-body-bytes", limit, NULL};
    fbt_server_start(&S, args);
    char extra[256];
    snprintf(extra, sizeof extra,
             "\"quotas\": {\"max_dataset_bytes\": %d},"
             " \"rate_limit\": {\"requests_per_second\": 1000, \"burst\": 1000}",
             LIMIT);
    fbt_tenant(&S, "uploader", extra, t_id, sizeof t_id, t_key, sizeof t_key);

    char *db_before = fbt_db_fingerprint(&S);
    char *dir_before = tenant_entries();
    int failed = 0;
    for (int i = 0; i < N_CASES; i++) {
        const body_case *c = &cases[i];
        char what[160];
        snprintf(what, sizeof what, "%s, %s, %zu bytes (%.4gx the limit)%s",
                 c->route == ROUTE_JSON ? "POST /v1/jobs" : "dataset upload",
                 c->chunked ? "chunked" : "Content-Length", c->bytes, (double)c->bytes / LIMIT,
                 c->client == EXPECT_CONTINUE ? ", Expect: 100-continue" : "");
        const char *path = c->route == ROUTE_JSON
                               ? "/v1/jobs"
                               : "/v1/datasets/toolarge/splits/train?label_column=label";
        fbt_resp r;
        size_t sent = 0;
        if (!exchange(c, path, &r, &sent)) {
            printf("FAIL %2d %s: no answer (the connection was dropped after %zu body bytes)\n", i,
                   what, sent);
            failed++;
            continue;
        }
        fbt_record(c->route == ROUTE_JSON ? "POST" : "PUT", path, &r);
        json_t *e = json_object_get(r.json, "error");
        const char *code = json_string_value(json_object_get(e, "code"));
        bool good = r.status == 413 && code && strcmp(code, "payload_too_large") == 0 &&
                    json_is_string(json_object_get(e, "message"));
        /* asked to wait, the client must not have had to send the body */
        if (c->client == EXPECT_CONTINUE && sent != 0) good = false;
        printf("%s %2d %s: %d %s (%zu body bytes sent)\n", good ? "ok  " : "FAIL", i, what,
               r.status, code ? code : "", sent);
        if (!good) {
            fprintf(stderr, "%s\n", r.body ? r.body : "(no body)");
            failed++;
        }
        fbt_resp_free(&r);
        char *db_now = fbt_db_fingerprint(&S);
        char *dir_now = tenant_entries();
        if (strcmp(db_now, db_before) != 0 || strcmp(dir_now, dir_before) != 0) {
            printf("FAIL %2d %s: something was stored (directory: %s)\n", i, what, dir_now);
            failed++;
        }
        free(db_now);
        free(dir_now);
    }
    free(db_before);
    free(dir_before);

    /* every refusal was counted, and the server still serves */
    fbt_resp r = fbt_call(&S, "GET", "/metrics", NULL, NULL);
    fbt_expect(&r, 200, NULL, "metrics");
    char want[128];
    snprintf(want, sizeof want,
             "fusebox_errors_total{code=\"payload_too_large\",status=\"413\"} %d", N_CASES);
    if (!failed) CHECK(strstr(r.body, want) != NULL);
    fbt_resp_free(&r);
    if (failed) {
        fprintf(stderr, "%d of %d cases were not answered with the 413 JSON error\n", failed,
                N_CASES);
        fbt_server_dump_log(&S);
        abort();
    }
    CHECK_INT_EQ(fbt_server_stop(&S), 0);
    fbt_db_drop(&S);
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("%d oversized bodies answered 413 payload_too_large, nothing stored\n", N_CASES);
    return 0;
}
