/*
 * libFuzzer target for fuseboxd's own HTTP parsing: the path and query of a
 * request target, the Content-Type checks, and the body checks that run
 * before JSON parsing.  libmicrohttpd splits the request line and headers;
 * what it hands over (a path, "key=value" pairs, header values, body bytes)
 * is what this target makes up from the input:
 *
 *   line 1: the request target, "path?query"
 *   line 2: a Content-Type value
 *   rest:   the body
 *
 * Beyond "never crash, never leak" it checks properties: a path matches at
 * most one route per method and a match rebuilds the path from the pattern
 * and its parameters; unescaping never grows a value nor hides a NUL; an
 * integer query value that is accepted lies in its range and one refused
 * leaves the output alone; the UTF-8 check (base/utf8.h) agrees with the
 * table of well-formed sequences in the Unicode standard (Table 3-7); the nesting
 * depth of any JSON that jansson accepts is the depth of the parsed tree; a
 * path accepted as a safe artifact path (paths.h: what an init reference
 * resolves to) has no empty, "." or ".." segment and is relative.
 */
#include "http.h"
#include "paths.h"
#include "routes.h"
#include "utf8.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

/* A NUL-terminated copy of n bytes, cut at the first NUL (a C string is all
 * libmicrohttpd ever hands over). */
static char *cstr(const uint8_t *p, size_t n)
{
    char *s = malloc(n + 1);
    if (!s) abort();
    memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

/* Rebuilds a path from a pattern and the parameters a match produced. */
static void rebuild(const char *pattern, char params[FB_MAX_PATH_PARAMS][FB_PATH_PARAM_MAX + 1],
                    char *out, size_t cap)
{
    size_t used = 0;
    int np = 0;
    for (const char *p = pattern; *p;) {
        if (*p == '{') {
            const char *e = strchr(p, '}');
            used += (size_t)snprintf(out + used, cap - used, "%s", params[np++]);
            p = e + 1;
        } else {
            if (used + 1 < cap) out[used++] = *p;
            out[used] = '\0';
            p++;
        }
        if (used >= cap) used = cap - 1;
    }
    out[used] = '\0';
}

static void check_path(const char *path)
{
    int per_method[8] = {0};
    const char *methods[8] = {0};
    for (int i = 0; i < fb_n_routes; i++) {
        char params[FB_MAX_PATH_PARAMS][FB_PATH_PARAM_MAX + 1];
        memset(params, 0, sizeof params);
        bool bare = fb_http_match_pattern(fb_routes[i].pattern, path, NULL);
        bool full = fb_http_match_pattern(fb_routes[i].pattern, path, params);
        if (bare != full) FAIL("params changed the match of %s", fb_routes[i].pattern);
        if (!full) continue;
        int np = 0;
        for (const char *p = fb_routes[i].pattern; (p = strchr(p, '{')); p++)
            np++;
        for (int k = 0; k < np; k++) {
            size_t n = strlen(params[k]);
            if (n == 0 || n > FB_PATH_PARAM_MAX || strchr(params[k], '/'))
                FAIL("parameter %d of %s is \"%s\"", k, fb_routes[i].pattern, params[k]);
            if (fb_is_uuid(params[k]) && n != 36) FAIL("uuid of %zu bytes", n);
        }
        char again[2048];
        rebuild(fb_routes[i].pattern, params, again, sizeof again);
        if (strcmp(again, path) != 0)
            FAIL("%s matched \"%s\" but rebuilds \"%s\"", fb_routes[i].pattern, path, again);
        int m = 0;
        while (m < 8 && methods[m] && strcmp(methods[m], fb_routes[i].method) != 0)
            m++;
        if (m == 8) continue;
        methods[m] = fb_routes[i].method;
        if (++per_method[m] > 1) FAIL("%s %s matches two routes", fb_routes[i].method, path);
    }
}

/* Decodes one query value the way the server sees it: '+' is a space
 * (libmicrohttpd), then the unescape callback. */
static void decode(char *v)
{
    for (char *p = v; *p; p++)
        if (*p == '+') *p = ' ';
    size_t before = strlen(v);
    size_t n = fb_http_unescape(v);
    if (n > before) FAIL("unescaping grew a value from %zu to %zu bytes", before, n);
    if (strlen(v) != n) FAIL("unescaping returned %zu for a string of %zu bytes", n, strlen(v));
}

static void check_query(char *q)
{
    for (char *item = q; item;) {
        char *amp = strchr(item, '&');
        if (amp) *amp = '\0';
        char *eq = strchr(item, '=');
        char *value = eq ? eq + 1 : item + strlen(item);
        if (eq) *eq = '\0';
        decode(item);
        decode(value);
        long long x = -12345;
        int err = fb_query_parse_int(value, 1, 1000, &x);
        if (err == FB_OK && (x < 1 || x > 1000 || strtoll(value, NULL, 10) != x))
            FAIL("\"%s\" accepted as %lld", value, x);
        if (err != FB_OK && x != -12345) FAIL("a refused \"%s\" wrote %lld", value, x);
        if (err != FB_OK && err != FB_ERR_BAD_QUERY && err != FB_ERR_OUT_OF_RANGE)
            FAIL("unexpected error %d for \"%s\"", err, value);
        item = amp ? amp + 1 : NULL;
    }
}

/* Table 3-7 of the Unicode standard: the well-formed byte sequences.
 * Returns the length of the sequence at s, 0 when ill-formed. */
static size_t utf8_len_reference(const unsigned char *s, size_t n)
{
    static const struct {
        unsigned char lo[4], hi[4];
        size_t len;
    } rows[] = {
        {{0x00}, {0x7f}, 1},
        {{0xc2, 0x80}, {0xdf, 0xbf}, 2},
        {{0xe0, 0xa0, 0x80}, {0xe0, 0xbf, 0xbf}, 3},
        {{0xe1, 0x80, 0x80}, {0xec, 0xbf, 0xbf}, 3},
        {{0xed, 0x80, 0x80}, {0xed, 0x9f, 0xbf}, 3},
        {{0xee, 0x80, 0x80}, {0xef, 0xbf, 0xbf}, 3},
        {{0xf0, 0x90, 0x80, 0x80}, {0xf0, 0xbf, 0xbf, 0xbf}, 4},
        {{0xf1, 0x80, 0x80, 0x80}, {0xf3, 0xbf, 0xbf, 0xbf}, 4},
        {{0xf4, 0x80, 0x80, 0x80}, {0xf4, 0x8f, 0xbf, 0xbf}, 4},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        if (rows[r].len > n) continue;
        bool ok = true;
        for (size_t k = 0; k < rows[r].len && ok; k++)
            ok = s[k] >= rows[r].lo[k] && s[k] <= rows[r].hi[k];
        if (ok) return rows[r].len;
    }
    return 0;
}

static int tree_depth(const json_t *j)
{
    int d = 0;
    if (json_is_array(j)) {
        for (size_t i = 0; i < json_array_size(j); i++) {
            int c = tree_depth(json_array_get(j, i));
            if (c > d) d = c;
        }
        return d + 1;
    }
    if (json_is_object(j)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v)
        {
            int c = tree_depth(v);
            if (c > d) d = c;
        }
        return d + 1;
    }
    return 0;
}

