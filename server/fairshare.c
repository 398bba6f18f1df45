/*
 * The fair-share controller of fairshare.h.
 *
 * Time shares are solved per device, then per group.  On a device, each
 * tenant's part is fixed by the weights; inside it the shares that make the
 * groups' predicted slowdowns equal are found by bisection on the common
 * slowdown level: a group that gets a fraction x of the device instead of
 * its current fraction f is predicted to step in step_time * f / x, so its
 * job j reaches slowdown a_j + b_j / x (a_j: time already spent, b_j: time
 * still to go, both over the job's isolated run time), and the x it needs
 * for a level L is the largest b_j / (L - a_j).  Each group's need shrinks
 * as L grows, so the level at which the needs fill the tenant's part is
 * unique.  The prediction treats the device as the group's bottleneck and
 * step time as inversely proportional to the share; where that is wrong the
 * next period's measurements correct it, and the bounded, damped moves keep
 * the correction from oscillating.
 */
#include "fairshare.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

#define BISECT_ROUNDS 100
#define CHANGE_EPS 1e-12

/* Every malformed snapshot or params set is refused with the same code. */
#define BAD(...) fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, __VA_ARGS__)

fb_fair_params fb_fair_params_default(void)
{
    return (fb_fair_params){.period_s = 5.0,
                            .smoothing = 0.3,
                            .split_hysteresis = 0.05,
                            .split_patience = 10,
                            .share_hysteresis = 0.02,
                            .max_share_step = 0.1,
                            .min_share = 0.25,
                            .migrate_gap = 2,
                            .migrate_patience = 6};
}

void fb_fair_memory_init(fb_fair_memory *mem) { *mem = (fb_fair_memory){0}; }

void fb_fair_device_memory_init(fb_fair_device_memory *mem)
{
    *mem = (fb_fair_device_memory){0};
}

void fb_fair_memory_restore(const fb_fair_memory *mem, fb_fair_group *G)
{
    bool same_shape = G->n_shards >= 64 || mem->split_toward >> G->n_shards == 0;
    G->split_periods = same_shape ? mem->split_periods : 0;
    G->split_toward = same_shape ? mem->split_toward : 0;
    G->split_gain = same_shape ? mem->split_gain : 0;
}

void fb_fair_memory_save(fb_fair_memory *mem, const fb_fair_decision *dec)
{
    mem->split_periods = dec->split_periods;
    mem->split_toward = dec->split_toward;
    mem->split_gain = dec->split_gain;
}

void fb_fair_device_memory_restore(const fb_fair_device_memory *mem, fb_fair_device *D)
{
    D->imbalanced_periods = mem->imbalanced_periods > 0 ? mem->imbalanced_periods : 0;
}

void fb_fair_device_memory_save(fb_fair_device_memory *mem, const fb_fair_result *res,
                                int device)
{
    mem->imbalanced_periods = res->imbalanced_periods[device];
}

double fb_fair_ewma(double prev, double sample, double w)
{
    if (prev == 0.0) return sample;
    return prev + w * (sample - prev);
}

/* ---- validation ------------------------------------------------------------ */

/* 0, or a finite value within FB_FAIR_MIN_VALUE..FB_FAIR_MAX_VALUE. */
static bool measured_ok(double v)
{
    return v == 0.0 || (v >= FB_FAIR_MIN_VALUE && v <= FB_FAIR_MAX_VALUE);
}

static int validate_params(const fb_fair_params *p, char *msg, size_t msg_cap)
{
    if (!(p->period_s > 0.0 && p->period_s <= FB_FAIR_MAX_VALUE))
        return BAD("params.period_s = %g must be positive and finite", p->period_s);
    if (!(p->smoothing > 0.0 && p->smoothing <= 1.0))
        return BAD("params.smoothing = %g must be in (0, 1]", p->smoothing);
    if (!(p->split_hysteresis >= 0.0 && p->split_hysteresis < 1.0))
        return BAD("params.split_hysteresis = %g must be in [0, 1)", p->split_hysteresis);
    if (p->split_patience < 1)
        return BAD("params.split_patience = %d must be at least 1", p->split_patience);
    if (!(p->share_hysteresis >= 0.0 && p->share_hysteresis < 1.0))
        return BAD("params.share_hysteresis = %g must be in [0, 1)", p->share_hysteresis);
    if (!(p->max_share_step > 0.0 && p->max_share_step <= 1.0))
        return BAD("params.max_share_step = %g must be in (0, 1]", p->max_share_step);
    if (!(p->min_share > 0.0 && p->min_share <= 1.0))
        return BAD("params.min_share = %g must be in (0, 1]", p->min_share);
    if (p->migrate_gap < 1)
        return BAD("params.migrate_gap = %d must be at least 1", p->migrate_gap);
    if (p->migrate_patience < 1)
        return BAD("params.migrate_patience = %d must be at least 1", p->migrate_patience);
    return FB_OK;
}

