/*
 * Flag and environment parsing for fuseboxd, driven by one table so that
 * --help, the environment names and the bounds cannot drift apart.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "errors.h"
#include "jobspec.h"
#include "paths.h"

/* the build tree's files (server/CMakeLists.txt): the defaults of a fuseboxd run where it
 * was built */
#ifndef FB_DEFAULT_SCHEMA_DIR
#define FB_DEFAULT_SCHEMA_DIR "schema"
#endif
#ifndef FB_DEFAULT_WEB_DIR
#define FB_DEFAULT_WEB_DIR ""
#endif
/* the build's fusebox-data (server/CMakeLists.txt); else found on PATH */
#ifndef FB_DEFAULT_DATA_TOOL
#define FB_DEFAULT_DATA_TOOL "fusebox-data"
#endif
/* the installed files, relative to the installed fuseboxd's directory (GNUInstallDirs:
 * bin/ and share/fusebox/); they win where they exist, so an installed fuseboxd needs no
 * path into a source tree */
#ifndef FB_INSTALLED_SCHEMA_DIR
#define FB_INSTALLED_SCHEMA_DIR "../share/fusebox/schema"
#endif
#ifndef FB_INSTALLED_WEB_DIR
#define FB_INSTALLED_WEB_DIR "../share/fusebox/web"
#endif
#define FB_INSTALLED_DATA_TOOL "fusebox-data"
/* where Debian's dataset-fashion-mnist package puts its files, as the
 * workers' IDX loader looks for them */
#define FB_DEFAULT_BUILTIN_DIR "/usr/share/datasets"

typedef enum opt_kind { OPT_STR, OPT_INT, OPT_SIZE, OPT_LEVEL } opt_kind;

typedef struct opt {
    const char *flag; /* without the leading dashes */
    const char *env;
    opt_kind kind;
    size_t offset;
    size_t cap;       /* OPT_STR: buffer size */
    long long lo, hi; /* OPT_INT, OPT_SIZE */
    const char *help;
} opt;

#define STR(f, e, field, h)                                                                        \
    {                                                                                              \
        f, e, OPT_STR, offsetof(fb_config, field), sizeof(((fb_config *)0)->field), 0, 0, h        \
    }
#define INT(f, e, field, lo, hi, h)                                                                \
    {                                                                                              \
        f, e, OPT_INT, offsetof(fb_config, field), 0, lo, hi, h                                    \
    }

