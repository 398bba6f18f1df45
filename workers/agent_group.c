/*
 * The worker agent's group threads (agent_int.h): each assigned group trains
 * in a thread of its own, which takes the group's turns on its devices
 * (turns.h), runs its session a step at a time, applies detaches and new
 * batch splits between steps, and hands its events and progress to the main
 * thread through its PUSH socket.  A group that spans workers first joins
 * its peers (TCP, and NCCL for CUDA devices), and before each step takes its
 * leader's decisions in one broadcast (span_exchange).  The test step hook,
 * which holds an array at a step a file names, is here too.
 */
#include "agent_int.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "cuda/cuda_backend.h"
#include "datadir.h"
#include "device.h"
#include "data_parallel.h"
#include "session.h"
#include "train.h"
#include "tsan.h"

/* A window of steps is cut to about this much training, so that stops, drains and
 * departures wait no longer for the session */
#define WINDOW_MS 500
#define HOOK_POLL_MS 2 /* the test step hook: how often a held group looks again */

/* The control vector a spanning group's leader broadcasts before each step (span_exchange). */
#define SPAN_MAGIC 0x66627370616e0001LL /* "fbspan", version 1 */
/* SPAN_HOLD: the leader is held by the test step hook; every rank stays at the step */
enum { SPAN_GO, SPAN_STOP, SPAN_DRAIN, SPAN_HOLD };
enum { CV_MAGIC, CV_STEP, CV_MEMBERS, CV_CMD, CV_SHARE, CV_HAS_SPLIT, CV_SPLIT };

/* ---- device turns ------------------------------------------------------------------------ */

static bool interrupted(const group *g)
{
    return atomic_load(&g->stop) || atomic_load(&g->drain);
}

/* interrupted() for fb_comm_tcp_new_until's give_up. */
static bool group_interrupted(void *g)
{
    return interrupted(g);
}

_Static_assert(FB_TURNS_MAX_DEVICES == FB_WIRE_MAX_DEVICES, "a group's turns cover its devices");

static bool turn_stopped(const fb_turn *t)
{
    return interrupted(t->user);
}

/* Enters the rotation of each device g takes turns on (turns.h). */
static void dev_register(group *g)
{
    fb_turns_sync_join(&g->a->turns, &g->turn);
}

static void dev_unregister(group *g)
{
    fb_turns_sync_leave(&g->a->turns, &g->turn, turn_stopped);
}

/*
 * Waits for g's turn on every device it steps on, and takes them all at once.  A group
 * that spans devices must hold all of them for its step: a group sharing one of them would
 * otherwise step there at the same time, outside the device's shares, and on a GPU two
 * threads would drive one backend at once.  It takes none of them until it can take all,
 * so that it never holds one device while waiting for another (a group that spans workers
 * waits in its sums while holding its devices; a hold-and-wait here could close a cycle
 * through two such groups).  False when a stop or drain request came first.
 */
static bool turns_acquire(group *g)
{
    return fb_turns_sync_acquire(&g->a->turns, &g->turn, turn_stopped);
}

/* Ends g's turn on its devices, charging it step_ms of device time weighted by its share
 * on each (it held all of them for the step). */
static void turns_release(group *g, double step_ms)
{
    fb_turns_sync_release(&g->a->turns, &g->turn, step_ms, turn_stopped);
}

/* Ends a turn g took without stepping: nothing is charged. */
static void turns_return(group *g)
{
    fb_turns_sync_return(&g->a->turns, &g->turn, turn_stopped);
}

/* Wakes the groups waiting for their turns, after a stop or drain request. */
void agent_turns_wake(fb_agent *a)
{
    fb_turns_sync_wake(&a->turns);
}

/* Scripted with a step hook: each decision of the turns as a line of HOOK_DIR/turns.log,
 * "EVENT GROUP AT_MS VALUE" (docs/worker.md, "Test clock and scripted step times"), so
 * that a test reads the order the turns were granted in.  Called under the turns' lock;
 * one write per line, which O_APPEND keeps whole. */
void agent_turn_logged(void *user, fb_turn_event ev, const fb_turn *t, int64_t at_ns, double value)
{
    static const char *const names[] = {[FB_TURN_EV_JOIN] = "join", [FB_TURN_EV_GRANT] = "grant",
                                        [FB_TURN_EV_DONE] = "done", [FB_TURN_EV_LEAVE] = "leave",
                                        [FB_TURN_EV_SHARE] = "share"};
    const fb_agent *a = user;
    const group *g = t->user;
    char line[256];
    int n = snprintf(line, sizeof line, "%s %s %.3f %g\n", names[ev], g->id, (double)at_ns / 1e6,
                     value);
    if (n > 0 && (size_t)n < sizeof line && write(a->turns_log, line, (size_t)n) != n)
        agent_log("group %s: cannot write the turns log: %s", g->id, strerror(errno));
}

/* ---- the group thread -------------------------------------------------------------------- */

/* Per-thread state of a training group. */
typedef struct runner {
    group *g;
    fb_session *s;
    fb_comm *comm;                /* a spanning group's communicator; freed after the session */
    fb_comm *nccl; /* a spanning CUDA group's gradient communicator (comm is then the
                      * control's); freed after the session */
    outmsg *pending, *pending_tail; /* events of the step in progress */
    double last_progress, samples, idle_ms;
    uint64_t split_gen; /* the REBALANCE split the session trains with */
    /* the test step hook's hold it is in: the key of its files ("" = not held), the step */
    char hold_key[FB_SPEC_NAME_MAX + 1];
    int64_t hold_step;
} runner;

/* Hands a message to the main thread; it owns it from then on. */
static void push_out(group *g, outmsg *o)
{
    if (!o) {
        agent_log("group %s: out of memory; a message is lost", g->id);
        return;
    }
    if (g->follower && o->kind == OUT_EVENT) {
        /* the leader reports the members; a follower's own events would be duplicates */
        agent_outmsg_free(o);
        return;
    }
    FB_TSAN_RELEASE(o);
    if (zmq_send(g->push, &o, sizeof o, 0) != (int)sizeof o) {
        agent_log("group %s: cannot hand a message to the main thread: %s", g->id,
                  zmq_strerror(errno));
        agent_outmsg_free(o);
    }
}

static void pend(runner *r, outmsg *o)
{
    if (!o) {
        agent_log("group %s: out of memory; an event is lost", r->g->id);
        return;
    }
    if (r->pending_tail)
        r->pending_tail->next = o;
    else
        r->pending = o;
    r->pending_tail = o;
}

