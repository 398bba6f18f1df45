/*
 * Datasets: register a built-in, import from a server path the administrator
 * allows, upload a CSV split, list, show and delete: the handlers.  Each
 * checks its request and claims the dataset's row; an import then runs in
 * the import engine (routes_datasets_import.c, through routes_datasets.h),
 * which says where a dataset's files are and how an import goes.
 *
 * What the datasets row holds.  state is importing, ready or failed.  The
 * jsonb column manifest holds the server's record of the dataset: "summary"
 * (what GET shows of the manifest: dtype, shape, classes, samples, bytes,
 * splits) once it has data, "builtin" (which one) for built-ins, "importing"
 * (the splits being imported) while an import runs, and "error" (why the last
 * import failed).  bytes is what counts against max_dataset_bytes (0 for
 * built-ins, which are shared).
 */
#define _GNU_SOURCE /* mkostemp */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "manifest.h"
#include "routes.h"
#include "routes_datasets.h"
#include "server_impl.h"

#define DS_UPLOAD_MAX ((uint64_t)1 << 30) /* fusebox-data reads CSV and text files up to 1 GiB */

/* A dataset row aliased d, as JSON. */
#define DS_SQL_JSON                                                                                \
    "json_build_object('id', d.id, 'name', d.name, 'source', d.source, 'state', d.state,"          \
    " 'builtin', d.manifest->>'builtin', 'importing', d.manifest->'importing',"                    \
    " 'error', d.manifest->>'error', 'bytes', d.bytes, 'summary', d.manifest->'summary',"          \
    " 'created_at', d.created_at)"

/* Jobs that would notice the dataset change or vanish. */
#define DS_SQL_ACTIVE_JOBS                                                                         \
    "(SELECT count(*) FROM (SELECT 1 FROM jobs j WHERE j.tenant_id = $1::uuid AND j.dataset = $2"  \
    " AND j.state IN ('queued', 'scheduled', 'running') LIMIT 1000) a)"

/* The built-ins: IDX files as Debian's dataset packages install them, read
 * by the workers' IDX loader under the same names. */
typedef struct builtin_def {
    const char *name;
    const char *hint; /* how an administrator installs it */
    int classes;
    long long samples[2]; /* train, test */
} builtin_def;

static const builtin_def builtins[] = {
    {"fashion-mnist", "install Debian's dataset-fashion-mnist package", 10, {60000, 10000}},
    {"mnist", "place the MNIST IDX files there", 10, {60000, 10000}},
};
#define N_BUILTINS ((int)(sizeof builtins / sizeof builtins[0]))

/* ---- names ---------------------------------------------------------------------------- */

/* The names the datasets table allows: ^[a-z0-9][a-z0-9._-]{0,63}$. */
static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > DS_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-'))) return false;
    }
    return true;
}

/* A random (version 4) UUID in its textual form. */
static void new_uuid(char out[FB_UUID_LEN + 1])
{
    uint8_t b[16];
    randombytes_buf(b, sizeof b);
    b[6] = (uint8_t)((b[6] & 0x0f) | 0x40);
    b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);
    char hex[33];
    sodium_bin2hex(hex, sizeof hex, b, sizeof b);
    snprintf(out, FB_UUID_LEN + 1, "%.8s-%.4s-%.4s-%.4s-%.12s", hex, hex + 8, hex + 12, hex + 16,
             hex + 20);
}

/* The first key of object o that is not one of keys[0..n), or NULL. */
static const char *unknown_key(json_t *o, const char *const *keys, int n)
{
    for (void *it = json_object_iter(o); it; it = json_object_iter_next(o, it)) {
        const char *k = json_object_iter_key(it);
        bool known = false;
        for (int i = 0; i < n; i++)
            known |= strcmp(k, keys[i]) == 0;
        if (!known) return k;
    }
    return NULL;
}

/* ---- request helpers ---------------------------------------------------------------- */

/* An optional string member of 1..max bytes without NUL; *out NULL when absent. */
static int str_member(fb_req *req, const char *key, size_t max, const char **out)
{
    json_t *v = json_object_get(req->json, key);
    *out = NULL;
    if (!v) return FB_OK;
    if (!json_is_string(v))
        return fb_req_fail(req, FB_ERR_WRONG_TYPE, key, "%s: expected a string", key);
    const char *s = json_string_value(v);
    if (json_string_length(v) == 0 || json_string_length(v) > max ||
        strlen(s) != json_string_length(v))
        return fb_req_fail(req, FB_ERR_OUT_OF_RANGE, key, "%s: must be 1..%zu bytes", key, max);
    *out = s;
    return FB_OK;
}

/* The quota left to the tenant: max_dataset_bytes less what its datasets take. */
typedef struct ds_quota {
    const char *tenant_id;
    long long left;
} ds_quota;

static int quota_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    ds_quota *x = arg;
    int err;
    const char *v[1] = {x->tenant_id};
    PGresult *r = fb_db_query(c, "ds_quota",
                              "SELECT t.max_dataset_bytes - coalesce((SELECT sum(d.bytes)"
                              " FROM datasets d WHERE d.tenant_id = t.id), 0)"
                              " FROM tenants t WHERE t.id = $1::uuid",
                              1, v, &err, msg, msg_cap);
    if (!r) return err;
    x->left = PQntuples(r) == 1 ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : 0;
    PQclear(r);
    return FB_OK;
}

/* Replies with a dataset JSON text PostgreSQL rendered (taken), plus Location. */
static void reply_dataset(fb_req *req, int status, char *text, const char *name)
{
    char loc[128];
    snprintf(loc, sizeof loc, "/v1/datasets/%s", name);
    fb_req_add_header(req, "Location", loc);
    fb_req_reply_owned(req, status, "application/json", text, strlen(text));
}

/* Copies the first column of the first row of r (malloc'd), NULL when none. */
static char *dup_cell(PGresult *r)
{
    if (PQntuples(r) < 1) return NULL;
    return strdup(PQgetvalue(r, 0, 0));
}

/* ---- POST /v1/datasets: built-ins ----------------------------------------------------- */

typedef struct ds_insert {
    const char *vals[4];
    char *out;
} ds_insert;

