/*
 * The control loop's records of what workers report: progress (metric
 * points, latest state, utilization, slowdown and the isolated step time's
 * profiles), events (started, evaluated, checkpointed, finished, failed,
 * detached) and the artifacts they carry (checkpoints and models, written
 * into the artifacts directory), and the measurements a group's reports
 * give (its step time, each device's speed).  Reports wait in memory in the
 * order they came (dispatch_impl.h, struct pending) and are written when
 * PostgreSQL is up; an event is acknowledged once it is committed.
 */
#include "dispatch_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <limits.h>
#include <math.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "db.h"
#include "errors.h"
#include "fairshare.h"
#include "log.h"
#include "metrics.h"
#include "paths.h"
#include "wire.h"

/* longest one flush of progress reports writes before it yields */
#define FLUSH_BUDGET_MS 100

/* and longest one transaction of it: a submission waits at most this for its plan */
#define FLUSH_SLICE_MS 20

/*
 * A member that failed on its worker ($4 the worker's message, $6 the worker): a spec fault
 * ($5) fails the job now; a job fault uses up one of its max_restarts and returns it to the
 * queue from its resume point, or fails it with this last error when none is left.  A job no
 * longer scheduled or running (cancelled meanwhile) keeps its state.  Event failed or
 * requeued, with the fault and the counts in its data.
 */
static const char sql_member_failed[] =
    "WITH v AS (SELECT id, CASE WHEN state NOT IN ('scheduled', 'running') THEN 'keep'"
    "   WHEN $5::bool OR restarts >= max_restarts THEN 'fail' ELSE 'restart' END AS verdict"
    "  FROM jobs WHERE id = $1::uuid),"
    " upd AS (UPDATE jobs j SET"
    "  state = CASE v.verdict WHEN 'fail' THEN 'failed' WHEN 'restart' THEN 'queued'"
    "   ELSE j.state END,"
    "  error = CASE WHEN v.verdict = 'restart' THEN j.error ELSE $4 END,"
    "  restarts = j.restarts + (v.verdict = 'restart')::int,"
    "  step = CASE WHEN v.verdict = 'restart' THEN j.resume_step ELSE j.step END,"
    "  queue_reason = CASE WHEN v.verdict = 'restart' THEN 'failed on worker ' || $6 || ': '"
    "   || $4 || '; restart ' || (j.restarts + 1) || ' of ' || j.max_restarts"
    "   || ', resumes from step ' || j.resume_step ELSE j.queue_reason END,"
    "  finished_at = CASE WHEN v.verdict = 'restart' THEN j.finished_at"
    "   ELSE coalesce(j.finished_at, now()) END,"
    "  in_group = false, updated_at = now()"
    "  FROM v WHERE j.id = v.id"
    "  RETURNING j.id, v.verdict, j.restarts, j.max_restarts, j.resume_step, j.queue_reason)"
    " INSERT INTO job_events (job_id, kind, message, data)"
    " SELECT id, CASE verdict WHEN 'restart' THEN 'requeued' ELSE 'failed' END,"
    " CASE verdict WHEN 'restart' THEN queue_reason ELSE $4 END,"
    " jsonb_build_object('step', $3::bigint, 'group_id', $2::text, 'worker', $6::text,"
    "  'fault', CASE WHEN $5::bool THEN 'spec' ELSE 'job' END, 'error', $4::text,"
    "  'restarts', restarts, 'max_restarts', max_restarts, 'resume_step', resume_step)"
    " FROM upd";

/* A full-state checkpoint's row ($1 job, $2 step, $3 path, $4 bytes, $5 SHA-256). */
static const char sql_checkpoint_state_insert[] =
    "INSERT INTO checkpoints (job_id, step, path, bytes, sha256, kind, is_final)"
    " VALUES ($1::uuid, $2::bigint, $3, $4::bigint, $5, 'state', false)"
    " ON CONFLICT (job_id, kind, step, is_final) DO NOTHING";

/* The job's resume point moves to a checkpoint, never back ($1 job, $2 step, $3 path). */
static const char sql_job_resume_point[] =
    "UPDATE jobs SET resume_step = $2::bigint, resume_path = $3, updated_at = now()"
    " WHERE id = $1::uuid AND resume_step <= $2::bigint";

/* A group's member count, and its end once no job trains in it; its state comes back. */
static const char sql_group_maybe_finish[] =
    "UPDATE groups g SET n_members = (SELECT count(*) FROM jobs j"
    "  WHERE j.group_id = g.id AND j.in_group),"
    " state = CASE WHEN EXISTS (SELECT 1 FROM jobs j WHERE j.group_id = g.id"
    "  AND j.in_group) THEN g.state ELSE 'finished' END,"
    " finished_at = CASE WHEN EXISTS (SELECT 1 FROM jobs j WHERE j.group_id = g.id"
    "  AND j.in_group) THEN NULL ELSE now() END, updated_at = now()"
    " WHERE g.id = $1::uuid AND g.state <> 'finished' RETURNING g.state";

/* The devices a finished group held, freed ($1 the group). */
static const char sql_group_devices_free[] =
    "UPDATE devices SET group_id = NULL, tenant_id = NULL"
    " WHERE group_id = $1::uuid";

/* The tenant of a job a late checkpoint may still resume, locked; no row when it belongs to no
 * other run (apply_late_checkpoint). */
static const char sql_late_checkpoint_owner[] =
    "SELECT j.tenant_id FROM jobs j JOIN groups g ON g.id = j.group_id"
    " JOIN workers w ON w.id = g.worker_id"
    " WHERE j.id = $1::uuid AND j.group_id = $2::uuid AND NOT j.in_group"
    " AND j.state = 'queued' AND g.state = 'finished'"
    " AND g.generation = $3::bigint AND w.name = $4"
    " AND j.resume_step < $5::bigint FOR UPDATE OF j";

/* The job resumes from a late checkpoint ($2 its step). */
static const char sql_late_checkpoint_job[] =
    "UPDATE jobs SET step = GREATEST(step, $2::bigint), updated_at = now(),"
    " queue_reason = 'a checkpoint arrived after the requeue; resumes from step ' || $2"
    " WHERE id = $1::uuid";

/* The event of a late checkpoint ($1 job, $2 step, $3 group). */
static const char sql_late_checkpoint_event[] =
    "INSERT INTO job_events (job_id, kind, message, data) VALUES ($1::uuid,"
    " 'checkpointed', 'checkpoint at step ' || $2 || ', received after the array was"
    " requeued; resumes from it', jsonb_build_object('step', $2::bigint, 'group_id',"
    " $3::text, 'late', true))";

/* The event's job, locked: its tenant, state and whether it is still in the event's group ($2). */
static const char sql_event_job[] =
    "SELECT tenant_id, state, in_group AND group_id = $2::uuid FROM jobs"
    " WHERE id = $1::uuid FOR UPDATE";

/* An event recorded once ($1 group, $2 job, $3 kind, $4 step): a row comes back when it is new. */
static const char sql_event_applied[] =
    "INSERT INTO events_applied (group_id, job_id, kind, step)"
    " VALUES ($1::uuid, $2::uuid, $3, $4::bigint) ON CONFLICT DO NOTHING RETURNING 1";

/* STARTED: the job runs. */
static const char sql_started_job[] =
    "UPDATE jobs SET state = 'running', started_at = coalesce(started_at, now()),"
    " updated_at = now() WHERE id = $1::uuid AND state = 'scheduled'";

