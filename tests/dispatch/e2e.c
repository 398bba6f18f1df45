/* The end-to-end dispatch tests' shared helpers (e2e.h). */
#include "e2e.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "datadir.h"
#include "ports.h"
#include "safetensors.h"
#include "wire.h"

static const char *bin(void)
{
    const char *b = getenv("FB_BINARY_DIR");
    CHECK(b != NULL && b[0]);
    return b;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void e2e_write(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    CHECK(fputs(text, f) >= 0);
    CHECK(fclose(f) == 0);
}

/* A learnable 4-class problem over 16 features: the label is the argmax of
 * a fixed linear map of x, so a small MLP reaches high accuracy. */
static void import_split(const char *dir, const char *split, int64_t n, uint64_t seed)
{
    float *x = malloc((size_t)n * 16 * sizeof *x);
    int32_t *y = malloc((size_t)n * sizeof *y);
    CHECK(x && y);
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        float score[4] = {0, 0, 0, 0};
        for (int f = 0; f < 16; f++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            float v = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
            x[i * 16 + f] = v;
            for (int k = 0; k < 4; k++)
                score[k] += v * (float)(((f * 7 + k * 3) % 5) - 2);
        }
        int best = 0;
        for (int k = 1; k < 4; k++)
            if (score[k] > score[best]) best = k;
        y[i] = best;
    }
    fb_import_opts o = {.out_dir = dir, .name = "synth", .split = split};
    int64_t shape[1] = {16};
    char msg[256];
    int rc = fb_datadir_import(NULL, &o, FB_DTYPE_F32, 1, shape, x, y, n, msg, sizeof msg);
    if (rc) fprintf(stderr, "import: %s\n", msg);
    CHECK(rc == 0);
    free(x);
    free(y);
}

static const char *const *server_flags(e2e *t, const char *const *extra)
{
    static char listen[64];
    static const char *flags[32];
    snprintf(listen, sizeof listen, "tcp://127.0.0.1:%d", t->worker_port);
    int n = 0;
    flags[n++] = "--worker-listen";
    flags[n++] = listen;
    static char hb[16], timeout[16], tick[16];
    snprintf(hb, sizeof hb, "%d", E2E_HEARTBEAT_MS);
    snprintf(timeout, sizeof timeout, "%d", E2E_HEARTBEAT_TIMEOUT_MS);
    snprintf(tick, sizeof tick, "%d", E2E_TICK_MS);
    flags[n++] = "--heartbeat-ms";
    flags[n++] = hb;
    flags[n++] = "--heartbeat-timeout-ms";
    flags[n++] = timeout;
    flags[n++] = "--tick-ms";
    flags[n++] = tick;
    if (t->clock) {
        flags[n++] = "--test-clock";
        flags[n++] = t->clock_path;
    }
    /* tenants' own datasets land where the workers read datasets */
    flags[n++] = "--datasets-dir";
    flags[n++] = t->data_dir;
    /* "synth" is in every worker's data directory, for every tenant, as a built-in is */
    flags[n++] = "--public-datasets";
    flags[n++] = "synth";
    for (int i = 0; extra && extra[i] && n < 30; i++)
        flags[n++] = extra[i];
    flags[n] = NULL;
    return flags;
}

static const char *const *saved_extra;

/* e2e_start, e2e_start_on and e2e_start_clocked: db_url NULL for a fresh database on the
 * test server; clocked for fuseboxd on a manual clock. */
