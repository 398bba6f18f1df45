/*
 * Text datasets: files read whole and joined into one byte text, imported as
 * byte-level token records by fb_datadir_import_tokens (datadir.c); and the
 * built-in corpora, fixed lists of files every Debian system has.
 */
#include "datadir.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends the file at path to *text (len bytes used, cap allocated), then a newline when the
 * file does not end with one. */
static int append_file(uint8_t **text, size_t *len, size_t *cap, const char *path, char *msg,
                       size_t msg_cap)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fb_errf(msg, msg_cap, errno == ENOENT ? FB_ERR_DATA : FB_ERR_IO,
                       "cannot open %s: %s", path, strerror(errno));
    size_t start = *len;
    int rc = 0;
    for (;;) {
        if (*cap - *len < 65536 + 1) {
            size_t nc = *cap ? 2 * *cap : 1 << 20;
            uint8_t *nt = realloc(*text, nc);
            if (!nt) {
                rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
                break;
            }
            *text = nt;
            *cap = nc;
        }
        size_t k = fread(*text + *len, 1, 65536, f);
        *len += k;
        if (k == 0) {
            if (ferror(f))
                rc = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot read %s: %s", path,
                             strerror(errno ? errno : EIO));
            break;
        }
        if (*len > FB_TEXT_MAX_BYTES) {
            rc = fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: the text is longer than %zu bytes",
                         path, FB_TEXT_MAX_BYTES);
            break;
        }
    }
    fclose(f);
    if (rc) return rc;
    if (*len == start) return fb_errf(msg, msg_cap, FB_ERR_DATA, "%s: empty file", path);
    if ((*text)[*len - 1] != '\n') (*text)[(*len)++] = '\n';
    return 0;
}

int fb_datadir_import_text(fb_import_result *res, const fb_import_opts *o,
                           const char *const *files, int n_files, int64_t context, int64_t stride,
                           char *msg, size_t msg_cap)
{
    if (!files)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_datadir_import_text: NULL argument");
    if (n_files < 1 || n_files > FB_TEXT_MAX_FILES)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%d text files; allowed 1 to %d",
                       n_files, FB_TEXT_MAX_FILES);
    uint8_t *text = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (int i = 0; i < n_files && !rc; i++)
        rc = append_file(&text, &len, &cap, files[i], msg, msg_cap);
    if (!rc) rc = fb_datadir_import_tokens(res, o, text, len, context, stride, msg, msg_cap);
    free(text);
    return rc;
}

int fb_datadir_builtin_text(char paths[][FB_TEXT_PATH_MAX], int *n, const char *corpus,
                            const char *dir, char *msg, size_t msg_cap)
{
    static const char *const licenses[] = {"GPL-3",      "GPL-2",    "LGPL-3", "LGPL-2.1",
                                           "Apache-2.0", "Artistic", "BSD"};
    const int count = (int)(sizeof licenses / sizeof licenses[0]);
    _Static_assert(sizeof licenses / sizeof licenses[0] <= FB_TEXT_MAX_FILES, "corpus size");
    if (!paths || !n || !corpus)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_datadir_builtin_text: NULL argument");
    if (strcmp(corpus, "licenses") != 0)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "unknown built-in text corpus \"%.64s\" (licenses)", corpus);
    if (!dir) dir = FB_TEXT_LICENSES_DIR;
    char p[FB_TEXT_PATH_MAX];
    for (int i = 0; i < count; i++) {
        if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, licenses[i]) >= sizeof p)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "the directory path is too long");
        FILE *f = fopen(p, "rb");
        if (!f)
            return fb_errf(msg, msg_cap, FB_ERR_DATA,
                           "built-in corpus licenses: cannot open %s: %s (the corpus is the "
                           "licence texts of Debian's base-files package)",
                           p, strerror(errno));
        fclose(f);
    }
    for (int i = 0; i < count; i++) snprintf(paths[i], FB_TEXT_PATH_MAX, "%s/%s", dir, licenses[i]);
    *n = count;
    return 0;
}
