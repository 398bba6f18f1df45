/*
 * manifest.json as a file: read, written atomically, and compared with the
 * shard files it lists.  The parser and the canonical JSON are api/manifest.c.
 */
#include "manifest_file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The manifest parser (api/) checks the shard format's limits under its own names. */
_Static_assert(FB_MANIFEST_MAX_RECORDS == FB_SHARD_MAX_RECORDS, "records limit");
_Static_assert(FB_MANIFEST_MAX_CHUNKS == FB_SHARD_MAX_CHUNKS, "chunks limit");
_Static_assert(FB_MANIFEST_MAX_SAMPLE_NUMEL == FB_SHARD_MAX_SAMPLE_NUMEL, "sample limit");
_Static_assert(FB_MANIFEST_MIN_SHARD_BYTES == FB_SHARD_HEADER_BYTES + FB_SHARD_INDEX_ENTRY_BYTES,
               "smallest shard");

static int slurp(char **buf, size_t *len, const char *path, size_t max, char *msg, size_t msg_cap)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fb_errf(msg, msg_cap, errno == ENOENT ? FB_ERR_DATA : FB_ERR_IO,
                       "cannot open %s: %s", path, strerror(errno));
    size_t n = 0, bcap = 65536;
    char *b = malloc(bcap);
    int rc = 0;
    if (!b) {
        fclose(f);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    }
    for (;;) {
        if (n == bcap) {
            if (bcap > max) {
                rc = fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: larger than %zu bytes", path, max);
                break;
            }
            char *nb = realloc(b, 2 * bcap);
            if (!nb) {
                rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
                break;
            }
            b = nb;
            bcap *= 2;
        }
        size_t k = fread(b + n, 1, bcap - n, f);
        n += k;
        if (k == 0) {
            if (ferror(f)) rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot read %s", path);
            break;
        }
    }
    fclose(f);
    if (rc) {
        free(b);
        return rc;
    }
    *buf = b;
    *len = n;
    return 0;
}

int fb_manifest_read(fb_manifest *out, const char *path, char *msg, size_t msg_cap)
{
    if (!out || !path) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_manifest_read: NULL argument");
    char *buf = NULL;
    size_t len = 0;
    int rc = slurp(&buf, &len, path, FB_MANIFEST_MAX_BYTES, msg, msg_cap);
    if (rc) return rc;
    rc = fb_manifest_parse(out, buf, len, path, msg, msg_cap);
    free(buf);
    return rc;
}

int fb_manifest_open_dir(fb_manifest *out, const char *dir, char *msg, size_t msg_cap)
{
    if (!out || !dir) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_manifest_open_dir: NULL argument");
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, FB_MANIFEST_FILE) >= sizeof path)
        return fb_errf(msg, msg_cap, FB_ERR_DATA, "dataset directory path is too long");
    fb_manifest m;
    int rc = fb_manifest_read(&m, path, msg, msg_cap);
    if (rc) return rc;
    if ((rc = fb_manifest_check_files(&m, dir, NULL, msg, msg_cap))) {
        fb_manifest_free(&m);
        return rc;
    }
    *out = m;
    return 0;
}

int fb_manifest_write(const char *path, const fb_manifest *m, char *msg, size_t msg_cap)
{
    if (!path || !m) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_manifest_write: NULL argument");
    char *text = NULL, tmp[4200];
    int rc = fb_manifest_to_json(&text, m, msg, msg_cap);
    if (rc) return rc;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = fb_errf(msg, msg_cap, fb_err_write_errno(errno), "cannot create %s: %s", tmp,
                     strerror(errno));
        free(text);
        return rc;
    }
    size_t len = strlen(text), off = 0;
    text[len] = '\n'; /* json_dumps leaves no final newline; the NUL is not needed any more */
    len++;
    while (off < len) {
        ssize_t k = write(fd, text + off, len - off);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            rc = fb_errf(msg, msg_cap, fb_err_write_errno(errno), "cannot write %s: %s", tmp,
                         strerror(errno));
            goto fail;
        }
        off += (size_t)k;
    }
    if (fsync(fd) != 0) {
        rc = fb_errf(msg, msg_cap, fb_err_write_errno(errno), "cannot fsync %s: %s", tmp,
                     strerror(errno));
        goto fail;
    }
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) {
        rc = fb_errf(msg, msg_cap, fb_err_write_errno(errno), "cannot close %s: %s", tmp,
                     strerror(errno));
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        rc = fb_errf(msg, msg_cap, fb_err_write_errno(errno), "cannot rename %s to %s: %s", tmp,
                     path, strerror(errno));
        goto fail;
    }
    free(text);
    char *copy = strdup(path);
    if (copy) {
        int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            if (fsync(dfd) != 0 && errno != EINVAL)
                rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot fsync the directory of %s", path);
            close(dfd);
        }
        free(copy);
    }
    return rc;
