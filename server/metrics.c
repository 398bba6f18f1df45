/*
 * Lock-free request counters and their Prometheus rendering, and what the
 * control loop publishes: the fair-share gauges and the time of its phases.
 */
#include "metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

static const int statuses[] = {200, 201, 204, 304, 400, 401, 403, 404, 405,
                               409, 413, 415, 422, 429, 500, 501, 503};
#define N_STATUS ((int)(sizeof statuses / sizeof statuses[0]) + 1) /* + "other" */

static const double bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                0.1,    0.25,  0.5,    1,     2.5,  5};
#define N_BOUNDS ((int)(sizeof bounds / sizeof bounds[0]))

static const int err_values[] = {
#define X_(name, value, code, http, desc) name,
    FB_ERR_TABLE(X_)
#undef X_
};
#define N_ERRS ((int)(sizeof err_values / sizeof err_values[0]))

typedef struct route_stats {
    _Atomic uint64_t by_status[N_STATUS];
    _Atomic uint64_t buckets[N_BOUNDS + 1]; /* last = +Inf */
    _Atomic uint64_t sum_us;
} route_stats;

struct fb_metrics {
    int n_routes;
    const char *const *names;
    const char *const *methods;
    route_stats *routes; /* n_routes + 1 */
    _Atomic uint64_t errors[N_ERRS];
};

static void fair_render(fb_textbuf *b);
static void control_render(fb_textbuf *b);

void fb_textbuf_printf(fb_textbuf *b, const char *fmt, ...)
{
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->data ? b->data + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap - b->len <= (size_t)n)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) {
            b->failed = 1;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
}

fb_metrics *fb_metrics_new(int n_routes, const char *const *route_names,
                           const char *const *route_methods)
{
    fb_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->routes = calloc((size_t)n_routes + 1, sizeof *m->routes);
    if (!m->routes) {
        free(m);
        return NULL;
    }
    m->n_routes = n_routes;
    m->names = route_names;
    m->methods = route_methods;
    return m;
}

void fb_metrics_free(fb_metrics *m)
{
    if (!m) return;
    free(m->routes);
    free(m);
}

void fb_metrics_record(fb_metrics *m, int route, int status, double seconds, int err)
{
    if (route < 0 || route > m->n_routes) route = m->n_routes;
    route_stats *r = &m->routes[route];
    int si = N_STATUS - 1;
    for (int i = 0; i < N_STATUS - 1; i++)
        if (statuses[i] == status) si = i;
    atomic_fetch_add_explicit(&r->by_status[si], 1, memory_order_relaxed);
    int bi = N_BOUNDS;
    for (int i = 0; i < N_BOUNDS; i++) {
        if (seconds <= bounds[i]) {
            bi = i;
            break;
        }
    }
    atomic_fetch_add_explicit(&r->buckets[bi], 1, memory_order_relaxed);
    uint64_t us = seconds > 0 ? (uint64_t)(seconds * 1e6) : 0;
    atomic_fetch_add_explicit(&r->sum_us, us, memory_order_relaxed);
    if (err) {
        for (int i = 0; i < N_ERRS; i++) {
            if (err_values[i] == err) {
                atomic_fetch_add_explicit(&m->errors[i], 1, memory_order_relaxed);
                break;
            }
        }
    }
}

