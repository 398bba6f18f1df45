/*
 * The planner and scheduler (server/planner.h): fusion rules, memory caps on
 * B, placement and co-location, quotas, queue order and fair share, time
 * shares, positions, refusal of malformed snapshots, the memory estimate,
 * and a randomized run of a few thousand snapshots against invariants that
 * every plan must keep.  Run with the argument "scale" it plans the
 * 10,000-job snapshot of bench/policy and checks the same invariants.
 */
#include "check.h"
#include "jobspec.h"
#include "planner.h"
#include "workload.h"

#include <stdbool.h>
#include <stdint.h>

#define MAXJ 64
#define MAXT 8
#define MAXD 32
#define MAXR 16

/* ---- building snapshots by hand -------------------------------------------- */

typedef struct scn {
    fb_plan_job jobs[MAXJ];
    int64_t batch[MAXJ];
    int nj;
    fb_plan_tenant tenants[MAXT];
    int nt;
    fb_plan_device devices[MAXD];
    int nd, n_workers;
    fb_plan_running running[MAXR];
    int rten[MAXR][4];
    int nr;
    int max_b, max_g;
} scn;

static void scn_init(scn *c)
{
    memset(c, 0, sizeof *c);
    c->max_b = 8;
    c->max_g = 1;
}

static int add_tenant(scn *c, double weight, bool share, int max_devices)
{
    CHECK(c->nt < MAXT);
    c->tenants[c->nt] = (fb_plan_tenant){weight, share, max_devices};
    return c->nt++;
}

/* A worker with n devices of one kind and size; returns its first device. */
static int add_worker(scn *c, int n, int kind, int64_t mem, bool ready)
{
    CHECK(c->nd + n <= MAXD);
    int first = c->nd;
    for (int i = 0; i < n; i++)
        c->devices[c->nd++] = (fb_plan_device){c->n_workers, i, kind, mem, ready, false};
    c->n_workers++;
    return first;
}

/* A worker that can take part in arrays spanning workers; returns its first device. */
static int add_comm_worker(scn *c, int n, int kind, int64_t mem, bool ready)
{
    int first = add_worker(c, n, kind, mem, ready);
    for (int i = first; i < c->nd; i++) c->devices[i].comm = true;
    return first;
}

/* A job with defaults: priority 50, no shared memory, one device, private
 * dataset, any kind, batch 64, seq in order of creation. */
static int add_job(scn *c, int tenant, const char *key, int64_t mem)
{
    CHECK(c->nj < MAXJ);
    c->jobs[c->nj] = (fb_plan_job){.seq = 10 + c->nj,
                                   .tenant = tenant,
                                   .fusion_key = key,
                                   .priority = 50,
                                   .mem_member_bytes = mem,
                                   .parallel_data = 1,
                                   .parallel_pipeline = 1};
    c->batch[c->nj] = 64;
    return c->nj++;
}

/* A running group on n devices starting at first, of one tenant. */
static int add_running(scn *c, int tenant, int first, int n, int64_t mem)
{
    CHECK(c->nr < MAXR && n <= FB_PLAN_MAX_GROUP_DEVICES);
    fb_plan_running *R = &c->running[c->nr];
    memset(R, 0, sizeof *R);
    R->n_devices = n;
    for (int i = 0; i < n; i++) R->devices[i] = first + i;
    R->mem_per_device = mem;
    c->rten[c->nr][0] = tenant;
    R->n_tenants = 1;
    R->tenants = c->rten[c->nr];
    return c->nr++;
}

static fb_plan_snapshot snap_of(scn *c)
{
    return (fb_plan_snapshot){.jobs = c->jobs, .n_jobs = c->nj, .tenants = c->tenants,
                              .n_tenants = c->nt, .devices = c->devices, .n_devices = c->nd,
                              .running = c->running, .n_running = c->nr, .max_b = c->max_b,
                              .max_groups_per_device = c->max_g};
}

/* ---- invariants every plan keeps --------------------------------------------- */

static int64_t ceil_div(int64_t a, int64_t b)
{
    return a / b + (a % b != 0);
}

static int64_t sat_add(int64_t a, int64_t b)
{
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}

static bool compatible(const fb_plan_snapshot *s, const int64_t *batch, int a, int b)
{
    const fb_plan_job *x = &s->jobs[a], *y = &s->jobs[b];
    if (strcmp(x->fusion_key, y->fusion_key) != 0 || x->start_step != y->start_step ||
        batch[a] != batch[b] || x->parallel_data != y->parallel_data ||
        x->parallel_pipeline != y->parallel_pipeline)
        return false;
    if (x->device_kind && y->device_kind && x->device_kind != y->device_kind) return false;
    if (x->tenant == y->tenant) return true;
    return s->tenants[x->tenant].share_arrays && s->tenants[y->tenant].share_arrays &&
           x->public_dataset && y->public_dataset;
}

/* The share a running group had before the plan: its known share, else the
 * formula over the running groups alone, smallest over its devices. */
static double running_share_before(const fb_plan_snapshot *s, int g)
{
    double best = 1.0;
    const fb_plan_running *G = &s->running[g];
    if (G->time_share > 0) return G->time_share;
    for (int i = 0; i < G->n_devices; i++) {
        int d = G->devices[i];
        double wsum = 0.0;
        int same = 0;
        int seen[256];
        int n_seen = 0;
        for (int h = 0; h < s->n_running; h++) {
            const fb_plan_running *H = &s->running[h];
            for (int k = 0; k < H->n_devices; k++) {
                if (H->devices[k] != d) continue;
                int t = H->tenants[0];
                if (t == G->tenants[0]) same++;
                bool dup = false;
                for (int q = 0; q < n_seen; q++) dup = dup || seen[q] == t;
                if (!dup && n_seen < 256) {
                    seen[n_seen++] = t;
                    wsum += s->tenants[t].weight;
                }
            }
        }
        double sh = s->tenants[G->tenants[0]].weight / wsum / same;
        if (sh < best) best = sh;
    }
    return best;
}

static void check_invariants(const fb_plan_snapshot *s, const int64_t *batch,
                             const fb_plan_result *r)
{
    int n = s->n_jobs, nd = s->n_devices;
    int *seen = calloc((size_t)n + 1, sizeof *seen);
    int *dcount = calloc((size_t)nd + 1, sizeof *dcount);
    int *dnew = calloc((size_t)nd + 1, sizeof *dnew);
    int64_t *dused = calloc((size_t)nd + 1, sizeof *dused);
    int64_t *held = calloc((size_t)s->n_tenants + 1, sizeof *held);
    int64_t *held_new = calloc((size_t)s->n_tenants + 1, sizeof *held_new);
    double *dshare = calloc((size_t)nd + 1, sizeof *dshare);
    bool *dmulti = calloc((size_t)nd + 1, sizeof *dmulti);
    double *rshare = calloc((size_t)s->n_running + 1, sizeof *rshare);
    int64_t *pos_seen = calloc((size_t)n + 1, sizeof *pos_seen);
    CHECK(seen && dcount && dnew && dused && held && held_new && dshare && dmulti && rshare &&
          pos_seen);

    for (int g = 0; g < s->n_running; g++) {
        const fb_plan_running *G = &s->running[g];
        for (int i = 0; i < G->n_devices; i++) {
            dcount[G->devices[i]]++;
            dused[G->devices[i]] += G->mem_per_device;
            if (G->n_devices > 1) dmulti[G->devices[i]] = true;
        }
        for (int i = 0; i < G->n_tenants; i++) {
            bool dup = false;
            for (int k = 0; k < i; k++) dup = dup || G->tenants[k] == G->tenants[i];
            if (!dup) held[G->tenants[i]] += G->n_devices;
        }
        rshare[g] = running_share_before(s, g);
    }
    CHECK(r->n_shares >= 0 && r->n_shares <= s->n_running);
    for (int i = 0; i < r->n_shares; i++) {
        int g = r->shares[i].running;
        CHECK(g >= 0 && g < s->n_running);
        for (int k = 0; k < i; k++) CHECK(r->shares[k].running != g);
        CHECK(r->shares[i].time_share > 0.0 && r->shares[i].time_share <= 1.0 + 1e-12);
        CHECK(fabs(r->shares[i].time_share - rshare[g]) > 1e-9);
        rshare[g] = r->shares[i].time_share;
    }

    for (int G = 0; G < r->n_groups; G++) {
        const fb_plan_group *grp = &r->groups[G];
        CHECK(grp->n_jobs >= 1 && grp->n_jobs <= s->max_b);
        int j0 = grp->jobs[0];
        const fb_plan_job *J0 = &s->jobs[j0];
        int kind = 0;
        int64_t members = 0, shared = 0;
        for (int i = 0; i < grp->n_jobs; i++) {
            int j = grp->jobs[i];
            CHECK(j >= 0 && j < n);
            CHECK_INT_EQ(seen[j], 0);
            seen[j] = 1;
            CHECK_INT_EQ(r->reason[j], FB_PLAN_PLACED);
            CHECK_INT_EQ(r->position[j], 0);
            CHECK(compatible(s, batch, j0, j));
            for (int k = 0; k < i; k++) CHECK(compatible(s, batch, grp->jobs[k], j));
            if (s->jobs[j].device_kind) kind = s->jobs[j].device_kind;
            members += s->jobs[j].mem_member_bytes;
            if (s->jobs[j].mem_shared_bytes > shared) shared = s->jobs[j].mem_shared_bytes;
        }
        CHECK_INT_EQ(grp->parallel_data, J0->parallel_data);
        CHECK_INT_EQ(grp->parallel_pipeline, J0->parallel_pipeline);
        CHECK_INT_EQ(grp->n_devices, J0->parallel_data * J0->parallel_pipeline);
        CHECK_INT_EQ(grp->mem_per_device, ceil_div(members + shared, J0->parallel_pipeline));
        int64_t sum = 0;
        for (int i = 0; i < grp->parallel_data; i++) {
            CHECK(grp->split[i] >= 1);
            if (i > 0) CHECK(grp->split[i] <= grp->split[i - 1]);
            CHECK(grp->split[0] - grp->split[i] <= 1);
            sum += grp->split[i];
        }
        CHECK_INT_EQ(sum, batch[j0]);
        CHECK(grp->time_share > 0.0 && grp->time_share <= 1.0 + 1e-12);
        int n_workers = 1;
        for (int i = 1; i < grp->n_devices; i++)
            n_workers +=
                s->devices[grp->devices[i]].worker != s->devices[grp->devices[i - 1]].worker;
        CHECK_INT_EQ(grp->n_workers, n_workers);
        for (int i = 0; i < grp->n_devices; i++) {
            int d = grp->devices[i];
            CHECK(d >= 0 && d < nd);
            if (i > 0) CHECK(d > grp->devices[i - 1]);
            CHECK(s->devices[d].ready);
            if (grp->n_workers == 1) {
                CHECK_INT_EQ(s->devices[d].worker, s->devices[grp->devices[0]].worker);
            } else {
                /* an array that spans workers: data parallel on devices of one kind
                 * (CPU or CUDA) of workers that can take part, each worker's ranks
                 * contiguous */
                CHECK(s->devices[d].comm);
                CHECK_INT_EQ(s->devices[d].kind, s->devices[grp->devices[0]].kind);
                CHECK_INT_EQ(grp->parallel_pipeline, 1);
                for (int k = 0; k < i; k++)
                    if (s->devices[grp->devices[k]].worker == s->devices[d].worker)
                        CHECK_INT_EQ(s->devices[grp->devices[i - 1]].worker, s->devices[d].worker);
            }
            if (kind) CHECK_INT_EQ(s->devices[d].kind, kind);
            dcount[d]++;
            dnew[d]++;
            dused[d] += grp->mem_per_device;
            dshare[d] += grp->time_share;
            if (grp->n_devices > 1) dmulti[d] = true;
        }
        /* each distinct tenant holds the group's devices once */
        for (int i = 0; i < grp->n_jobs; i++) {
            int t = s->jobs[grp->jobs[i]].tenant;
            bool dup = false;
            for (int k = 0; k < i; k++) dup = dup || s->jobs[grp->jobs[k]].tenant == t;
            if (!dup) held_new[t] += grp->n_devices;
        }
    }
    for (int t = 0; t < s->n_tenants; t++)
        if (held_new[t] > 0) CHECK(held[t] + held_new[t] <= s->tenants[t].max_devices);

    int64_t n_wait = 0;
    for (int j = 0; j < n; j++) {
        CHECK(r->reason[j] >= FB_PLAN_PLACED && r->reason[j] < FB_PLAN_REASON_COUNT);
        if (r->reason[j] == FB_PLAN_PLACED) {
            CHECK_INT_EQ(seen[j], 1);
            continue;
        }
        CHECK_INT_EQ(seen[j], 0);
        n_wait++;
        const fb_plan_job *J = &s->jobs[j];
        bool ready_kind = false;
        int64_t biggest = -1;
        for (int d = 0; d < nd; d++) {
            if (J->device_kind && s->devices[d].kind != J->device_kind) continue;
            ready_kind = ready_kind || s->devices[d].ready;
            if (s->devices[d].memory_bytes > biggest) biggest = s->devices[d].memory_bytes;
        }
        bool too_large = batch[j] < J->parallel_data ||
                         (ready_kind && ceil_div(sat_add(J->mem_member_bytes, J->mem_shared_bytes),
                                                 J->parallel_pipeline) > biggest);
        if (r->reason[j] == FB_PLAN_TOO_LARGE) CHECK(too_large);
        if (too_large) CHECK_INT_EQ(r->reason[j], FB_PLAN_TOO_LARGE);
        if (!too_large) CHECK_INT_EQ(r->reason[j] == FB_PLAN_NO_WORKERS, !ready_kind);
    }
    for (int j = 0; j < n; j++) {
        if (r->reason[j] == FB_PLAN_PLACED) continue;
        CHECK(r->position[j] >= 0 && r->position[j] < n_wait);
        CHECK_INT_EQ(pos_seen[r->position[j]], 0);
        pos_seen[r->position[j]] = 1;
    }

    /* devices with a new group: bounds, and shares that add up */
    for (int d = 0; d < nd; d++) {
        if (!dnew[d]) continue;
        CHECK(dcount[d] <= s->max_groups_per_device);
        CHECK(dused[d] <= s->devices[d].memory_bytes);
        for (int g = 0; g < s->n_running; g++)
            for (int i = 0; i < s->running[g].n_devices; i++)
                if (s->running[g].devices[i] == d) dshare[d] += rshare[g];
        CHECK(dshare[d] <= 1.0 + 1e-9);
        /* a group spanning devices takes its smallest share, so only a device
         * whose groups all live there alone adds up to exactly 1 */
        if (!dmulti[d]) CHECK_NEAR(dshare[d], 1.0, 1e-9);
    }
    free(seen);
    free(dcount);
    free(dnew);
    free(dused);
    free(held);
    free(held_new);
    free(dshare);
    free(dmulti);
    free(rshare);
    free(pos_seen);
}

