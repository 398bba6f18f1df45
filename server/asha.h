/*
 * Asynchronous successive halving (ASHA: Li et al., "A System for Massively
 * Parallel Hyperparameter Tuning", MLSys 2020) as a pure policy: no I/O, no
 * clock, no state between calls.  fuseboxd's control loop feeds it the
 * results a sweep's trials reported at one rung and applies its decision by
 * detaching the stopped member from its live array; the tests feed it
 * random streams of results.
 *
 * Rungs.  A sweep's rule (fb_asha_spec, parsed by api/sweepspec) puts rung r
 * at step grace_steps * reduction_factor^r for r = 0 .. max_rungs - 1.  A
 * trial reports at a rung once: with the first evaluation at or past the
 * rung's step (fb_asha_rung_at), so an eval cadence that does not hit the
 * rung steps exactly still yields one result per rung.
 *
 * The rule.  Write eta for reduction_factor.  When a trial reports at rung
 * r, let n be the number of results recorded at rung r so far, its own
 * included, from every trial of the sweep (stopped or not).  The trial
 * continues when its result ranks among the best floor(n / eta) of them,
 * which is ASHA's "top 1/eta of the rung"; otherwise it stops.  Two
 * refinements:
 *
 * - Fewer than eta results: the trial continues.  floor(n / eta) is 0 then,
 *   so the plain rule would stop every early arrival.  ASHA never discards
 *   such a trial either: it leaves it in the rung, where it can still be
 *   promoted once more results arrive.  Here stopping is irreversible (the
 *   member leaves its array and ends), so a trial is only stopped when eta
 *   results exist to compare it with, and otherwise continues
 *   optimistically; the price is that the first eta - 1 arrivals at each
 *   rung always continue.
 * - A result that is not a finite number (a diverged trial) ranks below
 *   every finite one, and its own trial stops whatever n is: its weights
 *   cannot recover.
 *
 * Ranking is by metric, better first (smaller for mode min, larger for mode
 * max); equal metrics rank by trial index, smaller first, so the decision
 * does not depend on the order the results are listed in.  The decision
 * does depend on which results have arrived, as in ASHA: it is taken once,
 * when the trial reports, and never revised.
 */
#ifndef FB_SERVER_ASHA_H
#define FB_SERVER_ASHA_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "sweepspec.h"

/* Results one decision may weigh: every trial of the largest sweep. */
#define FB_ASHA_MAX_RESULTS FB_SWEEP_MAX_TRIALS

typedef enum fb_asha_decision { FB_ASHA_CONTINUE, FB_ASHA_STOP } fb_asha_decision;

/* One trial's result at a rung. */
typedef struct fb_asha_result {
    int64_t trial; /* the trial's index in its sweep (>= 0): its identity and the tie-break */
    double metric; /* the rule's metric at the rung; not finite: diverged */
} fb_asha_result;

/*
 * Checks a rule: enabled, mode min or max, grace_steps >= 1,
 * reduction_factor 2..16 and max_rungs 1..32 (api/sweepspec's bounds).
 * Returns FB_OK, or FB_ERR_OUT_OF_RANGE with a message naming the field.
 */
int fb_asha_check(const fb_asha_spec *rule, char *msg, size_t msg_cap);

/*
 * The step of rung `rung` (grace_steps * reduction_factor^rung), or -1 when
 * the rule is invalid, rung is outside 0 .. max_rungs - 1, or the step would
 * not fit in an int64_t (such a rung is never reached).
 */
int64_t fb_asha_rung_step(const fb_asha_spec *rule, int rung);

/*
 * The rung an evaluation at `step` reports for: the highest rung whose step
 * is at most `step`; -1 before the first rung or for an invalid rule.  The
 * caller records at most one result per trial and rung, so a later
 * evaluation below the next rung's step reports for nothing new.
 */
int fb_asha_rung_at(const fb_asha_spec *rule, int64_t step);

/*
 * Decides for trial `trial`, which has just reported at some rung, given
 * all n results recorded at that rung so far, its own among them (in any
 * order; each trial at most once).  On success writes *out and returns
 * FB_OK.  On bad input (an invalid rule, results NULL, n outside
 * 1 .. FB_ASHA_MAX_RESULTS, a negative or repeated trial index, `trial` not
 * among the results) returns a negative fb_err with a message and leaves
 * *out untouched.
 */
int fb_asha_decide(const fb_asha_spec *rule, const fb_asha_result *results, int n, int64_t trial,
                   fb_asha_decision *out, char *msg, size_t msg_cap);

/* "continue" or "stop": the words the database and the API use. */
const char *fb_asha_decision_name(fb_asha_decision d);

#endif
