/*
 * The control broadcast of groups that span workers (fb_dp_broadcast_i64,
 * fb_session_broadcast): two processes, ranks 0..1 and rank 2 of a world
 * of 3 over the TCP communicator on loopback.  The values of rank 0's
 * process arrive bit for bit in the other (extremes of int64 included,
 * whatever the other passed), before and after a training step that uses
 * the same communicator; bad counts are refused in both processes alike
 * and change nothing; when the other process goes away the broadcast fails
 * with an I/O error, within the timeout, and leaves the values untouched.
 * In one process (no communicator across processes) the values stay.
 */
#include "parallel/xproc_util.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "device.h"
#include "data_parallel.h"
#include "jobspec.h"
#include "kernels.h"
#include "session.h"

#define WORLD 3
#define N 6
#define BS 12

static const unsigned char TOKEN[FB_COMM_TOKEN_BYTES] = "a group secret of 32 bytes......";
static const int64_t SPLIT[WORLD] = {4, 3, 5};
static const int64_t ROOT[N] = {0, -1, INT64_MIN, INT64_MAX, ((int64_t)1 << 53) + 1, 12345};
static char root_addr[64];
static fb_comm_tcp_listener *listener;

typedef struct proc {
    int base, D;
    int out_fd;
} proc;

static void make_spec(fb_job_spec *s)
{
    static const char text[] =
        "{\"name\":\"b\",\"dataset\":\"synthetic\",\"model\":{\"input\":[4],"
        "\"layers\":[{\"type\":\"linear\",\"out\":3}]},\"batch_size\":12,\"steps\":5,"
        "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},\"seed\":1}";
    char msg[256];
    CHECK_INT_EQ(fb_job_spec_parse(text, sizeof text - 1, NULL, s, msg, sizeof msg), FB_OK);
}

static void make_devs(fb_device *devs, int D)
{
    for (int d = 0; d < D; d++) {
        memset(&devs[d], 0, sizeof devs[d]);
        devs[d].kind = FB_DEVICE_CPU;
        devs[d].ordinal = d;
        snprintf(devs[d].name, sizeof devs[d].name, "cpu%d", d);
        devs[d].memory_bytes = (uint64_t)1 << 28;
        devs[d].be = fb_backend_cpu();
    }
}

