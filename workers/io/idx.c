#include "idx.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <zlib.h>

#define IDX_FIRST_CHUNK ((size_t)1 << 20) /* grow the value buffer from here */
#define IDX_PATH_MAX 4096

size_t fb_idx_type_size(int type)
{
    switch (type) {
    case FB_IDX_U8:
    case FB_IDX_I8:
        return 1;
    case FB_IDX_I16:
        return 2;
    case FB_IDX_I32:
    case FB_IDX_F32:
        return 4;
    case FB_IDX_F64:
        return 8;
    default:
        return 0;
    }
}

/* ------------------------------------------------------------------ sources */

/* Where the bytes come from: a (possibly gzip) file, or memory. */
typedef struct idx_src {
    gzFile gz;
    const uint8_t *mem;
    size_t mem_len, mem_pos;
    const char *name;
} idx_src;

/* zlib's gzerror text is "<path>: <what>"; the messages here name the path
 * themselves. */
static const char *idx_zmsg(const idx_src *s, const char *zmsg)
{
    size_t n = strlen(s->name);
    if (strncmp(zmsg, s->name, n) == 0 && zmsg[n] == ':' && zmsg[n + 1] == ' ') return zmsg + n + 2;
    return zmsg;
}

/* Reads up to n bytes; *got is how many arrived (fewer only at the end). */
static int idx_src_read(idx_src *s, void *dst, size_t n, size_t *got, char *msg, size_t msg_cap)
{
    uint8_t *p = dst;
    size_t have = 0;
    if (!s->gz) {
        size_t left = s->mem_len - s->mem_pos;
        have = n < left ? n : left;
        if (have) memcpy(p, s->mem + s->mem_pos, have);
        s->mem_pos += have;
        *got = have;
        return 0;
    }
    while (have < n) {
        size_t chunk = n - have > (1u << 30) ? (1u << 30) : n - have;
        int r = gzread(s->gz, p + have, (unsigned)chunk);
        if (r < 0) {
            int zerr;
            const char *zmsg = gzerror(s->gz, &zerr);
            if (zerr == Z_ERRNO)
                return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot read %s: %s", s->name,
                               strerror(errno));
            return fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: corrupt gzip stream: %s", s->name,
                           idx_zmsg(s, zmsg));
        }
        if (r == 0) break;
        have += (size_t)r;
    }
    if (have < n) {
        /* zlib reports a gzip stream cut short as a short read plus Z_BUF_ERROR. */
        int zerr;
        const char *zmsg = gzerror(s->gz, &zerr);
        if (zerr == Z_BUF_ERROR)
            return fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: truncated gzip stream: %s", s->name,
                           idx_zmsg(s, zmsg));
        if (zerr != Z_OK)
            return fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: corrupt gzip stream: %s", s->name,
                           idx_zmsg(s, zmsg));
    }
    *got = have;
    return 0;
}

/* Reverses each value's bytes: IDX is big-endian. */
static void idx_to_host(uint8_t *p, size_t nbytes, size_t esz)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    (void)p, (void)nbytes, (void)esz;
#else
    if (esz == 1) return;
    for (size_t i = 0; i + esz <= nbytes; i += esz)
        for (size_t a = 0, b = esz - 1; a < b; a++, b--) {
            uint8_t t = p[i + a];
            p[i + a] = p[i + b];
            p[i + b] = t;
        }
#endif
}

static int idx_truncated(const char *src, size_t want, size_t have, char *msg, size_t msg_cap)
{
    return fb_errf(msg, msg_cap, FB_ERR_DATA,
                   "%s: truncated: the header promises %zu bytes of values, the file holds %zu",
                   src, want, have);
}