static int builtin_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    ds_insert *x = arg;
    int err;
    fb_db_autocommit(c);
    PGresult *r =
        fb_db_query(c, "ds_builtin",
                    "INSERT INTO datasets AS d (tenant_id, name, source, state, bytes, manifest)"
                    " VALUES ($1::uuid, $2, 'builtin', 'ready', 0, $3::jsonb)"
                    " RETURNING " DS_SQL_JSON,
                    3, x->vals, &err, msg, msg_cap);
    if (!r) return err;
    free(x->out);
    x->out = dup_cell(r);
    PQclear(r);
    return x->out ? FB_OK : fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
}

/* Finds <dir>/<name>/<prefix>-<kind>-ubyte[.gz], as the IDX loader does;
 * its size, or -1 when it is not there. */
static long long builtin_file(const char *dir, const char *name, const char *prefix,
                              const char *kind, char *tried, size_t cap)
{
    for (int gz = 0; gz < 2; gz++) {
        snprintf(tried, cap, "%s/%s/%s-%s-ubyte%s", dir, name, prefix, kind, gz ? ".gz" : "");
        struct stat st;
        if (stat(tried, &st) == 0 && S_ISREG(st.st_mode)) return (long long)st.st_size;
    }
    return -1;
}

static int create_builtin(fb_req *req, const char *name)
{
    static const char *const allowed[] = {"name", "source", "builtin"};
    const char *k = unknown_key(req->json, allowed, 3);
    if (k)
        return fb_req_fail(req, FB_ERR_UNKNOWN_FIELD, k,
                           "%.64s: not a field of a built-in dataset (name, source, builtin)", k);
    const char *which;
    int err = str_member(req, "builtin", 64, &which);
    if (err) return err;
    if (!which)
        return fb_req_fail(req, FB_ERR_MISSING_FIELD, "builtin",
                           "builtin: which built-in dataset (fashion-mnist, mnist)");
    const builtin_def *b = NULL;
    for (int i = 0; i < N_BUILTINS; i++)
        if (strcmp(which, builtins[i].name) == 0) b = &builtins[i];
    if (!b)
        return fb_req_fail(req, FB_ERR_BAD_ENUM, "builtin", "builtin: one of fashion-mnist, mnist");
    static const char *const prefixes[2] = {"train", "t10k"}, *const split_names[2] = {"train",
                                                                                       "test"};
    json_t *splits = json_object();
    long long total = 0;
    for (int s = 0; s < 2; s++) {
        char tried[PATH_MAX + 64];
        long long img = builtin_file(req->srv->cfg.builtin_dir, b->name, prefixes[s], "images-idx3",
                                     tried, sizeof tried);
        long long lab = img < 0 ? -1
                                : builtin_file(req->srv->cfg.builtin_dir, b->name, prefixes[s],
                                               "labels-idx1", tried, sizeof tried);
        if (img < 0 || lab < 0) {
            json_decref(splits);
            fb_log_json(FB_LOG_WARN, "a built-in dataset is not installed",
                        json_pack("{s:s, s:s}", "builtin", b->name, "missing", tried));
            return fb_req_fail(req, FB_ERR_UNSUPPORTED, "builtin",
                               "builtin: %s is not installed on this server (the administrator "
                               "can %s, in --builtin-dir)",
                               b->name, b->hint);
        }
        json_object_set_new(splits, split_names[s],
                            json_pack("{s:I, s:I}", "samples", (json_int_t)b->samples[s], "bytes",
                                      (json_int_t)(img + lab)));
        total += img + lab;
    }
    json_t *rec = json_pack("{s:s, s:{s:s, s:[i,i,i], s:i, s:I, s:I, s:o}}", "builtin", b->name,
                            "summary", "dtype", "uint8", "shape", 1, 28, 28, "classes", b->classes,
                            "samples", (json_int_t)(b->samples[0] + b->samples[1]), "bytes",
                            (json_int_t)total, "splits", splits);
    char *text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    json_decref(rec);
    if (!text) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    ds_insert x = {.vals = {req->key.tenant_id, name, text}};
    err = fb_route_txn(req, builtin_txn, &x);
    free(text);
    if (err == FB_ERR_ALREADY_EXISTS)
        return fb_req_fail(req, FB_ERR_ALREADY_EXISTS, "name", "a dataset named %s exists", name);
    if (err) return err;
    reply_dataset(req, 201, x.out, name);
    return FB_OK;
}

/* ---- POST /v1/datasets: imports from server paths ------------------------------------- */

/* The import roots that exist, resolved; returns how many. */
static int import_roots(const fb_config *cfg, char roots[][PATH_MAX], int max)
{
    int n = 0;
    for (const char *s = cfg->import_roots; *s && n < max;) {
        size_t len = strcspn(s, ":");
        char root[PATH_MAX];
        if (len < sizeof root) {
            memcpy(root, s, len);
            root[len] = '\0';
            if (realpath(root, roots[n]))
                n++;
            else
                fb_log_json(FB_LOG_WARN, "an import root cannot be resolved",
                            json_pack("{s:s, s:s}", "root", root, "detail", strerror(errno)));
        }
        s += len;
        if (*s == ':') s++;
    }
    return n;
}

/* Is real (canonical) inside or equal to one of the roots? */
static bool inside_roots(const char *real, char roots[][PATH_MAX], int n)
{
    for (int i = 0; i < n; i++) {
        size_t len = strlen(roots[i]);
        if (strcmp(roots[i], "/") == 0) return true;
        if (strncmp(real, roots[i], len) == 0 && (real[len] == '/' || real[len] == '\0'))
            return true;
    }
    return false;
}

/* Does path lie under a root as written (before resolving anything)?  Used
 * only to word the refusal of a path that does not exist. */
static bool lexically_inside(const char *path, const fb_config *cfg)
{
    for (const char *s = cfg->import_roots; *s;) {
        size_t len = strcspn(s, ":");
        while (len > 1 && s[len - 1] == '/')
            len--;
        if (strncmp(path, s, len) == 0 && (path[len] == '/' || path[len] == '\0' || len == 1))
            return true;
        s += strcspn(s, ":");
        if (*s == ':') s++;
    }
    return false;
}

/*
 * Opens a file the client named (shown) at real, which must be canonical and
 * inside a root: without following a last symbolic link, without blocking on
 * a FIFO, and checked again after the open through /proc, so that a path
 * swapped between the check and the open is caught.  Returns the descriptor
 * or -1 after fb_req_fail.
 */