void fb_metrics_render(fb_metrics *m, fb_textbuf *b)
{
    fb_textbuf_printf(b, "# HELP fusebox_http_requests_total HTTP requests by route, method and "
                         "status.\n# TYPE fusebox_http_requests_total counter\n");
    for (int r = 0; r <= m->n_routes; r++) {
        const char *name = r < m->n_routes ? m->names[r] : "unmatched";
        const char *method = r < m->n_routes ? m->methods[r] : "any";
        for (int s = 0; s < N_STATUS; s++) {
            uint64_t v = atomic_load_explicit(&m->routes[r].by_status[s], memory_order_relaxed);
            if (!v) continue;
            char code[8];
            if (s < N_STATUS - 1)
                snprintf(code, sizeof code, "%d", statuses[s]);
            else
                snprintf(code, sizeof code, "other");
            fb_textbuf_printf(b,
                              "fusebox_http_requests_total{route=\"%s\",method=\"%s\","
                              "code=\"%s\"} %llu\n",
                              name, method, code, (unsigned long long)v);
        }
    }
    fb_textbuf_printf(b, "# HELP fusebox_http_request_duration_seconds Time from the first byte "
                         "of a request to its completion.\n"
                         "# TYPE fusebox_http_request_duration_seconds histogram\n");
    for (int r = 0; r <= m->n_routes; r++) {
        const char *name = r < m->n_routes ? m->names[r] : "unmatched";
        const char *method = r < m->n_routes ? m->methods[r] : "any";
        uint64_t cum = 0;
        uint64_t counts[N_BOUNDS + 1];
        for (int i = 0; i <= N_BOUNDS; i++)
            counts[i] = atomic_load_explicit(&m->routes[r].buckets[i], memory_order_relaxed);
        uint64_t total = 0;
        for (int i = 0; i <= N_BOUNDS; i++)
            total += counts[i];
        if (!total) continue;
        for (int i = 0; i <= N_BOUNDS; i++) {
            cum += counts[i];
            char le[32];
            if (i < N_BOUNDS)
                snprintf(le, sizeof le, "%g", bounds[i]);
            else
                snprintf(le, sizeof le, "+Inf");
            fb_textbuf_printf(b,
                              "fusebox_http_request_duration_seconds_bucket{route=\"%s\","
                              "method=\"%s\",le=\"%s\"} %llu\n",
                              name, method, le, (unsigned long long)cum);
        }
        uint64_t sum_us = atomic_load_explicit(&m->routes[r].sum_us, memory_order_relaxed);
        fb_textbuf_printf(b,
                          "fusebox_http_request_duration_seconds_sum{route=\"%s\",method=\"%s\"} "
                          "%.6f\n",
                          name, method, (double)sum_us / 1e6);
        fb_textbuf_printf(b,
                          "fusebox_http_request_duration_seconds_count{route=\"%s\","
                          "method=\"%s\"} %llu\n",
                          name, method, (unsigned long long)total);
    }
    fb_textbuf_printf(b, "# HELP fusebox_errors_total Failed requests by error code "
                         "(base/errors.h).\n# TYPE fusebox_errors_total counter\n");
    for (int i = 0; i < N_ERRS; i++) {
        if (err_values[i] == FB_OK) continue;
        uint64_t v = atomic_load_explicit(&m->errors[i], memory_order_relaxed);
        fb_textbuf_printf(b, "fusebox_errors_total{code=\"%s\",status=\"%d\"} %llu\n",
                          fb_err_code(err_values[i]), fb_err_http_status(err_values[i]),
                          (unsigned long long)v);
    }
    fair_render(b);
    control_render(b);
}

/* ---- fair-share gauges -------------------------------------------------------- */

typedef struct fair_group {
    char id[64];
    double slowdown, time_share;
} fair_group;

typedef struct fair_device {
    char group[64], worker[64];
    int device;
    double phase_s[4], samples_per_s;
} fair_device;

typedef struct fair_period {
    bool published;
    double max_slowdown, mean_slowdown;
    fair_group *groups;
    int n, cap;
    fair_device *devices;
    int n_dev, cap_dev;
} fair_period;

/* staging: the control loop's own; published: under fair_mu */
static pthread_mutex_t fair_mu = PTHREAD_MUTEX_INITIALIZER;
static fair_period fair_staging, fair_published;
static _Atomic uint64_t fair_periods, fair_changes, fair_migrations;
static bool fair_staging_failed;

void fb_metrics_fair_begin(double max_slowdown, double mean_slowdown)
{
    fair_staging.max_slowdown = max_slowdown;
    fair_staging.mean_slowdown = mean_slowdown;
    fair_staging.n = 0;
    fair_staging.n_dev = 0;
    fair_staging_failed = false;
}

void fb_metrics_fair_group(const char *group_id, double slowdown, double time_share)
{
    if (!group_id || fair_staging_failed) return;
    if (fair_staging.n == fair_staging.cap) {
        int cap = fair_staging.cap ? 2 * fair_staging.cap : 64;
        fair_group *g = realloc(fair_staging.groups, (size_t)cap * sizeof *g);
        if (!g) {
            /* a partial period would look like groups that vanished: skip it whole */
            fair_staging_failed = true;
            return;
        }
        fair_staging.groups = g;
        fair_staging.cap = cap;
    }
    fair_group *g = &fair_staging.groups[fair_staging.n++];
    snprintf(g->id, sizeof g->id, "%s", group_id);
    g->slowdown = slowdown;
    g->time_share = time_share;
}

