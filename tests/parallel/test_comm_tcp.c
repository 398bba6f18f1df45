/*
 * The TCP communicator, with its ranks in real processes on loopback:
 * - sums of odd lengths (chunk boundaries included) over 1..4 processes with
 *   mixed numbers of local ranks are the very floats of the shared-memory
 *   sum over the same world, in every buffer of every process (over IPv4,
 *   IPv6 where the machine has it, and a host name);
 * - a wrong token, a rank already held and a world of another size are
 *   refused with a clear error while the rightful members form the group;
 * - a peer killed, or stopped, in the middle of sums (once every process has
 *   summed at least once, which each tells the test) gives the others
 *   FB_ERR_IO naming its ranks, and so does the root, within ten times the
 *   communicator's timeout (a liveness bound: the time a stopped peer is
 *   waited for is the timeout's, which the machine's speed does not change);
 * - a peer that sums another length is an error on every process, and the
 *   communicator then refuses further sums at once;
 * - a rendezvous that its caller calls off (fb_comm_tcp_new_until) gives up
 *   on the give-up check that says so, without waiting out its timeout: a
 *   root whose members have not come, a member whose root does not listen,
 *   and a member that has joined and waits for the root's go;
 * - bad arguments are refused and leave the output alone.
 */
#include "xproc_util.h"

#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "comm.h"
#include "errors.h"

#define MAX_PROCS 6
#define OK_TIMEOUT_MS 20000

static const unsigned char TOKEN[FB_COMM_TOKEN_BYTES] = "0123456789abcdef0123456789abcdef";
static char root_addr[64];
static fb_comm_tcp_listener *listener;

/* Rank r's value at i: magnitudes from 2^-12 to 2^12 and both signs, so that
 * the order of the additions shows in the result. */
static float value(int r, size_t i)
{
    uint64_t z = (uint64_t)r * 0x9E3779B97F4A7C15ULL + i * 0xBF58476D1CE4E5B9ULL + 1;
    z ^= z >> 31;
    z *= 0x94D049BB133111EBULL;
    z ^= z >> 29;
    float m = (float)(z >> 40) / 16777216.0f + 0.5f;
    int e = (int)((z >> 8) % 25) - 12;
    return (z & 1 ? -1.0f : 1.0f) * ldexpf(m, e);
}

/* What one process does. */
typedef struct proc {
    int base, n_local, world;
    const unsigned char *token;
    int timeout_ms;
    /* the refusal it expects (0: joins) and a word its message must contain */
    int refused;
    const char *refused_word;
    /* may lose the race for its ranks: then it exits with status 3 */
    bool may_lose;
    /* sums: lengths[0..n_lengths); with bad_length, rank 2 sums one float
     * more than the others in the last, and every process expects an error */
    const size_t *lengths;
    int n_lengths;
    bool bad_length;
    /* loop sums of big until one fails (the kill tests); expect the failure within secs */
    bool until_error;
    double error_within;
    char error_word[16];
    /* writes a byte to ready_pipe once its first sum of the until_error loop has ended */
    bool say_ready;
} proc;

static int ready_pipe[2];

static fb_comm *join(const proc *p, char *msg, size_t msg_cap, int *err)
{
    fb_comm *c = NULL;
    *err = fb_comm_tcp_new(p->n_local, p->base, p->world, root_addr, p->base == 0 ? listener : NULL,
                           p->token, p->timeout_ms, &c, msg, msg_cap);
    return c;
}

