/*
 * fusebox-worker: offers this machine's devices to fuseboxd and trains the
 * groups it assigns (workers/agent.h).  Also makes the worker's CURVE
 * keypair (--gen-key).  Every flag can come from a FUSEBOX_WORKER_*
 * environment variable instead; a flag wins over its variable.  SIGTERM
 * and SIGINT drain the worker: every member is checkpointed and reported,
 * then it exits 0.  docs/worker.md is the manual.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "wire.h"

#define EXIT_USAGE 2

static void usage(FILE *f)
{
    fprintf(f, "usage: fusebox-worker --server ENDPOINT --server-key FILE --key FILE [options]\n"
               "       fusebox-worker --gen-key FILE\n"
               "\n"
               "Offers this machine's devices to fuseboxd and trains the groups it assigns.\n"
               "\n"
               "options (each also from the environment variable in brackets):\n"
               "  --server ENDPOINT     fuseboxd's worker endpoint, e.g. tcp://10.0.0.1:5555\n"
               "                        [FUSEBOX_WORKER_SERVER]\n"
               "  --server-key FILE     the server's public key file [FUSEBOX_WORKER_SERVER_KEY]\n"
               "  --key FILE            this worker's keypair file [FUSEBOX_WORKER_KEY]\n"
               "  --name NAME           worker name, a-z 0-9 . _ - (default: the host name)\n"
               "                        [FUSEBOX_WORKER_NAME]\n"
               "  --cpu-devices N       CPU devices to offer (default 1);\n"
               "                        each gets an equal part of the RAM\n"
               "                        [FUSEBOX_WORKER_CPU_DEVICES]\n"
               "  --threads-per-device T  math threads of each device (default: cores / devices)\n"
               "                        [FUSEBOX_WORKER_THREADS_PER_DEVICE]\n"
               "  --device-threads T0,T1,...  math threads of CPU devices 0, 1, ... one by one,\n"
               "                        for machines whose cores are not alike; devices not\n"
               "                        listed keep --threads-per-device\n"
               "                        [FUSEBOX_WORKER_DEVICE_THREADS]\n"
               "  --pin-devices on|off  CPU devices own cores (as many as their threads, in\n"
               "                        device order) and compute only there (default off)\n"
               "                        [FUSEBOX_WORKER_PIN_DEVICES]\n"
               "  --data-dir DIR        where datasets live (default: $FUSEBOX_DATA_DIR, else\n"
               "                        /usr/share/datasets) [FUSEBOX_WORKER_DATA_DIR]\n"
               "  --stage-dir DIR       copy a shard dataset's training shards to this node-local\n"
               "                        directory before an array reads them, verified on every\n"
               "                        use (default: read in place); a copy that fails drains\n"
               "                        the worker, which exits 1 [FUSEBOX_WORKER_STAGE_DIR]\n"
               "  --stage-bytes N       bound of the --stage-dir cache in bytes (default 16 GiB)\n"
               "                        [FUSEBOX_WORKER_STAGE_BYTES]\n"
               "  --heartbeat-ms MS     heartbeat until the server sets one (default 1000)\n"
               "                        [FUSEBOX_WORKER_HEARTBEAT_MS]\n"
               "  --progress-ms MS      progress report cadence per group (default 1000)\n"
               "                        [FUSEBOX_WORKER_PROGRESS_MS]\n"
               "  --sync-batchnorm on|off  batch-norm statistics over the whole global batch\n"
               "                        in data-parallel groups on CPU devices (default off:\n"
               "                        each device's own) [FUSEBOX_WORKER_SYNC_BATCHNORM]\n"
               "  --comm-addr HOST:LO[-HI]  where the other workers of an array that spans\n"
               "                        workers reach this one: a host name or IP address\n"
               "                        (IPv6 in brackets) and the ports (at most 1024) the\n"
               "                        server picks a rendezvous port from when this worker\n"
               "                        leads one (default: none; the worker then takes no\n"
               "                        part in spanning arrays) [FUSEBOX_WORKER_COMM_ADDR]\n"
               "  --comm-timeout-ms MS  how long the rendezvous and each sum of a spanning\n"
               "                        array wait for the other workers (default 60000)\n"
               "                        [FUSEBOX_WORKER_COMM_TIMEOUT_MS]\n"
               "  --device-turns auto|all|first  which devices a group on several takes its\n"
               "                        turn on for a step: all (a device serves one group at\n"
               "                        a time), or the first, sharing the others (default\n"
               "                        auto: all on CUDA devices, the first on CPU devices)\n"
               "                        [FUSEBOX_WORKER_DEVICE_TURNS]\n"
               "  --test-step-hook DIR  for tests only: hold arrays at the steps that files in\n"
               "                        DIR name (docs/worker.md); refused unless the\n"
               "                        environment has FUSEBOX_TEST_HOOKS=1\n"
               "                        [FUSEBOX_WORKER_TEST_STEP_HOOK]\n"
               "  --test-clock FILE     for tests only: read time from the clock file FILE\n"
               "                        (8 bytes, nanoseconds) that the test moves, instead of\n"
               "                        the monotonic clock; same rule\n"
               "                        [FUSEBOX_WORKER_TEST_CLOCK]\n"
               "  --test-step-ms KEY=MS[,KEY=MS...]  for tests only: each step of an array of\n"
               "                        job KEY (a name or id; * for any other) lasts exactly\n"
               "                        MS on the clock, and turns follow the script alone\n"
               "                        (docs/worker.md); same rule [FUSEBOX_WORKER_TEST_STEP_MS]\n"
               "  --gen-key FILE        write a new keypair to FILE (never overwrites), print its\n"
               "                        public key for the server's allow-list, and exit\n"
               "                        [FUSEBOX_WORKER_GEN_KEY]\n"
               "  --version             print the version and exit\n"
               "  -h, --help            this text\n"
               "\n"
               "SIGTERM or SIGINT drains the worker: every member is checkpointed and reported.\n");
}

static fb_agent *g_agent;

static void on_signal(int sig)
{
    (void)sig;
    fb_agent_drain(g_agent);
}

/* A comma-separated list of 1..cap integers in [lo, hi] into out; -1 when s is not one. */
static int parse_int_list(const char *s, int lo, int hi, int *out, int cap, int *n)
{
    int k = 0;
    for (const char *p = s;; p++) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || (*end && *end != ',') || v < lo || v > hi || k == cap) return -1;
        if (*p == '+' || *p == ' ' || *p == '\t') return -1;
        out[k++] = (int)v;
        if (!*end) break;
        p = end;
    }
    *n = k;
    return 0;
}

