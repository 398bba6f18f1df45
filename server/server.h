/*
 * fuseboxd, the control plane's process: configuration in, a running HTTP
 * API over PostgreSQL out.
 *
 * fb_server_new() connects to PostgreSQL (waiting for it a while), applies
 * the schema migrations, creates the admin tenant and its key file on first
 * start, starts the control loop (docs/architecture.md, "The control loop":
 * planner, scheduler, fair-share, ZeroMQ dispatch) and then the HTTP thread
 * pool, so that jobs accepted over HTTP find the loop running.
 * fb_server_run() blocks until SIGTERM or SIGINT and then shuts down
 * gracefully: it stops accepting connections, lets in-flight requests finish
 * (up to the shutdown timeout), stops the control loop and closes the
 * database pool.
 */
#ifndef FB_SERVER_SERVER_H
#define FB_SERVER_SERVER_H

#include <stddef.h>

#include "config.h"

typedef struct fb_server fb_server;

/*
 * Starts a server for cfg (copied).  The caller must have blocked SIGTERM,
 * SIGINT and SIGPIPE in the calling thread first (fb_server_block_signals)
 * so that the HTTP threads inherit the mask.  Returns NULL with a message in
 * msg on failure (database unreachable past the startup wait, a bad
 * migration, an unwritable data directory, a port in use).
 */
fb_server *fb_server_new(const fb_config *cfg, char *msg, size_t msg_cap);

/* Blocks SIGTERM, SIGINT and SIGPIPE in the calling thread. */
void fb_server_block_signals(void);

/* Waits for SIGTERM or SIGINT, then drains in-flight requests and stops the
 * HTTP daemon.  Returns 0 when every in-flight request finished in time. */
int fb_server_run(fb_server *srv);

/* Frees the server (stopping it first if still running); accepts NULL. */
void fb_server_free(fb_server *srv);

#endif
