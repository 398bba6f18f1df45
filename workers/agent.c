/*
 * The worker agent (agent.h): the main thread's socket loop, the group
 * threads that train, the device turns between groups, the outbox of
 * events, and the dataset cache the groups share.
 *
 * Ownership: the main thread owns the group list, the outbox and both
 * sockets.  A group's thread owns its session and its PUSH socket (created
 * by the main thread, handed over at pthread_create).  What both read is
 * guarded: a group's member states, step count and batch split by the
 * group's mutex, the device turns (turns.h: each group's virtual time and
 * share, each device's groups) by the turns' own lock, and the stop and
 * drain requests are atomics.  A group reports its end
 * with an EXIT message through its PUSH socket; the main thread joins it and
 * frees it only then, so a group pointer in a message is always valid.
 */
#include "agent.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "datadir.h"
#include "device.h"
#include "dp.h"
#include "idx.h"
#include "jobspec.h"
#include "kernels.h"
#include "backend_impl.h"
#include "comm.h"
#include "session.h"
#include "train.h"
#include "turns.h"
#include "wire.h"
#include "clock.h"
#include "tsan.h"

#ifdef FB_HAVE_CUDA
#include "cuda/cuda_device.h"
#endif
#include "cuda/cuda_backend.h"

#ifndef FB_VERSION_STRING
#define FB_VERSION_STRING "0.1.0"
#endif

#define POLL_MAX_MS 100       /* the loop wakes at least this often (drain requests) */
#define SILENT_HEARTBEATS 3   /* heartbeats without a word before registering again */
#define DEALER_LINGER_MS 2000 /* what close may spend sending what is still queued */
#define OUTBOX_WARN_EVERY_MS 10000
#define LEADER_WAIT_MS 5 /* device turns: how long a group keeps its place in line */
#define HOOK_POLL_MS 2   /* the test step hook: how often a held group looks again */

/* The control vector a spanning group's leader broadcasts before each step (span_exchange). */
#define SPAN_MAGIC 0x66627370616e0001LL /* "fbspan", version 1 */
/* SPAN_HOLD: the leader is held by the test step hook; every rank stays at the step */
enum { SPAN_GO, SPAN_STOP, SPAN_DRAIN, SPAN_HOLD };
enum { CV_MAGIC, CV_STEP, CV_MEMBERS, CV_CMD, CV_SHARE, CV_HAS_SPLIT, CV_SPLIT };

/* ---- logging and time ------------------------------------------------------------------ */

/* One line to stderr, with a UTC timestamp; formatted first so that lines from
 * different threads do not interleave. */
static void agent_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void agent_log(const char *fmt, ...)
{
    char line[1536], stamp[32];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s.%03dZ fusebox-worker: %s\n", stamp, (int)(ts.tv_nsec / 1000000), line);
}

/* Milliseconds on the process clock (base/clock.h).  Every time decision of the worker reads
 * it: the heartbeat cadence and the server's silence, the progress cadence, step times (which
 * the turns charge and the reports carry), the drain's wait for acknowledgements; so a test
 * with --test-clock steps them instead of sleeping. */
static double now_ms(void)
{
    return (double)fb_clock_ns() / 1e6;
}

/* ---- names ------------------------------------------------------------------------------- */

bool fb_agent_name_valid(const char *name)
{
    if (!name || !name[0] || strlen(name) > FB_WIRE_NAME_MAX) return false;
    for (const char *p = name; *p; p++) {
        char c = *p;
        bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        if (!alnum && (p == name || (c != '.' && c != '_' && c != '-'))) return false;
    }
    return true;
}

void fb_agent_name_sanitize(const char *in, char *out, size_t cap)
{
    size_t n = 0, max = cap - 1 < FB_WIRE_NAME_MAX ? cap - 1 : FB_WIRE_NAME_MAX;
    for (const char *p = in ? in : ""; *p && n < max; p++) {
        char c = *p;
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        if (!alnum && c != '.' && c != '_') c = '-';
        if (n == 0 && !alnum) continue; /* a name starts with a letter or digit */
        out[n++] = c;
    }
    out[n] = '\0';
    if (n == 0) snprintf(out, cap, "worker");
}

/* A port number of 1..5 digits without sign or leading zero at s[0..n); -1 when not one. */
static long port_number(const char *s, size_t n)
{
    if (n == 0 || n > 5 || s[0] == '0') return -1;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v >= 1 && v <= 65535 ? v : -1;
}

int fb_agent_parse_comm_addr(const char *s, char *host, size_t host_cap, int *lo, int *hi,
                             char *msg, size_t msg_cap)
{
    if (!s || !host || !lo || !hi)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "missing argument");
    const char *h = s, *ports;
    size_t hn;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "'%s': an IPv6 address in brackets must be followed by :PORT", s);
        h = s + 1;
        hn = (size_t)(close - h);
        ports = close + 2;
        if (!memchr(h, ':', hn))
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "'%s': only an IPv6 address goes in brackets", s);
    } else {
        const char *colon = strrchr(s, ':');
        if (!colon)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "'%s' has no ports: use HOST:LO or HOST:LO-HI", s);
        hn = (size_t)(colon - s);
        if (memchr(s, ':', hn))
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "'%s': write an IPv6 address in brackets, [ADDR]:LO-HI", s);
        ports = colon + 1;
    }
    char hbuf[FB_WIRE_NAME_MAX + 1];
    if (hn == 0 || hn > FB_WIRE_NAME_MAX || hn + 1 > host_cap)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "'%s': the host must have 1..%d characters", s,
                       (int)(host_cap - 1 < FB_WIRE_NAME_MAX ? host_cap - 1 : FB_WIRE_NAME_MAX));
    memcpy(hbuf, h, hn);
    hbuf[hn] = '\0';
    if (!fb_wire_host_valid(hbuf))
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "'%s': the host is neither a host name (letters, digits, '.', '-', '_') "
                       "nor an IP address",
                       s);
    const char *dash = strchr(ports, '-');
    size_t n_lo = dash ? (size_t)(dash - ports) : strlen(ports);
    long p_lo = port_number(ports, n_lo);
    long p_hi = dash ? port_number(dash + 1, strlen(dash + 1)) : p_lo;
    if (p_lo < 0 || p_hi < 0)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "'%s': the ports must be LO or LO-HI, numbers in 1..65535", s);
    if (p_hi < p_lo)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "'%s': the port range %ld-%ld is reversed", s, p_lo, p_hi);
    if (p_hi - p_lo >= FB_AGENT_COMM_PORTS)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "'%s': %ld ports, at most %d", s,
                       p_hi - p_lo + 1, FB_AGENT_COMM_PORTS);
    memcpy(host, hbuf, hn + 1);
    *lo = (int)p_lo;
    *hi = (int)p_hi;
    return FB_OK;
}

void fb_agent_default_name(char *out, size_t cap)
{
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    host[sizeof host - 1] = '\0';
    fb_agent_name_sanitize(host, out, cap);
}

/* ---- state ------------------------------------------------------------------------------- */

struct group;

