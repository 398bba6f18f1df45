/*
 * Dataset directories: import, verify, load, resolve.
 */
#include "datadir.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


#define DD_PATH 4096
#define DD_MAX_LABEL (1 << 24)

static int dd_mkdir(const char *p, char *msg, size_t msg_cap)
{
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return fb_errf(msg, msg_cap, fb_err_write_errno(errno), "cannot create %s: %s", p,
                       strerror(errno));
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
        return fb_errf(msg, msg_cap, FB_ERR_IO, "%s is not a directory", p);
    return 0;
}

static int valid_split(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > FB_MANIFEST_SPLIT_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' ||
              s[i] == '-'))
            return 0;
    return 1;
}

/* Removes <dir>/<split>/<split>-*.fbs files that m does not list. */
static void remove_stale(const fb_manifest *m, const char *dir, const char *split)
{
    char sub[DD_PATH], path[DD_PATH + 300], rel[FB_MANIFEST_PATH_MAX + 1];
    snprintf(sub, sizeof sub, "%s/%s", dir, split);
    DIR *d = opendir(sub);
    if (!d) return;
    const fb_manifest_split *sp = fb_manifest_find_split(m, split);
    size_t plen = strlen(split);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *f = de->d_name;
        size_t fl = strlen(f);
        if (strncmp(f, split, plen) != 0 || f[plen] != '-' || fl < 4 ||
            strcmp(f + fl - 4, ".fbs") != 0)
            continue;
        snprintf(rel, sizeof rel, "%s/%s", split, f);
        int listed = 0;
        for (int i = 0; sp && i < sp->n_shards; i++) listed |= strcmp(sp->shards[i].path, rel) == 0;
        if (listed) continue;
        snprintf(path, sizeof path, "%s/%s", sub, f);
        unlink(path);
    }
    closedir(d);
}

/* Where an import's records come from: an array [n, numel] of values, or a byte text whose
 * record i is the numel bytes from i * stride on, as int32 token ids. */
typedef struct import_src {
    const void *values;
    const uint8_t *text;
    int64_t stride;
} import_src;

/* Record i of src (numel values of esz bytes); tmp holds numel int32 for a text. */
static const void *src_record(const import_src *src, int64_t i, int64_t numel, size_t esz,
                              int32_t *tmp)
{
    if (!src->text) return (const uint8_t *)src->values + (size_t)(i * numel) * esz;
    const uint8_t *b = src->text + i * src->stride;
    for (int64_t k = 0; k < numel; k++) tmp[k] = b[k];
    return tmp;
}

/* How an import of n records will be laid out, from checked arguments. */
typedef struct import_plan {
    size_t esz;        /* bytes a value */
    int64_t numel;     /* values a record */
    int64_t chunk;     /* records a chunk */
    int64_t per_shard; /* records a shard */
    int64_t n_shards;
    int32_t max_label;
    int level; /* zstd */
} import_plan;

/* Checks fb_datadir_import's arguments and every record (labels in range, values finite)
 * before anything is written, and plans the chunks and shards. */
static int import_check(import_plan *pl, const fb_import_opts *o, fb_data_dtype dtype, int ndim,
                        const int64_t *shape, const import_src *src, const int32_t *labels,
                        int64_t n, char *msg, size_t msg_cap)
{
    if (!o || !o->out_dir || !o->name || !o->split || !shape ||
        (!src->values && !src->text && n))
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_datadir_import: NULL argument");
    size_t esz = fb_data_dtype_size(dtype);
    if (!esz) return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "unknown dtype %d", dtype);
    if (!fb_manifest_valid_name(o->name))
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "dataset name \"%.80s\" must be 1-64 of a-z 0-9 . _ -", o->name);
    if (!valid_split(o->split))
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "split name \"%.80s\" must be 1-32 of a-z 0-9 _ -", o->split);
    if (strlen(o->out_dir) > DD_PATH - 400)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "output directory path is too long");
    if (ndim != 1 && ndim != 3)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "samples of %d dimensions; expected [F] or [C, H, W]", ndim);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1 || shape[i] > FB_SHARD_MAX_SAMPLE_NUMEL ||
            numel > FB_SHARD_MAX_SAMPLE_NUMEL / shape[i])
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "sample shape is too large");
        numel *= shape[i];
    }
    if (n < 1) return fb_errf(msg, msg_cap, FB_ERR_DATA, "nothing to import: no records");
    int64_t rec_bytes = 4 + numel * (int64_t)esz;
    int64_t chunk = o->chunk_records;
    if (chunk == 0) chunk = FB_IMPORT_DEFAULT_CHUNK_BYTES / rec_bytes;
    if (chunk < 1) chunk = 1;
    if (chunk > FB_SHARD_MAX_CHUNK_RECORDS || (uint64_t)(chunk * rec_bytes) > FB_SHARD_MAX_CHUNK_BYTES)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "chunks of %" PRId64 " records of %" PRId64 " bytes exceed the chunk "
                       "limits (%" PRId64 " records, %" PRIu64 " bytes)",
                       chunk, rec_bytes, FB_SHARD_MAX_CHUNK_RECORDS, FB_SHARD_MAX_CHUNK_BYTES);
    int64_t per_shard = o->shard_records;
    if (per_shard == 0) {
        per_shard = FB_IMPORT_DEFAULT_SHARD_BYTES / rec_bytes / chunk * chunk;
        if (per_shard < chunk) per_shard = chunk;
    }
    if (per_shard < 1)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "shards need at least one record");
    int64_t n_shards = (n + per_shard - 1) / per_shard;
    if (n_shards > FB_MANIFEST_MAX_SHARDS)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "%" PRId64 " shards of %" PRId64 " records; a split may have at most %d",
                       n_shards, per_shard, FB_MANIFEST_MAX_SHARDS);
    int32_t max_label = 0;
    for (int64_t i = 0; labels && i < n; i++) {
        if (labels[i] < 0 || labels[i] >= DD_MAX_LABEL)
            return fb_errf(msg, msg_cap, FB_ERR_DATA,
                           "record %" PRId64 " has label %" PRId32 "; labels must be in [0, %d)",
                           i, labels[i], DD_MAX_LABEL);
        if (labels[i] > max_label) max_label = labels[i];
    }
    if (dtype == FB_DTYPE_F32) {
        const float *f = src->values;
        for (int64_t i = 0; i < n * numel; i++)
            if (!isfinite(f[i]))
                return fb_errf(msg, msg_cap, FB_ERR_DATA, "record %" PRId64 " has a value that "
                               "is not finite", i / numel);
    }

    *pl = (import_plan){.esz = esz, .numel = numel, .chunk = chunk, .per_shard = per_shard,
                        .n_shards = n_shards, .max_label = max_label,
                        .level = o->level ? o->level : FB_IMPORT_DEFAULT_LEVEL};
    return FB_OK;
}