/* An integer in [lo, hi]; -1 when s is not one. */
static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

enum {
    OPT_SERVER,
    OPT_SERVER_KEY,
    OPT_KEY,
    OPT_NAME,
    OPT_CPU_DEVICES,
    OPT_THREADS,
    OPT_DATA_DIR,
    OPT_HEARTBEAT,
    OPT_PROGRESS,
    OPT_GEN_KEY,
    OPT_SYNC_BN,
    OPT_DEVICE_THREADS,
    OPT_PIN_DEVICES,
    OPT_COMM_ADDR,
    OPT_COMM_TIMEOUT,
    OPT_DEVICE_TURNS,
    OPT_TEST_STEP_HOOK,
    OPT_TEST_CLOCK,
    OPT_TEST_STEP_MS,
    OPT_STAGE_DIR,
    OPT_STAGE_BYTES,
    OPT_COUNT
};

/* Each flag's name and its environment variable, in the order of the enum. */
static const struct {
    const char *flag, *env;
} g_opts[OPT_COUNT] = {
    {"server", "FUSEBOX_WORKER_SERVER"},
    {"server-key", "FUSEBOX_WORKER_SERVER_KEY"},
    {"key", "FUSEBOX_WORKER_KEY"},
    {"name", "FUSEBOX_WORKER_NAME"},
    {"cpu-devices", "FUSEBOX_WORKER_CPU_DEVICES"},
    {"threads-per-device", "FUSEBOX_WORKER_THREADS_PER_DEVICE"},
    {"data-dir", "FUSEBOX_WORKER_DATA_DIR"},
    {"heartbeat-ms", "FUSEBOX_WORKER_HEARTBEAT_MS"},
    {"progress-ms", "FUSEBOX_WORKER_PROGRESS_MS"},
    {"gen-key", "FUSEBOX_WORKER_GEN_KEY"},
    {"sync-batchnorm", "FUSEBOX_WORKER_SYNC_BATCHNORM"},
    {"device-threads", "FUSEBOX_WORKER_DEVICE_THREADS"},
    {"pin-devices", "FUSEBOX_WORKER_PIN_DEVICES"},
    {"comm-addr", "FUSEBOX_WORKER_COMM_ADDR"},
    {"comm-timeout-ms", "FUSEBOX_WORKER_COMM_TIMEOUT_MS"},
    {"device-turns", "FUSEBOX_WORKER_DEVICE_TURNS"},
    {"test-step-hook", "FUSEBOX_WORKER_TEST_STEP_HOOK"},
    {"test-clock", "FUSEBOX_WORKER_TEST_CLOCK"},
    {"test-step-ms", "FUSEBOX_WORKER_TEST_STEP_MS"},
    {"stage-dir", "FUSEBOX_WORKER_STAGE_DIR"},
    {"stage-bytes", "FUSEBOX_WORKER_STAGE_BYTES"},
};

