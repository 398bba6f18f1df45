/*
 * The wire protocol between fuseboxd and fusebox-worker: versioned JSON
 * messages over ZeroMQ (server ROUTER, worker DEALER, CURVE-encrypted and
 * authenticated), documented in docs/wire.md.
 *
 * A message is one ZeroMQ multipart message: frame 0 is a JSON object
 * {"v": FB_WIRE_VERSION, "type": "<type>", ...fields}; frames 1..n are
 * binary blobs (checkpoint and model files) that fields refer to by index
 * ("blob": 1 is frame 1); every blob frame is referred to by exactly one
 * field.  The ROUTER side sees the worker's routing id in front of frame 0;
 * the socket code strips it before fb_wire_decode.
 *
 * fb_wire_decode() validates everything: version, type, every field's type
 * and bounds, no unknown fields, ids that look like ids, blob indices that
 * exist.  A message that fails gets FB_ERR_BAD_WIRE with a message naming
 * the field; the caller logs and drops it.  fb_wire_encode() writes the
 * fields a message type uses and nothing else; encode(decode(x)) is a fixed
 * point.  Strings are copied into the fixed-size buffers of the structs
 * below (a longer string is refused by decode); the one unbounded string,
 * a member's spec, is malloc'd and released by fb_wire_msg_free.
 */
#ifndef FB_API_WIRE_H
#define FB_API_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define FB_WIRE_VERSION 1
#define FB_WIRE_MAX_JSON ((size_t)4 << 20)     /* bytes of frame 0 */
#define FB_WIRE_MAX_BLOB ((size_t)1 << 30)     /* bytes of one blob frame */
#define FB_WIRE_MAX_BLOBS 1024                 /* blob frames of one message */
#define FB_WIRE_MAX_DEVICES 64                 /* devices of one worker or group */
#define FB_WIRE_MAX_MEMBERS 1024               /* members of one group */
#define FB_WIRE_MAX_GROUPS 256                 /* groups one worker reports */
#define FB_WIRE_MAX_SPEC ((size_t)256 << 10)   /* bytes of one member's spec JSON */
#define FB_WIRE_NAME_MAX 63                    /* worker and device names, kinds */
#define FB_WIRE_DATASET_MAX 64                 /* dataset names (as the job spec allows) */
#define FB_WIRE_MAX_DEPTH 8                    /* nesting of arrays and objects in frame 0 */
#define FB_WIRE_TEXT_MAX 511                   /* free-text messages */
#define FB_WIRE_ID_LEN 36                      /* a UUID in its canonical text form */
#define FB_WIRE_TOKEN_BYTES 32                 /* a spanning group's secret (hex on the wire) */
#define FB_WIRE_COMM_PORTS 1024                /* ports of a worker's comm range, at most */

typedef enum fb_wire_type {
    FB_WIRE_HELLO,     /* worker -> server: I exist, these are my devices and running groups */
    FB_WIRE_WELCOME,   /* server -> worker: registered; heartbeat cadence */
    FB_WIRE_ASSIGN,    /* server -> worker: train this group */
    FB_WIRE_PROGRESS,  /* worker -> server: per-member progress and the step time breakdown */
    FB_WIRE_EVENT,     /* worker -> server: a member started, checkpointed, finished, failed, left */
    FB_WIRE_ACK,       /* server -> worker: an event (by seq) is durably recorded */
    FB_WIRE_DETACH,    /* server -> worker: remove a member (or, without job_id, the group) */
    FB_WIRE_REBALANCE, /* server -> worker: new batch split and time share of a group */
    FB_WIRE_HEARTBEAT, /* both ways: liveness; the server's reply says whether it knows the worker */
    FB_WIRE_DRAIN,     /* server -> worker: checkpoint, report and stop; worker -> server: draining */
    FB_WIRE_TYPE_COUNT
} fb_wire_type;

typedef enum fb_wire_event_kind {
    FB_EV_STARTED,      /* the member trained its first step in this assignment */
    FB_EV_EVALUATED,    /* a validation (an evaluation on the validation set): loss, accuracy */
    FB_EV_CHECKPOINTED, /* blob holds the member's full training state at step */
    FB_EV_FINISHED,     /* the member reached its last step; blob holds its model */
    FB_EV_FAILED,       /* the member failed by itself (NaN, bad data); text says why */
    FB_EV_DETACHED,     /* the member left on a DETACH; blob holds its state when drained */
    FB_EV_KIND_COUNT
} fb_wire_event_kind;

