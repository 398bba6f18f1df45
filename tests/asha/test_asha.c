/*
 * The ASHA policy (server/asha.h) against a second, deliberately plain
 * implementation of the rule written here: sort the rung's results best
 * first and keep the first floor(n / eta).  Many seeded random sweeps run
 * asynchronously (trials report at their rungs in a random order, some
 * metrics tie, some are NaN) and every decision of the policy must equal the
 * reference's.  Then the edge cases one by one: ties, mode min and max,
 * fewer results than eta, non-finite metrics, rung steps and max_rungs,
 * overflow of far rungs, and bad input refused with the output untouched.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "asha.h"
#include "check.h"

#define UNTOUCHED ((fb_asha_decision)42)

static fb_asha_spec rule(fb_metric_mode mode, int64_t grace, int eta, int rungs)
{
    fb_asha_spec r = {.enabled = true,
                      .mode = mode,
                      .grace_steps = grace,
                      .reduction_factor = eta,
                      .max_rungs = rungs};
    snprintf(r.metric, sizeof r.metric, "%s",
             mode == FB_METRIC_MIN ? "val_loss" : "val_accuracy");
    return r;
}

/* ---- the reference ------------------------------------------------------- */

/* A sort key in which smaller is better whatever the mode: diverged results
 * (not finite) after every finite one, then the metric, then the trial. */
static bool ref_better(const fb_asha_result *a, const fb_asha_result *b, fb_metric_mode mode)
{
    int ka = isfinite(a->metric) ? 0 : 1, kb = isfinite(b->metric) ? 0 : 1;
    if (ka != kb) return ka < kb;
    if (ka == 0) {
        double ma = mode == FB_METRIC_MAX ? -a->metric : a->metric;
        double mb = mode == FB_METRIC_MAX ? -b->metric : b->metric;
        if (ma < mb) return true;
        if (ma > mb) return false;
    }
    return a->trial < b->trial;
}

static fb_asha_decision ref_decide(int eta, fb_metric_mode mode, const fb_asha_result *res, int n,
                                   int64_t trial)
{
    fb_asha_result sorted[FB_ASHA_MAX_RESULTS];
    memcpy(sorted, res, (size_t)n * sizeof *res);
    for (int i = 1; i < n; i++) /* insertion sort */
        for (int k = i; k > 0 && ref_better(&sorted[k], &sorted[k - 1], mode); k--) {
            fb_asha_result t = sorted[k];
            sorted[k] = sorted[k - 1];
            sorted[k - 1] = t;
        }
    int pos = -1;
    for (int i = 0; i < n; i++)
        if (sorted[i].trial == trial) pos = i;
    CHECK(pos >= 0);
    if (!isfinite(sorted[pos].metric)) return FB_ASHA_STOP;
    if (n < eta) return FB_ASHA_CONTINUE;
    return pos < n / eta ? FB_ASHA_CONTINUE : FB_ASHA_STOP;
}

/* ---- random asynchronous sweeps ------------------------------------------ */

static uint64_t rng_state;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int rnd_int(int lo, int hi) /* lo..hi */
{
    return lo + (int)(rnd() % (uint64_t)(hi - lo + 1));
}