/* Plans the scenario, expects success, and checks the invariants. */
static void plan(scn *c, fb_plan_result *r)
{
    fb_plan_snapshot s = snap_of(c);
    char msg[256] = "";
    int rc = fb_plan_run(&s, c->batch, r, msg, sizeof msg);
    if (rc != FB_OK) fprintf(stderr, "fb_plan_run: %s\n", msg);
    CHECK_INT_EQ(rc, FB_OK);
    check_invariants(&s, c->batch, r);
}

/* The group that holds job j, or -1. */
static int group_of(const fb_plan_result *r, int j)
{
    for (int g = 0; g < r->n_groups; g++)
        for (int i = 0; i < r->groups[g].n_jobs; i++)
            if (r->groups[g].jobs[i] == j) return g;
    return -1;
}

static const char *KA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
static const char *KB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
static const char *KC = "cccccccccccccccccccccccccccccccc";

/* ---- fusion ----------------------------------------------------------------- */

static void test_fusion_by_key(void)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    add_worker(&c, 2, FB_PLAN_CUDA, 1000, true);
    int a0 = add_job(&c, t, KA, 10), b0 = add_job(&c, t, KB, 10);
    int a1 = add_job(&c, t, KA, 10), a2 = add_job(&c, t, KA, 10);
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.n_groups, 2);
    CHECK_INT_EQ(r.groups[0].n_jobs, 3);
    CHECK_INT_EQ(r.groups[0].jobs[0], a0);
    CHECK_INT_EQ(r.groups[0].jobs[1], a1);
    CHECK_INT_EQ(r.groups[0].jobs[2], a2);
    CHECK_INT_EQ(r.groups[1].n_jobs, 1);
    CHECK_INT_EQ(r.groups[1].jobs[0], b0);
    CHECK(r.groups[0].devices[0] != r.groups[1].devices[0]);
    fb_plan_result_free(&r);
}

static void test_start_step_never_fuses(void)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    add_worker(&c, 4, FB_PLAN_CPU, 1000, true);
    int a = add_job(&c, t, KA, 10), b = add_job(&c, t, KA, 10);
    c.jobs[b].start_step = 300;
    int d = add_job(&c, t, KA, 10);
    c.jobs[d].start_step = 300;
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.n_groups, 2);
    CHECK(group_of(&r, a) != group_of(&r, b));
    CHECK_INT_EQ(group_of(&r, b), group_of(&r, d));
    CHECK_INT_EQ(r.groups[group_of(&r, a)].n_jobs, 1);
    fb_plan_result_free(&r);
}

static void test_cross_tenant_fusion(void)
{
    /* {share A, share B, public}: fused only when all three hold */
    static const bool cases[][3] = {{true, true, true},   {true, false, true},
                                    {false, true, true},  {true, true, false},
                                    {false, false, true}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        scn c;
        scn_init(&c);
        int ta = add_tenant(&c, 1, cases[k][0], 100), tb = add_tenant(&c, 1, cases[k][1], 100);
        add_worker(&c, 2, FB_PLAN_CUDA, 1000, true);
        int a = add_job(&c, ta, KA, 10), b = add_job(&c, tb, KA, 10);
        c.jobs[a].public_dataset = c.jobs[b].public_dataset = cases[k][2];
        fb_plan_result r;
        plan(&c, &r);
        bool fused = cases[k][0] && cases[k][1] && cases[k][2];
        CHECK_INT_EQ(r.n_groups, fused ? 1 : 2);
        CHECK_INT_EQ(group_of(&r, a) == group_of(&r, b), fused);
        fb_plan_result_free(&r);
    }
}

static void test_max_b_one_disables_fusion(void)
{
    scn c;
    scn_init(&c);
    c.max_b = 1;
    int t = add_tenant(&c, 1, false, 100);
    add_worker(&c, 3, FB_PLAN_CUDA, 1000, true);
    for (int i = 0; i < 3; i++) add_job(&c, t, KA, 10);
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.n_groups, 3);
    for (int g = 0; g < 3; g++) CHECK_INT_EQ(r.groups[g].n_jobs, 1);
    fb_plan_result_free(&r);

    c.max_b = 2; /* the same queue fuses by twos */
    plan(&c, &r);
    CHECK_INT_EQ(r.n_groups, 2);
    CHECK_INT_EQ(r.groups[0].n_jobs, 2);
    CHECK_INT_EQ(r.groups[1].n_jobs, 1);
    fb_plan_result_free(&r);
}

/* B members of 100 bytes and 50 shared over P stages on a device of mem. */
static int fused_b(int64_t mem, int pipeline)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    add_worker(&c, pipeline, FB_PLAN_CUDA, mem, true);
    for (int i = 0; i < 6; i++) {
        int j = add_job(&c, t, KA, 100);
        c.jobs[j].mem_shared_bytes = 50;
        c.jobs[j].parallel_pipeline = pipeline;
    }
    fb_plan_result r;
    plan(&c, &r);
    CHECK(r.n_groups >= 1);
    int b = r.groups[0].n_jobs;
    CHECK_INT_EQ(r.groups[0].mem_per_device, ceil_div(b * 100 + 50, pipeline));
    fb_plan_result_free(&r);
    return b;
}

static void test_memory_caps_b(void)
{
    CHECK_INT_EQ(fused_b(450, 1), 4); /* 4 * 100 + 50 = 450 fits exactly */
    CHECK_INT_EQ(fused_b(449, 1), 3);
    CHECK_INT_EQ(fused_b(650, 1), 6);
    CHECK_INT_EQ(fused_b(10000, 1), 6); /* max_b 8, only 6 jobs */
    CHECK_INT_EQ(fused_b(225, 2), 4);   /* (4 * 100 + 50) / 2 = 225 */
    CHECK_INT_EQ(fused_b(224, 2), 3);
    CHECK_INT_EQ(fused_b(176, 2), 3); /* ceil(350 / 2) = 175 */
    CHECK_INT_EQ(fused_b(175, 2), 3);
    CHECK_INT_EQ(fused_b(174, 2), 2);

    /* ceil: 101 bytes over 2 stages need 51 per device */
    for (int64_t mem = 50; mem <= 51; mem++) {
        scn c;
        scn_init(&c);
        int t = add_tenant(&c, 1, false, 100);
        add_worker(&c, 2, FB_PLAN_CUDA, mem, true);
        int j = add_job(&c, t, KA, 101);
        c.jobs[j].parallel_pipeline = 2;
        fb_plan_result r;
        plan(&c, &r);
        CHECK_INT_EQ(r.reason[j], mem == 51 ? FB_PLAN_PLACED : FB_PLAN_TOO_LARGE);
        fb_plan_result_free(&r);
    }

    /* the cap follows the largest ready device, not a draining larger one */
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    add_worker(&c, 1, FB_PLAN_CUDA, 10000, false);
    add_worker(&c, 1, FB_PLAN_CUDA, 250, true);
    for (int i = 0; i < 4; i++) add_job(&c, t, KA, 100);
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.n_groups, 1);
    CHECK_INT_EQ(r.groups[0].n_jobs, 2);
    CHECK_INT_EQ(r.reason[2], FB_PLAN_WAIT_DEVICES);
    CHECK_INT_EQ(r.reason[3], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);
}

/* ---- reasons ---------------------------------------------------------------- */

static void test_too_large(void)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    add_worker(&c, 1, FB_PLAN_CPU, 5000, true);
    add_worker(&c, 1, FB_PLAN_CUDA, 1000, true);
    add_worker(&c, 1, FB_PLAN_CUDA, 2000, false);
    int huge = add_job(&c, t, KA, 6000);           /* fits nothing registered */
    int cuda = add_job(&c, t, KB, 3000);           /* fits the CPU device only */
    c.jobs[cuda].device_kind = FB_PLAN_CUDA;
    int wait = add_job(&c, t, KC, 1500);           /* only the draining device holds it */
    c.jobs[wait].device_kind = FB_PLAN_CUDA;
    int split = add_job(&c, t, "dddddddddddddddddddddddddddddddd", 10);
    c.jobs[split].parallel_data = 2;               /* batch 1 over 2 shards */
    c.batch[split] = 1;
    int ok = add_job(&c, t, KA, 500);
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[huge], FB_PLAN_TOO_LARGE);
    CHECK_INT_EQ(r.reason[cuda], FB_PLAN_TOO_LARGE);
    CHECK_INT_EQ(r.reason[wait], FB_PLAN_WAIT_DEVICES);
    CHECK_INT_EQ(r.reason[split], FB_PLAN_TOO_LARGE);
    CHECK_INT_EQ(r.reason[ok], FB_PLAN_PLACED);
    /* the too-large job does not pull its compatible neighbour down with it */
    CHECK_INT_EQ(r.groups[group_of(&r, ok)].n_jobs, 1);
    fb_plan_result_free(&r);
}

