/*
 * The NCCL id exchange of CUDA groups that span workers (fb_comm_share_id,
 * the function the worker calls right after the rendezvous): two
 * processes, ranks 0..1 and rank 2 of a world of 3 over the TCP
 * communicator on loopback.  The 128 random bytes of rank 0's process
 * (0x00 and 0xff included) arrive bit for bit in the other, whatever it
 * passed; when the leader reports that it has no id, every process gets an
 * I/O error at once and keeps its bytes; a missing argument is refused
 * without communicating; the communicator still sums afterwards.  It needs
 * no GPU: the id is opaque bytes to the exchange.  Also the layouts that
 * data parallelism compares, and its refusals of communicators that do not
 * fit the devices (fb_dp_opts.control_comm), which change nothing.
 */
#include "parallel/xproc_util.h"

#include <errno.h>
#include <stdint.h>
#include <sys/random.h>

#include "device.h"
#include "data_parallel.h"
#include "jobspec.h"
#include "kernels.h"

#define WORLD 3

static const unsigned char TOKEN[FB_COMM_TOKEN_BYTES] = "a group secret of 32 bytes......";
static char root_addr[64];
static fb_comm_tcp_listener *listener;
static unsigned char leader_id[FB_COMM_ID_BYTES];

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

static void make_devs(fb_device *devs, int D, fb_device_kind kind)
{
    for (int d = 0; d < D; d++) {
        memset(&devs[d], 0, sizeof devs[d]);
        devs[d].kind = kind;
        devs[d].ordinal = d;
        snprintf(devs[d].name, sizeof devs[d].name, "dev%d", d);
        devs[d].memory_bytes = (uint64_t)1 << 28;
        devs[d].be = fb_backend_cpu();
    }
}

/* fb_dp_new must refuse opts and leave *out as it was. */
static void dp_refuses(const fb_device *devs, int D, const fb_dp_opts *o, int want,
                       const char *why)
{
    fb_job_spec spec;
    make_spec(&spec);
    const fb_job_spec *specs[1] = {&spec};
    char msg[256] = "";
    static char sentinel;
    fb_dp *keep = (fb_dp *)(void *)&sentinel; /* not NULL: it must survive the refusal */
    fb_dp *dp = keep;
    int err = fb_dp_new(devs, D, specs, 1, 12, o, &dp, msg, sizeof msg);
    if (err != want || !strstr(msg, why))
        fprintf(stderr, "fb_dp_new: %d (%s), wanted %d with \"%s\"\n", err, msg, want, why);
    CHECK_INT_EQ(err, want);
    CHECK(strstr(msg, why) != NULL);
    CHECK(dp == keep);
    fb_job_spec_free(&spec);
}

/* Each process writes the id it received, then the id after the leader's failure. */
static void proc_main(void *arg)
{
    const proc *p = arg;
    char msg[256];
    fb_comm *comm = xp_join(&listener, p->D, p->base, WORLD, root_addr, TOKEN, 3000);
    int err;

    int base = -1, world = -1;
    fb_comm_layout(comm, &base, &world);
    CHECK_INT_EQ(base, p->base);
    CHECK_INT_EQ(world, WORLD);

    /* the leader's bytes win; the other process passes something else */
    unsigned char id[FB_COMM_ID_BYTES];
    if (p->base == 0)
        memcpy(id, leader_id, sizeof id);
    else
        memset(id, 0xa5, sizeof id);
    CHECK_INT_EQ(fb_comm_share_id(comm, 1, id, msg, sizeof msg), FB_OK);
    xp_write_all(p->out_fd, id, sizeof id);

    /* a missing argument: refused alike everywhere, without communicating */
    CHECK_INT_EQ(fb_comm_share_id(comm, 1, NULL, msg, sizeof msg), FB_ERR_INTERNAL);
    CHECK_INT_EQ(fb_comm_share_id(NULL, 1, id, msg, sizeof msg), FB_ERR_INTERNAL);

    /* the leader could not make an id: everyone learns it, and no id changes */
    unsigned char before[FB_COMM_ID_BYTES];
    memset(id, p->base == 0 ? 0x11 : 0x22, sizeof id);
    memcpy(before, id, sizeof id);
    err = fb_comm_share_id(comm, p->base == 0 ? 0 : 1, id, msg, sizeof msg);
    CHECK_INT_EQ(err, FB_ERR_IO);
    CHECK(strstr(msg, "could not make an NCCL id") != NULL);
    CHECK(memcmp(id, before, sizeof id) == 0);

    /* the communicator is intact: a plain sum over the world still adds up */
    float a[2] = {1, 2}, b[2] = {10, 20};
    float *bufs[2] = {a, b};
    CHECK_INT_EQ(fb_comm_allreduce_sum(comm, bufs, 2, msg, sizeof msg), FB_OK);
    xp_write_all(p->out_fd, a, sizeof a);

    /* communicators that do not fit the devices are refused before anything is built */
    fb_device devs[2];
    make_devs(devs, p->D, FB_DEVICE_CUDA);
    fb_dp_opts o = {.threads = 1, .slow_rank = -1, .comm = comm};
    dp_refuses(devs, p->D, &o, FB_ERR_UNSUPPORTED, "need an NCCL communicator");
    o.control_comm = comm;
    dp_refuses(devs, p->D, &o, FB_ERR_UNSUPPORTED, "cannot sum the gradients of CUDA");
    make_devs(devs, p->D, FB_DEVICE_CPU);
    fb_comm *shm = NULL;
    CHECK_INT_EQ(fb_comm_shm_new(p->D, &shm, msg, sizeof msg), FB_OK);
    o.comm = shm; /* the local ranks alone, against the control's world of 3 */
    dp_refuses(devs, p->D, &o, FB_ERR_OUT_OF_RANGE, "the gradient communicator holds ranks");
    o.comm = NULL;
    dp_refuses(devs, p->D, &o, FB_ERR_UNSUPPORTED, "needs a gradient communicator");
    fb_comm_free(shm);

    fb_comm_free(comm);
    close(p->out_fd);
}

