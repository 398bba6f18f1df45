/*
 * The wire protocol codec: strict decoding and encoding of the JSON frame of
 * the messages between fuseboxd and fusebox-worker, and the CURVE key files
 * both sides read.
 *
 * Every message type lists the fields it allows, every field has one JSON
 * type and a range, and every error names the field by its path
 * ("members[2].job_id").  Encoding builds the JSON from the struct and then
 * runs the decoder over its own output, so a message the receiver would
 * refuse is refused before it is sent, and decode(encode(m)) equals m by
 * construction.
 */
#include "wire.h"

#include "jobspec.h"
#include "utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

/* A job spec's dataset must fit the wire's buffer, or a valid job could never be dispatched. */
_Static_assert(FB_WIRE_DATASET_MAX >= FB_SPEC_DATASET_MAX, "dataset names must fit the wire");
_Static_assert(FB_FUSION_KEY_HEX < sizeof(((fb_wire_msg *)0)->fusion_key), "fusion key fits");

#define MAX_INT ((int64_t)1 << 53) /* counters stay exact in any JSON reader */
#define HEARTBEAT_MIN_MS 100
#define HEARTBEAT_MAX_MS 60000
#define KEY_FILE_MAX 4096       /* bytes of one key file */
#define KEYS_FILE_MAX (1 << 20) /* bytes of an allow-list */
#define Z85_KEY_LEN 40

static const char *const type_names[FB_WIRE_TYPE_COUNT] = {
    [FB_WIRE_HELLO] = "hello",         [FB_WIRE_WELCOME] = "welcome",
    [FB_WIRE_ASSIGN] = "assign",       [FB_WIRE_PROGRESS] = "progress",
    [FB_WIRE_EVENT] = "event",         [FB_WIRE_ACK] = "ack",
    [FB_WIRE_DETACH] = "detach",       [FB_WIRE_REBALANCE] = "rebalance",
    [FB_WIRE_HEARTBEAT] = "heartbeat", [FB_WIRE_DRAIN] = "drain",
};

static const char *const fault_names[FB_FAULT_COUNT] = {[FB_FAULT_JOB] = "job",
                                                        [FB_FAULT_SPEC] = "spec"};

static const char *const event_names[FB_EV_KIND_COUNT] = {
    [FB_EV_STARTED] = "started",
    [FB_EV_EVALUATED] = "evaluated",
    [FB_EV_CHECKPOINTED] = "checkpointed",
    [FB_EV_FINISHED] = "finished",
    [FB_EV_FAILED] = "failed",
    [FB_EV_DETACHED] = "detached",
};

static const char *const kind_names[] = {"cpu", "cuda"};

const char *fb_wire_type_name(fb_wire_type t)
{
    return (t >= 0 && t < FB_WIRE_TYPE_COUNT) ? type_names[t] : "unknown";
}

int fb_wire_type_parse(const char *name)
{
    for (int i = 0; name && i < FB_WIRE_TYPE_COUNT; i++)
        if (strcmp(name, type_names[i]) == 0) return i;
    return -1;
}

const char *fb_wire_event_name(fb_wire_event_kind k)
{
    return (k >= 0 && k < FB_EV_KIND_COUNT) ? event_names[k] : "unknown";
}

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
    if ((err = get_enum(d, root, "", "event", event_names, FB_EV_KIND_COUNT, &kind))) return err;
    m->event = (fb_wire_event_kind)kind;
    if ((err = get_uuid(d, root, "", "job_id", true, m->job_id))) return err;
    if ((err = get_int(d, root, "", "step", true, 0, MAX_INT, &m->step))) return err;
    m->loss = m->accuracy = NAN;
    if ((err = get_num(d, root, "", "loss", false, true, -HUGE_VAL, false, HUGE_VAL, &m->loss)))
        return err;
    if ((err = get_num(d, root, "", "accuracy", false, true, 0, false, 1, &m->accuracy)))
        return err;
    bool may_blob = kind == FB_EV_CHECKPOINTED || kind == FB_EV_FINISHED || kind == FB_EV_DETACHED;
    if (!may_blob && json_object_get(root, "blob"))
        return bad(d, "", "blob",
                   "a %s event carries no blob (only checkpointed, finished, detached)",
                   event_names[kind]);
    if ((err = get_blob(d, root, "", "blob", kind == FB_EV_CHECKPOINTED, &m->blob))) return err;
    if ((err = get_text(d, root, "", "text", m->text, sizeof m->text))) return err;
    if (kind == FB_EV_FAILED && !m->text[0])
        return bad(d, "", "text", "a failed event must say why");
    m->fault = FB_FAULT_JOB;
    if (json_object_get(root, "fault")) {
        if (kind != FB_EV_FAILED)
            return bad(d, "", "fault", "only a failed event names a fault, not a %s one",
                       event_names[kind]);
        int f;
        if ((err = get_enum(d, root, "", "fault", fault_names, FB_FAULT_COUNT, &f))) return err;
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
                                                           "accuracy", "blob", "text", "fault",
                                                           NULL}},
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
    if ((err = get_enum(d, root, "", "type", type_names, FB_WIRE_TYPE_COUNT, &t))) goto done;
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