static int open_inside(fb_req *req, const char *real, const char *shown, char roots[][PATH_MAX],
                       int n_roots)
{
    if (!inside_roots(real, roots, n_roots)) {
        fb_req_fail(req, FB_ERR_FORBIDDEN, "path",
                    "path: %.200s is not inside a directory the administrator allows imports "
                    "from (--import-roots)",
                    shown);
        return -1;
    }
    int fd = open(real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    char proc[64], seen[PATH_MAX];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    ssize_t n = fd >= 0 ? readlink(proc, seen, sizeof seen - 1) : -1;
    if (n >= 0) seen[n] = '\0';
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || n < 0 || strcmp(seen, real) != 0) {
        if (fd >= 0) close(fd);
        fb_req_fail(req, FB_ERR_DATA, "path", "path: %.200s is not a readable regular file", shown);
        return -1;
    }
    return fd;
}

/* Resolves dir/file (file may be absent: returns 0 without opening);
 * 1 with *fd open, or -1 after fb_req_fail. */
static int open_member(fb_req *req, const char *dir_real, const char *dir_shown, const char *file,
                       char roots[][PATH_MAX], int n_roots, int *fd, char *shown, size_t shown_cap)
{
    char joined[PATH_MAX + 64], real[PATH_MAX];
    snprintf(joined, sizeof joined, "%s/%s", dir_real, file);
    snprintf(shown, shown_cap, "%s/%s", dir_shown, file);
    struct stat st;
    if (lstat(joined, &st) != 0) return 0;
    if (!realpath(joined, real)) {
        fb_req_fail(req, FB_ERR_DATA, "path", "path: %.200s cannot be resolved", shown);
        return -1;
    }
    *fd = open_inside(req, real, shown, roots, n_roots);
    return *fd >= 0 ? 1 : -1;
}

/* Fills im's inputs from a directory: IDX (train-*, t10k-*), CSV (train.csv,
 * test.csv) or text (train.txt, test.txt); the train split is required, the
 * test split optional. */
static int inputs_from_dir(fb_req *req, fb_ds_import *im, const char *real, const char *shown,
                           char roots[][PATH_MAX], int n_roots)
{
    static const char *const prefixes[2] = {"train", "t10k"}, *const splits[2] = {"train", "test"};
    for (int s = 0; s < 2; s++) {
        fb_ds_input *in = &im->in[im->n_inputs];
        snprintf(in->split, sizeof in->split, "%s", splits[s]);
        int have[2] = {0, 0};
        if (im->csv || im->text) {
            char file[16];
            snprintf(file, sizeof file, "%s.%s", splits[s], im->text ? "txt" : "csv");
            have[0] = open_member(req, real, shown, file, roots, n_roots, &in->fd[0], in->shown[0],
                                  sizeof in->shown[0]);
            if (have[0] < 0) return FB_ERR_FORBIDDEN;
            if (have[0]) im->n_inputs++;
        } else {
            static const char *const kinds[2] = {"images-idx3", "labels-idx1"};
            for (int k = 0; k < 2; k++) {
                for (int gz = 0; gz < 2 && !have[k]; gz++) {
                    char file[64];
                    snprintf(file, sizeof file, "%s-%s-ubyte%s", prefixes[s], kinds[k],
                             gz ? ".gz" : "");
                    have[k] = open_member(req, real, shown, file, roots, n_roots, &in->fd[k],
                                          in->shown[k], sizeof in->shown[k]);
                    if (have[k] < 0) return FB_ERR_FORBIDDEN;
                }
            }
            if (have[0] != have[1])
                return fb_req_fail(req, FB_ERR_DATA, "path",
                                   "path: %.200s has %s-%s-ubyte[.gz] but not its %s file", shown,
                                   prefixes[s], have[0] ? "images-idx3" : "labels-idx1",
                                   have[0] ? "labels" : "images");
            if (have[0]) im->n_inputs++;
        }
        if (s == 0 && im->n_inputs == 0)
            return fb_req_fail(req, FB_ERR_DATA, "path",
                               im->text  ? "path: the directory %.200s has no train.txt"
                               : im->csv ? "path: the directory %.200s has no train.csv"
                                         : "path: the directory %.200s has no "
                                         "train-images-idx3-ubyte[.gz] and "
                                         "train-labels-idx1-ubyte[.gz]",
                               shown);
    }
    return FB_OK;
}

