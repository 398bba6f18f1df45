/*
 * The wire protocol codec, decoding: strict parsing of the JSON frame of the
 * messages between fuseboxd and fusebox-worker.
 *
 * Every message type lists the fields it allows, every field has one JSON
 * type and a range, and every error names the field by its path
 * ("members[2].job_id").  The encoder (wire_encode.c) runs this decoder over
 * its own output (fb_wire_check_encoded), so a message the receiver would
 * refuse is refused before it is sent, and decode(encode(m)) equals m by
 * construction.
 */
#include "wire.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobspec.h"
#include "wire_int.h"

#define MAX_INT ((int64_t)1 << 53) /* counters stay exact in any JSON reader */
#define HEARTBEAT_MIN_MS 100
#define HEARTBEAT_MAX_MS 60000

static const char *const kind_names[] = {"cpu", "cuda"};

/* ---- decoding: field access ----------------------------------------------- */

/* Decoder state: the error sink and which blob frames fields have claimed. */
typedef struct dec {
    char *msg;
    size_t cap;
    int n_blobs;
    int n_blob_refs, max_blob_ref;
    unsigned char blob_used[FB_WIRE_MAX_BLOBS + 1];
} dec;

/* Writes "path.key: what" into the caller's message buffer. */
__attribute__((format(printf, 4, 5))) static void note_bad(dec *d, const char *path,
                                                          const char *key, const char *fmt, ...)
{
    if (d->msg && d->cap) {
        char what[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        if (*path || *key)
            snprintf(d->msg, d->cap, "%s%s%s: %s", path, (*path && *key) ? "." : "", key, what);
        else
            snprintf(d->msg, d->cap, "%s", what);
    }
}

/* Notes what is wrong and gives FB_ERR_BAD_WIRE.  A macro, so that the constant is seen where
 * the error is returned: the optimiser then knows that a reader which returned 0 has set its
 * output (a function, which it does not inline, could have returned 0 for all it knows). */
#define bad(d, path, key, ...) (note_bad((d), (path), (key), __VA_ARGS__), FB_ERR_BAD_WIRE)

/* Copies up to 48 bytes of untrusted text for an error message, so a log line
 * cannot be split or garbled by what a peer sent. */
static const char *shown(const char *s, size_t len, char buf[64])
{
    size_t n = 0;
    for (size_t i = 0; i < len && n < 48; i++) {
        unsigned char ch = (unsigned char)s[i];
        buf[n++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    if (len > 48) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = '\0';
    return buf;
}

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
        return "true";
    case JSON_FALSE:
        return "false";
    default:
        return "null";
    }
}

/* Rejects any key of obj not in the NULL-terminated allowed list. */
static int check_fields(dec *d, json_t *obj, const char *path, const char *const *allowed)
{
    const char *key;
    size_t klen;
    json_t *val;
    json_object_keylen_foreach(obj, key, klen, val)
    {
        bool ok = strlen(key) == klen;
        bool known = false;
        for (const char *const *a = allowed; ok && *a && !known; a++)
            known = strcmp(key, *a) == 0;
        if (!known) {
            char list[400] = "", sk[64];
            size_t used = 0;
            for (const char *const *a = allowed; *a && used < sizeof list; a++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
                                         a == allowed ? "" : ", ", *a);
            return bad(d, path, klen ? shown(key, klen, sk) : "\"\"", "unknown field (allowed: %s)",
                       list);
        }
    }
    return FB_OK;
}

/* Looks key up; absent and required is an error, absent and optional gives *v = NULL. */
static int lookup(dec *d, json_t *obj, const char *path, const char *key, bool required, json_t **v)
{
    *v = json_object_get(obj, key);
    if (!*v && required) return bad(d, path, key, "required field missing");
    return FB_OK;
}

/* Checks an integer value in [lo, hi]. */
static int int_value(dec *d, json_t *v, const char *path, const char *key, int64_t lo, int64_t hi,
                     int64_t *out)
{
    if (!json_is_integer(v)) return bad(d, path, key, "expected an integer, got %s", json_kind(v));
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return bad(d, path, key, "%lld is out of range [%lld, %lld]", (long long)x, (long long)lo,
                   (long long)hi);
    *out = (int64_t)x;
    return FB_OK;
}

/* Reads an integer field in [lo, hi]; absent and optional leaves *out as it is. */
static int get_int(dec *d, json_t *obj, const char *path, const char *key, bool required,
                   int64_t lo, int64_t hi, int64_t *out)
{
    json_t *v;
    int err = lookup(d, obj, path, key, required, &v);
    if (err || !v) return err;
    return int_value(d, v, path, key, lo, hi, out);
}

static int get_i(dec *d, json_t *obj, const char *path, const char *key, bool required, int lo,
                 int hi, int *out)
{
    int64_t x = *out;
    int err = get_int(d, obj, path, key, required, lo, hi, &x);
    if (!err) *out = (int)x;
    return err;
}

/* Reads a number in [lo, hi] ((lo, hi] when lo_open); null means unknown
 * (NaN) where nullable.  Absent and optional leaves *out as it is. */
static int get_num(dec *d, json_t *obj, const char *path, const char *key, bool required,
                   bool nullable, double lo, bool lo_open, double hi, double *out)
{
    json_t *v;
    int err = lookup(d, obj, path, key, required, &v);
    if (err || !v) return err;
    if (json_is_null(v) && nullable) {
        *out = NAN;
        return FB_OK;
    }
    if (!json_is_number(v))
        return bad(d, path, key, "expected a number%s, got %s", nullable ? " or null" : "",
                   json_kind(v));
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
        return bad(d, path, key, "%.17g is out of range %c%g, %g]", x, lo_open ? '(' : '[', lo, hi);
    *out = x;
    return FB_OK;
}

static int get_bool(dec *d, json_t *obj, const char *path, const char *key, bool required,
                    bool *out)
{
    json_t *v;
    int err = lookup(d, obj, path, key, required, &v);
    if (err || !v) return err;
    if (!json_is_boolean(v))
        return bad(d, path, key, "expected true or false, got %s", json_kind(v));
    *out = json_is_true(v);
    return FB_OK;
}

/* Checks a string value of at most max bytes without NUL bytes. */
static int str_value(dec *d, json_t *v, const char *path, const char *key, size_t max,
                     const char **s, size_t *len)
{
    if (!json_is_string(v)) return bad(d, path, key, "expected a string, got %s", json_kind(v));
    const char *t = json_string_value(v);
    size_t n = json_string_length(v);
    if (memchr(t, '\0', n)) return bad(d, path, key, "contains a NUL byte");
    if (n > max) return bad(d, path, key, "%zu bytes, at most %zu allowed", n, max);
    *s = t;
    *len = n;
    return FB_OK;
}

/* Reads a string field; absent and optional gives *s = NULL. */
static int get_str(dec *d, json_t *obj, const char *path, const char *key, bool required,
                   size_t max, const char **s, size_t *len)
{
    json_t *v;
    *s = NULL;
    *len = 0;
    int err = lookup(d, obj, path, key, required, &v);
    if (err || !v) return err;
    return str_value(d, v, path, key, max, s, len);
}

static bool is_lower_alnum(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
}

static bool is_hex(char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
}

/* A UUID in canonical lower-case text form: 8-4-4-4-12 hex digits. */
static bool uuid_ok(const char *s, size_t n)
{
    if (n != FB_WIRE_ID_LEN) return false;
    for (size_t i = 0; i < n; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? s[i] != '-' : !is_hex(s[i])) return false;
    }
    return true;
}

