/*
 * fusebox-worker --stage-dir, end to end: fuseboxd on a fresh test database and real
 * workers on the shard dataset "synth".
 *
 *   1. Bad flags and variables, as a table: each is refused (exit 2) with its message.
 *   2. A worker with --stage-dir trains a job through the staged copy: the cache holds
 *      the training shards, byte for byte the originals.
 *   3. The staged copies corrupted in place (same size): the next job's array detects
 *      it (the whole-file checksum of every use), copies them afresh, and trains; the
 *      cache holds the originals again.
 *   4. Staging that cannot work on a node, as a table (the directory is a file, it lies
 *      under a file, the disk is full): the worker's array leaves uncounted, the job is
 *      back in the queue with restarts 0 and the worker's message, and the worker drains
 *      and exits 1 saying why.  A good worker then trains every such job to completion,
 *      restarts still 0.
 */
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "e2e.h"

#define WAIT_S 120 /* liveness bounds */

static e2e T;
static char mnt[400]; /* the full disk's tmpfs, unmounted on every exit */

static void unmount_tmpfs(void)
{
    if (mnt[0]) umount2(mnt, MNT_DETACH);
}

static void on_abort(int sig)
{
    unmount_tmpfs();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* The cache's shard files ("<crc32c>-<bytes>-<file name>"), each compared with its original
 * in synth's directory; corrupt flips a byte of each instead.  Returns how many there are. */
static int check_cache(const char *cache, bool corrupt)
{
    DIR *d = opendir(cache);
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *dash = strchr(e->d_name, '-');
        dash = dash ? strchr(dash + 1, '-') : NULL;
        if (e->d_name[0] == '.' || !dash) continue;
        char cpath[800], opath[800];
        snprintf(cpath, sizeof cpath, "%s/%s", cache, e->d_name);
        /* the manifest's path may have a directory; the cache keeps the base name */
        char pat[800];
        glob_t gl;
        snprintf(pat, sizeof pat, "%s/synth/{,*/}%s", T.data_dir, dash + 1);
        CHECK(glob(pat, GLOB_BRACE, NULL, &gl) == 0 && gl.gl_pathc == 1);
        snprintf(opath, sizeof opath, "%s", gl.gl_pathv[0]);
        globfree(&gl);
        size_t cl = 0, ol = 0;
        char *c = fb_test_read_file(cpath, &cl), *o = fb_test_read_file(opath, &ol);
        CHECK(c && o);
        if (corrupt) {
            c[cl / 2] ^= 0x5a;
            FILE *f = fopen(cpath, "wb");
            CHECK(f && fwrite(c, 1, cl, f) == cl && fclose(f) == 0);
        } else if (cl != ol || memcmp(c, o, cl) != 0) {
            fprintf(stderr, "%s differs from %s\n", cpath, opath);
            CHECK(0);
        }
        free(c);
        free(o);
        n++;
    }
    closedir(d);
    return n;
}

/* The last "staged synth" line of the worker's log: its re-staged count (-1: none). */
static int last_restaged(const char *worker)
{
    char path[400];
    snprintf(path, sizeof path, "%s/worker-%s.log", T.root, worker);
    size_t len = 0;
    char *log = fb_test_read_file(path, &len);
    CHECK(log != NULL);
    int restaged = -1;
    for (char *p = log; (p = strstr(p, "staged synth in ")); p++) {
        char *c = strstr(p, " copied, ");
        if (c) restaged = atoi(c + strlen(" copied, "));
    }
    free(log);
    return restaged;
}

static bool log_has(const char *worker, const char *text)
{
    char path[400];
    snprintf(path, sizeof path, "%s/worker-%s.log", T.root, worker);
    size_t len = 0;
    char *log = fb_test_read_file(path, &len);
    bool yes = log && strstr(log, text);
    free(log);
    return yes;
}

typedef struct flag_case {
    const char *what;
    const char *args; /* after --server, --server-key, --key */
    const char *env;  /* an assignment, or NULL */
    const char *says;
} flag_case;

static void bad_flags(void)
{
    char base[1200];
    snprintf(base, sizeof base,
             "%s/workers/fusebox-worker --server tcp://127.0.0.1:%d --server-key %s --key %s",
             getenv("FB_BINARY_DIR"), T.worker_port, T.server_pub, T.worker_key);
    const flag_case cases[] = {
        {"bound 0", "--stage-dir /tmp/x --stage-bytes 0", NULL,
         "--stage-bytes needs a positive integer of bytes, not '0'"},
        {"negative bound", "--stage-dir /tmp/x --stage-bytes -5", NULL,
         "--stage-bytes needs a positive integer of bytes, not '-5'"},
        {"bound with a unit", "--stage-dir /tmp/x --stage-bytes 12G", NULL,
         "--stage-bytes needs a positive integer of bytes, not '12G'"},
        {"bound past 64 bits", "--stage-dir /tmp/x --stage-bytes 99999999999999999999999", NULL,
         "--stage-bytes needs a positive integer of bytes"},
        {"bound from the environment", "--stage-dir /tmp/x", "FUSEBOX_WORKER_STAGE_BYTES=abc",
         "FUSEBOX_WORKER_STAGE_BYTES needs a positive integer of bytes, not 'abc'"},
        {"bound without a directory", "--stage-bytes 4096", NULL,
         "--stage-bytes bounds --stage-dir, which is not given"},
        {"empty directory", "--stage-dir ''", NULL, "--stage-dir needs a value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const flag_case *c = &cases[i];
        char cmd[2000], out[4096] = "";
        snprintf(cmd, sizeof cmd, "%s %s %s 2>&1", c->env ? c->env : "", base, c->args);
        FILE *p = popen(cmd, "r");
        CHECK(p != NULL);
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = 0;
        int st = pclose(p);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 2 || !strstr(out, c->says)) {
            fprintf(stderr, "case %s: status %d, said:\n%s\nexpected exit 2 and: %s\n", c->what,
                    WIFEXITED(st) ? WEXITSTATUS(st) : -1, out, c->says);
            CHECK(0);
        }
        printf("flags: %-28s refused: %s\n", c->what, c->says);
    }
}