/* Where a value came from, for messages about it. */
static void origin(char *buf, size_t cap, int opt, bool from_env)
{
    if (from_env)
        snprintf(buf, cap, "%s", g_opts[opt].env);
    else
        snprintf(buf, cap, "--%s", g_opts[opt].flag);
}

static int gen_key(const char *path)
{
    char msg[1024], pub[41];
    int err = fb_wire_key_generate(path, msg, sizeof msg);
    if (!err) err = fb_wire_key_load(path, pub, NULL, msg, sizeof msg);
    if (err) {
        fprintf(stderr, "fusebox-worker: %s (%s)\n", msg, fb_err_code(err));
        return 1;
    }
    printf("%s\n", pub);
    fflush(stdout);
    fprintf(stderr,
            "fusebox-worker: keypair written to %s; add the public key above to the "
            "server's list of allowed workers\n",
            path);
    return 0;
}

/* What the command line and the environment say, and the buffers the agent's options point
 * into while it runs. */
struct args {
    const char *val[OPT_COUNT];
    bool from_env[OPT_COUNT];
    int device_threads[FB_WIRE_MAX_DEVICES];
    char comm_host[FB_WIRE_NAME_MAX + 1];
    char server_pub[41], pub[41], sec[41];
};

/* The flags, then the environment for each one not given: A->val[opt] and where it came from.
 * Returns true when main should exit now with *rc (help, a usage error). */
static bool read_args(int argc, char **argv, struct args *A, int *rc)
{
    const char **val = A->val;
    bool *from_env = A->from_env;
    static const struct option long_opts[] = {
        {"server", required_argument, NULL, OPT_SERVER},
        {"server-key", required_argument, NULL, OPT_SERVER_KEY},
        {"key", required_argument, NULL, OPT_KEY},
        {"name", required_argument, NULL, OPT_NAME},
        {"cpu-devices", required_argument, NULL, OPT_CPU_DEVICES},
        {"threads-per-device", required_argument, NULL, OPT_THREADS},
        {"data-dir", required_argument, NULL, OPT_DATA_DIR},
        {"heartbeat-ms", required_argument, NULL, OPT_HEARTBEAT},
        {"progress-ms", required_argument, NULL, OPT_PROGRESS},
        {"gen-key", required_argument, NULL, OPT_GEN_KEY},
        {"sync-batchnorm", required_argument, NULL, OPT_SYNC_BN},
        {"device-threads", required_argument, NULL, OPT_DEVICE_THREADS},
        {"pin-devices", required_argument, NULL, OPT_PIN_DEVICES},
        {"comm-addr", required_argument, NULL, OPT_COMM_ADDR},
        {"comm-timeout-ms", required_argument, NULL, OPT_COMM_TIMEOUT},
        {"device-turns", required_argument, NULL, OPT_DEVICE_TURNS},
        {"test-step-hook", required_argument, NULL, OPT_TEST_STEP_HOOK},
        {"test-clock", required_argument, NULL, OPT_TEST_CLOCK},
        {"test-step-ms", required_argument, NULL, OPT_TEST_STEP_MS},
        {"stage-dir", required_argument, NULL, OPT_STAGE_DIR},
        {"stage-bytes", required_argument, NULL, OPT_STAGE_BYTES},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        if (opt == 'h') {
            usage(stdout);
            return *rc = 0, true;
        }
        if (opt == 'V') {
            printf("fusebox-worker %s\n", FB_VERSION_STRING);
            return *rc = 0, true;
        }
        if (opt < 0 || opt >= OPT_COUNT) {
            usage(stderr);
            return *rc = EXIT_USAGE, true;
        }
        val[opt] = optarg;
    }
    if (optind < argc) {
        fprintf(stderr, "fusebox-worker: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return *rc = EXIT_USAGE, true;
    }
    for (int i = 0; i < OPT_COUNT; i++) {
        const char *e = getenv(g_opts[i].env);
        if (!val[i] && e && e[0]) {
            val[i] = e;
            from_env[i] = true;
        }
    }
    char where[64];
    for (int i = 0; i < OPT_COUNT; i++)
        if (val[i] && !val[i][0]) {
            origin(where, sizeof where, i, from_env[i]);
            fprintf(stderr, "fusebox-worker: %s needs a value\n", where);
            return *rc = EXIT_USAGE, true;
        }
    if (val[OPT_GEN_KEY]) return *rc = gen_key(val[OPT_GEN_KEY]), true;

    static const int need[] = {OPT_SERVER, OPT_SERVER_KEY, OPT_KEY};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!val[need[i]]) {
            fprintf(stderr, "fusebox-worker: --%s (or %s) is required\n", g_opts[need[i]].flag,
                    g_opts[need[i]].env);
            usage(stderr);
            return *rc = EXIT_USAGE, true;
        }
    return false;
}

