#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "utf8.h"

/* Tensor data is read and written as raw bytes; the format is little-endian. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fb_io's safetensors code assumes a little-endian host"
#endif

#define ST_SHAPE_STR 192 /* room for "[d0, d1, ...]" with FB_ST_MAX_DIMS dims */

/* ------------------------------------------------------------------ dtypes */

static const struct {
    const char *name;
    size_t size;
} st_dtypes[FB_ST_DTYPE_COUNT] = {
    [FB_ST_BOOL] = {"BOOL", 1},       [FB_ST_U8] = {"U8", 1},           [FB_ST_I8] = {"I8", 1},
    [FB_ST_F8_E5M2] = {"F8_E5M2", 1}, [FB_ST_F8_E4M3] = {"F8_E4M3", 1}, [FB_ST_I16] = {"I16", 2},
    [FB_ST_U16] = {"U16", 2},         [FB_ST_F16] = {"F16", 2},         [FB_ST_BF16] = {"BF16", 2},
    [FB_ST_I32] = {"I32", 4},         [FB_ST_U32] = {"U32", 4},         [FB_ST_F32] = {"F32", 4},
    [FB_ST_F64] = {"F64", 8},         [FB_ST_I64] = {"I64", 8},         [FB_ST_U64] = {"U64", 8},
};

const char *fb_st_dtype_name(fb_st_dtype dtype)
{
    if ((unsigned)dtype >= FB_ST_DTYPE_COUNT) return "?";
    return st_dtypes[dtype].name;
}

size_t fb_st_dtype_size(fb_st_dtype dtype)
{
    if ((unsigned)dtype >= FB_ST_DTYPE_COUNT) return 0;
    return st_dtypes[dtype].size;
}

int fb_st_dtype_from_name(const char *name, fb_st_dtype *out)
{
    if (!name) return 0;
    for (int i = 0; i < FB_ST_DTYPE_COUNT; i++) {
        if (strcmp(name, st_dtypes[i].name) == 0) {
            *out = (fb_st_dtype)i;
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ helpers */

static uint64_t st_load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void st_store_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Writes "[d0, d1, ...]" into buf. */
static const char *st_fmt_shape(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t used = 0;
    int n = snprintf(buf, cap, "[");
    used = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < ndim && used < cap; i++) {
        n = snprintf(buf + used, cap - used, "%s%" PRId64, i ? ", " : "", shape[i]);
        if (n < 0) break;
        used += (size_t)n;
    }
    if (used < cap) snprintf(buf + used, cap - used, "]");
    return buf;
}

static char *st_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ------------------------------------------------------------------ reader */

typedef struct st_meta {
    char *key;
    char *value;
} st_meta;

struct fb_st_file {
    uint8_t *buf; /* the whole file */
    size_t len;
    fb_st_tensor *tensors; /* sorted by name; names owned */
    size_t n;
    st_meta *meta; /* sorted by key; owned */
    size_t n_meta;
    char *source; /* path or "<buffer>", for messages */
};

/* Range of one tensor inside the data section, for the tiling check. */
typedef struct st_range {
    uint64_t begin, end;
    const char *name;
} st_range;

static int st_cmp_range(const void *a, const void *b)
{
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int st_cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const fb_st_tensor *)a)->name, ((const fb_st_tensor *)b)->name);
}

static int st_cmp_meta(const void *a, const void *b)
{
    return strcmp(((const st_meta *)a)->key, ((const st_meta *)b)->key);
}

static void st_file_free_parts(fb_st_file *f)
{
    if (f->tensors)
        for (size_t i = 0; i < f->n; i++)
            free((char *)f->tensors[i].name);
    free(f->tensors);
    if (f->meta)
        for (size_t i = 0; i < f->n_meta; i++) {
            free(f->meta[i].key);
            free(f->meta[i].value);
        }
    free(f->meta);
    free(f->source);
}

void fb_st_close(fb_st_file *file)
{
    if (!file) return;
    st_file_free_parts(file);
    free(file->buf);
    free(file);
}

