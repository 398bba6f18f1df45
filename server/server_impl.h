/*
 * The server's state as the HTTP layer and the route handlers see it.
 * Private to server/: everything outside uses the opaque fb_server of
 * server.h.
 */
#ifndef FB_SERVER_SERVER_IMPL_H
#define FB_SERVER_SERVER_IMPL_H

#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "auth.h"
#include "config.h"
#include "db.h"
#include "http.h"
#include "metrics.h"

struct MHD_Daemon;
struct fb_dispatch;

struct fb_server {
    fb_config cfg;
    fb_db_pool *db;
    fb_auth *auth;
    fb_metrics *metrics;
    struct MHD_Daemon *mhd;
    fb_http_routes routes;        /* what mhd serves (fb_http_start) */
    struct fb_dispatch *dispatch; /* the control loop (dispatch.h) */
    int port;                      /* bound port */
    int schema_latest;             /* highest migration version this binary knows */
    char artifacts_real[PATH_MAX]; /* canonical artifacts directory ("" when absent) */
    int web_fd;                    /* the dashboard's directory (routes_static.c), -1 when absent */
    char instance[9];              /* random hex prefix of request ids */
    atomic_uint_fast64_t next_request;
    atomic_int in_flight; /* requests between first byte and completion */
    atomic_bool draining; /* SIGTERM received */
};

#endif
