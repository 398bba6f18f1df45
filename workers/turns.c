/* Device turns (turns.h): the pure core, then the locked wrapper. */
#include "turns.h"

#include <string.h>
#include <time.h>

#include "clock.h"
#include "errors.h"

/*
 * Virtual times are per device: each device's groups run on its own clock, which a
 * newcomer joins at the smallest time there, and each step adds its time over the share
 * to the clock of every device the group held.  One clock for all devices would not do:
 * a device whose groups have run for hours and one whose groups just started have clocks
 * hours apart, and a group on both would start hours behind the first device's groups
 * (which would then wait until it caught up) or hours ahead of the second's (waiting
 * itself).  Which of two waiting groups goes first must still be one order on every
 * device, or two groups on the same two devices could each wait for the other there.
 * So groups are ordered by their lead: how far a group's clock is ahead of the smallest
 * on each of its devices, the largest of these.  On one device this is the order of the
 * virtual times; a group on several devices goes when it is not ahead on any of them,
 * which is the pace of its busiest device, as a step that needs all its devices must be.
 */

int fb_turn_init(fb_turn *g, int n_devices, uint64_t ticket, double share, const int *devs, int n,
                 int64_t step_ns, void *user, char *msg, size_t msg_cap)
{
    if (!(share > 0 && share <= 1)) /* NaN too */
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "a time share must be in (0, 1], not %g",
                       share);
    if (n < 1 || n > FB_TURNS_MAX_DEVICES || !devs)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "a group takes its turns on 1..%d devices, not %d", FB_TURNS_MAX_DEVICES, n);
    if (step_ns < 0)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "a scripted step of %lld ns",
                       (long long)step_ns);
    int sorted[FB_TURNS_MAX_DEVICES], m = 0;
    for (int k = 0; k < n; k++) {
        int dev = devs[k];
        if (dev < 0 || dev >= n_devices)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "device %d does not exist (there are %d)", dev, n_devices);
        /* insertion into a sorted list; a device named twice counts once */
        bool seen = false;
        for (int j = 0; j < m; j++) seen |= sorted[j] == dev;
        if (seen) continue;
        int i = m++;
        while (i > 0 && sorted[i - 1] > dev) {
            sorted[i] = sorted[i - 1];
            i--;
        }
        sorted[i] = dev;
    }
    memset(g, 0, sizeof *g);
    g->ticket = ticket;
    g->share = share;
    g->n_devs = m;
    memcpy(g->devs, sorted, (size_t)m * sizeof *sorted);
    g->state = FB_TURN_OUT;
    g->step_ns = step_ns;
    g->user = user;
    return FB_OK;
}

double fb_turn_share(const fb_turn *g) { return g->share; }

bool fb_turn_granted(const fb_turn *g) { return g->state == FB_TURN_STEPPING; }

void fb_turns_init(fb_turns *t, int n_devices, int64_t leader_wait_ns, bool scripted,
                   fb_turns_event_fn on_event, void *event_user)
{
    memset(t, 0, sizeof *t);
    t->n_devices = n_devices;
    t->leader_wait_ns = leader_wait_ns;
    t->scripted = scripted;
    t->on_event = on_event;
    t->event_user = event_user;
}

static void event(const fb_turns *t, fb_turn_event ev, const fb_turn *g, int64_t at, double v)
{
    if (t->on_event) t->on_event(t->event_user, ev, g, at, v);
}

/* The time an event of g happens at: now, or in scripted mode the time g is at. */
static int64_t when(const fb_turns *t, const fb_turn *g, int64_t now_ns)
{
    return t->scripted ? g->at_ns : now_ns;
}

/* The smallest virtual time on device k (0 when it has no groups). */
static double dev_vmin(const fb_turns *t, int k)
{
    double v = 0;
    bool any = false;
    for (const fb_turn *h = t->dev_groups[k]; h; h = h->dev_next[k])
        if (!any || h->vtime[k] < v) {
            v = h->vtime[k];
            any = true;
        }
    return v;
}