static int validate_group(const fb_fair_snapshot *s, int g, int *dev_stamp, char *msg,
                          size_t msg_cap)
{
    const fb_fair_group *G = &s->groups[g];
    if (G->n_shards < 1 || G->n_shards > FB_FAIR_MAX_SHARDS)
        return BAD("groups[%d].n_shards = %d is outside 1..%d", g, G->n_shards, FB_FAIR_MAX_SHARDS);
    int64_t batch = 0;
    for (int i = 0; i < G->n_shards; i++) {
        int d = G->devices[i];
        if (d < 0 || d >= s->n_devices)
            return BAD("groups[%d].devices[%d] = %d is out of range (%d devices)", g, i, d,
                       s->n_devices);
        if (dev_stamp[d] == g + 1) return BAD("groups[%d] names device %d twice", g, d);
        dev_stamp[d] = g + 1;
        if (G->split[i] < 1 || G->split[i] > FB_FAIR_MAX_BATCH)
            return BAD("groups[%d].split[%d] = %lld must be at least 1", g, i,
                       (long long)G->split[i]);
        batch += G->split[i];
        if (batch > FB_FAIR_MAX_BATCH) return BAD("groups[%d] has a batch above 2^40 samples", g);
        if (!measured_ok(G->shard_rate[i]))
            return BAD("groups[%d].shard_rate[%d] = %g is neither 0 nor within 1e-9..1e12", g, i,
                       G->shard_rate[i]);
    }
    if (G->split_periods < 0)
        return BAD("groups[%d].split_periods = %d is negative", g, G->split_periods);
    if (G->n_shards < 64 && G->split_toward >> G->n_shards != 0)
        return BAD("groups[%d].split_toward = %#llx names a shard beyond its %d", g,
                   (unsigned long long)G->split_toward, G->n_shards);
    if (!(G->split_gain >= 0.0 && G->split_gain <= FB_FAIR_MAX_VALUE))
        return BAD("groups[%d].split_gain = %g is outside 0..1e12", g, G->split_gain);
    if (!(G->time_share > 0.0 && G->time_share <= 1.0))
        return BAD("groups[%d].time_share = %g is outside (0, 1]", g, G->time_share);
    if (!measured_ok(G->step_time_s))
        return BAD("groups[%d].step_time_s = %g is neither 0 nor within 1e-9..1e12", g,
                   G->step_time_s);
    if (!measured_ok(G->isolated_step_s))
        return BAD("groups[%d].isolated_step_s = %g is neither 0 nor within 1e-9..1e12", g,
                   G->isolated_step_s);
    if (G->n_jobs < 1 || !G->jobs) return BAD("groups[%d] has no jobs (n_jobs %d)", g, G->n_jobs);
    for (int j = 0; j < G->n_jobs; j++) {
        const fb_fair_job *J = &G->jobs[j];
        if (J->tenant < 0 || J->tenant >= s->n_tenants)
            return BAD("groups[%d].jobs[%d].tenant = %d is out of range (%d tenants)", g, j,
                       J->tenant, s->n_tenants);
        if (!(J->elapsed_s >= 0.0 && J->elapsed_s <= FB_FAIR_MAX_VALUE))
            return BAD("groups[%d].jobs[%d].elapsed_s = %g is outside 0..1e12", g, j, J->elapsed_s);
        if (J->total_steps < 1 || J->total_steps > FB_FAIR_MAX_STEPS)
            return BAD("groups[%d].jobs[%d].total_steps = %lld is outside 1..2^50", g, j,
                       (long long)J->total_steps);
        if (J->steps_done < 0 || J->steps_done > J->total_steps)
            return BAD("groups[%d].jobs[%d].steps_done = %lld is outside 0..%lld", g, j,
                       (long long)J->steps_done, (long long)J->total_steps);
    }
    return FB_OK;
}

