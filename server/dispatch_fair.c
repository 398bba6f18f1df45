/*
 * The control loop's fair-share adapter: every --rebalance-ms a period
 * reads the running groups (devices, splits and shares from the groups
 * table, smoothed step times and device speeds from the reports, isolated
 * step times from the profiles, members' progress) into the controller's
 * snapshot (fairshare.h), runs the policy, and applies its decisions: new
 * shares and splits written to the groups table and sent as REBALANCE,
 * migrations started, gauges published.  The controller owns the shares of
 * running groups; the planner only sets a new group's first one.
 */
#include "dispatch_impl.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "db.h"
#include "fairshare.h"
#include "log.h"
#include "metrics.h"
#include "planner.h"
#include "wire.h"

/* A decision of the controller ($2 share, $3 split); the generation ($4) guards against a
 * group re-assigned since the snapshot. */
static const char sql_fair_apply[] =
    "UPDATE groups SET time_share = $2::float8, split = CASE WHEN"
    " cardinality(split) = cardinality($3::bigint[]) THEN $3::bigint[] ELSE split END,"
    " updated_at = now() WHERE id = $1::uuid AND generation = $4::bigint"
    " AND state <> 'finished'";

/* The tenants' weights, for the period's snapshot. */
static const char sql_fair_tenants[] = "SELECT id::text, weight FROM tenants";

/* The unfinished groups with their devices, splits, shares and isolated step times, for the
 * snapshot. */
static const char sql_fair_groups[] =
    "SELECT g.id, w.name, g.device_idx::text, g.split::text, g.time_share,"
    " g.parallel_data, g.parallel_pipeline, coalesce(p.isolated_step_ms, 0)"
    " FROM groups g JOIN workers w ON w.id = g.worker_id"
    " LEFT JOIN profiles p ON p.fusion_key = g.fusion_key"
    "  AND p.n_models = g.n_members AND p.device_kind = w.backend"
    " WHERE g.state <> 'finished' ORDER BY g.id";

/* The members in group order; a group's first is a member of the tenant it is charged to
 * (tenant_ids[1], as the planner charges it); elapsed since submission on the loop's clock
 * ($1, fb_db_clock_now). */
static const char sql_fair_jobs[] =
    "SELECT j.group_id, j.id, j.tenant_id::text,"
    " extract(epoch FROM coalesce(to_timestamp($1::float8), now()) - j.created_at),"
    " LEAST(j.step, j.steps), j.steps"
    " FROM jobs j JOIN groups g ON g.id = j.group_id"
    " WHERE j.in_group AND g.state <> 'finished' AND j.steps >= 1"
    " ORDER BY j.group_id, (j.tenant_id = g.tenant_ids[1]) DESC, j.seq";

/* A measured time in seconds as the policy accepts it: 0 (unknown) or within its bounds. */
static double fair_seconds(double ms)
{
    double x = ms / 1000.0;
    return isfinite(x) && x >= FB_FAIR_MIN_VALUE && x <= FB_FAIR_MAX_VALUE ? x : 0.0;
}

typedef struct fair_ctx {
    PGresult *tenants, *groups, *jobs;
    char **tenant_ids; /* sorted, pointing into tenants */
    fb_fair_tenant *ft;
    fb_fair_device *fd;
    int *dev_worker, *dev_idx;
    fb_fair_group *fg;
    fb_fair_job *fj;
    int *grow;        /* snapshot group -> row of the groups result */
    int *jfirst;      /* snapshot group -> its first row of the jobs result */
} fair_ctx;

static void fair_ctx_free(fair_ctx *c)
{
    PQclear(c->tenants);
    PQclear(c->groups);
    PQclear(c->jobs);
    free(c->tenant_ids);
    free(c->ft);
    free(c->fd);
    free(c->dev_worker);
    free(c->dev_idx);
    free(c->fg);
    free(c->fj);
    free(c->grow);
    free(c->jfirst);
}

/* The snapshot device of (worker w, index idx), -1 when unknown. */
static int fair_device(const fair_ctx *c, int nd, int w, int64_t idx)
{
    for (int k = 0; k < nd; k++)
        if (c->dev_worker[k] == w && c->dev_idx[k] == idx) return k;
    return -1;
}