void fb_wire_msg_free(fb_wire_msg *m)
{
    if (!m) return;
    for (int i = 0; m->running && i < m->n_running; i++) {
        free(m->running[i].job_ids);
        free(m->running[i].steps);
    }
    free(m->running);
    for (int i = 0; m->members && i < m->n_members; i++)
        free(m->members[i].spec);
    free(m->members);
    free(m->progress);
    memset(m, 0, sizeof *m);
}

/* ---- encoding -------------------------------------------------------------- */

/* Encoder state: the first error wins. */
typedef struct enc {
    char *msg;
    size_t cap;
    int err;
} enc;

__attribute__((format(printf, 3, 4))) static void enc_fail(enc *e, const char *field,
                                                           const char *fmt, ...)
{
    if (e->err) return;
    e->err = FB_ERR_BAD_WIRE;
    if (e->msg && e->cap) {
        char what[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        snprintf(e->msg, e->cap, "%s: %s", field, what);
    }
}

static void enc_nomem(enc *e)
{
    if (!e->err) e->err = fb_errf(e->msg, e->cap, FB_ERR_NOMEM, "out of memory");
}

/* Jansson's *_new setters release v when they fail, also when o is NULL. */
static void put(enc *e, json_t *o, const char *key, json_t *v)
{
    if (!v || json_object_set_new(o, key, v)) enc_nomem(e);
}

static void append(enc *e, json_t *arr, json_t *v)
{
    if (!v || !arr || json_array_append_new(arr, v)) enc_nomem(e);
}

/* A string buffer of the struct: it must end inside its buffer and be UTF-8. */
static json_t *str_of(enc *e, const char *field, const char *s, size_t cap)
{
    if (cap && !memchr(s, '\0', cap)) {
        enc_fail(e, field, "not NUL-terminated within its %zu bytes", cap);
        return NULL;
    }
    if (!fb_utf8_valid_str(s)) {
        enc_fail(e, field, "not valid UTF-8");
        return NULL;
    }
    json_t *v = json_string(s);
    if (!v) enc_nomem(e);
    return v;
}

static void put_str(enc *e, json_t *o, const char *key, const char *s, size_t cap)
{
    json_t *v = str_of(e, key, s, cap);
    if (v) put(e, o, key, v);
}

/* A number; NaN is null where nullable, and infinities have no JSON form. */
static void put_num(enc *e, json_t *o, const char *path, const char *key, double x, bool nullable)
{
    if (isnan(x) && nullable) {
        put(e, o, key, json_null());
    } else if (!isfinite(x)) {
        char field[64];
        snprintf(field, sizeof field, "%s%s%s", path, *path ? "." : "", key);
        enc_fail(e, field, "%g is not a finite number", x);
    } else {
        put(e, o, key, json_real(x));
    }
}

static void put_int(enc *e, json_t *o, const char *key, int64_t x)
{
    put(e, o, key, json_integer((json_int_t)x));
}

/* A count of the struct, before it is used to index anything. */
static bool count_ok(enc *e, const char *field, int n, int max, const void *ptr)
{
    if (n < 0 || n > max) {
        enc_fail(e, field, "%d entries, allowed 0..%d", n, max);
        return false;
    }
    if (n > 0 && !ptr) {
        enc_fail(e, field, "%d entries but no array", n);
        return false;
    }
    return true;
}

/* Optional strings are left out when empty, as decode reads absence as "". */
static void put_opt_str(enc *e, json_t *o, const char *key, const char *s, size_t cap)
{
    if (!memchr(s, '\0', cap))
        enc_fail(e, key, "not NUL-terminated within its %zu bytes", cap);
    else if (s[0])
        put_str(e, o, key, s, cap);
}

static void put_group(enc *e, json_t *o, const fb_wire_msg *m)
{
    put_str(e, o, "group_id", m->group_id, sizeof m->group_id);
    put_int(e, o, "generation", m->generation);
}

static void put_split(enc *e, json_t *o, const fb_wire_msg *m)
{
    if (!count_ok(e, "split", m->n_split, FB_WIRE_MAX_DEVICES, m->split)) return;
    json_t *arr = json_array();
    for (int i = 0; i < m->n_split; i++)
        append(e, arr, json_integer(m->split[i]));
    put(e, o, "split", arr);
}

static void put_running(enc *e, json_t *o, const fb_wire_msg *m)
{
    if (!count_ok(e, "running", m->n_running, FB_WIRE_MAX_GROUPS, m->running)) return;
    json_t *arr = json_array();
    for (int i = 0; i < m->n_running && !e->err; i++) {
        const fb_wire_running *r = &m->running[i];
        char field[48];
        snprintf(field, sizeof field, "running[%d].job_ids", i);
        if (!count_ok(e, field, r->n_jobs, FB_WIRE_MAX_MEMBERS, r->job_ids)) break;
        if (!count_ok(e, field, r->n_jobs, FB_WIRE_MAX_MEMBERS, r->steps)) break;
        json_t *ro = json_object(), *ids = json_array(), *steps = json_array();
        put_str(e, ro, "group_id", r->group_id, sizeof r->group_id);
        put_int(e, ro, "generation", r->generation);
        for (int j = 0; j < r->n_jobs; j++) {
            snprintf(field, sizeof field, "running[%d].job_ids[%d]", i, j);
            json_t *id = str_of(e, field, r->job_ids[j], sizeof r->job_ids[j]);
            if (id) append(e, ids, id);
            append(e, steps, json_integer(r->steps[j]));
        }
        put(e, ro, "job_ids", ids);
        put(e, ro, "steps", steps);
        append(e, arr, ro);
    }
    put(e, o, "running", arr);
}

static void encode_hello(enc *e, json_t *o, const fb_wire_msg *m)
{
    put_str(e, o, "worker", m->worker, sizeof m->worker);
    put_str(e, o, "backend", m->backend, sizeof m->backend);
    put_str(e, o, "version", m->version, sizeof m->version);
    if (count_ok(e, "devices", m->n_devices, FB_WIRE_MAX_DEVICES, m->devices)) {
        json_t *arr = json_array();
        for (int i = 0; i < m->n_devices; i++) {
            const fb_wire_device *dv = &m->devices[i];
            json_t *d = json_object();
            char field[48];
            put_int(e, d, "idx", dv->idx);
            snprintf(field, sizeof field, "devices[%d].kind", i);
            json_t *v = str_of(e, field, dv->kind, sizeof dv->kind);
            if (v) put(e, d, "kind", v);
            snprintf(field, sizeof field, "devices[%d].name", i);
            v = str_of(e, field, dv->name, sizeof dv->name);
            if (v) put(e, d, "name", v);
            put_int(e, d, "memory_bytes", dv->memory_bytes);
            put_int(e, d, "free_bytes", dv->free_bytes);
            append(e, arr, d);
        }
        put(e, o, "devices", arr);
    }
    if (!memchr(m->comm_host, '\0', sizeof m->comm_host)) {
        enc_fail(e, "comm.host", "not NUL-terminated within its %zu bytes", sizeof m->comm_host);
    } else if (m->comm_host[0]) {
        /* written only when set: a server from before it refuses the field */
        json_t *c = json_object(), *ports = json_array();
        put_str(e, c, "host", m->comm_host, sizeof m->comm_host);
        append(e, ports, json_integer(m->comm_port_lo));
        append(e, ports, json_integer(m->comm_port_hi));
        put(e, c, "ports", ports);
        put(e, o, "comm", c);
    } else if (m->comm_port_lo || m->comm_port_hi) {
        enc_fail(e, "comm.ports", "set without comm.host");
    }
    put_running(e, o, m);
}

/* span of ASSIGN: written only for a group that spans workers (world set), so that a worker
 * from before it still reads every other ASSIGN. */
static void put_span(enc *e, json_t *o, const fb_wire_msg *m)
{
    if (!memchr(m->rendezvous, '\0', sizeof m->rendezvous) ||
        !memchr(m->token, '\0', sizeof m->token)) {
        enc_fail(e, "span", "rendezvous or token not NUL-terminated within its buffer");
        return;
    }
    if (!m->world) {
        if (m->rank_base || m->rendezvous[0] || m->token[0])
            enc_fail(e, "span", "rank_base, rendezvous or token set without world");
        return;
    }
    json_t *sp = json_object();
    put_int(e, sp, "world", m->world);
    put_int(e, sp, "rank_base", m->rank_base);
    put_str(e, sp, "rendezvous", m->rendezvous, sizeof m->rendezvous);
    put_str(e, sp, "token", m->token, sizeof m->token);
    put(e, o, "span", sp);
}

static void encode_assign(enc *e, json_t *o, const fb_wire_msg *m)
{
    put_group(e, o, m);
    put_str(e, o, "fusion_key", m->fusion_key, sizeof m->fusion_key);
    put_str(e, o, "dataset", m->dataset, sizeof m->dataset);
    if (m->dataset_tenant[0])
        put_str(e, o, "dataset_tenant", m->dataset_tenant, sizeof m->dataset_tenant);
    if (m->builtin[0]) {
        if (m->dataset_tenant[0])
            enc_fail(e, "builtin", "a built-in comes without a dataset_tenant");
        put_str(e, o, "builtin", m->builtin, sizeof m->builtin);
    }
    if (count_ok(e, "devices", m->n_group_devices, FB_WIRE_MAX_DEVICES, m->group_devices)) {
        json_t *arr = json_array();
        for (int i = 0; i < m->n_group_devices; i++)
            append(e, arr, json_integer(m->group_devices[i]));
        put(e, o, "devices", arr);
    }
    put_int(e, o, "parallel_data", m->parallel_data);
    put_int(e, o, "parallel_pipeline", m->parallel_pipeline);
    put_span(e, o, m);
    put_split(e, o, m);
    put_num(e, o, "", "time_share", m->time_share, false);
    if (!count_ok(e, "members", m->n_members, FB_WIRE_MAX_MEMBERS, m->members)) return;
    json_t *arr = json_array();
    for (int i = 0; i < m->n_members && !e->err; i++) {
        const fb_wire_member *mb = &m->members[i];
        json_t *mo = json_object();
        char field[48];
        snprintf(field, sizeof field, "members[%d].job_id", i);
        json_t *v = str_of(e, field, mb->job_id, sizeof mb->job_id);
        if (v) put(e, mo, "job_id", v);
        snprintf(field, sizeof field, "members[%d].tenant_id", i);
        if ((v = str_of(e, field, mb->tenant_id, sizeof mb->tenant_id))) put(e, mo, "tenant_id", v);
        snprintf(field, sizeof field, "members[%d].spec", i);
        if (!mb->spec)
            enc_fail(e, field, "no spec");
        else if ((v = str_of(e, field, mb->spec, 0)))
            put(e, mo, "spec", v);
        put_int(e, mo, "start_step", mb->start_step);
        if (mb->resume_blob) put_int(e, mo, "resume_blob", mb->resume_blob);
        if (mb->init_blob) {
            if (mb->start_step > 0) enc_fail(e, "init_blob", "only at start_step 0");
            put_int(e, mo, "init_blob", mb->init_blob);
        }
        append(e, arr, mo);
    }
    put(e, o, "members", arr);
}

static void encode_progress(enc *e, json_t *o, const fb_wire_msg *m)
{
    put_group(e, o, m);
    put_num(e, o, "", "compute_ms", m->compute_ms, false);
    put_num(e, o, "", "comm_ms", m->comm_ms, false);
    put_num(e, o, "", "io_ms", m->io_ms, false);
    put_num(e, o, "", "idle_ms", m->idle_ms, false);
    put_num(e, o, "", "samples_per_s", m->samples_per_s, false);
    /* the per-device breakdown is optional: a report without it is written as before */
    if (!count_ok(e, "devices", m->n_device_steps, FB_WIRE_MAX_DEVICES, m->device_steps)) return;
    if (m->n_device_steps > 0) {
        json_t *devs = json_array();
        for (int i = 0; i < m->n_device_steps && !e->err; i++) {
            const fb_wire_device_step *x = &m->device_steps[i];
            json_t *dobj = json_object();
            char path[32];
            snprintf(path, sizeof path, "devices[%d]", i);
            put_int(e, dobj, "idx", x->device);
            put_num(e, dobj, path, "compute_ms", x->compute_ms, false);
            put_num(e, dobj, path, "pass_ms", x->pass_ms, false);
            put_num(e, dobj, path, "comm_ms", x->comm_ms, false);
            put_num(e, dobj, path, "io_ms", x->io_ms, false);
            put_num(e, dobj, path, "idle_ms", x->idle_ms, false);
            put_int(e, dobj, "steps", x->steps);
            put_int(e, dobj, "samples", x->samples);
            append(e, devs, dobj);
        }
        put(e, o, "devices", devs);
    }
    if (!count_ok(e, "members", m->n_progress, FB_WIRE_MAX_MEMBERS, m->progress)) return;
    json_t *arr = json_array();
    for (int i = 0; i < m->n_progress && !e->err; i++) {
        const fb_wire_member_progress *p = &m->progress[i];
        json_t *po = json_object();
        char path[32], field[48];
        snprintf(path, sizeof path, "members[%d]", i);
        snprintf(field, sizeof field, "%s.job_id", path);
        json_t *v = str_of(e, field, p->job_id, sizeof p->job_id);
        if (v) put(e, po, "job_id", v);
        put_int(e, po, "step", p->step);
        put_int(e, po, "steps", p->steps);
        put_num(e, po, path, "loss", p->loss, true);
        put_num(e, po, path, "accuracy", p->accuracy, true);
        put_num(e, po, path, "lr", p->lr, true);
        append(e, arr, po);
    }
    put(e, o, "members", arr);
}

static void encode_event(enc *e, json_t *o, const fb_wire_msg *m)
{
    put_group(e, o, m);
    put_int(e, o, "seq", m->seq);
    if (m->event < 0 || m->event >= FB_EV_KIND_COUNT) {
        enc_fail(e, "event", "%d is not an event kind", (int)m->event);
        return;
    }
    put(e, o, "event", json_string(event_names[m->event]));
    put_str(e, o, "job_id", m->job_id, sizeof m->job_id);
    put_int(e, o, "step", m->step);
    put_num(e, o, "", "loss", m->loss, true);
    put_num(e, o, "", "accuracy", m->accuracy, true);
    if (m->blob) put_int(e, o, "blob", m->blob);
    put_opt_str(e, o, "text", m->text, sizeof m->text);
    /* written only when it is not the default: a server from before the field refuses it */
    if (m->fault != FB_FAULT_JOB) {
        if (m->event != FB_EV_FAILED)
            enc_fail(e, "fault", "only a failed event names a fault");
        else if (m->fault < 0 || m->fault >= FB_FAULT_COUNT)
            enc_fail(e, "fault", "%d is not a fault", (int)m->fault);
        else
            put(e, o, "fault", json_string(fault_names[m->fault]));
    }
}

static void encode_body(enc *e, json_t *o, const fb_wire_msg *m)
{
    switch (m->type) {
    case FB_WIRE_HELLO:
        encode_hello(e, o, m);
        break;
    case FB_WIRE_WELCOME:
        put_str(e, o, "worker_id", m->worker_id, sizeof m->worker_id);
        put_int(e, o, "heartbeat_ms", m->heartbeat_ms);
        break;
    case FB_WIRE_ASSIGN:
        encode_assign(e, o, m);
        break;
    case FB_WIRE_PROGRESS:
        encode_progress(e, o, m);
        break;
    case FB_WIRE_EVENT:
        encode_event(e, o, m);
        break;
    case FB_WIRE_ACK:
        put_int(e, o, "seq", m->seq);
        put_opt_str(e, o, "group_id", m->group_id, sizeof m->group_id);
        break;
    case FB_WIRE_DETACH:
        put_group(e, o, m);
        put_opt_str(e, o, "job_id", m->job_id, sizeof m->job_id);
        put_opt_str(e, o, "text", m->text, sizeof m->text);
        /* written only when set: a worker from before it refuses the field */
        if (m->keep_state && !m->job_id[0])
            enc_fail(e, "keep_state", "only a member's DETACH keeps state, not a group's");
        else if (m->keep_state)
            put(e, o, "keep_state", json_true());
        break;
    case FB_WIRE_REBALANCE:
        put_group(e, o, m);
        put_split(e, o, m);
        put_num(e, o, "", "time_share", m->time_share, false);
        break;
    case FB_WIRE_HEARTBEAT:
        /* Without these two checks a reply built without reply = true would go out as a
         * worker heartbeat, and the worker would never learn it is unknown. */
        if (m->reply && m->n_running)
            enc_fail(e, "running", "the server's heartbeat reply carries no running groups");
        else if (!m->reply && m->known)
            enc_fail(e, "known", "only the server's heartbeat reply (reply = true) carries known");
        else if (m->reply)
            put(e, o, "known", json_boolean(m->known));
        else
            put_running(e, o, m);
        break;
    case FB_WIRE_DRAIN:
        put_opt_str(e, o, "text", m->text, sizeof m->text);
        break;
    default:
        break;
    }
}

char *fb_wire_encode(const fb_wire_msg *m, char *msg, size_t msg_cap)
{
    enc e = {.msg = msg, .cap = msg_cap};
    if (msg && msg_cap) msg[0] = '\0';
    if (!m) {
        fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "no message");
        return NULL;
    }
    if (m->type < 0 || m->type >= FB_WIRE_TYPE_COUNT) {
        fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE, "type: %d is not a message type", (int)m->type);
        return NULL;
    }
    json_t *o = json_object();
    put_int(&e, o, "v", FB_WIRE_VERSION);
    put(&e, o, "type", json_string(type_names[m->type]));
    encode_body(&e, o, m);
    char *s = e.err ? NULL : json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (e.err) return NULL;
    if (!s) {
        fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        return NULL;
    }
    /* The receiver's checks, run on what would be sent: the blob count is not known here, so
     * every index is allowed and the ones used must then be exactly 1..k. */
    dec *d = calloc(1, sizeof *d);
    if (!d) {
        free(s);
        fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        return NULL;
    }
    *d = (dec){.msg = msg, .cap = msg_cap, .n_blobs = FB_WIRE_MAX_BLOBS};
    fb_wire_msg check;
    int err = decode(d, s, strlen(s), &check);
    if (!err && d->n_blob_refs != d->max_blob_ref)
        err = bad(d, "", "blob",
                  "indices must be numbered 1..%d in frame order, but index %d is used",
                  d->n_blob_refs, d->max_blob_ref);
    fb_wire_msg_free(&check);
    free(d);
    if (err) {
        free(s);
        return NULL;
    }
    return s;
}

