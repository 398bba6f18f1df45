/*
 * Device-turn tests on scripted step times (docs/worker.md, "Test clock and scripted step
 * times"): the worker reads a clock file the test moves (--test-clock), each array's step
 * lasts exactly its scripted time on it (--test-step-ms) and the worker logs each decision
 * of its turns to HOOK_DIR/turns.log (--test-step-hook).  The expected log comes from a
 * model: the turns' pure core (workers/turns.h) run by one thread, event after event in
 * the order of their times, with the same joins and share changes.  The worker's threads
 * must produce exactly that log, whatever their speed; the tests also assert counts and
 * orders worked out by hand.
 */
#ifndef FB_TESTS_TURNS_SCRIPT_H
#define FB_TESTS_TURNS_SCRIPT_H

#include "worker_util.h"

#include "clock.h"
#include "errors.h"
#include "turns.h"

#define TS_MAX_GROUPS 4
#define TS_MAX_LINES 4096
#define TS_WAIT_MS 120000 /* a wait for the worker's next decisions (an event, not a pace) */

typedef struct ts_script {
    char hook_dir[700], clock_path[700], log_path[760];
    fb_clock_file *clock;
    int64_t now_ms; /* where the test set the clock */
} ts_script;

/* The hook directory and the clock file (at start_ms) in the server's scratch directory; the
 * worker's test hooks are allowed (FUSEBOX_TEST_HOOKS=1, which the spawned worker inherits). */
static inline void ts_start(wu_server *s, ts_script *t, int64_t start_ms)
{
    memset(t, 0, sizeof *t);
    snprintf(t->hook_dir, sizeof t->hook_dir, "%s/hooks", s->dir);
    CHECK(mkdir(t->hook_dir, 0755) == 0);
    snprintf(t->clock_path, sizeof t->clock_path, "%s/clock", s->dir);
    snprintf(t->log_path, sizeof t->log_path, "%s/turns.log", t->hook_dir);
    char msg[512];
    t->clock = fb_clock_file_create(t->clock_path, start_ms * 1000000LL, msg, sizeof msg);
    if (!t->clock) fprintf(stderr, "%s\n", msg);
    CHECK(t->clock != NULL);
    t->now_ms = start_ms;
    CHECK(setenv("FUSEBOX_TEST_HOOKS", "1", 1) == 0);
}

static inline void ts_set(ts_script *t, int64_t ms)
{
    CHECK(fb_clock_file_set(t->clock, ms * 1000000LL));
    t->now_ms = ms;
}

static inline void ts_stop(ts_script *t)
{
    fb_clock_file_close(t->clock);
    t->clock = NULL;
}

/* ---- the log ------------------------------------------------------------------------- */

typedef struct ts_log {
    char *line[TS_MAX_LINES];
    int n;
} ts_log;

static inline void ts_log_free(ts_log *l)
{
    for (int i = 0; i < l->n; i++) free(l->line[i]);
    l->n = 0;
}

static inline void ts_log_add(ts_log *l, const char *line)
{
    CHECK(l->n < TS_MAX_LINES);
    l->line[l->n] = strdup(line);
    CHECK(l->line[l->n] != NULL);
    l->n++;
}

/* The worker's log, without its "share" lines when no_share (their place among the others
 * depends on when the message came, not on the turns). */
static inline void ts_read(const ts_script *t, bool no_share, ts_log *out)
{
    ts_log_free(out);
    char *text = wu_read_file(t->log_path, NULL);
    if (!text) return;
    for (char *p = text, *nl; *p; p = nl + 1) {
        nl = strchr(p, '\n');
        if (!nl) break; /* a line being written */
        *nl = '\0';
        if (!(no_share && strncmp(p, "share ", 6) == 0)) ts_log_add(out, p);
    }
    free(text);
}

static inline int ts_count(const ts_log *l, const char *what, const char *gid)
{
    int n = 0;
    size_t wl = strlen(what);
    for (int i = 0; i < l->n; i++)
        if (strncmp(l->line[i], what, wl) == 0 && l->line[i][wl] == ' ' &&
            (!gid || strncmp(l->line[i] + wl + 1, gid, strlen(gid)) == 0))
            n++;
    return n;
}

/* What ts_wait hands each message it serves, when set. */
static void (*ts_on_msg)(const wu_msg *w, void *arg);
static void *ts_on_msg_arg;

/* Serves the worker (answering heartbeats and HELLOs, acknowledging events, failing on a
 * FAILED event) until its log has at least n lines (share lines left out), or at least n
 * lines of kind what for gid when what is given. */
static inline void ts_wait(wu_server *s, const ts_script *t, int n, const char *what,
                           const char *gid)
{
    double end = wu_now_ms() + TS_WAIT_MS;
    ts_log l = {0};
    for (;;) {
        ts_read(t, what == NULL, &l);
        int have = what ? ts_count(&l, what, gid) : l.n;
        if (have >= n) break;
        if (wu_now_ms() > end) {
            fprintf(stderr, "the turns log has %d of %d lines%s%s after %d ms:\n", have, n,
                    what ? " of " : "", what ? what : "", TS_WAIT_MS);
            for (int i = 0; i < l.n; i++) fprintf(stderr, "  %s\n", l.line[i]);
            abort();
        }
        wu_msg w;
        if (!wu_next(s, 5, true, &w)) continue;
        if (w.m.type == FB_WIRE_EVENT && w.m.event == FB_EV_FAILED) {
            fprintf(stderr, "failed: %s\n", w.m.text);
            CHECK(w.m.event != FB_EV_FAILED);
        }
        if (ts_on_msg) ts_on_msg(&w, ts_on_msg_arg);
        wu_msg_free(&w);
    }
    ts_log_free(&l);
}

