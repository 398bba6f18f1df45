/*
 * The disk fills up while fuseboxd imports a dataset, end to end on real
 * processes.  The tenant's datasets directory is a small tmpfs of the test's
 * own (mounted as root; skipped with 77 where mounting is not permitted),
 * holding one dataset imported before ("base").  Each round a filler file
 * takes every free byte but a chosen number of pages, so that the next
 * import of the same CSV files runs out of space at a chosen point: before
 * its first shard (nothing free), in the middle of a shard (part of one
 * shard's pages free), at a manifest write (every shard's pages free, not
 * the manifest's), in the new split of an upload to a ready dataset (room
 * for the spooled body, not for the shard), or in the upload's body itself.
 * Counted and checked each round: the import fails as insufficient storage
 * with a message that names the file it could not write (a new dataset
 * turns failed, never ready; a ready one stays ready with its files
 * unchanged), the tmpfs holds nothing but the datasets and every page comes
 * back, "base" is unchanged (the SHA-256 of every file, and its row),
 * fuseboxd stays up and logs why.  Then the filler goes and the same import
 * (after the documented delete) or upload succeeds, with shards equal byte
 * for byte to those of "base"; at the end a job trains on each.  Short mode:
 * one round per point; --long: 10 per point, the pages left chosen at
 * random.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "rel.h"

#define TMPFS_SIZE "8m"
#define FEATURES 16
#define TRAIN_ROWS 12000
#define TEST_ROWS 2000
#define SHORT_ROUNDS 5
#define LONG_ROUNDS 50
#define IMPORT_TIMEOUT_MS 120000

static e2e T;
static char mnt[400], filler[460], src[300];
static bool mounted;
static long page_size;

enum point { BEFORE_SHARD, MID_SHARD, AT_MANIFEST, UPLOAD_SPLIT, UPLOAD_BODY, N_POINTS };
static const char *const point_name[N_POINTS] = {"before_shard", "mid_shard", "at_manifest",
                                                 "upload_split", "upload_body"};

static void cleanup(void)
{
    if (mounted) umount2(mnt, MNT_DETACH);
    mounted = false;
}

/* A failed check aborts, which runs no atexit handler: unmount here too, so
 * that a failing run leaves no tmpfs mounted (abort then ends the process). */
static void on_abort(int sig)
{
    (void)sig;
    if (mounted) umount2(mnt, MNT_DETACH);
}

/* Writes the CSV split path: FEATURES values in [-1, 1) and a label of 4
 * classes that a small MLP can learn (the dispatch suite's synthetic rule). */
static void write_csv(const char *path, int rows, unsigned long long seed)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    for (int c = 0; c < FEATURES; c++)
        fprintf(f, "f%d,", c);
    fprintf(f, "label\n");
    unsigned long long s = seed;
    for (int i = 0; i < rows; i++) {
        double score[4] = {0, 0, 0, 0};
        for (int c = 0; c < FEATURES; c++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            double v = (double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
            fprintf(f, "%.6f,", v);
            for (int k = 0; k < 4; k++)
                score[k] += v * (double)(((c * 7 + k * 3) % 5) - 2);
        }
        int best = 0;
        for (int k = 1; k < 4; k++)
            if (score[k] > score[best]) best = k;
        fprintf(f, "%d\n", best);
    }
    CHECK(fclose(f) == 0);
}

/* SHA-256 over every file below dir, names included (static buffer); ""
 * when dir cannot be read. */