/* Records a decision of the controller and tells the group's worker. */
static void fair_apply(fb_dispatch *d, const fb_fair_group *G, const fb_fair_decision *dec,
                       const char *gid)
{
    group *g = dsp_find_group(d, gid);
    if (!g || !dsp_find_worker(d, g->worker)) return;
    const int64_t *split = dec->split_changed ? dec->split : G->split;
    char share[40], gen[24], split_buf[FB_FAIR_MAX_SHARDS * 24 + 3];
    size_t len = 0;
    split_buf[len++] = '{';
    for (int i = 0; i < G->n_shards; i++)
        len += (size_t)snprintf(split_buf + len, sizeof split_buf - len, "%s%lld", i ? "," : "",
                                (long long)split[i]);
    snprintf(split_buf + len, sizeof split_buf - len, "}");
    snprintf(share, sizeof share, "%.17g", dec->time_share);
    snprintf(gen, sizeof gen, "%lld", (long long)g->generation);
    const char *v[4] = {gid, share, split_buf, gen};
    /* the generation guards against a group re-assigned since the snapshot */
    if (!dsp_exec(d, sql_fair_apply, 4, v))
        return;
    fb_wire_msg m = {.type = FB_WIRE_REBALANCE, .generation = g->generation,
                     .time_share = dec->time_share, .n_split = G->n_shards};
    snprintf(m.group_id, sizeof m.group_id, "%s", gid);
    for (int i = 0; i < G->n_shards && i < FB_WIRE_MAX_DEVICES; i++) m.split[i] = split[i];
    dsp_send(d, g->worker, &m, NULL, NULL, 0);
    fb_log_json(FB_LOG_INFO, "fair share: rebalanced an array",
                json_pack("{s:s, s:f, s:f, s:f, s:b}", "group_id", gid, "slowdown",
                          dec->slowdown, "time_share", dec->time_share, "target_share",
                          dec->target_share, "split_changed", dec->split_changed));
}

/*
 * A suggested migration: every member leaves its array on the server's
 * request with its full training state (DETACH keep_state), which the
 * DETACHED event records as its resume point, so it goes back to the queue
 * without losing a step, and the planner, which prefers the least loaded
 * devices, places it anew.
 */
static void fair_migrate(fb_dispatch *d, fair_ctx *c, const fb_fair_group *G, int sg)
{
    const char *gid = PQgetvalue(c->groups, c->grow[sg], 0);
    group *g = dsp_find_group(d, gid);
    if (!g || !dsp_find_worker(d, g->worker)) return;
    for (int k = 0; k < G->n_jobs; k++) {
        const char *job = PQgetvalue(c->jobs, c->jfirst[sg] + k, 1);
        /* with its full state: it resumes elsewhere from the step it left at */
        dsp_send_detach(d, g->worker, g->id, g->generation, job, "migrated", true);
        dsp_detach_recent(d, job, fb_clock_ms());
    }
    fb_log_json(FB_LOG_INFO, "fair share: migrating an array off an imbalanced device",
                json_pack("{s:s, s:s, s:i}", "group_id", gid, "worker", g->worker, "members",
                          G->n_jobs));
    fb_metrics_fair_migrated();
}

/*
 * The period's groups and their members, from the rows of c->groups and c->jobs (nr and nj
 * of them) and the loop's memory of each group, into c->fg and c->fj; rows the policy
 * would refuse are left out, not the period.  Returns how many groups.
 */