/* Each process writes what it received: the two broadcasts, then the large one's sum. */
static void proc_main(void *arg)
{
    const proc *p = arg;
    char msg[256];
    fb_comm *comm = xp_join(&listener, p->D, p->base, WORLD, root_addr, TOKEN, 3000);
    int err;
    fb_device devs[2];
    make_devs(devs, p->D);
    fb_job_spec spec;
    make_spec(&spec);
    const fb_job_spec *specs[1] = {&spec};
    fb_dp_opts o = {.threads = 1, .slow_rank = -1, .comm = comm};
    fb_dp *dp = NULL;
    CHECK_INT_EQ(fb_dp_new(devs, p->D, specs, 1, BS, &o, &dp, msg, sizeof msg), FB_OK);

    /* rank 0's values win; the other process passes something else */
    int64_t v[N];
    for (int i = 0; i < N; i++)
        v[i] = p->base == 0 ? ROOT[i] : 7 + i;
    CHECK_INT_EQ(fb_dp_broadcast_i64(dp, v, N, msg, sizeof msg), FB_OK);
    xp_write_all(p->out_fd, v, sizeof v);

    /* bad counts: refused alike everywhere, without communicating, v untouched */
    int64_t keep[N];
    memcpy(keep, v, sizeof v);
    CHECK_INT_EQ(fb_dp_broadcast_i64(dp, v, -1, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK_INT_EQ(fb_dp_broadcast_i64(dp, v, FB_DP_MAX_BROADCAST + 1, msg, sizeof msg),
                 FB_ERR_OUT_OF_RANGE);
    CHECK(strstr(msg, "a broadcast of 4097 values") != NULL);
    CHECK_INT_EQ(fb_dp_broadcast_i64(dp, NULL, 3, msg, sizeof msg), FB_ERR_INTERNAL);
    CHECK_INT_EQ(fb_dp_broadcast_i64(dp, v, 0, msg, sizeof msg), FB_OK);
    CHECK(memcmp(keep, v, sizeof v) == 0);

    /* a training step over the same communicator, then the largest broadcast */
    float x[BS * 4];
    int32_t y[BS];
    for (int i = 0; i < BS * 4; i++)
        x[i] = (float)((i * 37) % 11) / 11.0f;
    for (int i = 0; i < BS; i++)
        y[i] = i % 3;
    float loss[1];
    CHECK_INT_EQ(fb_dp_forward_backward(dp, x, y, BS, SPLIT, 0, loss, NULL, msg, sizeof msg),
                 FB_OK);
    int64_t *big = malloc(FB_DP_MAX_BROADCAST * sizeof *big);
    CHECK(big != NULL);
    for (int i = 0; i < FB_DP_MAX_BROADCAST; i++)
        big[i] = p->base == 0 ? (int64_t)i * -1000003 : 0x5555;
    CHECK_INT_EQ(fb_dp_broadcast_i64(dp, big, FB_DP_MAX_BROADCAST, msg, sizeof msg), FB_OK);
    int64_t bad = 0;
    for (int i = 0; i < FB_DP_MAX_BROADCAST; i++)
        bad += big[i] != (int64_t)i * -1000003;
    xp_write_all(p->out_fd, &bad, sizeof bad);
    xp_write_all(p->out_fd, loss, sizeof loss);

    /* the other process leaves: rank 0's next broadcast fails and changes nothing */
    if (p->base == 0) {
        for (int i = 0; i < N; i++)
            v[i] = ROOT[i];
        double t0 = xp_now();
        err = fb_dp_broadcast_i64(dp, v, N, msg, sizeof msg);
        fprintf(stderr, "broadcast without the peer: %s (%.0f ms)\n", msg, 1e3 * (xp_now() - t0));
        CHECK_INT_EQ(err, FB_ERR_IO);
        CHECK(xp_now() - t0 < 10.0);
        CHECK(memcmp(v, ROOT, sizeof v) == 0);
        CHECK_INT_EQ(fb_dp_broadcast_i64(dp, v, N, msg, sizeof msg), FB_ERR_IO);
    }
    free(big);
    fb_dp_free(dp);
    fb_comm_free(comm);
    fb_job_spec_free(&spec);
    close(p->out_fd);
}

/* In one process, the broadcast keeps the values: they are rank 0's already. */
static void one_process(void)
{
    char msg[256];
    fb_device devs[2];
    make_devs(devs, 2);
    fb_job_spec spec;
    make_spec(&spec);
    const fb_job_spec *specs[1] = {&spec};
    fb_dp_opts o = {.threads = 1, .slow_rank = -1};
    fb_dp *dp = NULL;
    CHECK_INT_EQ(fb_dp_new(devs, 2, specs, 1, BS, &o, &dp, msg, sizeof msg), FB_OK);
    int64_t v[N];
    memcpy(v, ROOT, sizeof v);
    CHECK_INT_EQ(fb_dp_broadcast_i64(dp, v, N, msg, sizeof msg), FB_OK);
    CHECK(memcmp(v, ROOT, sizeof v) == 0);
    CHECK_INT_EQ(fb_dp_broadcast_i64(dp, v, FB_DP_MAX_BROADCAST + 1, msg, sizeof msg),
                 FB_ERR_OUT_OF_RANGE);
    fb_dp_free(dp);
    fb_job_spec_free(&spec);
}

int main(void)
{
    listener = xp_listen(root_addr, sizeof root_addr);
    int rd[2];
    proc ps[2] = {{.base = 0, .D = 2}, {.base = 2, .D = 1}};
    pid_t pids[2];
    for (int i = 0; i < 2; i++)
        pids[i] = xp_spawn_piped(proc_main, &ps[i], &ps[i].out_fd, &rd[i]);
    fb_comm_tcp_listener_free(listener);
    listener = NULL;
    for (int i = 0; i < 2; i++) {
        int64_t v[N], bad;
        float loss[1];
        xp_read_all(rd[i], v, sizeof v);
        for (int k = 0; k < N; k++)
            if (v[k] != ROOT[k]) {
                fprintf(stderr, "process %d value %d: %lld, rank 0 sent %lld\n", i, k,
                        (long long)v[k], (long long)ROOT[k]);
                abort();
            }
        xp_read_all(rd[i], &bad, sizeof bad);
        CHECK_INT_EQ(bad, 0);
        xp_read_all(rd[i], loss, sizeof loss);
        CHECK(isfinite(loss[0]) && loss[0] > 0);
        close(rd[i]);
    }
    for (int i = 0; i < 2; i++)
        xp_wait_ok(pids[i], 30);
    /* after the children: this process starts the math library's threads only now */
    one_process();
    printf("test_span_broadcast: ok\n");
    return 0;
}