/* Reads a UUID field into out; absent and optional leaves out as it is. */
static int get_uuid(dec *d, json_t *obj, const char *path, const char *key, bool required,
                    char out[FB_WIRE_ID_LEN + 1])
{
    const char *s;
    size_t n;
    json_t *v;
    int err = lookup(d, obj, path, key, required, &v);
    if (err || !v) return err;
    if (!json_is_string(v)) return bad(d, path, key, "expected a string, got %s", json_kind(v));
    if ((err = str_value(d, v, path, key, (size_t)-1, &s, &n))) return err;
    char sh[64];
    if (!uuid_ok(s, n))
        return bad(d, path, key,
                   "\"%s\" is not a UUID in canonical lower-case form "
                   "(xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                   shown(s, n, sh));
    memcpy(out, s, n + 1);
    return FB_OK;
}

/* Name rules: which bytes a name may hold, and whether its first byte must be alphanumeric. */
typedef enum name_rule {
    NAME_WORKER,  /* [a-z0-9][a-z0-9._-]* */
    NAME_DATASET, /* [a-z0-9][a-z0-9._-]*, the job spec's dataset rule */
    NAME_VERSION, /* [A-Za-z0-9._+-]+ */
    NAME_DEVICE,  /* printable ASCII */
} name_rule;

static bool name_char_ok(name_rule r, size_t i, char ch)
{
    switch (r) {
    case NAME_WORKER:
    case NAME_DATASET:
        return is_lower_alnum(ch) || (i > 0 && (ch == '.' || ch == '_' || ch == '-'));
    case NAME_VERSION:
        return is_lower_alnum(ch) || (ch >= 'A' && ch <= 'Z') || ch == '.' || ch == '_' ||
               ch == '-' || ch == '+';
    default:
        return ch >= 0x20 && ch < 0x7f;
    }
}

static const char *const name_rule_text[] = {
    [NAME_WORKER] = "a-z or 0-9 first, then a-z, 0-9, '.', '_', '-'",
    [NAME_DATASET] = "a-z or 0-9 first, then a-z, 0-9, '.', '_', '-'",
    [NAME_VERSION] = "letters, digits, '.', '_', '-', '+'",
    [NAME_DEVICE] = "printable ASCII",
};

/* Reads a required name of 1..cap-1 bytes following rule r into out[cap]. */
static int get_name(dec *d, json_t *obj, const char *path, const char *key, name_rule r, char *out,
                    size_t cap)
{
    const char *s;
    size_t n;
    int err = get_str(d, obj, path, key, true, cap - 1, &s, &n);
    if (err) return err;
    if (n == 0) return bad(d, path, key, "must not be empty");
    for (size_t i = 0; i < n; i++) {
        char sh[64];
        if (!name_char_ok(r, i, s[i]))
            return bad(d, path, key, "\"%s\": byte %zu is not allowed (use %s)", shown(s, n, sh), i,
                       name_rule_text[r]);
    }
    memcpy(out, s, n + 1);
    return FB_OK;
}

/* Reads a string field that must be one of names[]. */
static int get_enum(dec *d, json_t *obj, const char *path, const char *key,
                    const char *const *names, int n_names, int *out)
{
    const char *s;
    size_t n;
    int err = get_str(d, obj, path, key, true, (size_t)-1, &s, &n);
    if (err) return err;
    for (int i = 0; i < n_names; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return FB_OK;
        }
    }
    char list[256] = "", sh[64];
    size_t used = 0;
    for (int i = 0; i < n_names && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
    return bad(d, path, key, "\"%s\" is not one of: %s", shown(s, n, sh), list);
}

/* Reads an optional free-text field (absent = ""). */
static int get_text(dec *d, json_t *obj, const char *path, const char *key, char *out, size_t cap)
{
    const char *s;
    size_t n;
    int err = get_str(d, obj, path, key, false, cap - 1, &s, &n);
    if (err || !s) return err;
    memcpy(out, s, n + 1);
    return FB_OK;
}

/* Reads an array field with min..max entries; absent and optional gives *arr = NULL. */
static int get_array(dec *d, json_t *obj, const char *path, const char *key, bool required,
                     size_t min, size_t max, json_t **arr)
{
    json_t *v;
    *arr = NULL;
    int err = lookup(d, obj, path, key, required, &v);
    if (err || !v) return err;
    if (!json_is_array(v)) return bad(d, path, key, "expected an array, got %s", json_kind(v));
    size_t n = json_array_size(v);
    if (n < min || n > max) return bad(d, path, key, "%zu entries, allowed %zu..%zu", n, min, max);
    *arr = v;
    return FB_OK;
}

/* An array element that must be an object with only the allowed fields. */
static int element_object(dec *d, json_t *v, const char *path, const char *const *allowed)
{
    if (!json_is_object(v)) return bad(d, path, "", "expected an object, got %s", json_kind(v));
    return check_fields(d, v, path, allowed);
}

/* Reads an optional blob index: present, it must name a blob frame no other field claimed. */
static int get_blob(dec *d, json_t *obj, const char *path, const char *key, bool required, int *out)
{
    json_t *v;
    int err = lookup(d, obj, path, key, required, &v);
    if (err || !v) return err;
    if (d->n_blobs == 0 && json_is_integer(v))
        return bad(d, path, key, "refers to blob %lld but the message has no blob frames",
                   (long long)json_integer_value(v));
    int64_t b;
    if ((err = int_value(d, v, path, key, 1, d->n_blobs, &b))) return err;
    if (d->blob_used[b]) return bad(d, path, key, "blob %d is referred to twice", (int)b);
    d->blob_used[b] = 1;
    d->n_blob_refs++;
    if (b > d->max_blob_ref) d->max_blob_ref = (int)b;
    *out = (int)b;
    return FB_OK;
}

/* Reads a group's split: n entries >= 1, one per data-parallel shard. */
static int get_split(dec *d, json_t *root, fb_wire_msg *m)
{
    json_t *arr;
    int err = get_array(d, root, "", "split", true, 1, FB_WIRE_MAX_DEVICES, &arr);
    if (err) return err;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        char key[32];
        snprintf(key, sizeof key, "split[%zu]", i);
        if ((err = int_value(d, json_array_get(arr, i), "", key, 1, MAX_INT, &m->split[i])))
            return err;
    }
    m->n_split = (int)json_array_size(arr);
    return FB_OK;
}

