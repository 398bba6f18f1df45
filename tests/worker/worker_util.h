/*
 * Helpers of the worker tests: the test process plays fuseboxd.  It binds a
 * ROUTER on a free loopback port as a CURVE server, with a ZAP handler that
 * admits one worker public key, spawns the real fusebox-worker executable,
 * and talks the wire protocol to it.  Also: a synthetic shard dataset, job
 * specs, UUIDs, and comparison of safetensors model files.
 */
#ifndef FB_TESTS_WORKER_UTIL_H
#define FB_TESTS_WORKER_UTIL_H

#include "check.h"
#include "engine/engine_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "datadir.h"
#include "idx.h"
#include "jobspec.h"
#include "safetensors.h"
#include "wire.h"

extern char **environ;

#define WU_MAX_BLOBS 8
#define WU_HEARTBEAT_MS 200

static inline double wu_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static inline void wu_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The whole file as a NUL-terminated string (malloc'd); NULL when unreadable. */
static inline char *wu_read_file(const char *path, size_t *len)
{
    return fb_test_read_file(path, len);
}

/* A canonical UUID whose last 12 hex digits are n: distinct ids that read well in logs. */
static inline void wu_uuid(char out[FB_WIRE_ID_LEN + 1], unsigned kind, unsigned long long n)
{
    snprintf(out, FB_WIRE_ID_LEN + 1, "%08x-0000-4000-8000-%012llx", kind, n);
}

/* ---- processes ----------------------------------------------------------------------- */

static inline const char *wu_worker_binary(void)
{
    static char path[4096];
    const char *bin = getenv("FB_BINARY_DIR");
    CHECK(bin != NULL && bin[0] != '\0');
    snprintf(path, sizeof path, "%s/workers/fusebox-worker", bin);
    CHECK(access(path, X_OK) == 0);
    return path;
}

/*
 * Starts argv[0] with the test's environment minus every FUSEBOX_WORKER_*
 * variable, plus env_add ("NAME=value" strings, NULL-terminated; may be NULL).
 * out_path, when set, receives stdout and stderr; otherwise they are the
 * test's own, so the worker's log shows up with the test's output.  The
 * child dies with the test (PR_SET_PDEATHSIG), so a failed CHECK leaves no
 * worker behind.
 */
static inline pid_t wu_spawn(char *const argv[], const char *const *env_add, const char *out_path)
{
    size_t n_env = 0, n_add = 0;
    while (environ[n_env])
        n_env++;
    while (env_add && env_add[n_add])
        n_add++;
    char **envp = calloc(n_env + n_add + 1, sizeof *envp);
    CHECK(envp != NULL);
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++)
        if (strncmp(environ[i], "FUSEBOX_WORKER_", 15) != 0) envp[k++] = environ[i];
    for (size_t i = 0; i < n_add; i++)
        envp[k++] = (char *)env_add[i];
    envp[k] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (out_path) {
            int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd < 0) _exit(126);
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execve(argv[0], argv, envp);
        _exit(127);
    }
    free(envp);
    return pid;
}

/* The exit status of pid within timeout_ms (a signal gives 128 + its number), or -1. */
static inline int wu_wait(pid_t pid, int timeout_ms)
{
    double end = wu_now_ms() + timeout_ms;
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        CHECK(r >= 0);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (wu_now_ms() >= end) return -1;
        wu_sleep_ms(10);
    }
}

/* Whether pid still runs. */
static inline bool wu_alive(pid_t pid)
{
    int st;
    return waitpid(pid, &st, WNOHANG) == 0;
}

/* Runs the worker binary with args to its end; its output goes to out_path. */
static inline int wu_run(const char *const *args, const char *const *env_add, const char *out_path)
{
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)wu_worker_binary();
    for (int i = 0; args && args[i]; i++) {
        CHECK(n < 31);
        argv[n++] = (char *)args[i];
    }
    argv[n] = NULL;
    pid_t pid = wu_spawn(argv, env_add, out_path);
    int rc = wu_wait(pid, 30000);
    if (rc < 0) {
        kill(pid, SIGKILL);
        wu_wait(pid, 5000);
    }
    return rc;
}

/*
 * Runs the worker binary with args (and env_add, as wu_spawn) to its end and
 * fails the test unless it exits rc with needle in its output (NULL: any
 * output); the output goes to run.out in dir.
 */