/* Writes the n records as pl->n_shards shards under o->out_dir/o->split, filling shards[]
 * (paths relative to out_dir, sizes, checksums) and the counts of *r. */
static int import_write_shards(fb_import_result *r, fb_manifest_shard *shards,
                               const import_plan *pl, const fb_import_opts *o,
                               fb_data_dtype dtype, const import_src *src, const int32_t *labels,
                               int64_t n, char *msg, size_t msg_cap)
{
    int32_t *tmp = NULL;
    if (src->text && !(tmp = malloc((size_t)pl->numel * sizeof *tmp)))
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    char path[DD_PATH + 300];
    int rc = FB_OK;
    const int64_t numel = pl->numel, per_shard = pl->per_shard;
    fb_shard_params sp = {.dtype = dtype, .sample_numel = numel, .chunk_records = pl->chunk,
                          .level = pl->level};
    for (int64_t s = 0; s < pl->n_shards; s++) {
        fb_shard_writer *w = NULL;
        snprintf(shards[s].path, sizeof shards[s].path, "%s/%s-%05" PRId64 ".fbs", o->split,
                 o->split, s);
        snprintf(path, sizeof path, "%s/%s", o->out_dir, shards[s].path);
        if ((rc = fb_shard_writer_open(&w, path, &sp, msg, msg_cap))) break;
        int64_t a = s * per_shard, b = a + per_shard < n ? a + per_shard : n;
        for (int64_t i = a; i < b && !rc; i++)
            rc = fb_shard_writer_add(w, src_record(src, i, numel, pl->esz, tmp), numel,
                                     labels ? labels[i] : 0, msg, msg_cap);
        fb_shard_info info;
        if (!rc) rc = fb_shard_writer_finish(&info, w, msg, msg_cap);
        fb_shard_writer_free(w);
        if (rc) break;
        shards[s].bytes = info.bytes;
        shards[s].records = info.records;
        shards[s].chunks = info.chunks;
        shards[s].crc32c = info.crc32c;
        r->chunks += info.chunks;
        r->bytes += info.bytes;
        r->raw_bytes += info.raw_bytes;
    }
    free(tmp);
    return rc;
}

/* fb_datadir_import of records from src; labels NULL: a dataset without labels (label 0 in
 * the shards, no classes in the manifest).  vocab: the token vocabulary of an int32 dataset,
 * else 0. */