/* ---- key files ------------------------------------------------------------- */

static const char z85_alphabet[] =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/* 40 characters of the Z85 alphabet that decode to 32 bytes: each group of 5
 * characters must stand for a value below 2^32.  That also means no key
 * starts with '#' (a group's first character is at most '%'), which is what
 * lets '#' start a comment in a list of bare keys. */
static bool z85_key_ok(const char *s, size_t n)
{
    if (n != Z85_KEY_LEN) return false;
    for (size_t g = 0; g < n; g += 5) {
        uint64_t value = 0;
        for (size_t i = g; i < g + 5; i++) {
            const char *at = s[i] ? strchr(z85_alphabet, s[i]) : NULL;
            if (!at) return false;
            value = value * 85 + (uint64_t)(at - z85_alphabet);
        }
        if (value > UINT32_MAX) return false;
    }
    return true;
}

/* Reads a whole small file into a NUL-terminated buffer. */
static int read_small(const char *path, size_t max, char **buf, size_t *len, char *msg, size_t cap)
{
    if (!path || !*path) return fb_errf(msg, cap, FB_ERR_IO, "no file name");
    FILE *f = fopen(path, "rb");
    if (!f) return fb_errf(msg, cap, FB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *b = malloc(max + 2);
    if (!b) {
        fclose(f);
        return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    }
    size_t n = fread(b, 1, max + 1, f);
    int rd = ferror(f);
    fclose(f);
    if (rd || n > max) {
        sodium_memzero(b, max + 2);
        free(b);
        return rd ? fb_errf(msg, cap, FB_ERR_IO, "%s: read error", path)
                  : fb_errf(msg, cap, FB_ERR_BAD_WIRE, "%s: larger than %zu bytes", path, max);
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return FB_OK;
}

/* Line iteration over a buffer: *line and *n get the next line without its end, trimmed of
 * surrounding blanks and a '\r'.  Returns false at the end. */
static bool next_line(char **cur, char *end, char **line, size_t *n)
{
    if (*cur >= end) return false;
    char *s = *cur, *nl = memchr(s, '\n', (size_t)(end - s));
    char *e = nl ? nl : end;
    *cur = nl ? nl + 1 : end;
    while (s < e && (*s == ' ' || *s == '\t'))
        s++;
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
        e--;
    *line = s;
    *n = (size_t)(e - s);
    return true;
}

/* If line is "<label>: <value>", points *val at the value. */
static bool labelled(const char *line, size_t n, const char *label, const char **val, size_t *vn)
{
    size_t l = strlen(label);
    if (n <= l || memcmp(line, label, l) != 0 || line[l] != ':') return false;
    size_t i = l + 1;
    while (i < n && (line[i] == ' ' || line[i] == '\t'))
        i++;
    *val = line + i;
    *vn = n - i;
    return true;
}

int fb_wire_key_generate(const char *path, char *msg, size_t msg_cap)
{
    char pub[Z85_KEY_LEN + 1], sec[Z85_KEY_LEN + 1], text[128];
    if (!path || !*path) return fb_errf(msg, msg_cap, FB_ERR_IO, "no key file name");
    if (zmq_curve_keypair(pub, sec) != 0)
        return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED, "cannot make a CURVE keypair: %s",
                       zmq_strerror(errno));
    int tlen = snprintf(text, sizeof text, "public: %s\nsecret: %s\n", pub, sec);
    sodium_memzero(sec, sizeof sec);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16), *dir = malloc(plen + 2);
    int err = FB_OK, fd = -1;
    if (!tmp || !dir) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* The key is written next to its final name and linked into place: link() fails when
     * the name exists, so an existing key is never replaced, and a crash leaves either no
     * key file or a complete one. */
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    fd = mkstemp(tmp);
    if (fd < 0) {
        err = fb_errf(msg, msg_cap, FB_ERR_IO, "%s: cannot create a temporary file: %s", path,
                      strerror(errno));
        tmp[0] = '\0';
        goto fail;
    }
    ssize_t w = (fchmod(fd, 0600) == 0) ? write(fd, text, (size_t)tlen) : -1;
    if (w != tlen || fsync(fd) != 0) {
        err =
            fb_errf(msg, msg_cap, FB_ERR_IO, "%s: cannot write the key: %s", tmp, strerror(errno));
        goto fail;
    }
    int cl = close(fd);
    fd = -1;
    if (cl != 0) {
        err =
            fb_errf(msg, msg_cap, FB_ERR_IO, "%s: cannot write the key: %s", tmp, strerror(errno));
        goto fail;
    }
    if (link(tmp, path) != 0) {
        err = errno == EEXIST ? fb_errf(msg, msg_cap, FB_ERR_ALREADY_EXISTS,
                                        "%s exists; a key file is never overwritten", path)
                              : fb_errf(msg, msg_cap, FB_ERR_IO, "%s: cannot create: %s", path,
                                        strerror(errno));
        goto fail;
    }
    unlink(tmp);
    tmp[0] = '\0';
    /* Make the new name durable too; a file system that cannot sync a directory says EINVAL. */
    memcpy(dir, path, plen + 1);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, plen + 2, ".");
    else if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        int rc = fsync(dfd), e = errno;
        close(dfd);
        if (rc != 0 && e != EINVAL)
            err = fb_errf(msg, msg_cap, FB_ERR_IO, "%s: cannot sync the directory: %s", dir,
                          strerror(e));
    }
