/*
 * IDX reader and dataset loader: round trips on small synthetic files (raw
 * and gzip), every IDX value type, a corruption table that must each be
 * FB_ERR_DATA, dataset name resolution, and, where Debian's
 * dataset-fashion-mnist is installed, the real Fashion-MNIST splits.
 */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "check.h"
#include "idx.h"

static char g_dir[256];
static char g_msg[1024];

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

/* Serialises an IDX file: header for type/dims, then body bytes as given
 * (already big-endian), then extra trailing bytes. */
static uint8_t *idx_bytes(int type, int ndim, const uint32_t *dims, const void *body,
                          size_t body_len, size_t extra, size_t *len)
{
    *len = 4 + 4 * (size_t)ndim + body_len + extra;
    uint8_t *b = calloc(*len + 1, 1);
    CHECK(b != NULL);
    b[2] = (uint8_t)type;
    b[3] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) {
        b[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
        b[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
        b[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
        b[7 + 4 * i] = (uint8_t)dims[i];
    }
    if (body_len) memcpy(b + 4 + 4 * ndim, body, body_len);
    for (size_t i = 0; i < extra; i++)
        b[4 + 4 * ndim + body_len + i] = 0xAB;
    return b;
}

static void write_file(const char *path, const uint8_t *buf, size_t len, int gz)
{
    if (gz) {
        gzFile f = gzopen(path, "wb");
        CHECK(f != NULL);
        if (len) CHECK_INT_EQ(gzwrite(f, buf, (unsigned)len), (long long)len);
        CHECK_INT_EQ(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        if (len) CHECK(fwrite(buf, 1, len, f) == len);
        CHECK(fclose(f) == 0);
    }
}

static void write_idx(const char *path, int gz, int type, int ndim, const uint32_t *dims,
                      const void *body, size_t body_len, size_t extra)
{
    size_t len;
    uint8_t *b = idx_bytes(type, ndim, dims, body, body_len, extra, &len);
    write_file(path, b, len, gz);
    free(b);
}

/* The synthetic split: 5 images of 3x4 and their labels. */
#define SN 5
#define SH 3
#define SW 4
static uint8_t g_px[SN * SH * SW];
static const uint8_t g_lab[SN] = {0, 3, 1, 3, 2};

static void write_split(const char *dir_name, const char *prefix, int gz_images, int gz_labels)
{
    char p[400];
    uint32_t di[3] = {SN, SH, SW}, dl[1] = {SN};
    snprintf(p, sizeof p, "%s/%s/%s-images-idx3-ubyte%s", g_dir, dir_name, prefix,
             gz_images ? ".gz" : "");
    write_idx(p, gz_images, 0x08, 3, di, g_px, sizeof g_px, 0);
    snprintf(p, sizeof p, "%s/%s/%s-labels-idx1-ubyte%s", g_dir, dir_name, prefix,
             gz_labels ? ".gz" : "");
    write_idx(p, gz_labels, 0x08, 1, dl, g_lab, sizeof g_lab, 0);
}

static void check_split(const fb_dataset *ds)
{
    CHECK_INT_EQ(ds->n, SN);
    CHECK_INT_EQ(ds->C, 1);
    CHECK_INT_EQ(ds->H, SH);
    CHECK_INT_EQ(ds->W, SW);
    CHECK_INT_EQ(ds->n_classes, 4);
    for (int i = 0; i < SN * SH * SW; i++)
        CHECK(ds->x[i] == (float)g_px[i] / 255.0f);
    for (int i = 0; i < SN; i++)
        CHECK_INT_EQ(ds->y[i], g_lab[i]);
    CHECK(ds->x[0] == 0.0f);
}

static void test_round_trip(void)
{
    for (int i = 0; i < SN * SH * SW; i++)
        g_px[i] = (uint8_t)(i * 37 % 256);
    g_px[7] = 255;
    uint32_t di[3] = {SN, SH, SW};
    char p[300];

    for (int gz = 0; gz < 2; gz++) {
        path_in(p, sizeof p, gz ? "img.gz" : "img");
        write_idx(p, gz, 0x08, 3, di, g_px, sizeof g_px, 0);
        fb_idx idx;
        int rc = fb_idx_read(p, &idx, g_msg, sizeof g_msg);
        if (rc) fprintf(stderr, "%s\n", g_msg);
        CHECK_INT_EQ(rc, 0);
        CHECK_INT_EQ(idx.type, FB_IDX_U8);
        CHECK_INT_EQ(idx.ndim, 3);
        CHECK_INT_EQ(idx.dims[0], SN);
        CHECK_INT_EQ(idx.dims[1], SH);
        CHECK_INT_EQ(idx.dims[2], SW);
        CHECK_INT_EQ(idx.numel, SN * SH * SW);
        CHECK_INT_EQ(idx.nbytes, sizeof g_px);
        CHECK(memcmp(idx.data, g_px, sizeof g_px) == 0);
        fb_idx_free(&idx);
        CHECK(idx.data == NULL);
        unlink(p);
    }
    fb_idx_free(NULL);

    /* Multi-byte types are big-endian in the file, host order in memory. */
    {
        uint32_t d1[1] = {3}, d2[2] = {1, 2};
        uint8_t i16[6] = {0xFF, 0xFE, 0x00, 0x01, 0x80, 0x00}; /* -2, 1, -32768 */
        uint8_t i32[12] = {0xFF, 0xFF, 0xFF, 0xFF, 0x00, 0x01, 0x00, 0x00, 0x7F, 0xFF, 0xFF, 0xFF};
        uint8_t f32[8] = {0x3F, 0x80, 0x00, 0x00, 0xC0, 0x20, 0x00, 0x00}; /* 1.0, -2.5 */
        uint8_t f64[8] = {0x40, 0x09, 0x21, 0xFB, 0x54, 0x44, 0x2D, 0x18}; /* pi */
        uint8_t i8[3] = {0x80, 0x7F, 0x00};
        fb_idx idx;
        size_t len;
        uint8_t *b = idx_bytes(0x0B, 1, d1, i16, sizeof i16, 0, &len);
        CHECK_INT_EQ(fb_idx_parse_buffer(b, len, &idx, g_msg, sizeof g_msg), 0);
        const int16_t *v16 = idx.data;
        CHECK(v16[0] == -2 && v16[1] == 1 && v16[2] == -32768);
        fb_idx_free(&idx);
        free(b);
        b = idx_bytes(0x0C, 1, d1, i32, sizeof i32, 0, &len);
        CHECK_INT_EQ(fb_idx_parse_buffer(b, len, &idx, g_msg, sizeof g_msg), 0);
        const int32_t *v32 = idx.data;
        CHECK(v32[0] == -1 && v32[1] == 65536 && v32[2] == INT32_MAX);
        fb_idx_free(&idx);
        free(b);
        b = idx_bytes(0x0D, 2, d2, f32, sizeof f32, 0, &len);
        CHECK_INT_EQ(fb_idx_parse_buffer(b, len, &idx, g_msg, sizeof g_msg), 0);
        const float *vf = idx.data;
        CHECK_INT_EQ(idx.ndim, 2);
        CHECK(vf[0] == 1.0f && vf[1] == -2.5f);
        fb_idx_free(&idx);
        free(b);
        uint32_t d11[1] = {1};
        b = idx_bytes(0x0E, 1, d11, f64, sizeof f64, 0, &len);
        CHECK_INT_EQ(fb_idx_parse_buffer(b, len, &idx, g_msg, sizeof g_msg), 0);
        CHECK(*(const double *)idx.data == 3.141592653589793);
        fb_idx_free(&idx);
        free(b);
        b = idx_bytes(0x09, 1, d1, i8, sizeof i8, 0, &len);
        CHECK_INT_EQ(fb_idx_parse_buffer(b, len, &idx, g_msg, sizeof g_msg), 0);
        const int8_t *v8 = idx.data;
        CHECK(v8[0] == -128 && v8[1] == 127 && v8[2] == 0);
        CHECK_INT_EQ(fb_idx_type_size(0x0E), 8);
        CHECK_INT_EQ(fb_idx_type_size(0x0A), 0);
        fb_idx_free(&idx);
        free(b);
    }

    /* The dataset loader on raw, gzip and mixed files. */
    char sub[300];
    path_in(sub, sizeof sub, "syn");
    CHECK(mkdir(sub, 0755) == 0);
    for (int mode = 0; mode < 3; mode++) {
        write_split("syn", "train", mode == 1, mode >= 1);
        char im[400], lb[400];
        snprintf(im, sizeof im, "%s/syn/train-images-idx3-ubyte%s", g_dir, mode == 1 ? ".gz" : "");
        snprintf(lb, sizeof lb, "%s/syn/train-labels-idx1-ubyte%s", g_dir, mode >= 1 ? ".gz" : "");
        fb_dataset ds;
        int rc = fb_dataset_load_idx(im, lb, &ds, g_msg, sizeof g_msg);
        if (rc) fprintf(stderr, "%s\n", g_msg);
        CHECK_INT_EQ(rc, 0);
        check_split(&ds);
        fb_dataset_free(&ds);
        CHECK(ds.x == NULL && ds.y == NULL && ds.n == 0);
        unlink(im);
        unlink(lb);
    }
    fb_dataset_free(NULL);

    /* All labels zero still gives two classes. */
    uint32_t dl[1] = {SN}, di3[3] = {SN, SH, SW};
    uint8_t zeros[SN] = {0};
    char im[300], lb[300];
    path_in(im, sizeof im, "z-images");
    path_in(lb, sizeof lb, "z-labels");
    write_idx(im, 0, 0x08, 3, di3, g_px, sizeof g_px, 0);
    write_idx(lb, 0, 0x08, 1, dl, zeros, sizeof zeros, 0);
    fb_dataset ds;
    CHECK_INT_EQ(fb_dataset_load_idx(im, lb, &ds, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(ds.n_classes, 2);
    fb_dataset_free(&ds);
    unlink(im);
    unlink(lb);
    CHECK(rmdir(sub) == 0);
}

/* ------------------------------------------------------------ corruption */

typedef struct bad_idx {
    const char *what;
    int type, ndim;
    uint32_t dims[5];
    size_t body_len; /* bytes of body actually present */
    size_t extra;    /* trailing bytes */
    size_t cut;      /* nonzero: keep only this many bytes of the file */
    uint8_t magic0;  /* first byte */
    const char *expect;
} bad_idx;

static const bad_idx bad_cases[] = {
    {"bad magic", 0x08, 1, {4}, 4, 0, 0, 0x01, "bad magic"},
    {"bad type byte", 0x07, 1, {4}, 4, 0, 0, 0, "type byte 0x07"},
    {"type 0x0a", 0x0A, 1, {4}, 4, 0, 0, 0, "type byte 0x0a"},
    {"zero dimensions", 0x08, 0, {0}, 0, 0, 0, 0, "0 dimensions"},
    {"five dimensions", 0x08, 5, {1, 1, 1, 1, 1}, 1, 0, 0, 0, "5 dimensions"},
    {"zero dim", 0x08, 2, {3, 0}, 0, 0, 0, 0, "dimension 1 is 0"},
    {"dim above limit", 0x08, 1, {0x80000000u}, 0, 0, 0, 0, "dimension 0 is 2147483648"},
    {"over 1 GiB", 0x08, 2, {65536, 65536}, 0, 0, 0, 0, "limit"},
    {"over 1 GiB by type size", 0x0E, 1, {(1u << 27) + 1}, 0, 0, 0, 0, "limit"},
    {"truncated data", 0x08, 2, {4, 4}, 10, 0, 0, 0, "truncated"},
    {"trailing bytes", 0x08, 2, {2, 2}, 4, 3, 0, 0, "trailing bytes"},
    {"truncated dims", 0x08, 3, {2, 2, 2}, 8, 0, 9, 0, "header is truncated"},
    {"too short for magic", 0x08, 1, {1}, 1, 0, 3, 0, "too short"},
    {"empty file", 0x08, 1, {1}, 1, 0, (size_t)-1, 0, "too short"},
};

static void test_corruption(void)
{
    char p[300];
    size_t n_cases = sizeof bad_cases / sizeof bad_cases[0];
    uint8_t body[64];
    for (size_t i = 0; i < sizeof body; i++)
        body[i] = (uint8_t)i;
    for (size_t i = 0; i < n_cases; i++) {
        const bad_idx *c = &bad_cases[i];
        size_t len;
        uint8_t *b = idx_bytes(c->type, c->ndim, c->dims, body, c->body_len, c->extra, &len);
        b[0] = c->magic0;
        if (c->cut == (size_t)-1)
            len = 0;
        else if (c->cut)
            len = c->cut;
        for (int gz = 0; gz < 3; gz++) {
            fb_idx idx = {.ndim = -9};
            g_msg[0] = '\0';
            int rc;
            if (gz == 2) {
                rc = fb_idx_parse_buffer(b, len, &idx, g_msg, sizeof g_msg);
            } else {
                path_in(p, sizeof p, gz ? "bad.gz" : "bad");
                write_file(p, b, len, gz);
                rc = fb_idx_read(p, &idx, g_msg, sizeof g_msg);
                unlink(p);
            }
            if (gz == 0) printf("  %-24s -> %s: %s\n", c->what, fb_err_code(rc), g_msg);
            if (rc != FB_ERR_DATA || !strstr(g_msg, c->expect)) {
                fprintf(stderr, "case \"%s\" (%s): rc %d, message \"%s\", expected \"%s\"\n",
                        c->what,
                        gz == 2 ? "buffer"
                        : gz    ? "gzip"
                                : "raw",
                        rc, g_msg, c->expect);
                CHECK(0);
            }
            CHECK(idx.ndim == -9 && idx.data == NULL);
        }
        free(b);
    }

    /* gzip-level damage: a cut stream, and flipped compressed bytes. */
    uint32_t d[2] = {64, 64};
    uint8_t big[64 * 64];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 7 + i / 64);
    path_in(p, sizeof p, "gz.gz");
    write_idx(p, 1, 0x08, 2, d, big, sizeof big, 0);
    FILE *f = fopen(p, "rb");
    CHECK(f != NULL);
    uint8_t comp[8192];
    size_t clen = fread(comp, 1, sizeof comp, f);
    fclose(f);
    CHECK(clen > 40 && clen < sizeof comp);
    fb_idx idx = {.ndim = -9};
    write_file(p, comp, clen / 2, 0);
    CHECK_INT_EQ(fb_idx_read(p, &idx, g_msg, sizeof g_msg), FB_ERR_DATA);
    printf("  %-24s -> %s\n", "gzip cut in half", g_msg);
    write_file(p, comp, clen - 4, 0); /* length field of the trailer missing */
    CHECK_INT_EQ(fb_idx_read(p, &idx, g_msg, sizeof g_msg), FB_ERR_DATA);
    printf("  %-24s -> %s\n", "gzip trailer cut", g_msg);
    comp[clen - 8] ^= 0x55; /* CRC of the trailer */
    write_file(p, comp, clen, 0);
    CHECK_INT_EQ(fb_idx_read(p, &idx, g_msg, sizeof g_msg), FB_ERR_DATA);
    printf("  %-24s -> %s\n", "gzip bad CRC", g_msg);
    comp[clen - 8] ^= 0x55;
    for (size_t i = 20; i < 40; i++)
        comp[i] ^= 0xFF;
    write_file(p, comp, clen, 0);
    CHECK_INT_EQ(fb_idx_read(p, &idx, g_msg, sizeof g_msg), FB_ERR_DATA);
    printf("  %-24s -> %s\n", "gzip corrupt deflate", g_msg);
    CHECK(idx.ndim == -9 && idx.data == NULL);
    unlink(p);

    /* A missing file is an OS error. */
    path_in(p, sizeof p, "absent");
    CHECK_INT_EQ(fb_idx_read(p, &idx, g_msg, sizeof g_msg), FB_ERR_IO);
    CHECK(strstr(g_msg, p) != NULL);

    /* Dataset-level mismatches: counts, ranks, types. */
    uint32_t di[3] = {SN, SH, SW}, dl[1] = {SN}, dl4[1] = {SN - 1}, d2[2] = {SN, SH * SW};
    char im[300], lb[300], im2[300], lb4[300], lb32[300];
    path_in(im, sizeof im, "images");
    path_in(lb, sizeof lb, "labels");
    path_in(im2, sizeof im2, "images2d");
    path_in(lb4, sizeof lb4, "labels4");
    path_in(lb32, sizeof lb32, "labels32");
    write_idx(im, 0, 0x08, 3, di, g_px, sizeof g_px, 0);
    write_idx(lb, 0, 0x08, 1, dl, g_lab, sizeof g_lab, 0);
    write_idx(im2, 0, 0x08, 2, d2, g_px, sizeof g_px, 0);
    write_idx(lb4, 0, 0x08, 1, dl4, g_lab, SN - 1, 0);
    uint8_t lab32[4 * SN] = {0};
    write_idx(lb32, 0, 0x0C, 1, dl, lab32, sizeof lab32, 0);
    struct {
        const char *what, *im, *lb, *expect;
        int rc;
    } ds_cases[] = {
        {"label/image count mismatch", im, lb4, "holds 5 images but", FB_ERR_DATA},
        {"images not 3-D", im2, lb, "[N, H, W]", FB_ERR_DATA},
        {"labels not u8", im, lb32, "labels must be unsigned bytes", FB_ERR_DATA},
        {"labels missing", im, p, "cannot open", FB_ERR_IO},
        {"images are labels", lb, lb, "[N, H, W]", FB_ERR_DATA},
    };
    for (size_t i = 0; i < sizeof ds_cases / sizeof ds_cases[0]; i++) {
        fb_dataset ds = {.n = -3};
        int rc = fb_dataset_load_idx(ds_cases[i].im, ds_cases[i].lb, &ds, g_msg, sizeof g_msg);
        printf("  %-24s -> %s: %s\n", ds_cases[i].what, fb_err_code(rc), g_msg);
        CHECK_INT_EQ(rc, ds_cases[i].rc);
        CHECK(strstr(g_msg, ds_cases[i].expect) != NULL);
        CHECK(ds.n == -3 && ds.x == NULL && ds.y == NULL);
    }
    unlink(im);
    unlink(lb);
    unlink(im2);
    unlink(lb4);
    unlink(lb32);
    printf("corruption table: %zu IDX cases x 3 sources, 4 gzip, %zu dataset cases rejected\n",
           n_cases, sizeof ds_cases / sizeof ds_cases[0]);
}

/* Every strict prefix and every single-byte header mutation of a valid file
 * is handled without crashing; prefixes are always rejected. */
static void test_mutations(void)
{
    uint32_t di[3] = {SN, SH, SW};
    size_t len;
    uint8_t *b = idx_bytes(0x08, 3, di, g_px, sizeof g_px, 0, &len);
    fb_idx idx;
    for (size_t cut = 0; cut < len; cut++)
        CHECK_INT_EQ(fb_idx_parse_buffer(b, cut, &idx, g_msg, sizeof g_msg), FB_ERR_DATA);
    uint8_t *m = malloc(len);
    CHECK(m != NULL);
    for (size_t pos = 0; pos < 16; pos++) {
        for (int v = 0; v < 256; v++) {
            memcpy(m, b, len);
            m[pos] = (uint8_t)v;
            int rc = fb_idx_parse_buffer(m, len, &idx, g_msg, sizeof g_msg);
            if (rc == 0) {
                CHECK(idx.nbytes == len - 4 - 4 * (size_t)idx.ndim);
                fb_idx_free(&idx);
            } else {
                CHECK_INT_EQ(rc, FB_ERR_DATA);
            }
        }
    }
    free(m);
    free(b);
}

/* ------------------------------------------------------------ named datasets */

static void test_named(void)
{
    char sub[300];
    path_in(sub, sizeof sub, "fashion-mnist");
    CHECK(mkdir(sub, 0755) == 0);
    write_split("fashion-mnist", "train", 1, 0); /* gzip images, raw labels */

    fb_dataset ds;
    int rc = fb_dataset_open_named("fashion-mnist", "train", g_dir, &ds, g_msg, sizeof g_msg);
    if (rc) fprintf(stderr, "%s\n", g_msg);
    CHECK_INT_EQ(rc, 0);
    check_split(&ds);
    fb_dataset_free(&ds);

    /* data_dir NULL: the environment variable decides. */
    CHECK(setenv(FB_DATASET_DIR_ENV, g_dir, 1) == 0);
    CHECK_INT_EQ(fb_dataset_open_named("fashion-mnist", "train", NULL, &ds, g_msg, sizeof g_msg),
                 0);
    check_split(&ds);
    fb_dataset_free(&ds);

    /* Missing split: names the paths tried and how to install. */
    fb_dataset keep = {.n = -3};
    CHECK_INT_EQ(fb_dataset_open_named("fashion-mnist", "test", NULL, &keep, g_msg, sizeof g_msg),
                 FB_ERR_DATA);
    printf("  missing split -> %s\n", g_msg);
    CHECK(strstr(g_msg, "fashion-mnist/t10k-images-idx3-ubyte") != NULL);
    CHECK(strstr(g_msg, "t10k-images-idx3-ubyte.gz") != NULL);
    CHECK(strstr(g_msg, "t10k-labels-idx1-ubyte") != NULL);
    CHECK(strstr(g_msg, "apt-get install dataset-fashion-mnist") != NULL);
    CHECK(keep.n == -3);
    CHECK(unsetenv(FB_DATASET_DIR_ENV) == 0);

    /* Images present, labels missing: names the labels paths. */
    char lb[400];
    snprintf(lb, sizeof lb, "%s/fashion-mnist/train-labels-idx1-ubyte", g_dir);
    CHECK(unlink(lb) == 0);
    CHECK_INT_EQ(fb_dataset_open_named("fashion-mnist", "train", g_dir, &keep, g_msg, sizeof g_msg),
                 FB_ERR_DATA);
    CHECK(strstr(g_msg, "train-labels-idx1-ubyte.gz") != NULL);
    CHECK(keep.n == -3);

    CHECK_INT_EQ(fb_dataset_open_named("cifar10", "train", g_dir, &keep, g_msg, sizeof g_msg),
                 FB_ERR_DATA);
    printf("  unknown name -> %s\n", g_msg);
    CHECK(strstr(g_msg, "cifar10") != NULL && strstr(g_msg, "fashion-mnist") != NULL &&
          strstr(g_msg, "mnist") != NULL);
    CHECK_INT_EQ(fb_dataset_open_named("fashion-mnist", "val", g_dir, &keep, g_msg, sizeof g_msg),
                 FB_ERR_DATA);
    CHECK(strstr(g_msg, "train, test") != NULL);
    CHECK_INT_EQ(
        fb_dataset_open_named("../fashion-mnist", "train", g_dir, &keep, g_msg, sizeof g_msg),
        FB_ERR_DATA);
    CHECK(keep.n == -3);

    /* mnist resolves under its own directory. */
    path_in(sub, sizeof sub, "mnist");
    CHECK(mkdir(sub, 0755) == 0);
    write_split("mnist", "t10k", 0, 1);
    CHECK_INT_EQ(fb_dataset_open_named("mnist", "test", g_dir, &ds, g_msg, sizeof g_msg), 0);
    check_split(&ds);
    fb_dataset_free(&ds);

    char p[400];
    const char *files[] = {"fashion-mnist/train-images-idx3-ubyte.gz",
                           "mnist/t10k-images-idx3-ubyte", "mnist/t10k-labels-idx1-ubyte.gz"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, files[i]);
        CHECK(unlink(p) == 0);
    }
    path_in(sub, sizeof sub, "mnist");
    CHECK(rmdir(sub) == 0);
    path_in(sub, sizeof sub, "fashion-mnist");
    CHECK(rmdir(sub) == 0);
}

/* Returns 1 when the real data was checked, 0 when it is not installed. */
static int test_real_fashion_mnist(void)
{
    struct stat st;
    if (stat(FB_DATASET_DEFAULT_DIR "/fashion-mnist", &st) != 0 || !S_ISDIR(st.st_mode)) {
        fb_test_missing("real Fashion-MNIST: %s/fashion-mnist not installed "
                        "(apt-get install dataset-fashion-mnist)",
                        FB_DATASET_DEFAULT_DIR);
        return 0;
    }
    static const struct {
        const char *split;
        int64_t n;
        int first_labels[5];
        double mean;
    } splits[] = {
        {"train", 60000, {9, 0, 0, 3, 0}, 0.2860406},
        {"test", 10000, {9, 2, 1, 1, 6}, 0.2868493},
    };
    for (int s = 0; s < 2; s++) {
        fb_dataset ds;
        int rc = fb_dataset_open_named("fashion-mnist", splits[s].split, FB_DATASET_DEFAULT_DIR,
                                       &ds, g_msg, sizeof g_msg);
        if (rc) fprintf(stderr, "%s\n", g_msg);
        CHECK_INT_EQ(rc, 0);
        CHECK_INT_EQ(ds.n, splits[s].n);
        CHECK_INT_EQ(ds.C, 1);
        CHECK_INT_EQ(ds.H, 28);
        CHECK_INT_EQ(ds.W, 28);
        CHECK_INT_EQ(ds.n_classes, 10);
        int64_t counts[10] = {0};
        for (int64_t i = 0; i < ds.n; i++) {
            CHECK(ds.y[i] >= 0 && ds.y[i] < 10);
            counts[ds.y[i]]++;
        }
        for (int c = 0; c < 10; c++)
            CHECK_INT_EQ(counts[c], ds.n / 10); /* balanced: 6000 / 1000 per class */
        for (int i = 0; i < 5; i++)
            CHECK_INT_EQ(ds.y[i], splits[s].first_labels[i]);
        double sum = 0;
        float lo = 1, hi = 0;
        size_t nx = (size_t)ds.n * 28 * 28;
        for (size_t i = 0; i < nx; i++) {
            sum += ds.x[i];
            lo = ds.x[i] < lo ? ds.x[i] : lo;
            hi = ds.x[i] > hi ? ds.x[i] : hi;
        }
        CHECK(lo == 0.0f && hi == 1.0f);
        CHECK_NEAR(sum / (double)nx, splits[s].mean, 1e-5);
        printf("real Fashion-MNIST %s: n=%" PRId64 " 28x28, 10 balanced classes, mean %.5f\n",
               splits[s].split, ds.n, sum / (double)nx);
        fb_dataset_free(&ds);
    }
    return 1;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* keep order with stderr in logs */
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/fb_test_idx.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    CHECK(mkdtemp(g_dir) != NULL);

    test_round_trip();
    test_corruption();
    test_mutations();
    test_named();
    int real = test_real_fashion_mnist();

    CHECK(rmdir(g_dir) == 0);
    printf("test_idx: ok%s\n", real ? "" : " (real Fashion-MNIST part skipped)");
    return 0;
}
