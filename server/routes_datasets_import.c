/*
 * The import engine of datasets (routes_datasets.h): what runs an import
 * that a handler of routes_datasets.c has checked and claimed.
 *
 * server/ may not link the data store (workers/data), so the server runs the
 * fusebox-data executable (--data-tool) as a child process to import and
 * verify, and reads the manifest.json it writes as a documented contract
 * (docs/data-format.md) with the contract's own strict parser
 * (api/manifest.h), the one the workers use.
 *
 * Where things are.  Tenant T's dataset N lives in DATASETS_DIR/T/N/.  An
 * import is built in DATASETS_DIR/T/.import-<id>/ and renamed into place
 * only once it verified and fits the quota; adding a split to a ready
 * dataset builds on a copy of hard links of it and swaps the two directories,
 * so a failed upload leaves the dataset as it was.  Uploads are spooled to an
 * unlinked file, so they leave nothing behind whatever happens.  Built-ins are
 * only registered: their IDX files stay in --builtin-dir.  Names starting with
 * "." are the server's own; dataset names cannot start with one.
 *
 * Imports run in a thread of their own, so that the request answers 202 at
 * once.  The thread holds a PostgreSQL session advisory lock keyed by the
 * dataset's id on a connection of its own for as long as it runs; a row that
 * is importing while nobody holds its lock belonged to a fuseboxd that
 * stopped, and the next request of that tenant marks it failed (or, for an
 * added split, ready as before) and removes what the import left.  Renames
 * of dataset directories happen under one process-wide mutex: one fuseboxd
 * owns a datasets directory.
 *
 * A full disk.  The data tool exits 3 when the datasets file system is full
 * (ENOSPC, EDQUOT); so do staging and the rename here.  Such an import fails
 * as insufficient_storage, not bad_data: the tenant's file is fine and the
 * same import succeeds once space is freed.  What it wrote goes with the
 * staging directory, so nothing half-written is left or recorded.

 */
#define _GNU_SOURCE /* renameat2, close_range, pipe2 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "manifest.h"
#include "routes_datasets.h"
#include "server_impl.h"

#define DS_ERR_MAX 1024        /* stored error messages */
#define DS_MAX_IMPORTS 4       /* imports running at once, server-wide */
#define DS_TOOL_TIMEOUT_S 3600 /* one run of the data tool */
#define DS_TREE_DEPTH 8        /* directories deep a dataset may be */
#define DS_TOOL_NO_SPACE 3     /* the data tool's exit status for a full file system */

/* The advisory lock an import holds is keyed by
 * hashtextextended('fusebox-dataset:' || id::text, 0), written out in each
 * statement that takes it. */

static atomic_int active_imports;
pthread_mutex_t fb_ds_fs_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- directories ------------------------------------------------------------------ */

/* DATASETS_DIR/<tenant>, created (with DATASETS_DIR) when missing. */
int fb_ds_tenant_dir(const fb_config *cfg, const char *tenant, char *out, size_t cap, char *msg,
                     size_t msg_cap)
{
    if ((size_t)snprintf(out, cap, "%s/%s", cfg->datasets_dir, tenant) >= cap)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "--datasets-dir is too long");
    const char *dirs[2] = {cfg->datasets_dir, out};
    for (int i = 0; i < 2; i++) {
        if (mkdir(dirs[i], 0750) != 0 && errno != EEXIST) {
            int e = errno;
            fb_log_json(FB_LOG_ERROR, "cannot create a datasets directory",
                        json_pack("{s:s, s:s}", "path", dirs[i], "detail", strerror(e)));
            if (fb_err_write_errno(e) == FB_ERR_NO_SPACE)
                return fb_errf(msg, msg_cap, FB_ERR_NO_SPACE,
                               "the server's datasets disk is full; retry once space is freed");
            return fb_errf(msg, msg_cap, FB_ERR_IO,
                           "the server cannot write its datasets directory (see its log)");
        }
    }
    return FB_OK;
}

/* Removes name in dfd and everything below it, never following symbolic
 * links.  Returns 0, or -1 when something stayed. */
static int rm_at(int dfd, const char *name, int depth)
{
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlinkat(dfd, name, 0) == 0 || errno == ENOENT ? 0 : -1;
    if (depth <= 0) return -1;
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
            rm_at(dirfd(d), e->d_name, depth - 1) != 0)
            rc = -1;
    closedir(d);
    if (unlinkat(dfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) rc = -1;
    return rc;
}

/* rm_at on a path's last component, logging what could not be removed. */
void fb_ds_rm_path(const char *dir, const char *name)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    if (rm_at(fd, name, DS_TREE_DEPTH) != 0)
        fb_log_json(FB_LOG_WARN, "could not remove a dataset directory",
                    json_pack("{s:s, s:s}", "dir", dir, "name", name));
    close(fd);
}