static int import_records(fb_import_result *res, const fb_import_opts *o, fb_data_dtype dtype,
                          int ndim, const int64_t *shape, const import_src *src,
                          const int32_t *labels, int64_t n, int64_t vocab, char *msg,
                          size_t msg_cap)
{
    import_plan pl = {0};
    int rc = import_check(&pl, o, dtype, ndim, shape, src, labels, n, msg, msg_cap);
    if (rc) return rc;
    const int64_t numel = pl.numel, n_shards = pl.n_shards;

    /* the manifest to extend, or a new one */
    char path[DD_PATH + 300];
    fb_manifest m, old;
    memset(&m, 0, sizeof m);
    memset(&old, 0, sizeof old);
    fb_manifest_shard *shards = NULL;
    if ((rc = dd_mkdir(o->out_dir, msg, msg_cap))) return rc;
    snprintf(path, sizeof path, "%s/%s", o->out_dir, FB_MANIFEST_FILE);
    struct stat st;
    bool have_old = stat(path, &st) == 0;
    if (have_old) {
        if ((rc = fb_manifest_read(&old, path, msg, msg_cap))) return rc;
        if (strcmp(old.name, o->name) != 0 || old.dtype != dtype || old.ndim != ndim ||
            memcmp(old.shape, shape, (size_t)ndim * sizeof *shape) != 0 || old.vocab != vocab ||
            (old.n_classes == 0) != (labels == NULL)) {
            rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                         "%s already holds dataset %s (%s samples of %" PRId64 " values, vocab %"
                         PRId64 ", %d classes); importing %s (%s samples of %" PRId64
                         " values, vocab %" PRId64 ", %s) there would mix them",
                         o->out_dir, old.name, fb_data_dtype_name(old.dtype), old.sample_numel,
                         old.vocab, old.n_classes, o->name, fb_data_dtype_name(dtype), numel,
                         vocab, labels ? "labels" : "no labels");
            goto done;
        }
        if (!fb_manifest_find_split(&old, o->split) && old.n_splits >= FB_MANIFEST_MAX_SPLITS) {
            rc = fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s already has %d splits",
                         o->out_dir, old.n_splits);
            goto done;
        }
    }
    snprintf(path, sizeof path, "%s/%s", o->out_dir, o->split);
    if ((rc = dd_mkdir(path, msg, msg_cap))) goto done;

    shards = calloc((size_t)n_shards, sizeof *shards);
    if (!shards) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto done;
    }
    fb_import_result r = {.samples = n, .shards = n_shards};
    if ((rc = import_write_shards(&r, shards, &pl, o, dtype, src, labels, n, msg, msg_cap)))
        goto done;

    /* the new manifest: the old one's other splits, then this split */
    snprintf(m.name, sizeof m.name, "%s", o->name);
    m.dtype = dtype;
    m.ndim = ndim;
    memcpy(m.shape, shape, (size_t)ndim * sizeof *shape);
    m.sample_numel = numel;
    m.vocab = vocab;
    m.n_classes = !labels ? 0 : pl.max_label + 1 < 2 ? 2 : pl.max_label + 1;
    if (labels && have_old && old.n_classes > m.n_classes) m.n_classes = old.n_classes;
    for (int i = 0; i < old.n_splits; i++)
        if (strcmp(old.splits[i].name, o->split) != 0) m.splits[m.n_splits++] = old.splits[i];
    fb_manifest_split *ns = &m.splits[m.n_splits++];
    snprintf(ns->name, sizeof ns->name, "%s", o->split);
    ns->samples = n;
    ns->n_shards = (int)n_shards;
    ns->shards = shards;
    snprintf(path, sizeof path, "%s/%s", o->out_dir, FB_MANIFEST_FILE);
    rc = fb_manifest_write(path, &m, msg, msg_cap);
    if (!rc) {
        remove_stale(&m, o->out_dir, o->split);
        r.n_classes = m.n_classes;
        r.vocab = m.vocab;
        if (res) *res = r;
    }
done:
    /* m borrowed old's shard lists and this split's; free each list once */
    free(shards);
    fb_manifest_free(&old);
    return rc;
}

int fb_datadir_import(fb_import_result *res, const fb_import_opts *o, fb_data_dtype dtype,
                      int ndim, const int64_t *shape, const void *values, const int32_t *labels,
                      int64_t n, char *msg, size_t msg_cap)
{
    if (!labels && n)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_datadir_import: NULL argument");
    if (dtype == FB_DTYPE_I32)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "int32 token records are imported by fb_datadir_import_tokens");
    import_src src = {.values = values};
    return import_records(res, o, dtype, ndim, shape, &src, labels, n, 0, msg, msg_cap);
}

int fb_datadir_import_tokens(fb_import_result *res, const fb_import_opts *o, const uint8_t *text,
                             size_t len, int64_t context, int64_t stride, char *msg,
                             size_t msg_cap)
{
    if (!text && len)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_datadir_import_tokens: NULL argument");
    if (context < 1 || context > FB_TEXT_MAX_CONTEXT)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "context %" PRId64 "; allowed 1 to %d tokens", context, FB_TEXT_MAX_CONTEXT);
    if (stride < 1 || stride > FB_TEXT_MAX_STRIDE)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "stride %" PRId64 "; allowed 1 to %" PRId64 " bytes", stride,
                       (int64_t)FB_TEXT_MAX_STRIDE);
    if (len > FB_TEXT_MAX_BYTES)
        return fb_errf(msg, msg_cap, FB_ERR_DATA, "the text has %zu bytes; at most %zu", len,
                       FB_TEXT_MAX_BYTES);
    if (len < (size_t)context + 1)
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "the text has %zu bytes; a record needs context + 1 = %" PRId64, len,
                       context + 1);
    int64_t n = ((int64_t)len - (context + 1)) / stride + 1;
    int64_t shape[1] = {context + 1};
    import_src src = {.text = text, .stride = stride};
    return import_records(res, o, FB_DTYPE_I32, 1, shape, &src, NULL, n, FB_TEXT_VOCAB, msg,
                          msg_cap);
}

