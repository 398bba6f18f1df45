/*
 * The staging cache: copy + verify on first use, verify on every later use,
 * least-recently-used eviction under a byte bound, one flock around it all.
 */
#include "stage.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "crc32c.h"
#include "shard.h"

#define STAGE_BLOCK ((size_t)1 << 20)
#define STAGE_NAME_MAX 320

typedef struct stage_entry {
    char file[STAGE_NAME_MAX];
    uint64_t bytes;
    uint64_t last_used;
    bool pinned; /* part of the split being staged: never evicted by it */
} stage_entry;

typedef struct stage_index {
    stage_entry *e;
    size_t n, cap;
    uint64_t clock;
} stage_index;

static double stage_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static stage_entry *idx_find(stage_index *ix, const char *file)
{
    for (size_t i = 0; i < ix->n; i++)
        if (strcmp(ix->e[i].file, file) == 0) return &ix->e[i];
    return NULL;
}

static stage_entry *idx_add(stage_index *ix, const char *file, uint64_t bytes, uint64_t used)
{
    if (ix->n == ix->cap) {
        size_t nc = ix->cap ? 2 * ix->cap : 16;
        stage_entry *ne = realloc(ix->e, nc * sizeof *ne);
        if (!ne) return NULL;
        ix->e = ne;
        ix->cap = nc;
    }
    stage_entry *e = &ix->e[ix->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->file, sizeof e->file, "%s", file);
    e->bytes = bytes;
    e->last_used = used;
    return e;
}

static void idx_remove(stage_index *ix, stage_entry *e)
{
    size_t i = (size_t)(e - ix->e);
    ix->e[i] = ix->e[--ix->n];
}

/* A cache file name: "<8 hex>-<decimal bytes>-<name>" with a plain name. */
static int entry_name_ok(const char *f)
{
    size_t n = strlen(f);
    if (n < 12 || n >= STAGE_NAME_MAX || f[8] != '-') return 0;
    for (int i = 0; i < 8; i++)
        if (!((f[i] >= '0' && f[i] <= '9') || (f[i] >= 'a' && f[i] <= 'f'))) return 0;
    size_t i = 9;
    while (i < n && f[i] >= '0' && f[i] <= '9') i++;
    if (i == 9 || i >= n || f[i] != '-' || i + 1 >= n) return 0;
    if (strstr(f, ".tmp.")) return 0;
    for (; i < n; i++)
        if (!((f[i] >= 'a' && f[i] <= 'z') || (f[i] >= 'A' && f[i] <= 'Z') ||
              (f[i] >= '0' && f[i] <= '9') || f[i] == '.' || f[i] == '_' || f[i] == '-'))
            return 0;
    return 1;
}

/* Loads index.json, then reconciles it with the directory: entries whose
 * file is gone are dropped, files the index does not know (a crash between
 * copy and index update) are adopted as least recently used, and leftover
 * temporary files are removed.  A missing or corrupt index is not an error. */
static int idx_load(stage_index *ix, const char *dir, bool repair, char *msg, size_t msg_cap)
{
    char path[FB_STAGE_PATH_MAX + STAGE_NAME_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, FB_STAGE_INDEX);
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, NULL);
    if (root && json_is_object(root)) {
        json_t *clock = json_object_get(root, "clock"), *arr = json_object_get(root, "entries");
        if (json_is_integer(clock) && json_integer_value(clock) >= 0)
            ix->clock = (uint64_t)json_integer_value(clock);
        size_t i;
        json_t *o;
        if (json_is_array(arr)) json_array_foreach(arr, i, o) {
                const char *f = json_string_value(json_object_get(o, "file"));
                json_t *b = json_object_get(o, "bytes"), *u = json_object_get(o, "last_used");
                if (!f || !entry_name_ok(f) || !json_is_integer(b) || !json_is_integer(u) ||
                    json_integer_value(b) < 0 || json_integer_value(u) < 0 || idx_find(ix, f))
                    continue;
                if (!idx_add(ix, f, (uint64_t)json_integer_value(b),
                             (uint64_t)json_integer_value(u))) {
                    json_decref(root);
                    return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
                }
            }
    }
    json_decref(root);
    /* drop entries without a file of their size */
    for (size_t i = 0; i < ix->n;) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, ix->e[i].file);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) ||
            (uint64_t)st.st_size != ix->e[i].bytes) {
            if (repair) unlink(path);
            ix->e[i] = ix->e[--ix->n];
        } else {
            i++;
        }
    }
    DIR *d = opendir(dir);
    if (!d) return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot list %s: %s", dir, strerror(errno));
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d)) != NULL) {
        const char *f = de->d_name;
        if (f[0] == '.' || strcmp(f, FB_STAGE_INDEX) == 0 || strcmp(f, "lock") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, f);
        if (strstr(f, ".tmp.")) {
            if (repair) unlink(path);
            continue;
        }
        if (!entry_name_ok(f) || idx_find(ix, f)) continue;
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (!idx_add(ix, f, (uint64_t)st.st_size, 0)) {
            rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
            break;
        }
    }
    closedir(d);
    return rc;
}