/* ---- decoding: the addresses of arrays that span workers -------------------- */

/* A host as other workers reach it: a name ([A-Za-z0-9] first, then letters, digits, '.', '-',
 * '_') or an IP literal (IPv6 without brackets: hex digits, ':', '.'; at least one ':').  What
 * it resolves to is the resolver's business; this keeps out what no resolver takes and what
 * would make "host:port" ambiguous. */
static bool host_ok(const char *s, size_t n)
{
    if (n == 0 || n > FB_WIRE_NAME_MAX) return false;
    if (memchr(s, ':', n)) {
        for (size_t i = 0; i < n; i++) {
            char ch = s[i];
            bool hex = is_hex(ch) || (ch >= 'A' && ch <= 'F');
            if (!hex && ch != ':' && ch != '.') return false;
        }
        return true;
    }
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        bool alnum = is_lower_alnum(ch) || (ch >= 'A' && ch <= 'Z');
        if (!alnum && (i == 0 || (ch != '.' && ch != '-' && ch != '_'))) return false;
    }
    return true;
}

/* Parses "host:port" or "[v6 addr]:port" (n bytes) into host (without brackets) and *port;
 * false with why filled when it is not one. */
static bool rendezvous_parse(const char *s, size_t n, char *host, size_t hcap, int *port, char *why,
                             size_t wcap)
{
    const char *h = s, *colon;
    size_t hn;
    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close || close + 1 >= s + n || close[1] != ':') {
            snprintf(why, wcap, "a bracketed IPv6 address must be followed by \":port\"");
            return false;
        }
        h = s + 1;
        hn = (size_t)(close - h);
        colon = close + 1;
        if (!memchr(h, ':', hn)) {
            snprintf(why, wcap, "only an IPv6 address goes in brackets");
            return false;
        }
    } else {
        colon = NULL;
        for (size_t i = 0; i < n; i++)
            if (s[i] == ':') colon = s + i;
        if (!colon) {
            snprintf(why, wcap, "has no port (expected \"host:port\" or \"[v6 addr]:port\")");
            return false;
        }
        hn = (size_t)(colon - s);
        if (memchr(s, ':', hn)) {
            snprintf(why, wcap, "an IPv6 address must be written in brackets, \"[addr]:port\"");
            return false;
        }
    }
    if (!host_ok(h, hn) || hn + 1 > hcap) {
        snprintf(why, wcap, "the host is not a host name or an IP address of 1..%d bytes",
                 FB_WIRE_NAME_MAX);
        return false;
    }
    const char *p = colon + 1, *end = s + n;
    long v = 0;
    bool digits = p < end && end - p <= 5 && *p != '0';
    for (const char *q = p; digits && q < end; q++) {
        digits = *q >= '0' && *q <= '9';
        v = v * 10 + (*q - '0');
    }
    if (!digits || v < 1 || v > 65535) {
        snprintf(why, wcap, "the port is not a number in 1..65535");
        return false;
    }
    memcpy(host, h, hn);
    host[hn] = '\0';
    *port = (int)v;
    return true;
}

bool fb_wire_host_valid(const char *host)
{
    return host && host_ok(host, strlen(host));
}

int fb_wire_rendezvous_split(const char *rendezvous, char *host, size_t host_cap, int *port,
                             char *msg, size_t msg_cap)
{
    char h[FB_WIRE_NAME_MAX + 1], why[160], sh[64];
    int pt;
    if (!rendezvous || !host || !port)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "missing argument");
    size_t n = strlen(rendezvous);
    if (!rendezvous_parse(rendezvous, n, h, sizeof h, &pt, why, sizeof why))
        return fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE, "rendezvous \"%s\": %s",
                       shown(rendezvous, n, sh), why);
    size_t hn = strlen(h);
    if (hn + 1 > host_cap)
        return fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE, "rendezvous host does not fit %zu bytes",
                       host_cap);
    memcpy(host, h, hn + 1);
    *port = pt;
    return FB_OK;
}

/* comm of HELLO (optional): {"host": "...", "ports": [lo, hi]}. */
static int decode_comm(dec *d, json_t *root, fb_wire_msg *m)
{
    static const char *const k_comm[] = {"host", "ports", NULL};
    json_t *o = json_object_get(root, "comm"), *ports;
    if (!o) return FB_OK;
    int err = element_object(d, o, "comm", k_comm);
    if (err) return err;
    const char *s;
    size_t n;
    char sh[64];
    if ((err = get_str(d, o, "comm", "host", true, (size_t)-1, &s, &n))) return err;
    if (!host_ok(s, n))
        return bad(d, "comm", "host",
                   "\"%s\" is not a host name or an IP address (IPv6 without brackets) of 1..%d "
                   "bytes",
                   shown(s, n, sh), FB_WIRE_NAME_MAX);
    if ((err = get_array(d, o, "comm", "ports", true, 2, 2, &ports))) return err;
    int64_t lo, hi;
    if ((err = int_value(d, json_array_get(ports, 0), "comm", "ports[0]", 1, 65535, &lo)))
        return err;
    if ((err = int_value(d, json_array_get(ports, 1), "comm", "ports[1]", 1, 65535, &hi)))
        return err;
    if (hi < lo)
        return bad(d, "comm", "ports", "[%lld, %lld] is reversed (lowest port first)",
                   (long long)lo, (long long)hi);
    if (hi - lo >= FB_WIRE_COMM_PORTS)
        return bad(d, "comm", "ports", "[%lld, %lld] holds %lld ports, at most %d allowed",
                   (long long)lo, (long long)hi, (long long)(hi - lo + 1), FB_WIRE_COMM_PORTS);
    memcpy(m->comm_host, s, n + 1);
    m->comm_port_lo = (int)lo;
    m->comm_port_hi = (int)hi;
    return FB_OK;
}