static void flush_pending(runner *r)
{
    while (r->pending) {
        outmsg *o = r->pending;
        r->pending = o->next;
        o->next = NULL;
        push_out(r->g, o);
    }
    r->pending_tail = NULL;
}

static void set_alive(group *g, member *mb, bool alive)
{
    pthread_mutex_lock(&g->mu);
    mb->alive = alive;
    pthread_mutex_unlock(&g->mu);
}

static bool is_alive(group *g, member *mb)
{
    pthread_mutex_lock(&g->mu);
    bool alive = mb->alive;
    pthread_mutex_unlock(&g->mu);
    return alive;
}

static int64_t steps_done(const runner *r)
{
    return r->s ? fb_session_steps_done(r->s) : r->g->start_step;
}

/* A FAILED event for every member still alive, and they leave; fault says whose fault it is
 * (docs/scheduling.md, "Fault classes"). */
static void fail_all(runner *r, fb_wire_fault fault, const char *text)
{
    group *g = r->g;
    for (int i = 0; i < g->n_members; i++) {
        member *mb = &g->m[i];
        if (mb->sidx < 0 || !is_alive(g, mb)) continue;
        set_alive(g, mb, false);
        outmsg *o =
            agent_event_new(g, g->id, g->generation, FB_EV_FAILED, mb->job_id, steps_done(r));
        agent_event_text(o, "%s", text);
        if (o) o->w.fault = fault;
        pend(r, o);
    }
    agent_log("group %s: every member failed: %s", g->id, text);
}

/* Copies an event's file; false when out of memory. */
static bool copy_blob(outmsg *o, const void *blob, size_t len)
{
    if (!blob || !len) return true;
    o->blob = malloc(len);
    if (!o->blob) return false;
    memcpy(o->blob, blob, len);
    o->blob_len = len;
    o->w.blob = 1;
    return true;
}

/* The session's callback: turns training events into wire events (held until the step is
 * over, so that "started" goes first) and keeps the latest loss for PROGRESS. */
static void on_train_event(const fb_train_event *ev, void *user)
{
    runner *r = user;
    group *g = r->g;
    if (ev->member < 0 || ev->member >= g->n_sess) return;
    member *mb = &g->m[g->by_sidx[ev->member]];
    outmsg *o = NULL;
    switch (ev->kind) {
    case FB_TRAIN_STEP:
        mb->loss = ev->loss;
        mb->accuracy = ev->accuracy;
        mb->lr = ev->lr;
        return;
    case FB_TRAIN_EVAL:
        o = agent_event_new(g, g->id, g->generation, FB_EV_EVALUATED, mb->job_id, ev->step);
        if (o) {
            o->w.loss = ev->loss;
            o->w.accuracy = ev->accuracy;
        }
        break;
    case FB_TRAIN_CHECKPOINT:
        o = agent_event_new(g, g->id, g->generation, FB_EV_CHECKPOINTED, mb->job_id, ev->step);
        if (o && !copy_blob(o, ev->blob, ev->blob_len)) {
            /* the next checkpoint (or the server's last one) still covers the job */
            agent_log("group %s: out of memory; checkpoint of %s at step %lld not sent", g->id,
                      mb->job_id, (long long)ev->step);
            agent_outmsg_free(o);
            return;
        }
        break;
    case FB_TRAIN_DONE:
        set_alive(g, mb, false);
        mb->final_report = true;
        mb->final_step = ev->step;
        o = agent_event_new(g, g->id, g->generation, FB_EV_FINISHED, mb->job_id, ev->step);
        if (o) {
            o->w.loss = ev->loss;
            o->w.accuracy = ev->accuracy;
            o->w.test_loss = ev->test_loss;
            o->w.test_accuracy = ev->test_accuracy;
            if (!copy_blob(o, ev->blob, ev->blob_len)) {
                o->w.event = FB_EV_FAILED;
                o->w.loss = o->w.accuracy = o->w.test_loss = o->w.test_accuracy = NAN;
                snprintf(o->w.text, sizeof o->w.text,
                         "out of memory while sending the finished model");
            }
        }
        agent_log("group %s: %s finished at step %lld (loss %.4g, accuracy %.4g)", g->id,
                  mb->job_id, (long long)ev->step, ev->loss, ev->accuracy);
        break;
    case FB_TRAIN_FAILED:
        set_alive(g, mb, false);
        o = agent_event_new(g, g->id, g->generation, FB_EV_FAILED, mb->job_id, ev->step);
        agent_event_text(o, "%s", ev->text ? ev->text : "failed");
        agent_log("group %s: %s failed at step %lld: %s", g->id, mb->job_id, (long long)ev->step,
                  ev->text ? ev->text : "?");
        break;
    default:
        return;
    }
    pend(r, o);
}

/* Puts a leaving member's full training state into o, its DETACHED event,
 * with `what` (how it left) as the event's text; when the state cannot be
 * taken the text says why and the member resumes from its last checkpoint. */
static void leave_with_state(runner *r, member *mb, outmsg *o, const char *what)
{
    if (!o) return;
    char msg[512];
    void *buf = NULL;
    size_t len = 0;
    int err = fb_session_checkpoint(r->s, mb->sidx, &buf, &len, msg, sizeof msg);
    if (err) {
        agent_event_text(o, "%s; no checkpoint: %s", what, msg);
        agent_log("group %s: %s left without a checkpoint (%s): %s", r->g->id, mb->job_id, what,
                  msg);
        return;
    }
    o->blob = buf;
    o->blob_len = len;
    o->w.blob = 1;
    agent_event_text(o, "%s", what);
}

/* Members the server asked to leave leave now, at a step boundary. */
static void apply_detaches(runner *r)
{
    group *g = r->g;
    pthread_mutex_lock(&g->mu);
    bool any = g->detach_pending;
    g->detach_pending = false;
    pthread_mutex_unlock(&g->mu);
    if (!any) return;
    for (int i = 0; i < g->n_members; i++) {
        member *mb = &g->m[i];
        pthread_mutex_lock(&g->mu);
        bool go = mb->detach_req && mb->alive, keep = mb->detach_keep;
        mb->detach_req = mb->detach_keep = false;
        if (go) mb->alive = false;
        pthread_mutex_unlock(&g->mu);
        if (!go || mb->sidx < 0) continue;
        outmsg *o =
            agent_event_new(g, g->id, g->generation, FB_EV_DETACHED, mb->job_id, steps_done(r));
        /* the state is taken while the member is still in the session */
        if (keep)
            leave_with_state(r, mb, o, "left with its state on the server's request");
        else
            agent_event_text(o, "detached on the server's request");
        fb_session_detach(r->s, mb->sidx);
        pend(r, o);
        agent_log("group %s: %s detached at step %lld", g->id, mb->job_id,
                  (long long)steps_done(r));
    }
    flush_pending(r);
}

