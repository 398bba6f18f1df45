/*
 * End to end, on real processes (fuseboxd, PostgreSQL, one fusebox-worker):
 * a 9-trial learning-rate sweep with ASHA early stopping (reduction factor
 * 3, rungs at steps 30 and 90) trains as one fused array, and its weak
 * members leave the live array while the others train on.
 *
 * - Every trial reports at rung 0, and at rung 1 exactly those that went
 *   on; each rung result is the trial's validation loss at the rung's step as
 *   job_metrics holds it.
 * - Each decision equals the one a plain reimplementation of the rule here
 *   takes on the same results in the order they arrived (asha_rungs.seq).
 * - A stopped trial ends completed with end_reason early_stopped, in the
 *   array the survivors trained in, with a checkpoint at its stopping rung
 *   that can be downloaded.
 * - The survivors finish, and their final models equal what fusebox-train
 *   makes of the same nine specs as one array that nobody leaves (within
 *   1e-4): the departures did not alter them.
 * - GET /v1/sweeps/{id} shows each trial's rung history and end reason.
 */
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "e2e.h"

#define N_TRIALS 9
#define ETA 3
#define GRACE 30
#define N_RUNGS 2
#define STEPS 240

static e2e T;

/*
 * The learning rates, in trial order (which is the order of the members in
 * the array, and so the order their results arrive in).  Over this range
 * SGD's validation loss falls as the rate grows, and good and bad rates are
 * interleaved, so that trials stop in the middle of the array and survivors
 * behind them move up when it compacts.  The rates stay where fusing does
 * not amplify float rounding (a member's weights after 240 steps equal its
 * solo run's to about 1e-7), so that 1e-4 tells a departure that disturbed
 * a survivor from rounding.
 */
static const double lrs[N_TRIALS] = {0.002, 0.001,  0.005, 0.0003, 0.0001,
                                     0.003, 0.0005, 0.007, 0.01};

/* ---- the rule, written again -------------------------------------------- */

typedef struct result {
    int trial;
    double metric;
} result;

/* Decision (true: stop) for trial `who`, the last of the n results of its
 * rung in arrival order: it stops when eta or more results exist and fewer
 * than n / eta of them are ahead of it, sorting smaller loss first and
 * equal losses by smaller trial index. */
static bool rule_stops(const result *res, int n, int who)
{
    result s[N_TRIALS];
    memcpy(s, res, (size_t)n * sizeof *res);
    for (int i = 0; i < n; i++) /* selection sort, best first */
        for (int k = i + 1; k < n; k++)
            if (s[k].metric < s[i].metric ||
                (s[k].metric == s[i].metric && s[k].trial < s[i].trial)) {
                result t = s[i];
                s[i] = s[k];
                s[k] = t;
            }
    if (n < ETA) return false;
    for (int i = 0; i < n / ETA; i++)
        if (s[i].trial == who) return false;
    return true;
}

/* ---- the sweep -------------------------------------------------------------- */

static int64_t rung_step(int r)
{
    int64_t s = GRACE;
    for (int i = 0; i < r; i++)
        s *= ETA;
    return s;
}