void fb_metrics_fair_device(const char *group_id, const char *worker, int device,
                            const double phase_s[4], double samples_per_s)
{
    if (!group_id || !worker || !phase_s || fair_staging_failed) return;
    if (fair_staging.n_dev == fair_staging.cap_dev) {
        int cap = fair_staging.cap_dev ? 2 * fair_staging.cap_dev : 64;
        fair_device *dv = realloc(fair_staging.devices, (size_t)cap * sizeof *dv);
        if (!dv) {
            fair_staging_failed = true;
            return;
        }
        fair_staging.devices = dv;
        fair_staging.cap_dev = cap;
    }
    fair_device *dv = &fair_staging.devices[fair_staging.n_dev++];
    snprintf(dv->group, sizeof dv->group, "%s", group_id);
    snprintf(dv->worker, sizeof dv->worker, "%s", worker);
    dv->device = device;
    memcpy(dv->phase_s, phase_s, sizeof dv->phase_s);
    dv->samples_per_s = samples_per_s;
}

void fb_metrics_fair_end(int n_changed)
{
    atomic_fetch_add_explicit(&fair_periods, 1, memory_order_relaxed);
    if (n_changed > 0)
        atomic_fetch_add_explicit(&fair_changes, (uint64_t)n_changed, memory_order_relaxed);
    if (fair_staging_failed) return;
    pthread_mutex_lock(&fair_mu);
    fair_period t = fair_published;
    fair_published = fair_staging;
    fair_published.published = true;
    fair_staging = t;
    pthread_mutex_unlock(&fair_mu);
}

void fb_metrics_fair_migrated(void)
{
    atomic_fetch_add_explicit(&fair_migrations, 1, memory_order_relaxed);
}

static void fair_value(fb_textbuf *b, const char *prefix, double v)
{
    if (isfinite(v))
        fb_textbuf_printf(b, "%s %.9g\n", prefix, v);
    else
        fb_textbuf_printf(b, "%s NaN\n", prefix);
}

static void fair_render(fb_textbuf *b)
{
    fb_textbuf_printf(b,
                      "# HELP fusebox_fair_periods_total Fair-share periods run.\n"
                      "# TYPE fusebox_fair_periods_total counter\nfusebox_fair_periods_total %llu\n"
                      "# HELP fusebox_fair_changes_total Arrays whose time share or batch split "
                      "a period changed.\n# TYPE fusebox_fair_changes_total counter\n"
                      "fusebox_fair_changes_total %llu\n"
                      "# HELP fusebox_fair_migrations_total Arrays moved off an imbalanced "
                      "device.\n# TYPE fusebox_fair_migrations_total counter\n"
                      "fusebox_fair_migrations_total %llu\n",
                      (unsigned long long)atomic_load(&fair_periods),
                      (unsigned long long)atomic_load(&fair_changes),
                      (unsigned long long)atomic_load(&fair_migrations));
    pthread_mutex_lock(&fair_mu);
    if (fair_published.published) {
        fb_textbuf_printf(b, "# HELP fusebox_job_slowdown Slowdown of the running jobs at the "
                             "last fair-share period (1 = as fast as alone).\n"
                             "# TYPE fusebox_job_slowdown gauge\n");
        fair_value(b, "fusebox_job_slowdown{stat=\"max\"}", fair_published.max_slowdown);
        fair_value(b, "fusebox_job_slowdown{stat=\"mean\"}", fair_published.mean_slowdown);
        fb_textbuf_printf(b, "# HELP fusebox_group_slowdown Largest slowdown of an array's "
                             "members.\n# TYPE fusebox_group_slowdown gauge\n");
        char prefix[128];
        for (int i = 0; i < fair_published.n; i++) {
            snprintf(prefix, sizeof prefix, "fusebox_group_slowdown{group=\"%s\"}",
                     fair_published.groups[i].id);
            fair_value(b, prefix, fair_published.groups[i].slowdown);
        }
        fb_textbuf_printf(b, "# HELP fusebox_group_time_share An array's time share of its "
                             "devices (a weight of the workers' step scheduler).\n"
                             "# TYPE fusebox_group_time_share gauge\n");
        for (int i = 0; i < fair_published.n; i++) {
            snprintf(prefix, sizeof prefix, "fusebox_group_time_share{group=\"%s\"}",
                     fair_published.groups[i].id);
            fair_value(b, prefix, fair_published.groups[i].time_share);
        }
        static const char *const phases[4] = {"compute", "comm", "io", "idle"};
        char dprefix[256];
        fb_textbuf_printf(b, "# HELP fusebox_device_step_seconds Where a step's time went on "
                             "each device of a running array, per step, at its last report "
                             "(comm: not hidden by compute; idle: waiting for other devices, "
                             "the pipeline bubble or the array's turn).\n"
                             "# TYPE fusebox_device_step_seconds gauge\n");
        for (int i = 0; i < fair_published.n_dev; i++) {
            const fair_device *dv = &fair_published.devices[i];
            for (int ph = 0; ph < 4; ph++) {
                snprintf(dprefix, sizeof dprefix,
                         "fusebox_device_step_seconds{group=\"%s\",worker=\"%s\",device=\"%d\","
                         "phase=\"%s\"}",
                         dv->group, dv->worker, dv->device, phases[ph]);
                fair_value(b, dprefix, dv->phase_s[ph]);
            }
        }
        fb_textbuf_printf(b, "# HELP fusebox_device_samples_per_second Samples per second of "
                             "the training passes of each device of a running array, smoothed: "
                             "what the batch split follows.\n"
                             "# TYPE fusebox_device_samples_per_second gauge\n");
        for (int i = 0; i < fair_published.n_dev; i++) {
            const fair_device *dv = &fair_published.devices[i];
            snprintf(dprefix, sizeof dprefix,
                     "fusebox_device_samples_per_second{group=\"%s\",worker=\"%s\","
                     "device=\"%d\"}",
                     dv->group, dv->worker, dv->device);
            fair_value(b, dprefix, dv->samples_per_s);
        }
    }
    pthread_mutex_unlock(&fair_mu);
}

