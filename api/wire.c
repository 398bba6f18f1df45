/*
 * The wire protocol codec, its common part: the names of message types,
 * events and faults, releasing a decoded message, and the CURVE key files
 * both sides read.  Decoding is wire_decode.c, encoding wire_encode.c; the
 * three share wire_int.h.
 */
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "jobspec.h"
#include "wire_int.h"

/* A job spec's dataset must fit the wire's buffer, or a valid job could never be dispatched. */
_Static_assert(FB_WIRE_DATASET_MAX >= FB_SPEC_DATASET_MAX, "dataset names must fit the wire");
_Static_assert(FB_FUSION_KEY_HEX < sizeof(((fb_wire_msg *)0)->fusion_key), "fusion key fits");

#define KEY_FILE_MAX 4096       /* bytes of one key file */
#define KEYS_FILE_MAX (1 << 20) /* bytes of an allow-list */
#define Z85_KEY_LEN 40

const char *const fb_wire_type_names[FB_WIRE_TYPE_COUNT] = {
    [FB_WIRE_HELLO] = "hello",         [FB_WIRE_WELCOME] = "welcome",
    [FB_WIRE_ASSIGN] = "assign",       [FB_WIRE_PROGRESS] = "progress",
    [FB_WIRE_EVENT] = "event",         [FB_WIRE_ACK] = "ack",
    [FB_WIRE_DETACH] = "detach",       [FB_WIRE_REBALANCE] = "rebalance",
    [FB_WIRE_HEARTBEAT] = "heartbeat", [FB_WIRE_DRAIN] = "drain",
};

const char *const fb_wire_fault_names[FB_FAULT_COUNT] = {[FB_FAULT_JOB] = "job",
                                                         [FB_FAULT_SPEC] = "spec"};

const char *const fb_wire_event_names[FB_EV_KIND_COUNT] = {
    [FB_EV_STARTED] = "started",
    [FB_EV_EVALUATED] = "evaluated",
    [FB_EV_CHECKPOINTED] = "checkpointed",
    [FB_EV_FINISHED] = "finished",
    [FB_EV_FAILED] = "failed",
    [FB_EV_DETACHED] = "detached",
};

const char *fb_wire_type_name(fb_wire_type t)
{
    return (t >= 0 && t < FB_WIRE_TYPE_COUNT) ? fb_wire_type_names[t] : "unknown";
}

int fb_wire_type_parse(const char *name)
{
    for (int i = 0; name && i < FB_WIRE_TYPE_COUNT; i++)
        if (strcmp(name, fb_wire_type_names[i]) == 0) return i;
    return -1;
}

const char *fb_wire_event_name(fb_wire_event_kind k)
{
    return (k >= 0 && k < FB_EV_KIND_COUNT) ? fb_wire_event_names[k] : "unknown";
}

void fb_wire_msg_free(fb_wire_msg *m)
{
    if (!m) return;
    for (int i = 0; m->running && i < m->n_running; i++) {
        free(m->running[i].job_ids);
        free(m->running[i].steps);
    }
    free(m->running);
    for (int i = 0; m->members && i < m->n_members; i++)
        free(m->members[i].spec);
    free(m->members);
    free(m->progress);
    memset(m, 0, sizeof *m);
}

/* ---- key files ------------------------------------------------------------- */

static const char z85_alphabet[] =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/* 40 characters of the Z85 alphabet that decode to 32 bytes: each group of 5
 * characters must stand for a value below 2^32.  That also means no key
 * starts with '#' (a group's first character is at most '%'), which is what
 * lets '#' start a comment in a list of bare keys. */
static bool z85_key_ok(const char *s, size_t n)
{
    if (n != Z85_KEY_LEN) return false;
    for (size_t g = 0; g < n; g += 5) {
        uint64_t value = 0;
        for (size_t i = g; i < g + 5; i++) {
            const char *at = s[i] ? strchr(z85_alphabet, s[i]) : NULL;
            if (!at) return false;
            value = value * 85 + (uint64_t)(at - z85_alphabet);
        }
        if (value > UINT32_MAX) return false;
    }
    return true;
}