static const char *tree_sha256(const char *dir)
{
    static char out[65];
    char cmd[900];
    snprintf(cmd, sizeof cmd,
             "cd '%s' 2>/dev/null && find . -type f -print0 | sort -z | xargs -0 sha256sum |"
             " sha256sum",
             dir);
    out[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (!p) return out;
    if (fscanf(p, "%64s", out) != 1) out[0] = '\0';
    pclose(p);
    return out;
}

/* The directory of dataset name on the tmpfs (static buffer). */
static const char *path_of(const char *name)
{
    static char out[600];
    snprintf(out, sizeof out, "%s/%s", mnt, name);
    return out;
}

/* The contents of the import root's file name (the caller's), its length in *len. */
static char *read_file(const char *name, size_t *len)
{
    char path[400];
    snprintf(path, sizeof path, "%s/%s", src, name);
    char *buf = fb_test_read_file(path, len);
    CHECK(buf != NULL && *len > 0);
    return buf;
}

/* Pages a file of the tmpfs holds. */
static long long pages_of(const char *rel)
{
    char path[800];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", mnt, rel);
    CHECK(stat(path, &st) == 0);
    return ((long long)st.st_blocks * 512 + page_size - 1) / page_size;
}

static long long free_bytes(void)
{
    struct statvfs v;
    CHECK(statvfs(mnt, &v) == 0);
    return (long long)v.f_bavail * (long long)v.f_frsize;
}

/* Makes the filler take every free byte but leave_pages pages: writes
 * until ENOSPC, then gives back whole pages from its end. */
static void fill_disk(long long leave_pages)
{
    long long total = rel_fill_disk(filler);
    int fd = open(filler, O_WRONLY);
    CHECK(fd >= 0);
    CHECK_INT_EQ(free_bytes(), 0);
    CHECK(total >= leave_pages * page_size);
    CHECK(ftruncate(fd, total - leave_pages * page_size) == 0);
    close(fd);
    CHECK_INT_EQ(free_bytes(), leave_pages * page_size);
}

/* GET /v1/datasets/name; the response's JSON is the caller's. */
static json_t *get_dataset(const char *name, int *status)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/datasets/%s", name);
    fbt_resp r = fbt_call(&T.s, "GET", path, T.key, NULL);
    *status = r.status;
    json_t *j = r.json ? json_incref(r.json) : NULL;
    fbt_resp_free(&r);
    return j;
}

static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* Waits until name is no longer importing; returns its row (the caller's). */
static json_t *wait_imported(const char *name)
{
    double t0 = fbt_now_ms();
    for (;;) {
        int status;
        json_t *d = get_dataset(name, &status);
        CHECK_INT_EQ(status, 200);
        if (strcmp(jstr(d, "state"), "importing") != 0) return d;
        json_decref(d);
        if (fbt_now_ms() - t0 > IMPORT_TIMEOUT_MS) {
            e2e_dump(&T);
            CHECK(!"the import did not finish");
        }
        rel_sleep_ms(20);
    }
}

/* Imports the CSV directory as name and waits until it is no longer
 * importing; returns its row (the caller's). */
static json_t *import_and_wait(const char *name)
{
    char body[600];
    snprintf(body, sizeof body,
             "{\"name\": \"%s\", \"source\": \"import\", \"path\": \"%s\", \"format\": \"csv\","
             " \"label_column\": \"label\"}",
             name, src);
    fbt_resp r = fbt_call(&T.s, "POST", "/v1/datasets", T.key, body);
    fbt_expect(&r, 202, NULL, "start an import");
    fbt_resp_free(&r);
    return wait_imported(name);
}

/* PUT the CSV text csv (len bytes) as split of name; the caller frees the
 * response. */
static fbt_resp upload(const char *name, const char *split, const char *csv, size_t len)
{
    char path[300], auth[200];
    snprintf(path, sizeof path, "/v1/datasets/%s/splits/%s?label_column=label", name, split);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", T.key);
    const char *h[] = {auth, "Content-Type: text/csv", NULL};
    fbt_resp r;
    CHECK(fbt_http(T.s.port, "PUT", path, h, csv, len, &r) == 0);
    fbt_record("PUT", path, &r);
    return r;
}

/* Uploads the CSV text csv (len bytes) as split of name and waits until the
 * import is over; returns the dataset's row (the caller's). */
static json_t *upload_and_wait(const char *name, const char *split, const char *csv, size_t len)
{
    fbt_resp r = upload(name, split, csv, len);
    fbt_expect(&r, 202, NULL, "upload a split");
    fbt_resp_free(&r);
    return wait_imported(name);
}

/* Deletes name where it exists. */
static void delete_dataset(const char *name)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/datasets/%s", name);
    fbt_resp r = fbt_call(&T.s, "DELETE", path, T.key, NULL);
    if (r.status != 200 && r.status != 204) fbt_expect(&r, 404, "not_found", "delete a dataset");
    fbt_resp_free(&r);
}

