/*
 * The event loop of the simulator and its step-time model (sim.h).
 *
 * Between events every running group advances at a constant rate (steps per
 * second), and every device accumulates busy time at a constant rate, so the
 * state is settled lazily: a group's steps are steps + rate * (now - t_last).
 * Rates change only where something changed, and a group's devices all
 * belong to one worker (the planner places a group on one worker), so the
 * rates are recomputed per dirty worker, never for the whole cluster at once
 * except after a rebalance period.
 *
 * The rates of a worker's groups come from a fixed point.  Each group's
 * shard on a device gets a fraction of it by weighted water-filling over
 * the groups there (weights: time shares); a shard that is not its group's
 * slowest only needs the fraction that keeps pace with the slowest one, and
 * the rest goes to the others on the device, the way the workers' stride
 * scheduler hands a waiting group's turn to the next.  The fractions and the
 * step times depend on each other; a few rounds settle them.
 *
 * Devices on one host slow one another down (sim.h), so a change on one of
 * the host's workers marks all of them dirty, and each recomputation pass
 * first counts the host's busy devices.  Start and end costs are spans in
 * which a group is live but not active (ready_at), the way a migrated group
 * waits to resume: it holds its slots on its devices and uses none of their
 * time.
 */
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

#define FIX_ROUNDS 60
#define FIX_EPS 1e-10

enum { J_WAITING, J_QUEUED, J_RUNNING, J_DONE };

typedef struct devrt {
    int *groups; /* live groups on the device */
    int n, cap;
    double busy;      /* useful device-seconds so far */
    double busy_rate; /* useful fraction of the device now */
    double t_last;
    fb_fair_device_memory fair; /* the fair-share controller's memory, handed back each period */
    double inflation; /* the host's step-time inflation now (1: none) */
} devrt;

typedef struct grp {
    bool live, ready; /* ready: stepping (not in its start, resume or end span) */
    bool ending;      /* its last members stepped their last; it ends at ready_at */
    int key, profile;
    int *members;
    int n_members, cap_members;
    int n_dev;
    int dev[FB_PLAN_MAX_GROUP_DEVICES];
    int64_t split[FB_PLAN_MAX_GROUP_DEVICES];
    double phi[FB_PLAN_MAX_GROUP_DEVICES];        /* fraction of each device it gets */
    bool bneck[FB_PLAN_MAX_GROUP_DEVICES];        /* the shard limits the group's step */
    double shard_rate[FB_PLAN_MAX_GROUP_DEVICES]; /* samples/s while computing */
    double share;
    fb_fair_memory fair; /* the controller's split memory, handed back each period */
    int64_t mem_per_device;
    int64_t start_step, min_total;
    double steps, t_last, rate, step_time, ready_at;
} grp;

typedef struct jobrt {
    int state;
    int group;
    int64_t start_step;
    double placed_at, finish, penalty;
} jobrt;

typedef struct eng {
    const sim_scenario *sc;
    const sim_config *cfg;
    double t;
    devrt *dev;
    int nd;
    grp *g;
    int ng, cap_g;
    int *free_g, n_free;
    jobrt *job;
    int next_arrival;
    int *queue, nq, cap_q;
    int n_workers;
    int *wfirst, *wcount;    /* devices of each worker */
    int *whost;              /* host of each worker, -1: none */
    int *hw_first, *hw_list; /* workers of host h: hw_list[hw_first[h] .. hw_first[h + 1]) */
    int *host_stamp, host_stamp_now;
    unsigned char *dirty;
    int *dirty_list, n_dirty;
    double *profile_table; /* [profile][B][kind]: isolated step time, 0 = not measured */
    int live;
    bool plan_due;
    double plan_at; /* the planner acts no earlier: dispatch_s after the first call */
    double last_plan, next_period;
    int *stamp, stamp_now; /* scratch: groups seen */
    int *wgroups;          /* scratch: a worker's groups */
    sim_result *res;
    char *msg;
    size_t cap;
} eng;

/* ---- small helpers ------------------------------------------------------------------ */

static int push_int(int **a, int *n, int *cap, int v)
{
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 8;
        int *q = realloc(*a, (size_t)c * sizeof *q);
        if (!q) return -1;
        *a = q;
        *cap = c;
    }
    (*a)[(*n)++] = v;
    return 0;
}

static void remove_int(int *a, int *n, int v)
{
    for (int i = 0; i < *n; i++)
        if (a[i] == v) {
            a[i] = a[--*n];
            return;
        }
}

static const sim_profile *prof_of(const eng *e, const grp *G)
{
    return &e->sc->profiles[G->profile];
}

/* Device-seconds (at speed 1) of one step of the whole group. */
static double group_work(const eng *e, const grp *G)
{
    const sim_profile *P = prof_of(e, G);
    return P->step_s * P->data * (1.0 + P->alpha * (G->n_members - 1));
}

static double *profile_slot(eng *e, const grp *G)
{
    int kind = e->sc->devices[G->dev[0]].kind;
    return &e->profile_table[((size_t)G->profile * (size_t)(e->cfg->max_b + 1) +
                              (size_t)G->n_members) *
                                 3 +
                             (size_t)kind];
}

static void mark_one(eng *e, int worker)
{
    if (e->dirty[worker]) return;
    e->dirty[worker] = 1;
    e->dirty_list[e->n_dirty++] = worker;
}

/* A change on a worker changes its host's count of busy devices, and with it
 * every device's speed there: the host's other workers are dirty too. */