/* Checks the 8-byte header length against the limit and the file size. */
static int st_check_prefix(const uint8_t *buf, uint64_t file_len, const char *src, char *msg,
                           size_t msg_cap)
{
    if (file_len < 8)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: %" PRIu64 " bytes is too short for a safetensors file "
                       "(the 8-byte header length is missing)",
                       src, file_len);
    uint64_t hlen = st_load_le64(buf);
    if (hlen > FB_ST_MAX_HEADER)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: header length %" PRIu64 " exceeds the limit of %" PRIu64 " bytes", src,
                       hlen, FB_ST_MAX_HEADER);
    if (hlen > file_len - 8)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: header length %" PRIu64 " runs past the end of the file (%" PRIu64
                       " bytes)",
                       src, hlen, file_len);
    return 0;
}

/* Reads one non-negative JSON integer. */
static int st_get_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

/* Validates one tensor entry of the header into *t (name set by the caller)
 * and its byte range into *r; data is the start of the data section. */
static int st_parse_entry(const char *name, json_t *e, const uint8_t *data, uint64_t data_len,
                          const char *src, fb_st_tensor *t, st_range *r, char *msg, size_t msg_cap)
{
    if (!json_is_object(e))
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: tensor %s: entry is not a JSON object",
                       src, name);
    const char *k;
    json_t *v;
    json_object_foreach(e, k, v)
    {
        if (strcmp(k, "dtype") != 0 && strcmp(k, "shape") != 0 && strcmp(k, "data_offsets") != 0)
            return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                           "%s: tensor %s: unknown field \"%s\" (expected dtype, shape, "
                           "data_offsets)",
                           src, name, k);
    }

    json_t *jd = json_object_get(e, "dtype");
    if (!json_is_string(jd))
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: tensor %s: \"dtype\" %s", src, name,
                       jd ? "is not a string" : "is missing");
    if (!fb_st_dtype_from_name(json_string_value(jd), &t->dtype))
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: tensor %s: unknown dtype \"%.32s\"",
                       src, name, json_string_value(jd));

    json_t *js = json_object_get(e, "shape");
    if (!json_is_array(js))
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: tensor %s: \"shape\" %s", src, name,
                       js ? "is not an array" : "is missing");
    size_t nd = json_array_size(js);
    if (nd > FB_ST_MAX_DIMS)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: tensor %s has %zu dimensions, more than the %d supported", src, name,
                       nd, FB_ST_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!st_get_u64(json_array_get(js, i), &d))
            return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                           "%s: tensor %s: shape[%zu] is not a non-negative integer", src, name, i);
        t->shape[i] = (int64_t)d;
        if (d != 0 && numel > UINT64_MAX / d)
            overflow = true;
        else
            numel *= d;
    }
    /* A zero dimension makes the product 0 even after an overflowing one. */
    for (size_t i = 0; i < nd; i++)
        if (t->shape[i] == 0) numel = 0, overflow = false;
    size_t esz = st_dtypes[t->dtype].size;
    if (overflow || numel > UINT64_MAX / esz)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: tensor %s: shape size overflows", src,
                       name);
    uint64_t nbytes = numel * esz;

    json_t *jo = json_object_get(e, "data_offsets");
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: tensor %s: \"data_offsets\" must be an array [begin, end]", src, name);
    uint64_t b, en;
    if (!st_get_u64(json_array_get(jo, 0), &b) || !st_get_u64(json_array_get(jo, 1), &en))
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: tensor %s: data offsets are not non-negative integers", src, name);
    if (en < b)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: tensor %s: data offsets [%" PRIu64 ", %" PRIu64 "] end before they "
                       "begin",
                       src, name, b, en);
    if (en > data_len)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: tensor %s: data offsets [%" PRIu64 ", %" PRIu64
                       "] run past the data section (%" PRIu64 " bytes)",
                       src, name, b, en, data_len);
    if (en - b != nbytes) {
        char sh[ST_SHAPE_STR];
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: tensor %s: %s %s needs %" PRIu64 " bytes but its data offsets "
                       "[%" PRIu64 ", %" PRIu64 "] span %" PRIu64,
                       src, name, st_dtypes[t->dtype].name,
                       st_fmt_shape(sh, sizeof sh, t->shape, t->ndim), nbytes, b, en, en - b);
    }
    t->numel = (int64_t)numel; /* <= data_len, so it fits */
    t->nbytes = (size_t)nbytes;
    t->data = data + b;
    r->begin = b;
    r->end = en;
    return 0;
}