double fb_turns_lead(const fb_turns *t, const fb_turn *g)
{
    double l = 0;
    for (int i = 0; i < g->n_devs; i++) {
        int k = g->devs[i];
        double d = g->vtime[k] - dev_vmin(t, k);
        if (d > l) l = d;
    }
    return l;
}

/*
 * Who should step on device k before g, whose lead is g_lead: 2 when a waiting group has
 * a smaller lead (or an equal one and an older ticket), 1 when only groups between two of
 * their steps do (a parked group is nobody's leader), 0 when g is first.
 */
static int ahead_of(const fb_turns *t, int k, const fb_turn *g, double g_lead)
{
    int ahead = 0;
    for (const fb_turn *h = t->dev_groups[k]; h; h = h->dev_next[k]) {
        if (h == g || h->state == FB_TURN_PARKED) continue;
        double l = fb_turns_lead(t, h);
        if (l < g_lead || (l == g_lead && h->ticket < g->ticket))
            ahead = h->state == FB_TURN_WAITING ? 2 : ahead > 1 ? ahead : 1;
    }
    return ahead;
}

static void grant(fb_turns *t, fb_turn *g, int64_t at)
{
    for (int i = 0; i < g->n_devs; i++) t->busy[g->devs[i]] = true;
    g->state = FB_TURN_STEPPING;
    if (t->scripted) {
        if (at < g->at_ns) at = g->at_ns;
        g->at_ns = at;
        g->end_ns = at + g->step_ns;
    }
    g->waited_ns = at - g->asked_ns;
    event(t, FB_TURN_EV_GRANT, g, at, (double)g->steps);
    g->steps++;
}

/*
 * Grants every waiting group that may go at time `at`: one whose devices are all free and
 * that no waiting group precedes on any of them.  A group ahead of it that is between two
 * of its steps (sending its events) is about to ask: without waiting for it, two groups
 * that alternate would never meet here and the shares would not matter.  In real mode it
 * gets leader_wait_ns at most, so that a group held up elsewhere does not leave the device
 * idle; scripted, the device waits for it, so that no grant depends on how fast a thread
 * comes back.  While a group waits it counts as waiting on each of its devices, so a group
 * behind it on any of them lets the device go idle rather than overtake it, which keeps it
 * from starving.  Grants do not depend on the order groups are looked at: a grant only
 * makes devices busy, and of two waiting groups that share a device one precedes the other.
 * Returns the earliest deadline of a leader's wait still running (INT64_MAX: none).
 */
static int64_t dispatch(fb_turns *t, int64_t at)
{
    int64_t next = INT64_MAX;
    for (fb_turn *g = t->all; g; g = g->next) {
        if (g->state != FB_TURN_WAITING) continue;
        int ahead = 0;
        double g_lead = fb_turns_lead(t, g);
        for (int i = 0; i < g->n_devs && ahead < 2; i++) {
            int k = g->devs[i];
            int here = t->busy[k] ? 2 : ahead_of(t, k, g, g_lead);
            if (here > ahead) ahead = here;
        }
        if (ahead == 1 && !t->scripted && !g->lw_expired) {
            if (!g->lw_started) {
                g->lw_started = true;
                g->lw_deadline_ns = at + t->leader_wait_ns;
            }
            if (at >= g->lw_deadline_ns)
                g->lw_expired = true;
            else if (g->lw_deadline_ns < next)
                next = g->lw_deadline_ns;
        }
        if (ahead == 0 || (ahead == 1 && g->lw_expired)) grant(t, g, at);
    }
    return next;
}

