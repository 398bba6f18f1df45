/*
 * What the end-to-end dispatch tests share: a fuseboxd (through the server
 * test harness) with its control loop on a free port and a worker allow-list,
 * real fusebox-worker processes on a small synthetic shard dataset, job and
 * sweep helpers over HTTP, and fusebox-train as the reference a fused result
 * must match.
 */
#ifndef FB_TESTS_DISPATCH_E2E_H
#define FB_TESTS_DISPATCH_E2E_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "harness.h"

typedef struct e2e {
    fbt_server s;
    char root[256];     /* the test's scratch directory */
    char data_dir[300]; /* datasets for workers and fusebox-train */
    char worker_key[300];
    char server_pub[300];
    char hook_dir[300]; /* the workers' test step hook (e2e_hold) */
    int worker_port;
    char tenant[40], key[128]; /* a tenant of the test */
    bool own_database;         /* on a database of the test's own (e2e_start_on) */
    /* fuseboxd's manual clock (e2e_start_clocked); NULL: the monotonic clock */
    struct fb_clock_file *clock;
    char clock_path[300];
} e2e;

/* What e2e_start gives fuseboxd: its tick, the workers' heartbeat period and the
 * heartbeat timeout, in milliseconds. */
#define E2E_TICK_MS 100
#define E2E_HEARTBEAT_MS 200
#define E2E_HEARTBEAT_TIMEOUT_MS 1500
/* where a manual clock starts (milliseconds; a multiple of E2E_TICK_MS) */
#define E2E_CLOCK_START_MS 1000000

/* Creates the scratch directory, the dataset "synth" (train and test
 * splits), a worker keypair and the server's data directory with the
 * allow-list, then starts fuseboxd (fast heartbeats) and creates a tenant. */
void e2e_start(e2e *t, const char *const *extra_server_flags);

/* Like e2e_start, but on the database of db_url (libpq conninfo) instead of
 * a fresh one on FUSEBOX_TEST_DATABASE_URL: for a test that stops and starts
 * its own PostgreSQL (pgctl.h).  t->s.sql is connected to it; e2e_finish
 * leaves the database alone. */
void e2e_start_on(e2e *t, const char *db_url, const char *const *extra_server_flags);

/*
 * Like e2e_start, but fuseboxd's control loop reads a manual clock (--test-clock, with
 * FUSEBOX_TEST_HOOKS=1), a file in the scratch directory that starts at
 * E2E_CLOCK_START_MS and moves only by e2e_clock_advance and e2e_clock_set.  So every
 * decision that depends on time (a worker lost, an array requeued, a fair-share period, a
 * plan after a submission beyond the first) is taken at a clock time the test chose, and
 * none while the test's own checks take their real time.  Messages are still answered
 * as they come (a HELLO's WELCOME, a heartbeat's reply), at the clock's current time.
 */
void e2e_start_clocked(e2e *t, const char *const *extra_server_flags);

/* The manual clock's time in milliseconds. */
long long e2e_clock_ms(const e2e *t);

/*
 * Moves the manual clock forward by ms (> 0, a multiple of E2E_TICK_MS) or to ms
 * (a multiple of E2E_TICK_MS past E2E_CLOCK_START_MS, not before the current time), then
 * waits until fuseboxd's control loop has finished its tick at that time
 * (fusebox_control_tick_clock_ms in /metrics), so that what the tick decided is in the
 * database and its messages are sent when these return.  A tick runs at each tick time
 * the clock reaches or passes, once: moving by 3 ticks at once is one tick, at the end.
 * Fails the test, printing the logs, when the tick does not come within 60 s of real
 * time (a liveness bound: no decision depends on it).
 */
void e2e_clock_advance(e2e *t, long long ms);
void e2e_clock_set(e2e *t, long long ms);

/* The control loop's clock when it last read a message of the worker named name
 * (fusebox_worker_last_seen_clock_ms in /metrics), -1 when it has no such worker. */
long long e2e_worker_seen_ms(e2e *t, const char *name);

/* Restarts fuseboxd (after a kill) on the same database, data directory and
 * worker port. */