/* The state of name in GET /v1/datasets (static buffer), "absent" when the
 * list does not have it. */
static const char *listed_state(const char *name)
{
    static char out[32];
    fbt_resp r = fbt_call(&T.s, "GET", "/v1/datasets?limit=200", T.key, NULL);
    fbt_expect(&r, 200, NULL, "list datasets");
    snprintf(out, sizeof out, "absent");
    json_t *items = json_object_get(r.json, "datasets");
    size_t i;
    json_t *d;
    json_array_foreach(items, i, d)
    {
        if (strcmp(jstr(d, "name"), name) == 0) snprintf(out, sizeof out, "%s", jstr(d, "state"));
    }
    fbt_resp_free(&r);
    return out;
}

/* Entries of the tmpfs other than the filler and the datasets in keep
 * (NULL-terminated); each is printed. */
static int leftovers(const char *const *keep)
{
    DIR *d = opendir(mnt);
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *f = e->d_name;
        if (strcmp(f, ".") == 0 || strcmp(f, "..") == 0 || strcmp(f, ".fill") == 0) continue;
        bool kept = false;
        for (int i = 0; keep[i]; i++)
            kept |= strcmp(f, keep[i]) == 0;
        if (kept) continue;
        printf("  left behind: %s\n", f);
        n++;
    }
    closedir(d);
    return n;
}

/* Whether fuseboxd is alive and answers /healthz. */
static bool server_up(void)
{
    int st;
    if (waitpid(T.s.pid, &st, WNOHANG) != 0) return false;
    fbt_resp r = fbt_call(&T.s, "GET", "/healthz", NULL, NULL);
    bool ok = r.status == 200;
    fbt_resp_free(&r);
    return ok;
}

/* Whether every shard of name equals the same shard of "base" byte for byte
 * and `fusebox-data verify` accepts name. */
static bool same_data_as_base(const char *name)
{
    static const char *const shards[] = {"train/train-00000.fbs", "test/test-00000.fbs"};
    for (int i = 0; i < 2; i++) {
        char a[800], b[800];
        snprintf(a, sizeof a, "%s/base/%s", mnt, shards[i]);
        snprintf(b, sizeof b, "%s/%s/%s", mnt, name, shards[i]);
        char ha[65];
        snprintf(ha, sizeof ha, "%s", rel_file_sha256(a));
        if (!ha[0] || strcmp(ha, rel_file_sha256(b)) != 0) return false;
    }
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s/workers/data/fusebox-data' verify '%s/%s' >/dev/null",
             getenv("FB_BINARY_DIR"), mnt, name);
    return system(cmd) == 0;
}

static unsigned long long rng_state;