/* STARTED: the group runs. */
static const char sql_started_group[] =
    "UPDATE groups SET state = 'running', updated_at = now()"
    " WHERE id = $1::uuid AND state = 'scheduled'";

/* STARTED: its event ($1 job, $2 group, $3 step, $4 worker). */
static const char sql_started_event[] =
    "INSERT INTO job_events (job_id, kind, message, data) VALUES ($1::uuid,"
    " 'started', 'training at step ' || $3 || ' in array ' || $2 || ' on worker '"
    " || $4, jsonb_build_object('group_id', $2::text, 'worker', $4::text,"
    " 'step', $3::bigint))";

/* EVALUATED: the validation's point of the series ($1 job, $2 step, $3 loss, $4 accuracy). */
static const char sql_evaluated_metrics[] =
    "INSERT INTO job_metrics (job_id, step, val_loss, val_accuracy)"
    " VALUES ($1::uuid, $2::bigint, $3::float8, $4::float8)"
    " ON CONFLICT (job_id, step) DO UPDATE SET val_loss = EXCLUDED.val_loss,"
    " val_accuracy = EXCLUDED.val_accuracy";

/* EVALUATED: the validation in the job's latest metrics. */
static const char sql_evaluated_latest[] =
    "UPDATE jobs SET latest_metrics = coalesce(latest_metrics, '{}'::jsonb) ||"
    " jsonb_strip_nulls(jsonb_build_object('val_step', $2::bigint, 'val_loss',"
    " $3::float8, 'val_accuracy', $4::float8)), updated_at = now()"
    " WHERE id = $1::uuid";

/* CHECKPOINTED: its event ($1 job, $2 group, $3 step). */
static const char sql_checkpointed_event[] =
    "INSERT INTO job_events (job_id, kind, message, data) VALUES ($1::uuid,"
    " 'checkpointed', 'checkpoint at step ' || $3,"
    " jsonb_build_object('step', $3::bigint, 'group_id', $2::text))";

/* FINISHED: the final model's row ($1 job, $2 step, $3 path, $4 bytes, $5 SHA-256). */
static const char sql_checkpoint_model_insert[] =
    "INSERT INTO checkpoints (job_id, step, path, bytes, sha256, kind, is_final)"
    " VALUES ($1::uuid, $2::bigint, $3, $4::bigint, $5, 'model', true)"
    " ON CONFLICT (job_id, kind, step, is_final) DO NOTHING";

/* FINISHED: the test evaluation joins the series at the last step ($3 loss, $4 accuracy). */
static const char sql_finished_test_metrics[] =
    "INSERT INTO job_metrics (job_id, step, test_loss, test_accuracy)"
    " VALUES ($1::uuid, $2::bigint, $3::float8, $4::float8)"
    " ON CONFLICT (job_id, step) DO UPDATE SET test_loss = EXCLUDED.test_loss,"
    " test_accuracy = EXCLUDED.test_accuracy";

/* FINISHED: the job completed at its step, with its validation ($3, $4) and test ($5, $6) in
 * its latest metrics. */
static const char sql_finished_job[] =
    "UPDATE jobs SET state = CASE WHEN state IN ('scheduled', 'running')"
    " THEN 'completed' ELSE state END, in_group = false,"
    " step = $2::bigint, finished_at = coalesce(finished_at, now()),"
    " latest_metrics = coalesce(latest_metrics, '{}'::jsonb) ||"
    " jsonb_strip_nulls(jsonb_build_object('step', $2::bigint, 'val_step',"
    " CASE WHEN $3::float8 IS NOT NULL OR $4::float8 IS NOT NULL THEN $2::bigint"
    " END, 'val_loss', $3::float8, 'val_accuracy', $4::float8, 'test_loss',"
    " $5::float8, 'test_accuracy', $6::float8)),"
    " updated_at = now() WHERE id = $1::uuid";

/* FINISHED: its event ($1 job, $2 group, $3 step, $4..$7 validation and test loss and accuracy). */
static const char sql_finished_event[] =
    "INSERT INTO job_events (job_id, kind, message, data) VALUES ($1::uuid,"
    " 'completed', 'finished at step ' || $3 || coalesce(': validation accuracy ' ||"
    " round($5::numeric, 4), '') || coalesce(', test accuracy ' ||"
    " round($7::numeric, 4), ''), jsonb_strip_nulls(jsonb_build_object('step',"
    " $3::bigint, 'val_loss', $4::float8, 'val_accuracy', $5::float8,"
    " 'test_loss', $6::float8, 'test_accuracy', $7::float8,"
    " 'group_id', $2::text)))";

/* DETACHED: a member that left while its job still wants training goes back to the queue; its
 * event ($4 why). */
static const char sql_detached_member[] =
    "WITH upd AS (UPDATE jobs SET in_group = false, updated_at = now(),"
    " state = CASE WHEN state IN ('scheduled', 'running') THEN 'queued' ELSE state END,"
    " queue_reason = CASE WHEN state IN ('scheduled', 'running') THEN"
    "  'left its array (' || $4 || '); resumes from step ' || resume_step"
    "  ELSE queue_reason END,"
    " step = CASE WHEN state IN ('scheduled', 'running') THEN resume_step ELSE step END"
    " WHERE id = $1::uuid RETURNING state, resume_step)"
    " INSERT INTO job_events (job_id, kind, message, data) SELECT $1::uuid,"
    " CASE WHEN state = 'queued' THEN 'requeued' ELSE 'detached' END,"
    " CASE WHEN state = 'queued' THEN 'left its array (' || $4 ||"
    "  '); resumes from step ' || resume_step ELSE 'left its array (' || $4 || ')' END,"
    " jsonb_build_object('step', $3::bigint, 'group_id', $2::text) FROM upd";

/* A device's utilization: the busy part of the time of the unfinished arrays on it, summed,
 * from their latest reports, for the devices of group $1. */
static const char sql_utilization[] =
    "WITH g AS (SELECT worker_id, idx FROM group_devices WHERE group_id = $1::uuid),"
    " busy AS (SELECT d.worker_id, d.idx, coalesce(sum(CASE WHEN t.total > 0"
    "   THEN t.work / t.total END), 0) AS u"
    "  FROM devices d JOIN g ON d.worker_id = g.worker_id AND d.idx = g.idx"
    "  LEFT JOIN LATERAL (SELECT coalesce((o.breakdown->>'compute_ms')::float8, 0)"
    "   + coalesce((o.breakdown->>'comm_ms')::float8, 0)"
    "   + coalesce((o.breakdown->>'io_ms')::float8, 0) AS work,"
    "   coalesce((o.breakdown->>'compute_ms')::float8, 0)"
    "   + coalesce((o.breakdown->>'comm_ms')::float8, 0)"
    "   + coalesce((o.breakdown->>'io_ms')::float8, 0)"
    "   + coalesce((o.breakdown->>'idle_ms')::float8, 0) AS total"
    "   FROM (SELECT o1.breakdown FROM groups o1 WHERE o1.worker_id = d.worker_id"
    "    AND d.idx = ANY(o1.device_idx) AND o1.comm_port IS NULL"
    "    AND o1.state <> 'finished'"
    "    UNION ALL SELECT o2.breakdown FROM group_workers gw"
    "    JOIN groups o2 ON o2.id = gw.group_id WHERE gw.worker_id = d.worker_id"
    "    AND d.idx = ANY(gw.device_idx) AND o2.state <> 'finished') o) t ON true"
    "  GROUP BY d.worker_id, d.idx)"
    " UPDATE devices d SET utilization = LEAST(1, GREATEST(0, busy.u)) FROM busy"
    " WHERE d.worker_id = busy.worker_id AND d.idx = busy.idx";