static void mark_dirty(eng *e, int worker)
{
    if (e->dirty[worker]) return;
    mark_one(e, worker);
    int h = e->whost[worker];
    if (h < 0) return;
    for (int k = e->hw_first[h]; k < e->hw_first[h + 1]; k++)
        mark_one(e, e->hw_list[k]);
}

static void settle_group(eng *e, grp *G)
{
    G->steps += G->rate * (e->t - G->t_last);
    G->t_last = e->t;
}

static void settle_device(eng *e, int d)
{
    devrt *D = &e->dev[d];
    D->busy += D->busy_rate * (e->t - D->t_last);
    D->t_last = e->t;
}

/* ---- the step-time model ---------------------------------------------------------- */

static int shard_on(const grp *G, int d)
{
    for (int i = 0; i < G->n_dev; i++)
        if (G->dev[i] == d) return i;
    return -1;
}

/* Active groups: live and resumed. */
static bool active(const grp *G)
{
    return G->live && G->ready;
}

/* A device's speed while n_active groups step on it: the host's inflation,
 * then what taking turns costs (more threads than cores, caches refilled),
 * which grows with each group beyond two and is capped so that a crowded
 * device still steps. */
static double capacity(const eng *e, int d, int n_active)
{
    double s = e->sc->devices[d].speed / e->dev[d].inflation;
    if (n_active < 2) return s;
    double loss = e->cfg->switch_overhead + e->cfg->switch_overhead_step * (double)(n_active - 2);
    return s * (1.0 - fmin(loss, 0.9));
}

static int n_active_on(const eng *e, int d)
{
    int n = 0;
    for (int k = 0; k < e->dev[d].n; k++)
        n += active(&e->g[e->dev[d].groups[k]]);
    return n;
}

/* Seconds shard i of G takes for one step at its current fraction. */
static double shard_time(const eng *e, const grp *G, int i, double c)
{
    return group_work(e, G) * (double)G->split[i] / (double)prof_of(e, G)->batch / (c * G->phi[i]);
}

/* The fraction of a device of capacity c that shard i needs to keep pace
 * with a step time tau. */
static double shard_need(const eng *e, const grp *G, int i, double c, double tau)
{
    return group_work(e, G) * (double)G->split[i] / (double)prof_of(e, G)->batch / (c * tau);
}

typedef struct wf {
    int group, shard;
    double w, cap;
} wf;

/*
 * Weighted water-filling of device d among its active groups.  A shard that
 * limits its group's step (bneck) takes what it can get; any other takes at
 * most what keeps pace with its group's step time tau, and the rest goes to
 * the others by weight.  A shard that cannot get that much becomes a
 * limiting one.
 */
static void water_fill(eng *e, int d, const double *tau, wf *items)
{
    devrt *D = &e->dev[d];
    int n = 0;
    double c = capacity(e, d, n_active_on(e, d));
    for (int k = 0; k < D->n; k++) {
        grp *G = &e->g[D->groups[k]];
        if (!active(G)) continue;
        int i = shard_on(G, d);
        double cap = G->bneck[i] ? INFINITY : shard_need(e, G, i, c, tau[D->groups[k]]);
        wf it = {.group = D->groups[k], .shard = i, .w = G->share, .cap = cap};
        /* insertion by cap / weight */
        int j = n++;
        while (j > 0 && items[j - 1].cap / items[j - 1].w > it.cap / it.w) {
            items[j] = items[j - 1];
            j--;
        }
        items[j] = it;
    }
    double remaining = 1.0, wrem = 0.0;
    for (int k = 0; k < n; k++)
        wrem += items[k].w;
    for (int k = 0; k < n; k++) {
        grp *G = &e->g[items[k].group];
        double fair = remaining * items[k].w / wrem;
        if (items[k].cap <= fair) {
            G->phi[items[k].shard] = items[k].cap;
            remaining -= items[k].cap;
            wrem -= items[k].w;
            continue;
        }
        /* the rest are not capped below their part: all get their part */
        for (int m = k; m < n; m++) {
            grp *H = &e->g[items[m].group];
            H->phi[items[m].shard] = remaining * items[m].w / wrem;
            if (!H->bneck[items[m].shard]) H->bneck[items[m].shard] = true;
        }
        return;
    }
}

/* The step time of G from its limiting shards. */
static double limited_step(const eng *e, const grp *G)
{
    double tau = 0.0;
    for (int i = 0; i < G->n_dev; i++) {
        if (!G->bneck[i]) continue;
        int d = G->dev[i];
        double t = shard_time(e, G, i, capacity(e, d, n_active_on(e, d)));
        if (t > tau) tau = t;
    }
    return tau;
}