/* Whose fault a member's failure is (EVENT failed; docs/scheduling.md, "Fault classes"):
 * the array's own error on the worker (out of memory, numerics, bad data, a checkpoint that
 * does not restore), which uses up one of the job's max_restarts, or the member's spec,
 * which cannot train anywhere and fails the job at once. */
typedef enum fb_wire_fault {
    FB_FAULT_JOB,  /* "job", also when the field is absent */
    FB_FAULT_SPEC, /* "spec" */
    FB_FAULT_COUNT
} fb_wire_fault;

typedef struct fb_wire_device {
    int idx;                            /* the worker's device index, 0.. */
    char kind[FB_WIRE_NAME_MAX + 1];    /* "cpu" or "cuda" */
    char name[FB_WIRE_NAME_MAX + 1];    /* e.g. "NVIDIA H200" or "cpu0" */
    int64_t memory_bytes;               /* total, > 0 */
    int64_t free_bytes;                 /* free now, 0..memory_bytes */
} fb_wire_device;

/* A group a worker is running, as reported in HELLO and HEARTBEAT. */
typedef struct fb_wire_running {
    char group_id[FB_WIRE_ID_LEN + 1];
    int64_t generation;
    int n_jobs;
    char (*job_ids)[FB_WIRE_ID_LEN + 1]; /* [n_jobs], malloc'd */
    int64_t *steps;                      /* [n_jobs] updates done, malloc'd */
} fb_wire_running;

typedef struct fb_wire_member {
    char job_id[FB_WIRE_ID_LEN + 1];
    char tenant_id[FB_WIRE_ID_LEN + 1];
    char *spec;         /* the canonical job spec JSON (malloc'd); the worker parses it */
    int64_t start_step; /* updates already done (0, or the resume checkpoint's step) */
    int resume_blob;    /* blob index of the full-state checkpoint to resume from, 0 = none */
    /* blob index of the weights the spec's init names (a model or checkpoint file of the
     * tenant's, read by the server), 0 = none; only at start_step 0 */
    int init_blob;
} fb_wire_member;

/* Per-member progress inside PROGRESS. */
typedef struct fb_wire_member_progress {
    char job_id[FB_WIRE_ID_LEN + 1];
    int64_t step, steps;
    double loss, accuracy, lr; /* NaN when unknown (encoded as null) */
} fb_wire_member_progress;

/*
 * One device of a group in PROGRESS: where its time went per step since the
 * last report, ms, and the samples it trained on in those steps, so that the
 * server can tell each device's speed and split the batch by it.  The speed
 * is samples per second of the training passes (pass_ms): the update costs
 * a replica the same whatever its share, and counting it would make a small
 * shard look slow and shrink it further.  A device of a data-parallel shard counts the
 * shard's samples once per step; pipeline stages of one shard count the same
 * samples each.
 */
typedef struct fb_wire_device_step {
    int device;        /* the worker's device index, one of the group's, 0..FB_WIRE_MAX_DEVICES-1 */
    double compute_ms; /* forward, backward and update */
    double pass_ms;    /* of compute_ms: forward and backward over its shard */
    double comm_ms;    /* communication that compute did not hide */
    double io_ms;      /* waiting for minibatches */
    double idle_ms;    /* waiting: for slower devices, the pipeline bubble, the device's turn */
    int64_t steps;     /* steps in the interval (equal for every device of the report) */
    int64_t samples;   /* samples this device trained on in those steps */
} fb_wire_device_step;