static int validate(const fb_fair_snapshot *s, int *dev_stamp, char *msg, size_t msg_cap)
{
    for (int d = 0; d < s->n_devices; d++) {
        const fb_fair_device *D = &s->devices[d];
        if (D->kind != FB_PLAN_CPU && D->kind != FB_PLAN_CUDA)
            return BAD("devices[%d].kind = %d is unknown", d, D->kind);
        if (D->imbalanced_periods < 0)
            return BAD("devices[%d].imbalanced_periods = %d is negative", d, D->imbalanced_periods);
    }
    for (int t = 0; t < s->n_tenants; t++) {
        double w = s->tenants[t].weight;
        if (!(w > 0.0 && w <= DBL_MAX))
            return BAD("tenants[%d].weight = %g must be finite and positive", t, w);
    }
    for (int g = 0; g < s->n_groups; g++) {
        int rc = validate_group(s, g, dev_stamp, msg, msg_cap);
        if (rc) return rc;
    }
    return FB_OK;
}

/* ---- slowdown ---------------------------------------------------------------- */

/* The step time the prediction uses now: the measured one, else the
 * isolated one (nothing says the group is slowed yet). */
static double step_now(const fb_fair_group *G)
{
    return G->step_time_s > 0.0 ? G->step_time_s : G->isolated_step_s;
}

static double job_slowdown(const fb_fair_group *G, const fb_fair_job *J)
{
    if (G->isolated_step_s == 0.0) return 1.0;
    double remaining = (double)(J->total_steps - J->steps_done);
    return (J->elapsed_s + remaining * step_now(G)) / ((double)J->total_steps * G->isolated_step_s);
}

/* ---- the split ------------------------------------------------------------- */

/* The split proportional to the shard rates: each shard at least 1 sample,
 * the batch unchanged, rounding by largest remainder.  Returns false when a
 * rate is not measured yet. */
static bool proportional_split(const fb_fair_group *G, int64_t *split)
{
    int D = G->n_shards;
    double sum_rate = 0.0;
    int64_t batch = 0;
    for (int i = 0; i < D; i++) {
        if (G->shard_rate[i] <= 0.0) return false;
        sum_rate += G->shard_rate[i];
        batch += G->split[i];
    }
    double ideal[FB_FAIR_MAX_SHARDS];
    int64_t total = 0;
    for (int i = 0; i < D; i++) {
        ideal[i] = (double)batch * G->shard_rate[i] / sum_rate;
        double fl = floor(ideal[i]);
        split[i] = fl < 1.0 ? 1 : (int64_t)fl;
        total += split[i];
    }
    /* Rounding down leaves at most D samples; the floor of 1 can take at
     * most D too, so both loops run at most D times. */
    while (total < batch) {
        int best = 0;
        for (int i = 1; i < D; i++)
            if (ideal[i] - (double)split[i] > ideal[best] - (double)split[best]) best = i;
        split[best]++;
        total++;
    }
    while (total > batch) {
        int best = -1;
        for (int i = 0; i < D; i++)
            if (split[i] > 1 &&
                (best < 0 || (double)split[i] - ideal[i] > (double)split[best] - ideal[best]))
                best = i;
        split[best]--;
        total--;
    }
    return true;
}

/* Step time of a split in seconds at the measured rates: its slowest shard. */
static double split_time(const fb_fair_group *G, const int64_t *split)
{
    double t = 0.0;
    for (int i = 0; i < G->n_shards; i++) {
        double ti = (double)split[i] / G->shard_rate[i];
        if (ti > t) t = ti;
    }
    return t;
}

/*
 * A large gain is taken at once.  A smaller one waits until the
 * proportional split has pointed the same way, the same shards gaining
 * samples, for split_patience periods in a row and the gains predicted in
 * those periods add up to more than split_hysteresis; then the proportional
 * split is applied exactly.  A band alone stops a split that the rates
 * approach gradually short of proportional by up to the band (each last
 * step is too small), and a narrower band chases noise.  A steady gap g
 * points the same way every period and is closed after
 * max(split_patience, split_hysteresis / g) periods.  Noise in the measured
 * rates points one way one period and another the next, or nowhere once
 * rounding absorbs it, and each such period starts the count again.  The
 * caller's smoothing makes neighbouring periods alike for about
 * 1 / smoothing periods (3 by default), so noise does point one way for a
 * few periods in a row: the default patience of 10 is three times that,
 * and the sum keeps many small gains of noise from passing for a gap.
 *
 * A smaller gain that gives samples to a shard on a device shared with
 * other groups is not taken at all.  A shard's rate is measured while it
 * competes for its whole part of the device, but a shard that waits for
 * its group leaves the rest of its turn to the groups beside it (the
 * workers' scheduler is work-conserving); the proportional split makes
 * every shard a bottleneck and takes that rest away, which the group's
 * predicted step does not count.  Below the band the loss can be the
 * larger: in the simulator's scale-busy a 4-shard group that gained 1.8%
 * that way took a third of the device time of the array beside it.
 * Samples moved off shared devices cost nobody.
 */
