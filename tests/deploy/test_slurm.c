/*
 * deploy/slurm/fusebox-worker.sbatch on a real Slurm: munged, slurmctld and slurmd from
 * Debian's packages, configured entirely in the test's scratch directory (its own
 * slurm.conf, ports, munge key and socket, state and spool directories), one node.
 *
 *   0. The script's bad environments, as a table: each is refused (exit 1) with its
 *      message before anything starts; a registration that fuseboxd refuses (a wrong
 *      admin key) fails the Slurm job, and no key is registered.
 *   1. A fuseboxd on a fresh test database; the sbatch worker registers its own key
 *      through POST /v1/workers/keys (no file names it), stages the shard dataset under
 *      the job's $TMPDIR, and trains a job that the step hook holds at step 120 of 400
 *      (so "mid-training" does not depend on the machine's speed).
 *   2. scancel: Slurm's SIGTERM reaches the worker, which drains: the job goes back to
 *      the queue from step 120 (its drained state) with restarts 0; the batch script's
 *      trap revokes the allocation's key.
 *   3. A second sbatch worker resumes the job from step 120 and completes it, restarts
 *      still 0; scancel again, its key revoked too.
 *
 * Every Slurm and munge process lives in a PID namespace of its own (unshare
 * --kill-child, itself killed when the test dies), so no exit path, an abort or a
 * timeout's kill included, leaves a daemon, a slurmstepd or a worker behind.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "e2e.h"
#include "ports.h"

#define JOB "slurm-job"
#define HOLD_STEP 120
#define STEPS 400
/* liveness bounds (no decision depends on them) */
#define UP_S 60
#define WAIT_S 90

static e2e T;
static char R[400];       /* Slurm's directory in the scratch directory */
static pid_t ns_pid = -1; /* unshare, whose namespace holds every Slurm process */

/* Kills the namespace: unshare's death kills its child, the namespace's init, and with
 * it every process there.  Async-signal-safe (the abort handler calls it). */
static void slurm_down(void)
{
    if (ns_pid <= 0) return;
    kill(ns_pid, SIGKILL);
    waitpid(ns_pid, NULL, 0);
    ns_pid = -1;
}

static void on_fatal(int sig)
{
    slurm_down();
    signal(sig, SIG_DFL);
    raise(sig);
}

static const char *find_program(const char *name)
{
    static char path[256];
    static const char *const dirs[] = {"/usr/sbin", "/usr/bin", "/sbin", "/bin"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dirs[i], name);
        if (access(path, X_OK) == 0) return path;
    }
    return NULL;
}

/* The first line a shell command prints (static buffer, no newline); "" for none. */
static const char *sh_line(const char *cmd)
{
    static char out[4096];
    out[0] = 0;
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!fgets(out, sizeof out, p)) out[0] = 0;
    while (fgetc(p) != EOF) {
    }
    pclose(p);
    out[strcspn(out, "\n")] = 0;
    return out;
}

static void dump_slurm(void)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd,
             "for f in %s/*.log %s/*.out %s/sbatch-*.txt; do [ -f \"$f\" ] || continue; "
             "echo \"== $f\"; tail -n 60 \"$f\"; done >&2",
             R, R, R);
    if (system(cmd) != 0) fprintf(stderr, "(cannot show Slurm's logs)\n");
}

static void fail(const char *what)
{
    fprintf(stderr, "test_slurm: %s\n", what);
    dump_slurm();
    e2e_dump(&T);
    CHECK(0);
}

/* Writes slurm.conf and the munge key, and starts munged, slurmctld and slurmd in a PID
 * namespace; returns once the node is idle. */