static inline void wu_expect_run(const char *dir, const char *const *args,
                                 const char *const *env_add, int rc, const char *needle)
{
    char out[700];
    snprintf(out, sizeof out, "%s/run.out", dir);
    int got = wu_run(args, env_add, out);
    char *text = wu_read_file(out, NULL);
    CHECK(text != NULL);
    if (got != rc || (needle && !strstr(text, needle))) {
        fprintf(stderr,
                "fusebox-worker %s...: exit %d (expected %d), output:\n%s\n(expected "
                "\"%s\")\n",
                args[0] ? args[0] : "", got, rc, text, needle ? needle : "");
        abort();
    }
    free(text);
}

/* ---- the fake server ------------------------------------------------------------------- */

typedef struct wu_server {
    char dir[512];
    char server_key_file[640], worker_key_file[640], data_dir[640];
    char pub[41], sec[41]; /* the server's keypair */
    char worker_pub[41];   /* printed by fusebox-worker --gen-key */
    uint8_t allowed[32];   /* the one client key the ZAP handler admits */
    void *ctx, *router, *zap;
    char endpoint[256];
    pthread_t zap_th;
    atomic_bool zap_stop;
    atomic_int zap_allowed, zap_denied;
} wu_server;

/* The ZAP handler (RFC 27): admits CURVE clients whose key is s->allowed. */
static inline void *wu_zap_main(void *arg)
{
    wu_server *s = arg;
    while (!atomic_load(&s->zap_stop)) {
        zmq_pollitem_t it = {.socket = s->zap, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 50) <= 0) continue;
        zmq_msg_t f[8];
        int n = 0, more = 1;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            CHECK(zmq_msg_recv(&m, s->zap, 0) >= 0);
            more = zmq_msg_more(&m);
            if (n < 8)
                f[n++] = m;
            else
                zmq_msg_close(&m);
        }
        bool ok = n >= 7 && zmq_msg_size(&f[5]) == 5 &&
                  memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 && zmq_msg_size(&f[6]) == 32 &&
                  memcmp(zmq_msg_data(&f[6]), s->allowed, 32) == 0;
        atomic_fetch_add(ok ? &s->zap_allowed : &s->zap_denied, 1);
        const char *status = ok ? "200" : "400", *text = ok ? "OK" : "key not allowed";
        zmq_send(s->zap, "1.0", 3, ZMQ_SNDMORE);
        zmq_send(s->zap, n > 1 ? zmq_msg_data(&f[1]) : "", n > 1 ? zmq_msg_size(&f[1]) : 0,
                 ZMQ_SNDMORE);
        zmq_send(s->zap, status, 3, ZMQ_SNDMORE);
        zmq_send(s->zap, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(s->zap, "", 0, ZMQ_SNDMORE);
        zmq_send(s->zap, "", 0, 0);
        for (int i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
    }
    return NULL;
}

static inline void wu_router_open(wu_server *s, const char *endpoint)
{
    s->router = zmq_socket(s->ctx, ZMQ_ROUTER);
    CHECK(s->router != NULL);
    int one = 1, zero = 0;
    CHECK(zmq_setsockopt(s->router, ZMQ_CURVE_SERVER, &one, sizeof one) == 0);
    CHECK(zmq_setsockopt(s->router, ZMQ_CURVE_SECRETKEY, s->sec, 41) == 0);
    /* a worker that comes back under its name takes its routing id over */
    CHECK(zmq_setsockopt(s->router, ZMQ_ROUTER_HANDOVER, &one, sizeof one) == 0);
    CHECK(zmq_setsockopt(s->router, ZMQ_LINGER, &zero, sizeof zero) == 0);
    int rc = -1;
    for (int tries = 0; tries < 50 && rc != 0; tries++) {
        rc = zmq_bind(s->router, endpoint);
        if (rc != 0) wu_sleep_ms(100);
    }
    CHECK_INT_EQ(rc, 0);
    size_t len = sizeof s->endpoint;
    CHECK(zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &len) == 0);
}

/*
 * A scratch directory with the server's keypair and the worker's (made by
 * fusebox-worker --gen-key, whose printed public key is admitted unless
 * admit_worker is false), a data directory, the ZAP handler and the ROUTER.
 */