/* A server path as the client gave it: absolute, without "." or ".." parts. */
static bool path_words_ok(const char *p)
{
    if (p[0] != '/') return false;
    for (const char *s = p; *s;) {
        while (*s == '/')
            s++;
        size_t len = strcspn(s, "/");
        if ((len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.')) return false;
        s += len;
    }
    return true;
}

/* An integer member of the body in [lo, hi]: 0 when absent (*out untouched), else FB_OK. */
static int int_member(fb_req *req, const char *key, long long lo, long long hi, long long *out)
{
    json_t *v = json_object_get(req->json, key);
    if (!v) return FB_OK;
    if (!json_is_integer(v))
        return fb_req_fail(req, FB_ERR_WRONG_TYPE, key, "%s: expected an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return fb_req_fail(req, FB_ERR_OUT_OF_RANGE, key, "%s: %lld; allowed %lld to %lld", key,
                           (long long)x, lo, hi);
    *out = x;
    return FB_OK;
}

/* context (required) and stride (default: the context) of a text import; neither may be given
 * for another format. */
static int text_fields(fb_req *req, fb_ds_import *im)
{
    json_t *context = json_object_get(req->json, "context");
    json_t *stride = json_object_get(req->json, "stride");
    if (!im->text) {
        const char *extra = context ? "context" : stride ? "stride" : NULL;
        if (extra)
            return fb_req_fail(req, FB_ERR_CONFLICT, extra, "%s: only for format text", extra);
        return FB_OK;
    }
    const char *extra = json_object_get(req->json, "label_column") ? "label_column"
                        : json_object_get(req->json, "header")     ? "header"
                                                                   : NULL;
    if (extra)
        return fb_req_fail(req, FB_ERR_CONFLICT, extra,
                           "%s: only for format csv (text datasets have no labels)", extra);
    if (!context)
        return fb_req_fail(req, FB_ERR_MISSING_FIELD, "context",
                           "context: the tokens a record predicts from, 1..%d (records hold "
                           "context + 1 bytes)",
                           DS_TEXT_MAX_CONTEXT);
    int err;
    if ((err = int_member(req, "context", 1, DS_TEXT_MAX_CONTEXT, &im->context)) ||
        (err = int_member(req, "stride", 1, DS_TEXT_MAX_STRIDE, &im->stride)))
        return err;
    return FB_OK;
}

/* The fields of an import (after name and source). */
static int import_fields(fb_req *req, fb_ds_import *im, const char **path, const char **split)
{
    static const char *const allowed[] = {"name",  "source", "path",    "format", "label_column",
                                          "header", "split", "context", "stride"};
    const char *k = unknown_key(req->json, allowed, 9);
    if (k)
        return fb_req_fail(req, FB_ERR_UNKNOWN_FIELD, k,
                           "%.64s: not a field of an import (name, source, path, format, "
                           "label_column, header, split, context, stride)",
                           k);
    const char *format;
    int err;
    if ((err = str_member(req, "path", PATH_MAX - 1, path)) ||
        (err = str_member(req, "format", 16, &format)) ||
        (err = str_member(req, "split", DS_SPLIT_MAX, split)))
        return err;
    if (!*path)
        return fb_req_fail(req, FB_ERR_MISSING_FIELD, "path", "path: the server path to import");
    if (!format)
        return fb_req_fail(req, FB_ERR_MISSING_FIELD, "format", "format: idx, csv or text");
    if (strcmp(format, "idx") != 0 && strcmp(format, "csv") != 0 && strcmp(format, "text") != 0)
        return fb_req_fail(req, FB_ERR_BAD_ENUM, "format", "format: idx, csv or text");
    im->csv = strcmp(format, "csv") == 0;
    im->text = strcmp(format, "text") == 0;
    if ((err = text_fields(req, im))) return err;
    json_t *label = json_object_get(req->json, "label_column");
    json_t *header = json_object_get(req->json, "header");
    if (im->text) {
        /* context and stride were read by text_fields */
    } else if (!im->csv) {
        const char *extra = label ? "label_column" : header ? "header" : *split ? "split" : NULL;
        if (extra)
            return fb_req_fail(req, FB_ERR_CONFLICT, extra,
                               "%s: only for format csv or text (an IDX directory gives train "
                               "and test)",
                               extra);
    } else {
        if (!label)
            return fb_req_fail(req, FB_ERR_MISSING_FIELD, "label_column",
                               "label_column: the CSV column of the labels (a header name or a "
                               "0-based index)");
        if (json_is_integer(label) && json_integer_value(label) >= 0 &&
            json_integer_value(label) < 1000000) {
            snprintf(im->label_column, sizeof im->label_column, "%lld",
                     (long long)json_integer_value(label));
        } else if (json_is_string(label) && json_string_length(label) >= 1 &&
                   json_string_length(label) <= DS_LABEL_MAX &&
                   strlen(json_string_value(label)) == json_string_length(label)) {
            snprintf(im->label_column, sizeof im->label_column, "%s", json_string_value(label));
        } else {
            return fb_req_fail(req, FB_ERR_WRONG_TYPE, "label_column",
                               "label_column: a header name (1..%d bytes) or a 0-based index",
                               DS_LABEL_MAX);
        }
        if (header && !json_is_boolean(header))
            return fb_req_fail(req, FB_ERR_WRONG_TYPE, "header", "header: expected true or false");
        if (header) im->header = json_is_true(header) ? 1 : 0;
    }
    if (*split && !fb_manifest_valid_split_name(*split))
        return fb_req_fail(req, FB_ERR_BAD_NAME, "split",
                           "split: 1..32 bytes of a-z, 0-9, '_' and '-'");
    if (!path_words_ok(*path))
        return fb_req_fail(req, FB_ERR_BAD_NAME, "path",
                           "path: an absolute server path without \".\" or \"..\" parts");
    return FB_OK;
}

/* Locks the new id, then inserts its row as importing: in this order, so
 * that no request ever sees the row importing without its lock held. */
static int claim_new(fb_req *req, fb_ds_import *im, const char *source, char **row)
{
    char msg[FB_MSG_MAX];
    int err = FB_OK;
    new_uuid(im->id);
    if (!im->pg && !(im->pg = fb_ds_import_connect(&req->srv->cfg, msg, sizeof msg)))
        return fb_req_fail(req, FB_ERR_UNAVAILABLE, NULL, "%s", msg);
    const char *lv[1] = {im->id};
    if ((err = fb_ds_import_do(
             im->pg, "SELECT pg_advisory_lock(hashtextextended('fusebox-dataset:' || $1::text, 0))",
             1, lv, msg, sizeof msg)))
        return fb_req_fail(req, err, NULL, "%s", msg);
    json_t *splits = json_array();
    for (int i = 0; i < im->n_inputs; i++)
        json_array_append_new(splits, json_string(im->in[i].split));
    json_t *rec = json_pack("{s:o}", "importing", splits);
    char *text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    json_decref(rec);
    if (!text) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    const char *v[5] = {im->id, im->tenant_id, im->name, source, text};
    PGresult *r = fb_ds_import_exec(im->pg,
                                    "INSERT INTO datasets AS d (id, tenant_id, name, source, state,"
                                    " manifest) VALUES ($1::uuid, $2::uuid, $3, $4, 'importing',"
                                    " $5::jsonb) RETURNING " DS_SQL_JSON,
                                    5, v, &err, msg, sizeof msg);
    free(text);
    if (!r && err == FB_ERR_ALREADY_EXISTS)
        return fb_req_fail(req, FB_ERR_ALREADY_EXISTS, "name", "a dataset named %s exists",
                           im->name);
    if (!r) return fb_req_fail(req, err, NULL, "%s", msg);
    *row = dup_cell(r);
    PQclear(r);
    return *row ? FB_OK : fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
}

static int create_import(fb_req *req, const char *name)
{
    const fb_config *cfg = &req->srv->cfg;
    fb_ds_import *im = fb_ds_import_new();
    char roots[FB_CONFIG_MAX_ROOTS][PATH_MAX], real[PATH_MAX], msg[FB_MSG_MAX];
    char *row = NULL;
    const char *path = NULL, *split = NULL;
    int err;
    if (!im) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    snprintf(im->name, sizeof im->name, "%s", name);
    snprintf(im->tenant_id, sizeof im->tenant_id, "%s", req->key.tenant_id);
    snprintf(im->tool, sizeof im->tool, "%s", cfg->data_tool);
    if ((err = import_fields(req, im, &path, &split))) goto fail;
    if (!cfg->import_roots[0]) {
        err = fb_req_fail(req, FB_ERR_FORBIDDEN, "source",
                          "imports from server paths are disabled: the administrator allows "
                          "them with --import-roots");
        goto fail;
    }
    int n_roots = import_roots(cfg, roots, FB_CONFIG_MAX_ROOTS);
    if (!realpath(path, real)) {
        bool inside = lexically_inside(path, cfg);
        err = inside ? fb_req_fail(req, FB_ERR_DATA, "path", "path: %.200s does not exist", path)
                     : fb_req_fail(req, FB_ERR_FORBIDDEN, "path",
                                   "path: %.200s is not inside a directory the administrator "
                                   "allows imports from (--import-roots)",
                                   path);
        goto fail;
    }
    if (!inside_roots(real, roots, n_roots)) {
        err = fb_req_fail(req, FB_ERR_FORBIDDEN, "path",
                          "path: %.200s is not inside a directory the administrator allows "
                          "imports from (--import-roots)",
                          path);
        goto fail;
    }
    struct stat st;
    if (stat(real, &st) != 0) {
        err = fb_req_fail(req, FB_ERR_DATA, "path", "path: %.200s cannot be read", path);
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        if (split) {
            err = fb_req_fail(req, FB_ERR_CONFLICT, "split",
                              "split: only for a single CSV or text file (a directory gives "
                              "train and test)");
            goto fail;
        }
        if ((err = inputs_from_dir(req, im, real, path, roots, n_roots))) goto fail;
    } else if (im->csv || im->text) {
        fb_ds_input *in = &im->in[0];
        snprintf(in->split, sizeof in->split, "%s", split ? split : "train");
        snprintf(in->shown[0], sizeof in->shown[0], "%s", path);
        if ((in->fd[0] = open_inside(req, real, path, roots, n_roots)) < 0) {
            err = FB_ERR_DATA;
            goto fail;
        }
        im->n_inputs = 1;
    } else {
        err = fb_req_fail(req, FB_ERR_DATA, "path",
                          "path: for format idx, a directory holding train-images-idx3-ubyte[.gz]"
                          " and train-labels-idx1-ubyte[.gz] (and t10k-* for a test split)");
        goto fail;
    }
    ds_quota q = {.tenant_id = req->key.tenant_id};
    if ((err = fb_route_txn(req, quota_txn, &q))) goto fail;
    if (q.left <= 0) {
        err = fb_req_fail(req, FB_ERR_QUOTA_EXCEEDED, NULL,
                          "the tenant's datasets already use its max_dataset_bytes quota");
        goto fail;
    }
    if ((err = fb_ds_tenant_dir(cfg, im->tenant_id, im->tenant_dir, sizeof im->tenant_dir, msg,
                                sizeof msg))) {
        err = fb_req_fail(req, err, NULL, "%s", msg);
        goto fail;
    }
    if ((err = fb_ds_import_slot_take(req))) goto fail;
    if ((err = claim_new(req, im, "import", &row))) {
        fb_ds_import_slot_give();
        goto fail;
    }
    if ((err = fb_ds_import_start(req, im))) {
        free(row);
        return err;
    }
    reply_dataset(req, 202, row, name);
    return FB_OK;
fail:
    fb_ds_import_free(im);
    return err;
}

int fb_route_dataset_create(fb_req *req)
{
    static const char *const none[] = {NULL};
    const char *name, *source;
    int err;
    if ((err = fb_req_check_query(req, none)) || (err = str_member(req, "name", 256, &name)) ||
        (err = str_member(req, "source", 16, &source)))
        return err;
    if (!name) return fb_req_fail(req, FB_ERR_MISSING_FIELD, "name", "name: the dataset's name");
    if (!name_ok(name))
        return fb_req_fail(req, FB_ERR_BAD_NAME, "name",
                           "name: 1..64 bytes of a-z, 0-9, '.', '_' and '-', starting with a "
                           "letter or digit");
    if (!source)
        return fb_req_fail(req, FB_ERR_MISSING_FIELD, "source",
                           "source: builtin or import (uploads use PUT "
                           "/v1/datasets/{name}/splits/{split})");
    if ((err = fb_ds_recover_stale(req))) return err;
    if (strcmp(source, "builtin") == 0) return create_builtin(req, name);
    if (strcmp(source, "import") == 0) return create_import(req, name);
    return fb_req_fail(req, FB_ERR_BAD_ENUM, "source",
                       "source: builtin or import (uploads use PUT "
                       "/v1/datasets/{name}/splits/{split})");
}

/* ---- PUT /v1/datasets/{name}/splits/{split}: uploads ------------------------------------ */

typedef struct upload_args {
    const char *name, *split;
    char label_column[DS_LABEL_MAX + 1];
    int header;
    bool text;
    long long context, stride;
} upload_args;

/* format=text's query: context (required), stride; label_column and header are CSV's. */
static int upload_text_args(fb_req *req, upload_args *a, const char *header)
{
    const char *extra = a->label_column[0] ? "label_column" : header[0] ? "header" : NULL;
    if (extra)
        return fb_req_fail(req, FB_ERR_BAD_QUERY, extra,
                           "%s: only for format csv (text datasets have no labels)", extra);
    int err;
    if ((err = fb_query_int(req, "context", 0, 1, DS_TEXT_MAX_CONTEXT, &a->context)) ||
        (err = fb_query_int(req, "stride", 0, 1, DS_TEXT_MAX_STRIDE, &a->stride)))
        return err;
    if (!a->context)
        return fb_req_fail(req, FB_ERR_BAD_QUERY, "context",
                           "context: the tokens a record predicts from, 1..%d, is required for "
                           "format text",
                           DS_TEXT_MAX_CONTEXT);
    return FB_OK;
}

/* The path parameters and query of an upload. */
static int upload_args_read(fb_req *req, upload_args *a)
{
    static const char *const allowed[] = {"label_column", "header", "format", "context",
                                          "stride",       NULL};
    char header[8], format[8];
    int err;
    a->name = fb_req_param(req, 0);
    a->split = fb_req_param(req, 1);
    a->header = -1;
    a->text = false;
    a->context = a->stride = 0;
    if ((err = fb_req_check_query(req, allowed)) ||
        (err = fb_query_str(req, "label_column", a->label_column, sizeof a->label_column)) ||
        (err = fb_query_str(req, "header", header, sizeof header)) ||
        (err = fb_query_str(req, "format", format, sizeof format)))
        return err;
    if (format[0] && strcmp(format, "csv") != 0 && strcmp(format, "text") != 0)
        return fb_req_fail(req, FB_ERR_BAD_QUERY, "format", "format: csv (the default) or text");
    a->text = strcmp(format, "text") == 0;
    if (!name_ok(a->name))
        return fb_req_fail(req, FB_ERR_BAD_NAME, "name",
                           "name: 1..64 bytes of a-z, 0-9, '.', '_' and '-', starting with a "
                           "letter or digit");
    if (!fb_manifest_valid_split_name(a->split))
        return fb_req_fail(req, FB_ERR_BAD_NAME, "split",
                           "split: 1..32 bytes of a-z, 0-9, '_' and '-'");
    if (a->text) return upload_text_args(req, a, header);
    const char *extra = fb_req_query(req, "context") ? "context"
                        : fb_req_query(req, "stride") ? "stride"
                                                      : NULL;
    if (extra)
        return fb_req_fail(req, FB_ERR_BAD_QUERY, extra, "%s: only for format text", extra);
    if (!a->label_column[0])
        return fb_req_fail(req, FB_ERR_BAD_QUERY, "label_column",
                           "label_column: the CSV column of the labels (a header name or a "
                           "0-based index) is required");
    if (header[0]) {
        if (strcmp(header, "true") != 0 && strcmp(header, "false") != 0)
            return fb_req_fail(req, FB_ERR_BAD_QUERY, "header", "header: true or false");
        a->header = header[0] == 't';
    }
    return FB_OK;
}

typedef struct upload_check {
    const char *vals[2];
    bool found;
    char state[16], source[16];
    long long active_jobs, left;
} upload_check;

static int upload_check_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    upload_check *x = arg;
    int err;
    PGresult *r = fb_db_query(
        c, "ds_upload_check",
        "SELECT d.state, d.source, " DS_SQL_ACTIVE_JOBS ","
        " (SELECT t.max_dataset_bytes - coalesce((SELECT sum(o.bytes) FROM datasets o"
        " WHERE o.tenant_id = t.id), 0) FROM tenants t WHERE t.id = $1::uuid)"
        " FROM (SELECT 1) one LEFT JOIN datasets d ON d.tenant_id = $1::uuid AND d.name = $2",
        2, x->vals, &err, msg, msg_cap);
    if (!r) return err;
    x->found = !PQgetisnull(r, 0, 0);
    snprintf(x->state, sizeof x->state, "%s", PQgetvalue(r, 0, 0));
    snprintf(x->source, sizeof x->source, "%s", PQgetvalue(r, 0, 1));
    x->active_jobs = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
    x->left = strtoll(PQgetvalue(r, 0, 3), NULL, 10);
    PQclear(r);
    return FB_OK;
}

/* Whether the dataset takes an upload now; the refusals of both phases. */
static int upload_allowed(fb_req *req, const upload_check *x, const char *name)
{
    if (!x->found) return FB_OK;
    if (strcmp(x->source, "upload") != 0)
        return fb_req_fail(req, FB_ERR_STATE_CONFLICT, NULL,
                           "dataset %s is %s; splits are uploaded only to datasets made by "
                           "upload",
                           name, strcmp(x->source, "builtin") == 0 ? "a built-in" : "imported");
    if (strcmp(x->state, "importing") == 0)
        return fb_req_fail(req, FB_ERR_STATE_CONFLICT, NULL,
                           "dataset %s is being imported; upload when it is ready or failed", name);
    if (strcmp(x->state, "ready") == 0 && x->active_jobs > 0)
        return fb_req_fail(req, FB_ERR_STATE_CONFLICT, NULL,
                           "%lld queued, scheduled or running job%s dataset %s; it cannot "
                           "change under them",
                           x->active_jobs, x->active_jobs == 1 ? " uses" : "s use", name);
    return FB_OK;
}

int fb_route_stream_open(fb_req *req, uint64_t declared, int *fd, uint64_t *limit)
{
    if (req->route->fn != fb_route_dataset_upload)
        return fb_req_fail(req, FB_ERR_INTERNAL, NULL, "this route takes no upload");
    upload_args a;
    int err;
    if ((err = upload_args_read(req, &a)) || (err = fb_ds_recover_stale(req))) return err;
    upload_check x = {.vals = {req->key.tenant_id, a.name}};
    if ((err = fb_route_txn(req, upload_check_txn, &x)) || (err = upload_allowed(req, &x, a.name)))
        return err;
    uint64_t left = x.left > 0 ? (uint64_t)x.left : 0;
    if (declared > left)
        return fb_req_fail(req, FB_ERR_PAYLOAD_TOO_LARGE, NULL,
                           "the upload of %llu bytes exceeds the %llu bytes the tenant's "
                           "max_dataset_bytes quota leaves",
                           (unsigned long long)declared, (unsigned long long)left);
    if (declared > DS_UPLOAD_MAX)
        return fb_req_fail(req, FB_ERR_PAYLOAD_TOO_LARGE, NULL,
                           "the upload of %llu bytes exceeds the %llu bytes an uploaded file may "
                           "have",
                           (unsigned long long)declared, (unsigned long long)DS_UPLOAD_MAX);
    char dir[PATH_MAX], path[PATH_MAX + 32], msg[FB_MSG_MAX];
    if ((err = fb_ds_tenant_dir(&req->srv->cfg, req->key.tenant_id, dir, sizeof dir, msg,
                                sizeof msg)))
        return fb_req_fail(req, err, NULL, "%s", msg);
    snprintf(path, sizeof path, "%s/.upload-XXXXXX", dir);
    int f = mkostemp(path, O_CLOEXEC);
    if (f < 0) {
        int e = errno;
        fb_log_json(FB_LOG_ERROR, "cannot spool an upload",
                    json_pack("{s:s, s:s}", "dir", dir, "detail", strerror(e)));
        if (fb_err_write_errno(e) == FB_ERR_NO_SPACE)
            return fb_req_fail(req, FB_ERR_NO_SPACE, NULL,
                               "the server's datasets disk is full; upload again once space is "
                               "freed");
        return fb_req_fail(req, FB_ERR_IO, NULL, "the server cannot store uploads (see its log)");
    }
    /* nameless from the start: whatever happens to the request, nothing stays */
    unlink(path);
    *fd = f;
    *limit = left < DS_UPLOAD_MAX ? left : DS_UPLOAD_MAX;
    return FB_OK;
}

/* Locks the dataset (an existing row by its id, a new one by a new id) and
 * turns it importing; *update says whether it keeps its other splits. */
static int claim_upload(fb_req *req, fb_ds_import *im, char **row)
{
    char msg[FB_MSG_MAX];
    int err = FB_OK;
    if (!(im->pg = fb_ds_import_connect(&req->srv->cfg, msg, sizeof msg)))
        return fb_req_fail(req, FB_ERR_UNAVAILABLE, NULL, "%s", msg);
    const char *v2[2] = {im->tenant_id, im->name};
    PGresult *r = fb_ds_import_exec(im->pg,
                                    "SELECT id, state FROM datasets WHERE tenant_id = $1::uuid"
                                    " AND name = $2",
                                    2, v2, &err, msg, sizeof msg);
    if (!r) return fb_req_fail(req, err, NULL, "%s", msg);
    bool found = PQntuples(r) == 1;
    char state[16] = "";
    if (found) {
        snprintf(im->id, sizeof im->id, "%s", PQgetvalue(r, 0, 0));
        snprintf(state, sizeof state, "%s", PQgetvalue(r, 0, 1));
    }
    PQclear(r);
    if (!found) return claim_new(req, im, "upload", row);
    const char *lv[1] = {im->id};
    if (!(r = fb_ds_import_exec(
              im->pg,
              "SELECT pg_try_advisory_lock(hashtextextended('fusebox-dataset:' || $1::text, 0))", 1,
              lv, &err, msg, sizeof msg)))
        return fb_req_fail(req, err, NULL, "%s", msg);
    bool locked = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    if (!locked)
        return fb_req_fail(req, FB_ERR_STATE_CONFLICT, NULL,
                           "dataset %s is being imported; upload when it is ready or failed",
                           im->name);
    im->update = strcmp(state, "ready") == 0;
    const char *v4[4] = {im->tenant_id, im->name, state, im->in[0].split};
    r = fb_ds_import_exec(
        im->pg,
        "UPDATE datasets AS d SET state = 'importing', bytes = CASE WHEN d.state ="
        " 'ready' THEN d.bytes ELSE 0 END, manifest = CASE WHEN d.state = 'ready'"
        " THEN coalesce(d.manifest, '{}') - 'error' ELSE '{}' END"
        " || jsonb_build_object('importing', jsonb_build_array($4::text))"
        " WHERE d.tenant_id = $1::uuid AND d.name = $2 AND d.state = $3"
        " AND d.source = 'upload' AND (d.state = 'failed' OR " DS_SQL_ACTIVE_JOBS
        " = 0) RETURNING " DS_SQL_JSON,
        4, v4, &err, msg, sizeof msg);
    if (!r) return fb_req_fail(req, err, NULL, "%s", msg);
    *row = dup_cell(r);
    bool claimed = PQntuples(r) == 1;
    PQclear(r);
    if (!claimed)
        return fb_req_fail(req, FB_ERR_STATE_CONFLICT, NULL,
                           "dataset %s changed while the upload arrived (a job now uses it, or "
                           "it was replaced); try again",
                           im->name);
    return *row ? FB_OK : fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
}

int fb_route_dataset_upload(fb_req *req)
{
    int fd = fb_req_take_body_fd(req);
    upload_args a;
    char msg[FB_MSG_MAX], *row = NULL;
    fb_ds_import *im = NULL;
    int err;
    if (fd < 0) return fb_req_fail(req, FB_ERR_INTERNAL, NULL, "the upload was not stored");
    if ((err = upload_args_read(req, &a))) goto fail;
    if (req->body_len == 0) {
        err = fb_req_fail(req, FB_ERR_DATA, NULL, "the body is empty; send the %s file",
                          a.text ? "text" : "CSV");
        goto fail;
    }
    if (!(im = fb_ds_import_new())) {
        err = fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
        goto fail;
    }
    snprintf(im->name, sizeof im->name, "%s", a.name);
    snprintf(im->tenant_id, sizeof im->tenant_id, "%s", req->key.tenant_id);
    snprintf(im->tool, sizeof im->tool, "%s", req->srv->cfg.data_tool);
    snprintf(im->label_column, sizeof im->label_column, "%s", a.label_column);
    im->csv = !a.text;
    im->text = a.text;
    im->context = a.context;
    im->stride = a.stride;
    im->header = a.header;
    im->n_inputs = 1;
    snprintf(im->in[0].split, sizeof im->in[0].split, "%s", a.split);
    snprintf(im->in[0].shown[0], sizeof im->in[0].shown[0], "%s.%s", a.split,
             a.text ? "txt" : "csv");
    im->in[0].fd[0] = fd;
    fd = -1;
    if ((err = fb_ds_tenant_dir(&req->srv->cfg, im->tenant_id, im->tenant_dir,
                                sizeof im->tenant_dir, msg, sizeof msg))) {
        err = fb_req_fail(req, err, NULL, "%s", msg);
        goto fail;
    }
    if ((err = fb_ds_import_slot_take(req))) goto fail;
    if ((err = claim_upload(req, im, &row))) {
        fb_ds_import_slot_give();
        goto fail;
    }
    if ((err = fb_ds_import_start(req, im))) {
        free(row);
        return err;
    }
    reply_dataset(req, 202, row, a.name);
    return FB_OK;
fail:
    if (fd >= 0) close(fd);
    fb_ds_import_free(im);
    return err;
}

/* ---- GET /v1/datasets, GET /v1/datasets/{name} ------------------------------------------ */

typedef struct ds_list {
    const char *vals[3];
    long long limit;
    json_t *items;
    char next[DS_NAME_MAX + 1];
} ds_list;

static int list_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    ds_list *x = arg;
    int err;
    PGresult *r = fb_db_query(c, "ds_list",
                              "SELECT d.name, " DS_SQL_JSON " FROM datasets d"
                              " WHERE d.tenant_id = $1::uuid AND ($2::text IS NULL OR d.name > $2)"
                              " ORDER BY d.name LIMIT $3::integer",
                              3, x->vals, &err, msg, msg_cap);
    if (!r) return err;
    fb_pg_page(r, x->limit, &x->items, x->next, sizeof x->next);
    return FB_OK;
}