static void decide_split(const fb_fair_group *G, const int *dev_off, const fb_fair_params *p,
                         fb_fair_decision *dec)
{
    memcpy(dec->split, G->split, (size_t)G->n_shards * sizeof *dec->split);
    int64_t next[FB_FAIR_MAX_SHARDS];
    if (G->n_shards < 2 || !proportional_split(G, next)) return;
    double now = split_time(G, G->split), then = split_time(G, next);
    if (!(then < now)) return; /* no gain: no gap, and the count starts again */
    uint64_t toward = 0;
    bool onto_shared = false;
    for (int i = 0; i < G->n_shards; i++)
        if (next[i] > G->split[i]) {
            toward |= UINT64_C(1) << i;
            int d = G->devices[i];
            if (dev_off[d + 1] - dev_off[d] >= 2) onto_shared = true;
        }
    double gain = 1.0 - then / now, sum = gain;
    int periods = 1;
    if (G->split_toward == toward && G->split_periods > 0) {
        periods = G->split_periods < INT_MAX ? G->split_periods + 1 : INT_MAX;
        sum = fmin(G->split_gain + gain, FB_FAIR_MAX_VALUE);
    }
    if (gain <= p->split_hysteresis && onto_shared) return; /* not a gap worth closing */
    if (gain <= p->split_hysteresis &&
        (periods < p->split_patience || sum <= p->split_hysteresis)) {
        dec->split_periods = periods;
        dec->split_toward = toward;
        dec->split_gain = sum;
        return;
    }
    memcpy(dec->split, next, (size_t)G->n_shards * sizeof *dec->split);
    dec->split_changed = true;
}

/* ---- time shares on one device --------------------------------------------- */

/* A group on the device being solved, with what its prediction needs. */
typedef struct slot {
    int group;
    int tenant;
    int entry;    /* its entry in the device lists */
    double f;     /* its current fraction of the device */
    bool neutral; /* no profile, or nothing left to do: gets an even part */
    double iso;   /* isolated step time */
    double k;     /* step time at fraction x is k / x */
} slot;

static int cmp_slot(const void *a, const void *b)
{
    const slot *x = a, *y = b;
    if (x->tenant != y->tenant) return x->tenant < y->tenant ? -1 : 1;
    return (x->group > y->group) - (x->group < y->group);
}

/* The fraction group sl needs for every member to reach slowdown level L,
 * or +inf when a member is already above L whatever it gets. */
static double need_at(const fb_fair_group *G, const slot *sl, double L)
{
    double need = 0.0;
    for (int j = 0; j < G->n_jobs; j++) {
        const fb_fair_job *J = &G->jobs[j];
        int64_t rem = J->total_steps - J->steps_done;
        if (rem == 0) continue;
        double run = (double)J->total_steps * sl->iso;
        double a = J->elapsed_s / run, b = (double)rem * sl->k / run;
        if (L <= a) return INFINITY;
        double x = b / (L - a);
        if (x > need) need = x;
    }
    return need;
}

static double clampd(double v, double lo, double hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static double fill_at(const fb_fair_snapshot *s, const slot *sl, int n, double L, double lo,
                      double hi, double *x)
{
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        if (sl[i].neutral) continue;
        x[i] = clampd(need_at(&s->groups[sl[i].group], &sl[i], L), lo, hi);
        sum += x[i];
    }
    return sum;
}

/*
 * Splits part (a tenant's fraction of the device) among its n groups sl[]
 * so that the predicted slowdowns of the profiled ones are equal; writes
 * x[i].  Neutral groups get part / n each.
 */
