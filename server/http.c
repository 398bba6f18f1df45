/*
 * The HTTP layer: libmicrohttpd callbacks, route matching, the checks that
 * run before any handler (method, route, auth, rate, size, media type, JSON
 * shape), error bodies, access logs and request metrics.
 *
 * libmicrohttpd calls on_request() once with the headers, once per body
 * chunk, and once more at the end of the body.  Everything that can be
 * decided from the headers is decided on the first call.  A body refused
 * while it arrives (chunked, or over an upload's limit) is read to its end
 * and dropped, however long it is, and only then answered: libmicrohttpd can
 * queue an answer only before the body or after it, never in between.  A
 * refusal decided from the headers is answered at once when the client asked
 * "Expect: 100-continue" (it has not sent the body) or declared a body of
 * more than DISCARD_FACTOR times the limit (reading it all would cost more
 * than it is worth); otherwise the body is drained first, so that the client
 * reads the answer instead of a reset connection.
 */
#include "http.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "db.h"
#include "log.h"
#include "server_impl.h"
#include "utf8.h"

#define MAX_EXTRA_HEADERS 6
#define DISCARD_FACTOR 8 /* declared bodies past this many times the limit: answer at once */

typedef struct req_impl {
    struct MHD_Connection *conn;
    int route_index; /* srv->routes.n when no route matched */
    int64_t start_ns;
    char request_id[32];
    /* refusal decided before the handler */
    int err;
    char msg[FB_MSG_MAX];
    char field[128];
    int retry_after;  /* seconds, for 429 and 503 */
    char allow[64];   /* for 405 */
    bool respond_now; /* answer on the first call, without reading the body */
    /* body */
    char *body;
    size_t body_len, body_cap;
    bool body_seen;
    uint64_t discarded;  /* body bytes dropped after the refusal */
    int body_fd;         /* FB_BODY_STREAM: the file the body goes to, -1 otherwise */
    uint64_t body_limit; /* FB_BODY_STREAM: its limit */
    /* response */
    int status;
    char *resp_data;
    size_t resp_len;
    const char *content_type;
    int file_fd;
    uint64_t file_size;
    char filename[160];
    int n_headers;
    char *hdr_name[MAX_EXTRA_HEADERS];
    char *hdr_value[MAX_EXTRA_HEADERS];
    bool conditional; /* fb_req_revalidate: an ETag, and 304 when it matches */
    bool responded;
} req_impl;