void fb_turns_join(fb_turns *t, fb_turn *g, int64_t now_ns)
{
    if (g->state != FB_TURN_OUT) return;
    for (int i = 0; i < g->n_devs; i++) {
        int k = g->devs[i];
        g->vtime[k] = dev_vmin(t, k);
        g->dev_next[k] = t->dev_groups[k];
        t->dev_groups[k] = g;
    }
    fb_turn **p = &t->all;
    while (*p && (*p)->ticket < g->ticket) p = &(*p)->next;
    g->next = *p;
    *p = g;
    g->state = FB_TURN_BETWEEN;
    g->at_ns = now_ns;
    event(t, FB_TURN_EV_JOIN, g, now_ns, 0);
}

void fb_turns_leave(fb_turns *t, fb_turn *g, int64_t now_ns)
{
    if (g->state == FB_TURN_OUT) return;
    for (int i = 0; i < g->n_devs; i++) {
        int k = g->devs[i];
        if (g->state == FB_TURN_STEPPING) t->busy[k] = false;
        for (fb_turn **p = &t->dev_groups[k]; *p; p = &(*p)->dev_next[k])
            if (*p == g) {
                *p = g->dev_next[k];
                break;
            }
    }
    for (fb_turn **p = &t->all; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    int64_t at = when(t, g, now_ns);
    g->state = FB_TURN_OUT;
    event(t, FB_TURN_EV_LEAVE, g, at, 0);
    dispatch(t, at);
}

void fb_turns_ask(fb_turns *t, fb_turn *g, int64_t now_ns)
{
    if (g->state != FB_TURN_BETWEEN && g->state != FB_TURN_PARKED) return;
    /* scripted, a group back from a hold asks when the test let it go */
    if (g->state == FB_TURN_PARKED && t->scripted && now_ns > g->at_ns) g->at_ns = now_ns;
    g->state = FB_TURN_WAITING;
    g->lw_started = g->lw_expired = false;
    g->asked_ns = when(t, g, now_ns);
    dispatch(t, g->asked_ns);
}

void fb_turns_cancel(fb_turns *t, fb_turn *g, int64_t now_ns)
{
    if (g->state != FB_TURN_WAITING && g->state != FB_TURN_STEPPING) return;
    if (g->state == FB_TURN_STEPPING) {
        for (int i = 0; i < g->n_devs; i++) t->busy[g->devs[i]] = false;
        /* scripted, a turn given back is held for its step's length, so that whether a
         * turn is stepped or given back, which no other group can know in advance, does
         * not change when the others' events come */
        if (t->scripted) g->at_ns = g->end_ns;
    }
    g->state = FB_TURN_BETWEEN;
    dispatch(t, when(t, g, now_ns));
}

void fb_turns_done(fb_turns *t, fb_turn *g, double charge_ms, int64_t now_ns)
{
    if (g->state != FB_TURN_STEPPING) return;
    if (t->scripted) {
        charge_ms = (double)g->step_ns / 1e6;
        g->at_ns = g->end_ns;
    }
    for (int i = 0; i < g->n_devs; i++) {
        g->vtime[g->devs[i]] += charge_ms / g->share;
        t->busy[g->devs[i]] = false;
    }
    g->state = FB_TURN_BETWEEN;
    int64_t at = when(t, g, now_ns);
    event(t, FB_TURN_EV_DONE, g, at, charge_ms);
    dispatch(t, at);
}

void fb_turns_park(fb_turns *t, fb_turn *g, bool parked, int64_t now_ns)
{
    if (parked && g->state == FB_TURN_BETWEEN) {
        g->state = FB_TURN_PARKED;
        dispatch(t, when(t, g, now_ns)); /* no one waits for it any more */
    } else if (!parked && g->state == FB_TURN_PARKED) {
        g->state = FB_TURN_BETWEEN;
    }
}

int fb_turns_set_share(fb_turns *t, fb_turn *g, double share, int64_t now_ns, char *msg,
                       size_t msg_cap)
{
    if (!(share > 0 && share <= 1))
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "a time share must be in (0, 1], not %g",
                       share);
    g->share = share;
    event(t, FB_TURN_EV_SHARE, g, when(t, g, now_ns), share);
    return FB_OK;
}