static const opt opts[] = {
    STR("listen", "FUSEBOX_LISTEN", listen, "IPv4 address to listen on"),
    INT("port", "FUSEBOX_PORT", port, 0, 65535, "TCP port; 0 picks a free one (see --port-file)"),
    STR("port-file", "FUSEBOX_PORT_FILE", port_file,
        "write the bound port to this file once listening"),
    STR("database-url", "FUSEBOX_DATABASE_URL", database_url,
        "PostgreSQL URI or conninfo (required)"),
    STR("data-dir", "FUSEBOX_DATA_DIR", data_dir, "state directory; the admin key is written here"),
    STR("artifacts-dir", "FUSEBOX_ARTIFACTS_DIR", artifacts_dir,
        "checkpoints and models (default DATA_DIR/artifacts)"),
    STR("schema-dir", "FUSEBOX_SCHEMA_DIR", schema_dir, "directory of NNN_*.sql migrations"),
    STR("web-dir", "FUSEBOX_WEB_DIR", web_dir,
        "the dashboard's files, served at / and /static/ (empty: none)"),
    {"max-body-bytes", "FUSEBOX_MAX_BODY_BYTES", OPT_SIZE, offsetof(fb_config, max_body_bytes), 0,
     64, 1LL << 30, "largest request body accepted (413 above)"},
    INT("threads", "FUSEBOX_THREADS", threads, 1, 256,
        "HTTP worker threads (default: 1 per core, 2..32)"),
    INT("db-pool", "FUSEBOX_DB_POOL", db_pool, 1, 256,
        "PostgreSQL connections (default: as --threads)"),
    INT("max-connections", "FUSEBOX_MAX_CONNECTIONS", max_connections, 1, 65536,
        "concurrent HTTP connections"),
    INT("connection-timeout", "FUSEBOX_CONNECTION_TIMEOUT", connection_timeout_s, 1, 3600,
        "seconds an idle or stalled HTTP connection is kept"),
    INT("request-timeout-ms", "FUSEBOX_REQUEST_TIMEOUT_MS", request_timeout_ms, 10, 600000,
        "limit for each SQL statement of a request"),
    INT("db-wait-ms", "FUSEBOX_DB_WAIT_MS", db_wait_ms, 0, 600000,
        "how long a request waits for a database connection or a reconnect before 503"),
    INT("startup-wait", "FUSEBOX_STARTUP_WAIT", startup_wait_s, 0, 3600,
        "seconds to wait for PostgreSQL at start"),
    INT("json-max-depth", "FUSEBOX_JSON_MAX_DEPTH", json_max_depth, 2, 256,
        "deepest nesting of arrays and objects in a body"),
    INT("shutdown-timeout", "FUSEBOX_SHUTDOWN_TIMEOUT", shutdown_timeout_s, 0, 3600,
        "seconds in-flight requests get to finish after SIGTERM"),
    STR("worker-listen", "FUSEBOX_WORKER_LISTEN", worker_listen,
        "ZeroMQ endpoint workers connect to (port 0 picks a free one)"),
    STR("worker-port-file", "FUSEBOX_WORKER_PORT_FILE", worker_port_file,
        "write the bound worker port to this file"),
    STR("server-key", "FUSEBOX_SERVER_KEY", server_key,
        "CURVE keypair of the server, created on first start (default DATA_DIR/server.key)"),
    STR("worker-keys", "FUSEBOX_WORKER_KEYS", worker_keys,
        "public keys of the workers allowed to connect (default DATA_DIR/worker-keys)"),
    INT("heartbeat-ms", "FUSEBOX_HEARTBEAT_MS", heartbeat_ms, 100, 60000,
        "how often workers send a heartbeat"),
    INT("heartbeat-timeout-ms", "FUSEBOX_HEARTBEAT_TIMEOUT_MS", heartbeat_timeout_ms, 300, 600000,
        "a worker silent this long is lost and its jobs are re-queued"),
    INT("tick-ms", "FUSEBOX_TICK_MS", tick_ms, 10, 60000, "control-loop period"),
    INT("max-array", "FUSEBOX_MAX_ARRAY", max_array, 1, 1024,
        "members per fused training array; 1 disables fusion"),
    INT("max-groups-per-device", "FUSEBOX_MAX_GROUPS_PER_DEVICE", max_groups_per_device, 1, 64,
        "fused arrays that may share one device"),
    INT("rebalance-ms", "FUSEBOX_REBALANCE_MS", rebalance_ms, 0, 3600000,
        "fair-share period: time shares and batch splits of running arrays are revised this "
        "often (0: off, shares stay as placed)"),
    INT("control-lock-poll-ms", "FUSEBOX_CONTROL_LOCK_POLL_MS", control_lock_poll_ms, 10,
        600000,
        "a standby fuseboxd (another one's control loop holds the database's control lock) "
        "asks for the lock this often and takes over when it is free"),
    STR("datasets-dir", "FUSEBOX_DATASETS_DIR", datasets_dir,
        "tenants' datasets, DIR/<tenant id>/<name>/ (default DATA_DIR/datasets)"),
    STR("import-roots", "FUSEBOX_IMPORT_ROOTS", import_roots,
        "colon-separated absolute directories datasets may be imported from (empty: none)"),
    STR("data-tool", "FUSEBOX_DATA_TOOL", data_tool,
        "the fusebox-data executable that imports and verifies datasets"),
    STR("builtin-dir", "FUSEBOX_BUILTIN_DIR", builtin_dir,
        "where the built-in datasets' IDX files are (<dir>/fashion-mnist/)"),
    STR("public-datasets", "FUSEBOX_PUBLIC_DATASETS", public_datasets,
        "comma-separated datasets in every worker's data directory that any tenant may name "
        "(empty: the built-ins only)"),
    STR("test-clock", "FUSEBOX_TEST_CLOCK", test_clock,
        "for tests only: read the control loop's time from this clock file (8 bytes, "
        "nanoseconds) that the test moves; refused unless the environment has "
        "FUSEBOX_TEST_HOOKS=1"),
    {"log-level", "FUSEBOX_LOG_LEVEL", OPT_LEVEL, offsetof(fb_config, log_level), 0, 0, 0,
     "debug, info, warn or error"},
};
#define N_OPTS (sizeof opts / sizeof opts[0])