/* The agent's options from the values read: numbers, switches and names checked, the test
 * hooks refused without their environment switch, the keys loaded into A's buffers.
 * Returns 0, or EXIT_USAGE after saying what is wrong. */
static int agent_opts_from(struct args *A, fb_agent_opts *o)
{
    const char **val = A->val;
    const bool *from_env = A->from_env;
    char where[64], msg[1024];
    *o = (fb_agent_opts){
        .server = val[OPT_SERVER], .name = val[OPT_NAME], .data_dir = val[OPT_DATA_DIR]};
    static const struct {
        int opt, lo, hi;
    } ints[] = {{OPT_CPU_DEVICES, 1, FB_WIRE_MAX_DEVICES},
                {OPT_THREADS, 1, 1024},
                {OPT_HEARTBEAT, 100, 60000},
                {OPT_PROGRESS, 10, 3600000},
                {OPT_COMM_TIMEOUT, 1, 3600000}};
    int *dst[] = {&o->cpu_devices, &o->threads_per_device, &o->heartbeat_ms, &o->progress_ms,
                  &o->comm_timeout_ms};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        int k = ints[i].opt;
        if (val[k] && parse_int(val[k], ints[i].lo, ints[i].hi, dst[i])) {
            origin(where, sizeof where, k, from_env[k]);
            fprintf(stderr, "fusebox-worker: %s needs an integer in [%d, %d], not '%s'\n", where,
                    ints[i].lo, ints[i].hi, val[k]);
            return EXIT_USAGE;
        }
    }
    o->stage_dir = val[OPT_STAGE_DIR];
    if (val[OPT_STAGE_BYTES]) {
        const char *v = val[OPT_STAGE_BYTES];
        char *end;
        errno = 0;
        unsigned long long b = strtoull(v, &end, 10);
        if (errno || end == v || *end || b == 0 || v[0] < '0' || v[0] > '9') {
            origin(where, sizeof where, OPT_STAGE_BYTES, from_env[OPT_STAGE_BYTES]);
            fprintf(stderr, "fusebox-worker: %s needs a positive integer of bytes, not '%s'\n",
                    where, v);
            return EXIT_USAGE;
        }
        if (!val[OPT_STAGE_DIR]) {
            origin(where, sizeof where, OPT_STAGE_BYTES, from_env[OPT_STAGE_BYTES]);
            fprintf(stderr, "fusebox-worker: %s bounds --stage-dir, which is not given\n", where);
            return EXIT_USAGE;
        }
        o->stage_bytes = b;
    }
    static const int onoff[] = {OPT_SYNC_BN, OPT_PIN_DEVICES};
    bool *onoff_dst[] = {&o->sync_batchnorm, &o->pin_devices};
    for (size_t i = 0; i < sizeof onoff / sizeof onoff[0]; i++) {
        int k = onoff[i];
        if (!val[k]) continue;
        if (strcmp(val[k], "on") == 0) {
            *onoff_dst[i] = true;
        } else if (strcmp(val[k], "off") != 0) {
            origin(where, sizeof where, k, from_env[k]);
            fprintf(stderr, "fusebox-worker: %s needs on or off, not '%s'\n", where, val[k]);
            return EXIT_USAGE;
        }
    }
    if (val[OPT_DEVICE_TURNS]) {
        static const char *const turns[] = {[FB_AGENT_TURNS_AUTO] = "auto",
                                            [FB_AGENT_TURNS_ALL] = "all",
                                            [FB_AGENT_TURNS_FIRST] = "first"};
        o->device_turns = -1;
        for (int i = 0; i < 3; i++)
            if (strcmp(val[OPT_DEVICE_TURNS], turns[i]) == 0) o->device_turns = i;
        if (o->device_turns < 0) {
            origin(where, sizeof where, OPT_DEVICE_TURNS, from_env[OPT_DEVICE_TURNS]);
            fprintf(stderr, "fusebox-worker: %s needs auto, all or first, not '%s'\n", where,
                    val[OPT_DEVICE_TURNS]);
            return EXIT_USAGE;
        }
    }
    if (val[OPT_DEVICE_THREADS]) {
        if (parse_int_list(val[OPT_DEVICE_THREADS], 1, 1024, A->device_threads, FB_WIRE_MAX_DEVICES,
                           &o->n_device_threads)) {
            origin(where, sizeof where, OPT_DEVICE_THREADS, from_env[OPT_DEVICE_THREADS]);
            fprintf(stderr,
                    "fusebox-worker: %s needs 1..%d comma-separated integers in [1, 1024], "
                    "not '%s'\n",
                    where, FB_WIRE_MAX_DEVICES, val[OPT_DEVICE_THREADS]);
            return EXIT_USAGE;
        }
        o->device_threads = A->device_threads;
    }
    if (val[OPT_COMM_ADDR]) {
        if (fb_agent_parse_comm_addr(val[OPT_COMM_ADDR], A->comm_host, sizeof A->comm_host,
                                     &o->comm_port_lo, &o->comm_port_hi, msg, sizeof msg)) {
            origin(where, sizeof where, OPT_COMM_ADDR, from_env[OPT_COMM_ADDR]);
            fprintf(stderr, "fusebox-worker: %s: %s\n", where, msg);
            return EXIT_USAGE;
        }
        o->comm_host = A->comm_host;
    }
    static const int test_hooks[] = {OPT_TEST_STEP_HOOK, OPT_TEST_CLOCK, OPT_TEST_STEP_MS};
    for (size_t i = 0; i < sizeof test_hooks / sizeof test_hooks[0]; i++) {
        /* a hook that holds training or replaces time must never be one stray flag away in
         * a deployment */
        int k = test_hooks[i];
        const char *on = getenv(FB_AGENT_TEST_HOOKS_ENV);
        if (val[k] && (!on || strcmp(on, "1") != 0)) {
            origin(where, sizeof where, k, from_env[k]);
            fprintf(stderr,
                    "fusebox-worker: %s is for tests only and needs %s=1 in the environment; "
                    "refusing to start\n",
                    where, FB_AGENT_TEST_HOOKS_ENV);
            return EXIT_USAGE;
        }
    }
    o->test_step_hook = val[OPT_TEST_STEP_HOOK];
    o->test_clock = val[OPT_TEST_CLOCK];
    o->test_step_ms = val[OPT_TEST_STEP_MS];
    if (o->name && !fb_agent_name_valid(o->name)) {
        origin(where, sizeof where, OPT_NAME, from_env[OPT_NAME]);
        fprintf(stderr,
                "fusebox-worker: %s '%s' is not a worker name: 1..63 of a-z 0-9 . _ -, "
                "starting with a letter or digit\n",
                where, o->name);
        return EXIT_USAGE;
    }

    int err = fb_wire_key_load(val[OPT_SERVER_KEY], A->server_pub, NULL, msg, sizeof msg);
    if (err) {
        fprintf(stderr, "fusebox-worker: server key: %s (%s)\n", msg, fb_err_code(err));
        return EXIT_USAGE;
    }
    err = fb_wire_key_load(val[OPT_KEY], A->pub, A->sec, msg, sizeof msg);
    if (err) {
        fprintf(stderr, "fusebox-worker: worker key: %s (%s)\n", msg, fb_err_code(err));
        return EXIT_USAGE;
    }
    o->server_key = A->server_pub;
    o->public_key = A->pub;
    o->secret_key = A->sec;

    return 0;
}

int main(int argc, char **argv)
{
    static struct args A;
    int rc;
    if (read_args(argc, argv, &A, &rc)) return rc;
    fb_agent_opts o;
    if ((rc = agent_opts_from(&A, &o))) return rc;

    char msg[1024];
    fb_agent *a = NULL;
    int err = fb_agent_new(&a, &o, msg, sizeof msg);
    if (err) {
        fprintf(stderr, "fusebox-worker: %s (%s)\n", msg, fb_err_code(err));
        return err == FB_ERR_OUT_OF_RANGE ? EXIT_USAGE : 1;
    }
    g_agent = a;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    err = fb_agent_run(a, msg, sizeof msg);
    if (err) fprintf(stderr, "fusebox-worker: %s (%s)\n", msg, fb_err_code(err));
    /* no handler may reach the agent while it is freed */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    g_agent = NULL;
    fb_agent_free(a);
    return err ? 1 : 0;
}