static int idx_parse(idx_src *s, fb_idx *out, char *msg, size_t msg_cap)
{
    const char *src = s->name;
    uint8_t hdr[4 + 4 * FB_IDX_MAX_DIMS];
    uint8_t *data = NULL;
    size_t got;
    int rc = idx_src_read(s, hdr, 4, &got, msg, msg_cap);
    if (rc) return rc;
    if (got < 4)
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "%s: %zu bytes is too short for an IDX header (4-byte magic)", src, got);
    if (hdr[0] != 0 || hdr[1] != 0)
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "%s: bad magic %02x %02x %02x %02x (an IDX file starts with 00 00, a "
                       "type byte and a dimension count)",
                       src, hdr[0], hdr[1], hdr[2], hdr[3]);
    size_t esz = fb_idx_type_size(hdr[2]);
    if (!esz)
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "%s: unknown IDX type byte 0x%02x (known: 0x08 u8, 0x09 i8, 0x0b i16, "
                       "0x0c i32, 0x0d f32, 0x0e f64)",
                       src, hdr[2]);
    int ndim = hdr[3];
    if (ndim < 1 || ndim > FB_IDX_MAX_DIMS)
        return fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: %d dimensions, expected 1 to %d", src, ndim,
                       FB_IDX_MAX_DIMS);
    if ((rc = idx_src_read(s, hdr + 4, 4 * (size_t)ndim, &got, msg, msg_cap)) != 0) return rc;
    if (got < 4 * (size_t)ndim)
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "%s: header is truncated: %d dimensions need %d bytes, %zu present", src,
                       ndim, 4 * ndim, got);
    int64_t dims[FB_IDX_MAX_DIMS] = {0};
    uint64_t total = esz;
    for (int i = 0; i < ndim; i++) {
        const uint8_t *b = hdr + 4 + 4 * i;
        uint32_t d = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
        if (d == 0 || d > FB_IDX_MAX_DIM)
            return fb_errf(msg, msg_cap, FB_ERR_DATA,
                           "%s: dimension %d is %" PRIu32 ", expected 1 to %d", src, i, d,
                           FB_IDX_MAX_DIM);
        if (total > FB_IDX_MAX_BYTES / d)
            return fb_errf(msg, msg_cap, FB_ERR_DATA,
                           "%s: values would take more than the %" PRIu64 "-byte limit", src,
                           FB_IDX_MAX_BYTES);
        total *= d;
        dims[i] = d;
    }

    size_t want = (size_t)total, have = 0, bcap = 0;
    if (!s->gz && want > s->mem_len - s->mem_pos) /* known short: no allocation */
        return idx_truncated(src, want, s->mem_len - s->mem_pos, msg, msg_cap);
    /* Grow the buffer as bytes arrive, so that a short file claiming a huge
     * shape costs little. */
    while (have < want) {
        if (have == bcap) {
            size_t nc = bcap ? 2 * bcap : IDX_FIRST_CHUNK;
            if (nc > want) nc = want;
            uint8_t *nd = realloc(data, nc);
            if (!nd) {
                rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "%s: out of memory (%zu bytes)", src, nc);
                goto fail;
            }
            data = nd;
            bcap = nc;
        }
        if ((rc = idx_src_read(s, data + have, bcap - have, &got, msg, msg_cap)) != 0) goto fail;
        have += got;
        if (have < bcap) break;
    }
    if (have < want) {
        rc = idx_truncated(src, want, have, msg, msg_cap);
        goto fail;
    }
    uint8_t extra[64];
    if ((rc = idx_src_read(s, extra, sizeof extra, &got, msg, msg_cap)) != 0) goto fail;
    if (got > 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s: trailing bytes after the %zu bytes of values the header promises", src,
                     want);
        goto fail;
    }
    idx_to_host(data, want, esz);

    out->type = (fb_idx_type)hdr[2];
    out->ndim = ndim;
    memcpy(out->dims, dims, sizeof dims);
    out->numel = (int64_t)(want / esz);
    out->data = data;
    out->nbytes = want;
    return 0;

fail:
    free(data);
    return rc;
}

int fb_idx_read(const char *path, fb_idx *out, char *msg, size_t msg_cap)
{
    if (!path || !out) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_idx_read: NULL argument");
    errno = 0;
    gzFile gz = gzopen(path, "rb");
    if (!gz) {
        if (errno == 0) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "%s: out of memory", path);
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    }
    gzbuffer(gz, 1u << 17);
    idx_src s = {.gz = gz, .name = path};
    int rc = idx_parse(&s, out, msg, msg_cap);
    gzclose_r(gz);
    return rc;
}

int fb_idx_parse_buffer(const uint8_t *buf, size_t len, fb_idx *out, char *msg, size_t msg_cap)
{
    if ((!buf && len > 0) || !out)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_idx_parse_buffer: NULL argument");
    idx_src s = {.mem = buf, .mem_len = len, .name = "<buffer>"};
    return idx_parse(&s, out, msg, msg_cap);
}

void fb_idx_free(fb_idx *idx)
{
    if (!idx) return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}

/* ------------------------------------------------------------------ datasets */

int fb_dataset_load_idx(const char *images_path, const char *labels_path, fb_dataset *out,
                        char *msg, size_t msg_cap)
{
    if (!images_path || !labels_path || !out)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_dataset_load_idx: NULL argument");
    fb_idx im = {0}, lb = {0};
    float *x = NULL;
    int32_t *y = NULL;
    int rc = fb_idx_read(images_path, &im, msg, msg_cap);
    if (rc) goto fail;
    if (im.type != FB_IDX_U8 || im.ndim != 3) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s: images must be unsigned bytes (type 0x08) of shape [N, H, W]; the "
                     "file has type 0x%02x and %d dimensions",
                     images_path, (unsigned)im.type, im.ndim);
        goto fail;
    }
    if ((rc = fb_idx_read(labels_path, &lb, msg, msg_cap)) != 0) goto fail;
    if (lb.type != FB_IDX_U8 || lb.ndim != 1) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s: labels must be unsigned bytes (type 0x08) of shape [N]; the file has "
                     "type 0x%02x and %d dimensions",
                     labels_path, (unsigned)lb.type, lb.ndim);
        goto fail;
    }
    if (lb.dims[0] != im.dims[0]) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s holds %" PRId64 " images but %s holds %" PRId64 " labels", images_path,
                     im.dims[0], labels_path, lb.dims[0]);
        goto fail;
    }

    size_t n = (size_t)im.dims[0];
    if (im.nbytes > SIZE_MAX / sizeof *x) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "%s is too large to load here", images_path);
        goto fail;
    }
    x = malloc(im.nbytes * sizeof *x);
    y = malloc(n * sizeof *y);
    if (!x || !y) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory loading %s", images_path);
        goto fail;
    }
    const uint8_t *px = im.data, *py = lb.data;
    for (size_t i = 0; i < im.nbytes; i++)
        x[i] = (float)px[i] / 255.0f;
    int max_label = 0;
    for (size_t i = 0; i < n; i++) {
        y[i] = py[i];
        if (py[i] > max_label) max_label = py[i];
    }

    out->n = (int64_t)n;
    out->C = 1;
    out->H = (int)im.dims[1];
    out->W = (int)im.dims[2];
    out->x = x;
    out->y = y;
    out->n_classes = max_label + 1 < 2 ? 2 : max_label + 1;
    fb_idx_free(&im);
    fb_idx_free(&lb);
    return 0;