int fb_datadir_import_idx(fb_import_result *res, const fb_import_opts *o, const char *images,
                          const char *labels, char *msg, size_t msg_cap)
{
    if (!o || !images || !labels)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_datadir_import_idx: NULL argument");
    fb_idx im = {0}, lb = {0};
    int32_t *y = NULL;
    int rc = fb_idx_read(images, &im, msg, msg_cap);
    if (rc) goto done;
    fb_data_dtype dt;
    if (im.type == FB_IDX_U8)
        dt = FB_DTYPE_U8;
    else if (im.type == FB_IDX_F32)
        dt = FB_DTYPE_F32;
    else {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s: images must be unsigned bytes (0x08) or float32 (0x0d); the file has "
                     "type 0x%02x", images, (unsigned)im.type);
        goto done;
    }
    int64_t shape[3];
    int nd;
    if (im.ndim == 3) {
        nd = 3;
        shape[0] = 1, shape[1] = im.dims[1], shape[2] = im.dims[2];
    } else if (im.ndim == 4) {
        nd = 3;
        shape[0] = im.dims[1], shape[1] = im.dims[2], shape[2] = im.dims[3];
    } else if (im.ndim == 2) {
        nd = 1;
        shape[0] = im.dims[1];
    } else {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s: images must have shape [N, F], [N, H, W] or [N, C, H, W]; the file has "
                     "%d dimensions", images, im.ndim);
        goto done;
    }
    if ((rc = fb_idx_read(labels, &lb, msg, msg_cap))) goto done;
    if (lb.ndim != 1 || lb.type == FB_IDX_F32 || lb.type == FB_IDX_F64) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s: labels must be integers of shape [N]; the file has type 0x%02x and %d "
                     "dimensions", labels, (unsigned)lb.type, lb.ndim);
        goto done;
    }
    if (lb.dims[0] != im.dims[0]) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s holds %" PRId64 " images but %s holds %" PRId64 " labels", images,
                     im.dims[0], labels, lb.dims[0]);
        goto done;
    }
    int64_t n = im.dims[0];
    y = malloc((size_t)n * sizeof *y);
    if (!y) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t v;
        switch (lb.type) {
        case FB_IDX_U8: v = ((const uint8_t *)lb.data)[i]; break;
        case FB_IDX_I8: v = ((const int8_t *)lb.data)[i]; break;
        case FB_IDX_I16: v = ((const int16_t *)lb.data)[i]; break;
        default: v = ((const int32_t *)lb.data)[i]; break;
        }
        if (v < 0 || v >= DD_MAX_LABEL) {
            rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                         "%s: label %" PRId64 " of record %" PRId64 " is outside [0, %d)", labels,
                         v, i, DD_MAX_LABEL);
            goto done;
        }
        y[i] = (int32_t)v;
    }
    rc = fb_datadir_import(res, o, dt, nd, shape, im.data, y, n, msg, msg_cap);
done:
    free(y);
    fb_idx_free(&im);
    fb_idx_free(&lb);
    return rc;
}

/* ------------------------------------------------------------ CSV */

typedef struct csv_row {
    char **f; /* fields, NUL-terminated, in place */
    int n, cap;
} csv_row;

/* Splits one line (modified in place) into fields; returns 0 or -1 for an
 * unterminated quote. */
static int csv_split(char *line, csv_row *row)
{
    row->n = 0;
    char *p = line;
    for (;;) {
        if (row->n == row->cap) {
            int nc = row->cap ? 2 * row->cap : 16;
            char **nf = realloc(row->f, (size_t)nc * sizeof *nf);
            if (!nf) return -2;
            row->f = nf;
            row->cap = nc;
        }
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '"') {
            char *out = ++p, *start = p;
            for (;;) {
                if (*p == '\0') return -1;
                if (*p == '"') {
                    if (p[1] == '"') {
                        *out++ = '"';
                        p += 2;
                        continue;
                    }
                    p++;
                    break;
                }
                *out++ = *p++;
            }
            while (*p == ' ' || *p == '\t') p++;
            if (*p != ',' && *p != '\0') return -1;
            char end = *p;
            *out = '\0';
            row->f[row->n++] = start;
            if (end == '\0') return 0;
            p++;
        } else {
            char *start = p;
            while (*p && *p != ',') p++;
            char end = *p;
            char *e = p;
            while (e > start && (e[-1] == ' ' || e[-1] == '\t')) e--;
            *e = '\0';
            row->f[row->n++] = start;
            if (end == '\0') return 0;
            p++;
        }
    }
}

static int csv_number(const char *s, double *out)
{
    if (!*s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno == ERANGE || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

/* Reads all of path (at most FB_CSV_MAX_BYTES) into *text, NUL-terminated, its length in
 * *len; *text is the caller's to free, also on error. */
static int csv_read_file(const char *csv_path, char **text_out, size_t *len_out, char *msg,
                         size_t msg_cap)
{
    FILE *f = fopen(csv_path, "rb");
    if (!f) return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot open %s: %s", csv_path, strerror(errno));
    char *text = NULL;
    int rc = 0;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            size_t nc = cap ? 2 * cap : 1 << 20;
            if (nc > FB_CSV_MAX_BYTES + 65536 + 1) nc = FB_CSV_MAX_BYTES + 65536 + 1;
            if (nc <= cap) {
                rc = fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: larger than %zu bytes", csv_path,
                             FB_CSV_MAX_BYTES);
                break;
            }
            char *nt = realloc(text, nc);
            if (!nt) {
                rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
                break;
            }
            text = nt;
            cap = nc;
        }
        size_t k = fread(text + len, 1, 65536, f);
        len += k;
        if (k == 0) {
            if (ferror(f)) rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot read %s", csv_path);
            break;
        }
        if (len > FB_CSV_MAX_BYTES) {
            rc = fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: larger than %zu bytes", csv_path,
                         FB_CSV_MAX_BYTES);
            break;
        }
    }
    fclose(f);
    *text_out = text;
    *len_out = len;
    if (rc) return rc;
    if (!text || len == 0) return fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: empty file", csv_path);
    text[len] = '\0';
    return FB_OK;
}