static void start(e2e *t, const char *db_url, const char *const *extra, bool clocked)
{
    char msg[256];
    memset(t, 0, sizeof *t);
    if (!db_url) fbt_require_database();
    snprintf(t->root, sizeof t->root, "/tmp/fb-e2e-XXXXXX");
    CHECK(mkdtemp(t->root) != NULL);
    if (clocked) {
        snprintf(t->clock_path, sizeof t->clock_path, "%s/clock", t->root);
        t->clock = fb_clock_file_create(t->clock_path, (int64_t)E2E_CLOCK_START_MS * 1000000, msg,
                                        sizeof msg);
        if (!t->clock) fprintf(stderr, "%s\n", msg);
        CHECK(t->clock != NULL);
        /* fuseboxd refuses --test-clock without it; its workers get it anyway */
        CHECK(setenv("FUSEBOX_TEST_HOOKS", "1", 1) == 0);
    }
    snprintf(t->data_dir, sizeof t->data_dir, "%s/data", t->root);
    CHECK(mkdir(t->data_dir, 0755) == 0);
    snprintf(t->hook_dir, sizeof t->hook_dir, "%s/hooks", t->root);
    CHECK(mkdir(t->hook_dir, 0755) == 0);
    char ds[400];
    snprintf(ds, sizeof ds, "%s/synth", t->data_dir);
    import_split(ds, "train", 2048, 11);
    import_split(ds, "test", 512, 12);
    snprintf(t->worker_key, sizeof t->worker_key, "%s/worker.key", t->root);
    CHECK(fb_wire_key_generate(t->worker_key, msg, sizeof msg) == 0);
    char pub[41];
    CHECK(fb_wire_key_load(t->worker_key, pub, NULL, msg, sizeof msg) == 0);
    snprintf(t->s.data_dir, sizeof t->s.data_dir, "%s/server", t->root);
    CHECK(mkdir(t->s.data_dir, 0700) == 0);
    char keys[400], line[128];
    snprintf(keys, sizeof keys, "%s/worker-keys", t->s.data_dir);
    snprintf(line, sizeof line, "# the test's workers\n%s\n", pub);
    e2e_write(keys, line);
    snprintf(t->server_pub, sizeof t->server_pub, "%s/server.key.pub", t->s.data_dir);
    t->worker_port = fbt_free_port();
    saved_extra = extra;
    if (db_url) {
        CHECK(strlen(db_url) < sizeof t->s.db_url);
        snprintf(t->s.db_url, sizeof t->s.db_url, "%s", db_url);
        t->s.sql = PQconnectdb(db_url);
        if (PQstatus(t->s.sql) != CONNECTION_OK)
            fprintf(stderr, "cannot connect to %s: %s", db_url, PQerrorMessage(t->s.sql));
        CHECK(PQstatus(t->s.sql) == CONNECTION_OK);
        PQclear(PQexec(t->s.sql, "SET client_min_messages = warning"));
        t->own_database = true;
    } else {
        fbt_db_create(&t->s);
    }
    fbt_server_start(&t->s, server_flags(t, extra));
    /* the control loop's first tick comes at its start, at the clock's first time: every
     * later tick time is a multiple of the tick from it */
    if (clocked) e2e_clock_set(t, E2E_CLOCK_START_MS);
    fbt_tenant(&t->s, "lab", "", t->tenant, sizeof t->tenant, t->key, sizeof t->key);
}

void e2e_start(e2e *t, const char *const *extra)
{
    start(t, NULL, extra, false);
}

void e2e_start_on(e2e *t, const char *db_url, const char *const *extra)
{
    CHECK(db_url != NULL && db_url[0]);
    start(t, db_url, extra, false);
}

void e2e_start_clocked(e2e *t, const char *const *extra)
{
    start(t, NULL, extra, true);
}

long long e2e_clock_ms(const e2e *t)
{
    CHECK(t->clock != NULL);
    return (long long)(fb_clock_file_get(t->clock) / 1000000);
}

/* fusebox_control_tick_clock_ms in /metrics: the clock time of fuseboxd's last finished
 * tick, -1 before the first. */
static long long tick_clock_ms(e2e *t)
{
    static const char key[] = "\nfusebox_control_tick_clock_ms ";
    fbt_resp r = fbt_call(&t->s, "GET", "/metrics", NULL, NULL);
    fbt_expect(&r, 200, NULL, "metrics");
    const char *p = strstr(r.body, key);
    long long v = p ? strtoll(p + sizeof key - 1, NULL, 10) : -1;
    fbt_resp_free(&r);
    return v;
}

long long e2e_worker_seen_ms(e2e *t, const char *name)
{
    char key[128];
    snprintf(key, sizeof key, "\nfusebox_worker_last_seen_clock_ms{worker=\"%s\"} ", name);
    fbt_resp r = fbt_call(&t->s, "GET", "/metrics", NULL, NULL);
    fbt_expect(&r, 200, NULL, "metrics");
    const char *p = strstr(r.body, key);
    long long v = p ? strtoll(p + strlen(key), NULL, 10) : -1;
    fbt_resp_free(&r);
    return v;
}

void e2e_clock_set(e2e *t, long long ms)
{
    CHECK(t->clock != NULL);
    CHECK_INT_EQ((ms - E2E_CLOCK_START_MS) % E2E_TICK_MS, 0);
    CHECK(ms >= e2e_clock_ms(t));
    CHECK(fb_clock_file_set(t->clock, (int64_t)ms * 1000000));
    double start = fbt_now_ms();
    long long at;
    while ((at = tick_clock_ms(t)) < ms) {
        if (fbt_now_ms() - start > 60000) {
            fprintf(stderr,
                    "fuseboxd did not tick at clock %lld ms within 60 s (its last tick: "
                    "%lld)\n",
                    ms, at);
            e2e_dump(t);
            CHECK(0);
        }
        sleep_ms(2);
    }
    /* one tick per time the clock stands at: a later one would mean the clock moved */
    CHECK_INT_EQ(at, ms);
}

