/*
 * The wire protocol contract: every message type survives encode and decode
 * field by field, hand-written frames (the fuzz seeds) decode and re-encode
 * to a fixed point, a table of malformed frames is refused with a message
 * naming the field, encode refuses structs that would not decode, and the
 * CURVE key files are written safely and read strictly.
 *
 * Frames in the table are written with single quotes for readability; they
 * are turned into JSON double quotes before decoding.
 */
#include "check.h"
#include "wire.h"

#include <dirent.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#define G1 "3f2b8c1e-9a4d-4e6f-8b2a-7c5d1e0f9a3b"
#define G2 "0b7e4d2c-1f3a-4b5c-9d8e-2a6f0c1b3d4e"
#define J1 "c1a2b3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d"
#define J2 "d2b3c4e5-f6a7-4b8c-9dae-1f2a3b4c5d6e"
#define J3 "e3c4d5f6-a7b8-4c9d-aebf-2a3b4c5d6e7f"
#define T1 "7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d"
#define W1 "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a"
#define FKEY "9f86d081884c7d659a2feaa0c55ad015"

static char *quoted(const char *s)
{
    char *t = strdup(s);
    CHECK(t);
    for (char *p = t; *p; p++)
        if (*p == '\'') *p = '"';
    return t;
}

/* ---- field-by-field equality ---------------------------------------------- */