/* Recreates the tree src (in sdir) as dst (in ddir): directories anew,
 * regular files as hard links.  Anything else is refused. */
static int link_tree(int sdir, const char *src, int ddir, const char *dst, int depth)
{
    if (depth <= 0) return -1;
    int s = openat(sdir, src, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (s < 0) return -1;
    if (mkdirat(ddir, dst, 0750) != 0) {
        close(s);
        return -1;
    }
    int d = openat(ddir, dst, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *it = d >= 0 ? fdopendir(s) : NULL;
    if (!it) {
        close(s);
        if (d >= 0) close(d);
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(it))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        struct stat st;
        if (fstatat(dirfd(it), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            rc = -1;
        else if (S_ISDIR(st.st_mode))
            rc = link_tree(dirfd(it), e->d_name, d, e->d_name, depth - 1);
        else if (S_ISREG(st.st_mode))
            rc = linkat(dirfd(it), e->d_name, d, e->d_name, 0) == 0 ? 0 : -1;
        else
            rc = -1;
    }
    closedir(it);
    close(d);
    return rc;
}

/* Copies src into out (cap bytes), replacing each from[i] by to[i] and line
 * ends by "; ", so that the data tool's words name what the client knows
 * (its paths, "train.csv") instead of the server's descriptors and
 * directories. */
static void rewrite_text(char *out, size_t cap, const char *src, const char *const *from,
                         const char *const *to, int n)
{
    size_t used = 0;
    const char *p = src;
    while (*p && used + 1 < cap) {
        int hit = -1;
        for (int i = 0; i < n && hit < 0; i++)
            if (from[i][0] && strncmp(p, from[i], strlen(from[i])) == 0) hit = i;
        const char *add;
        size_t len;
        if (hit >= 0) {
            add = to[hit];
            len = strlen(add);
            p += strlen(from[hit]);
        } else if (*p == '\n') {
            add = p[1] ? "; " : "";
            len = strlen(add);
            p++;
        } else {
            add = p;
            len = 1;
            p++;
        }
        if (len > cap - 1 - used) len = cap - 1 - used;
        memcpy(out + used, add, len);
        used += len;
    }
    out[used] = '\0';
}

/* ---- the manifest, read as input ---------------------------------------------------- */

/*
 * Reads <dfd>/manifest.json, which the data tool wrote for dataset name,
 * parses it as strictly as the workers do (api/manifest.h), checks it
 * against the files it lists (each there, a regular file of the listed
 * size), and returns the summary the API shows plus the bytes the dataset
 * takes (shards and manifest).
 */
static int read_manifest(int dfd, const char *name, json_t **summary, long long *total, char *msg,
                         size_t msg_cap)
{
    int err = FB_OK;
    char *text = NULL;
    fb_manifest m;
    memset(&m, 0, sizeof m);
    json_t *shape = NULL, *splits = NULL;
    int fd = openat(dfd, FB_MANIFEST_FILE, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        err = fb_errf(msg, msg_cap, FB_ERR_DATA, "manifest.json is missing");
        goto fail;
    }
    if (st.st_size <= 0 || (size_t)st.st_size > FB_MANIFEST_MAX_BYTES) {
        err = fb_errf(msg, msg_cap, FB_ERR_DATA, "manifest.json has %lld bytes (1..%lld allowed)",
                      (long long)st.st_size, (long long)FB_MANIFEST_MAX_BYTES);
        goto fail;
    }
    size_t len = (size_t)st.st_size, got = 0;
    if (!(text = malloc(len))) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    while (got < len) {
        ssize_t r = read(fd, text + got, len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    if (got != len) {
        err = fb_errf(msg, msg_cap, FB_ERR_IO, "manifest.json could not be read");
        goto fail;
    }
    if ((err = fb_manifest_parse(&m, text, len, FB_MANIFEST_FILE, msg, msg_cap))) goto fail;
    if (strcmp(m.name, name) != 0) {
        err = fb_errf(msg, msg_cap, FB_ERR_DATA, "manifest: name is not \"%s\"", name);
        goto fail;
    }
    shape = m.ndim == 0 ? json_string("variable") : json_array();
    splits = json_object();
    if (!shape || !splits) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < m.ndim; i++)
        json_array_append_new(shape, json_integer(m.shape[i]));
    long long samples = 0, bytes = (long long)st.st_size;
    for (int s = 0; s < m.n_splits; s++) {
        const fb_manifest_split *sp = &m.splits[s];
        for (int i = 0; i < sp->n_shards; i++) {
            const char *path = sp->shards[i].path;
            struct stat sh;
            if (fstatat(dfd, path, &sh, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sh.st_mode)) {
                err = fb_errf(msg, msg_cap, FB_ERR_DATA, "manifest: %s is listed but is not a file",
                              path);
                goto fail;
            }
            if ((uint64_t)sh.st_size != sp->shards[i].bytes) {
                err = fb_errf(msg, msg_cap, FB_ERR_DATA,
                              "manifest: %s has %lld bytes; the manifest says %llu", path,
                              (long long)sh.st_size, (unsigned long long)sp->shards[i].bytes);
                goto fail;
            }
        }
        long long split_bytes = (long long)fb_manifest_split_bytes(sp);
        json_object_set_new(splits, sp->name,
                            json_pack("{s:I, s:I, s:I}", "samples", (json_int_t)sp->samples,
                                      "shards", (json_int_t)sp->n_shards, "bytes",
                                      (json_int_t)split_bytes));
        samples += sp->samples;
        bytes += split_bytes;
    }
    json_t *s = json_pack("{s:s, s:O, s:I, s:I, s:I, s:O}", "dtype", fb_data_dtype_name(m.dtype),
                          "shape", shape, "classes", (json_int_t)m.n_classes, "samples",
                          (json_int_t)samples, "bytes", (json_int_t)bytes, "splits", splits);
    /* token datasets: their vocabulary (classes is 0 when they have no labels) */
    if (s && m.vocab && json_object_set_new(s, "vocab", json_integer((json_int_t)m.vocab))) {
        json_decref(s);
        s = NULL;
    }
    if (!s) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    *summary = s;
    *total = bytes;
fail:
    if (fd >= 0) close(fd);
    free(text);
    fb_manifest_free(&m);
    json_decref(splits);
    json_decref(shape);
    return err;
}

/* ---- the data tool ---------------------------------------------------------------- */

/*
 * Runs the data tool with argv (argv[0] is its path), its stdin and stdout
 * on /dev/null, its stderr into out (cap bytes, the rest dropped), and
 * fds[i] as descriptor 3 + i, which argv names as /dev/fd/<3 + i>.  The
 * child dies with the thread that started it.  Returns FB_OK with the exit
 * status in *status, or FB_ERR_IO with out saying why it did not run or
 * finish.
 */
static int run_tool(char *const argv[], const int *fds, int n_fds, int *status, char *out,
                    size_t cap)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return fb_errf(out, cap, FB_ERR_IO, "cannot start the data tool: %s", strerror(errno));
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        return fb_errf(out, cap, FB_ERR_IO, "cannot start the data tool: %s", strerror(e));
    }
    if (pid == 0) {
        /* only async-signal-safe calls from here to exec */
        static const char no_exec[] = "the data tool could not be executed\n";
        sigset_t none;
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        /* the server blocks SIGTERM and friends in every thread; the tool need not */
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        int hi[3], nul = open("/dev/null", O_RDWR);
        if (nul < 0) _exit(127);
        hi[0] = fcntl(p[1], F_DUPFD, 64);
        for (int i = 0; i < n_fds; i++)
            hi[1 + i] = fcntl(fds[i], F_DUPFD, 64);
        if (dup2(nul, 0) < 0 || dup2(nul, 1) < 0 || hi[0] < 0 || dup2(hi[0], 2) < 0) _exit(127);
        for (int i = 0; i < n_fds; i++)
            if (hi[1 + i] < 0 || dup2(hi[1 + i], 3 + i) < 0) _exit(127);
        close_range((unsigned)(3 + n_fds), ~0U, 0);
        execv(argv[0], argv);
        ssize_t ignored = write(2, no_exec, sizeof no_exec - 1);
        (void)ignored;
        _exit(127);
    }
    close(p[1]);
    size_t used = 0;
    out[0] = '\0';
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bool timed_out = false;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        long long left_ms = (long long)DS_TOOL_TIMEOUT_S * 1000 -
                            ((t.tv_sec - t0.tv_sec) * 1000LL + (t.tv_nsec - t0.tv_nsec) / 1000000);
        if (left_ms <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        int pr = poll(&pf, 1, left_ms > 60000 ? 60000 : (int)left_ms);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) continue;
        char buf[1024];
        ssize_t r = read(p[0], buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        size_t take = (size_t)r < cap - 1 - used ? (size_t)r : cap - 1 - used;
        memcpy(out + used, buf, take);
        used += take;
        out[used] = '\0';
    }
    close(p[0]);
    if (timed_out) kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (timed_out)
        return fb_errf(out, cap, FB_ERR_IO, "the data tool ran longer than %d s and was stopped",
                       DS_TOOL_TIMEOUT_S);
    if (!WIFEXITED(st))
        return fb_errf(out, cap, FB_ERR_IO, "the data tool was killed by signal %d",
                       WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    *status = WEXITSTATUS(st);
    return FB_OK;
}

/* ---- the import connection -------------------------------------------------------- */

/* A connection of the import's own (the pool's belong to requests), with the
 * request connections' settings that matter to it: the statement limit, UTC,
 * and no JIT (server/db.c's conn_open says why; the import's statements are
 * as short as a request's). */
PGconn *fb_ds_import_connect(const fb_config *cfg, char *msg, size_t msg_cap)
{
    char options[128];
    snprintf(options, sizeof options, "-c statement_timeout=%d -c TimeZone=UTC -c jit=off",
             cfg->request_timeout_ms);
    const char *keys[] = {"dbname", "application_name", "connect_timeout", "options", NULL};
    const char *vals[] = {cfg->database_url, "fuseboxd-dataset-import", "3", options, NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (!c || PQstatus(c) != CONNECTION_OK) {
        fb_log_json(FB_LOG_WARN, "dataset import: cannot connect to PostgreSQL",
                    json_pack("{s:s}", "detail", c ? PQerrorMessage(c) : "out of memory"));
        PQfinish(c);
        fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE, "the database is unreachable; retry");
        return NULL;
    }
    return c;
}

/* One statement on an import connection, with fb_db_query's error mapping. */
PGresult *fb_ds_import_exec(PGconn *c, const char *sql, int n, const char *const *vals, int *err,
                            char *msg, size_t msg_cap)
{
    PGresult *r = PQexecParams(c, sql, n, NULL, vals, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return r;
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    if (state && strcmp(state, "23505") == 0) {
        *err = fb_errf(msg, msg_cap, FB_ERR_ALREADY_EXISTS, "already exists");
    } else if (PQstatus(c) != CONNECTION_OK || (state && strncmp(state, "57", 2) == 0)) {
        *err = fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE, "the database is unavailable; retry");
    } else {
        fb_log_json(FB_LOG_ERROR, "dataset SQL failed",
                    json_pack("{s:s}", "detail", r ? PQresultErrorMessage(r) : "no result"));
        *err = fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "a database statement failed");
    }
    PQclear(r);
    return NULL;
}

/* Runs a statement whose result does not matter beyond success. */
int fb_ds_import_do(PGconn *c, const char *sql, int n, const char *const *vals, char *msg,
                    size_t msg_cap)
{
    int err = FB_OK;
    PGresult *r = fb_ds_import_exec(c, sql, n, vals, &err, msg, msg_cap);
    PQclear(r);
    return r ? FB_OK : err;
}

/* ---- imports ---------------------------------------------------------------------- */

fb_ds_import *fb_ds_import_new(void)
{
    fb_ds_import *im = calloc(1, sizeof *im);
    if (!im) return NULL;
    im->header = -1;
    for (int i = 0; i < 2; i++)
        im->in[i].fd[0] = im->in[i].fd[1] = -1;
    return im;
}

void fb_ds_import_free(fb_ds_import *im)
{
    if (!im) return;
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++)
            if (im->in[i].fd[k] >= 0) close(im->in[i].fd[k]);
    PQfinish(im->pg);
    free(im);
}

/*
 * The error of an import that ran out of space while writing split (NULL:
 * outside the data tool), with detail (what failed, may be "") for the
 * tenant, who cannot free the space: what was kept and how to retry.  The
 * administrator, who can, is told in the log.
 */
static int no_space(const fb_ds_import *im, char *err, size_t cap, const char *split,
                    const char *detail)
{
    fb_log_json(FB_LOG_ERROR, "dataset import: the datasets directory is full",
                json_pack("{s:s, s:s, s:s, s:s}", "dir", im->tenant_dir, "dataset", im->name,
                          "split", split ? split : "", "detail", detail));
    char where[DS_SPLIT_MAX + 32] = "";
    if (split) snprintf(where, sizeof where, " while writing split %s", split);
    return fb_errf(err, cap, FB_ERR_NO_SPACE,
                   "insufficient storage: the server's datasets disk filled up%s (%s); "
                   "nothing of this import was kept; %s once space is freed",
                   where, detail[0] ? detail : "no space left on device",
                   im->update ? "the dataset is as it was before; upload the split again"
                              : "delete the dataset and import it again");
}

/* Runs the tool on one input split into the staging directory. */
static int import_split(const fb_ds_import *im, const fb_ds_input *in, const char *staging,
                        char *err, size_t cap)
{
    char out_arg[PATH_MAX + 16], name_arg[DS_NAME_MAX + 16], split_arg[DS_SPLIT_MAX + 16];
    char label_arg[DS_LABEL_MAX + 32], images_arg[32], labels_arg[32];
    snprintf(out_arg, sizeof out_arg, "--out=%s", staging);
    snprintf(name_arg, sizeof name_arg, "--name=%s", im->name);
    snprintf(split_arg, sizeof split_arg, "--split=%s", in->split);
    char *argv[12];
    int a = 0;
    argv[a++] = (char *)im->tool;
    argv[a++] = "import";
    char context_arg[48], stride_arg[48];
    if (im->text) {
        snprintf(context_arg, sizeof context_arg, "--context=%lld", im->context);
        snprintf(stride_arg, sizeof stride_arg, "--stride=%lld",
                 im->stride ? im->stride : im->context);
        argv[a++] = "text";
        argv[a++] = "/dev/fd/3";
        argv[a++] = context_arg;
        argv[a++] = stride_arg;
    } else if (im->csv) {
        snprintf(label_arg, sizeof label_arg, "--label-column=%s", im->label_column);
        argv[a++] = "csv";
        argv[a++] = "/dev/fd/3";
        argv[a++] = label_arg;
        if (im->header >= 0) argv[a++] = im->header ? "--header" : "--no-header";
    } else {
        snprintf(images_arg, sizeof images_arg, "--images=/dev/fd/3");
        snprintf(labels_arg, sizeof labels_arg, "--labels=/dev/fd/4");
        argv[a++] = "idx";
        argv[a++] = images_arg;
        argv[a++] = labels_arg;
    }
    argv[a++] = out_arg;
    argv[a++] = name_arg;
    argv[a++] = split_arg;
    argv[a] = NULL;
    char text[DS_ERR_MAX];
    int status = 0;
    int rc = run_tool(argv, in->fd, im->csv || im->text ? 1 : 2, &status, text, sizeof text);
    if (rc) return fb_errf(err, cap, rc, "split %s: %s", in->split, text);
    if (status == 0) return FB_OK;
    char prefix[PATH_MAX + 2];
    snprintf(prefix, sizeof prefix, "%s/", staging);
    /* the tool names the code of its error in parentheses; the server's own code says it */
    const char *from[] = {"fusebox-data: ", "/dev/fd/3", "/dev/fd/4", prefix,
                          " (insufficient_storage)"};
    const char *to[] = {"", in->shown[0], in->shown[1], "", ""};
    char clean[DS_ERR_MAX];
    rewrite_text(clean, sizeof clean, text, from, to, 5);
    if (status == DS_TOOL_NO_SPACE) return no_space(im, err, cap, in->split, clean);
    return fb_errf(err, cap, status == 1 ? FB_ERR_DATA : FB_ERR_INTERNAL, "split %s: %s", in->split,
                   clean[0] ? clean : "the data tool failed without saying why");
}

/* Runs `fusebox-data verify` on the staging directory. */
static int import_verify(const fb_ds_import *im, const char *staging, char *err, size_t cap)
{
    char *argv[] = {(char *)im->tool, "verify", (char *)staging, NULL};
    char text[DS_ERR_MAX];
    int status = 0;
    int rc = run_tool(argv, NULL, 0, &status, text, sizeof text);
    if (rc) return fb_errf(err, cap, rc, "verify: %s", text);
    if (status == 0) return FB_OK;
    char prefix[PATH_MAX + 2];
    snprintf(prefix, sizeof prefix, "%s/", staging);
    const char *from[] = {"fusebox-data: ", prefix};
    const char *to[] = {"", ""};
    char clean[DS_ERR_MAX];
    rewrite_text(clean, sizeof clean, text, from, to, 2);
    if (status == DS_TOOL_NO_SPACE) return no_space(im, err, cap, NULL, clean);
    return fb_errf(err, cap, FB_ERR_DATA, "the imported dataset did not verify: %s", clean);
}

/* Exchanges the directory entries a and b of tdir: atomically where the
 * file system can (renameat2), else (NFS) by three renames through spare. */
static int swap_dirs(int tdir, const char *a, const char *b, const char *spare)
{
    if (renameat2(tdir, a, tdir, b, RENAME_EXCHANGE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return -1;
    if (renameat(tdir, b, tdir, spare) != 0) return -1;
    if (renameat(tdir, a, tdir, b) != 0) {
        renameat(tdir, spare, tdir, b);
        return -1;
    }
    if (renameat(tdir, spare, tdir, a) != 0)
        fb_log_json(FB_LOG_WARN, "dataset import: an old copy stays behind",
                    json_pack("{s:s}", "name", spare));
    return 0;
}

/*
 * Records the import as ready and moves its directory into place, in one
 * transaction, under the directory mutex: the quota is checked with the
 * tenant's row locked, and a commit that fails moves the directory back.
 * FB_ERR_NOT_FOUND when the row is no longer importing (it was recovered
 * after a lost connection): the import is then abandoned.
 */
static int import_finish(fb_ds_import *im, int tdir, const char *stage_name, json_t *summary,
                         long long bytes, char *err, size_t cap)
{
    int rc;
    char bytes_s[24], *record = NULL;
    snprintf(bytes_s, sizeof bytes_s, "%lld", bytes);
    json_t *rec = json_pack("{s:O}", "summary", summary);
    record = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    json_decref(rec);
    if (!record) return fb_errf(err, cap, FB_ERR_NOMEM, "out of memory");
    if (PQstatus(im->pg) != CONNECTION_OK) PQreset(im->pg);
    pthread_mutex_lock(&fb_ds_fs_mu);
    bool moved = false;
    const char *v1[1] = {im->tenant_id}, *v2[2] = {im->tenant_id, im->id};
    const char *v3[3] = {im->id, bytes_s, record};
    PGresult *r = NULL;
    if ((rc = fb_ds_import_do(im->pg, "BEGIN", 0, NULL, err, cap))) goto done;
    if (!(r = fb_ds_import_exec(im->pg,
                                "SELECT max_dataset_bytes FROM tenants WHERE id = $1::uuid"
                                " FOR NO KEY UPDATE",
                                1, v1, &rc, err, cap)))
        goto rollback;
    long long max = PQntuples(r) == 1 ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : -1;
    PQclear(r);
    if (!(r = fb_ds_import_exec(im->pg,
                                "SELECT coalesce(sum(bytes), 0) FROM datasets"
                                " WHERE tenant_id = $1::uuid AND id <> $2::uuid",
                                2, v2, &rc, err, cap)))
        goto rollback;
    long long others = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    if (max < 0) {
        rc = fb_errf(err, cap, FB_ERR_NOT_FOUND, "the tenant was deleted");
        goto rollback;
    }
    if (others + bytes > max) {
        rc = fb_errf(err, cap, FB_ERR_QUOTA_EXCEEDED,
                     "the imported dataset takes %lld bytes, more than the %lld bytes the "
                     "tenant's max_dataset_bytes quota leaves",
                     bytes, max - others > 0 ? max - others : 0);
        goto rollback;
    }
    if (!(r = fb_ds_import_exec(im->pg,
                                "UPDATE datasets SET state = 'ready', bytes = $2::bigint,"
                                " manifest = $3::jsonb WHERE id = $1::uuid AND state = 'importing'"
                                " RETURNING 1",
                                3, v3, &rc, err, cap)))
        goto rollback;
    bool claimed = PQntuples(r) == 1;
    PQclear(r);
    if (!claimed) {
        rc = fb_errf(err, cap, FB_ERR_NOT_FOUND, "the import was abandoned");
        goto rollback;
    }
    char spare[64];
    snprintf(spare, sizeof spare, ".swap-%s", im->id);
    if (im->update) {
        moved = swap_dirs(tdir, stage_name, im->name, spare) == 0;
    } else {
        rm_at(tdir, im->name, DS_TREE_DEPTH); /* what a crash left of an earlier one */
        moved = renameat(tdir, stage_name, tdir, im->name) == 0;
    }
    if (!moved) {
        int e = errno;
        fb_log_json(FB_LOG_ERROR, "dataset import: cannot move the dataset into place",
                    json_pack("{s:s, s:s}", "dir", im->tenant_dir, "detail", strerror(e)));
        rc = fb_err_write_errno(e) == FB_ERR_NO_SPACE
                 ? no_space(im, err, cap, NULL, strerror(e))
                 : fb_errf(err, cap, FB_ERR_IO, "the server could not move the dataset into place");
        goto rollback;
    }
    if ((rc = fb_ds_import_do(im->pg, "COMMIT", 0, NULL, err, cap))) {
        if (im->update)
            swap_dirs(tdir, stage_name, im->name, spare);
        else
            renameat(tdir, im->name, tdir, stage_name);
        rc = fb_errf(err, cap, FB_ERR_UNAVAILABLE,
                     "the database went away while the import was recorded");
    }
    goto done;
rollback:
    fb_ds_import_do(im->pg, "ROLLBACK", 0, NULL, NULL, 0);
done:
    pthread_mutex_unlock(&fb_ds_fs_mu);
    free(record);
    return rc;
}

/* Records a failed import: a new dataset turns failed, one that had data
 * turns ready again as it was; both keep the error. */
static void import_record_failure(fb_ds_import *im, const char *error)
{
    if (PQstatus(im->pg) != CONNECTION_OK) PQreset(im->pg);
    const char *v[2] = {im->id, error};
    char msg[FB_MSG_MAX];
    int err =
        fb_ds_import_do(im->pg,
                        "UPDATE datasets SET state = CASE WHEN manifest ? 'summary' THEN 'ready'"
                        " ELSE 'failed' END, manifest = (coalesce(manifest, '{}') - 'importing')"
                        " || jsonb_build_object('error', $2::text)"
                        " WHERE id = $1::uuid AND state = 'importing'",
                        2, v, msg, sizeof msg);
    if (err)
        fb_log_json(FB_LOG_ERROR, "dataset import: cannot record the failure",
                    json_pack("{s:s, s:s}", "dataset", im->id, "detail", msg));
}

/* The import thread: stage, import each split, verify, read the manifest,
 * then move into place; on any failure remove the staging directory. */
static void *import_main(void *arg)
{
    fb_ds_import *im = arg;
    char stage_name[64], staging[PATH_MAX + 80], err[DS_ERR_MAX] = "";
    snprintf(stage_name, sizeof stage_name, ".import-%s", im->id);
    snprintf(staging, sizeof staging, "%s/%s", im->tenant_dir, stage_name);
    json_t *summary = NULL;
    long long bytes = 0;
    int rc = FB_OK;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int tdir = open(im->tenant_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (tdir < 0) {
        rc = fb_errf(err, sizeof err, FB_ERR_IO, "the server cannot open its datasets directory");
        goto out;
    }
    rm_at(tdir, stage_name, DS_TREE_DEPTH);
    bool staged = im->update ? link_tree(tdir, im->name, tdir, stage_name, DS_TREE_DEPTH) == 0
                             : mkdirat(tdir, stage_name, 0750) == 0;
    if (!staged) {
        int e = errno;
        fb_log_json(FB_LOG_ERROR, "dataset import: cannot stage",
                    json_pack("{s:s, s:s}", "path", staging, "detail", strerror(e)));
        rc = fb_err_write_errno(e) == FB_ERR_NO_SPACE
                 ? no_space(im, err, sizeof err, NULL, strerror(e))
                 : fb_errf(err, sizeof err, FB_ERR_IO, "the server could not prepare the import");
        goto out;
    }
    for (int i = 0; i < im->n_inputs && !rc; i++)
        rc = import_split(im, &im->in[i], staging, err, sizeof err);
    if (!rc) rc = import_verify(im, staging, err, sizeof err);
    if (!rc) {
        int sfd = openat(tdir, stage_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        char msg[DS_ERR_MAX];
        rc = sfd < 0 ? fb_errf(msg, sizeof msg, FB_ERR_IO, "the staged dataset vanished")
                     : read_manifest(sfd, im->name, &summary, &bytes, msg, sizeof msg);
        if (sfd >= 0) close(sfd);
        if (rc) fb_errf(err, sizeof err, rc, "the data tool's output is not acceptable: %s", msg);
    }
    if (!rc) rc = import_finish(im, tdir, stage_name, summary, bytes, err, sizeof err);
out:
    /* after a swap the staging name holds the dataset as it was before */
    if (tdir >= 0) {
        if (rm_at(tdir, stage_name, DS_TREE_DEPTH) != 0)
            fb_log_json(FB_LOG_WARN, "dataset import: could not remove the staging directory",
                        json_pack("{s:s}", "path", staging));
        close(tdir);
    }
    if (rc && rc != FB_ERR_NOT_FOUND) import_record_failure(im, err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    if (rc)
        fb_log_json(FB_LOG_WARN, "dataset import failed",
                    json_pack("{s:s, s:s, s:s, s:f, s:s}", "tenant", im->tenant_id, "dataset",
                              im->name, "id", im->id, "ms", ms, "error", err));
    else
        fb_log_json(FB_LOG_INFO, "dataset imported",
                    json_pack("{s:s, s:s, s:s, s:f, s:I}", "tenant", im->tenant_id, "dataset",
                              im->name, "id", im->id, "ms", ms, "bytes", (json_int_t)bytes));
    json_decref(summary);
    fb_ds_import_free(im);
    atomic_fetch_sub(&active_imports, 1);
    return NULL;
}

/* Takes one of the DS_MAX_IMPORTS slots, or refuses the request. */
int fb_ds_import_slot_take(fb_req *req)
{
    if (atomic_load(&req->srv->draining))
        return fb_req_fail(req, FB_ERR_UNAVAILABLE, NULL, "the server is shutting down");
    if (atomic_fetch_add(&active_imports, 1) >= DS_MAX_IMPORTS) {
        atomic_fetch_sub(&active_imports, 1);
        return fb_req_fail(req, FB_ERR_UNAVAILABLE, NULL,
                           "%d dataset imports are running; retry when one has finished",
                           DS_MAX_IMPORTS);
    }
    return FB_OK;
}

void fb_ds_import_slot_give(void)
{
    atomic_fetch_sub(&active_imports, 1);
}

/* Starts the import thread, which owns im from then on.  When no thread
 * can start, the row is marked failed and im freed here. */
int fb_ds_import_start(fb_req *req, fb_ds_import *im)
{
    pthread_attr_t attr;
    pthread_t th;
    bool ok = pthread_attr_init(&attr) == 0;
    if (ok) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        ok = pthread_create(&th, &attr, import_main, im) == 0;
        pthread_attr_destroy(&attr);
    }
    if (ok) return FB_OK;
    import_record_failure(im, "the server could not start the import");
    fb_ds_import_free(im);
    atomic_fetch_sub(&active_imports, 1);
    return fb_req_fail(req, FB_ERR_UNAVAILABLE, NULL, "the server could not start the import");
}

/* ---- stale imports --------------------------------------------------------------- */

typedef struct recover {
    const char *tenant_id;
    int n;
    char id[16][FB_UUID_LEN + 1];
    char name[16][DS_NAME_MAX + 1];
    bool had_data[16];
} recover;

static int recover_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    recover *x = arg;
    int err;
    const char *v[1] = {x->tenant_id};
    fb_db_autocommit(c);
    PGresult *r = fb_db_query(
        c, "ds_recover",
        "UPDATE datasets d SET state = CASE WHEN d.manifest ? 'summary' THEN 'ready'"
        " ELSE 'failed' END, manifest = (coalesce(d.manifest, '{}') - 'importing')"
        " || jsonb_build_object('error', 'the import was interrupted when the server stopped; '"
        " || CASE WHEN d.manifest ? 'summary' THEN 'the dataset is as it was before it'"
        " ELSE 'delete the dataset and import it again' END)"
        " WHERE d.id IN (SELECT s.id FROM datasets s WHERE s.tenant_id = $1::uuid"
        " AND s.state = 'importing' LIMIT 16)"
        " AND d.state = 'importing'"
        " AND pg_try_advisory_xact_lock(hashtextextended('fusebox-dataset:' || d.id::text, 0))"
        " RETURNING d.id, d.name, coalesce(d.manifest ? 'summary', false)",
        1, v, &err, msg, msg_cap);
    if (!r) return err;
    x->n = 0;
    for (int i = 0; i < PQntuples(r) && x->n < 16; i++, x->n++) {
        snprintf(x->id[x->n], sizeof x->id[0], "%s", PQgetvalue(r, i, 0));
        snprintf(x->name[x->n], sizeof x->name[0], "%s", PQgetvalue(r, i, 1));
        x->had_data[x->n] = PQgetvalue(r, i, 2)[0] == 't';
    }
    PQclear(r);
    return FB_OK;
}

/*
 * Finishes the imports of the tenant whose fuseboxd stopped: a row that is
 * importing while nobody holds its lock.  What they left on disk goes too:
 * the staging directory, the spare name of a swap and, for a new dataset,
 * anything under its name.
 */
int fb_ds_recover_stale(fb_req *req)
{
    recover x = {.tenant_id = req->key.tenant_id};
    int err = fb_route_txn(req, recover_txn, &x);
    if (err || x.n == 0) return err;
    char dir[PATH_MAX], msg[FB_MSG_MAX];
    if (fb_ds_tenant_dir(&req->srv->cfg, x.tenant_id, dir, sizeof dir, msg, sizeof msg))
        return FB_OK;
    pthread_mutex_lock(&fb_ds_fs_mu);
    for (int i = 0; i < x.n; i++) {
        char stage[64];
        snprintf(stage, sizeof stage, ".import-%s", x.id[i]);
        fb_ds_rm_path(dir, stage);
        snprintf(stage, sizeof stage, ".swap-%s", x.id[i]);
        fb_ds_rm_path(dir, stage);
        if (!x.had_data[i]) fb_ds_rm_path(dir, x.name[i]);
        fb_log_json(FB_LOG_WARN, "dataset import was interrupted",
                    json_pack("{s:s, s:s}", "tenant", x.tenant_id, "dataset", x.name[i]));
    }
    pthread_mutex_unlock(&fb_ds_fs_mu);
    return FB_OK;
}