/* PROGRESS: the members' points of the time series ($2..$5 arrays of job, step, loss,
 * accuracy; $6..$10 the array's speed and breakdown). */
static const char sql_progress_metrics[] =
    "INSERT INTO job_metrics (job_id, step, loss, accuracy, samples_per_s, compute_ms,"
    " comm_ms, io_ms, wait_ms)"
    " SELECT u.id, u.step, u.loss, u.acc, $6::float8, $7::float8, $8::float8,"
    " $9::float8, $10::float8"
    " FROM unnest($2::uuid[], $3::bigint[], $4::float8[], $5::float8[]) AS"
    " u(id, step, loss, acc) JOIN jobs j ON j.id = u.id AND j.group_id = $1::uuid"
    " ON CONFLICT (job_id, step) DO UPDATE SET loss = EXCLUDED.loss,"
    " accuracy = EXCLUDED.accuracy, samples_per_s = EXCLUDED.samples_per_s,"
    " compute_ms = EXCLUDED.compute_ms, comm_ms = EXCLUDED.comm_ms,"
    " io_ms = EXCLUDED.io_ms, wait_ms = EXCLUDED.wait_ms";

/* PROGRESS: the members' latest state ($2..$6 arrays of job, step, loss, accuracy, lr; $7..$11
 * speed and breakdown). */
static const char sql_progress_jobs[] =
    "UPDATE jobs j SET step = GREATEST(j.step, u.step), updated_at = now(),"
    " latest_metrics = coalesce(j.latest_metrics, '{}'::jsonb) ||"
    " jsonb_strip_nulls(jsonb_build_object('step', u.step, 'loss', u.loss,"
    " 'accuracy', u.acc, 'lr', u.lr, 'samples_per_s', $7::float8,"
    " 'compute_ms', $8::float8, 'comm_ms', $9::float8, 'io_ms', $10::float8,"
    " 'idle_ms', $11::float8))"
    " FROM unnest($2::uuid[], $3::bigint[], $4::float8[], $5::float8[], $6::float8[])"
    " AS u(id, step, loss, acc, lr)"
    " WHERE j.id = u.id AND j.group_id = $1::uuid AND j.in_group";

/* PROGRESS: the array's speed and breakdown. */
static const char sql_progress_group[] =
    "UPDATE groups SET samples_per_s = $2::float8, updated_at = now(),"
    " breakdown = jsonb_strip_nulls(jsonb_build_object('compute_ms', $3::float8,"
    " 'comm_ms', $4::float8, 'io_ms', $5::float8, 'idle_ms', $6::float8))"
    " WHERE id = $1::uuid";

/* PROGRESS of an array that spans workers: its device breakdown over all ranks ($2, JSON). */
static const char sql_group_breakdown_span[] =
    "UPDATE groups SET device_breakdown = $2::jsonb WHERE id = $1::uuid";

/* PROGRESS: the report's device breakdown ($2, JSON), kept only when it names the group's
 * devices in the group's order, which gives each entry its shard and stage. */
static const char sql_group_breakdown[] =
    "UPDATE groups g SET device_breakdown = (SELECT jsonb_agg(e.x ||"
    " jsonb_build_object('shard', (e.k - 1) / g.parallel_pipeline,"
    " 'stage', (e.k - 1) % g.parallel_pipeline, 'worker',"
    " (SELECT w.name FROM workers w WHERE w.id = g.worker_id)) ORDER BY e.k)"
    " FROM jsonb_array_elements($2::jsonb) WITH ORDINALITY AS e(x, k))"
    " WHERE g.id = $1::uuid AND g.parallel_pipeline >= 1"
    " AND g.device_idx = ARRAY(SELECT (e.x->>'device')::int"
    "  FROM jsonb_array_elements($2::jsonb) WITH ORDINALITY AS e(x, k)"
    "  ORDER BY e.k)";

/* The profile of a report's array (fusion key, B, device kind): seeded, replaced, averaged
 * in, or lowered by a shared window (record_slowdown says when and why). */
static const char sql_profile[] =
    "WITH a AS (SELECT g.fusion_key, w.backend,"
    "  g.parallel_data = 1 AND g.parallel_pipeline = 1 AS one_device,"
    "  EXISTS (SELECT 1 FROM group_devices mine JOIN group_devices o"
    "   ON o.worker_id = mine.worker_id AND o.idx = mine.idx AND o.group_id <> mine.group_id"
    "   JOIN groups og ON og.id = o.group_id AND og.state <> 'finished'"
    "   WHERE mine.group_id = g.id) AS shared"
    "  FROM groups g JOIN workers w ON w.id = g.worker_id WHERE g.id = $1::uuid),"
    " l AS (UPDATE profiles p SET"
    "  isolated_step_ms = 0.5 * p.isolated_step_ms + 0.5 * $5::float8, measured_at = now()"
    "  FROM a WHERE a.shared AND a.one_device AND $4::boolean AND $5::float8 > 0"
    "  AND $5::float8 < p.isolated_step_ms AND p.fusion_key = a.fusion_key"
    "  AND p.n_models = $3::int AND p.device_kind = a.backend)"
    " INSERT INTO profiles AS p (fusion_key, n_models, device_kind, isolated_step_ms, warm)"
    " SELECT a.fusion_key, $3::int, a.backend, $2::float8, $4::boolean FROM a"
    " WHERE NOT a.shared"
    " ON CONFLICT (fusion_key, n_models, device_kind) DO UPDATE SET"
    " isolated_step_ms = CASE WHEN NOT p.warm THEN EXCLUDED.isolated_step_ms"
    "  WHEN EXCLUDED.isolated_step_ms < p.isolated_step_ms"
    "  THEN 0.5 * p.isolated_step_ms + 0.5 * EXCLUDED.isolated_step_ms"
    "  ELSE 0.9 * p.isolated_step_ms + 0.1 * EXCLUDED.isolated_step_ms END,"
    " warm = true, measured_at = now() WHERE EXCLUDED.warm";

/* The members' slowdown ($4..$6 arrays of job, step, total steps; $2 the smoothed step, $7 the
 * busy time standing in for a missing profile, $8 the loop's clock), in the series and the
 * job. */
static const char sql_slowdown[] =
    "WITH s AS (SELECT u.id, u.step,"
    "  (extract(epoch FROM coalesce(to_timestamp($8::float8), now()) - j.created_at)"
    "  * 1000"
    "  + (u.total - u.step) * $2::float8)"
    "  / (u.total * coalesce(p.isolated_step_ms, $7::float8)) AS x"
    " FROM unnest($4::uuid[], $5::bigint[], $6::bigint[]) AS u(id, step, total)"
    " JOIN jobs j ON j.id = u.id AND j.group_id = $1::uuid AND j.in_group"
    " JOIN groups g ON g.id = $1::uuid JOIN workers w ON w.id = g.worker_id"
    " LEFT JOIN profiles p ON p.fusion_key = g.fusion_key AND p.n_models = $3::int"
    "  AND p.device_kind = w.backend"
    " WHERE u.total > 0 AND coalesce(p.isolated_step_ms, $7::float8) > 0),"
    " m AS (UPDATE job_metrics jm SET slowdown = s.x FROM s"
    "  WHERE jm.job_id = s.id AND jm.step = s.step)"
    " UPDATE jobs j SET slowdown = s.x FROM s WHERE j.id = s.id";

