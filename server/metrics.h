/*
 * Request counters for GET /metrics (Prometheus text format 0.0.4).
 *
 * Counts requests by route and status, a latency histogram per route, and
 * client and server errors by fb_err code.  Every counter is a C11 atomic, so
 * the HTTP threads record without locks.  Gauges that live in the database
 * (jobs by state, queue depth) are appended by the caller at scrape time.
 */
#ifndef FB_SERVER_METRICS_H
#define FB_SERVER_METRICS_H

#include <stddef.h>

typedef struct fb_metrics fb_metrics_t;

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
fb_metrics_t *fb_metrics_new(int n_routes, const char *const *route_names,
                             const char *const *route_methods);

/* Frees the counters; accepts NULL. */
void fb_metrics_free(fb_metrics_t *m);

/* Records one finished request: route index (n_routes = none), HTTP status,
 * latency in seconds, and the fb_err code when it failed (0 otherwise). */
void fb_metrics_record(fb_metrics_t *m, int route, int status, double seconds, int err);

/* Appends every counter and histogram to b. */
void fb_metrics_render(fb_metrics_t *m, fb_textbuf *b);

#endif
