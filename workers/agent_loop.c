/*
 * The worker agent's main thread (agent_int.h): one loop polls the DEALER
 * towards the server, the PULL its group threads send to and the DEALER's
 * connection monitor.  It registers and heartbeats, keeps the outbox of
 * events until the server acknowledges them, starts groups on ASSIGN, passes
 * DETACH and REBALANCE on to them, drains, and joins the groups that end.
 */
#include "agent_int.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "clock.h"
#include "tsan.h"

#ifndef FB_VERSION_STRING
#define FB_VERSION_STRING "0.1.0"
#endif

#define SILENT_HEARTBEATS 3 /* heartbeats without a word before registering again */
#define OUTBOX_WARN_EVERY_MS 10000

/* ---- the main thread: sending ------------------------------------------------------------ */

/* Sends a message (and its blob).  0 when sent, 1 when the socket cannot take it now (no
 * connection yet, or a full queue), -1 when sending failed, -2 when it does not encode. */
static int send_wire(fb_agent *a, const fb_wire_msg *m, const void *blob, size_t blob_len)
{
    char err[512];
    char *json = fb_wire_encode(m, err, sizeof err);
    if (!json) {
        agent_log("cannot encode a %s message: %s", fb_wire_type_name(m->type), err);
        return -2;
    }
    int rc = zmq_send(a->dealer, json, strlen(json), ZMQ_DONTWAIT | (blob ? ZMQ_SNDMORE : 0));
    free(json);
    if (rc < 0) {
        if (errno == EAGAIN) return 1;
        agent_log("cannot send a %s message: %s", fb_wire_type_name(m->type), zmq_strerror(errno));
        return -1;
    }
    if (blob && zmq_send(a->dealer, blob, blob_len, ZMQ_DONTWAIT) < 0) {
        agent_log("cannot send the file of a %s message: %s", fb_wire_type_name(m->type),
                  zmq_strerror(errno));
        return -1;
    }
    return 0;
}

/* The groups running now, as HELLO and HEARTBEAT report them.  Members that left are not
 * listed; a group none of whose members is left is not either. */
static int fill_running(fb_agent *a, fb_wire_msg *m)
{
    int n = 0;
    for (group *g = a->groups; g; g = g->next)
        if (!atomic_load(&g->stop)) n++;
    if (n > FB_WIRE_MAX_GROUPS) {
        agent_log("%d groups run here; only %d fit a report", n, FB_WIRE_MAX_GROUPS);
        n = FB_WIRE_MAX_GROUPS;
    }
    m->running = n ? calloc((size_t)n, sizeof *m->running) : NULL;
    if (n && !m->running) return FB_ERR_NOMEM;
    int k = 0;
    for (group *g = a->groups; g && k < n; g = g->next) {
        if (atomic_load(&g->stop)) continue;
        fb_wire_running *rg = &m->running[k];
        pthread_mutex_lock(&g->mu);
        int alive = 0;
        for (int i = 0; i < g->n_members; i++)
            alive += g->m[i].alive;
        if (alive) {
            rg->job_ids = calloc((size_t)alive, sizeof *rg->job_ids);
            rg->steps = calloc((size_t)alive, sizeof *rg->steps);
        }
        if (alive && rg->job_ids && rg->steps) {
            snprintf(rg->group_id, sizeof rg->group_id, "%s", g->id);
            rg->generation = g->generation;
            for (int i = 0; i < g->n_members; i++) {
                if (!g->m[i].alive) continue;
                snprintf(rg->job_ids[rg->n_jobs], sizeof rg->job_ids[0], "%s", g->m[i].job_id);
                rg->steps[rg->n_jobs++] = g->steps_done;
            }
            k++;
        } else {
            free(rg->job_ids);
            free(rg->steps);
            rg->job_ids = NULL;
            rg->steps = NULL;
        }
        pthread_mutex_unlock(&g->mu);
    }
    m->n_running = k;
    return FB_OK;
}

static void send_hello(fb_agent *a)
{
    fb_wire_msg m = {.type = FB_WIRE_HELLO};
    snprintf(m.worker, sizeof m.worker, "%s", a->name);
    snprintf(m.backend, sizeof m.backend, "%s", a->backend);
    snprintf(m.version, sizeof m.version, "%s", FB_VERSION_STRING);
    m.n_devices = a->n_devices;
    for (int i = 0; i < a->n_devices; i++) {
        m.devices[i] = a->dev[i].info;
        if (strcmp(m.devices[i].kind, "cpu") == 0) {
            /* the RAM free now, shared evenly like the total */
            int64_t avail = (int64_t)sysconf(_SC_AVPHYS_PAGES) * (int64_t)sysconf(_SC_PAGESIZE);
            int64_t share = avail > 0 ? avail / a->n_devices : 0;
            m.devices[i].free_bytes =
                share < m.devices[i].memory_bytes ? share : m.devices[i].memory_bytes;
        }
    }
    snprintf(m.comm_host, sizeof m.comm_host, "%s", a->comm_host);
    if (a->comm_host[0]) {
        m.comm_port_lo = a->comm_port_lo;
        m.comm_port_hi = a->comm_port_hi;
    }
    if (fill_running(a, &m) == FB_OK) send_wire(a, &m, NULL, 0);
    fb_wire_msg_free(&m);
}

