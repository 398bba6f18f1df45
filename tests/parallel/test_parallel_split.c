/*
 * In-group batch splits that follow measured per-device speed, end to end on
 * real processes: fuseboxd with its fair-share controller (--rebalance-ms),
 * one fusebox-worker with two CPU devices that own one core each
 * (--pin-devices on), and a data-parallel job (parallel.data 2) on both.
 * Device 1 is slower for an honest reason: another array (a job that does
 * not fuse) trains on it at the same time, on the same core, while device 0
 * has its core to itself.  (Two filler jobs are started and the one the
 * planner puts on device 0 is cancelled, since the planner fills the lowest
 * index first.)
 *
 * The worker reports each device's step breakdown and samples; the server
 * turns them into each device's speed (samples per second of its passes)
 * and the controller re-splits the batch in proportion.  The test checks
 * that the split starts even and moves toward the faster device 0 while the
 * job trains; that the per-device breakdown is served by GET /v1/jobs/{id},
 * GET /v1/cluster and /metrics; and that the trained model is the one
 * fusebox-train makes on a single device (splits never change training).
 * Bad values of the new worker flag are refused before the worker starts.
 */
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "check.h"
#include "e2e.h"

static e2e T;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

#define BATCH 256

/* An MLP trained data-parallel on two devices (static buffer). */
static const char *spec(long long steps)
{
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"name\": \"split\", \"dataset\": \"synth\", \"model\": {\"input\": [16],"
             " \"layers\": [{\"type\": \"linear\", \"out\": 1024}, {\"type\": \"relu\"},"
             " {\"type\": \"linear\", \"out\": 1024}, {\"type\": \"relu\"},"
             " {\"type\": \"linear\", \"out\": 4}]}, \"batch_size\": %d, \"steps\": %lld,"
             " \"eval_every\": %lld, \"checkpoint_every\": %lld,"
             " \"parallel\": {\"data\": 2, \"pipeline\": 1},"
             " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01}, \"seed\": 5}",
             BATCH, steps, steps, steps);
    return buf;
}

/* fusebox-worker with extra flags after the usual ones (the later value of a flag wins),
 * connecting nowhere useful: for flags it must refuse before it connects.  Returns its
 * exit status and what it said. */
static int worker_refuses(const char *flags, char *out, size_t cap)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "'%s/workers/fusebox-worker' --server tcp://127.0.0.1:1 --server-key '%s'"
             " --key '%s' --name refused --cpu-devices 2 %s 2>&1",
             getenv("FB_BINARY_DIR"), T.server_pub, T.worker_key, flags);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void check_bad_flags(void)
{
    static const struct {
        const char *flags, *says;
    } bad[] = {
        {"--device-threads 0,1", "--device-threads needs 1..64 comma-separated integers"},
        {"--device-threads 2,", "--device-threads needs"},
        {"--device-threads 2,,1", "--device-threads needs"},
        {"--device-threads 1025", "--device-threads needs"},
        {"--device-threads x", "--device-threads needs"},
        {"--device-threads 2,1,1", "device threads are given for 3 devices; the worker offers 2"},
        {"--pin-devices yes", "--pin-devices needs on or off, not 'yes'"},
        {"--device-turns both", "--device-turns needs auto, all or first, not 'both'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char out[2048];
        int rc = worker_refuses(bad[i].flags, out, sizeof out);
        if (rc != 2 || !strstr(out, bad[i].says))
            fprintf(stderr, "%s: exit %d, said: %s\n", bad[i].flags, rc, out);
        CHECK_INT_EQ(rc, 2);
        CHECK(strstr(out, bad[i].says) != NULL);
    }
}

/* The job's split and per-device breakdown (GET /v1/jobs/{id}); false while it does not
 * train or either is not there yet. */
typedef struct view {
    int64_t split[2];
    double rate[2]; /* samples per second of each device's compute */
    int n_devices;
} view;

static bool observe(const char *id, view *v)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    fbt_resp r = fbt_call(&T.s, "GET", path, T.key, NULL);
    fbt_expect(&r, 200, NULL, "get the job");
    const char *state = json_string_value(json_object_get(r.json, "state"));
    json_t *split = json_object_get(json_object_get(r.json, "fair_share"), "split");
    json_t *bd = json_object_get(r.json, "device_breakdown");
    bool ok = state && strcmp(state, "running") == 0 && json_array_size(split) == 2 &&
              json_is_array(bd);
    if (ok) {
        for (int s = 0; s < 2; s++) v->split[s] = json_integer_value(json_array_get(split, s));
        CHECK_INT_EQ(v->split[0] + v->split[1], BATCH);
        v->n_devices = (int)json_array_size(bd);
        CHECK_INT_EQ(v->n_devices, 2);
        for (int k = 0; k < 2; k++) {
            json_t *e = json_array_get(bd, (size_t)k);
            /* the group's devices in its order: shard k on worker device k */
            CHECK_INT_EQ(json_integer_value(json_object_get(e, "device")), k);
            CHECK_INT_EQ(json_integer_value(json_object_get(e, "shard")), k);
            CHECK_INT_EQ(json_integer_value(json_object_get(e, "stage")), 0);
            static const char *const phase[] = {"compute_ms", "comm_ms", "io_ms", "idle_ms"};
            for (int p = 0; p < 4; p++) {
                json_t *x = json_object_get(e, phase[p]);
                CHECK(json_is_number(x) && json_number_value(x) >= 0);
            }
            CHECK(json_number_value(json_object_get(e, "compute_ms")) > 0);
            CHECK(json_number_value(json_object_get(e, "samples_per_step")) >= 1);
            json_t *rate = json_object_get(e, "samples_per_s");
            v->rate[k] = json_is_number(rate) ? json_number_value(rate) : 0;
        }
    }
    fbt_resp_free(&r);
    return ok;
}

