/*
 * The HTTP layer serves the route table and the stream hook it is given at
 * start (fb_http_start), not names it links to: a table of bad tables is
 * refused with a message and starts nothing; a daemon given a small table of
 * its own answers that table's routes (a handler, a path parameter, 405 with
 * Allow, an upload through the given hook) and 404 for fuseboxd's own
 * routes, which it was not given.  No database: the routes need no key.
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "http.h"
#include "server_impl.h"

static int probe(fb_req *req)
{
    fb_req_reply_text(req, 200, "text/plain", "probe", 5);
    return FB_OK;
}

static int probe_param(fb_req *req)
{
    const char *p = fb_req_param(req, 0);
    fb_req_reply_text(req, 200, "text/plain", p, strlen(p));
    return FB_OK;
}

static int upload(fb_req *req)
{
    int fd = fb_req_take_body_fd(req);
    char text[64];
    int n = snprintf(text, sizeof text, "stored %zu", req->body_len);
    if (fd >= 0) close(fd);
    fb_req_reply_text(req, 200, "text/plain", text, (size_t)n);
    return FB_OK;
}

static atomic_int hook_calls;

static int hook(fb_req *req, uint64_t declared, int *fd, uint64_t *limit)
{
    atomic_fetch_add(&hook_calls, 1);
    FILE *f = tmpfile();
    if (!f) return fb_req_fail(req, FB_ERR_IO, NULL, "no temporary file");
    *fd = dup(fileno(f));
    fclose(f);
    *limit = 64;
    return FB_OK;
}

static const fb_route good[] = {
    {"GET", "/probe", FB_AUTH_NONE, FB_BODY_NONE, probe},
    {"GET", "/probe/{x}", FB_AUTH_NONE, FB_BODY_NONE, probe_param},
    {"PUT", "/upload", FB_AUTH_NONE, FB_BODY_STREAM, upload},
};
static const fb_route no_fn[] = {{"GET", "/probe", FB_AUTH_NONE, FB_BODY_NONE, NULL}};
static const fb_route no_slash[] = {{"GET", "probe", FB_AUTH_NONE, FB_BODY_NONE, probe}};
static const fb_route no_method[] = {{NULL, "/probe", FB_AUTH_NONE, FB_BODY_NONE, probe}};

static void check_tables(fb_server *srv)
{
    const struct {
        const char *name;
        fb_http_routes rt;
        bool null_table;
        const char *msg; /* a substring of the refusal; NULL: accepted */
    } cases[] = {
        {"no table at all", {0}, true, "no routes"},
        {"no routes", {NULL, 3, hook}, false, "no routes"},
        {"zero routes", {good, 0, hook}, false, "no routes"},
        {"negative count", {good, -1, hook}, false, "no routes"},
        {"a route without a handler", {no_fn, 1, NULL}, false, "route 0 has no method, no handler"},
        {"a route without a method", {no_method, 1, NULL}, false, "route 0 has no method"},
        {"a pattern without /", {no_slash, 1, NULL}, false, "not starting with /"},
        {"a stream route without a hook", {good, 3, NULL}, false,
         "PUT /upload streams its body but no stream hook was given"},
        {"no stream route, no hook", {good, 2, NULL}, false, NULL},
        {"a stream route and its hook", {good, 3, hook}, false, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char msg[256] = "";
        const fb_http_routes *rt = cases[i].null_table ? NULL : &cases[i].rt;
        int err = fb_http_check_routes(rt, msg, sizeof msg);
        printf("%-32s %s%s\n", cases[i].name, err ? "refused: " : "accepted", msg);
        if (!cases[i].msg) {
            CHECK_INT_EQ(err, FB_OK);
            continue;
        }
        CHECK_INT_EQ(err, FB_ERR_INTERNAL);
        CHECK(strstr(msg, cases[i].msg) != NULL);
        /* and fb_http_start refuses the same table before it listens */
        char msg2[256] = "";
        CHECK(fb_http_start(srv, rt, msg2, sizeof msg2) == NULL);
        CHECK_STR_EQ(msg2, msg);
        CHECK(srv->routes.routes == NULL);
    }
}

