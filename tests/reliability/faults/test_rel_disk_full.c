/*
 * The disk fills up under the artifacts directory while an array trains and
 * checkpoints, end to end on real processes.  fuseboxd's artifacts
 * directory is a small tmpfs of the test's own (mounted as root; skipped
 * with 77 where mounting is not permitted).  The order of events is fixed by
 * the workers' test step hook, not by the machine's speed: the array is held
 * right after its second checkpoint (step HOLD_AT) until both jobs have it
 * recorded; then a filler file takes every free byte, and the hold moves
 * FULL_CHECKPOINTS checkpoints on, so that every one of those checkpoint
 * writes meets the full disk.  Counted and checked while the disk is full
 * and the array is held there: fuseboxd stays up and says why in its log,
 * no job fails, no job's resume point moves to a checkpoint that is not on
 * disk, the last recorded checkpoint of each job is still on disk with the
 * SHA-256 the database holds, and no temporary file is left behind.  Then
 * the filler goes and the hold with it, the waiting checkpoint events are
 * retried and the jobs complete with every checkpoint recorded once, and
 * their models equal an uninterrupted fusebox-train run bit for bit.
 */
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

#define HIDDEN 256
/* fixed sizes: the step hook, not the job's length, puts the fault mid-run */
#define EVERY 10
#define STEPS 120
#define HOLD_AT (2 * EVERY)
#define FULL_CHECKPOINTS 3
#define TMPFS_SIZE "8m"

static e2e T;
static char mnt[300], filler[400];
static bool mounted;

static void cleanup(void)
{
    if (mounted) umount2(mnt, MNT_DETACH);
    mounted = false;
}

/* Fills the tmpfs; returns the bytes written. */
static long long fill_disk(void)
{
    long long total = rel_fill_disk(filler);
    struct statvfs v;
    CHECK(statvfs(mnt, &v) == 0);
    CHECK_INT_EQ((long long)v.f_bavail, 0);
    return total;
}