/* span of ASSIGN (optional): {"world", "rank_base", "rendezvous", "token"}; needs
 * parallel_data and parallel_pipeline read already. */
static int decode_span(dec *d, json_t *root, fb_wire_msg *m)
{
    static const char *const k_span[] = {"world", "rank_base", "rendezvous", "token", NULL};
    json_t *o = json_object_get(root, "span");
    if (!o) return FB_OK;
    int err = element_object(d, o, "span", k_span);
    if (err) return err;
    int world = 0, base = 0;
    if ((err = get_i(d, o, "span", "world", true, 2, FB_WIRE_MAX_DEVICES, &world))) return err;
    if (m->parallel_pipeline != 1)
        return bad(d, "span", "world", "a group that spans workers has parallel_pipeline 1, not %d",
                   m->parallel_pipeline);
    if (m->parallel_data >= world)
        return bad(d, "span", "world",
                   "%d, but this worker's parallel_data is %d: a spanning group has ranks on "
                   "other workers too",
                   world, m->parallel_data);
    if ((err = get_i(d, o, "span", "rank_base", true, 0, FB_WIRE_MAX_DEVICES, &base))) return err;
    if (base + m->parallel_data > world)
        return bad(d, "span", "rank_base", "%d + parallel_data %d exceeds the world of %d ranks",
                   base, m->parallel_data, world);
    const char *s;
    size_t n;
    char sh[64], why[160], host[FB_WIRE_NAME_MAX + 1];
    int port;
    if ((err = get_str(d, o, "span", "rendezvous", true, sizeof m->rendezvous - 1, &s, &n)))
        return err;
    if (!rendezvous_parse(s, n, host, sizeof host, &port, why, sizeof why))
        return bad(d, "span", "rendezvous", "\"%s\": %s", shown(s, n, sh), why);
    memcpy(m->rendezvous, s, n + 1);
    if ((err = get_str(d, o, "span", "token", true, (size_t)-1, &s, &n))) return err;
    bool hex = n == 2 * FB_WIRE_TOKEN_BYTES;
    for (size_t i = 0; hex && i < n; i++)
        hex = is_hex(s[i]);
    if (!hex)
        return bad(d, "span", "token", "\"%s\" is not %d lower-case hex digits", shown(s, n, sh),
                   2 * FB_WIRE_TOKEN_BYTES);
    memcpy(m->token, s, n + 1);
    m->world = world;
    m->rank_base = base;
    return FB_OK;
}

/* ---- decoding: duplicate job ids ----------------------------------------- */

typedef struct idref {
    const char *id;
    int i, j; /* running[i].job_ids[j], or members[i].job_id with j = -1 */
} idref;

static int idref_cmp(const void *a, const void *b)
{
    const idref *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    if (c) return c;
    if (x->i != y->i) return x->i < y->i ? -1 : 1;
    return (x->j > y->j) - (x->j < y->j);
}

/* Rejects a job id that appears twice, naming its second place. */
static int check_dup_ids(dec *d, idref *refs, size_t n, const char *outer)
{
    qsort(refs, n, sizeof *refs, idref_cmp);
    for (size_t k = 1; k < n; k++) {
        if (strcmp(refs[k - 1].id, refs[k].id) != 0) continue;
        char path[48], key[32];
        snprintf(path, sizeof path, "%s[%d]", outer, refs[k].i);
        if (refs[k].j >= 0)
            snprintf(key, sizeof key, "job_ids[%d]", refs[k].j);
        else
            snprintf(key, sizeof key, "job_id");
        return bad(d, path, key, "job %s appears more than once in the message", refs[k].id);
    }
    return FB_OK;
}

/* ---- decoding: the message types ----------------------------------------- */

static int get_group(dec *d, json_t *root, fb_wire_msg *m)
{
    int err = get_uuid(d, root, "", "group_id", true, m->group_id);
    if (!err) err = get_int(d, root, "", "generation", true, 1, MAX_INT, &m->generation);
    return err;
}