static req_impl *impl_of(const fb_req *req)
{
    return (req_impl *)req->impl;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- handler-facing helpers -------------------------------------------- */

fb_db_pool *fb_req_db(fb_req *req)
{
    return req->srv->db;
}

const char *fb_req_param(const fb_req *req, int i)
{
    return (i >= 0 && i < FB_MAX_PATH_PARAMS) ? req->params[i] : "";
}

const char *fb_req_header(fb_req *req, const char *name)
{
    return MHD_lookup_connection_value(impl_of(req)->conn, MHD_HEADER_KIND, name);
}

const char *fb_req_query(fb_req *req, const char *name)
{
    return MHD_lookup_connection_value(impl_of(req)->conn, MHD_GET_ARGUMENT_KIND, name);
}

typedef struct query_check {
    const char *const *allowed;
    const char *bad; /* first offending key */
    bool duplicate;
    const char *seen[16];
    int n_seen;
} query_check;

static enum MHD_Result query_iter(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value)
{
    (void)kind;
    (void)value;
    query_check *q = cls;
    bool ok = false;
    for (const char *const *a = q->allowed; *a; a++)
        if (strcmp(*a, key) == 0) ok = true;
    if (!ok) {
        q->bad = key;
        return MHD_NO;
    }
    for (int i = 0; i < q->n_seen; i++) {
        if (strcmp(q->seen[i], key) == 0) {
            q->bad = key;
            q->duplicate = true;
            return MHD_NO;
        }
    }
    if (q->n_seen < 16) q->seen[q->n_seen++] = key;
    return MHD_YES;
}

int fb_req_check_query(fb_req *req, const char *const *allowed)
{
    query_check q = {.allowed = allowed};
    MHD_get_connection_values(impl_of(req)->conn, MHD_GET_ARGUMENT_KIND, query_iter, &q);
    if (!q.bad) return FB_OK;
    char safe[65];
    size_t n = 0;
    for (const char *s = q.bad; *s && n < sizeof safe - 1; s++)
        safe[n++] = (*s >= 0x20 && *s < 0x7f && *s != '"' && *s != '\\') ? *s : '?';
    safe[n] = '\0';
    if (q.duplicate)
        return fb_req_fail(req, FB_ERR_BAD_QUERY, safe, "query parameter \"%s\" is given twice",
                           safe);
    char list[256] = "";
    size_t used = 0;
    for (const char *const *a = allowed; *a && used < sizeof list; a++)
        used +=
            (size_t)snprintf(list + used, sizeof list - used, "%s%s", a == allowed ? "" : ", ", *a);
    return fb_req_fail(req, FB_ERR_BAD_QUERY, safe, "unknown query parameter \"%s\" (allowed: %s)",
                       safe, allowed[0] ? list : "none");
}

int fb_req_fail(fb_req *req, int err, const char *field, const char *fmt, ...)
{
    req_impl *im = impl_of(req);
    im->err = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(im->msg, sizeof im->msg, fmt, ap);
    va_end(ap);
    snprintf(im->field, sizeof im->field, "%s", field ? field : "");
    return err;
}

int fb_req_fail_msg(fb_req *req, int err, const char *msg, const char *field_prefix)
{
    req_impl *im = impl_of(req);
    im->err = err;
    snprintf(im->msg, sizeof im->msg, "%s", msg && msg[0] ? msg : fb_err_describe(err));
    /* a leading JSON path ("optimizer.lr: ...", "model.layers[2] (linear): ...") */
    size_t n = 0;
    while (msg && msg[n] &&
           (isalnum((unsigned char)msg[n]) || msg[n] == '_' || msg[n] == '.' || msg[n] == '[' ||
            msg[n] == ']'))
        n++;
    bool path = msg && n > 0 && (msg[n] == ':' || msg[n] == ' ') && !isdigit((unsigned char)msg[0]);
    if (path && msg[n] == ' ' && msg[n + 1] != '(') path = false;
    if (path && strncmp(msg, "invalid", 7) == 0) path = false;
    if (path)
        snprintf(im->field, sizeof im->field, "%s%s%.*s", field_prefix ? field_prefix : "",
                 field_prefix && field_prefix[0] ? "." : "", (int)n, msg);
    else
        snprintf(im->field, sizeof im->field, "%s", "");
    return err;
}

static void set_response(req_impl *im, int status, char *data, size_t len, const char *type)
{
    free(im->resp_data);
    im->status = status;
    im->resp_data = data;
    im->resp_len = len;
    im->content_type = type;
}

void fb_req_reply_json(fb_req *req, int status, json_t *body)
{
    req_impl *im = impl_of(req);
    char *text = body ? json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(body);
    if (!text) {
        fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory building the response");
        return;
    }
    set_response(im, status, text, strlen(text), "application/json");
}

void fb_req_revalidate(fb_req *req)
{
    impl_of(req)->conditional = true;
}

/* The entity tag of a response's bytes: their length and 64-bit FNV-1a hash, so that equal
 * tags mean equal bytes for any practical purpose (a poller re-reads at most its own page). */
static void body_etag(char *tag, size_t cap, const char *data, size_t len)
{
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)data[i]) * 1099511628211ULL;
    snprintf(tag, cap, "\"%zx-%016llx\"", len, (unsigned long long)h);
}

/* Whether an If-None-Match value names tag: a comma-separated list of entity tags, each
 * possibly weak (W/), compared weakly as RFC 9110 asks of If-None-Match, or "*". */
static bool none_match_hits(const char *inm, const char *tag)
{
    size_t tn = strlen(tag);
    const char *p = inm;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (!*p) break;
        if (*p == '*') return true;
        if (p[0] == 'W' && p[1] == '/') p += 2;
        const char *e = p;
        if (*e == '"') {
            e = strchr(e + 1, '"');
            if (!e) return false;
            e++;
        } else {
            while (*e && *e != ',') e++;
        }
        if ((size_t)(e - p) == tn && memcmp(p, tag, tn) == 0) return true;
        p = e;
    }
    return false;
}

/* A revalidated 200 gets its ETag and "private, no-cache" (stored, revalidated each time);
 * when the request's If-None-Match names that tag the answer becomes 304 without a body. */
static void apply_conditional(fb_req *req, req_impl *im)
{
    if (!im->conditional || im->err || im->status != 200 || im->file_fd >= 0 || !im->resp_data)
        return;
    char tag[48];
    body_etag(tag, sizeof tag, im->resp_data, im->resp_len);
    fb_req_add_header(req, "ETag", tag);
    fb_req_add_header(req, MHD_HTTP_HEADER_CACHE_CONTROL, "private, no-cache");
    const char *inm = fb_req_header(req, MHD_HTTP_HEADER_IF_NONE_MATCH);
    if (inm && none_match_hits(inm, tag)) {
        free(im->resp_data);
        im->resp_data = NULL;
        im->resp_len = 0;
        im->status = 304;
    }
}