/*
 * A dataset shared by every group that trains on it with one val_fraction: an
 * IDX dataset's splits in memory (train without the records held out for
 * validation, which are val); a shard dataset's validation set and test split
 * in memory, its train split read by each group's own prefetching loader (as
 * fusebox-train reads it, so that a job trains on the same minibatches here
 * and there).
 */
typedef struct dataset_ref {
    char tenant[FB_WIRE_ID_LEN + 1]; /* owner of a private dataset, "" for a public one */
    char name[FB_SPEC_DATASET_MAX + 1];
    double val_fraction;             /* the specs' (part of the key) */
    char data_dir[1100];             /* where name is found: the data dir, or its tenant's */
    int refs;
    bool shard;
    fb_dataset train, val, test; /* train: IDX only; val: n 0 when there is none */
    bool has_test;
    struct dataset_ref *next;
} dataset_ref;

/* One device; the groups placed on it take turns (turns.h). */
typedef struct agent_device {
    fb_wire_device info;
    fb_backend *be;
    /* a CPU device with a thread count of its own: the CPU backend with that count, which
     * be then points to (the math ops size their thread teams from a backend's count) */
    struct fb_backend own_be;
    int cpu_first, cpu_count; /* its cores when the worker pins devices (cpu_count 0: not) */
} agent_device;

/* A member of an assigned group. */
typedef struct member {
    char job_id[FB_WIRE_ID_LEN + 1];
    fb_job_spec spec;
    bool parsed;
    int sidx;         /* index in the session's specs, -1 when not trained here */
    zmq_msg_t resume; /* the checkpoint to resume from, when has_resume */
    bool has_resume;
    zmq_msg_t init; /* the weights its spec's init names, as the server sent them, when has_init */
    bool has_init;
    /* under the group's mutex */
    bool alive; /* in the array (or about to enter it) */
    bool detach_req;
    bool detach_keep; /* the DETACH wants its full state in the DETACHED event */
    /* the group thread's own */
    bool started;
    double loss, accuracy, lr;
    /* it finished at final_step: the next report still carries its last training values */
    bool final_report;
    int64_t final_step;
} member;

typedef struct group {
    struct fb_agent *a;
    char id[FB_WIRE_ID_LEN + 1];
    int64_t generation;
    char dataset[FB_WIRE_DATASET_MAX + 1]; /* as the specs name it */
    char dataset_tenant[FB_WIRE_ID_LEN + 1];
    /* the dataset it reads: dataset, or the public built-in a tenant's alias stands for */
    char source[FB_WIRE_DATASET_MAX + 1];
    int dev;
    int64_t start_step;
    int n_members;
    member *m;
    int n_sess;
    int *by_sidx;       /* session index -> member index */
    void *push;         /* PUSH to the main thread; the group thread's after start */
    struct outmsg *bye; /* its EXIT message, made up front so that it cannot be lost */
    pthread_t th;

    atomic_bool stop;  /* leave now, silently */
    atomic_bool drain; /* checkpoint everyone, report, leave */

    pthread_mutex_t mu;
    int64_t steps_done;
    bool detach_pending;
    int n_split;
    int64_t split[FB_WIRE_MAX_DEVICES];
    uint64_t split_gen; /* bumped by each REBALANCE that carries a split */

    /* its place in the device turns (under the agent's turns lock): its share, its virtual
     * times, the devices it takes a turn on for each step (every device of its layout once,
     * or its first only: a->device_turns) */
    fb_turn turn;

    /* hybrid parallelism, set at ASSIGN: n_dp data shards x pipeline stages on the worker's
     * devices dp_devs (shard d, stage p at d * pipeline + p); 1 x 1 = one device */
    int n_dp;
    int pipeline;
    int dp_devs[FB_WIRE_MAX_DEVICES];

    /* a group that spans workers (world >= 2; 0: it lives here only): this worker's n_dp
     * devices are ranks rank_base.. of world; the leader (rank_base 0) listens at
     * rendezvous, decides at each step boundary and alone reports the members; a follower
     * applies what the leader broadcasts and sends only its devices' PROGRESS */
    int world, rank_base;
    bool follower;
    char rendezvous[FB_WIRE_NAME_MAX * 2 + 8];
    unsigned char token[FB_COMM_TOKEN_BYTES];
    uint64_t members_hash; /* of the ASSIGN's job ids in order, which every worker compares */

    struct group *next; /* the main thread's list */
} group;

/* What a group thread hands the main thread (by pointer, through its PUSH socket). */
typedef enum out_kind { OUT_EVENT, OUT_PROGRESS, OUT_EXIT } out_kind;

typedef struct outmsg {
    out_kind kind;
    group *g;      /* the sender; NULL for events the main thread makes */
    fb_wire_msg w; /* EVENT or PROGRESS; seq is set by the main thread */
    void *blob;    /* the event's file, blob_len bytes, malloc'd */
    size_t blob_len;
    struct outmsg *next; /* outbox order, then a group thread's pending list */
} outmsg;

struct fb_agent {
    char server[1024];
    char server_key[41], public_key[41], secret_key[41];
    char name[FB_WIRE_NAME_MAX + 1];
    char data_dir[1024];
    int threads, heartbeat_ms, progress_ms;
    uint64_t outbox_limit;
    int n_devices;
    agent_device dev[FB_WIRE_MAX_DEVICES];
    /* the device turns of every group: their order and shares (turns.h) */
    fb_turns_sync turns;
    bool turns_init;
    const char *backend;
    bool sync_bn; /* --sync-batchnorm */
    /* --comm-addr ("" = none) and --comm-timeout-ms */
    char comm_host[FB_WIRE_NAME_MAX + 1];
    int comm_port_lo, comm_port_hi, comm_timeout_ms;
    int device_turns; /* FB_AGENT_TURNS_* */
    char hook_dir[1024]; /* --test-step-hook, "" = none (tests only) */
    /* --test-step-ms (tests only): scripted step times by job name or id ("*": any other) */
    bool scripted;
    struct script_entry {
        char key[FB_SPEC_NAME_MAX + 1];
        int64_t ns;
    } script[FB_AGENT_SCRIPT_MAX];
    int n_script;
    int turns_log; /* scripted with a step hook: HOOK_DIR/turns.log, the turns' decisions; -1 */

    void *ctx, *dealer, *pull, *mon;
    char inproc[64], mon_ep[64];
    atomic_bool drain_req;

    /* the main thread's */
    bool welcomed, draining, drain_sent;
    bool connected, auth_logged; /* what the connection monitor last said */
    char worker_id[FB_WIRE_ID_LEN + 1];
    double last_rx, last_beat, drained_at;
    bool drain_timed; /* drained_at is set (a manual clock may read 0) */
    group *groups;
    uint64_t next_ticket;
    outmsg *outbox, *outbox_tail, *unsent; /* unsent: the first one not yet on the wire */
    int64_t next_seq;
    uint64_t outbox_bytes;
    double last_outbox_warn;

    pthread_mutex_t ds_mu;
    bool ds_mu_init;
    dataset_ref *datasets;
};

static void outmsg_free(outmsg *o)
{
    if (!o) return;
    fb_wire_msg_free(&o->w);
    free(o->blob);
    free(o);
}