fail:
    if (fd >= 0) close(fd);
    if (tmp && tmp[0]) unlink(tmp);
    free(tmp);
    free(dir);
    sodium_memzero(text, sizeof text);
    return err;
}

int fb_wire_key_load(const char *path, char public_z85[41], char secret_z85[41], char *msg,
                     size_t msg_cap)
{
    char pub[Z85_KEY_LEN + 1] = "", sec[Z85_KEY_LEN + 1] = "", derived[Z85_KEY_LEN + 1];
    char *buf = NULL, *cur, *line;
    size_t len = 0, n;
    int err = read_small(path, KEY_FILE_MAX, &buf, &len, msg, msg_cap);
    if (err) return err;
    cur = buf;
    for (int ln = 1; next_line(&cur, buf + len, &line, &n); ln++) {
        const char *val;
        size_t vn;
        if (n == 0 || line[0] == '#') continue;
        bool is_pub = labelled(line, n, "public", &val, &vn);
        bool is_sec = !is_pub && labelled(line, n, "secret", &val, &vn);
        if (!is_pub && !is_sec) {
            err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE,
                          "%s: line %d: expected \"public: <key>\" or \"secret: <key>\"", path, ln);
            goto fail;
        }
        char *dst = is_pub ? pub : sec;
        if (dst[0]) {
            err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE, "%s: line %d: a second %s key", path, ln,
                          is_pub ? "public" : "secret");
            goto fail;
        }
        if (!z85_key_ok(val, vn)) {
            err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE,
                          "%s: line %d: the %s key is not 40 characters of Z85", path, ln,
                          is_pub ? "public" : "secret");
            goto fail;
        }
        memcpy(dst, val, vn);
        dst[vn] = '\0';
    }
    if (!pub[0]) {
        err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE, "%s: no \"public:\" line", path);
        goto fail;
    }
    if (secret_z85 && !sec[0]) {
        err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE,
                      "%s: no \"secret:\" line (is this a public key file?)", path);
        goto fail;
    }
    if (sec[0] && (zmq_curve_public(derived, sec) != 0 || strcmp(derived, pub) != 0)) {
        err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE,
                      "%s: the public key does not belong to the secret key", path);
        goto fail;
    }
    if (public_z85) memcpy(public_z85, pub, sizeof pub);
    if (secret_z85) memcpy(secret_z85, sec, sizeof sec);