void fb_req_reply_text(fb_req *req, int status, const char *content_type, const char *text,
                       size_t len)
{
    req_impl *im = impl_of(req);
    char *copy = malloc(len + 1);
    if (!copy) {
        fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory building the response");
        return;
    }
    memcpy(copy, text, len);
    copy[len] = '\0';
    set_response(im, status, copy, len, content_type);
}

void fb_req_reply_owned(fb_req *req, int status, const char *content_type, char *text, size_t len)
{
    set_response(impl_of(req), status, text, len, content_type);
}

void fb_req_reply_file(fb_req *req, int fd, uint64_t size, const char *content_type,
                       const char *filename)
{
    req_impl *im = impl_of(req);
    set_response(im, 200, NULL, 0, content_type);
    if (im->file_fd >= 0) close(im->file_fd);
    im->file_fd = fd;
    im->file_size = size;
    snprintf(im->filename, sizeof im->filename, "%s", filename ? filename : "");
}

int fb_req_take_body_fd(fb_req *req)
{
    req_impl *im = impl_of(req);
    int fd = im->body_fd;
    im->body_fd = -1;
    return fd;
}

void fb_req_add_header(fb_req *req, const char *name, const char *value)
{
    req_impl *im = impl_of(req);
    if (im->n_headers >= MAX_EXTRA_HEADERS) return;
    char *n = strdup(name), *v = strdup(value);
    if (!n || !v) {
        free(n);
        free(v);
        return;
    }
    im->hdr_name[im->n_headers] = n;
    im->hdr_value[im->n_headers] = v;
    im->n_headers++;
}

/* ---- request checks ----------------------------------------------------- */

bool fb_http_match_pattern(const char *pattern, const char *path,
                           char params[FB_MAX_PATH_PARAMS][FB_PATH_PARAM_MAX + 1])
{
    const char *p = pattern, *s = path;
    int np = 0;
    while (*p && *s) {
        if (*p != '/' || *s != '/') return false;
        p++;
        s++;
        const char *pe = strchr(p, '/'), *se = strchr(s, '/');
        size_t pl = pe ? (size_t)(pe - p) : strlen(p), sl = se ? (size_t)(se - s) : strlen(s);
        if (pl > 0 && p[0] == '{') {
            if (sl == 0 || sl > FB_PATH_PARAM_MAX || np >= FB_MAX_PATH_PARAMS) return false;
            if (params) {
                memcpy(params[np], s, sl);
                params[np][sl] = '\0';
            }
            np++;
        } else if (pl != sl || strncmp(p, s, pl) != 0) {
            return false;
        }
        p += pl;
        s += sl;
    }
    return *p == '\0' && *s == '\0';
}

/* Finds the route; on a path match with another method fills allow. */
static int find_route(const char *method, const char *path, fb_req *req, char *allow,
                      size_t allow_cap, bool *path_known)
{
    *path_known = false;
    allow[0] = '\0';
    size_t used = 0;
    const fb_http_routes *rt = &req->srv->routes;
    for (int i = 0; i < rt->n; i++) {
        const fb_route *r = &rt->routes[i];
        if (!fb_http_match_pattern(r->pattern, path, NULL)) continue;
        *path_known = true;
        if (strcmp(r->method, method) == 0) {
            fb_http_match_pattern(r->pattern, path, req->params);
            return i;
        }
        if (!strstr(allow, r->method) && used < allow_cap)
            used += (size_t)snprintf(allow + used, allow_cap - used, "%s%s", used ? ", " : "",
                                     r->method);
    }
    return -1;
}

typedef struct key_lookup {
    const char *key_id;
    fb_auth_entry entry;
    bool found;
} key_lookup;