/* Parses buf[0..len) (owned by the caller until success, then by *out). */
static int st_parse_owned(uint8_t *buf, size_t len, const char *src, fb_st_file **out, char *msg,
                          size_t msg_cap)
{
    int rc = st_check_prefix(buf, len, src, msg, msg_cap);
    if (rc) return rc;
    uint64_t hlen = st_load_le64(buf);
    uint64_t data_len = (uint64_t)len - 8 - hlen;
    const uint8_t *data = buf + 8 + hlen;

    json_t *root = NULL;
    st_range *ranges = NULL;
    fb_st_file *f = calloc(1, sizeof *f);
    if (!f) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "%s: out of memory", src);
    f->source = st_strdup(src);
    if (!f->source) goto nomem;

    json_error_t jerr;
    root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        rc = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: header is not valid JSON: %s (byte %d)",
                     src, jerr.text, jerr.position);
        goto fail;
    }
    if (!json_is_object(root)) {
        rc = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: header is a JSON %s, expected an object",
                     src,
                     json_is_array(root)    ? "array"
                     : json_is_string(root) ? "string"
                                            : "scalar");
        goto fail;
    }

    size_t n_keys = json_object_size(root);
    json_t *jmeta = json_object_get(root, "__metadata__");
    size_t n_tensors = n_keys - (jmeta ? 1 : 0);
    if (jmeta && !json_is_null(jmeta)) {
        if (!json_is_object(jmeta)) {
            rc = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                         "%s: \"__metadata__\" is not a JSON object", src);
            goto fail;
        }
        f->meta = calloc(json_object_size(jmeta) + 1, sizeof *f->meta);
        if (!f->meta) goto nomem;
        const char *k;
        json_t *v;
        json_object_foreach(jmeta, k, v)
        {
            if (!json_is_string(v)) {
                rc = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                             "%s: metadata value of \"%.64s\" is not a string", src, k);
                goto fail;
            }
            st_meta *m = &f->meta[f->n_meta];
            m->key = st_strdup(k);
            m->value = m->key ? st_strdup(json_string_value(v)) : NULL;
            if (!m->value) {
                free(m->key);
                goto nomem;
            }
            f->n_meta++;
        }
        qsort(f->meta, f->n_meta, sizeof *f->meta, st_cmp_meta);
    }

    f->tensors = calloc(n_tensors + 1, sizeof *f->tensors);
    ranges = calloc(n_tensors + 1, sizeof *ranges);
    if (!f->tensors || !ranges) goto nomem;
    const char *name;
    json_t *entry;
    json_object_foreach(root, name, entry)
    {
        if (strcmp(name, "__metadata__") == 0) continue;
        fb_st_tensor *t = &f->tensors[f->n];
        rc = st_parse_entry(name, entry, data, data_len, src, t, &ranges[f->n], msg, msg_cap);
        if (rc) goto fail;
        t->name = st_strdup(name);
        if (!t->name) goto nomem;
        ranges[f->n].name = t->name;
        f->n++;
    }

    /* The offsets must tile [0, data_len) exactly: no overlap, no hole. */
    qsort(ranges, f->n, sizeof *ranges, st_cmp_range);
    uint64_t pos = 0;
    const char *prev = NULL;
    for (size_t i = 0; i < f->n; i++) {
        if (ranges[i].begin < pos) {
            rc = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                         "%s: tensors %s and %s overlap (data offset %" PRIu64 " is before %" PRIu64
                         ")",
                         src, prev, ranges[i].name, ranges[i].begin, pos);
            goto fail;
        }
        if (ranges[i].begin > pos) {
            rc = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                         "%s: data bytes [%" PRIu64 ", %" PRIu64 ") belong to no tensor", src, pos,
                         ranges[i].begin);
            goto fail;
        }
        pos = ranges[i].end;
        prev = ranges[i].name;
    }
    if (pos != data_len) {
        rc = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                     "%s: data section is %" PRIu64 " bytes but the tensors cover only %" PRIu64,
                     src, data_len, pos);
        goto fail;
    }

    qsort(f->tensors, f->n, sizeof *f->tensors, st_cmp_tensor);

    json_decref(root);
    free(ranges);
    f->buf = buf;
    f->len = len;
    *out = f;
    return 0;