/* The first row of a CSV: its column count, whether it is a header (header says, or "auto":
 * a field that is not a number), and which column holds the label (by header name, else as
 * an index). The header's names point into the row's fields (*hdr_names, the caller's to
 * free). */
static int csv_first_row(const csv_row *row, fb_csv_header header, const char *label_column,
                         const char *csv_path, int64_t line_no, int *ncol_out, int *label_out,
                         bool *is_header_out, char ***hdr_out, char *msg, size_t msg_cap)
{
    int rc = FB_OK, ncol, label = -1;
    char **hdr_names = NULL;
    *ncol_out = ncol = row->n;
    if (ncol < 2) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA, "%s:%" PRId64 ": %d column%s; a CSV to "
                     "import needs a label column and at least one feature",
                     csv_path, line_no, ncol, ncol == 1 ? "" : "s");
        return rc;
    }
    bool is_header = header == FB_CSV_HEADER_YES;
    if (header == FB_CSV_HEADER_AUTO) {
        double v;
        for (int c = 0; c < row->n; c++) is_header |= !csv_number(row->f[c], &v);
    }
    if (is_header) {
        *hdr_out = hdr_names = calloc((size_t)ncol, sizeof *hdr_names);
        if (!hdr_names) {
            rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
            return rc;
        }
        for (int c = 0; c < ncol; c++) {
            hdr_names[c] = row->f[c];
            if (strcmp(row->f[c], label_column) == 0 && label < 0) label = c;
        }
    }
    if (label < 0) {
        char *end;
        errno = 0;
        long v = strtol(label_column, &end, 10);
        if (*label_column && !*end && !errno && v >= 0 && v < ncol) label = (int)v;
    }
    if (label < 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s: no label column \"%.64s\": %s, and not a column index "
                     "0..%d", csv_path, label_column,
                     hdr_names ? "no header field has that name" : "the file has no header",
                     ncol - 1);
        return rc;
    }
    *label_out = label;
    *is_header_out = is_header;
    return rc;
}

int fb_datadir_import_csv(fb_import_result *res, const fb_import_opts *o, const char *csv_path,
                          const char *label_column, fb_csv_header header, char *msg,
                          size_t msg_cap)
{
    if (!o || !csv_path || !label_column)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_datadir_import_csv: NULL argument");
    char *text = NULL, **hdr_names = NULL;
    float *x = NULL;
    int32_t *y = NULL;
    csv_row row = {0};
    size_t len = 0;
    int rc = csv_read_file(csv_path, &text, &len, msg, msg_cap);
    if (rc) goto done;
    if (memchr(text, '\0', len)) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: contains NUL bytes; not a text CSV file",
                     csv_path);
        goto done;
    }

    int ncol = -1, label = -1, F = 0;
    int64_t n = 0, rows_cap = 0, line_no = 0;
    bool first = true;
    char *p = text;
    while (*p) {
        char *nl = strchr(p, '\n'), *next = nl ? nl + 1 : p + strlen(p);
        if (nl) *nl = '\0';
        size_t ll = strlen(p);
        if (ll && p[ll - 1] == '\r') p[ll - 1] = '\0';
        line_no++;
        char *line = p;
        p = next;
        bool blank = true;
        for (char *q = line; *q; q++) blank &= *q == ' ' || *q == '\t';
        if (blank) continue;
        int sr = csv_split(line, &row);
        if (sr == -2) {
            rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (sr < 0) {
            rc = fb_errf(msg, msg_cap, FB_ERR_DATA, "%s:%" PRId64 ": unterminated or misplaced "
                         "double quote", csv_path, line_no);
            goto done;
        }
        if (first) {
            first = false;
            bool is_header = false;
            if ((rc = csv_first_row(&row, header, label_column, csv_path, line_no, &ncol, &label,
                                    &is_header, &hdr_names, msg, msg_cap)))
                goto done;
            F = ncol - 1;
            if (is_header) continue;
        }
        if (row.n != ncol) {
            rc = fb_errf(msg, msg_cap, FB_ERR_DATA, "%s:%" PRId64 ": %d fields, expected %d",
                         csv_path, line_no, row.n, ncol);
            goto done;
        }
        if (n == rows_cap) {
            int64_t nc = rows_cap ? 2 * rows_cap : 1024;
            float *nx = realloc(x, (size_t)nc * (size_t)F * sizeof *nx);
            if (nx) x = nx;
            int32_t *ny = realloc(y, (size_t)nc * sizeof *ny);
            if (ny) y = ny;
            if (!nx || !ny) {
                rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
                goto done;
            }
            rows_cap = nc;
        }
        for (int c = 0, k = 0; c < ncol; c++) {
            double v;
            if (!csv_number(row.f[c], &v) || (c != label && fabs(v) > 3.4e38)) {
                char col[96];
                if (hdr_names)
                    snprintf(col, sizeof col, "column %d (\"%.64s\")", c, hdr_names[c]);
                else
                    snprintf(col, sizeof col, "column %d", c);
                rc = fb_errf(msg, msg_cap, FB_ERR_DATA, "%s:%" PRId64 ", %s: \"%.40s\" is not "
                             "a finite number", csv_path, line_no, col, row.f[c]);
                goto done;
            }
            if (c == label) {
                if (v != floor(v) || v < 0 || v >= DD_MAX_LABEL) {
                    rc = fb_errf(msg, msg_cap, FB_ERR_DATA, "%s:%" PRId64 ", label column %d: "
                                 "\"%.40s\" is not an integer class in [0, %d)",
                                 csv_path, line_no, c, row.f[c], DD_MAX_LABEL);
                    goto done;
                }
                y[n] = (int32_t)v;
            } else {
                x[n * F + k++] = (float)v;
            }
        }
        n++;
    }
    if (n == 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: no data rows", csv_path);
        goto done;
    }
    int64_t shape[1] = {F};
    rc = fb_datadir_import(res, o, FB_DTYPE_F32, 1, shape, x, y, n, msg, msg_cap);
done:
    free(text);
    free(hdr_names);
    free(row.f);
    free(x);
    free(y);
    return rc;
}

