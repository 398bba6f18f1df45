/*
 * The dashboard's files: GET / answers index.html and GET /static/{file}
 * one file of the web directory (--web-dir, by default the build's web/,
 * where the build copies web/ and the chart library).  No key is needed for
 * them; every call the page makes to /v1 still carries one.
 *
 * Path handling is strict so that nothing but the files of that one flat
 * directory can be read: the route matches exactly one path segment, the
 * name must be 1..64 bytes of [A-Za-z0-9._-] starting with a letter or a
 * digit (no "..", no hidden files, no slashes), its extension must be in the
 * table below, and the file is opened relative to the directory's
 * descriptor without following a symbolic link and must be a regular file.
 * Anything else is the same 404 as an unknown route.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "routes.h"
#include "server_impl.h"

#define STATIC_NAME_MAX 64

typedef struct static_type {
    const char *ext;
    const char *content_type;
} static_type;

static const static_type static_types[] = {
    {".html", "text/html; charset=utf-8"},
    {".js", "text/javascript; charset=utf-8"},
    {".mjs", "text/javascript; charset=utf-8"},
    {".css", "text/css; charset=utf-8"},
    {".svg", "image/svg+xml"},
    {".png", "image/png"},
    {".ico", "image/x-icon"},
    {".json", "application/json"},
};

/* The content type of an acceptable file name, or NULL. */
static const char *static_name_type(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > STATIC_NAME_MAX) return NULL;
    char c0 = name[0];
    if (!((c0 >= 'a' && c0 <= 'z') || (c0 >= 'A' && c0 <= 'Z') || (c0 >= '0' && c0 <= '9')))
        return NULL;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok) return NULL;
    }
    if (strstr(name, "..")) return NULL;
    const char *dot = strrchr(name, '.');
    if (!dot) return NULL;
    for (size_t i = 0; i < sizeof static_types / sizeof static_types[0]; i++)
        if (strcasecmp(dot, static_types[i].ext) == 0) return static_types[i].content_type;
    return NULL;
}

/* Answers one file of the web directory (the name is checked here). */
static int static_send(fb_req *req, const char *name)
{
    const char *type = static_name_type(name);
    int dir = req->srv->web_fd;
    if (!type || dir < 0) return fb_req_fail(req, FB_ERR_NO_ROUTE, NULL, "no route for this path");
    int fd = openat(dir, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        return fb_req_fail(req, FB_ERR_NO_ROUTE, NULL, "no route for this path");
    }
    /* a weak validator from size and modification time: the browser asks
     * again each time (no-cache) and gets 304 while the build left it alone */
    char etag[96];
    snprintf(etag, sizeof etag, "W/\"%llx-%llx-%lx\"", (unsigned long long)st.st_size,
             (unsigned long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
    fb_req_add_header(req, "ETag", etag);
    fb_req_add_header(req, "Cache-Control", "no-cache");
    if (strncmp(type, "text/html", 9) == 0) {
        fb_req_add_header(req, "Content-Security-Policy",
                          "default-src 'self'; img-src 'self' data:; style-src 'self' "
                          "'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'");
        fb_req_add_header(req, "Referrer-Policy", "no-referrer");
    }
    const char *inm = fb_req_header(req, "If-None-Match");
    if (inm && strcmp(inm, etag) == 0) {
        close(fd);
        fb_req_reply_text(req, 304, type, "", 0);
        return FB_OK;
    }
    fb_req_reply_file(req, fd, (uint64_t)st.st_size, type, NULL);
    return FB_OK;
}

int fb_route_static_index(fb_req *req)
{
    return static_send(req, "index.html");
}

int fb_route_static_file(fb_req *req)
{
    return static_send(req, fb_req_param(req, 0));
}
