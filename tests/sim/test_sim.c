/*
 * The simulator (sim/sim.h): scenarios small enough to work out by hand
 * (time sharing, fusion, context-switch overhead, a data-parallel job next
 * to a single-device one, with and without rebalancing), the parser's
 * refusals with file and line, the generator, the scale scenario at a
 * twentieth of its size under every variant, and fusebox-sim run as a
 * program.
 */
#include "check.h"
#include "errors.h"
#include "sim.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

static void load_text(sim_scenario *sc, const char *text)
{
    char msg[512] = "";
    memset(sc, 0, sizeof *sc);
    int rc = sim_scenario_read_text(sc, text, "t", msg, sizeof msg);
    if (!rc) rc = sim_scenario_finish(sc, 1.0, msg, sizeof msg);
    if (rc) fprintf(stderr, "scenario: %s\n", msg);
    CHECK_INT_EQ(rc, 0);
}

static void run(const sim_scenario *sc, const sim_config *cfg, sim_result *r)
{
    char msg[512] = "";
    int rc = sim_run(sc, cfg, r, msg, sizeof msg);
    if (rc) fprintf(stderr, "sim_run: %s\n", msg);
    CHECK_INT_EQ(rc, 0);
}

/* ---- worked out by hand ----------------------------------------------------------- */

/* Two 1-step-per-second jobs of 10 and 20 steps on one device, submitted
 * together under one key, so they may fuse. */
static const char *PAIR =
    "{\"type\": \"sim\", \"switch_overhead\": 0, \"rebalance\": false}\n"
    "{\"type\": \"devices\", \"count\": 1}\n"
    "{\"type\": \"tenant\", \"name\": \"a\"}\n"
    "{\"type\": \"profile\", \"name\": \"p\", \"step_s\": 1.0, \"alpha\": 0.5}\n"
    "{\"type\": \"job\", \"at\": 0, \"tenant\": \"a\", \"profile\": \"p\", \"steps\": 10, \"key\": "
    "\"k\"}\n"
    "{\"type\": \"job\", \"at\": 0, \"tenant\": \"a\", \"profile\": \"p\", \"steps\": 20, \"key\": "
    "\"k\"}\n";

static void test_time_sharing(void)
{
    sim_scenario sc;
    load_text(&sc, PAIR);
    sim_result r;
    /* no fusion: each gets half the device, 0.5 steps/s; the short one ends
     * at 20 s with the long one at step 10, which then runs alone 10 s more */
    sim_config c = sc.cfg;
    c.max_b = 1;
    run(&sc, &c, &r);
    CHECK_INT_EQ(r.n_done, 2);
    CHECK_NEAR(r.finish[0], 20.0, 1e-9);
    CHECK_NEAR(r.finish[1], 30.0, 1e-9);
    CHECK_NEAR(r.slowdown[0], 2.0, 1e-9);
    CHECK_NEAR(r.slowdown[1], 1.5, 1e-9);
    CHECK_NEAR(r.makespan_s, 30.0, 1e-9);
    CHECK_NEAR(r.utilization, 1.0, 1e-9);
    CHECK_NEAR(r.slow_max, 2.0, 1e-9);
    CHECK_NEAR(r.slow_mean, 1.75, 1e-9);
    CHECK_NEAR(r.jct_mean, 25.0, 1e-9);
    CHECK_NEAR(r.wait_mean, 0.0, 0);
    /* Jain's index of 1/slowdown = (0.5 + 2/3)^2 / (2 * (0.25 + 4/9)) = 0.98 */
    CHECK_NEAR(r.jain, 0.98, 1e-9);
    sim_result_free(&r);

    /* a context switch costs 10%: 0.45 steps/s each while both run, so the
     * short one ends at 10 / 0.45 s; the device does useful work 90% of that */
    c.switch_overhead = 0.1;
    run(&sc, &c, &r);
    double t1 = 10.0 / 0.45;
    CHECK_NEAR(r.finish[0], t1, 1e-9);
    CHECK_NEAR(r.finish[1], t1 + 10.0, 1e-9);
    CHECK_NEAR(r.utilization, (0.9 * t1 + 10.0) / (t1 + 10.0), 1e-9);
    sim_result_free(&r);

    /* fusion: one array of two steps in 1 * (1 + 0.5) s; the short member
     * leaves at 15 s and the other steps alone, 1 s a step, 10 steps more */
    c = sc.cfg;
    run(&sc, &c, &r);
    CHECK_NEAR(r.finish[0], 15.0, 1e-9);
    CHECK_NEAR(r.finish[1], 25.0, 1e-9);
    CHECK_NEAR(r.slowdown[0], 1.5, 1e-9);
    CHECK_NEAR(r.slowdown[1], 1.25, 1e-9);
    CHECK_NEAR(r.utilization, 1.0, 1e-9);
    CHECK_INT_EQ(r.n_plans, 1);
    sim_result_free(&r);
    sim_scenario_free(&sc);
    sim_scenario_free(&sc); /* zeroed: harmless */
    sim_scenario_free(NULL);
}