static bool record_slowdown(fb_dispatch *d, const pending *p, const char *ids,
                            const char *steps, const char *totals);

/* ---- artifacts ----------------------------------------------------------- */

static int mkdirs(const char *path)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0750) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(tmp, 0750) != 0 && errno != EEXIST ? -1 : 0;
}

/*
 * Writes a blob to artifacts/<tenant>/<job>/<file> through a temporary file,
 * fsync and rename; rel receives the path relative to the artifacts
 * directory and sha its SHA-256 in hex.
 */
static int write_artifact(fb_dispatch *d, const char *tenant, const char *job, const char *file,
                          const void *buf, size_t len, char *rel, size_t rel_cap, char sha[65])
{
    char dir[PATH_MAX], path[PATH_MAX], tmp[PATH_MAX];
    snprintf(rel, rel_cap, "%s/%s/%s", tenant, job, file);
    snprintf(dir, sizeof dir, "%s/%s/%s", d->artifacts, tenant, job);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, file);
    if (mkdirs(dir) != 0) return FB_ERR_IO;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
    if (fd < 0) return FB_ERR_IO;
    const uint8_t *p = buf;
    size_t left = len;
    bool ok = true;
    while (ok && left) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR) continue;
        ok = n > 0;
        if (ok) {
            p += n;
            left -= (size_t)n;
        }
    }
    ok = ok && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return FB_ERR_IO;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    uint8_t h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, buf, len);
    sodium_bin2hex(sha, 65, h, sizeof h);
    return FB_OK;
}

/* Reads an artifact (relative path) into memory; NULL when it cannot, or
 * when the path leads out of the artifacts directory (paths.h). */
static void *read_under(const char *root, const char *rel, size_t *len)
{
    int fd = fb_path_open_under(root, rel);
    if (fd < 0) return NULL;
    struct stat st;
    void *buf = NULL;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
        (size_t)st.st_size <= FB_WIRE_MAX_BLOB && (buf = malloc((size_t)st.st_size))) {
        size_t got = 0;
        while (got < (size_t)st.st_size) {
            ssize_t n = read(fd, (char *)buf + got, (size_t)st.st_size - got);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            got += (size_t)n;
        }
        if (got != (size_t)st.st_size) {
            free(buf);
            buf = NULL;
        } else {
            *len = got;
        }
    }
    close(fd);
    return buf;
}

void *dsp_read_artifact(fb_dispatch *d, const char *rel, size_t *len)
{
    return read_under(d->artifacts, rel, len);
}

/* Reads an artifact of the tenant's: rel must lie under <tenant id>/ and resolve, every
 * link followed, inside that tenant's own directory; NULL otherwise. */
void *dsp_read_tenant_artifact(fb_dispatch *d, const char *tenant, const char *rel,
                                  size_t *len)
{
    size_t tl = strlen(tenant);
    if (strncmp(rel, tenant, tl) != 0 || rel[tl] != '/') return NULL;
    char root[PATH_MAX];
    if ((size_t)snprintf(root, sizeof root, "%s/%s", d->artifacts, tenant) >= sizeof root)
        return NULL;
    return read_under(root, rel + tl + 1, len);
}

/* ---- events -------------------------------------------------------------- */

static void fmt_num(char *buf, size_t cap, double x)
{
    if (isfinite(x))
        snprintf(buf, cap, "%.17g", x);
    else
        buf[0] = '\0';
}

/* Records a full-state checkpoint of a job (file, row, resume point). */
static int record_state(fb_dispatch *d, const pending *e, const char *tenant)
{
    const fb_wire_msg *m = &e->m;
    char file[64], rel[PATH_MAX], sha[65], step[24], bytes[24];
    snprintf(file, sizeof file, "state-%lld.safetensors", (long long)m->step);
    if (write_artifact(d, tenant, m->job_id, file, e->blob, e->blob_len, rel, sizeof rel, sha))
        return FB_ERR_IO;
    snprintf(step, sizeof step, "%lld", (long long)m->step);
    snprintf(bytes, sizeof bytes, "%zu", e->blob_len);
    const char *v[5] = {m->job_id, step, rel, bytes, sha};
    if (!dsp_exec(d, sql_checkpoint_state_insert, 5, v) ||
        !dsp_exec(d, sql_job_resume_point, 3, v))
        return FB_ERR_UNAVAILABLE;
    return FB_OK;
}

/* Finishes a group once none of its jobs trains in it any more; *finished
 * says whether it did (the caller forgets the group after COMMIT). */
static bool maybe_finish_group(fb_dispatch *d, const char *group_id, bool *finished)
{
    const char *v[1] = {group_id};
    PGresult *r = dsp_q(d, sql_group_maybe_finish, 1, v);
    if (!r) return false;
    *finished = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "finished") == 0;
    PQclear(r);
    return !*finished || (dsp_exec(d, sql_group_devices_free, 1, v) &&
                          dsp_update_utilization(d, group_id));
}

/*
 * A checkpoint that arrived after its array was requeued (its worker was
 * taken for lost, or stopped listing the array, and its link or its outbox
 * caught up later).  It is kept only while it belongs to no other run and
 * saves work: the job is still queued, has not been placed since it left
 * this array (group_id is still this one), the sender is the worker the
 * array was assigned to, in this generation, and the step is past the
 * resume point.  It then becomes the resume point: the next plan reads the
 * queue copy, which the trigger of schema 007 brings up to date, so the
 * ASSIGN carries this very file and this step.  Otherwise it is dropped: a
 * job placed again belongs to its new run, which resumed from the point its
 * ASSIGN carried, and an older checkpoint must never move a resume point
 * back.
 */