fail:
    free(x);
    free(y);
    fb_idx_free(&im);
    fb_idx_free(&lb);
    return rc;
}

static const struct {
    const char *name;
    const char *install_hint;
} idx_known[] = {
    {"fashion-mnist", "install it with `apt-get install dataset-fashion-mnist`"},
    {"mnist", "place the MNIST IDX files there"},
};

static bool idx_is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Finds <dir>/<name>/<prefix>-<kind>-ubyte[.gz]; fills tried[] with both
 * candidates, and path with the one that exists (returns 1) */
static int idx_resolve(char path[IDX_PATH_MAX], char tried[2][IDX_PATH_MAX], const char *dir,
                       const char *name, const char *prefix, const char *kind)
{
    snprintf(tried[0], IDX_PATH_MAX, "%s/%s/%s-%s-ubyte", dir, name, prefix, kind);
    snprintf(tried[1], IDX_PATH_MAX, "%s/%s/%s-%s-ubyte.gz", dir, name, prefix, kind);
    for (int i = 0; i < 2; i++) {
        if (idx_is_file(tried[i])) {
            memcpy(path, tried[i], IDX_PATH_MAX);
            return 1;
        }
    }
    return 0;
}

int fb_dataset_open_named(const char *name, const char *split, const char *data_dir,
                          fb_dataset *out, char *msg, size_t msg_cap)
{
    if (!name || !split || !out)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_dataset_open_named: NULL argument");
    int known = -1;
    for (size_t i = 0; i < sizeof idx_known / sizeof idx_known[0]; i++)
        if (strcmp(name, idx_known[i].name) == 0) known = (int)i;
    if (known < 0)
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "unknown dataset \"%.64s\"; known datasets: fashion-mnist, mnist", name);
    const char *prefix;
    if (strcmp(split, "train") == 0)
        prefix = "train";
    else if (strcmp(split, "test") == 0)
        prefix = "t10k";
    else
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "unknown split \"%.64s\" of dataset %s; known splits: train, test", split,
                       name);
    const char *dir = data_dir;
    if (!dir) {
        dir = getenv(FB_DATASET_DIR_ENV);
        if (!dir || !*dir) dir = FB_DATASET_DEFAULT_DIR;
    }
    if (strlen(dir) > IDX_PATH_MAX - 128)
        return fb_errf(msg, msg_cap, FB_ERR_DATA, "data directory path is too long");

    /* On the heap: six 4 KiB paths are too much for small thread stacks. */
    char *buf = malloc(6 * IDX_PATH_MAX);
    if (!buf) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    char *img = buf, *lab = buf + IDX_PATH_MAX;
    char(*tried_img)[IDX_PATH_MAX] = (char(*)[IDX_PATH_MAX])(buf + 2 * IDX_PATH_MAX);
    char(*tried_lab)[IDX_PATH_MAX] = (char(*)[IDX_PATH_MAX])(buf + 4 * IDX_PATH_MAX);
    int have_img = idx_resolve(img, tried_img, dir, name, prefix, "images-idx3");
    int have_lab = idx_resolve(lab, tried_lab, dir, name, prefix, "labels-idx1");
    int rc;
    if (!have_img || !have_lab) {
        const char(*a)[IDX_PATH_MAX] = have_img ? tried_lab : tried_img;
        const char(*b)[IDX_PATH_MAX] = have_img || have_lab ? NULL : tried_lab;
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "dataset %s (%s split) not found: tried %s, %s%s%s%s%s; %s, or set %s to a "
                     "directory holding %s/",
                     name, split, a[0], a[1], b ? ", " : "", b ? b[0] : "", b ? ", " : "",
                     b ? b[1] : "", idx_known[known].install_hint, FB_DATASET_DIR_ENV, name);
    } else {
        rc = fb_dataset_load_idx(img, lab, out, msg, msg_cap);
    }
    free(buf);
    return rc;
}

void fb_dataset_free(fb_dataset *ds)
{
    if (!ds) return;
    free(ds->x);
    free(ds->y);
    memset(ds, 0, sizeof *ds);
}