/* GET /v1/cluster: the data-parallel array and each of its devices; the filler's array on
 * one device. */
static void check_cluster(void)
{
    fbt_resp r = fbt_call(&T.s, "GET", "/v1/cluster", T.key, NULL);
    fbt_expect(&r, 200, NULL, "cluster");
    json_t *arrays = json_object_get(r.json, "arrays");
    CHECK_INT_EQ(json_array_size(arrays), 2);
    int seen = 0;
    for (size_t i = 0; i < 2; i++) {
        json_t *a = json_array_get(arrays, i);
        json_t *bd = json_object_get(a, "device_breakdown");
        size_t n = json_array_size(json_object_get(a, "devices"));
        CHECK(json_is_array(bd));
        if (n == 1) {
            /* reported once the filler's first report with a step came in */
            CHECK(json_array_size(bd) <= 1);
            continue;
        }
        CHECK_INT_EQ(n, 2);
        CHECK_INT_EQ(json_array_size(bd), 2);
        for (size_t k = 0; k < 2; k++) {
            json_t *e = json_array_get(bd, k);
            CHECK_INT_EQ(json_integer_value(json_object_get(e, "device")), (long long)k);
            CHECK(json_number_value(json_object_get(e, "compute_ms")) > 0);
        }
        seen++;
    }
    CHECK_INT_EQ(seen, 1);
    fbt_resp_free(&r);
}

/* A job that does not fuse with the data-parallel one (another model, one device), long
 * enough to outlast the test (static buffer). */
static const char *filler(const char *name)
{
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"name\": \"%s\", \"dataset\": \"synth\", \"model\": {\"input\": [16],"
             " \"layers\": [{\"type\": \"linear\", \"out\": 256}, {\"type\": \"relu\"},"
             " {\"type\": \"linear\", \"out\": 4}]}, \"batch_size\": %d, \"steps\": 10000000,"
             " \"eval_every\": 10000000, \"checkpoint_every\": 10000000,"
             " \"optimizer\": {\"type\": \"adam\", \"lr\": 0.001}, \"seed\": 9}",
             name, BATCH);
    return buf;
}

/* The worker device indices of a running job's array, as text ("[1]"). */
static const char *devices_of(const char *id)
{
    static char buf[64];
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT g.device_idx::text FROM jobs j JOIN groups g ON g.id = j.group_id"
             " WHERE j.id = '%s'",
             id);
    snprintf(buf, sizeof buf, "%s", fbt_sql_value(&T.s, sql));
    return buf;
}