/* A job that queues: one device, at most one group on it. */
static void test_queueing(void)
{
    sim_scenario sc;
    load_text(
        &sc,
        "{\"type\": \"sim\", \"switch_overhead\": 0, \"max_groups_per_device\": 1,"
        " \"plan_gap_s\": 0}\n"
        "{\"type\": \"devices\", \"count\": 1}\n"
        "{\"type\": \"tenant\", \"name\": \"a\"}\n"
        "{\"type\": \"profile\", \"name\": \"p\", \"step_s\": 0.5}\n"
        "{\"type\": \"job\", \"at\": 0, \"tenant\": \"a\", \"profile\": \"p\", \"steps\": 100}\n"
        "{\"type\": \"job\", \"at\": 10, \"tenant\": \"a\", \"profile\": \"p\", \"steps\": 20}\n");
    sim_result r;
    run(&sc, &sc.cfg, &r);
    /* the first runs 0..50 s; the second waits 40 s, then runs 10 s */
    CHECK_NEAR(r.finish[0], 50.0, 1e-9);
    CHECK_NEAR(r.placed[1], 50.0, 1e-9);
    CHECK_NEAR(r.finish[1], 60.0, 1e-9);
    CHECK_NEAR(r.wait_mean, 20.0, 1e-9);
    CHECK_NEAR(r.slowdown[1], 50.0 / 10.0, 1e-9);
    sim_result_free(&r);
    sim_scenario_free(&sc);
}

static void test_minimal_paper(void)
{
    const char *src = getenv("FB_SOURCE_DIR");
    if (!src) {
        fprintf(stderr, "FB_SOURCE_DIR is not set\n");
        exit(FB_TEST_SKIP);
    }
    char path[4096], msg[512];
    snprintf(path, sizeof path, "%s/sim/scenarios/paper-minimal.jsonl", src);
    sim_scenario sc = {0};
    CHECK_INT_EQ(sim_scenario_read(&sc, path, msg, sizeof msg), 0);
    CHECK_INT_EQ(sim_scenario_finish(&sc, 1.0, msg, sizeof msg), 0);
    sim_result r;
    /* without rebalancing (worked out in the file's comment): both step
     * every 2 s and finish at 2000 s; the second GPU idles half the time */
    sim_config c = sc.cfg;
    c.rebalance = false;
    run(&sc, &c, &r);
    CHECK_NEAR(r.finish[0], 2000.0, 1e-9);
    CHECK_NEAR(r.finish[1], 2000.0, 1e-9);
    CHECK_NEAR(r.slow_max, 2.0, 1e-9);
    CHECK_NEAR(r.utilization, 0.75, 1e-9);
    CHECK_INT_EQ(r.n_periods, 0);
    sim_result_free(&r);
    /* with it: the wide job's batch moves to the idle GPU and the shares
     * tilt, toward the bound of 1.5 for both, and both GPUs stay busy */
    c.rebalance = true;
    run(&sc, &c, &r);
    fprintf(stderr, "paper-minimal rebalanced: slowdowns %.3f %.3f, utilization %.3f\n",
            r.slowdown[0], r.slowdown[1], r.utilization);
    CHECK(r.slow_max >= 1.5 - 1e-9); /* no policy beats the bound */
    CHECK(r.slow_max < 1.6);
    CHECK(r.utilization > 0.95);
    CHECK(r.n_split_changes >= 1);
    CHECK(r.n_share_changes >= 1);
    CHECK_INT_EQ(r.n_profiles, 2);
    sim_result_free(&r);
    sim_scenario_free(&sc);
}

/* Migration: a short job leaves one GPU idle while two long ones share the
 * other; the controller suggests moving one, and with migrate on the
 * simulator checkpoints it and the planner resumes it on the idle GPU. */