static void equalize(const fb_fair_snapshot *s, const fb_fair_params *p, const slot *sl, int n,
                     double part, double *x)
{
    double even = part / n, floor_x = p->min_share * even;
    int n_prof = 0;
    double max_a = 0.0, max_b = 0.0;
    for (int i = 0; i < n; i++) {
        if (sl[i].neutral) {
            x[i] = even;
            continue;
        }
        n_prof++;
        const fb_fair_group *G = &s->groups[sl[i].group];
        for (int j = 0; j < G->n_jobs; j++) {
            const fb_fair_job *J = &G->jobs[j];
            int64_t rem = J->total_steps - J->steps_done;
            if (rem == 0) continue;
            double run = (double)J->total_steps * sl[i].iso;
            double a = J->elapsed_s / run, b = (double)rem * sl[i].k / run;
            if (a > max_a) max_a = a;
            if (b > max_b) max_b = b;
        }
    }
    if (n_prof == 0) return;
    double budget = even * n_prof;
    /* At L = max_a some group needs everything; at hi every need is at or
     * below the floor, so the sum of the clamped needs crosses budget in
     * between (floors sum to at most budget since min_share <= 1). */
    double lo = max_a, hi = max_a + max_b / floor_x + 1.0;
    for (int r = 0; r < BISECT_ROUNDS; r++) {
        double mid = lo + (hi - lo) / 2;
        if (mid <= lo || mid >= hi) break;
        if (fill_at(s, sl, n, mid, floor_x, budget, x) > budget)
            lo = mid;
        else
            hi = mid;
    }
    double sum = fill_at(s, sl, n, hi, floor_x, budget, x);
    /* the sum is at or below budget here; scaling up keeps every floor */
    if (sum > 0.0)
        for (int i = 0; i < n; i++)
            if (!sl[i].neutral) x[i] *= budget / sum;
}

/* ---- components ------------------------------------------------------------ */

static int uf_find(int *parent, int a)
{
    while (parent[a] != a) {
        parent[a] = parent[parent[a]];
        a = parent[a];
    }
    return a;
}

static void uf_union(int *parent, int a, int b)
{
    a = uf_find(parent, a);
    b = uf_find(parent, b);
    if (a != b) parent[a < b ? b : a] = a < b ? a : b;
}

/* ---- the run ----------------------------------------------------------------- */

/* Working arrays of one run, released together. */
typedef struct work {
    int *off, *list;      /* device -> entries (groups on it), CSR */
    int *goff, *entry_of; /* group g's shard i is entry entry_of[goff[g] + i] */
    double *entry_x;      /* target fraction of each entry */
    double *cur, *target; /* per group: current effective share and target */
    double *sum_share;    /* per device: sum of the time shares on it */
    double *sum_target;   /* per device: sum of the target shares on it */
    int *parent;          /* per device: union-find of shared devices */
    double *comp_delta;   /* per component root: largest |target - cur| */
    double *comp_gap;     /* per component root: largest gap in effective fractions */
    int *dev_stamp;
    slot *slots;
    double *xs;
    unsigned char *suggested;
} work;

static void work_free(work *w)
{
    free(w->off);
    free(w->list);
    free(w->goff);
    free(w->entry_of);
    free(w->entry_x);
    free(w->cur);
    free(w->target);
    free(w->sum_share);
    free(w->sum_target);
    free(w->parent);
    free(w->comp_delta);
    free(w->comp_gap);
    free(w->dev_stamp);
    free(w->slots);
    free(w->xs);
    free(w->suggested);
}

static void *zalloc(size_t n, size_t size)
{
    return calloc(n ? n : 1, size);
}