/* A zeroed message of a kind; the caller fills it.  NULL when out of memory. */
static outmsg *outmsg_new(out_kind kind, group *g)
{
    outmsg *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->kind = kind;
    o->g = g;
    return o;
}

/* An EVENT about job_id of group (id, generation); unknown numbers are NaN. */
static outmsg *event_new(group *g, const char *group_id, int64_t generation,
                         fb_wire_event_kind kind, const char *job_id, int64_t step)
{
    outmsg *o = outmsg_new(OUT_EVENT, g);
    if (!o) return NULL;
    o->w.type = FB_WIRE_EVENT;
    snprintf(o->w.group_id, sizeof o->w.group_id, "%s", group_id);
    o->w.generation = generation;
    o->w.event = kind;
    snprintf(o->w.job_id, sizeof o->w.job_id, "%s", job_id);
    o->w.step = step;
    o->w.loss = NAN;
    o->w.accuracy = NAN;
    o->w.test_loss = o->w.test_accuracy = NAN;
    return o;
}

/*
 * Sets an event's text.  Texts quote what came from outside (spec fields,
 * file names) and are cut at FB_WIRE_TEXT_MAX bytes, possibly inside a UTF-8
 * sequence, which the encoder would refuse; so every byte outside printable
 * ASCII becomes '?'.  An event that cannot be encoded would never be sent.
 */
static void event_text(outmsg *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void event_text(outmsg *o, const char *fmt, ...)
{
    if (!o) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->w.text, sizeof o->w.text, fmt, ap);
    va_end(ap);
    for (char *p = o->w.text; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) *p = '?';
}

/* ---- the dataset cache --------------------------------------------------------------------- */

/* Loads a dataset's train and (when there is one) test split into memory. */
static int dataset_load(fb_agent *a, dataset_ref *r, char *msg, size_t cap)
{
    char dir[2048], m2[1024];
    if (r->tenant[0])
        snprintf(r->data_dir, sizeof r->data_dir, "%s/%s", a->data_dir, r->tenant);
    else
        snprintf(r->data_dir, sizeof r->data_dir, "%s", a->data_dir);
    int kind = fb_datadir_resolve(dir, sizeof dir, r->name, r->data_dir);
    if (kind < 0)
        return fb_errf(msg, cap, FB_ERR_DATA, "dataset %s: not a valid dataset name", r->name);
    struct stat st;
    if ((stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) && !r->tenant[0] &&
        strcmp(a->data_dir, FB_DATASET_DEFAULT_DIR) != 0) {
        /* a public dataset not in the data directory (which may be fuseboxd's datasets
         * directory, holding tenants' datasets only): the system's built-in ones */
        snprintf(r->data_dir, sizeof r->data_dir, "%s", FB_DATASET_DEFAULT_DIR);
        kind = fb_datadir_resolve(dir, sizeof dir, r->name, r->data_dir);
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return fb_errf(msg, cap, FB_ERR_NOT_FOUND,
                       "dataset %s is not in the worker's data directory (%s)%s", r->name,
                       a->data_dir, r->tenant[0] ? "" : " nor among the built-in datasets");
    int err;
    if (kind == 1) {
        r->shard = true;
        double held; /* each group's loader holds the same records out (fb_data_open_named) */
        if ((err = fb_datadir_load_val(&r->val, &held, dir, r->val_fraction, true, m2,
                                       sizeof m2)))
            return fb_errf(msg, cap, err, "dataset %s: %s", r->name, m2);
        err = fb_datadir_load_split(&r->test, dir, "test", m2, sizeof m2);
        if (err && err != FB_ERR_NOT_FOUND) {
            fb_dataset_free(&r->val);
            return fb_errf(msg, cap, err, "dataset %s: %s", r->name, m2);
        }
        r->has_test = err == FB_OK;
    } else {
        if ((err = fb_dataset_open_named(r->name, "train", r->data_dir, &r->train, m2,
                                         sizeof m2)))
            return fb_errf(msg, cap, err, "dataset %s: %s", r->name, m2);
        if ((err = fb_dataset_holdout(&r->train, &r->val, r->val_fraction, m2, sizeof m2)) ||
            (err = fb_dataset_open_named(r->name, "test", r->data_dir, &r->test, m2,
                                         sizeof m2))) {
            fb_dataset_free(&r->train);
            fb_dataset_free(&r->val);
            return fb_errf(msg, cap, err, "dataset %s: %s", r->name, m2);
        }
        r->has_test = true;
    }
    return FB_OK;
}

/* The named dataset, loaded on first use; NULL with msg filled when it cannot be. */
static dataset_ref *dataset_acquire(fb_agent *a, const char *tenant, const char *name,
                                    double val_fraction, char *msg, size_t cap)
{
    pthread_mutex_lock(&a->ds_mu);
    dataset_ref *r;
    for (r = a->datasets; r; r = r->next)
        if (strcmp(r->name, name) == 0 && strcmp(r->tenant, tenant) == 0 &&
            r->val_fraction == val_fraction)
            break;
    if (r) {
        r->refs++;
        pthread_mutex_unlock(&a->ds_mu);
        return r;
    }
    r = calloc(1, sizeof *r);
    if (!r) {
        fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
        pthread_mutex_unlock(&a->ds_mu);
        return NULL;
    }
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->tenant, sizeof r->tenant, "%s", tenant);
    r->val_fraction = val_fraction;
    /* loading under the lock: a second group on the same dataset waits for this load
     * instead of reading the files again */
    double t0 = now_ms();
    if (dataset_load(a, r, msg, cap)) {
        free(r);
        pthread_mutex_unlock(&a->ds_mu);
        return NULL;
    }
    r->refs = 1;
    r->next = a->datasets;
    a->datasets = r;
    pthread_mutex_unlock(&a->ds_mu);
    agent_log("dataset %s loaded in %.0f ms: %s, %lld validation and %lld test samples", name,
              now_ms() - t0,
              r->shard ? "shards (train split read by each array's loader)" : "in memory",
              (long long)r->val.n, (long long)(r->has_test ? r->test.n : 0));
    return r;
}

/* Drops a reference; the last one frees the data. */
static void dataset_release(fb_agent *a, dataset_ref *r)
{
    if (!r) return;
    pthread_mutex_lock(&a->ds_mu);
    if (--r->refs == 0) {
        for (dataset_ref **p = &a->datasets; *p; p = &(*p)->next)
            if (*p == r) {
                *p = r->next;
                break;
            }
        fb_dataset_free(&r->train);
        fb_dataset_free(&r->val);
        fb_dataset_free(&r->test);
        free(r);
    }
    pthread_mutex_unlock(&a->ds_mu);
}

/* ---- device turns ------------------------------------------------------------------------ */