static void test_migration(void)
{
    sim_scenario sc;
    load_text(
        &sc,
        "{\"type\": \"sim\", \"switch_overhead\": 0, \"migrate_cost_s\": 10,"
        " \"plan_gap_s\": 0}\n"
        "{\"type\": \"devices\", \"count\": 2}\n"
        "{\"type\": \"tenant\", \"name\": \"a\"}\n"
        "{\"type\": \"profile\", \"name\": \"p\", \"step_s\": 1.0}\n"
        "{\"type\": \"job\", \"at\": 0, \"tenant\": \"a\", \"profile\": \"p\", \"steps\": 1000}\n"
        "{\"type\": \"job\", \"at\": 0, \"tenant\": \"a\", \"profile\": \"p\", \"steps\": 100}\n"
        "{\"type\": \"job\", \"at\": 1, \"tenant\": \"a\", \"profile\": \"p\", \"steps\": 1000}\n");
    sim_result stay, move;
    sim_config c = sc.cfg;
    run(&sc, &c, &stay);
    c.migrate = true;
    run(&sc, &c, &move);
    fprintf(stderr, "migration: makespan %.0f without, %.0f with (%lld migrations)\n",
            stay.makespan_s, move.makespan_s, (long long)move.n_migrations);
    CHECK_INT_EQ(stay.n_migrations, 0);
    CHECK_INT_EQ(stay.n_done, 3);
    CHECK_INT_EQ(move.n_done, 3);
    /* without: the two long jobs share one GPU to the end, about 2000 s */
    CHECK(stay.makespan_s > 1900.0);
    /* with: one of them moves once, soon after the short job ends at 100 s,
     * and both finish near 1000 s plus the time shared and the resume cost */
    CHECK_INT_EQ(move.n_migrations, 1);
    CHECK(move.makespan_s < 1200.0);
    CHECK(move.finish[1] == stay.finish[1]);
    /* a migrated job keeps its steps: it cannot finish before its run alone */
    CHECK(move.slowdown[0] >= 1.0 && move.slowdown[2] >= 1.0);
    sim_result_free(&stay);
    sim_result_free(&move);
    sim_scenario_free(&sc);
}

/* ---- the parser ----------------------------------------------------------------------- */

static const char *HEAD = "{\"type\": \"sim\", \"period_s\": 2}\n"
                          "# a comment, then a blank line\n"
                          "\n"
                          "{\"type\": \"devices\", \"count\": 2}\n"
                          "{\"type\": \"tenant\", \"name\": \"a\"}\n"
                          "{\"type\": \"profile\", \"name\": \"p\", \"step_s\": 0.1}\n";

static void expect_refused(const char *line, const char *want)
{
    char text[2048], msg[512] = "";
    snprintf(text, sizeof text, "%s%s\n", HEAD, line);
    sim_scenario sc = {0};
    int rc = sim_scenario_read_text(&sc, text, "trace.jsonl", msg, sizeof msg);
    if (rc == 0 || !strstr(msg, "trace.jsonl:7: ") || !strstr(msg, want))
        fprintf(stderr, "line %s: rc %d, message \"%s\" (want \"%s\")\n", line, rc, msg, want);
    CHECK(rc < 0);
    CHECK(strstr(msg, "trace.jsonl:7: ") != NULL);
    CHECK(strstr(msg, want) != NULL);
    /* the records before it are there, the bad one is not */
    CHECK_INT_EQ(sc.n_profiles, 1);
    CHECK_INT_EQ(sc.n_jobs, 0);
    CHECK_NEAR(sc.cfg.period_s, 2.0, 0);
    sim_scenario_free(&sc);
}