/* Drain: every member still in the array leaves with its full state. */
static void drain_members(runner *r)
{
    group *g = r->g;
    for (int i = 0; i < g->n_members; i++) {
        member *mb = &g->m[i];
        if (mb->sidx < 0 || !is_alive(g, mb)) continue;
        set_alive(g, mb, false);
        outmsg *o =
            agent_event_new(g, g->id, g->generation, FB_EV_DETACHED, mb->job_id, steps_done(r));
        if (!o) {
            pend(r, o);
            continue;
        }
        leave_with_state(r, mb, o, "drained");
        pend(r, o);
    }
    flush_pending(r);
    agent_log("group %s: drained at step %lld", g->id, (long long)steps_done(r));
}

/* PROGRESS for the members still in the array, with the step time breakdown. */
static void send_progress(runner *r, double now)
{
    group *g = r->g;
    fb_session_times t = fb_session_take_times(r->s);
    double elapsed_s = (now - r->last_progress) / 1e3;
    int64_t steps = t.steps > 0 ? t.steps : 1;
    outmsg *o = agent_outmsg_new(OUT_PROGRESS, g);
    int n = 0;
    if (o) o->w.progress = calloc((size_t)g->n_members, sizeof *o->w.progress);
    if (!o || !o->w.progress) {
        agent_outmsg_free(o);
        return; /* the next report covers it */
    }
    o->w.type = FB_WIRE_PROGRESS;
    snprintf(o->w.group_id, sizeof o->w.group_id, "%s", g->id);
    o->w.generation = g->generation;
    /* evaluation and checkpoints run on the device, so they count as compute */
    o->w.compute_ms = (t.compute_ms + t.other_ms) / (double)steps;
    /* data parallelism: all-reduce time backward did not hide, and waiting for the
     * slowest device, on top of waiting for the device's turn */
    o->w.comm_ms = t.comm_ms / (double)steps;
    o->w.io_ms = t.io_ms / (double)steps;
    o->w.idle_ms = (r->idle_ms + t.idle_ms) / (double)steps;
    o->w.samples_per_s = elapsed_s > 0 ? r->samples / elapsed_s : 0;
    double script_ms = (double)g->turn.step_ns / 1e6;
    if (g->a->scripted) {
        /* a scripted step is its script's time of compute, and nothing else: the session's
         * own measures are of the machine, which the test does not set */
        o->w.compute_ms = script_ms;
        o->w.comm_ms = o->w.io_ms = 0;
        o->w.idle_ms = r->idle_ms / (double)steps;
    }
    /* each device's own breakdown, so that the server sees which one is slower; waiting for
     * the group's turn on its device is every device's wait */
    int n_dev = g->n_dp * g->pipeline;
    if (t.devices == n_dev && n_dev <= FB_SESSION_MAX_DEVICES && t.steps > 0) {
        for (int k = 0; k < n_dev; k++) {
            const fb_session_device_times *dt = &t.dev[k];
            o->w.device_steps[k] = (fb_wire_device_step){
                .device = n_dev > 1 ? g->dp_devs[k] : g->dev,
                .compute_ms = dt->compute_ms / (double)steps,
                .pass_ms = dt->pass_ms / (double)steps,
                .comm_ms = dt->comm_ms / (double)steps,
                .io_ms = dt->io_ms / (double)steps,
                .idle_ms = (r->idle_ms + dt->idle_ms) / (double)steps,
                .steps = t.steps,
                .samples = dt->samples};
            if (g->a->scripted)
                o->w.device_steps[k] = (fb_wire_device_step){
                    .device = o->w.device_steps[k].device,
                    .compute_ms = script_ms,
                    .pass_ms = script_ms,
                    .idle_ms = r->idle_ms / (double)steps,
                    .steps = t.steps,
                    .samples = dt->samples};
        }
        o->w.n_device_steps = n_dev;
    }
    for (int i = 0; i < g->n_members; i++) {
        member *mb = &g->m[i];
        bool in = mb->sidx >= 0 && fb_session_has(r->s, mb->sidx);
        if (!in && !mb->final_report) continue;
        fb_wire_member_progress *p = &o->w.progress[n++];
        snprintf(p->job_id, sizeof p->job_id, "%s", mb->job_id);
        p->step = in ? fb_session_steps_done(r->s) : mb->final_step;
        p->steps = in ? fb_session_total_steps(r->s, mb->sidx) : mb->final_step;
        mb->final_report = false;
        p->loss = mb->loss;
        p->accuracy = mb->accuracy;
        p->lr = mb->lr;
    }
    o->w.n_progress = n;
    r->last_progress = now;
    r->samples = 0;
    r->idle_ms = 0;
    if (g->follower) {
        /* its devices only: the leader reports the members */
        free(o->w.progress);
        o->w.progress = NULL;
        o->w.n_progress = n = 0;
        if (o->w.n_device_steps == 0) {
            agent_outmsg_free(o);
            return;
        }
    } else if (n == 0) {
        agent_outmsg_free(o);
        return;
    }
    push_out(g, o);
}

/* Whose fault a session that cannot open is: a weights file that is corrupt or does not fit
 * the model, or a spec this runtime refuses, fails the same way anywhere (the spec's); out of
 * memory, an unreadable file or anything else is this run's (the job's), which a restart
 * elsewhere may not meet. */
static fb_wire_fault session_fault(int err)
{
    return err == FB_ERR_CHECKPOINT || (err <= FB_ERR_JSON_SYNTAX && err >= FB_ERR_NOT_FUSIBLE)
               ? FB_FAULT_SPEC
               : FB_FAULT_JOB;
}