/* Recomputes the rates of one worker's groups and its devices' busy rates. */
static void recompute_worker(eng *e, int w, double *tau, wf *items)
{
    int first = e->wfirst[w], count = e->wcount[w], ng = 0;
    e->stamp_now++;
    for (int d = first; d < first + count; d++)
        for (int k = 0; k < e->dev[d].n; k++) {
            int gi = e->dev[d].groups[k];
            if (e->stamp[gi] == e->stamp_now) continue;
            e->stamp[gi] = e->stamp_now;
            e->wgroups[ng++] = gi;
        }
    for (int d = first; d < first + count; d++)
        settle_device(e, d);
    for (int k = 0; k < ng; k++)
        settle_group(e, &e->g[e->wgroups[k]]);

    /* start: every shard gets its weighted part of its device, and the
     * slowest shards of each group are its limiting ones */
    for (int k = 0; k < ng; k++) {
        int gi = e->wgroups[k];
        grp *G = &e->g[gi];
        if (!active(G)) continue;
        double t = 0.0, ts[FB_PLAN_MAX_GROUP_DEVICES];
        for (int i = 0; i < G->n_dev; i++) {
            int d = G->dev[i];
            double sum = 0.0, c = capacity(e, d, n_active_on(e, d));
            for (int m = 0; m < e->dev[d].n; m++)
                if (active(&e->g[e->dev[d].groups[m]])) sum += e->g[e->dev[d].groups[m]].share;
            G->phi[i] = G->share / sum;
            /* what a shard computes at while every group there competes: the
             * speed the controller measures and splits by */
            G->shard_rate[i] = (double)prof_of(e, G)->batch * c * G->phi[i] / group_work(e, G);
            ts[i] = shard_time(e, G, i, c);
            if (ts[i] > t) t = ts[i];
        }
        for (int i = 0; i < G->n_dev; i++)
            G->bneck[i] = ts[i] >= t * (1.0 - 1e-9);
        tau[gi] = t;
    }
    /* Limiting shards gain what the others leave, which shortens their
     * groups' steps, which raises what the others need: repeat until the
     * step times stop moving. */
    for (int round = 0; round < FIX_ROUNDS; round++) {
        for (int d = first; d < first + count; d++)
            water_fill(e, d, tau, items);
        double change = 0.0;
        for (int k = 0; k < ng; k++) {
            int gi = e->wgroups[k];
            if (!active(&e->g[gi])) continue;
            double t = limited_step(e, &e->g[gi]);
            double rel = fabs(t - tau[gi]) / tau[gi];
            if (rel > change) change = rel;
            tau[gi] = t;
        }
        if (change < FIX_EPS) break;
    }
    /* the rates, and what each device spends on useful work */
    for (int d = first; d < first + count; d++)
        e->dev[d].busy_rate = 0.0;
    for (int k = 0; k < ng; k++) {
        int gi = e->wgroups[k];
        grp *G = &e->g[gi];
        if (!active(G)) {
            G->rate = 0.0;
            G->step_time = 0.0;
            continue;
        }
        G->step_time = tau[gi];
        G->rate = 1.0 / tau[gi];
        for (int i = 0; i < G->n_dev; i++) {
            int d = G->dev[i];
            double c = capacity(e, d, n_active_on(e, d));
            double used = shard_need(e, G, i, c, tau[gi]);
            e->dev[d].busy_rate += used * c / e->sc->devices[d].speed;
        }
    }
}

/* g(k) of sim.h: how much slower each of a host's k busy devices steps. */
static double host_inflation(const sim_host *H, int k)
{
    if (k <= 1) return 1.0;
    int m = k < H->cores ? k : H->cores;
    double g = 1.0 + H->interference * (double)(m - 1);
    if (k > H->cores) g *= (double)k / (double)H->cores;
    return g;
}

/* Sets the inflation of every device on host h from its busy devices now. */
static void update_host(eng *e, int h)
{
    int busy = 0;
    for (int k = e->hw_first[h]; k < e->hw_first[h + 1]; k++) {
        int w = e->hw_list[k];
        for (int d = e->wfirst[w]; d < e->wfirst[w] + e->wcount[w]; d++)
            busy += n_active_on(e, d) > 0;
    }
    double g = host_inflation(&e->sc->hosts[h], busy);
    for (int k = e->hw_first[h]; k < e->hw_first[h + 1]; k++) {
        int w = e->hw_list[k];
        for (int d = e->wfirst[w]; d < e->wfirst[w] + e->wcount[w]; d++)
            e->dev[d].inflation = g;
    }
}

static int recompute_dirty(eng *e)
{
    double *tau = malloc((size_t)(e->ng ? e->ng : 1) * sizeof *tau);
    int maxn = 1;
    for (int d = 0; d < e->nd; d++)
        if (e->dev[d].n > maxn) maxn = e->dev[d].n;
    wf *items = malloc((size_t)maxn * sizeof *items);
    if (!tau || !items) {
        free(tau);
        free(items);
        return fb_errf(e->msg, e->cap, FB_ERR_NOMEM, "out of memory");
    }
    /* the hosts first: a worker's rates need its host's busy devices, which
     * the other dirty workers' groups decide as much as its own */
    e->host_stamp_now++;
    for (int i = 0; i < e->n_dirty; i++) {
        int h = e->whost[e->dirty_list[i]];
        if (h < 0 || e->host_stamp[h] == e->host_stamp_now) continue;
        e->host_stamp[h] = e->host_stamp_now;
        update_host(e, h);
    }
    for (int i = 0; i < e->n_dirty; i++) {
        recompute_worker(e, e->dirty_list[i], tau, items);
        e->dirty[e->dirty_list[i]] = 0;
    }
    e->n_dirty = 0;
    free(tau);
    free(items);
    return 0;
}

/* ---- groups ------------------------------------------------------------------------- */

static int new_group(eng *e)
{
    if (e->n_free > 0) return e->free_g[--e->n_free];
    if (e->ng == e->cap_g) {
        int c = e->cap_g ? e->cap_g * 2 : 64;
        grp *q = realloc(e->g, (size_t)c * sizeof *q);
        if (!q) return -1;
        e->g = q;
        memset(q + e->cap_g, 0, (size_t)(c - e->cap_g) * sizeof *q);
        int *st = realloc(e->stamp, (size_t)c * sizeof *st);
        if (!st) return -1;
        e->stamp = st;
        memset(st + e->cap_g, 0, (size_t)(c - e->cap_g) * sizeof *st);
        int *f = realloc(e->free_g, (size_t)c * sizeof *f);
        if (!f) return -1;
        e->free_g = f;
        e->cap_g = c;
    }
    return e->ng++;
}

