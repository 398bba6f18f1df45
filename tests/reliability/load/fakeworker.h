/*
 * Fake workers for the load test: many registered workers with running
 * arrays, without the processes.  One thread drives a DEALER socket per
 * fake worker, CURVE-authenticated with the test's worker key like
 * fusebox-worker, and speaks the wire protocol of api/wire.h: HELLO with one
 * CPU device, heartbeats listing its running arrays, a STARTED event for
 * every member it is assigned, PROGRESS for every array at a fixed cadence
 * (steps advancing, made-up loss), and a DETACHED event for every member
 * the server detaches.  It trains nothing, so a hundred arrays fit a small
 * machine while fuseboxd does all the work it does for real ones.
 */
#ifndef FB_TESTS_RELIABILITY_FAKEWORKER_H
#define FB_TESTS_RELIABILITY_FAKEWORKER_H

#include <stdint.h>

typedef struct fw_pool fw_pool;

/*
 * Starts n fake workers named prefix0 .. prefix(n-1) that connect to the
 * server at endpoint ("tcp://127.0.0.1:port") with the server's public key
 * file and the worker keypair file; heartbeat_ms and progress_ms set their
 * cadences.  Fails the test when a socket cannot be set up.
 */
fw_pool *fw_start(const char *endpoint, const char *server_pub_file, const char *worker_key_file,
                  const char *prefix, int n, int heartbeat_ms, int progress_ms);

/* Stops the thread and closes the sockets; accepts NULL. */
void fw_stop(fw_pool *p);

/* Fake workers the server has welcomed. */
int fw_welcomed(fw_pool *p);

/* Arrays running on the fake workers now. */
int fw_arrays(fw_pool *p);

/* ASSIGN messages received so far by worker i, and when the last one
 * arrived (fbt_now_ms clock). */
int64_t fw_assigned(fw_pool *p, int i, double *last_ms);

/* Messages the fake workers could not decode (the server sent something
 * the protocol does not allow): must stay 0. */
int64_t fw_bad_messages(fw_pool *p);

/* Arrays the fake workers gave up because the server assigned their
 * members again in a new array: it had taken a live worker for lost. */
int64_t fw_stale_arrays(fw_pool *p);

#endif