static fb_asha_decision decide(const fb_asha_spec *r, const fb_asha_result *res, int n,
                               int64_t trial)
{
    fb_asha_decision d = UNTOUCHED;
    char msg[256];
    int err = fb_asha_decide(r, res, n, trial, &d, msg, sizeof msg);
    if (err) fprintf(stderr, "fb_asha_decide: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    CHECK(d == FB_ASHA_CONTINUE || d == FB_ASHA_STOP);
    return d;
}

/*
 * One sweep: n trials, each with a metric per rung drawn from a small set of
 * values (so that ties happen) or NaN now and then.  At every turn a random
 * trial that still runs reports at its next rung; both implementations
 * decide; a stopped trial reports no more.  Returns the number of stops.
 */
static int random_sweep(uint64_t seed, long *decisions)
{
    rng_state = seed * 0x9E3779B97F4A7C15ULL + 1;
    int eta = rnd_int(2, 5), rungs = rnd_int(1, 5), n = rnd_int(1, 60);
    fb_metric_mode mode = rnd() & 1 ? FB_METRIC_MAX : FB_METRIC_MIN;
    int levels = rnd_int(2, 40); /* fewer levels: more ties */
    fb_asha_spec r = rule(mode, rnd_int(1, 50), eta, rungs);
    static fb_asha_result at[32][FB_ASHA_MAX_RESULTS];
    int n_at[32] = {0};
    int next[FB_ASHA_MAX_RESULTS];
    bool alive[FB_ASHA_MAX_RESULTS];
    int64_t index[FB_ASHA_MAX_RESULTS];
    for (int i = 0; i < n; i++) {
        next[i] = 0;
        alive[i] = true;
        index[i] = rnd_int(0, 3) ? i : i + 1000; /* trial indices need not be dense */
    }
    int stops = 0, running = n;
    while (running > 0) {
        int k = rnd_int(0, n - 1);
        while (!alive[k])
            k = (k + 1) % n;
        int rung = next[k];
        double m = rnd_int(0, 19) == 0 ? NAN : (double)rnd_int(0, levels - 1) / levels;
        /* a trial reports where an evaluation at or past the rung's step lands */
        int64_t step = fb_asha_rung_step(&r, rung) + rnd_int(0, (int)r.grace_steps - 1);
        CHECK_INT_EQ(fb_asha_rung_at(&r, step), rung);
        at[rung][n_at[rung]++] = (fb_asha_result){.trial = index[k], .metric = m};
        fb_asha_decision got = decide(&r, at[rung], n_at[rung], index[k]);
        fb_asha_decision want = ref_decide(eta, mode, at[rung], n_at[rung], index[k]);
        if (got != want) {
            fprintf(stderr,
                    "seed %llu: eta %d mode %s rung %d, %d results, trial %lld (metric %g):"
                    " policy %s, reference %s\n",
                    (unsigned long long)seed, eta, mode == FB_METRIC_MIN ? "min" : "max", rung,
                    n_at[rung], (long long)index[k], m, fb_asha_decision_name(got),
                    fb_asha_decision_name(want));
            CHECK(got == want);
        }
        /* the best result so far continues once eta results exist */
        if (n_at[rung] >= eta && isfinite(m)) {
            bool best = true;
            for (int i = 0; i < n_at[rung] - 1; i++)
                if (ref_better(&at[rung][i], &at[rung][n_at[rung] - 1], mode)) best = false;
            if (best) CHECK(got == FB_ASHA_CONTINUE);
        }
        (*decisions)++;
        if (got == FB_ASHA_STOP) {
            stops++;
            alive[k] = false;
            running--;
        } else if (++next[k] == rungs) {
            alive[k] = false; /* past the last rung: trains to its end */
            running--;
        }
    }
    return stops;
}

static void random_sweeps(void)
{
    long decisions = 0, stops = 0;
    for (uint64_t seed = 1; seed <= 2000; seed++)
        stops += random_sweep(seed, &decisions);
    printf("random sweeps: %ld decisions, %ld stops, all equal to the reference\n", decisions,
           stops);
    /* the streams exercise both outcomes in quantity */
    CHECK(stops > decisions / 5);
    CHECK(stops < decisions);
}

/* ---- edge cases ---------------------------------------------------------- */

static void ties_rank_by_trial_index(void)
{
    fb_asha_spec r = rule(FB_METRIC_MIN, 10, 3, 3);
    fb_asha_result res[3] = {{7, 0.5}, {2, 0.5}, {4, 0.5}};
    CHECK(decide(&r, res, 3, 2) == FB_ASHA_CONTINUE);
    CHECK(decide(&r, res, 3, 4) == FB_ASHA_STOP);
    CHECK(decide(&r, res, 3, 7) == FB_ASHA_STOP);
    /* the order of the list does not matter */
    fb_asha_result rev[3] = {res[2], res[1], res[0]};
    CHECK(decide(&r, rev, 3, 2) == FB_ASHA_CONTINUE);
    CHECK(decide(&r, rev, 3, 7) == FB_ASHA_STOP);
    /* six results, two continue: the tie at the cut goes to the smaller index */
    fb_asha_result six[6] = {{0, 0.9}, {1, 0.1}, {2, 0.3}, {3, 0.3}, {4, 0.8}, {5, 0.7}};
    CHECK(decide(&r, six, 6, 1) == FB_ASHA_CONTINUE);
    CHECK(decide(&r, six, 6, 2) == FB_ASHA_CONTINUE);
    CHECK(decide(&r, six, 6, 3) == FB_ASHA_STOP);
    CHECK(decide(&r, six, 6, 0) == FB_ASHA_STOP);
}

static void modes(void)
{
    fb_asha_result res[4] = {{0, 0.2}, {1, 0.9}, {2, 0.5}, {3, 0.7}};
    fb_asha_spec lo = rule(FB_METRIC_MIN, 10, 4, 2), hi = rule(FB_METRIC_MAX, 10, 4, 2);
    CHECK(decide(&lo, res, 4, 0) == FB_ASHA_CONTINUE);
    CHECK(decide(&lo, res, 4, 1) == FB_ASHA_STOP);
    CHECK(decide(&hi, res, 4, 0) == FB_ASHA_STOP);
    CHECK(decide(&hi, res, 4, 1) == FB_ASHA_CONTINUE);
    CHECK(decide(&hi, res, 4, 3) == FB_ASHA_STOP);
    /* eta 2 over four results: the best two */
    fb_asha_spec hi2 = rule(FB_METRIC_MAX, 10, 2, 2);
    CHECK(decide(&hi2, res, 4, 3) == FB_ASHA_CONTINUE);
    CHECK(decide(&hi2, res, 4, 2) == FB_ASHA_STOP);
}

static void fewer_results_than_eta(void)
{
    fb_asha_spec r = rule(FB_METRIC_MIN, 10, 3, 3);
    fb_asha_result res[3] = {{0, 0.1}, {1, 5.0}, {2, 9.0}};
    /* the first arrivals continue, however bad */
    CHECK(decide(&r, res, 1, 0) == FB_ASHA_CONTINUE);
    CHECK(decide(&r, res, 2, 1) == FB_ASHA_CONTINUE);
    /* the third one is measured against both */
    CHECK(decide(&r, res, 3, 2) == FB_ASHA_STOP);
    CHECK(decide(&r, res, 3, 0) == FB_ASHA_CONTINUE);
    /* a larger eta waits for more */
    fb_asha_spec r16 = rule(FB_METRIC_MIN, 10, 16, 3);
    CHECK(decide(&r16, res, 3, 2) == FB_ASHA_CONTINUE);
}

static void not_finite_metrics(void)
{
    fb_asha_spec lo = rule(FB_METRIC_MIN, 10, 3, 3), hi = rule(FB_METRIC_MAX, 10, 3, 3);
    fb_asha_result res[3] = {{0, NAN}, {1, 5.0}, {2, 6.0}};
    CHECK(decide(&lo, res, 1, 0) == FB_ASHA_STOP); /* stops even alone */
    CHECK(decide(&lo, res, 3, 1) == FB_ASHA_CONTINUE);
    CHECK(decide(&lo, res, 3, 2) == FB_ASHA_STOP);
    /* +inf is not the best accuracy, and -inf not the best loss: both diverged */
    fb_asha_result inf[3] = {{0, INFINITY}, {1, 0.5}, {2, 0.4}};
    CHECK(decide(&hi, inf, 3, 1) == FB_ASHA_CONTINUE);
    CHECK(decide(&hi, inf, 3, 0) == FB_ASHA_STOP);
    fb_asha_result ninf[3] = {{0, -INFINITY}, {1, 0.5}, {2, 0.4}};
    CHECK(decide(&lo, ninf, 3, 2) == FB_ASHA_CONTINUE);
    CHECK(decide(&lo, ninf, 3, 0) == FB_ASHA_STOP);
}

static void rung_steps(void)
{
    fb_asha_spec r = rule(FB_METRIC_MIN, 20, 3, 3);
    CHECK_INT_EQ(fb_asha_rung_step(&r, 0), 20);
    CHECK_INT_EQ(fb_asha_rung_step(&r, 1), 60);
    CHECK_INT_EQ(fb_asha_rung_step(&r, 2), 180);
    CHECK_INT_EQ(fb_asha_rung_step(&r, 3), -1); /* max_rungs */
    CHECK_INT_EQ(fb_asha_rung_step(&r, -1), -1);
    CHECK_INT_EQ(fb_asha_rung_at(&r, 0), -1);
    CHECK_INT_EQ(fb_asha_rung_at(&r, 19), -1);
    CHECK_INT_EQ(fb_asha_rung_at(&r, 20), 0);
    CHECK_INT_EQ(fb_asha_rung_at(&r, 59), 0);
    CHECK_INT_EQ(fb_asha_rung_at(&r, 60), 1);
    CHECK_INT_EQ(fb_asha_rung_at(&r, 180), 2);
    CHECK_INT_EQ(fb_asha_rung_at(&r, 100000), 2); /* no rung past the last */
    fb_asha_spec one = rule(FB_METRIC_MIN, 5, 2, 1);
    CHECK_INT_EQ(fb_asha_rung_at(&one, 1000), 0);
    /* far rungs that overflow are never reached */
    fb_asha_spec far = rule(FB_METRIC_MIN, 1000000000, 16, 32);
    CHECK_INT_EQ(fb_asha_rung_step(&far, 5), 1000000000LL * 16 * 16 * 16 * 16 * 16);
    CHECK_INT_EQ(fb_asha_rung_step(&far, 31), -1);
    int top = fb_asha_rung_at(&far, INT64_MAX);
    CHECK(top >= 5 && top < 31);
    CHECK(fb_asha_rung_step(&far, top) > 0 && fb_asha_rung_step(&far, top + 1) == -1);
}

static void expect_refused(const fb_asha_spec *r, const fb_asha_result *res, int n, int64_t trial,
                           int code)
{
    fb_asha_decision d = UNTOUCHED;
    char msg[256] = "";
    int err = fb_asha_decide(r, res, n, trial, &d, msg, sizeof msg);
    if (err != code) fprintf(stderr, "expected %d, got %d (%s)\n", code, err, msg);
    CHECK_INT_EQ(err, code);
    CHECK(d == UNTOUCHED);
    CHECK(msg[0] != '\0');
}

static void bad_input(void)
{
    fb_asha_spec ok = rule(FB_METRIC_MIN, 10, 3, 3);
    fb_asha_result res[3] = {{0, 0.1}, {1, 0.2}, {2, 0.3}};
    expect_refused(NULL, res, 3, 0, FB_ERR_MISSING_FIELD);
    fb_asha_spec bad = ok;
    bad.enabled = false;
    expect_refused(&bad, res, 3, 0, FB_ERR_MISSING_FIELD);
    bad = ok;
    bad.reduction_factor = 1;
    expect_refused(&bad, res, 3, 0, FB_ERR_OUT_OF_RANGE);
    CHECK_INT_EQ(fb_asha_rung_step(&bad, 0), -1);
    CHECK_INT_EQ(fb_asha_rung_at(&bad, 100), -1);
    bad.reduction_factor = 17;
    expect_refused(&bad, res, 3, 0, FB_ERR_OUT_OF_RANGE);
    bad = ok;
    bad.grace_steps = 0;
    expect_refused(&bad, res, 3, 0, FB_ERR_OUT_OF_RANGE);
    bad = ok;
    bad.max_rungs = 0;
    expect_refused(&bad, res, 3, 0, FB_ERR_OUT_OF_RANGE);
    bad.max_rungs = 33;
    expect_refused(&bad, res, 3, 0, FB_ERR_OUT_OF_RANGE);
    bad = ok;
    bad.mode = (fb_metric_mode)7;
    expect_refused(&bad, res, 3, 0, FB_ERR_BAD_ENUM);
    expect_refused(&ok, NULL, 3, 0, FB_ERR_MISSING_FIELD);
    expect_refused(&ok, res, 0, 0, FB_ERR_OUT_OF_RANGE);
    expect_refused(&ok, res, -1, 0, FB_ERR_OUT_OF_RANGE);
    expect_refused(&ok, res, FB_ASHA_MAX_RESULTS + 1, 0, FB_ERR_OUT_OF_RANGE);
    expect_refused(&ok, res, 3, 9, FB_ERR_NOT_FOUND);
    expect_refused(&ok, res, 2, 2, FB_ERR_NOT_FOUND); /* only the first n count */
    fb_asha_result dup[3] = {{0, 0.1}, {1, 0.2}, {0, 0.3}};
    expect_refused(&ok, dup, 3, 1, FB_ERR_CONFLICT);
    fb_asha_result neg[2] = {{0, 0.1}, {-4, 0.2}};
    expect_refused(&ok, neg, 2, 0, FB_ERR_OUT_OF_RANGE);
    char msg[128];
    CHECK_INT_EQ(fb_asha_decide(&ok, res, 3, 0, NULL, msg, sizeof msg), FB_ERR_MISSING_FIELD);
    CHECK_INT_EQ(fb_asha_check(&ok, msg, sizeof msg), FB_OK);
    CHECK_STR_EQ(fb_asha_decision_name(FB_ASHA_STOP), "stop");
    CHECK_STR_EQ(fb_asha_decision_name(FB_ASHA_CONTINUE), "continue");
}

int main(void)
{
    ties_rank_by_trial_index();
    modes();
    fewer_results_than_eta();
    not_finite_metrics();
    rung_steps();
    bad_input();
    printf("ok: edge cases\n");
    random_sweeps();
    return 0;
}