static void submit(char *sweep, size_t cap, char (*ids)[64], char (*names)[64])
{
    char body[2048], list[256] = "";
    size_t len = 0;
    for (int i = 0; i < N_TRIALS; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%g", i ? ", " : "", lrs[i]);
    snprintf(
        body, sizeof body,
        "{\"name\": \"asha\", \"base\": {\"dataset\": \"synth\", \"model\": {\"input\": [16],"
        " \"layers\": [{\"type\": \"linear\", \"out\": 1024}, {\"type\": \"relu\"},"
        " {\"type\": \"linear\", \"out\": 4}]}, \"batch_size\": 256, \"steps\": %d,"
        " \"eval_every\": %d, \"checkpoint_every\": %d,"
        " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.001, \"momentum\": 0.9},"
        " \"seed\": 3},"
        " \"search\": {\"type\": \"grid\", \"params\": {\"optimizer.lr\": {\"values\": [%s]}}},"
        " \"early_stopping\": {\"type\": \"asha\", \"metric\": \"val_loss\", \"mode\": \"min\","
        " \"grace_steps\": %d, \"reduction_factor\": %d, \"max_rungs\": %d}}",
        STEPS, GRACE, GRACE, list, GRACE, ETA, N_RUNGS);
    fbt_resp r = fbt_call(&T.s, "POST", "/v1/sweeps", T.key, body);
    fbt_expect(&r, 201, NULL, "submit a sweep with early stopping");
    snprintf(sweep, cap, "%s", json_string_value(json_object_get(r.json, "id")));
    json_t *trials = json_object_get(r.json, "trials");
    CHECK_INT_EQ((long long)json_array_size(trials), N_TRIALS);
    for (int i = 0; i < N_TRIALS; i++) {
        json_t *t = json_array_get(trials, (size_t)i);
        CHECK_INT_EQ(json_integer_value(json_object_get(t, "index")), i);
        snprintf(ids[i], 64, "%s", json_string_value(json_object_get(t, "job_id")));
        snprintf(names[i], 64, "%s", json_string_value(json_object_get(t, "name")));
        /* nothing reported yet */
        CHECK(json_is_null(json_object_get(t, "end_reason")));
        CHECK_INT_EQ((long long)json_array_size(json_object_get(t, "rungs")), 0);
    }
    fbt_resp_free(&r);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    e2e_start(&T, NULL);
    pid_t worker = e2e_worker(&T, "w1");
    char sweep[64], ids[N_TRIALS][64], names[N_TRIALS][64], sql[1024];
    double t0 = fbt_now_ms();
    submit(sweep, sizeof sweep, ids, names);
    for (int i = 0; i < N_TRIALS; i++)
        e2e_wait_state(&T, T.key, ids[i], "completed", 240);
    printf("the sweep took %.1f s\n", (fbt_now_ms() - t0) / 1000);

    /* the rung results in arrival order, beside the validation loss job_metrics holds */
    snprintf(sql, sizeof sql,
             "SELECT a.rung, j.trial_index, a.step, a.metric, a.decision, m.val_loss"
             " FROM asha_rungs a JOIN jobs j ON j.id = a.job_id"
             " LEFT JOIN job_metrics m ON m.job_id = a.job_id AND m.step = a.step"
             " WHERE a.sweep_id = '%s' ORDER BY a.seq",
             sweep);
    PGresult *r = fbt_sql(&T.s, sql);
    result at[N_RUNGS][N_TRIALS];
    int n_at[N_RUNGS] = {0}, stop_rung[N_TRIALS];
    bool seen[N_RUNGS][N_TRIALS] = {{false}};
    for (int i = 0; i < N_TRIALS; i++)
        stop_rung[i] = -1;
    int n_stops = 0;
    for (int row = 0; row < PQntuples(r); row++) {
        int rung = atoi(PQgetvalue(r, row, 0)), trial = atoi(PQgetvalue(r, row, 1));
        CHECK(rung >= 0 && rung < N_RUNGS && trial >= 0 && trial < N_TRIALS);
        CHECK(!seen[rung][trial]);
        seen[rung][trial] = true;
        /* eval_every divides the rung steps: each result is at its rung's step */
        CHECK_INT_EQ(atoll(PQgetvalue(r, row, 2)), rung_step(rung));
        CHECK(!PQgetisnull(r, row, 5));
        double metric = strtod(PQgetvalue(r, row, 3), NULL);
        CHECK(metric == strtod(PQgetvalue(r, row, 5), NULL));
        /* a trial stopped at rung 0 weighs in nowhere later */
        CHECK(stop_rung[trial] < 0);
        at[rung][n_at[rung]++] = (result){trial, metric};
        bool want = rule_stops(at[rung], n_at[rung], trial);
        const char *got = PQgetvalue(r, row, 4);
        printf("rung %d (step %lld), arrival %d: trial %d (lr %g) val_loss %.6f -> %s\n", rung,
               (long long)rung_step(rung), n_at[rung], trial, lrs[trial], metric, got);
        CHECK_STR_EQ(got, want ? "stop" : "continue");
        if (want) {
            stop_rung[trial] = rung;
            n_stops++;
        }
    }
    PQclear(r);
    /* every trial reported at rung 0; at rung 1 exactly those that went on */
    CHECK_INT_EQ(n_at[0], N_TRIALS);
    for (int i = 0; i < N_TRIALS; i++)
        CHECK(seen[1][i] == (stop_rung[i] != 0));
    printf("%d of %d trials stopped early\n", n_stops, N_TRIALS);
    /* how many stop depends on the order the members arrive in, which the array sets */
    CHECK(n_stops >= 1);
    CHECK(n_stops <= N_TRIALS - 2); /* the first two arrivals at each rung go on */

    /* the sweep as the API shows it */
    char path[160];
    snprintf(path, sizeof path, "/v1/sweeps/%s", sweep);
    fbt_resp g = fbt_call(&T.s, "GET", path, T.key, NULL);
    fbt_expect(&g, 200, NULL, "get the sweep");
    json_t *trials = json_object_get(g.json, "trials");
    CHECK_INT_EQ((long long)json_array_size(trials), N_TRIALS);
    char group[64];
    snprintf(group, sizeof group, "%s", e2e_job_field(&T, T.key, ids[0], "group_id"));
    CHECK(strlen(group) == 36);
    for (int i = 0; i < N_TRIALS; i++) {
        json_t *t = json_array_get(trials, (size_t)i);
        json_t *rungs = json_object_get(t, "rungs");
        bool stopped = stop_rung[i] >= 0;
        int n_rungs = stopped ? stop_rung[i] + 1 : N_RUNGS;
        CHECK_INT_EQ((long long)json_array_size(rungs), n_rungs);
        for (int k = 0; k < n_rungs; k++) {
            json_t *x = json_array_get(rungs, (size_t)k);
            CHECK_INT_EQ(json_integer_value(json_object_get(x, "rung")), k);
            CHECK_INT_EQ(json_integer_value(json_object_get(x, "step")), rung_step(k));
            CHECK(json_is_number(json_object_get(x, "metric")));
            CHECK_STR_EQ(json_string_value(json_object_get(x, "decision")),
                         stopped && k == stop_rung[i] ? "stop" : "continue");
        }
        CHECK_STR_EQ(json_string_value(json_object_get(t, "state")), "completed");
        /* the whole sweep trained in one array, which the stopped members left */
        CHECK_STR_EQ(e2e_job_field(&T, T.key, ids[i], "group_id"), group);
        long long step = json_integer_value(json_object_get(t, "step"));
        if (!stopped) {
            CHECK(json_is_null(json_object_get(t, "end_reason")));
            CHECK_INT_EQ(step, STEPS);
            continue;
        }
        CHECK_STR_EQ(json_string_value(json_object_get(t, "end_reason")), "early_stopped");
        int64_t at_step = rung_step(stop_rung[i]);
        printf("trial %d stopped at rung %d and left its array at step %lld\n", i, stop_rung[i],
               step);
        CHECK(step >= at_step && step < STEPS);
        /* its checkpoint at the stopping rung is kept, and is what it downloads as */
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM checkpoints WHERE job_id = '%s' AND kind = 'state'"
                 " AND step = %lld",
                 ids[i], (long long)at_step);
        CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "1");
        snprintf(sql, sizeof sql,
                 "SELECT resume_step >= %lld AND resume_path IS NOT NULL AND NOT in_group"
                 " FROM jobs WHERE id = '%s'",
                 (long long)at_step, ids[i]);
        CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "t");
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind = 'early_stopped'"
                 " AND (data->>'rung')::int = %d",
                 ids[i], stop_rung[i]);
        CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "1");
        /* it was not re-queued on leaving */
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind = 'requeued'",
                 ids[i]);
        CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "0");
        char file[400];
        snprintf(file, sizeof file, "%s/stopped-%d.safetensors", T.root, i);
        e2e_download_model(&T, T.key, ids[i], file);
    }
    fbt_resp_free(&g);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM job_events WHERE kind = 'scheduled'"
             " AND data->>'group_id' = '%s' AND (data->>'members')::int = %d",
             group, N_TRIALS);
    CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "9");

    /* survivors against one uninterrupted array of the nine specs, and solo */
    char spec_files[N_TRIALS][400], ref_dir[400], solo_dir[400];
    const char *files[N_TRIALS];
    for (int i = 0; i < N_TRIALS; i++) {
        snprintf(path, sizeof path, "/v1/jobs/%s", ids[i]);
        fbt_resp j = fbt_call(&T.s, "GET", path, T.key, NULL);
        fbt_expect(&j, 200, NULL, "get a trial");
        char *spec = json_dumps(json_object_get(j.json, "spec"), JSON_COMPACT);
        CHECK(spec != NULL);
        snprintf(spec_files[i], sizeof spec_files[i], "%s/trial-%d.json", T.root, i);
        e2e_write(spec_files[i], spec);
        free(spec);
        fbt_resp_free(&j);
        files[i] = spec_files[i];
    }
    snprintf(ref_dir, sizeof ref_dir, "%s/ref-array", T.root);
    e2e_train_reference(&T, files, N_TRIALS, ref_dir);
    for (int i = 0; i < N_TRIALS; i++) {
        if (stop_rung[i] >= 0) continue;
        char got[400], want[600];
        snprintf(got, sizeof got, "%s/model-%d.safetensors", T.root, i);
        e2e_download_model(&T, T.key, ids[i], got);
        snprintf(want, sizeof want, "%s/%s.safetensors", ref_dir, names[i]);
        snprintf(solo_dir, sizeof solo_dir, "%s/ref-solo-%d", T.root, i);
        e2e_train_reference(&T, &files[i], 1, solo_dir);
        char solo[600];
        snprintf(solo, sizeof solo, "%s/%s.safetensors", solo_dir, names[i]);
        double diff = e2e_max_diff(got, want), diff_solo = e2e_max_diff(got, solo);
        printf("survivor %d (lr %g): max |model - uninterrupted array| = %g, - solo = %g\n", i,
               lrs[i], diff, diff_solo);
        CHECK(diff >= 0 && diff <= 1e-4);
        CHECK(diff_solo >= 0 && diff_solo <= 1e-4);
    }
    CHECK_INT_EQ(e2e_kill(worker, SIGTERM), 0);
    e2e_finish(&T);
    int rc = fbt_validate_recorded();
    return rc == 77 ? 0 : rc;
}