/* running[]: the groups a worker runs, with their members' step counts. */
static int decode_running(dec *d, json_t *root, fb_wire_msg *m)
{
    static const char *const k_run[] = {"group_id", "generation", "job_ids", "steps", NULL};
    json_t *arr;
    int err = get_array(d, root, "", "running", true, 0, FB_WIRE_MAX_GROUPS, &arr);
    if (err) return err;
    size_t n = json_array_size(arr), total = 0;
    if (n == 0) return FB_OK;
    m->running = calloc(n, sizeof *m->running);
    if (!m->running) return fb_errf(d->msg, d->cap, FB_ERR_NOMEM, "out of memory");
    m->n_running = (int)n;
    for (size_t i = 0; i < n; i++) {
        fb_wire_running *r = &m->running[i];
        json_t *o = json_array_get(arr, i), *ids, *steps;
        char path[32];
        snprintf(path, sizeof path, "running[%zu]", i);
        if ((err = element_object(d, o, path, k_run))) return err;
        if ((err = get_uuid(d, o, path, "group_id", true, r->group_id))) return err;
        if ((err = get_int(d, o, path, "generation", true, 1, MAX_INT, &r->generation))) return err;
        if ((err = get_array(d, o, path, "job_ids", true, 0, FB_WIRE_MAX_MEMBERS, &ids)))
            return err;
        if ((err = get_array(d, o, path, "steps", true, 0, FB_WIRE_MAX_MEMBERS, &steps)))
            return err;
        size_t nj = json_array_size(ids);
        if (json_array_size(steps) != nj)
            return bad(d, path, "steps", "%zu entries, but job_ids has %zu", json_array_size(steps),
                       nj);
        for (size_t k = 0; k < i; k++)
            if (strcmp(m->running[k].group_id, r->group_id) == 0)
                return bad(d, path, "group_id", "group %s is listed twice", r->group_id);
        if (nj == 0) continue;
        r->job_ids = calloc(nj, sizeof *r->job_ids);
        r->steps = calloc(nj, sizeof *r->steps);
        if (!r->job_ids || !r->steps) return fb_errf(d->msg, d->cap, FB_ERR_NOMEM, "out of memory");
        r->n_jobs = (int)nj;
        for (size_t j = 0; j < nj; j++) {
            char key[32];
            const char *s;
            size_t len;
            snprintf(key, sizeof key, "job_ids[%zu]", j);
            if ((err = str_value(d, json_array_get(ids, j), path, key, (size_t)-1, &s, &len)))
                return err;
            char sh[64];
            if (!uuid_ok(s, len))
                return bad(d, path, key, "\"%s\" is not a UUID in canonical lower-case form",
                           shown(s, len, sh));
            memcpy(r->job_ids[j], s, len + 1);
            snprintf(key, sizeof key, "steps[%zu]", j);
            if ((err = int_value(d, json_array_get(steps, j), path, key, 0, MAX_INT, &r->steps[j])))
                return err;
        }
        total += nj;
    }
    if (total == 0) return FB_OK;
    idref *refs = malloc(total * sizeof *refs);
    if (!refs) return fb_errf(d->msg, d->cap, FB_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (int i = 0; i < m->n_running; i++)
        for (int j = 0; j < m->running[i].n_jobs; j++)
            refs[k++] = (idref){m->running[i].job_ids[j], i, j};
    err = check_dup_ids(d, refs, total, "running");
    free(refs);
    return err;
}

static int decode_hello(dec *d, json_t *root, fb_wire_msg *m)
{
    static const char *const k_dev[] = {"idx", "kind", "name", "memory_bytes", "free_bytes", NULL};
    int err, kind;
    json_t *arr;
    if ((err = get_name(d, root, "", "worker", NAME_WORKER, m->worker, sizeof m->worker)))
        return err;
    if ((err = get_enum(d, root, "", "backend", kind_names, 2, &kind))) return err;
    snprintf(m->backend, sizeof m->backend, "%s", kind_names[kind]);
    if ((err = get_name(d, root, "", "version", NAME_VERSION, m->version, sizeof m->version)))
        return err;
    if ((err = get_array(d, root, "", "devices", true, 1, FB_WIRE_MAX_DEVICES, &arr))) return err;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        fb_wire_device *dv = &m->devices[i];
        json_t *o = json_array_get(arr, i);
        char path[32];
        snprintf(path, sizeof path, "devices[%zu]", i);
        if ((err = element_object(d, o, path, k_dev))) return err;
        if ((err = get_i(d, o, path, "idx", true, 0, FB_WIRE_MAX_DEVICES - 1, &dv->idx)))
            return err;
        for (size_t k = 0; k < i; k++)
            if (m->devices[k].idx == dv->idx)
                return bad(d, path, "idx", "device %d is listed twice", dv->idx);
        if ((err = get_enum(d, o, path, "kind", kind_names, 2, &kind))) return err;
        snprintf(dv->kind, sizeof dv->kind, "%s", kind_names[kind]);
        if ((err = get_name(d, o, path, "name", NAME_DEVICE, dv->name, sizeof dv->name)))
            return err;
        if ((err = get_int(d, o, path, "memory_bytes", true, 1, MAX_INT, &dv->memory_bytes)))
            return err;
        if ((err = get_int(d, o, path, "free_bytes", true, 0, dv->memory_bytes, &dv->free_bytes)))
            return err;
    }
    m->n_devices = (int)json_array_size(arr);
    if ((err = decode_comm(d, root, m))) return err;
    return decode_running(d, root, m);
}

static int decode_welcome(dec *d, json_t *root, fb_wire_msg *m)
{
    int err = get_uuid(d, root, "", "worker_id", true, m->worker_id);
    if (!err)
        err = get_i(d, root, "", "heartbeat_ms", true, HEARTBEAT_MIN_MS, HEARTBEAT_MAX_MS,
                    &m->heartbeat_ms);
    return err;
}

static int decode_assign(dec *d, json_t *root, fb_wire_msg *m)
{
    static const char *const k_mem[] = {"job_id",      "tenant_id", "spec", "start_step",
                                        "resume_blob", "init_blob", NULL};
    int err;
    json_t *arr;
    const char *s;
    size_t n;
    if ((err = get_group(d, root, m))) return err;
    if ((err = get_str(d, root, "", "fusion_key", true, (size_t)-1, &s, &n))) return err;
    bool hex = n == FB_FUSION_KEY_HEX;
    for (size_t i = 0; hex && i < n; i++)
        hex = is_hex(s[i]);
    char sh[64];
    if (!hex)
        return bad(d, "", "fusion_key", "\"%s\" is not %d lower-case hex digits", shown(s, n, sh),
                   FB_FUSION_KEY_HEX);
    memcpy(m->fusion_key, s, n + 1);
    if ((err = get_name(d, root, "", "dataset", NAME_DATASET, m->dataset, sizeof m->dataset)))
        return err;
    if ((err = get_uuid(d, root, "", "dataset_tenant", false, m->dataset_tenant))) return err;
    if (json_object_get(root, "builtin")) {
        if ((err = get_name(d, root, "", "builtin", NAME_DATASET, m->builtin, sizeof m->builtin)))
            return err;
        if (m->dataset_tenant[0])
            return bad(d, "", "builtin", "a built-in is public: it comes without a dataset_tenant");
    }
    if ((err = get_array(d, root, "", "devices", true, 1, FB_WIRE_MAX_DEVICES, &arr))) return err;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        char key[32];
        int64_t x;
        snprintf(key, sizeof key, "devices[%zu]", i);
        if ((err = int_value(d, json_array_get(arr, i), "", key, 0, FB_WIRE_MAX_DEVICES - 1, &x)))
            return err;
        m->group_devices[i] = (int)x;
    }
    m->n_group_devices = (int)json_array_size(arr);
    if ((err =
             get_i(d, root, "", "parallel_data", true, 1, FB_WIRE_MAX_DEVICES, &m->parallel_data)))
        return err;
    if ((err = get_i(d, root, "", "parallel_pipeline", true, 1, FB_WIRE_MAX_DEVICES,
                     &m->parallel_pipeline)))
        return err;
    if (m->parallel_data * m->parallel_pipeline != m->n_group_devices)
        return bad(d, "", "devices", "%d entries, but parallel_data x parallel_pipeline is %d",
                   m->n_group_devices, m->parallel_data * m->parallel_pipeline);
    if ((err = decode_span(d, root, m))) return err;
    if ((err = get_split(d, root, m))) return err;
    if (m->world && m->n_split != m->world)
        return bad(d, "", "split", "%d entries, but the group spans a world of %d ranks",
                   m->n_split, m->world);
    if (!m->world && m->n_split != m->parallel_data)
        return bad(d, "", "split", "%d entries, but parallel_data is %d", m->n_split,
                   m->parallel_data);
    if ((err = get_num(d, root, "", "time_share", true, false, 0, true, 1, &m->time_share)))
        return err;
    if ((err = get_array(d, root, "", "members", true, 1, FB_WIRE_MAX_MEMBERS, &arr))) return err;
    n = json_array_size(arr);
    m->members = calloc(n, sizeof *m->members);
    if (!m->members) return fb_errf(d->msg, d->cap, FB_ERR_NOMEM, "out of memory");
    m->n_members = (int)n;
    for (size_t i = 0; i < n; i++) {
        fb_wire_member *mb = &m->members[i];
        json_t *o = json_array_get(arr, i);
        char path[32];
        size_t len;
        snprintf(path, sizeof path, "members[%zu]", i);
        if ((err = element_object(d, o, path, k_mem))) return err;
        if ((err = get_uuid(d, o, path, "job_id", true, mb->job_id))) return err;
        if ((err = get_uuid(d, o, path, "tenant_id", true, mb->tenant_id))) return err;
        if ((err = get_str(d, o, path, "spec", true, FB_WIRE_MAX_SPEC, &s, &len))) return err;
        if (len == 0) return bad(d, path, "spec", "must not be empty");
        mb->spec = malloc(len + 1);
        if (!mb->spec) return fb_errf(d->msg, d->cap, FB_ERR_NOMEM, "out of memory");
        memcpy(mb->spec, s, len + 1);
        if ((err = get_int(d, o, path, "start_step", true, 0, MAX_INT, &mb->start_step)))
            return err;
        if ((err = get_blob(d, o, path, "resume_blob", false, &mb->resume_blob))) return err;
        if (mb->start_step > 0 && mb->resume_blob == 0)
            return bad(d, path, "start_step",
                       "%lld > 0 needs a resume_blob holding the state to resume from",
                       (long long)mb->start_step);
        if ((err = get_blob(d, o, path, "init_blob", false, &mb->init_blob))) return err;
        if (mb->init_blob && mb->start_step > 0)
            return bad(d, path, "init_blob",
                       "initial weights are for a start at step 0, not at step %lld",
                       (long long)mb->start_step);
    }
    idref *refs = malloc(n * sizeof *refs);
    if (!refs) return fb_errf(d->msg, d->cap, FB_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        refs[i] = (idref){m->members[i].job_id, (int)i, -1};
    err = check_dup_ids(d, refs, n, "members");
    free(refs);
    return err;
}