static int lookup_key_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    key_lookup *k = arg;
    const char *vals[1] = {k->key_id};
    int err;
    PGresult *r = fb_db_query(c, "auth_key",
                              "SELECT k.tenant_id, encode(k.secret_hash, 'hex'),"
                              " k.revoked_at IS NOT NULL, t.is_admin, t.rate_limit_rps,"
                              " t.rate_limit_burst"
                              " FROM api_keys k JOIN tenants t ON t.id = k.tenant_id"
                              " WHERE k.key_id = $1",
                              1, vals, &err, msg, msg_cap);
    if (!r) return err;
    k->found = PQntuples(r) == 1;
    if (k->found) {
        fb_auth_entry *e = &k->entry;
        memset(e, 0, sizeof *e);
        snprintf(e->key_id, sizeof e->key_id, "%s", k->key_id);
        snprintf(e->tenant_id, sizeof e->tenant_id, "%s", PQgetvalue(r, 0, 0));
        size_t bin_len = 0;
        if (sodium_hex2bin(e->hash, sizeof e->hash, PQgetvalue(r, 0, 1),
                           strlen(PQgetvalue(r, 0, 1)), NULL, &bin_len, NULL) != 0 ||
            bin_len != sizeof e->hash)
            k->found = false;
        e->revoked = PQgetvalue(r, 0, 2)[0] == 't';
        e->is_admin = PQgetvalue(r, 0, 3)[0] == 't';
        e->rate_rps = strtod(PQgetvalue(r, 0, 4), NULL);
        e->rate_burst = atoi(PQgetvalue(r, 0, 5));
    }
    PQclear(r);
    return FB_OK;
}

/* Authenticates the request and applies the tenant's rate limit. */
static int check_auth(fb_req *req)
{
    req_impl *im = impl_of(req);
    const char *h = fb_req_header(req, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h)
        return fb_req_fail(req, FB_ERR_UNAUTHORIZED, NULL,
                           "missing \"Authorization: Bearer <key>\" header");
    if (strncasecmp(h, "Bearer ", 7) != 0)
        return fb_req_fail(req, FB_ERR_UNAUTHORIZED, NULL,
                           "the Authorization header must read \"Bearer <key>\"");
    const char *key = h + 7;
    while (*key == ' ')
        key++;
    char key_id[FB_KEY_ID_LEN + 1];
    uint8_t hash[FB_KEY_HASH_BYTES];
    if (!fb_auth_key_parse(key, key_id, hash))
        return fb_req_fail(req, FB_ERR_UNAUTHORIZED, NULL, "the API key is malformed");
    fb_auth_entry e;
    if (!fb_auth_cache_get(req->srv->auth, key_id, &e)) {
        key_lookup k = {.key_id = key_id};
        char msg[FB_MSG_MAX];
        int err = fb_db_run(req->srv->db, lookup_key_txn, &k, msg, sizeof msg);
        if (err) {
            im->retry_after = 1;
            return fb_req_fail(req, err, NULL, "%s", msg);
        }
        if (!k.found) return fb_req_fail(req, FB_ERR_UNAUTHORIZED, NULL, "unknown API key");
        e = k.entry;
        fb_auth_cache_put(req->srv->auth, &e);
    }
    if (!fb_auth_hash_equal(e.hash, hash))
        return fb_req_fail(req, FB_ERR_UNAUTHORIZED, NULL, "unknown API key");
    if (e.revoked) return fb_req_fail(req, FB_ERR_UNAUTHORIZED, NULL, "the API key was revoked");
    req->key = e;
    if (req->route->auth == FB_AUTH_ADMIN && !e.is_admin)
        return fb_req_fail(req, FB_ERR_FORBIDDEN, NULL, "this route needs an admin key");
    int retry = 1;
    if (!fb_auth_rate_take(req->srv->auth, e.tenant_id, e.rate_rps, e.rate_burst, &retry)) {
        im->retry_after = retry;
        return fb_req_fail(req, FB_ERR_RATE_LIMITED, NULL,
                           "over the tenant's rate of %.6g requests/s (burst %d); retry after %d s",
                           e.rate_rps, e.rate_burst, retry);
    }
    return FB_OK;
}

bool fb_http_is_json_type(const char *ct)
{
    if (!ct) return false;
    while (*ct == ' ')
        ct++;
    if (strncasecmp(ct, "application/json", 16) != 0) return false;
    const char *p = ct + 16;
    while (*p == ' ')
        p++;
    if (!*p) return true;
    if (*p != ';') return false;
    p++;
    while (*p == ' ')
        p++;
    if (strncasecmp(p, "charset=", 8) != 0) return false;
    p += 8;
    if (*p == '"') p++;
    if (strncasecmp(p, "utf-8", 5) != 0) return false;
    p += 5;
    if (*p == '"') p++;
    while (*p == ' ')
        p++;
    return *p == '\0';
}