void e2e_clock_advance(e2e *t, long long ms)
{
    CHECK(ms > 0 && ms % E2E_TICK_MS == 0);
    e2e_clock_set(t, e2e_clock_ms(t) + ms);
}

void e2e_restart_server(e2e *t)
{
    fbt_server_start(&t->s, server_flags(t, saved_extra));
    /* on a manual clock, its first tick at the time the clock stands at */
    if (t->clock) e2e_clock_set(t, e2e_clock_ms(t));
}

void e2e_finish(e2e *t)
{
    /* a clean exit: the control loop stopped, and (under ASan) nothing leaked */
    CHECK_INT_EQ(fbt_server_stop(&t->s), 0);
    if (t->own_database) {
        PQfinish(t->s.sql);
        t->s.sql = NULL;
    } else {
        fbt_db_drop(&t->s);
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->root);
    CHECK(system(cmd) == 0);
    fb_clock_file_close(t->clock);
    t->clock = NULL;
}

/* fusebox-worker with the usual test flags against server, started through wrapper (a
 * command and its arguments before the worker's, may be NULL) and followed by extra flags (may
 * be NULL; a later flag wins); output to worker-<name>.log. */
static pid_t spawn_worker(e2e *t, const char *name, const char *server, const char *const *wrapper,
                          const char *const *extra)
{
    char exe[512], log[400];
    snprintf(exe, sizeof exe, "%s/workers/fusebox-worker", bin());
    snprintf(log, sizeof log, "%s/worker-%s.log", t->root, name);
    const char *argv[64];
    int n = 0;
    for (int i = 0; wrapper && wrapper[i] && n < 16; i++)
        argv[n++] = wrapper[i];
    const char *args[] = {exe,           "--server",
                          server,        "--server-key",
                          t->server_pub, "--key",
                          t->worker_key, "--name",
                          name,          "--cpu-devices",
                          "1",           "--threads-per-device",
                          "1",           "--data-dir",
                          t->data_dir,   "--heartbeat-ms",
                          "200",         "--progress-ms",
                          "200",         "--test-step-hook",
                          t->hook_dir,   NULL};
    for (int i = 0; args[i]; i++)
        argv[n++] = args[i];
    for (int i = 0; extra && extra[i] && n < 63; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);     /* a test that aborts leaves no worker behind */
        setenv("FUSEBOX_TEST_HOOKS", "1", 1); /* the worker refuses its hook without it */
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

pid_t e2e_worker_args(e2e *t, const char *name, const char *const *extra)
{
    char server[64];
    snprintf(server, sizeof server, "tcp://127.0.0.1:%d", t->worker_port);
    return spawn_worker(t, name, server, NULL, extra);
}

pid_t e2e_worker(e2e *t, const char *name)
{
    return e2e_worker_args(t, name, NULL);
}

int e2e_kill(pid_t pid, int sig)
{
    kill(pid, sig);
    int st = 0;
    for (int i = 0; i < 3000; i++) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    fprintf(stderr, "a worker did not exit within 30 s of signal %d\n", sig);
    CHECK(0);
    return -1;
}

const char *e2e_spec(const char *name, double lr, int steps, int checkpoint_every)
{
    static __thread char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"name\": \"%s\", \"dataset\": \"synth\", \"model\": {\"input\": [16],"
             " \"layers\": [{\"type\": \"linear\", \"out\": 32}, {\"type\": \"relu\"},"
             " {\"type\": \"linear\", \"out\": 4}]}, \"batch_size\": 32, \"steps\": %d,"
             " \"eval_every\": 100, \"checkpoint_every\": %d,"
             " \"optimizer\": {\"type\": \"adam\", \"lr\": %g}, \"seed\": 3}",
             name, steps, checkpoint_every, lr);
    return buf;
}

const char *e2e_submit(e2e *t, const char *key, const char *spec)
{
    static __thread char id[64];
    fbt_resp r = fbt_call(&t->s, "POST", "/v1/jobs", key, spec);
    fbt_expect(&r, 201, NULL, "submit a job");
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(r.json, "id")));
    fbt_resp_free(&r);
    return id;
}