#define CHECK_DBL_SAME(a, b)                                                                       \
    do {                                                                                           \
        double a2_ = (a), b2_ = (b);                                                               \
        if (!((isnan(a2_) && isnan(b2_)) || a2_ == b2_)) {                                         \
            fprintf(stderr, "%s:%d: %s != %s: %.17g vs %.17g\n", __FILE__, __LINE__, #a, #b, a2_,  \
                    b2_);                                                                          \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static void check_same(const fb_wire_msg *a, const fb_wire_msg *b)
{
    CHECK_INT_EQ(a->type, b->type);
    CHECK_STR_EQ(a->group_id, b->group_id);
    CHECK_INT_EQ(a->generation, b->generation);
    CHECK_STR_EQ(a->worker, b->worker);
    CHECK_STR_EQ(a->backend, b->backend);
    CHECK_STR_EQ(a->version, b->version);
    CHECK_INT_EQ(a->n_devices, b->n_devices);
    for (int i = 0; i < a->n_devices; i++) {
        CHECK_INT_EQ(a->devices[i].idx, b->devices[i].idx);
        CHECK_STR_EQ(a->devices[i].kind, b->devices[i].kind);
        CHECK_STR_EQ(a->devices[i].name, b->devices[i].name);
        CHECK_INT_EQ(a->devices[i].memory_bytes, b->devices[i].memory_bytes);
        CHECK_INT_EQ(a->devices[i].free_bytes, b->devices[i].free_bytes);
    }
    CHECK_STR_EQ(a->comm_host, b->comm_host);
    CHECK_INT_EQ(a->comm_port_lo, b->comm_port_lo);
    CHECK_INT_EQ(a->comm_port_hi, b->comm_port_hi);
    CHECK_INT_EQ(a->world, b->world);
    CHECK_INT_EQ(a->rank_base, b->rank_base);
    CHECK_STR_EQ(a->rendezvous, b->rendezvous);
    CHECK_STR_EQ(a->token, b->token);
    CHECK_INT_EQ(a->n_running, b->n_running);
    for (int i = 0; i < a->n_running; i++) {
        const fb_wire_running *x = &a->running[i], *y = &b->running[i];
        CHECK_STR_EQ(x->group_id, y->group_id);
        CHECK_INT_EQ(x->generation, y->generation);
        CHECK_INT_EQ(x->n_jobs, y->n_jobs);
        for (int j = 0; j < x->n_jobs; j++) {
            CHECK_STR_EQ(x->job_ids[j], y->job_ids[j]);
            CHECK_INT_EQ(x->steps[j], y->steps[j]);
        }
    }
    CHECK_STR_EQ(a->worker_id, b->worker_id);
    CHECK_INT_EQ(a->heartbeat_ms, b->heartbeat_ms);
    CHECK_INT_EQ(a->reply, b->reply);
    CHECK_INT_EQ(a->known, b->known);
    CHECK_INT_EQ(a->keep_state, b->keep_state);
    CHECK_INT_EQ(a->fault, b->fault);
    CHECK_STR_EQ(a->fusion_key, b->fusion_key);
    CHECK_STR_EQ(a->dataset, b->dataset);
    CHECK_STR_EQ(a->dataset_tenant, b->dataset_tenant);
    CHECK_STR_EQ(a->builtin, b->builtin);
    CHECK_INT_EQ(a->n_group_devices, b->n_group_devices);
    for (int i = 0; i < a->n_group_devices; i++)
        CHECK_INT_EQ(a->group_devices[i], b->group_devices[i]);
    CHECK_INT_EQ(a->parallel_data, b->parallel_data);
    CHECK_INT_EQ(a->parallel_pipeline, b->parallel_pipeline);
    CHECK_INT_EQ(a->n_members, b->n_members);
    for (int i = 0; i < a->n_members; i++) {
        const fb_wire_member *x = &a->members[i], *y = &b->members[i];
        CHECK_STR_EQ(x->job_id, y->job_id);
        CHECK_STR_EQ(x->tenant_id, y->tenant_id);
        CHECK_STR_EQ(x->spec, y->spec);
        CHECK_INT_EQ(x->start_step, y->start_step);
        CHECK_INT_EQ(x->resume_blob, y->resume_blob);
        CHECK_INT_EQ(x->init_blob, y->init_blob);
    }
    CHECK_INT_EQ(a->n_split, b->n_split);
    for (int i = 0; i < a->n_split; i++)
        CHECK_INT_EQ(a->split[i], b->split[i]);
    CHECK_DBL_SAME(a->time_share, b->time_share);
    CHECK_DBL_SAME(a->compute_ms, b->compute_ms);
    CHECK_DBL_SAME(a->comm_ms, b->comm_ms);
    CHECK_DBL_SAME(a->io_ms, b->io_ms);
    CHECK_DBL_SAME(a->idle_ms, b->idle_ms);
    CHECK_DBL_SAME(a->samples_per_s, b->samples_per_s);
    CHECK_INT_EQ(a->n_device_steps, b->n_device_steps);
    for (int i = 0; i < a->n_device_steps; i++) {
        const fb_wire_device_step *x = &a->device_steps[i], *y = &b->device_steps[i];
        CHECK_INT_EQ(x->device, y->device);
        CHECK_DBL_SAME(x->compute_ms, y->compute_ms);
        CHECK_DBL_SAME(x->pass_ms, y->pass_ms);
        CHECK_DBL_SAME(x->comm_ms, y->comm_ms);
        CHECK_DBL_SAME(x->io_ms, y->io_ms);
        CHECK_DBL_SAME(x->idle_ms, y->idle_ms);
        CHECK_INT_EQ(x->steps, y->steps);
        CHECK_INT_EQ(x->samples, y->samples);
    }
    CHECK_INT_EQ(a->n_progress, b->n_progress);
    for (int i = 0; i < a->n_progress; i++) {
        const fb_wire_member_progress *x = &a->progress[i], *y = &b->progress[i];
        CHECK_STR_EQ(x->job_id, y->job_id);
        CHECK_INT_EQ(x->step, y->step);
        CHECK_INT_EQ(x->steps, y->steps);
        CHECK_DBL_SAME(x->loss, y->loss);
        CHECK_DBL_SAME(x->accuracy, y->accuracy);
        CHECK_DBL_SAME(x->lr, y->lr);
    }
    CHECK_INT_EQ(a->seq, b->seq);
    CHECK_INT_EQ(a->event, b->event);
    CHECK_STR_EQ(a->job_id, b->job_id);
    CHECK_INT_EQ(a->step, b->step);
    CHECK_DBL_SAME(a->loss, b->loss);
    CHECK_DBL_SAME(a->accuracy, b->accuracy);
    CHECK_INT_EQ(a->blob, b->blob);
    CHECK_STR_EQ(a->text, b->text);
}

/* encode -> decode gives m back field by field, and re-encoding gives the same text. */
static void round_trip(const fb_wire_msg *m, int n_blobs)
{
    char msg[512];
    char *s = fb_wire_encode(m, msg, sizeof msg);
    if (!s) fprintf(stderr, "encode of %s failed: %s\n", fb_wire_type_name(m->type), msg);
    CHECK(s);
    fb_wire_msg back;
    int rc = fb_wire_decode(s, strlen(s), n_blobs, &back, msg, sizeof msg);
    if (rc) fprintf(stderr, "decode of %s failed: %s\n", s, msg);
    CHECK_INT_EQ(rc, FB_OK);
    check_same(m, &back);
    char *again = fb_wire_encode(&back, msg, sizeof msg);
    CHECK(again);
    CHECK_STR_EQ(s, again);
    CHECK(strstr(s, "\"type\":\"") != NULL);
    free(again);
    free(s);
    fb_wire_msg_free(&back);
}

static fb_wire_msg blank(fb_wire_type t)
{
    fb_wire_msg m;
    memset(&m, 0, sizeof m);
    m.type = t;
    return m;
}

static fb_wire_running running_of(const char *gid, int64_t gen, int n, const char *const *ids,
                                  const int64_t *steps)
{
    fb_wire_running r;
    memset(&r, 0, sizeof r);
    snprintf(r.group_id, sizeof r.group_id, "%s", gid);
    r.generation = gen;
    r.n_jobs = n;
    if (n) {
        r.job_ids = calloc((size_t)n, sizeof *r.job_ids);
        r.steps = calloc((size_t)n, sizeof *r.steps);
        CHECK(r.job_ids && r.steps);
        for (int i = 0; i < n; i++) {
            snprintf(r.job_ids[i], sizeof r.job_ids[i], "%s", ids[i]);
            r.steps[i] = steps[i];
        }
    }
    return r;
}

static void set_running(fb_wire_msg *m)
{
    static const char *const ids[] = {J1, J2};
    static const int64_t steps[] = {1200, 0};
    m->n_running = 2;
    m->running = calloc(2, sizeof *m->running);
    CHECK(m->running);
    m->running[0] = running_of(G1, 4, 2, ids, steps);
    m->running[1] = running_of(G2, 9007199254740992LL, 0, NULL, NULL);
}

static fb_wire_msg make_hello(void)
{
    fb_wire_msg m = blank(FB_WIRE_HELLO);
    snprintf(m.worker, sizeof m.worker, "gpu-node-3.rack_a");
    snprintf(m.backend, sizeof m.backend, "cuda");
    snprintf(m.version, sizeof m.version, "0.1.0+g8820715");
    m.n_devices = 2;
    m.devices[0] = (fb_wire_device){.idx = 0, .memory_bytes = 150754820096LL, .free_bytes = 1};
    m.devices[1] = (fb_wire_device){.idx = 7, .memory_bytes = 1, .free_bytes = 1};
    snprintf(m.devices[0].kind, sizeof m.devices[0].kind, "cuda");
    snprintf(m.devices[0].name, sizeof m.devices[0].name, "NVIDIA H200 (MIG 1g.18gb)");
    snprintf(m.devices[1].kind, sizeof m.devices[1].kind, "cpu");
    snprintf(m.devices[1].name, sizeof m.devices[1].name, "cpu0");
    set_running(&m);
    return m;
}

static fb_wire_msg make_assign(void)
{
    fb_wire_msg m = blank(FB_WIRE_ASSIGN);
    snprintf(m.group_id, sizeof m.group_id, G1);
    m.generation = 5;
    snprintf(m.fusion_key, sizeof m.fusion_key, FKEY);
    snprintf(m.dataset, sizeof m.dataset, "%s",
             "a-64-byte-dataset-name.as-the-job-spec-allows_0123456789abcdefgh");
    CHECK_INT_EQ(strlen(m.dataset), FB_WIRE_DATASET_MAX);
    snprintf(m.dataset_tenant, sizeof m.dataset_tenant, "%s", J3);
    m.n_group_devices = 4;
    for (int i = 0; i < 4; i++)
        m.group_devices[i] = 3 - i;
    m.parallel_data = 2;
    m.parallel_pipeline = 2;
    m.n_split = 2;
    m.split[0] = 70;
    m.split[1] = 58;
    m.time_share = 0.1 + 0.2; /* not exactly 0.3: the text must carry every bit */
    m.n_members = 3;
    m.members = calloc(3, sizeof *m.members);
    CHECK(m.members);
    static const char *const ids[] = {J1, J2, J3};
    static const char *const specs[] = {"{\"name\":\"lr-0.1\",\"note\":\"caf\xc3\xa9\\n\"}", "{}",
                                        "not parsed here: the worker parses it"};
    for (int i = 0; i < 3; i++) {
        snprintf(m.members[i].job_id, sizeof m.members[i].job_id, "%s", ids[i]);
        snprintf(m.members[i].tenant_id, sizeof m.members[i].tenant_id, T1);
        m.members[i].spec = strdup(specs[i]);
        CHECK(m.members[i].spec);
    }
    m.members[0].start_step = 1000;
    m.members[0].resume_blob = 2;
    m.members[1].start_step = 2000;
    m.members[1].resume_blob = 1;
    return m;
}

static fb_wire_msg make_progress(void)
{
    fb_wire_msg m = blank(FB_WIRE_PROGRESS);
    snprintf(m.group_id, sizeof m.group_id, G1);
    m.generation = 5;
    m.compute_ms = 12.5;
    m.comm_ms = 1.0 / 3.0;
    m.io_ms = 1e-300;
    m.idle_ms = 0;
    m.samples_per_s = 20480.125;
    m.n_progress = 2;
    m.progress = calloc(2, sizeof *m.progress);
    CHECK(m.progress);
    m.progress[0] = (fb_wire_member_progress){
        .step = 1100, .steps = 3000, .loss = -0.4321, .accuracy = 0.875, .lr = 0.1};
    snprintf(m.progress[0].job_id, sizeof m.progress[0].job_id, J1);
    m.progress[1] =
        (fb_wire_member_progress){.step = 0, .steps = 0, .loss = NAN, .accuracy = NAN, .lr = NAN};
    snprintf(m.progress[1].job_id, sizeof m.progress[1].job_id, J2);
    return m;
}

static fb_wire_msg make_event(fb_wire_event_kind k, int blob, const char *text, double loss)
{
    fb_wire_msg m = blank(FB_WIRE_EVENT);
    snprintf(m.group_id, sizeof m.group_id, G1);
    m.generation = 5;
    m.seq = 17;
    m.event = k;
    snprintf(m.job_id, sizeof m.job_id, J3);
    m.step = 2000;
    m.loss = loss;
    m.accuracy = isnan(loss) ? NAN : 1.0;
    m.blob = blob;
    snprintf(m.text, sizeof m.text, "%s", text);
    return m;
}

static void test_round_trips(void)
{
    fb_wire_msg m = make_hello();
    round_trip(&m, 0);
    fb_wire_msg_free(&m);
    CHECK(m.running == NULL && m.n_running == 0);

    m = blank(FB_WIRE_WELCOME);
    snprintf(m.worker_id, sizeof m.worker_id, W1);
    m.heartbeat_ms = 100;
    round_trip(&m, 0);
    m.heartbeat_ms = 60000;
    round_trip(&m, 0);

    /* a worker that can take part in arrays spanning workers: a name, IPv4, IPv6 (stored
     * without brackets), one port or a range of FB_WIRE_COMM_PORTS */
    m = make_hello();
    snprintf(m.comm_host, sizeof m.comm_host, "gpu-node-3.rack_a.example");
    m.comm_port_lo = m.comm_port_hi = 29500;
    round_trip(&m, 0);
    snprintf(m.comm_host, sizeof m.comm_host, "10.0.0.7");
    m.comm_port_lo = 1;
    m.comm_port_hi = FB_WIRE_COMM_PORTS;
    round_trip(&m, 0);
    snprintf(m.comm_host, sizeof m.comm_host, "fe80::1:Ab");
    m.comm_port_lo = 65535 - FB_WIRE_COMM_PORTS + 1;
    m.comm_port_hi = 65535;
    round_trip(&m, 0);
    fb_wire_msg_free(&m);

    m = make_assign();
    round_trip(&m, 2);
    /* a member starting from the tenant's weights, on a built-in under the tenant's name */
    m.members[2].init_blob = 3;
    m.dataset_tenant[0] = '\0';
    snprintf(m.builtin, sizeof m.builtin, "fashion-mnist");
    round_trip(&m, 3);
    fb_wire_msg_free(&m);

    /* a group spanning workers: this worker holds ranks 1..2 of 4, the split has 4 entries */
    m = make_assign();
    m.n_group_devices = 2;
    m.parallel_data = 2;
    m.parallel_pipeline = 1;
    m.world = 4;
    m.rank_base = 1;
    m.n_split = 4;
    m.split[2] = 33;
    m.split[3] = 1;
    snprintf(m.rendezvous, sizeof m.rendezvous, "gpu-node-1.example:29500");
    memset(m.token, 'a', 2 * FB_WIRE_TOKEN_BYTES);
    m.token[5] = '0';
    m.token[2 * FB_WIRE_TOKEN_BYTES] = '\0';
    round_trip(&m, 2);
    snprintf(m.rendezvous, sizeof m.rendezvous, "[2001:db8::7]:1");
    m.rank_base = 2; /* the last ranks */
    round_trip(&m, 2);
    /* the longest rendezvous: a 63-byte IPv6 literal in brackets and a 5-digit port */
    memset(m.rendezvous, '1', sizeof m.rendezvous);
    m.rendezvous[0] = '[';
    m.rendezvous[2] = ':';
    m.rendezvous[64] = ']';
    memcpy(m.rendezvous + 65, ":65535", 7);
    CHECK_INT_EQ(strlen(m.rendezvous), 71);
    round_trip(&m, 2);
    m.world = FB_WIRE_MAX_DEVICES;
    m.n_split = FB_WIRE_MAX_DEVICES;
    for (int i = 0; i < m.n_split; i++)
        m.split[i] = 2;
    m.rank_base = 0; /* the leader */
    round_trip(&m, 2);
    fb_wire_msg_free(&m);

    m = make_progress();
    round_trip(&m, 0);
    /* with the per-device breakdown: two devices of unequal speed, device indices not in
     * order, and the largest counts the wire allows */
    m.n_device_steps = 2;
    m.device_steps[0] = (fb_wire_device_step){.device = 3, .compute_ms = 20.25, .pass_ms = 17.5,
                                              .comm_ms = 0.5,
                                              .io_ms = 1.0 / 7.0, .idle_ms = 0, .steps = 12,
                                              .samples = 12 * 40};
    m.device_steps[1] = (fb_wire_device_step){.device = 0, .compute_ms = 10.125, .pass_ms = 10.125,
                                              .comm_ms = 0,
                                              .io_ms = 1.0 / 7.0, .idle_ms = 10.5, .steps = 12,
                                              .samples = 12 * 88};
    round_trip(&m, 0);
    m.device_steps[0].steps = m.device_steps[1].steps = (int64_t)1 << 53;
    m.device_steps[1].samples = (int64_t)1 << 53;
    round_trip(&m, 0);
    m.n_device_steps = FB_WIRE_MAX_DEVICES;
    for (int i = 0; i < FB_WIRE_MAX_DEVICES; i++)
        m.device_steps[i] = (fb_wire_device_step){.device = FB_WIRE_MAX_DEVICES - 1 - i,
                                                  .compute_ms = i, .pass_ms = i / 3.0,
                                                  .steps = 1, .samples = i};
    round_trip(&m, 0);
    /* a spanning group's follower: its devices and no members */
    free(m.progress);
    m.progress = NULL;
    m.n_progress = 0;
    m.n_device_steps = 1;
    round_trip(&m, 0);
    fb_wire_msg_free(&m);

    m = make_event(FB_EV_CHECKPOINTED, 1, "", 0.25);
    round_trip(&m, 1);
    m = make_event(FB_EV_FINISHED, 1, "done", 0.125);
    round_trip(&m, 1);
    m.test_loss = 0.5; /* the test evaluation at the member's end */
    m.test_accuracy = 0.875;
    round_trip(&m, 1);
    m.test_loss = m.test_accuracy = NAN; /* none: not on the wire */
    round_trip(&m, 1);
    m = make_event(FB_EV_DETACHED, 0, "", NAN);
    round_trip(&m, 0);
    m = make_event(FB_EV_FAILED, 0, "loss is not finite at step 40: \"nan\"\n\ttab", NAN);
    round_trip(&m, 0);
    m.fault = FB_FAULT_SPEC; /* the spec cannot train anywhere */
    round_trip(&m, 0);
    m = make_event(FB_EV_STARTED, 0, "", NAN);
    round_trip(&m, 0);
    m = make_event(FB_EV_EVALUATED, 0, "", 1e-7);
    round_trip(&m, 0);

    m = blank(FB_WIRE_ACK);
    m.seq = 9007199254740992LL;
    round_trip(&m, 0);
    snprintf(m.group_id, sizeof m.group_id, G2);
    round_trip(&m, 0);

    m = blank(FB_WIRE_DETACH);
    snprintf(m.group_id, sizeof m.group_id, G1);
    m.generation = 6;
    round_trip(&m, 0);
    snprintf(m.job_id, sizeof m.job_id, J2);
    memset(m.text, 'x', FB_WIRE_TEXT_MAX);
    m.text[FB_WIRE_TEXT_MAX] = '\0';
    round_trip(&m, 0);
    m.keep_state = true; /* a migration: the member leaves with its state */
    round_trip(&m, 0);

    m = blank(FB_WIRE_REBALANCE);
    snprintf(m.group_id, sizeof m.group_id, G1);
    m.generation = 7;
    m.n_split = FB_WIRE_MAX_DEVICES;
    for (int i = 0; i < m.n_split; i++)
        m.split[i] = i + 1;
    m.time_share = 1.0;
    round_trip(&m, 0);
    m.time_share = 5e-324; /* the smallest positive double is in (0, 1] */
    round_trip(&m, 0);

    m = blank(FB_WIRE_HEARTBEAT);
    set_running(&m);
    round_trip(&m, 0);
    fb_wire_msg_free(&m);
    m = blank(FB_WIRE_HEARTBEAT);
    round_trip(&m, 0); /* a worker running nothing */
    m.reply = true;
    m.known = true;
    round_trip(&m, 0);
    m.known = false;
    round_trip(&m, 0);

    m = blank(FB_WIRE_DRAIN);
    round_trip(&m, 0);
    snprintf(m.text, sizeof m.text, "maintenance \xe2\x9c\x93");
    round_trip(&m, 0);
}

/* Fields a type does not use are not sent, and decode to zero. */
static void test_encode_writes_only_the_type_fields(void)
{
    fb_wire_msg m = blank(FB_WIRE_WELCOME);
    snprintf(m.worker_id, sizeof m.worker_id, W1);
    m.heartbeat_ms = 1000;
    snprintf(m.group_id, sizeof m.group_id, G1);
    m.seq = 4;
    char msg[256];
    char *s = fb_wire_encode(&m, msg, sizeof msg);
    CHECK(s);
    CHECK_STR_EQ(s,
                 "{\"v\":1,\"type\":\"welcome\",\"worker_id\":\"" W1 "\",\"heartbeat_ms\":1000}");
    free(s);
}

/* ---- the fuzz seeds: valid frames of every type, written by hand --------- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    CHECK(b);
    CHECK_INT_EQ(fread(b, 1, (size_t)n, f), n);
    b[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void test_seed_corpus(void)
{
    const char *src = getenv("FB_SOURCE_DIR");
    if (!src) {
        fprintf(stderr, "FB_SOURCE_DIR not set; seed corpus not checked\n");
        return;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/wire", src);
    DIR *dh = opendir(dir);
    CHECK(dh);
    int files = 0, seen[FB_WIRE_TYPE_COUNT] = {0};
    struct dirent *de;
    while ((de = readdir(dh))) {
        if (de->d_name[0] == '.') continue;
        char path[4352], msg[512];
        size_t len;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        char *b = read_file(path, &len);
        CHECK(b && len > 1);
        /* the first byte is the blob count, as the fuzz target reads it */
        fb_wire_msg m, again;
        int rc = fb_wire_decode(b + 1, len - 1, (unsigned char)b[0] % 8, &m, msg, sizeof msg);
        if (rc) fprintf(stderr, "%s: %s\n", de->d_name, msg);
        CHECK_INT_EQ(rc, FB_OK);
        seen[m.type]++;
        char *s = fb_wire_encode(&m, msg, sizeof msg);
        CHECK(s);
        CHECK_INT_EQ(fb_wire_decode(s, strlen(s), (unsigned char)b[0] % 8, &again, msg, sizeof msg),
                     FB_OK);
        check_same(&m, &again);
        fb_wire_msg_free(&again);
        fb_wire_msg_free(&m);
        free(s);
        free(b);
        files++;
    }
    closedir(dh);
    CHECK(files >= FB_WIRE_TYPE_COUNT);
    for (int t = 0; t < FB_WIRE_TYPE_COUNT; t++) {
        if (!seen[t]) fprintf(stderr, "no seed of type %s\n", fb_wire_type_name(t));
        CHECK(seen[t] > 0);
    }
}