static void test_parser(void)
{
    const char *J = "\"type\": \"job\", \"at\": 0, \"tenant\": \"a\", \"profile\": \"p\"";
    char line[512];
    expect_refused("{\"type\": \"job\", \"at\": 0", "not JSON");
    expect_refused("[1, 2]", "must be a JSON object");
    expect_refused("{\"at\": 0}", "missing field \"type\"");
    expect_refused("{\"type\": \"gpu\"}", "unknown record type");
    expect_refused("{\"type\": \"tenant\", \"name\": \"b\", \"colour\": 1}",
                   "unknown field \"colour\"");
    expect_refused("{\"type\": \"tenant\", \"name\": \"a\"}", "defined twice");
    expect_refused("{\"type\": \"tenant\", \"name\": \"a b\"}", "is not a name");
    expect_refused("{\"type\": \"tenant\", \"name\": \"b\", \"weight\": 0}", "\"weight\" = 0");
    expect_refused("{\"type\": \"tenant\", \"name\": \"b\", \"weight\": \"1\"}",
                   "must be a number");
    expect_refused("{\"type\": \"tenant\", \"name\": \"b\", \"share_arrays\": 1}", "true or false");
    expect_refused("{\"type\": \"devices\", \"count\": 0}", "\"count\" = 0");
    expect_refused("{\"type\": \"devices\", \"count\": 2.5}", "must be an integer");
    expect_refused("{\"type\": \"devices\", \"count\": 2, \"kind\": \"tpu\"}",
                   "\"cuda\" or \"cpu\"");
    expect_refused("{\"type\": \"profile\", \"name\": \"q\"}", "missing field \"step_s\"");
    expect_refused("{\"type\": \"profile\", \"name\": \"q\", \"step_s\": 1, \"alpha\": 2}",
                   "\"alpha\" = 2");
    expect_refused(
        "{\"type\": \"profile\", \"name\": \"q\", \"step_s\": 1, \"batch\": 2, \"data\": 4}",
        "smaller than data");
    expect_refused("{\"type\": \"sim\", \"max_b\": 0}", "\"max_b\" = 0");
    expect_refused("{\"type\": \"sim\", \"switch_overhead\": 0.9}", "\"switch_overhead\"");
    expect_refused("{\"type\": \"sim\", \"min_share\": 0}", "\"min_share\"");
    snprintf(line, sizeof line, "{%s}", J);
    expect_refused(line, "missing field \"steps\"");
    snprintf(line, sizeof line, "{%s, \"steps\": 0}", J);
    expect_refused(line, "\"steps\" = 0");
    snprintf(line, sizeof line, "{%s, \"steps\": 10, \"at\": -1}", J);
    expect_refused(line, "not JSON"); /* a duplicate field */
    expect_refused(
        "{\"type\": \"job\", \"at\": -1, \"tenant\": \"a\", \"profile\": \"p\", \"steps\": 1}",
        "\"at\" = -1");
    expect_refused(
        "{\"type\": \"job\", \"at\": 0, \"tenant\": \"z\", \"profile\": \"p\", \"steps\": 1}",
        "tenant \"z\" is not defined");
    expect_refused(
        "{\"type\": \"job\", \"at\": 0, \"tenant\": \"a\", \"profile\": \"z\", \"steps\": 1}",
        "profile \"z\" is not defined");
    snprintf(line, sizeof line, "{%s, \"steps\": 10, \"priority\": 101}", J);
    expect_refused(line, "\"priority\" = 101");
    snprintf(line, sizeof line, "{%s, \"steps\": 10, \"key\": \"#job0\"}", J);
    expect_refused(line, "is not a name");
    expect_refused("{\"type\": \"mix\", \"profile\": \"p\", \"steps\": [10, 5]}", "min <= max");
    expect_refused(
        "{\"type\": \"mix\", \"profile\": \"p\", \"steps\": [1, 5], \"tenants\": [\"x\"]}",
        "tenants[0] is not a defined tenant");
    expect_refused("{\"type\": \"generate\", \"jobs\": 10}", "missing field \"rate_per_s\"");

    /* a key belongs to one profile: a later line may not reuse it for another */
    char text[2048], msg[512] = "";
    snprintf(text, sizeof text,
             "%s{\"type\": \"profile\", \"name\": \"q\", \"step_s\": 1}\n"
             "{%s, \"steps\": 10, \"key\": \"k\"}\n"
             "{\"type\": \"job\", \"at\": 1, \"tenant\": \"a\", \"profile\": \"q\", \"steps\": 10, "
             "\"key\": \"k\"}\n",
             HEAD, J);
    sim_scenario sc = {0};
    CHECK(sim_scenario_read_text(&sc, text, "t", msg, sizeof msg) < 0);
    CHECK(strstr(msg, "t:9: key \"k\" belongs to profile \"p\"") != NULL);
    CHECK_INT_EQ(sc.n_jobs, 1);
    sim_scenario_free(&sc);

    /* finishing needs devices, tenants and jobs; mixes and a generator go together */
    memset(&sc, 0, sizeof sc);
    CHECK_INT_EQ(sim_scenario_read_text(&sc, HEAD, "t", msg, sizeof msg), 0);
    CHECK(sim_scenario_finish(&sc, 1.0, msg, sizeof msg) < 0);
    CHECK(strstr(msg, "no jobs") != NULL);
    sim_scenario_free(&sc);
    memset(&sc, 0, sizeof sc);
    snprintf(text, sizeof text, "%s{\"type\": \"mix\", \"profile\": \"p\", \"steps\": [1, 5]}\n",
             HEAD);
    CHECK_INT_EQ(sim_scenario_read_text(&sc, text, "t", msg, sizeof msg), 0);
    CHECK(sim_scenario_finish(&sc, 1.0, msg, sizeof msg) < 0);
    CHECK(strstr(msg, "need a generate record") != NULL);
    sim_scenario_free(&sc);
    memset(&sc, 0, sizeof sc);
    snprintf(text, sizeof text, "%s{%s, \"steps\": 10}\n", HEAD, J);
    CHECK_INT_EQ(sim_scenario_read_text(&sc, text, "t", msg, sizeof msg), 0);
    CHECK(sim_scenario_finish(&sc, 0.0, msg, sizeof msg) < 0);
    CHECK(strstr(msg, "scale") != NULL);
    CHECK(sim_scenario_read(&sc, "/nonexistent/scenario.jsonl", msg, sizeof msg) == FB_ERR_IO);
    sim_scenario_free(&sc);
}