static void test_no_workers(void)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    int j = add_job(&c, t, KA, 10);
    fb_plan_result r;
    plan(&c, &r); /* no devices at all */
    CHECK_INT_EQ(r.reason[j], FB_PLAN_NO_WORKERS);
    CHECK_INT_EQ(r.n_groups, 0);
    fb_plan_result_free(&r);

    add_worker(&c, 2, FB_PLAN_CUDA, 1000, false); /* registered, draining */
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_NO_WORKERS);
    fb_plan_result_free(&r);

    add_worker(&c, 1, FB_PLAN_CPU, 1000, true); /* a ready device of the wrong kind */
    c.jobs[j].device_kind = FB_PLAN_CUDA;
    int any = add_job(&c, t, KB, 10);
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_NO_WORKERS);
    CHECK_INT_EQ(r.reason[any], FB_PLAN_PLACED);
    fb_plan_result_free(&r);
    CHECK_STR_EQ(fb_plan_reason_text(FB_PLAN_NO_WORKERS), "waiting for workers");
    CHECK_STR_EQ(fb_plan_reason_text(FB_PLAN_WAIT_DEVICES), "waiting for devices");
    CHECK_STR_EQ(fb_plan_reason_text(FB_PLAN_REASON_COUNT), "unknown");
    CHECK_STR_EQ(fb_plan_reason_text((fb_plan_reason)-1), "unknown");
    for (int k = 0; k < FB_PLAN_REASON_COUNT; k++)
        CHECK(strcmp(fb_plan_reason_text((fb_plan_reason)k), "unknown") != 0);
}

static void test_quota(void)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 2);
    int u = add_tenant(&c, 1, false, 100);
    int first = add_worker(&c, 4, FB_PLAN_CUDA, 1000, true);
    add_running(&c, t, first, 1, 100); /* t holds one device already */
    int a = add_job(&c, t, KA, 10), b = add_job(&c, t, KB, 10), other = add_job(&c, u, KC, 10);
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[a], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.reason[b], FB_PLAN_QUOTA);
    CHECK_INT_EQ(r.reason[other], FB_PLAN_PLACED);
    fb_plan_result_free(&r);

    /* a two-device group never fits a quota of one more device */
    c.jobs[a].parallel_data = 2;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[a], FB_PLAN_QUOTA);
    CHECK_INT_EQ(r.reason[b], FB_PLAN_PLACED);
    fb_plan_result_free(&r);

    /* an array of two of t's jobs holds its device once */
    scn e;
    scn_init(&e);
    int v = add_tenant(&e, 1, false, 2);
    add_worker(&e, 2, FB_PLAN_CUDA, 1000, true);
    int f1 = add_job(&e, v, KA, 10), f2 = add_job(&e, v, KA, 10), g1 = add_job(&e, v, KB, 10);
    plan(&e, &r);
    CHECK_INT_EQ(group_of(&r, f1), group_of(&r, f2));
    CHECK_INT_EQ(r.reason[g1], FB_PLAN_PLACED);
    fb_plan_result_free(&r);

    /* quota 0: nothing ever runs */
    c.tenants[u].max_devices = 0;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[other], FB_PLAN_QUOTA);
    fb_plan_result_free(&r);
}

static void test_quota_in_shared_arrays(void)
{
    /* b's tenant is at its quota: a's array goes ahead without b */
    scn c;
    scn_init(&c);
    int ta = add_tenant(&c, 1, true, 10), tb = add_tenant(&c, 1, true, 1);
    int first = add_worker(&c, 3, FB_PLAN_CUDA, 1000, true);
    add_running(&c, tb, first, 1, 10);
    int a = add_job(&c, ta, KA, 10), b = add_job(&c, tb, KA, 10), a2 = add_job(&c, ta, KA, 10);
    for (int j = 0; j < c.nj; j++) c.jobs[j].public_dataset = true;
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[a], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.reason[a2], FB_PLAN_PLACED);
    CHECK_INT_EQ(group_of(&r, a), group_of(&r, a2));
    CHECK_INT_EQ(r.reason[b], FB_PLAN_QUOTA);
    fb_plan_result_free(&r);

    /* with room in its quota, b joins the same array */
    c.tenants[tb].max_devices = 2;
    plan(&c, &r);
    CHECK_INT_EQ(r.n_groups, 1);
    CHECK_INT_EQ(r.groups[0].n_jobs, 3);
    fb_plan_result_free(&r);
}

/* ---- order ------------------------------------------------------------------ */

static void test_priority_order(void)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    add_worker(&c, 1, FB_PLAN_CUDA, 1000, true);
    int old_low = add_job(&c, t, KA, 10);
    c.jobs[old_low].priority = 10;
    int new_high = add_job(&c, t, KB, 10);
    c.jobs[new_high].priority = 90;
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[new_high], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.reason[old_low], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);

    c.jobs[old_low].priority = 90; /* equal priority: submission order */
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[old_low], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.reason[new_high], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);
}

/* Which of two tenants gets the one free device: A holds held_a devices with
 * weight wa, B holds held_b with weight wb; A's job is older. */
static int fair_winner(int held_a, double wa, int held_b, double wb)
{
    scn c;
    scn_init(&c);
    int ta = add_tenant(&c, wa, false, 100), tb = add_tenant(&c, wb, false, 100);
    int first = add_worker(&c, held_a + held_b + 1, FB_PLAN_CUDA, 1000, true);
    for (int i = 0; i < held_a; i++) add_running(&c, ta, first + i, 1, 10);
    for (int i = 0; i < held_b; i++) add_running(&c, tb, first + held_a + i, 1, 10);
    int a = add_job(&c, ta, KA, 10), b = add_job(&c, tb, KB, 10);
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.n_groups, 1);
    int winner = r.reason[a] == FB_PLAN_PLACED ? 0 : 1;
    CHECK_INT_EQ(r.reason[winner ? a : b], FB_PLAN_WAIT_DEVICES);
    CHECK_INT_EQ(r.position[winner ? a : b], 0);
    fb_plan_result_free(&r);
    return winner;
}

static void test_fair_share_order(void)
{
    CHECK_INT_EQ(fair_winner(0, 1, 0, 1), 0); /* tie: the older job */
    CHECK_INT_EQ(fair_winner(2, 1, 0, 1), 1); /* A holds devices, B none */
    CHECK_INT_EQ(fair_winner(2, 1, 1, 1), 1);
    CHECK_INT_EQ(fair_winner(2, 4, 1, 1), 0); /* weighted: 2/4 < 1/1 */
    CHECK_INT_EQ(fair_winner(2, 2, 1, 1), 0); /* 2/2 = 1/1: the older job */
    CHECK_INT_EQ(fair_winner(3, 2, 1, 1), 1); /* 3/2 > 1/1 */

    /* holdings grow during the plan: three tenants of weight 1, two jobs
     * each, four devices: every tenant gets one before any gets a second */
    scn c;
    scn_init(&c);
    for (int t = 0; t < 3; t++) add_tenant(&c, 1, false, 100);
    add_worker(&c, 4, FB_PLAN_CUDA, 1000, true);
    const char *keys[6] = {KA, KB, KC, "d", "e", "f"};
    for (int i = 0; i < 6; i++) add_job(&c, i / 2, keys[i], 10); /* t0: 0,1  t1: 2,3  t2: 4,5 */
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.n_groups, 4);
    CHECK_INT_EQ(r.groups[0].jobs[0], 0);
    CHECK_INT_EQ(r.groups[1].jobs[0], 2);
    CHECK_INT_EQ(r.groups[2].jobs[0], 4);
    CHECK_INT_EQ(r.groups[3].jobs[0], 1);
    CHECK_INT_EQ(r.reason[3], FB_PLAN_WAIT_DEVICES);
    CHECK_INT_EQ(r.reason[5], FB_PLAN_WAIT_DEVICES);
    /* after the plan t0 holds 2, t1 and t2 one each: t1's job is ahead */
    CHECK_INT_EQ(r.position[3], 0);
    CHECK_INT_EQ(r.position[5], 1);
    fb_plan_result_free(&r);
}

static void test_holdings_from_shared_arrays(void)
{
    /* A's array takes b1 along, so B holds a device from then on although
     * B's own first job (b0) has not moved: C, holding none, goes first */
    scn c;
    scn_init(&c);
    int ta = add_tenant(&c, 1, true, 10), tb = add_tenant(&c, 1, true, 10);
    int tc = add_tenant(&c, 1, false, 10);
    add_worker(&c, 2, FB_PLAN_CUDA, 1000, true);
    int b0 = add_job(&c, tb, KB, 10), cj = add_job(&c, tc, KC, 10);
    int a = add_job(&c, ta, KA, 10), b1 = add_job(&c, tb, KA, 10);
    c.jobs[a].priority = 90;
    c.jobs[a].public_dataset = c.jobs[b1].public_dataset = true;
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(group_of(&r, a), group_of(&r, b1));
    CHECK_INT_EQ(r.reason[cj], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.reason[b0], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);
}

static void test_old_small_group_first(void)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    add_worker(&c, 1, FB_PLAN_CUDA, 1000, true);
    int small = add_job(&c, t, KA, 100);
    int big[4];
    for (int i = 0; i < 4; i++) big[i] = add_job(&c, t, KB, 100);
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.n_groups, 1);
    CHECK_INT_EQ(r.groups[0].n_jobs, 1);
    CHECK_INT_EQ(r.groups[0].jobs[0], small);
    for (int i = 0; i < 4; i++) {
        CHECK_INT_EQ(r.reason[big[i]], FB_PLAN_WAIT_DEVICES);
        CHECK_INT_EQ(r.position[big[i]], i);
    }
    fb_plan_result_free(&r);
}

static void test_unplaced_group_does_not_block(void)
{
    scn c;
    scn_init(&c);
    c.max_g = 2;
    int t = add_tenant(&c, 1, false, 100);
    int first = add_worker(&c, 1, FB_PLAN_CUDA, 1000, true);
    add_worker(&c, 1, FB_PLAN_CUDA, 300, true);
    add_running(&c, t, first, 1, 800);
    int big = add_job(&c, t, KA, 400), small = add_job(&c, t, KB, 250);
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[big], FB_PLAN_WAIT_DEVICES);
    CHECK_INT_EQ(r.reason[small], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.groups[0].devices[0], 1);
    fb_plan_result_free(&r);
}

/* ---- placement ---------------------------------------------------------------- */

static void test_colocation(void)
{
    scn c;
    scn_init(&c);
    c.max_g = 2;
    int t = add_tenant(&c, 1, false, 100);
    add_worker(&c, 1, FB_PLAN_CUDA, 1000, true);
    int a = add_job(&c, t, KA, 300), b = add_job(&c, t, KB, 300), d = add_job(&c, t, KC, 300);
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[a], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.reason[b], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.reason[d], FB_PLAN_WAIT_DEVICES); /* the bound of two groups */
    fb_plan_result_free(&r);

    c.max_g = 3; /* memory is the bound now: 900 of 1000 */
    c.jobs[d].mem_member_bytes = 401;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[d], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);
    c.jobs[d].mem_member_bytes = 400; /* exactly the free memory */
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[d], FB_PLAN_PLACED);
    fb_plan_result_free(&r);

    /* idle devices first, then the fewest groups, then the most free memory */
    scn e;
    scn_init(&e);
    e.max_g = 3;
    int u = add_tenant(&e, 1, false, 100);
    int f0 = add_worker(&e, 3, FB_PLAN_CUDA, 1000, true);
    add_running(&e, u, f0, 1, 100);
    add_running(&e, u, f0 + 1, 1, 500);
    add_running(&e, u, f0 + 1, 1, 100);
    add_running(&e, u, f0 + 2, 1, 300);
    int x = add_job(&e, u, KA, 10), y = add_job(&e, u, KB, 10);
    int z = add_job(&e, u, KC, 10);
    plan(&e, &r);
    CHECK_INT_EQ(r.groups[group_of(&r, x)].devices[0], f0);     /* 1 group, 900 free */
    CHECK_INT_EQ(r.groups[group_of(&r, y)].devices[0], f0 + 2); /* 1 group, 700 free */
    CHECK_INT_EQ(r.groups[group_of(&r, z)].devices[0], f0); /* all at 2: 890 free beats 690, 400 */
    fb_plan_result_free(&r);
}