/* Does the request announce a body (Content-Length > 0 or chunked)? */
static bool has_body(fb_req *req, uint64_t *declared)
{
    const char *cl = fb_req_header(req, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *te = fb_req_header(req, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    *declared = 0;
    if (cl) {
        *declared = strtoull(cl, NULL, 10);
        return *declared > 0;
    }
    return te != NULL;
}

/* Did the client ask to be told before it sends the body (RFC 9110, 10.1.1)? */
static bool expects_continue(fb_req *req)
{
    const char *e = fb_req_header(req, MHD_HTTP_HEADER_EXPECT);
    return e && strcasecmp(e, "100-continue") == 0;
}

bool fb_http_is_stream_type(const char *ct)
{
    if (!ct) return true;
    while (*ct == ' ')
        ct++;
    size_t n = strcspn(ct, "; ");
    return (n == 24 && strncasecmp(ct, "application/octet-stream", 24) == 0) ||
           (n == 8 && strncasecmp(ct, "text/csv", 8) == 0);
}

/* The checks of a FB_BODY_STREAM route: its media type, then where the body
 * goes and how long it may be (the routes' stream hook). */
static void check_stream(fb_req *req, uint64_t declared)
{
    req_impl *im = impl_of(req);
    if (!fb_http_is_stream_type(fb_req_header(req, MHD_HTTP_HEADER_CONTENT_TYPE))) {
        fb_req_fail(req, FB_ERR_UNSUPPORTED_MEDIA_TYPE, NULL,
                    "send the file as Content-Type: application/octet-stream (or text/csv)");
    } else {
        int fd = -1;
        uint64_t limit = 0;
        int err = req->srv->routes.stream_open(req, declared, &fd, &limit);
        if (!err && declared > limit) {
            close(fd);
            fb_req_fail(req, FB_ERR_PAYLOAD_TOO_LARGE, NULL,
                        "the body of %llu bytes exceeds this upload's limit of %llu bytes",
                        (unsigned long long)declared, (unsigned long long)limit);
        } else if (!err) {
            im->body_fd = fd;
            im->body_limit = limit;
            return;
        } else if (!im->err) {
            fb_req_fail(req, err, NULL, "%s", fb_err_describe(err));
        }
    }
    if (declared > (uint64_t)req->srv->cfg.max_body_bytes * DISCARD_FACTOR) im->respond_now = true;
}

/* Everything decidable from the request line and headers. */
static void check_headers(fb_req *req, const char *method)
{
    req_impl *im = impl_of(req);
    char allow[64];
    bool path_known;
    int ri = find_route(method, req->path, req, allow, sizeof allow, &path_known);
    if (ri < 0) {
        if (path_known) {
            snprintf(im->allow, sizeof im->allow, "%s", allow);
            fb_req_fail(req, FB_ERR_METHOD_NOT_ALLOWED, NULL,
                        "%s is not allowed here (allowed: %s)", method, allow);
        } else {
            fb_req_fail(req, FB_ERR_NO_ROUTE, NULL, "no route for this path");
        }
        return;
    }
    im->route_index = ri;
    req->route = &req->srv->routes.routes[ri];
    if (req->route->auth != FB_AUTH_NONE && check_auth(req)) return;
    uint64_t declared;
    bool body = has_body(req, &declared);
    if (req->route->body == FB_BODY_STREAM) {
        check_stream(req, declared);
        return;
    }
    size_t limit = req->srv->cfg.max_body_bytes;
    if (declared > limit) {
        fb_req_fail(req, FB_ERR_PAYLOAD_TOO_LARGE, NULL,
                    "the body of %llu bytes exceeds the limit of %zu bytes",
                    (unsigned long long)declared, limit);
        if (declared > (uint64_t)limit * DISCARD_FACTOR) im->respond_now = true;
        return;
    }
    if (req->route->body == FB_BODY_JSON || (req->route->body == FB_BODY_JSON_OPTIONAL && body)) {
        const char *ct = fb_req_header(req, MHD_HTTP_HEADER_CONTENT_TYPE);
        if (!fb_http_is_json_type(ct)) {
            fb_req_fail(req, FB_ERR_UNSUPPORTED_MEDIA_TYPE, NULL,
                        "the body must be sent as Content-Type: application/json");
            return;
        }
    }
}

int fb_http_json_depth(const char *s, size_t n, int limit)
{
    int depth = 0, max = 0;
    bool in_str = false, esc = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (esc)
                esc = false;
            else if (c == '\\')
                esc = true;
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"') {
            in_str = true;
        } else if (c == '{' || c == '[') {
            if (++depth > max) max = depth;
            if (max > limit) return max;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return max;
}

/* Parses the body of a JSON route into req->json. */
static int parse_body(fb_req *req)
{
    req_impl *im = impl_of(req);
    if (im->body_len == 0) {
        if (req->route->body == FB_BODY_JSON_OPTIONAL) return FB_OK;
        return fb_req_fail(req, FB_ERR_JSON_SYNTAX, NULL, "the body is empty; send a JSON object");
    }
    size_t bad_at;
    if (!fb_utf8_valid(im->body, im->body_len, &bad_at))
        return fb_req_fail(req, FB_ERR_BAD_ENCODING, NULL,
                           "the body is not valid UTF-8 (byte offset %zu)", bad_at);
    int max = req->srv->cfg.json_max_depth;
    if (fb_http_json_depth(im->body, im->body_len, max) > max)
        return fb_req_fail(req, FB_ERR_JSON_TOO_DEEP, NULL,
                           "the body nests arrays and objects deeper than %d levels", max);
    json_error_t jerr;
    json_t *root =
        json_loadb(im->body, im->body_len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root)
        return fb_req_fail(req, FB_ERR_JSON_SYNTAX, NULL, "invalid JSON at line %d column %d: %s",
                           jerr.line, jerr.column, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return fb_req_fail(req, FB_ERR_NOT_OBJECT, NULL, "the body must be a JSON object");
    }
    req->json = root;
    return FB_OK;
}

/* ---- responses ------------------------------------------------------------ */

static json_t *error_body(const req_impl *im)
{
    json_t *e = json_pack("{s:s, s:s}", "code", fb_err_code(im->err), "message",
                          im->msg[0] ? im->msg : fb_err_describe(im->err));
    if (e && im->field[0]) json_object_set_new(e, "field", json_string(im->field));
    return json_pack("{s:o}", "error", e);
}

static void add_header(struct MHD_Response *r, const char *name, const char *value)
{
    MHD_add_response_header(r, name, value);
}

/* Builds and queues the response of the request (an error when im->err). */
static enum MHD_Result send_response(fb_req *req)
{
    req_impl *im = impl_of(req);
    struct MHD_Response *r;
    if (im->err) {
        if (im->file_fd >= 0) {
            close(im->file_fd);
            im->file_fd = -1;
        }
        im->status = fb_err_http_status(im->err);
        json_t *body = error_body(im);
        char *text = body ? json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(body);
        if (!text) text = strdup("{\"error\":{\"code\":\"out_of_memory\",\"message\":\"\"}}");
        set_response(im, im->status, text, text ? strlen(text) : 0, "application/json");
    }
    apply_conditional(req, im);
    if (im->file_fd >= 0) {
        r = MHD_create_response_from_fd64(im->file_size, im->file_fd);
        if (r) {
            im->file_fd = -1; /* libmicrohttpd closes it now */
            if (im->filename[0]) {
                char disp[256];
                snprintf(disp, sizeof disp, "attachment; filename=\"%s\"", im->filename);
                add_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, disp);
            }
        }
    } else {
        r = MHD_create_response_from_buffer(
            im->resp_len, im->resp_data ? im->resp_data : (char *)"",
            im->resp_data ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
        if (r) im->resp_data = NULL;
    }
    if (!r) return MHD_NO;
    add_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
               im->content_type ? im->content_type : "application/json");
    /* API answers are never cached; a handler may say otherwise (static files) */
    bool cache_set = false;
    for (int i = 0; i < im->n_headers; i++)
        if (strcasecmp(im->hdr_name[i], MHD_HTTP_HEADER_CACHE_CONTROL) == 0) cache_set = true;
    if (!cache_set || im->err) add_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    add_header(r, "X-Request-Id", im->request_id);
    add_header(r, "X-Content-Type-Options", "nosniff");
    if (im->err == FB_ERR_UNAUTHORIZED)
        add_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"fusebox\"");
    if (im->err == FB_ERR_METHOD_NOT_ALLOWED) add_header(r, MHD_HTTP_HEADER_ALLOW, im->allow);
    if (im->err == FB_ERR_RATE_LIMITED || im->err == FB_ERR_UNAVAILABLE) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", im->retry_after > 0 ? im->retry_after : 1);
        add_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    for (int i = 0; i < im->n_headers; i++)
        add_header(r, im->hdr_name[i], im->hdr_value[i]);
    if (atomic_load(&req->srv->draining) || im->respond_now)
        add_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(im->conn, (unsigned)im->status, r);
    MHD_destroy_response(r);
    im->responded = true;
    return ok;
}