static void cancel(const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
    fbt_resp r = fbt_call(&T.s, "POST", path, T.key, "{}");
    fbt_expect(&r, 200, NULL, "cancel a job");
    fbt_resp_free(&r);
}

/* /metrics: both devices' phases and speeds, labelled by group, worker and device; false
 * while no fair-share period has published them yet. */
static bool check_metrics(void)
{
    fbt_resp r = fbt_call(&T.s, "GET", "/metrics", NULL, NULL);
    fbt_expect(&r, 200, NULL, "metrics");
    CHECK(r.body != NULL);
    static const char *const want[] = {
        "# TYPE fusebox_device_step_seconds gauge",
        ",worker=\"w1\",device=\"0\",phase=\"compute\"} ",
        ",worker=\"w1\",device=\"1\",phase=\"idle\"} ",
        "# TYPE fusebox_device_samples_per_second gauge",
        "fusebox_device_samples_per_second{group=\"",
    };
    bool all = true;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        all &= strstr(r.body, want[i]) != NULL;
    fbt_resp_free(&r);
    return all;
}

int main(void)
{
    CHECK(getenv("FB_BINARY_DIR") != NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    double t0 = fbt_now_ms();
    const char *flags[] = {"--rebalance-ms", "1000", "--max-groups-per-device", "2", NULL};
    e2e_start(&T, flags);
    check_bad_flags();

    char server[64];
    snprintf(server, sizeof server, "tcp://127.0.0.1:%d", T.worker_port);
    /* the usual worker flags (one math thread a device), then two devices on a core each */
    const char *const wrapper[] = {"/bin/sh", "-c", "exec \"$@\" --cpu-devices 2 --pin-devices on",
                                   "sh", NULL};
    pid_t w = e2e_worker_via(&T, "w1", server, wrapper);

    /* a filler on each device; the one on device 0 goes again */
    char fill[2][64];
    for (int i = 0; i < 2; i++) {
        snprintf(fill[i], sizeof fill[i], "%s", e2e_submit(&T, T.key, filler(i ? "b" : "a")));
        e2e_wait_state(&T, T.key, fill[i], "running", 60);
    }
    CHECK_STR_EQ(devices_of(fill[0]), "{0}");
    CHECK_STR_EQ(devices_of(fill[1]), "{1}");
    cancel(fill[0]);
    e2e_wait_state(&T, T.key, fill[0], "cancelled", 30);
    e2e_wait_sql(&T, "SELECT count(*) = 1 FROM groups WHERE state <> 'finished'", 30,
                 "the cancelled filler's array ends");

    /* long enough for many fair-share periods (the split moves only when the measured speeds
     * differ beyond the hysteresis, which a busy machine can hide for a few periods); the
     * test stops watching once the split moved and only waits for the end */
    const long long steps = 600;
    char spec_file[400];
    snprintf(spec_file, sizeof spec_file, "%s/split.json", T.root);
    e2e_write(spec_file, spec(steps));
    char id[64];
    snprintf(id, sizeof id, "%s", e2e_submit(&T, T.key, spec(steps)));
    /* the planner's split, read as soon as the array exists: the controller changes it only
     * after measurements of a warm array (its first report does not count) */
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT coalesce((SELECT g.split::text FROM jobs j JOIN groups g"
             " ON g.id = j.group_id WHERE j.id = '%s'), '')",
             id);
    char planned[64] = "";
    for (double t = fbt_now_ms(); !planned[0]; sleep_ms(20)) {
        CHECK(fbt_now_ms() - t < 60000);
        snprintf(planned, sizeof planned, "%s", fbt_sql_value(&T.s, sql));
    }
    printf("the planner's split: %s\n", planned);
    CHECK_STR_EQ(planned, "{128,128}");
    e2e_wait_state(&T, T.key, id, "running", 60);
    CHECK_STR_EQ(devices_of(id), "{0,1}");

    /* the split: even at first, then toward device 0, which computes faster */
    view v = {0};
    int64_t best0 = 0;
    double rate_sum[2] = {0, 0}, since = fbt_now_ms();
    int n_rates = 0, n_seen = 0;
    bool served = false, in_metrics = false;
    while (best0 < BATCH * 11 / 20 || n_rates < 3) {
        const char *state = e2e_job_field(&T, T.key, id, "state");
        if (strcmp(state, "running") != 0 || fbt_now_ms() - since > 60000) {
            fprintf(stderr,
                    "the split did not move toward device 0 (state %s, best %lld/%d, %d "
                    "readings)\n",
                    state, (long long)best0, BATCH, n_rates);
            e2e_dump(&T);
            CHECK(0);
        }
        sleep_ms(250);
        if (!observe(id, &v)) continue;
        /* the first report with speeds holds the array's warm-up */
        if (v.rate[0] > 0 && v.rate[1] > 0 && n_seen++ > 0) {
            rate_sum[0] += v.rate[0];
            rate_sum[1] += v.rate[1];
            n_rates++;
        }
        if (v.split[0] > best0) {
            best0 = v.split[0];
            printf("t=%5.1fs split %lld/%lld, device speeds %.0f and %.0f samples/s\n",
                   (fbt_now_ms() - since) / 1e3, (long long)v.split[0], (long long)v.split[1],
                   v.rate[0], v.rate[1]);
        }
        if (!served) {
            check_cluster();
            served = true;
        }
        if (!in_metrics) in_metrics = check_metrics();
    }
    CHECK(in_metrics);
    /* the reports, one by one noisy on a shared machine, say the same on the whole: device 0,
     * with a core to itself, computes faster than device 1, which shares its core */
    printf("mean of %d readings: device 0 %.0f, device 1 %.0f samples/s\n", n_rates,
           rate_sum[0] / n_rates, rate_sum[1] / n_rates);
    CHECK(rate_sum[0] > rate_sum[1]);

    /* the job completes, and its model is fusebox-train's on one device */
    e2e_wait_state(&T, T.key, id, "completed", 120);
    char got[400], ref_dir[400], want[500];
    snprintf(got, sizeof got, "%s/model.safetensors", T.root);
    e2e_download_model(&T, T.key, id, got);
    snprintf(ref_dir, sizeof ref_dir, "%s/ref", T.root);
    const char *files[1] = {spec_file};
    e2e_train_reference(&T, files, 1, ref_dir);
    snprintf(want, sizeof want, "%s/split.safetensors", ref_dir);
    double diff = e2e_max_diff(got, want);
    printf("max |model (2 devices, split moved to %lld/%lld) - fusebox-train| = %g\n",
           (long long)best0, (long long)(BATCH - best0), diff);
    CHECK(diff >= 0 && diff < 1e-4);
    /* and its final evaluation: the same test loss within float rounding */
    char log[400], line[1024];
    snprintf(sql, sizeof sql,
             "SELECT latest_metrics->>'val_loss' FROM jobs WHERE id = '%s'", id);
    double loss = strtod(fbt_sql_value(&T.s, sql), NULL), ref_loss = NAN;
    snprintf(log, sizeof log, "%s/reference.log", T.root);
    FILE *f = fopen(log, "r");
    CHECK(f != NULL);
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "\"event\":\"done\"") ? strstr(line, "\"val_loss\":") : NULL;
        if (at) ref_loss = strtod(at + strlen("\"val_loss\":"), NULL);
    }
    fclose(f);
    double rel = fabs(loss - ref_loss) / fabs(ref_loss);
    printf("final test loss %.9g, fusebox-train's %.9g: relative difference %.3g\n", loss,
           ref_loss, rel);
    CHECK(rel <= 1e-5);
    cancel(fill[1]);
    e2e_wait_state(&T, T.key, fill[1], "cancelled", 30);

    int rc = fbt_validate_recorded();
    if (rc == 77)
        printf("the responses were not validated against api/openapi.yaml (no node)\n");
    else
        CHECK_INT_EQ(rc, 0);
    CHECK_INT_EQ(e2e_kill(w, SIGTERM), 0);
    printf("test_parallel_split: ok (%.1f s)\n", (fbt_now_ms() - t0) / 1e3);
    e2e_finish(&T);
    return 0;
}