static void slurm_up(void)
{
    char path[600], text[4096];
    snprintf(R, sizeof R, "%s/slurm", T.root);
    CHECK(mkdir(R, 0755) == 0);
    const char *const subdirs[] = {"ctld", "spool", "node-tmp"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", R, subdirs[i]);
        CHECK(mkdir(path, 0755) == 0);
    }
    /* munged's key: random bytes, readable by its owner alone */
    snprintf(path, sizeof path, "%s/munge.key", R);
    unsigned char key[1024];
    FILE *ur = fopen("/dev/urandom", "rb");
    CHECK(ur && fread(key, 1, sizeof key, ur) == sizeof key);
    fclose(ur);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0 && write(fd, key, sizeof key) == (ssize_t)sizeof key);
    close(fd);

    char host[256];
    CHECK(gethostname(host, sizeof host) == 0);
    host[strcspn(host, ".")] = 0; /* Slurm names hosts as `hostname -s` does */
    int ctld_port = fbt_free_port(), node_port = fbt_free_port();
    while (node_port == ctld_port)
        node_port = fbt_free_port();
    snprintf(text, sizeof text,
             "ClusterName=fbtest\n"
             "SlurmctldHost=%s(127.0.0.1)\n"
             "SlurmUser=root\nSlurmdUser=root\n"
             "SlurmctldPort=%d\nSlurmdPort=%d\n"
             "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=%s/munge.sock\n"
             "StateSaveLocation=%s/ctld\nSlurmdSpoolDir=%s/spool\n"
             "SlurmctldPidFile=%s/slurmctld.pid\nSlurmdPidFile=%s/slurmd.pid\n"
             "SlurmctldLogFile=%s/slurmctld.log\nSlurmdLogFile=%s/slurmd.log\n"
             /* no cgroups in a test's container: processes tracked by their parents */
             "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
             "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
             "SchedulerType=sched/builtin\nMpiDefault=none\nReturnToService=2\n"
             "JobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\n"
             /* the drain's bound: SIGKILL this long after SIGTERM */
             "KillWait=120\nSlurmdTimeout=300\n"
             "NodeName=fbnode NodeHostname=%s NodeAddr=127.0.0.1 CPUs=%ld State=UNKNOWN\n"
             "PartitionName=fb Nodes=fbnode Default=YES MaxTime=INFINITE State=UP\n",
             host, ctld_port, node_port, R, R, R, R, R, R, R, host,
             sysconf(_SC_NPROCESSORS_ONLN) > 0 ? sysconf(_SC_NPROCESSORS_ONLN) : 1);
    snprintf(path, sizeof path, "%s/slurm.conf", R);
    e2e_write(path, text);
    CHECK(setenv("SLURM_CONF", path, 1) == 0);

    /* the namespace's init: munged first (slurmctld needs its socket), then the daemons
     * in the foreground of their own, and a wait that reaps them */
    snprintf(text, sizeof text,
             "set -u; PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH; cd %s\n"
             "munged -F --force --socket=%s/munge.sock --key-file=%s/munge.key"
             " --pid-file=%s/munged.pid --log-file=%s/munged.log --seed-file=%s/munge.seed"
             " > munged.out 2>&1 &\n"
             "i=0; while [ ! -S %s/munge.sock ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); "
             "done\n"
             "slurmctld -D -i -f %s/slurm.conf > slurmctld.out 2>&1 &\n"
             "slurmd -D -N fbnode -f %s/slurm.conf > slurmd.out 2>&1 &\n"
             "wait\n",
             R, R, R, R, R, R, R, R, R);
    const char *unshare = find_program("unshare");
    CHECK(unshare != NULL);
    ns_pid = fork();
    CHECK(ns_pid >= 0);
    if (ns_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* the test's death ends the namespace */
        execl(unshare, "unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c",
              text, (char *)NULL);
        _exit(127);
    }
    double start = fbt_now_ms();
    for (;;) {
        const char *st = sh_line("sinfo -h -N -o %t 2>/dev/null");
        if (strcmp(st, "idle") == 0) break;
        if (fbt_now_ms() - start > UP_S * 1000.0) fail("the Slurm node did not come up");
        int status;
        if (waitpid(ns_pid, &status, WNOHANG) == ns_pid) {
            ns_pid = -1;
            fail("the Slurm namespace exited");
        }
        usleep(200 * 1000);
    }
    printf("slurm: node fbnode idle after %.1f s (slurmctld port %d, slurmd port %d)\n",
           (fbt_now_ms() - start) / 1000, ctld_port, node_port);
}

