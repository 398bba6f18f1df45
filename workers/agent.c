/*
 * The worker agent (agent.h): its public entry and set-up.  Here are the
 * names (worker names, the comm address), what every room of the agent uses
 * (the log, the clock, the messages a group thread or the main thread makes),
 * and fb_agent_new and fb_agent_free: the checks of the options, the devices
 * and their thread counts, the sockets.  The other rooms, behind agent_int.h
 * (which also says who owns what): the dataset cache (agent_data.c), the group
 * threads that train, spanning groups included (agent_group.c), and the main
 * thread's socket loop (agent_loop.c); the device turns are turns.c's.
 */
#include "agent.h"
#include "agent_int.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "clock.h"
#include "device.h"
#include "idx.h"

#define DEALER_LINGER_MS 2000 /* what close may spend sending what is still queued */
#define LEADER_WAIT_MS 5      /* device turns: how long a group keeps its place in line */

/* ---- logging and time ------------------------------------------------------------------ */

/* One line to stderr, with a UTC timestamp; formatted first so that lines from
 * different threads do not interleave. */
void agent_log(const char *fmt, ...)
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
double agent_now_ms(void)
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

/* ---- messages ---------------------------------------------------------------------------- */

void agent_outmsg_free(outmsg *o)
{
    if (!o) return;
    fb_wire_msg_free(&o->w);
    free(o->blob);
    free(o);
}

/* A zeroed message of a kind; the caller fills it.  NULL when out of memory. */
outmsg *agent_outmsg_new(out_kind kind, group *g)
{
    outmsg *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->kind = kind;
    o->g = g;
    return o;
}

/* An EVENT about job_id of group (id, generation); unknown numbers are NaN. */
outmsg *agent_event_new(group *g, const char *group_id, int64_t generation, fb_wire_event_kind kind,
                        const char *job_id, int64_t step)
{
    outmsg *o = agent_outmsg_new(OUT_EVENT, g);
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
void agent_event_text(outmsg *o, const char *fmt, ...)
{
    if (!o) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->w.text, sizeof o->w.text, fmt, ap);
    va_end(ap);
    for (char *p = o->w.text; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) *p = '?';
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
                   size_t msg_cap)
{
    if (zmq_setsockopt(s, opt, v, len) == 0) return FB_OK;
    return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot set %s on the socket: %s", what,
                   zmq_strerror(errno));
}

/* The DEALER towards the server: routing id = the worker's name, CURVE client. */
static int open_dealer(fb_agent *a, char *msg, size_t msg_cap)
{
    a->dealer = zmq_socket(a->ctx, ZMQ_DEALER);
    if (!a->dealer)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot create a socket: %s", zmq_strerror(errno));
    int ivl = 100, ivl_max = 1000, linger = DEALER_LINGER_MS, one = 1;
    int hb_ivl = 1000, hb_timeout = 5000;
    int64_t max_msg = (int64_t)FB_WIRE_MAX_BLOB;
    int err;
    if ((err = set_opt(a->dealer, ZMQ_ROUTING_ID, a->name, strlen(a->name), "the routing id", msg,
                       msg_cap)) ||
        (err = set_opt(a->dealer, ZMQ_CURVE_SERVERKEY, a->server_key, 41, "the server key", msg,
                       msg_cap)) ||
        (err = set_opt(a->dealer, ZMQ_CURVE_PUBLICKEY, a->public_key, 41, "the public key", msg,
                       msg_cap)) ||
        (err = set_opt(a->dealer, ZMQ_CURVE_SECRETKEY, a->secret_key, 41, "the secret key", msg,
                       msg_cap)) ||
        (err = set_opt(a->dealer, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl, "the reconnect interval",
                       msg, msg_cap)) ||
        (err = set_opt(a->dealer, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max,
                       "the reconnect interval", msg, msg_cap)) ||
        (err = set_opt(a->dealer, ZMQ_LINGER, &linger, sizeof linger, "linger", msg, msg_cap)) ||
        /* queue only to a live connection: what cannot go now waits in the outbox */
        (err = set_opt(a->dealer, ZMQ_IMMEDIATE, &one, sizeof one, "immediate", msg, msg_cap)) ||
        /* notice a dead peer even when no data flows, so that reconnecting starts */
        (err = set_opt(a->dealer, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl, "heartbeats", msg,
                       msg_cap)) ||
        (err = set_opt(a->dealer, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout,
                       "heartbeats", msg, msg_cap)) ||
        (err = set_opt(a->dealer, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg, "the size bound", msg,
                       msg_cap)))
        return err;
    snprintf(a->mon_ep, sizeof a->mon_ep, "inproc://fusebox-agent-monitor-%p", (void *)a);
    int events = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                 ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL;
    if (zmq_socket_monitor(a->dealer, a->mon_ep, events) != 0 ||
        !(a->mon = zmq_socket(a->ctx, ZMQ_PAIR)) || zmq_connect(a->mon, a->mon_ep) != 0)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot monitor the socket: %s",
                       zmq_strerror(errno));
    if (zmq_connect(a->dealer, a->server) != 0)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "cannot connect to %s: %s", a->server,
                       zmq_strerror(errno));
    return FB_OK;
}