/* Requires the worker's log (share lines left out) to begin with the model's lines. */
static inline void ts_expect(const ts_script *t, const ts_log *model)
{
    ts_log l = {0};
    ts_read(t, true, &l);
    bool ok = l.n >= model->n;
    for (int i = 0; ok && i < model->n; i++) ok = strcmp(l.line[i], model->line[i]) == 0;
    if (!ok) {
        fprintf(stderr, "the worker's turns (left) are not the model's (right):\n");
        for (int i = 0; i < l.n || i < model->n; i++)
            fprintf(stderr, "  %-40s %s %s\n", i < l.n ? l.line[i] : "-",
                    i < l.n && i < model->n && strcmp(l.line[i], model->line[i]) == 0 ? "  "
                                                                                        : "!=",
                    i < model->n ? model->line[i] : "-");
        abort();
    }
    ts_log_free(&l);
}

/* ---- the model ------------------------------------------------------------------------- */

typedef struct ts_model {
    fb_turns core;
    fb_turn g[TS_MAX_GROUPS];
    const char *gid[TS_MAX_GROUPS];
    int n;
    ts_log log;
} ts_model;

/* The agent's line for an event (workers/agent_group.c, agent_turn_logged). */
static inline void ts_model_event(void *user, fb_turn_event ev, const fb_turn *g, int64_t at_ns,
                                  double value)
{
    static const char *const names[] = {[FB_TURN_EV_JOIN] = "join", [FB_TURN_EV_GRANT] = "grant",
                                        [FB_TURN_EV_DONE] = "done", [FB_TURN_EV_LEAVE] = "leave",
                                        [FB_TURN_EV_SHARE] = "share"};
    ts_model *m = user;
    if (ev == FB_TURN_EV_SHARE) return; /* compared without them */
    char line[256];
    snprintf(line, sizeof line, "%s %s %.3f %g", names[ev], m->gid[g - m->g], (double)at_ns / 1e6,
             value);
    ts_log_add(&m->log, line);
}

static inline void ts_model_init(ts_model *m, int n_devices)
{
    memset(m, 0, sizeof *m);
    fb_turns_init(&m->core, n_devices, 5000000, true, ts_model_event, m);
}

/* Takes every event up to at_ms, in the order of their times (the older group first at the
 * same time), as the worker's threads must: a stepping group ends its step, a group between
 * two steps asks again at once. */
static inline void ts_model_run(ts_model *m, int64_t at_ms)
{
    for (;;) {
        fb_turn *next = NULL;
        for (int i = 0; i < m->n; i++)
            if (fb_turns_is_next(&m->core, &m->g[i]) &&
                (m->g[i].state == FB_TURN_BETWEEN || m->g[i].state == FB_TURN_STEPPING))
                next = &m->g[i];
        if (!next) return;
        int64_t t = next->state == FB_TURN_STEPPING ? next->end_ns : next->at_ns;
        if (t > at_ms * 1000000LL) return;
        if (next->state == FB_TURN_STEPPING)
            fb_turns_done(&m->core, next, 0, t);
        else
            fb_turns_ask(&m->core, next, t);
    }
}

/* A group of the model: the ASSIGN's order gives its ticket, as on the worker. */
static inline void ts_model_join(ts_model *m, const char *gid, const int *devs, int n_devs,
                                 double share, int64_t step_ms, int64_t at_ms)
{
    CHECK(m->n < TS_MAX_GROUPS);
    ts_model_run(m, at_ms);
    char msg[256];
    int i = m->n++;
    m->gid[i] = gid;
    CHECK_INT_EQ(fb_turn_init(&m->g[i], m->core.n_devices, (uint64_t)i, share, devs, n_devs,
                              step_ms * 1000000LL, NULL, msg, sizeof msg),
                 FB_OK);
    CHECK(fb_turns_may_join(&m->core, at_ms * 1000000LL));
    fb_turns_join(&m->core, &m->g[i], at_ms * 1000000LL);
}

static inline void ts_model_share(ts_model *m, int i, double share, int64_t at_ms)
{
    ts_model_run(m, at_ms);
    char msg[256];
    CHECK_INT_EQ(fb_turns_set_share(&m->core, &m->g[i], share, at_ms * 1000000LL, msg,
                                    sizeof msg),
                 FB_OK);
}

/* The grants of the model's log from line `from` on, as "GROUP-LETTER@MS" words, for the
 * hand-worked expectations (groups lettered A.. in join order). */
static inline void ts_model_grants(const ts_model *m, int from, char *out, size_t cap)
{
    size_t at = 0;
    out[0] = '\0';
    for (int i = from; i < m->log.n && at < cap; i++) {
        char gid[FB_WIRE_ID_LEN + 1];
        double ms;
        if (sscanf(m->log.line[i], "grant %36s %lf", gid, &ms) != 2) continue;
        int k = 0;
        while (k < m->n && strcmp(m->gid[k], gid) != 0) k++;
        at += (size_t)snprintf(out + at, cap - at, "%s%c@%.0f", at ? " " : "", 'A' + k, ms);
    }
}

#endif