/* One HTTP/1.0 exchange on loopback: the status, and the response's body in
 * body (NUL-terminated). */
static int exchange(int port, const char *request, char *body, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    size_t len = strlen(request);
    CHECK(write(fd, request, len) == (ssize_t)len);
    char buf[8192];
    size_t got = 0;
    ssize_t n;
    while (got < sizeof buf - 1 && (n = read(fd, buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)n;
    close(fd);
    buf[got] = '\0';
    int status = 0;
    CHECK(sscanf(buf, "HTTP/1.%*d %d", &status) == 1);
    const char *b = strstr(buf, "\r\n\r\n");
    snprintf(body, cap, "%s", b ? b + 4 : "");
    return status;
}

int main(void)
{
    static fb_server srv; /* zeroed: no database, no key cache */
    fb_config_defaults(&srv.cfg);
    snprintf(srv.cfg.listen, sizeof srv.cfg.listen, "127.0.0.1");
    srv.cfg.port = 0;
    srv.cfg.threads = 2;
    snprintf(srv.instance, sizeof srv.instance, "test");
    srv.web_fd = -1;
    static const char *names[] = {"/probe", "/probe/{x}", "/upload"};
    static const char *methods[] = {"GET", "GET", "PUT"};
    srv.metrics = fb_metrics_new(3, names, methods);
    CHECK(srv.metrics != NULL);

    check_tables(&srv);

    fb_http_routes rt = {.routes = good, .n = 3, .stream_open = hook};
    char msg[256] = "";
    struct MHD_Daemon *d = fb_http_start(&srv, &rt, msg, sizeof msg);
    if (!d) printf("fb_http_start: %s\n", msg);
    CHECK(d != NULL);
    int port = fb_http_port(d);
    CHECK(port > 0);

    char body[4096];
    CHECK_INT_EQ(exchange(port, "GET /probe HTTP/1.0\r\n\r\n", body, sizeof body), 200);
    CHECK_STR_EQ(body, "probe");
    CHECK_INT_EQ(exchange(port, "GET /probe/abc HTTP/1.0\r\n\r\n", body, sizeof body), 200);
    CHECK_STR_EQ(body, "abc");
    CHECK_INT_EQ(exchange(port, "POST /probe HTTP/1.0\r\nContent-Length: 0\r\n\r\n", body,
                          sizeof body),
                 405);
    CHECK(strstr(body, "method_not_allowed") != NULL);
    /* fuseboxd's own routes are not linked in: this daemon does not know them */
    CHECK_INT_EQ(exchange(port, "GET /healthz HTTP/1.0\r\n\r\n", body, sizeof body), 404);
    CHECK(strstr(body, "route_not_found") != NULL);
    /* an upload goes through the hook given at start */
    CHECK_INT_EQ(exchange(port,
                          "PUT /upload HTTP/1.0\r\nContent-Type: application/octet-stream\r\n"
                          "Content-Length: 5\r\n\r\nhello",
                          body, sizeof body),
                 200);
    CHECK_STR_EQ(body, "stored 5");
    CHECK_INT_EQ(atomic_load(&hook_calls), 1);
    /* and the hook's limit holds */
    char big[512];
    snprintf(big, sizeof big,
             "PUT /upload HTTP/1.0\r\nContent-Type: application/octet-stream\r\n"
             "Content-Length: 100\r\n\r\n%0100d",
             0);
    CHECK_INT_EQ(exchange(port, big, body, sizeof body), 413);
    CHECK_INT_EQ(atomic_load(&hook_calls), 2);

    MHD_stop_daemon(d);
    fb_metrics_free(srv.metrics);
    printf("ok\n");
    return 0;
}