/* ---- control-loop phases ------------------------------------------------------ */

static const char *const phase_names[FB_CONTROL_PHASES] = {"plan", "flush", "rebalance"};
static _Atomic uint64_t control_buckets[FB_CONTROL_PHASES][N_BOUNDS + 1]; /* last = +Inf */
static _Atomic uint64_t control_sum_us[FB_CONTROL_PHASES];

void fb_metrics_control(fb_control_phase phase, double seconds)
{
    if ((int)phase < 0 || phase >= FB_CONTROL_PHASES || !(seconds >= 0)) return;
    int i = 0;
    while (i < N_BOUNDS && seconds > bounds[i])
        i++;
    atomic_fetch_add_explicit(&control_buckets[phase][i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&control_sum_us[phase], (uint64_t)(seconds * 1e6),
                              memory_order_relaxed);
}

static _Atomic uint64_t control_ticks;
static _Atomic int64_t control_tick_clock_ms = -1; /* -1: no tick yet */

void fb_metrics_tick(int64_t clock_ms)
{
    atomic_store_explicit(&control_tick_clock_ms, clock_ms, memory_order_relaxed);
    atomic_fetch_add_explicit(&control_ticks, 1, memory_order_release);
}

static void ticks_render(fb_textbuf *b)
{
    uint64_t n = atomic_load_explicit(&control_ticks, memory_order_acquire);
    fb_textbuf_printf(b,
                      "# HELP fusebox_control_ticks_total Ticks fuseboxd's control loop has "
                      "finished.\n"
                      "# TYPE fusebox_control_ticks_total counter\n"
                      "fusebox_control_ticks_total %llu\n",
                      (unsigned long long)n);
    int64_t at = atomic_load_explicit(&control_tick_clock_ms, memory_order_relaxed);
    if (at < 0) return;
    fb_textbuf_printf(b,
                      "# HELP fusebox_control_tick_clock_ms The control loop's clock, in "
                      "milliseconds, when its last finished tick began.\n"
                      "# TYPE fusebox_control_tick_clock_ms gauge\n"
                      "fusebox_control_tick_clock_ms %lld\n",
                      (long long)at);
}

/* ---- workers' last reads ------------------------------------------------------ */

typedef struct seen_slot {
    char name[72]; /* as rendered: escaped for a label value, cut at 64 bytes of the name */
    bool used;
    _Atomic int64_t clock_ms;
} seen_slot;

static seen_slot seen[FB_METRICS_WORKER_SLOTS];
static int seen_hint; /* where the search for a free slot starts */
static pthread_mutex_t seen_mu = PTHREAD_MUTEX_INITIALIZER; /* `used` and `name` */

int fb_metrics_worker_add(const char *name, int64_t clock_ms)
{
    pthread_mutex_lock(&seen_mu);
    int slot = -1;
    for (int k = 0; k < FB_METRICS_WORKER_SLOTS && slot < 0; k++) {
        int i = (seen_hint + k) % FB_METRICS_WORKER_SLOTS;
        if (!seen[i].used) slot = i;
    }
    if (slot >= 0) {
        seen_slot *s = &seen[slot];
        size_t o = 0;
        for (const char *p = name; *p && o + 3 < sizeof s->name && p - name < 64; p++) {
            if (*p == '"' || *p == '\\' || *p == '\n') s->name[o++] = '\\';
            s->name[o++] = *p == '\n' ? 'n' : *p;
        }
        s->name[o] = '\0';
        atomic_store_explicit(&s->clock_ms, clock_ms, memory_order_relaxed);
        s->used = true;
        seen_hint = (slot + 1) % FB_METRICS_WORKER_SLOTS;
    }
    pthread_mutex_unlock(&seen_mu);
    return slot;
}

void fb_metrics_worker_seen(int slot, int64_t clock_ms)
{
    if (slot < 0 || slot >= FB_METRICS_WORKER_SLOTS) return;
    atomic_store_explicit(&seen[slot].clock_ms, clock_ms, memory_order_relaxed);
}

void fb_metrics_worker_remove(int slot)
{
    if (slot < 0 || slot >= FB_METRICS_WORKER_SLOTS) return;
    pthread_mutex_lock(&seen_mu);
    seen[slot].used = false;
    pthread_mutex_unlock(&seen_mu);
}

static void seen_render(fb_textbuf *b)
{
    fb_textbuf_printf(b, "# HELP fusebox_worker_last_seen_clock_ms The control loop's clock, in "
                         "milliseconds, when it last read a message of a registered worker.\n"
                         "# TYPE fusebox_worker_last_seen_clock_ms gauge\n");
    pthread_mutex_lock(&seen_mu);
    for (int i = 0; i < FB_METRICS_WORKER_SLOTS; i++)
        if (seen[i].used)
            fb_textbuf_printf(
                b, "fusebox_worker_last_seen_clock_ms{worker=\"%s\"} %lld\n", seen[i].name,
                (long long)atomic_load_explicit(&seen[i].clock_ms, memory_order_relaxed));
    pthread_mutex_unlock(&seen_mu);
}

static void control_render(fb_textbuf *b)
{
    ticks_render(b);
    seen_render(b);
    fb_textbuf_printf(b, "# HELP fusebox_control_loop_seconds Time of one run of a phase of "
                         "fuseboxd's control loop (plan: the scheduling decision).\n"
                         "# TYPE fusebox_control_loop_seconds histogram\n");
    for (int p = 0; p < FB_CONTROL_PHASES; p++) {
        uint64_t cum = 0;
        for (int i = 0; i <= N_BOUNDS; i++) {
            cum += atomic_load_explicit(&control_buckets[p][i], memory_order_relaxed);
            char le[32];
            if (i < N_BOUNDS)
                snprintf(le, sizeof le, "%g", bounds[i]);
            else
                snprintf(le, sizeof le, "+Inf");
            fb_textbuf_printf(b,
                              "fusebox_control_loop_seconds_bucket{phase=\"%s\",le=\"%s\"} "
                              "%llu\n",
                              phase_names[p], le, (unsigned long long)cum);
        }
        fb_textbuf_printf(
            b, "fusebox_control_loop_seconds_sum{phase=\"%s\"} %.6f\n", phase_names[p],
            (double)atomic_load_explicit(&control_sum_us[p], memory_order_relaxed) / 1e6);
        fb_textbuf_printf(b, "fusebox_control_loop_seconds_count{phase=\"%s\"} %llu\n",
                          phase_names[p], (unsigned long long)cum);
    }
}