void fb_config_defaults(fb_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->listen, sizeof cfg->listen, "127.0.0.1");
    cfg->port = 8080;
    snprintf(cfg->data_dir, sizeof cfg->data_dir, "fuseboxd-data");
    if (!fb_path_beside_exe(FB_INSTALLED_SCHEMA_DIR, cfg->schema_dir, sizeof cfg->schema_dir))
        snprintf(cfg->schema_dir, sizeof cfg->schema_dir, "%s", FB_DEFAULT_SCHEMA_DIR);
    if (!fb_path_beside_exe(FB_INSTALLED_WEB_DIR, cfg->web_dir, sizeof cfg->web_dir))
        snprintf(cfg->web_dir, sizeof cfg->web_dir, "%s", FB_DEFAULT_WEB_DIR);
    cfg->max_body_bytes = 1 << 20;
    /* one HTTP thread and one connection per core: with PostgreSQL on the
     * same machine more only adds context switches between its backends and
     * the HTTP threads (bench/api: p99 of GET /v1/jobs/{id} 12 ms with 2 on
     * 2 cores, 31 ms with 4, 31 ms with 8); raise both for a remote database */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int per = cores < 2 ? 2 : cores > 32 ? 32 : (int)cores;
    cfg->threads = per;
    cfg->db_pool = per;
    cfg->max_connections = 1024;
    cfg->connection_timeout_s = 30;
    cfg->request_timeout_ms = 5000;
    cfg->db_wait_ms = 3000;
    cfg->startup_wait_s = 30;
    cfg->json_max_depth = 32;
    cfg->shutdown_timeout_s = 10;
    cfg->log_level = FB_LOG_INFO;
    snprintf(cfg->worker_listen, sizeof cfg->worker_listen, "tcp://127.0.0.1:5555");
    cfg->heartbeat_ms = 1000;
    cfg->heartbeat_timeout_ms = 5000;
    cfg->tick_ms = 500;
    cfg->max_array = 64;
    cfg->max_groups_per_device = 4;
    cfg->rebalance_ms = 5000;
    cfg->control_lock_poll_ms = 1000;
    if (!fb_path_beside_exe(FB_INSTALLED_DATA_TOOL, cfg->data_tool, sizeof cfg->data_tool))
        snprintf(cfg->data_tool, sizeof cfg->data_tool, "%s", FB_DEFAULT_DATA_TOOL);
    snprintf(cfg->builtin_dir, sizeof cfg->builtin_dir, "%s", FB_DEFAULT_BUILTIN_DIR);
}

static void default_text(const opt *o, char *buf, size_t cap)
{
    fb_config d;
    fb_config_defaults(&d);
    const char *base = (const char *)&d + o->offset;
    switch (o->kind) {
    case OPT_STR:
        snprintf(buf, cap, "%s", base[0] ? base : "-");
        break;
    case OPT_INT:
        snprintf(buf, cap, "%d", *(const int *)base);
        break;
    case OPT_SIZE:
        snprintf(buf, cap, "%zu", *(const size_t *)base);
        break;
    case OPT_LEVEL:
        snprintf(buf, cap, "info");
        break;
    }
}

void fb_config_usage(FILE *out)
{
    fprintf(out, "usage: fuseboxd [--flag value | --flag=value]...\n\n"
                 "fuseboxd serves fusebox's REST API (/v1) in front of PostgreSQL.\n"
                 "Every flag may also be given as an environment variable; flags win.\n\n");
    fprintf(out, "  %-22s %-28s %-18s %s\n", "flag", "environment", "default", "meaning");
    for (size_t i = 0; i < N_OPTS; i++) {
        char def[64];
        default_text(&opts[i], def, sizeof def);
        fprintf(out, "  --%-20s %-28s %-18s %s\n", opts[i].flag, opts[i].env, def, opts[i].help);
    }
    fprintf(out, "  --%-20s %-28s %-18s %s\n", "help", "", "", "print this text");
    fprintf(out, "  --%-20s %-28s %-18s %s\n", "version", "", "", "print the version");
    fprintf(out, "\nOn first start fuseboxd creates the admin tenant and writes its API key\n"
                 "to DATA_DIR/admin.key (mode 0600).  SIGTERM or SIGINT stop it gracefully.\n");
}

