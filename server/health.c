/*
 * GET /healthz (the process answers), GET /readyz (the database answers and
 * has every migration this binary knows) and GET /metrics (Prometheus text:
 * request counters plus job gauges read from the database at scrape time).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "routes.h"
#include "server_impl.h"

int fb_route_healthz(fb_req *req)
{
    fb_req_reply_json(req, 200, json_pack("{s:s}", "status", "ok"));
    return FB_OK;
}

typedef struct ready_ctx {
    int schema;
} ready_ctx;

static int ready_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    ready_ctx *x = arg;
    int err;
    PGresult *r =
        fb_db_query(c, "readyz", "SELECT coalesce(max(version), 0) FROM schema_migrations", 0, NULL,
                    &err, msg, msg_cap);
    if (!r) return err;
    x->schema = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return FB_OK;
}

int fb_route_readyz(fb_req *req)
{
    ready_ctx x = {0};
    if (atomic_load(&req->srv->draining))
        return fb_req_fail(req, FB_ERR_UNAVAILABLE, NULL, "fuseboxd is shutting down");
    if (fb_route_txn(req, ready_txn, &x)) return FB_ERR_UNAVAILABLE;
    if (x.schema < req->srv->schema_latest)
        return fb_req_fail(req, FB_ERR_UNAVAILABLE, NULL,
                           "the database schema is at %d, fuseboxd needs %d", x.schema,
                           req->srv->schema_latest);
    fb_req_reply_json(req, 200,
                      json_pack("{s:s, s:s, s:i, s:s}", "status", "ready", "database", "ok",
                                "schema_version", x.schema, "control_loop",
                                atomic_load(&req->srv->control_active) ? "active" : "standby"));
    return FB_OK;
}

typedef struct gauge_ctx {
    fb_textbuf *b;
} gauge_ctx;

static int gauges_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    gauge_ctx *g = arg;
    int err;
    PGresult *r = fb_db_query(c, "metrics_jobs",
                              "SELECT s.state, count(j.state) FROM unnest(ARRAY['queued',"
                              "'scheduled','running','completed','failed','cancelled']) s(state)"
                              " LEFT JOIN jobs j ON j.state = s.state GROUP BY s.state"
                              " ORDER BY s.state",
                              0, NULL, &err, msg, msg_cap);
    if (!r) return err;
    fb_textbuf_printf(g->b, "# HELP fusebox_jobs Jobs by state.\n# TYPE fusebox_jobs gauge\n");
    long long queued = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        fb_textbuf_printf(g->b, "fusebox_jobs{state=\"%s\"} %s\n", PQgetvalue(r, i, 0),
                          PQgetvalue(r, i, 1));
        if (strcmp(PQgetvalue(r, i, 0), "queued") == 0) queued = atoll(PQgetvalue(r, i, 1));
    }
    PQclear(r);
    fb_textbuf_printf(g->b,
                      "# HELP fusebox_queue_depth Jobs waiting for devices.\n"
                      "# TYPE fusebox_queue_depth gauge\nfusebox_queue_depth %lld\n",
                      queued);
    return FB_OK;
}

int fb_route_metrics(fb_req *req)
{
    fb_textbuf b = {0};
    fb_metrics_render(req->srv->metrics, &b);
    gauge_ctx g = {&b};
    char msg[FB_MSG_MAX];
    int db_up = fb_db_run(req->srv->db, gauges_txn, &g, msg, sizeof msg) == FB_OK;
    fb_textbuf_printf(&b,
                      "# HELP fusebox_database_up Whether the last scrape reached "
                      "PostgreSQL.\n# TYPE fusebox_database_up gauge\nfusebox_database_up %d\n",
                      db_up);
    fb_textbuf_printf(&b,
                      "# HELP fusebox_db_connections_open Open PostgreSQL connections.\n"
                      "# TYPE fusebox_db_connections_open gauge\n"
                      "fusebox_db_connections_open %d\n",
                      fb_db_pool_open_count(req->srv->db));
    fb_textbuf_printf(&b,
                      "# HELP fusebox_control_loop_active Whether this fuseboxd holds the "
                      "control lock and runs the control loop (0: standby).\n"
                      "# TYPE fusebox_control_loop_active gauge\n"
                      "fusebox_control_loop_active %d\n",
                      atomic_load(&req->srv->control_active) ? 1 : 0);
    fb_textbuf_printf(&b,
                      "# HELP fusebox_http_in_flight Requests being served.\n"
                      "# TYPE fusebox_http_in_flight gauge\nfusebox_http_in_flight %d\n",
                      atomic_load(&req->srv->in_flight));
    if (b.failed) {
        free(b.data);
        return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory rendering metrics");
    }
    fb_req_reply_text(req, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len);
    free(b.data);
    return FB_OK;
}