fail:
    if (fd >= 0) close(fd);
    unlink(tmp);
    free(text);
    return rc;
}

int fb_manifest_check_files(const fb_manifest *m, const char *dir, const char *split, char *msg,
                            size_t msg_cap)
{
    if (!m || !dir) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_manifest_check_files: NULL argument");
    char path[4400];
    for (int s = 0; s < m->n_splits; s++) {
        const fb_manifest_split *sp = &m->splits[s];
        if (split && strcmp(split, sp->name) != 0) continue;
        for (int i = 0; i < sp->n_shards; i++) {
            const fb_manifest_shard *sh = &sp->shards[i];
            snprintf(path, sizeof path, "%s/%s", dir, sh->path);
            struct stat st;
            if (stat(path, &st) != 0)
                return fb_errf(msg, msg_cap, errno == ENOENT ? FB_ERR_DATA : FB_ERR_IO,
                               "%s: listed in the manifest (split %s) but cannot be read: %s",
                               path, sp->name, strerror(errno));
            if ((uint64_t)st.st_size != sh->bytes)
                return fb_errf(msg, msg_cap, FB_ERR_DATA,
                               "%s: the manifest says %" PRIu64 " bytes, the file has %lld",
                               path, sh->bytes, (long long)st.st_size);
            fb_shard_reader *r;
            int rc = fb_shard_open(&r, path, msg, msg_cap);
            if (rc) return rc;
            const fb_shard_meta *mt = fb_shard_get_meta(r);
            if (mt->dtype != m->dtype || mt->sample_numel != m->sample_numel)
                rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                             "%s: holds %s records of %" PRId64 " values; the manifest says %s "
                             "records of %" PRId64,
                             path, fb_data_dtype_name(mt->dtype), mt->sample_numel,
                             fb_data_dtype_name(m->dtype), m->sample_numel);
            else if (mt->records != sh->records || mt->chunks != sh->chunks)
                rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                             "%s: holds %" PRId64 " records in %" PRId64 " chunks; the manifest "
                             "says %" PRId64 " in %" PRId64,
                             path, mt->records, mt->chunks, sh->records, sh->chunks);
            fb_shard_close(r);
            if (rc) return rc;
        }
    }
    return 0;
}


int fb_manifest_check_chunk(const fb_manifest *m, const fb_shard_chunk *ch, const char *path,
                            char *msg, size_t msg_cap)
{
    for (int64_t i = 0; i < ch->records; i++) {
        int32_t lab = ch->labels[i];
        if (m->n_classes == 0 && lab != 0)
            return fb_errf(msg, msg_cap, FB_ERR_DATA,
                           "%s: chunk %" PRId64 ": record %" PRId64 " has label %" PRId32
                           "; the dataset has no labels (label 0 for every record)",
                           path, ch->index, ch->first_record + i, lab);
        if (m->n_classes > 0 && (lab < 0 || lab >= m->n_classes))
            return fb_errf(msg, msg_cap, FB_ERR_DATA,
                           "%s: chunk %" PRId64 ": record %" PRId64 " has label %" PRId32
                           ", outside [0, %d) of the manifest",
                           path, ch->index, ch->first_record + i, lab, m->n_classes);
    }
    if (m->dtype != FB_DTYPE_I32) return 0;
    const int32_t *ids = ch->values;
    int64_t n = (int64_t)(ch->values_bytes / sizeof *ids), numel = m->sample_numel;
    for (int64_t k = 0; k < n; k++)
        if (ids[k] < 0 || ids[k] >= m->vocab)
            return fb_errf(msg, msg_cap, FB_ERR_DATA,
                           "%s: chunk %" PRId64 ": record %" PRId64 " has token id %" PRId32
                           " at position %" PRId64 ", outside [0, %" PRId64
                           ") of the manifest's vocab",
                           path, ch->index, ch->first_record + k / numel, ids[k], k % numel,
                           m->vocab);
    return 0;
}

void fb_data_values_to_float(float *dst, fb_data_dtype dtype, const void *src, int64_t n)
{
    if (dtype == FB_DTYPE_U8) {
        const uint8_t *u = src;
        for (int64_t v = 0; v < n; v++) dst[v] = (float)u[v] / 255.0f;
    } else if (dtype == FB_DTYPE_I32) {
        const int32_t *t = src;
        for (int64_t v = 0; v < n; v++) dst[v] = (float)t[v];
    } else {
        memcpy(dst, src, (size_t)n * sizeof *dst);
    }
}