/* devices[] of PROGRESS (optional): one entry per device of the group, each named once, all
 * over the same number of steps. */
static int decode_device_steps(dec *d, json_t *root, fb_wire_msg *m)
{
    static const char *const k_dev[] = {"idx",     "compute_ms", "pass_ms", "comm_ms", "io_ms",
                                        "idle_ms", "steps",      "samples", NULL};
    static const char *const times[] = {"compute_ms", "comm_ms", "io_ms", "idle_ms"};
    json_t *arr;
    int err = get_array(d, root, "", "devices", false, 1, FB_WIRE_MAX_DEVICES, &arr);
    if (err || !arr) return err;
    size_t n = json_array_size(arr);
    for (size_t i = 0; i < n; i++) {
        fb_wire_device_step *e = &m->device_steps[i];
        json_t *o = json_array_get(arr, i);
        char path[32];
        snprintf(path, sizeof path, "devices[%zu]", i);
        if ((err = element_object(d, o, path, k_dev))) return err;
        if ((err = get_i(d, o, path, "idx", true, 0, FB_WIRE_MAX_DEVICES - 1, &e->device)))
            return err;
        for (size_t k = 0; k < i; k++)
            if (m->device_steps[k].device == e->device)
                return bad(d, path, "idx", "device %d is listed twice", e->device);
        double *slots[] = {&e->compute_ms, &e->comm_ms, &e->io_ms, &e->idle_ms};
        for (int t = 0; t < 4; t++)
            if ((err = get_num(d, o, path, times[t], true, false, 0, false, HUGE_VAL, slots[t])))
                return err;
        if ((err = get_num(d, o, path, "pass_ms", true, false, 0, false, HUGE_VAL, &e->pass_ms)))
            return err;
        /* a part of compute_ms (both are means of the same steps, so no rounding slack) */
        if (e->pass_ms > e->compute_ms)
            return bad(d, path, "pass_ms", "%g ms is more than compute_ms (%g ms), which holds it",
                       e->pass_ms, e->compute_ms);
        if ((err = get_int(d, o, path, "steps", true, 0, MAX_INT, &e->steps))) return err;
        if (i > 0 && e->steps != m->device_steps[0].steps)
            return bad(d, path, "steps", "%lld, but devices[0] reports %lld: every device of a "
                       "report covers the same steps", (long long)e->steps,
                       (long long)m->device_steps[0].steps);
        if ((err = get_int(d, o, path, "samples", true, 0, MAX_INT, &e->samples))) return err;
        if (e->steps == 0 && e->samples > 0)
            return bad(d, path, "samples", "%lld samples in 0 steps", (long long)e->samples);
    }
    m->n_device_steps = (int)n;
    return FB_OK;
}