static int idx_save(const stage_index *ix, const char *dir, char *msg, size_t msg_cap)
{
    char path[FB_STAGE_PATH_MAX + 64], tmp[FB_STAGE_PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/%s", dir, FB_STAGE_INDEX);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    json_t *arr = json_array();
    for (size_t i = 0; i < ix->n; i++)
        json_array_append_new(arr, json_pack("{s:s, s:I, s:I}", "file", ix->e[i].file, "bytes",
                                             (json_int_t)ix->e[i].bytes, "last_used",
                                             (json_int_t)ix->e[i].last_used));
    json_t *root = json_pack("{s:i, s:I, s:o}", "version", 1, "clock", (json_int_t)ix->clock,
                             "entries", arr);
    if (!root) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    int rc = json_dump_file(root, tmp, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(root);
    if (rc != 0) {
        unlink(tmp);
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot write %s", tmp);
    }
    int fd = open(tmp, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot rename %s: %s", tmp, strerror(errno));
    }
    return 0;
}

static int mkdir_p(const char *dir, char *msg, size_t msg_cap)
{
    char p[FB_STAGE_PATH_MAX];
    if ((size_t)snprintf(p, sizeof p, "%s", dir) >= sizeof p)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cache directory path is too long");
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot create %s: %s", p, strerror(errno));
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot create %s: %s", p, strerror(errno));
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
        return fb_errf(msg, msg_cap, FB_ERR_IO, "%s is not a directory", p);
    return 0;
}

/* Copies src to dst (through a temporary name, fsynced) and checks that the
 * copied bytes are the manifest's: size and CRC32C. */
static int stage_copy(const char *src, const char *dst, const fb_manifest_shard *sh, uint8_t *buf,
                      char *msg, size_t msg_cap)
{
    char tmp[FB_STAGE_PATH_MAX + STAGE_NAME_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dst, (long)getpid());
    int in = open(src, O_RDONLY | O_CLOEXEC), out = -1, rc = 0;
    if (in < 0) return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot open %s: %s", src, strerror(errno));
    out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        goto done;
    }
    uint32_t crc = 0;
    uint64_t n = 0;
    for (;;) {
        ssize_t k = read(in, buf, STAGE_BLOCK);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot read %s: %s", src, strerror(errno));
            goto done;
        }
        if (k == 0) break;
        crc = fb_crc32c(crc, buf, (size_t)k);
        n += (uint64_t)k;
        for (ssize_t off = 0; off < k;) {
            ssize_t w = write(out, buf + off, (size_t)(k - off));
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) {
                rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
                goto done;
            }
            off += w;
        }
    }
    if (n != sh->bytes) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s: the manifest says %" PRIu64 " bytes, the file "
                     "has %" PRIu64,
                     src, sh->bytes, n);
        goto done;
    }
    if (crc != sh->crc32c) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "%s: checksum mismatch (manifest %08" PRIx32 ", file %08" PRIx32 ")", src,
                     sh->crc32c, crc);
        goto done;
    }
    if (fsync(out) != 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot fsync %s: %s", tmp, strerror(errno));
        goto done;
    }
    int o = out;
    out = -1;
    if (close(o) != 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot close %s: %s", tmp, strerror(errno));
        goto done;
    }
    if (rename(tmp, dst) != 0)
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot rename %s: %s", tmp, strerror(errno));
done:
    close(in);
    if (out >= 0) close(out);
    if (rc) unlink(tmp);
    return rc;
}

/* 1 when the cached file has the manifest's size and checksum. */
static int stage_check(const char *path, const fb_manifest_shard *sh)
{
    uint32_t crc;
    uint64_t bytes;
    char m[256];
    if (fb_file_crc32c(&crc, &bytes, path, m, sizeof m) != 0) return 0;
    return bytes == sh->bytes && crc == sh->crc32c;
}

/* Evicts unpinned entries, least recently used first, until `extra` more
 * bytes fit under max_bytes (or nothing evictable is left); returns the
 * bytes the cache then holds. */
static uint64_t evict_to(stage_index *ix, const char *cache_dir, uint64_t max_bytes,
                         uint64_t extra, fb_stage_stats *st)
{
    uint64_t used = 0;
    for (size_t k = 0; k < ix->n; k++) used += ix->e[k].bytes;
    while (used + extra > max_bytes) {
        stage_entry *victim = NULL;
        for (size_t k = 0; k < ix->n; k++)
            if (!ix->e[k].pinned && (!victim || ix->e[k].last_used < victim->last_used))
                victim = &ix->e[k];
        if (!victim) break;
        char vp[FB_STAGE_PATH_MAX];
        snprintf(vp, sizeof vp, "%s/%s", cache_dir, victim->file);
        unlink(vp);
        used -= victim->bytes;
        idx_remove(ix, victim);
        st->evicted++;
    }
    return used;
}

