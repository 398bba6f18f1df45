/*
 * The planner and the scheduler of planner.h.
 *
 * The queue order depends on the devices each tenant holds, and that changes
 * with every group placed, so grouping and placement are one loop: take the
 * job first in the current order, form its group, place it, update the
 * tenants' holdings, repeat.  Sorting the queue again after each placement
 * would cost O(n log n) per group; instead every tenant keeps its own jobs
 * sorted once by (priority desc, seq asc), and a heap holds one entry per
 * tenant keyed by its first job (priority desc, devices held / weight, seq).
 * Keys only ever grow during a plan (holdings grow, a tenant's first job only
 * moves later), so a stale heap entry is simply refreshed when it surfaces.
 *
 * Compatible jobs are found through buckets: a hash table numbers the
 * grouping keys (fusion key, start step, batch, parallel shape, and the
 * tenant unless the job may share an array), and the eligible jobs are
 * ordered by bucket, then device kind, tenant, priority and seq.  A lane is
 * one tenant's jobs of one kind in a bucket, already in queue order.  A
 * group takes the next jobs of its bucket by merging the lanes' first jobs
 * in the current order, through a heap per bucket that lives as long as the
 * plan and is refreshed lazily like the tenant heap.  All of
 * these orders are stable counting sorts over the seq order (priorities are
 * 0..100, tenants and buckets are small integers), so the only comparison
 * sorts are the seq order itself and the tenants' final ratios.
 *
 * Placement gets harder as the plan fills devices, never easier, so a failed
 * placement is remembered per (kind, device count) as the smallest memory
 * that did not fit; any later group needing as much fails without a scan.
 */
#include "planner.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

#define KINDS 3 /* 0 = any, FB_PLAN_CPU, FB_PLAN_CUDA */
#define SHARE_EPS 1e-9

/* ---- arithmetic on non-negative sizes ------------------------------------- */

static int64_t sat_add(int64_t a, int64_t b)
{
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}

static int64_t sat_mul(int64_t a, int64_t b)
{
    if (a == 0 || b == 0) return 0;
    return a > INT64_MAX / b ? INT64_MAX : a * b;
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return a / b + (a % b != 0);
}

/* Memory on each of a group's devices: members and shared part over its
 * pipeline stages.  A saturated sum stays above FB_PLAN_MAX_BYTES, so it can
 * never fit a device. */
static int64_t per_device(int64_t members, int64_t shared, int pipeline)
{
    return ceil_div(sat_add(members, shared), pipeline);
}

/* ---- scratch memory --------------------------------------------------------- */

/* The working arrays of one plan; all released together. */
typedef struct scratch {
    void *p[64];
    int n;
    bool failed;
} scratch;

static void *scratch_alloc(scratch *s, size_t count, size_t size)
{
    if (s->failed || s->n == (int)(sizeof s->p / sizeof s->p[0])) {
        s->failed = true;
        return NULL;
    }
    void *p = calloc(count ? count : 1, size);
    if (!p) {
        s->failed = true;
        return NULL;
    }
    s->p[s->n++] = p;
    return p;
}

static void scratch_free(scratch *s)
{
    for (int i = 0; i < s->n; i++) free(s->p[i]);
    s->n = 0;
}

/* ---- validation ------------------------------------------------------------ */

/* A job's seq and index, to sort the queue by submission once. */
typedef struct seq_idx {
    int64_t seq;
    int idx;
} seq_idx;