/* ------------------------------------------------------------ verify, load */

int fb_datadir_verify_shard(fb_verify_result *res, const fb_manifest *m, const char *dir,
                            const fb_manifest_shard *sh, char *msg, size_t msg_cap)
{
    if (!m || !dir || !sh)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_datadir_verify_shard: NULL argument");
    char path[DD_PATH + 300];
    snprintf(path, sizeof path, "%s/%s", dir, sh->path);
    fb_shard_reader *r = NULL;
    fb_shard_scratch *s = fb_shard_scratch_new();
    if (!s) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    /* chunks first, so that damage is reported with the chunk it is in;
     * the whole-file checksum then covers every byte in between */
    int rc = fb_shard_open(&r, path, msg, msg_cap);
    if (rc) goto done;
    const fb_shard_meta *mt = fb_shard_get_meta(r);
    if (mt->dtype != m->dtype || mt->sample_numel != m->sample_numel) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s: holds %s records of %" PRId64 " values; the manifest says %s records "
                     "of %" PRId64,
                     path, fb_data_dtype_name(mt->dtype), mt->sample_numel,
                     fb_data_dtype_name(m->dtype), m->sample_numel);
        goto done;
    }
    if (mt->records != sh->records || mt->chunks != sh->chunks) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s: holds %" PRId64 " records in %" PRId64 " chunks; the manifest says %"
                     PRId64 " in %" PRId64,
                     path, mt->records, mt->chunks, sh->records, sh->chunks);
        goto done;
    }
    for (int64_t c = 0; c < mt->chunks; c++) {
        fb_shard_chunk ch;
        if ((rc = fb_shard_read_chunk(&ch, NULL, 0, s, r, c, msg, msg_cap))) goto done;
        if ((rc = fb_manifest_check_chunk(m, &ch, path, msg, msg_cap))) goto done;
    }
    uint32_t crc;
    uint64_t bytes;
    if ((rc = fb_file_crc32c(&crc, &bytes, path, msg, msg_cap))) goto done;
    if (bytes != sh->bytes) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s: the manifest says %" PRIu64 " bytes, the file has %" PRIu64, path,
                     sh->bytes, bytes);
        goto done;
    }
    if (crc != sh->crc32c) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s: file checksum mismatch (manifest %08" PRIx32 ", file %08" PRIx32 ")",
                     path, sh->crc32c, crc);
        goto done;
    }
    if (res) {
        res->records = mt->records;
        res->chunks = mt->chunks;
        res->bytes = mt->bytes;
        res->raw_bytes = mt->raw_bytes;
    }
done:
    fb_shard_close(r);
    fb_shard_scratch_free(s);
    return rc;
}

/* Whether record i of a split goes into a load of `part`. */
static bool in_part(int64_t i, fb_data_part part, double val_fraction)
{
    if (part == FB_PART_ALL) return true;
    return fb_data_held_out(i, val_fraction) == (part == FB_PART_HELD_OUT);
}

int fb_datadir_load_split(fb_dataset *out, const char *dir, const char *split, char *msg,
                          size_t msg_cap)
{
    return fb_datadir_load_split_part(out, dir, split, FB_PART_ALL, 0, msg, msg_cap);
}