static void test_generator(void)
{
    const char *text =
        "{\"type\": \"devices\", \"count\": 8}\n"
        "{\"type\": \"tenant\", \"name\": \"a\"}\n"
        "{\"type\": \"tenant\", \"name\": \"b\"}\n"
        "{\"type\": \"profile\", \"name\": \"p\", \"step_s\": 0.1}\n"
        "{\"type\": \"profile\", \"name\": \"q\", \"step_s\": 0.2}\n"
        "{\"type\": \"mix\", \"profile\": \"p\", \"weight\": 3, \"sweep\": [4, 4],"
        " \"steps\": [100, 200], \"tenants\": [\"b\"]}\n"
        "{\"type\": \"mix\", \"profile\": \"q\", \"weight\": 1, \"steps\": [50, 50]}\n"
        "{\"type\": \"generate\", \"jobs\": 1000, \"rate_per_s\": 2, \"seed\": 9}\n"
        "{\"type\": \"job\", \"at\": 3.5, \"tenant\": \"a\", \"profile\": \"q\", "
        "\"steps\": 7}\n";
    sim_scenario a, b;
    load_text(&a, text);
    load_text(&b, text);
    CHECK_INT_EQ(a.n_jobs, 1001);
    CHECK_INT_EQ(a.n_devices, 8);
    int sweeps = 0, singles = 0;
    for (int j = 0; j < a.n_jobs; j++) {
        const sim_job *J = &a.jobs[j];
        CHECK(memcmp(J, &b.jobs[j], sizeof *J) == 0); /* same seed, same jobs */
        if (j > 0) CHECK(J->at >= a.jobs[j - 1].at);
        if (J->profile == 0) {
            CHECK_INT_EQ(J->tenant, 1);
            CHECK(J->steps >= 100 && J->steps <= 200);
            sweeps++;
        } else {
            CHECK(J->steps == 50 || J->steps == 7);
            singles++;
        }
    }
    /* 3:1 weights and sweeps of 4: about 12 sweep jobs per single one */
    CHECK(sweeps > 8 * singles && sweeps < 16 * singles);
    /* a sweep's jobs share a key and a submission time */
    int same = 0;
    for (int j = 1; j < a.n_jobs; j++)
        if (a.jobs[j].key == a.jobs[j - 1].key) {
            CHECK(a.jobs[j].at == a.jobs[j - 1].at);
            same++;
        }
    CHECK(same > 0);
    sim_scenario_free(&a);
    sim_scenario_free(&b);
}

/* ---- the scale scenario, reduced ----------------------------------------------------- */

