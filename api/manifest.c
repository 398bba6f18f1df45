/*
 * manifest.json: the sample dtypes, the strict parser and the canonical
 * writer (to and from bytes; the files are workers/data/manifest_file.c's).
 */
#include "manifest.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

size_t fb_data_dtype_size(int dtype)
{
    switch (dtype) {
    case FB_DTYPE_U8: return 1;
    case FB_DTYPE_F32: return 4;
    case FB_DTYPE_I32: return 4;
    default: return 0;
    }
}

const char *fb_data_dtype_name(int dtype)
{
    switch (dtype) {
    case FB_DTYPE_U8: return "uint8";
    case FB_DTYPE_F32: return "float32";
    case FB_DTYPE_I32: return "int32";
    default: return NULL;
    }
}

int fb_data_dtype_parse(fb_data_dtype *out, const char *name)
{
    if (!name) return 0;
    if (strcmp(name, "uint8") == 0) {
        *out = FB_DTYPE_U8;
        return 1;
    }
    if (strcmp(name, "float32") == 0) {
        *out = FB_DTYPE_F32;
        return 1;
    }
    if (strcmp(name, "int32") == 0) {
        *out = FB_DTYPE_I32;
        return 1;
    }
    return 0;
}

typedef struct mctx {
    const char *src;
    char *msg;
    size_t cap;
} mctx;

static void mbad_note(const mctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes "source: what" into the caller's message buffer. */
static void mbad_note(const mctx *c, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fb_errf(c->msg, c->cap, FB_ERR_DATA, "%s: %s", c->src, what);
}

/* Notes what is wrong and gives FB_ERR_DATA.  A macro, so that the constant is seen where the
 * error is returned: the optimiser then knows that a reader which returned 0 has set its
 * output (fb_errf, in another file, could have returned 0 for all it knows). */
#define mbad(c, ...) (mbad_note((c), __VA_ARGS__), FB_ERR_DATA)

/* Rejects any key of obj not in allowed (NULL-terminated). */
static int only_keys(const mctx *c, json_t *obj, const char *where, const char *const *allowed)
{
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++) ok |= strcmp(*a, k) == 0;
        if (!ok) return mbad(c, "unknown field \"%.64s\" in %s", k, where);
    }
    return 0;
}

static int get_obj(const mctx *c, json_t *obj, const char *key, const char *where, json_t **out)
{
    json_t *v = json_object_get(obj, key);
    if (!v) return mbad(c, "missing field %s.%s", where, key);
    if (!json_is_object(v)) return mbad(c, "%s.%s must be an object", where, key);
    *out = v;
    return 0;
}

static int get_int(const mctx *c, json_t *obj, const char *key, const char *where, int64_t lo,
                   int64_t hi, int64_t *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v) return mbad(c, "missing field %s.%s", where, key);
    if (!json_is_integer(v)) return mbad(c, "%s.%s must be an integer", where, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return mbad(c, "%s.%s is %lld; allowed %lld to %lld", where, key, (long long)x,
                    (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

static int get_str(const mctx *c, json_t *obj, const char *key, const char *where,
                   const char **out)
{
    json_t *v = json_object_get(obj, key);
    if (!v) return mbad(c, "missing field %s.%s", where, key);
    if (!json_is_string(v)) return mbad(c, "%s.%s must be a string", where, key);
    *out = json_string_value(v);
    return 0;
}

int fb_manifest_valid_name(const char *name)
{
    size_t n = strlen(name);
    if (n < 1 || n > FB_MANIFEST_NAME_MAX) return 0;
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' ||
              ch == '-'))
            return 0;
    }
    return 1;
}