static void test_multi_device_one_worker(void)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    add_worker(&c, 2, FB_PLAN_CUDA, 1000, true);
    add_worker(&c, 2, FB_PLAN_CUDA, 1000, true);
    int j = add_job(&c, t, KA, 100);
    c.jobs[j].parallel_data = 2;
    c.jobs[j].parallel_pipeline = 2; /* four devices, no worker has them */
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);

    int w2 = add_worker(&c, 5, FB_PLAN_CUDA, 1000, true);
    c.max_g = 2;
    c.jobs[j].parallel_data = 3;
    c.jobs[j].parallel_pipeline = 1;
    c.batch[j] = 10;
    add_running(&c, t, w2 + 1, 1, 50); /* the idle devices win */
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_PLACED);
    const fb_plan_group *g = &r.groups[0];
    CHECK_INT_EQ(g->n_devices, 3);
    CHECK_INT_EQ(g->devices[0], w2);
    CHECK_INT_EQ(g->devices[1], w2 + 2);
    CHECK_INT_EQ(g->devices[2], w2 + 3);
    CHECK_INT_EQ(g->split[0], 4);
    CHECK_INT_EQ(g->split[1], 3);
    CHECK_INT_EQ(g->split[2], 3);
    fb_plan_result_free(&r);

    /* pipeline: memory per device is split over the stages */
    c.jobs[j].parallel_data = 1;
    c.jobs[j].parallel_pipeline = 2;
    c.jobs[j].mem_member_bytes = 1900;
    c.jobs[j].mem_shared_bytes = 99;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.groups[0].mem_per_device, 1000);
    CHECK_INT_EQ(r.groups[0].split[0], 10);
    CHECK_INT_EQ(r.groups[0].devices[0], 0); /* two idle devices on the first worker */
    CHECK_INT_EQ(r.groups[0].devices[1], 1);
    fb_plan_result_free(&r);
}

static void test_device_kinds(void)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    int cpu = add_worker(&c, 1, FB_PLAN_CPU, 1000, true);
    int gpu = add_worker(&c, 1, FB_PLAN_CUDA, 1000, true);
    int any = add_job(&c, t, KA, 10), need_gpu = add_job(&c, t, KA, 10),
        need_cpu = add_job(&c, t, KA, 10), any2 = add_job(&c, t, KA, 10);
    c.jobs[need_gpu].device_kind = FB_PLAN_CUDA;
    c.jobs[need_cpu].device_kind = FB_PLAN_CPU;
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.n_groups, 2);
    CHECK_INT_EQ(group_of(&r, any), group_of(&r, need_gpu));
    CHECK_INT_EQ(group_of(&r, any), group_of(&r, any2)); /* the CPU job is passed over */
    CHECK_INT_EQ(r.groups[group_of(&r, any)].devices[0], gpu);
    CHECK_INT_EQ(r.groups[group_of(&r, need_cpu)].devices[0], cpu);
    fb_plan_result_free(&r);
}


/* ---- arrays that span workers ------------------------------------------------ */

/* The number of distinct workers of group g's devices, checked against n_workers. */
static int workers_of(const scn *c, const fb_plan_group *g)
{
    int n = 0;
    for (int i = 0; i < g->n_devices; i++) {
        bool seen = false;
        for (int k = 0; k < i; k++)
            seen = seen || c->devices[g->devices[k]].worker == c->devices[g->devices[i]].worker;
        n += !seen;
    }
    CHECK_INT_EQ(g->n_workers, n);
    return n;
}

static void test_span_only_when_needed(void)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    int w0 = add_comm_worker(&c, 2, FB_PLAN_CPU, 1000, true);
    int w1 = add_comm_worker(&c, 2, FB_PLAN_CPU, 1000, true);
    int j = add_job(&c, t, KA, 100);
    c.jobs[j].parallel_data = 2;
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_PLACED);
    CHECK_INT_EQ(workers_of(&c, &r.groups[0]), 1); /* one worker can take it: no span */
    fb_plan_result_free(&r);

    c.jobs[j].parallel_data = 3;
    c.batch[j] = 10;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_PLACED);
    const fb_plan_group *g = &r.groups[0];
    CHECK_INT_EQ(workers_of(&c, g), 2);
    CHECK_INT_EQ(g->n_devices, 3);
    CHECK_INT_EQ(g->parallel_data, 3);
    /* worker by worker, the first worker leads with rank 0 */
    CHECK_INT_EQ(g->devices[0], w0);
    CHECK_INT_EQ(g->devices[1], w0 + 1);
    CHECK_INT_EQ(g->devices[2], w1);
    CHECK_INT_EQ(g->split[0] + g->split[1] + g->split[2], 10);
    CHECK_INT_EQ(g->mem_per_device, 100); /* whole replicas */
    fb_plan_result_free(&r);

    /* a worker that reported no comm address takes no part */
    for (int d = w1; d < w1 + 2; d++) c.devices[d].comm = false;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_WAIT_DEVICES);
    CHECK_INT_EQ(r.n_groups, 0);
    fb_plan_result_free(&r);
}

static void test_span_kinds_and_shapes(void)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    int cpu = add_comm_worker(&c, 1, FB_PLAN_CPU, 1000, true);
    int cuda = add_comm_worker(&c, 1, FB_PLAN_CUDA, 1000, true);
    int j = add_job(&c, t, KA, 100);
    c.jobs[j].parallel_data = 2;
    fb_plan_result r;
    plan(&c, &r); /* one CPU and one CUDA device: never mixed */
    CHECK_INT_EQ(r.reason[j], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);

    int cpu2 = add_comm_worker(&c, 1, FB_PLAN_CPU, 1000, true);
    plan(&c, &r); /* any kind: it spans the two CPU workers */
    CHECK_INT_EQ(r.reason[j], FB_PLAN_PLACED);
    CHECK_INT_EQ(workers_of(&c, &r.groups[0]), 2);
    CHECK_INT_EQ(r.groups[0].devices[0], cpu);
    CHECK_INT_EQ(r.groups[0].devices[1], cpu2);
    fb_plan_result_free(&r);

    c.jobs[j].device_kind = FB_PLAN_CPU;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_PLACED);
    fb_plan_result_free(&r);

    /* CUDA arrays span CUDA workers (NCCL across workers), never CPU ones */
    c.jobs[j].device_kind = FB_PLAN_CUDA;
    plan(&c, &r); /* one CUDA device among comm workers: it waits */
    CHECK_INT_EQ(r.reason[j], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);
    int cuda2 = add_comm_worker(&c, 1, FB_PLAN_CUDA, 1000, true);
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_PLACED);
    CHECK_INT_EQ(workers_of(&c, &r.groups[0]), 2);
    CHECK_INT_EQ(r.groups[0].devices[0], cuda);
    CHECK_INT_EQ(r.groups[0].devices[1], cuda2);
    fb_plan_result_free(&r);
    /* any kind takes CPU devices first, CUDA ones when the CPU devices cannot */
    c.jobs[j].device_kind = 0;
    c.devices[cpu2].ready = false;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.groups[0].devices[0], cuda);
    CHECK_INT_EQ(r.groups[0].devices[1], cuda2);
    fb_plan_result_free(&r);
    c.devices[cpu2].ready = true;
    /* three replicas: two CPU and two CUDA devices would do, but kinds never mix */
    c.jobs[j].parallel_data = 3;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);

    /* pipeline stages do not span workers */
    add_comm_worker(&c, 1, FB_PLAN_CPU, 1000, true);
    add_comm_worker(&c, 1, FB_PLAN_CPU, 1000, true);
    c.jobs[j].device_kind = FB_PLAN_CPU;
    c.jobs[j].parallel_data = 2;
    c.jobs[j].parallel_pipeline = 2;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);
    /* nor does a single replica: parallel_data 1 x pipeline 2 */
    c.jobs[j].parallel_data = 1;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);
    /* while D = 4 x P = 1 spans the four CPU workers, after the failure above of the
     * same device count (the remembered failure is per kind of placement) */
    int j2 = add_job(&c, t, KB, 100);
    c.jobs[j].parallel_data = 2;
    c.jobs[j2].parallel_data = 4;
    c.jobs[j2].device_kind = FB_PLAN_CPU;
    c.jobs[j2].seq = 1; /* first in the queue: planned first */
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j2], FB_PLAN_PLACED);
    CHECK_INT_EQ(workers_of(&c, &r.groups[group_of(&r, j2)]), 4);
    fb_plan_result_free(&r);
    c.jobs[j2].seq = 100; /* now after the 2 x 2 job that fails with 4 devices */
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_WAIT_DEVICES);
    CHECK_INT_EQ(r.reason[j2], FB_PLAN_PLACED);
    fb_plan_result_free(&r);
}

/* At most one array that spans workers on a device: two of them sharing devices on two
 * workers could each hold one worker's turn while waiting in a sum for the other. */
static void test_span_one_per_device(void)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    int w0 = add_comm_worker(&c, 1, FB_PLAN_CPU, 1000, true);
    int w1 = add_comm_worker(&c, 1, FB_PLAN_CPU, 1000, true);
    c.max_g = 4;
    /* two spanning jobs of different keys in one plan: the first spans, the second waits */
    int a = add_job(&c, t, KA, 100), b = add_job(&c, t, KB, 100);
    c.jobs[a].parallel_data = c.jobs[b].parallel_data = 2;
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[a], FB_PLAN_PLACED);
    CHECK_INT_EQ(workers_of(&c, &r.groups[group_of(&r, a)]), 2);
    CHECK_INT_EQ(r.reason[b], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);

    /* the same with the first one running: an ordinary job still shares its devices */
    add_running(&c, t, w0, 2, 100);
    CHECK_INT_EQ(w1, w0 + 1);
    c.jobs[a].parallel_data = 1;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[b], FB_PLAN_WAIT_DEVICES);
    CHECK_INT_EQ(r.reason[a], FB_PLAN_PLACED);
    fb_plan_result_free(&r);

    /* a running array on two devices of ONE worker does not span: the job spans beside it */
    scn_init(&c);
    t = add_tenant(&c, 1, false, 100);
    w0 = add_comm_worker(&c, 2, FB_PLAN_CPU, 1000, true);
    add_comm_worker(&c, 1, FB_PLAN_CPU, 1000, true);
    c.max_g = 4;
    add_running(&c, t, w0, 2, 100);
    b = add_job(&c, t, KB, 100);
    c.jobs[b].parallel_data = 3;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[b], FB_PLAN_PLACED);
    CHECK_INT_EQ(workers_of(&c, &r.groups[0]), 2);
    fb_plan_result_free(&r);
}