nomem:
    rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "%s: out of memory", src);
fail:
    json_decref(root);
    free(ranges);
    st_file_free_parts(f);
    free(f);
    return rc;
}

int fb_st_parse_buffer(const uint8_t *buf, size_t len, fb_st_file **out, char *msg, size_t msg_cap)
{
    if (!buf && len > 0)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_st_parse_buffer: NULL buffer");
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "<buffer>: out of memory (%zu bytes)", len);
    if (len) memcpy(copy, buf, len);
    int rc = st_parse_owned(copy, len, "<buffer>", out, msg, msg_cap);
    if (rc) free(copy);
    return rc;
}

/* Reads exactly n bytes at the current offset; a short file is FB_ERR_IO. */
static int st_read_exact(int fd, uint8_t *dst, size_t n, const char *path, char *msg,
                         size_t msg_cap)
{
    size_t got = 0;
    while (got < n) {
        size_t chunk = n - got > (1u << 30) ? (1u << 30) : n - got;
        ssize_t r = read(fd, dst + got, chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot read %s: %s", path, strerror(errno));
        if (r == 0)
            return fb_errf(msg, msg_cap, FB_ERR_IO, "%s shrank while it was being read", path);
        got += (size_t)r;
    }
    return 0;
}

int fb_st_open(const char *path, fb_st_file **out, char *msg, size_t msg_cap)
{
    uint8_t *buf = NULL;
    int rc;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "%s is not a regular file", path);
        goto fail;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > SIZE_MAX - 1) {
        rc = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s is too large to load", path);
        goto fail;
    }
    size_t len = (size_t)st.st_size;
    buf = malloc(len ? len : 1);
    if (!buf) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "%s: out of memory (%zu bytes)", path, len);
        goto fail;
    }
    /* Check the header length before reading a possibly huge file. */
    size_t head = len < 8 ? len : 8;
    if ((rc = st_read_exact(fd, buf, head, path, msg, msg_cap)) != 0) goto fail;
    if ((rc = st_check_prefix(buf, len, path, msg, msg_cap)) != 0) goto fail;
    if ((rc = st_read_exact(fd, buf + head, len - head, path, msg, msg_cap)) != 0) goto fail;
    close(fd);
    fd = -1;
    rc = st_parse_owned(buf, len, path, out, msg, msg_cap);
    if (rc) goto fail;
    return 0;

fail:
    if (fd >= 0) close(fd);
    free(buf);
    return rc;
}

size_t fb_st_count(const fb_st_file *file)
{
    return file ? file->n : 0;
}

const fb_st_tensor *fb_st_at(const fb_st_file *file, size_t i)
{
    if (!file || i >= file->n) return NULL;
    return &file->tensors[i];
}

const fb_st_tensor *fb_st_find(const fb_st_file *file, const char *name)
{
    if (!file || !name) return NULL;
    fb_st_tensor key = {.name = name};
    return bsearch(&key, file->tensors, file->n, sizeof *file->tensors, st_cmp_tensor);
}

size_t fb_st_metadata_count(const fb_st_file *file)
{
    return file ? file->n_meta : 0;
}

int fb_st_metadata_at(const fb_st_file *file, size_t i, const char **key, const char **value)
{
    if (!file || i >= file->n_meta) return FB_ERR_NOT_FOUND;
    *key = file->meta[i].key;
    *value = file->meta[i].value;
    return 0;
}