static int decode_progress(dec *d, json_t *root, fb_wire_msg *m)
{
    static const char *const k_prog[] = {"job_id", "steps", "step", "loss", "accuracy", "lr", NULL};
    static const char *const times[] = {"compute_ms", "comm_ms", "io_ms", "idle_ms"};
    double *slots[] = {&m->compute_ms, &m->comm_ms, &m->io_ms, &m->idle_ms};
    int err;
    json_t *arr;
    if ((err = get_group(d, root, m))) return err;
    for (int i = 0; i < 4; i++)
        if ((err = get_num(d, root, "", times[i], true, false, 0, false, HUGE_VAL, slots[i])))
            return err;
    if ((err = get_num(d, root, "", "samples_per_s", true, false, 0, false, HUGE_VAL,
                       &m->samples_per_s)))
        return err;
    if ((err = decode_device_steps(d, root, m))) return err;
    if ((err = get_array(d, root, "", "members", true, 0, FB_WIRE_MAX_MEMBERS, &arr))) return err;
    size_t n = json_array_size(arr);
    /* a follower of a spanning group reports its devices and leaves the members to the leader */
    if (n == 0 && m->n_device_steps == 0)
        return bad(d, "", "members",
                   "no entries and no devices: only a report with devices (of a spanning "
                   "group's follower) may leave the members out");
    if (n == 0) return FB_OK;
    m->progress = calloc(n, sizeof *m->progress);
    if (!m->progress) return fb_errf(d->msg, d->cap, FB_ERR_NOMEM, "out of memory");
    m->n_progress = (int)n;
    for (size_t i = 0; i < n; i++) {
        fb_wire_member_progress *p = &m->progress[i];
        json_t *o = json_array_get(arr, i);
        char path[32];
        snprintf(path, sizeof path, "members[%zu]", i);
        if ((err = element_object(d, o, path, k_prog))) return err;
        if ((err = get_uuid(d, o, path, "job_id", true, p->job_id))) return err;
        if ((err = get_int(d, o, path, "steps", true, 0, MAX_INT, &p->steps))) return err;
        if ((err = get_int(d, o, path, "step", true, 0, p->steps, &p->step))) return err;
        if ((err = get_num(d, o, path, "loss", true, true, -HUGE_VAL, false, HUGE_VAL, &p->loss)))
            return err;
        if ((err = get_num(d, o, path, "accuracy", true, true, 0, false, 1, &p->accuracy)))
            return err;
        if ((err = get_num(d, o, path, "lr", true, true, 0, false, HUGE_VAL, &p->lr))) return err;
    }
    idref *refs = malloc(n * sizeof *refs);
    if (!refs) return fb_errf(d->msg, d->cap, FB_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        refs[i] = (idref){m->progress[i].job_id, (int)i, -1};
    err = check_dup_ids(d, refs, n, "members");
    free(refs);
    return err;
}

static int decode_event(dec *d, json_t *root, fb_wire_msg *m)
{
    int err, kind;
    if ((err = get_group(d, root, m))) return err;
    if ((err = get_int(d, root, "", "seq", true, 1, MAX_INT, &m->seq))) return err;
    if ((err = get_enum(d, root, "", "event", fb_wire_event_names, FB_EV_KIND_COUNT, &kind)))
        return err;
    m->event = (fb_wire_event_kind)kind;
    if ((err = get_uuid(d, root, "", "job_id", true, m->job_id))) return err;
    if ((err = get_int(d, root, "", "step", true, 0, MAX_INT, &m->step))) return err;
    m->loss = m->accuracy = NAN;
    if ((err = get_num(d, root, "", "loss", false, true, -HUGE_VAL, false, HUGE_VAL, &m->loss)))
        return err;
    if ((err = get_num(d, root, "", "accuracy", false, true, 0, false, 1, &m->accuracy)))
        return err;
    m->test_loss = m->test_accuracy = NAN;
    if ((err = get_num(d, root, "", "test_loss", false, true, -HUGE_VAL, false, HUGE_VAL,
                       &m->test_loss)) ||
        (err = get_num(d, root, "", "test_accuracy", false, true, 0, false, 1,
                       &m->test_accuracy)))
        return err;
    if (kind != FB_EV_FINISHED &&
        (json_object_get(root, "test_loss") || json_object_get(root, "test_accuracy")))
        return bad(d, "", json_object_get(root, "test_loss") ? "test_loss" : "test_accuracy",
                   "only a finished event carries a test evaluation, not %s %s one",
                   kind == FB_EV_EVALUATED ? "an" : "a", fb_wire_event_names[kind]);
    bool may_blob = kind == FB_EV_CHECKPOINTED || kind == FB_EV_FINISHED || kind == FB_EV_DETACHED;
    if (!may_blob && json_object_get(root, "blob"))
        return bad(d, "", "blob",
                   "a %s event carries no blob (only checkpointed, finished, detached)",
                   fb_wire_event_names[kind]);
    if ((err = get_blob(d, root, "", "blob", kind == FB_EV_CHECKPOINTED, &m->blob))) return err;
    if ((err = get_text(d, root, "", "text", m->text, sizeof m->text))) return err;
    if (kind == FB_EV_FAILED && !m->text[0])
        return bad(d, "", "text", "a failed event must say why");
    m->fault = FB_FAULT_JOB;
    if (json_object_get(root, "fault")) {
        if (kind != FB_EV_FAILED)
            return bad(d, "", "fault", "only a failed event names a fault, not a %s one",
                       fb_wire_event_names[kind]);
        int f;
        if ((err = get_enum(d, root, "", "fault", fb_wire_fault_names, FB_FAULT_COUNT, &f)))
            return err;
        m->fault = (fb_wire_fault)f;
    }
    return FB_OK;
}

static int decode_ack(dec *d, json_t *root, fb_wire_msg *m)
{
    int err = get_int(d, root, "", "seq", true, 1, MAX_INT, &m->seq);
    if (!err) err = get_uuid(d, root, "", "group_id", false, m->group_id);
    return err;
}

static int decode_detach(dec *d, json_t *root, fb_wire_msg *m)
{
    int err = get_group(d, root, m);
    if (!err) err = get_uuid(d, root, "", "job_id", false, m->job_id);
    if (!err) err = get_text(d, root, "", "text", m->text, sizeof m->text);
    if (!err && json_object_get(root, "keep_state"))
        err = get_bool(d, root, "", "keep_state", true, &m->keep_state);
    if (!err && m->keep_state && !m->job_id[0])
        return bad(d, "", "keep_state", "only a member's DETACH keeps state, not a group's");
    return err;
}

static int decode_rebalance(dec *d, json_t *root, fb_wire_msg *m)
{
    int err = get_group(d, root, m);
    if (!err) err = get_split(d, root, m);
    if (!err) err = get_num(d, root, "", "time_share", true, false, 0, true, 1, &m->time_share);
    return err;
}

static int decode_heartbeat(dec *d, json_t *root, fb_wire_msg *m)
{
    bool has_run = json_object_get(root, "running") != NULL;
    bool has_known = json_object_get(root, "known") != NULL;
    if (has_run && has_known)
        return bad(d, "", "known",
                   "a heartbeat carries running (from the worker) or known (the server's "
                   "reply), not both");
    if (!has_known) return decode_running(d, root, m);
    m->reply = true;
    return get_bool(d, root, "", "known", true, &m->known);
}

static int decode_drain(dec *d, json_t *root, fb_wire_msg *m)
{
    return get_text(d, root, "", "text", m->text, sizeof m->text);
}

typedef int (*decode_fn)(dec *d, json_t *root, fb_wire_msg *m);

static const struct {
    decode_fn fn;
    const char *const *fields;
} types[FB_WIRE_TYPE_COUNT] = {
    [FB_WIRE_HELLO] = {decode_hello,
                       (const char *const[]){"v", "type", "worker", "backend", "version", "devices",
                                             "comm", "running", NULL}},
    [FB_WIRE_WELCOME] = {decode_welcome,
                         (const char *const[]){"v", "type", "worker_id", "heartbeat_ms", NULL}},
    [FB_WIRE_ASSIGN] = {decode_assign,
                        (const char *const[]){"v", "type", "group_id", "generation", "fusion_key",
                                              "dataset", "dataset_tenant", "builtin", "devices",
                                              "parallel_data", "parallel_pipeline", "span", "split",
                                              "time_share", "members", NULL}},
    [FB_WIRE_PROGRESS] = {decode_progress,
                          (const char *const[]){"v", "type", "group_id", "generation", "compute_ms",
                                                "comm_ms", "io_ms", "idle_ms", "samples_per_s",
                                                "devices", "members", NULL}},
    [FB_WIRE_EVENT] = {decode_event, (const char *const[]){"v", "type", "group_id", "generation",
                                                           "seq", "event", "job_id", "step", "loss",
                                                           "accuracy", "test_loss",
                                                           "test_accuracy", "blob", "text",
                                                           "fault", NULL}},
    [FB_WIRE_ACK] = {decode_ack, (const char *const[]){"v", "type", "seq", "group_id", NULL}},
    [FB_WIRE_DETACH] = {decode_detach, (const char *const[]){"v", "type", "group_id", "generation",
                                                             "job_id", "text", "keep_state", NULL}},
    [FB_WIRE_REBALANCE] = {decode_rebalance,
                           (const char *const[]){"v", "type", "group_id", "generation", "split",
                                                 "time_share", NULL}},
    [FB_WIRE_HEARTBEAT] = {decode_heartbeat,
                           (const char *const[]){"v", "type", "running", "known", NULL}},
    [FB_WIRE_DRAIN] = {decode_drain, (const char *const[]){"v", "type", "text", NULL}},
};

/* Nesting depth of arrays and objects in JSON text, counted before parsing so
 * a deeply nested frame costs nothing; strings are skipped. */
static int json_depth(const char *s, size_t n)
{
    int depth = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (in_str) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_str = false;
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == '[' || ch == '{') {
            if (++depth > max) max = depth;
        } else if (ch == ']' || ch == '}') {
            depth--;
        }
    }
    return max;
}