int fb_stage_split(char (*paths)[FB_STAGE_PATH_MAX], fb_stage_stats *stats, const char *cache_dir,
                   uint64_t max_bytes, const char *dataset_dir, const fb_manifest *m,
                   const char *split, char *msg, size_t msg_cap)
{
    if (!paths || !cache_dir || !dataset_dir || !m || !split)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_stage_split: NULL argument");
    const fb_manifest_split *sp = fb_manifest_find_split(m, split);
    if (!sp) return fb_errf(msg, msg_cap, FB_ERR_NOT_FOUND, "dataset %s has no split %s", m->name, split);
    if (strlen(cache_dir) > FB_STAGE_PATH_MAX - STAGE_NAME_MAX - 64 ||
        strlen(dataset_dir) > FB_STAGE_PATH_MAX - FB_MANIFEST_PATH_MAX - 8)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cache or dataset directory path is too long");
    double t0 = stage_now();
    fb_stage_stats st = {0};
    stage_index ix = {0};
    int lock = -1, rc;
    bool loaded = false;
    uint8_t *buf = malloc(STAGE_BLOCK);
    char (*out)[FB_STAGE_PATH_MAX] = calloc((size_t)sp->n_shards, sizeof *out);
    char (*names)[STAGE_NAME_MAX] = calloc((size_t)sp->n_shards, sizeof *names);
    if (!buf || !out || !names) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = mkdir_p(cache_dir, msg, msg_cap))) goto done;
    char lpath[FB_STAGE_PATH_MAX];
    snprintf(lpath, sizeof lpath, "%s/lock", cache_dir);
    lock = open(lpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock < 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot open %s: %s", lpath, strerror(errno));
        goto done;
    }
    while (flock(lock, LOCK_EX) != 0) {
        if (errno == EINTR) continue;
        rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot lock %s: %s", lpath, strerror(errno));
        goto done;
    }
    if ((rc = idx_load(&ix, cache_dir, true, msg, msg_cap))) goto done;
    loaded = true;

    for (int i = 0; i < sp->n_shards; i++) {
        const fb_manifest_shard *sh = &sp->shards[i];
        const char *base = strrchr(sh->path, '/');
        base = base ? base + 1 : sh->path;
        snprintf(names[i], STAGE_NAME_MAX, "%08" PRIx32 "-%" PRIu64 "-%.200s", sh->crc32c,
                 sh->bytes, base);
        stage_entry *e = idx_find(&ix, names[i]);
        if (e) e->pinned = true;
    }
    for (int i = 0; i < sp->n_shards; i++) {
        const fb_manifest_shard *sh = &sp->shards[i];
        char src[FB_STAGE_PATH_MAX], dst[FB_STAGE_PATH_MAX];
        snprintf(src, sizeof src, "%s/%s", dataset_dir, sh->path);
        snprintf(dst, sizeof dst, "%s/%s", cache_dir, names[i]);
        stage_entry *e = idx_find(&ix, names[i]);
        if (e) {
            st.bytes_verified += sh->bytes;
            if (stage_check(dst, sh)) {
                e->last_used = ++ix.clock;
                st.hits++;
                snprintf(out[i], FB_STAGE_PATH_MAX, "%s", dst);
                continue;
            }
            unlink(dst);
            idx_remove(&ix, e);
            st.restaged++;
        }
        /* make room: least recently used first, never this split's shards */
        uint64_t used = evict_to(&ix, cache_dir, max_bytes, sh->bytes, &st);
        if (used + sh->bytes > max_bytes) {
            /* still no room: read this one where it is, after the same check a copy gets */
            if (!stage_check(src, sh)) {
                rc = fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: size or checksum does not match "
                             "the manifest", src);
                goto done;
            }
            st.uncached++;
            snprintf(out[i], FB_STAGE_PATH_MAX, "%s", src);
            continue;
        }
        if ((rc = stage_copy(src, dst, sh, buf, msg, msg_cap))) goto done;
        e = idx_add(&ix, names[i], sh->bytes, ++ix.clock);
        if (!e) {
            rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
            goto done;
        }
        e->pinned = true;
        st.copied++;
        st.bytes_copied += sh->bytes;
        snprintf(out[i], FB_STAGE_PATH_MAX, "%s", dst);
    }
    /* a bound lowered since the last run holds from now on */
    evict_to(&ix, cache_dir, max_bytes, 0, &st);
    rc = 0;
done:
    /* the index describes the directory even after a failure part-way */
    if (loaded) {
        int src = idx_save(&ix, cache_dir, rc ? NULL : msg, rc ? 0 : msg_cap);
        if (!rc) rc = src;
    }
    if (!rc) {
        memcpy(paths, out, (size_t)sp->n_shards * sizeof *out);
        st.seconds = stage_now() - t0;
        if (stats) *stats = st;
    }
    if (lock >= 0) close(lock); /* releases the flock */
    free(ix.e);
    free(buf);
    free(out);
    free(names);
    return rc;
}

uint64_t fb_stage_cache_bytes(const char *cache_dir)
{
    stage_index ix = {0};
    char m[256];
    uint64_t total = 0;
    if (idx_load(&ix, cache_dir, false, m, sizeof m) == 0)
        for (size_t i = 0; i < ix.n; i++) total += ix.e[i].bytes;
    free(ix.e);
    return total;
}