static long long rnd(long long lo, long long hi) /* in [lo, hi] */
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (long long)((rng_state >> 33) % (unsigned long long)(hi - lo + 1));
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* the numbers reach the log even when a check aborts */
    int rounds = rel_rounds(argc, argv, SHORT_ROUNDS, LONG_ROUNDS);
    if (!getenv("FB_BINARY_DIR")) {
        printf("SKIPPED: run through ctest\n");
        return 77;
    }
    fbt_require_database();
    if (geteuid() != 0) {
        printf("SKIPPED: mounting a tmpfs needs root\n");
        return 77;
    }
    page_size = sysconf(_SC_PAGESIZE);
    const char *seed_env = getenv("FUSEBOX_RELIABILITY_SEED");
    rng_state = seed_env ? strtoull(seed_env, NULL, 10) : (unsigned long long)getpid();
    printf("seed %llu (FUSEBOX_RELIABILITY_SEED repeats it), %d rounds\n", rng_state, rounds);

    /* the files to import, outside the tmpfs, in the one import root */
    snprintf(src, sizeof src, "/tmp/fb-rel-import-XXXXXX");
    CHECK(mkdtemp(src) != NULL);
    char path[800];
    snprintf(path, sizeof path, "%s/train.csv", src);
    write_csv(path, TRAIN_ROWS, 21);
    snprintf(path, sizeof path, "%s/test.csv", src);
    write_csv(path, TEST_ROWS, 22);
    const char *flags[] = {"--import-roots", src, NULL};
    e2e_start(&T, flags);

    /* the tenant's datasets directory is the tmpfs; workers read it there too */
    snprintf(mnt, sizeof mnt, "%s/%s", T.data_dir, T.tenant);
    CHECK(mkdir(mnt, 0750) == 0);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=" TMPFS_SIZE ",mode=0750") != 0) {
        printf("SKIPPED: cannot mount a tmpfs here: %s\n", strerror(errno));
        e2e_finish(&T);
        return 77;
    }
    mounted = true;
    atexit(cleanup);
    signal(SIGABRT, on_abort);
    snprintf(filler, sizeof filler, "%s/.fill", mnt);

    json_t *base = import_and_wait("base");
    CHECK_STR_EQ(jstr(base, "state"), "ready");
    long long base_bytes = json_integer_value(json_object_get(base, "bytes"));
    /* per split: samples, shards and their bytes (the total counts the manifest, which names
     * the dataset) */
    json_t *base_splits = json_incref(json_object_get(json_object_get(base, "summary"), "splits"));
    CHECK(json_object_size(base_splits) == 2);
    json_decref(base);
    char base_sha[65];
    snprintf(base_sha, sizeof base_sha, "%s", tree_sha256(path_of("base")));
    long long train_pages = pages_of("base/train/train-00000.fbs");
    long long test_pages = pages_of("base/test/test-00000.fbs");
    long long manifest_pages = pages_of("base/manifest.json");
    printf("base: %lld bytes; shards of %lld and %lld pages, manifest %lld; %lld bytes free\n",
           base_bytes, train_pages, test_pages, manifest_pages, free_bytes());
    CHECK(train_pages >= 8 && test_pages >= 2 && manifest_pages == 1);
    CHECK(free_bytes() > (train_pages + test_pages + 2) * page_size);

    size_t test_len = 0, train_len = 0;
    char *train_csv = read_file("train.csv", &train_len);
    char *test_csv = read_file("test.csv", &test_len);
    long long spool_pages = ((long long)test_len + page_size - 1) / page_size;

    int hits[N_POINTS] = {0}, failed_clear = 0, wrong_point = 0, registered = 0, listed_wrong = 0;
    int left = 0, base_changed = 0, server_down = 0, retried_ok = 0, body_refused = 0;
    int body_507 = 0, space_kept = 0;
    double retry_ms_max = 0;
    bool uploaded = false;
    const char *const keep[] = {"base", "imp", "up", NULL};
    for (int round = 0; round < rounds; round++) {
        enum point pt = (enum point)(round % N_POINTS);
        bool is_upload = pt == UPLOAD_SPLIT || pt == UPLOAD_BODY, random = rounds > SHORT_ROUNDS;
        const char *name = is_upload ? "up" : "imp";
        /* the dataset as it is before the disk fills: absent, or (an upload) its train split */
        delete_dataset(name);
        char before_sha[65] = "";
        if (is_upload) {
            json_t *u = upload_and_wait("up", "train", train_csv, train_len);
            CHECK_STR_EQ(jstr(u, "state"), "ready");
            json_decref(u);
            snprintf(before_sha, sizeof before_sha, "%s", tree_sha256(path_of("up")));
        }
        long long leave = 0;
        const char *want_file = "train-00000.fbs";
        bool in_test = pt != BEFORE_SHARD && random && rnd(0, 1);
        if (pt == MID_SHARD) {
            /* some of one shard's pages: its first chunks are written, a later one is not */
            long long pages = in_test ? test_pages : train_pages;
            long long part = random ? rnd(1, pages - 1) : pages / 2;
            leave = (in_test ? train_pages + manifest_pages : 0) + part;
            want_file = in_test ? "test-00000.fbs" : "train-00000.fbs";
        } else if (pt == AT_MANIFEST) {
            /* every page the shards take: the manifest of the first or last split finds none */
            leave = in_test ? train_pages + manifest_pages + test_pages : train_pages;
            want_file = "manifest.json";
        } else if (pt == UPLOAD_SPLIT) {
            /* the spooled body fits, the new split's shard does not (or none of it) */
            in_test = true;
            leave = spool_pages + (random ? rnd(0, test_pages - 1) : test_pages / 2);
            want_file = "test-00000.fbs";
        } else if (pt == UPLOAD_BODY) {
            /* the body itself does not fit: refused while it arrives, before any import */
            in_test = true;
            leave = random ? rnd(0, spool_pages - 1) : spool_pages / 2;
        }
        long long free_before = free_bytes();
        fill_disk(leave);
        json_t *d;
        if (pt == UPLOAD_BODY) {
            fbt_resp r = upload("up", "test", test_csv, test_len);
            json_t *e = json_object_get(r.json, "error");
            const char *code = json_string_value(json_object_get(e, "code"));
            const char *msg = json_string_value(json_object_get(e, "message"));
            printf("round %d: %s, %lld pages free: %d %s \"%s\"\n", round, point_name[pt], leave,
                   r.status, code ? code : "", msg ? msg : "");
            body_refused += r.status >= 400 && msg && strstr(msg, "No space left on device");
            body_507 += r.status == 507;
            registered += r.status == 202;
            fbt_resp_free(&r);
            d = wait_imported("up");
            json_t *sp = json_object_get(json_object_get(d, "summary"), "splits");
            registered += strcmp(jstr(d, "state"), "ready") != 0 || json_object_size(sp) != 1;
            json_decref(d);
            listed_wrong += strcmp(listed_state("up"), "ready") != 0;
            goto checks;
        }
        d = is_upload ? upload_and_wait("up", "test", test_csv, test_len) : import_and_wait("imp");
        const char *state = jstr(d, "state"), *error = jstr(d, "error");
        json_t *splits = json_object_get(json_object_get(d, "summary"), "splits");
        /* a new dataset fails; one that had data stays ready as it was, without the split */
        const char *want_state = is_upload ? "ready" : "failed";
        bool clear = strcmp(state, want_state) == 0 && strstr(error, "insufficient storage") &&
                     strstr(error, "No space left on device");
        printf("round %d: %s (%s split), %lld pages free: %s, \"%s\"\n", round, point_name[pt],
               in_test ? "test" : "train", leave, state, error);
        failed_clear += clear;
        wrong_point += strstr(error, want_file) == NULL;
        registered += strcmp(state, want_state) != 0 || json_object_get(splits, "test") != NULL;
        json_decref(d);
        listed_wrong += strcmp(listed_state(name), want_state) != 0;
    checks:
        hits[pt]++;
        left += leftovers(keep);
        if (is_upload) base_changed += strcmp(tree_sha256(path_of("up")), before_sha) != 0;
        base_changed += strcmp(tree_sha256(path_of("base")), base_sha) != 0;
        int status;
        json_t *b = get_dataset("base", &status);
        base_changed += status != 200 || strcmp(jstr(b, "state"), "ready") != 0 ||
                        json_integer_value(json_object_get(b, "bytes")) != base_bytes;
        json_decref(b);
        server_down += !server_up();

        /* space returns: all of it (no file the import opened holds any; the import thread
         * lets go of the upload's spool file just after it records the failure) */
        CHECK(unlink(filler) == 0);
        double freed = fbt_now_ms();
        while (free_bytes() != free_before && fbt_now_ms() - freed < 2000)
            rel_sleep_ms(10);
        if (free_bytes() != free_before) {
            printf("  %lld bytes stay taken\n", free_before - free_bytes());
            space_kept++;
        }
        /* the same import (after the documented delete), or upload */
        double t0 = fbt_now_ms();
        if (!is_upload) delete_dataset("imp");
        d = is_upload ? upload_and_wait("up", "test", test_csv, test_len) : import_and_wait("imp");
        double ms = fbt_now_ms() - t0;
        if (ms > retry_ms_max) retry_ms_max = ms;
        bool ready = strcmp(jstr(d, "state"), "ready") == 0;
        bool same_splits =
            json_equal(json_object_get(json_object_get(d, "summary"), "splits"), base_splits);
        bool same_data = same_data_as_base(name);
        bool clean = leftovers(keep) == 0;
        bool ok = ready && same_splits && same_data && clean;
        if (!ok)
            printf("  the retry: %s, \"%s\"; %s, data %s, %s\n", jstr(d, "state"), jstr(d, "error"),
                   same_splits ? "splits as base" : "splits DIFFER",
                   same_data ? "as base" : "DIFFER", clean ? "nothing else on disk" : "LEFTOVERS");
        retried_ok += ok;
        uploaded |= is_upload && ok;
        json_decref(d);
    }

    /* what was imported once space returned trains */
    pid_t worker = e2e_worker(&T, "w0");
    int trained = 0;
    for (int i = 0; i < 2; i++) {
        const char *name = i == 0 ? "imp" : "up";
        if (i == 1 && !uploaded) continue;
        char spec[1024], id[64];
        snprintf(spec, sizeof spec,
                 "{\"name\": \"on-%s\", \"dataset\": \"%s\", \"model\": {\"input\": [16],"
                 " \"layers\": [{\"type\": \"linear\", \"out\": 32}, {\"type\": \"relu\"},"
                 " {\"type\": \"linear\", \"out\": 4}]}, \"batch_size\": 32, \"steps\": 60,"
                 " \"eval_every\": 30, \"checkpoint_every\": 30,"
                 " \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01}, \"seed\": 3}",
                 name, name);
        snprintf(id, sizeof id, "%s", e2e_submit(&T, T.key, spec));
        e2e_wait_state(&T, T.key, id, "completed", 180);
        trained++;
    }
    CHECK_INT_EQ(e2e_kill(worker, SIGTERM), 0);
    free(train_csv);
    /* the administrator, who can free space, is told in the log each time */
    char cmd[800];
    snprintf(cmd, sizeof cmd, "grep -c 'the datasets directory is full' '%s'", T.s.log_path);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    int said = 0;
    if (fscanf(p, "%d", &said) != 1) said = 0;
    pclose(p);
    free(test_csv);

    printf("result: disk-full-import rounds=%d before_shard=%d mid_shard=%d at_manifest=%d"
           " upload_split=%d upload_body=%d failed_clear=%d body_refused=%d body_507=%d"
           " wrong_point=%d registered=%d listed_wrong=%d left_behind=%d space_kept=%d"
           " log_lines=%d"
           " base_changed=%d server_down=%d retried_ok=%d retry_ms_max=%.0f trained=%d\n",
           rounds, hits[BEFORE_SHARD], hits[MID_SHARD], hits[AT_MANIFEST], hits[UPLOAD_SPLIT],
           hits[UPLOAD_BODY], failed_clear, body_refused, body_507, wrong_point, registered,
           listed_wrong, left, space_kept, said, base_changed, server_down, retried_ok,
           retry_ms_max, trained);
    CHECK_INT_EQ(failed_clear + body_refused, rounds);
    CHECK_INT_EQ(body_507, hits[UPLOAD_BODY]); /* the server's disk, not a bad request */
    CHECK_INT_EQ(wrong_point, 0);
    CHECK_INT_EQ(registered, 0);
    CHECK_INT_EQ(listed_wrong, 0);
    CHECK_INT_EQ(left, 0);
    CHECK_INT_EQ(base_changed, 0);
    CHECK_INT_EQ(server_down, 0);
    CHECK_INT_EQ(retried_ok, rounds);
    CHECK_INT_EQ(trained, rounds > UPLOAD_SPLIT ? 2 : 1);
    CHECK_INT_EQ(space_kept, 0);
    CHECK_INT_EQ(said, failed_clear);
    json_decref(base_splits);
    cleanup();
    CHECK(rmdir(mnt) == 0);
    e2e_finish(&T);
    snprintf(path, sizeof path, "rm -rf '%s'", src);
    CHECK(system(path) == 0);
    printf("ok\n");
    return 0;
}