fail:
    sodium_memzero(sec, sizeof sec);
    if (buf) sodium_memzero(buf, len);
    free(buf);
    return err;
}

int fb_wire_keys_load(const char *path, char (*keys)[41], int cap, int *n, char *msg,
                      size_t msg_cap)
{
    if (cap < 0 || (cap > 0 && !keys) || !n)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "bad key list arguments");
    char *buf = NULL, *cur, *line;
    size_t len = 0, ln_len;
    int err = read_small(path, KEYS_FILE_MAX, &buf, &len, msg, msg_cap);
    if (err) return err;
    char(*got)[Z85_KEY_LEN + 1] = malloc((size_t)(cap ? cap : 1) * sizeof *got);
    int *from = malloc((size_t)(cap ? cap : 1) * sizeof *from);
    int count = 0;
    if (!got || !from) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    cur = buf;
    for (int ln = 1; next_line(&cur, buf + len, &line, &ln_len); ln++) {
        const char *val = line;
        size_t vn = ln_len;
        if (ln_len == 0) continue;
        if (line[0] == '#') continue;
        if (labelled(line, ln_len, "secret", &val, &vn)) {
            if (!z85_key_ok(val, vn)) {
                err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE,
                              "%s: line %d: the secret key is not 40 characters of Z85", path, ln);
                goto fail;
            }
            continue;
        }
        bool is_pub = labelled(line, ln_len, "public", &val, &vn);
        if (!z85_key_ok(val, vn)) {
            err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE,
                          is_pub ? "%s: line %d: the public key is not 40 characters of Z85"
                                 : "%s: line %d: expected a 40-character Z85 key, "
                                   "\"public: <key>\", a '#' comment or a blank line",
                          path, ln);
            goto fail;
        }
        for (int k = 0; k < count; k++) {
            if (memcmp(got[k], val, Z85_KEY_LEN) == 0) {
                err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE,
                              "%s: line %d: repeats the key of line %d", path, ln, from[k]);
                goto fail;
            }
        }
        if (count == cap) {
            err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE, "%s: line %d: more than %d keys", path, ln,
                          cap);
            goto fail;
        }
        memcpy(got[count], val, Z85_KEY_LEN);
        got[count][Z85_KEY_LEN] = '\0';
        from[count++] = ln;
    }
    if (count) memcpy(keys, got, (size_t)count * sizeof *got);
    *n = count;
fail:
    if (buf) sodium_memzero(buf, len);
    free(buf);
    free(got);
    free(from);
    return err;
}