const char *fb_st_metadata_get(const fb_st_file *file, const char *key)
{
    /* bsearch must not see the NULL table of a file without metadata */
    if (!file || !key || file->n_meta == 0) return NULL;
    st_meta k = {.key = (char *)key};
    const st_meta *m = bsearch(&k, file->meta, file->n_meta, sizeof *file->meta, st_cmp_meta);
    return m ? m->value : NULL;
}

/* Finds name and checks its shape against expected[0..ndim). */
static int st_lookup_shaped(const fb_st_file *file, const char *name, const int64_t *expected,
                            int ndim, const fb_st_tensor **out, char *msg, size_t msg_cap)
{
    if (!file || !name || ndim < 0 || ndim > FB_ST_MAX_DIMS || (ndim > 0 && !expected))
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "invalid arguments for tensor %s",
                       name ? name : "(null)");
    const fb_st_tensor *t = fb_st_find(file, name);
    if (!t)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: tensor %s is missing", file->source,
                       name);
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == expected[i];
    if (!same) {
        char a[ST_SHAPE_STR], b[ST_SHAPE_STR];
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: tensor %s has shape %s, expected %s",
                       file->source, name, st_fmt_shape(a, sizeof a, t->shape, t->ndim),
                       st_fmt_shape(b, sizeof b, expected, ndim));
    }
    *out = t;
    return 0;
}

static float st_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    float f;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 exactly */
        f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    uint32_t bits;
    if (exp == 0x1F)
        bits = sign | 0x7F800000u | (man << 13); /* inf or NaN */
    else
        bits = sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &bits, sizeof f);
    return f;
}

int fb_st_get_f32(const fb_st_file *file, const char *name, const int64_t *expected_shape, int ndim,
                  float *dst, char *msg, size_t msg_cap)
{
    const fb_st_tensor *t;
    int rc = st_lookup_shaped(file, name, expected_shape, ndim, &t, msg, msg_cap);
    if (rc) return rc;
    size_t n = (size_t)t->numel;
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case FB_ST_F32:
        if (n) memcpy(dst, p, n * 4);
        return 0;
    case FB_ST_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            /* Out-of-range values become infinities instead of undefined behaviour. */
            if (d > FLT_MAX)
                dst[i] = INFINITY;
            else if (d < -FLT_MAX)
                dst[i] = -INFINITY;
            else
                dst[i] = (float)d;
        }
        return 0;
    case FB_ST_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = st_half_to_float((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        return 0;
    case FB_ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
            memcpy(&dst[i], &bits, 4);
        }
        return 0;
    default:
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: tensor %s has dtype %s, expected F32 (or F64, F16, BF16)", file->source,
                       name, st_dtypes[t->dtype].name);
    }
}

int fb_st_get_i64(const fb_st_file *file, const char *name, const int64_t *expected_shape, int ndim,
                  int64_t *dst, char *msg, size_t msg_cap)
{
    const fb_st_tensor *t;
    int rc = st_lookup_shaped(file, name, expected_shape, ndim, &t, msg, msg_cap);
    if (rc) return rc;
    size_t n = (size_t)t->numel;
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case FB_ST_I64:
        if (n) memcpy(dst, p, n * 8);
        return 0;
    case FB_ST_U64:
        /* Check every value before writing any, so dst stays untouched on failure. */
        for (size_t i = 0; i < n; i++) {
            uint64_t u;
            memcpy(&u, p + 8 * i, 8);
            if (u > INT64_MAX)
                return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                               "%s: tensor %s: element %zu (%" PRIu64 ") does not fit int64",
                               file->source, name, i, u);
        }
        if (n) memcpy(dst, p, n * 8);
        return 0;
    case FB_ST_I32:
        for (size_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, p + 4 * i, 4);
            dst[i] = v;
        }
        return 0;
    case FB_ST_U32:
        for (size_t i = 0; i < n; i++) {
            uint32_t v;
            memcpy(&v, p + 4 * i, 4);
            dst[i] = v;
        }
        return 0;
    case FB_ST_I16:
        for (size_t i = 0; i < n; i++) {
            int16_t v;
            memcpy(&v, p + 2 * i, 2);
            dst[i] = v;
        }
        return 0;
    case FB_ST_U16:
        for (size_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, p + 2 * i, 2);
            dst[i] = v;
        }
        return 0;
    case FB_ST_I8:
        for (size_t i = 0; i < n; i++)
            dst[i] = (int8_t)p[i];
        return 0;
    case FB_ST_U8:
        for (size_t i = 0; i < n; i++)
            dst[i] = p[i];
        return 0;
    case FB_ST_BOOL:
        for (size_t i = 0; i < n; i++)
            dst[i] = p[i] != 0;
        return 0;
    default:
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: tensor %s has dtype %s, expected an integer dtype (I64)", file->source,
                       name, st_dtypes[t->dtype].name);
    }
}

