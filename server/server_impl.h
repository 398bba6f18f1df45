/*
 * The server's state as the HTTP layer and the route handlers see it.
 * Private to server/: everything outside uses the opaque fb_server of
 * server.h.
 */
#ifndef FB_SERVER_SERVER_IMPL_H
#define FB_SERVER_SERVER_IMPL_H

#include <limits.h>
#include <libpq-fe.h>
#include <pthread.h>
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
    struct fb_dispatch *dispatch; /* the control loop (dispatch.h); NULL while standby */
    /* the control lock (server.c, "control lock"): the keeper thread alone starts and stops
     * the loop after fb_server_new; standby_pg is its connection while it waits for the
     * lock, which becomes the loop's own once the lock is taken */
    pthread_t keeper;
    bool keeper_ready, keeper_started;  /* keeper_mu and keeper_cv made; the thread runs */
    bool keeper_stop, keeper_wake;      /* under keeper_mu */
    pthread_mutex_t keeper_mu;
    pthread_cond_t keeper_cv;
    PGconn *standby_pg;
    bool standby_said;         /* "control loop: standby" logged since the last change */
    atomic_bool control_active; /* this process's control loop runs (/readyz) */
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
