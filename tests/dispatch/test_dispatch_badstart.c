/*
 * An array that cannot start on a real fusebox-worker ends its jobs, within
 * seconds, with the worker's message (docs/scheduling.md, "Fault classes"):
 * the dataset's training shard is corrupt on the worker (its magic
 * overwritten after the import), so every array of the job fails as it opens
 * its loader.  That is a job fault: with max_restarts 1 the job is
 * re-queued once, placed again, fails again and ends `failed` with the
 * worker's message in its `error` and its events; the arrays leave no device
 * share behind.  No fake worker: the failure path is the worker's own.
 */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "e2e.h"

static e2e T;

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    e2e_start(&T, NULL);
    char shard[600];
    snprintf(shard, sizeof shard, "%s/synth/train/train-00000.fbs", T.data_dir);
    FILE *f = fopen(shard, "r+b");
    CHECK(f != NULL);
    CHECK(fwrite("CORRUPT!", 1, 8, f) == 8);
    CHECK(fclose(f) == 0);
    pid_t w = e2e_worker(&T, "w-badstart");
    char spec[1200];
    snprintf(spec, sizeof spec, "%s", e2e_spec("badstart", 0.001, 200, 100));
    char *end = strrchr(spec, '}');
    CHECK(end != NULL);
    snprintf(end, sizeof spec - (size_t)(end - spec), ", \"max_restarts\": 1}");
    char job[64];
    snprintf(job, sizeof job, "%s", e2e_submit(&T, T.key, spec));
    double t0 = fbt_now_ms();
    e2e_wait_state(&T, T.key, job, "failed", 60);
    double took = (fbt_now_ms() - t0) / 1000;
    char error[600];
    snprintf(error, sizeof error, "%s", e2e_job_field(&T, T.key, job, "error"));
    long long restarts = strtoll(e2e_job_field(&T, T.key, job, "restarts"), NULL, 10);
    printf("failed after %.1f s, restarts %lld: %s\n", took, restarts, error);
    CHECK(strstr(error, "not a fusebox shard") != NULL);
    CHECK_INT_EQ(restarts, 1);

    /* its events: one requeue (a job fault, the message in it), then the failure */
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/events", job);
    fbt_resp r = fbt_call(&T.s, "GET", path, T.key, NULL);
    fbt_expect(&r, 200, NULL, "the job's events");
    int requeued = 0, failed = 0;
    size_t i;
    json_t *ev;
    json_array_foreach(json_object_get(r.json, "events"), i, ev) {
        const char *kind = json_string_value(json_object_get(ev, "kind"));
        const char *msg = json_string_value(json_object_get(ev, "message"));
        const char *fault = json_string_value(json_object_get(json_object_get(ev, "data"), "fault"));
        if (!kind || !msg) continue;
        printf("event %s (%s): %s\n", kind, fault ? fault : "-", msg);
        if (strcmp(kind, "requeued") == 0) {
            requeued++;
            CHECK(fault && strcmp(fault, "job") == 0);
            CHECK(strstr(msg, "not a fusebox shard") != NULL);
        } else if (strcmp(kind, "failed") == 0) {
            failed++;
            CHECK(strstr(msg, "not a fusebox shard") != NULL);
        }
    }
    fbt_resp_free(&r);
    CHECK_INT_EQ(requeued, 1);
    CHECK_INT_EQ(failed, 1);

    /* no array of it is left holding a device */
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM groups g WHERE g.state <> 'finished' AND EXISTS (SELECT 1"
             " FROM job_events e WHERE e.job_id = '%s' AND e.data->>'group_id' = g.id::text)",
             job);
    CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "0");
    CHECK_STR_EQ(fbt_sql_value(&T.s, "SELECT count(*) FROM devices WHERE group_id IS NOT NULL"),
                 "0");

    printf("result: badstart failed_after_s=%.1f restarts=%lld\n", took, restarts);
    CHECK_INT_EQ(e2e_kill(w, SIGTERM), 0);
    e2e_finish(&T);
    printf("ok\n");
    return 0;
}