/* ---- malformed frames ------------------------------------------------------ */

typedef struct bad_case {
    const char *name;
    const char *json;
    int n_blobs;
    const char *msg_has; /* the field the message must name, and often why */
} bad_case;

#define HDR(t) "{'v':1,'type':'" t "',"
#define GRP "'group_id':'" G1 "','generation':5,"
#define MEMBER(id, extra)                                                                          \
    "{'job_id':'" id "','tenant_id':'" T1 "','spec':'{}','start_step':0" extra "}"
#define ASSIGN(devs, pd, split, members, ...)                                                      \
    HDR("assign")                                                                                  \
    GRP "'fusion_key':'" FKEY "','dataset':'fashion-mnist','devices':" devs ",'parallel_data':" pd \
        ",'parallel_pipeline':1,'split':" split ",'time_share':1,'members':[" members              \
        "]" __VA_ARGS__ "}"
#define A_OK(...) ASSIGN("[0,1]", "2", "[64,64]", MEMBER(J1, ""), __VA_ARGS__)
#define DEV(idx, mem, fr)                                                                          \
    "{'idx':" idx ",'kind':'cuda','name':'NVIDIA H200','memory_bytes':" mem ",'free_bytes':" fr "}"
#define HELLO(worker, backend, devices, running)                                                   \
    HDR("hello")                                                                                   \
    "'worker':" worker ",'backend':" backend ",'version':'0.1.0','devices':[" devices              \
    "],'running':[" running "]}"
#define H_OK(worker) HELLO(worker, "'cuda'", DEV("0", "100", "50"), "")
#define RUN(gid, ids, steps)                                                                       \
    "{'group_id':'" gid "','generation':2,'job_ids':" ids ",'steps':" steps "}"
#define PMEMBER(id, step, steps, loss, acc, lr)                                                    \
    "{'job_id':'" id "','step':" step ",'steps':" steps ",'loss':" loss ",'accuracy':" acc         \
    ",'lr':" lr "}"
#define PROGRESS(cms, members)                                                                     \
    HDR("progress")                                                                                \
    GRP "'compute_ms':" cms ",'comm_ms':0,'io_ms':0,'idle_ms':0,"                                  \
        "'samples_per_s':10,'members':[" members "]}"
#define PDEV(idx, cms, steps, samples)                                                             \
    "{'idx':" idx ",'compute_ms':" cms ",'pass_ms':0.5,'comm_ms':0.5,'io_ms':0,'idle_ms':1,"      \
    "'steps':" steps                                                                               \
    ",'samples':" samples "}"
#define PROGRESS_DEVS(devs)                                                                        \
    HDR("progress")                                                                                \
    GRP "'compute_ms':1,'comm_ms':0,'io_ms':0,'idle_ms':0,'samples_per_s':10,'devices':" devs    \
        ",'members':[" PMEMBER(J1, "1", "10", "0.5", "0.5", "0.1") "]}"
#define EVENT(kind, rest)                                                                          \
    HDR("event") GRP "'seq':3,'event':'" kind "','job_id':'" J1 "','step':9" rest "}"
#define WELCOME(wid, hb) HDR("welcome") "'worker_id':" wid ",'heartbeat_ms':" hb "}"
#define TEN "abcdefghij"
#define TOKHEX48 "0123456789abcdef0123456789abcdef0123456789abcdef"
#define TOKHEX "0123456789abcdef" TOKHEX48
#define TOK "'" TOKHEX "'"
#define SPAN(world, base, rdv, token)                                                              \
    "{'world':" world ",'rank_base':" base ",'rendezvous':" rdv ",'token':" token "}"
#define SPAN_A(devs, pd, split, span) ASSIGN(devs, pd, split, MEMBER(J1, ""), ",'span':" span)
#define HELLO_COMM(comm)                                                                           \
    HDR("hello")                                                                                   \
    "'worker':'n1','backend':'cpu','version':'0.1.0','devices':[" DEV(                             \
        "0", "100", "50") "],'comm':" comm ",'running':[]}"

