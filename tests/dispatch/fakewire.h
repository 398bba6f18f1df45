/*
 * A fake worker for the control loop's tests: a ZeroMQ DEALER that speaks the
 * wire protocol (docs/wire.md) to the test's fuseboxd, under CURVE with the
 * test's worker key, so that a test decides every message a worker sends and
 * sees every one it gets.  The pieces every such test needs (connecting,
 * sending, receiving, a HELLO, a running array in a HELLO or HEARTBEAT, a
 * number from the database); each test keeps its own scenario around them.
 */
#ifndef FB_TESTS_DISPATCH_FAKEWIRE_H
#define FB_TESTS_DISPATCH_FAKEWIRE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "check.h"
#include "e2e.h"
#include "wire.h"

static inline void fw_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A DEALER named `name` (its routing id) connected to T's worker port with T's keys; hwm > 0
 * sets both high-water marks (a socket whose replies pile up must drop none). */
static inline void *fw_connect(void *ctx, const e2e *T, const char *name, int hwm)
{
    char server_pub[41], pub[41], sec[41], msg[256];
    CHECK(fb_wire_key_load(T->server_pub, server_pub, NULL, msg, sizeof msg) == 0);
    CHECK(fb_wire_key_load(T->worker_key, pub, sec, msg, sizeof msg) == 0);
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    CHECK(sock != NULL);
    int linger = 0;
    CHECK(zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger) == 0);
    if (hwm > 0) {
        CHECK(zmq_setsockopt(sock, ZMQ_RCVHWM, &hwm, sizeof hwm) == 0);
        CHECK(zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof hwm) == 0);
    }
    CHECK(zmq_setsockopt(sock, ZMQ_ROUTING_ID, name, strlen(name)) == 0);
    CHECK(zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server_pub, 41) == 0);
    CHECK(zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, 41) == 0);
    CHECK(zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, 41) == 0);
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", T->worker_port);
    CHECK(zmq_connect(sock, endpoint) == 0);
    return sock;
}

/* Sends m, with blob as its one blob frame when blob is not NULL. */
static inline void fw_send(void *sock, const fb_wire_msg *m, const void *blob, size_t len)
{
    char err[256];
    char *json = fb_wire_encode(m, err, sizeof err);
    if (!json) fprintf(stderr, "fake worker: cannot encode: %s\n", err);
    CHECK(json != NULL);
    CHECK(zmq_send(sock, json, strlen(json), blob ? ZMQ_SNDMORE : 0) >= 0);
    if (blob) CHECK(zmq_send(sock, blob, len, 0) >= 0);
    free(json);
}

/* Receives one message within ms and decodes it into out; false when none came.  With blob
 * not NULL, its first blob frame is copied there (malloc'd, NUL-terminated; NULL when it has
 * none); otherwise the blob frames are only counted.  `who` names the fake in messages. */
static inline bool fw_recv(void *sock, const char *who, int ms, fb_wire_msg *out, void **blob,
                           size_t *blob_len)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, ms) <= 0 || !(it.revents & ZMQ_POLLIN)) return false;
    zmq_msg_t head;
    zmq_msg_init(&head);
    CHECK(zmq_msg_recv(&head, sock, 0) >= 0);
    if (blob) {
        *blob = NULL;
        *blob_len = 0;
    }
    int blobs = 0;
    for (bool more = zmq_msg_more(&head); more;) {
        zmq_msg_t tmp;
        zmq_msg_init(&tmp);
        CHECK(zmq_msg_recv(&tmp, sock, 0) >= 0);
        more = zmq_msg_more(&tmp);
        if (blob && blobs == 0) {
            *blob_len = zmq_msg_size(&tmp);
            *blob = malloc(*blob_len + 1);
            CHECK(*blob != NULL);
            memcpy(*blob, zmq_msg_data(&tmp), *blob_len);
            ((char *)*blob)[*blob_len] = '\0';
        }
        zmq_msg_close(&tmp);
        blobs++;
    }
    char err[256];
    memset(out, 0, sizeof *out);
    int rc = fb_wire_decode(zmq_msg_data(&head), zmq_msg_size(&head), blobs, out, err,
                            sizeof err);
    if (rc) fprintf(stderr, "fake worker %s: undecodable message: %s\n", who, err);
    CHECK(rc == 0);
    zmq_msg_close(&head);
    return true;
}

/* m becomes the HELLO of worker `name` with n CPU devices of 8 GiB each. */
static inline void fw_hello(fb_wire_msg *m, const char *name, int n)
{
    CHECK(n >= 1 && n <= FB_WIRE_MAX_DEVICES);
    memset(m, 0, sizeof *m);
    m->type = FB_WIRE_HELLO;
    snprintf(m->worker, sizeof m->worker, "%s", name);
    snprintf(m->backend, sizeof m->backend, "cpu");
    snprintf(m->version, sizeof m->version, "fake");
    m->n_devices = n;
    for (int i = 0; i < n; i++) {
        m->devices[i].idx = i;
        snprintf(m->devices[i].kind, sizeof m->devices[i].kind, "cpu");
        snprintf(m->devices[i].name, sizeof m->devices[i].name, "cpu%d", i);
        m->devices[i].memory_bytes = m->devices[i].free_bytes = (int64_t)8 << 30;
    }
}

/* Lists array `group` (generation) with its one job at `step` as running, in a HELLO or a
 * HEARTBEAT; fb_wire_msg_free frees it with m. */
static inline void fw_add_running(fb_wire_msg *m, const char *group, int64_t generation,
                                  const char *job, int64_t step)
{
    fb_wire_running *r = realloc(m->running, (size_t)(m->n_running + 1) * sizeof *r);
    CHECK(r != NULL);
    m->running = r;
    r = &m->running[m->n_running++];
    memset(r, 0, sizeof *r);
    snprintf(r->group_id, sizeof r->group_id, "%s", group);
    r->generation = generation;
    r->n_jobs = 1;
    r->job_ids = calloc(1, sizeof *r->job_ids);
    r->steps = calloc(1, sizeof *r->steps);
    CHECK(r->job_ids && r->steps);
    snprintf(r->job_ids[0], sizeof r->job_ids[0], "%s", job);
    r->steps[0] = step;
}

/* The integer a query returns; fmt has one %s, which arg fills. */
static inline long long fw_sql_ll(e2e *T, const char *fmt, const char *arg)
{
    char sql[512];
    snprintf(sql, sizeof sql, fmt, arg);
    const char *v = fbt_sql_value(&T->s, sql);
    CHECK(v != NULL && v[0]);
    return strtoll(v, NULL, 10);
}

/* Sets the test tenant's device quota. */
static inline void fw_set_quota(e2e *T, int devices)
{
    char sql[256];
    snprintf(sql, sizeof sql, "UPDATE tenants SET max_devices = %d WHERE id = '%s'", devices,
             T->tenant);
    PQclear(fbt_sql(&T->s, sql));
}

#endif