static int check_key(const char *key, const char *what, char *msg, size_t msg_cap)
{
    if (!key || strlen(key) != 40)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s must be 40 characters of Z85", what);
    uint8_t bin[32];
    if (!zmq_z85_decode(bin, key))
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s is not valid Z85", what);
    return FB_OK;
}

/*
 * Parses --test-step-ms: "KEY=MS[,KEY=MS...]", at most FB_AGENT_SCRIPT_MAX entries, KEY
 * 1..FB_SPEC_NAME_MAX bytes without ',' or '=' (a job's name or id, or "*"), each once, MS
 * an integer in [1, 3600000].  FB_OK, or FB_ERR_OUT_OF_RANGE naming the entry.
 */
static int parse_script(const char *spec, struct script_entry *out, int *n_out, char *msg,
                        size_t msg_cap)
{
    int n = 0;
    for (const char *p = spec;; p++) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        size_t klen = eq ? (size_t)(eq - p) : 0;
        if (!eq || klen == 0 || klen > FB_SPEC_NAME_MAX || len - klen - 1 == 0)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
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
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "scripted step times: '%.*s' needs an integer of ms in [1, 3600000]",
                           (int)len, p);
        if (n == FB_AGENT_SCRIPT_MAX)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "scripted step times: more than %d entries", FB_AGENT_SCRIPT_MAX);
        for (int k = 0; k < n; k++)
            if (strlen(out[k].key) == klen && memcmp(out[k].key, p, klen) == 0)
                return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
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

/* fb_agent_new's options once checked, with their defaults filled in. */
typedef struct checked_opts {
    int cpu_devices, heartbeat_ms, progress_ms, comm_timeout_ms;
    struct script_entry script[FB_AGENT_SCRIPT_MAX]; /* --test-step-ms, parsed */
    int n_script;
} checked_opts;

/* Checks fb_agent_new's options, all but the test clock (which the caller turns on last),
 * into c.  FB_OK, or FB_ERR_OUT_OF_RANGE with msg naming the option. */