/* Stores one value into the field of o; errors name where it came from. */
static int set_opt(fb_config *cfg, const opt *o, const char *val, const char *from, char *msg,
                   size_t msg_cap)
{
    char *base = (char *)cfg + o->offset;
    switch (o->kind) {
    case OPT_STR: {
        size_t n = strlen(val);
        if (n >= o->cap)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s: value longer than %zu bytes",
                           from, o->cap - 1);
        memcpy(base, val, n + 1);
        return FB_OK;
    }
    case OPT_INT:
    case OPT_SIZE: {
        if (!val[0] || !(isdigit((unsigned char)val[0]) || val[0] == '-'))
            return fb_errf(msg, msg_cap, FB_ERR_WRONG_TYPE, "%s: \"%.64s\" is not an integer", from,
                           val);
        errno = 0;
        char *end = NULL;
        long long x = strtoll(val, &end, 10);
        if (errno || !end || *end)
            return fb_errf(msg, msg_cap, FB_ERR_WRONG_TYPE, "%s: \"%.64s\" is not an integer", from,
                           val);
        if (x < o->lo || x > o->hi)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "%s: %lld is out of range [%lld, %lld]", from, x, o->lo, o->hi);
        if (o->kind == OPT_INT)
            *(int *)base = (int)x;
        else
            *(size_t *)base = (size_t)x;
        return FB_OK;
    }
    case OPT_LEVEL: {
        fb_log_level lvl;
        if (!fb_log_level_parse(val, &lvl))
            return fb_errf(msg, msg_cap, FB_ERR_BAD_ENUM,
                           "%s: \"%.64s\" is not one of debug, info, warn, error", from, val);
        *(fb_log_level *)base = lvl;
        return FB_OK;
    }
    }
    return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "%s: unknown option kind", from);
}

/* A dataset name as job specs write it: ^[a-z0-9][a-z0-9._-]{0,63}$. */
static bool dataset_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-'))) return false;
    }
    return true;
}

/* Each public dataset is a dataset name: it becomes a directory under the workers' data
 * directory, so "..", a slash or an empty name would leave it. */
static int check_public_datasets(const char *list, char *msg, size_t msg_cap)
{
    for (const char *s = list; *s;) {
        size_t len = strcspn(s, ",");
        if (!dataset_name_ok(s, len))
            return fb_errf(msg, msg_cap, FB_ERR_BAD_NAME,
                           "--public-datasets: \"%.*s\" is not a dataset name (a-z or 0-9 "
                           "first, then a-z, 0-9, '.', '_', '-'; names separated by ',')",
                           (int)(len > 64 ? 64 : len), s);
        s += len;
        if (*s == ',' && !*++s)
            return fb_errf(msg, msg_cap, FB_ERR_BAD_NAME,
                           "--public-datasets: ends with ',' (an empty name)");
    }
    return FB_OK;
}

bool fb_config_dataset_public(const char *list, const char *name)
{
    if (fb_spec_dataset_builtin(name)) return true;
    size_t n = strlen(name);
    for (const char *s = list ? list : ""; *s;) {
        size_t len = strcspn(s, ",");
        if (len == n && strncmp(s, name, n) == 0) return true;
        s += len;
        if (*s == ',') s++;
    }
    return false;
}

/* Each import root is an absolute path; a relative one would depend on the
 * directory fuseboxd happens to start in. */
static int check_import_roots(const char *roots, char *msg, size_t msg_cap)
{
    int n = 0;
    for (const char *s = roots; *s;) {
        size_t len = strcspn(s, ":");
        if (len == 0 || s[0] != '/')
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "--import-roots: \"%.*s\" is not an absolute directory (roots are "
                           "separated by ':')",
                           (int)(len > 64 ? 64 : len), s);
        if (len >= FB_CONFIG_PATH_MAX)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "--import-roots: a root is too long");
        if (++n > FB_CONFIG_MAX_ROOTS)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "--import-roots: more than %d roots",
                           FB_CONFIG_MAX_ROOTS);
        s += len;
        if (*s == ':') {
            s++;
            if (!*s)
                return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                               "--import-roots: ends with ':' (an empty root)");
        }
    }
    return FB_OK;
}

/* A test hook (--test-clock, which stops the control loop's time) must never be one stray
 * flag away in a deployment: it needs FUSEBOX_TEST_HOOKS=1 exactly, as fusebox-worker's
 * --test-step-hook does.  from names where the value came from. */
static int check_test_hooks(const fb_config *cfg, const char *from, char *msg, size_t msg_cap)
{
    if (!cfg->test_clock[0]) return FB_OK;
    const char *on = getenv(FB_CONFIG_TEST_HOOKS_ENV);
    if (!on || strcmp(on, "1") != 0)
        return fb_errf(msg, msg_cap, FB_ERR_BAD_ENUM,
                       "%s is for tests only and needs %s=1 in the environment; refusing to "
                       "start",
                       from, FB_CONFIG_TEST_HOOKS_ENV);
    return FB_OK;
}

int fb_config_apply_test_clock(const fb_config *cfg, char *msg, size_t msg_cap)
{
    if (!cfg->test_clock[0]) return FB_OK;
    char why[FB_CONFIG_PATH_MAX + 128];
    if (fb_clock_use_file(cfg->test_clock, why, sizeof why) != 0)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "--test-clock: %s", why);
    return FB_OK;
}