/* The shared-memory sum of the whole world at length n: the reference. */
static float *shm_sum(int world, size_t n)
{
    char msg[128];
    float *bufs[64];
    for (int r = 0; r < world; r++) {
        bufs[r] = malloc(n * sizeof(float));
        CHECK(bufs[r] != NULL);
        for (size_t i = 0; i < n; i++) bufs[r][i] = value(r, i);
    }
    fb_comm *c = NULL;
    CHECK_INT_EQ(fb_comm_shm_new(world, &c, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(fb_comm_allreduce_sum(c, bufs, n, msg, sizeof msg), FB_OK);
    fb_comm_free(c);
    for (int r = 1; r < world; r++) free(bufs[r]);
    return bufs[0];
}

static void proc_main(void *arg)
{
    const proc *p = arg;
    char msg[256];
    int err;
    if (p->base != 0) {
        fb_comm_tcp_listener_free(listener); /* the parent's, inherited */
        listener = NULL;
    }
    fb_comm *c = join(p, msg, sizeof msg, &err);
    fb_comm_tcp_listener_free(listener);
    listener = NULL;
    if (p->refused) {
        printf("ranks %d+%d refused as expected: %s\n", p->base, p->n_local, msg);
        CHECK_INT_EQ(err, p->refused);
        CHECK(c == NULL);
        CHECK(strstr(msg, p->refused_word) != NULL);
        return;
    }
    if (p->may_lose && err) {
        printf("rank %d lost the race as it may: %s\n", p->base, msg);
        CHECK_INT_EQ(err, FB_ERR_ALREADY_EXISTS);
        CHECK(strstr(msg, "already held") != NULL);
        CHECK(c == NULL);
        exit(3);
    }
    if (err) fprintf(stderr, "rank %d: %s\n", p->base, msg);
    CHECK_INT_EQ(err, FB_OK);
    CHECK_STR_EQ(fb_comm_name(c), "tcp");
    CHECK_INT_EQ(fb_comm_local_size(c), p->n_local);
    CHECK(fb_comm_host_memory(c));
    int base = -1, world = -1;
    CHECK_INT_EQ(fb_comm_tcp_layout(c, &base, &world, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(base, p->base);
    CHECK_INT_EQ(world, p->world);
    float *bufs[64];
    for (int k = 0; k < p->n_lengths; k++) {
        size_t n = p->lengths[k];
        bool bad = p->bad_length && k == p->n_lengths - 1;
        size_t mine = bad && p->base == 2 ? n + 1 : n;
        for (int j = 0; j < p->n_local; j++) {
            bufs[j] = malloc(mine * sizeof(float));
            CHECK(bufs[j] != NULL);
            for (size_t i = 0; i < mine; i++) bufs[j][i] = value(p->base + j, i);
        }
        err = fb_comm_allreduce_sum(c, bufs, mine, msg, sizeof msg);
        if (p->bad_length && k == p->n_lengths - 1) {
            /* every process of the world hears of the wrong length */
            printf("rank %d: a wrong length: %s\n", p->base, msg);
            CHECK_INT_EQ(err, FB_ERR_IO);
            CHECK(strstr(msg, "rank 2") != NULL);
            CHECK(strstr(msg, "floats") != NULL);
            CHECK_INT_EQ(fb_comm_allreduce_sum(c, bufs, mine, msg, sizeof msg), FB_ERR_IO);
            CHECK(strstr(msg, "failed before") != NULL);
        } else {
            if (err) fprintf(stderr, "rank %d, length %zu: %s\n", p->base, n, msg);
            CHECK_INT_EQ(err, FB_OK);
            float *want = shm_sum(p->world, n);
            for (int j = 0; j < p->n_local; j++)
                CHECK(memcmp(bufs[j], want, n * sizeof(float)) == 0);
            free(want);
        }
        for (int j = 0; j < p->n_local; j++) free(bufs[j]);
    }
    if (p->until_error) {
        size_t n = (size_t)1 << 18;
        for (int j = 0; j < p->n_local; j++) {
            bufs[j] = calloc(n, sizeof(float));
            CHECK(bufs[j] != NULL);
        }
        double t_fail = 0;
        for (long sums = 0;; sums++) {
            double t = xp_now();
            err = fb_comm_allreduce_sum(c, bufs, n, msg, sizeof msg);
            if (err) {
                t_fail = xp_now() - t;
                break;
            }
            /* the test strikes once every process has summed here: the fault falls in a
             * later sum of this loop, whatever the machine's speed */
            if (sums == 0 && p->say_ready) CHECK(write(ready_pipe[1], "r", 1) == 1);
        }
        fprintf(stderr, "rank %d: the failed sum took %.2f s: %s\n", p->base, t_fail, msg);
        CHECK_INT_EQ(err, FB_ERR_IO);
        CHECK(t_fail < p->error_within);
        CHECK(strstr(msg, p->error_word) != NULL);
        for (int j = 0; j < p->n_local; j++) free(bufs[j]);
    }
    fb_comm_free(c);
}

static const size_t LENGTHS[] = {1, 7, 1023, 65537};

/* One world of n_procs processes holding n_local[p] ranks each, its root on
 * listener at root_addr: every sum equals the shared-memory sum, bit for
 * bit, everywhere. */
static void world_sums_at(int n_procs, const int *n_local)
{
    proc ps[MAX_PROCS];
    pid_t pids[MAX_PROCS];
    int world = 0;
    for (int p = 0; p < n_procs; p++) world += n_local[p];
    int base = 0;
    for (int p = 0; p < n_procs; p++) {
        ps[p] = (proc){.base = base, .n_local = n_local[p], .world = world, .token = TOKEN,
                       .timeout_ms = OK_TIMEOUT_MS, .lengths = LENGTHS,
                       .n_lengths = (int)(sizeof LENGTHS / sizeof LENGTHS[0])};
        base += n_local[p];
    }
    /* the members first: they wait for the root to come */
    for (int p = n_procs - 1; p >= 0; p--) pids[p] = xp_spawn(proc_main, &ps[p]);
    for (int p = 0; p < n_procs; p++) xp_wait_ok(pids[p], 50);
    fb_comm_tcp_listener_free(listener);
    listener = NULL;
    printf("%d processes, world %d, root at %s: sums equal shared memory's\n", n_procs, world,
           root_addr);
}

/* One world of n_procs processes holding n_local[p] ranks each, on 127.0.0.1. */
static void world_sums(int n_procs, const int *n_local)
{
    listener = xp_listen(root_addr, sizeof root_addr);
    world_sums_at(n_procs, n_local);
}

/* The same over IPv6 loopback, and with the root named rather than numbered. */
static void other_addresses(void)
{
    static const int w[] = {2, 1};
    listener = xp_listen_on("[::1]", "[::1]", root_addr, sizeof root_addr);
    if (listener)
        world_sums_at(2, w);
    else
        printf("no IPv6 loopback here: the IPv6 world is not run\n");
    listener = xp_listen_on("127.0.0.1", "localhost", root_addr, sizeof root_addr);
    CHECK(listener != NULL);
    world_sums_at(2, w);
}

/* Intruders refused, one at a time, while the group waits for its last
 * member; then the last member comes and the group sums. */
static void refusals(void)
{
    static const unsigned char bad[FB_COMM_TOKEN_BYTES] = "0123456789abcdef0123456789abcdeX";
    static const size_t one[] = {4099};
    listener = xp_listen(root_addr, sizeof root_addr);
    proc root = {.base = 0, .n_local = 1, .world = 3, .token = TOKEN, .timeout_ms = OK_TIMEOUT_MS,
                 .lengths = one, .n_lengths = 1};
    proc a = root, b = root, c = root;
    a.base = 1;
    b.base = 1;
    c.base = 2;
    pid_t pr = xp_spawn(proc_main, &root);
    /* a wrong token */
    proc x = a;
    x.token = bad;
    x.refused = FB_ERR_UNAUTHORIZED;
    x.refused_word = "token";
    xp_wait_ok(xp_spawn(proc_main, &x), 30);
    /* a world of another size */
    x = a;
    x.world = 4;
    x.refused = FB_ERR_OUT_OF_RANGE;
    x.refused_word = "world";
    xp_wait_ok(xp_spawn(proc_main, &x), 30);
    /* two processes claim rank 1: the first to come holds it, the other is refused */
    a.may_lose = b.may_lose = true;
    pid_t pa = xp_spawn(proc_main, &a);
    pid_t pb = xp_spawn(proc_main, &b);
    double end = xp_now() + 30;
    pid_t loser = 0;
    int st = 0;
    while (!loser && xp_now() < end) {
        pid_t r = waitpid(-1, &st, WNOHANG);
        CHECK(r >= 0);
        if (r == pa || r == pb) loser = r;
        CHECK(r == 0 || r == pa || r == pb);
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    CHECK(loser != 0);
    /* the loser was refused because rank 1 was held (status 3, see proc_main) */
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 3);
    pid_t winner = loser == pa ? pb : pa;
    pid_t pc = xp_spawn(proc_main, &c);
    xp_wait_ok(pr, 30);
    xp_wait_ok(winner, 30);
    xp_wait_ok(pc, 30);
    fb_comm_tcp_listener_free(listener);
    listener = NULL;
    printf("refusals: wrong token, held rank, other world, duplicate rank 1\n");
}

/* A world of three single-rank processes that sum until one of them is
 * killed (or stopped) after each has ended one sum of the loop; the others
 * must fail, naming it, within ten times the timeout. */
static void peer_lost(int victim, bool stop)
{
    const int timeout = 3000;
    static const size_t one[] = {65537};
    listener = xp_listen(root_addr, sizeof root_addr);
    CHECK(pipe(ready_pipe) == 0);
    proc ps[3];
    pid_t pids[3];
    for (int p = 0; p < 3; p++) {
        ps[p] = (proc){.base = p, .n_local = 1, .world = 3, .token = TOKEN, .timeout_ms = timeout,
                       .lengths = one, .n_lengths = 1, .until_error = true,
                       .error_within = 10 * timeout / 1000.0, .say_ready = true};
        snprintf(ps[p].error_word, sizeof ps[p].error_word, "rank %d", victim);
        pids[p] = xp_spawn(proc_main, &ps[p]);
    }
    /* every process has ended a sum of the loop (a liveness bound of 120 s) */
    for (int p = 0; p < 3; p++) {
        struct pollfd pf = {.fd = ready_pipe[0], .events = POLLIN};
        CHECK(poll(&pf, 1, 120000) == 1);
        char b;
        CHECK(read(ready_pipe[0], &b, 1) == 1);
    }
    close(ready_pipe[0]);
    close(ready_pipe[1]);
    kill(pids[victim], stop ? SIGSTOP : SIGKILL);
    for (int p = 0; p < 3; p++)
        if (p != victim) xp_wait_ok(pids[p], 60);
    if (stop) kill(pids[victim], SIGKILL);
    int st = xp_wait(pids[victim], 10);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    fb_comm_tcp_listener_free(listener);
    listener = NULL;
    printf("rank %d %s: the others failed in time\n", victim, stop ? "stopped" : "killed");
}

/* Rank 2 sums one float more than the others. */
static void wrong_length(void)
{
    static const size_t two[] = {1025, 65537};
    listener = xp_listen(root_addr, sizeof root_addr);
    proc ps[3];
    pid_t pids[3];
    for (int p = 0; p < 3; p++) {
        ps[p] = (proc){.base = p, .n_local = 1, .world = 3, .token = TOKEN,
                       .timeout_ms = OK_TIMEOUT_MS, .lengths = two, .n_lengths = 2,
                       .bad_length = true};
        pids[p] = xp_spawn(proc_main, &ps[p]);
    }
    /* the root tells every process at once: each one's error names rank 2 and the floats
     * (proc_main), where one that waited out its own timeout would say it took no data */
    for (int p = 0; p < 3; p++)
        xp_wait_ok(pids[p], 60);
    fb_comm_tcp_listener_free(listener);
    listener = NULL;
    printf("a wrong length: an error on every process\n");
}

static void bad_arguments(void)
{
    char msg[256] = "";
    fb_comm *c = (fb_comm *)&msg, *keep = c;
    struct {
        int n_local, base, world, timeout;
        const char *addr;
        const char *word;
    } cases[] = {
        {1, 0, 0, 1000, "127.0.0.1:1", "world"},
        {1, 0, 65, 1000, "127.0.0.1:1", "world"},
        {0, 0, 2, 1000, "127.0.0.1:1", "do not fit"},
        {2, 1, 2, 1000, "127.0.0.1:1", "do not fit"},
        {1, -1, 2, 1000, "127.0.0.1:1", "do not fit"},
        {1, 1, 2, 0, "127.0.0.1:1", "timeout"},
        {1, 1, 2, 3600001, "127.0.0.1:1", "timeout"},
        {1, 1, 2, 1000, "127.0.0.1", "host:port"},
        {1, 1, 2, 1000, "127.0.0.1:99999", "port"},
        {1, 1, 2, 1000, "127.0.0.1:12a", "port"},
        {1, 1, 2, 1000, "::1:5000", "brackets"},
        {1, 1, 2, 1000, ":5000", "host"},
        {1, 1, 2, 1000, "127.0.0.1:0", "port 0"},
        {1, 1, 2, 1000, NULL, "address"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int err = fb_comm_tcp_new(cases[i].n_local, cases[i].base, cases[i].world, cases[i].addr,
                                  NULL, TOKEN, cases[i].timeout, &c, msg, sizeof msg);
        printf("refused: %s\n", msg);
        CHECK_INT_EQ(err, FB_ERR_OUT_OF_RANGE);
        CHECK(c == keep);
        CHECK(strstr(msg, cases[i].word) != NULL);
    }
    /* only rank 0's process listens */
    fb_comm_tcp_listener *l = xp_listen(root_addr, sizeof root_addr);
    CHECK_INT_EQ(fb_comm_tcp_new(1, 1, 2, root_addr, l, TOKEN, 1000, &c, msg, sizeof msg),
                 FB_ERR_OUT_OF_RANGE);
    CHECK(c == keep);
    fb_comm_tcp_listener_free(l);
    /* nobody listens: a member gives up at its timeout, naming the root */
    double t0 = xp_now();
    CHECK_INT_EQ(fb_comm_tcp_new(1, 1, 2, root_addr, NULL, TOKEN, 300, &c, msg, sizeof msg),
                 FB_ERR_IO);
    printf("no root: %s\n", msg);
    CHECK(xp_now() - t0 < 5);
    CHECK(strstr(msg, "rank 0") != NULL);
    CHECK(c == keep);
    /* a root whose members never come gives up at its timeout, naming them */
    l = xp_listen(root_addr, sizeof root_addr);
    CHECK_INT_EQ(fb_comm_tcp_new(1, 0, 3, root_addr, l, TOKEN, 300, &c, msg, sizeof msg),
                 FB_ERR_IO);
    printf("no members: %s\n", msg);
    CHECK(strstr(msg, "ranks 1, 2 did not join") != NULL);
    CHECK(c == keep);
    fb_comm_tcp_listener_free(l);
    fb_comm_tcp_listener_free(NULL);
    /* a listener on a malformed address */
    l = (fb_comm_tcp_listener *)&msg;
    int port = -7;
    CHECK_INT_EQ(fb_comm_tcp_listen("localhost", &l, &port, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK(l == (fb_comm_tcp_listener *)&msg && port == -7);
    /* the layout of a communicator that does not span processes */
    fb_comm *shm = NULL;
    CHECK_INT_EQ(fb_comm_shm_new(2, &shm, msg, sizeof msg), FB_OK);
    int base = -5;
    CHECK_INT_EQ(fb_comm_tcp_layout(shm, &base, NULL, msg, sizeof msg), FB_ERR_UNSUPPORTED);
    CHECK_INT_EQ(base, -5);
    fb_comm_free(shm);
}

/* A give-up check that says yes on its third call. */
static bool third_call(void *calls)
{
    return ++*(int *)calls >= 3;
}

typedef struct root_job {
    fb_comm_tcp_listener *l;
    int err;
} root_job;

/* A root of a world of three whose rank 2 never comes: it gives up at its 2 s timeout. */
static void *root_waiting(void *arg)
{
    root_job *j = arg;
    fb_comm *c = NULL;
    char msg[256];
    j->err = fb_comm_tcp_new(1, 0, 3, root_addr, j->l, TOKEN, 2000, &c, msg, sizeof msg);
    return NULL;
}

static void called_off(void)
{
    fb_comm *keep = (fb_comm *)&keep, *c = keep;
    char msg[256];
    int calls = 0;
    /* a root whose member has not come */
    fb_comm_tcp_listener *l = xp_listen(root_addr, sizeof root_addr);
    CHECK_INT_EQ(fb_comm_tcp_new_until(1, 0, 2, root_addr, l, TOKEN, OK_TIMEOUT_MS, third_call,
                                       &calls, &c, msg, sizeof msg),
                 FB_ERR_IO);
    printf("called off (root): %s, after %d checks\n", msg, calls);
    CHECK(strstr(msg, "called off") != NULL && calls == 3 && c == keep);
    fb_comm_tcp_listener_free(l);
    /* a member whose root does not listen (the listener is gone) */
    calls = 0;
    CHECK_INT_EQ(fb_comm_tcp_new_until(1, 1, 2, root_addr, NULL, TOKEN, OK_TIMEOUT_MS, third_call,
                                       &calls, &c, msg, sizeof msg),
                 FB_ERR_IO);
    printf("called off (member, no root): %s\n", msg);
    CHECK(strstr(msg, "called off") != NULL && calls == 3 && c == keep);
    /* a member that joined and waits for the root's go, which waits for rank 2 */
    root_job j = {.l = xp_listen(root_addr, sizeof root_addr), .err = 1};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, root_waiting, &j) == 0);
    /* its checks: before connecting (the root listens, so one try connects), after, and
     * then while it waits for the go: the third */
    calls = 0;
    CHECK_INT_EQ(fb_comm_tcp_new_until(1, 1, 3, root_addr, NULL, TOKEN, OK_TIMEOUT_MS, third_call,
                                       &calls, &c, msg, sizeof msg),
                 FB_ERR_IO);
    printf("called off (member, joined): %s\n", msg);
    CHECK(strstr(msg, "waiting for rank 0") != NULL && c == keep);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_INT_EQ(j.err, FB_ERR_IO); /* the root timed out on its own */
    fb_comm_tcp_listener_free(j.l);
}

int main(void)
{
    bad_arguments();
    called_off();

    /* other_addresses adds two worlds of {2, 1} */
    static const int w1[] = {3}, w2[] = {1, 1}, w3[] = {1, 2, 1}, w4[] = {2, 1, 1, 3};
    world_sums(1, w1);
    world_sums(2, w2);
    world_sums(3, w3);
    world_sums(4, w4);
    other_addresses();

    refusals();
    wrong_length();
    peer_lost(2, false);
    peer_lost(0, false);
    peer_lost(1, true);
    printf("ok\n");
    return 0;
}