static int check_opts(const fb_agent_opts *o, checked_opts *c, char *msg, size_t msg_cap)
{
    int err;
    if (!o || !o->server || !o->server[0])
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "the server's endpoint is missing");
    if (strlen(o->server) >= sizeof((fb_agent *)0)->server)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "the server's endpoint is too long");
    if ((err = check_key(o->server_key, "the server key", msg, msg_cap)) ||
        (err = check_key(o->public_key, "the public key", msg, msg_cap)) ||
        (err = check_key(o->secret_key, "the secret key", msg, msg_cap)))
        return err;
    if (o->name && !fb_agent_name_valid(o->name))
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "worker name '%s': use 1..%d of a-z 0-9 . _ -, starting with a letter "
                       "or digit",
                       o->name, FB_WIRE_NAME_MAX);
    int cpu_devices = o->cpu_devices ? o->cpu_devices : 1;
    if (cpu_devices < 1 || cpu_devices > FB_WIRE_MAX_DEVICES)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "CPU devices must be in [1, %d], not %d",
                       FB_WIRE_MAX_DEVICES, o->cpu_devices);
    if (o->threads_per_device < 0 || o->threads_per_device > 1024)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "threads per device must be in [1, 1024], not %d", o->threads_per_device);
    if (o->n_device_threads < 0 || o->n_device_threads > cpu_devices ||
        (o->n_device_threads > 0 && !o->device_threads))
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "device threads are given for %d devices; the worker offers %d CPU "
                       "device%s",
                       o->n_device_threads, cpu_devices, cpu_devices == 1 ? "" : "s");
    for (int i = 0; i < o->n_device_threads; i++)
        if (o->device_threads[i] < 1 || o->device_threads[i] > 1024)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "threads of device %d must be in [1, 1024], not %d", i,
                           o->device_threads[i]);
    if (o->device_turns < FB_AGENT_TURNS_AUTO || o->device_turns > FB_AGENT_TURNS_FIRST)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "device turns must be auto, all or first");
    int hb = o->heartbeat_ms ? o->heartbeat_ms : FB_AGENT_DEFAULT_HEARTBEAT_MS;
    if (hb < 100 || hb > 60000)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "the heartbeat must be in [100, 60000] ms, not %d", o->heartbeat_ms);
    int pr = o->progress_ms ? o->progress_ms : FB_AGENT_DEFAULT_PROGRESS_MS;
    if (pr < 10 || pr > 3600000)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "the progress interval must be in [10, 3600000] ms, not %d", o->progress_ms);
    if (o->comm_host && !fb_wire_host_valid(o->comm_host))
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "the comm host '%s' is neither a host name nor an IP address (1..%d "
                       "characters, IPv6 without brackets)",
                       o->comm_host, FB_WIRE_NAME_MAX);
    if (o->comm_host &&
        (o->comm_port_lo < 1 || o->comm_port_hi > 65535 || o->comm_port_hi < o->comm_port_lo ||
         o->comm_port_hi - o->comm_port_lo >= FB_AGENT_COMM_PORTS))
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "the comm ports %d..%d: 1 <= low <= high <= 65535, at most %d ports",
                       o->comm_port_lo, o->comm_port_hi, FB_AGENT_COMM_PORTS);
    int ct = o->comm_timeout_ms ? o->comm_timeout_ms : FB_AGENT_DEFAULT_COMM_TIMEOUT_MS;
    if (ct < 1 || ct > 3600000)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "the comm timeout must be in [1, 3600000] ms, not %d", o->comm_timeout_ms);
    static const char *const hook_names[] = {"the test step hook", "the test clock",
                                             "the step time script"};
    const char *hooks[] = {o->test_step_hook, o->test_clock, o->test_step_ms};
    for (int i = 0; i < 3; i++) {
        /* a hook holds training at a file's word, or replaces time: only where a test says
         * it is one */
        const char *on = getenv(FB_AGENT_TEST_HOOKS_ENV);
        if (hooks[i] && (!on || strcmp(on, "1") != 0))
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "%s is for tests only: it needs %s=1 in the environment", hook_names[i],
                           FB_AGENT_TEST_HOOKS_ENV);
    }
    c->n_script = 0;
    if (o->test_step_ms &&
        (err = parse_script(o->test_step_ms, c->script, &c->n_script, msg, msg_cap)))
        return err;
    if (o->test_step_hook) {
        struct stat st;
        if (!o->test_step_hook[0] || strlen(o->test_step_hook) >= sizeof((fb_agent *)0)->hook_dir)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "the test step hook's directory: 1..%zu bytes",
                           sizeof((fb_agent *)0)->hook_dir - 1);
        if (stat(o->test_step_hook, &st) != 0 || !S_ISDIR(st.st_mode))
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "the test step hook's directory %s is not a directory",
                           o->test_step_hook);
    }
    c->cpu_devices = cpu_devices;
    c->heartbeat_ms = hb;
    c->progress_ms = pr;
    c->comm_timeout_ms = ct;
    return FB_OK;
}