static long long ll(const char *sql)
{
    return rel_sql_ll(&T, sql);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* the numbers reach the log even when a check aborts */
    if (!getenv("FB_BINARY_DIR")) {
        printf("SKIPPED: run through ctest\n");
        return 77;
    }
    fbt_require_database();
    if (geteuid() != 0) {
        printf("SKIPPED: mounting a tmpfs needs root\n");
        return 77;
    }
    snprintf(mnt, sizeof mnt, "/tmp/fb-rel-artifacts-XXXXXX");
    CHECK(mkdtemp(mnt) != NULL);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=" TMPFS_SIZE ",mode=0700") != 0) {
        printf("SKIPPED: cannot mount a tmpfs here: %s\n", strerror(errno));
        rmdir(mnt);
        return 77;
    }
    mounted = true;
    atexit(cleanup);
    snprintf(filler, sizeof filler, "%s/filler", mnt);
    char artifacts[400];
    snprintf(artifacts, sizeof artifacts, "%s/artifacts", mnt);
    CHECK(mkdir(artifacts, 0700) == 0);
    const char *flags[] = {"--artifacts-dir", artifacts, NULL};
    e2e_start(&T, flags);
    char ids[2][64], names[2][64], sql[1024];
    /* held by the first trial's name before the sweep exists, so that the array cannot
     * pass the step first; a hold of one member holds the whole array */
    const char *key = "diskfull-0";
    e2e_hold(&T, key, HOLD_AT);
    pid_t worker = e2e_worker(&T, "w0");
    rel_sweep(&T, "diskfull", HIDDEN, 128, 0, STEPS, EVERY, "[0.002, 0.01]", 2, ids, names);
    CHECK_STR_EQ(names[0], key);
    CHECK_INT_EQ(e2e_wait_held(&T, key, 120), HOLD_AT);
    snprintf(sql, sizeof sql,
             "SELECT bool_and(state = 'running' AND resume_step = %d) FROM jobs"
             " WHERE id IN ('%s', '%s')",
             HOLD_AT, ids[0], ids[1]);
    e2e_wait_sql(&T, sql, 60, "both jobs running, held, their second checkpoint recorded");
    /* one array: the hold stops both jobs */
    char group[64];
    snprintf(group, sizeof group, "%s", e2e_job_field(&T, T.key, ids[0], "group_id"));
    CHECK_STR_EQ(e2e_job_field(&T, T.key, ids[1], "group_id"), group);

    long long filled = fill_disk();
    double full_at = fbt_now_ms();
    printf("the artifacts file system is full (%lld bytes of filler)\n", filled);
    /* nothing was in flight (the array is held and its checkpoint recorded): this is the
     * resume point the full disk must not move */
    long long resume[2];
    for (int i = 0; i < 2; i++) {
        snprintf(sql, sizeof sql, "SELECT resume_step FROM jobs WHERE id = '%s'", ids[i]);
        resume[i] = ll(sql);
        CHECK_INT_EQ(resume[i], HOLD_AT);
    }
    /* the array trains on to FULL_CHECKPOINTS more checkpoints, all of them taken while
     * the disk is full, and is held again after the last one */
    const long long full_hold = HOLD_AT + FULL_CHECKPOINTS * EVERY;
    e2e_hold(&T, key, full_hold);
    CHECK_INT_EQ(e2e_wait_held(&T, key, 120), full_hold);
    /* the first of them met the full disk (the later ones wait behind it, in order) */
    rel_wait_count(&T, T.s.log_path, "cannot write an artifact", 1, 60,
                   "fuseboxd to say it cannot write an artifact");
    int st;
    CHECK(waitpid(T.s.pid, &st, WNOHANG) == 0);
    int moved = 0, invalid = 0, failed = 0;
    for (int i = 0; i < 2; i++) {
        snprintf(sql, sizeof sql, "SELECT resume_step FROM jobs WHERE id = '%s'", ids[i]);
        moved += ll(sql) != resume[i];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM jobs WHERE id = '%s' AND state = 'failed'",
                 ids[i]);
        failed += (int)ll(sql);
        /* the job's resume point: on disk, intact, as recorded */
        snprintf(sql, sizeof sql,
                 "SELECT c.path || ' ' || c.sha256 FROM jobs j JOIN checkpoints c ON c.job_id ="
                 " j.id AND c.kind = 'state' AND c.step = j.resume_step WHERE j.id = '%s'",
                 ids[i]);
        char rel_path[300], sha[80];
        CHECK(sscanf(fbt_sql_value(&T.s, sql), "%299s %79s", rel_path, sha) == 2);
        char path[800];
        snprintf(path, sizeof path, "%s/%s", artifacts, rel_path);
        bool ok = strcmp(rel_file_sha256(path), sha) == 0;
        printf("job %d: resumes from step %lld, %s: %s\n", i, resume[i], rel_path,
               ok ? "intact" : "MISSING OR CHANGED");
        invalid += !ok;
    }
    char cmd[800];
    snprintf(cmd, sizeof cmd, "find '%s' -name '.*.tmp' | grep -q .", artifacts);
    int leftovers = system(cmd) == 0;
    snprintf(cmd, sizeof cmd, "grep -c 'cannot write an artifact' '%s'", T.s.log_path);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    int said = 0;
    if (fscanf(p, "%d", &said) != 1) said = 0;
    pclose(p);
    printf("while full: %d resume points moved, %d invalid, %d jobs failed, temporary files"
           " left: %s, %d log lines say why\n",
           moved, invalid, failed, leftovers ? "yes" : "no", said);

    CHECK(unlink(filler) == 0);
    double freed_at = fbt_now_ms();
    long long full_ms = (long long)(freed_at - full_at);
    e2e_release(&T, key);
    for (int i = 0; i < 2; i++)
        e2e_wait_state(&T, T.key, ids[i], "completed", 120);
    printf("both jobs completed %.0f ms after the space came back\n", fbt_now_ms() - freed_at);
    long long want = (STEPS - 1) / EVERY, lost = 0;
    for (int i = 0; i < 2; i++) {
        snprintf(sql, sizeof sql,
                 "SELECT count(DISTINCT step) FROM checkpoints WHERE job_id = '%s'"
                 " AND kind = 'state'",
                 ids[i]);
        lost += want - ll(sql);
    }
    double diff = rel_max_diff_to_reference(&T, ids, names, 2, "diskfull");
    printf("result: disk-full jobs=2 full_ms=%lld full_checkpoints=%d resume_moved=%d "
           "previous_invalid=%d failed=%d"
           " tmp_left=%d log_lines=%d checkpoints_lost=%lld max_model_diff=%g\n",
           full_ms, FULL_CHECKPOINTS, moved, invalid, failed, leftovers, said, lost, diff);
    CHECK_INT_EQ(moved, 0);
    CHECK_INT_EQ(invalid, 0);
    CHECK_INT_EQ(failed, 0);
    CHECK_INT_EQ(leftovers, 0);
    CHECK(said > 0);
    CHECK_INT_EQ(lost, 0);
    CHECK(diff == 0);
    CHECK_INT_EQ(e2e_kill(worker, SIGTERM), 0);
    e2e_finish(&T);
    cleanup();
    CHECK(rmdir(mnt) == 0);
    printf("ok\n");
    return 0;
}