static void test_span_fewest_workers(void)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    int a = add_comm_worker(&c, 1, FB_PLAN_CPU, 1000, true);
    int b = add_comm_worker(&c, 2, FB_PLAN_CPU, 1000, true);
    int w3 = add_comm_worker(&c, 3, FB_PLAN_CPU, 1000, true);
    int j = add_job(&c, t, KA, 100);
    c.jobs[j].parallel_data = 4;
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_PLACED);
    const fb_plan_group *g = &r.groups[0];
    /* 3 + 1 or 3 + 2 devices: two workers, never all three; the bigger ones */
    CHECK_INT_EQ(workers_of(&c, g), 2);
    for (int i = 0; i < g->n_devices; i++) CHECK(g->devices[i] >= b);
    CHECK_INT_EQ(g->devices[0], b); /* equals in every way: the lowest indices */
    CHECK_INT_EQ(g->devices[3], w3 + 1);
    fb_plan_result_free(&r);

    /* the idle devices win among the chosen workers' devices */
    c.max_g = 2;
    add_running(&c, t, b, 1, 10);
    plan(&c, &r);
    g = &r.groups[0];
    CHECK_INT_EQ(workers_of(&c, g), 2);
    CHECK_INT_EQ(g->devices[0], b + 1);
    CHECK_INT_EQ(g->devices[1], w3);
    fb_plan_result_free(&r);

    /* six devices need all three workers */
    c.jobs[j].parallel_data = 6;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_PLACED);
    CHECK_INT_EQ(workers_of(&c, &r.groups[0]), 3);
    CHECK_INT_EQ(r.groups[0].devices[0], a);
    /* the shared device: the new array's share is below 1 there */
    CHECK(r.groups[0].time_share < 1.0);
    fb_plan_result_free(&r);

    /* and seven cannot be had */
    c.jobs[j].parallel_data = 7;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);
}

static void test_span_memory_quota_draining(void)
{
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 3);
    int w0 = add_comm_worker(&c, 2, FB_PLAN_CPU, 1000, true);
    int w1 = add_comm_worker(&c, 2, FB_PLAN_CPU, 1000, true);
    int j = add_job(&c, t, KA, 600);
    c.jobs[j].parallel_data = 3;
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_PLACED);
    fb_plan_result_free(&r);

    /* quota: four devices for a tenant allowed three */
    c.jobs[j].parallel_data = 4;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_QUOTA);
    fb_plan_result_free(&r);
    c.tenants[t].max_devices = 4;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_PLACED);
    CHECK_INT_EQ(workers_of(&c, &r.groups[0]), 2);
    fb_plan_result_free(&r);

    /* memory: a device with 500 bytes left cannot hold a 600-byte replica */
    c.max_g = 2;
    add_running(&c, t, w1 + 1, 1, 500);
    c.tenants[t].max_devices = 100;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);
    c.jobs[j].parallel_data = 3;
    c.batch[j] = 9;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.groups[0].devices[0], w0);
    CHECK_INT_EQ(r.groups[0].devices[1], w0 + 1);
    CHECK_INT_EQ(r.groups[0].devices[2], w1);
    fb_plan_result_free(&r);

    /* a draining worker takes no part */
    c.devices[w0].ready = c.devices[w0 + 1].ready = false;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);
    int w2 = add_comm_worker(&c, 2, FB_PLAN_CPU, 1000, true);
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.groups[0].devices[0], w1);
    CHECK_INT_EQ(r.groups[0].devices[1], w2);
    CHECK_INT_EQ(r.groups[0].devices[2], w2 + 1);
    fb_plan_result_free(&r);
}

/* ---- time shares ------------------------------------------------------------ */

static void test_shares_follow_weights(void)
{
    scn c;
    scn_init(&c);
    c.max_g = 4;
    int a = add_tenant(&c, 1, false, 100), b = add_tenant(&c, 3, false, 100);
    add_worker(&c, 1, FB_PLAN_CUDA, 1000, true);
    int ja = add_job(&c, a, KA, 10), jb = add_job(&c, b, KB, 10), jb2 = add_job(&c, b, KC, 10);
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.n_groups, 3);
    CHECK_NEAR(r.groups[group_of(&r, ja)].time_share, 0.25, 1e-12);
    CHECK_NEAR(r.groups[group_of(&r, jb)].time_share, 0.375, 1e-12);
    CHECK_NEAR(r.groups[group_of(&r, jb2)].time_share, 0.375, 1e-12);
    CHECK_INT_EQ(r.n_shares, 0);
    fb_plan_result_free(&r);
}

static void test_running_share_changes(void)
{
    scn c;
    scn_init(&c);
    c.max_g = 3;
    int a = add_tenant(&c, 1, false, 100), b = add_tenant(&c, 1, false, 100);
    int d0 = add_worker(&c, 2, FB_PLAN_CUDA, 1000, true);
    int ra = add_running(&c, a, d0, 1, 100);
    int rb = add_running(&c, b, d0, 1, 100);
    add_running(&c, a, d0 + 1, 1, 950); /* 50 free: nothing new lands there */
    int jb = add_job(&c, b, KA, 100);
    fb_plan_result r;
    plan(&c, &r);
    /* a keeps its half; b's half is now split between its two groups */
    CHECK_INT_EQ(r.reason[jb], FB_PLAN_PLACED);
    CHECK_NEAR(r.groups[0].time_share, 0.25, 1e-12);
    CHECK_INT_EQ(r.n_shares, 1);
    CHECK_INT_EQ(r.shares[0].running, rb);
    CHECK_NEAR(r.shares[0].time_share, 0.25, 1e-12);
    (void)ra;
    fb_plan_result_free(&r);

    /* a running group over two devices takes its smaller share */
    scn e;
    scn_init(&e);
    e.max_g = 2;
    int x = add_tenant(&e, 1, false, 100), y = add_tenant(&e, 1, false, 100);
    int f = add_worker(&e, 2, FB_PLAN_CUDA, 1000, true);
    int wide = add_running(&e, x, f, 2, 100);
    add_running(&e, x, f + 1, 1, 100);
    int jy = add_job(&e, y, KA, 100);
    plan(&e, &r);
    CHECK_INT_EQ(r.groups[0].devices[0], f); /* one group there, against two */
    CHECK_NEAR(r.groups[0].time_share, 0.5, 1e-12);
    CHECK_INT_EQ(r.n_shares, 0); /* wide had 0.5 (on f + 1) and keeps it */
    (void)wide;
    (void)jy;
    fb_plan_result_free(&r);
}

/* A running group's known share is corrected when its neighbour has finished, with no new
 * group placed; a known share that already fits the formula is left alone. */