/* Opens the session and restores the members that resume; false when nothing can train. */
static bool open_session(runner *r, dataset_ref *ds, const fb_dataset *train, fb_loader *loader)
{
    group *g = r->g;
    fb_agent *a = g->a;
    char msg[1024];
    const fb_job_spec **specs = calloc((size_t)g->n_sess, sizeof *specs);
    if (!specs) {
        fail_all(r, FB_FAULT_JOB, "out of memory");
        flush_pending(r);
        return false;
    }
    for (int k = 0; k < g->n_sess; k++)
        specs[k] = &g->m[g->by_sidx[k]].spec;
    /* every step reports its loss: the host has it anyway, and PROGRESS shows the latest */
    fb_train_opts o = {.log_every = 1,
                       .cb = on_train_event,
                       .user = r,
                       .start_step = g->start_step,
                       .blobs = true,
                       .loader = loader,
                       /* the test step hook and scripted step times hold and time single
                        * steps; elsewhere a call trains a window of them */
                       .window = a->hook_dir[0] || a->scripted ? 1 : FB_SESSION_DEFAULT_WINDOW,
                       .window_ms = WINDOW_MS};
    fb_device devs[FB_WIRE_MAX_DEVICES];
    int64_t split[FB_WIRE_MAX_DEVICES];
    fb_dp_opts dpo = {.slow_rank = -1};
    if (g->n_dp * g->pipeline > 1 || g->world) {
        for (int k = 0; k < g->n_dp * g->pipeline; k++) {
            const agent_device *ad = &a->dev[g->dp_devs[k]];
            memset(&devs[k], 0, sizeof devs[k]);
            devs[k].kind = strcmp(ad->info.kind, "cuda") == 0 ? FB_DEVICE_CUDA : FB_DEVICE_CPU;
            devs[k].ordinal = ad->info.idx;
            devs[k].be = ad->be;
            devs[k].cpu_first = ad->cpu_first;
            devs[k].cpu_count = ad->cpu_count;
            snprintf(devs[k].name, sizeof devs[k].name, "%s", ad->info.name);
        }
        o.devices = devs;
        o.n_devices = g->n_dp * g->pipeline;
        o.pipeline = g->pipeline;
        /* synchronised batch norm needs host memory: CPU devices only */
        dpo.sync_bn = a->sync_bn && devs[0].kind == FB_DEVICE_CPU;
        o.dp = &dpo;
        /* the split of the ASSIGN, when it fits; the session checks it */
        pthread_mutex_lock(&g->mu);
        if (g->n_split == (g->world ? g->world : g->n_dp)) {
            memcpy(split, g->split, sizeof split);
            o.split = split;
        }
        /* ranks rank_base.. of the world, across workers; CUDA gradients go through NCCL,
         * the control broadcast through TCP */
        o.comm = r->nccl ? r->nccl : r->comm;
        o.control_comm = r->nccl ? r->comm : NULL;
        r->split_gen = g->split_gen;
        pthread_mutex_unlock(&g->mu);
    }
    o.test = ds->has_test ? &ds->test : NULL;
    int err = fb_session_new(&r->s, a->dev[g->dev].be, specs, g->n_sess, train, &ds->val, &o,
                             msg, sizeof msg);
    free(specs);
    if (err) {
        /* the events must leave with the failure: without them the server would hold the
         * jobs scheduled in an array that no longer runs */
        fail_all(r, session_fault(err), msg);
        flush_pending(r);
        return false;
    }
    /* each member's starting weights, the tenant's (init) or its own state (a resume); one
     * that does not load fails that member alone */
    for (int i = 0; i < g->n_members; i++) {
        member *mb = &g->m[i];
        if (mb->sidx < 0 || !(mb->has_init || mb->has_resume)) continue;
        zmq_msg_t *bytes = mb->has_resume ? &mb->resume : &mb->init;
        err = mb->has_resume ? fb_session_restore(r->s, mb->sidx, zmq_msg_data(bytes),
                                                  zmq_msg_size(bytes), msg, sizeof msg)
                             : fb_session_load_weights(r->s, mb->sidx, zmq_msg_data(bytes),
                                                       zmq_msg_size(bytes), msg, sizeof msg);
        if (!err) continue;
        fb_session_detach(r->s, mb->sidx);
        set_alive(g, mb, false);
        outmsg *ev =
            agent_event_new(g, g->id, g->generation, FB_EV_FAILED, mb->job_id, g->start_step);
        if (mb->has_resume) {
            agent_event_text(ev, "the checkpoint does not restore: %s", msg);
        } else {
            agent_event_text(ev, "init: the weights of job %s do not fit this model: %s",
                             mb->spec.init_job, msg);
            if (ev) ev->w.fault = FB_FAULT_SPEC; /* the same weights never fit: no restart */
        }
        agent_log("group %s: %s: %s", g->id, mb->job_id, ev ? ev->w.text : msg);
        pend(r, ev);
    }
    for (int i = 0; i < g->n_members; i++) {
        if (g->m[i].has_resume) {
            zmq_msg_close(&g->m[i].resume);
            g->m[i].has_resume = false;
        }
        if (g->m[i].has_init) {
            zmq_msg_close(&g->m[i].init);
            g->m[i].has_init = false;
        }
    }
    flush_pending(r);
    return !fb_session_done(r->s);
}

/* TF32 is a setting of the device's backend, not of an array: set it for
 * this group's spec before each of its steps, on each of its devices (it holds
 * their turns), since groups of another precision may share them.  A bf16
 * group turns it on too: its arrays round the operands of their products to
 * bf16 themselves (workers/array.c), and TF32 keeps all 8 significant bits of
 * a bf16 value, so the tensor cores compute the same exact products as float
 * math, faster.  The rounding is the
 * array's and not the backend's, because the CPU backend is one handle shared
 * by every CPU device of the process, whose groups run at the same time.
 * Nothing happens on CPU devices. */
static void set_precision(group *g)
{
    fb_precision p = g->n_sess > 0 ? g->m[g->by_sidx[0]].spec.precision : FB_PREC_FP32;
    bool tf32 = p == FB_PREC_TF32 || p == FB_PREC_BF16;
    int n = g->n_dp * g->pipeline;
    if (n <= 1) {
        fb_cuda_backend_set_tf32(g->a->dev[g->dev].be, tf32);
        return;
    }
    for (int k = 0; k < n; k++)
        fb_cuda_backend_set_tf32(g->a->dev[g->dp_devs[k]].be, tf32);
}

/* Takes a REBALANCE's new split into the session between two steps; a split
 * that does not fit (another shard count, another batch) is logged and the
 * old one stays.  True when a new split was applied: split[0..*n_out) (split
 * has room for FB_WIRE_MAX_DEVICES entries), which a spanning group's leader
 * passes on. */