static inline void wu_server_start(wu_server *s, const char *tag, bool admit_worker)
{
    memset(s, 0, sizeof *s);
    const char *t = getenv("TMPDIR");
    snprintf(s->dir, sizeof s->dir, "%s/fbworker-%s-XXXXXX", t && *t ? t : "/tmp", tag);
    CHECK(mkdtemp(s->dir) != NULL);
    snprintf(s->server_key_file, sizeof s->server_key_file, "%s/server.key", s->dir);
    snprintf(s->worker_key_file, sizeof s->worker_key_file, "%s/worker.key", s->dir);
    snprintf(s->data_dir, sizeof s->data_dir, "%s/data", s->dir);
    CHECK(mkdir(s->data_dir, 0755) == 0);
    char msg[512];
    CHECK_INT_EQ(fb_wire_key_generate(s->server_key_file, msg, sizeof msg), 0);
    CHECK_INT_EQ(fb_wire_key_load(s->server_key_file, s->pub, s->sec, msg, sizeof msg), 0);

    char out[700];
    snprintf(out, sizeof out, "%s/gen-key.out", s->dir);
    const char *args[] = {"--gen-key", s->worker_key_file, NULL};
    CHECK_INT_EQ(wu_run(args, NULL, out), 0);
    char *printed = wu_read_file(out, NULL);
    CHECK(printed != NULL);
    CHECK(strlen(printed) >= 41 && printed[40] == '\n');
    memcpy(s->worker_pub, printed, 40);
    s->worker_pub[40] = '\0';
    free(printed);
    char pub2[41];
    CHECK_INT_EQ(fb_wire_key_load(s->worker_key_file, pub2, NULL, msg, sizeof msg), 0);
    CHECK_STR_EQ(pub2, s->worker_pub);

    if (admit_worker) {
        CHECK(zmq_z85_decode(s->allowed, s->worker_pub) != NULL);
    } else {
        /* some other worker's key */
        char other[41], other_sec[41];
        CHECK(zmq_curve_keypair(other, other_sec) == 0);
        CHECK(zmq_z85_decode(s->allowed, other) != NULL);
    }
    s->ctx = zmq_ctx_new();
    CHECK(s->ctx != NULL);
    s->zap = zmq_socket(s->ctx, ZMQ_REP);
    CHECK(s->zap != NULL);
    CHECK(zmq_bind(s->zap, "inproc://zeromq.zap.01") == 0);
    CHECK(pthread_create(&s->zap_th, NULL, wu_zap_main, s) == 0);
    wu_router_open(s, "tcp://127.0.0.1:*");
}

/* Closes the ROUTER and binds a new one at the same endpoint: a server restart. */
static inline void wu_server_restart(wu_server *s, int down_ms)
{
    char ep[256];
    snprintf(ep, sizeof ep, "%s", s->endpoint);
    CHECK(zmq_close(s->router) == 0);
    wu_sleep_ms(down_ms);
    wu_router_open(s, ep);
}

static inline void wu_server_stop(wu_server *s)
{
    atomic_store(&s->zap_stop, true);
    pthread_join(s->zap_th, NULL);
    zmq_close(s->zap);
    zmq_close(s->router);
    zmq_ctx_term(s->ctx);
    et_rmtree(s->dir);
}

/* Spawns fusebox-worker against s with the usual test flags plus extra (NULL-terminated). */
static inline pid_t wu_start_worker(wu_server *s, const char *name, const char *const *extra)
{
    char *argv[40];
    int n = 0;
    argv[n++] = (char *)wu_worker_binary();
    const char *base[] = {"--server",
                          s->endpoint,
                          "--server-key",
                          s->server_key_file,
                          "--key",
                          s->worker_key_file,
                          "--name",
                          name,
                          "--data-dir",
                          s->data_dir,
                          "--heartbeat-ms",
                          "200",
                          "--progress-ms",
                          "50",
                          "--threads-per-device",
                          "1",
                          NULL};
    for (int i = 0; base[i]; i++)
        argv[n++] = (char *)base[i];
    for (int i = 0; extra && extra[i]; i++) {
        CHECK(n < 39);
        argv[n++] = (char *)extra[i];
    }
    argv[n] = NULL;
    return wu_spawn(argv, NULL, NULL);
}

/* ---- messages ------------------------------------------------------------------------- */

typedef struct wu_msg {
    char from[FB_WIRE_NAME_MAX + 1]; /* the routing id */
    fb_wire_msg m;
    int n_blobs;
    void *blob[WU_MAX_BLOBS + 1]; /* blob[i] is blob index i (1-based) */
    size_t blob_len[WU_MAX_BLOBS + 1];
} wu_msg;