static void recompute_min_total(eng *e, grp *G)
{
    G->min_total = INT64_MAX;
    for (int m = 0; m < G->n_members; m++) {
        int64_t t = e->sc->jobs[G->members[m]].steps;
        if (t < G->min_total) G->min_total = t;
    }
}

/* Something calls for the planner (a submission, a group's end); it acts
 * dispatch_s later, together with whatever else calls for it meanwhile. */
static void want_plan(eng *e)
{
    if (!e->plan_due || e->nq == 0) e->plan_at = e->t + e->cfg->dispatch_s;
    e->plan_due = true;
}

static void end_group(eng *e, int gi)
{
    grp *G = &e->g[gi];
    for (int i = 0; i < G->n_dev; i++) {
        remove_int(e->dev[G->dev[i]].groups, &e->dev[G->dev[i]].n, gi);
        mark_dirty(e, e->sc->devices[G->dev[i]].worker);
    }
    G->live = false;
    G->n_members = 0;
    e->free_g[e->n_free++] = gi;
    e->live--;
    want_plan(e);
}

/* Time at which G's next member finishes, or +inf. */
static double completion_time(const grp *G)
{
    if (!G->live || G->rate <= 0.0) return INFINITY;
    double left = (double)(G->min_total - G->start_step) - G->steps;
    return G->t_last + (left > 0.0 ? left : 0.0) / G->rate;
}

/* Whether member m of G has stepped its last. */
static bool member_done(const eng *e, const grp *G, int m)
{
    int j = G->members[m];
    double left = (double)(e->sc->jobs[j].steps - G->start_step) - G->steps;
    return left <= 1e-9 * (double)e->sc->jobs[j].steps;
}

static void finish_members(eng *e, int gi)
{
    grp *G = &e->g[gi];
    settle_group(e, G);
    /* the member that set this event is done whatever rounding says */
    double need = (double)(G->min_total - G->start_step);
    if (G->steps < need) G->steps = need;
    double end_s = prof_of(e, G)->end_s;
    int done = 0;
    for (int m = 0; m < G->n_members; m++)
        done += member_done(e, G, m);
    if (done == G->n_members && end_s > 0.0) {
        /* the last members end with the array: it keeps its slots, idle, until
         * their ends are recorded (fuseboxd places nothing there before) */
        G->ending = true;
        G->ready = false;
        G->ready_at = e->t + end_s;
        mark_dirty(e, e->sc->devices[G->dev[0]].worker);
        return;
    }
    /* members that leave an array which goes on: their own end costs them,
     * not the others */
    for (int m = 0; m < G->n_members;) {
        if (member_done(e, G, m)) {
            int j = G->members[m];
            e->job[j].state = J_DONE;
            e->job[j].finish = e->t + end_s;
            G->members[m] = G->members[--G->n_members];
        } else {
            m++;
        }
    }
    if (G->n_members == 0) {
        end_group(e, gi);
        return;
    }
    recompute_min_total(e, G);
    mark_dirty(e, e->sc->devices[G->dev[0]].worker);
}

/* The end span of an array whose last members stepped their last is over:
 * they are finished, and the array leaves its devices. */
static void end_members(eng *e, int gi)
{
    grp *G = &e->g[gi];
    for (int m = 0; m < G->n_members; m++) {
        int j = G->members[m];
        e->job[j].state = J_DONE;
        e->job[j].finish = e->t;
    }
    end_group(e, gi);
}

/* ---- the planner --------------------------------------------------------------------- */

/* Starts the planner's group P: a new group on its devices with its members taken from the
 * queue (as placed, with any migration's resume cost), ready after the array's start. */
static int start_planned_group(eng *e, const fb_plan_group *P)
{
    const sim_scenario *sc = e->sc;
    int gi = new_group(e);
    if (gi < 0) {
        return fb_errf(e->msg, e->cap, FB_ERR_NOMEM, "out of memory");
    }
    grp *G = &e->g[gi];
    int *members = G->members, cap_members = G->cap_members;
    memset(G, 0, sizeof *G);
    fb_fair_memory_init(&G->fair);
    G->members = members;
    G->cap_members = cap_members;
    const sim_job *J0 = &sc->jobs[e->queue[P->jobs[0]]];
    G->live = true;
    G->key = J0->key;
    G->profile = J0->profile;
    G->n_dev = P->n_devices;
    memcpy(G->dev, P->devices, (size_t)P->n_devices * sizeof *P->devices);
    memcpy(G->split, P->split, (size_t)P->parallel_data * sizeof *P->split);
    G->share = P->time_share;
    G->mem_per_device = P->mem_per_device;
    G->start_step = e->job[e->queue[P->jobs[0]]].start_step;
    G->t_last = e->t;
    double penalty = 0.0;
    for (int m = 0; m < P->n_jobs; m++) {
        int j = e->queue[P->jobs[m]];
        if (push_int(&G->members, &G->n_members, &G->cap_members, j)) {
            return fb_errf(e->msg, e->cap, FB_ERR_NOMEM, "out of memory");
        }
        jobrt *Jr = &e->job[j];
        if (Jr->placed_at < 0) Jr->placed_at = e->t;
        if (Jr->penalty > penalty) penalty = Jr->penalty;
        Jr->penalty = 0.0;
        Jr->state = J_RUNNING;
        Jr->group = gi;
    }
    /* a migrated group's resume cost, then the array's start */
    const sim_profile *Pf = &sc->profiles[G->profile];
    double delay = penalty + Pf->start_s + Pf->start_member_s * (double)(G->n_members - 1);
    G->ready_at = e->t + delay;
    G->ready = delay <= 0.0;
    recompute_min_total(e, G);
    for (int i = 0; i < G->n_dev; i++)
        if (push_int(&e->dev[G->dev[i]].groups, &e->dev[G->dev[i]].n, &e->dev[G->dev[i]].cap,
                     gi)) {
            return fb_errf(e->msg, e->cap, FB_ERR_NOMEM, "out of memory");
        }
    mark_dirty(e, sc->devices[G->dev[0]].worker);
    e->live++;
    return 0;
}