static int apply_late_checkpoint(fb_dispatch *d, pending *e)
{
    const fb_wire_msg *m = &e->m;
    char gen[24], step[24];
    snprintf(gen, sizeof gen, "%lld", (long long)m->generation);
    snprintf(step, sizeof step, "%lld", (long long)m->step);
    int err = FB_OK;
    if (!dsp_begin(d)) return FB_ERR_UNAVAILABLE;
    const char *v[5] = {m->job_id, m->group_id, gen, e->worker, step};
    PGresult *r = dsp_q(d, sql_late_checkpoint_owner, 5, v);
    if (!r) goto fail;
    if (PQntuples(r) != 1) {
        PQclear(r);
        dsp_rollback(d);
        fb_log_json(FB_LOG_INFO, "stale event dropped",
                    json_pack("{s:s, s:s, s:s, s:I}", "worker", e->worker, "group_id",
                              m->group_id, "event", "checkpointed", "step",
                              (json_int_t)m->step));
        return FB_OK;
    }
    char tenant[FB_WIRE_ID_LEN + 1];
    snprintf(tenant, sizeof tenant, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    if ((err = record_state(d, e, tenant))) goto fail;
    const char *vs[3] = {m->job_id, step, m->group_id};
    if (!dsp_exec(d, sql_late_checkpoint_job, 2, vs) ||
        !dsp_exec(d, sql_late_checkpoint_event, 3, vs) ||
        !dsp_commit(d))
        goto fail;
    fb_log_json(FB_LOG_INFO, "a checkpoint received after its array was requeued resumes the job",
                json_pack("{s:s, s:s, s:s, s:I}", "worker", e->worker, "group_id", m->group_id,
                          "job_id", m->job_id, "step", (json_int_t)m->step));
    return FB_OK;
fail:
    dsp_rollback(d);
    return err ? err : FB_ERR_UNAVAILABLE;
}

/*
 * Applies one event in one transaction.  FB_OK when it is recorded (or
 * needs no record: its job left the group already), else an error and the
 * event is retried later.
 */
static int apply_event(fb_dispatch *d, pending *e)
{
    fb_wire_msg *m = &e->m;
    const char *kind = fb_wire_event_name(m->event);
    int err = FB_OK;
    if (e->late) return apply_late_checkpoint(d, e);
    if (!dsp_begin(d)) return FB_ERR_UNAVAILABLE;
    const char *v2[2] = {m->job_id, m->group_id};
    PGresult *r = dsp_q(d, sql_event_job, 2, v2);
    if (!r) goto fail;
    if (PQntuples(r) != 1 || strcmp(PQgetvalue(r, 0, 2), "t") != 0) {
        PQclear(r);
        dsp_rollback(d);
        fb_log_json(FB_LOG_DEBUG, "event for a job no longer in the array; ignored",
                    json_pack("{s:s, s:s}", "job_id", m->job_id, "event", kind));
        return FB_OK;
    }
    char tenant[FB_WIRE_ID_LEN + 1], state[16];
    snprintf(tenant, sizeof tenant, "%s", PQgetvalue(r, 0, 0));
    snprintf(state, sizeof state, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    {
        /* an event resent after its acknowledgement was lost is recorded once */
        char st[24];
        snprintf(st, sizeof st, "%lld", (long long)m->step);
        const char *va[4] = {m->group_id, m->job_id, kind, st};
        r = dsp_q(d, sql_event_applied, 4, va);
        if (!r) goto fail;
        bool fresh = PQntuples(r) == 1;
        PQclear(r);
        if (!fresh) {
            dsp_rollback(d);
            return FB_OK;
        }
    }
    char step[24], loss[40], acc[40], tloss[40], tacc[40];
    snprintf(step, sizeof step, "%lld", (long long)m->step);
    fmt_num(loss, sizeof loss, m->loss);
    fmt_num(acc, sizeof acc, m->accuracy);
    fmt_num(tloss, sizeof tloss, m->test_loss);
    fmt_num(tacc, sizeof tacc, m->test_accuracy);
    /* loss, accuracy: the validation's (evaluated, finished); tl, ta: the test's (finished) */
    const char *lv = loss[0] ? loss : NULL, *av = acc[0] ? acc : NULL;
    const char *tl = tloss[0] ? tloss : NULL, *ta = tacc[0] ? tacc : NULL;
    bool leaves = false, asha_stop = false;
    switch (m->event) {
    case FB_EV_STARTED: {
        const char *v1[1] = {m->job_id}, *v2[1] = {m->group_id};
        const char *v4[4] = {m->job_id, m->group_id, step, e->worker};
        if (!dsp_exec(d, sql_started_job, 1, v1) ||
            !dsp_exec(d, sql_started_group, 1, v2) ||
            !dsp_exec(d, sql_started_event, 4, v4))
            goto fail;
        break;
    }
    case FB_EV_EVALUATED: {
        const char *v[4] = {m->job_id, step, lv, av};
        if (!dsp_exec(d, sql_evaluated_metrics, 4, v) ||
            !dsp_exec(d, sql_evaluated_latest, 4, v) ||
            !dsp_asha_on_evaluated(d, m, &asha_stop))
            goto fail;
        break;
    }
    case FB_EV_CHECKPOINTED: {
        const char *v[3] = {m->job_id, m->group_id, step};
        if (!e->blob) break;
        if ((err = record_state(d, e, tenant))) goto fail;
        if (!dsp_exec(d, sql_checkpointed_event, 3, v))
            goto fail;
        break;
    }
    case FB_EV_FINISHED: {
        leaves = true;
        if (e->blob) {
            char rel[PATH_MAX], sha[65], bytes[24];
            if ((err = write_artifact(d, tenant, m->job_id, "model.safetensors", e->blob,
                                      e->blob_len, rel, sizeof rel, sha)))
                goto fail;
            snprintf(bytes, sizeof bytes, "%zu", e->blob_len);
            const char *v[5] = {m->job_id, step, rel, bytes, sha};
            if (!dsp_exec(d, sql_checkpoint_model_insert, 5, v))
                goto fail;
        }
        const char *vt[4] = {m->job_id, step, tl, ta};
        const char *v6[6] = {m->job_id, step, lv, av, tl, ta};
        const char *v7[7] = {m->job_id, m->group_id, step, lv, av, tl, ta};
        /* the test evaluation joins the series at the last step, beside its validation */
        if (((tl || ta) &&
             !dsp_exec(d, sql_finished_test_metrics, 4, vt)) ||
            !dsp_exec(d, sql_finished_job, 6, v6) ||
            !dsp_exec(d, sql_finished_event, 7, v7))
            goto fail;
        break;
    }
    case FB_EV_FAILED: {
        /* a job fault uses up a restart (the job goes back to the queue), a spec fault or
         * the last restart fails it (sql_member_failed) */
        leaves = true;
        const char *v6[6] = {m->job_id, m->group_id, step, m->text,
                             m->fault == FB_FAULT_SPEC ? "true" : "false", e->worker};
        if (!dsp_exec(d, sql_member_failed, 6, v6)) goto fail;
        break;
    }
    case FB_EV_DETACHED: {
        leaves = true;
        const char *v[4] = {m->job_id, m->group_id, step, m->text};
        if (e->blob && (err = record_state(d, e, tenant))) goto fail;
        bool early_stopped = false;
        if (!dsp_asha_on_detached(d, m, &early_stopped)) goto fail;
        if (early_stopped) break;
        /* a member that left while its job still wants training goes back to the queue */
        if (!dsp_exec(d, sql_detached_member, 4, v))
            goto fail;
        break;
    }
    default:
        break;
    }
    bool finished = false;
    if (leaves && !maybe_finish_group(d, m->group_id, &finished)) goto fail;
    if (!dsp_commit(d)) goto fail;
    if (finished) dsp_drop_group(d, m->group_id);
    if (leaves) d->plan_due = true;
    if (asha_stop) dsp_asha_send_stop(d, m);
    return FB_OK;
fail:
    dsp_rollback(d);
    return err ? err : FB_ERR_UNAVAILABLE;
}

void dsp_pending_free(pending *p)
{
    if (!p) return;
    fb_wire_msg_free(&p->m);
    free(p->span_breakdown);
    free(p->blob);
    free(p);
}

void dsp_push(queue *qq, pending *p)
{
    p->next = NULL;
    if (qq->tail)
        qq->tail->next = p;
    else
        qq->head = p;
    qq->tail = p;
    qq->n++;
}

pending *dsp_pop(queue *qq)
{
    pending *p = qq->head;
    if (!p) return NULL;
    qq->head = p->next;
    if (!qq->head) qq->tail = NULL;
    qq->n--;
    return p;
}

/* Writes queued events in order and acknowledges each once committed. */
void dsp_flush_events(fb_dispatch *d)
{
    while (d->events.head) {
        if (!dsp_db_ok(d)) return;
        pending *e = d->events.head;
        int err = apply_event(d, e);
        if (err == FB_ERR_IO) {
            /* once per outage (a full disk would otherwise log every turn of the loop) */
            if (!d->artifact_fail_said)
                fb_log_json(FB_LOG_ERROR, "cannot write an artifact; the event waits",
                            json_pack("{s:s, s:s}", "job_id", e->m.job_id, "artifacts",
                                      d->artifacts));
            d->artifact_fail_said = true;
            return;
        }
        if (err) return;
        if (d->artifact_fail_said) {
            fb_log_json(FB_LOG_INFO, "events are written again",
                        json_pack("{s:s}", "artifacts", d->artifacts));
            d->artifact_fail_said = false;
        }
        dsp_pop(&d->events);
        fb_wire_msg ack = {.type = FB_WIRE_ACK, .seq = e->m.seq};
        snprintf(ack.group_id, sizeof ack.group_id, "%s", e->m.group_id);
        ack.generation = e->m.generation;
        dsp_send(d, e->worker, &ack, NULL, NULL, 0);
        dsp_pending_free(e);
    }
}

/* ---- progress ------------------------------------------------------------ */

/* Appends x (or NULL) to a PostgreSQL array literal being built in b. */
static void arr_num(char *b, size_t cap, size_t *len, double x, bool first)
{
    if (*len + 40 >= cap) return;
    *len += (size_t)snprintf(b + *len, cap - *len, "%s", first ? "" : ",");
    if (isfinite(x))
        *len += (size_t)snprintf(b + *len, cap - *len, "%.9g", x);
    else
        *len += (size_t)snprintf(b + *len, cap - *len, "NULL");
}

/*
 * A device's utilization: the part of its time the arrays on it spend
 * working (compute, communication, I/O) rather than waiting for their turn,
 * summed over the unfinished arrays there, from their latest reports.
 * Recomputed for the devices of group_id (after its report, or its end).
 */
bool dsp_update_utilization(fb_dispatch *d, const char *group_id)
{
    const char *v[1] = {group_id};
    /* an array's devices are group_devices (schema 008): its worker's, or those of each of
     * its workers when it spans several; the arrays on a device are found from either side
     * through the indexes on the worker */
    return dsp_exec(d, sql_utilization, 1, v);
}

/*
 * The report's per-device breakdown as the groups table keeps it (schema
 * 006): per device its index, times per step, samples per step and speed
 * (samples per second of its training passes; null when it ran none).  A
 * malloc'd JSON text, or NULL when the report has none or memory ran out.
 */
static char *device_breakdown_json(const fb_wire_msg *m)
{
    if (m->n_device_steps < 1) return NULL;
    json_t *arr = json_array();
    for (int i = 0; arr && i < m->n_device_steps; i++) {
        const fb_wire_device_step *e = &m->device_steps[i];
        double busy_s = (double)e->steps * e->pass_ms / 1000.0;
        double per_step = e->steps > 0 ? (double)e->samples / (double)e->steps : 0;
        json_t *o = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:o}", "device", e->device,
                              "compute_ms", e->compute_ms, "comm_ms", e->comm_ms, "io_ms",
                              e->io_ms, "idle_ms", e->idle_ms, "samples_per_step", per_step,
                              "samples_per_s",
                              busy_s > 0 ? json_real((double)e->samples / busy_s) : json_null());
        if (!o || json_array_append_new(arr, o)) {
            json_decref(arr);
            arr = NULL;
        }
    }
    char *text = arr ? json_dumps(arr, JSON_COMPACT) : NULL;
    json_decref(arr);
    return text;
}

