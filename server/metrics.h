/*
 * Request counters for GET /metrics (Prometheus text format 0.0.4).
 *
 * Counts requests by route and status, a latency histogram per route, and
 * client and server errors by fb_err code; serves the fair-share controller's
 * slowdown and time-share gauges.  Every counter is a C11 atomic, so
 * the HTTP threads record without locks.  Gauges that live in the database
 * (jobs by state, queue depth) are appended by the caller at scrape time.
 */
#ifndef FB_SERVER_METRICS_H
#define FB_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct fb_metrics fb_metrics;

/* Text buffer that grows; used to render the exposition. */
typedef struct fb_textbuf {
    char *data;
    size_t len, cap;
    int failed; /* an allocation failed; data holds what fit */
} fb_textbuf;

/* Appends printf-formatted text. */
void fb_textbuf_printf(fb_textbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Creates counters for n_routes routes named by route_names (route templates
 * such as "/v1/jobs/{id}", borrowed for the lifetime of the metrics); index
 * n_routes stands for requests that matched no route.  NULL when out of memory.
 */
fb_metrics *fb_metrics_new(int n_routes, const char *const *route_names,
                           const char *const *route_methods);

/* Frees the counters; accepts NULL. */
void fb_metrics_free(fb_metrics *m);

/* Records one finished request: route index (n_routes = none), HTTP status,
 * latency in seconds, and the fb_err code when it failed (0 otherwise). */
void fb_metrics_record(fb_metrics *m, int route, int status, double seconds, int err);

/* Appends every counter and histogram to b, and the fair-share gauges below
 * once the control loop has published them. */
void fb_metrics_render(fb_metrics *m, fb_textbuf *b);

/*
 * Fair-share gauges.  The control loop (dispatch.c) publishes the outcome of
 * each fair-share period here; the scrape renders the latest one.  They are
 * process-wide rather than part of an fb_metrics because the control loop
 * does not hold the HTTP side's counters: one fuseboxd runs one control loop.
 * A period is published by fb_metrics_fair_begin, one fb_metrics_fair_group
 * per running group, then fb_metrics_fair_end, all from one thread (the
 * control loop's); the scrape sees either the previous period or this one,
 * never a mix.  group_id is copied (at most 63 characters).  A value that is
 * not finite is rendered as NaN.
 */
void fb_metrics_fair_begin(double max_slowdown, double mean_slowdown);
void fb_metrics_fair_group(const char *group_id, double slowdown, double time_share);
/*
 * One device of a running group, published within the same period: its
 * latest step time breakdown per step in seconds (phase_s: compute,
 * communication not hidden, I/O wait, idle) and its speed (samples per
 * second of its training passes; 0 = not measured).  Rendered as
 * fusebox_device_step_seconds{group,worker,device,phase} and
 * fusebox_device_samples_per_second{group,worker,device}: one series per
 * device of a running group, so the count stays bounded by the devices in
 * use.  group_id and worker are copied (at most 63 characters each).
 */
void fb_metrics_fair_device(const char *group_id, const char *worker, int device,
                            const double phase_s[4], double samples_per_s);
/* n_changed: groups whose share or split the period changed. */
void fb_metrics_fair_end(int n_changed);
/* Counts one migration the controller started. */
void fb_metrics_fair_migrated(void);

/* The control loop's phases, timed by fb_metrics_control. */
typedef enum fb_control_phase {
    FB_CONTROL_PLAN,      /* one plan: read the queue, decide, write and send assignments */
    FB_CONTROL_FLUSH,     /* one flush of queued progress reports */
    FB_CONTROL_REBALANCE, /* one fair-share period */
    FB_CONTROL_PHASES
} fb_control_phase;

/*
 * Records that one run of a control-loop phase took `seconds`; rendered by
 * fb_metrics_render as the histogram fusebox_control_loop_seconds{phase}.
 * Process-wide and lock-free, like the fair-share gauges: the control loop
 * records, HTTP threads render.
 */
void fb_metrics_control(fb_control_phase phase, double seconds);

/*
 * Records that the control loop finished a tick that began at clock_ms on
 * its clock (base/clock.h); rendered as the counter
 * fusebox_control_ticks_total and the gauge fusebox_control_tick_clock_ms.
 * They show that the loop is alive, and a test on a manual clock waits for
 * the gauge to reach the time it set before it looks at the decisions of
 * that tick.
 */
void fb_metrics_tick(int64_t clock_ms);

/*
 * The control loop's clock when it last read a message of each registered
 * worker, rendered as the gauge fusebox_worker_last_seen_clock_ms{worker}:
 * how long a worker has been silent is the tick's clock minus it (an alert
 * rule's input), and a test on a manual clock waits for a worker to have been
 * read at the time it set.  fb_metrics_worker_add gives a registered worker
 * its slot (-1 when all FB_METRICS_WORKER_SLOTS are taken: it goes
 * unpublished), fb_metrics_worker_seen records a read (lock-free: it is
 * called for every message), fb_metrics_worker_remove frees the slot of a
 * dropped worker; -1 is ignored by both.  One thread, the control loop's,
 * calls the three.
 */
#define FB_METRICS_WORKER_SLOTS 4096
int fb_metrics_worker_add(const char *name, int64_t clock_ms);
void fb_metrics_worker_seen(int slot, int64_t clock_ms);
void fb_metrics_worker_remove(int slot);

#endif