/* Reads a whole small file into a NUL-terminated buffer. */
static int read_small(const char *path, size_t max, char **buf, size_t *len, char *msg,
                      size_t msg_cap)
{
    if (!path || !*path) return fb_errf(msg, msg_cap, FB_ERR_IO, "no file name");
    FILE *f = fopen(path, "rb");
    if (!f) return fb_errf(msg, msg_cap, FB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *b = malloc(max + 2);
    if (!b) {
        fclose(f);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    }
    size_t n = fread(b, 1, max + 1, f);
    int rd = ferror(f);
    fclose(f);
    if (rd || n > max) {
        sodium_memzero(b, max + 2);
        free(b);
        return rd ? fb_errf(msg, msg_cap, FB_ERR_IO, "%s: read error", path)
                  : fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE, "%s: larger than %zu bytes", path, max);
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return FB_OK;
}

/* Line iteration over a buffer: *line and *n get the next line without its end, trimmed of
 * surrounding blanks and a '\r'.  Returns false at the end. */
static bool next_line(char **cur, char *end, char **line, size_t *n)
{
    if (*cur >= end) return false;
    char *s = *cur, *nl = memchr(s, '\n', (size_t)(end - s));
    char *e = nl ? nl : end;
    *cur = nl ? nl + 1 : end;
    while (s < e && (*s == ' ' || *s == '\t'))
        s++;
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
        e--;
    *line = s;
    *n = (size_t)(e - s);
    return true;
}

/* If line is "<label>: <value>", points *val at the value. */
static bool labelled(const char *line, size_t n, const char *label, const char **val, size_t *vn)
{
    size_t l = strlen(label);
    if (n <= l || memcmp(line, label, l) != 0 || line[l] != ':') return false;
    size_t i = l + 1;
    while (i < n && (line[i] == ' ' || line[i] == '\t'))
        i++;
    *val = line + i;
    *vn = n - i;
    return true;
}

int fb_wire_key_generate(const char *path, char *msg, size_t msg_cap)
{
    char pub[Z85_KEY_LEN + 1], sec[Z85_KEY_LEN + 1], text[128];
    if (!path || !*path) return fb_errf(msg, msg_cap, FB_ERR_IO, "no key file name");
    if (zmq_curve_keypair(pub, sec) != 0)
        return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED, "cannot make a CURVE keypair: %s",
                       zmq_strerror(errno));
    int tlen = snprintf(text, sizeof text, "public: %s\nsecret: %s\n", pub, sec);
    sodium_memzero(sec, sizeof sec);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16), *dir = malloc(plen + 2);
    int err = FB_OK, fd = -1;
    if (!tmp || !dir) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* The key is written next to its final name and linked into place: link() fails when
     * the name exists, so an existing key is never replaced, and a crash leaves either no
     * key file or a complete one. */
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    fd = mkstemp(tmp);
    if (fd < 0) {
        err = fb_errf(msg, msg_cap, FB_ERR_IO, "%s: cannot create a temporary file: %s", path,
                      strerror(errno));
        tmp[0] = '\0';
        goto fail;
    }
    ssize_t w = (fchmod(fd, 0600) == 0) ? write(fd, text, (size_t)tlen) : -1;
    if (w != tlen || fsync(fd) != 0) {
        err =
            fb_errf(msg, msg_cap, FB_ERR_IO, "%s: cannot write the key: %s", tmp, strerror(errno));
        goto fail;
    }
    int cl = close(fd);
    fd = -1;
    if (cl != 0) {
        err =
            fb_errf(msg, msg_cap, FB_ERR_IO, "%s: cannot write the key: %s", tmp, strerror(errno));
        goto fail;
    }
    if (link(tmp, path) != 0) {
        err = errno == EEXIST ? fb_errf(msg, msg_cap, FB_ERR_ALREADY_EXISTS,
                                        "%s exists; a key file is never overwritten", path)
                              : fb_errf(msg, msg_cap, FB_ERR_IO, "%s: cannot create: %s", path,
                                        strerror(errno));
        goto fail;
    }
    unlink(tmp);
    tmp[0] = '\0';
    /* Make the new name durable too; a file system that cannot sync a directory says EINVAL. */
    memcpy(dir, path, plen + 1);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, plen + 2, ".");
    else if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        int rc = fsync(dfd), e = errno;
        close(dfd);
        if (rc != 0 && e != EINVAL)
            err = fb_errf(msg, msg_cap, FB_ERR_IO, "%s: cannot sync the directory: %s", dir,
                          strerror(e));
    }
fail:
    if (fd >= 0) close(fd);
    if (tmp && tmp[0]) unlink(tmp);
    free(tmp);
    free(dir);
    sodium_memzero(text, sizeof text);
    return err;
}