void e2e_submit_sweep(e2e *t, const char *key, const char *body, int n, char (*ids)[64],
                      char (*names)[64])
{
    fbt_resp r = fbt_call(&t->s, "POST", "/v1/sweeps", key, body);
    fbt_expect(&r, 201, NULL, "submit a sweep");
    json_t *trials = json_object_get(r.json, "trials");
    CHECK_INT_EQ((long long)json_array_size(trials), n);
    for (int i = 0; i < n; i++) {
        json_t *tr = json_array_get(trials, (size_t)i);
        CHECK_INT_EQ(json_integer_value(json_object_get(tr, "index")), i);
        snprintf(ids[i], 64, "%s", json_string_value(json_object_get(tr, "job_id")));
        if (names) snprintf(names[i], 64, "%s", json_string_value(json_object_get(tr, "name")));
    }
    fbt_resp_free(&r);
}

const char *e2e_job_field(e2e *t, const char *key, const char *id, const char *field)
{
    static __thread char out[256];
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    fbt_resp r = fbt_call(&t->s, "GET", path, key, NULL);
    fbt_expect(&r, 200, NULL, "get a job");
    json_t *v = json_object_get(r.json, field);
    if (json_is_string(v))
        snprintf(out, sizeof out, "%s", json_string_value(v));
    else if (json_is_integer(v))
        snprintf(out, sizeof out, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(out, sizeof out, "%.17g", json_real_value(v));
    else
        out[0] = '\0';
    fbt_resp_free(&r);
    return out;
}

void e2e_dump(e2e *t)
{
    fbt_server_dump_log(&t->s);
    char cmd[600];
    snprintf(cmd, sizeof cmd,
             "for f in '%s'/worker-*.log; do echo \"== $f\"; tail -n 60 \"$f\"; done 1>&2",
             t->root);
    if (system(cmd) != 0) fprintf(stderr, "(no worker logs)\n");
}

void e2e_wait_state(e2e *t, const char *key, const char *id, const char *state, int timeout_s)
{
    double start = fbt_now_ms();
    char last[64] = "";
    for (;;) {
        const char *st = e2e_job_field(t, key, id, "state");
        snprintf(last, sizeof last, "%s", st);
        if (strcmp(st, state) == 0) return;
        if (fbt_now_ms() - start > timeout_s * 1000.0 ||
            ((strcmp(st, "failed") == 0 || strcmp(st, "cancelled") == 0 ||
              strcmp(st, "completed") == 0) &&
             strcmp(state, st) != 0))
            break;
        sleep_ms(100);
    }
    fprintf(stderr, "job %s: waited for %s, it is %s (error: %s)\n", id, state, last,
            e2e_job_field(t, key, id, "error"));
    e2e_dump(t);
    CHECK(0);
}

void e2e_wait_sql(e2e *t, const char *sql, int timeout_s, const char *what)
{
    double start = fbt_now_ms();
    while (strcmp(fbt_sql_value(&t->s, sql), "t") != 0) {
        if (fbt_now_ms() - start > timeout_s * 1000.0) {
            fprintf(stderr, "timed out waiting for %s\n", what);
            e2e_dump(t);
            CHECK(0);
        }
        sleep_ms(100);
    }
}

void e2e_download_model(e2e *t, const char *key, const char *id, const char *path)
{
    char route[128];
    snprintf(route, sizeof route, "/v1/jobs/%s/model", id);
    fbt_resp r = fbt_call(&t->s, "GET", route, key, NULL);
    fbt_expect(&r, 200, NULL, "download a model");
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(r.body, 1, r.body_len, f) == r.body_len);
    CHECK(fclose(f) == 0);
    fbt_resp_free(&r);
}

void e2e_train_reference(e2e *t, const char *const *spec_files, int n, const char *out_dir)
{
    e2e_train_reference_on(t, spec_files, n, out_dir, 1);
}

void e2e_train_reference_on(e2e *t, const char *const *spec_files, int n, const char *out_dir,
                            int devices)
{
    char cmd[4096];
    int len = snprintf(cmd, sizeof cmd,
                       "'%s/workers/fusebox-train' --threads 1 --devices %d --log-every 0"
                       " --data-dir '%s' --out '%s'",
                       bin(), devices, t->data_dir, out_dir);
    for (int i = 0; i < n; i++)
        len += snprintf(cmd + len, sizeof cmd - (size_t)len, " '%s'", spec_files[i]);
    snprintf(cmd + len, sizeof cmd - (size_t)len, " > '%s/reference.log' 2>&1", t->root);
    int rc = system(cmd);
    if (rc != 0) {
        snprintf(cmd, sizeof cmd, "cat '%s/reference.log' 1>&2", t->root);
        if (system(cmd) != 0) fprintf(stderr, "(no log)\n");
    }
    CHECK(rc == 0);
}