static bool write_progress(fb_dispatch *d, const pending *p, bool full)
{
    const fb_wire_msg *m = &p->m;
    size_t cap = (size_t)m->n_progress * 48 + 16;
    char *ids = malloc(cap), *steps = malloc(cap), *totals = malloc(cap), *loss = malloc(cap),
         *acc = malloc(cap), *lr = malloc(cap);
    bool ok = false;
    if (!ids || !steps || !totals || !loss || !acc || !lr) goto done;
    size_t li = 1, ls = 1, lt = 1, ll = 1, la = 1, lr_ = 1;
    ids[0] = steps[0] = totals[0] = loss[0] = acc[0] = lr[0] = '{';
    for (int i = 0; i < m->n_progress; i++) {
        const fb_wire_member_progress *p = &m->progress[i];
        li += (size_t)snprintf(ids + li, cap - li, "%s%s", i ? "," : "", p->job_id);
        ls += (size_t)snprintf(steps + ls, cap - ls, "%s%lld", i ? "," : "", (long long)p->step);
        lt += (size_t)snprintf(totals + lt, cap - lt, "%s%lld", i ? "," : "",
                               (long long)p->steps);
        arr_num(loss, cap, &ll, p->loss, i == 0);
        arr_num(acc, cap, &la, p->accuracy, i == 0);
        arr_num(lr, cap, &lr_, p->lr, i == 0);
    }
    snprintf(ids + li, cap - li, "}");
    snprintf(steps + ls, cap - ls, "}");
    snprintf(totals + lt, cap - lt, "}");
    snprintf(loss + ll, cap - ll, "}");
    snprintf(acc + la, cap - la, "}");
    snprintf(lr + lr_, cap - lr_, "}");
    char sps[40], cm[40], co[40], io[40], idle[40];
    fmt_num(sps, sizeof sps, m->samples_per_s);
    fmt_num(cm, sizeof cm, m->compute_ms);
    fmt_num(co, sizeof co, m->comm_ms);
    fmt_num(io, sizeof io, m->io_ms);
    fmt_num(idle, sizeof idle, m->idle_ms);
    const char *v[11] = {m->group_id, ids, steps, loss, acc, lr, sps[0] ? sps : NULL,
                         cm[0] ? cm : NULL, co[0] ? co : NULL, io[0] ? io : NULL,
                         idle[0] ? idle : NULL};
    const char *vm[10] = {v[0], v[1], v[2], v[3], v[4], v[6], v[7], v[8], v[9], v[10]};
    const char *vg[6] = {v[0], v[6], v[7], v[8], v[9], v[10]};
    ok = dsp_exec(d, sql_progress_metrics, 10, vm);
    /* a report superseded by a newer one of the same array only adds its points to the
     * time series: the newer one sets the latest state */
    if (!ok || !full) goto done;
    ok = dsp_exec(d, sql_progress_jobs, 11, v) &&
         dsp_exec(d, sql_progress_group, 6, vg) &&
         dsp_update_utilization(d, m->group_id) && record_slowdown(d, p, ids, steps, totals);
    if (ok && p->span_breakdown) {
        const char *vd[2] = {m->group_id, p->span_breakdown};
        ok = dsp_exec(d, sql_group_breakdown_span, 2, vd);
    } else if (ok && m->n_device_steps > 0) {
        /* kept only when the report names the group's devices in the group's order, which
         * gives each entry its shard and stage (devices are shard-major) */
        char *bd = device_breakdown_json(m);
        const char *vd[2] = {m->group_id, bd};
        ok = !bd ||
             dsp_exec(d, sql_group_breakdown, 2, vd);
        free(bd);
    }
done:
    free(ids);
    free(steps);
    free(totals);
    free(loss);
    free(acc);
    free(lr);
    return ok;
}