int64_t fb_turns_poll(fb_turns *t, int64_t now_ns) { return dispatch(t, now_ns); }

/* The time of g's next event (scripted): its step's end when it steps, the time it is at
 * when it is between two steps (it will ask, park or leave then); INT64_MAX when it has none
 * (waiting for others, parked, out). */
static int64_t pending_ns(const fb_turn *g)
{
    return g->state == FB_TURN_STEPPING  ? g->end_ns
           : g->state == FB_TURN_BETWEEN ? g->at_ns
                                         : INT64_MAX;
}

bool fb_turns_is_next(const fb_turns *t, const fb_turn *g)
{
    if (!t->scripted) return true;
    int64_t mine = pending_ns(g);
    for (const fb_turn *h = t->all; h; h = h->next) {
        int64_t theirs = pending_ns(h);
        if (h != g && theirs != INT64_MAX &&
            (theirs < mine || (theirs == mine && h->ticket < g->ticket)))
            return false;
    }
    return true;
}

bool fb_turns_may_end(const fb_turns *t, const fb_turn *g, int64_t now_ns)
{
    if (g->state != FB_TURN_STEPPING) return false;
    return !t->scripted || (now_ns >= g->end_ns && fb_turns_is_next(t, g));
}

bool fb_turns_may_join(const fb_turns *t, int64_t now_ns)
{
    if (!t->scripted) return true;
    for (const fb_turn *h = t->all; h; h = h->next)
        if (pending_ns(h) <= now_ns) return false;
    return true;
}

/* ---- the locked wrapper -------------------------------------------------------------- */

#define SYNC_WAIT_CAP_MS 100 /* the longest sleep before the clock is read again */

int fb_turns_sync_init(fb_turns_sync *s, int n_devices, int64_t leader_wait_ns, bool scripted,
                       fb_turns_event_fn on_event, void *event_user)
{
    if (pthread_mutex_init(&s->mu, NULL) != 0) return FB_ERR_NOMEM;
    /* waits have deadlines on the monotonic clock, immune to changes of the wall clock */
    pthread_condattr_t ca;
    bool ok = pthread_condattr_init(&ca) == 0;
    if (ok) {
        ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
             pthread_cond_init(&s->cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }
    if (!ok) {
        pthread_mutex_destroy(&s->mu);
        return FB_ERR_NOMEM;
    }
    fb_turns_init(&s->core, n_devices, leader_wait_ns, scripted, on_event, event_user);
    return FB_OK;
}

void fb_turns_sync_destroy(fb_turns_sync *s)
{
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}

/* Sleeps on the condition until woken or until the clock may have reached deadline_ns
 * (INT64_MAX: until woken). */
static void sync_wait(fb_turns_sync *s, int64_t deadline_ns)
{
    if (deadline_ns == INT64_MAX) {
        pthread_cond_wait(&s->cv, &s->mu);
        return;
    }
    int64_t deadline_ms = deadline_ns / 1000000 + (deadline_ns % 1000000 != 0);
    int ms = fb_clock_wait_ms(deadline_ms, SYNC_WAIT_CAP_MS);
    if (ms <= 0) return;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += (long)ms * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&s->cv, &s->mu, &until);
}

/* Scripted: waits until g's next event is the earliest pending one (fb_turns_is_next), or
 * stop(g).  Every event broadcasts, so the wait needs no deadline. */
static void wait_next(fb_turns_sync *s, fb_turn *g, fb_turns_stop_fn stop)
{
    while (!stop(g) && !fb_turns_is_next(&s->core, g)) pthread_cond_wait(&s->cv, &s->mu);
}