int fb_config_parse(fb_config *cfg, int argc, char **argv, char *msg, size_t msg_cap)
{
    fb_config work = *cfg;
    const char *clock_from = "--test-clock"; /* where --test-clock's value came from */
    for (size_t i = 0; i < N_OPTS; i++) {
        const char *v = getenv(opts[i].env);
        if (v && v[0]) {
            int err = set_opt(&work, &opts[i], v, opts[i].env, msg, msg_cap);
            if (err) return err;
            if (opts[i].offset == offsetof(fb_config, test_clock)) clock_from = opts[i].env;
        }
    }
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fb_config_usage(stdout);
            return 1;
        }
        if (strcmp(arg, "--version") == 0) {
            printf("fuseboxd %s\n", FB_VERSION_STRING);
            return 1;
        }
        if (strncmp(arg, "--", 2) != 0)
            return fb_errf(msg, msg_cap, FB_ERR_BAD_ENUM,
                           "unexpected argument \"%.64s\" (see --help)", arg);
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        const opt *o = NULL;
        for (size_t i = 0; i < N_OPTS; i++)
            if (strlen(opts[i].flag) == name_len && strncmp(opts[i].flag, name, name_len) == 0)
                o = &opts[i];
        if (!o)
            return fb_errf(msg, msg_cap, FB_ERR_UNKNOWN_FIELD,
                           "unknown flag \"%.64s\" (see --help)", arg);
        const char *val = eq ? eq + 1 : NULL;
        if (!val) {
            if (a + 1 >= argc)
                return fb_errf(msg, msg_cap, FB_ERR_MISSING_FIELD, "--%s needs a value", o->flag);
            val = argv[++a];
        }
        char from[80];
        snprintf(from, sizeof from, "--%s", o->flag);
        int err = set_opt(&work, o, val, from, msg, msg_cap);
        if (err) return err;
        if (o->offset == offsetof(fb_config, test_clock)) clock_from = "--test-clock";
    }
    if (!work.database_url[0])
        return fb_errf(msg, msg_cap, FB_ERR_MISSING_FIELD,
                       "--database-url (or FUSEBOX_DATABASE_URL) is required");
    if (!work.data_dir[0])
        return fb_errf(msg, msg_cap, FB_ERR_MISSING_FIELD, "--data-dir must not be empty");
    if (!work.artifacts_dir[0]) {
        int n =
            snprintf(work.artifacts_dir, sizeof work.artifacts_dir, "%s/artifacts", work.data_dir);
        if (n < 0 || (size_t)n >= sizeof work.artifacts_dir)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "--data-dir is too long");
    }
    if (!work.server_key[0]) {
        int n = snprintf(work.server_key, sizeof work.server_key, "%s/server.key", work.data_dir);
        if (n < 0 || (size_t)n >= sizeof work.server_key)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "--data-dir is too long");
    }
    if (!work.worker_keys[0]) {
        int n =
            snprintf(work.worker_keys, sizeof work.worker_keys, "%s/worker-keys", work.data_dir);
        if (n < 0 || (size_t)n >= sizeof work.worker_keys)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "--data-dir is too long");
    }
    if (!work.worker_listen[0])
        return fb_errf(msg, msg_cap, FB_ERR_MISSING_FIELD, "--worker-listen must not be empty");
    if (work.heartbeat_timeout_ms < 2 * work.heartbeat_ms)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "--heartbeat-timeout-ms must be at least twice --heartbeat-ms");
    if (!work.datasets_dir[0]) {
        int n = snprintf(work.datasets_dir, sizeof work.datasets_dir, "%s/datasets", work.data_dir);
        if (n < 0 || (size_t)n >= sizeof work.datasets_dir)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "--data-dir is too long");
    }
    if (!work.data_tool[0])
        return fb_errf(msg, msg_cap, FB_ERR_MISSING_FIELD, "--data-tool must not be empty");
    if (!work.builtin_dir[0])
        return fb_errf(msg, msg_cap, FB_ERR_MISSING_FIELD, "--builtin-dir must not be empty");
    int err = check_import_roots(work.import_roots, msg, msg_cap);
    if (err) return err;
    if ((err = check_public_datasets(work.public_datasets, msg, msg_cap))) return err;
    if ((err = check_test_hooks(&work, clock_from, msg, msg_cap))) return err;
    *cfg = work;
    return FB_OK;
}
