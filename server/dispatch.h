/*
 * The control loop of fuseboxd: one thread that owns the workers' ZeroMQ
 * socket (ROUTER, CURVE, a ZAP handler that admits only listed worker keys)
 * and every scheduling decision.  It wakes on worker messages, on
 * PostgreSQL notifications (jobs submitted or cancelled) and on a tick, and:
 *
 * - registers workers (HELLO), answers heartbeats, declares silent workers
 *   lost and returns their jobs to the queue with their last checkpoint;
 * - feeds the planner and scheduler (planner.h) a snapshot of the queue and
 *   the cluster, records their decisions (groups, queue reasons, time
 *   shares) and sends ASSIGN and REBALANCE;
 * - records progress, events, checkpoints and models (written into the
 *   artifacts directory) and acknowledges each event once it is committed;
 *   when PostgreSQL is away, reports wait in memory and are written when it
 *   returns;
 * - detaches cancelled members from their running arrays.
 *
 * HTTP handlers never talk to it: they write jobs, and PostgreSQL tells it.
 * The wire protocol is docs/wire.md.
 */
#ifndef FB_SERVER_DISPATCH_H
#define FB_SERVER_DISPATCH_H

#include <stddef.h>

#include "config.h"

typedef struct fb_dispatch fb_dispatch;

/*
 * Creates the server's CURVE keypair on first start (cfg->server_key, with
 * the public half beside it in <server_key>.pub), binds cfg->worker_listen,
 * writes cfg->worker_port_file, and starts the control-loop thread.
 * artifacts is the canonical artifacts directory.  Returns NULL with msg
 * filled when the key, the endpoint or the thread cannot be set up.
 */
fb_dispatch *fb_dispatch_start(const fb_config *cfg, const char *artifacts, char *msg,
                                 size_t msg_cap);

/* Stops the loop (pending reports are flushed when the database is up),
 * closes the socket and frees everything.  Accepts NULL. */
void fb_dispatch_stop(fb_dispatch *d);

#endif