int fb_datadir_load_split_part(fb_dataset *out, const char *dir, const char *split,
                               fb_data_part part, double val_fraction, char *msg, size_t msg_cap)
{
    if (!out || !dir || !split)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_datadir_load_split: NULL argument");
    fb_manifest m;
    char path[DD_PATH + 300];
    snprintf(path, sizeof path, "%s/%s", dir, FB_MANIFEST_FILE);
    int rc = fb_manifest_read(&m, path, msg, msg_cap);
    if (rc) return rc;
    float *x = NULL;
    int32_t *y = NULL;
    fb_shard_reader *r = NULL;
    fb_shard_scratch *s = fb_shard_scratch_new();
    const fb_manifest_split *sp = fb_manifest_find_split(&m, split);
    if (!s) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (!sp) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOT_FOUND, "dataset %s (%s) has no split \"%.32s\"",
                     m.name, dir, split);
        goto done;
    }
    if (m.sample_numel == 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                     "dataset %s has variable-size records; they cannot be trained on", m.name);
        goto done;
    }
    if ((rc = fb_manifest_check_files(&m, dir, split, msg, msg_cap))) goto done;
    int64_t numel = m.sample_numel, want = 0;
    for (int64_t i = 0; i < sp->samples; i++) want += in_part(i, part, val_fraction);
    /* at least one element: an empty part is a valid dataset of 0 samples */
    x = malloc(((size_t)want * (size_t)numel + 1) * sizeof *x);
    y = malloc(((size_t)want + 1) * sizeof *y);
    if (!x || !y) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory loading %s (%s)", m.name, split);
        goto done;
    }
    int64_t at = 0, rec = 0;
    for (int i = 0; i < sp->n_shards; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, sp->shards[i].path);
        if ((rc = fb_shard_open(&r, path, msg, msg_cap))) goto done;
        const fb_shard_meta *mt = fb_shard_get_meta(r);
        for (int64_t c = 0; c < mt->chunks; c++) {
            fb_shard_chunk ch;
            if ((rc = fb_shard_read_chunk(&ch, NULL, 0, s, r, c, msg, msg_cap))) goto done;
            if ((rc = fb_manifest_check_chunk(&m, &ch, path, msg, msg_cap))) goto done;
            for (int64_t k = 0; k < ch.records; k++, rec++) {
                if (!in_part(rec, part, val_fraction)) continue;
                y[at] = ch.labels[k];
                fb_data_values_to_float(x + at++ * numel, m.dtype,
                                        (const uint8_t *)ch.values +
                                            (size_t)(k * numel) * fb_data_dtype_size(m.dtype),
                                        numel);
            }
        }
        fb_shard_close(r);
        r = NULL;
    }
    out->n = want;
    if (m.ndim == 3) {
        out->C = (int)m.shape[0], out->H = (int)m.shape[1], out->W = (int)m.shape[2];
    } else {
        out->C = 1, out->H = 1, out->W = (int)m.shape[0];
    }
    out->x = x;
    out->y = y;
    out->n_classes = m.n_classes;
    x = NULL;
    y = NULL;
done:
    fb_shard_close(r);
    fb_shard_scratch_free(s);
    free(x);
    free(y);
    fb_manifest_free(&m);
    return rc;
}

int fb_datadir_resolve(char *dir, size_t dir_cap, const char *name, const char *data_dir)
{
    if (!dir || !name || !fb_manifest_valid_name(name)) return -1;
    const char *base = data_dir;
    if (!base) {
        base = getenv(FB_DATASET_DIR_ENV);
        if (!base || !*base) base = FB_DATASET_DEFAULT_DIR;
    }
    if ((size_t)snprintf(dir, dir_cap, "%s/%s", base, name) >= dir_cap) return -1;
    char mpath[DD_PATH + 300];
    if ((size_t)snprintf(mpath, sizeof mpath, "%s/%s", dir, FB_MANIFEST_FILE) >= sizeof mpath)
        return -1;
    struct stat st;
    return stat(mpath, &st) == 0 && S_ISREG(st.st_mode) ? 1 : 0;
}

int fb_dataset_holdout(fb_dataset *train, fb_dataset *val, double val_fraction, char *msg,
                       size_t msg_cap)
{
    if (!train || !val)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_dataset_holdout: NULL argument");
    int64_t numel = (int64_t)train->C * train->H * train->W, held = 0;
    for (int64_t i = 0; i < train->n; i++) held += fb_data_held_out(i, val_fraction);
    fb_dataset v = {.n = held, .C = train->C, .H = train->H, .W = train->W,
                    .n_classes = train->n_classes};
    v.x = malloc(((size_t)held * (size_t)numel + 1) * sizeof *v.x);
    v.y = malloc(((size_t)held + 1) * sizeof *v.y);
    if (!v.x || !v.y) {
        fb_dataset_free(&v);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory holding out validation records");
    }
    /* in place: the kept records move down in order, the held ones go to val */
    int64_t k = 0, h = 0;
    for (int64_t i = 0; i < train->n; i++) {
        const float *src = train->x + i * numel;
        if (fb_data_held_out(i, val_fraction)) {
            memcpy(v.x + h * numel, src, (size_t)numel * sizeof *src);
            v.y[h++] = train->y[i];
        } else {
            if (k != i) memmove(train->x + k * numel, src, (size_t)numel * sizeof *src);
            train->y[k++] = train->y[i];
        }
    }
    train->n = k;
    *val = v;
    return 0;
}