double e2e_max_diff(const char *a, const char *b)
{
    char msg[256];
    fb_st_file *fa = NULL, *fb = NULL;
    if (fb_st_open(a, &fa, msg, sizeof msg) || fb_st_open(b, &fb, msg, sizeof msg)) {
        fprintf(stderr, "compare: %s\n", msg);
        fb_st_close(fa);
        return -1;
    }
    double worst = 0;
    size_t n = fb_st_count(fa);
    /* a full-state file may carry optimizer tensors; compare the model's */
    size_t n_model_b = 0;
    for (size_t i = 0; i < fb_st_count(fb); i++)
        n_model_b += strncmp(fb_st_at(fb, i)->name, "optim.", 6) != 0;
    size_t n_model_a = 0;
    for (size_t i = 0; i < n; i++) {
        const fb_st_tensor *ta = fb_st_at(fa, i);
        if (strncmp(ta->name, "optim.", 6) == 0) continue;
        n_model_a++;
        const fb_st_tensor *tb = fb_st_find(fb, ta->name);
        if (!tb || tb->numel != ta->numel || tb->dtype != ta->dtype) {
            worst = -1;
            break;
        }
        if (ta->dtype != FB_ST_F32) { /* counters: equal or not */
            if (ta->nbytes != tb->nbytes || memcmp(ta->data, tb->data, ta->nbytes) != 0)
                worst = INFINITY;
            continue;
        }
        for (int64_t k = 0; k < ta->numel; k++) {
            float x, y;
            memcpy(&x, ta->data + 4 * k, 4);
            memcpy(&y, tb->data + 4 * k, 4);
            double dd = fabs((double)x - (double)y);
            if (!(dd <= worst)) worst = isnan(dd) ? INFINITY : dd;
        }
    }
    if (worst >= 0 && n_model_a != n_model_b) worst = -1;
    fb_st_close(fa);
    fb_st_close(fb);
    return worst;
}

/* The path of the hook file kind-job ("hold" or "held") in path (cap bytes). */
static void hook_path(const e2e *t, const char *kind, const char *job, char *path, size_t cap)
{
    CHECK(job != NULL && job[0] && !strchr(job, '/'));
    CHECK((size_t)snprintf(path, cap, "%s/%s-%s", t->hook_dir, kind, job) < cap);
}

void e2e_hold(e2e *t, const char *job, long long step)
{
    CHECK(step >= 0);
    char held[400], path[400], tmp[420], text[32];
    hook_path(t, "held", job, held, sizeof held);
    hook_path(t, "hold", job, path, sizeof path);
    CHECK(unlink(held) == 0 || errno == ENOENT);
    /* renamed into place: a worker reads the whole step or no file */
    snprintf(tmp, sizeof tmp, "%s/.hold.tmp", t->hook_dir);
    snprintf(text, sizeof text, "%lld\n", step);
    e2e_write(tmp, text);
    CHECK(rename(tmp, path) == 0);
}

long long e2e_wait_held(e2e *t, const char *job, int timeout_s)
{
    char held[400];
    hook_path(t, "held", job, held, sizeof held);
    double start = fbt_now_ms();
    for (;;) {
        FILE *f = fopen(held, "r");
        long long step = -1;
        if (f) {
            if (fscanf(f, "%lld", &step) != 1) step = -1;
            fclose(f);
        }
        if (step >= 0) return step;
        if (fbt_now_ms() - start > timeout_s * 1000.0) break;
        sleep_ms(5);
    }
    fprintf(stderr, "no worker held %s within %d s\n", job, timeout_s);
    e2e_dump(t);
    CHECK(0);
    return -1;
}

void e2e_release(e2e *t, const char *job)
{
    char held[400], path[400];
    hook_path(t, "hold", job, path, sizeof path);
    hook_path(t, "held", job, held, sizeof held);
    CHECK(unlink(path) == 0 || errno == ENOENT);
    CHECK(unlink(held) == 0 || errno == ENOENT);
}

pid_t e2e_worker_via(e2e *t, const char *name, const char *server, const char *const *wrapper)
{
    return spawn_worker(t, name, server, wrapper, NULL);
}