int fb_manifest_valid_split_name(const char *name)
{
    size_t n = strlen(name);
    if (n < 1 || n > FB_MANIFEST_SPLIT_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

/* A relative path of components made of A-Z a-z 0-9 . _ -, none of them
 * empty, "." or "..": it can only name a file inside the dataset directory. */
static int valid_rel_path(const char *p)
{
    size_t n = strlen(p);
    if (n < 1 || n > FB_MANIFEST_PATH_MAX) return 0;
    const char *seg = p;
    for (size_t i = 0; i <= n; i++) {
        char ch = p[i];
        if (ch == '/' || ch == '\0') {
            size_t len = (size_t)(p + i - seg);
            if (len == 0) return 0;
            if ((len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.'))
                return 0;
            seg = p + i + 1;
            continue;
        }
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

static int parse_hex32(const char *s, uint32_t *out)
{
    if (strlen(s) != 8) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 8; i++) {
        char ch = s[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0) return 0;
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return 1;
}

static int parse_split(const mctx *c, json_t *js, const char *name, fb_manifest_split *sp)
{
    char where[64];
    snprintf(where, sizeof where, "splits.%s", name);
    static const char *const k_split[] = {"samples", "shards", NULL};
    static const char *const k_shard[] = {"path", "bytes", "records", "chunks", "crc32c", NULL};
    if (!json_is_object(js)) return mbad(c, "%s must be an object", where);
    int rc = only_keys(c, js, where, k_split);
    if (rc) return rc;
    int64_t samples;
    if ((rc = get_int(c, js, "samples", where, 1, FB_MANIFEST_MAX_RECORDS, &samples))) return rc;
    json_t *arr = json_object_get(js, "shards");
    if (!arr) return mbad(c, "missing field %s.shards", where);
    if (!json_is_array(arr)) return mbad(c, "%s.shards must be an array", where);
    size_t n = json_array_size(arr);
    if (n < 1 || n > FB_MANIFEST_MAX_SHARDS)
        return mbad(c, "%s.shards has %zu entries; allowed 1 to %d", where, n,
                    FB_MANIFEST_MAX_SHARDS);
    fb_manifest_shard *sh = calloc(n, sizeof *sh);
    if (!sh) return fb_errf(c->msg, c->cap, FB_ERR_NOMEM, "out of memory");
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        char w2[96];
        snprintf(w2, sizeof w2, "%s.shards[%zu]", where, i);
        json_t *o = json_array_get(arr, i);
        if (!json_is_object(o)) {
            rc = mbad(c, "%s must be an object", w2);
            goto fail;
        }
        const char *path, *crc;
        int64_t bytes, records, chunks;
        if ((rc = only_keys(c, o, w2, k_shard)) || (rc = get_str(c, o, "path", w2, &path)) ||
            (rc = get_int(c, o, "bytes", w2, FB_MANIFEST_MIN_SHARD_BYTES,
                          INT64_MAX, &bytes)) ||
            (rc = get_int(c, o, "records", w2, 1, FB_MANIFEST_MAX_RECORDS, &records)) ||
            (rc = get_int(c, o, "chunks", w2, 1, FB_MANIFEST_MAX_CHUNKS, &chunks)) ||
            (rc = get_str(c, o, "crc32c", w2, &crc)))
            goto fail;
        if (!valid_rel_path(path)) {
            rc = mbad(c, "%s.path \"%.80s\" is not a relative path of A-Z a-z 0-9 . _ - "
                      "components (at most %d bytes, no . or ..)",
                      w2, path, FB_MANIFEST_PATH_MAX);
            goto fail;
        }
        if (!parse_hex32(crc, &sh[i].crc32c)) {
            rc = mbad(c, "%s.crc32c must be 8 lowercase hex digits", w2);
            goto fail;
        }
        if (chunks > records) {
            rc = mbad(c, "%s has %lld chunks for %lld records", w2, (long long)chunks,
                      (long long)records);
            goto fail;
        }
        snprintf(sh[i].path, sizeof sh[i].path, "%s", path);
        sh[i].bytes = (uint64_t)bytes;
        sh[i].records = records;
        sh[i].chunks = chunks;
        total += records;
        if (total > FB_MANIFEST_MAX_RECORDS) {
            rc = mbad(c, "%s: too many records", where);
            goto fail;
        }
    }
    if (total != samples) {
        rc = mbad(c, "%s.samples is %lld but its shards hold %lld records", where,
                  (long long)samples, (long long)total);
        goto fail;
    }
    snprintf(sp->name, sizeof sp->name, "%s", name);
    sp->samples = samples;
    sp->n_shards = (int)n;
    sp->shards = sh;
    return 0;
fail:
    free(sh);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* "sample": the dtype and the shape ([F], [C, H, W], "variable"; [L] for int32 tokens). */
static int parse_sample(const mctx *c, json_t *root, fb_manifest *m)
{
    static const char *const k_sample[] = {"dtype", "shape", NULL};
    json_t *o;
    const char *s;
    int rc;
    if ((rc = get_obj(c, root, "sample", "manifest", &o)) ||
        (rc = only_keys(c, o, "sample", k_sample)) || (rc = get_str(c, o, "dtype", "sample", &s)))
        return rc;
    if (!fb_data_dtype_parse(&m->dtype, s))
        return mbad(c, "sample.dtype \"%.32s\" is not uint8, float32 or int32", s);
    json_t *shape = json_object_get(o, "shape");
    if (!shape) return mbad(c, "missing field sample.shape");
    if (json_is_string(shape) && strcmp(json_string_value(shape), "variable") == 0) {
        if (m->dtype == FB_DTYPE_I32)
            return mbad(c, "sample.shape of an int32 token dataset must be [L], not \"variable\"");
        m->ndim = 0;
        m->sample_numel = 0;
        return 0;
    }
    if (!json_is_array(shape))
        return mbad(c, "sample.shape must be an array of dimensions or \"variable\"");
    size_t nd = json_array_size(shape);
    if (m->dtype == FB_DTYPE_I32 && nd != 1)
        return mbad(c, "sample.shape has %zu dimensions; an int32 token dataset has [L]", nd);
    if (nd != 1 && nd != 3)
        return mbad(c, "sample.shape has %zu dimensions; expected [F] or [C, H, W]", nd);
    int64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 1 ||
            json_integer_value(d) > FB_MANIFEST_MAX_SAMPLE_NUMEL)
            return mbad(c, "sample.shape[%zu] must be an integer in 1..%lld", i,
                        (long long)FB_MANIFEST_MAX_SAMPLE_NUMEL);
        m->shape[i] = json_integer_value(d);
        numel *= m->shape[i];
        if (numel > FB_MANIFEST_MAX_SAMPLE_NUMEL)
            return mbad(c, "sample.shape has more than %lld values",
                        (long long)FB_MANIFEST_MAX_SAMPLE_NUMEL);
    }
    m->ndim = (int)nd;
    m->sample_numel = numel;
    return 0;
}

/* "tokens": {"vocab": V}, required for int32 datasets and forbidden for the others. */
static int parse_tokens(const mctx *c, json_t *root, fb_manifest *m)
{
    static const char *const k_tokens[] = {"vocab", NULL};
    json_t *o = json_object_get(root, "tokens");
    if (m->dtype != FB_DTYPE_I32) {
        if (o)
            return mbad(c, "tokens is only for int32 token datasets; sample.dtype is %s",
                        fb_data_dtype_name(m->dtype));
        m->vocab = 0;
        return 0;
    }
    if (!o) return mbad(c, "missing field manifest.tokens (required for an int32 token dataset)");
    if (!json_is_object(o)) return mbad(c, "manifest.tokens must be an object");
    int rc;
    if ((rc = only_keys(c, o, "tokens", k_tokens)) ||
        (rc = get_int(c, o, "vocab", "tokens", 1, FB_MANIFEST_MAX_VOCAB, &m->vocab)))
        return rc;
    return 0;
}

/* "label": {"dtype": "int32", "classes": K}, or null (no labels) for a token dataset. */
static int parse_label(const mctx *c, json_t *root, fb_manifest *m)
{
    static const char *const k_label[] = {"dtype", "classes", NULL};
    json_t *o = json_object_get(root, "label");
    if (o && json_is_null(o)) {
        if (m->dtype != FB_DTYPE_I32)
            return mbad(c, "label is null, which only an int32 token dataset may be; "
                        "sample.dtype is %s", fb_data_dtype_name(m->dtype));
        m->n_classes = 0;
        return 0;
    }
    const char *s;
    int64_t v;
    int rc;
    if ((rc = get_obj(c, root, "label", "manifest", &o)) ||
        (rc = only_keys(c, o, "label", k_label)) || (rc = get_str(c, o, "dtype", "label", &s)))
        return rc;
    if (strcmp(s, "int32") != 0) return mbad(c, "label.dtype \"%.32s\" is not int32", s);
    if ((rc = get_int(c, o, "classes", "label", 1, FB_MANIFEST_MAX_CLASSES, &v))) return rc;
    m->n_classes = (int)v;
    return 0;
}

static int parse_root(const mctx *c, json_t *root, fb_manifest *m)
{
    static const char *const k_root[] = {"format", "version", "name", "sample", "tokens",
                                         "label", "splits", NULL};
    if (!json_is_object(root)) return mbad(c, "the manifest must be a JSON object");
    int rc;
    const char *s;
    int64_t v;
    /* format and version first: a newer manifest gets a message about its version */
    if ((rc = get_str(c, root, "format", "manifest", &s))) return rc;
    if (strcmp(s, FB_MANIFEST_FORMAT) != 0)
        return mbad(c, "format is \"%.64s\", expected \"%s\"", s, FB_MANIFEST_FORMAT);
    if ((rc = get_int(c, root, "version", "manifest", 1, INT32_MAX, &v))) return rc;
    if (v != FB_MANIFEST_VERSION)
        return mbad(c, "manifest version %lld; this fusebox reads version %d", (long long)v,
                    FB_MANIFEST_VERSION);
    if ((rc = only_keys(c, root, "the manifest", k_root))) return rc;
    if ((rc = get_str(c, root, "name", "manifest", &s))) return rc;
    if (!fb_manifest_valid_name(s))
        return mbad(c, "name \"%.80s\" must be 1-64 of a-z 0-9 . _ -", s);
    snprintf(m->name, sizeof m->name, "%s", s);

    if ((rc = parse_sample(c, root, m)) || (rc = parse_tokens(c, root, m)) ||
        (rc = parse_label(c, root, m)))
        return rc;

    json_t *splits;
    if ((rc = get_obj(c, root, "splits", "manifest", &splits))) return rc;
    size_t ns = json_object_size(splits);
    if (ns < 1 || ns > FB_MANIFEST_MAX_SPLITS)
        return mbad(c, "splits has %zu entries; allowed 1 to %d", ns, FB_MANIFEST_MAX_SPLITS);
    const char *k;
    json_t *js;
    json_object_foreach(splits, k, js) {
        if (!fb_manifest_valid_split_name(k))
            return mbad(c, "split name \"%.64s\" must be 1-32 of a-z 0-9 _ -", k);
        if ((rc = parse_split(c, js, k, &m->splits[m->n_splits]))) return rc;
        m->n_splits++;
    }
    /* no shard file may be listed twice, in one split or across splits */
    size_t total = 0, k2 = 0;
    for (int a = 0; a < m->n_splits; a++) total += (size_t)m->splits[a].n_shards;
    const char **paths = malloc(total * sizeof *paths);
    if (!paths) return fb_errf(c->msg, c->cap, FB_ERR_NOMEM, "out of memory");
    for (int a = 0; a < m->n_splits; a++)
        for (int i = 0; i < m->splits[a].n_shards; i++) paths[k2++] = m->splits[a].shards[i].path;
    qsort(paths, total, sizeof *paths, cmp_str);
    rc = 0;
    for (size_t i = 1; i < total && !rc; i++)
        if (strcmp(paths[i - 1], paths[i]) == 0) rc = mbad(c, "shard %s is listed twice", paths[i]);
    free(paths);
    return rc;
}

int fb_manifest_parse(fb_manifest *out, const char *json, size_t len, const char *source,
                      char *msg, size_t msg_cap)
{
    if (!out || (!json && len))
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_manifest_parse: NULL argument");
    mctx c = {.src = source ? source : "manifest", .msg = msg, .cap = msg_cap};
    if (len > FB_MANIFEST_MAX_BYTES)
        return mbad(&c, "%zu bytes; a manifest may have at most %zu", len, FB_MANIFEST_MAX_BYTES);
    json_error_t jerr;
    json_t *root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return mbad(&c, "not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                    jerr.column);
    fb_manifest m;
    memset(&m, 0, sizeof m);
    int rc = parse_root(&c, root, &m);
    json_decref(root);
    if (rc) {
        fb_manifest_free(&m);
        return rc;
    }
    *out = m;
    return 0;
}

static json_t *manifest_json(const fb_manifest *m)
{
    json_t *shape;
    if (m->ndim == 0) {
        shape = json_string("variable");
    } else {
        shape = json_array();
        for (int i = 0; i < m->ndim; i++) json_array_append_new(shape, json_integer(m->shape[i]));
    }
    json_t *splits = json_object();
    for (int s = 0; s < m->n_splits; s++) {
        const fb_manifest_split *sp = &m->splits[s];
        json_t *arr = json_array();
        for (int i = 0; i < sp->n_shards; i++) {
            const fb_manifest_shard *sh = &sp->shards[i];
            char crc[9];
            snprintf(crc, sizeof crc, "%08" PRIx32, sh->crc32c);
            json_array_append_new(
                arr, json_pack("{s:s, s:I, s:I, s:I, s:s}", "path", sh->path, "bytes",
                               (json_int_t)sh->bytes, "records", (json_int_t)sh->records,
                               "chunks", (json_int_t)sh->chunks, "crc32c", crc));
        }
        json_object_set_new(splits, sp->name,
                            json_pack("{s:I, s:o}", "samples", (json_int_t)sp->samples, "shards",
                                      arr));
    }
    json_t *label = m->n_classes == 0
                        ? json_null()
                        : json_pack("{s:s, s:i}", "dtype", "int32", "classes", m->n_classes);
    json_t *root = json_pack("{s:s, s:i, s:s, s:{s:s, s:o}, s:o, s:o}", "format",
                             FB_MANIFEST_FORMAT, "version", FB_MANIFEST_VERSION, "name", m->name,
                             "sample", "dtype", fb_data_dtype_name(m->dtype), "shape", shape,
                             "label", label, "splits", splits);
    if (root && m->dtype == FB_DTYPE_I32 &&
        json_object_set_new(root, "tokens", json_pack("{s:I}", "vocab", (json_int_t)m->vocab))) {
        json_decref(root);
        return NULL;
    }
    return root;
}

int fb_manifest_to_json(char **json, const fb_manifest *m, char *msg, size_t msg_cap)
{
    if (!json || !m) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_manifest_to_json: NULL argument");
    if (!fb_data_dtype_name(m->dtype))
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "manifest with unknown dtype %d", m->dtype);
    if ((m->dtype == FB_DTYPE_I32) != (m->vocab != 0))
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "manifest of dtype %s with vocab %lld",
                       fb_data_dtype_name(m->dtype), (long long)m->vocab);
    json_t *root = manifest_json(m);
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    if (!text) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    /* what we write must be what we read back */
    fb_manifest back;
    int rc = fb_manifest_parse(&back, text, strlen(text), "the manifest being written", msg,
                               msg_cap);
    if (rc) {
        free(text);
        return rc == FB_ERR_DATA ? FB_ERR_INTERNAL : rc;
    }
    fb_manifest_free(&back);
    *json = text;
    return 0;
}

const fb_manifest_split *fb_manifest_find_split(const fb_manifest *m, const char *name)
{
    for (int s = 0; s < m->n_splits; s++)
        if (strcmp(m->splits[s].name, name) == 0) return &m->splits[s];
    return NULL;
}

uint64_t fb_manifest_split_bytes(const fb_manifest_split *s)
{
    uint64_t b = 0;
    for (int i = 0; i < s->n_shards; i++) b += s->shards[i].bytes;
    return b;
}

void fb_manifest_free(fb_manifest *m)
{
    if (!m) return;
    for (int s = 0; s < m->n_splits; s++) free(m->splits[s].shards);
    memset(m, 0, sizeof *m);
}