void e2e_restart_server(e2e *t);

/* Stops fuseboxd, drops the database (not one of e2e_start_on) and removes
 * the scratch directory. */
void e2e_finish(e2e *t);

/* Starts a fusebox-worker named name (log in the scratch directory), with the test step
 * hook on (--test-step-hook t->hook_dir and FUSEBOX_TEST_HOOKS=1), so e2e_hold works. */
pid_t e2e_worker(e2e *t, const char *name);

/* Like e2e_worker, with extra flags after the usual ones (NULL-terminated; NULL for
 * none). */
pid_t e2e_worker_args(e2e *t, const char *name, const char *const *extra);

/* Sends sig to pid and waits for it; returns the exit status or 128 + signal. */
int e2e_kill(pid_t pid, int sig);

/* A job spec on "synth" (static buffer): MLP 16-32-4, Adam, batch 32. */
const char *e2e_spec(const char *name, double lr, int steps, int checkpoint_every);

/* Submits a job for key; returns its id (static buffer). */
const char *e2e_submit(e2e *t, const char *key, const char *spec);
/* Submits a sweep (POST /v1/sweeps body, expecting 201 and n trials) as tenant key: its
 * trials' job ids and names in submission order (names may be NULL). */
void e2e_submit_sweep(e2e *t, const char *key, const char *body, int n, char (*ids)[64],
                      char (*names)[64]);

/* A job's field as text (static buffer), "" when null. */
const char *e2e_job_field(e2e *t, const char *key, const char *id, const char *field);

/* Waits until the job reaches state (or fails the test after timeout_s,
 * printing the logs). */
void e2e_wait_state(e2e *t, const char *key, const char *id, const char *state, int timeout_s);

/* Waits until a SQL query's first cell is "t". */
void e2e_wait_sql(e2e *t, const char *sql, int timeout_s, const char *what);

/* Downloads a job's model into path. */
void e2e_download_model(e2e *t, const char *key, const char *id, const char *path);

/* Runs fusebox-train on spec files (one array) writing into out_dir. */
void e2e_train_reference(e2e *t, const char *const *spec_files, int n, const char *out_dir);
/* The same, data-parallel over devices CPU devices (fusebox-train --devices): the
 * arithmetic of an array spanning that many ranks, each on one thread. */
void e2e_train_reference_on(e2e *t, const char *const *spec_files, int n, const char *out_dir,
                            int devices);

/* Writes text to a file. */
void e2e_write(const char *path, const char *text);

/*
 * Compares two safetensors files tensor by tensor (names, shapes and
 * values); returns the largest absolute difference, or -1 when the names or
 * shapes differ.
 */
double e2e_max_diff(const char *a, const char *b);

/*
 * The workers' test step hook (docs/worker.md), which places a fault at an exact step
 * instead of sizing a job from the machine's speed.  e2e_hold holds the array of job (a
 * job id, or a job's name: a name may be held before its job is submitted, so that no
 * array passes the step first) once it has done `step` steps; it writes the hold file
 * (and removes a held file an earlier hold left behind, say by a worker killed while
 * held).  A later e2e_hold of the same job moves the hold: a held array goes on to the
 * new step.  e2e_wait_held waits up to timeout_s for a worker to hold job and returns
 * the step it holds at (printing the logs and failing the test after timeout_s).
 * e2e_release removes the hold: the array goes on (and a held file a dead worker left).
 */
void e2e_hold(e2e *t, const char *job, long long step);
long long e2e_wait_held(e2e *t, const char *job, int timeout_s);
void e2e_release(e2e *t, const char *job);

/* Prints the server's and workers' logs. */
void e2e_dump(e2e *t);

/*
 * Like e2e_worker, but connecting to the server endpoint `server` (ZeroMQ
 * "tcp://host:port") and started through the command wrapper (a
 * NULL-terminated argv prefix such as {"ip", "netns", "exec", "ns1", NULL};
 * NULL for none): for a worker in another network namespace.
 */
pid_t e2e_worker_via(e2e *t, const char *name, const char *server, const char *const *wrapper);

#endif