static void check_body(const uint8_t *body, size_t n)
{
    size_t bad_at = (size_t)-1;
    bool ok = fb_utf8_valid(body, n, &bad_at);
    size_t i = 0, len;
    while (i < n && (len = utf8_len_reference(body + i, n - i)) > 0)
        i += len;
    if (ok != (i == n)) FAIL("UTF-8 check says %d, the Unicode table says %d", ok, i == n);
    if (!ok && bad_at != i) FAIL("UTF-8 check reports offset %zu, the table %zu", bad_at, i);

    const int limit = 32;
    int depth = fb_http_json_depth((const char *)body, n, limit);
    if (depth < 0 || depth > limit + 1) FAIL("depth %d with limit %d", depth, limit);
    json_t *root = json_loadb((const char *)body, n, JSON_DECODE_ANY, NULL);
    if (root && depth <= limit && tree_depth(root) != depth)
        FAIL("depth %d, but the parsed tree is %d deep", depth, tree_depth(root));
    json_decref(root);

    char *init = cstr(body, n);
    if (fb_path_safe_relative(init)) {
        if (init[0] == '/') FAIL("absolute artifact path \"%s\" accepted", init);
        for (char *seg = init; seg && *seg;) {
            char *slash = strchr(seg, '/');
            size_t sl = slash ? (size_t)(slash - seg) : strlen(seg);
            if (sl == 0 || (sl == 1 && seg[0] == '.') || (sl == 2 && !strncmp(seg, "..", 2)))
                FAIL("artifact path \"%s\" accepted", init);
            /* a trailing slash is let through: it names no other file */
            seg = slash ? slash + 1 : NULL;
        }
    }
    free(init);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    size_t tlen = nl ? (size_t)(nl - data) : size;
    char *target = cstr(data, tlen);
    const uint8_t *rest = nl ? nl + 1 : data + size;
    size_t rest_len = (size_t)(data + size - rest);

    char *q = strchr(target, '?');
    if (q) *q++ = '\0';
    /* the server copies at most this much and refuses longer paths */
    if (strlen(target) < 1024) {
        fb_http_unescape(target);
        check_path(target);
    }
    if (q) check_query(q);
    free(target);

    const uint8_t *nl2 = memchr(rest, '\n', rest_len);
    size_t clen = nl2 ? (size_t)(nl2 - rest) : rest_len;
    char *ct = cstr(rest, clen);
    if (fb_http_is_json_type(ct) && fb_http_is_stream_type(ct))
        FAIL("\"%s\" is both JSON and an upload type", ct);
    free(ct);
    if (nl2) check_body(nl2 + 1, (size_t)(rest + rest_len - (nl2 + 1)));
    return 0;
}