/* Targets of the groups on device d (at least two of them). */
static void solve_device(const fb_fair_snapshot *s, const fb_fair_params *p, work *w, int d)
{
    int n = w->off[d + 1] - w->off[d];
    slot *sl = w->slots;
    for (int i = 0; i < n; i++) {
        int e = w->off[d] + i, g = w->list[e];
        const fb_fair_group *G = &s->groups[g];
        double f = G->time_share / w->sum_share[d];
        bool left = false;
        for (int j = 0; j < G->n_jobs; j++)
            if (G->jobs[j].steps_done < G->jobs[j].total_steps) left = true;
        sl[i] = (slot){.group = g,
                       .tenant = G->jobs[0].tenant,
                       .entry = e,
                       .f = f,
                       .neutral = G->isolated_step_s == 0.0 || !left,
                       .iso = G->isolated_step_s,
                       .k = G->step_time_s > 0.0 ? G->step_time_s * f : G->isolated_step_s};
    }
    qsort(sl, (size_t)n, sizeof *sl, cmp_slot);
    double wsum = 0.0;
    for (int i = 0; i < n; i++)
        if (i == 0 || sl[i].tenant != sl[i - 1].tenant) wsum += s->tenants[sl[i].tenant].weight;
    for (int i = 0; i < n;) {
        int k = i;
        while (k < n && sl[k].tenant == sl[i].tenant)
            k++;
        double part = s->tenants[sl[i].tenant].weight / wsum;
        equalize(s, p, sl + i, k - i, part, w->xs + i);
        for (int m = i; m < k; m++)
            w->entry_x[sl[m].entry] = w->xs[m];
        i = k;
    }
}

static int build_lists(const fb_fair_snapshot *s, work *w)
{
    int ND = s->n_devices, NG = s->n_groups;
    int64_t entries = 0;
    for (int g = 0; g < NG; g++)
        entries += s->groups[g].n_shards;
    w->off = zalloc((size_t)ND + 1, sizeof *w->off);
    w->list = zalloc((size_t)entries, sizeof *w->list);
    w->goff = zalloc((size_t)NG + 1, sizeof *w->goff);
    w->entry_of = zalloc((size_t)entries, sizeof *w->entry_of);
    w->entry_x = zalloc((size_t)entries, sizeof *w->entry_x);
    w->cur = zalloc((size_t)NG, sizeof *w->cur);
    w->target = zalloc((size_t)NG, sizeof *w->target);
    w->sum_share = zalloc((size_t)ND, sizeof *w->sum_share);
    w->sum_target = zalloc((size_t)ND, sizeof *w->sum_target);
    w->parent = zalloc((size_t)ND, sizeof *w->parent);
    w->comp_delta = zalloc((size_t)ND, sizeof *w->comp_delta);
    w->comp_gap = zalloc((size_t)ND, sizeof *w->comp_gap);
    w->slots = zalloc((size_t)NG, sizeof *w->slots);
    w->xs = zalloc((size_t)NG, sizeof *w->xs);
    w->suggested = zalloc((size_t)NG, 1);
    int *fill = zalloc((size_t)ND + 1, sizeof *fill);
    if (!w->off || !w->list || !w->goff || !w->entry_of || !w->entry_x || !w->cur || !w->target ||
        !w->sum_share || !w->sum_target || !w->parent || !w->comp_delta || !w->comp_gap ||
        !w->slots || !w->xs || !w->suggested || !fill) {
        free(fill);
        return FB_ERR_NOMEM;
    }
    for (int g = 0; g < NG; g++)
        for (int i = 0; i < s->groups[g].n_shards; i++)
            w->off[s->groups[g].devices[i] + 1]++;
    for (int d = 0; d < ND; d++)
        w->off[d + 1] += w->off[d];
    memcpy(fill, w->off, (size_t)ND * sizeof *fill);
    for (int g = 0; g < NG; g++) {
        const fb_fair_group *G = &s->groups[g];
        w->goff[g + 1] = w->goff[g] + G->n_shards;
        for (int i = 0; i < G->n_shards; i++) {
            int d = G->devices[i];
            w->entry_of[w->goff[g] + i] = fill[d];
            w->list[fill[d]++] = g;
            w->sum_share[d] += G->time_share;
        }
    }
    free(fill);
    for (int d = 0; d < ND; d++)
        w->parent[d] = d;
    return FB_OK;
}

/* Time shares: per-device targets, then per group the smallest, then one
 * damped move per component of devices linked by groups. */