static int fair_snapshot_groups(fb_dispatch *d, fair_ctx *c, int nt, int nd, int nr, int nj)
{
    int ng = 0, jrow = 0, nfj = 0;
    for (int i = 0; i < nr; i++) {
        const char *gid = PQgetvalue(c->groups, i, 0);
        while (jrow < nj && strcmp(PQgetvalue(c->jobs, jrow, 0), gid) < 0) jrow++;
        int j0 = jrow;
        while (jrow < nj && strcmp(PQgetvalue(c->jobs, jrow, 0), gid) == 0) jrow++;
        worker *w = dsp_find_worker(d, PQgetvalue(c->groups, i, 1));
        group *mem = dsp_find_group(d, gid);
        if (!w || !mem || jrow == j0) continue;
        int widx = (int)(w - d->workers);
        fb_fair_group *G = &c->fg[ng];
        memset(G, 0, sizeof *G);
        int64_t dev[FB_PLAN_MAX_GROUP_DEVICES], split[FB_FAIR_MAX_SHARDS];
        int n_dev = dsp_parse_ints(PQgetvalue(c->groups, i, 2), dev, FB_PLAN_MAX_GROUP_DEVICES);
        int n_split = dsp_parse_ints(PQgetvalue(c->groups, i, 3), split, FB_FAIR_MAX_SHARDS);
        int D = (int)strtol(PQgetvalue(c->groups, i, 5), NULL, 10);
        int P = (int)strtol(PQgetvalue(c->groups, i, 6), NULL, 10);
        /* a group that spans workers: rank s is the device of the worker holding it, and
         * its rate is kept by rank */
        int sw[FB_FAIR_MAX_SHARDS];
        if (mem->span) {
            n_dev = 0;
            for (int k = 0; k < mem->span->n; k++) {
                const span_member *sm = &mem->span->m[k];
                worker *ws = dsp_find_worker(d, sm->worker);
                for (int r = 0; r < sm->n_ranks && n_dev < FB_PLAN_MAX_GROUP_DEVICES; r++) {
                    sw[n_dev] = ws ? (int)(ws - d->workers) : -1;
                    dev[n_dev++] = sm->dev[r];
                }
            }
            if (P != 1 || D > FB_FAIR_MAX_SHARDS) continue;
        }
        if (D < 1 || P < 1 || D > FB_FAIR_MAX_SHARDS || n_split != D || n_dev != D * P) continue;
        bool ok = true;
        int64_t batch = 0;
        for (int s = 0; s < D && ok; s++) {
            /* a shard is where its first pipeline stage runs (devices are data-major) */
            G->devices[s] = fair_device(c, nd, mem->span ? sw[s] : widx, dev[s * P]);
            G->split[s] = split[s];
            batch += split[s] > 0 ? split[s] : 0;
            ok = G->devices[s] >= 0 && split[s] >= 1 && batch <= FB_FAIR_MAX_BATCH;
        }
        double share = strtod(PQgetvalue(c->groups, i, 4), NULL);
        if (!ok || !(share > 0 && share <= 1)) continue;
        G->n_shards = D;
        G->time_share = share;
        /* its memory, unless kept while it had another shape (fb_fair_memory_restore) */
        fb_fair_memory_restore(&mem->fair, G);
        /* a shard is as fast as the slowest of its stages, and unknown (0) until each of them
         * has been measured; the policy then leaves the split alone */
        for (int s = 0; s < D; s++) {
            double rate = 0;
            for (int p = 0; p < P; p++) {
                int64_t k = mem->span ? s : dev[s * P + p];
                double x = k >= 0 && k < FB_WIRE_MAX_DEVICES ? mem->dev_rate[k] : 0;
                if (!(x > 0)) {
                    rate = 0;
                    break;
                }
                if (p == 0 || x < rate) rate = x;
            }
            G->shard_rate[s] = rate >= FB_FAIR_MIN_VALUE && rate <= FB_FAIR_MAX_VALUE ? rate : 0;
        }
        G->step_time_s = fair_seconds(mem->step_ms);
        double iso = strtod(PQgetvalue(c->groups, i, 7), NULL);
        G->isolated_step_s = fair_seconds(iso > 0 ? iso : mem->busy_ms);
        int n_in = 0;
        for (int r = j0; r < jrow; r++) {
            int t = dsp_tenant_index(c->tenant_ids, nt, PQgetvalue(c->jobs, r, 2));
            int64_t total = strtoll(PQgetvalue(c->jobs, r, 5), NULL, 10);
            int64_t done = strtoll(PQgetvalue(c->jobs, r, 4), NULL, 10);
            double el = strtod(PQgetvalue(c->jobs, r, 3), NULL);
            /* a member the policy could not take makes the whole group's rows unusable
             * (the job rows must stay contiguous with jfirst) */
            if (t < 0 || total < 1 || total > FB_FAIR_MAX_STEPS || done < 0) {
                ok = false;
                break;
            }
            c->fj[nfj + n_in++] = (fb_fair_job){
                .tenant = t,
                .elapsed_s = isfinite(el) && el > 0 ? fmin(el, FB_FAIR_MAX_VALUE) : 0,
                .steps_done = done,
                .total_steps = total};
        }
        if (!ok) continue;
        G->n_jobs = n_in;
        G->jobs = &c->fj[nfj];
        c->jfirst[ng] = j0;
        c->grow[ng++] = i;
        nfj += n_in;
    }
    return ng;
}

