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

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "config.h"

typedef struct fb_dispatch fb_dispatch;

/*
 * The control lock: a PostgreSQL session advisory lock that one fuseboxd of
 * a database holds for as long as its control loop runs (docs/deploy.md,
 * "One control loop").  It is the two-integer form of the advisory locks,
 * whose keys never meet the one-bigint keys of the migration lock
 * (migrate.c) and of dataset imports (routes_datasets*.c).  The SQL answers
 * one boolean: whether this session holds the lock now.
 */
#define FB_CONTROL_LOCK_SQL "SELECT pg_try_advisory_lock(746029052, 1)"

/*
 * Creates the server's CURVE keypair on first start (cfg->server_key, with
 * the public half beside it in <server_key>.pub), binds cfg->worker_listen,
 * writes cfg->worker_port_file, and starts the control-loop thread.
 * artifacts is the canonical artifacts directory.  locked is a connection
 * whose session holds the control lock (FB_CONTROL_LOCK_SQL answered true):
 * it becomes the loop's own connection, taken over whatever happens (on
 * failure it is closed, which releases the lock).  When that connection is
 * lost the loop takes the lock again on its next one before it writes
 * anything; if another session holds it by then, the loop steps down
 * (fb_dispatch_stepped_down) and calls on_step_down(arg) from its thread, when
 * not NULL, so the caller hears of it at once.  Returns NULL with msg filled
 * when the key, the endpoint or the thread cannot be set up.
 */
fb_dispatch *fb_dispatch_start(const fb_config *cfg, const char *artifacts, PGconn *locked,
                               void (*on_step_down)(void *arg), void *arg, char *msg,
                               size_t msg_cap);

/* Whether the loop found the control lock held by another session and stopped
 * (its socket still bound until fb_dispatch_stop).  Any thread may ask. */
bool fb_dispatch_stepped_down(fb_dispatch *d);

/* Stops the loop (pending reports are flushed when the database is up),
 * closes the socket and frees everything.  Accepts NULL. */
void fb_dispatch_stop(fb_dispatch *d);

#endif
