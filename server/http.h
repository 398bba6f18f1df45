/*
 * fuseboxd's HTTP layer over libmicrohttpd: the route table's types, the
 * checks every request passes before a handler runs, and the request and
 * response types handlers use.  The table itself and the upload hook are the
 * routes' (routes.h); fb_http_start() is given them, so this layer links to
 * no handler by name.
 *
 * In the order of Redis's processCommand, a request is refused before any
 * handler runs when its route is unknown (404), its method is not the
 * route's (405), its key is missing, malformed, unknown or revoked (401), it
 * asks for an admin route without an admin key (403), its tenant is over its
 * request rate (429 with Retry-After), its body is larger than the limit
 * (413) or is not application/json where JSON is expected (415), or the
 * JSON is malformed, not UTF-8, nested too deeply or not an object (400).
 * Uploads (FB_BODY_STREAM) are streamed to a file under a limit their route
 * sets instead.
 * Every error answer is {"error": {"code", "message", "field"?}} with a code
 * from base/errors.h, and is counted per code for /metrics.
 */
#ifndef FB_SERVER_HTTP_H
#define FB_SERVER_HTTP_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "auth.h"
#include "errors.h"
#include "metrics.h"

typedef struct fb_server fb_server;
typedef struct fb_req fb_req;

typedef enum fb_route_auth {
    FB_AUTH_NONE,   /* health, readiness, metrics */
    FB_AUTH_TENANT, /* any valid key */
    FB_AUTH_ADMIN   /* keys of the admin tenant only */
} fb_route_auth;

typedef enum fb_route_body {
    FB_BODY_NONE,          /* a body, if any, is read (size-limited) and ignored */
    FB_BODY_JSON,          /* a JSON object is required */
    FB_BODY_JSON_OPTIONAL, /* a JSON object or nothing */
    FB_BODY_STREAM         /* any bytes, written to the file the stream hook gives */
} fb_route_body;

/* A handler fills the response through fb_req_reply_* and returns FB_OK, or
 * returns a negative fb_err after fb_req_fail() described the problem. */
typedef int (*fb_route_fn)(fb_req *req);

typedef struct fb_route {
    const char *method;  /* "GET", "POST", "PATCH", "DELETE" */
    const char *pattern; /* "/v1/jobs/{id}": {name} matches one path segment */
    fb_route_auth auth;
    fb_route_body body;
    fb_route_fn fn;
} fb_route;

#define FB_MAX_PATH_PARAMS 4
#define FB_PATH_PARAM_MAX 128
#define FB_MSG_MAX 512

/*
 * Per-request state, owned by the HTTP layer from the first byte of the
 * request until its response is sent.  Handlers read the public fields.
 */
struct fb_req {
    fb_server *srv;
    const fb_route *route;
    const char *method;
    char path[1024];
    char params[FB_MAX_PATH_PARAMS][FB_PATH_PARAM_MAX + 1];
    fb_auth_entry key; /* the caller's key when the route needs one */
    json_t *json;      /* the parsed body, when there is one */
    const char *body;  /* raw body bytes (body_len of them; NUL-terminated) */
    size_t body_len;
    void *impl; /* the HTTP layer's private part */
};

/* The server a request belongs to (for its pool, auth cache and config). */
struct fb_db_pool *fb_req_db(fb_req *req);

/* Path parameter i (in pattern order). */
const char *fb_req_param(const fb_req *req, int i);

/* A request header (case-insensitive name), or NULL. */
const char *fb_req_header(fb_req *req, const char *name);

/*
 * Query parameters: fb_req_check_query() refuses any parameter not in the
 * NULL-terminated allowed list and any given twice (FB_ERR_BAD_QUERY);
 * fb_req_query() returns a parameter's value or NULL.
 */
int fb_req_check_query(fb_req *req, const char *const *allowed);
const char *fb_req_query(fb_req *req, const char *name);

/*
 * Records why the request failed: the error's message (printf-style) and
 * the offending field (NULL for none).  Returns err, for
 * `return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no job %s", id);`.
 */