static void send_heartbeat(fb_agent *a)
{
    fb_wire_msg m = {.type = FB_WIRE_HEARTBEAT};
    if (fill_running(a, &m) == FB_OK) send_wire(a, &m, NULL, 0);
    fb_wire_msg_free(&m);
}

static void send_drain(fb_agent *a)
{
    fb_wire_msg m = {.type = FB_WIRE_DRAIN};
    snprintf(m.text, sizeof m.text, "draining");
    a->drain_sent = send_wire(a, &m, NULL, 0) != 1;
}

/* Unlinks o from the outbox (prev is its predecessor or NULL) and frees it. */
void agent_outbox_remove(fb_agent *a, outmsg *prev, outmsg *o)
{
    if (prev)
        prev->next = o->next;
    else
        a->outbox = o->next;
    if (a->outbox_tail == o) a->outbox_tail = prev;
    if (a->unsent == o) a->unsent = o->next;
    a->outbox_bytes -= o->blob_len;
    agent_outmsg_free(o);
}

/* Sends the outbox's unsent events in order, up to the first the socket refuses. */
static void flush_outbox(fb_agent *a)
{
    if (!a->welcomed || !a->unsent) return;
    outmsg *prev = NULL;
    for (outmsg *o = a->outbox; o && o != a->unsent; o = o->next)
        prev = o;
    while (a->unsent) {
        outmsg *o = a->unsent;
        int rc = send_wire(a, &o->w, o->blob, o->blob_len);
        if (rc == 1) return;
        if (rc == -2) {
            /* it would fail the same way every time; keeping it would resend it forever */
            agent_outbox_remove(a, prev, o);
            continue;
        }
        prev = o;
        a->unsent = o->next;
    }
}

/*
 * Keeps the outbox within its bound: past it, checkpoints that a newer unacknowledged
 * checkpoint of the same job supersedes go (a resume needs only the newest).  Finished
 * models and drained states are never dropped; when they alone exceed the bound the
 * outbox grows and says so.
 */
static void outbox_bound(fb_agent *a, const outmsg *newest)
{
    if (a->outbox_bytes <= a->outbox_limit) return;
    if (newest->w.event == FB_EV_CHECKPOINTED) {
        outmsg *prev = NULL;
        for (outmsg *o = a->outbox; o && o != newest;) {
            outmsg *next = o->next;
            if (o->w.event == FB_EV_CHECKPOINTED && strcmp(o->w.job_id, newest->w.job_id) == 0) {
                agent_log("outbox over its bound: dropping the unacknowledged checkpoint of %s "
                          "at step %lld (seq %lld); the one at step %lld supersedes it",
                          o->w.job_id, (long long)o->w.step, (long long)o->w.seq,
                          (long long)newest->w.step);
                agent_outbox_remove(a, prev, o);
            } else {
                prev = o;
            }
            o = next;
        }
    }
    double now = agent_now_ms();
    if (a->outbox_bytes > a->outbox_limit && now - a->last_outbox_warn >= OUTBOX_WARN_EVERY_MS) {
        a->last_outbox_warn = now;
        agent_log("WARNING: %llu bytes of events wait for the server's acknowledgement, over "
                  "the bound of %llu; is the server reachable?",
                  (unsigned long long)a->outbox_bytes, (unsigned long long)a->outbox_limit);
    }
}

/* Numbers an event, keeps it until it is acknowledged, and sends it when registered. */
static void outbox_add(fb_agent *a, outmsg *o)
{
    if (!o) {
        agent_log("out of memory; an event is lost");
        return;
    }
    o->next = NULL;
    o->w.seq = a->next_seq++;
    if (a->outbox_tail)
        a->outbox_tail->next = o;
    else
        a->outbox = o;
    a->outbox_tail = o;
    if (!a->unsent) a->unsent = o;
    a->outbox_bytes += o->blob_len;
    outbox_bound(a, o);
    flush_outbox(a);
}

static void outbox_ack(fb_agent *a, int64_t seq)
{
    outmsg *prev = NULL;
    for (outmsg *o = a->outbox; o; prev = o, o = o->next)
        if (o->w.seq == seq) {
            agent_outbox_remove(a, prev, o);
            return;
        }
    /* a repeated ACK, or one for a checkpoint the bound dropped: nothing to do */
}

/* ---- the main thread: groups ------------------------------------------------------------- */

static group *find_group(fb_agent *a, const char *id)
{
    for (group *g = a->groups; g; g = g->next)
        if (!atomic_load(&g->stop) && strcmp(g->id, id) == 0) return g;
    return NULL;
}

static void group_free(group *g)
{
    if (!g) return;
    for (int i = 0; i < g->n_members; i++) {
        if (g->m[i].parsed) fb_job_spec_free(&g->m[i].spec);
        if (g->m[i].has_resume) zmq_msg_close(&g->m[i].resume);
        if (g->m[i].has_init) zmq_msg_close(&g->m[i].init);
    }
    free(g->m);
    free(g->by_sidx);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* Asks a group to leave without reporting anything (its events are dropped too). */
void agent_stop_group(fb_agent *a, group *g)
{
    atomic_store(&g->stop, true);
    agent_turns_wake(a);
}

/* A FAILED event from the main thread, for a member that never reached a group thread:
 * fault_member names whose fault it is, fail_member (the array's own: out of memory, the
 * worker's state) and fail_spec (the spec cannot train anywhere) say it for the caller. */
static void fault_member(fb_agent *a, const fb_wire_msg *m, const fb_wire_member *wm,
                         fb_wire_fault fault, const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));
