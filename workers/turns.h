/*
 * Device turns (private to workers/): which of the groups placed on a
 * worker's devices steps next.  Stride scheduling at step granularity: each
 * group has a virtual time per device, advanced by (its step's duration / its
 * time share) after each step; the group that is least ahead goes next, so
 * over time each group gets device time in proportion to its share whatever
 * its step length.  A group may span devices: it takes all of them at once
 * for each step.  docs/worker.md ("Device turns") describes the policy.
 *
 * Two layers.  The core (fb_turns) is pure: every call takes the time "now"
 * and the charges as arguments, changes the state and grants turns to the
 * groups that may go; it has no threads, no locks and reads no clock, so a
 * unit test drives it step by step and asserts every grant.  The wrapper
 * (fb_turns_sync) holds one core behind a mutex for the agent's group
 * threads: a thread asks, sleeps until the core has granted it its turn,
 * steps and ends its turn with the step's charge; it reads time through
 * base/clock.h only.
 *
 * Scripted mode (a test hook: --test-step-ms, docs/worker.md) makes the turn
 * order a pure function of the scripted step times and of the clock's steps:
 * each group's step lasts exactly its scripted time on the clock and is
 * charged that; a device waits without a deadline for a group ahead of the
 * others that is between two steps (no wait bounded in real time); and every
 * event (a step's end, a group's next ask, a join) carries the time it happens
 * at in the script and is taken in the order of those times, whichever thread
 * brings it first (fb_turns_is_next).
 */
#ifndef FB_WORKERS_TURNS_H
#define FB_WORKERS_TURNS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FB_TURNS_MAX_DEVICES 64 /* = FB_WIRE_MAX_DEVICES, which agent_group.c checks */

/* Where a group stands in the turns. */
typedef enum fb_turn_state {
    FB_TURN_OUT,     /* not in the rotation (before fb_turns_join, after fb_turns_leave) */
    FB_TURN_BETWEEN, /* in the rotation, between two of its steps */
    FB_TURN_WAITING, /* asked for its turn */
    FB_TURN_STEPPING, /* holds its devices */
    FB_TURN_PARKED,  /* held away by the test step hook: no one waits for it */
} fb_turn_state;

/* One group's place in the turns, embedded in the caller's group.  Set up by
 * fb_turn_init; every field is the core's (read fb_turn_share and
 * fb_turn_granted rather than the fields). */
typedef struct fb_turn {
    uint64_t ticket; /* breaks ties of lead: the older group first */
    double share;    /* its time share, (0, 1] */
    int n_devs;
    int devs[FB_TURNS_MAX_DEVICES]; /* the devices it steps on: distinct, ascending */
    fb_turn_state state;
    double vtime[FB_TURNS_MAX_DEVICES]; /* its virtual time (ms) on device k, for k in devs */
    struct fb_turn *dev_next[FB_TURNS_MAX_DEVICES]; /* the next group on device k */
    struct fb_turn *next;                           /* every group in the rotation */
    /* the wait for a leader between two steps (real mode): its deadline, once it began */
    bool lw_started, lw_expired;
    int64_t lw_deadline_ns;
    /* scripted mode: its step length, the time it is at, the end of its step in progress */
    int64_t step_ns;
    int64_t at_ns, end_ns;
    uint64_t steps; /* turns it was granted */
    /* its last ask and how long it waited for that turn (scripted: times of the script) */
    int64_t asked_ns, waited_ns;
    void *user;     /* the caller's (the agent's group) */
} fb_turn;

/* What the core reports of its decisions, for a test log (may be NULL). */
typedef enum fb_turn_event { FB_TURN_EV_JOIN, FB_TURN_EV_GRANT, FB_TURN_EV_DONE,
                             FB_TURN_EV_LEAVE, FB_TURN_EV_SHARE } fb_turn_event;
typedef void (*fb_turns_event_fn)(void *user, fb_turn_event ev, const fb_turn *g, int64_t at_ns,
                                  double value);

/* The core: the devices' groups and busy flags. */
typedef struct fb_turns {
    int n_devices;
    bool busy[FB_TURNS_MAX_DEVICES];
    fb_turn *dev_groups[FB_TURNS_MAX_DEVICES];
    fb_turn *all; /* the rotation, by ticket */
    int64_t leader_wait_ns;
    bool scripted;
    fb_turns_event_fn on_event;
    void *event_user;
} fb_turns;

/*
 * Prepares a group's place: ticket (unique, older groups smaller), share in (0, 1], its
 * devices devs[0..n) (each in [0, n_devices), repeats allowed: each counts once), and, in
 * scripted mode, its step length step_ns (> 0; 0 otherwise).  FB_OK, or
 * FB_ERR_OUT_OF_RANGE with msg saying what is wrong (g untouched).
 */
int fb_turn_init(fb_turn *g, int n_devices, uint64_t ticket, double share, const int *devs, int n,
                 int64_t step_ns, void *user, char *msg, size_t msg_cap);

/* Its time share, and whether it holds its devices now. */
double fb_turn_share(const fb_turn *g);
bool fb_turn_granted(const fb_turn *g);

/* An empty core of n_devices (1..FB_TURNS_MAX_DEVICES) devices.  leader_wait_ns: how long a
 * device may stay idle for a group ahead that is between two steps (real mode; ignored when
 * scripted, where it waits for it).  on_event (may be NULL) hears every decision. */
void fb_turns_init(fb_turns *t, int n_devices, int64_t leader_wait_ns, bool scripted,
                   fb_turns_event_fn on_event, void *event_user);