static int cmp_seq_idx(const void *a, const void *b)
{
    const seq_idx *x = a, *y = b;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Every malformed snapshot is refused with the same code. */
#define BAD(...) fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, __VA_ARGS__)

static int validate_counts(const fb_plan_snapshot *s, const int64_t *batch, char *msg,
                           size_t msg_cap)
{
    if (s->n_jobs < 0 || s->n_tenants < 0 || s->n_devices < 0 || s->n_running < 0)
        return BAD("snapshot counts must not be negative (jobs %d, tenants %d, devices %d, "
                       "running %d)",
                       s->n_jobs, s->n_tenants, s->n_devices, s->n_running);
    if ((s->n_jobs > 0 && (!s->jobs || !batch)) || (s->n_tenants > 0 && !s->tenants) ||
        (s->n_devices > 0 && !s->devices) || (s->n_running > 0 && !s->running))
        return BAD("snapshot array missing for a count above 0");
    if (s->max_b < 1) return BAD("max_b = %d must be at least 1", s->max_b);
    if (s->max_groups_per_device < 1)
        return BAD("max_groups_per_device = %d must be at least 1", s->max_groups_per_device);
    return FB_OK;
}

/* Validates the jobs; fills by_seq with the job indices in seq order. */
static int validate_jobs(const fb_plan_snapshot *s, const int64_t *batch, seq_idx *seqs,
                         int *by_seq, char *msg, size_t msg_cap)
{
    for (int j = 0; j < s->n_jobs; j++) {
        const fb_plan_job *J = &s->jobs[j];
        if (J->tenant < 0 || J->tenant >= s->n_tenants)
            return BAD("jobs[%d].tenant = %d is out of range (%d tenants)", j, J->tenant, s->n_tenants);
        if (!J->fusion_key) return BAD("jobs[%d].fusion_key is NULL", j);
        if (J->start_step < 0)
            return BAD("jobs[%d].start_step = %lld is negative", j, (long long)J->start_step);
        if (J->priority < 0 || J->priority > 100)
            return BAD("jobs[%d].priority = %d is outside 0..100", j, J->priority);
        if (J->mem_member_bytes < 0 || J->mem_shared_bytes < 0)
            return BAD("jobs[%d] has negative memory (member %lld, shared %lld bytes)", j,
                       (long long)J->mem_member_bytes, (long long)J->mem_shared_bytes);
        if (J->parallel_data < 1 || J->parallel_pipeline < 1 ||
            J->parallel_data > FB_PLAN_MAX_GROUP_DEVICES ||
            J->parallel_pipeline > FB_PLAN_MAX_GROUP_DEVICES ||
            J->parallel_data * J->parallel_pipeline > FB_PLAN_MAX_GROUP_DEVICES)
            return BAD("jobs[%d].parallel data %d x pipeline %d must each be >= 1 and "
                           "need at most %d devices",
                           j, J->parallel_data, J->parallel_pipeline, FB_PLAN_MAX_GROUP_DEVICES);
        if (J->device_kind != 0 && J->device_kind != FB_PLAN_CPU && J->device_kind != FB_PLAN_CUDA)
            return BAD("jobs[%d].device_kind = %d is unknown", j, J->device_kind);
        if (batch[j] < 1) return BAD("batch[%d] = %lld is below 1", j, (long long)batch[j]);
        seqs[j] = (seq_idx){J->seq, j};
    }
    qsort(seqs, (size_t)s->n_jobs, sizeof *seqs, cmp_seq_idx);
    for (int j = 0; j < s->n_jobs; j++) {
        if (j > 0 && seqs[j].seq == seqs[j - 1].seq)
            return BAD("seq %lld appears more than once", (long long)seqs[j].seq);
        by_seq[j] = seqs[j].idx;
    }
    return FB_OK;
}

static int validate_tenants(const fb_plan_snapshot *s, char *msg, size_t msg_cap)
{
    for (int t = 0; t < s->n_tenants; t++) {
        double w = s->tenants[t].weight;
        if (!(w > 0.0 && w <= DBL_MAX))
            return BAD("tenants[%d].weight = %g must be finite and positive", t, w);
        if (s->tenants[t].max_devices < 0)
            return BAD("tenants[%d].max_devices = %d is negative", t, s->tenants[t].max_devices);
    }
    return FB_OK;
}

static int validate_devices(const fb_plan_snapshot *s, int *run_workers, char *msg, size_t msg_cap)
{
    int n_runs = 0;
    for (int d = 0; d < s->n_devices; d++) {
        const fb_plan_device *D = &s->devices[d];
        if (D->worker < 0 || D->idx < 0)
            return BAD("devices[%d] has a negative worker (%d) or idx (%d)", d, D->worker, D->idx);
        if (D->kind != FB_PLAN_CPU && D->kind != FB_PLAN_CUDA)
            return BAD("devices[%d].kind = %d is unknown", d, D->kind);
        if (D->memory_bytes < 0 || D->memory_bytes > FB_PLAN_MAX_BYTES)
            return BAD("devices[%d].memory_bytes = %lld is outside 0..2^56", d,
                       (long long)D->memory_bytes);
        if (d == 0 || D->worker != s->devices[d - 1].worker)
            run_workers[n_runs++] = D->worker;
        else if (D->comm != s->devices[d - 1].comm)
            return BAD("the devices of worker %d disagree on comm", D->worker);
    }
    qsort(run_workers, (size_t)n_runs, sizeof *run_workers, cmp_int);
    for (int r = 1; r < n_runs; r++)
        if (run_workers[r] == run_workers[r - 1])
            return BAD("the devices of worker %d are not contiguous", run_workers[r]);
    return FB_OK;
}

static int validate_running(const fb_plan_snapshot *s, int *dev_stamp, char *msg, size_t msg_cap)
{
    for (int g = 0; g < s->n_running; g++) {
        const fb_plan_running *R = &s->running[g];
        if (R->n_devices < 1 || R->n_devices > FB_PLAN_MAX_GROUP_DEVICES)
            return BAD("running[%d].n_devices = %d is outside 1..64", g, R->n_devices);
        for (int i = 0; i < R->n_devices; i++) {
            int d = R->devices[i];
            if (d < 0 || d >= s->n_devices)
                return BAD("running[%d] names device %d, out of range", g, d);
            if (dev_stamp[d] == g + 1)
                return BAD("running[%d] names device %d twice", g, d);
            dev_stamp[d] = g + 1;
        }
        if (R->mem_per_device < 0 || R->mem_per_device > FB_PLAN_MAX_BYTES)
            return BAD("running[%d].mem_per_device = %lld is outside 0..2^56", g,
                       (long long)R->mem_per_device);
        if (!(R->time_share >= 0 && R->time_share <= 1))
            return BAD("running[%d].time_share = %g is outside [0, 1]", g, R->time_share);
        if (R->n_tenants < 1 || !R->tenants)
            return BAD("running[%d] has no tenants (n_tenants %d)", g, R->n_tenants);
        for (int i = 0; i < R->n_tenants; i++)
            if (R->tenants[i] < 0 || R->tenants[i] >= s->n_tenants)
                return BAD("running[%d] names tenant %d, out of range", g, R->tenants[i]);
    }
    return FB_OK;
}

#undef BAD

/* ---- the queue ------------------------------------------------------------- */

/* A heap entry: a tenant (or a lane) keyed by its first job in queue order. */
typedef struct qent {
    int64_t seq;
    int64_t held; /* the tenant's holdings when the key was made */
    double ratio; /* held / weight */
    int prio;
    int id;
} qent;

static bool qent_before(const qent *a, const qent *b)
{
    if (a->prio != b->prio) return a->prio > b->prio;
    if (a->ratio != b->ratio) return a->ratio < b->ratio;
    return a->seq < b->seq;
}

static void heap_push(qent *h, int *n, qent e)
{
    int i = (*n)++;
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!qent_before(&e, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = e;
}

static qent heap_pop(qent *h, int *n)
{
    qent top = h[0], last = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && qent_before(&h[c + 1], &h[c])) c++;
        if (!qent_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

/* The plan's state: the snapshot, derived tables and what is placed so far. */
typedef struct plan {
    const fb_plan_snapshot *s;
    const int64_t *batch;

    fb_plan_reason *reason;
    unsigned char *assigned; /* the job has a reason for this plan */
    int *by_seq;             /* the jobs in seq order */
    int64_t *held;           /* [n_tenants] devices held, counted per group */

    int *tstream, *toff, *tcur; /* per tenant: eligible jobs by (priority desc, seq) */
    int *border;                /* eligible jobs by bucket, then tenant, priority desc, seq */
    int *job_lane;              /* [n_jobs] lane of an eligible job */
    int *lane_start, *lane_end, *lane_cur, *lane_bucket;
    int *bucket_first_lane, *bucket_end_lane;
    qent *lane_heap; /* bucket b's heap of lanes lives at [bucket_first_lane[b], ...) */
    int *bucket_heap_n;
    int *aside;      /* lanes a formation passes over, pushed back after it */

    int64_t maxmem_ready[KINDS], maxmem_all[KINDS];
    int *run_start, *run_end, n_runs; /* devices of each worker */
    int *dcount;                      /* groups on each device */
    /* a device holds an array that spans workers: it takes no second one, since two such
     * arrays sharing devices on two workers could each hold one worker's turn while waiting
     * in a sum for the other worker, which serves the other array */
    bool *dspan;
    /* [n_runs] choose_span's workers, allocated by its first call (most plans span
     * nothing, and a plan's allocations are zeroed) */
    struct span_offer *span_offers;
    struct scratch *sc;
    int64_t *dused;                   /* bytes held on each device */
    /* by kind, whether the group may span workers, and device count */
    int64_t fail_mem[KINDS][2][FB_PLAN_MAX_GROUP_DEVICES + 1];

    int *members, n_members; /* the group being formed */
    int *tstamp, stamp;      /* distinct tenants of a group */
} plan;

static bool kind_fits(int want, int have)
{
    return want == 0 || want == have;
}

static bool may_share(const plan *p, int j)
{
    const fb_plan_job *J = &p->s->jobs[j];
    return J->public_dataset && p->s->tenants[J->tenant].share_arrays;
}

static bool quota_blocked(const plan *p, int t, int need)
{
    return p->held[t] + need > p->s->tenants[t].max_devices;
}

/*
 * Stable counting sort: out[] receives in[] ordered by key[in[i]] (0..k-1),
 * equal keys keeping their order.  cnt has k + 1 entries; on return cnt[v]
 * is where key v starts in out.  Every order the plan needs is a chain of
 * these over the seq order, O(n) instead of O(n log n) comparisons.
 */
static void counting_sort(const int *in, int n, const int *key, int k, int *cnt, int *out)
{
    memset(cnt, 0, ((size_t)k + 1) * sizeof *cnt);
    for (int i = 0; i < n; i++) cnt[key[in[i]] + 1]++;
    for (int v = 0; v < k; v++) cnt[v + 1] += cnt[v];
    for (int i = 0; i < n; i++) out[cnt[key[in[i]]]++] = in[i];
    for (int v = k; v > 0; v--) cnt[v] = cnt[v - 1];
    cnt[0] = 0;
}

/* FNV-1a, then mixed with the other fields of the grouping key. */
static uint64_t hash_str(const char *str)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (; *str; str++) h = (h ^ (unsigned char)*str) * UINT64_C(0x100000001b3);
    return h;
}

static uint64_t hash_mix(uint64_t h, uint64_t v)
{
    h ^= v + UINT64_C(0x9E3779B97F4A7C15) + (h << 6) + (h >> 2);
    return h;
}

/* The tenant in the grouping key, or -1 when the job may join any tenant's
 * array that may share. */
static int owner_of(const plan *p, int j)
{
    return may_share(p, j) ? -1 : p->s->jobs[j].tenant;
}

static uint64_t group_hash(const plan *p, int j)
{
    const fb_plan_job *J = &p->s->jobs[j];
    uint64_t h = hash_str(J->fusion_key);
    h = hash_mix(h, (uint64_t)J->start_step);
    h = hash_mix(h, (uint64_t)p->batch[j]);
    h = hash_mix(h, (uint64_t)(J->parallel_data * 65 + J->parallel_pipeline));
    return hash_mix(h, (uint64_t)(int64_t)owner_of(p, j));
}

/* Equal grouping keys: the jobs may train in one array. */
static bool same_group(const plan *p, int a, int b)
{
    const fb_plan_job *x = &p->s->jobs[a], *y = &p->s->jobs[b];
    return x->start_step == y->start_step && p->batch[a] == p->batch[b] &&
           x->parallel_data == y->parallel_data && x->parallel_pipeline == y->parallel_pipeline &&
           owner_of(p, a) == owner_of(p, b) && strcmp(x->fusion_key, y->fusion_key) == 0;
}

/* The tenant's first job not yet assigned, or -1. */
static int tenant_head(plan *p, int t)
{
    while (p->tcur[t] < p->toff[t + 1] && p->assigned[p->tstream[p->tcur[t]]]) p->tcur[t]++;
    return p->tcur[t] < p->toff[t + 1] ? p->tstream[p->tcur[t]] : -1;
}

static qent make_qent(const plan *p, int id, int job)
{
    const fb_plan_job *J = &p->s->jobs[job];
    qent e = {.seq = J->seq, .held = p->held[J->tenant], .prio = J->priority, .id = id};
    e.ratio = (double)e.held / p->s->tenants[J->tenant].weight;
    return e;
}

/* The first unassigned position of a lane at or after pos, or lane_end. */
static int lane_next(const plan *p, int lane, int pos)
{
    while (pos < p->lane_end[lane] && p->assigned[p->border[pos]]) pos++;
    return pos;
}

/* ---- group formation ------------------------------------------------------- */

typedef struct forming {
    int kind;          /* 0 until a member needs one kind */
    int64_t members;   /* bytes of the members, saturating */
    int64_t shared;    /* the largest shared part */
    int pipeline;
} forming;

/* Adds job j (of a compatible kind) to the group, unless its memory would
 * no longer fit the largest ready device of the group's kind. */
static bool try_add(plan *p, forming *f, int j)
{
    const fb_plan_job *J = &p->s->jobs[j];
    int kind = f->kind ? f->kind : J->device_kind;
    int64_t members = sat_add(f->members, J->mem_member_bytes);
    int64_t shared = J->mem_shared_bytes > f->shared ? J->mem_shared_bytes : f->shared;
    if (per_device(members, shared, f->pipeline) > p->maxmem_ready[kind]) return false;
    f->kind = kind;
    f->members = members;
    f->shared = shared;
    p->members[p->n_members++] = j;
    p->assigned[j] = 1;
    return true;
}

/*
 * Forms the group that j0 starts: j0, then the next compatible jobs of its
 * bucket in the current queue order.  Each bucket keeps a heap of its lanes
 * across the whole plan, keyed like the tenant heap and refreshed lazily the
 * same way, so a formation costs O(members log lanes) however many tenants
 * share the bucket.  A lane holds one tenant's jobs of one device kind, so
 * a lane is either compatible with the group or not as a whole; lanes of an
 * incompatible kind, and of other tenants at their quota, are set aside and
 * pushed back unchanged afterwards.
 */
static void form_group(plan *p, int j0, forming *f)
{
    const fb_plan_snapshot *s = p->s;
    const fb_plan_job *J0 = &s->jobs[j0];
    int need = J0->parallel_data * J0->parallel_pipeline;
    *f = (forming){.kind = J0->device_kind, .members = J0->mem_member_bytes,
                   .shared = J0->mem_shared_bytes, .pipeline = J0->parallel_pipeline};
    p->n_members = 0;
    p->members[p->n_members++] = j0;
    p->assigned[j0] = 1;
    if (s->max_b == 1) return;

    int b = p->lane_bucket[p->job_lane[j0]];
    qent *heap = p->lane_heap + p->bucket_first_lane[b];
    int *n_heap = &p->bucket_heap_n[b], n_aside = 0;
    while (*n_heap > 0 && p->n_members < s->max_b) {
        qent e = heap_pop(heap, n_heap);
        int L = e.id;
        p->lane_cur[L] = lane_next(p, L, p->lane_cur[L]);
        if (p->lane_cur[L] == p->lane_end[L]) continue; /* spent: leaves the heap */
        int j = p->border[p->lane_cur[L]];
        qent fresh = make_qent(p, L, j);
        if (fresh.seq != e.seq || fresh.held != e.held) {
            heap_push(heap, n_heap, fresh);
            continue;
        }
        int t = s->jobs[j].tenant, kind = s->jobs[j].device_kind;
        if ((f->kind && kind && kind != f->kind) || (t != J0->tenant && quota_blocked(p, t, need))) {
            p->aside[n_aside++] = L;
            continue;
        }
        if (!try_add(p, f, j)) {
            heap_push(heap, n_heap, e);
            break;
        }
        p->lane_cur[L] = lane_next(p, L, p->lane_cur[L] + 1);
        if (p->lane_cur[L] < p->lane_end[L])
            heap_push(heap, n_heap, make_qent(p, L, p->border[p->lane_cur[L]]));
    }
    for (int i = 0; i < n_aside; i++) {
        int L = p->aside[i];
        heap_push(heap, n_heap, make_qent(p, L, p->border[p->lane_cur[L]]));
    }
}

/* ---- placement ------------------------------------------------------------- */

/* Device order of the contract: fewest groups, most free memory, lowest index. */
static bool dev_before(const plan *p, int a, int b, const int64_t *free_of)
{
    if (p->dcount[a] != p->dcount[b]) return p->dcount[a] < p->dcount[b];
    if (free_of[a] != free_of[b]) return free_of[a] > free_of[b];
    return a < b;
}

/* Chooses n devices of one worker for a group; returns false when no worker
 * has them.  out[] receives the devices in increasing index order. */
static bool choose_devices(plan *p, int kind, int n, int64_t mem, int64_t *free_of, int *out)
{
    const fb_plan_snapshot *s = p->s;
    int best[FB_PLAN_MAX_GROUP_DEVICES], buf[FB_PLAN_MAX_GROUP_DEVICES];
    bool found = false;
    int64_t best_groups = 0, best_free = 0;
    for (int r = 0; r < p->n_runs; r++) {
        if (p->run_end[r] - p->run_start[r] < n) continue;
        int k = 0;
        for (int d = p->run_start[r]; d < p->run_end[r]; d++) {
            const fb_plan_device *D = &s->devices[d];
            if (!D->ready || !kind_fits(kind, D->kind) || p->dcount[d] >= s->max_groups_per_device)
                continue;
            int64_t used = p->dused[d] < D->memory_bytes ? p->dused[d] : D->memory_bytes;
            free_of[d] = D->memory_bytes - used;
            if (free_of[d] < mem) continue;
            /* keep the n best so far, sorted, by insertion */
            if (k == n && !dev_before(p, d, buf[n - 1], free_of)) continue;
            int i = k < n ? k++ : n - 1;
            while (i > 0 && dev_before(p, d, buf[i - 1], free_of)) {
                buf[i] = buf[i - 1];
                i--;
            }
            buf[i] = d;
        }
        if (k < n) continue;
        int64_t groups = 0, free_sum = 0;
        for (int i = 0; i < n; i++) {
            groups += p->dcount[buf[i]];
            free_sum += free_of[buf[i]];
        }
        /* workers come in device order, so the first of equals wins */
        if (!found || groups < best_groups || (groups == best_groups && free_sum > best_free)) {
            found = true;
            best_groups = groups;
            best_free = free_sum;
            memcpy(best, buf, (size_t)n * sizeof *buf);
        }
    }
    if (!found) return false;
    qsort(best, (size_t)n, sizeof *best, cmp_int);
    memcpy(out, best, (size_t)n * sizeof *best);
    return true;
}

/* A worker's offer to an array that spans workers: its eligible devices, best first. */
typedef struct span_offer {
    int run;
    int k;              /* eligible devices, at most the array's count */
    int64_t groups;     /* groups on them */
    int64_t free_sum;   /* their free memory */
    int dev[FB_PLAN_MAX_GROUP_DEVICES];
} span_offer;

static int cmp_offer(const void *a, const void *b)
{
    const span_offer *x = a, *y = b;
    if (x->k != y->k) return x->k > y->k ? -1 : 1;
    if (x->groups != y->groups) return x->groups < y->groups ? -1 : 1;
    if (x->free_sum != y->free_sum) return x->free_sum > y->free_sum ? -1 : 1;
    return (x->run > y->run) - (x->run < y->run);
}

/*
 * Chooses n devices of kind (FB_PLAN_CPU or FB_PLAN_CUDA, never mixed: the
 * replicas of one array sum through one backend, TCP or NCCL) on several
 * workers that can take part in spanning arrays, for a data-parallel group
 * that no single worker can take; false
 * when even all of them together cannot.  The fewest workers: those with the
 * most eligible devices first (then the fewest groups and the most free
 * memory on them), until their devices add up to n; then the n best of their
 * devices.  Taking the workers by their count of devices makes any smaller
 * set of workers too small, so all of the chosen ones hold ranks.  out[]
 * receives the devices in increasing index order, which lists them worker by
 * worker (a worker's devices are contiguous in the snapshot).
 */
static bool choose_span(plan *p, int kind, int n, int64_t mem, int64_t *free_of, int *out)
{
    const fb_plan_snapshot *s = p->s;
    if (!p->span_offers) p->span_offers = scratch_alloc(p->sc, (size_t)p->n_runs, sizeof(span_offer));
    span_offer *offers = p->span_offers;
    if (!offers) return false;
    int n_offers = 0;
    for (int r = 0; r < p->n_runs; r++) {
        if (!s->devices[p->run_start[r]].comm) continue;
        span_offer *o = &offers[n_offers];
        o->run = r;
        o->k = 0;
        for (int d = p->run_start[r]; d < p->run_end[r]; d++) {
            const fb_plan_device *D = &s->devices[d];
            if (!D->ready || D->kind != kind || p->dcount[d] >= s->max_groups_per_device ||
                p->dspan[d])
                continue;
            int64_t used = p->dused[d] < D->memory_bytes ? p->dused[d] : D->memory_bytes;
            free_of[d] = D->memory_bytes - used;
            if (free_of[d] < mem) continue;
            if (o->k == n && !dev_before(p, d, o->dev[n - 1], free_of)) continue;
            int i = o->k < n ? o->k++ : n - 1;
            while (i > 0 && dev_before(p, d, o->dev[i - 1], free_of)) {
                o->dev[i] = o->dev[i - 1];
                i--;
            }
            o->dev[i] = d;
        }
        if (o->k == 0) continue;
        o->groups = o->free_sum = 0;
        for (int i = 0; i < o->k; i++) {
            o->groups += p->dcount[o->dev[i]];
            o->free_sum += free_of[o->dev[i]];
        }
        n_offers++;
    }
    qsort(offers, (size_t)n_offers, sizeof *offers, cmp_offer);
    int m = 0, total = 0;
    while (m < n_offers && total < n) total += offers[m++].k;
    if (total < n) return false;
    /* the n best of the chosen workers' devices, by merging their sorted lists */
    int at[FB_PLAN_MAX_GROUP_DEVICES] = {0};
    for (int i = 0; i < n; i++) {
        int best = -1;
        for (int w = 0; w < m; w++)
            if (at[w] < offers[w].k &&
                (best < 0 || dev_before(p, offers[w].dev[at[w]], offers[best].dev[at[best]],
                                        free_of)))
                best = w;
        out[i] = offers[best].dev[at[best]++];
    }
    qsort(out, (size_t)n, sizeof *out, cmp_int);
    return true;
}

/* ---- time shares ----------------------------------------------------------- */

/* Per-device shares of every group, running and new; each group keeps the
 * smallest over its devices.  Entries of dev lists: running g is g, new group
 * G is n_running + G. */
static int compute_shares(plan *p, scratch *sc, fb_plan_group *groups, int n_groups,
                          double *old_share, double *new_share)
{
    const fb_plan_snapshot *s = p->s;
    int R = s->n_running, n_dev = s->n_devices;
    int *off = scratch_alloc(sc, (size_t)n_dev + 1, sizeof *off);
    int64_t n_entries = 0;
    for (int g = 0; g < R; g++) n_entries += s->running[g].n_devices;
    for (int G = 0; G < n_groups; G++) n_entries += groups[G].n_devices;
    int *list = scratch_alloc(sc, (size_t)n_entries, sizeof *list);
    int *fill = scratch_alloc(sc, (size_t)n_dev + 1, sizeof *fill);
    int *stamp = scratch_alloc(sc, (size_t)s->n_tenants, sizeof *stamp);
    int *cnt_old = scratch_alloc(sc, (size_t)s->n_tenants, sizeof *cnt_old);
    int *cnt_new = scratch_alloc(sc, (size_t)s->n_tenants, sizeof *cnt_new);
    if (sc->failed) return FB_ERR_NOMEM;

    for (int g = 0; g < R; g++)
        for (int i = 0; i < s->running[g].n_devices; i++) off[s->running[g].devices[i] + 1]++;
    for (int G = 0; G < n_groups; G++)
        for (int i = 0; i < groups[G].n_devices; i++) off[groups[G].devices[i] + 1]++;
    for (int d = 0; d < n_dev; d++) off[d + 1] += off[d];
    memcpy(fill, off, ((size_t)n_dev + 1) * sizeof *off);
    for (int g = 0; g < R; g++)
        for (int i = 0; i < s->running[g].n_devices; i++)
            list[fill[s->running[g].devices[i]]++] = g;
    for (int G = 0; G < n_groups; G++)
        for (int i = 0; i < groups[G].n_devices; i++) list[fill[groups[G].devices[i]]++] = R + G;

    for (int g = 0; g < R + n_groups; g++) {
        old_share[g] = 1.0;
        new_share[g] = 1.0;
    }
    for (int d = 0; d < n_dev; d++) {
        double w_old = 0.0, w_new = 0.0;
        for (int k = off[d]; k < off[d + 1]; k++) {
            int g = list[k];
            int t = g < R ? s->running[g].tenants[0] : s->jobs[groups[g - R].jobs[0]].tenant;
            if (stamp[t] != d + 1) {
                stamp[t] = d + 1;
                cnt_old[t] = cnt_new[t] = 0;
            }
            double w = s->tenants[t].weight;
            if (g < R && cnt_old[t]++ == 0) w_old += w;
            if (cnt_new[t]++ == 0) w_new += w;
        }
        for (int k = off[d]; k < off[d + 1]; k++) {
            int g = list[k];
            int t = g < R ? s->running[g].tenants[0] : s->jobs[groups[g - R].jobs[0]].tenant;
            double w = s->tenants[t].weight;
            double sn = w / w_new / cnt_new[t];
            if (sn < new_share[g]) new_share[g] = sn;
            if (g < R) {
                double so = w / w_old / cnt_old[t];
                if (so < old_share[g]) old_share[g] = so;
            }
        }
    }
    return FB_OK;
}

/*
 * keep_running_shares: the running groups keep the shares they have (the
 * fair-share controller owns them), so a new group's share is scaled to
 * stand to them as the formula would have it.  The workers' stride
 * scheduler uses shares as weights, so what matters on a device is a
 * group's share over the sum there: on device d, where the running groups'
 * known shares sum to K and their formula shares to F, the formula share x
 * of a new group becomes x * K / F, the smallest over its devices, at most 1
 * (where the cap bites the controller corrects the rest).
 */
static int keep_running(plan *p, scratch *sc, fb_plan_group *groups, int n_groups,
                        const double *old_share, const double *new_share)
{
    const fb_plan_snapshot *s = p->s;
    int R = s->n_running;
    double *known = scratch_alloc(sc, (size_t)s->n_devices + 1, sizeof *known);
    double *formula = scratch_alloc(sc, (size_t)s->n_devices + 1, sizeof *formula);
    if (sc->failed) return FB_ERR_NOMEM;
    for (int g = 0; g < R; g++)
        for (int i = 0; i < s->running[g].n_devices; i++) {
            known[s->running[g].devices[i]] += old_share[g];
            formula[s->running[g].devices[i]] += new_share[g];
        }
    for (int G = 0; G < n_groups; G++) {
        double w = 1.0;
        for (int i = 0; i < groups[G].n_devices; i++) {
            int d = groups[G].devices[i];
            double scale = formula[d] > 0.0 ? known[d] / formula[d] : 1.0;
            double x = new_share[R + G] * scale;
            if (x < w) w = x;
        }
        if (w > 0.0) groups[G].time_share = w;
    }
    return FB_OK;
}

/* ---- positions ------------------------------------------------------------- */

typedef struct ratio_idx {
    double ratio;
    int idx;
} ratio_idx;

static int cmp_ratio_idx(const void *a, const void *b)
{
    const ratio_idx *x = a, *y = b;
    if (x->ratio != y->ratio) return x->ratio < y->ratio ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/*
 * Positions of the unplaced jobs in the queue order after the plan:
 * priority desc, then the tenant's holdings over weight, then seq.  Tenants
 * with equal ratios share a rank so that their jobs interleave by seq.
 */
static int fill_positions(plan *p, scratch *sc, int64_t *position)
{
    const fb_plan_snapshot *s = p->s;
    int n = s->n_jobs, T = s->n_tenants;
    ratio_idx *tr = scratch_alloc(sc, (size_t)T, sizeof *tr);
    int *rank = scratch_alloc(sc, (size_t)T, sizeof *rank);
    int *wait = scratch_alloc(sc, (size_t)n, sizeof *wait);
    int *tmp = scratch_alloc(sc, (size_t)n, sizeof *tmp);
    int *key = scratch_alloc(sc, (size_t)n, sizeof *key);
    int *cnt = scratch_alloc(sc, (size_t)(T > 101 ? T : 101) + 1, sizeof *cnt);
    if (sc->failed) return FB_ERR_NOMEM;
    for (int t = 0; t < T; t++) tr[t] = (ratio_idx){(double)p->held[t] / s->tenants[t].weight, t};
    qsort(tr, (size_t)T, sizeof *tr, cmp_ratio_idx);
    for (int i = 0, r = 0; i < T; i++) {
        if (i > 0 && tr[i].ratio != tr[i - 1].ratio) r++;
        rank[tr[i].idx] = r;
    }
    int n_wait = 0;
    for (int i = 0; i < n; i++) {
        int j = p->by_seq[i];
        position[j] = 0;
        if (p->reason[j] == FB_PLAN_PLACED) continue;
        wait[n_wait++] = j;
        key[j] = rank[s->jobs[j].tenant];
    }
    counting_sort(wait, n_wait, key, T, cnt, tmp);
    for (int i = 0; i < n_wait; i++) key[tmp[i]] = 100 - s->jobs[tmp[i]].priority;
    counting_sort(tmp, n_wait, key, 101, cnt, wait);
    for (int i = 0; i < n_wait; i++) position[wait[i]] = i;
    return FB_OK;
}

/* ---- the plan -------------------------------------------------------------- */

/* Builds the tenant streams, the buckets and lanes, and marks the jobs that
 * cannot start a group at all (no ready device, too large). */
static int prepare(plan *p, scratch *sc)
{
    const fb_plan_snapshot *s = p->s;
    int n = s->n_jobs;

    for (int k = 0; k < KINDS; k++) p->maxmem_ready[k] = p->maxmem_all[k] = -1;
    for (int d = 0; d < s->n_devices; d++) {
        const fb_plan_device *D = &s->devices[d];
        int kinds[2] = {0, D->kind};
        for (int i = 0; i < 2; i++) {
            int k = kinds[i];
            if (D->memory_bytes > p->maxmem_all[k]) p->maxmem_all[k] = D->memory_bytes;
            if (D->ready && D->memory_bytes > p->maxmem_ready[k])
                p->maxmem_ready[k] = D->memory_bytes;
        }
    }
    bool any_ready[KINDS] = {false, false, false};
    for (int d = 0; d < s->n_devices; d++)
        if (s->devices[d].ready) any_ready[0] = any_ready[s->devices[d].kind] = true;

    /* counting_sort's keys and counters, and a hash table of grouping keys */
    int kmax = n > s->n_tenants ? n : s->n_tenants;
    if (kmax < 101) kmax = 101;
    int *elig = scratch_alloc(sc, (size_t)n, sizeof *elig);
    int *tmp = scratch_alloc(sc, (size_t)n, sizeof *tmp);
    int *key = scratch_alloc(sc, (size_t)n, sizeof *key);
    int *kind_of = scratch_alloc(sc, (size_t)n, sizeof *kind_of);
    int *cnt = scratch_alloc(sc, (size_t)kmax + 1, sizeof *cnt);
    /* open addressing at most half full; a slot keeps part of the hash so
     * that most probes settle without comparing fusion keys */
    struct slot {
        uint32_t hash;
        int job; /* -1: empty */
    };
    size_t table_cap = 16;
    while (table_cap < 2 * (size_t)n) table_cap *= 2;
    struct slot *table = scratch_alloc(sc, table_cap, sizeof *table);
    if (sc->failed) return FB_ERR_NOMEM;

    int n_elig = 0;
    for (int i = 0; i < n; i++) {
        int j = p->by_seq[i];
        const fb_plan_job *J = &s->jobs[j];
        if (p->batch[j] < J->parallel_data) {
            p->reason[j] = FB_PLAN_TOO_LARGE;
        } else if (!any_ready[J->device_kind]) {
            p->reason[j] = FB_PLAN_NO_WORKERS;
        } else if (per_device(J->mem_member_bytes, J->mem_shared_bytes, J->parallel_pipeline) >
                   p->maxmem_all[J->device_kind]) {
            p->reason[j] = FB_PLAN_TOO_LARGE;
        } else {
            elig[n_elig++] = j;
            continue;
        }
        p->assigned[j] = 1;
    }

    /* tenant streams: (tenant, priority desc, seq) from the seq order */
    for (int i = 0; i < n_elig; i++) key[elig[i]] = 100 - s->jobs[elig[i]].priority;
    counting_sort(elig, n_elig, key, 101, cnt, tmp);
    for (int i = 0; i < n_elig; i++) key[tmp[i]] = s->jobs[tmp[i]].tenant;
    counting_sort(tmp, n_elig, key, s->n_tenants, cnt, p->tstream);
    for (int t = 0; t <= s->n_tenants; t++) p->toff[t] = t < s->n_tenants ? cnt[t] : n_elig;
    for (int t = 0; t < s->n_tenants; t++) p->tcur[t] = p->toff[t];

    /* buckets: equal grouping keys, numbered in order of first appearance */
    int *bucket_of = key; /* the stream keys are spent */
    for (size_t i = 0; i < table_cap; i++) table[i].job = -1;
    int n_buckets = 0;
    for (int i = 0; i < n_elig; i++) {
        int j = p->tstream[i];
        uint64_t h = group_hash(p, j);
        uint32_t h32 = (uint32_t)(h >> 32);
        size_t at = (size_t)h & (table_cap - 1);
        while (table[at].job >= 0 && !(table[at].hash == h32 && same_group(p, table[at].job, j)))
            at = (at + 1) & (table_cap - 1);
        if (table[at].job < 0) {
            table[at] = (struct slot){h32, j};
            bucket_of[j] = n_buckets++;
        } else {
            bucket_of[j] = bucket_of[table[at].job];
        }
    }
    /* lanes: ordered by bucket, then kind, the stream order holds within,
     * so a lane is a run of one tenant and kind */
    for (int i = 0; i < n_elig; i++) kind_of[p->tstream[i]] = s->jobs[p->tstream[i]].device_kind;
    counting_sort(p->tstream, n_elig, kind_of, KINDS, cnt, tmp);
    counting_sort(tmp, n_elig, bucket_of, n_buckets, cnt, p->border);
    int n_lanes = 0, b_prev = -1;
    for (int i = 0; i < n_elig; i++) {
        int j = p->border[i], b = bucket_of[j];
        const fb_plan_job *prev = b == b_prev ? &s->jobs[p->border[i - 1]] : NULL;
        if (!prev || prev->tenant != s->jobs[j].tenant ||
            prev->device_kind != s->jobs[j].device_kind) {
            if (n_lanes > 0) p->lane_end[n_lanes - 1] = i;
            if (b != b_prev) {
                if (b > 0) p->bucket_end_lane[b - 1] = n_lanes;
                p->bucket_first_lane[b] = n_lanes;
                b_prev = b;
            }
            p->lane_start[n_lanes] = p->lane_cur[n_lanes] = i;
            p->lane_bucket[n_lanes++] = b;
        }
        p->job_lane[j] = n_lanes - 1;
    }
    if (n_lanes > 0) p->lane_end[n_lanes - 1] = n_elig;
    if (n_buckets > 0) p->bucket_end_lane[n_buckets - 1] = n_lanes;
    for (int L = 0; L < n_lanes; L++) {
        int b = p->lane_bucket[L];
        heap_push(p->lane_heap + p->bucket_first_lane[b], &p->bucket_heap_n[b],
                  make_qent(p, L, p->border[p->lane_start[L]]));
    }
    return FB_OK;
}

/* The working arrays of one run, all from the scratch arena (sc->failed on out of memory). */
static void plan_alloc(plan *p, scratch *sc, int n, int T, int ND)
{
    p->reason = scratch_alloc(sc, (size_t)n, sizeof *p->reason);
    p->assigned = scratch_alloc(sc, (size_t)n, 1);
    p->held = scratch_alloc(sc, (size_t)T, sizeof *p->held);
    p->tstream = scratch_alloc(sc, (size_t)n, sizeof(int));
    p->toff = scratch_alloc(sc, (size_t)T + 1, sizeof(int));
    p->tcur = scratch_alloc(sc, (size_t)T, sizeof(int));
    p->border = scratch_alloc(sc, (size_t)n, sizeof(int));
    p->job_lane = scratch_alloc(sc, (size_t)n, sizeof(int));
    p->lane_start = scratch_alloc(sc, (size_t)n, sizeof(int));
    p->lane_end = scratch_alloc(sc, (size_t)n, sizeof(int));
    p->lane_cur = scratch_alloc(sc, (size_t)n, sizeof(int));
    p->bucket_heap_n = scratch_alloc(sc, (size_t)n, sizeof(int));
    p->aside = scratch_alloc(sc, (size_t)n, sizeof(int));
    p->lane_bucket = scratch_alloc(sc, (size_t)n, sizeof(int));
    p->bucket_first_lane = scratch_alloc(sc, (size_t)n, sizeof(int));
    p->bucket_end_lane = scratch_alloc(sc, (size_t)n, sizeof(int));
    p->lane_heap = scratch_alloc(sc, (size_t)n, sizeof(qent));
    p->run_start = scratch_alloc(sc, (size_t)ND, sizeof(int));
    p->run_end = scratch_alloc(sc, (size_t)ND, sizeof(int));
    p->dcount = scratch_alloc(sc, (size_t)ND, sizeof(int));
    p->dspan = scratch_alloc(sc, (size_t)ND, sizeof(bool));
    p->dused = scratch_alloc(sc, (size_t)ND, sizeof(int64_t));
    p->members = scratch_alloc(sc, (size_t)n, sizeof(int));
    p->tstamp = scratch_alloc(sc, (size_t)T, sizeof(int));
}

/* What the running groups hold (devices, memory, spanning, each tenant's device count), the
 * runs of devices that belong to one worker, and no memory failure known yet. */
static void plan_account_running(plan *p)
{
    const fb_plan_snapshot *s = p->s;
    const int ND = s->n_devices, R = s->n_running;
    for (int g = 0; g < R; g++) {
        const fb_plan_running *G = &s->running[g];
        bool spans = false;
        for (int i = 0; i < G->n_devices; i++) {
            p->dcount[G->devices[i]]++;
            p->dused[G->devices[i]] = sat_add(p->dused[G->devices[i]], G->mem_per_device);
            spans |= s->devices[G->devices[i]].worker != s->devices[G->devices[0]].worker;
        }
        for (int i = 0; spans && i < G->n_devices; i++) p->dspan[G->devices[i]] = true;
        p->stamp++;
        for (int i = 0; i < G->n_tenants; i++) {
            if (p->tstamp[G->tenants[i]] == p->stamp) continue;
            p->tstamp[G->tenants[i]] = p->stamp;
            p->held[G->tenants[i]] += G->n_devices;
        }
    }
    for (int d = 0; d < ND; d++) {
        if (d == 0 || s->devices[d].worker != s->devices[d - 1].worker) {
            if (p->n_runs > 0) p->run_end[p->n_runs - 1] = d;
            p->run_start[p->n_runs++] = d;
        }
    }
    if (p->n_runs > 0) p->run_end[p->n_runs - 1] = ND;
    for (int k = 0; k < KINDS; k++)
        for (int sp = 0; sp < 2; sp++)
            for (int i = 0; i <= FB_PLAN_MAX_GROUP_DEVICES; i++) p->fail_mem[k][sp][i] = INT64_MAX;
}

/* Records the formed group (p->members, led by j0) placed on G->devices as a result group:
 * its members into the slab, its split, and what it now holds of devices and tenants. */
static void plan_record_group(plan *p, int j0, int need, int64_t mem, fb_plan_group *G,
                              int **member_slab)
{
    const fb_plan_snapshot *s = p->s;
    const fb_plan_job *J0 = &s->jobs[j0];
    G->n_jobs = p->n_members;
    G->jobs = *member_slab;
    memcpy(*member_slab, p->members, (size_t)p->n_members * sizeof(int));
    *member_slab += p->n_members;
    G->n_devices = need;
    G->parallel_data = J0->parallel_data;
    G->parallel_pipeline = J0->parallel_pipeline;
    int64_t b = p->batch[j0], D = J0->parallel_data;
    for (int i = 0; i < FB_PLAN_MAX_GROUP_DEVICES; i++)
        G->split[i] = i < D ? b / D + (i < b % D) : 0;
    for (int i = need; i < FB_PLAN_MAX_GROUP_DEVICES; i++) G->devices[i] = -1;
    G->mem_per_device = mem;
    G->time_share = 1.0;
    G->n_workers = 1;
    for (int i = 1; i < need; i++)
        G->n_workers += s->devices[G->devices[i]].worker != s->devices[G->devices[i - 1]].worker;
    for (int i = 0; i < need; i++) {
        p->dcount[G->devices[i]]++;
        p->dused[G->devices[i]] = sat_add(p->dused[G->devices[i]], mem);
        if (G->n_workers > 1) p->dspan[G->devices[i]] = true;
    }
    p->stamp++;
    for (int i = 0; i < p->n_members; i++) {
        int mt = s->jobs[p->members[i]].tenant;
        if (p->tstamp[mt] == p->stamp) continue;
        p->tstamp[mt] = p->stamp;
        p->held[mt] += need;
    }
}

/* Tenants take turns by their heads (the tenant heap theap, of T slots): each turn forms
 * the head's group and places it, or marks why it waits.  Groups land in res->groups (at
 * most cap_groups), their member lists in member_slab. */
static void plan_place_groups(plan *p, qent *theap, int64_t *free_of, fb_plan_result *res,
                              int64_t cap_groups, int *member_slab)
{
    const fb_plan_snapshot *s = p->s;
    int n_heap = 0;
    for (int t = 0; t < s->n_tenants; t++) {
        int j = tenant_head(p, t);
        if (j >= 0) heap_push(theap, &n_heap, make_qent(p, t, j));
    }
    while (n_heap > 0) {
        qent top = heap_pop(theap, &n_heap);
        int t = top.id, j0 = tenant_head(p, t);
        if (j0 < 0) continue;
        qent fresh = make_qent(p, t, j0);
        if (fresh.seq != top.seq || fresh.held != top.held) {
            heap_push(theap, &n_heap, fresh);
            continue;
        }
        const fb_plan_job *J0 = &s->jobs[j0];
        int need = J0->parallel_data * J0->parallel_pipeline;
        if (quota_blocked(p, t, need)) {
            p->reason[j0] = FB_PLAN_QUOTA;
            p->assigned[j0] = 1;
        } else {
            forming f;
            form_group(p, j0, &f);
            int64_t mem = per_device(f.members, f.shared, f.pipeline);
            fb_plan_group *G = &res->groups[res->n_groups];
            bool placed = false;
            /* an array that no single worker can take may span workers: purely data
             * parallel, on devices of one kind (CPU: TCP sums; CUDA: NCCL); of any kind,
             * CPU devices first */
            int sp = f.pipeline == 1 && J0->parallel_data >= 2;
            int64_t *fail = &p->fail_mem[f.kind][sp][need];
            if (mem < *fail && res->n_groups < cap_groups) {
                placed = choose_devices(p, f.kind, need, mem, free_of, G->devices) ||
                         (sp && f.kind != FB_PLAN_CUDA &&
                          choose_span(p, FB_PLAN_CPU, need, mem, free_of, G->devices)) ||
                         (sp && f.kind != FB_PLAN_CPU &&
                          choose_span(p, FB_PLAN_CUDA, need, mem, free_of, G->devices));
                if (!placed) *fail = mem;
            }
            for (int i = 0; i < p->n_members; i++)
                p->reason[p->members[i]] = placed ? FB_PLAN_PLACED : FB_PLAN_WAIT_DEVICES;
            if (placed) {
                plan_record_group(p, j0, need, mem, G, &member_slab);
                res->n_groups++;
            }
        }
        int j = tenant_head(p, t);
        if (j >= 0) heap_push(theap, &n_heap, make_qent(p, t, j));
    }
}

/* Time shares, when anything new shares a device or a running share is off the formula:
 * the new groups' shares, and res->shares for the running groups whose share changes.
 * Returns non-zero on out of memory. */
static int plan_assign_shares(plan *p, scratch *sc, fb_plan_result *res)
{
    const fb_plan_snapshot *s = p->s;
    const int R = s->n_running;
    bool known = false;
    for (int g = 0; g < R; g++) known |= s->running[g].time_share > 0;
    if (res->n_groups == 0 && !known) return 0;
    double *old_share = scratch_alloc(sc, (size_t)R + (size_t)res->n_groups, sizeof(double));
    double *new_share = scratch_alloc(sc, (size_t)R + (size_t)res->n_groups, sizeof(double));
    if (sc->failed) return -1;
    if (compute_shares(p, sc, res->groups, res->n_groups, old_share, new_share)) return -1;
    for (int g = 0; g < R; g++)
        if (s->running[g].time_share > 0) old_share[g] = s->running[g].time_share;
    for (int G = 0; G < res->n_groups; G++) res->groups[G].time_share = new_share[R + G];
    if (s->keep_running_shares &&
        keep_running(p, sc, res->groups, res->n_groups, old_share, new_share))
        return -1;
    int n_changed = 0;
    for (int g = 0; g < R && !s->keep_running_shares; g++)
        if (new_share[g] - old_share[g] > SHARE_EPS || old_share[g] - new_share[g] > SHARE_EPS)
            n_changed++;
    if (n_changed == 0) return 0;
    res->shares = malloc((size_t)n_changed * sizeof *res->shares);
    if (!res->shares) return -1;
    for (int g = 0; g < R; g++)
        if (new_share[g] - old_share[g] > SHARE_EPS || old_share[g] - new_share[g] > SHARE_EPS)
            res->shares[res->n_shares++] = (fb_plan_share){.running = g, .time_share = new_share[g]};
    return 0;
}

int fb_plan_run(const fb_plan_snapshot *s, const int64_t *batch, fb_plan_result *out, char *msg,
                size_t msg_cap)
{
    if (!s || !out) return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "snapshot or result is NULL");
    int rc = validate_counts(s, batch, msg, msg_cap);
    if (rc) return rc;

    const int n = s->n_jobs, T = s->n_tenants, ND = s->n_devices;
    scratch sc = {.n = 0};
    fb_plan_result res = {0};
    plan P = {.s = s, .batch = batch, .sc = &sc};
    plan *p = &P;
    seq_idx *seqs = scratch_alloc(&sc, (size_t)n, sizeof *seqs);
    p->by_seq = scratch_alloc(&sc, (size_t)n, sizeof *p->by_seq);
    int *run_workers = scratch_alloc(&sc, (size_t)ND, sizeof *run_workers);
    int *dev_stamp = scratch_alloc(&sc, (size_t)ND, sizeof *dev_stamp);
    if (sc.failed) goto nomem;
    if ((rc = validate_jobs(s, batch, seqs, p->by_seq, msg, msg_cap)) ||
        (rc = validate_tenants(s, msg, msg_cap)) ||
        (rc = validate_devices(s, run_workers, msg, msg_cap)) ||
        (rc = validate_running(s, dev_stamp, msg, msg_cap)))
        goto done;

    plan_alloc(p, &sc, n, T, ND);
    int64_t *free_of = scratch_alloc(&sc, (size_t)ND, sizeof *free_of);
    qent *theap = scratch_alloc(&sc, (size_t)T, sizeof *theap);
    if (sc.failed) goto nomem;
    plan_account_running(p);
    if ((rc = prepare(p, &sc))) goto done;

    /* The result's groups and their member lists are one allocation.  Every
     * placed group holds a slot on some device, which bounds their number. */
    int64_t cap_groups = (int64_t)ND * s->max_groups_per_device;
    if (cap_groups > n) cap_groups = n;
    size_t group_bytes = (size_t)cap_groups * sizeof(fb_plan_group);
    res.groups = malloc(group_bytes + (size_t)(n ? n : 1) * sizeof(int));
    res.reason = malloc((size_t)(n ? n : 1) * sizeof *res.reason);
    res.position = malloc((size_t)(n ? n : 1) * sizeof *res.position);
    if (!res.groups || !res.reason || !res.position) goto nomem_res;

    plan_place_groups(p, theap, free_of, &res, cap_groups,
                      (int *)(void *)((char *)res.groups + group_bytes));
    if (plan_assign_shares(p, &sc, &res)) goto nomem_res;
    if (fill_positions(p, &sc, res.position)) goto nomem_res;
    memcpy(res.reason, p->reason, (size_t)n * sizeof *res.reason);
    *out = res;
    rc = FB_OK;
    goto done;

nomem_res:
    fb_plan_result_free(&res);
nomem:
    rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory planning %d jobs", n);
done:
    scratch_free(&sc);
    return rc;
}

void fb_plan_result_free(fb_plan_result *r)
{
    if (!r) return;
    free(r->groups); /* the member lists live in the same block */
    free(r->reason);
    free(r->position);
    free(r->shares);
    memset(r, 0, sizeof *r);
}

const char *fb_plan_reason_text(fb_plan_reason r)
{
    switch (r) {
    case FB_PLAN_PLACED: return "scheduled";
    case FB_PLAN_NO_WORKERS: return "waiting for workers";
    case FB_PLAN_WAIT_DEVICES: return "waiting for devices";
    case FB_PLAN_QUOTA: return "waiting for the tenant's device quota";
    case FB_PLAN_TOO_LARGE: return "too large for any registered device";
    case FB_PLAN_REASON_COUNT: break;
    }
    return "unknown";
}

/* ---- memory estimate -------------------------------------------------------- */

/* Output elements per sample of every layer, nested ones included. */
/*
 * The numbers a layer keeps per sample for backward beyond its output.  A
 * transformer block (T positions of D, MLP width M, H heads) is eleven nodes
 * inside (workers/array.c, build_block): two layernorms with their output
 * and statistics, qkv (3D), the attention output and its probabilities
 * (H x T x T), the projection, two dropouts, two residual sums, and the MLP's
 * two hidden layers (M each) and output; its own output is counted as every
 * layer's.
 */
static int64_t layer_inner_numel(const fb_layer *l)
{
    if (l->type != FB_LAYER_TRANSFORMER_BLOCK) return 0;
    int64_t T = l->in.d[0], D = l->in.d[1], M = sat_mul(l->mlp_ratio, D);
    int64_t per_t = sat_add(sat_add(sat_mul(11, D), sat_mul(2, M)), 4);
    return sat_add(sat_mul(T, per_t), sat_mul(sat_mul(l->heads, T), T));
}

static int64_t layers_out_numel(const fb_layer *l, int n)
{
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        sum = sat_add(sum, sat_add(fb_shape_numel(&l[i].out), layer_inner_numel(&l[i])));
        if (l[i].type == FB_LAYER_RESIDUAL) {
            sum = sat_add(sum, layers_out_numel(l[i].body, l[i].n_body));
            sum = sat_add(sum, layers_out_numel(l[i].shortcut, l[i].n_shortcut));
        }
    }
    return sum;
}

int64_t fb_plan_member_bytes(const fb_job_spec *spec, int64_t *shared)
{
    if (!spec) return FB_ERR_OUT_OF_RANGE;
    int slots = 0; /* optimizer state per parameter */
    if (spec->optim.type == FB_OPTIM_ADAM || spec->optim.type == FB_OPTIM_ADAMW)
        slots = 2;
    else if (spec->optim.momentum > 0.0)
        slots = 1;
    int64_t params = sat_mul(sat_mul(4, spec->n_params), 2 + slots);
    int64_t acts = sat_mul(sat_mul(8, spec->batch_size), layers_out_numel(spec->layers, spec->n_layers));
    if (shared)
        *shared = sat_mul(sat_mul(4, spec->batch_size), sat_add(fb_shape_numel(&spec->input), 1));
    return sat_add(params, acts);
}