/* Submits the sbatch worker (with the test's environment and the assignments of
 * export, "" for none); returns its Slurm job id. */
static long sbatch_worker_with(const char *export)
{
    char cmd[1600];
    snprintf(cmd, sizeof cmd,
             "sbatch --parsable --export=ALL%s%s -o %s/sbatch-%%j.txt %s/deploy/slurm/"
             "fusebox-worker.sbatch 2>&1",
             export[0] ? "," : "", export, R, getenv("FB_SOURCE_DIR"));
    const char *out = sh_line(cmd);
    char *end;
    long id = strtol(out, &end, 10);
    if (end == out || id <= 0) {
        fprintf(stderr, "sbatch said: %s\n", out);
        fail("sbatch failed");
    }
    printf("slurm: sbatch job %ld\n", id);
    return id;
}

static long sbatch_worker(void)
{
    return sbatch_worker_with("");
}

static void wait_slurm_job_gone(long id)
{
    char cmd[200];
    snprintf(cmd, sizeof cmd, "squeue -h -j %ld -o %%T 2>/dev/null", id);
    double start = fbt_now_ms();
    while (sh_line(cmd)[0]) {
        if (fbt_now_ms() - start > WAIT_S * 1000.0) fail("the Slurm job did not end");
        usleep(200 * 1000);
    }
}

static void scancel(long id)
{
    char cmd[100];
    snprintf(cmd, sizeof cmd, "scancel %ld", id);
    CHECK(system(cmd) == 0);
}

/* The allocation's key (named slurm-ID-*) in GET /v1/workers/keys: 1 live, 0 revoked,
 * -1 none. */
static int key_state(long id)
{
    fbt_resp r = fbt_call(&T.s, "GET", "/v1/workers/keys", T.s.admin_key, NULL);
    fbt_expect(&r, 200, NULL, "list worker keys");
    char prefix[64];
    snprintf(prefix, sizeof prefix, "slurm-%ld-", id);
    int st = -1;
    size_t i;
    json_t *k;
    json_array_foreach(json_object_get(r.json, "keys"), i, k)
    {
        const char *name = json_string_value(json_object_get(k, "name"));
        if (name && strncmp(name, prefix, strlen(prefix)) == 0)
            st = json_is_null(json_object_get(k, "revoked_at")) ? 1 : 0;
    }
    fbt_resp_free(&r);
    return st;
}

typedef struct env_case {
    const char *what, *env; /* env: env(1) arguments before the script */
    const char *says;
} env_case;

/* The script's own checks, before it starts anything, as a table: each bad environment
 * exits 1 with its message; then a registration fuseboxd refuses (a wrong admin key)
 * fails the Slurm job with the script's message, and no key is registered. */
