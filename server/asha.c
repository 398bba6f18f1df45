/* Asynchronous successive halving as a pure policy (asha.h). */
#include "asha.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>

int fb_asha_check(const fb_asha_spec *rule, char *msg, size_t msg_cap)
{
    if (!rule) return fb_errf(msg, msg_cap, FB_ERR_MISSING_FIELD, "early_stopping: no rule");
    if (!rule->enabled)
        return fb_errf(msg, msg_cap, FB_ERR_MISSING_FIELD,
                       "early_stopping: the sweep has no early-stopping rule");
    if (rule->mode != FB_METRIC_MIN && rule->mode != FB_METRIC_MAX)
        return fb_errf(msg, msg_cap, FB_ERR_BAD_ENUM, "early_stopping.mode: not min or max");
    if (rule->grace_steps < 1)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "early_stopping.grace_steps: %" PRId64 " is below 1", rule->grace_steps);
    if (rule->reduction_factor < 2 || rule->reduction_factor > 16)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "early_stopping.reduction_factor: %d is outside 2..16",
                       rule->reduction_factor);
    if (rule->max_rungs < 1 || rule->max_rungs > 32)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "early_stopping.max_rungs: %d is outside 1..32", rule->max_rungs);
    return FB_OK;
}

int64_t fb_asha_rung_step(const fb_asha_spec *rule, int rung)
{
    char msg[8];
    if (fb_asha_check(rule, msg, sizeof msg) || rung < 0 || rung >= rule->max_rungs) return -1;
    int64_t step = rule->grace_steps;
    for (int r = 0; r < rung; r++) {
        if (step > INT64_MAX / rule->reduction_factor) return -1;
        step *= rule->reduction_factor;
    }
    return step;
}

int fb_asha_rung_at(const fb_asha_spec *rule, int64_t step)
{
    char msg[8];
    if (fb_asha_check(rule, msg, sizeof msg)) return -1;
    int rung = -1;
    for (int r = 0; r < rule->max_rungs; r++) {
        int64_t s = fb_asha_rung_step(rule, r);
        if (s < 0 || s > step) break;
        rung = r;
    }
    return rung;
}

/* Whether result a ranks before result b: the better metric, not-finite
 * values last, then the smaller trial index. */
static bool ranks_before(const fb_asha_result *a, const fb_asha_result *b, fb_metric_mode mode)
{
    bool fa = isfinite(a->metric), fb = isfinite(b->metric);
    if (fa != fb) return fa;
    if (fa && a->metric != b->metric)
        return mode == FB_METRIC_MIN ? a->metric < b->metric : a->metric > b->metric;
    return a->trial < b->trial;
}

int fb_asha_decide(const fb_asha_spec *rule, const fb_asha_result *results, int n, int64_t trial,
                   fb_asha_decision *out, char *msg, size_t msg_cap)
{
    int err = fb_asha_check(rule, msg, msg_cap);
    if (err) return err;
    if (!results || !out)
        return fb_errf(msg, msg_cap, FB_ERR_MISSING_FIELD, "asha: no results or no output");
    if (n < 1 || n > FB_ASHA_MAX_RESULTS)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "asha: %d results at a rung; expected 1..%d", n, FB_ASHA_MAX_RESULTS);
    /* quadratic, without allocating: n is at most one sweep's trials */
    int self = -1;
    for (int i = 0; i < n; i++) {
        if (results[i].trial < 0)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "asha: result %d has the negative trial index %" PRId64, i,
                           results[i].trial);
        for (int k = 0; k < i; k++)
            if (results[k].trial == results[i].trial)
                return fb_errf(msg, msg_cap, FB_ERR_CONFLICT,
                               "asha: trial %" PRId64 " has two results at one rung",
                               results[i].trial);
        if (results[i].trial == trial) self = i;
    }
    if (self < 0)
        return fb_errf(msg, msg_cap, FB_ERR_NOT_FOUND,
                       "asha: trial %" PRId64 " is not among the rung's results", trial);
    const fb_asha_result *me = &results[self];
    fb_asha_decision d;
    if (!isfinite(me->metric)) {
        d = FB_ASHA_STOP;
    } else if (n < rule->reduction_factor) {
        d = FB_ASHA_CONTINUE;
    } else {
        int ahead = 0;
        for (int i = 0; i < n; i++)
            if (i != self && ranks_before(&results[i], me, rule->mode)) ahead++;
        d = ahead < n / rule->reduction_factor ? FB_ASHA_CONTINUE : FB_ASHA_STOP;
    }
    *out = d;
    return FB_OK;
}

const char *fb_asha_decision_name(fb_asha_decision d)
{
    return d == FB_ASHA_STOP ? "stop" : "continue";
}