/*
 * Slowdown (docs/architecture.md): (elapsed + remaining steps x step time) / (total steps x
 * isolated step time), elapsed from submission.  The isolated step time is
 * the profile of (fusion key, array size, device kind): measured whenever an
 * array has its devices to itself (no other unfinished array on any of them)
 * and smoothed, then reused for arrays that share, whose busy time lowers a
 * profile it shows to be too slow (below).  Until a profile exists
 * the busy part of the step stands in for it.  p carries the report's step
 * as dsp_note_step_time measured it: the step of the window the report closed
 * (none for an array's first report, so its warm-up never counts), which
 * feeds the profile, and the smoothed step, which the slowdown uses, as the
 * fair-share controller does (before the first window closes, the report's
 * own breakdown stands in for both).  A report that closed no window, or a member's
 * last report (its window holds the final evaluation and export, which no
 * later step pays), is cold: it only seeds a missing profile, which the
 * first warm report replaces (profiles.warm).  ids, steps and totals are the
 * report's members as the array literals write_progress built.
 */
static bool record_slowdown(fb_dispatch *d, const pending *p, const char *ids,
                            const char *steps, const char *totals)
{
    const fb_wire_msg *m = &p->m;
    double step_ms = p->smooth_step_ms, busy_ms = p->smooth_busy_ms;
    if (!(step_ms > 0 && busy_ms > 0)) {
        /* nothing measured yet (an array's first half second): the report's own breakdown,
         * which is all a short job ever has */
        const double parts[4] = {m->compute_ms, m->comm_ms, m->io_ms, m->idle_ms};
        step_ms = busy_ms = 0;
        for (int i = 0; i < 4; i++)
            if (isfinite(parts[i]) && parts[i] > 0) {
                step_ms += parts[i];
                if (i < 3) busy_ms += parts[i];
            }
    }
    if (!(step_ms > 0) || !(busy_ms > 0) || m->n_progress < 1) return true;
    /* a profile only from a report that closed a measuring window */
    bool warm = p->step_ms > 0 && p->busy_ms > 0;
    /* a member's last report carries its final evaluation and model export, which a
     * later step of the array does not pay */
    for (int i = 0; i < m->n_progress && warm; i++)
        if (m->progress[i].step >= m->progress[i].steps) warm = false;
    /* a cold report only seeds a profile that does not exist yet; the first warm one
     * replaces the seed, later ones are averaged in: a faster step quickly, a slower one
     * slowly, since load from outside the array (other processes on the machine, the
     * server catching up) only ever makes a step slower than it is alone.
     * A warm window of an array that shares its device bounds its profile from above:
     * its busy time (compute, communication, I/O; the wait for its turn left out) is what
     * its steps took, and taking turns adds idle time, not busy time, while outside load
     * only adds to it.  A profile above it was measured under load (a loaded machine, a
     * short first window) and is too slow, so such a window lowers it, seed or not, by
     * the half step a faster window alone takes rather than straight to the busy time:
     * one window's busy time rests on the arrival times of two reports and on a report
     * interval's breakdown, and one low window must not set the profile; halving the gap
     * still brings a profile three times too slow within 10% in five windows.  A shared
     * window never raises a profile nor creates one (the busy time stands in until one
     * exists).  The bound needs a busy time that covers the whole step, so only arrays on
     * one device lower: of a pipeline, compute is the stages' mean and the bubble, part of
     * every step alone, is idle; of a data-parallel array (spanning workers or not),
     * compute and communication are the devices' means and the wait for the slowest
     * device is idle.  A profile is per device kind (the worker's backend), so an array
     * lowers only its own kind's.  What the bound misses: a data loader that is the
     * bottleneck alone prefetches during other arrays' turns, so a shared window hides
     * part of its wait.  The lowering is a data-modifying WITH of the insert's statement
     * (one statement per report, as before); the two never touch the same row.  Sharing
     * is read from group_devices (schema 008), so that a device also counts as shared
     * when another array holds it as a rank of an array that spans workers, or when this
     * array spans workers and another holds one of its followers' devices.  The statement is
     * sql_profile. */
    /* the profile takes this window's step (a cold seed the smoothed one), or of a shared
     * window its busy time; the slowdown the smoothed step, the one the controller acts on */
    char ms[40], b[16], busy[40], prof[40], wbusy[40];
    snprintf(ms, sizeof ms, "%.9g", step_ms);
    snprintf(b, sizeof b, "%d", m->n_progress);
    snprintf(busy, sizeof busy, "%.9g", busy_ms);
    snprintf(prof, sizeof prof, "%.9g", warm ? p->step_ms : step_ms);
    snprintf(wbusy, sizeof wbusy, "%.9g", warm ? p->busy_ms : 0.0);
    const char *vp[5] = {m->group_id, prof, b, warm ? "true" : "false", wbusy};
    /* elapsed since submission on the loop's clock (fb_db_clock_now) */
    char now_s[32];
    const char *now = fb_db_clock_now(now_s, sizeof now_s);
    const char *vs[8] = {m->group_id, ms, b, ids, steps, totals, busy, now};
    return dsp_exec(d, sql_profile, 5, vp) &&
           dsp_exec(d, sql_slowdown, 8, vs);
}

/* Whether a report queued after p is of the same array (and so supersedes p's
 * latest state). */
static bool superseded(const pending *p)
{
    for (const pending *q = p->next; q; q = q->next)
        if (strcmp(q->m.group_id, p->m.group_id) == 0) return true;
    return false;
}

/*
 * Writes queued progress reports, oldest first, in transactions of at most
 * FLUSH_SLICE_MS; what a failed one held is kept.  A report superseded by a
 * newer one of the same array writes only its metric points (one statement
 * instead of six), and one call writes for at most FLUSH_BUDGET_MS, less
 * when a submission wants a plan (after at least one slice, so that
 * frequent submissions cannot starve the reports), so that a backlog (many
 * arrays, a slow database) neither starves planning and heartbeats nor
 * grows: the loop comes back for the rest on its next turn.
 */
static void flush_progress_run(fb_dispatch *d)
{
    int64_t t0 = dsp_real_ms();
    /* slices of one transaction each: PostgreSQL hands a listening session its
     * notifications only between transactions, and a submission that arrives during a
     * long flush is planned after the slice it arrived in, not after the whole flush */
    for (bool first = true;
         d->progress.head && dsp_real_ms() - t0 < FLUSH_BUDGET_MS && (first || !d->plan_due);
         first = false) {
        if (!dsp_db_ok(d) || !dsp_begin(d)) return;
        int64_t t1 = dsp_real_ms();
        int n = 0;
        for (pending *p = d->progress.head; p; p = p->next) {
            if (!write_progress(d, p, !superseded(p))) {
                dsp_rollback(d);
                return;
            }
            n++;
            if (dsp_real_ms() - t1 >= FLUSH_SLICE_MS) break;
        }
        if (!dsp_commit(d)) {
            dsp_rollback(d);
            return;
        }
        for (pending *p; n > 0 && (p = dsp_pop(&d->progress)); n--) dsp_pending_free(p);
        PQconsumeInput(d->pg);
        dsp_take_notifies(d);
    }
}