static const bad_case bad_cases[] = {
    /* framing, version, type */
    {"not json", "{'v':1,", 0, "not valid JSON"},
    {"array root", "[1,2]", 0, "expected a JSON object"},
    {"trailing garbage", "{'v':1,'type':'drain'} x", 0, "not valid JSON"},
    {"missing version", "{'type':'drain'}", 0, "v: required field missing"},
    {"wrong version", "{'v':2,'type':'drain'}", 0, "v: version 2"},
    {"version as string", "{'v':'1','type':'drain'}", 0, "v: expected an integer"},
    {"missing type", "{'v':1}", 0, "type: required field missing"},
    {"unknown type", "{'v':1,'type':'reboot'}", 0, "type: \"reboot\" is not one of"},
    {"type not a string", "{'v':1,'type':3}", 0, "type: expected a string"},
    {"duplicate key", "{'v':1,'type':'drain','text':'a','text':'b'}", 0, "duplicate"},
    {"too deep", "{'v':1,'type':'drain','x':[[[[[[[[[]]]]]]]]]}", 0, "deeper than 8"},
    {"invalid utf-8", "{'v':1,'type':'drain','text':'\xff'}", 0, "not valid JSON"},
    {"NUL escape in text", "{'v':1,'type':'drain','text':'a\\u0000b'}", 0,
     "text: contains a NUL byte"},
    {"bad blob count", "{'v':1,'type':'drain'}", -1, "blob frames"},
    {"unreferenced blob frame", "{'v':1,'type':'drain'}", 1, "blob frame 1 is not referred to"},
    /* unknown fields */
    {"unknown root field", "{'v':1,'type':'drain','reason':'x'}", 0, "reason: unknown field"},
    {"field of another type", HDR("ack") "'seq':1,'generation':2}", 0, "generation: unknown field"},
    {"valid assign (control)", A_OK(), 0, NULL},
    {"unknown field in a member", ASSIGN("[0,1]", "2", "[64,64]", MEMBER(J1, ",'lr':0.1")), 0,
     "members[0].lr: unknown field"},
    {"unknown device field",
     HELLO("'n1'", "'cpu'",
           "{'idx':0,'kind':'cpu','name':'c','memory_bytes':1,'free_bytes':0,"
           "'numa':1}",
           ""),
     0, "devices[0].numa: unknown field"},
    /* WELCOME */
    {"heartbeat too fast", WELCOME("'" W1 "'", "99"), 0, "heartbeat_ms: 99 is out of range"},
    {"heartbeat too slow", WELCOME("'" W1 "'", "60001"), 0, "heartbeat_ms: 60001"},
    {"heartbeat as real", WELCOME("'" W1 "'", "1000.0"), 0, "heartbeat_ms: expected an integer"},
    {"upper-case uuid", WELCOME("'5D4C3B2A-1F0E-4D9C-8B7A-6F5E4D3C2B1A'", "1000"), 0,
     "worker_id: \"5D4C3B2A"},
    {"uuid without dashes", WELCOME("'5d4c3b2a1f0e4d9c8b7a6f5e4d3c2b1a'", "1000"), 0,
     "worker_id: \"5d4c3b2a1f0e4d9c8b7a6f5e4d3c2b1a\" is not a UUID"},
    {"uuid too long", WELCOME("'" W1 "0'", "1000"), 0, "0\" is not a UUID"},
    {"uuid with braces", WELCOME("'{" W1 "}'", "1000"), 0, "worker_id: \"{5d4c"},
    {"uuid not a string", WELCOME("7", "1000"), 0, "worker_id: expected a string"},
    {"missing worker_id", HDR("welcome") "'heartbeat_ms':1000}", 0, "worker_id: required"},
    /* ASSIGN */
    {"unknown assign field", A_OK(",'x':0"), 0, "x: unknown field"},
    {"generation 0",
     HDR("rebalance") "'group_id':'" G1 "','generation':0,'split':[1],"
                      "'time_share':1}",
     0, "generation: 0 is out of range"},
    {"generation above 2^53",
     HDR("rebalance") "'group_id':'" G1 "','generation':9007199254740993,"
                      "'split':[1],'time_share':1}",
     0, "generation: 9007199254740993"},
    {"missing group", HDR("rebalance") "'generation':1,'split':[1],'time_share':1}", 0,
     "group_id: required field missing"},
    {"short fusion key",
     HDR("assign") GRP "'fusion_key':'abc','dataset':'d','devices':[0],"
                       "'parallel_data':1,'parallel_pipeline':1,'split':[1],'time_share':1,"
                       "'members':[" MEMBER(J1, "") "]}",
     0, "fusion_key: \"abc\""},
    {"bad dataset name",
     HDR("assign") GRP "'fusion_key':'" FKEY "','dataset':'Fashion',"
                       "'devices':[0],'parallel_data':1,'parallel_pipeline':1,'split':[1],"
                       "'time_share':1,'members':[" MEMBER(J1, "") "]}",
     0, "dataset: \"Fashion\": byte 0"},
    {"dataset dot",
     HDR("assign") GRP "'fusion_key':'" FKEY "','dataset':'.',"
                       "'devices':[0],'parallel_data':1,'parallel_pipeline':1,'split':[1],"
                       "'time_share':1,'members':[" MEMBER(J1, "") "]}",
     0, "dataset: \".\": byte 0"},
    {"dataset dotdot",
     HDR("assign") GRP "'fusion_key':'" FKEY "','dataset':'..',"
                       "'devices':[0],'parallel_data':1,'parallel_pipeline':1,'split':[1],"
                       "'time_share':1,'members':[" MEMBER(J1, "") "]}",
     0, "dataset: \"..\": byte 0"},
    {"builtin dotdot", A_OK(",'builtin':'..'"), 0, "builtin: \"..\": byte 0"},
    {"builtin slash", A_OK(",'builtin':'a/b'"), 0, "builtin: \"a/b\": byte 1"},
    {"builtin with a tenant", A_OK(",'builtin':'mnist','dataset_tenant':'" T1 "'"), 0,
     "builtin: a built-in is public"},
    {"init blob on a resume",
     ASSIGN("[0,1]", "2", "[64,64]",
            "{'job_id':'" J1 "','tenant_id':'" T1 "','spec':'{}','start_step':5,"
            "'resume_blob':1,'init_blob':2}"),
     2, "members[0].init_blob: initial weights are for a start at step 0"},
    {"init blob twice",
     ASSIGN("[0,1]", "2", "[64,64]", MEMBER(J1, ",'resume_blob':1,'init_blob':1")), 1,
     "blob 1 is referred to twice"},
    {"init blob beyond frames", ASSIGN("[0,1]", "2", "[64,64]", MEMBER(J1, ",'init_blob':2")), 1,
     "members[0].init_blob: 2 is out of range"},
    {"dataset tenant not a uuid",
     HDR("assign") GRP "'fusion_key':'" FKEY "','dataset':'d','dataset_tenant':'../x',"
                       "'devices':[0],'parallel_data':1,'parallel_pipeline':1,'split':[1],"
                       "'time_share':1,'members':[" MEMBER(J1, "") "]}",
     0, "dataset_tenant: \"../x\" is not a UUID"},
    {"devices not data x pipeline", ASSIGN("[0,1,2]", "2", "[64,64]", MEMBER(J1, "")), 0,
     "devices: 3 entries, but parallel_data x parallel_pipeline is 2"},
    {"device index too large", ASSIGN("[0,64]", "2", "[64,64]", MEMBER(J1, "")), 0,
     "devices[1]: 64 is out of range"},
    {"device index not an integer", ASSIGN("[0,'1']", "2", "[64,64]", MEMBER(J1, "")), 0,
     "devices[1]: expected an integer, got a string"},
    {"split count", ASSIGN("[0,1]", "2", "[128]", MEMBER(J1, "")), 0,
     "split: 1 entries, but parallel_data is 2"},
    {"split zero", ASSIGN("[0,1]", "2", "[128,0]", MEMBER(J1, "")), 0,
     "split[1]: 0 is out of range"},
    {"parallel_data zero", ASSIGN("[0,1]", "0", "[64,64]", MEMBER(J1, "")), 0,
     "parallel_data: 0 is out of range"},
    {"no members", ASSIGN("[0,1]", "2", "[64,64]", ""), 0, "members: 0 entries"},
    {"member not an object", ASSIGN("[0,1]", "2", "[64,64]", "'" J1 "'"), 0,
     "members[0]: expected an object"},
    {"spec as object",
     ASSIGN("[0,1]", "2", "[64,64]",
            "{'job_id':'" J1 "','tenant_id':'" T1 "','spec':{},'start_step':0}"),
     0, "members[0].spec: expected a string, got an object"},
    {"empty spec",
     ASSIGN("[0,1]", "2", "[64,64]",
            "{'job_id':'" J1 "','tenant_id':'" T1 "','spec':'','start_step':0}"),
     0, "members[0].spec: must not be empty"},
    {"bad tenant id",
     ASSIGN("[0,1]", "2", "[64,64]",
            "{'job_id':'" J1 "','tenant_id':'tenant-1','spec':'{}',"
            "'start_step':0}"),
     0, "members[0].tenant_id: \"tenant-1\" is not a UUID"},
    {"duplicate job id",
     ASSIGN("[0,1]", "2", "[64,64]", MEMBER(J1, "") "," MEMBER(J2, "") "," MEMBER(J1, "")), 0,
     "members[2].job_id: job " J1 " appears more than once"},
    {"resume blob beyond frames", ASSIGN("[0,1]", "2", "[64,64]", MEMBER(J1, ",'resume_blob':2")),
     1, "members[0].resume_blob: 2 is out of range [1, 1]"},
    {"resume blob without frames", ASSIGN("[0,1]", "2", "[64,64]", MEMBER(J1, ",'resume_blob':1")),
     0, "members[0].resume_blob: refers to blob 1 but the message has no blob frames"},
    {"resume blob zero", ASSIGN("[0,1]", "2", "[64,64]", MEMBER(J1, ",'resume_blob':0")), 1,
     "members[0].resume_blob: 0 is out of range"},
    {"blob used twice",
     ASSIGN("[0,1]", "2", "[64,64]",
            MEMBER(J1, ",'resume_blob':1") "," MEMBER(J2, ",'resume_blob':1")),
     1, "members[1].resume_blob: blob 1 is referred to twice"},
    {"resume without state",
     ASSIGN("[0,1]", "2", "[64,64]",
            "{'job_id':'" J1 "','tenant_id':'" T1 "','spec':'{}','start_step':5}"),
     0, "members[0].start_step: 5 > 0 needs a resume_blob"},
    {"time_share twice", A_OK(",'time_share':0"), 0, "duplicate"},
    {"time share 0", HDR("rebalance") GRP "'split':[1],'time_share':0}", 0,
     "time_share: 0 is out of range (0, 1]"},
    {"time share above 1", HDR("rebalance") GRP "'split':[1],'time_share':1.5}", 0,
     "time_share: 1.5 is out of range"},
    {"time share null", HDR("rebalance") GRP "'split':[1],'time_share':null}", 0,
     "time_share: expected a number, got null"},
    {"no split", HDR("rebalance") GRP "'split':[],'time_share':1}", 0, "split: 0 entries"},
    /* ASSIGN of a group that spans workers */
    {"span (control)", SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'127.0.0.1:29500'", TOK)), 0,
     NULL},
    {"span leader, IPv6 (control)",
     SPAN_A("[0]", "1", "[70,58]", SPAN("2", "0", "'[::1]:29500'", TOK)), 0, NULL},
    {"span world 1", SPAN_A("[0]", "1", "[128]", SPAN("1", "0", "'h:1'", TOK)), 0,
     "span.world: 1 is out of range [2, 64]"},
    {"span world 0", SPAN_A("[0]", "1", "[128]", SPAN("0", "0", "'h:1'", TOK)), 0,
     "span.world: 0 is out of range [2, 64]"},
    {"span world 65", SPAN_A("[0]", "1", "[128]", SPAN("65", "0", "'h:1'", TOK)), 0,
     "span.world: 65 is out of range [2, 64]"},
    {"span world as string", SPAN_A("[0]", "1", "[70,58]", SPAN("'2'", "0", "'h:1'", TOK)), 0,
     "span.world: expected an integer, got a string"},
    {"span world not above local ranks",
     SPAN_A("[0,1]", "2", "[70,58]", SPAN("2", "0", "'h:1'", TOK)), 0,
     "span.world: 2, but this worker's parallel_data is 2"},
    {"span with a pipeline",
     HDR("assign") GRP "'fusion_key':'" FKEY "','dataset':'d','devices':[0,1],'parallel_data':1,"
                       "'parallel_pipeline':2,'split':[70,58],'time_share':1,'members':[" MEMBER(
                           J1, "") "],'span':" SPAN("2", "0", "'h:1'", TOK) "}",
     0, "span.world: a group that spans workers has parallel_pipeline 1, not 2"},
    {"span rank_base negative", SPAN_A("[0]", "1", "[70,58]", SPAN("2", "-1", "'h:1'", TOK)), 0,
     "span.rank_base: -1 is out of range"},
    {"span rank_base past the world", SPAN_A("[0]", "1", "[70,58]", SPAN("2", "2", "'h:1'", TOK)),
     0, "span.rank_base: 2 + parallel_data 1 exceeds the world of 2 ranks"},
    {"span ranks past the world", SPAN_A("[0,1]", "2", "[40,40,48]", SPAN("3", "2", "'h:1'", TOK)),
     0, "span.rank_base: 2 + parallel_data 2 exceeds the world of 3 ranks"},
    {"span rank_base missing",
     SPAN_A("[0]", "1", "[70,58]", "{'world':2,'rendezvous':'h:1','token':'" TOKHEX "'}"), 0,
     "span.rank_base: required field missing"},
    {"span split of local length", SPAN_A("[0]", "1", "[128]", SPAN("2", "1", "'h:1'", TOK)), 0,
     "split: 1 entries, but the group spans a world of 2 ranks"},
    {"span split too long", SPAN_A("[0]", "1", "[40,40,48]", SPAN("2", "1", "'h:1'", TOK)), 0,
     "split: 3 entries, but the group spans a world of 2 ranks"},
    {"span token short", SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'h:1'", "'abc'")), 0,
     "span.token: \"abc\" is not 64 lower-case hex digits"},
    {"span token long", SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'h:1'", "'" TOKHEX "0'")), 0,
     "span.token: \"" TOKHEX48 "...\" is not 64 lower-case hex digits"},
    {"span token upper case",
     SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'h:1'", "'ABCDEF0123456789" TOKHEX48 "'")), 0,
     "span.token: \"ABCDEF0123456789"},
    {"span token not hex",
     SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'h:1'", "'g123456789abcdef" TOKHEX48 "'")), 0,
     "span.token: \"g123456789abcdef"},
    {"span token as number", SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'h:1'", "7")), 0,
     "span.token: expected a string, got an integer"},
    {"span rendezvous without a port",
     SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'node-1'", TOK)), 0,
     "span.rendezvous: \"node-1\": has no port"},
    {"span rendezvous empty port", SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'node-1:'", TOK)),
     0, "span.rendezvous: \"node-1:\": the port is not a number in 1..65535"},
    {"span rendezvous port 0", SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'node-1:0'", TOK)), 0,
     "the port is not a number in 1..65535"},
    {"span rendezvous port 65536",
     SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'node-1:65536'", TOK)), 0,
     "the port is not a number in 1..65535"},
    {"span rendezvous port with sign",
     SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'node-1:+80'", TOK)), 0,
     "the port is not a number in 1..65535"},
    {"span rendezvous without a host", SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "':80'", TOK)),
     0, "span.rendezvous: \":80\": the host is not a host name or an IP address"},
    {"span rendezvous host with a space",
     SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'a b:80'", TOK)), 0,
     "the host is not a host name or an IP address"},
    {"span rendezvous IPv6 without brackets",
     SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'::1:80'", TOK)), 0,
     "an IPv6 address must be written in brackets"},
    {"span rendezvous brackets without a port",
     SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'[::1]'", TOK)), 0,
     "a bracketed IPv6 address must be followed by \":port\""},
    {"span rendezvous name in brackets",
     SPAN_A("[0]", "1", "[70,58]", SPAN("2", "1", "'[node]:80'", TOK)), 0,
     "only an IPv6 address goes in brackets"},
    {"span rendezvous too long",
     SPAN_A("[0]", "1", "[70,58]",
            SPAN("2", "1", "'" TEN TEN TEN TEN TEN TEN TEN TEN TEN TEN TEN TEN TEN "1234:1'", TOK)),
     0, "span.rendezvous: 136 bytes, at most 133"},
    {"span rendezvous host too long",
     SPAN_A("[0]", "1", "[70,58]",
            SPAN("2", "1", "'a123456789012345678901234567890123456789012345678901234567890123:1'",
                 TOK)),
     0, "the host is not a host name or an IP address of 1..63 bytes"},
    {"span unknown field",
     SPAN_A("[0]", "1", "[70,58]",
            "{'world':2,'rank_base':1,'rendezvous':'h:1','token':'" TOKHEX "','nccl':1}"),
     0, "span.nccl: unknown field"},
    {"span not an object", SPAN_A("[0]", "1", "[70,58]", "[2,1]"), 0,
     "span: expected an object, got an array"},
    /* HELLO: where other workers reach this one */
    {"comm (control)", HELLO_COMM("{'host':'node-1','ports':[29500,29599]}"), 0, NULL},
    {"comm ports reversed", HELLO_COMM("{'host':'node-1','ports':[29599,29500]}"), 0,
     "comm.ports: [29599, 29500] is reversed"},
    {"comm ports too wide", HELLO_COMM("{'host':'node-1','ports':[1000,2024]}"), 0,
     "comm.ports: [1000, 2024] holds 1025 ports, at most 1024 allowed"},
    {"comm port zero", HELLO_COMM("{'host':'node-1','ports':[0,10]}"), 0,
     "comm.ports[0]: 0 is out of range [1, 65535]"},
    {"comm port too large", HELLO_COMM("{'host':'node-1','ports':[65000,65536]}"), 0,
     "comm.ports[1]: 65536 is out of range [1, 65535]"},
    {"comm one port", HELLO_COMM("{'host':'node-1','ports':[29500]}"), 0,
     "comm.ports: 1 entries, allowed 2..2"},
    {"comm ports missing", HELLO_COMM("{'host':'node-1'}"), 0,
     "comm.ports: required field missing"},
    {"comm empty host", HELLO_COMM("{'host':'','ports':[1,2]}"), 0,
     "comm.host: \"\" is not a host name"},
    {"comm host in brackets", HELLO_COMM("{'host':'[::1]','ports':[1,2]}"), 0,
     "comm.host: \"[::1]\" is not a host name or an IP address (IPv6 without brackets)"},
    {"comm host with a port", HELLO_COMM("{'host':'node-1:80','ports':[1,2]}"), 0,
     "comm.host: \"node-1:80\" is not a host name"},
    {"comm host starting with a dot", HELLO_COMM("{'host':'.node','ports':[1,2]}"), 0,
     "comm.host: \".node\" is not a host name"},
    {"comm unknown field", HELLO_COMM("{'host':'n','ports':[1,2],'nic':'eth0'}"), 0,
     "comm.nic: unknown field"},
    /* HELLO and HEARTBEAT */
    {"worker name starts with a dash", H_OK("'-node'"), 0, "worker: \"-node\": byte 0"},
    {"worker name upper case", H_OK("'Node1'"), 0, "worker: \"Node1\": byte 0"},
    {"worker name too long",
     H_OK("'a123456789012345678901234567890123456789012345678901234567890123'"), 0,
     "worker: 64 bytes, at most 63"},
    {"empty worker name", H_OK("''"), 0, "worker: must not be empty"},
    {"unknown backend", HELLO("'n1'", "'tpu'", DEV("0", "100", "50"), ""), 0,
     "backend: \"tpu\" is not one of: cpu, cuda"},
    {"no devices", HELLO("'n1'", "'cuda'", "", ""), 0, "devices: 0 entries"},
    {"free above total", HELLO("'n1'", "'cuda'", DEV("0", "100", "101"), ""), 0,
     "devices[0].free_bytes: 101 is out of range [0, 100]"},
    {"zero memory", HELLO("'n1'", "'cuda'", DEV("0", "0", "0"), ""), 0,
     "devices[0].memory_bytes: 0 is out of range"},
    {"device listed twice",
     HELLO("'n1'", "'cuda'", DEV("3", "100", "50") "," DEV("3", "100", "50"), ""), 0,
     "devices[1].idx: device 3 is listed twice"},
    {"running generation zero",
     HELLO("'n1'", "'cuda'", DEV("0", "100", "50"),
           "{'group_id':'" G1 "','generation':0,"
           "'job_ids':[],'steps':[]}"),
     0, "running[0].generation: 0 is out of range"},
    {"running arrays differ",
     HELLO("'n1'", "'cuda'", DEV("0", "100", "50"), RUN(G1, "['" J1 "']", "[]")), 0,
     "running[0].steps: 0 entries, but job_ids has 1"},
    {"running bad job id", HELLO("'n1'", "'cuda'", DEV("0", "100", "50"), RUN(G1, "['x']", "[1]")),
     0, "running[0].job_ids[0]: \"x\" is not a UUID"},
    {"running negative steps",
     HELLO("'n1'", "'cuda'", DEV("0", "100", "50"), RUN(G1, "['" J1 "']", "[-1]")), 0,
     "running[0].steps[0]: -1 is out of range"},
    {"job in two running groups",
     HELLO("'n1'", "'cuda'", DEV("0", "100", "50"),
           RUN(G1, "['" J1 "','" J2 "']", "[1,2]") "," RUN(G2, "['" J3 "','" J2 "']", "[1,2]")),
     0, "running[1].job_ids[1]: job " J2 " appears more than once"},
    {"group running twice",
     HELLO("'n1'", "'cuda'", DEV("0", "100", "50"), RUN(G1, "[]", "[]") "," RUN(G1, "[]", "[]")), 0,
     "running[1].group_id: group " G1 " is listed twice"},
    {"running not an array", HDR("heartbeat") "'running':{}}", 0,
     "running: expected an array, got an object"},
    {"heartbeat with both", HDR("heartbeat") "'running':[],'known':true}", 0,
     "known: a heartbeat carries running"},
    {"unknown heartbeat field", HDR("heartbeat") "'x':1}", 0, "x: unknown field"},
    {"empty heartbeat", "{'v':1,'type':'heartbeat'}", 0, "running: required field missing"},
    {"known as number", HDR("heartbeat") "'known':1}", 0, "known: expected true or false"},
    /* PROGRESS */
    {"step beyond steps", PROGRESS("1", PMEMBER(J1, "11", "10", "null", "null", "null")), 0,
     "members[0].step: 11 is out of range [0, 10]"},
    {"accuracy above 1", PROGRESS("1", PMEMBER(J1, "1", "10", "0.5", "1.5", "0.1")), 0,
     "members[0].accuracy: 1.5 is out of range"},
    {"negative lr", PROGRESS("1", PMEMBER(J1, "1", "10", "0.5", "0.5", "-0.1")), 0,
     "members[0].lr: -0.10000000000000001 is out of range"},
    {"loss as string", PROGRESS("1", PMEMBER(J1, "1", "10", "'nan'", "0.5", "0.1")), 0,
     "members[0].loss: expected a number or null, got a string"},
    {"loss missing",
     PROGRESS("1", "{'job_id':'" J1 "','step':1,'steps':2,'accuracy':null,"
                   "'lr':null}"),
     0, "members[0].loss: required field missing"},
    {"compute null", PROGRESS("null", PMEMBER(J1, "1", "10", "0.5", "0.5", "0.1")), 0,
     "compute_ms: expected a number, got null"},
    {"negative compute", PROGRESS("-1", PMEMBER(J1, "1", "10", "0.5", "0.5", "0.1")), 0,
     "compute_ms: -1 is out of range"},
    {"progress twice for a job",
     PROGRESS("1", PMEMBER(J1, "1", "10", "0.5", "0.5", "0.1") "," PMEMBER(J1, "1", "10", "0.5",
                                                                           "0.5", "0.1")),
     0, "members[1].job_id: job " J1 " appears more than once"},
    /* PROGRESS: the per-device breakdown */
    {"two devices", PROGRESS_DEVS("[" PDEV("0", "2", "4", "100") "," PDEV("1", "3", "4", "28") "]"),
     0, NULL},
    {"devices empty", PROGRESS_DEVS("[]"), 0, "devices: 0 entries, allowed 1..64"},
    {"devices not an array", PROGRESS_DEVS("{}"), 0, "devices: expected an array, got an object"},
    {"device listed twice",
     PROGRESS_DEVS("[" PDEV("1", "2", "4", "100") "," PDEV("1", "3", "4", "28") "]"), 0,
     "devices[1].idx: device 1 is listed twice"},
    {"device index 64", PROGRESS_DEVS("[" PDEV("64", "2", "4", "100") "]"), 0,
     "devices[0].idx: 64 is out of range [0, 63]"},
    {"device index negative", PROGRESS_DEVS("[" PDEV("-1", "2", "4", "100") "]"), 0,
     "devices[0].idx: -1 is out of range"},
    {"device compute negative", PROGRESS_DEVS("[" PDEV("0", "-2", "4", "100") "]"), 0,
     "devices[0].compute_ms: -2 is out of range"},
    {"device compute null", PROGRESS_DEVS("[" PDEV("0", "null", "4", "100") "]"), 0,
     "devices[0].compute_ms: expected a number, got null"},
    {"device steps differ",
     PROGRESS_DEVS("[" PDEV("0", "2", "4", "100") "," PDEV("1", "3", "5", "28") "]"), 0,
     "devices[1].steps: 5, but devices[0] reports 4"},
    {"device passes longer than its compute",
     PROGRESS_DEVS("[{'idx':0,'compute_ms':1,'pass_ms':1.5,'comm_ms':0,'io_ms':0,'idle_ms':0,"
                   "'steps':1,'samples':1}]"),
     0, "devices[0].pass_ms: 1.5 ms is more than compute_ms (1 ms)"},
    {"device passes negative",
     PROGRESS_DEVS("[{'idx':0,'compute_ms':1,'pass_ms':-1,'comm_ms':0,'io_ms':0,'idle_ms':0,"
                   "'steps':1,'samples':1}]"),
     0, "devices[0].pass_ms: -1 is out of range"},
    {"device samples without steps", PROGRESS_DEVS("[" PDEV("0", "2", "0", "1") "]"), 0,
     "devices[0].samples: 1 samples in 0 steps"},
    {"device samples negative", PROGRESS_DEVS("[" PDEV("0", "2", "4", "-1") "]"), 0,
     "devices[0].samples: -1 is out of range"},
    {"device samples above 2^53", PROGRESS_DEVS("[" PDEV("0", "2", "4", "9007199254740993") "]"), 0,
     "devices[0].samples: 9007199254740993 is out of range"},
    {"device samples real", PROGRESS_DEVS("[" PDEV("0", "2", "4", "1.0") "]"), 0,
     "devices[0].samples: expected an integer, got a real number"},
    {"device unknown field",
     PROGRESS_DEVS("[{'idx':0,'compute_ms':1,'pass_ms':1,'comm_ms':0,'io_ms':0,'idle_ms':0,"
                   "'steps':1,'samples':1,'stage':0}]"),
     0, "devices[0].stage: unknown field"},
    {"device field missing",
     PROGRESS_DEVS("[{'idx':0,'compute_ms':1,'pass_ms':1,'comm_ms':0,'io_ms':0,'idle_ms':0,"
                   "'steps':1}]"),
     0, "devices[0].samples: required field missing"},
    {"device not an object", PROGRESS_DEVS("[3]"), 0, "devices[0]: expected an object"},
    /* PROGRESS of a spanning group's follower: devices and no members */
    {"follower progress (control)",
     HDR("progress") GRP "'compute_ms':1,'comm_ms':0,'io_ms':0,'idle_ms':0,'samples_per_s':10,"
                         "'devices':[" PDEV("0", "2", "4", "100") "],'members':[]}",
     0, NULL},
    {"no members and no devices", PROGRESS("1", ""), 0, "members: no entries and no devices"},
    /* EVENT, ACK, DETACH, DRAIN */
    {"unknown event", EVENT("exploded", ""), 0, "event: \"exploded\" is not one of"},
    {"seq zero", HDR("event") GRP "'seq':0,'event':'started','job_id':'" J1 "','step':0}", 0,
     "seq: 0 is out of range"},
    {"checkpoint without blob", EVENT("checkpointed", ""), 0, "blob: required field missing"},
    {"started with blob", EVENT("started", ",'blob':1"), 1,
     "blob: a started event carries no blob"},
    {"failed without text", EVENT("failed", ""), 0, "text: a failed event must say why"},
    {"failed with a job fault", EVENT("failed", ",'text':'oom','fault':'job'"), 0, NULL},
    {"failed with an unknown fault", EVENT("failed", ",'text':'oom','fault':'worker'"), 0,
     "fault: \"worker\" is not one of: job, spec"},
    {"fault not a string", EVENT("failed", ",'text':'oom','fault':1"), 0,
     "fault: expected a string"},
    {"fault of a finished event", EVENT("finished", ",'fault':'job'"), 0,
     "fault: only a failed event names a fault, not a finished one"},
    {"event job missing", HDR("event") GRP "'seq':1,'event':'started','step':0}", 0,
     "job_id: required field missing"},
    {"event accuracy negative", EVENT("evaluated", ",'accuracy':-0.5"), 0,
     "accuracy: -0.5 is out of range"},
    {"finished with its test evaluation", EVENT("finished", ",'test_loss':0.4,'test_accuracy':0.9"),
     0, NULL},
    {"finished with a null test evaluation",
     EVENT("finished", ",'test_loss':null,'test_accuracy':null"), 0, NULL},
    {"test accuracy above 1", EVENT("finished", ",'test_loss':0.4,'test_accuracy':1.5"), 0,
     "test_accuracy: 1.5 is out of range"},
    {"test loss a string", EVENT("finished", ",'test_loss':'low'"), 0, "test_loss: expected"},
    {"a validation with a test value", EVENT("evaluated", ",'test_loss':0.4"), 0,
     "test_loss: only a finished event carries a test evaluation, not an evaluated one"},
    {"a checkpoint with a test value", EVENT("checkpointed", ",'blob':1,'test_accuracy':0.4"), 1,
     "test_accuracy: only a finished event carries a test evaluation, not a checkpointed one"},
    {"event blob as string", EVENT("finished", ",'blob':'1'"), 1,
     "blob: expected an integer, got a string"},
    {"ack bad group", HDR("ack") "'seq':1,'group_id':'g1'}", 0, "group_id: \"g1\" is not a UUID"},
    {"ack without seq", "{'v':1,'type':'ack'}", 0, "seq: required field missing"},
    {"detach empty job id", HDR("detach") GRP "'job_id':''}", 0, "job_id: \"\" is not a UUID"},
    {"detach keep_state of a group", HDR("detach") GRP "'keep_state':true}", 0,
     "keep_state: only a member's DETACH keeps state"},
    {"detach keep_state string", HDR("detach") GRP "'job_id':'" J1 "','keep_state':'yes'}", 0,
     "keep_state: expected true or false, got a string"},
    {"drain text number", HDR("drain") "'text':5}", 0, "text: expected a string, got an integer"},
};