typedef struct fb_wire_msg {
    fb_wire_type type;
    /* every type but HELLO/WELCOME/HEARTBEAT/DRAIN names a group and its generation */
    char group_id[FB_WIRE_ID_LEN + 1];
    int64_t generation; /* >= 1 */

    /* HELLO */
    char worker[FB_WIRE_NAME_MAX + 1];  /* worker name: [a-z0-9][a-z0-9._-]* */
    char backend[FB_WIRE_NAME_MAX + 1]; /* "cpu" or "cuda" */
    char version[FB_WIRE_NAME_MAX + 1]; /* the worker's software version */
    int n_devices;
    fb_wire_device devices[FB_WIRE_MAX_DEVICES];
    /* HELLO (optional on the wire): where the other workers of an array that spans workers
     * reach this one.  comm_host is a host name or an IP literal (IPv6 without brackets),
     * "" when the worker cannot take part in spanning arrays; the ports are the range
     * comm_port_lo..comm_port_hi (1..65535, at most FB_WIRE_COMM_PORTS of them) the server
     * picks a spanning group's rendezvous port from when this worker leads it.  JSON:
     * "comm": {"host": "...", "ports": [lo, hi]}. */
    char comm_host[FB_WIRE_NAME_MAX + 1];
    int comm_port_lo, comm_port_hi;
    /* HELLO and HEARTBEAT (worker -> server): the groups running now */
    int n_running;
    fb_wire_running *running; /* [n_running], malloc'd */

    /* WELCOME */
    char worker_id[FB_WIRE_ID_LEN + 1]; /* the server's id for the worker */
    int heartbeat_ms;                   /* 100..60000 */

    /* HEARTBEAT: reply is true in the server's reply, which carries known (false asks the
     * worker to send HELLO again), and false in the worker's heartbeat, which carries running */
    bool reply;
    bool known;

    /* ASSIGN */
    char fusion_key[64];
    char dataset[FB_WIRE_DATASET_MAX + 1];
    /* the tenant owning a private dataset ("" for a public one): the worker reads it from
     * <data dir>/<dataset_tenant>/<dataset> instead of <data dir>/<dataset> */
    char dataset_tenant[FB_WIRE_ID_LEN + 1];
    /* the public built-in dataset that the tenant's dataset `dataset` stands for ("" when it
     * is not such an alias): the worker reads the built-in, as a public dataset */
    char builtin[FB_WIRE_DATASET_MAX + 1];
    int n_group_devices;
    int group_devices[FB_WIRE_MAX_DEVICES]; /* the worker's device indices, data x pipeline */
    int parallel_data, parallel_pipeline;   /* 1.., product = n_group_devices */
    int n_members;
    fb_wire_member *members; /* [n_members], malloc'd */
    /* ASSIGN of a group that spans workers (optional on the wire: world 0 when absent, the
     * group lives on this worker only).  The group has `world` (2..FB_WIRE_MAX_DEVICES)
     * data-parallel ranks; this worker holds ranks rank_base .. rank_base + parallel_data - 1
     * (parallel_data < world, parallel_pipeline 1), and split has one entry per rank of the
     * world.  The worker holding rank 0 (the leader) listens at rendezvous ("host:port",
     * "[v6 addr]:port"), the others connect there; every process presents token, the group's
     * secret for this generation (2 x FB_WIRE_TOKEN_BYTES lower-case hex digits).  JSON:
     * "span": {"world", "rank_base", "rendezvous", "token"}, written only when world >= 2. */
    int world, rank_base;
    char rendezvous[FB_WIRE_NAME_MAX * 2 + 8];
    char token[2 * FB_WIRE_TOKEN_BYTES + 1];

    /* ASSIGN and REBALANCE: samples of the global batch per data-parallel shard (sum = the
     * batch size; of a spanning group, one entry per rank of the world), and the group's share
     * of its devices' time in (0, 1] */
    int n_split;
    int64_t split[FB_WIRE_MAX_DEVICES];
    double time_share;

    /* PROGRESS: the step time breakdown since the last report, per step, ms */
    double compute_ms, comm_ms, io_ms, idle_ms;
    double samples_per_s; /* samples x members per second since the last report */
    /* PROGRESS: the same breakdown per device of the group (optional on the wire: 0 when
     * absent, else the group's D x P devices, each named once) */
    int n_device_steps;
    fb_wire_device_step device_steps[FB_WIRE_MAX_DEVICES];
    /* PROGRESS: per member; 0 entries only in the report of a follower of a spanning group
     * (the leader reports the members), which then carries its devices (n_device_steps > 0) */
    int n_progress;
    fb_wire_member_progress *progress; /* [n_progress], malloc'd */

    /* EVENT (worker -> server) and ACK (server -> worker) */
    int64_t seq;              /* the worker's event sequence number, >= 1 */
    fb_wire_event_kind event; /* EVENT */
    char job_id[FB_WIRE_ID_LEN + 1]; /* EVENT, DETACH ("" in DETACH: the whole group) */
    int64_t step;             /* EVENT */
    double loss, accuracy;    /* EVENT: evaluated/finished: the validation (NaN = unknown) */
    /* EVENT finished: the final evaluation on the test split (NaN = none; on the wire only
     * when there is one) */
    double test_loss, test_accuracy;
    int blob;                 /* EVENT: blob index of the file, 0 = none */
    char text[FB_WIRE_TEXT_MAX + 1]; /* EVENT failed, DETACH, DRAIN: why */
    fb_wire_fault fault;             /* EVENT failed: whose fault (FB_FAULT_JOB when absent) */
    /* DETACH of one member: it leaves with its full training state (the blob of its
     * DETACHED event), so that it resumes elsewhere without losing a step */
    bool keep_state;
} fb_wire_msg;