static inline void wu_msg_free(wu_msg *w)
{
    fb_wire_msg_free(&w->m);
    for (int i = 1; i <= w->n_blobs; i++)
        free(w->blob[i]);
    memset(w, 0, sizeof *w);
}

/* Moves the one blob that an event must carry into *data (freeing what *data held) and its
 * length into *len; the caller frees it. */
static inline void wu_take_blob(wu_msg *w, void **data, size_t *len)
{
    CHECK_INT_EQ(w->m.blob, 1);
    CHECK_INT_EQ(w->n_blobs, 1);
    free(*data);
    *data = w->blob[1];
    *len = w->blob_len[1];
    w->blob[1] = NULL;
    w->n_blobs = 0;
}

/* The next message within timeout_ms; false on timeout.  What the worker sends must decode. */
static inline bool wu_recv(wu_server *s, int timeout_ms, wu_msg *out)
{
    memset(out, 0, sizeof *out);
    zmq_pollitem_t it = {.socket = s->router, .events = ZMQ_POLLIN};
    int rc = zmq_poll(&it, 1, timeout_ms);
    CHECK(rc >= 0);
    if (rc == 0) return false;
    zmq_msg_t f[WU_MAX_BLOBS + 2];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        CHECK(zmq_msg_recv(&m, s->router, 0) >= 0);
        more = zmq_msg_more(&m);
        CHECK(n < WU_MAX_BLOBS + 2);
        f[n++] = m;
    }
    CHECK(n >= 2);
    size_t idlen = zmq_msg_size(&f[0]);
    CHECK(idlen < sizeof out->from);
    memcpy(out->from, zmq_msg_data(&f[0]), idlen);
    out->from[idlen] = '\0';
    char err[512];
    int dec =
        fb_wire_decode(zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), n - 2, &out->m, err, sizeof err);
    if (dec != FB_OK) {
        fprintf(stderr, "the worker sent a message that does not decode: %s\n%.*s\n", err,
                (int)zmq_msg_size(&f[1]), (const char *)zmq_msg_data(&f[1]));
        abort();
    }
    out->n_blobs = n - 2;
    for (int i = 2; i < n; i++) {
        size_t len = zmq_msg_size(&f[i]);
        out->blob[i - 1] = malloc(len ? len : 1);
        CHECK(out->blob[i - 1] != NULL);
        memcpy(out->blob[i - 1], zmq_msg_data(&f[i]), len);
        out->blob_len[i - 1] = len;
    }
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
    return true;
}