static void bad_environments(void)
{
    char script[600], cmd[1600];
    snprintf(script, sizeof script, "%s/deploy/slurm/fusebox-worker.sbatch",
             getenv("FB_SOURCE_DIR"));
    const env_case cases[] = {
        {"outside Slurm", "-u SLURM_JOB_ID", "run me with sbatch"},
        {"no server URL", "-u FUSEBOX_URL SLURM_JOB_ID=1", "FUSEBOX_URL is not set"},
        {"no admin key file", "SLURM_JOB_ID=1 FUSEBOX_ADMIN_KEY_FILE=/nonexistent",
         "cannot read FUSEBOX_ADMIN_KEY_FILE (/nonexistent)"},
        {"no server key", "-u FUSEBOX_WORKER_SERVER_KEY SLURM_JOB_ID=1",
         "FUSEBOX_WORKER_SERVER_KEY is not set"},
        {"unreadable server key", "SLURM_JOB_ID=1 FUSEBOX_WORKER_SERVER_KEY=/nonexistent",
         "cannot read FUSEBOX_WORKER_SERVER_KEY (/nonexistent)"},
        {"no worker program", "SLURM_JOB_ID=1 FUSEBOX_WORKER_BIN=/nonexistent/fusebox-worker",
         "no /nonexistent/fusebox-worker here"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const env_case *c = &cases[i];
        snprintf(cmd, sizeof cmd, "env %s bash %s 2>&1", c->env, script);
        char out[4096] = "";
        FILE *p = popen(cmd, "r");
        CHECK(p != NULL);
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = 0;
        int st = pclose(p);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 1 || !strstr(out, c->says)) {
            fprintf(stderr, "case %s: status %d, said:\n%s\nexpected exit 1 and: %s\n", c->what,
                    WIFEXITED(st) ? WEXITSTATUS(st) : -1, out, c->says);
            fail("a bad environment was not refused");
        }
        printf("slurm: %-22s refused: %s\n", c->what, c->says);
    }
    char wrong[500], exp[600];
    snprintf(wrong, sizeof wrong, "%s/wrong-admin.key", T.root);
    e2e_write(wrong, "fb_not_a_key\n");
    snprintf(exp, sizeof exp, "FUSEBOX_ADMIN_KEY_FILE=%s", wrong);
    long j = sbatch_worker_with(exp);
    wait_slurm_job_gone(j);
    char path[600];
    snprintf(path, sizeof path, "%s/sbatch-%ld.txt", R, j);
    size_t len = 0;
    FILE *f = fopen(path, "r");
    char out[8192] = "";
    if (f) {
        len = fread(out, 1, sizeof out - 1, f);
        fclose(f);
    }
    out[len] = 0;
    if (!strstr(out, "registering the worker key with")) fail("a refused registration");
    CHECK_INT_EQ(key_state(j), -1);
    printf("slurm: a wrong admin key: sbatch job %ld failed registering, no key registered\n", j);
}

/* Shard files in the node's staging cache. */
static int staged_files(void)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/node-tmp/fusebox-stage", R);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' && strcmp(e->d_name, "index.json") && strcmp(e->d_name, "lock"))
            n++;
    closedir(d);
    return n;
}

static bool needs(const char *prog)
{
    if (find_program(prog)) return true;
    exit(fb_test_missing("%s is missing (scripts/lib/packages.txt: munge, slurmctld, slurmd, "
                         "slurm-client)",
                         prog));
}