/* One process: the id stays as it is, the leader's failure still fails. */
static void one_process(void)
{
    char msg[256];
    fb_comm *shm = NULL;
    CHECK_INT_EQ(fb_comm_shm_new(3, &shm, msg, sizeof msg), FB_OK);
    int base = -1, world = -1;
    fb_comm_layout(shm, &base, &world);
    CHECK_INT_EQ(base, 0);
    CHECK_INT_EQ(world, 3);
    unsigned char id[FB_COMM_ID_BYTES];
    memcpy(id, leader_id, sizeof id);
    CHECK_INT_EQ(fb_comm_share_id(shm, 1, id, msg, sizeof msg), FB_OK);
    CHECK(memcmp(id, leader_id, sizeof id) == 0);
    memset(id, 0x33, sizeof id);
    CHECK_INT_EQ(fb_comm_share_id(shm, 0, id, msg, sizeof msg), FB_ERR_IO);
    for (size_t i = 0; i < sizeof id; i++)
        CHECK_INT_EQ(id[i], 0x33);
    fb_comm_free(shm);
}

int main(void)
{
    CHECK(getrandom(leader_id, sizeof leader_id, 0) == (ssize_t)sizeof leader_id);
    leader_id[0] = 0x00; /* the extremes of a byte */
    leader_id[1] = 0xff;
    leader_id[2] = 0x80;
    listener = xp_listen(root_addr, sizeof root_addr);
    int rd[2];
    proc ps[2] = {{.base = 0, .D = 2}, {.base = 2, .D = 1}};
    pid_t pids[2];
    for (int i = 0; i < 2; i++)
        pids[i] = xp_spawn_piped(proc_main, &ps[i], &ps[i].out_fd, &rd[i]);
    fb_comm_tcp_listener_free(listener);
    listener = NULL;
    for (int i = 0; i < 2; i++) {
        unsigned char id[FB_COMM_ID_BYTES];
        xp_read_all(rd[i], id, sizeof id);
        for (int k = 0; k < FB_COMM_ID_BYTES; k++)
            if (id[k] != leader_id[k]) {
                fprintf(stderr, "process %d byte %d: 0x%02x, the leader sent 0x%02x\n", i, k,
                        id[k], leader_id[k]);
                abort();
            }
        float sum[2];
        xp_read_all(rd[i], sum, sizeof sum);
        /* ranks 0, 1 of the first process and rank 2 of the second: 1 + 10 + 1, 2 + 20 + 2 */
        CHECK(sum[0] == 12.0f && sum[1] == 24.0f);
        close(rd[i]);
    }
    for (int i = 0; i < 2; i++)
        xp_wait_ok(pids[i], 30);
    one_process();
    printf("test_span_nccl_id: ok\n");
    return 0;
}
