/* Fake workers speaking the wire protocol (fakeworker.h). */
#include "fakeworker.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "check.h"
#include "harness.h"
#include "wire.h"

#define FW_MAX_GROUPS 4
#define FW_MAX_MEMBERS 8
#define FW_STEPS_PER_REPORT 50

typedef struct fw_group {
    char id[FB_WIRE_ID_LEN + 1];
    int64_t generation;
    int n;
    char jobs[FW_MAX_MEMBERS][FB_WIRE_ID_LEN + 1];
    int64_t steps[FW_MAX_MEMBERS]; /* each member's total */
    int64_t step;                  /* updates done */
} fw_group;

typedef struct fw_worker {
    char name[32];
    void *sock;
    bool welcomed;
    int n_groups;
    fw_group g[FW_MAX_GROUPS];
    int64_t seq;
    double last_hb;
    int64_t assigned;
    double last_assign_ms;
    int64_t stale; /* arrays given up for a new one with the same members */
} fw_worker;

struct fw_pool {
    void *ctx;
    int n;
    fw_worker *w;
    int heartbeat_ms, progress_ms;
    double last_progress;
    pthread_t thread;
    pthread_mutex_t mu; /* guards the workers' state against the getters */
    atomic_bool stop;
    atomic_llong bad;
};

static void send_msg(fw_worker *w, const fb_wire_msg *m)
{
    char err[512];
    char *json = fb_wire_encode(m, err, sizeof err);
    if (!json) fprintf(stderr, "fake worker %s: cannot encode: %s\n", w->name, err);
    CHECK(json != NULL);
    /* a full queue (the server is slow) drops the message, as a lossy link would */
    zmq_send(w->sock, json, strlen(json), ZMQ_DONTWAIT);
    free(json);
}

/* The running arrays, as HELLO and HEARTBEAT list them. */
static void fill_running(fw_worker *w, fb_wire_msg *m)
{
    m->n_running = w->n_groups;
    if (!w->n_groups) return;
    m->running = calloc((size_t)w->n_groups, sizeof *m->running);
    CHECK(m->running != NULL);
    for (int i = 0; i < w->n_groups; i++) {
        fw_group *g = &w->g[i];
        fb_wire_running *r = &m->running[i];
        snprintf(r->group_id, sizeof r->group_id, "%s", g->id);
        r->generation = g->generation;
        r->n_jobs = g->n;
        r->job_ids = calloc((size_t)g->n, sizeof *r->job_ids);
        r->steps = calloc((size_t)g->n, sizeof *r->steps);
        CHECK(r->job_ids && r->steps);
        for (int k = 0; k < g->n; k++) {
            snprintf(r->job_ids[k], sizeof r->job_ids[k], "%s", g->jobs[k]);
            r->steps[k] = g->step;
        }
    }
}

static void send_hello(fw_worker *w)
{
    fb_wire_msg m = {.type = FB_WIRE_HELLO};
    snprintf(m.worker, sizeof m.worker, "%s", w->name);
    snprintf(m.backend, sizeof m.backend, "cpu");
    snprintf(m.version, sizeof m.version, "fake");
    m.n_devices = 1;
    m.devices[0].idx = 0;
    snprintf(m.devices[0].kind, sizeof m.devices[0].kind, "cpu");
    snprintf(m.devices[0].name, sizeof m.devices[0].name, "cpu0");
    m.devices[0].memory_bytes = (int64_t)8 << 30;
    m.devices[0].free_bytes = (int64_t)8 << 30;
    fill_running(w, &m);
    send_msg(w, &m);
    fb_wire_msg_free(&m);
}

static void send_event(fw_worker *w, const fw_group *g, fb_wire_event_kind kind, const char *job)
{
    fb_wire_msg m = {.type = FB_WIRE_EVENT, .generation = g->generation, .seq = ++w->seq,
                     .event = kind, .step = g->step, .loss = NAN, .accuracy = NAN};
    snprintf(m.group_id, sizeof m.group_id, "%s", g->id);
    snprintf(m.job_id, sizeof m.job_id, "%s", job);
    if (kind == FB_EV_DETACHED) snprintf(m.text, sizeof m.text, "detached");
    send_msg(w, &m);
}

static void send_progress(fw_worker *w, fw_group *g)
{
    fb_wire_msg m = {.type = FB_WIRE_PROGRESS, .generation = g->generation};
    snprintf(m.group_id, sizeof m.group_id, "%s", g->id);
    g->step += FW_STEPS_PER_REPORT;
    m.compute_ms = 4.0;
    m.comm_ms = 0.5;
    m.io_ms = 0.5;
    m.idle_ms = 0;
    m.samples_per_s = 1000.0 * g->n;
    m.n_progress = g->n;
    m.progress = calloc((size_t)g->n, sizeof *m.progress);
    CHECK(m.progress != NULL);
    for (int k = 0; k < g->n; k++) {
        fb_wire_member_progress *p = &m.progress[k];
        snprintf(p->job_id, sizeof p->job_id, "%s", g->jobs[k]);
        /* never the last step: a fake array does not finish */
        if (g->step >= g->steps[k]) g->step = g->steps[k] - 1;
        p->step = g->step;
        p->steps = g->steps[k];
        p->loss = 1.0 / (1.0 + (double)g->step / 1000.0);
        p->accuracy = 0.5;
        p->lr = 0.001;
    }
    send_msg(w, &m);
    fb_wire_msg_free(&m);
}