static void fault_member(fb_agent *a, const fb_wire_msg *m, const fb_wire_member *wm,
                         fb_wire_fault fault, const char *fmt, va_list ap)
{
    if (m->world && m->rank_base > 0) {
        /* a follower of a spanning group: the leader, which checks the same, reports it */
        agent_log("group %s: %s cannot train here (the leader reports it)", m->group_id,
                  wm->job_id);
        return;
    }
    outmsg *o =
        agent_event_new(NULL, m->group_id, m->generation, FB_EV_FAILED, wm->job_id, wm->start_step);
    if (o) {
        char text[FB_WIRE_TEXT_MAX + 1];
        vsnprintf(text, sizeof text, fmt, ap);
        agent_event_text(o, "%s", text);
        o->w.fault = fault;
        agent_log("group %s: %s failed (%s fault): %s", m->group_id, wm->job_id,
                  fault == FB_FAULT_SPEC ? "spec" : "job", o->w.text);
    }
    outbox_add(a, o);
}

static void fail_member(fb_agent *a, const fb_wire_msg *m, const fb_wire_member *wm,
                        const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void fail_member(fb_agent *a, const fb_wire_msg *m, const fb_wire_member *wm,
                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fault_member(a, m, wm, FB_FAULT_JOB, fmt, ap);
    va_end(ap);
}

static void fail_spec(fb_agent *a, const fb_wire_msg *m, const fb_wire_member *wm,
                      const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void fail_spec(fb_agent *a, const fb_wire_msg *m, const fb_wire_member *wm,
                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fault_member(a, m, wm, FB_FAULT_SPEC, fmt, ap);
    va_end(ap);
}

/* Checks one member of an ASSIGN; false (with a FAILED event sent) when it cannot train. */
static bool member_ok(fb_agent *a, const fb_wire_msg *m, const fb_wire_member *wm, member *mb,
                      const int64_t *group_start)
{
    char msg[1024];
    int err = fb_job_spec_parse(wm->spec, strlen(wm->spec), NULL, &mb->spec, msg, sizeof msg);
    if (err) {
        fail_spec(a, m, wm, "the spec does not parse: %s (%s)", msg, fb_err_code(err));
        return false;
    }
    mb->parsed = true;
    if (strcmp(mb->spec.fusion_key, m->fusion_key) != 0) {
        fail_spec(a, m, wm, "the spec's fusion key %s is not the group's %s", mb->spec.fusion_key,
                  m->fusion_key);
        return false;
    }
    if (strcmp(mb->spec.dataset, m->dataset) != 0) {
        fail_member(a, m, wm, "the spec's dataset %s is not the group's %s", mb->spec.dataset,
                    m->dataset);
        return false;
    }
    if (group_start && wm->start_step != *group_start) {
        fail_member(a, m, wm,
                    "start step %lld differs from the group's %lld; the members of an array "
                    "train in lockstep",
                    (long long)wm->start_step, (long long)*group_start);
        return false;
    }
    if (wm->start_step > 0 && wm->resume_blob == 0) {
        fail_member(a, m, wm, "start step %lld needs a checkpoint to resume from",
                    (long long)wm->start_step);
        return false;
    }
    /* a worker opens no path a spec names: initial weights come from the server */
    if (mb->spec.init[0]) {
        fail_spec(a, m, wm,
                    "init: a worker takes initial weights only as the server sends them, "
                    "never from a path in the spec");
        return false;
    }
    if (mb->spec.init_job[0] && wm->start_step == 0 && wm->init_blob == 0) {
        fail_member(a, m, wm, "init names job %s, but the assignment carries no weights",
                    mb->spec.init_job);
        return false;
    }
    if (wm->init_blob && !mb->spec.init_job[0]) {
        fail_member(a, m, wm, "the assignment carries initial weights the spec does not ask for");
        return false;
    }
    return true;
}

/* Starts a group's thread with the termination signals blocked, so that they reach the
 * main thread's loop rather than interrupting a training step. */
static int start_thread(group *g)
{
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int rc = pthread_create(&g->th, NULL, agent_group_thread, g);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

static int hex_value(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : 0;
}

/*
 * Whether this worker can hold its part of a spanning group (the decoder checked the
 * span's numbers): it needs --comm-addr and devices of one kind, CPU (whose gradients
 * go through the TCP communicator) or CUDA (through NCCL, joined over it).  A refusal
 * sends no event: it is not the members' fault, and the server re-queues a group that
 * does not run.
 */
static bool span_assign_ok(fb_agent *a, const fb_wire_msg *m)
{
    const char *why = NULL;
    if (!a->comm_host[0])
        why = "this worker takes no part in arrays that span workers (no --comm-addr)";
    const char *kind = NULL;
    for (int i = 0; !why && i < m->n_group_devices; i++) {
        int k = m->group_devices[i];
        if (k < 0 || k >= a->n_devices) continue; /* on_assign fails the members */
        if (!kind) kind = a->dev[k].info.kind;
        if (strcmp(a->dev[k].info.kind, kind) != 0)
            why = "an array that spans workers needs devices of one kind";
    }
    if (!why) return true;
    agent_log("group %s generation %lld: spanning assignment refused: %s", m->group_id,
              (long long)m->generation, why);
    return false;
}

/* DETACHED events for every member of an ASSIGN this worker will not start, through no
 * fault of theirs: the server re-queues them at once, as for a drain, instead of holding
 * them scheduled until it notices that the array does not run.  A follower of a spanning
 * group sends none (the leader speaks for the members). */
static void refuse_members(fb_agent *a, const fb_wire_msg *m, const char *why)
{
    if (m->world && m->rank_base > 0) return;
    for (int i = 0; i < m->n_members; i++) {
        outmsg *o = agent_event_new(NULL, m->group_id, m->generation, FB_EV_DETACHED,
                                    m->members[i].job_id, m->members[i].start_step);
        agent_event_text(o, "%s", why);
        outbox_add(a, o);
    }
}

/* FAILED events (the array's own fault) for every member of an ASSIGN that cannot start. */
static void fail_members(fb_agent *a, const fb_wire_msg *m, const char *why)
{
    for (int i = 0; i < m->n_members; i++) fail_member(a, m, &m->members[i], "%s", why);
}

/* The scripted step of g: the entry of its first member (in the ASSIGN's order) that names
 * one by name or id, else the "*" entry; -1 when there is neither. */
static int64_t script_step_ns(const fb_agent *a, const group *g)
{
    for (int i = 0; i < g->n_members; i++) {
        const member *mb = &g->m[i];
        if (mb->sidx < 0) continue;
        for (int k = 0; k < a->n_script; k++)
            if (strcmp(a->script[k].key, mb->job_id) == 0 ||
                (mb->spec.name[0] && strcmp(a->script[k].key, mb->spec.name) == 0))
                return a->script[k].ns;
    }
    for (int k = 0; k < a->n_script; k++)
        if (strcmp(a->script[k].key, "*") == 0) return a->script[k].ns;
    return -1;
}

/*
 * Whether an ASSIGN may start a group here: not while draining (its members are refused),
 * not twice (a duplicate generation is ignored), not with a job listed twice, not a span this
 * worker cannot hold, not on devices it does not have (its members fail).  A newer
 * generation of a group that runs here stops the old one first.  False when the ASSIGN is
 * done with: what had to be logged and sent is.
 */
static bool assign_admitted(fb_agent *a, const fb_wire_msg *m)
{
    if (a->draining) {
        agent_log("group %s: assignment refused, the worker is draining", m->group_id);
        refuse_members(a, m, "the worker is draining");
        return false;
    }
    group *old = find_group(a, m->group_id);
    if (old && old->generation == m->generation) {
        agent_log("group %s generation %lld: already running; duplicate ASSIGN ignored",
                  m->group_id, (long long)m->generation);
        return false;
    }
    for (int i = 0; i < m->n_members; i++)
        for (int j = 0; j < i; j++)
            if (strcmp(m->members[i].job_id, m->members[j].job_id) == 0) {
                agent_log("group %s: ASSIGN lists job %s twice; dropped", m->group_id,
                          m->members[i].job_id);
                return false;
            }
    if (old) {
        agent_log("group %s: generation %lld replaces %lld", m->group_id, (long long)m->generation,
                  (long long)old->generation);
        agent_stop_group(a, old);
    }
    if (m->world && !span_assign_ok(a, m)) return false;
    for (int i = 0; i < m->n_group_devices; i++)
        if (m->group_devices[i] < 0 || m->group_devices[i] >= a->n_devices) {
            for (int k = 0; k < m->n_members; k++)
                fail_member(a, m, &m->members[k],
                            "device %d does not exist on worker %s (it has %d)",
                            m->group_devices[i], a->name, a->n_devices);
            return false;
        }
    return true;
}

/* The group of an admitted ASSIGN, its members not yet taken (take_members): its ids and
 * dataset, its layout on the worker's devices, its span across workers.  NULL, with its
 * members failed, when out of memory. */
static group *group_new(fb_agent *a, const fb_wire_msg *m)
{
    group *g = calloc(1, sizeof *g);
    if (!g || pthread_mutex_init(&g->mu, NULL) != 0) {
        free(g);
        agent_log("group %s: out of memory", m->group_id);
        fail_members(a, m, "out of memory on the worker");
        return NULL;
    }
    g->a = a;
    snprintf(g->id, sizeof g->id, "%s", m->group_id);
    g->generation = m->generation;
    snprintf(g->dataset, sizeof g->dataset, "%s", m->dataset);
    snprintf(g->dataset_tenant, sizeof g->dataset_tenant, "%s", m->dataset_tenant);
    snprintf(g->source, sizeof g->source, "%s", m->builtin[0] ? m->builtin : m->dataset);
    g->dev = m->n_group_devices > 0 ? m->group_devices[0] : 0;
    g->n_split = m->n_split;
    memcpy(g->split, m->split, sizeof g->split);
    g->n_dp = 1;
    g->pipeline = 1;
    int want_d = m->parallel_data > 0 ? m->parallel_data : 1;
    int want_p = m->parallel_pipeline > 0 ? m->parallel_pipeline : 1;
    if ((want_d * want_p > 1 || m->world) && m->n_group_devices == want_d * want_p) {
        /* shard d, stage p is entry d * P + p (docs/wire.md) */
        g->n_dp = want_d;
        g->pipeline = want_p;
        for (int k = 0; k < want_d * want_p; k++) g->dp_devs[k] = m->group_devices[k];
    }
    if (m->world) {
        g->world = m->world;
        g->rank_base = m->rank_base;
        g->follower = m->rank_base > 0;
        snprintf(g->rendezvous, sizeof g->rendezvous, "%s", m->rendezvous);
        for (int k = 0; k < FB_COMM_TOKEN_BYTES; k++) {
            unsigned hi = (unsigned)hex_value(m->token[2 * k]);
            unsigned lo = (unsigned)hex_value(m->token[2 * k + 1]);
            g->token[k] = (unsigned char)(hi << 4 | lo);
        }
        /* FNV-1a over the job ids, in the ASSIGN's order, which the member bits follow */
        uint64_t h = 0xcbf29ce484222325ULL;
        for (int i = 0; i < m->n_members; i++)
            for (const char *p = m->members[i].job_id; *p; p++)
                h = (h ^ (unsigned char)*p) * 0x100000001b3ULL;
        g->members_hash = h;
    }
    g->m = calloc((size_t)(m->n_members ? m->n_members : 1), sizeof *g->m);
    g->by_sidx = calloc((size_t)(m->n_members ? m->n_members : 1), sizeof *g->by_sidx);
    if (!g->m || !g->by_sidx) {
        agent_log("group %s: out of memory", m->group_id);
        group_free(g);
        fail_members(a, m, "out of memory on the worker");
        return NULL;
    }
    return g;
}

/* The members of g's ASSIGN that can train, with the checkpoints and weights they start
 * from (copied out of the message's frames); the others fail one by one (member_ok). */
static void take_members(fb_agent *a, const fb_wire_msg *m, zmq_msg_t *frames, group *g)
{
    g->n_members = m->n_members;
    bool have_start = false;
    for (int i = 0; i < m->n_members; i++) {
        const fb_wire_member *wm = &m->members[i];
        member *mb = &g->m[i];
        snprintf(mb->job_id, sizeof mb->job_id, "%s", wm->job_id);
        mb->sidx = -1;
        mb->loss = mb->accuracy = mb->lr = NAN;
        if (!member_ok(a, m, wm, mb, have_start ? &g->start_step : NULL)) continue;
        if (wm->resume_blob > 0) {
            zmq_msg_init(&mb->resume);
            if (zmq_msg_copy(&mb->resume, &frames[wm->resume_blob]) != 0) {
                zmq_msg_close(&mb->resume);
                fail_member(a, m, wm, "out of memory");
                continue;
            }
            mb->has_resume = true;
        }
        if (wm->init_blob > 0) {
            zmq_msg_init(&mb->init);
            if (zmq_msg_copy(&mb->init, &frames[wm->init_blob]) != 0) {
                zmq_msg_close(&mb->init);
                if (mb->has_resume) zmq_msg_close(&mb->resume);
                mb->has_resume = false;
                fail_member(a, m, wm, "out of memory");
                continue;
            }
            mb->has_init = true;
        }
        if (!have_start) {
            g->start_step = wm->start_step;
            have_start = true;
        }
        mb->sidx = g->n_sess;
        mb->alive = true;
        g->by_sidx[g->n_sess++] = i;
    }
    g->steps_done = g->start_step;
}

/* g's place in the device turns: its share, its scripted step time, the devices of its
 * turns.  False, with its members failed, when the script names none of its jobs. */
static bool join_turns(fb_agent *a, const fb_wire_msg *m, group *g)
{
    double share = m->time_share > 0 ? m->time_share : 1;
    /* the devices of its turns: each of the layout's once (the wire allows the same device
     * twice in a layout), or its first only (a->device_turns; all devices of a worker are of
     * one kind) */
    bool all_turns = a->device_turns == FB_AGENT_TURNS_ALL ||
                     (a->device_turns == FB_AGENT_TURNS_AUTO &&
                      strcmp(a->dev[g->dev].info.kind, "cuda") == 0);
    int n_layout = all_turns ? g->n_dp * g->pipeline : 1;
    char why[256];
    int64_t step_ns = a->scripted ? script_step_ns(a, g) : 0;
    if (step_ns < 0)
        snprintf(why, sizeof why, "the scripted step times (--test-step-ms) name none of its "
                 "jobs and have no '*' entry");
    if (step_ns < 0 || fb_turn_init(&g->turn, a->n_devices, a->next_ticket++, share,
                                    n_layout > 1 ? g->dp_devs : &g->dev, n_layout, step_ns, g,
                                    why, sizeof why) != FB_OK) {
        /* the wire checked the share and the devices: only a script can be wrong here */
        agent_log("group %s: %s", m->group_id, why);
        for (int i = 0; i < g->n_members; i++)
            if (g->m[i].sidx >= 0) fail_member(a, m, &m->members[i], "%s", why);
        return false;
    }
    return true;
}

/* ASSIGN: a group to train here, started in a thread of its own (agent_group.c). */
static void on_assign(fb_agent *a, const fb_wire_msg *m, zmq_msg_t *frames)
{
    if (!assign_admitted(a, m)) return;
    group *g = group_new(a, m);
    if (!g) return;
    take_members(a, m, frames, g);
    if (g->n_sess == 0) {
        agent_log("group %s: no member can train; nothing started", m->group_id);
        group_free(g);
        return;
    }
    if (!join_turns(a, m, g)) {
        group_free(g);
        return;
    }
    if (g->world)
        agent_log("group %s: ranks %d..%d of %d across workers (%s, rendezvous %s)", m->group_id,
                  g->rank_base, g->rank_base + g->n_dp - 1, g->world,
                  g->follower ? "follower" : "leader", g->rendezvous);
    else if (g->n_dp * g->pipeline > 1)
        agent_log("group %s: %d data shard%s x %d pipeline stage%s", m->group_id, g->n_dp,
                  g->n_dp == 1 ? "" : "s", g->pipeline, g->pipeline == 1 ? "" : "s");
    g->bye = agent_outmsg_new(OUT_EXIT, g);
    g->push = g->bye ? zmq_socket(a->ctx, ZMQ_PUSH) : NULL;
    if (!g->push || zmq_connect(g->push, a->inproc) != 0 || start_thread(g) != 0) {
        agent_log("group %s: cannot start its thread", m->group_id);
        for (int i = 0; i < g->n_members; i++)
            if (g->m[i].sidx >= 0)
                fail_member(a, m, &m->members[i], "the worker cannot start a training thread");
        if (g->push) zmq_close(g->push);
        agent_outmsg_free(g->bye);
        group_free(g);
        return;
    }
    g->next = a->groups;
    a->groups = g;
    agent_log("group %s generation %lld: %d of %d members on device %d, dataset %s, from step "
              "%lld, time share %.3g",
              g->id, (long long)g->generation, g->n_sess, g->n_members, g->dev, g->dataset,
              (long long)g->start_step, fb_turn_share(&g->turn));
}

static void on_detach(fb_agent *a, const fb_wire_msg *m)
{
    group *g = find_group(a, m->group_id);
    if (!g || g->generation != m->generation) {
        agent_log("DETACH for group %s generation %lld, which does not run here; dropped",
                  m->group_id, (long long)m->generation);
        return;
    }
    if (!m->job_id[0]) {
        agent_log("group %s: stopped by the server%s%s", g->id, m->text[0] ? ": " : "", m->text);
        agent_stop_group(a, g);
        return;
    }
    if (g->follower) {
        /* members leave at a step the leader chooses, so their DETACH goes to the leader */
        agent_log("group %s: DETACH of %s sent to a follower of a spanning group; dropped "
                  "(the leader decides)",
                  g->id, m->job_id);
        return;
    }
    for (int i = 0; i < g->n_members; i++) {
        member *mb = &g->m[i];
        if (strcmp(mb->job_id, m->job_id) != 0) continue;
        pthread_mutex_lock(&g->mu);
        bool alive = mb->alive;
        if (alive) {
            mb->detach_req = true;
            mb->detach_keep |= m->keep_state;
            g->detach_pending = true;
        }
        pthread_mutex_unlock(&g->mu);
        if (!alive)
            agent_log("group %s: DETACH of %s, which has already left; dropped", g->id, m->job_id);
        return;
    }
    agent_log("group %s: DETACH of %s, which is not a member; dropped", g->id, m->job_id);
}

static void on_rebalance(fb_agent *a, const fb_wire_msg *m)
{
    group *g = find_group(a, m->group_id);
    if (!g || g->generation != m->generation) {
        agent_log("REBALANCE for group %s generation %lld, which does not run here; dropped",
                  m->group_id, (long long)m->generation);
        return;
    }
    if (g->follower) {
        agent_log("group %s: REBALANCE sent to a follower of a spanning group; dropped (the "
                  "leader passes its split on)",
                  g->id);
        return;
    }
    char why[128];
    if (m->time_share > 0 &&
        fb_turns_sync_set_share(&a->turns, &g->turn, m->time_share, why, sizeof why) != FB_OK)
        agent_log("group %s: REBALANCE share not applied: %s", g->id, why);
    if (m->n_split > 0) {
        pthread_mutex_lock(&g->mu);
        g->n_split = m->n_split;
        memcpy(g->split, m->split, sizeof g->split);
        g->split_gen++;
        pthread_mutex_unlock(&g->mu);
    }
    agent_log("group %s: time share %.3g", g->id, m->time_share);
}

static void start_drain(fb_agent *a, const char *why)
{
    if (a->draining) return;
    a->draining = true;
    agent_log("draining (%s): checkpointing every member", why);
    send_drain(a);
    for (group *g = a->groups; g; g = g->next) {
        /* a follower's part trains on until the server moves its group away (its leader
         * drains it, or every member leaves on the leader's DETACH) */
        if (g->follower) continue;
        atomic_store(&g->drain, true);
        agent_turns_wake(a);
    }
}

/* ---- the main thread: receiving ---------------------------------------------------------- */

static void on_message(fb_agent *a, zmq_msg_t *frames, int n_frames)
{
    char err[512];
    fb_wire_msg m;
    if (fb_wire_decode(zmq_msg_data(&frames[0]), zmq_msg_size(&frames[0]), n_frames - 1, &m, err,
                       sizeof err) != FB_OK) {
        agent_log("malformed message dropped: %s", err);
        return;
    }
    switch (m.type) {
    case FB_WIRE_WELCOME:
        snprintf(a->worker_id, sizeof a->worker_id, "%s", m.worker_id);
        a->heartbeat_ms = m.heartbeat_ms;
        if (a->welcomed) {
            /* the answer to a HELLO queued while the link was down: a link that comes back
             * delivers every HELLO of the outage at once, and resending the outbox for each
             * answer multiplied the traffic of a returning worker */
            break;
        }
        a->welcomed = true;
        agent_log("registered as %s (worker id %s), heartbeat every %d ms; resending %s", a->name,
                  a->worker_id, a->heartbeat_ms,
                  a->outbox ? "the unacknowledged events" : "nothing");
        a->unsent = a->outbox; /* the server records events idempotently, by seq */
        flush_outbox(a);
        if (a->draining && !a->drain_sent) send_drain(a);
        break;
    case FB_WIRE_HEARTBEAT:
        if (!m.reply) {
            agent_log("a worker's heartbeat came from the server; dropped");
        } else if (!m.known) {
            agent_log("the server does not know this worker; registering again");
            a->welcomed = false;
            send_hello(a);
        }
        break;
    case FB_WIRE_ASSIGN:
        on_assign(a, &m, frames);
        break;
    case FB_WIRE_ACK:
        outbox_ack(a, m.seq);
        break;
    case FB_WIRE_DETACH:
        on_detach(a, &m);
        break;
    case FB_WIRE_REBALANCE:
        on_rebalance(a, &m);
        break;
    case FB_WIRE_DRAIN:
        start_drain(a, m.text[0] ? m.text : "the server asked");
        break;
    default:
        agent_log("a %s message is not for a worker; dropped", fb_wire_type_name(m.type));
        break;
    }
    fb_wire_msg_free(&m);
}

/* Reads what the server sent, a bounded number of messages per call. */
static int recv_dealer(fb_agent *a, char *msg, size_t msg_cap)
{
    for (int k = 0; k < 64; k++) {
        zmq_msg_t frames[FB_WIRE_MAX_BLOBS + 1];
        int n = 0;
        bool too_many = false, more = true;
        while (more) {
            zmq_msg_t f;
            zmq_msg_init(&f);
            if (zmq_msg_recv(&f, a->dealer, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                int e = errno;
                zmq_msg_close(&f);
                for (int i = 0; i < n; i++)
                    zmq_msg_close(&frames[i]);
                if (e == EAGAIN && n == 0) return FB_OK;
                if (e == EINTR) return FB_OK;
                return fb_errf(msg, msg_cap, FB_ERR_IO, "receiving from the server: %s",
                               zmq_strerror(e));
            }
            more = zmq_msg_more(&f);
            if (n < FB_WIRE_MAX_BLOBS + 1) {
                frames[n++] = f;
            } else {
                too_many = true;
                zmq_msg_close(&f);
            }
        }
        a->last_rx = agent_now_ms();
        if (too_many)
            agent_log("a message of more than %d frames dropped", FB_WIRE_MAX_BLOBS + 1);
        else if (zmq_msg_size(&frames[0]) > FB_WIRE_MAX_JSON)
            agent_log("a message with %zu bytes of JSON dropped", zmq_msg_size(&frames[0]));
        else
            on_message(a, frames, n);
        for (int i = 0; i < n; i++)
            zmq_msg_close(&frames[i]);
    }
    return FB_OK;
}

/* Takes a group thread's message. */
static void on_internal(fb_agent *a, outmsg *o)
{
    group *g = o->g;
    switch (o->kind) {
    case OUT_EXIT:
        pthread_join(g->th, NULL);
        for (group **p = &a->groups; *p; p = &(*p)->next)
            if (*p == g) {
                *p = g->next;
                break;
            }
        group_free(g);
        agent_outmsg_free(o);
        break;
    case OUT_PROGRESS:
        /* also while registering again: a server that still knows the worker (only its
         * database is away) records the progress; one that does not drops it */
        if (!atomic_load(&g->stop) && (a->welcomed || a->worker_id[0]))
            send_wire(a, &o->w, NULL, 0);
        agent_outmsg_free(o);
        break;
    case OUT_EVENT:
        if (g && atomic_load(&g->stop)) {
            agent_outmsg_free(o); /* a stopped group reports nothing */
            break;
        }
        o->g = NULL;
        outbox_add(a, o);
        break;
    }
}

void agent_recv_pull(fb_agent *a)
{
    for (int k = 0; k < 256; k++) {
        outmsg *o = NULL;
        int rc = zmq_recv(a->pull, &o, sizeof o, ZMQ_DONTWAIT);
        if (rc < 0) return;
        if (rc != (int)sizeof o || !o) continue;
        FB_TSAN_ACQUIRE(o);
        on_internal(a, o);
    }
}

/* The DEALER's connection events: one log line per change, so that an operator sees a
 * refused key or a lost server without reading packet traces. */
static void recv_monitor(fb_agent *a)
{
    for (int k = 0; k < 64; k++) {
        zmq_msg_t f[2];
        int n = 0, more = 1;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, a->mon, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                zmq_msg_close(&m);
                for (int i = 0; i < n; i++)
                    zmq_msg_close(&f[i]);
                return;
            }
            more = zmq_msg_more(&m);
            if (n < 2)
                f[n++] = m;
            else
                zmq_msg_close(&m);
        }
        uint16_t event = 0;
        uint32_t value = 0;
        if (n >= 1 && zmq_msg_size(&f[0]) >= 6) {
            memcpy(&event, zmq_msg_data(&f[0]), 2);
            memcpy(&value, (const char *)zmq_msg_data(&f[0]) + 2, 4);
        }
        for (int i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
        switch (event) {
        case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
            agent_log("connected to %s", a->server);
            a->connected = true;
            a->auth_logged = false;
            /* register now rather than at the next heartbeat: the HELLO sent at start found
             * no connection yet, and a test's manual clock may not reach the next beat */
            if (!a->welcomed) send_hello(a);
            break;
        case ZMQ_EVENT_DISCONNECTED:
            if (a->connected) agent_log("connection to %s lost; reconnecting", a->server);
            a->connected = false;
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
            if (!a->auth_logged)
                agent_log("the server refused this worker (status %u): is its public key in "
                          "the server's list of allowed workers?",
                          (unsigned)value);
            a->auth_logged = true;
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
            if (!a->auth_logged)
                agent_log("the handshake with %s failed: is --server-key the server's public "
                          "key?",
                          a->server);
            a->auth_logged = true;
            break;
        default:
            break;
        }
    }
}

/* ---- the main thread: the loop ----------------------------------------------------------- */

/* Heartbeats, registration and resends, on the heartbeat cadence. */
static void on_timer(fb_agent *a, double now)
{
    if (now - a->last_beat < a->heartbeat_ms) return;
    a->last_beat = now;
    if (!a->welcomed) {
        send_hello(a);
    } else if (now - a->last_rx >= SILENT_HEARTBEATS * (double)a->heartbeat_ms) {
        /* the server may have restarted and forgotten this worker: register again, with
         * the running groups, until it answers */
        agent_log("no word from the server for %.1f s; registering again every heartbeat",
                  (now - a->last_rx) / 1e3);
        /* events wait for the next WELCOME, which resends them all in order: sent now they
         * could reach a new server ahead of older ones it has not seen yet */
        a->welcomed = false;
        send_hello(a);
    } else {
        send_heartbeat(a);
    }
    flush_outbox(a);
    if (a->draining && !a->drain_sent) send_drain(a);
}

/* What a finished drain returns: FB_OK, or FB_ERR_IO when staging failed on this node (the
 * worker drained because of it, and whoever started it must hear that it cannot train). */
static int drained_rc(fb_agent *a, char *msg, size_t msg_cap)
{
    if (!atomic_load(&a->stage_fault)) return FB_OK;
    return fb_errf(msg, msg_cap, FB_ERR_IO, "node-local staging failed, so the worker drained: %s",
                   a->stage_fault_msg);
}

int fb_agent_run(fb_agent *a, char *msg, size_t msg_cap)
{
    double start = agent_now_ms();
    a->last_rx = start;
    a->last_beat = start;
    send_hello(a);
    agent_log("worker %s: %d %s device%s, %d thread%s each; server %s", a->name, a->n_devices,
              a->backend, a->n_devices == 1 ? "" : "s", a->threads, a->threads == 1 ? "" : "s",
              a->server);
    for (;;) {
        double now = agent_now_ms();
        if (atomic_load(&a->drain_req)) start_drain(a, "requested");
        if (a->draining && !a->groups) {
            if (!a->drain_timed) {
                a->drain_timed = true;
                a->drained_at = now;
                if (a->outbox)
                    agent_log("every group drained; waiting up to %d ms for %s",
                              FB_AGENT_DRAIN_WAIT_MS, "the server's acknowledgements");
            }
            if (!a->outbox) {
                agent_log("drained; every event acknowledged");
                return drained_rc(a, msg, msg_cap);
            }
            if (now - a->drained_at >= FB_AGENT_DRAIN_WAIT_MS) {
                int n = 0;
                for (outmsg *o = a->outbox; o; o = o->next)
                    n++;
                agent_log("drained; %d event%s not acknowledged in time", n, n == 1 ? "" : "s");
                return drained_rc(a, msg, msg_cap);
            }
        }
        on_timer(a, now);
        /* the next heartbeat's time on the clock; a manual one is polled */
        int wait = fb_clock_wait_ms((int64_t)ceil(a->last_beat + a->heartbeat_ms), POLL_MAX_MS);
        zmq_pollitem_t items[3] = {{.socket = a->dealer, .events = ZMQ_POLLIN},
                                   {.socket = a->pull, .events = ZMQ_POLLIN},
                                   {.socket = a->mon, .events = ZMQ_POLLIN}};
        int rc = zmq_poll(items, 3, wait);
        if (rc < 0) {
            if (errno == EINTR) continue;
            return fb_errf(msg, msg_cap, FB_ERR_IO, "zmq_poll: %s", zmq_strerror(errno));
        }
        if (items[1].revents & ZMQ_POLLIN) agent_recv_pull(a);
        if (items[2].revents & ZMQ_POLLIN) recv_monitor(a);
        if (items[0].revents & ZMQ_POLLIN) {
            int err = recv_dealer(a, msg, msg_cap);
            if (err) return err;
        }
    }
}

void fb_agent_drain(fb_agent *a)
{
    if (a) atomic_store(&a->drain_req, true);
}