static bool interrupted(const group *g)
{
    return atomic_load(&g->stop) || atomic_load(&g->drain);
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
static void turns_wake(fb_agent *a)
{
    fb_turns_sync_wake(&a->turns);
}

/* Scripted with a step hook: each decision of the turns as a line of HOOK_DIR/turns.log,
 * "EVENT GROUP AT_MS VALUE" (docs/worker.md, "Test clock and scripted step times"), so
 * that a test reads the order the turns were granted in.  Called under the turns' lock;
 * one write per line, which O_APPEND keeps whole. */
static void turn_logged(void *user, fb_turn_event ev, const fb_turn *t, int64_t at_ns,
                        double value)
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
        outmsg_free(o);
        return;
    }
    FB_TSAN_RELEASE(o);
    if (zmq_send(g->push, &o, sizeof o, 0) != (int)sizeof o) {
        agent_log("group %s: cannot hand a message to the main thread: %s", g->id,
                  zmq_strerror(errno));
        outmsg_free(o);
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
        outmsg *o = event_new(g, g->id, g->generation, FB_EV_FAILED, mb->job_id, steps_done(r));
        event_text(o, "%s", text);
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
        o = event_new(g, g->id, g->generation, FB_EV_EVALUATED, mb->job_id, ev->step);
        if (o) {
            o->w.loss = ev->loss;
            o->w.accuracy = ev->accuracy;
        }
        break;
    case FB_TRAIN_CHECKPOINT:
        o = event_new(g, g->id, g->generation, FB_EV_CHECKPOINTED, mb->job_id, ev->step);
        if (o && !copy_blob(o, ev->blob, ev->blob_len)) {
            /* the next checkpoint (or the server's last one) still covers the job */
            agent_log("group %s: out of memory; checkpoint of %s at step %lld not sent", g->id,
                      mb->job_id, (long long)ev->step);
            outmsg_free(o);
            return;
        }
        break;
    case FB_TRAIN_DONE:
        set_alive(g, mb, false);
        mb->final_report = true;
        mb->final_step = ev->step;
        o = event_new(g, g->id, g->generation, FB_EV_FINISHED, mb->job_id, ev->step);
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
        o = event_new(g, g->id, g->generation, FB_EV_FAILED, mb->job_id, ev->step);
        event_text(o, "%s", ev->text ? ev->text : "failed");
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
        event_text(o, "%s; no checkpoint: %s", what, msg);
        agent_log("group %s: %s left without a checkpoint (%s): %s", r->g->id, mb->job_id, what,
                  msg);
        return;
    }
    o->blob = buf;
    o->blob_len = len;
    o->w.blob = 1;
    event_text(o, "%s", what);
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
        outmsg *o = event_new(g, g->id, g->generation, FB_EV_DETACHED, mb->job_id, steps_done(r));
        /* the state is taken while the member is still in the session */
        if (keep)
            leave_with_state(r, mb, o, "left with its state on the server's request");
        else
            event_text(o, "detached on the server's request");
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
        outmsg *o = event_new(g, g->id, g->generation, FB_EV_DETACHED, mb->job_id, steps_done(r));
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
    outmsg *o = outmsg_new(OUT_PROGRESS, g);
    int n = 0;
    if (o) o->w.progress = calloc((size_t)g->n_members, sizeof *o->w.progress);
    if (!o || !o->w.progress) {
        outmsg_free(o);
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
            outmsg_free(o);
            return;
        }
    } else if (n == 0) {
        outmsg_free(o);
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
                       .loader = loader};
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
        outmsg *ev = event_new(g, g->id, g->generation, FB_EV_FAILED, mb->job_id, g->start_step);
        if (mb->has_resume) {
            event_text(ev, "the checkpoint does not restore: %s", msg);
        } else {
            event_text(ev, "init: the weights of job %s do not fit this model: %s",
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
        outmsg_free(o);
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
static int span_exchange(runner *r, bool hold, int *cmd, char *msg, size_t cap)
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
    int err = fb_session_broadcast(r->s, v, n, msg, cap);
    if (err) return err;
    if (v[CV_MAGIC] != SPAN_MAGIC)
        return fb_errf(msg, cap, FB_ERR_IO, "the leader's control message is not one");
    if (v[CV_STEP] != fb_session_steps_done(r->s))
        return fb_errf(msg, cap, FB_ERR_IO, "the leader is at step %lld, this worker at %lld",
                       (long long)v[CV_STEP], (long long)fb_session_steps_done(r->s));
    if ((uint64_t)v[CV_MEMBERS] != g->members_hash)
        return fb_errf(msg, cap, FB_ERR_IO,
                       "the leader's assignment lists other members than this worker's");
    *cmd = (int)v[CV_CMD];
    if (!g->follower || (*cmd != SPAN_GO && *cmd != SPAN_HOLD)) return FB_OK;
    memcpy(&share, &v[CV_SHARE], sizeof share);
    char why[128];
    if (*cmd == SPAN_GO && share > 0 && share <= 1)
        fb_turns_sync_set_share(&g->a->turns, &g->turn, share, why, sizeof why);
    if (v[CV_HAS_SPLIT]) {
        if ((err = fb_session_set_split(r->s, v + CV_SPLIT, g->world, msg, cap))) return err;
        agent_log("group %s: the leader's batch split from step %lld", g->id,
                  (long long)fb_session_steps_done(r->s));
    }
    for (int i = 0; i < g->n_members; i++) {
        member *mb = &g->m[i];
        bool here = mb->sidx >= 0 && fb_session_has(r->s, mb->sidx);
        bool there = ((uint64_t)bits[i / 64] >> (i % 64)) & 1;
        if (there && !here)
            return fb_errf(msg, cap, FB_ERR_IO, "member %s trains on the leader but no longer here",
                           mb->job_id);
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
    double now = now_ms();
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
static int train_step(runner *r, bool first, double t1, char *msg, size_t cap)
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
    int err = fb_session_step(r->s, msg, cap);
    double t2 = now_ms();
    turns_release(g, t2 - t1);
    /* scripted: the step ended when the clock reached its end, which the release waited for */
    if (g->a->scripted) t2 = now_ms();
    r->samples += (double)batch * size;
    pthread_mutex_lock(&g->mu);
    g->steps_done = fb_session_steps_done(r->s);
    pthread_mutex_unlock(&g->mu);
    if (first) {
        for (int i = 0; i < g->n_members; i++) {
            member *mb = &g->m[i];
            if (!mb->started) continue;
            outmsg *o =
                event_new(g, g->id, g->generation, FB_EV_STARTED, mb->job_id, g->start_step + 1);
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
    r->last_progress = now_ms();
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
        double t0 = now_ms();
        bool turn = turns_acquire(g);
        double t1 = now_ms();
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
    r->last_progress = now_ms();
    fb_session_take_times(r->s);
    while (!fb_session_done(r->s)) {
        if (g->follower && atomic_load(&g->stop)) return;
        /* the leader alone reads the test step hook and holds every rank with it */
        bool hold = !g->follower && !interrupted(g) && hook_holds(r);
        /* a leader asked to stop or drain still tells the others, without its turn */
        bool turn = false;
        double t0 = now_ms();
        if (!interrupted(g)) turn = turns_acquire(g);
        double t1 = now_ms();
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
            if (turn) turns_release(g, now_ms() - t1);
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
    double t0 = now_ms();
    int err = fb_comm_tcp_new(g->n_dp, g->rank_base, g->world, g->rendezvous, NULL, g->token,
                              g->a->comm_timeout_ms, &r->comm, msg, sizeof msg);
    if (err) {
        span_fault(r, g->follower ? "joining the leader" : "the rendezvous", msg);
        return false;
    }
    agent_log("group %s: ranks %d..%d of %d joined at %s in %.0f ms (%s)", g->id, g->rank_base,
              g->rank_base + g->n_dp - 1, g->world, g->rendezvous, now_ms() - t0,
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
              g->rank_base + g->n_dp - 1, g->world, now_ms() - t0);
    return true;
}

static void *group_thread(void *arg)
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
    dataset_ref *ds = joined ? dataset_acquire(a, g->dataset_tenant, g->source, val_fraction,
                                               msg, sizeof msg)
                             : NULL;
    fb_loader *loader = NULL;
    fb_dataset shard_train = {0}, unused_val = {0}, unused = {0};
    bool ready = ds != NULL;
    if (ready && ds->shard && g->n_sess > 0) {
        /* this array's own loader, positioned at its start step */
        const fb_job_spec *s0 = &g->m[g->by_sidx[0]].spec;
        fb_data_source_opts so = {.batch_size = s0->batch_size, .shuffle = s0->shuffle,
                                  .data_seed = s0->data_seed, .start_step = g->start_step,
                                  .val_fraction = s0->val_fraction};
        ready = fb_data_open_named(&shard_train, &unused_val, &unused, &loader, g->source,
                                   ds->data_dir, &so, msg, sizeof msg) == FB_OK;
    }
    if (!joined) {
        /* span_fault said why */
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
    dataset_release(a, ds);
    outmsg *bye = g->bye;
    FB_TSAN_RELEASE(bye);
    if (zmq_send(g->push, &bye, sizeof bye, 0) != (int)sizeof bye)
        agent_log("group %s: cannot report its end: %s", g->id, zmq_strerror(errno));
    zmq_close(g->push);
    return NULL;
}

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
static void outbox_remove(fb_agent *a, outmsg *prev, outmsg *o)
{
    if (prev)
        prev->next = o->next;
    else
        a->outbox = o->next;
    if (a->outbox_tail == o) a->outbox_tail = prev;
    if (a->unsent == o) a->unsent = o->next;
    a->outbox_bytes -= o->blob_len;
    outmsg_free(o);
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
            outbox_remove(a, prev, o);
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
                outbox_remove(a, prev, o);
            } else {
                prev = o;
            }
            o = next;
        }
    }
    double now = now_ms();
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
            outbox_remove(a, prev, o);
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
static void stop_group(fb_agent *a, group *g)
{
    atomic_store(&g->stop, true);
    turns_wake(a);
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
        event_new(NULL, m->group_id, m->generation, FB_EV_FAILED, wm->job_id, wm->start_step);
    if (o) {
        char text[FB_WIRE_TEXT_MAX + 1];
        vsnprintf(text, sizeof text, fmt, ap);
        event_text(o, "%s", text);
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
    int rc = pthread_create(&g->th, NULL, group_thread, g);
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
        outmsg *o = event_new(NULL, m->group_id, m->generation, FB_EV_DETACHED,
                              m->members[i].job_id, m->members[i].start_step);
        event_text(o, "%s", why);
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

static void on_assign(fb_agent *a, const fb_wire_msg *m, zmq_msg_t *frames)
{
    if (a->draining) {
        agent_log("group %s: assignment refused, the worker is draining", m->group_id);
        refuse_members(a, m, "the worker is draining");
        return;
    }
    group *old = find_group(a, m->group_id);
    if (old && old->generation == m->generation) {
        agent_log("group %s generation %lld: already running; duplicate ASSIGN ignored",
                  m->group_id, (long long)m->generation);
        return;
    }
    for (int i = 0; i < m->n_members; i++)
        for (int j = 0; j < i; j++)
            if (strcmp(m->members[i].job_id, m->members[j].job_id) == 0) {
                agent_log("group %s: ASSIGN lists job %s twice; dropped", m->group_id,
                          m->members[i].job_id);
                return;
            }
    if (old) {
        agent_log("group %s: generation %lld replaces %lld", m->group_id, (long long)m->generation,
                  (long long)old->generation);
        stop_group(a, old);
    }
    if (m->world && !span_assign_ok(a, m)) return;
    for (int i = 0; i < m->n_group_devices; i++)
        if (m->group_devices[i] < 0 || m->group_devices[i] >= a->n_devices) {
            for (int k = 0; k < m->n_members; k++)
                fail_member(a, m, &m->members[k],
                            "device %d does not exist on worker %s (it has %d)",
                            m->group_devices[i], a->name, a->n_devices);
            return;
        }
    group *g = calloc(1, sizeof *g);
    if (!g || pthread_mutex_init(&g->mu, NULL) != 0) {
        free(g);
        agent_log("group %s: out of memory", m->group_id);
        fail_members(a, m, "out of memory on the worker");
        return;
    }
    g->a = a;
    snprintf(g->id, sizeof g->id, "%s", m->group_id);
    g->generation = m->generation;
    snprintf(g->dataset, sizeof g->dataset, "%s", m->dataset);
    snprintf(g->dataset_tenant, sizeof g->dataset_tenant, "%s", m->dataset_tenant);
    snprintf(g->source, sizeof g->source, "%s", m->builtin[0] ? m->builtin : m->dataset);
    g->dev = m->n_group_devices > 0 ? m->group_devices[0] : 0;
    double share = m->time_share > 0 ? m->time_share : 1;
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
    /* the devices of its turns: each of the layout's once (the wire allows the same device
     * twice in a layout), or its first only (a->device_turns; all devices of a worker are of
     * one kind) */
    bool all_turns = a->device_turns == FB_AGENT_TURNS_ALL ||
                     (a->device_turns == FB_AGENT_TURNS_AUTO &&
                      strcmp(a->dev[g->dev].info.kind, "cuda") == 0);
    int n_layout = all_turns ? g->n_dp * g->pipeline : 1;
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
        return;
    }
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
    if (g->n_sess == 0) {
        agent_log("group %s: no member can train; nothing started", m->group_id);
        group_free(g);
        return;
    }
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
    g->bye = outmsg_new(OUT_EXIT, g);
    g->push = g->bye ? zmq_socket(a->ctx, ZMQ_PUSH) : NULL;
    if (!g->push || zmq_connect(g->push, a->inproc) != 0 || start_thread(g) != 0) {
        agent_log("group %s: cannot start its thread", m->group_id);
        for (int i = 0; i < g->n_members; i++)
            if (g->m[i].sidx >= 0)
                fail_member(a, m, &m->members[i], "the worker cannot start a training thread");
        if (g->push) zmq_close(g->push);
        outmsg_free(g->bye);
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
        stop_group(a, g);
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
        turns_wake(a);
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
static int recv_dealer(fb_agent *a, char *msg, size_t cap)
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
                return fb_errf(msg, cap, FB_ERR_IO, "receiving from the server: %s",
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
        a->last_rx = now_ms();
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
        outmsg_free(o);
        break;
    case OUT_PROGRESS:
        /* also while registering again: a server that still knows the worker (only its
         * database is away) records the progress; one that does not drops it */
        if (!atomic_load(&g->stop) && (a->welcomed || a->worker_id[0]))
            send_wire(a, &o->w, NULL, 0);
        outmsg_free(o);
        break;
    case OUT_EVENT:
        if (g && atomic_load(&g->stop)) {
            outmsg_free(o); /* a stopped group reports nothing */
            break;
        }
        o->g = NULL;
        outbox_add(a, o);
        break;
    }
}

static void recv_pull(fb_agent *a)
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

int fb_agent_run(fb_agent *a, char *msg, size_t cap)
{
    double start = now_ms();
    a->last_rx = start;
    a->last_beat = start;
    send_hello(a);
    agent_log("worker %s: %d %s device%s, %d thread%s each; server %s", a->name, a->n_devices,
              a->backend, a->n_devices == 1 ? "" : "s", a->threads, a->threads == 1 ? "" : "s",
              a->server);
    for (;;) {
        double now = now_ms();
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
                return FB_OK;
            }
            if (now - a->drained_at >= FB_AGENT_DRAIN_WAIT_MS) {
                int n = 0;
                for (outmsg *o = a->outbox; o; o = o->next)
                    n++;
                agent_log("drained; %d event%s not acknowledged in time", n, n == 1 ? "" : "s");
                return FB_OK;
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
            return fb_errf(msg, cap, FB_ERR_IO, "zmq_poll: %s", zmq_strerror(errno));
        }
        if (items[1].revents & ZMQ_POLLIN) recv_pull(a);
        if (items[2].revents & ZMQ_POLLIN) recv_monitor(a);
        if (items[0].revents & ZMQ_POLLIN) {
            int err = recv_dealer(a, msg, cap);
            if (err) return err;
        }
    }
}

void fb_agent_drain(fb_agent *a)
{
    if (a) atomic_store(&a->drain_req, true);
}

/* ---- set-up and tear-down ---------------------------------------------------------------- */

/* The devices: every CUDA device when the build has CUDA and the machine a GPU
 * with a backend for it, else cpu_devices CPU devices that share the machine's
 * RAM evenly (device.h).  Each device keeps its own backend. */
static void find_devices(fb_agent *a, int cpu_devices)
{
    int64_t ram = (int64_t)sysconf(_SC_PHYS_PAGES) * (int64_t)sysconf(_SC_PAGESIZE);
    if (ram <= 0) ram = (int64_t)1 << 30;
    fb_device devs[FB_WIRE_MAX_DEVICES];
    char msg[256];
    int n = fb_devices_discover(cpu_devices, (uint64_t)ram, devs, FB_WIRE_MAX_DEVICES, msg,
                                sizeof msg);
    if (n < 1) {
        /* cpu_devices was checked by the caller; one CPU device is always there */
        agent_log("device discovery: %s; offering one CPU device", msg);
        n = fb_devices_discover(1, (uint64_t)ram, devs, 1, msg, sizeof msg);
    }
    a->backend = devs[0].kind == FB_DEVICE_CUDA ? "cuda" : "cpu";
    a->n_devices = n;
    for (int i = 0; i < n; i++) {
        fb_wire_device *d = &a->dev[i].info;
        d->idx = i;
        snprintf(d->kind, sizeof d->kind, "%s", devs[i].kind == FB_DEVICE_CUDA ? "cuda" : "cpu");
        snprintf(d->name, sizeof d->name, "%s", devs[i].name);
        d->memory_bytes = (int64_t)devs[i].memory_bytes;
        d->free_bytes = d->memory_bytes;
        a->dev[i].be = devs[i].be;
    }
    if (devs[0].kind == FB_DEVICE_CUDA)
        agent_log("%d CUDA device%s offered", n, n == 1 ? "" : "s");
}

static int set_opt(void *s, int opt, const void *v, size_t len, const char *what, char *msg,
                   size_t cap)
{
    if (zmq_setsockopt(s, opt, v, len) == 0) return FB_OK;
    return fb_errf(msg, cap, FB_ERR_IO, "cannot set %s on the socket: %s", what,
                   zmq_strerror(errno));
}

/* The DEALER towards the server: routing id = the worker's name, CURVE client. */
static int open_dealer(fb_agent *a, char *msg, size_t cap)
{
    a->dealer = zmq_socket(a->ctx, ZMQ_DEALER);
    if (!a->dealer)
        return fb_errf(msg, cap, FB_ERR_IO, "cannot create a socket: %s", zmq_strerror(errno));
    int ivl = 100, ivl_max = 1000, linger = DEALER_LINGER_MS, one = 1;
    int hb_ivl = 1000, hb_timeout = 5000;
    int64_t max_msg = (int64_t)FB_WIRE_MAX_BLOB;
    int err;
    if ((err = set_opt(a->dealer, ZMQ_ROUTING_ID, a->name, strlen(a->name), "the routing id", msg,
                       cap)) ||
        (err = set_opt(a->dealer, ZMQ_CURVE_SERVERKEY, a->server_key, 41, "the server key", msg,
                       cap)) ||
        (err = set_opt(a->dealer, ZMQ_CURVE_PUBLICKEY, a->public_key, 41, "the public key", msg,
                       cap)) ||
        (err = set_opt(a->dealer, ZMQ_CURVE_SECRETKEY, a->secret_key, 41, "the secret key", msg,
                       cap)) ||
        (err = set_opt(a->dealer, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl, "the reconnect interval",
                       msg, cap)) ||
        (err = set_opt(a->dealer, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max,
                       "the reconnect interval", msg, cap)) ||
        (err = set_opt(a->dealer, ZMQ_LINGER, &linger, sizeof linger, "linger", msg, cap)) ||
        /* queue only to a live connection: what cannot go now waits in the outbox */
        (err = set_opt(a->dealer, ZMQ_IMMEDIATE, &one, sizeof one, "immediate", msg, cap)) ||
        /* notice a dead peer even when no data flows, so that reconnecting starts */
        (err = set_opt(a->dealer, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl, "heartbeats", msg,
                       cap)) ||
        (err = set_opt(a->dealer, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout,
                       "heartbeats", msg, cap)) ||
        (err = set_opt(a->dealer, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg, "the size bound", msg,
                       cap)))
        return err;
    snprintf(a->mon_ep, sizeof a->mon_ep, "inproc://fusebox-agent-monitor-%p", (void *)a);
    int events = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                 ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL;
    if (zmq_socket_monitor(a->dealer, a->mon_ep, events) != 0 ||
        !(a->mon = zmq_socket(a->ctx, ZMQ_PAIR)) || zmq_connect(a->mon, a->mon_ep) != 0)
        return fb_errf(msg, cap, FB_ERR_IO, "cannot monitor the socket: %s", zmq_strerror(errno));
    if (zmq_connect(a->dealer, a->server) != 0)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE, "cannot connect to %s: %s", a->server,
                       zmq_strerror(errno));
    return FB_OK;
}

static int check_key(const char *key, const char *what, char *msg, size_t cap)
{
    if (!key || strlen(key) != 40)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE, "%s must be 40 characters of Z85", what);
    uint8_t bin[32];
    if (!zmq_z85_decode(bin, key))
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE, "%s is not valid Z85", what);
    return FB_OK;
}

/*
 * Parses --test-step-ms: "KEY=MS[,KEY=MS...]", at most FB_AGENT_SCRIPT_MAX entries, KEY
 * 1..FB_SPEC_NAME_MAX bytes without ',' or '=' (a job's name or id, or "*"), each once, MS
 * an integer in [1, 3600000].  FB_OK, or FB_ERR_OUT_OF_RANGE naming the entry.
 */
static int parse_script(const char *spec, struct script_entry *out, int *n_out, char *msg,
                        size_t cap)
{
    int n = 0;
    for (const char *p = spec;; p++) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        size_t klen = eq ? (size_t)(eq - p) : 0;
        if (!eq || klen == 0 || klen > FB_SPEC_NAME_MAX || len - klen - 1 == 0)
            return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                           "scripted step times: '%.*s' is not KEY=MS (KEY a job's name or id, "
                           "or *)",
                           (int)len, p);
        char num[16];
        size_t nlen = len - klen - 1;
        long long ms = -1;
        if (nlen < sizeof num) {
            memcpy(num, eq + 1, nlen);
            num[nlen] = '\0';
            char *e;
            errno = 0;
            ms = strtoll(num, &e, 10);
            if (errno || *e || num[0] < '0' || num[0] > '9') ms = -1;
        }
        if (ms < 1 || ms > 3600000)
            return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                           "scripted step times: '%.*s' needs an integer of ms in [1, 3600000]",
                           (int)len, p);
        if (n == FB_AGENT_SCRIPT_MAX)
            return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                           "scripted step times: more than %d entries", FB_AGENT_SCRIPT_MAX);
        for (int k = 0; k < n; k++)
            if (strlen(out[k].key) == klen && memcmp(out[k].key, p, klen) == 0)
                return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                               "scripted step times: '%.*s' is named twice", (int)klen, p);
        memcpy(out[n].key, p, klen);
        out[n].key[klen] = '\0';
        out[n].ns = ms * 1000000LL;
        n++;
        if (!end) break;
        p = end;
    }
    *n_out = n;
    return FB_OK;
}