/* ------------------------------------------------------------------ writer */

typedef struct st_wtensor {
    char *name;
    fb_st_dtype dtype;
    int ndim;
    int64_t shape[FB_ST_MAX_DIMS];
    const void *data;
    uint64_t nbytes;
} st_wtensor;

struct fb_st_writer {
    st_wtensor *t;
    size_t n, cap;
    st_meta *meta;
    size_t n_meta, meta_cap;
};

fb_st_writer *fb_st_writer_new(void)
{
    return calloc(1, sizeof(fb_st_writer));
}

void fb_st_writer_free(fb_st_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n; i++)
        free(w->t[i].name);
    free(w->t);
    for (size_t i = 0; i < w->n_meta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->meta);
    free(w);
}

int fb_st_writer_add(fb_st_writer *w, const char *name, fb_st_dtype dtype, const int64_t *shape,
                     int ndim, const void *data, char *msg, size_t msg_cap)
{
    if (!w || !name)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_st_writer_add: NULL argument");
    if (!*name || strcmp(name, "__metadata__") == 0 || !fb_utf8_valid_str(name))
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "tensor name \"%.64s\" is empty, reserved or not valid UTF-8", name);
    if ((unsigned)dtype >= FB_ST_DTYPE_COUNT)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "tensor %s: unknown dtype %d", name,
                       (int)dtype);
    if (ndim < 0 || ndim > FB_ST_MAX_DIMS || (ndim > 0 && !shape))
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "tensor %s: %d dimensions (0 to %d supported)", name, ndim, FB_ST_MAX_DIMS);
    uint64_t numel = 1;
    bool overflow = false, zero = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                           "tensor %s: dimension %d is negative (%" PRId64 ")", name, i, shape[i]);
        uint64_t d = (uint64_t)shape[i];
        if (d == 0)
            zero = true;
        else if (numel > UINT64_MAX / d)
            overflow = true;
        else
            numel *= d;
    }
    if (zero) numel = 0, overflow = false;
    uint64_t esz = st_dtypes[dtype].size;
    if (overflow || numel > (uint64_t)INT64_MAX / esz)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "tensor %s: shape size overflows", name);
    if (numel > 0 && !data)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "tensor %s: NULL data", name);
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "tensor %s was already added", name);

    if (w->n == w->cap) {
        size_t nc = w->cap ? 2 * w->cap : 16;
        st_wtensor *nt = realloc(w->t, nc * sizeof *nt);
        if (!nt) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        w->t = nt;
        w->cap = nc;
    }
    char *copy = st_strdup(name);
    if (!copy) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    st_wtensor *t = &w->t[w->n++];
    memset(t, 0, sizeof *t);
    t->name = copy;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->data = data;
    t->nbytes = numel * esz;
    return 0;
}

int fb_st_writer_add_f32(fb_st_writer *w, const char *name, const int64_t *shape, int ndim,
                         const float *data, char *msg, size_t msg_cap)
{
    return fb_st_writer_add(w, name, FB_ST_F32, shape, ndim, data, msg, msg_cap);
}