static void test_known_shares_corrected(void)
{
    scn c;
    scn_init(&c);
    c.max_g = 2;
    int a = add_tenant(&c, 1, false, 100), b = add_tenant(&c, 3, false, 100);
    int d0 = add_worker(&c, 2, FB_PLAN_CPU, 1000, true);
    int alone = add_running(&c, a, d0, 1, 100);
    c.running[alone].time_share = 0.5; /* its neighbour has gone */
    int fits = add_running(&c, b, d0 + 1, 1, 100);
    c.running[fits].time_share = 1.0;
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.n_groups, 0);
    CHECK_INT_EQ(r.n_shares, 1);
    CHECK_INT_EQ(r.shares[0].running, alone);
    CHECK_NEAR(r.shares[0].time_share, 1.0, 1e-12);
    fb_plan_result_free(&r);

    /* shares follow the tenants' weights (1 : 3) when both are on one device */
    scn e;
    scn_init(&e);
    e.max_g = 2;
    a = add_tenant(&e, 1, false, 100);
    b = add_tenant(&e, 3, false, 100);
    d0 = add_worker(&e, 1, FB_PLAN_CPU, 1000, true);
    int ga = add_running(&e, a, d0, 1, 100), gb = add_running(&e, b, d0, 1, 100);
    e.running[ga].time_share = 0.5;
    e.running[gb].time_share = 0.5;
    plan(&e, &r);
    CHECK_INT_EQ(r.n_shares, 2);
    for (int i = 0; i < 2; i++)
        CHECK_NEAR(r.shares[i].time_share, r.shares[i].running == ga ? 0.25 : 0.75, 1e-12);
    fb_plan_result_free(&r);

    /* out of range is refused */
    e.running[ga].time_share = 1.5;
    fb_plan_snapshot s = snap_of(&e);
    char msg[256];
    CHECK_INT_EQ(fb_plan_run(&s, e.batch, &r, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK(strstr(msg, "time_share") != NULL);
}

/* With keep_running_shares the running groups' shares are the fair-share
 * controller's: none is changed, and a new group's share is scaled so that
 * it stands to the running groups' known shares as the formula says. */
static void test_keep_running_shares(void)
{
    scn c;
    scn_init(&c);
    c.max_g = 3;
    int a = add_tenant(&c, 1, false, 100), b = add_tenant(&c, 1, false, 100);
    int d0 = add_worker(&c, 2, FB_PLAN_CPU, 1000, true);
    /* the controller gave a 0.8 and b 0.2 of d0; the formula would give 0.5 each */
    int ga = add_running(&c, a, d0, 1, 100), gb = add_running(&c, b, d0, 1, 100);
    c.running[ga].time_share = 0.8;
    c.running[gb].time_share = 0.2;
    add_running(&c, a, d0 + 1, 1, 950); /* full: the new group goes to d0 */
    int jb = add_job(&c, b, KA, 100);
    fb_plan_snapshot s = snap_of(&c);
    fb_plan_result r;
    char msg[256];
    /* without the flag the planner resets both (the formula: a 0.5, b's two 0.25) */
    CHECK_INT_EQ(fb_plan_run(&s, c.batch, &r, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(r.n_shares, 2);
    fb_plan_result_free(&r);
    s.keep_running_shares = true;
    CHECK_INT_EQ(fb_plan_run(&s, c.batch, &r, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(r.reason[jb], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.n_groups, 1);
    CHECK_INT_EQ(r.groups[0].devices[0], d0);
    CHECK_INT_EQ(r.n_shares, 0);
    /* formula: 0.25 against running formula shares 0.5 + 0.25 = 0.75 whose known
     * shares sum to 1.0: 0.25 * 1.0 / 0.75 = 1/3, a quarter of the device's weight */
    CHECK_NEAR(r.groups[0].time_share, 1.0 / 3.0, 1e-12);
    fb_plan_result_free(&r);

    /* on a device of its own a new group gets the whole device, as without the flag */
    scn e;
    scn_init(&e);
    e.max_g = 3;
    int x = add_tenant(&e, 1, false, 100);
    int f = add_worker(&e, 2, FB_PLAN_CPU, 1000, true);
    int gx = add_running(&e, x, f, 1, 100);
    e.running[gx].time_share = 0.4;
    add_job(&e, x, KA, 100);
    s = snap_of(&e);
    s.keep_running_shares = true;
    CHECK_INT_EQ(fb_plan_run(&s, e.batch, &r, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(r.n_groups, 1);
    CHECK_INT_EQ(r.groups[0].devices[0], f + 1); /* the idle device first */
    CHECK_NEAR(r.groups[0].time_share, 1.0, 1e-12);
    CHECK_INT_EQ(r.n_shares, 0);
    fb_plan_result_free(&r);

    /* three equal groups, one running with the whole device: the two new ones get equal
     * weights, each a third of the device */
    scn h;
    scn_init(&h);
    h.max_g = 3;
    int t = add_tenant(&h, 1, false, 100);
    int hd = add_worker(&h, 1, FB_PLAN_CPU, 1000, true);
    int g1 = add_running(&h, t, hd, 1, 100);
    h.running[g1].time_share = 1.0;
    add_job(&h, t, KA, 100);
    add_job(&h, t, KB, 100);
    s = snap_of(&h);
    s.keep_running_shares = true;
    CHECK_INT_EQ(fb_plan_run(&s, h.batch, &r, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(r.n_groups, 2);
    for (int i = 0; i < 2; i++) CHECK_NEAR(r.groups[i].time_share, 1.0, 1e-12);
    fb_plan_result_free(&r);
}

/* ---- positions, determinism ----------------------------------------------------- */

static void test_positions(void)
{
    scn c;
    scn_init(&c);
    c.max_b = 1;
    int t = add_tenant(&c, 1, false, 100);
    add_worker(&c, 2, FB_PLAN_CUDA, 1000, true);
    int j[6];
    for (int i = 0; i < 6; i++) j[i] = add_job(&c, t, KA, 10);
    c.jobs[j[4]].priority = 80;
    c.jobs[j[5]].mem_member_bytes = 5000; /* too large, still in the queue */
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[j[4]], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.reason[j[0]], FB_PLAN_PLACED);
    CHECK_INT_EQ(r.position[j[0]], 0);
    CHECK_INT_EQ(r.position[j[1]], 0);
    CHECK_INT_EQ(r.position[j[2]], 1);
    CHECK_INT_EQ(r.position[j[3]], 2);
    CHECK_INT_EQ(r.position[j[5]], 3);
    CHECK_INT_EQ(r.reason[j[5]], FB_PLAN_TOO_LARGE);
    fb_plan_result_free(&r);
}

static void check_same(const fb_plan_snapshot *s, const fb_plan_result *a, const fb_plan_result *b)
{
    CHECK_INT_EQ(a->n_groups, b->n_groups);
    CHECK_INT_EQ(a->n_shares, b->n_shares);
    for (int j = 0; j < s->n_jobs; j++) {
        CHECK_INT_EQ(a->reason[j], b->reason[j]);
        CHECK_INT_EQ(a->position[j], b->position[j]);
    }
    for (int g = 0; g < a->n_groups; g++) {
        const fb_plan_group *x = &a->groups[g], *y = &b->groups[g];
        CHECK_INT_EQ(x->n_jobs, y->n_jobs);
        CHECK(memcmp(x->jobs, y->jobs, (size_t)x->n_jobs * sizeof(int)) == 0);
        CHECK_INT_EQ(x->n_devices, y->n_devices);
        CHECK(memcmp(x->devices, y->devices, sizeof x->devices) == 0);
        CHECK(memcmp(x->split, y->split, sizeof x->split) == 0);
        CHECK_INT_EQ(x->mem_per_device, y->mem_per_device);
        CHECK(x->time_share == y->time_share);
    }
    for (int i = 0; i < a->n_shares; i++) {
        CHECK_INT_EQ(a->shares[i].running, b->shares[i].running);
        CHECK(a->shares[i].time_share == b->shares[i].time_share);
    }
}

/* ---- malformed snapshots -------------------------------------------------------- */

typedef void (*breaker)(scn *c);

static void brk_tenant(scn *c) { c->jobs[1].tenant = c->nt; }
static void brk_tenant_neg(scn *c) { c->jobs[0].tenant = -1; }
static void brk_key(scn *c) { c->jobs[0].fusion_key = NULL; }
static void brk_step(scn *c) { c->jobs[0].start_step = -1; }
static void brk_prio(scn *c) { c->jobs[0].priority = 101; }
static void brk_mem(scn *c) { c->jobs[0].mem_member_bytes = -1; }
static void brk_shared(scn *c) { c->jobs[1].mem_shared_bytes = -5; }
static void brk_pdata(scn *c) { c->jobs[0].parallel_data = 0; }
static void brk_ppipe(scn *c) { c->jobs[0].parallel_pipeline = -3; }
static void brk_pbig(scn *c) { c->jobs[0].parallel_data = 9, c->jobs[0].parallel_pipeline = 8; }
static void brk_kind(scn *c) { c->jobs[0].device_kind = 3; }
static void brk_batch(scn *c) { c->batch[1] = 0; }
static void brk_seq(scn *c) { c->jobs[1].seq = c->jobs[0].seq; }
static void brk_weight(scn *c) { c->tenants[0].weight = 0; }
static void brk_weight_neg(scn *c) { c->tenants[0].weight = -1; }
static void brk_weight_nan(scn *c) { c->tenants[0].weight = NAN; }
static void brk_weight_inf(scn *c) { c->tenants[0].weight = INFINITY; }
static void brk_maxdev(scn *c) { c->tenants[0].max_devices = -1; }
static void brk_dev_mem(scn *c) { c->devices[0].memory_bytes = -1; }
static void brk_dev_huge(scn *c) { c->devices[0].memory_bytes = FB_PLAN_MAX_BYTES + 1; }
static void brk_dev_kind(scn *c) { c->devices[0].kind = 0; }
static void brk_dev_worker(scn *c) { c->devices[0].worker = -1; }
static void brk_dev_idx(scn *c) { c->devices[1].idx = -1; }
static void brk_contig(scn *c) { c->devices[1].worker = 1, c->devices[2].worker = 0; }
static void brk_comm(scn *c) { c->devices[1].comm = true; }
static void brk_run_dev(scn *c) { c->running[0].devices[0] = c->nd; }
static void brk_run_dev_neg(scn *c) { c->running[0].devices[0] = -1; }
static void brk_run_dup(scn *c) { c->running[0].n_devices = 2, c->running[0].devices[1] = 0; }
static void brk_run_n(scn *c) { c->running[0].n_devices = 0; }
static void brk_run_n_big(scn *c) { c->running[0].n_devices = FB_PLAN_MAX_GROUP_DEVICES + 1; }
static void brk_run_mem(scn *c) { c->running[0].mem_per_device = -1; }
static void brk_run_ten(scn *c) { c->rten[0][0] = c->nt; }
static void brk_run_nten(scn *c) { c->running[0].n_tenants = 0; }
static void brk_run_tnull(scn *c) { c->running[0].tenants = NULL; }
static void brk_max_b(scn *c) { c->max_b = 0; }
static void brk_max_g(scn *c) { c->max_g = 0; }

static void test_malformed(void)
{
    static const breaker cases[] = {
        brk_tenant,   brk_tenant_neg, brk_key,        brk_step,       brk_prio,     brk_mem,
        brk_shared,   brk_pdata,      brk_ppipe,      brk_pbig,       brk_kind,     brk_batch,
        brk_seq,      brk_weight,     brk_weight_neg, brk_weight_nan, brk_weight_inf,
        brk_maxdev,   brk_dev_mem,    brk_dev_huge,   brk_dev_kind,   brk_dev_worker,
        brk_dev_idx,  brk_contig,     brk_run_dev,    brk_run_dev_neg, brk_run_dup, brk_run_n,
        brk_run_n_big, brk_run_mem,   brk_run_ten,    brk_run_nten,   brk_run_tnull, brk_max_b,
        brk_max_g,    brk_comm};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        scn c;
        scn_init(&c);
        int t = add_tenant(&c, 1, false, 100);
        add_tenant(&c, 2, true, 100);
        int first = add_worker(&c, 2, FB_PLAN_CUDA, 1000, true);
        add_worker(&c, 1, FB_PLAN_CPU, 1000, true);
        add_running(&c, t, first, 1, 100);
        add_job(&c, t, KA, 10);
        add_job(&c, 1, KB, 10);
        fb_plan_snapshot s = snap_of(&c);
        fb_plan_result r;
        char msg[256];
        /* the intact snapshot plans, so each failure below is the breaker's */
        CHECK_INT_EQ(fb_plan_run(&s, c.batch, &r, msg, sizeof msg), FB_OK);
        fb_plan_result_free(&r);
        cases[k](&c);
        s = snap_of(&c);
        memset(&r, 0xA5, sizeof r);
        fb_plan_result before;
        memcpy(&before, &r, sizeof r);
        msg[0] = '\0';
        int rc = fb_plan_run(&s, c.batch, &r, msg, sizeof msg);
        if (rc != FB_ERR_OUT_OF_RANGE) fprintf(stderr, "case %zu: rc %d\n", k, rc);
        CHECK_INT_EQ(rc, FB_ERR_OUT_OF_RANGE);
        CHECK(strlen(msg) > 0);
        CHECK(memcmp(&r, &before, sizeof r) == 0);
    }

    /* missing arrays and negative counts */
    scn c;
    scn_init(&c);
    add_tenant(&c, 1, false, 100);
    add_job(&c, 0, KA, 10);
    fb_plan_snapshot s = snap_of(&c);
    fb_plan_result r;
    char msg[256];
    CHECK_INT_EQ(fb_plan_run(&s, NULL, &r, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK_INT_EQ(fb_plan_run(NULL, c.batch, &r, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK_INT_EQ(fb_plan_run(&s, c.batch, NULL, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    s.n_devices = -1;
    CHECK_INT_EQ(fb_plan_run(&s, c.batch, &r, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    s = snap_of(&c);
    s.jobs = NULL;
    CHECK_INT_EQ(fb_plan_run(&s, c.batch, &r, msg, 0), FB_ERR_OUT_OF_RANGE);
    s = snap_of(&c);
    s.n_devices = 1; /* devices NULL with a count */
    s.devices = NULL;
    CHECK_INT_EQ(fb_plan_run(&s, c.batch, &r, NULL, 0), FB_ERR_OUT_OF_RANGE);

    /* an empty snapshot is fine */
    fb_plan_snapshot empty = {.max_b = 1, .max_groups_per_device = 1};
    CHECK_INT_EQ(fb_plan_run(&empty, NULL, &r, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(r.n_groups, 0);
    CHECK_INT_EQ(r.n_shares, 0);
    fb_plan_result_free(&r);
    fb_plan_result_free(&r); /* zeroed: a second free is harmless */
    fb_plan_result_free(NULL);
}

static void test_huge_estimates(void)
{
    /* estimates near INT64_MAX saturate instead of wrapping into a fit */
    scn c;
    scn_init(&c);
    int t = add_tenant(&c, 1, false, 100);
    add_worker(&c, 1, FB_PLAN_CUDA, FB_PLAN_MAX_BYTES, true);
    int a = add_job(&c, t, KA, INT64_MAX);
    c.jobs[a].mem_shared_bytes = INT64_MAX;
    int b = add_job(&c, t, KB, FB_PLAN_MAX_BYTES / 2);
    int b2 = add_job(&c, t, KB, FB_PLAN_MAX_BYTES / 2);
    int b3 = add_job(&c, t, KB, FB_PLAN_MAX_BYTES / 2);
    fb_plan_result r;
    plan(&c, &r);
    CHECK_INT_EQ(r.reason[a], FB_PLAN_TOO_LARGE);
    CHECK_INT_EQ(r.reason[b], FB_PLAN_PLACED);
    CHECK_INT_EQ(group_of(&r, b), group_of(&r, b2));
    CHECK_INT_EQ(r.reason[b3], FB_PLAN_WAIT_DEVICES);
    fb_plan_result_free(&r);
}

/* ---- the memory estimate ------------------------------------------------------- */

static int64_t estimate(const char *json_sq, int64_t *shared)
{
    char json[1024];
    size_t n = strlen(json_sq);
    CHECK(n < sizeof json);
    for (size_t i = 0; i <= n; i++) json[i] = json_sq[i] == '\'' ? '"' : json_sq[i];
    fb_job_spec spec;
    char msg[256];
    int rc = fb_job_spec_parse(json, n, NULL, &spec, msg, sizeof msg);
    if (rc) fprintf(stderr, "spec: %s\n", msg);
    CHECK_INT_EQ(rc, FB_OK);
    int64_t m = fb_plan_member_bytes(&spec, shared);
    fb_job_spec_free(&spec);
    return m;
}

#define EST_MLP(opt)                                                                               \
    "{'dataset':'x','model':{'input':[4],'layers':[{'type':'linear','out':3},{'type':'relu'},"     \
    "{'type':'linear','out':2}]},'batch_size':10,'steps':1,'optimizer':" opt "}"

static void test_member_bytes(void)
{
    /* 23 parameters; outputs 3 + 3 + 2 = 8 numbers per sample */
    int64_t shared = -1;
    CHECK_INT_EQ(estimate(EST_MLP("{'type':'adam','lr':0.1}"), &shared), 4 * 23 * 4 + 8 * 10 * 8);
    CHECK_INT_EQ(shared, 4 * 10 * (4 + 1));
    CHECK_INT_EQ(estimate(EST_MLP("{'type':'adamw','lr':0.1}"), NULL), 4 * 23 * 4 + 8 * 10 * 8);
    CHECK_INT_EQ(estimate(EST_MLP("{'type':'sgd','lr':0.1}"), NULL), 4 * 23 * 2 + 8 * 10 * 8);
    CHECK_INT_EQ(estimate(EST_MLP("{'type':'sgd','lr':0.1,'momentum':0.9}"), NULL),
                 4 * 23 * 3 + 8 * 10 * 8);

    /* nested layers count: input (2, 4, 4) = 32; conv 2->2 k1 keeps 32 and
     * has 6 parameters; the residual's body conv (32) and relu (32), the
     * residual itself (32), flatten (32), linear 32 -> 1 (33 parameters, 1) */
    int64_t m = estimate("{'dataset':'x','model':{'input':[2,4,4],'layers':["
                         "{'type':'conv2d','out':2,'kernel':1},"
                         "{'type':'residual','body':[{'type':'conv2d','out':2,'kernel':1},"
                         "{'type':'relu'}]},{'type':'flatten'},{'type':'linear','out':1}]},"
                         "'loss':'mse','batch_size':2,'steps':1,"
                         "'optimizer':{'type':'sgd','lr':0.1}}",
                         &shared);
    int64_t params = 6 + 6 + 33, outs = 32 + 32 + 32 + 32 + 32 + 1;
    CHECK_INT_EQ(m, 4 * params * 2 + 8 * 2 * outs);
    CHECK_INT_EQ(shared, 4 * 2 * (32 + 1));

    /* a language model (T 2, D 2, vocab 3, one block of 1 head, MLP width 2): parameters
     * embedding 6, block 44 (two layernorms 4 + 4, qkv 18, projection 6, MLP 6 + 6),
     * head 9; per sample the embedding's 4, the block's output 4 and inside it
     * T x (11 D + 2 M + 4) + H x T x T = 64, the head's 6; the records are T + 1 ids */
    m = estimate("{'dataset':'x','model':{'input':{'tokens':2,'vocab':3},'layers':["
                 "{'type':'embedding','dim':2},{'type':'transformer_block','heads':1,"
                 "'mlp_ratio':1},{'type':'linear','out':3}]},'batch_size':2,'steps':1,"
                 "'optimizer':{'type':'adam','lr':0.1}}",
                 &shared);
    CHECK_INT_EQ(m, 4 * 59 * 4 + 8 * 2 * (4 + 4 + 64 + 6));
    CHECK_INT_EQ(shared, 4 * 2 * (3 + 1));

    shared = 7;
    CHECK(fb_plan_member_bytes(NULL, &shared) < 0);
    CHECK_INT_EQ(shared, 7);
}

/* ---- a naive reference planner ------------------------------------------------ */

/*
 * The policy of planner.h written the slow, obvious way: every step scans
 * the whole queue for the next job, every group scans it again for members,
 * every placement tries every device.  fb_plan_run must produce exactly its
 * plan (shares within rounding).
 */
typedef struct ref_plan {
    int n_groups;
    int g_jobs[MAXJ][MAXJ], g_n[MAXJ], g_dev[MAXJ][FB_PLAN_MAX_GROUP_DEVICES], g_ndev[MAXJ];
    int64_t g_mem[MAXJ];
    double g_share[MAXJ];
    fb_plan_reason reason[MAXJ];
    int64_t position[MAXJ];
    double run_old[MAXR], run_new[MAXR];
} ref_plan;

static int ref_owner(const scn *c, int j)
{
    const fb_plan_job *J = &c->jobs[j];
    return J->public_dataset && c->tenants[J->tenant].share_arrays ? -1 : J->tenant;
}

static bool ref_before(const scn *c, const int64_t *held, int a, int b)
{
    const fb_plan_job *x = &c->jobs[a], *y = &c->jobs[b];
    if (x->priority != y->priority) return x->priority > y->priority;
    double rx = (double)held[x->tenant] / c->tenants[x->tenant].weight;
    double ry = (double)held[y->tenant] / c->tenants[y->tenant].weight;
    if (rx != ry) return rx < ry;
    return x->seq < y->seq;
}

/* Per-device share of a group whose first tenant is t on device d, given
 * the first tenants of the groups there. */
static double ref_dev_share(const scn *c, const int *tenants, int n, int t)
{
    double w = 0.0;
    int same = 0;
    for (int i = 0; i < n; i++) {
        bool first = true;
        for (int k = 0; k < i; k++) first = first && tenants[k] != tenants[i];
        if (first) w += c->tenants[tenants[i]].weight;
        same += tenants[i] == t;
    }
    return c->tenants[t].weight / w / same;
}

static void ref_run(const scn *c, ref_plan *rp)
{
    int64_t held[MAXT] = {0}, used[MAXD] = {0};
    int count[MAXD] = {0};
    bool assigned[MAXJ] = {false};
    memset(rp, 0, sizeof *rp);
    for (int g = 0; g < c->nr; g++) {
        const fb_plan_running *G = &c->running[g];
        for (int i = 0; i < G->n_devices; i++) {
            count[G->devices[i]]++;
            used[G->devices[i]] += G->mem_per_device;
        }
        for (int i = 0; i < G->n_tenants; i++) {
            bool first = true;
            for (int k = 0; k < i; k++) first = first && G->tenants[k] != G->tenants[i];
            if (first) held[G->tenants[i]] += G->n_devices;
        }
    }
    int64_t ready_max[3] = {-1, -1, -1}, all_max[3] = {-1, -1, -1};
    for (int d = 0; d < c->nd; d++) {
        const fb_plan_device *D = &c->devices[d];
        for (int k = 0; k < 3; k++) {
            if (k && k != D->kind) continue;
            if (D->memory_bytes > all_max[k]) all_max[k] = D->memory_bytes;
            if (D->ready && D->memory_bytes > ready_max[k]) ready_max[k] = D->memory_bytes;
        }
    }
    for (int j = 0; j < c->nj; j++) {
        const fb_plan_job *J = &c->jobs[j];
        int64_t one = ceil_div(sat_add(J->mem_member_bytes, J->mem_shared_bytes), J->parallel_pipeline);
        if (c->batch[j] < J->parallel_data) rp->reason[j] = FB_PLAN_TOO_LARGE;
        else if (ready_max[J->device_kind] < 0) rp->reason[j] = FB_PLAN_NO_WORKERS;
        else if (one > all_max[J->device_kind]) rp->reason[j] = FB_PLAN_TOO_LARGE;
        else continue;
        assigned[j] = true;
    }
    for (;;) {
        int j0 = -1;
        for (int j = 0; j < c->nj; j++)
            if (!assigned[j] && (j0 < 0 || ref_before(c, held, j, j0))) j0 = j;
        if (j0 < 0) break;
        const fb_plan_job *J0 = &c->jobs[j0];
        int need = J0->parallel_data * J0->parallel_pipeline;
        assigned[j0] = true;
        if (held[J0->tenant] + need > c->tenants[J0->tenant].max_devices) {
            rp->reason[j0] = FB_PLAN_QUOTA;
            continue;
        }
        int members[MAXJ], nm = 1, kind = J0->device_kind;
        int64_t msum = J0->mem_member_bytes, shared = J0->mem_shared_bytes;
        members[0] = j0;
        bool taken[MAXJ] = {false};
        while (nm < c->max_b) {
            int next = -1;
            for (int j = 0; j < c->nj; j++) {
                const fb_plan_job *J = &c->jobs[j];
                if (assigned[j] || taken[j] || strcmp(J->fusion_key, J0->fusion_key) != 0 ||
                    J->start_step != J0->start_step || c->batch[j] != c->batch[j0] ||
                    J->parallel_data != J0->parallel_data ||
                    J->parallel_pipeline != J0->parallel_pipeline || ref_owner(c, j) != ref_owner(c, j0))
                    continue;
                if (kind && J->device_kind && J->device_kind != kind) continue;
                if (J->tenant != J0->tenant && held[J->tenant] + need > c->tenants[J->tenant].max_devices)
                    continue;
                if (next < 0 || ref_before(c, held, j, next)) next = j;
            }
            if (next < 0) break;
            const fb_plan_job *N = &c->jobs[next];
            int nk = kind ? kind : N->device_kind;
            int64_t ns = N->mem_shared_bytes > shared ? N->mem_shared_bytes : shared;
            if (ceil_div(sat_add(sat_add(msum, N->mem_member_bytes), ns), J0->parallel_pipeline) >
                ready_max[nk])
                break;
            kind = nk;
            msum = sat_add(msum, N->mem_member_bytes);
            shared = ns;
            members[nm++] = next;
            taken[next] = true;
        }
        for (int i = 0; i < nm; i++) assigned[members[i]] = true;
        int64_t mem = ceil_div(sat_add(msum, shared), J0->parallel_pipeline);
        /* placement: on each worker the best devices, then the best worker */
        int best[FB_PLAN_MAX_GROUP_DEVICES], found = 0;
        int64_t best_groups = 0, best_free = 0;
        for (int d0 = 0; d0 < c->nd; d0++) {
            if (d0 > 0 && c->devices[d0].worker == c->devices[d0 - 1].worker) continue;
            int cand[MAXD], nc = 0;
            for (int d = d0; d < c->nd && c->devices[d].worker == c->devices[d0].worker; d++) {
                const fb_plan_device *D = &c->devices[d];
                if (D->ready && (!kind || D->kind == kind) && count[d] < c->max_g &&
                    D->memory_bytes - used[d] >= mem)
                    cand[nc++] = d;
            }
            if (nc < need) continue;
            for (int i = 0; i < nc; i++) /* selection sort by (groups, free desc, index) */
                for (int k = i + 1; k < nc; k++) {
                    int a = cand[i], b = cand[k];
                    int64_t fa = c->devices[a].memory_bytes - used[a];
                    int64_t fb = c->devices[b].memory_bytes - used[b];
                    if (count[b] < count[a] || (count[b] == count[a] && fb > fa) ||
                        (count[b] == count[a] && fb == fa && b < a)) {
                        cand[i] = b;
                        cand[k] = a;
                    }
                }
            int64_t groups = 0, free_sum = 0;
            for (int i = 0; i < need; i++) {
                groups += count[cand[i]];
                free_sum += c->devices[cand[i]].memory_bytes - used[cand[i]];
            }
            if (!found || groups < best_groups || (groups == best_groups && free_sum > best_free)) {
                found = 1;
                best_groups = groups;
                best_free = free_sum;
                memcpy(best, cand, (size_t)need * sizeof(int));
            }
        }
        for (int i = 0; i < nm; i++)
            rp->reason[members[i]] = found ? FB_PLAN_PLACED : FB_PLAN_WAIT_DEVICES;
        if (!found) continue;
        int G = rp->n_groups++;
        memcpy(rp->g_jobs[G], members, (size_t)nm * sizeof(int));
        rp->g_n[G] = nm;
        for (int i = 0; i < need; i++) /* increasing index */
            for (int k = i + 1; k < need; k++)
                if (best[k] < best[i]) {
                    int x = best[i];
                    best[i] = best[k];
                    best[k] = x;
                }
        memcpy(rp->g_dev[G], best, (size_t)need * sizeof(int));
        rp->g_ndev[G] = need;
        rp->g_mem[G] = mem;
        for (int i = 0; i < need; i++) {
            count[best[i]]++;
            used[best[i]] += mem;
        }
        for (int i = 0; i < nm; i++) {
            bool first = true;
            for (int k = 0; k < i; k++)
                first = first && c->jobs[members[k]].tenant != c->jobs[members[i]].tenant;
            if (first) held[c->jobs[members[i]].tenant] += need;
        }
    }
    /* shares: per device, over the first tenants of its groups */
    for (int g = 0; g < c->nr + rp->n_groups; g++) {
        const int *devs = g < c->nr ? c->running[g].devices : rp->g_dev[g - c->nr];
        int nd = g < c->nr ? c->running[g].n_devices : rp->g_ndev[g - c->nr];
        int t = g < c->nr ? c->running[g].tenants[0] : c->jobs[rp->g_jobs[g - c->nr][0]].tenant;
        double s_old = 1.0, s_new = 1.0;
        for (int i = 0; i < nd; i++) {
            int ten_old[MAXR + MAXJ], n_old = 0, ten_new[MAXR + MAXJ], n_new = 0;
            for (int h = 0; h < c->nr + rp->n_groups; h++) {
                const int *hd = h < c->nr ? c->running[h].devices : rp->g_dev[h - c->nr];
                int hn = h < c->nr ? c->running[h].n_devices : rp->g_ndev[h - c->nr];
                int ht = h < c->nr ? c->running[h].tenants[0] : c->jobs[rp->g_jobs[h - c->nr][0]].tenant;
                for (int k = 0; k < hn; k++)
                    if (hd[k] == devs[i]) {
                        ten_new[n_new++] = ht;
                        if (h < c->nr) ten_old[n_old++] = ht;
                    }
            }
            double sn = ref_dev_share(c, ten_new, n_new, t);
            if (sn < s_new) s_new = sn;
            if (g < c->nr) {
                double so = ref_dev_share(c, ten_old, n_old, t);
                if (so < s_old) s_old = so;
            }
        }
        if (g < c->nr) {
            rp->run_old[g] = s_old;
            rp->run_new[g] = s_new;
        } else {
            rp->g_share[g - c->nr] = s_new;
        }
    }
    /* positions: the unplaced jobs in the order after the plan */
    for (int j = 0; j < c->nj; j++) {
        if (rp->reason[j] == FB_PLAN_PLACED) continue;
        for (int k = 0; k < c->nj; k++)
            if (k != j && rp->reason[k] != FB_PLAN_PLACED && ref_before(c, held, k, j)) rp->position[j]++;
    }
}

static void check_matches_reference(const scn *c, const fb_plan_result *r)
{
    ref_plan rp;
    ref_run(c, &rp);
    CHECK_INT_EQ(r->n_groups, rp.n_groups);
    for (int j = 0; j < c->nj; j++) {
        CHECK_INT_EQ(r->reason[j], rp.reason[j]);
        CHECK_INT_EQ(r->position[j], rp.position[j]);
    }
    for (int g = 0; g < rp.n_groups; g++) {
        CHECK_INT_EQ(r->groups[g].n_jobs, rp.g_n[g]);
        for (int i = 0; i < rp.g_n[g]; i++) CHECK_INT_EQ(r->groups[g].jobs[i], rp.g_jobs[g][i]);
        CHECK_INT_EQ(r->groups[g].n_devices, rp.g_ndev[g]);
        for (int i = 0; i < rp.g_ndev[g]; i++) CHECK_INT_EQ(r->groups[g].devices[i], rp.g_dev[g][i]);
        CHECK_INT_EQ(r->groups[g].mem_per_device, rp.g_mem[g]);
        CHECK_NEAR(r->groups[g].time_share, rp.g_share[g], 1e-12);
    }
    int k = 0;
    for (int g = 0; g < c->nr; g++) {
        if (fabs(rp.run_new[g] - rp.run_old[g]) <= 1e-9) continue;
        CHECK(k < r->n_shares);
        CHECK_INT_EQ(r->shares[k].running, g);
        CHECK_NEAR(r->shares[k].time_share, rp.run_new[g], 1e-12);
        k++;
    }
    CHECK_INT_EQ(k, r->n_shares);
}

/* ---- randomized invariants -------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static int rnd_below(int n)
{
    return (int)(rnd() % (uint64_t)n);
}

static void random_scenario(scn *c)
{
    static const char *keys[] = {"k1", "k2", "k3"};
    static const int64_t batches[] = {1, 2, 3, 8, 64};
    scn_init(c);
    c->max_b = 1 + rnd_below(5);
    c->max_g = 1 + rnd_below(3);
    int nt = 1 + rnd_below(MAXT);
    for (int t = 0; t < nt; t++)
        add_tenant(c, 0.5 + rnd_below(8) * 0.5, rnd_below(3) != 0, rnd_below(12));
    int nw = rnd_below(10) == 0 ? 0 : 1 + rnd_below(4);
    for (int w = 0; w < nw && c->nd < MAXD - 6; w++)
        add_worker(c, 1 + rnd_below(6), 1 + rnd_below(2), rnd_below(6) == 0 ? 0 : 100 + rnd_below(2000),
                   rnd_below(5) != 0);
    /* running groups that respect the bounds, as a real cluster's would */
    int used_g[MAXD] = {0};
    int64_t used_m[MAXD] = {0};
    int nr = c->nd ? rnd_below(6) : 0;
    for (int i = 0; i < nr; i++) {
        int d = rnd_below(c->nd);
        int n = 1 + rnd_below(2);
        if (d + n > c->nd || c->devices[d].worker != c->devices[d + n - 1].worker) n = 1;
        int64_t mem = rnd_below(700);
        bool ok = true;
        for (int k = 0; k < n; k++)
            ok = ok && used_g[d + k] < c->max_g && used_m[d + k] + mem <= c->devices[d + k].memory_bytes;
        if (!ok) continue;
        for (int k = 0; k < n; k++) {
            used_g[d + k]++;
            used_m[d + k] += mem;
        }
        int g = add_running(c, rnd_below(nt), d, n, mem);
        if (rnd_below(3) == 0) { /* a shared array of two tenants */
            c->rten[g][1] = rnd_below(nt);
            c->running[g].n_tenants = 2;
        }
    }
    int nj = rnd_below(MAXJ / 2 + 1);
    for (int i = 0; i < nj; i++) {
        int k = rnd_below(3);
        int j = add_job(c, rnd_below(nt), keys[k], rnd_below(800));
        fb_plan_job *J = &c->jobs[j];
        J->seq = (int64_t)rnd_below(1000) * MAXJ + j; /* unique, not in index order */
        J->start_step = rnd_below(4) == 0 ? 100 : 0;
        J->priority = rnd_below(3) * 40;
        J->mem_shared_bytes = rnd_below(200);
        J->parallel_data = 1 + (rnd_below(4) == 0) + (rnd_below(8) == 0);
        J->parallel_pipeline = 1 + (rnd_below(5) == 0);
        J->public_dataset = rnd_below(3) != 0;
        J->device_kind = rnd_below(2) ? 0 : 1 + rnd_below(2);
        /* mostly the key's batch, as real fusion keys imply, sometimes not */
        c->batch[j] = batches[rnd_below(4) == 0 ? rnd_below(5) : k + 2];
    }
}

static void test_random_invariants(void)
{
    rng_state = 20261201;
    int64_t reasons[FB_PLAN_REASON_COUNT] = {0};
    int64_t shares = 0, fused = 0, cross = 0, wide = 0, colocated = 0;
    for (int iter = 0; iter < 6000; iter++) {
        scn c;
        random_scenario(&c);
        fb_plan_result r, r2;
        plan(&c, &r);
        fb_plan_snapshot s = snap_of(&c);
        char msg[128];
        CHECK_INT_EQ(fb_plan_run(&s, c.batch, &r2, msg, sizeof msg), FB_OK);
        check_same(&s, &r, &r2);
        check_matches_reference(&c, &r);
        for (int j = 0; j < c.nj; j++) reasons[r.reason[j]]++;
        for (int g = 0; g < r.n_groups; g++) {
            const fb_plan_group *G = &r.groups[g];
            fused += G->n_jobs > 1;
            wide += G->n_devices > 1;
            colocated += G->time_share < 1.0;
            for (int i = 1; i < G->n_jobs; i++)
                if (c.jobs[G->jobs[i]].tenant != c.jobs[G->jobs[0]].tenant) {
                    cross++;
                    break;
                }
        }
        shares += r.n_shares;
        fb_plan_result_free(&r);
        fb_plan_result_free(&r2);
    }
    /* the generator must reach every case, or the invariants prove little */
    fprintf(stderr,
            "random: placed %lld, no workers %lld, wait %lld, quota %lld, too large %lld; "
            "groups fused %lld, cross-tenant %lld, multi-device %lld, sharing a device %lld; "
            "running shares changed %lld\n",
            (long long)reasons[FB_PLAN_PLACED], (long long)reasons[FB_PLAN_NO_WORKERS],
            (long long)reasons[FB_PLAN_WAIT_DEVICES], (long long)reasons[FB_PLAN_QUOTA],
            (long long)reasons[FB_PLAN_TOO_LARGE], (long long)fused, (long long)cross,
            (long long)wide, (long long)colocated, (long long)shares);
    for (int k = 0; k < FB_PLAN_REASON_COUNT; k++) CHECK(reasons[k] > 200);
    CHECK(fused > 200 && cross > 50 && wide > 200 && colocated > 200 && shares > 200);
}

/* ---- the 10,000-job snapshot --------------------------------------------------- */

static void test_scale(void)
{
    workload w;
    workload_shape shape = workload_budget_shape();
    CHECK_INT_EQ(workload_make(&w, &shape), 0);
    fb_plan_result r, r2;
    char msg[256] = "";
    int rc = fb_plan_run(&w.snap, w.batch, &r, msg, sizeof msg);
    if (rc) fprintf(stderr, "fb_plan_run: %s\n", msg);
    CHECK_INT_EQ(rc, FB_OK);
    check_invariants(&w.snap, w.batch, &r);
    CHECK_INT_EQ(fb_plan_run(&w.snap, w.batch, &r2, msg, sizeof msg), FB_OK);
    check_same(&w.snap, &r, &r2);
    int64_t placed = 0;
    for (int j = 0; j < w.snap.n_jobs; j++) placed += r.reason[j] == FB_PLAN_PLACED;
    printf("scale: %d jobs, %d groups, %lld jobs placed, %d share changes\n", w.snap.n_jobs,
           r.n_groups, (long long)placed, r.n_shares);
    CHECK(r.n_groups > 100 && placed > r.n_groups);
    fb_plan_result_free(&r);
    fb_plan_result_free(&r2);
    workload_free(&w);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "scale") == 0) {
        test_scale();
        printf("test_planner scale: ok\n");
        return 0;
    }
    test_fusion_by_key();
    test_start_step_never_fuses();
    test_cross_tenant_fusion();
    test_max_b_one_disables_fusion();
    test_memory_caps_b();
    test_too_large();
    test_no_workers();
    test_quota();
    test_quota_in_shared_arrays();
    test_priority_order();
    test_fair_share_order();
    test_holdings_from_shared_arrays();
    test_old_small_group_first();
    test_unplaced_group_does_not_block();
    test_colocation();
    test_multi_device_one_worker();
    test_device_kinds();
    test_span_only_when_needed();
    test_span_kinds_and_shapes();
    test_span_one_per_device();
    test_span_fewest_workers();
    test_span_memory_quota_draining();
    test_shares_follow_weights();
    test_running_share_changes();
    test_known_shares_corrected();
    test_keep_running_shares();
    test_positions();
    test_malformed();
    test_huge_estimates();
    test_member_bytes();
    test_random_invariants();
    printf("test_planner: ok\n");
    return 0;
}
