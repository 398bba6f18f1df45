/*
 * The dashboard's static files: GET / and GET /static/{file} serve the files
 * of --web-dir with their content types and ETags and need no key, while
 * every attempt to read something else (dot-dot segments, encoded slashes,
 * absolute paths, hidden files, symbolic links, directories, unknown types,
 * NUL bytes) answers 404 and never the bytes of a file outside the
 * directory.  The API behind it still wants its key.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"

#define SECRET "top-secret-outside-web-dir"

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
}

/* A raw request line, so that nothing normalises the path on our side. */
static fbt_resp raw_get(fbt_server *s, const char *target)
{
    char req[1024];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                     target);
    fbt_resp r;
    CHECK_INT_EQ(fbt_http_raw(s->port, req, (size_t)n, &r), 0);
    return r;
}

static void expect_hidden(fbt_server *s, const char *target)
{
    fbt_resp r = raw_get(s, target);
    if (r.status == 200 || (r.body && strstr(r.body, SECRET))) {
        fprintf(stderr, "GET %s: status %d\n%s\n", target, r.status, r.body ? r.body : "");
        abort();
    }
    /* 404 from the route checks; 400 when libmicrohttpd refuses the line */
    CHECK(r.status == 404 || r.status == 400);
    fbt_resp_free(&r);
}

int main(void)
{
    fbt_require_database();
    fbt_server s = {0};
    fbt_db_create(&s);

    char root[] = "/tmp/fbt-web-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    char web[300], sub[320], cmd[700];
    snprintf(web, sizeof web, "%s/www", root);
    snprintf(sub, sizeof sub, "%s/sub.js", web);
    CHECK_INT_EQ(mkdir(web, 0755), 0);
    CHECK_INT_EQ(mkdir(sub, 0755), 0); /* a directory with a served extension */
    write_file(root, "secret.js", SECRET);
    write_file(root, "secret.html", SECRET);
    write_file(web, "index.html", "<!doctype html><title>fusebox</title>");
    write_file(web, "app.js", "export const x = 1;\n");
    write_file(web, "style.css", "body { margin: 0; }\n");
    write_file(web, ".hidden.js", SECRET);
    write_file(web, "notes.txt", SECRET);
    char target[400], link[400];
    snprintf(target, sizeof target, "%s/secret.js", root);
    snprintf(link, sizeof link, "%s/link.js", web);
    CHECK_INT_EQ(symlink(target, link), 0);

    const char *extra[] = {"--web-dir", web, NULL};
    fbt_server_start(&s, extra);

    /* the page and its files, without a key */
    fbt_resp r = fbt_call(&s, "GET", "/", NULL, NULL);
    fbt_expect(&r, 200, NULL, "GET /");
    CHECK(strstr(r.body, "<title>fusebox</title>") != NULL);
    CHECK_STR_EQ(fbt_header(&r, "Content-Type"), "text/html; charset=utf-8");
    CHECK(fbt_header(&r, "Content-Security-Policy") != NULL);
    CHECK(fbt_header(&r, "Content-Disposition") == NULL);
    fbt_resp_free(&r);

    r = fbt_call(&s, "GET", "/static/app.js", NULL, NULL);
    fbt_expect(&r, 200, NULL, "GET /static/app.js");
    CHECK_STR_EQ(r.body, "export const x = 1;\n");
    CHECK_STR_EQ(fbt_header(&r, "Content-Type"), "text/javascript; charset=utf-8");
    CHECK_STR_EQ(fbt_header(&r, "Cache-Control"), "no-cache");
    char etag[128];
    snprintf(etag, sizeof etag, "%s", fbt_header(&r, "ETag"));
    CHECK(etag[0] == 'W');
    fbt_resp_free(&r);

    /* revalidation: the same ETag answers 304 without a body */
    char inm[200];
    snprintf(inm, sizeof inm, "If-None-Match: %s", etag);
    const char *hdr[] = {inm, NULL};
    r = fbt_call_h(&s, "GET", "/static/app.js", NULL, NULL, hdr);
    CHECK_INT_EQ(r.status, 304);
    CHECK_INT_EQ((long long)r.body_len, 0);
    fbt_resp_free(&r);

    r = fbt_call(&s, "GET", "/static/style.css", NULL, NULL);
    fbt_expect(&r, 200, NULL, "GET /static/style.css");
    CHECK_STR_EQ(fbt_header(&r, "Content-Type"), "text/css; charset=utf-8");
    fbt_resp_free(&r);

    /* GET only */
    r = fbt_call(&s, "POST", "/static/app.js", NULL, "{}");
    fbt_expect(&r, 405, "method_not_allowed", "POST /static/app.js");
    fbt_resp_free(&r);
    r = fbt_call(&s, "DELETE", "/", NULL, NULL);
    fbt_expect(&r, 405, "method_not_allowed", "DELETE /");
    fbt_resp_free(&r);

    /* everything that is not a plain file of the directory */
    static const char *const attempts[] = {
        "/static/../secret.js",
        "/static/..%2fsecret.js",
        "/static/..%2Fsecret.js",
        "/static/%2e%2e%2fsecret.js",
        "/static/%2e%2e/secret.js",
        "/static/..",
        "/static/.",
        "/static/",
        "/static",
        "/static//tmp/secret.js",
        "/static/%2ftmp%2fsecret.js",
        "/static/%2Fetc%2Fpasswd",
        "/static/....%2f....%2fsecret.js",
        "/static/..%5csecret.js",
        "/static/.hidden.js",
        "/static/link.js",
        "/static/sub.js",
        "/static/notes.txt",
        "/static/index.html%00.js",
        "/static/app.js%00",
        "/static/missing.js",
        "/../secret.html",
        "/%2e%2e/secret.html",
        "/secret.html",
        "/index.html",
        "//etc/passwd",
        "/static/app.js/",
        "/static/app.js/..",
    };
    for (size_t i = 0; i < sizeof attempts / sizeof attempts[0]; i++)
        expect_hidden(&s, attempts[i]);

    /* a long name is refused, not truncated into a match */
    char longname[200] = "/static/";
    for (int i = 0; i < 100; i++)
        strcat(longname, "a");
    strcat(longname, ".js");
    expect_hidden(&s, longname);

    /* the API still needs its key */
    r = fbt_call(&s, "GET", "/v1/jobs", NULL, NULL);
    fbt_expect(&r, 401, "unauthorized", "GET /v1/jobs without a key");
    fbt_resp_free(&r);

    CHECK_INT_EQ(fbt_server_stop(&s), 0);
    fbt_db_drop(&s);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK_INT_EQ(system(cmd), 0);
    printf("static files: ok\n");
    return 0;
}