static bool apply_split(runner *r, int64_t *split, int *n_out)
{
    group *g = r->g;
    int n = 0;
    pthread_mutex_lock(&g->mu);
    bool changed = g->split_gen != r->split_gen;
    if (changed) {
        n = g->n_split;
        memcpy(split, g->split, sizeof g->split);
        r->split_gen = g->split_gen;
    }
    pthread_mutex_unlock(&g->mu);
    if (!changed || fb_session_shards(r->s) < 2) return false;
    char msg[256];
    if (fb_session_set_split(r->s, split, n, msg, sizeof msg) != FB_OK) {
        agent_log("group %s: REBALANCE split not applied: %s", g->id, msg);
        return false;
    }
    char text[256];
    size_t at = 0;
    for (int d = 0; d < n && at < sizeof text; d++)
        at += (size_t)snprintf(text + at, sizeof text - at, "%s%lld", d ? "/" : "",
                               (long long)split[d]);
    agent_log("group %s: batch split %s from step %lld", g->id, text,
              (long long)fb_session_steps_done(r->s));
    *n_out = n;
    return true;
}

/*
 * A spanning group's communication failed (a peer died, was stopped, timed out or
 * refused): an infrastructure fault, not the members'.  The group stops without member
 * events and is no longer listed as running; the server re-queues its jobs from their
 * last checkpoints and stops the other workers' parts.
 */
static void span_fault(runner *r, const char *what, const char *why)
{
    group *g = r->g;
    agent_log("group %s generation %lld: %s failed at step %lld: %s; stopping the group "
              "without member events",
              g->id, (long long)g->generation, what, (long long)steps_done(r), why);
    atomic_store(&g->stop, true);
    /* what the step queued is dropped: the server learns of the fault from the running
     * list, and a member's event after it would contradict the re-queue */
    while (r->pending) {
        outmsg *o = r->pending;
        r->pending = o->next;
        agent_outmsg_free(o);
    }
    r->pending_tail = NULL;
}

/*
 * The agreement of a spanning group at a step boundary: the leader's decisions (stop,
 * drain, members that left, a new split, the time share) go to every rank in one
 * broadcast, so that every worker applies them before the same step.  The leader applies
 * its detaches (and sends their events) and its REBALANCE before it broadcasts; a
 * follower applies what it receives.  Members that finish or fail do so at the same step
 * everywhere by themselves (the losses are the world's), and the broadcast checks that
 * too: each member's presence is compared, as are the step and the members' ids.
 * A leader that the test step hook holds (hold) sends SPAN_HOLD: members still leave, no
 * split or share changes, and no rank steps.
 * *cmd receives SPAN_GO, SPAN_STOP, SPAN_DRAIN or SPAN_HOLD.  Returns FB_OK, or an error (msg says
 * why) after which the group must stop: a broken communicator or a disagreement.
 */
static int span_exchange(runner *r, bool hold, int *cmd, char *msg, size_t msg_cap)
{
    group *g = r->g;
    int words = (g->n_members + 63) / 64;
    int n = CV_SPLIT + g->world + words;
    int64_t v[CV_SPLIT + FB_WIRE_MAX_DEVICES + (FB_WIRE_MAX_MEMBERS + 63) / 64];
    memset(v, 0, sizeof v);
    int64_t *bits = v + CV_SPLIT + g->world;
    double share = 1;
    if (!g->follower) {
        int c = atomic_load(&g->stop) ? SPAN_STOP : atomic_load(&g->drain) ? SPAN_DRAIN : SPAN_GO;
        if (c == SPAN_GO && hold) c = SPAN_HOLD;
        if (c == SPAN_GO || c == SPAN_HOLD) apply_detaches(r);
        int64_t split[FB_WIRE_MAX_DEVICES];
        int n_split = 0;
        if (c == SPAN_GO && apply_split(r, split, &n_split) && n_split == g->world) {
            v[CV_HAS_SPLIT] = 1;
            memcpy(v + CV_SPLIT, split, (size_t)g->world * sizeof *split);
        }
        share = fb_turns_sync_share(&g->a->turns, &g->turn);
        v[CV_MAGIC] = SPAN_MAGIC;
        v[CV_STEP] = fb_session_steps_done(r->s);
        v[CV_MEMBERS] = (int64_t)g->members_hash;
        v[CV_CMD] = c;
        memcpy(&v[CV_SHARE], &share, sizeof share);
        for (int i = 0; i < g->n_members; i++) {
            const member *mb = &g->m[i];
            if (mb->sidx >= 0 && fb_session_has(r->s, mb->sidx))
                bits[i / 64] |= (int64_t)((uint64_t)1 << (i % 64));
        }
    }
    int err = fb_session_broadcast(r->s, v, n, msg, msg_cap);
    if (err) return err;
    if (v[CV_MAGIC] != SPAN_MAGIC)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "the leader's control message is not one");
    if (v[CV_STEP] != fb_session_steps_done(r->s))
        return fb_errf(msg, msg_cap, FB_ERR_IO, "the leader is at step %lld, this worker at %lld",
                       (long long)v[CV_STEP], (long long)fb_session_steps_done(r->s));
    if ((uint64_t)v[CV_MEMBERS] != g->members_hash)
        return fb_errf(msg, msg_cap, FB_ERR_IO,
                       "the leader's assignment lists other members than this worker's");
    *cmd = (int)v[CV_CMD];
    if (!g->follower || (*cmd != SPAN_GO && *cmd != SPAN_HOLD)) return FB_OK;
    memcpy(&share, &v[CV_SHARE], sizeof share);
    char why[128];
    if (*cmd == SPAN_GO && share > 0 && share <= 1)
        fb_turns_sync_set_share(&g->a->turns, &g->turn, share, why, sizeof why);
    if (v[CV_HAS_SPLIT]) {
        if ((err = fb_session_set_split(r->s, v + CV_SPLIT, g->world, msg, msg_cap))) return err;
        agent_log("group %s: the leader's batch split from step %lld", g->id,
                  (long long)fb_session_steps_done(r->s));
    }
    for (int i = 0; i < g->n_members; i++) {
        member *mb = &g->m[i];
        bool here = mb->sidx >= 0 && fb_session_has(r->s, mb->sidx);
        bool there = ((uint64_t)bits[i / 64] >> (i % 64)) & 1;
        if (there && !here)
            return fb_errf(msg, msg_cap, FB_ERR_IO,
                           "member %s trains on the leader but no longer here", mb->job_id);
        if (here && !there) {
            set_alive(g, mb, false);
            fb_session_detach(r->s, mb->sidx);
            agent_log("group %s: %s left at step %lld, as the leader decided", g->id, mb->job_id,
                      (long long)fb_session_steps_done(r->s));
        }
    }
    return FB_OK;
}

/* ---- the test step hook (tests only) --------------------------------------------------- */