/* The test hooks' part of the agent (tests only): the step hook's directory, the scripted
 * step times and, with both, the turns log.  FB_ERR_IO when that log cannot be made. */
static int set_test_hooks(fb_agent *a, const fb_agent_opts *o, const checked_opts *c, char *msg,
                          size_t msg_cap)
{
    if (o->test_step_hook) {
        snprintf(a->hook_dir, sizeof a->hook_dir, "%s", o->test_step_hook);
        agent_log("the test step hook is on (%s): arrays hold at the steps its files name",
                  a->hook_dir);
    }
    if (o->test_clock)
        agent_log("the test clock is on (%s): time moves only when the test moves it",
                  o->test_clock);
    if (!o->test_step_ms) return FB_OK;
    a->scripted = true;
    memcpy(a->script, c->script, sizeof c->script);
    a->n_script = c->n_script;
    agent_log("scripted step times are on (%s)", o->test_step_ms);
    if (!a->hook_dir[0]) return FB_OK;
    char path[1200];
    snprintf(path, sizeof path, "%s/turns.log", a->hook_dir);
    a->turns_log = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (a->turns_log < 0)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    return FB_OK;
}

/* The math threads of the devices, and their cores when the worker pins them.  cores is
 * the machine's count (or less than 1 when unknown).  FB_ERR_NOMEM when out of memory. */
static int set_device_threads(fb_agent *a, const fb_agent_opts *o, long cores, char *msg,
                              size_t msg_cap)
{
    a->threads =
        o->threads_per_device ? o->threads_per_device : (int)(cores > 0 ? cores : 1) / a->n_devices;
    if (a->threads < 1) a->threads = 1;
    /* one process-wide CPU backend: every group's math uses this many threads */
    fb_backend_set_threads(fb_backend_cpu(), a->threads);
    /* except on CPU devices with a count of their own: a clone of the backend that differs
     * only in its count; CUDA devices have no such setting */
    for (int i = 0; i < o->n_device_threads && i < a->n_devices; i++) {
        agent_device *ad = &a->dev[i];
        if (strcmp(ad->info.kind, "cpu") != 0) {
            agent_log("device %d is not a CPU device; its thread count is ignored", i);
            continue;
        }
        ad->own_be = fb_backend_clone_threads(ad->be, o->device_threads[i]);
        if (!ad->own_be) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        ad->be = ad->own_be;
        agent_log("CPU device %d: %d math thread%s", i, o->device_threads[i],
                  o->device_threads[i] == 1 ? "" : "s");
    }
    /* pinned devices own consecutive cores, as many as their math threads */
    for (int i = 0, next = 0; o->pin_devices && i < a->n_devices; i++) {
        agent_device *ad = &a->dev[i];
        if (strcmp(ad->info.kind, "cpu") != 0) continue;
        ad->cpu_first = next;
        ad->cpu_count = fb_backend_threads(ad->be) > 0 ? fb_backend_threads(ad->be) : a->threads;
        next = (int)((next + ad->cpu_count) % (cores > 0 ? cores : 1));
        agent_log("CPU device %d: pinned to core%s %d..%d (modulo %ld)", i,
                  ad->cpu_count == 1 ? "" : "s", ad->cpu_first, ad->cpu_first + ad->cpu_count - 1,
                  cores > 0 ? cores : 1);
    }
    return FB_OK;
}