int fb_wire_key_load(const char *path, char public_z85[41], char secret_z85[41], char *msg,
                     size_t msg_cap)
{
    char pub[Z85_KEY_LEN + 1] = "", sec[Z85_KEY_LEN + 1] = "", derived[Z85_KEY_LEN + 1];
    char *buf = NULL, *cur, *line;
    size_t len = 0, n;
    int err = read_small(path, KEY_FILE_MAX, &buf, &len, msg, msg_cap);
    if (err) return err;
    cur = buf;
    for (int ln = 1; next_line(&cur, buf + len, &line, &n); ln++) {
        const char *val;
        size_t vn;
        if (n == 0 || line[0] == '#') continue;
        bool is_pub = labelled(line, n, "public", &val, &vn);
        bool is_sec = !is_pub && labelled(line, n, "secret", &val, &vn);
        if (!is_pub && !is_sec) {
            err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE,
                          "%s: line %d: expected \"public: <key>\" or \"secret: <key>\"", path, ln);
            goto fail;
        }
        char *dst = is_pub ? pub : sec;
        if (dst[0]) {
            err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE, "%s: line %d: a second %s key", path, ln,
                          is_pub ? "public" : "secret");
            goto fail;
        }
        if (!z85_key_ok(val, vn)) {
            err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE,
                          "%s: line %d: the %s key is not 40 characters of Z85", path, ln,
                          is_pub ? "public" : "secret");
            goto fail;
        }
        memcpy(dst, val, vn);
        dst[vn] = '\0';
    }
    if (!pub[0]) {
        err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE, "%s: no \"public:\" line", path);
        goto fail;
    }
    if (secret_z85 && !sec[0]) {
        err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE,
                      "%s: no \"secret:\" line (is this a public key file?)", path);
        goto fail;
    }
    if (sec[0] && (zmq_curve_public(derived, sec) != 0 || strcmp(derived, pub) != 0)) {
        err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE,
                      "%s: the public key does not belong to the secret key", path);
        goto fail;
    }
    if (public_z85) memcpy(public_z85, pub, sizeof pub);
    if (secret_z85) memcpy(secret_z85, sec, sizeof sec);
fail:
    sodium_memzero(sec, sizeof sec);
    if (buf) sodium_memzero(buf, len);
    free(buf);
    return err;
}

int fb_wire_keys_load(const char *path, char (*keys)[41], int cap, int *n, char *msg,
                      size_t msg_cap)
{
    if (cap < 0 || (cap > 0 && !keys) || !n)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "bad key list arguments");
    char *buf = NULL, *cur, *line;
    size_t len = 0, ln_len;
    int err = read_small(path, KEYS_FILE_MAX, &buf, &len, msg, msg_cap);
    if (err) return err;
    char(*got)[Z85_KEY_LEN + 1] = malloc((size_t)(cap ? cap : 1) * sizeof *got);
    int *from = malloc((size_t)(cap ? cap : 1) * sizeof *from);
    int count = 0;
    if (!got || !from) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    cur = buf;
    for (int ln = 1; next_line(&cur, buf + len, &line, &ln_len); ln++) {
        const char *val = line;
        size_t vn = ln_len;
        if (ln_len == 0) continue;
        if (line[0] == '#') continue;
        if (labelled(line, ln_len, "secret", &val, &vn)) {
            if (!z85_key_ok(val, vn)) {
                err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE,
                              "%s: line %d: the secret key is not 40 characters of Z85", path, ln);
                goto fail;
            }
            continue;
        }
        bool is_pub = labelled(line, ln_len, "public", &val, &vn);
        if (!z85_key_ok(val, vn)) {
            err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE,
                          is_pub ? "%s: line %d: the public key is not 40 characters of Z85"
                                 : "%s: line %d: expected a 40-character Z85 key, "
                                   "\"public: <key>\", a '#' comment or a blank line",
                          path, ln);
            goto fail;
        }
        for (int k = 0; k < count; k++) {
            if (memcmp(got[k], val, Z85_KEY_LEN) == 0) {
                err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE,
                              "%s: line %d: repeats the key of line %d", path, ln, from[k]);
                goto fail;
            }
        }
        if (count == cap) {
            err = fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE, "%s: line %d: more than %d keys", path, ln,
                          cap);
            goto fail;
        }
        memcpy(got[count], val, Z85_KEY_LEN);
        got[count][Z85_KEY_LEN] = '\0';
        from[count++] = ln;
    }
    if (count) memcpy(keys, got, (size_t)count * sizeof *got);
    *n = count;
fail:
    if (buf) sodium_memzero(buf, len);
    free(buf);
    free(got);
    free(from);
    return err;
}