/* A flush of progress reports, timed when there was something to write. */
void dsp_flush_progress(fb_dispatch *d)
{
    if (!d->progress.head) return;
    double t0 = dsp_real_s();
    flush_progress_run(d);
    fb_metrics_control(FB_CONTROL_FLUSH, dsp_real_s() - t0);
}

/* ---- what a group's reports measure --------------------------------------- */

/* Steps are measured over windows of at least this long: reports that arrive bunched
 * (the loop was busy, or the worker's outbox caught up) must not look like fast steps. */
#define STEP_WINDOW_MS 500

/*
 * Measures a current group's step from its PROGRESS reports and smooths it.
 * The step time is the wall-clock time over the steps the array made in a
 * window of STEP_WINDOW_MS or more, as the control loop sees the reports
 * arrive: the workers' own per-step breakdown adds up per-thread times (it
 * can exceed the wall-clock time of a step), so it only says which part of a
 * step is busy (compute, communication, I/O) and which waits for the array's
 * turn on a shared device.  The busy part stands in for the isolated step
 * time until a profile exists (the workers' stride scheduler runs one array
 * at a time on a device, so that is what a step takes alone, cache effects
 * aside).  The first window starts at the array's first report, so its
 * warm-up never counts.  *step_ms and *busy_ms receive the step and busy
 * time of a window this report closes, 0 when it closes none.
 */
void dsp_note_step_time(fb_dispatch *d, const fb_wire_msg *m, double *step_ms,
                           double *busy_ms)
{
    *step_ms = *busy_ms = 0;
    group *g = dsp_find_group(d, m->group_id);
    if (!g) return;
    int64_t t = fb_clock_ms(), step = 0;
    for (int i = 0; i < m->n_progress; i++)
        if (m->progress[i].step > step) step = m->progress[i].step;
    if (g->reports++ == 0 || step < g->base_step) {
        g->base_step = step;
        g->base_ms = t;
        return;
    }
    if (t - g->base_ms < STEP_WINDOW_MS || step == g->base_step) return;
    double wall = (double)(t - g->base_ms) / (double)(step - g->base_step);
    g->base_step = step;
    g->base_ms = t;
    double busy = 0, idle = isfinite(m->idle_ms) && m->idle_ms > 0 ? m->idle_ms : 0;
    const double parts[3] = {m->compute_ms, m->comm_ms, m->io_ms};
    for (int i = 0; i < 3; i++)
        if (isfinite(parts[i]) && parts[i] > 0) busy += parts[i];
    if (!(busy > 0) || !(wall > 0) || wall > 1e12) return;
    *step_ms = wall;
    *busy_ms = wall * busy / (busy + idle);
    g->step_ms = fb_fair_ewma(g->step_ms, *step_ms, d->fair.smoothing);
    g->busy_ms = fb_fair_ewma(g->busy_ms, *busy_ms, d->fair.smoothing);
}

/*
 * dsp_note_device_steps for a group that spans workers: each of the reporting
 * worker's devices is the rank it holds, and rates are kept by rank.  Every
 * worker reports on its own, so a rank's first report (its warm-up) gives no
 * rate.
 */
static void note_span_steps(fb_dispatch *d, group *g, const char *name, const fb_wire_msg *m)
{
    span *sp = g->span;
    for (int i = 0; i < m->n_device_steps; i++) {
        const fb_wire_device_step *e = &m->device_steps[i];
        int r = dsp_span_rank(g, name, e->device);
        if (r < 0) continue;
        bool first = !sp->has[r];
        sp->has[r] = true;
        sp->step[r] = *e;
        double busy_s = (double)e->steps * e->pass_ms / 1000.0;
        if (first || e->steps < 1 || e->samples < 1 || !(busy_s > 0)) continue;
        double rate = (double)e->samples / busy_s;
        if (!(rate >= FB_FAIR_MIN_VALUE && rate <= FB_FAIR_MAX_VALUE)) continue;
        g->dev_rate[r] = fb_fair_ewma(g->dev_rate[r], rate, d->fair.smoothing);
    }
}

/*
 * Takes a report's per-device breakdown into its group: the latest entries,
 * and each device's speed, the samples it trained on per second of its own
 * training passes (communication and waiting left out, so that a device is
 * not taken for slow because it waited for another; the update left out,
 * which costs every replica the same whatever its share), smoothed.  Rates are kept
 * by device index; the fair-share period reads those of the group's own
 * devices only, so an entry for another device changes nothing.  An array's
 * first report holds its warm-up (memory touched the first time, threads
 * started), which says nothing about a device's speed: as for its step time
 * (dsp_note_step_time, called first), it gives no rate.
 */
void dsp_note_device_steps(fb_dispatch *d, const char *name, const fb_wire_msg *m)
{
    group *g = dsp_find_group(d, m->group_id);
    if (!g || m->n_device_steps < 1) return;
    if (g->span) {
        note_span_steps(d, g, name, m);
        return;
    }
    g->n_dev = m->n_device_steps;
    memcpy(g->dev, m->device_steps, (size_t)m->n_device_steps * sizeof *g->dev);
    if (g->reports <= 1) return;
    for (int i = 0; i < m->n_device_steps; i++) {
        const fb_wire_device_step *e = &m->device_steps[i];
        double busy_s = (double)e->steps * e->pass_ms / 1000.0;
        if (e->steps < 1 || e->samples < 1 || !(busy_s > 0)) continue;
        double rate = (double)e->samples / busy_s;
        if (!(rate >= FB_FAIR_MIN_VALUE && rate <= FB_FAIR_MAX_VALUE)) continue;
        g->dev_rate[e->device] = fb_fair_ewma(g->dev_rate[e->device], rate, d->fair.smoothing);
    }
}

/*
 * The device breakdown of a group that spans workers, as the groups table
 * keeps it (schema 006), over all its ranks from each rank's latest report:
 * per rank its worker, device index, rank (= shard; stage 0), times per step,
 * samples per step and speed.  A malloc'd JSON text, or NULL when no rank has
 * reported yet or memory ran out.
 */
char *dsp_span_breakdown_json(const group *g)
{
    const span *sp = g->span;
    json_t *arr = json_array();
    int n = 0;
    for (int k = 0; arr && k < sp->n; k++) {
        const span_member *sm = &sp->m[k];
        for (int i = 0; arr && i < sm->n_ranks; i++) {
            int r = sm->rank_base + i;
            if (!sp->has[r]) continue;
            const fb_wire_device_step *e = &sp->step[r];
            double busy_s = (double)e->steps * e->pass_ms / 1000.0;
            double per_step = e->steps > 0 ? (double)e->samples / (double)e->steps : 0;
            json_t *o = json_pack(
                "{s:i, s:s, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:o}", "device", e->device,
                "worker", sm->worker, "rank", r, "shard", r, "stage", 0, "compute_ms",
                e->compute_ms, "comm_ms", e->comm_ms, "io_ms", e->io_ms, "idle_ms", e->idle_ms,
                "samples_per_step", per_step, "samples_per_s",
                busy_s > 0 ? json_real((double)e->samples / busy_s) : json_null());
            if (!o || json_array_append_new(arr, o)) {
                json_decref(arr);
                arr = NULL;
            }
            n++;
        }
    }
    char *text = arr && n > 0 ? json_dumps(arr, JSON_COMPACT) : NULL;
    json_decref(arr);
    return text;
}