/*
 * A test holds an array at a step boundary with a file DIR/hold-KEY holding a step N, KEY a
 * member's job id or name (a name lets a test place the hold before it submits, so that no
 * array can pass N first): when the array has done N steps it stays there, writes
 * DIR/held-KEY with N (a temporary file renamed, so a reader sees all of it or nothing)
 * and looks again every HOOK_POLL_MS until the hold file is gone or names another step,
 * reporting its progress (the held step) as often as it would while training.
 * Only the group thread waits: the main thread goes on heartbeating and receiving, and
 * a held array still obeys what it is told at a step boundary (detaches, a drain, a
 * stop), so "drain while running" or "kill after a checkpoint" happen at the held step.
 */

/* The step DIR/hold-key names, or -1 when there is no such file or it names none. */
static int64_t hook_hold_step(const fb_agent *a, const char *key)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/hold-%s", a->hook_dir, key);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long long n = -1;
    if (fscanf(f, "%lld", &n) != 1 || n < 0) n = -1;
    fclose(f);
    return n;
}

/* Leaves the hold: DIR/held-KEY goes, so a test never reads a hold that ended. */
static void hook_unhold(runner *r)
{
    if (!r->hold_key[0]) return;
    char path[1200];
    snprintf(path, sizeof path, "%s/held-%s", r->g->a->hook_dir, r->hold_key);
    if (unlink(path) != 0 && errno != ENOENT)
        agent_log("group %s: test step hook: cannot remove %s: %s", r->g->id, path,
                  strerror(errno));
    agent_log("group %s: test step hook: the hold at step %lld ends", r->g->id,
              (long long)r->hold_step);
    r->hold_key[0] = '\0';
}

/* Writes DIR/held-KEY with the step, through a temporary file renamed over it. */
static void hook_write_held(runner *r)
{
    const char *dir = r->g->a->hook_dir;
    char tmp[1200], path[1200];
    snprintf(tmp, sizeof tmp, "%s/.held-%s.tmp", dir, r->hold_key);
    snprintf(path, sizeof path, "%s/held-%s", dir, r->hold_key);
    FILE *f = fopen(tmp, "w");
    bool ok = f && fprintf(f, "%lld\n", (long long)r->hold_step) > 0;
    if (f && fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        agent_log("group %s: test step hook: cannot write %s: %s", r->g->id, path,
                  strerror(errno));
        unlink(tmp);
    }
}

/*
 * Whether the test step hook holds the array at this step boundary: a hold file of a
 * member still in it names the steps done.  Entering a hold writes its held file; leaving
 * one (released, or a hold file naming another step) removes it.
 */
static bool hook_holds(runner *r)
{
    group *g = r->g;
    if (!g->a->hook_dir[0] || !r->s) return false;
    int64_t step = fb_session_steps_done(r->s);
    const char *key = NULL;
    for (int i = 0; i < g->n_members && !key; i++) {
        member *mb = &g->m[i];
        if (mb->sidx < 0 || !fb_session_has(r->s, mb->sidx)) continue;
        if (hook_hold_step(g->a, mb->job_id) == step)
            key = mb->job_id;
        else if (mb->spec.name[0] && hook_hold_step(g->a, mb->spec.name) == step)
            key = mb->spec.name;
    }
    if (r->hold_key[0] && (!key || strcmp(key, r->hold_key) != 0 || step != r->hold_step))
        hook_unhold(r);
    if (!key) return false;
    bool entering = !r->hold_key[0];
    if (entering) {
        snprintf(r->hold_key, sizeof r->hold_key, "%s", key);
        r->hold_step = step;
    }
    /* the server hears of the held step, and a server that comes back hears it again */
    double now = agent_now_ms();
    if (entering || now - r->last_progress >= g->a->progress_ms) send_progress(r, now);
    if (entering) {
        /* after that report is on its way to the server */
        hook_write_held(r);
        agent_log("group %s: test step hook: held at step %lld by hold-%s", g->id,
                  (long long)step, key);
    }
    return true;
}

static void hook_sleep(void)
{
    struct timespec ts = {0, HOOK_POLL_MS * 1000000L};
    nanosleep(&ts, NULL);
}

/* One step of the session on the turn the group holds since t1 (ms), then its events and
 * reports.  Returns the step's error (msg says why), after which the group cannot go on. */
static int train_step(runner *r, bool first, double t1, char *msg, size_t msg_cap)
{
    group *g = r->g;
    int64_t batch = g->m[g->by_sidx[0]].spec.batch_size;
    /* who trains this step, so that each gets "started" after its first one */
    for (int i = 0; i < g->n_members; i++) {
        member *mb = &g->m[i];
        mb->started = mb->sidx >= 0 && fb_session_has(r->s, mb->sidx);
    }
    set_precision(g);
    int size = fb_session_size(r->s);
    int err = fb_session_step(r->s, msg, msg_cap);
    double t2 = agent_now_ms();
    turns_release(g, t2 - t1);
    /* scripted: the step ended when the clock reached its end, which the release waited for */
    if (g->a->scripted) t2 = agent_now_ms();
    r->samples += (double)batch * size;
    pthread_mutex_lock(&g->mu);
    g->steps_done = fb_session_steps_done(r->s);
    pthread_mutex_unlock(&g->mu);
    if (first) {
        for (int i = 0; i < g->n_members; i++) {
            member *mb = &g->m[i];
            if (!mb->started) continue;
            outmsg *o = agent_event_new(g, g->id, g->generation, FB_EV_STARTED, mb->job_id,
                                        g->start_step + 1);
            push_out(g, o);
        }
    }
    /* the report goes before this step's events, so that a member that finished is
     * reported with its last training values while the server still counts it in */
    bool finishing = false;
    for (int i = 0; i < g->n_members; i++)
        finishing |= g->m[i].final_report;
    if (!err && (first || finishing || t2 - r->last_progress >= g->a->progress_ms))
        send_progress(r, t2);
    if (!err || !g->world) flush_pending(r);
    return err;
}