static void test_scale_reduced(void)
{
    const char *src = getenv("FB_SOURCE_DIR");
    if (!src) exit(FB_TEST_SKIP);
    char path[4096], msg[512];
    snprintf(path, sizeof path, "%s/sim/scenarios/scale.jsonl", src);
    sim_scenario sc = {0};
    CHECK_INT_EQ(sim_scenario_read(&sc, path, msg, sizeof msg), 0);
    CHECK_INT_EQ(sim_scenario_finish(&sc, 0.05, msg, sizeof msg), 0);
    CHECK_INT_EQ(sc.n_devices, 50);
    CHECK_INT_EQ(sc.n_jobs, 1000);
    for (int k = 0; k < 4; k++) {
        sim_config c = sc.cfg;
        c.max_b = (k & 1) ? sc.cfg.max_b : 1;
        c.rebalance = (k & 2) != 0;
        sim_result r, again;
        run(&sc, &c, &r);
        run(&sc, &c, &again);
        CHECK_INT_EQ(r.n_done, sc.n_jobs);
        CHECK(r.utilization > 0.0 && r.utilization <= 1.0 + 1e-9);
        CHECK(r.jain > 0.0 && r.jain <= 1.0 + 1e-12);
        CHECK(r.slow_max >= r.slow_p95 && r.slow_p95 >= 1.0);
        for (int j = 0; j < sc.n_jobs; j++) {
            /* no device is faster than the reference: nothing beats its exclusive run */
            CHECK(r.slowdown[j] >= 1.0 - 1e-9);
            CHECK(r.finish[j] >= r.placed[j] && r.placed[j] >= sc.jobs[j].at);
            CHECK(r.finish[j] == again.finish[j]); /* deterministic */
        }
        if (c.rebalance) CHECK(r.n_periods > 0);
        fprintf(stderr, "scale x0.05 variant %d: makespan %.0f, max slowdown %.2f, util %.3f\n", k,
                r.makespan_s, r.slow_max, r.utilization);
        sim_result_free(&r);
        sim_result_free(&again);
    }
    sim_scenario_free(&sc);
}

/* ---- the program ---------------------------------------------------------------------- */

/* Runs a command; returns its exit status and its stdout in out (cap bytes). */
static int run_cmd(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_program(void)
{
    const char *src = getenv("FB_SOURCE_DIR"), *bin = getenv("FB_BINARY_DIR");
    if (!src || !bin) exit(FB_TEST_SKIP);
    static char out[65536];
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "'%s/sim/fusebox-sim' --json --no-rebalance '%s/sim/scenarios/paper-minimal.jsonl'",
             bin, src);
    CHECK_INT_EQ(run_cmd(cmd, out, sizeof out), 0);
    json_error_t e;
    json_t *o = json_loads(out, 0, &e);
    CHECK(o != NULL);
    CHECK_STR_EQ(json_string_value(json_object_get(o, "scenario")), "paper-minimal");
    json_t *run0 = json_array_get(json_object_get(o, "runs"), 0);
    CHECK_NEAR(json_real_value(json_object_get(run0, "slowdown_max")), 2.0, 1e-9);
    CHECK_NEAR(json_real_value(json_object_get(run0, "utilization")), 0.75, 1e-9);
    CHECK_INT_EQ(json_integer_value(json_object_get(run0, "jobs_done")), 2);
    json_decref(o);

    snprintf(cmd, sizeof cmd,
             "'%s/sim/fusebox-sim' --compare '%s/sim/scenarios/paper-minimal.jsonl'", bin, src);
    CHECK_INT_EQ(run_cmd(cmd, out, sizeof out), 0);
    CHECK(strstr(out, "fusebox/basel") != NULL);
    CHECK(strstr(out, "max slowdown") != NULL);

    /* a bad scenario: exit 2 and the line on stderr */
    char bad[4096];
    snprintf(bad, sizeof bad, "%s/tests/sim/bad-scenario-XXXXXX", bin);
    int fd = mkstemp(bad);
    CHECK(fd >= 0);
    const char *text =
        "{\"type\": \"tenant\", \"name\": \"a\"}\n{\"type\": \"tenant\", \"name\": 5}\n";
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    snprintf(cmd, sizeof cmd, "'%s/sim/fusebox-sim' '%s' 2>&1", bin, bad);
    CHECK_INT_EQ(run_cmd(cmd, out, sizeof out), 2);
    CHECK(strstr(out, ":2: field \"name\" must be a string") != NULL);
    unlink(bad);
    snprintf(cmd, sizeof cmd, "'%s/sim/fusebox-sim' --bogus x 2>&1", bin);
    CHECK_INT_EQ(run_cmd(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "'%s/sim/fusebox-sim' --scale 2 x 2>&1", bin);
    CHECK_INT_EQ(run_cmd(cmd, out, sizeof out), 2);
}

int main(void)
{
    test_time_sharing();
    test_queueing();
    test_migration();
    test_parser();
    test_generator();
    test_minimal_paper();
    test_scale_reduced();
    test_program();
    printf("test_sim: ok\n");
    return 0;
}