int fb_req_fail(fb_req *req, int err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Fails with a message already in msg (from a callee), deriving the field
 * from a leading JSON path ("optimizer.lr: ..."), prefixed by field_prefix. */
int fb_req_fail_msg(fb_req *req, int err, const char *msg, const char *field_prefix);

/* Responds with a JSON document (stolen) and status. */
void fb_req_reply_json(fb_req *req, int status, json_t *body);

/* Lets a client revalidate the 200 response the handler gave: it carries an ETag of its
 * bytes, and a request whose If-None-Match names the same bytes gets 304 Not Modified and
 * no body.  For the reads that dashboards poll. */
void fb_req_revalidate(fb_req *req);

/* Responds with text (copied) of the given content type. */
void fb_req_reply_text(fb_req *req, int status, const char *content_type, const char *text,
                       size_t len);

/* Responds with text the HTTP layer takes ownership of (malloc'd, len bytes). */
void fb_req_reply_owned(fb_req *req, int status, const char *content_type, char *text, size_t len);

/* Responds with the bytes of an open file (fd is closed by the HTTP layer)
 * offered for download as filename, or shown inline when filename is NULL. */
void fb_req_reply_file(fb_req *req, int fd, uint64_t size, const char *content_type,
                       const char *filename);

/* Adds a response header (both copied); at most a few per response.  A
 * Cache-Control header replaces the default "no-store" of successful answers. */
void fb_req_add_header(fb_req *req, const char *name, const char *value);

/*
 * FB_BODY_STREAM routes (uploads) never hold their body in memory and are not
 * bound by --max-body-bytes.  Once the headers passed every other check
 * (route, method, key, rate, and a Content-Type that is absent,
 * application/octet-stream or text/csv), the HTTP layer calls the stream
 * hook the routes gave fb_http_start(): declared is the Content-Length (0
 * when absent or chunked).  It returns FB_OK with *fd, a descriptor open for
 * writing that the HTTP layer then owns and writes the body into, and
 * *limit, the most bytes the body may have (more answers 413); or a negative
 * fb_err after fb_req_fail(), and the request is refused before its body is
 * read.
 */
typedef int (*fb_stream_open_fn)(fb_req *req, uint64_t declared, int *fd, uint64_t *limit);

/* What the HTTP layer serves: the route table (n routes, matched in order)
 * and the hook of its FB_BODY_STREAM routes (NULL when it has none). */
typedef struct fb_http_routes {
    const fb_route *routes;
    int n;
    fb_stream_open_fn stream_open;
} fb_http_routes;

/* The file a FB_BODY_STREAM body was written to (req->body_len bytes, the
 * offset at its end), handed to the caller, who closes it; -1 when there is
 * none or it was taken already. */
int fb_req_take_body_fd(fb_req *req);

/*
 * The parsers the checks above are made of, public so that the fuzz target
 * (tests/fuzz/fuzz_http.c) can feed them hostile bytes without a socket.
 */

/* Matches a NUL-terminated path against a route pattern ("/v1/jobs/{id}":
 * {name} matches one non-empty segment of at most FB_PATH_PARAM_MAX bytes),
 * copying the segments into params (may be NULL) in pattern order.  True on
 * a match; params may be partly written either way. */
bool fb_http_match_pattern(const char *pattern, const char *path,
                           char params[FB_MAX_PATH_PARAMS][FB_PATH_PARAM_MAX + 1]);

/* Decodes %XX escapes of a path or query value in place, except %00, which
 * stays as it is so that a NUL never cuts the string short.  Returns the
 * new length. */
size_t fb_http_unescape(char *val);

/* True when a Content-Type is application/json, optionally with
 * charset=utf-8 and nothing else. */
bool fb_http_is_json_type(const char *ct);

/* An upload's Content-Type: absent (curl -T), application/octet-stream or
 * text/csv; a parameter such as a charset does not matter to a file. */
bool fb_http_is_stream_type(const char *ct);

/* The deepest nesting of arrays and objects in n bytes of JSON text, strings
 * skipped; returns as soon as it exceeds limit. */
int fb_http_json_depth(const char *s, size_t n, int limit);

/* Checks the route table (not empty, every route with a handler, a stream
 * hook when a route streams); FB_OK, or FB_ERR_INTERNAL with msg. */
int fb_http_check_routes(const fb_http_routes *routes, char *msg, size_t msg_cap);

/* Starts the daemon on srv's configured address, serving routes (copied into
 * srv; the table it points to must outlive the daemon, and srv->metrics must
 * have been made for the same table: requests are counted by route index);
 * NULL with msg on failure, a bad table included. */
struct MHD_Daemon *fb_http_start(fb_server *srv, const fb_http_routes *routes, char *msg,
                                 size_t msg_cap);

/* The bound port of a started daemon. */
int fb_http_port(struct MHD_Daemon *d);

#endif