/* The ZeroMQ context, the PULL the group threads send to, and the DEALER. */
static int open_sockets(fb_agent *a, char *msg, size_t msg_cap)
{
    if (!zmq_has("curve"))
        return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED, "this libzmq has no CURVE security");
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
    if (!a->ctx)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot create a ZeroMQ context: %s",
                       zmq_strerror(errno));
    snprintf(a->inproc, sizeof a->inproc, "inproc://fusebox-agent-%p", (void *)a);
    if (!a->pull || zmq_bind(a->pull, a->inproc) != 0)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot bind %s: %s", a->inproc,
                       zmq_strerror(errno));
    return open_dealer(a, msg, msg_cap);
}

int fb_agent_new(fb_agent **out, const fb_agent_opts *o, char *msg, size_t msg_cap)
{
    checked_opts c;
    int err = check_opts(o, &c, msg, msg_cap);
    if (err) return err;
    /* last of the checks: from here on the process reads that clock */
    if (o->test_clock && fb_clock_use_file(o->test_clock, msg, msg_cap) != 0)
        return FB_ERR_OUT_OF_RANGE;
    const char *dd = o->data_dir;
    if (!dd || !dd[0]) dd = getenv(FB_DATASET_DIR_ENV);
    if (!dd || !dd[0]) dd = FB_DATASET_DEFAULT_DIR;

    fb_agent *a = calloc(1, sizeof *a);
    if (!a) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    a->turns_log = -1;
    if (strlen(dd) >= sizeof a->data_dir) {
        err = fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "the data directory's path is too long");
        goto fail;
    }
    if (o->stage_dir && o->stage_dir[0]) {
        if (strlen(o->stage_dir) >= sizeof a->stage_dir) {
            err = fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                          "the staging directory's path is too long");
            goto fail;
        }
        snprintf(a->stage_dir, sizeof a->stage_dir, "%s", o->stage_dir);
        a->stage_bytes = o->stage_bytes ? o->stage_bytes : FB_AGENT_DEFAULT_STAGE_BYTES;
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
    a->heartbeat_ms = c.heartbeat_ms;
    a->progress_ms = c.progress_ms;
    a->comm_timeout_ms = c.comm_timeout_ms;
    a->device_turns = o->device_turns;
    if ((err = set_test_hooks(a, o, &c, msg, msg_cap))) goto fail;
    if (o->comm_host) {
        snprintf(a->comm_host, sizeof a->comm_host, "%s", o->comm_host);
        a->comm_port_lo = o->comm_port_lo;
        a->comm_port_hi = o->comm_port_hi;
    }
    a->outbox_limit = o->outbox_bytes ? o->outbox_bytes : FB_AGENT_DEFAULT_OUTBOX_BYTES;
    a->next_seq = 1;
    atomic_init(&a->stage_fault, false);
    atomic_init(&a->drain_req, false);
    if (pthread_mutex_init(&a->ds_mu, NULL) != 0) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    a->ds_mu_init = true;

    find_devices(a, c.cpu_devices);
    if (fb_turns_sync_init(&a->turns, a->n_devices, LEADER_WAIT_MS * 1000000LL, a->scripted,
                           a->turns_log >= 0 ? agent_turn_logged : NULL, a) != FB_OK) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    a->turns_init = true;
    a->sync_bn = o->sync_batchnorm;
    if ((err = set_device_threads(a, o, sysconf(_SC_NPROCESSORS_ONLN), msg, msg_cap)) ||
        (err = open_sockets(a, msg, msg_cap)))
        goto fail;
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
        agent_stop_group(a, g);
    while (a->groups && a->pull) {
        zmq_pollitem_t it = {.socket = a->pull, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, POLL_MAX_MS) < 0 && errno != EINTR) break;
        agent_recv_pull(a);
    }
    while (a->outbox)
        agent_outbox_remove(a, NULL, a->outbox);
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
    for (int i = 0; i < a->n_devices; i++)
        fb_backend_clone_free(a->dev[i].own_be);
    free(a);
}