/* Sends raw frames (after the routing id) to worker `to`. */
static inline void wu_send_frames(wu_server *s, const char *to, const void *const *frames,
                                  const size_t *lens, int n)
{
    CHECK(zmq_send(s->router, to, strlen(to), ZMQ_SNDMORE) >= 0);
    for (int i = 0; i < n; i++)
        CHECK(zmq_send(s->router, frames[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
}

/* Encodes m (it must encode) and sends it with n_blobs blobs. */
static inline void wu_send(wu_server *s, const char *to, const fb_wire_msg *m,
                           const void *const *blobs, const size_t *blob_lens, int n_blobs)
{
    char err[512];
    char *json = fb_wire_encode(m, err, sizeof err);
    if (!json) {
        fprintf(stderr, "test message does not encode: %s\n", err);
        abort();
    }
    const void *frames[WU_MAX_BLOBS + 1] = {json};
    size_t lens[WU_MAX_BLOBS + 1] = {strlen(json)};
    CHECK(n_blobs <= WU_MAX_BLOBS);
    for (int i = 0; i < n_blobs; i++) {
        frames[i + 1] = blobs[i];
        lens[i + 1] = blob_lens[i];
    }
    wu_send_frames(s, to, frames, lens, n_blobs + 1);
    free(json);
}

static inline void wu_send_welcome(wu_server *s, const char *to)
{
    fb_wire_msg m = {.type = FB_WIRE_WELCOME, .heartbeat_ms = WU_HEARTBEAT_MS};
    wu_uuid(m.worker_id, 0xabc, 1);
    wu_send(s, to, &m, NULL, NULL, 0);
}

static inline void wu_send_ack(wu_server *s, const char *to, const fb_wire_msg *ev)
{
    fb_wire_msg m = {.type = FB_WIRE_ACK, .seq = ev->seq};
    snprintf(m.group_id, sizeof m.group_id, "%s", ev->group_id);
    wu_send(s, to, &m, NULL, NULL, 0);
}

static inline void wu_send_heartbeat_reply(wu_server *s, const char *to, bool known)
{
    fb_wire_msg m = {.type = FB_WIRE_HEARTBEAT, .reply = true, .known = known};
    wu_send(s, to, &m, NULL, NULL, 0);
}

/*
 * Answers what a server answers whatever it knows of the worker's groups: a
 * HELLO gets a WELCOME, a worker's heartbeat the reply known = true and,
 * when ack is true, an EVENT its ACK.  Anything else needs no answer.
 */
static inline void wu_answer(wu_server *s, const wu_msg *w, bool ack)
{
    switch (w->m.type) {
    /* a worker repeats HELLO every heartbeat until a WELCOME reaches it, so one more can
     * cross the WELCOME on a slow machine; and one that heard nothing for three heartbeats
     * (a test busy elsewhere) registers again and holds its events until welcomed: answer
     * every HELLO as a server does (a registered worker ignores the extra ones) */
    case FB_WIRE_HELLO:
        wu_send_welcome(s, w->from);
        break;
    case FB_WIRE_HEARTBEAT:
        if (!w->m.reply) wu_send_heartbeat_reply(s, w->from, true);
        break;
    case FB_WIRE_EVENT:
        if (ack) wu_send_ack(s, w->from, &w->m);
        break;
    default:
        break;
    }
}

/*
 * The next message that is not a worker heartbeat or a HELLO, answering
 * those and, when ack is true, acknowledging an EVENT before it is returned
 * (wu_answer).  False when nothing came within timeout_ms.
 */
static inline bool wu_next(wu_server *s, int timeout_ms, bool ack, wu_msg *out)
{
    double end = wu_now_ms() + timeout_ms;
    for (;;) {
        int left = (int)(end - wu_now_ms());
        if (left <= 0 || !wu_recv(s, left, out)) return false;
        wu_answer(s, out, ack);
        if ((out->m.type == FB_WIRE_HEARTBEAT && !out->m.reply) || out->m.type == FB_WIRE_HELLO) {
            wu_msg_free(out);
            continue;
        }
        return true;
    }
}

/* Waits for the worker's HELLO (answering nothing else, so events that come first are sent
 * again after the WELCOME) and checks what it says. */
static inline void wu_expect_hello(wu_server *s, const char *name, int timeout_ms, wu_msg *out)
{
    double end = wu_now_ms() + timeout_ms;
    for (;;) {
        int left = (int)(end - wu_now_ms());
        if (left <= 0 || !wu_recv(s, left, out)) {
            fprintf(stderr, "no HELLO from worker %s within %d ms\n", name, timeout_ms);
            abort();
        }
        if (out->m.type == FB_WIRE_HELLO) break;
        /* not acknowledged: the worker sends it again after the WELCOME */
        wu_msg_free(out);
    }
    CHECK_STR_EQ(out->from, name);
    CHECK_STR_EQ(out->m.worker, name);
    CHECK_STR_EQ(out->m.backend, "cpu");
    CHECK(out->m.version[0] != '\0');
    CHECK(out->m.n_devices >= 1);
    for (int i = 0; i < out->m.n_devices; i++) {
        CHECK_INT_EQ(out->m.devices[i].idx, i);
        CHECK_STR_EQ(out->m.devices[i].kind, "cpu");
        CHECK(out->m.devices[i].memory_bytes > 0);
        CHECK(out->m.devices[i].free_bytes <= out->m.devices[i].memory_bytes);
    }
}

/* ---- datasets, specs, models ------------------------------------------------------------ */

/* splitmix64, the tests' own generator */
static inline uint64_t wu_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/*
 * Imports dataset `name` into data_dir as shards: float32 samples of shape [F]
 * in [0, 1), labelled by the argmax of a random linear teacher (learnable by
 * an MLP), n_train in split "train" and n_test in "test".
 */
static inline void wu_make_dataset(const char *data_dir, const char *name, int64_t n_train,
                                   int64_t n_test, int F, int classes, uint64_t seed)
{
    uint64_t st = seed;
    float *teacher = malloc((size_t)classes * (size_t)F * sizeof *teacher);
    CHECK(teacher != NULL);
    for (int i = 0; i < classes * F; i++)
        teacher[i] = (float)(wu_rand(&st) >> 40) / 16777216.0f - 0.5f;
    const char *splits[2] = {"train", "test"};
    int64_t counts[2] = {n_train, n_test};
    char out_dir[1024];
    snprintf(out_dir, sizeof out_dir, "%s/%s", data_dir, name);
    for (int sp = 0; sp < 2; sp++) {
        int64_t n = counts[sp];
        float *x = malloc((size_t)n * (size_t)F * sizeof *x);
        int32_t *y = malloc((size_t)n * sizeof *y);
        CHECK(x && y);
        for (int64_t i = 0; i < n; i++) {
            float *xi = x + i * F;
            for (int f = 0; f < F; f++)
                xi[f] = (float)(wu_rand(&st) >> 40) / 16777216.0f;
            int best = 0;
            double bv = -INFINITY;
            for (int k = 0; k < classes; k++) {
                double v = 0;
                for (int f = 0; f < F; f++)
                    v += (double)teacher[k * F + f] * xi[f];
                if (v > bv) {
                    bv = v;
                    best = k;
                }
            }
            y[i] = best;
        }
        int64_t shape[1] = {F};
        fb_import_opts o = {.out_dir = out_dir, .name = name, .split = splits[sp], .level = 1};
        char msg[1024];
        int rc = fb_datadir_import(NULL, &o, FB_DTYPE_F32, 1, shape, x, y, n, msg, sizeof msg);
        if (rc) fprintf(stderr, "import: %s\n", msg);
        CHECK_INT_EQ(rc, 0);
        free(x);
        free(y);
    }
    free(teacher);
}

/* Parses a spec (it must parse); the JSON text is kept in *json (malloc'd, canonical). */
static inline void wu_spec(fb_job_spec *spec, char **json, const char *fmt, ...)
{
    char text[4096], msg[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    CHECK(n > 0 && (size_t)n < sizeof text);
    int err = fb_job_spec_parse(text, strlen(text), NULL, spec, msg, sizeof msg);
    if (err) {
        fprintf(stderr, "spec rejected (%s): %s\n%s\n", fb_err_code(err), msg, text);
        abort();
    }
    *json = fb_job_spec_canonical(spec);
    CHECK(*json != NULL);
}

/*
 * Compares two model files tensor by tensor.  tol < 0: the tensors' bytes
 * must be equal (memcmp).  tol >= 0: every float tensor must agree to
 * max|a - b| <= tol * max(1, max|b|).  Returns the worst normalised error.
 */
static inline double wu_models_compare(const void *a, size_t a_len, const void *b, size_t b_len,
                                       double tol, const char *what)
{
    char msg[512];
    fb_st_file *fa = NULL, *fbf = NULL;
    CHECK_INT_EQ(fb_st_parse_buffer(a, a_len, &fa, msg, sizeof msg), 0);
    CHECK_INT_EQ(fb_st_parse_buffer(b, b_len, &fbf, msg, sizeof msg), 0);
    CHECK(fb_st_count(fa) > 0);
    CHECK_INT_EQ(fb_st_count(fa), fb_st_count(fbf));
    double worst = 0;
    for (size_t i = 0; i < fb_st_count(fa); i++) {
        const fb_st_tensor *ta = fb_st_at(fa, i), *tb = fb_st_at(fbf, i);
        CHECK_STR_EQ(ta->name, tb->name);
        CHECK_INT_EQ(ta->dtype, tb->dtype);
        CHECK_INT_EQ(ta->numel, tb->numel);
        CHECK_INT_EQ(ta->nbytes, tb->nbytes);
        if (tol < 0) {
            if (memcmp(ta->data, tb->data, ta->nbytes) != 0) {
                fprintf(stderr, "%s: tensor %s differs\n", what, ta->name);
                abort();
            }
            continue;
        }
        CHECK_INT_EQ(ta->dtype, FB_ST_F32);
        double diff = 0, mag = 1;
        for (int64_t k = 0; k < ta->numel; k++) {
            float x, y;
            memcpy(&x, ta->data + 4 * k, 4);
            memcpy(&y, tb->data + 4 * k, 4);
            diff = fmax(diff, fabs((double)x - (double)y));
            mag = fmax(mag, fabs((double)y));
        }
        double e = diff / mag;
        if (!(e <= tol)) {
            fprintf(stderr, "%s: tensor %s differs by %.3g (tolerance %.3g)\n", what, ta->name, e,
                    tol);
            abort();
        }
        worst = fmax(worst, e);
    }
    fb_st_close(fa);
    fb_st_close(fbf);
    return worst;
}

#endif