/* Decodes into *out (zeroed first); *out owns what it holds even on failure. */
static int decode(dec *d, const char *json, size_t len, fb_wire_msg *out)
{
    memset(out, 0, sizeof *out);
    if (!json) return bad(d, "", "", "no frame");
    if (len > FB_WIRE_MAX_JSON)
        return bad(d, "", "", "frame 0 of %zu bytes exceeds %zu", len, FB_WIRE_MAX_JSON);
    const char *nul = memchr(json, '\0', len);
    if (nul) return bad(d, "", "", "frame 0 has a NUL byte at offset %zu", (size_t)(nul - json));
    if (json_depth(json, len) > FB_WIRE_MAX_DEPTH)
        return bad(d, "", "", "frame 0 nests arrays and objects deeper than %d", FB_WIRE_MAX_DEPTH);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (!root) {
        /* jansson quotes the input near the error; keep that quote printable */
        for (char *p = jerr.text; *p; p++)
            if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) *p = '?';
        return bad(d, "", "", "not valid JSON at line %d column %d: %s", jerr.line, jerr.column,
                   jerr.text);
    }
    int err, t;
    int64_t v = 0;
    if (!json_is_object(root)) {
        err = bad(d, "", "", "expected a JSON object, got %s", json_kind(root));
        goto done;
    }
    json_t *vv = json_object_get(root, "v");
    if (vv && json_is_integer(vv) && json_integer_value(vv) != FB_WIRE_VERSION) {
        err = bad(d, "", "v", "version %lld is not spoken here (this side speaks %d)",
                  (long long)json_integer_value(vv), FB_WIRE_VERSION);
        goto done;
    }
    if ((err = get_int(d, root, "", "v", true, FB_WIRE_VERSION, FB_WIRE_VERSION, &v))) goto done;
    if ((err = get_enum(d, root, "", "type", fb_wire_type_names, FB_WIRE_TYPE_COUNT, &t)))
        goto done;
    out->type = (fb_wire_type)t;
    if ((err = check_fields(d, root, "", types[t].fields))) goto done;
    if ((err = types[t].fn(d, root, out))) goto done;
done:
    json_decref(root);
    return err;
}

int fb_wire_decode(const char *json, size_t len, int n_blobs, fb_wire_msg *out, char *msg,
                   size_t msg_cap)
{
    if (msg && msg_cap) msg[0] = '\0';
    if (!out) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "no output message");
    dec *d = calloc(1, sizeof *d);
    if (!d) {
        memset(out, 0, sizeof *out);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    }
    d->msg = msg;
    d->cap = msg_cap;
    d->n_blobs = n_blobs;
    int err;
    if (n_blobs < 0 || n_blobs > FB_WIRE_MAX_BLOBS) {
        memset(out, 0, sizeof *out);
        err = bad(d, "", "", "%d blob frames, allowed 0..%d", n_blobs, FB_WIRE_MAX_BLOBS);
    } else if (!(err = decode(d, json, len, out))) {
        for (int b = 1; b <= n_blobs; b++) {
            if (!d->blob_used[b]) {
                err = bad(d, "", "", "blob frame %d is not referred to by any field", b);
                break;
            }
        }
    }
    free(d);
    if (err) fb_wire_msg_free(out);
    return err;
}

int fb_wire_check_encoded(const char *json, size_t len, char *msg, size_t msg_cap)
{
    /* the blob count is not known here, so every index is allowed and the ones used must then
     * be exactly 1..k */
    dec *d = calloc(1, sizeof *d);
    if (!d) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    *d = (dec){.msg = msg, .cap = msg_cap, .n_blobs = FB_WIRE_MAX_BLOBS};
    fb_wire_msg check;
    int err = decode(d, json, len, &check);
    if (!err && d->n_blob_refs != d->max_blob_ref)
        err = bad(d, "", "blob",
                  "indices must be numbered 1..%d in frame order, but index %d is used",
                  d->n_blob_refs, d->max_blob_ref);
    fb_wire_msg_free(&check);
    free(d);
    return err;
}