int fb_st_writer_add_i64(fb_st_writer *w, const char *name, const int64_t *shape, int ndim,
                         const int64_t *data, char *msg, size_t msg_cap)
{
    return fb_st_writer_add(w, name, FB_ST_I64, shape, ndim, data, msg, msg_cap);
}

int fb_st_writer_set_metadata(fb_st_writer *w, const char *key, const char *value, char *msg,
                              size_t msg_cap)
{
    if (!w || !key || !value)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_st_writer_set_metadata: NULL argument");
    if (!fb_utf8_valid_str(key) || !fb_utf8_valid_str(value))
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "metadata key \"%.64s\" or its value is not valid UTF-8", key);
    char *v = st_strdup(value);
    if (!v) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < w->n_meta; i++) {
        if (strcmp(w->meta[i].key, key) == 0) {
            free(w->meta[i].value);
            w->meta[i].value = v;
            return 0;
        }
    }
    char *k = st_strdup(key);
    if (!k) goto nomem;
    if (w->n_meta == w->meta_cap) {
        size_t nc = w->meta_cap ? 2 * w->meta_cap : 8;
        st_meta *nm = realloc(w->meta, nc * sizeof *nm);
        if (!nm) goto nomem;
        w->meta = nm;
        w->meta_cap = nc;
    }
    w->meta[w->n_meta].key = k;
    w->meta[w->n_meta].value = v;
    w->n_meta++;
    return 0;

nomem:
    free(k);
    free(v);
    return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
}

/* Data layout order: larger elements first (so every tensor is aligned to its
 * element size after the 8-aligned data start), then by name. */
static int st_cmp_layout(const void *a, const void *b)
{
    const st_wtensor *x = *(const st_wtensor *const *)a, *y = *(const st_wtensor *const *)b;
    size_t sx = st_dtypes[x->dtype].size, sy = st_dtypes[y->dtype].size;
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Builds the padded header; *out is malloc'd, *out_len a multiple of 8. */
static int st_build_header(const fb_st_writer *w, const st_wtensor *const *order, char **out,
                           size_t *out_len, char *msg, size_t msg_cap)
{
    json_t *root = json_object();
    char *s = NULL;
    if (!root) goto nomem;
    uint64_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        const st_wtensor *t = order[i];
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        if (!e || !shape || !offs || json_object_set_new(root, t->name, e) != 0) {
            json_decref(e);
            json_decref(shape);
            json_decref(offs);
            goto nomem;
        }
        int bad = json_object_set_new(e, "shape", shape);
        bad |= json_object_set_new(e, "data_offsets", offs);
        bad |= json_object_set_new(e, "dtype", json_string(st_dtypes[t->dtype].name));
        for (int d = 0; d < t->ndim; d++)
            bad |= json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
        bad |= json_array_append_new(offs, json_integer((json_int_t)off));
        bad |= json_array_append_new(offs, json_integer((json_int_t)(off + t->nbytes)));
        if (bad) goto nomem;
        off += t->nbytes;
    }
    if (w->n_meta > 0) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m) != 0) goto nomem;
        for (size_t i = 0; i < w->n_meta; i++)
            if (json_object_set_new(m, w->meta[i].key, json_string(w->meta[i].value)) != 0)
                goto nomem;
    }
    s = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    if (!s) goto nomem;
    size_t len = strlen(s);
    size_t padded = (len + 7) / 8 * 8;
    char *p = realloc(s, padded + 1);
    if (!p) goto nomem;
    memset(p + len, ' ', padded - len);
    p[padded] = '\0';
    json_decref(root);
    *out = p;
    *out_len = padded;
    return 0;

nomem:
    free(s);
    json_decref(root);
    return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory while building the header");
}

static int st_write_all(int fd, const void *buf, uint64_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t r = write(fd, p, chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (uint64_t)r;
    }
    return 0;
}

