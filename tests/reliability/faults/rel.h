/*
 * What the fault scripts of the reliability suite share, on top of the
 * end-to-end dispatch helpers (tests/dispatch/e2e.h): how many rounds a
 * script runs (a short mode for ctest, a long one for the benchmark), sweeps
 * of an MLP sized from the speed this machine trains it at, and the
 * comparison of each job's model with an uninterrupted fusebox-train run of
 * the same specs.  Every script prints one "result:" line of counts that
 * bench/reliability/run.sh collects into docs/RELIABILITY.md's table.
 */
#ifndef FB_TESTS_RELIABILITY_REL_H
#define FB_TESTS_RELIABILITY_REL_H

#include "e2e.h"

/* At most this many trials in one sweep of these helpers. */
#define REL_MAX_TRIALS 4

/*
 * The number of rounds: "--rounds N" on the command line (1..1000), else
 * long_rounds with "--long" or FUSEBOX_RELIABILITY_LONG=1 in the environment,
 * else short_rounds (what ctest runs).  Any other argument fails the test
 * with a usage line.
 */
int rel_rounds(int argc, char **argv, int short_rounds, int long_rounds);

/* A sweep over lr (lrs: a JSON list of n numbers, n <= REL_MAX_TRIALS) of
 * the MLP above; fills ids and names in grid order (the array's order).
 * Sweeps that differ in data_seed never fuse but train at the same speed. */
void rel_sweep(e2e *t, const char *name, int hidden, int batch, int data_seed, int steps,
               int checkpoint_every, const char *lrs, int n, char (*ids)[64], char (*names)[64]);

/*
 * Trains the jobs' specs (as stored by the server) as one array with
 * fusebox-train and returns the largest max |difference| between a job's
 * model and the reference's; fails the test when a model is missing or its
 * tensors differ in names or shapes.
 */
double rel_max_diff_to_reference(e2e *t, char (*ids)[64], char (*names)[64], int n,
                                 const char *tag);

/* The first cell of a query as a number; fails the test on NULL. */
long long rel_sql_ll(e2e *t, const char *sql);

/* Sleeps ms milliseconds. */
void rel_sleep_ms(int ms);

/* SHA-256 of a file in hex (static buffer); "" when it cannot be read. */
const char *rel_file_sha256(const char *path);

/*
 * Writes zeros into the file filler (created or truncated) until its file
 * system is full, the last bytes too, and returns the bytes written; the
 * caller may give some back with ftruncate.  Fails the test on any error
 * but ENOSPC.
 */
long long rel_fill_disk(const char *filler);

/* How many lines of file contain text (grep -c); 0 when it cannot be read. */
int rel_count_in(const char *file, const char *text);

/*
 * Waits until rel_count_in(file, text) is at least n, polling every 20 ms; fails the
 * test after timeout_s, printing the logs.  The timeout is a liveness bound only: what
 * the caller checks afterwards is the order of events, never how long this took.
 */
void rel_wait_count(e2e *t, const char *file, const char *text, int n, int timeout_s,
                    const char *what);

#endif