int fb_route_dataset_list(fb_req *req)
{
    static const char *const allowed[] = {"limit", "cursor", NULL};
    char cursor[DS_NAME_MAX + 1], limit_s[16];
    ds_list x = {0};
    int err;
    if ((err = fb_req_check_query(req, allowed)) ||
        (err = fb_query_int(req, "limit", 50, 1, 200, &x.limit)) ||
        (err = fb_query_str(req, "cursor", cursor, sizeof cursor)))
        return err;
    if (cursor[0] && !name_ok(cursor))
        return fb_req_fail(req, FB_ERR_BAD_QUERY, "cursor", "cursor: not a cursor of this list");
    if ((err = fb_ds_recover_stale(req))) return err;
    snprintf(limit_s, sizeof limit_s, "%lld", x.limit + 1);
    x.vals[0] = req->key.tenant_id;
    x.vals[1] = cursor[0] ? cursor : NULL;
    x.vals[2] = limit_s;
    return fb_route_reply_page(req, list_txn, &x, &x.items, x.next, "datasets");
}

typedef struct ds_get {
    const char *vals[2];
    char *out;
} ds_get;

static int get_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    ds_get *x = arg;
    int err;
    PGresult *r = fb_db_query(c, "ds_get",
                              "SELECT " DS_SQL_JSON " FROM datasets d"
                              " WHERE d.tenant_id = $1::uuid AND d.name = $2",
                              2, x->vals, &err, msg, msg_cap);
    if (!r) return err;
    free(x->out);
    x->out = NULL;
    bool found = PQntuples(r) == 1;
    if (found) x->out = dup_cell(r);
    PQclear(r);
    return found && !x->out ? fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory") : FB_OK;
}