/* fsyncs the directory holding path, so a rename in it survives a crash. */
static int st_fsync_dir(const char *path, char *msg, size_t msg_cap)
{
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) {
        dir = st_strdup(".");
    } else {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        dir = malloc(n + 1);
        if (dir) {
            memcpy(dir, path, n);
            dir[n] = '\0';
        }
    }
    if (!dir) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    int rc = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    } else {
        /* Some file systems cannot fsync a directory (EINVAL); nothing to do then. */
        if (fsync(fd) != 0 && errno != EINVAL)
            rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot fsync directory %s: %s", dir,
                         strerror(errno));
        close(fd);
    }
    free(dir);
    return rc;
}

/* The whole file as bytes: length prefix, padded header, tensor data in layout
 * order.  The one serializer behind fb_st_write and fb_st_write_buffer. */
static int st_serialize(const fb_st_writer *w, uint8_t **out, size_t *out_len, char *msg,
                        size_t msg_cap)
{
    int rc;
    char *header = NULL;
    uint8_t *buf = NULL;
    size_t hlen = 0;
    const st_wtensor **order = calloc(w->n + 1, sizeof *order);
    if (!order) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < w->n; i++)
        order[i] = &w->t[i];
    qsort(order, w->n, sizeof *order, st_cmp_layout);
    if ((rc = st_build_header(w, order, &header, &hlen, msg, msg_cap)) != 0) goto out;
    if ((uint64_t)hlen > FB_ST_MAX_HEADER) {
        rc = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                     "header of %zu bytes exceeds the limit of %" PRIu64 " bytes", hlen,
                     FB_ST_MAX_HEADER);
        goto out;
    }
    uint64_t total = 8 + (uint64_t)hlen;
    for (size_t i = 0; i < w->n; i++) {
        if (order[i]->nbytes > (uint64_t)SIZE_MAX - total) {
            rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "the tensors do not fit in memory");
            goto out;
        }
        total += order[i]->nbytes;
    }
    buf = malloc((size_t)total);
    if (!buf) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory (%" PRIu64 " bytes)", total);
        goto out;
    }
    st_store_le64(buf, (uint64_t)hlen);
    memcpy(buf + 8, header, hlen);
    size_t at = 8 + hlen;
    for (size_t i = 0; i < w->n; i++) {
        if (order[i]->nbytes) memcpy(buf + at, order[i]->data, (size_t)order[i]->nbytes);
        at += (size_t)order[i]->nbytes;
    }
    *out = buf;
    *out_len = (size_t)total;
    rc = 0;
out:
    free(header);
    free(order);
    return rc;
}

int fb_st_write_buffer(const fb_st_writer *w, void **buf, size_t *len, char *msg, size_t msg_cap)
{
    if (!w || !buf || !len)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_st_write_buffer: NULL argument");
    uint8_t *b = NULL;
    size_t n = 0;
    int rc = st_serialize(w, &b, &n, msg, msg_cap);
    if (rc) return rc;
    *buf = b;
    *len = n;
    return 0;
}

int fb_st_write(const fb_st_writer *w, const char *path, char *msg, size_t msg_cap)
{
    if (!w || !path || !*path)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_st_write: NULL writer or empty path");
    int rc;
    int fd = -1;
    char *tmp = NULL;
    uint8_t *bytes = NULL;
    size_t nbytes = 0;
    size_t tcap = strlen(path) + 32;
    tmp = malloc(tcap);
    if (!tmp) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = st_serialize(w, &bytes, &nbytes, msg, msg_cap)) != 0) goto out;

    snprintf(tmp, tcap, "%s.tmp.%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (st_write_all(fd, bytes, nbytes) != 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
        goto fail;
    }
    if (fsync(fd) != 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot fsync %s: %s", tmp, strerror(errno));
        goto fail;
    }
    int cr = close(fd);
    fd = -1;
    if (cr != 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot close %s: %s", tmp, strerror(errno));
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot rename %s to %s: %s", tmp, path,
                     strerror(errno));
        goto fail;
    }
    rc = st_fsync_dir(path, msg, msg_cap);
    goto out; /* the temporary file is gone: it has become path */

fail:
    if (fd >= 0) close(fd);
    unlink(tmp);
out:
    free(bytes);
    free(tmp);
    return rc;
}