/* Runs the route's handler once the whole body is in. */
static void run_handler(fb_req *req)
{
    req_impl *im = impl_of(req);
    req->body = im->body ? im->body : "";
    req->body_len = im->body_len;
    if ((req->route->body == FB_BODY_JSON || req->route->body == FB_BODY_JSON_OPTIONAL) &&
        parse_body(req))
        return;
    int err = req->route->fn(req);
    if (err && !im->err) fb_req_fail(req, err, NULL, "%s", fb_err_describe(err));
    if (!im->err && !im->status)
        fb_req_fail(req, FB_ERR_INTERNAL, NULL, "the handler gave no response");
    if (im->err == FB_ERR_UNAVAILABLE && im->retry_after <= 0) im->retry_after = 1;
}

/* Writes all n bytes, retrying short writes; false with errno on failure. */
static bool write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = ENOSPC;
            return false;
        }
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* ---- libmicrohttpd callbacks ----------------------------------------------- */

static void copy_path(char *dst, size_t cap, const char *url)
{
    size_t n = strlen(url);
    if (n >= cap) n = cap - 1;
    memcpy(dst, url, n);
    dst[n] = '\0';
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    fb_server *srv = cls;
    fb_req *req = *con_cls;
    if (!req) {
        req = calloc(1, sizeof *req);
        req_impl *im = calloc(1, sizeof *im);
        if (!req || !im) {
            free(req);
            free(im);
            return MHD_NO;
        }
        req->impl = im;
        req->srv = srv;
        req->method = method;
        im->conn = conn;
        im->file_fd = -1;
        im->body_fd = -1;
        im->route_index = srv->routes.n;
        im->start_ns = now_ns();
        snprintf(im->request_id, sizeof im->request_id, "%s-%llu", srv->instance,
                 (unsigned long long)atomic_fetch_add(&srv->next_request, 1));
        *con_cls = req;
        atomic_fetch_add(&srv->in_flight, 1);
        if (strlen(url) >= sizeof req->path) {
            fb_req_fail(req, FB_ERR_NO_ROUTE, NULL, "the path is too long");
        } else {
            copy_path(req->path, sizeof req->path, url);
            check_headers(req, method);
        }
        /* refused before its body: a client that waits for 100 Continue
         * sends none, so it may have the answer now */
        uint64_t declared;
        if (im->err && has_body(req, &declared) && expects_continue(req)) im->respond_now = true;
        if (im->respond_now) return send_response(req);
        return MHD_YES;
    }
    req_impl *im = impl_of(req);
    if (im->responded) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        size_t limit = srv->cfg.max_body_bytes;
        *upload_data_size = 0;
        if (im->err) {
            im->discarded += n;
            return MHD_YES;
        }
        if (im->body_fd >= 0) {
            if ((uint64_t)im->body_len + n > im->body_limit) {
                fb_req_fail(req, FB_ERR_PAYLOAD_TOO_LARGE, NULL,
                            "the body exceeds this upload's limit of %llu bytes",
                            (unsigned long long)im->body_limit);
                im->discarded = n;
                return MHD_YES;
            }
            if (!write_all(im->body_fd, upload_data, n)) {
                int e = errno;
                /* a full disk is the server's storage, not a fault of the request */
                fb_req_fail(req, fb_err_write_errno(e), NULL,
                            "the server could not store the upload: %s", strerror(e));
                return MHD_YES;
            }
            im->body_len += n;
            return MHD_YES;
        }
        if (im->body_len + n > limit) {
            fb_req_fail(req, FB_ERR_PAYLOAD_TOO_LARGE, NULL,
                        "the body exceeds the limit of %zu bytes", limit);
            im->discarded = im->body_len + n;
            return MHD_YES;
        }
        if (im->body_len + n + 1 > im->body_cap) {
            size_t cap = im->body_cap ? im->body_cap : 4096;
            while (cap < im->body_len + n + 1)
                cap *= 2;
            if (cap > limit + 1) cap = limit + 1;
            char *b = realloc(im->body, cap);
            if (!b) {
                fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory reading the body");
                return MHD_YES;
            }
            im->body = b;
            im->body_cap = cap;
        }
        memcpy(im->body + im->body_len, upload_data, n);
        im->body_len += n;
        im->body[im->body_len] = '\0';
        return MHD_YES;
    }
    if (!im->err) run_handler(req);
    return send_response(req);
}