static int run_planner(eng *e)
{
    const sim_scenario *sc = e->sc;
    int nq = e->nq, R = 0, rc = 0;
    e->plan_due = false;
    e->last_plan = e->t;
    if (nq == 0) return 0;
    e->res->n_plans++;
    fb_plan_job *pj = calloc((size_t)nq, sizeof *pj);
    int64_t *batch = calloc((size_t)nq, sizeof *batch);
    fb_plan_tenant *pt = calloc((size_t)sc->n_tenants, sizeof *pt);
    fb_plan_device *pd = calloc((size_t)e->nd, sizeof *pd);
    fb_plan_running *pr = calloc((size_t)(e->live ? e->live : 1), sizeof *pr);
    int *rmap = calloc((size_t)(e->live ? e->live : 1), sizeof *rmap);
    int64_t n_rt = 0;
    for (int gi = 0; gi < e->ng; gi++)
        if (e->g[gi].live) n_rt += e->g[gi].n_members;
    int *rten = calloc((size_t)(n_rt ? n_rt : 1), sizeof *rten);
    fb_plan_result res = {0};
    if (!pj || !batch || !pt || !pd || !pr || !rmap || !rten) {
        rc = fb_errf(e->msg, e->cap, FB_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int q = 0; q < nq; q++) {
        int j = e->queue[q];
        const sim_job *J = &sc->jobs[j];
        const sim_profile *P = &sc->profiles[J->profile];
        pj[q] = (fb_plan_job){.seq = j,
                              .tenant = J->tenant,
                              .fusion_key = sc->keys[J->key],
                              .start_step = e->job[j].start_step,
                              .priority = J->priority,
                              .mem_member_bytes = P->member_bytes,
                              .mem_shared_bytes = P->shared_bytes,
                              .parallel_data = P->data,
                              .parallel_pipeline = 1,
                              .public_dataset = P->public_dataset,
                              .device_kind = P->kind};
        batch[q] = P->batch;
    }
    for (int t = 0; t < sc->n_tenants; t++)
        pt[t] = (fb_plan_tenant){.weight = sc->tenants[t].weight,
                                 .share_arrays = sc->tenants[t].share_arrays,
                                 .max_devices = sc->tenants[t].max_devices};
    for (int d = 0; d < e->nd; d++) {
        const sim_device *D = &sc->devices[d];
        pd[d] = (fb_plan_device){.worker = D->worker,
                                 .idx = d - e->wfirst[D->worker],
                                 .kind = D->kind,
                                 .memory_bytes = D->memory_bytes,
                                 .ready = true};
    }
    int *tp = rten;
    for (int gi = 0; gi < e->ng; gi++) {
        grp *G = &e->g[gi];
        if (!G->live) continue;
        fb_plan_running *P = &pr[R];
        P->n_devices = G->n_dev;
        memcpy(P->devices, G->dev, (size_t)G->n_dev * sizeof *G->dev);
        P->mem_per_device = G->mem_per_device;
        /* the controller's shares, which the planner scales a new group's share to */
        P->time_share = e->cfg->rebalance ? G->share : 0;
        P->n_tenants = G->n_members;
        P->tenants = tp;
        for (int m = 0; m < G->n_members; m++)
            *tp++ = sc->jobs[G->members[m]].tenant;
        rmap[R++] = gi;
    }
    fb_plan_snapshot snap = {.jobs = pj,
                             .n_jobs = nq,
                             .tenants = pt,
                             .n_tenants = sc->n_tenants,
                             .devices = pd,
                             .n_devices = e->nd,
                             .running = pr,
                             .n_running = R,
                             .max_b = e->cfg->max_b,
                             .max_groups_per_device = e->cfg->max_groups_per_device,
                             /* as in fuseboxd: with rebalancing on, the controller owns
                              * running groups' shares */
                             .keep_running_shares = e->cfg->rebalance};
    char err[256];
    if ((rc = fb_plan_run(&snap, batch, &res, err, sizeof err))) {
        rc = fb_errf(e->msg, e->cap, rc, "the planner refused its snapshot: %s", err);
        goto out;
    }
    for (int i = 0; i < res.n_shares; i++) {
        grp *G = &e->g[rmap[res.shares[i].running]];
        G->share = res.shares[i].time_share;
        mark_dirty(e, sc->devices[G->dev[0]].worker);
    }
    for (int k = 0; k < res.n_groups; k++)
        if ((rc = start_planned_group(e, &res.groups[k]))) goto out;
    /* the queue keeps the jobs still waiting */
    int w = 0;
    for (int q = 0; q < nq; q++)
        if (res.reason[q] != FB_PLAN_PLACED) e->queue[w++] = e->queue[q];
    e->nq = w;
out:
    fb_plan_result_free(&res);
    free(pj);
    free(batch);
    free(pt);
    free(pd);
    free(pr);
    free(rmap);
    free(rten);
    return rc;
}

/* ---- the fair-share controller -------------------------------------------------------- */

/* Checkpoints gi and puts its members back in the queue. */
static int migrate_group(eng *e, int gi)
{
    grp *G = &e->g[gi];
    settle_group(e, G);
    int64_t at = G->start_step + (int64_t)G->steps;
    for (int m = 0; m < G->n_members; m++) {
        int j = G->members[m];
        jobrt *Jr = &e->job[j];
        Jr->state = J_QUEUED;
        Jr->start_step = at;
        Jr->penalty = e->cfg->migrate_cost_s;
        if (push_int(&e->queue, &e->nq, &e->cap_q, j))
            return fb_errf(e->msg, e->cap, FB_ERR_NOMEM, "out of memory");
    }
    end_group(e, gi);
    e->res->n_migrations++;
    return 0;
}

static int rebalance(eng *e)
{
    const sim_scenario *sc = e->sc;
    int rc = 0, n = 0;
    int64_t n_jobs = 0;
    for (int gi = 0; gi < e->ng; gi++)
        if (e->g[gi].live) n_jobs += e->g[gi].n_members;
    fb_fair_device *fd = calloc((size_t)e->nd, sizeof *fd);
    fb_fair_tenant *ft = calloc((size_t)sc->n_tenants, sizeof *ft);
    fb_fair_group *fg = calloc((size_t)(e->live ? e->live : 1), sizeof *fg);
    fb_fair_job *fj = calloc((size_t)(n_jobs ? n_jobs : 1), sizeof *fj);
    int *map = calloc((size_t)(e->live ? e->live : 1), sizeof *map);
    fb_fair_result res = {0};
    if (!fd || !ft || !fg || !fj || !map) {
        rc = fb_errf(e->msg, e->cap, FB_ERR_NOMEM, "out of memory");
        goto out;
    }
    e->res->n_periods++;
    for (int d = 0; d < e->nd; d++) {
        fd[d] = (fb_fair_device){.kind = sc->devices[d].kind, .ready = true};
        fb_fair_device_memory_restore(&e->dev[d].fair, &fd[d]);
    }
    for (int t = 0; t < sc->n_tenants; t++)
        ft[t].weight = sc->tenants[t].weight;
    fb_fair_job *jp = fj;
    for (int gi = 0; gi < e->ng; gi++) {
        grp *G = &e->g[gi];
        if (!G->live) continue;
        settle_group(e, G);
        fb_fair_group *F = &fg[n];
        F->n_shards = G->n_dev;
        memcpy(F->devices, G->dev, (size_t)G->n_dev * sizeof *G->dev);
        memcpy(F->split, G->split, (size_t)G->n_dev * sizeof *G->split);
        if (G->ready) memcpy(F->shard_rate, G->shard_rate, (size_t)G->n_dev * sizeof(double));
        F->time_share = G->share;
        F->step_time_s = G->ready ? G->step_time : 0.0;
        F->isolated_step_s = *profile_slot(e, G);
        F->n_jobs = G->n_members;
        F->jobs = jp;
        fb_fair_memory_restore(&G->fair, F);
        for (int m = 0; m < G->n_members; m++) {
            const sim_job *J = &sc->jobs[G->members[m]];
            int64_t done = G->start_step + (int64_t)G->steps;
            *jp++ = (fb_fair_job){.tenant = J->tenant,
                                  .elapsed_s = e->t - J->at,
                                  .steps_done = done < J->steps ? done : J->steps,
                                  .total_steps = J->steps};
        }
        map[n++] = gi;
    }
    fb_fair_snapshot snap = {.devices = fd,
                             .n_devices = e->nd,
                             .tenants = ft,
                             .n_tenants = sc->n_tenants,
                             .groups = fg,
                             .n_groups = n};
    char err[256];
    if ((rc = fb_fair_run(&snap, &e->cfg->fair, &res, err, sizeof err))) {
        rc = fb_errf(e->msg, e->cap, rc, "the fair-share controller refused its snapshot: %s", err);
        goto out;
    }
    for (int d = 0; d < e->nd; d++)
        fb_fair_device_memory_save(&e->dev[d].fair, &res, d);
    for (int k = 0; k < n; k++) {
        grp *G = &e->g[map[k]];
        const fb_fair_decision *D = &res.groups[k];
        int w = sc->devices[G->dev[0]].worker;
        fb_fair_memory_save(&G->fair, D);
        if (D->split_changed) {
            memcpy(G->split, D->split, (size_t)G->n_dev * sizeof *G->split);
            e->res->n_split_changes++;
            mark_dirty(e, w);
        }
        if (D->share_changed) {
            G->share = D->time_share;
            e->res->n_share_changes++;
            mark_dirty(e, w);
        }
        double *slot = profile_slot(e, G);
        if (D->needs_profile && *slot == 0.0) {
            /* Its step alone on its devices (no sharing, no switching) with the
             * split the controller reaches there: in proportion to the devices'
             * speeds.  Not the split it has now, which this very period may have
             * skewed toward its less shared devices: measured with that, the
             * profile came out up to 1.5 times the true one (paper-3gpus's
             * DenseNet), and the controller, taking the group for less slowed
             * than it was, gave it less time.  fuseboxd's profile converges to
             * this value: it measures arrays that run alone and takes a faster
             * sample half-way at once. */
            double speed = 0.0;
            for (int i = 0; i < G->n_dev; i++)
                speed += sc->devices[G->dev[i]].speed;
            double t = group_work(e, G) / speed;
            /* fuseboxd's controller acts on the profile it stored, which was
             * measured once, maybe while the host was busier or quieter */
            const sim_profile *P = prof_of(e, G);
            if (P->isolated_s > 0.0) t *= P->isolated_s / P->step_s;
            *slot = t;
            e->res->n_profiles++;
        }
    }
    /* a group in its end span has nothing left to move */
    if (e->cfg->migrate)
        for (int m = 0; m < res.n_migrations; m++)
            if (!e->g[map[res.migrations[m].group]].ending &&
                (rc = migrate_group(e, map[res.migrations[m].group])))
                goto out;
out:
    fb_fair_result_free(&res);
    free(fd);
    free(ft);
    free(fg);
    free(fj);
    free(map);
    return rc;
}

/* ---- the loop ------------------------------------------------------------------------- */

static int eng_init(eng *e, const sim_scenario *sc, const sim_config *cfg, sim_result *res,
                    char *msg, size_t msg_cap)
{
    e->sc = sc;
    e->cfg = cfg;
    e->res = res;
    e->msg = msg;
    e->cap = msg_cap;
    e->nd = sc->n_devices;
    e->n_workers = sc->devices[sc->n_devices - 1].worker + 1;
    e->dev = calloc((size_t)e->nd, sizeof *e->dev);
    e->job = calloc((size_t)sc->n_jobs, sizeof *e->job);
    e->wfirst = calloc((size_t)e->n_workers, sizeof *e->wfirst);
    e->wcount = calloc((size_t)e->n_workers, sizeof *e->wcount);
    e->dirty = calloc((size_t)e->n_workers, 1);
    e->dirty_list = calloc((size_t)e->n_workers, sizeof *e->dirty_list);
    e->whost = malloc((size_t)e->n_workers * sizeof *e->whost);
    e->hw_first = calloc((size_t)sc->n_hosts + 1, sizeof *e->hw_first);
    e->hw_list = malloc((size_t)e->n_workers * sizeof *e->hw_list);
    e->host_stamp = calloc((size_t)sc->n_hosts + 1, sizeof *e->host_stamp);
    e->wgroups = NULL;
    e->profile_table =
        calloc((size_t)sc->n_profiles * (size_t)(cfg->max_b + 1) * 3, sizeof *e->profile_table);
    res->finish = malloc((size_t)sc->n_jobs * sizeof *res->finish);
    res->placed = malloc((size_t)sc->n_jobs * sizeof *res->placed);
    res->slowdown = calloc((size_t)sc->n_jobs, sizeof *res->slowdown);
    if (!e->dev || !e->job || !e->wfirst || !e->wcount || !e->dirty || !e->dirty_list ||
        !e->whost || !e->hw_first || !e->hw_list || !e->host_stamp || !e->profile_table ||
        !res->finish || !res->placed || !res->slowdown)
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    for (int d = sc->n_devices - 1; d >= 0; d--) {
        e->wfirst[sc->devices[d].worker] = d;
        e->wcount[sc->devices[d].worker]++;
        e->dev[d].inflation = 1.0;
    }
    /* each host's workers (a worker's devices all come from one record, so
     * from one host), listed by host */
    for (int w = 0; w < e->n_workers; w++) {
        e->whost[w] = sc->devices[e->wfirst[w]].host;
        if (e->whost[w] >= 0) e->hw_first[e->whost[w] + 1]++;
    }
    for (int h = 0; h < sc->n_hosts; h++)
        e->hw_first[h + 1] += e->hw_first[h];
    int *fill = calloc((size_t)sc->n_hosts + 1, sizeof *fill);
    if (!fill) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    for (int w = 0; w < e->n_workers; w++)
        if (e->whost[w] >= 0) e->hw_list[e->hw_first[e->whost[w]] + fill[e->whost[w]]++] = w;
    free(fill);
    for (int j = 0; j < sc->n_jobs; j++) {
        e->job[j] = (jobrt){.state = J_WAITING, .group = -1, .placed_at = -1.0, .finish = -1.0};
        res->finish[j] = -1.0;
        res->placed[j] = -1.0;
    }
    e->last_plan = -INFINITY;
    e->next_period = cfg->period_s;
    return 0;
}

static void eng_free(eng *e)
{
    for (int d = 0; d < e->nd && e->dev; d++)
        free(e->dev[d].groups);
    for (int gi = 0; gi < e->ng; gi++)
        free(e->g[gi].members);
    free(e->dev);
    free(e->g);
    free(e->free_g);
    free(e->job);
    free(e->queue);
    free(e->wfirst);
    free(e->wcount);
    free(e->dirty);
    free(e->dirty_list);
    free(e->whost);
    free(e->hw_first);
    free(e->hw_list);
    free(e->host_stamp);
    free(e->profile_table);
    free(e->stamp);
    free(e->wgroups);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[n]. */
static double pct(const double *v, int n, double p)
{
    int k = (int)ceil(p * n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static int summarize(eng *e)
{
    const sim_scenario *sc = e->sc;
    sim_result *r = e->res;
    int n = sc->n_jobs, done = 0;
    double *jct = malloc((size_t)n * sizeof *jct), *sd = malloc((size_t)n * sizeof *sd);
    if (!jct || !sd) {
        free(jct);
        free(sd);
        return fb_errf(e->msg, e->cap, FB_ERR_NOMEM, "out of memory");
    }
    double first = sc->jobs[0].at, last = first, wait = 0.0, inv = 0.0, inv2 = 0.0;
    for (int j = 0; j < n; j++) {
        const sim_job *J = &sc->jobs[j];
        r->placed[j] = e->job[j].placed_at;
        if (e->job[j].state != J_DONE) continue;
        double f = e->job[j].finish;
        r->finish[j] = f;
        r->slowdown[j] = (f - J->at) / ((double)J->steps * sc->profiles[J->profile].step_s);
        jct[done] = f - J->at;
        sd[done] = r->slowdown[j];
        wait += e->job[j].placed_at - J->at;
        inv += 1.0 / r->slowdown[j];
        inv2 += 1.0 / (r->slowdown[j] * r->slowdown[j]);
        if (f > last) last = f;
        done++;
    }
    r->n_jobs = n;
    r->n_done = done;
    r->makespan_s = last - first;
    if (done > 0) {
        double sj = 0.0, ss = 0.0;
        for (int k = 0; k < done; k++) {
            sj += jct[k];
            ss += sd[k];
        }
        qsort(jct, (size_t)done, sizeof *jct, cmp_double);
        qsort(sd, (size_t)done, sizeof *sd, cmp_double);
        r->jct_mean = sj / done;
        r->jct_p50 = pct(jct, done, 0.5);
        r->jct_p95 = pct(jct, done, 0.95);
        r->jct_max = jct[done - 1];
        r->slow_mean = ss / done;
        r->slow_p95 = pct(sd, done, 0.95);
        r->slow_max = sd[done - 1];
        r->wait_mean = wait / done;
        r->jain = inv * inv / (done * inv2);
    }
    double busy = 0.0;
    for (int d = 0; d < e->nd; d++)
        busy += e->dev[d].busy;
    r->utilization = r->makespan_s > 0.0 ? busy / (e->nd * r->makespan_s) : 0.0;
    free(jct);
    free(sd);
    return 0;
}

int sim_run(const sim_scenario *sc, const sim_config *cfg, sim_result *out, char *msg,
            size_t msg_cap)
{
    if (!sc || !cfg || !out || !sc->finished || sc->n_devices < 1 || sc->n_jobs < 1)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "sim_run needs a finished scenario with devices and jobs");
    sim_result res = {0};
    eng E = {0}, *e = &E;
    int rc = eng_init(e, sc, cfg, &res, msg, msg_cap);
    if (rc) goto fail;
    e->wgroups = malloc((size_t)(sc->n_jobs + 1) * sizeof *e->wgroups);
    if (!e->wgroups) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (;;) {
        /* the next event */
        double t_next = INFINITY;
        if (e->next_arrival < sc->n_jobs) t_next = sc->jobs[e->next_arrival].at;
        for (int gi = 0; gi < e->ng; gi++) {
            const grp *G = &e->g[gi];
            if (!G->live) continue;
            double tc = G->ready ? completion_time(G) : G->ready_at;
            if (tc < t_next) t_next = tc;
        }
        if (e->plan_due && e->nq > 0) {
            double tp = e->last_plan + cfg->plan_gap_s;
            if (tp < e->plan_at) tp = e->plan_at;
            if (tp < e->t) tp = e->t;
            if (tp < t_next) t_next = tp;
        }
        if (cfg->rebalance && e->live > 0) {
            if (e->next_period <= e->t) e->next_period = e->t + cfg->period_s;
            if (e->next_period < t_next) t_next = e->next_period;
        }
        if (t_next == INFINITY) break;
        if (t_next > e->t) e->t = t_next;

        /* members that finish, groups that resume */
        for (int gi = 0; gi < e->ng; gi++) {
            grp *G = &e->g[gi];
            if (!G->live) continue;
            if (!G->ready) {
                if (G->ready_at <= e->t && G->ending) {
                    end_members(e, gi);
                } else if (G->ready_at <= e->t) {
                    settle_group(e, G);
                    G->ready = true;
                    mark_dirty(e, sc->devices[G->dev[0]].worker);
                }
                continue;
            }
            if (completion_time(G) <= e->t) finish_members(e, gi);
        }
        /* submissions */
        while (e->next_arrival < sc->n_jobs && sc->jobs[e->next_arrival].at <= e->t) {
            int j = e->next_arrival++;
            e->job[j].state = J_QUEUED;
            want_plan(e);
            if (push_int(&e->queue, &e->nq, &e->cap_q, j)) {
                rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
                goto fail;
            }
        }
        if ((rc = recompute_dirty(e))) goto fail;
        if (e->plan_due && e->nq > 0 && e->t >= e->last_plan + cfg->plan_gap_s &&
            e->t >= e->plan_at) {
            if ((rc = run_planner(e))) goto fail;
            if ((rc = recompute_dirty(e))) goto fail;
        }
        if (cfg->rebalance && e->live > 0 && e->t >= e->next_period) {
            e->next_period += cfg->period_s;
            if ((rc = rebalance(e))) goto fail;
            if ((rc = recompute_dirty(e))) goto fail;
        }
    }
    for (int d = 0; d < e->nd; d++)
        settle_device(e, d);
    if ((rc = summarize(e))) goto fail;
    eng_free(e);
    *out = res;
    return 0;
fail:
    eng_free(e);
    sim_result_free(&res);
    return rc;
}

void sim_result_free(sim_result *r)
{
    if (!r) return;
    free(r->finish);
    free(r->placed);
    free(r->slowdown);
    memset(r, 0, sizeof *r);
}