int fb_route_dataset_get(fb_req *req)
{
    static const char *const none[] = {NULL};
    const char *name = fb_req_param(req, 0);
    int err;
    if ((err = fb_req_check_query(req, none))) return err;
    if (!name_ok(name)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such dataset");
    if ((err = fb_ds_recover_stale(req))) return err;
    ds_get x = {.vals = {req->key.tenant_id, name}};
    if ((err = fb_route_txn(req, get_txn, &x))) {
        free(x.out);
        return err;
    }
    if (!x.out) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such dataset");
    fb_req_reply_owned(req, 200, "application/json", x.out, strlen(x.out));
    return FB_OK;
}

/* ---- DELETE /v1/datasets/{name} ------------------------------------------------------------ */

typedef struct ds_delete {
    const char *vals[2];
    bool found;
    char id[FB_UUID_LEN + 1], state[16];
    long long active_jobs;
    char *out;
} ds_delete;

static int delete_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    ds_delete *x = arg;
    int err;
    if ((err = fb_db_begin(c, msg, msg_cap))) return err;
    PGresult *r = fb_db_query(c, "ds_delete_lock",
                              "SELECT d.id, d.state, " DS_SQL_ACTIVE_JOBS ", " DS_SQL_JSON
                              " FROM datasets d WHERE d.tenant_id = $1::uuid AND d.name = $2"
                              " FOR UPDATE OF d",
                              2, x->vals, &err, msg, msg_cap);
    if (!r) return err;
    x->found = PQntuples(r) == 1;
    free(x->out);
    x->out = NULL;
    if (x->found) {
        snprintf(x->id, sizeof x->id, "%s", PQgetvalue(r, 0, 0));
        snprintf(x->state, sizeof x->state, "%s", PQgetvalue(r, 0, 1));
        x->active_jobs = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
        x->out = strdup(PQgetvalue(r, 0, 3));
    }
    PQclear(r);
    if (!x->found || strcmp(x->state, "importing") == 0 || x->active_jobs > 0) {
        fb_db_rollback(c);
        return FB_OK;
    }
    if (!x->out) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    const char *v[1] = {x->id};
    if (!(r = fb_db_query(c, "ds_delete", "DELETE FROM datasets WHERE id = $1::uuid", 1, v, &err,
                          msg, msg_cap)))
        return err;
    PQclear(r);
    return fb_db_commit(c, msg, msg_cap);
}