static void decide_shares(const fb_fair_snapshot *s, const fb_fair_params *p, work *w,
                          fb_fair_decision *dec)
{
    int ND = s->n_devices, NG = s->n_groups;
    for (int d = 0; d < ND; d++)
        if (w->off[d + 1] - w->off[d] >= 2) solve_device(s, p, w, d);
    for (int g = 0; g < NG; g++) {
        const fb_fair_group *G = &s->groups[g];
        w->cur[g] = 1.0;
        w->target[g] = 1.0;
        for (int i = 0; i < G->n_shards; i++) {
            int d = G->devices[i];
            uf_union(w->parent, G->devices[0], d);
            if (w->off[d + 1] - w->off[d] < 2) continue;
            double f = G->time_share / w->sum_share[d];
            if (f < w->cur[g]) w->cur[g] = f;
            double x = w->entry_x[w->entry_of[w->goff[g] + i]];
            if (x < w->target[g]) w->target[g] = x;
        }
    }
    for (int g = 0; g < NG; g++) {
        const fb_fair_group *G = &s->groups[g];
        int root = uf_find(w->parent, G->devices[0]);
        double delta = fabs(w->target[g] - w->cur[g]);
        if (delta > w->comp_delta[root]) w->comp_delta[root] = delta;
        for (int i = 0; i < G->n_shards; i++)
            w->sum_target[G->devices[i]] += w->target[g];
    }
    /* The dead band compares what the worker would run: on each shared
     * device, a group's fraction under the target shares (target over the
     * device's sum of targets) against its fraction now.  The targets of a
     * device sum below 1 where one of its groups is held lower by another
     * device; comparing such a target with a fraction would find a gap that
     * writing the target does not close, and the shares would be rewritten
     * every period without changing anything the worker does. */
    for (int g = 0; g < NG; g++) {
        const fb_fair_group *G = &s->groups[g];
        int root = uf_find(w->parent, G->devices[0]);
        for (int i = 0; i < G->n_shards; i++) {
            int d = G->devices[i];
            if (w->off[d + 1] - w->off[d] < 2) continue;
            double gap = fabs(w->target[g] / w->sum_target[d] - G->time_share / w->sum_share[d]);
            if (gap > w->comp_gap[root]) w->comp_gap[root] = gap;
        }
    }
    for (int g = 0; g < NG; g++) {
        const fb_fair_group *G = &s->groups[g];
        int root = uf_find(w->parent, G->devices[0]);
        double delta = w->comp_delta[root], gap = w->comp_gap[root];
        dec[g].target_share = w->target[g];
        dec[g].time_share = G->time_share;
        /* An array alone on all its devices has all their time, whatever share it kept from
         * when it had company (the stride scheduler only weighs shares against each other):
         * its share says so, rather than a figure that no longer means anything. */
        bool alone = true;
        for (int i = 0; i < G->n_shards; i++)
            alone &= w->off[G->devices[i] + 1] - w->off[G->devices[i]] < 2;
        if (alone) {
            if (fabs(1.0 - G->time_share) > CHANGE_EPS) {
                dec[g].time_share = 1.0;
                dec[g].share_changed = true;
            }
            continue;
        }
        if (delta == 0.0 || gap < p->share_hysteresis * (1.0 - 1e-9)) continue;
        /* A move that would stop inside the dead band would stay there short
         * of the target; it stops at the band's edge instead, so the next
         * period finishes the approach without a step above max_share_step
         * (possible only when the band is narrower than that step). */
        double move = delta;
        if (delta > p->max_share_step) {
            move = p->max_share_step;
            if (delta - move < p->share_hysteresis && p->share_hysteresis < p->max_share_step)
                move = delta - p->share_hysteresis;
        }
        double theta = move / delta;
        double next = w->cur[g] + theta * (w->target[g] - w->cur[g]);
        next = clampd(next, FB_FAIR_MIN_VALUE, 1.0);
        /* a difference rounding made is no change worth a message */
        if (fabs(next - G->time_share) <= CHANGE_EPS) continue;
        dec[g].time_share = next;
        dec[g].share_changed = true;
    }
}