/* Trains until every member has left, or a stop or drain request. */
static void train_loop(runner *r)
{
    group *g = r->g;
    char msg[1024];
    bool first = true;
    r->last_progress = agent_now_ms();
    fb_session_take_times(r->s); /* the session's set-up is not a step */
    while (!fb_session_done(r->s)) {
        if (atomic_load(&g->stop)) return;
        if (atomic_load(&g->drain)) {
            drain_members(r);
            return;
        }
        if (hook_holds(r)) {
            /* no device waits for a held group to come back for its turn */
            fb_turns_sync_park(&g->a->turns, &g->turn, true, turn_stopped);
            /* members the server sends away leave at the held step, on the group's turn
             * (leaving touches the device) */
            pthread_mutex_lock(&g->mu);
            bool detach = g->detach_pending;
            pthread_mutex_unlock(&g->mu);
            if (detach && turns_acquire(g)) {
                apply_detaches(r);
                turns_return(g);
            }
            if (!fb_session_done(r->s)) hook_sleep();
            continue;
        }
        double t0 = agent_now_ms();
        bool turn = turns_acquire(g);
        double t1 = agent_now_ms();
        /* scripted: the wait in the script's times, not the clock's reading */
        r->idle_ms += g->a->scripted && turn ? (double)g->turn.waited_ns / 1e6 : t1 - t0;
        if (!turn) continue;
        apply_detaches(r);
        if (fb_session_done(r->s)) {
            turns_return(g);
            break;
        }
        int64_t split[FB_WIRE_MAX_DEVICES];
        int n_split = 0;
        apply_split(r, split, &n_split);
        if (train_step(r, first, t1, msg, sizeof msg)) {
            fail_all(r, FB_FAULT_JOB, msg);
            flush_pending(r);
            return;
        }
        first = false;
    }
}

/*
 * The loop of a group that spans workers: before each step every rank takes the
 * leader's decisions (span_exchange); a stop or drain of the leader ends the group on
 * every worker, and a failed communication ends it without member events.  A follower
 * that is stopped itself just leaves: its peers' sums then fail and they stop too.
 */
static void span_loop(runner *r)
{
    group *g = r->g;
    char msg[1024];
    bool first = true;
    r->last_progress = agent_now_ms();
    fb_session_take_times(r->s);
    while (!fb_session_done(r->s)) {
        if (g->follower && atomic_load(&g->stop)) return;
        /* the leader alone reads the test step hook and holds every rank with it */
        bool hold = !g->follower && !interrupted(g) && hook_holds(r);
        /* a leader asked to stop or drain still tells the others, without its turn */
        bool turn = false;
        double t0 = agent_now_ms();
        if (!interrupted(g)) turn = turns_acquire(g);
        double t1 = agent_now_ms();
        r->idle_ms += t1 - t0;
        int cmd = SPAN_GO;
        int err = span_exchange(r, hold, &cmd, msg, sizeof msg);
        if (!err && cmd == SPAN_HOLD) {
            /* no step: members may have left; the followers wait in the next exchange */
            if (turn) turns_return(g);
            if (!g->follower && !fb_session_done(r->s)) hook_sleep();
            continue;
        }
        if (err || cmd != SPAN_GO || fb_session_done(r->s)) {
            if (turn) turns_release(g, agent_now_ms() - t1);
            if (err) {
                span_fault(r, "the agreement with the other workers", msg);
            } else if (cmd == SPAN_DRAIN && !g->follower) {
                drain_members(r);
            } else if (cmd != SPAN_GO && g->follower) {
                agent_log("group %s: the leader %s the group at step %lld", g->id,
                          cmd == SPAN_DRAIN ? "drained" : "stopped",
                          (long long)fb_session_steps_done(r->s));
                atomic_store(&g->stop, true);
            }
            return;
        }
        if (!turn) continue; /* a follower's stop came during the wait: it leaves above */
        err = train_step(r, first, t1, msg, sizeof msg);
        if (err) {
            /* a failed sum is the infrastructure's fault; anything else on the leader is
             * the members', reported as on one worker */
            if (err == FB_ERR_IO || g->follower) {
                span_fault(r, "a training step", msg);
            } else {
                fail_all(r, FB_FAULT_JOB, msg);
                flush_pending(r);
            }
            return;
        }
        first = false;
    }
}

/*
 * Joins the other workers of a spanning group: the leader binds the rendezvous and waits
 * for every rank, a follower connects there; each presents the group's token.  It runs
 * in the group's thread, so the agent's loop goes on meanwhile.  False (logged, the group
 * stopped without member events) when it fails.
 */
static bool open_comm(runner *r)
{
    group *g = r->g;
    char msg[512];
    double t0 = agent_now_ms();
    /* a stop or drain while the others have not joined ends the wait (the server stops an
     * array whose other worker it lost; waiting out the timeout would hold a drain) */
    int err = fb_comm_tcp_new_until(g->n_dp, g->rank_base, g->world, g->rendezvous, NULL,
                                    g->token, g->a->comm_timeout_ms, group_interrupted, g,
                                    &r->comm, msg, sizeof msg);
    if (err) {
        span_fault(r, g->follower ? "joining the leader" : "the rendezvous", msg);
        return false;
    }
    agent_log("group %s: ranks %d..%d of %d joined at %s in %.0f ms (%s)", g->id, g->rank_base,
              g->rank_base + g->n_dp - 1, g->world, g->rendezvous, agent_now_ms() - t0,
              g->follower ? "follower" : "leader");
    if (strcmp(g->a->dev[g->dp_devs[0]].info.kind, "cuda") != 0) return true;
    /* CUDA: the gradients go through NCCL, joined with an id that the leader makes (it
     * holds the leader's address, so the server cannot make it) and hands out over TCP */
    unsigned char id[FB_COMM_ID_BYTES] = {0};
    int ordinals[FB_WIRE_MAX_DEVICES];
    int ok = 1;
    if (!g->follower && (err = fb_comm_nccl_unique_id(id, msg, sizeof msg)) != FB_OK) {
        agent_log("group %s: %s; the followers are told", g->id, msg);
        ok = 0;
    }
    err = fb_comm_share_id(r->comm, ok, id, msg, sizeof msg);
    for (int k = 0; !err && k < g->n_dp; k++) ordinals[k] = g->a->dev[g->dp_devs[k]].info.idx;
    /* the same deadline as the TCP rendezvous and control sums (--comm-timeout-ms): a peer
     * that hangs with its connections open stops the group instead of holding it */
    fb_comm_nccl_opts nopts = {.timeout_ms = g->a->comm_timeout_ms};
    if (!err)
        err = fb_comm_nccl_new_opts(g->n_dp, ordinals, g->rank_base, g->world, id, &nopts,
                                    &r->nccl, msg, sizeof msg);
    if (err) {
        span_fault(r, "joining NCCL", msg);
        return false;
    }
    if (g->a->sync_bn)
        agent_log("group %s: synchronised batch norm needs host sums, which CUDA devices do "
                  "not make; each device normalises with its own statistics", g->id);
    agent_log("group %s: NCCL joined for ranks %d..%d of %d in %.0f ms", g->id, g->rank_base,
              g->rank_base + g->n_dp - 1, g->world, agent_now_ms() - t0);
    return true;
}