static void test_bad_frames(void)
{
    int n = (int)(sizeof bad_cases / sizeof bad_cases[0]), checked = 0;
    fb_wire_msg zero;
    memset(&zero, 0, sizeof zero);
    for (int i = 0; i < n; i++) {
        const bad_case *c = &bad_cases[i];
        char *json = quoted(c->json), msg[512];
        fb_wire_msg out;
        memset(&out, 0xab, sizeof out);
        int rc = fb_wire_decode(json, strlen(json), c->n_blobs, &out, msg, sizeof msg);
        if (!c->msg_has) {
            /* a valid neighbour of the bad frames: proves the macros build good frames */
            if (rc) fprintf(stderr, "case \"%s\" refused: %s\n", c->name, msg);
            CHECK_INT_EQ(rc, FB_OK);
            fb_wire_msg_free(&out);
            free(json);
            continue;
        }
        if (rc != FB_ERR_BAD_WIRE || !strstr(msg, c->msg_has)) {
            fprintf(stderr, "case \"%s\": rc %d, message \"%s\", wanted \"%s\"\n%s\n", c->name, rc,
                    rc ? msg : "", c->msg_has, json);
            abort();
        }
        CHECK(memcmp(&out, &zero, sizeof out) == 0);
        checked++;
        free(json);
    }
    CHECK(checked >= 40);
}

