/*
 * The wire protocol codec, encoding: the JSON frame built from a message
 * struct, then checked by the decoder (fb_wire_check_encoded), so that what
 * the receiver would refuse is refused before it is sent.
 */
#include "wire.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"
#include "wire_int.h"

/* ---- encoding -------------------------------------------------------------- */

/* Encoder state: the first error wins. */
typedef struct enc {
    char *msg;
    size_t cap;
    int err;
} enc;

__attribute__((format(printf, 3, 4))) static void enc_fail(enc *e, const char *field,
                                                           const char *fmt, ...)
{
    if (e->err) return;
    e->err = FB_ERR_BAD_WIRE;
    if (e->msg && e->cap) {
        char what[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        snprintf(e->msg, e->cap, "%s: %s", field, what);
    }
}

static void enc_nomem(enc *e)
{
    if (!e->err) e->err = fb_errf(e->msg, e->cap, FB_ERR_NOMEM, "out of memory");
}

/* Jansson's *_new setters release v when they fail, also when o is NULL. */
static void put(enc *e, json_t *o, const char *key, json_t *v)
{
    if (!v || json_object_set_new(o, key, v)) enc_nomem(e);
}

static void append(enc *e, json_t *arr, json_t *v)
{
    if (!v || !arr || json_array_append_new(arr, v)) enc_nomem(e);
}

/* A string buffer of the struct: it must end inside its buffer and be UTF-8. */
static json_t *str_of(enc *e, const char *field, const char *s, size_t cap)
{
    if (cap && !memchr(s, '\0', cap)) {
        enc_fail(e, field, "not NUL-terminated within its %zu bytes", cap);
        return NULL;
    }
    if (!fb_utf8_valid_str(s)) {
        enc_fail(e, field, "not valid UTF-8");
        return NULL;
    }
    json_t *v = json_string(s);
    if (!v) enc_nomem(e);
    return v;
}

static void put_str(enc *e, json_t *o, const char *key, const char *s, size_t cap)
{
    json_t *v = str_of(e, key, s, cap);
    if (v) put(e, o, key, v);
}

/* A number; NaN is null where nullable, and infinities have no JSON form. */
static void put_num(enc *e, json_t *o, const char *path, const char *key, double x, bool nullable)
{
    if (isnan(x) && nullable) {
        put(e, o, key, json_null());
    } else if (!isfinite(x)) {
        char field[64];
        snprintf(field, sizeof field, "%s%s%s", path, *path ? "." : "", key);
        enc_fail(e, field, "%g is not a finite number", x);
    } else {
        put(e, o, key, json_real(x));
    }
}

static void put_int(enc *e, json_t *o, const char *key, int64_t x)
{
    put(e, o, key, json_integer((json_int_t)x));
}

/* A count of the struct, before it is used to index anything. */
static bool count_ok(enc *e, const char *field, int n, int max, const void *ptr)
{
    if (n < 0 || n > max) {
        enc_fail(e, field, "%d entries, allowed 0..%d", n, max);
        return false;
    }
    if (n > 0 && !ptr) {
        enc_fail(e, field, "%d entries but no array", n);
        return false;
    }
    return true;
}

/* Optional strings are left out when empty, as decode reads absence as "". */
static void put_opt_str(enc *e, json_t *o, const char *key, const char *s, size_t cap)
{
    if (!memchr(s, '\0', cap))
        enc_fail(e, key, "not NUL-terminated within its %zu bytes", cap);
    else if (s[0])
        put_str(e, o, key, s, cap);
}

static void put_group(enc *e, json_t *o, const fb_wire_msg *m)
{
    put_str(e, o, "group_id", m->group_id, sizeof m->group_id);
    put_int(e, o, "generation", m->generation);
}

static void put_split(enc *e, json_t *o, const fb_wire_msg *m)
{
    if (!count_ok(e, "split", m->n_split, FB_WIRE_MAX_DEVICES, m->split)) return;
    json_t *arr = json_array();
    for (int i = 0; i < m->n_split; i++)
        append(e, arr, json_integer(m->split[i]));
    put(e, o, "split", arr);
}

static void put_running(enc *e, json_t *o, const fb_wire_msg *m)
{
    if (!count_ok(e, "running", m->n_running, FB_WIRE_MAX_GROUPS, m->running)) return;
    json_t *arr = json_array();
    for (int i = 0; i < m->n_running && !e->err; i++) {
        const fb_wire_running *r = &m->running[i];
        char field[48];
        snprintf(field, sizeof field, "running[%d].job_ids", i);
        if (!count_ok(e, field, r->n_jobs, FB_WIRE_MAX_MEMBERS, r->job_ids)) break;
        if (!count_ok(e, field, r->n_jobs, FB_WIRE_MAX_MEMBERS, r->steps)) break;
        json_t *ro = json_object(), *ids = json_array(), *steps = json_array();
        put_str(e, ro, "group_id", r->group_id, sizeof r->group_id);
        put_int(e, ro, "generation", r->generation);
        for (int j = 0; j < r->n_jobs; j++) {
            snprintf(field, sizeof field, "running[%d].job_ids[%d]", i, j);
            json_t *id = str_of(e, field, r->job_ids[j], sizeof r->job_ids[j]);
            if (id) append(e, ids, id);
            append(e, steps, json_integer(r->steps[j]));
        }
        put(e, ro, "job_ids", ids);
        put(e, ro, "steps", steps);
        append(e, arr, ro);
    }
    put(e, o, "running", arr);
}

static void encode_hello(enc *e, json_t *o, const fb_wire_msg *m)
{
    put_str(e, o, "worker", m->worker, sizeof m->worker);
    put_str(e, o, "backend", m->backend, sizeof m->backend);
    put_str(e, o, "version", m->version, sizeof m->version);
    if (count_ok(e, "devices", m->n_devices, FB_WIRE_MAX_DEVICES, m->devices)) {
        json_t *arr = json_array();
        for (int i = 0; i < m->n_devices; i++) {
            const fb_wire_device *dv = &m->devices[i];
            json_t *d = json_object();
            char field[48];
            put_int(e, d, "idx", dv->idx);
            snprintf(field, sizeof field, "devices[%d].kind", i);
            json_t *v = str_of(e, field, dv->kind, sizeof dv->kind);
            if (v) put(e, d, "kind", v);
            snprintf(field, sizeof field, "devices[%d].name", i);
            v = str_of(e, field, dv->name, sizeof dv->name);
            if (v) put(e, d, "name", v);
            put_int(e, d, "memory_bytes", dv->memory_bytes);
            put_int(e, d, "free_bytes", dv->free_bytes);
            append(e, arr, d);
        }
        put(e, o, "devices", arr);
    }
    if (!memchr(m->comm_host, '\0', sizeof m->comm_host)) {
        enc_fail(e, "comm.host", "not NUL-terminated within its %zu bytes", sizeof m->comm_host);
    } else if (m->comm_host[0]) {
        /* written only when set: a server from before it refuses the field */
        json_t *c = json_object(), *ports = json_array();
        put_str(e, c, "host", m->comm_host, sizeof m->comm_host);
        append(e, ports, json_integer(m->comm_port_lo));
        append(e, ports, json_integer(m->comm_port_hi));
        put(e, c, "ports", ports);
        put(e, o, "comm", c);
    } else if (m->comm_port_lo || m->comm_port_hi) {
        enc_fail(e, "comm.ports", "set without comm.host");
    }
    put_running(e, o, m);
}

/* span of ASSIGN: written only for a group that spans workers (world set), so that a worker
 * from before it still reads every other ASSIGN. */
static void put_span(enc *e, json_t *o, const fb_wire_msg *m)
{
    if (!memchr(m->rendezvous, '\0', sizeof m->rendezvous) ||
        !memchr(m->token, '\0', sizeof m->token)) {
        enc_fail(e, "span", "rendezvous or token not NUL-terminated within its buffer");
        return;
    }
    if (!m->world) {
        if (m->rank_base || m->rendezvous[0] || m->token[0])
            enc_fail(e, "span", "rank_base, rendezvous or token set without world");
        return;
    }
    json_t *sp = json_object();
    put_int(e, sp, "world", m->world);
    put_int(e, sp, "rank_base", m->rank_base);
    put_str(e, sp, "rendezvous", m->rendezvous, sizeof m->rendezvous);
    put_str(e, sp, "token", m->token, sizeof m->token);
    put(e, o, "span", sp);
}

static void encode_assign(enc *e, json_t *o, const fb_wire_msg *m)
{
    put_group(e, o, m);
    put_str(e, o, "fusion_key", m->fusion_key, sizeof m->fusion_key);
    put_str(e, o, "dataset", m->dataset, sizeof m->dataset);
    if (m->dataset_tenant[0])
        put_str(e, o, "dataset_tenant", m->dataset_tenant, sizeof m->dataset_tenant);
    if (m->builtin[0]) {
        if (m->dataset_tenant[0])
            enc_fail(e, "builtin", "a built-in comes without a dataset_tenant");
        put_str(e, o, "builtin", m->builtin, sizeof m->builtin);
    }
    if (count_ok(e, "devices", m->n_group_devices, FB_WIRE_MAX_DEVICES, m->group_devices)) {
        json_t *arr = json_array();
        for (int i = 0; i < m->n_group_devices; i++)
            append(e, arr, json_integer(m->group_devices[i]));
        put(e, o, "devices", arr);
    }
    put_int(e, o, "parallel_data", m->parallel_data);
    put_int(e, o, "parallel_pipeline", m->parallel_pipeline);
    put_span(e, o, m);
    put_split(e, o, m);
    put_num(e, o, "", "time_share", m->time_share, false);
    if (!count_ok(e, "members", m->n_members, FB_WIRE_MAX_MEMBERS, m->members)) return;
    json_t *arr = json_array();
    for (int i = 0; i < m->n_members && !e->err; i++) {
        const fb_wire_member *mb = &m->members[i];
        json_t *mo = json_object();
        char field[48];
        snprintf(field, sizeof field, "members[%d].job_id", i);
        json_t *v = str_of(e, field, mb->job_id, sizeof mb->job_id);
        if (v) put(e, mo, "job_id", v);
        snprintf(field, sizeof field, "members[%d].tenant_id", i);
        if ((v = str_of(e, field, mb->tenant_id, sizeof mb->tenant_id))) put(e, mo, "tenant_id", v);
        snprintf(field, sizeof field, "members[%d].spec", i);
        if (!mb->spec)
            enc_fail(e, field, "no spec");
        else if ((v = str_of(e, field, mb->spec, 0)))
            put(e, mo, "spec", v);
        put_int(e, mo, "start_step", mb->start_step);
        if (mb->resume_blob) put_int(e, mo, "resume_blob", mb->resume_blob);
        if (mb->init_blob) {
            if (mb->start_step > 0) enc_fail(e, "init_blob", "only at start_step 0");
            put_int(e, mo, "init_blob", mb->init_blob);
        }
        append(e, arr, mo);
    }
    put(e, o, "members", arr);
}

static void encode_progress(enc *e, json_t *o, const fb_wire_msg *m)
{
    put_group(e, o, m);
    put_num(e, o, "", "compute_ms", m->compute_ms, false);
    put_num(e, o, "", "comm_ms", m->comm_ms, false);
    put_num(e, o, "", "io_ms", m->io_ms, false);
    put_num(e, o, "", "idle_ms", m->idle_ms, false);
    put_num(e, o, "", "samples_per_s", m->samples_per_s, false);
    /* the per-device breakdown is optional: a report without it is written as before */
    if (!count_ok(e, "devices", m->n_device_steps, FB_WIRE_MAX_DEVICES, m->device_steps)) return;
    if (m->n_device_steps > 0) {
        json_t *devs = json_array();
        for (int i = 0; i < m->n_device_steps && !e->err; i++) {
            const fb_wire_device_step *x = &m->device_steps[i];
            json_t *dobj = json_object();
            char path[32];
            snprintf(path, sizeof path, "devices[%d]", i);
            put_int(e, dobj, "idx", x->device);
            put_num(e, dobj, path, "compute_ms", x->compute_ms, false);
            put_num(e, dobj, path, "pass_ms", x->pass_ms, false);
            put_num(e, dobj, path, "comm_ms", x->comm_ms, false);
            put_num(e, dobj, path, "io_ms", x->io_ms, false);
            put_num(e, dobj, path, "idle_ms", x->idle_ms, false);
            put_int(e, dobj, "steps", x->steps);
            put_int(e, dobj, "samples", x->samples);
            append(e, devs, dobj);
        }
        put(e, o, "devices", devs);
    }
    if (!count_ok(e, "members", m->n_progress, FB_WIRE_MAX_MEMBERS, m->progress)) return;
    json_t *arr = json_array();
    for (int i = 0; i < m->n_progress && !e->err; i++) {
        const fb_wire_member_progress *p = &m->progress[i];
        json_t *po = json_object();
        char path[32], field[48];
        snprintf(path, sizeof path, "members[%d]", i);
        snprintf(field, sizeof field, "%s.job_id", path);
        json_t *v = str_of(e, field, p->job_id, sizeof p->job_id);
        if (v) put(e, po, "job_id", v);
        put_int(e, po, "step", p->step);
        put_int(e, po, "steps", p->steps);
        put_num(e, po, path, "loss", p->loss, true);
        put_num(e, po, path, "accuracy", p->accuracy, true);
        put_num(e, po, path, "lr", p->lr, true);
        append(e, arr, po);
    }
    put(e, o, "members", arr);
}

static void encode_event(enc *e, json_t *o, const fb_wire_msg *m)
{
    put_group(e, o, m);
    put_int(e, o, "seq", m->seq);
    if (m->event < 0 || m->event >= FB_EV_KIND_COUNT) {
        enc_fail(e, "event", "%d is not an event kind", (int)m->event);
        return;
    }
    put(e, o, "event", json_string(fb_wire_event_names[m->event]));
    put_str(e, o, "job_id", m->job_id, sizeof m->job_id);
    put_int(e, o, "step", m->step);
    put_num(e, o, "", "loss", m->loss, true);
    put_num(e, o, "", "accuracy", m->accuracy, true);
    /* the final test evaluation, finished only, and absent when there is none (NaN) */
    if (m->event == FB_EV_FINISHED && !isnan(m->test_loss))
        put_num(e, o, "", "test_loss", m->test_loss, true);
    if (m->event == FB_EV_FINISHED && !isnan(m->test_accuracy))
        put_num(e, o, "", "test_accuracy", m->test_accuracy, true);
    if (m->blob) put_int(e, o, "blob", m->blob);
    put_opt_str(e, o, "text", m->text, sizeof m->text);
    /* written only when it is not the default: a server from before the field refuses it */
    if (m->fault != FB_FAULT_JOB) {
        if (m->event != FB_EV_FAILED)
            enc_fail(e, "fault", "only a failed event names a fault");
        else if (m->fault < 0 || m->fault >= FB_FAULT_COUNT)
            enc_fail(e, "fault", "%d is not a fault", (int)m->fault);
        else
            put(e, o, "fault", json_string(fb_wire_fault_names[m->fault]));
    }
}

static void encode_body(enc *e, json_t *o, const fb_wire_msg *m)
{
    switch (m->type) {
    case FB_WIRE_HELLO:
        encode_hello(e, o, m);
        break;
    case FB_WIRE_WELCOME:
        put_str(e, o, "worker_id", m->worker_id, sizeof m->worker_id);
        put_int(e, o, "heartbeat_ms", m->heartbeat_ms);
        break;
    case FB_WIRE_ASSIGN:
        encode_assign(e, o, m);
        break;
    case FB_WIRE_PROGRESS:
        encode_progress(e, o, m);
        break;
    case FB_WIRE_EVENT:
        encode_event(e, o, m);
        break;
    case FB_WIRE_ACK:
        put_int(e, o, "seq", m->seq);
        put_opt_str(e, o, "group_id", m->group_id, sizeof m->group_id);
        break;
    case FB_WIRE_DETACH:
        put_group(e, o, m);
        put_opt_str(e, o, "job_id", m->job_id, sizeof m->job_id);
        put_opt_str(e, o, "text", m->text, sizeof m->text);
        /* written only when set: a worker from before it refuses the field */
        if (m->keep_state && !m->job_id[0])
            enc_fail(e, "keep_state", "only a member's DETACH keeps state, not a group's");
        else if (m->keep_state)
            put(e, o, "keep_state", json_true());
        break;
    case FB_WIRE_REBALANCE:
        put_group(e, o, m);
        put_split(e, o, m);
        put_num(e, o, "", "time_share", m->time_share, false);
        break;
    case FB_WIRE_HEARTBEAT:
        /* Without these two checks a reply built without reply = true would go out as a
         * worker heartbeat, and the worker would never learn it is unknown. */
        if (m->reply && m->n_running)
            enc_fail(e, "running", "the server's heartbeat reply carries no running groups");
        else if (!m->reply && m->known)
            enc_fail(e, "known", "only the server's heartbeat reply (reply = true) carries known");
        else if (m->reply)
            put(e, o, "known", json_boolean(m->known));
        else
            put_running(e, o, m);
        break;
    case FB_WIRE_DRAIN:
        put_opt_str(e, o, "text", m->text, sizeof m->text);
        break;
    default:
        break;
    }
}

char *fb_wire_encode(const fb_wire_msg *m, char *msg, size_t msg_cap)
{
    enc e = {.msg = msg, .cap = msg_cap};
    if (msg && msg_cap) msg[0] = '\0';
    if (!m) {
        fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "no message");
        return NULL;
    }
    if (m->type < 0 || m->type >= FB_WIRE_TYPE_COUNT) {
        fb_errf(msg, msg_cap, FB_ERR_BAD_WIRE, "type: %d is not a message type", (int)m->type);
        return NULL;
    }
    json_t *o = json_object();
    put_int(&e, o, "v", FB_WIRE_VERSION);
    put(&e, o, "type", json_string(fb_wire_type_names[m->type]));
    encode_body(&e, o, m);
    char *s = e.err ? NULL : json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (e.err) return NULL;
    if (!s) {
        fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        return NULL;
    }
    /* the receiver's checks, run on what would be sent */
    if (fb_wire_check_encoded(s, strlen(s), msg, msg_cap)) {
        free(s);
        return NULL;
    }
    return s;
}