/*
 * Staging the training shards failed on this node while the dataset reads in place (the
 * cache directory cannot be made, the node's disk is full): an infrastructure fault.  Every
 * member leaves with a DETACHED event and no state (an array that spans workers stops as
 * span_fault says), so the server re-queues it from its last checkpoint without counting a
 * restart, and the worker drains: a node that cannot stage would fail every array it is
 * given.
 */
static void stage_fault(runner *r, const char *why)
{
    group *g = r->g;
    fb_agent *a = g->a;
    /* an array that spans workers stops as for broken communication: the server re-queues
     * its jobs from the running list (a follower speaks for no member) */
    if (g->world) span_fault(r, "node-local staging", why);
    for (int i = 0; !g->world && i < g->n_members; i++) {
        member *mb = &g->m[i];
        if (mb->sidx < 0 || !is_alive(g, mb)) continue;
        set_alive(g, mb, false);
        outmsg *o =
            agent_event_new(g, g->id, g->generation, FB_EV_DETACHED, mb->job_id, steps_done(r));
        agent_event_text(o, "node-local staging failed: %s", why);
        pend(r, o);
    }
    flush_pending(r);
    agent_log("group %s: node-local staging in %s failed: %s; its members leave uncounted and "
              "the worker drains",
              g->id, a->stage_dir, why);
    pthread_mutex_lock(&a->ds_mu);
    if (!atomic_load(&a->stage_fault)) {
        snprintf(a->stage_fault_msg, sizeof a->stage_fault_msg, "%s", why);
        atomic_store(&a->stage_fault, true);
    }
    pthread_mutex_unlock(&a->ds_mu);
    fb_agent_drain(a);
}

void *agent_group_thread(void *arg)
{
    group *g = arg;
    fb_agent *a = g->a;
    runner r = {.g = g};
    char msg[1024];
    agent_device *d = &a->dev[g->dev];
    if (g->n_dp * g->pipeline == 1 && !g->world && d->cpu_count > 0) {
        /* one device: this thread computes for it (more devices: their rank threads do) */
        fb_device pin = {.kind = FB_DEVICE_CPU, .cpu_first = d->cpu_first,
                         .cpu_count = d->cpu_count};
        snprintf(pin.name, sizeof pin.name, "%s", d->info.name);
        if (fb_device_pin_thread(&pin, msg, sizeof msg) != FB_OK)
            agent_log("group %s: %s; it runs unpinned", g->id, msg);
    }
    /* a spanning group joins its peers first: a worker that cannot train (its dataset is
     * missing) then leaves at once, and the others' first sum tells them */
    bool joined = !g->world || open_comm(&r);
    /* the members share a fusion key, so they hold out the same validation records */
    double val_fraction = g->n_sess > 0 ? g->m[g->by_sidx[0]].spec.val_fraction : 0;
    dataset_ref *ds = joined ? agent_dataset_acquire(a, g->dataset_tenant, g->source, val_fraction,
                                                     msg, sizeof msg)
                             : NULL;
    fb_loader *loader = NULL;
    fb_dataset shard_train = {0}, unused_val = {0}, unused = {0};
    bool ready = ds != NULL, staging_fault = false;
    if (ready && ds->shard && g->n_sess > 0) {
        /* this array's own loader, positioned at its start step */
        const fb_job_spec *s0 = &g->m[g->by_sidx[0]].spec;
        fb_data_source_opts so = {.batch_size = s0->batch_size, .shuffle = s0->shuffle,
                                  .data_seed = s0->data_seed, .start_step = g->start_step,
                                  .val_fraction = s0->val_fraction};
        if (a->stage_dir[0]) {
            so.cache_dir = a->stage_dir;
            so.cache_bytes = a->stage_bytes;
        }
        int err = fb_data_open_named(&shard_train, &unused_val, &unused, &loader, g->source,
                                     ds->data_dir, &so, msg, sizeof msg);
        ready = err == FB_OK;
        if (err == FB_ERR_IO && so.cache_dir) {
            /* staging or the dataset?  Opened in place, the dataset reads: the cache (this
             * node's disk) failed, the node's fault.  Else the data is unreadable here as it
             * would be without staging, a job fault: counted, so that one broken dataset
             * cannot drain every worker it is sent to */
            fb_data_source_opts in_place = so;
            in_place.cache_dir = NULL;
            fb_loader *probe = NULL;
            fb_dataset ptrain = {0}, pval = {0}, ptest = {0};
            char m2[256];
            staging_fault = fb_data_open_named(&ptrain, &pval, &ptest, &probe, g->source,
                                               ds->data_dir, &in_place, m2, sizeof m2) == FB_OK;
            fb_loader_free(probe);
            fb_dataset_free(&ptrain);
            fb_dataset_free(&pval);
            fb_dataset_free(&ptest);
        }
        if (ready && so.cache_dir) {
            fb_loader_stats st;
            fb_loader_get_stats(&st, loader);
            agent_log("group %s: staged %s in %s: %d cached, %d copied, %d re-staged (failed "
                      "verification), %d read in place",
                      g->id, g->source, a->stage_dir, st.stage.hits, st.stage.copied,
                      st.stage.restaged, st.stage.uncached);
        }
    }
    if (!joined) {
        /* span_fault said why */
    } else if (staging_fault) {
        stage_fault(&r, msg);
    } else if (!ready) {
        fail_all(&r, FB_FAULT_JOB, msg);
        flush_pending(&r);
    } else if (open_session(&r, ds, ds->shard ? &shard_train : &ds->train, loader)) {
        dev_register(g);
        if (g->world)
            span_loop(&r);
        else
            train_loop(&r);
        dev_unregister(g);
    }
    hook_unhold(&r);
    if (atomic_load(&g->stop))
        agent_log("group %s generation %lld stopped", g->id, (long long)g->generation);
    else
        agent_log("group %s generation %lld ended at step %lld", g->id, (long long)g->generation,
                  (long long)steps_done(&r));
    fb_session_free(r.s);
    fb_comm_free(r.nccl); /* after the session, which borrowed both */
    fb_comm_free(r.comm);
    fb_loader_free(loader);
    agent_dataset_release(a, ds);
    outmsg *bye = g->bye;
    FB_TSAN_RELEASE(bye);
    if (zmq_send(g->push, &bye, sizeof bye, 0) != (int)sizeof bye)
        agent_log("group %s: cannot report its end: %s", g->id, zmq_strerror(errno));
    zmq_close(g->push);
    return NULL;
}