static int64_t spec_steps(const char *spec)
{
    json_t *j = json_loads(spec, 0, NULL);
    json_t *s = json_object_get(j, "steps");
    int64_t n = json_is_integer(s) ? (int64_t)json_integer_value(s) : 1000000;
    json_decref(j);
    return n > 1 ? n : 2;
}

static void on_assign(fw_worker *w, const fb_wire_msg *m)
{
    /* the server sends an ASSIGN again until a heartbeat lists the array */
    for (int i = 0; i < w->n_groups; i++)
        if (strcmp(w->g[i].id, m->group_id) == 0) return;
    /* a member of an array we hold, in a new one: the server gave the old
     * array up (it took us for lost), so the old one is stale and goes, as
     * the DETACH it sends for it would make a real worker do */
    for (int i = 0; i < w->n_groups; i++) {
        bool stale = false;
        for (int k = 0; k < w->g[i].n; k++)
            for (int j = 0; j < m->n_members; j++)
                stale = stale || strcmp(w->g[i].jobs[k], m->members[j].job_id) == 0;
        if (stale) {
            w->g[i--] = w->g[--w->n_groups];
            w->stale++;
        }
    }
    w->assigned++;
    w->last_assign_ms = fbt_now_ms();
    if (w->n_groups >= FW_MAX_GROUPS || m->n_members > FW_MAX_MEMBERS) {
        fprintf(stderr, "fake worker %s: more than it can hold\n", w->name);
        CHECK(0);
    }
    fw_group *g = &w->g[w->n_groups++];
    memset(g, 0, sizeof *g);
    snprintf(g->id, sizeof g->id, "%s", m->group_id);
    g->generation = m->generation;
    g->n = m->n_members;
    for (int k = 0; k < m->n_members; k++) {
        snprintf(g->jobs[k], sizeof g->jobs[k], "%s", m->members[k].job_id);
        g->steps[k] = spec_steps(m->members[k].spec);
        g->step = m->members[k].start_step;
    }
    g->step++;
    for (int k = 0; k < g->n; k++) send_event(w, g, FB_EV_STARTED, g->jobs[k]);
}

static void drop_group(fw_worker *w, int i)
{
    w->g[i] = w->g[--w->n_groups];
}

static void on_detach(fw_worker *w, const fb_wire_msg *m)
{
    for (int i = 0; i < w->n_groups; i++) {
        fw_group *g = &w->g[i];
        if (strcmp(g->id, m->group_id) != 0) continue;
        for (int k = 0; k < g->n; k++) {
            if (m->job_id[0] && strcmp(m->job_id, g->jobs[k]) != 0) continue;
            send_event(w, g, FB_EV_DETACHED, g->jobs[k]);
            if (m->job_id[0]) {
                memmove(g->jobs[k], g->jobs[k + 1], (size_t)(g->n - k - 1) * sizeof g->jobs[0]);
                memmove(&g->steps[k], &g->steps[k + 1],
                        (size_t)(g->n - k - 1) * sizeof g->steps[0]);
                g->n--;
                break;
            }
        }
        if (!m->job_id[0] || g->n == 0) drop_group(w, i);
        return;
    }
}

static void receive(fw_pool *p, fw_worker *w)
{
    zmq_msg_t fr[4];
    int n = 0;
    bool more = true;
    while (more) {
        zmq_msg_t tmp;
        zmq_msg_init(&tmp);
        if (zmq_msg_recv(&tmp, w->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&tmp);
            break;
        }
        more = zmq_msg_more(&tmp);
        if (n < 4)
            fr[n++] = tmp;
        else
            zmq_msg_close(&tmp);
    }
    if (n == 0) return;
    fb_wire_msg m;
    char err[512];
    if (fb_wire_decode(zmq_msg_data(&fr[0]), zmq_msg_size(&fr[0]), n - 1, &m, err, sizeof err)) {
        fprintf(stderr, "fake worker %s: undecodable message: %s\n", w->name, err);
        atomic_fetch_add(&p->bad, 1);
    } else {
        pthread_mutex_lock(&p->mu);
        switch (m.type) {
        case FB_WIRE_WELCOME:
            w->welcomed = true;
            break;
        case FB_WIRE_HEARTBEAT:
            if (m.reply && !m.known) send_hello(w); /* the server forgot us: register again */
            break;
        case FB_WIRE_ASSIGN:
            on_assign(w, &m);
            break;
        case FB_WIRE_DETACH:
            on_detach(w, &m);
            break;
        default: /* ACK, REBALANCE, DRAIN: nothing to do for a fake */
            break;
        }
        pthread_mutex_unlock(&p->mu);
        fb_wire_msg_free(&m);
    }
    for (int i = 0; i < n; i++) zmq_msg_close(&fr[i]);
}