/* The period's decisions for its ng groups: each group's memory kept, its gauges
 * published, and a changed share or split written and sent (fair_apply).  Returns how
 * many changed. */
static int fair_publish(fb_dispatch *d, const fair_ctx *c, const fb_fair_result *res, int ng)
{
    int n_changed = 0;
    for (int g = 0; g < ng; g++) {
        const fb_fair_decision *dec = &res->groups[g];
        const char *gid = PQgetvalue(c->groups, c->grow[g], 0);
        fb_metrics_fair_group(gid, dec->slowdown,
                              dec->share_changed ? dec->time_share : c->fg[g].time_share);
        group *mem = dsp_find_group(d, gid);
        if (mem) fb_fair_memory_save(&mem->fair, dec);
        for (int k = 0; mem && mem->span && k < mem->span->n; k++) {
            const span_member *sm = &mem->span->m[k];
            for (int x = 0; x < sm->n_ranks; x++) {
                int r = sm->rank_base + x;
                if (!mem->span->has[r]) continue;
                const fb_wire_device_step *e = &mem->span->step[r];
                fb_metrics_fair_device(gid, sm->worker, e->device,
                                       (const double[4]){e->compute_ms / 1e3, e->comm_ms / 1e3,
                                                         e->io_ms / 1e3, e->idle_ms / 1e3},
                                       mem->dev_rate[r]);
            }
        }
        for (int k = 0; mem && !mem->span && k < mem->n_dev; k++) {
            const fb_wire_device_step *e = &mem->dev[k];
            fb_metrics_fair_device(gid, mem->worker, e->device,
                                   (const double[4]){e->compute_ms / 1e3, e->comm_ms / 1e3,
                                                     e->io_ms / 1e3, e->idle_ms / 1e3},
                                   mem->dev_rate[e->device]);
        }
        if (!dec->share_changed && !dec->split_changed) continue;
        fair_apply(d, &c->fg[g], dec, gid);
        n_changed++;
    }
    return n_changed;
}

/*
 * One fair-share period: a snapshot of the running groups (their devices,
 * splits and shares from the groups table, smoothed step times from the
 * reports, isolated step times from the profiles, members' progress), the
 * policy (fairshare.h), and its decisions: new shares and splits written to
 * the groups table and sent as REBALANCE, migrations started, gauges
 * published.  The controller owns the shares of running groups; the planner
 * only sets a new group's first one.
 */