static int hex_value(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c - 'A' + 10;
}

size_t fb_http_unescape(char *val)
{
    char *r = val, *w = val;
    while (*r) {
        if (r[0] == '%' && isxdigit((unsigned char)r[1]) && isxdigit((unsigned char)r[2])) {
            int v = hex_value(r[1]) * 16 + hex_value(r[2]);
            if (v != 0) {
                *w++ = (char)v;
                r += 3;
                continue;
            }
        }
        *w++ = *r++;
    }
    *w = '\0';
    return (size_t)(w - val);
}

static size_t on_unescape(void *cls, struct MHD_Connection *conn, char *val)
{
    (void)cls;
    (void)conn;
    return fb_http_unescape(val);
}

/* Keeps a log line printable and short. */
static void sanitize(char *dst, size_t cap, const char *src)
{
    size_t n = 0;
    for (; src && *src && n + 1 < cap; src++)
        dst[n++] = ((unsigned char)*src >= 0x20 && (unsigned char)*src < 0x7f) ? *src : '?';
    dst[n] = '\0';
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    fb_server *srv = cls;
    fb_req *req = *con_cls;
    if (!req) return;
    req_impl *im = impl_of(req);
    double secs = (double)(now_ns() - im->start_ns) / 1e9;
    int status = im->responded ? im->status : 0;
    fb_metrics_record(srv->metrics, im->route_index, status, secs, im->err);
    fb_log_level lvl = im->err && status >= 500 ? FB_LOG_WARN : FB_LOG_INFO;
    if (fb_log_enabled(lvl)) {
        char path[256];
        sanitize(path, sizeof path, req->path);
        json_t *f =
            json_pack("{s:s, s:s, s:s, s:i, s:f, s:s}", "request_id", im->request_id, "method",
                      req->method ? req->method : "", "path", path, "status", status, "ms",
                      secs * 1e3, "route", req->route ? req->route->pattern : "");
        if (f && req->key.tenant_id[0])
            json_object_set_new(f, "tenant", json_string(req->key.tenant_id));
        if (f && im->err) json_object_set_new(f, "code", json_string(fb_err_code(im->err)));
        if (f && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
            json_object_set_new(f, "terminated", json_integer((int)toe));
        fb_log_json(lvl, "request", f);
    }
    json_decref(req->json);
    free(im->body);
    free(im->resp_data);
    if (im->file_fd >= 0) close(im->file_fd);
    if (im->body_fd >= 0) close(im->body_fd);
    for (int i = 0; i < im->n_headers; i++) {
        free(im->hdr_name[i]);
        free(im->hdr_value[i]);
    }
    sodium_memzero(&req->key, sizeof req->key);
    free(im);
    free(req);
    *con_cls = NULL;
    atomic_fetch_sub(&srv->in_flight, 1);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char text[512];
    vsnprintf(text, sizeof text, fmt, ap);
    text[strcspn(text, "\n")] = '\0';
    char clean[512];
    sanitize(clean, sizeof clean, text);
    fb_log_json(FB_LOG_WARN, "libmicrohttpd", json_pack("{s:s}", "detail", clean));
}

int fb_http_check_routes(const fb_http_routes *routes, char *msg, size_t msg_cap)
{
    if (!routes || !routes->routes || routes->n <= 0)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "the HTTP layer was given no routes");
    for (int i = 0; i < routes->n; i++) {
        const fb_route *r = &routes->routes[i];
        if (!r->method || !r->pattern || r->pattern[0] != '/' || !r->fn)
            return fb_errf(msg, msg_cap, FB_ERR_INTERNAL,
                           "route %d has no method, no handler or a pattern not starting with /",
                           i);
        if (r->body == FB_BODY_STREAM && !routes->stream_open)
            return fb_errf(msg, msg_cap, FB_ERR_INTERNAL,
                           "%s %s streams its body but no stream hook was given", r->method,
                           r->pattern);
    }
    return FB_OK;
}

struct MHD_Daemon *fb_http_start(fb_server *srv, const fb_http_routes *routes, char *msg,
                                 size_t msg_cap)
{
    if (fb_http_check_routes(routes, msg, msg_cap)) return NULL;
    srv->routes = *routes;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)srv->cfg.port);
    if (inet_pton(AF_INET, srv->cfg.listen, &addr.sin_addr) != 1) {
        fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "--listen: \"%s\" is not an IPv4 address",
                srv->cfg.listen);
        return NULL;
    }
    unsigned flags =
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, srv,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)srv->cfg.threads, MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->cfg.max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)srv->cfg.connection_timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_LISTEN_BACKLOG_SIZE,
        (unsigned)1024, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
        MHD_OPTION_UNESCAPE_CALLBACK, on_unescape, srv, MHD_OPTION_END);
    if (!d)
        fb_errf(msg, msg_cap, FB_ERR_IO, "cannot listen on %s:%d (in use, or not allowed)",
                srv->cfg.listen, srv->cfg.port);
    return d;
}

int fb_http_port(struct MHD_Daemon *d)
{
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    return info ? (int)info->port : 0;
}
