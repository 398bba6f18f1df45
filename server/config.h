/*
 * fuseboxd's configuration: command-line flags, each with an environment
 * variable fallback (FUSEBOX_<FLAG>, e.g. --database-url and
 * FUSEBOX_DATABASE_URL), checked with bounds before anything starts.  A flag
 * given on the command line wins over the variable, which wins over the
 * default.  `fuseboxd --help` prints the table fb_config_usage() writes.
 */
#ifndef FB_SERVER_CONFIG_H
#define FB_SERVER_CONFIG_H

#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>

#include "log.h"

#define FB_CONFIG_PATH_MAX 1024
#define FB_CONFIG_URL_MAX 2048
#define FB_CONFIG_ROOTS_MAX 4096 /* --import-roots, all roots together */
#define FB_CONFIG_MAX_ROOTS 16   /* --import-roots, how many */

typedef struct fb_config {
    char listen[64];                        /* IPv4 address to bind, default 127.0.0.1 */
    int port;                               /* 0 = any free port (see port_file) */
    char port_file[FB_CONFIG_PATH_MAX];     /* written with the bound port once listening */
    char database_url[FB_CONFIG_URL_MAX];   /* libpq connection string or URI */
    char data_dir[FB_CONFIG_PATH_MAX];      /* admin key file lives here */
    char artifacts_dir[FB_CONFIG_PATH_MAX]; /* checkpoints and models; default data_dir/artifacts */
    char schema_dir[FB_CONFIG_PATH_MAX];    /* schema/NNN_*.sql migrations */
    char web_dir[FB_CONFIG_PATH_MAX];       /* the dashboard's files; "" serves none */
    size_t max_body_bytes;                  /* request bodies above this get 413 */
    int threads;                            /* HTTP worker threads */
    int db_pool;                            /* PostgreSQL connections */
    int max_connections;                    /* concurrent HTTP connections */
    int connection_timeout_s;               /* idle HTTP connection limit */
    int request_timeout_ms;                 /* per-statement limit inside PostgreSQL */
    int db_wait_ms;                         /* waiting for a pooled connection or a reconnect */
    int startup_wait_s;                     /* waiting for PostgreSQL at start */
    int json_max_depth;                     /* nesting of arrays and objects in bodies */
    int shutdown_timeout_s;                 /* SIGTERM: time in-flight requests get */
    fb_log_level log_level;
    /* the control loop and the workers' socket */
    char worker_listen[256];                /* ZeroMQ endpoint the workers connect to */
    char worker_port_file[FB_CONFIG_PATH_MAX]; /* written with the bound worker port */
    char server_key[FB_CONFIG_PATH_MAX];    /* CURVE keypair file; default DATA_DIR/server.key */
    char worker_keys[FB_CONFIG_PATH_MAX];   /* allowed worker public keys; DATA_DIR/worker-keys */
    int heartbeat_ms;                       /* workers' heartbeat period */
    int heartbeat_timeout_ms;               /* a worker silent this long is lost */
    int tick_ms;                            /* control-loop period */
    int max_array;                          /* members per fused array; 1 disables fusion */
    int max_groups_per_device;              /* arrays co-located on one device */
    int rebalance_ms;                       /* fair-share period; 0 = off */
    int control_lock_poll_ms;               /* a standby asks for the control lock this often */
    /* datasets (routes_datasets.c) */
    char datasets_dir[FB_CONFIG_PATH_MAX];  /* tenants' datasets; default DATA_DIR/datasets */
    char import_roots[FB_CONFIG_ROOTS_MAX]; /* colon-separated roots imports may read; "" none */
    char data_tool[FB_CONFIG_PATH_MAX];     /* the fusebox-data executable */
    char builtin_dir[FB_CONFIG_PATH_MAX];   /* built-in datasets' IDX files */
    /* comma-separated names of datasets every worker's data directory holds, which every
     * tenant may train on like the built-ins; "" = the built-ins only */
    char public_datasets[FB_CONFIG_PATH_MAX];
    /* for tests only: the clock file the control loop reads its time from (base/clock.h);
     * "" = the monotonic clock.  Accepted only with FUSEBOX_TEST_HOOKS=1 in the
     * environment (FB_CONFIG_TEST_HOOKS_ENV) */
    char test_clock[FB_CONFIG_PATH_MAX];
} fb_config;

/* The environment variable that must be exactly "1" for a test hook (--test-clock) to be
 * accepted: the same one fusebox-worker's --test-step-hook needs. */
#define FB_CONFIG_TEST_HOOKS_ENV "FUSEBOX_TEST_HOOKS"

/*
 * Makes this process's clock the test clock file of cfg->test_clock, if one is set
 * (fb_clock_use_file).  FB_OK, or a negative fb_err with a message naming the flag and
 * what is wrong with the file; fuseboxd then does not start.
 */
int fb_config_apply_test_clock(const fb_config *cfg, char *msg, size_t msg_cap);

/* Fills cfg with the defaults (no database URL). */
void fb_config_defaults(fb_config *cfg);

/*
 * Reads the environment, then argv, into cfg (which should hold the
 * defaults).  Returns FB_OK, 1 when --help or --version was handled (the text
 * went to stdout; the caller exits 0), or a negative fb_err with a message
 * naming the flag.  Derived defaults (artifacts_dir) are filled here.
 */
int fb_config_parse(fb_config *cfg, int argc, char **argv, char *msg, size_t msg_cap);

/*
 * Whether a job spec may name dataset `name` without the tenant having
 * registered it: a public built-in (fashion-mnist, mnist) or one of the
 * comma-separated names of list (--public-datasets).
 */
bool fb_config_dataset_public(const char *list, const char *name);

/* Prints the flag table with defaults and environment variables. */
void fb_config_usage(FILE *out);

#endif