static void rebalance_run(fb_dispatch *d)
{
    d->last_rebalance_ms = fb_clock_ms();
    if (!dsp_db_ok(d)) return;
    fair_ctx c = {0};
    fb_fair_result res = {0};
    c.tenants = dsp_q(d, sql_fair_tenants, 0, NULL);
    c.groups = dsp_q(d, sql_fair_groups, 0, NULL);
    /* members in group order; a group's first is a member of the tenant it is charged to
     * (tenant_ids[1], as the planner charges it) */
    /* elapsed since submission on the loop's clock (fb_db_clock_now) */
    char now_s[32];
    const char *vn[1] = {fb_db_clock_now(now_s, sizeof now_s)};
    c.jobs = dsp_q(d, sql_fair_jobs, 1, vn);
    if (!c.tenants || !c.groups || !c.jobs) goto out;
    int nt = PQntuples(c.tenants), nr = PQntuples(c.groups), nj = PQntuples(c.jobs);
    int nd = 0;
    for (int i = 0; i < d->n_workers; i++) nd += d->workers[i].n_devices;
    c.tenant_ids = calloc((size_t)(nt ? nt : 1), sizeof *c.tenant_ids);
    c.ft = calloc((size_t)(nt ? nt : 1), sizeof *c.ft);
    c.fd = calloc((size_t)(nd ? nd : 1), sizeof *c.fd);
    c.dev_worker = calloc((size_t)(nd ? nd : 1), sizeof *c.dev_worker);
    c.dev_idx = calloc((size_t)(nd ? nd : 1), sizeof *c.dev_idx);
    c.fg = calloc((size_t)(nr ? nr : 1), sizeof *c.fg);
    c.fj = calloc((size_t)(nj ? nj : 1), sizeof *c.fj);
    c.grow = calloc((size_t)(nr ? nr : 1), sizeof *c.grow);
    c.jfirst = calloc((size_t)(nr ? nr : 1), sizeof *c.jfirst);
    if (!c.tenant_ids || !c.ft || !c.fd || !c.dev_worker || !c.dev_idx || !c.fg || !c.fj ||
        !c.grow || !c.jfirst)
        goto out;
    for (int i = 0; i < nt; i++) c.tenant_ids[i] = PQgetvalue(c.tenants, i, 0);
    qsort(c.tenant_ids, (size_t)nt, sizeof *c.tenant_ids, dsp_cmp_str);
    for (int i = 0; i < nt; i++) {
        int k = dsp_tenant_index(c.tenant_ids, nt, PQgetvalue(c.tenants, i, 0));
        double w = strtod(PQgetvalue(c.tenants, i, 1), NULL);
        c.ft[k].weight = isfinite(w) && w > 0 ? w : 1.0;
    }
    nd = 0;
    for (int i = 0; i < d->n_workers; i++)
        for (int k = 0; k < d->workers[i].n_devices; k++) {
            const fb_wire_device *dv = &d->workers[i].devices[k];
            c.fd[nd] = (fb_fair_device){.kind = strcmp(dv->kind, "cuda") == 0 ? FB_PLAN_CUDA
                                                                               : FB_PLAN_CPU,
                                        .ready = !d->workers[i].draining};
            fb_fair_device_memory_restore(&d->workers[i].fair[k], &c.fd[nd]);
            c.dev_worker[nd] = i;
            c.dev_idx[nd++] = dv->idx;
        }
    int ng = fair_snapshot_groups(d, &c, nt, nd, nr, nj);
    fb_fair_snapshot snap = {.devices = c.fd, .n_devices = nd, .tenants = c.ft,
                             .n_tenants = nt, .groups = c.fg, .n_groups = ng};
    char err[256];
    if (fb_fair_run(&snap, &d->fair, &res, err, sizeof err)) {
        fb_log_json(FB_LOG_ERROR, "the fair-share controller refused its snapshot",
                    json_pack("{s:s}", "error", err));
        goto out;
    }
    /* the snapshot's devices are the workers' in order */
    for (int i = 0, k = 0; i < d->n_workers; i++)
        for (int x = 0; x < d->workers[i].n_devices; x++, k++)
            fb_fair_device_memory_save(&d->workers[i].fair[x], &res, k);
    fb_metrics_fair_begin(res.max_slowdown, res.mean_slowdown);
    int n_changed = fair_publish(d, &c, &res, ng);
    fb_metrics_fair_end(n_changed);
    for (int i = 0; i < res.n_migrations; i++)
        fair_migrate(d, &c, &c.fg[res.migrations[i].group], res.migrations[i].group);
    if (n_changed || res.n_migrations)
        fb_log_json(FB_LOG_INFO, "fair share: period",
                    json_pack("{s:i, s:i, s:i, s:f, s:f}", "groups", ng, "changed", n_changed,
                              "migrations", res.n_migrations, "max_slowdown", res.max_slowdown,
                              "mean_slowdown", res.mean_slowdown));
out:
    fb_fair_result_free(&res);
    fair_ctx_free(&c);
}

/* A fair-share period, timed. */
void dsp_rebalance(fb_dispatch *d)
{
    double t0 = dsp_real_s();
    rebalance_run(d);
    fb_metrics_control(FB_CONTROL_REBALANCE, dsp_real_s() - t0);
}