const char *fb_datadir_val_split(const fb_manifest *m)
{
    static const char *const names[] = {"val", "validation"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (fb_manifest_find_split(m, names[i])) return names[i];
    return NULL;
}

int fb_datadir_load_val(fb_dataset *val, double *held_fraction, const char *dir,
                        double val_fraction, bool load, char *msg, size_t msg_cap)
{
    if (!val || !held_fraction || !dir)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_datadir_load_val: NULL argument");
    fb_manifest m;
    int rc = fb_manifest_open_dir(&m, dir, msg, msg_cap);
    if (rc) return rc;
    const char *split = fb_datadir_val_split(&m);
    char name[FB_MANIFEST_SPLIT_MAX + 1];
    snprintf(name, sizeof name, "%s", split ? split : "");
    fb_manifest_free(&m);
    fb_dataset v = {0};
    if (load && split)
        rc = fb_datadir_load_split(&v, dir, name, msg, msg_cap);
    else if (load && val_fraction > 0)
        rc = fb_datadir_load_split_part(&v, dir, "train", FB_PART_HELD_OUT, val_fraction, msg,
                                        msg_cap);
    if (rc) return rc;
    *held_fraction = split ? 0 : val_fraction;
    *val = v;
    return 0;
}

int fb_data_open_named(fb_dataset *train, fb_dataset *val, fb_dataset *test, fb_loader **loader,
                       const char *name, const char *data_dir, const fb_data_source_opts *o,
                       char *msg, size_t msg_cap)
{
    if (!train || !val || !test || !loader || !name || !o)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_data_open_named: NULL argument");
    if (!(o->val_fraction >= 0 && o->val_fraction <= FB_DATA_MAX_VAL_FRACTION))
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "val_fraction %g; allowed 0 to %g",
                       o->val_fraction, FB_DATA_MAX_VAL_FRACTION);
    char dir[DD_PATH];
    int kind = fb_datadir_resolve(dir, sizeof dir, name, data_dir);
    fb_dataset tr = {0}, va = {0}, te = {0};
    int rc;
    if (kind <= 0) {
        /* not a shard dataset: the IDX files (fb_dataset_open_named names what is wrong);
         * they have no validation split, so it is held out of train */
        if ((rc = fb_dataset_open_named(name, "train", data_dir, &tr, msg, msg_cap))) {
            if (kind == 0 && msg && strncmp(msg, "unknown dataset", 15) == 0)
                fb_errf(msg, msg_cap, rc,
                        "unknown dataset \"%.64s\": %s/%s does not exist (a shard dataset), "
                        "and it is not an IDX dataset (fashion-mnist, mnist)",
                        name, dir, FB_MANIFEST_FILE);
            return rc;
        }
        if ((rc = fb_dataset_holdout(&tr, &va, o->val_fraction, msg, msg_cap)) ||
            (o->want_test &&
             (rc = fb_dataset_open_named(name, "test", data_dir, &te, msg, msg_cap)))) {
            fb_dataset_free(&tr);
            fb_dataset_free(&va);
            return rc;
        }
        if (!o->want_val) fb_dataset_free(&va);
        *train = tr;
        *val = va;
        *test = te;
        *loader = NULL;
        return 0;
    }
    double held = 0;
    if ((rc = fb_datadir_load_val(&va, &held, dir, o->val_fraction, o->want_val, msg, msg_cap)))
        return rc;
    fb_loader *l = NULL;
    fb_loader_opts lo = {.dir = dir, .split = "train", .batch_size = o->batch_size,
                         .shuffle = o->shuffle, .data_seed = o->data_seed, .drop_last = true,
                         .threads = o->threads ? o->threads : 2, .cache_dir = o->cache_dir,
                         .cache_bytes = o->cache_bytes, .val_fraction = held};
    if (o->start_step > 0) {
        /* the position needs the size of what trains, which the manifest knows */
        fb_manifest m;
        if ((rc = fb_manifest_open_dir(&m, dir, msg, msg_cap))) goto fail;
        const fb_manifest_split *sp = fb_manifest_find_split(&m, "train");
        int64_t n = fb_data_kept_count(sp ? sp->samples : 0, held);
        fb_manifest_free(&m);
        if (n < o->batch_size) {
            rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                         "dataset %.64s: its train split has fewer samples than a batch", name);
            goto fail;
        }
        lo.start = fb_loader_pos_at_step(n, o->batch_size, true, o->start_step);
    }
    if ((rc = fb_loader_open(&l, &lo, msg, msg_cap))) goto fail;
    if (o->want_test && (rc = fb_datadir_load_split(&te, dir, "test", msg, msg_cap))) goto fail;
    const fb_manifest *m = fb_loader_manifest(l);
    tr.n = fb_loader_samples(l);
    if (m->ndim == 3) {
        tr.C = (int)m->shape[0], tr.H = (int)m->shape[1], tr.W = (int)m->shape[2];
    } else {
        tr.C = 1, tr.H = 1, tr.W = (int)m->shape[0];
    }
    tr.n_classes = m->n_classes;
    *train = tr;
    *val = va;
    *test = te;
    *loader = l;
    return 0;
fail:
    fb_loader_free(l);
    fb_dataset_free(&va);
    return rc;
}