int fb_agent_new(fb_agent **out, const fb_agent_opts *o, char *msg, size_t cap)
{
    int err;
    if (!o || !o->server || !o->server[0])
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE, "the server's endpoint is missing");
    if (strlen(o->server) >= sizeof((fb_agent *)0)->server)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE, "the server's endpoint is too long");
    if ((err = check_key(o->server_key, "the server key", msg, cap)) ||
        (err = check_key(o->public_key, "the public key", msg, cap)) ||
        (err = check_key(o->secret_key, "the secret key", msg, cap)))
        return err;
    if (o->name && !fb_agent_name_valid(o->name))
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                       "worker name '%s': use 1..%d of a-z 0-9 . _ -, starting with a letter "
                       "or digit",
                       o->name, FB_WIRE_NAME_MAX);
    int cpu_devices = o->cpu_devices ? o->cpu_devices : 1;
    if (cpu_devices < 1 || cpu_devices > FB_WIRE_MAX_DEVICES)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE, "CPU devices must be in [1, %d], not %d",
                       FB_WIRE_MAX_DEVICES, o->cpu_devices);
    if (o->threads_per_device < 0 || o->threads_per_device > 1024)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                       "threads per device must be in [1, 1024], not %d", o->threads_per_device);
    if (o->n_device_threads < 0 || o->n_device_threads > cpu_devices ||
        (o->n_device_threads > 0 && !o->device_threads))
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                       "device threads are given for %d devices; the worker offers %d CPU "
                       "device%s",
                       o->n_device_threads, cpu_devices, cpu_devices == 1 ? "" : "s");
    for (int i = 0; i < o->n_device_threads; i++)
        if (o->device_threads[i] < 1 || o->device_threads[i] > 1024)
            return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                           "threads of device %d must be in [1, 1024], not %d", i,
                           o->device_threads[i]);
    if (o->device_turns < FB_AGENT_TURNS_AUTO || o->device_turns > FB_AGENT_TURNS_FIRST)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE, "device turns must be auto, all or first");
    int hb = o->heartbeat_ms ? o->heartbeat_ms : FB_AGENT_DEFAULT_HEARTBEAT_MS;
    if (hb < 100 || hb > 60000)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                       "the heartbeat must be in [100, 60000] ms, not %d", o->heartbeat_ms);
    int pr = o->progress_ms ? o->progress_ms : FB_AGENT_DEFAULT_PROGRESS_MS;
    if (pr < 10 || pr > 3600000)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                       "the progress interval must be in [10, 3600000] ms, not %d", o->progress_ms);
    if (o->comm_host && !fb_wire_host_valid(o->comm_host))
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                       "the comm host '%s' is neither a host name nor an IP address (1..%d "
                       "characters, IPv6 without brackets)",
                       o->comm_host, FB_WIRE_NAME_MAX);
    if (o->comm_host &&
        (o->comm_port_lo < 1 || o->comm_port_hi > 65535 || o->comm_port_hi < o->comm_port_lo ||
         o->comm_port_hi - o->comm_port_lo >= FB_AGENT_COMM_PORTS))
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                       "the comm ports %d..%d: 1 <= low <= high <= 65535, at most %d ports",
                       o->comm_port_lo, o->comm_port_hi, FB_AGENT_COMM_PORTS);
    int ct = o->comm_timeout_ms ? o->comm_timeout_ms : FB_AGENT_DEFAULT_COMM_TIMEOUT_MS;
    if (ct < 1 || ct > 3600000)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                       "the comm timeout must be in [1, 3600000] ms, not %d", o->comm_timeout_ms);
    static const char *const hook_names[] = {"the test step hook", "the test clock",
                                             "the step time script"};
    const char *hooks[] = {o->test_step_hook, o->test_clock, o->test_step_ms};
    for (int i = 0; i < 3; i++) {
        /* a hook holds training at a file's word, or replaces time: only where a test says
         * it is one */
        const char *on = getenv(FB_AGENT_TEST_HOOKS_ENV);
        if (hooks[i] && (!on || strcmp(on, "1") != 0))
            return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                           "%s is for tests only: it needs %s=1 in the environment",
                           hook_names[i], FB_AGENT_TEST_HOOKS_ENV);
    }
    struct script_entry script[FB_AGENT_SCRIPT_MAX];
    int n_script = 0;
    if (o->test_step_ms && (err = parse_script(o->test_step_ms, script, &n_script, msg, cap)))
        return err;
    if (o->test_step_hook) {
        struct stat st;
        if (!o->test_step_hook[0] || strlen(o->test_step_hook) >= sizeof((fb_agent *)0)->hook_dir)
            return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                           "the test step hook's directory: 1..%zu bytes",
                           sizeof((fb_agent *)0)->hook_dir - 1);
        if (stat(o->test_step_hook, &st) != 0 || !S_ISDIR(st.st_mode))
            return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                           "the test step hook's directory %s is not a directory",
                           o->test_step_hook);
    }
    /* last of the checks: from here on the process reads that clock */
    if (o->test_clock && fb_clock_use_file(o->test_clock, msg, cap) != 0)
        return FB_ERR_OUT_OF_RANGE;
    const char *dd = o->data_dir;
    if (!dd || !dd[0]) dd = getenv(FB_DATASET_DIR_ENV);
    if (!dd || !dd[0]) dd = FB_DATASET_DEFAULT_DIR;

    fb_agent *a = calloc(1, sizeof *a);
    if (!a) return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    a->turns_log = -1;
    if (strlen(dd) >= sizeof a->data_dir) {
        err = fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE, "the data directory's path is too long");
        goto fail;
    }
    snprintf(a->data_dir, sizeof a->data_dir, "%s", dd);
    snprintf(a->server, sizeof a->server, "%s", o->server);
    snprintf(a->server_key, sizeof a->server_key, "%s", o->server_key);
    snprintf(a->public_key, sizeof a->public_key, "%s", o->public_key);
    snprintf(a->secret_key, sizeof a->secret_key, "%s", o->secret_key);
    if (o->name)
        snprintf(a->name, sizeof a->name, "%s", o->name);
    else
        fb_agent_default_name(a->name, sizeof a->name);
    a->heartbeat_ms = hb;
    a->progress_ms = pr;
    a->comm_timeout_ms = ct;
    a->device_turns = o->device_turns;
    if (o->test_step_hook) {
        snprintf(a->hook_dir, sizeof a->hook_dir, "%s", o->test_step_hook);
        agent_log("the test step hook is on (%s): arrays hold at the steps its files name",
                  a->hook_dir);
    }
    if (o->test_clock)
        agent_log("the test clock is on (%s): time moves only when the test moves it",
                  o->test_clock);
    if (o->test_step_ms) {
        a->scripted = true;
        memcpy(a->script, script, sizeof script);
        a->n_script = n_script;
        agent_log("scripted step times are on (%s)", o->test_step_ms);
        if (a->hook_dir[0]) {
            char path[1200];
            snprintf(path, sizeof path, "%s/turns.log", a->hook_dir);
            a->turns_log = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
            if (a->turns_log < 0) {
                err = fb_errf(msg, cap, FB_ERR_IO, "cannot create %s: %s", path, strerror(errno));
                goto fail;
            }
        }
    }
    if (o->comm_host) {
        snprintf(a->comm_host, sizeof a->comm_host, "%s", o->comm_host);
        a->comm_port_lo = o->comm_port_lo;
        a->comm_port_hi = o->comm_port_hi;
    }
    a->outbox_limit = o->outbox_bytes ? o->outbox_bytes : FB_AGENT_DEFAULT_OUTBOX_BYTES;
    a->next_seq = 1;
    atomic_init(&a->drain_req, false);
    if (pthread_mutex_init(&a->ds_mu, NULL) != 0) {
        err = fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    a->ds_mu_init = true;

    find_devices(a, cpu_devices);
    if (fb_turns_sync_init(&a->turns, a->n_devices, LEADER_WAIT_MS * 1000000LL, a->scripted,
                           a->turns_log >= 0 ? turn_logged : NULL, a) != FB_OK) {
        err = fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    a->turns_init = true;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    a->threads =
        o->threads_per_device ? o->threads_per_device : (int)(cores > 0 ? cores : 1) / a->n_devices;
    if (a->threads < 1) a->threads = 1;
    a->sync_bn = o->sync_batchnorm;
    /* one process-wide CPU backend: every group's math uses this many threads */
    fb_backend_set_threads(fb_backend_cpu(), a->threads);
    /* except on CPU devices with a count of their own: a copy of the backend that differs
     * only in its count; CUDA devices have no such setting */
    for (int i = 0; i < o->n_device_threads && i < a->n_devices; i++) {
        agent_device *ad = &a->dev[i];
        if (strcmp(ad->info.kind, "cpu") != 0) {
            agent_log("device %d is not a CPU device; its thread count is ignored", i);
            continue;
        }
        ad->own_be = *ad->be;
        ad->own_be.threads = o->device_threads[i];
        ad->be = &ad->own_be;
        agent_log("CPU device %d: %d math thread%s", i, o->device_threads[i],
                  o->device_threads[i] == 1 ? "" : "s");
    }
    /* pinned devices own consecutive cores, as many as their math threads */
    for (int i = 0, next = 0; o->pin_devices && i < a->n_devices; i++) {
        agent_device *ad = &a->dev[i];
        if (strcmp(ad->info.kind, "cpu") != 0) continue;
        ad->cpu_first = next;
        ad->cpu_count = ad->be->threads > 0 ? ad->be->threads : a->threads;
        next = (int)((next + ad->cpu_count) % (cores > 0 ? cores : 1));
        agent_log("CPU device %d: pinned to core%s %d..%d (modulo %ld)", i,
                  ad->cpu_count == 1 ? "" : "s", ad->cpu_first, ad->cpu_first + ad->cpu_count - 1,
                  cores > 0 ? cores : 1);
    }

    if (!zmq_has("curve")) {
        err = fb_errf(msg, cap, FB_ERR_UNSUPPORTED, "this libzmq has no CURVE security");
        goto fail;
    }
    /* ZeroMQ starts its threads with the first socket; they inherit this mask, so that
     * SIGTERM and SIGINT interrupt the loop's zmq_poll at once */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    a->ctx = zmq_ctx_new();
    a->pull = a->ctx ? zmq_socket(a->ctx, ZMQ_PULL) : NULL;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!a->ctx) {
        err =
            fb_errf(msg, cap, FB_ERR_IO, "cannot create a ZeroMQ context: %s", zmq_strerror(errno));
        goto fail;
    }
    snprintf(a->inproc, sizeof a->inproc, "inproc://fusebox-agent-%p", (void *)a);
    if (!a->pull || zmq_bind(a->pull, a->inproc) != 0) {
        err = fb_errf(msg, cap, FB_ERR_IO, "cannot bind %s: %s", a->inproc, zmq_strerror(errno));
        goto fail;
    }
    if ((err = open_dealer(a, msg, cap))) goto fail;
    *out = a;
    return FB_OK;
fail:
    fb_agent_free(a);
    return err;
}

void fb_agent_free(fb_agent *a)
{
    if (!a) return;
    /* groups still running (fb_agent_run failed): stop them and wait for their ends,
     * reading their messages meanwhile so that none blocks on a full queue */
    for (group *g = a->groups; g; g = g->next)
        stop_group(a, g);
    while (a->groups && a->pull) {
        zmq_pollitem_t it = {.socket = a->pull, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, POLL_MAX_MS) < 0 && errno != EINTR) break;
        recv_pull(a);
    }
    while (a->outbox)
        outbox_remove(a, NULL, a->outbox);
    if (a->dealer) {
        if (a->mon) zmq_socket_monitor(a->dealer, NULL, 0);
        zmq_close(a->dealer);
    }
    if (a->mon) zmq_close(a->mon);
    if (a->pull) zmq_close(a->pull);
    if (a->ctx) zmq_ctx_term(a->ctx);
    if (a->turns_init) fb_turns_sync_destroy(&a->turns);
    if (a->turns_log >= 0) close(a->turns_log);
    if (a->ds_mu_init) pthread_mutex_destroy(&a->ds_mu);
    free(a);
}
