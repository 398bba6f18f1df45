/*
 * Helpers shared by the data tests: scratch directories, whole-file reads
 * and writes, in-place byte edits of shard files, and a synthetic dataset
 * whose float32 samples carry their own record index, so that any sample a
 * loader delivers says exactly which record it is.
 */
#ifndef FB_TESTS_DATA_UTIL_H
#define FB_TESTS_DATA_UTIL_H

#include "check.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "datadir.h"
#include "loader.h"
#include "manifest_file.h"
#include "shard.h"

/* Creates a fresh scratch directory under $TMPDIR (or /tmp) into buf. */
static inline void du_scratch(char *buf, size_t cap, const char *tag)
{
    const char *t = getenv("TMPDIR");
    snprintf(buf, cap, "%s/fbdata-%s-XXXXXX", t && *t ? t : "/tmp", tag);
    CHECK(mkdtemp(buf) != NULL);
}

/* rm -rf path (files and directories below it). */
static inline void du_rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *de;
            while ((de = readdir(d)) != NULL) {
                if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
                char sub[4096];
                snprintf(sub, sizeof sub, "%s/%s", path, de->d_name);
                du_rm_rf(sub);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

static inline uint8_t *du_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    CHECK(n >= 0);
    rewind(f);
    uint8_t *b = malloc((size_t)n + 1);
    CHECK(b != NULL);
    CHECK(fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

static inline void du_write(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (len) CHECK(fwrite(buf, 1, len, f) == len);
    CHECK(fclose(f) == 0);
}

static inline void du_copy(const char *dst, const char *src)
{
    size_t len;
    uint8_t *b = du_read(src, &len);
    du_write(dst, b, len);
    free(b);
}

/* XORs byte at offset off of the file with x. */
static inline void du_flip(const char *path, uint64_t off, uint8_t x)
{
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    uint8_t b;
    CHECK(pread(fd, &b, 1, (off_t)off) == 1);
    b ^= x;
    CHECK(pwrite(fd, &b, 1, (off_t)off) == 1);
    close(fd);
}

static inline bool du_contains(const char *hay, const char *needle)
{
    return hay && strstr(hay, needle) != NULL;
}

#define CHECK_CONTAINS(hay, needle)                                                                \
    do {                                                                                           \
        const char *h_ = (hay), *n_ = (needle);                                                    \
        if (!du_contains(h_, n_)) {                                                                \
            fprintf(stderr, "%s:%d: expected \"%s\" in \"%s\"\n", __FILE__, __LINE__, n_,          \
                    h_ ? h_ : "(null)");                                                           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/*
 * Imports an "index" dataset of n records into dir/split: float32 samples
 * of shape [2], sample i = {i, -i}, label i % classes.  chunk and shard give
 * records per chunk and per shard.
 */
static inline void du_make_index_dataset(const char *dir, const char *split, int64_t n,
                                         int classes, int64_t chunk, int64_t shard)
{
    float *x = malloc((size_t)n * 2 * sizeof *x);
    int32_t *y = malloc((size_t)n * sizeof *y);
    CHECK(x && y);
    for (int64_t i = 0; i < n; i++) {
        x[2 * i] = (float)i;
        x[2 * i + 1] = -(float)i;
        y[i] = (int32_t)(i % classes);
    }
    int64_t shape[1] = {2};
    fb_import_opts o = {.out_dir = dir, .name = "index", .split = split, .chunk_records = chunk,
                        .shard_records = shard, .level = 1};
    char msg[1024];
    int rc = fb_datadir_import(NULL, &o, FB_DTYPE_F32, 1, shape, x, y, n, msg, sizeof msg);
    if (rc) fprintf(stderr, "import: %s\n", msg);
    CHECK_INT_EQ(rc, 0);
    free(x);
    free(y);
}

static inline double du_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