static void expect_bad(const char *json, size_t len, int n_blobs, const char *has)
{
    fb_wire_msg out;
    char msg[512];
    int rc = fb_wire_decode(json, len, n_blobs, &out, msg, sizeof msg);
    if (rc != FB_ERR_BAD_WIRE || !strstr(msg, has)) {
        fprintf(stderr, "rc %d, message \"%s\", wanted \"%s\"\n", rc, rc ? msg : "", has);
        abort();
    }
}

static void test_bounds(void)
{
    char *buf = malloc(FB_WIRE_MAX_JSON + 2);
    CHECK(buf);

    /* text: 511 bytes fit, 512 do not */
    char *text = malloc(FB_WIRE_TEXT_MAX + 2);
    CHECK(text);
    memset(text, 'y', FB_WIRE_TEXT_MAX + 1);
    text[FB_WIRE_TEXT_MAX] = '\0';
    int len = snprintf(buf, FB_WIRE_MAX_JSON, "{\"v\":1,\"type\":\"drain\",\"text\":\"%s\"}", text);
    fb_wire_msg m;
    char msg[512];
    CHECK_INT_EQ(fb_wire_decode(buf, (size_t)len, 0, &m, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(strlen(m.text), FB_WIRE_TEXT_MAX);
    fb_wire_msg_free(&m);
    text[FB_WIRE_TEXT_MAX] = 'y';
    text[FB_WIRE_TEXT_MAX + 1] = '\0';
    len = snprintf(buf, FB_WIRE_MAX_JSON, "{\"v\":1,\"type\":\"drain\",\"text\":\"%s\"}", text);
    expect_bad(buf, (size_t)len, 0, "text: 512 bytes, at most 511");
    free(text);

    /* a raw NUL byte inside the frame */
    static const char nul_frame[] = "{\"v\":1,\"type\":\"drain\",\"text\":\"a\0b\"}";
    expect_bad(nul_frame, sizeof nul_frame - 1, 0, "NUL byte at offset 31");

    /* a spec one byte over its bound */
    char *spec = malloc(FB_WIRE_MAX_SPEC + 2);
    CHECK(spec);
    memset(spec, 's', FB_WIRE_MAX_SPEC + 1);
    spec[FB_WIRE_MAX_SPEC + 1] = '\0';
    char *tmpl = quoted(ASSIGN(
        "[0]", "1", "[64]", "{'job_id':'" J1 "','tenant_id':'" T1 "','spec':'%s','start_step':0}"));
    len = snprintf(buf, FB_WIRE_MAX_JSON, tmpl, spec);
    expect_bad(buf, (size_t)len, 0, "members[0].spec: 262145 bytes, at most 262144");
    spec[FB_WIRE_MAX_SPEC] = '\0';
    len = snprintf(buf, FB_WIRE_MAX_JSON, tmpl, spec);
    CHECK_INT_EQ(fb_wire_decode(buf, (size_t)len, 0, &m, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(strlen(m.members[0].spec), FB_WIRE_MAX_SPEC);
    fb_wire_msg_free(&m);
    free(tmpl);
    free(spec);

    /* a frame over FB_WIRE_MAX_JSON is refused before parsing */
    memset(buf, ' ', FB_WIRE_MAX_JSON + 1);
    memcpy(buf, "{\"v\":1,\"type\":\"drain\"}", 22);
    expect_bad(buf, FB_WIRE_MAX_JSON + 1, 0, "exceeds");
    CHECK_INT_EQ(fb_wire_decode(buf, FB_WIRE_MAX_JSON, 0, &m, msg, sizeof msg), FB_OK);

    /* more members than FB_WIRE_MAX_MEMBERS */
    size_t used = (size_t)snprintf(buf, FB_WIRE_MAX_JSON,
                                   "{\"v\":1,\"type\":\"progress\",\"group_id\":\"" G1
                                   "\",\"generation\":1,\"compute_ms\":0,\"comm_ms\":0,"
                                   "\"io_ms\":0,\"idle_ms\":0,\"samples_per_s\":0,\"members\":[");
    for (int i = 0; i <= FB_WIRE_MAX_MEMBERS; i++)
        used += (size_t)snprintf(buf + used, FB_WIRE_MAX_JSON - used,
                                 "%s{\"job_id\":\"00000000-0000-4000-8000-%012d\",\"step\":0,"
                                 "\"steps\":0,\"loss\":null,\"accuracy\":null,\"lr\":null}",
                                 i ? "," : "", i);
    used += (size_t)snprintf(buf + used, FB_WIRE_MAX_JSON - used, "]}");
    expect_bad(buf, used, 0, "members: 1025 entries, allowed 0..1024");

    /* a NULL frame and a NULL output are refused, not dereferenced */
    expect_bad(NULL, 10, 0, "no frame");
    CHECK(fb_wire_decode("{}", 2, 0, NULL, msg, sizeof msg) != FB_OK);
    free(buf);
}

/* ---- encode refuses what decode would refuse ------------------------------ */

static void expect_encode_fails(const fb_wire_msg *m, const char *has)
{
    char msg[512] = "";
    char *s = fb_wire_encode(m, msg, sizeof msg);
    if (s || !strstr(msg, has)) {
        fprintf(stderr, "encode gave %s, message \"%s\", wanted \"%s\"\n", s ? s : "NULL", msg,
                has);
        abort();
    }
}

static void test_encode_refuses(void)
{
    fb_wire_msg m = blank(FB_WIRE_WELCOME);
    snprintf(m.worker_id, sizeof m.worker_id, W1);
    m.heartbeat_ms = 50;
    expect_encode_fails(&m, "heartbeat_ms: 50 is out of range");
    m.heartbeat_ms = 1000;
    memset(m.worker_id, 'a', sizeof m.worker_id);
    expect_encode_fails(&m, "worker_id: not NUL-terminated");

    m = blank((fb_wire_type)99);
    expect_encode_fails(&m, "type: 99");
    expect_encode_fails(NULL, "no message");

    m = make_progress();
    m.compute_ms = NAN;
    expect_encode_fails(&m, "compute_ms: nan is not a finite number");
    m.compute_ms = 1;
    m.progress[1].loss = INFINITY;
    expect_encode_fails(&m, "members[1].loss: inf is not a finite number");
    m.progress[1].loss = NAN;
    m.progress[1].step = 5; /* steps is 0 */
    expect_encode_fails(&m, "members[1].step: 5 is out of range [0, 0]");
    m.progress[1].step = 0;
    m.n_device_steps = FB_WIRE_MAX_DEVICES + 1;
    expect_encode_fails(&m, "devices: 65 entries, allowed 0..64");
    m.n_device_steps = -1;
    expect_encode_fails(&m, "devices: -1 entries");
    m.n_device_steps = 1;
    m.device_steps[0] = (fb_wire_device_step){.device = 0, .idle_ms = INFINITY, .steps = 1};
    expect_encode_fails(&m, "devices[0].idle_ms: inf is not a finite number");
    m.device_steps[0].idle_ms = 0;
    m.device_steps[0].device = FB_WIRE_MAX_DEVICES;
    expect_encode_fails(&m, "devices[0].idx: 64 is out of range");
    m.n_device_steps = 0;
    snprintf(m.progress[1].job_id, sizeof m.progress[1].job_id, J1);
    expect_encode_fails(&m, "members[1].job_id: job " J1 " appears more than once");
    fb_wire_msg_free(&m);

    m = make_assign();
    m.n_members = FB_WIRE_MAX_MEMBERS + 1;
    expect_encode_fails(&m, "members: 1025 entries");
    m.n_members = 3;
    free(m.members[2].spec);
    m.members[2].spec = NULL;
    expect_encode_fails(&m, "members[2].spec: no spec");
    m.members[2].spec = strdup("{}");
    m.members[0].resume_blob = 3; /* blobs 1 and 3 used: frame 2 would be missing */
    expect_encode_fails(&m, "blob: indices must be numbered 1..2");
    m.members[0].resume_blob = 2;
    m.parallel_pipeline = 1;
    expect_encode_fails(&m, "devices: 4 entries, but parallel_data x parallel_pipeline is 2");
    m.parallel_pipeline = 2;
    snprintf(m.fusion_key, sizeof m.fusion_key, "%s", "9F86D081884C7D659A2FEAA0C55AD015");
    expect_encode_fails(&m, "fusion_key");
    fb_wire_msg_free(&m);

    /* span: written only for world >= 2, and checked as decode checks it */
    m = make_assign();
    m.world = 1;
    expect_encode_fails(&m, "span.world: 1 is out of range [2, 64]");
    m.world = 0;
    m.rank_base = 1;
    expect_encode_fails(&m, "span: rank_base, rendezvous or token set without world");
    m.rank_base = 0;
    snprintf(m.token, sizeof m.token, "%s", TOKHEX);
    expect_encode_fails(&m, "span: rank_base, rendezvous or token set without world");
    m.n_group_devices = 1;
    m.parallel_data = 1;
    m.parallel_pipeline = 1;
    m.world = 2;
    snprintf(m.rendezvous, sizeof m.rendezvous, "h:1");
    m.n_split = 3;
    m.split[2] = 1;
    expect_encode_fails(&m, "split: 3 entries, but the group spans a world of 2 ranks");
    m.n_split = 1;
    expect_encode_fails(&m, "split: 1 entries, but the group spans a world of 2 ranks");
    m.n_split = 2;
    m.rank_base = 2;
    expect_encode_fails(&m, "span.rank_base: 2 + parallel_data 1 exceeds");
    m.rank_base = 1;
    m.token[3] = 'G';
    expect_encode_fails(&m, "span.token");
    m.token[3] = '0';
    memset(m.rendezvous, 'r', sizeof m.rendezvous);
    expect_encode_fails(&m, "span: rendezvous or token not NUL-terminated");
    snprintf(m.rendezvous, sizeof m.rendezvous, "h");
    expect_encode_fails(&m, "span.rendezvous: \"h\": has no port");
    snprintf(m.rendezvous, sizeof m.rendezvous, "h:1");
    char *ok = fb_wire_encode(&m, NULL, 0);
    CHECK(ok != NULL);
    CHECK(strstr(ok, "\"span\":{") != NULL);
    free(ok);
    fb_wire_msg_free(&m);

    /* comm: ports need a host, the host must end inside its buffer */
    m = make_hello();
    m.comm_port_lo = 1;
    m.comm_port_hi = 2;
    expect_encode_fails(&m, "comm.ports: set without comm.host");
    memset(m.comm_host, 'h', sizeof m.comm_host);
    expect_encode_fails(&m, "comm.host: not NUL-terminated");
    snprintf(m.comm_host, sizeof m.comm_host, "node-1");
    m.comm_port_lo = 3;
    expect_encode_fails(&m, "comm.ports: [3, 2] is reversed");
    m.comm_port_lo = 0;
    expect_encode_fails(&m, "comm.ports[0]: 0 is out of range");
    fb_wire_msg_free(&m);

    /* a follower's report without devices has nothing to say */
    m = make_progress();
    free(m.progress);
    m.progress = NULL;
    m.n_progress = 0;
    expect_encode_fails(&m, "members: no entries and no devices");
    fb_wire_msg_free(&m);

    m = make_event(FB_EV_STARTED, 1, "", NAN);
    expect_encode_fails(&m, "blob: a started event carries no blob");
    m = make_event((fb_wire_event_kind)17, 0, "", NAN);
    expect_encode_fails(&m, "event: 17 is not an event kind");
    m = make_event(FB_EV_CHECKPOINTED, 2, "", NAN);
    expect_encode_fails(&m,
                        "blob: indices must be numbered 1..1 in frame order, but index 2 is used");

    m = blank(FB_WIRE_DETACH);
    snprintf(m.group_id, sizeof m.group_id, G1);
    m.generation = 1;
    snprintf(m.text, sizeof m.text, "bad \xff byte");
    expect_encode_fails(&m, "text: not valid UTF-8");
    m.text[0] = '\0';
    m.keep_state = true;
    expect_encode_fails(&m, "keep_state: only a member's DETACH keeps state");
    m = make_event(FB_EV_STARTED, 0, "", NAN);
    m.fault = FB_FAULT_SPEC;
    expect_encode_fails(&m, "fault: only a failed event names a fault");

    m = blank(FB_WIRE_HEARTBEAT);
    m.known = true;
    expect_encode_fails(&m, "known: only the server's heartbeat reply");
    m = blank(FB_WIRE_HEARTBEAT);
    set_running(&m);
    m.reply = true;
    expect_encode_fails(&m, "running: the server's heartbeat reply carries no running groups");
    m.reply = false;
    m.running[0].n_jobs = -1;
    expect_encode_fails(&m, "running[0].job_ids: -1 entries");
    m.running[0].n_jobs = 2;
    fb_wire_msg_free(&m);
}

/* The rendezvous split the worker uses to reach its leader. */
static void test_rendezvous_split(void)
{
    char host[FB_WIRE_NAME_MAX + 1] = "untouched", msg[256];
    int port = -7;
    CHECK_INT_EQ(
        fb_wire_rendezvous_split("node-1.example:29500", host, sizeof host, &port, msg, sizeof msg),
        FB_OK);
    CHECK_STR_EQ(host, "node-1.example");
    CHECK_INT_EQ(port, 29500);
    CHECK_INT_EQ(fb_wire_rendezvous_split("[fe80::1]:1", host, sizeof host, &port, msg, sizeof msg),
                 FB_OK);
    CHECK_STR_EQ(host, "fe80::1");
    CHECK_INT_EQ(port, 1);
    static const char *const bad[] = {"",        "node",   "node:",   "node:0",    "node:65536",
                                      "node:08", "::1:80", "[::1]",   "[::1]80",   "[a]:80",
                                      ":80",     "a b:80", "node:8a", "[::1]:80x", "node:123456"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msg[0] = '\0';
        int rc = fb_wire_rendezvous_split(bad[i], host, sizeof host, &port, msg, sizeof msg);
        if (rc != FB_ERR_BAD_WIRE) fprintf(stderr, "\"%s\" was accepted\n", bad[i]);
        CHECK_INT_EQ(rc, FB_ERR_BAD_WIRE);
        CHECK(strstr(msg, "rendezvous") != NULL);
        /* outputs untouched */
        CHECK_STR_EQ(host, "fe80::1");
        CHECK_INT_EQ(port, 1);
    }
    char small[4];
    CHECK_INT_EQ(fb_wire_rendezvous_split("node-1:80", small, sizeof small, &port, msg, sizeof msg),
                 FB_ERR_BAD_WIRE);
    CHECK(strstr(msg, "does not fit") != NULL);
    CHECK_INT_EQ(fb_wire_rendezvous_split(NULL, host, sizeof host, &port, msg, sizeof msg),
                 FB_ERR_INTERNAL);
}

static void test_names(void)
{
    for (int t = 0; t < FB_WIRE_TYPE_COUNT; t++)
        CHECK_INT_EQ(fb_wire_type_parse(fb_wire_type_name((fb_wire_type)t)), t);
    CHECK_INT_EQ(fb_wire_type_parse("Hello"), -1);
    CHECK_INT_EQ(fb_wire_type_parse(NULL), -1);
    CHECK_STR_EQ(fb_wire_type_name(FB_WIRE_REBALANCE), "rebalance");
    CHECK_STR_EQ(fb_wire_type_name((fb_wire_type)-1), "unknown");
    CHECK_STR_EQ(fb_wire_event_name(FB_EV_CHECKPOINTED), "checkpointed");
    CHECK_STR_EQ(fb_wire_event_name(FB_EV_KIND_COUNT), "unknown");
    fb_wire_msg_free(NULL);
}

/* ---- key files ------------------------------------------------------------- */

static char tmpdir[512];

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    CHECK(f);
    CHECK_INT_EQ(fwrite(text, 1, strlen(text), f), strlen(text));
    CHECK_INT_EQ(fclose(f), 0);
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    CHECK(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* Loads path as a key file and expects an error mentioning has; outputs must stay as they were. */
static void expect_key_bad(const char *path, bool want_secret, int code, const char *has)
{
    char pub[41], sec[41], msg[512];
    memset(pub, 'P', sizeof pub);
    memset(sec, 'S', sizeof sec);
    int rc = fb_wire_key_load(path, pub, want_secret ? sec : NULL, msg, sizeof msg);
    if (rc != code || !strstr(msg, has)) {
        fprintf(stderr, "key file %s: rc %d, message \"%s\", wanted %d \"%s\"\n", path, rc,
                rc ? msg : "", code, has);
        abort();
    }
    for (int i = 0; i < 41; i++)
        CHECK(pub[i] == 'P' && sec[i] == 'S');
}

static void gen_key(const char *name, char pub[41], char sec[41])
{
    char path[600], msg[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    int rc = fb_wire_key_generate(path, msg, sizeof msg);
    if (rc) fprintf(stderr, "generate: %s\n", msg);
    CHECK_INT_EQ(rc, FB_OK);
    CHECK_INT_EQ(fb_wire_key_load(path, pub, sec, msg, sizeof msg), FB_OK);
}

static void test_key_files(void)
{
    char path[600], other[600], msg[512], pub[41], sec[41], pub2[41], sec2[41], text[512];
    snprintf(path, sizeof path, "%s/worker.key", tmpdir);

    CHECK_INT_EQ(fb_wire_key_generate(path, msg, sizeof msg), FB_OK);
    struct stat st;
    CHECK_INT_EQ(stat(path, &st), 0);
    CHECK_INT_EQ(st.st_mode & 0777, 0600);
    CHECK_INT_EQ(count_entries(tmpdir), 1); /* no temporary file left behind */
    CHECK_INT_EQ(fb_wire_key_load(path, pub, sec, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(strlen(pub), 40);
    CHECK_INT_EQ(strlen(sec), 40);
    CHECK(strcmp(pub, sec) != 0);
    memset(pub2, 0, sizeof pub2);
    CHECK_INT_EQ(fb_wire_key_load(path, pub2, NULL, msg, sizeof msg), FB_OK);
    CHECK_STR_EQ(pub, pub2);
    size_t before_len, after_len;
    char *before = read_file(path, &before_len);
    CHECK(before);
    snprintf(text, sizeof text, "public: %s\nsecret: %s\n", pub, sec);
    CHECK_STR_EQ(before, text);

    /* an existing file is never overwritten */
    CHECK_INT_EQ(fb_wire_key_generate(path, msg, sizeof msg), FB_ERR_ALREADY_EXISTS);
    CHECK(strstr(msg, "worker.key exists"));
    char *after = read_file(path, &after_len);
    CHECK_STR_EQ(before, after);
    CHECK_INT_EQ(count_entries(tmpdir), 1);
    free(before);
    free(after);
    snprintf(other, sizeof other, "%s/no-such-dir/worker.key", tmpdir);
    CHECK_INT_EQ(fb_wire_key_generate(other, msg, sizeof msg), FB_ERR_IO);

    /* two generated keys differ */
    gen_key("second.key", pub2, sec2);
    CHECK(strcmp(pub, pub2) != 0);

    /* a public-only file is enough for the public key, not for a secret */
    snprintf(other, sizeof other, "%s/public.key", tmpdir);
    snprintf(text, sizeof text, "# the worker's public key\n\npublic: %s\r\n", pub);
    write_text(other, text);
    memset(pub2, 0, sizeof pub2);
    CHECK_INT_EQ(fb_wire_key_load(other, pub2, NULL, msg, sizeof msg), FB_OK);
    CHECK_STR_EQ(pub, pub2);
    expect_key_bad(other, true, FB_ERR_BAD_WIRE, "no \"secret:\" line");

    /* malformed key files name the line */
    snprintf(text, sizeof text, "public: %.39s\n", pub);
    write_text(other, text);
    expect_key_bad(other, false, FB_ERR_BAD_WIRE, "line 1: the public key is not 40 characters");
    snprintf(text, sizeof text, "public: %.39s~\n", pub);
    write_text(other, text);
    expect_key_bad(other, false, FB_ERR_BAD_WIRE, "line 1: the public key");
    snprintf(text, sizeof text, "# c\n\npublic: %s\nprivate: %s\n", pub, sec);
    write_text(other, text);
    expect_key_bad(other, true, FB_ERR_BAD_WIRE, "line 4: expected \"public: <key>\"");
    snprintf(text, sizeof text, "public: %s\npublic: %s\n", pub, pub2);
    write_text(other, text);
    expect_key_bad(other, false, FB_ERR_BAD_WIRE, "line 2: a second public key");
    snprintf(text, sizeof text, "public: %s\nsecret: %s\n", pub, sec2);
    write_text(other, text);
    expect_key_bad(other, true, FB_ERR_BAD_WIRE, "does not belong to the secret key");
    /* a group of five characters above 2^32 is not Z85 of 32 bytes */
    snprintf(text, sizeof text, "public: %%%%%%%%%%%.35s\n", pub);
    write_text(other, text);
    expect_key_bad(other, false, FB_ERR_BAD_WIRE, "line 1: the public key");
    write_text(other, "");
    expect_key_bad(other, false, FB_ERR_BAD_WIRE, "no \"public:\" line");
    snprintf(other, sizeof other, "%s/missing.key", tmpdir);
    expect_key_bad(other, false, FB_ERR_IO, "cannot open");
}

/* Loads an allow-list and expects an error mentioning has, outputs untouched. */
static void expect_keys_bad(const char *path, int cap, const char *has)
{
    char keys[4][41], msg[512];
    memset(keys, 'K', sizeof keys);
    int n = -7;
    int rc = fb_wire_keys_load(path, keys, cap, &n, msg, sizeof msg);
    if (rc != FB_ERR_BAD_WIRE || !strstr(msg, has)) {
        fprintf(stderr, "allow-list: rc %d, message \"%s\", wanted \"%s\"\n", rc, rc ? msg : "",
                has);
        abort();
    }
    CHECK_INT_EQ(n, -7);
    for (size_t i = 0; i < sizeof keys; i++)
        CHECK(((char *)keys)[i] == 'K');
}

static void test_allow_list(void)
{
    char p1[41], s1[41], p2[41], s2[41], p3[41], s3[41], path[600], text[2048], msg[512];
    char keys[4][41];
    int n = 0;
    gen_key("a.key", p1, s1);
    gen_key("b.key", p2, s2);
    gen_key("c.key", p3, s3);
    snprintf(path, sizeof path, "%s/workers.allow", tmpdir);
    snprintf(text, sizeof text,
             "# workers allowed to connect\n\n%s\n   public: %s  \n#%s\nsecret: %s\r\n"
             "public:%s\n",
             p1, p2, p3, s3, p3);
    write_text(path, text);
    CHECK_INT_EQ(fb_wire_keys_load(path, keys, 4, &n, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(n, 3);
    CHECK_STR_EQ(keys[0], p1);
    CHECK_STR_EQ(keys[1], p2);
    CHECK_STR_EQ(keys[2], p3);

    expect_keys_bad(path, 2, "line 7: more than 2 keys");
    snprintf(text, sizeof text, "%s\n\n%s\n", p1, p1);
    write_text(path, text);
    expect_keys_bad(path, 4, "line 3: repeats the key of line 1");
    snprintf(text, sizeof text, "# a\n%s\n\n%s extra\n", p1, p2);
    write_text(path, text);
    expect_keys_bad(path, 4, "line 4: expected a 40-character Z85 key");
    snprintf(text, sizeof text, "public: %.20s\n", p1);
    write_text(path, text);
    expect_keys_bad(path, 4, "line 1: the public key is not 40 characters");
    snprintf(text, sizeof text, "%s\nsecret: nope\n", p1);
    write_text(path, text);
    expect_keys_bad(path, 4, "line 2: the secret key");

    write_text(path, "# nobody yet\n\n");
    n = -1;
    CHECK_INT_EQ(fb_wire_keys_load(path, keys, 4, &n, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(n, 0);
    snprintf(path, sizeof path, "%s/missing.allow", tmpdir);
    CHECK_INT_EQ(fb_wire_keys_load(path, keys, 4, &n, msg, sizeof msg), FB_ERR_IO);
}

static void remove_tmpdir(void)
{
    DIR *d = opendir(tmpdir);
    if (!d) return;
    struct dirent *de;
    char path[1024];
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", tmpdir, de->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(tmpdir);
}

int main(void)
{
    test_names();
    test_round_trips();
    test_encode_writes_only_the_type_fields();
    test_seed_corpus();
    test_bad_frames();
    test_bounds();
    test_encode_refuses();
    test_rendezvous_split();

    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/fb-wire-XXXXXX", base && *base ? base : "/tmp");
    CHECK(mkdtemp(tmpdir));
    test_key_files();
    test_allow_list();
    remove_tmpdir();
    printf("test_wire: ok\n");
    return 0;
}