int main(void)
{
    fbt_require_database();
    const char *const progs[] = {"munged", "slurmctld", "slurmd",  "sbatch", "srun", "scancel",
                                 "squeue", "sinfo",     "unshare", "curl",   "jq"};
    for (size_t i = 0; i < sizeof progs / sizeof progs[0]; i++)
        needs(progs[i]);
    if (geteuid() != 0) exit(fb_test_missing("slurmd runs as root here; the test is not root"));
    signal(SIGABRT, on_fatal);
    signal(SIGTERM, on_fatal);
    signal(SIGINT, on_fatal);
    atexit(slurm_down);

    e2e_start(&T, NULL);
    slurm_up();

    /* what the sbatch script reads, passed on by sbatch (--export=ALL) */
    char admin_file[400], url[64], server[64], bin[600], tmp[600];
    snprintf(admin_file, sizeof admin_file, "%s/admin.key", T.root);
    e2e_write(admin_file, T.s.admin_key);
    CHECK(chmod(admin_file, 0600) == 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d", T.s.port);
    snprintf(server, sizeof server, "tcp://127.0.0.1:%d", T.worker_port);
    snprintf(bin, sizeof bin, "%s/workers/fusebox-worker", getenv("FB_BINARY_DIR"));
    snprintf(tmp, sizeof tmp, "%s/node-tmp", R);
    const char *const env[][2] = {
        {"FUSEBOX_URL", url},
        {"FUSEBOX_ADMIN_KEY_FILE", admin_file},
        {"FUSEBOX_WORKER_SERVER", server},
        {"FUSEBOX_WORKER_SERVER_KEY", T.server_pub},
        {"FUSEBOX_WORKER_BIN", bin},
        {"FUSEBOX_WORKER_DATA_DIR", T.data_dir},
        {"FUSEBOX_WORKER_CPU_DEVICES", "1"},
        {"FUSEBOX_WORKER_THREADS_PER_DEVICE", "1"},
        {"FUSEBOX_WORKER_HEARTBEAT_MS", "200"},
        {"FUSEBOX_WORKER_PROGRESS_MS", "200"},
        {"FUSEBOX_TEST_HOOKS", "1"},
        {"FUSEBOX_WORKER_TEST_STEP_HOOK", T.hook_dir},
        {"TMPDIR", tmp},
    };
    for (size_t i = 0; i < sizeof env / sizeof env[0]; i++)
        CHECK(setenv(env[i][0], env[i][1], 1) == 0);
    /* GPUs bound by Slurm only: none here, so the CPU backend */
    unsetenv("CUDA_VISIBLE_DEVICES");

    bad_environments();

    /* 1. the first sbatch worker trains the job to the hold */
    e2e_hold(&T, JOB, HOLD_STEP);
    char id[64];
    snprintf(id, sizeof id, "%s", e2e_submit(&T, T.key, e2e_spec(JOB, 0.01, STEPS, 50)));
    long j1 = sbatch_worker();
    CHECK_INT_EQ(e2e_wait_held(&T, JOB, WAIT_S), HOLD_STEP);
    CHECK_INT_EQ(key_state(j1), 1);
    CHECK(staged_files() > 0);
    printf("slurm: job %s held at step %d on sbatch job %ld, its key live, %d shard file(s) "
           "staged\n",
           id, HOLD_STEP, j1, staged_files());

    /* 2. scancel: the worker drains, the job re-queues uncounted, the key is revoked */
    scancel(j1);
    wait_slurm_job_gone(j1);
    e2e_wait_state(&T, T.key, id, "queued", WAIT_S);
    CHECK_STR_EQ(e2e_job_field(&T, T.key, id, "restarts"), "0");
    char sql[600];
    snprintf(sql, sizeof sql,
             "SELECT count(*) > 0 FROM job_events WHERE job_id = '%s' AND kind = 'requeued'"
             " AND message LIKE '%%drained%%resumes from step %d%%'",
             id, HOLD_STEP);
    e2e_wait_sql(&T, sql, WAIT_S, "the drained job re-queued from its held step");
    if (key_state(j1) != 0) fail("the first allocation's key was not revoked");
    printf("slurm: scancel %ld: drained at step %d, re-queued with restarts 0, key revoked\n", j1,
           HOLD_STEP);

    /* 3. a second sbatch worker resumes it and completes it */
    e2e_release(&T, JOB);
    long j2 = sbatch_worker();
    e2e_wait_state(&T, T.key, id, "completed", WAIT_S);
    CHECK_STR_EQ(e2e_job_field(&T, T.key, id, "restarts"), "0");
    CHECK_STR_EQ(e2e_job_field(&T, T.key, id, "step"), "400");
    snprintf(sql, sizeof sql,
             "SELECT count(*) = 1 FROM job_events WHERE job_id = '%s' AND kind = 'scheduled'"
             " AND message LIKE '%%slurm-%ld-%%'",
             id, j2);
    e2e_wait_sql(&T, sql, WAIT_S, "the job scheduled once on the second allocation's worker");
    scancel(j2);
    wait_slurm_job_gone(j2);
    if (key_state(j2) != 0) fail("the second allocation's key was not revoked");
    printf("slurm: sbatch job %ld resumed it from step %d to %d, restarts 0; scancel, key "
           "revoked\n",
           j2, HOLD_STEP, STEPS);

    slurm_down();
    e2e_finish(&T);
    printf("test_slurm: ok\n");
    return 0;
}