int fb_route_dataset_delete(fb_req *req)
{
    static const char *const none[] = {NULL};
    const char *name = fb_req_param(req, 0);
    int err;
    if ((err = fb_req_check_query(req, none))) return err;
    if (!name_ok(name)) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such dataset");
    if ((err = fb_ds_recover_stale(req))) return err;
    ds_delete x = {.vals = {req->key.tenant_id, name}};
    char dir[PATH_MAX], msg[FB_MSG_MAX];
    /* the directory is renamed away under the mutex, before an import of a
     * new dataset of this name can move its own into place */
    pthread_mutex_lock(&fb_ds_fs_mu);
    err = fb_route_txn(req, delete_txn, &x);
    bool gone = !err && x.found && strcmp(x.state, "importing") != 0 && x.active_jobs == 0;
    char trash[64] = "";
    if (gone && fb_ds_tenant_dir(&req->srv->cfg, req->key.tenant_id, dir, sizeof dir, msg,
                                 sizeof msg) == FB_OK) {
        snprintf(trash, sizeof trash, ".delete-%s", x.id);
        int tdir = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (tdir < 0 || renameat(tdir, name, tdir, trash) != 0) trash[0] = '\0';
        if (tdir >= 0) close(tdir);
    }
    pthread_mutex_unlock(&fb_ds_fs_mu);
    if (trash[0]) fb_ds_rm_path(dir, trash);
    if (err) {
        free(x.out);
        return err;
    }
    if (!x.found) return fb_req_fail(req, FB_ERR_NOT_FOUND, NULL, "no such dataset");
    if (strcmp(x.state, "importing") == 0) {
        free(x.out);
        return fb_req_fail(req, FB_ERR_STATE_CONFLICT, NULL,
                           "dataset %s is being imported; delete it when it is ready or failed",
                           name);
    }
    if (x.active_jobs > 0) {
        free(x.out);
        return fb_req_fail(req, FB_ERR_STATE_CONFLICT, NULL,
                           "%lld queued, scheduled or running job%s dataset %s; cancel %s or "
                           "wait until %s",
                           x.active_jobs, x.active_jobs == 1 ? " uses" : "s use", name,
                           x.active_jobs == 1 ? "it" : "them",
                           x.active_jobs == 1 ? "it finishes" : "they finish");
    }
    fb_log_json(FB_LOG_INFO, "dataset deleted",
                json_pack("{s:s, s:s}", "tenant", req->key.tenant_id, "dataset", name));
    fb_req_reply_owned(req, 200, "application/json", x.out, strlen(x.out));
    return FB_OK;
}