/* The type's name on the wire ("hello", ...), and back (-1 when unknown). */
const char *fb_wire_type_name(fb_wire_type t);
int fb_wire_type_parse(const char *name);
const char *fb_wire_event_name(fb_wire_event_kind k);

/*
 * Parses and validates frame 0 (json, len bytes, not NUL-terminated) of a
 * message that came with n_blobs blob frames.  On success *out is filled
 * (release it with fb_wire_msg_free) and FB_OK returned; on failure *out is
 * zeroed and FB_ERR_BAD_WIRE returned with a message naming the field
 * (FB_ERR_NOMEM when memory runs out).
 */
int fb_wire_decode(const char *json, size_t len, int n_blobs, fb_wire_msg *out, char *msg,
                   size_t msg_cap);

/*
 * Renders msg as frame 0 (a malloc'd NUL-terminated string the caller
 * frees).  Validates as decode does (so a bad message is never sent), with
 * the blob count taken to be the number of blob fields set, which must then
 * be numbered 1..k; returns NULL with msg filled when it would not decode.
 */
char *fb_wire_encode(const fb_wire_msg *m, char *msg, size_t msg_cap);

/*
 * Splits a spanning group's rendezvous ("host:port", "[v6 addr]:port") into
 * host (without brackets, host_cap bytes) and *port, with the checks decode
 * applies.  Returns FB_OK or FB_ERR_BAD_WIRE (msg says why); host and *port
 * are untouched on failure.
 */
int fb_wire_rendezvous_split(const char *rendezvous, char *host, size_t host_cap, int *port,
                             char *msg, size_t msg_cap);

/* Whether host is what HELLO's comm.host takes: a host name ([A-Za-z0-9] first, then letters,
 * digits, '.', '-', '_') or an IP address (IPv6 without brackets), 1..FB_WIRE_NAME_MAX bytes. */
bool fb_wire_host_valid(const char *host);

/* Releases what a message owns (running, members and their specs, progress);
 * leaves *m zeroed.  Accepts NULL. */
void fb_wire_msg_free(fb_wire_msg *m);

/*
 * CURVE keys as files: one line "public: <40 chars Z85>" and, for a secret
 * key file, a second line "secret: <40 chars Z85>".  fb_wire_key_generate
 * writes a new keypair to path (mode 0600, atomically; refuses to overwrite
 * an existing file).  fb_wire_key_load reads one (secret may be NULL to read
 * only the public key; a file without a secret line then suffices).  Keys
 * are returned as 40-char Z85 text plus NUL.  Errors: FB_ERR_ALREADY_EXISTS
 * (generate: the file exists), FB_ERR_IO (cannot read or write),
 * FB_ERR_BAD_WIRE (a malformed file; the message names the line),
 * FB_ERR_UNSUPPORTED (libzmq without CURVE).
 */
int fb_wire_key_generate(const char *path, char *msg, size_t msg_cap);
int fb_wire_key_load(const char *path, char public_z85[41], char secret_z85[41], char *msg,
                     size_t msg_cap);

/*
 * Reads a list of allowed worker public keys: one Z85 key (40 chars) per
 * line, '#' comments and blank lines allowed; or a key file as above (its
 * public line counts).  A line starting with '#' is a comment (no valid
 * key starts with '#').  keys receives up to cap keys; *n
 * their count; more than cap keys, a repeated key or a malformed line is an
 * error naming the line, and leaves keys and *n untouched.
 */
int fb_wire_keys_load(const char *path, char (*keys)[41], int cap, int *n, char *msg,
                      size_t msg_cap);

#endif