void fb_turns_sync_join(fb_turns_sync *s, fb_turn *g)
{
    pthread_mutex_lock(&s->mu);
    int64_t now = fb_clock_ns();
    /* scripted: after every event up to now, so that the smallest virtual times it joins at
     * are those of that time whichever threads got there first */
    while (!fb_turns_may_join(&s->core, now)) pthread_cond_wait(&s->cv, &s->mu);
    fb_turns_join(&s->core, g, now);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void fb_turns_sync_leave(fb_turns_sync *s, fb_turn *g, fb_turns_stop_fn stop)
{
    pthread_mutex_lock(&s->mu);
    if (g->state == FB_TURN_BETWEEN) wait_next(s, g, stop);
    fb_turns_leave(&s->core, g, fb_clock_ns());
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void fb_turns_sync_park(fb_turns_sync *s, fb_turn *g, bool parked, fb_turns_stop_fn stop)
{
    pthread_mutex_lock(&s->mu);
    if (g->state == FB_TURN_BETWEEN) wait_next(s, g, stop);
    fb_turns_park(&s->core, g, parked, fb_clock_ns());
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int fb_turns_sync_set_share(fb_turns_sync *s, fb_turn *g, double share, char *msg, size_t msg_cap)
{
    pthread_mutex_lock(&s->mu);
    int err = fb_turns_set_share(&s->core, g, share, fb_clock_ns(), msg, msg_cap);
    pthread_mutex_unlock(&s->mu);
    return err;
}

double fb_turns_sync_share(fb_turns_sync *s, const fb_turn *g)
{
    pthread_mutex_lock(&s->mu);
    double share = fb_turn_share(g);
    pthread_mutex_unlock(&s->mu);
    return share;
}

bool fb_turns_sync_acquire(fb_turns_sync *s, fb_turn *g, fb_turns_stop_fn stop)
{
    pthread_mutex_lock(&s->mu);
    bool ok = false;
    if (g->state == FB_TURN_BETWEEN) wait_next(s, g, stop);
    if (!stop(g)) {
        fb_turns_ask(&s->core, g, fb_clock_ns());
        pthread_cond_broadcast(&s->cv); /* an event: the next one may be another's */
        /* the core grants at the events that allow it, whichever thread brings them; a
         * waiter reads the clock again only for a leader's wait that may have run out */
        while (!fb_turn_granted(g) && !stop(g)) {
            int64_t next = fb_turns_poll(&s->core, fb_clock_ns());
            if (fb_turn_granted(g)) break;
            sync_wait(s, next);
        }
        ok = fb_turn_granted(g) && !stop(g);
        if (!ok) fb_turns_cancel(&s->core, g, fb_clock_ns());
    }
    pthread_cond_broadcast(&s->cv); /* the line changed */
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* Scripted: waits until g's step may end (its end on the clock, every earlier event
 * taken), or stop(g). */
static void wait_end(fb_turns_sync *s, fb_turn *g, fb_turns_stop_fn stop)
{
    while (s->core.scripted && !stop(g) && !fb_turns_may_end(&s->core, g, fb_clock_ns())) {
        /* its end has not come (a poll of the clock), or an earlier event has not been
         * taken yet (woken when it is) */
        bool due = fb_clock_ns() >= g->end_ns;
        sync_wait(s, due ? INT64_MAX : g->end_ns);
    }
}

void fb_turns_sync_release(fb_turns_sync *s, fb_turn *g, double step_ms, fb_turns_stop_fn stop)
{
    pthread_mutex_lock(&s->mu);
    wait_end(s, g, stop);
    fb_turns_done(&s->core, g, step_ms, fb_clock_ns());
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void fb_turns_sync_return(fb_turns_sync *s, fb_turn *g, fb_turns_stop_fn stop)
{
    pthread_mutex_lock(&s->mu);
    wait_end(s, g, stop);
    fb_turns_cancel(&s->core, g, fb_clock_ns());
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void fb_turns_sync_wake(fb_turns_sync *s)
{
    pthread_mutex_lock(&s->mu);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}