/* Enters g (FB_TURN_OUT, prepared) into the rotation of each of its devices at the smallest
 * virtual time there, so that it neither waits for the groups there to catch up nor jumps
 * ahead of them.  now_ns is the time it joins at (scripted: the time it is at). */
void fb_turns_join(fb_turns *t, fb_turn *g, int64_t now_ns);

/* Takes g out of the rotation (from any state: a turn it holds ends uncharged); groups that
 * waited for it may go. */
void fb_turns_leave(fb_turns *t, fb_turn *g, int64_t now_ns);

/* g asks for its turn on all its devices at once (from BETWEEN or PARKED); it may be granted
 * at once (fb_turn_granted). */
void fb_turns_ask(fb_turns *t, fb_turn *g, int64_t now_ns);

/* g gives up waiting (a stop or drain came first), or gives back a turn it was granted
 * without stepping: BETWEEN again, uncharged (scripted: at the end the grant gave it). */
void fb_turns_cancel(fb_turns *t, fb_turn *g, int64_t now_ns);

/* g (STEPPING) ends its turn and is charged charge_ms of device time on each of its devices,
 * weighted by its share; BETWEEN again.  Scripted: the charge is its step length whatever
 * charge_ms says, and the step ends at the end the grant gave it. */
void fb_turns_done(fb_turns *t, fb_turn *g, double charge_ms, int64_t now_ns);

/* Parks g (BETWEEN, held by the test step hook, so that no device waits for it) or brings it
 * back (BETWEEN). */
void fb_turns_park(fb_turns *t, fb_turn *g, bool parked, int64_t now_ns);

/* A new time share in (0, 1] for the charges from now on (in any state); FB_OK, or
 * FB_ERR_OUT_OF_RANGE with msg (nothing changes). */
int fb_turns_set_share(fb_turns *t, fb_turn *g, double share, int64_t now_ns, char *msg,
                       size_t msg_cap);

/* Grants what may go at now_ns (a leader's wait may have run out).  Returns the earliest
 * time at which a wait runs out, INT64_MAX when none is pending. */
int64_t fb_turns_poll(fb_turns *t, int64_t now_ns);

/*
 * Scripted mode takes events in the order of their times in the script, whichever thread
 * brings one first: a group's next event is its step's end (done or given back) when it
 * steps, and the time it is at when it is between two steps (it asks, parks or leaves
 * then).  fb_turns_is_next: whether g's next event is the earliest of every group's (at the
 * same time, the older ticket first); always true in real mode.  fb_turns_may_end: whether
 * g (stepping) may end its turn at now_ns: real mode, yes; scripted, when its end has come
 * and it is next.  fb_turns_may_join: whether a group may join at now_ns: scripted, once
 * every event up to now_ns has been taken.
 */
bool fb_turns_is_next(const fb_turns *t, const fb_turn *g);
bool fb_turns_may_end(const fb_turns *t, const fb_turn *g, int64_t now_ns);
bool fb_turns_may_join(const fb_turns *t, int64_t now_ns);

/* The lead of g: how far its virtual time is ahead of the smallest on each of its devices,
 * the largest of these (ms).  The least ahead goes first. */
double fb_turns_lead(const fb_turns *t, const fb_turn *g);

/* ---- the locked wrapper for threads -------------------------------------------------- */

/* Whether the caller's group must stop waiting (a stop or drain request). */
typedef bool (*fb_turns_stop_fn)(const fb_turn *g);

typedef struct fb_turns_sync {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fb_turns core;
} fb_turns_sync;


/* Sets up the wrapper and its core (fb_turns_init's arguments).  FB_OK or FB_ERR_NOMEM. */
int fb_turns_sync_init(fb_turns_sync *s, int n_devices, int64_t leader_wait_ns, bool scripted,
                       fb_turns_event_fn on_event, void *event_user);
void fb_turns_sync_destroy(fb_turns_sync *s);

/* fb_turns_join, _leave, _park and _set_share under the lock, at the clock's time; scripted,
 * each waits for its event's turn (fb_turns_is_next, fb_turns_may_join) unless stop(g). */
void fb_turns_sync_join(fb_turns_sync *s, fb_turn *g);
void fb_turns_sync_leave(fb_turns_sync *s, fb_turn *g, fb_turns_stop_fn stop);
void fb_turns_sync_park(fb_turns_sync *s, fb_turn *g, bool parked, fb_turns_stop_fn stop);
int fb_turns_sync_set_share(fb_turns_sync *s, fb_turn *g, double share, char *msg, size_t msg_cap);
double fb_turns_sync_share(fb_turns_sync *s, const fb_turn *g);

/* Waits for g's turn on every device it steps on and takes them all at once.  False (and g
 * holds nothing) when stop(g) became true first. */
bool fb_turns_sync_acquire(fb_turns_sync *s, fb_turn *g, fb_turns_stop_fn stop);

/* Ends g's turn, charged step_ms (its measured step).  Scripted: first waits until the clock
 * reaches the step's end and the steps that end before it have ended (or stop(g)). */
void fb_turns_sync_release(fb_turns_sync *s, fb_turn *g, double step_ms, fb_turns_stop_fn stop);

/* Ends a turn g took without stepping, nothing charged (scripted: at the step's end, as
 * fb_turns_sync_release waits for it). */
void fb_turns_sync_return(fb_turns_sync *s, fb_turn *g, fb_turns_stop_fn stop);

/* Wakes the waiting groups, after a stop or drain request. */
void fb_turns_sync_wake(fb_turns_sync *s);

#endif