/* Waits for the worker's exit; its status. */
static int wait_exit(pid_t pid, const char *what)
{
    double start = fbt_now_ms();
    for (;;) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
        if (fbt_now_ms() - start > WAIT_S * 1000.0) {
            fprintf(stderr, "%s did not exit\n", what);
            e2e_dump(&T);
            CHECK(0);
        }
        usleep(50 * 1000);
    }
}

typedef struct stage_case {
    const char *what, *name; /* name: the worker's and the job's */
    const char *says;        /* in the worker's message */
    char dir[600];
} stage_case;

int main(void)
{
    signal(SIGABRT, on_abort);
    atexit(unmount_tmpfs);
    e2e_start(&T, NULL);
    bad_flags();

    /* 2. trained through the staged copy */
    char cache[400];
    snprintf(cache, sizeof cache, "%s/stage", T.root);
    const char *const flags[] = {"--stage-dir", cache, NULL};
    pid_t w = e2e_worker_args(&T, "w-stage", flags);
    char a[64], b[64];
    snprintf(a, sizeof a, "%s", e2e_submit(&T, T.key, e2e_spec("stage-a", 0.01, 60, 20)));
    e2e_wait_state(&T, T.key, a, "completed", WAIT_S);
    int n = check_cache(cache, false);
    CHECK(n > 0);
    CHECK_INT_EQ(last_restaged("w-stage"), 0);
    printf("staged: %d shard file(s) in the cache, equal to the originals; job completed\n", n);

    /* 3. corrupted in place: detected on the next use and copied afresh */
    CHECK_INT_EQ(check_cache(cache, true), n);
    snprintf(b, sizeof b, "%s", e2e_submit(&T, T.key, e2e_spec("stage-b", 0.01, 60, 20)));
    e2e_wait_state(&T, T.key, b, "completed", WAIT_S);
    CHECK_INT_EQ(last_restaged("w-stage"), n);
    CHECK_INT_EQ(check_cache(cache, false), n);
    CHECK_STR_EQ(e2e_job_field(&T, T.key, b, "restarts"), "0");
    printf("corrupted: %d staged file(s) re-staged on the next use; job completed\n", n);
    CHECK_INT_EQ(e2e_kill(w, SIGTERM), 0);

    /* 4. staging that cannot work: the node's fault, not the job's */
    stage_case cases[3] = {{"the directory is a file", "w-file", "is not a directory", ""},
                           {"it lies under a file", "w-under", "Not a directory", ""},
                           {"the disk is full", "w-full", "No space left on device", ""}};
    char file[400];
    snprintf(file, sizeof file, "%s/a-file", T.root);
    e2e_write(file, "not a directory\n");
    snprintf(cases[0].dir, sizeof cases[0].dir, "%s", file);
    snprintf(cases[1].dir, sizeof cases[1].dir, "%s/stage", file);
    snprintf(mnt, sizeof mnt, "%s/small", T.root);
    CHECK(mkdir(mnt, 0700) == 0);
    /* smaller than synth's training shard (2048 records of 16 floats) */
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=64k,mode=0700") != 0) {
        int e = errno;
        mnt[0] = 0;
        e2e_finish(&T);
        return fb_test_missing("cannot mount a tmpfs (needs root): %s", strerror(e));
    }
    snprintf(cases[2].dir, sizeof cases[2].dir, "%s/stage", mnt);
    char ids[3][64];
    for (int i = 0; i < 3; i++) {
        stage_case *c = &cases[i];
        const char *const bad[] = {"--stage-dir", c->dir, NULL};
        pid_t wb = e2e_worker_args(&T, c->name, bad);
        snprintf(ids[i], sizeof ids[i], "%s",
                 e2e_submit(&T, T.key, e2e_spec(c->name, 0.01, 60, 20)));
        int st = wait_exit(wb, c->name);
        if (st != 1 || !log_has(c->name, "node-local staging failed, so the worker drained") ||
            !log_has(c->name, c->says)) {
            fprintf(stderr, "case %s: exit %d\n", c->what, st);
            e2e_dump(&T);
            CHECK(0);
        }
        e2e_wait_state(&T, T.key, ids[i], "queued", WAIT_S);
        CHECK_STR_EQ(e2e_job_field(&T, T.key, ids[i], "restarts"), "0");
        char sql[400];
        snprintf(sql, sizeof sql,
                 "SELECT count(*) > 0 FROM job_events WHERE job_id = '%s' AND kind = 'requeued'"
                 " AND message LIKE '%%node-local staging failed%%'",
                 ids[i]);
        e2e_wait_sql(&T, sql, WAIT_S, "the job re-queued with the staging failure");
        printf("bad staging: %-24s worker exit 1, job re-queued, restarts 0\n", c->what);
    }
    w = e2e_worker_args(&T, "w-good", flags);
    for (int i = 0; i < 3; i++) {
        e2e_wait_state(&T, T.key, ids[i], "completed", WAIT_S);
        CHECK_STR_EQ(e2e_job_field(&T, T.key, ids[i], "restarts"), "0");
    }
    printf("a good worker trained all three to completion, restarts 0\n");
    CHECK_INT_EQ(e2e_kill(w, SIGTERM), 0);
    unmount_tmpfs();
    mnt[0] = 0;
    e2e_finish(&T);
    printf("test_dispatch_stage: ok\n");
    return 0;
}