/* Counts imbalanced periods per device and suggests migrations. */
static int decide_migrations(const fb_fair_snapshot *s, const fb_fair_params *p, work *w,
                             fb_fair_result *res)
{
    int ND = s->n_devices;
    int min_load[3] = {INT_MAX, INT_MAX, INT_MAX};
    for (int d = 0; d < ND; d++) {
        int load = w->off[d + 1] - w->off[d];
        if (s->devices[d].ready && load < min_load[s->devices[d].kind])
            min_load[s->devices[d].kind] = load;
    }
    int cap = 0;
    for (int d = 0; d < ND; d++) {
        int load = w->off[d + 1] - w->off[d], lo = min_load[s->devices[d].kind];
        bool imbalanced = lo != INT_MAX && load - lo >= p->migrate_gap;
        int prev = s->devices[d].imbalanced_periods;
        res->imbalanced_periods[d] = !imbalanced ? 0 : prev < INT_MAX ? prev + 1 : INT_MAX;
        if (res->imbalanced_periods[d] >= p->migrate_patience) cap++;
    }
    if (cap == 0) return FB_OK;
    res->migrations = malloc((size_t)cap * sizeof *res->migrations);
    if (!res->migrations) return FB_ERR_NOMEM;
    for (int d = 0; d < ND; d++) {
        if (res->imbalanced_periods[d] < p->migrate_patience) continue;
        int best = -1;
        for (int e = w->off[d]; e < w->off[d + 1]; e++) {
            int g = w->list[e];
            if (w->suggested[g]) continue;
            if (best < 0 || res->groups[g].slowdown > res->groups[best].slowdown) best = g;
        }
        if (best < 0) continue;
        w->suggested[best] = 1;
        res->migrations[res->n_migrations++] = (fb_fair_migration){.group = best, .device = d};
        res->imbalanced_periods[d] = 0;
    }
    return FB_OK;
}

int fb_fair_run(const fb_fair_snapshot *s, const fb_fair_params *p, fb_fair_result *out, char *msg,
                size_t msg_cap)
{
    if (!s || !out) return BAD("snapshot or result is NULL");
    fb_fair_params defaults = fb_fair_params_default();
    if (!p) p = &defaults;
    int rc = validate_params(p, msg, msg_cap);
    if (rc) return rc;
    if (s->n_devices < 0 || s->n_tenants < 0 || s->n_groups < 0)
        return BAD("snapshot counts must not be negative (devices %d, tenants %d, groups %d)",
                   s->n_devices, s->n_tenants, s->n_groups);
    if ((s->n_devices > 0 && !s->devices) || (s->n_tenants > 0 && !s->tenants) ||
        (s->n_groups > 0 && !s->groups))
        return BAD("snapshot array missing for a count above 0");

    work w = {0};
    fb_fair_result res = {0};
    w.dev_stamp = zalloc((size_t)s->n_devices, sizeof *w.dev_stamp);
    if (!w.dev_stamp) goto nomem;
    if ((rc = validate(s, w.dev_stamp, msg, msg_cap))) goto fail;
    if (build_lists(s, &w)) goto nomem;

    /* the decisions and every job's slowdown: one block */
    int64_t n_jobs = 0;
    for (int g = 0; g < s->n_groups; g++)
        n_jobs += s->groups[g].n_jobs;
    size_t head = (size_t)s->n_groups * sizeof *res.groups;
    res.groups = malloc(head + (size_t)(n_jobs ? n_jobs : 1) * sizeof(double));
    res.imbalanced_periods = zalloc((size_t)s->n_devices, sizeof *res.imbalanced_periods);
    if (!res.groups || !res.imbalanced_periods) goto nomem;
    memset(res.groups, 0, head);
    res.n_groups = s->n_groups;
    res.n_devices = s->n_devices;
    double *slab = (double *)(void *)((char *)res.groups + head);

    double sum = 0.0;
    for (int g = 0; g < s->n_groups; g++) {
        const fb_fair_group *G = &s->groups[g];
        fb_fair_decision *dec = &res.groups[g];
        dec->job_slowdown = slab;
        slab += G->n_jobs;
        dec->needs_profile = G->isolated_step_s == 0.0;
        for (int j = 0; j < G->n_jobs; j++) {
            double sd = job_slowdown(G, &G->jobs[j]);
            dec->job_slowdown[j] = sd;
            if (j == 0 || sd > dec->slowdown) dec->slowdown = sd;
            if (sd > res.max_slowdown) res.max_slowdown = sd;
            sum += sd;
        }
        decide_split(G, w.off, p, dec);
    }
    if (n_jobs > 0) res.mean_slowdown = sum / (double)n_jobs;
    decide_shares(s, p, &w, res.groups);
    if (decide_migrations(s, p, &w, &res)) goto nomem;
    work_free(&w);
    *out = res;
    return FB_OK;

nomem:
    rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory rebalancing %d groups", s->n_groups);
fail:
    fb_fair_result_free(&res);
    work_free(&w);
    return rc;
}

void fb_fair_result_free(fb_fair_result *r)
{
    if (!r) return;
    free(r->groups); /* the slowdowns live in the same block */
    free(r->imbalanced_periods);
    free(r->migrations);
    memset(r, 0, sizeof *r);
}