static void *run(void *arg)
{
    fw_pool *p = arg;
    zmq_pollitem_t *items = calloc((size_t)p->n, sizeof *items);
    CHECK(items != NULL);
    for (int i = 0; i < p->n; i++) items[i] = (zmq_pollitem_t){p->w[i].sock, 0, ZMQ_POLLIN, 0};
    for (int i = 0; i < p->n; i++) send_hello(&p->w[i]);
    while (!atomic_load(&p->stop)) {
        zmq_poll(items, p->n, 10);
        for (int i = 0; i < p->n; i++)
            if (items[i].revents & ZMQ_POLLIN) receive(p, &p->w[i]);
        double now = fbt_now_ms();
        pthread_mutex_lock(&p->mu);
        for (int i = 0; i < p->n; i++) {
            fw_worker *w = &p->w[i];
            if (now - w->last_hb < p->heartbeat_ms) continue;
            w->last_hb = now;
            fb_wire_msg m = {.type = FB_WIRE_HEARTBEAT};
            fill_running(w, &m);
            send_msg(w, &m);
            fb_wire_msg_free(&m);
        }
        if (now - p->last_progress >= p->progress_ms) {
            p->last_progress = now;
            for (int i = 0; i < p->n; i++)
                for (int k = 0; k < p->w[i].n_groups; k++) send_progress(&p->w[i], &p->w[i].g[k]);
        }
        pthread_mutex_unlock(&p->mu);
    }
    free(items);
    return NULL;
}

fw_pool *fw_start(const char *endpoint, const char *server_pub_file, const char *worker_key_file,
                  const char *prefix, int n, int heartbeat_ms, int progress_ms)
{
    char server_pub[41], pub[41], sec[41], msg[256];
    CHECK(fb_wire_key_load(server_pub_file, server_pub, NULL, msg, sizeof msg) == 0);
    CHECK(fb_wire_key_load(worker_key_file, pub, sec, msg, sizeof msg) == 0);
    fw_pool *p = calloc(1, sizeof *p);
    CHECK(p != NULL);
    p->w = calloc((size_t)n, sizeof *p->w);
    CHECK(p->w != NULL);
    p->n = n;
    p->heartbeat_ms = heartbeat_ms;
    p->progress_ms = progress_ms;
    pthread_mutex_init(&p->mu, NULL);
    p->ctx = zmq_ctx_new();
    CHECK(p->ctx != NULL);
    zmq_ctx_set(p->ctx, ZMQ_MAX_SOCKETS, n + 64);
    for (int i = 0; i < n; i++) {
        fw_worker *w = &p->w[i];
        snprintf(w->name, sizeof w->name, "%s%d", prefix, i);
        w->sock = zmq_socket(p->ctx, ZMQ_DEALER);
        CHECK(w->sock != NULL);
        int linger = 0;
        CHECK(zmq_setsockopt(w->sock, ZMQ_LINGER, &linger, sizeof linger) == 0);
        CHECK(zmq_setsockopt(w->sock, ZMQ_ROUTING_ID, w->name, strlen(w->name)) == 0);
        CHECK(zmq_setsockopt(w->sock, ZMQ_CURVE_SERVERKEY, server_pub, 41) == 0);
        CHECK(zmq_setsockopt(w->sock, ZMQ_CURVE_PUBLICKEY, pub, 41) == 0);
        CHECK(zmq_setsockopt(w->sock, ZMQ_CURVE_SECRETKEY, sec, 41) == 0);
        CHECK(zmq_connect(w->sock, endpoint) == 0);
    }
    CHECK(pthread_create(&p->thread, NULL, run, p) == 0);
    return p;
}

void fw_stop(fw_pool *p)
{
    if (!p) return;
    atomic_store(&p->stop, true);
    pthread_join(p->thread, NULL);
    for (int i = 0; i < p->n; i++) zmq_close(p->w[i].sock);
    zmq_ctx_term(p->ctx);
    pthread_mutex_destroy(&p->mu);
    free(p->w);
    free(p);
}

int fw_welcomed(fw_pool *p)
{
    int n = 0;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n; i++) n += p->w[i].welcomed;
    pthread_mutex_unlock(&p->mu);
    return n;
}

int fw_arrays(fw_pool *p)
{
    int n = 0;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n; i++) n += p->w[i].n_groups;
    pthread_mutex_unlock(&p->mu);
    return n;
}

int64_t fw_assigned(fw_pool *p, int i, double *last_ms)
{
    pthread_mutex_lock(&p->mu);
    int64_t n = p->w[i].assigned;
    if (last_ms) *last_ms = p->w[i].last_assign_ms;
    pthread_mutex_unlock(&p->mu);
    return n;
}

int64_t fw_bad_messages(fw_pool *p) { return atomic_load(&p->bad); }

int64_t fw_stale_arrays(fw_pool *p)
{
    int64_t n = 0;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n; i++) n += p->w[i].stale;
    pthread_mutex_unlock(&p->mu);
    return n;
}
