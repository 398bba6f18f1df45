/*
 * Data-parallel ranks in two processes: one with two CPU devices (ranks 0
 * and 1), one with one (rank 2), joined by the TCP communicator on
 * loopback, train a fused array of B = 4 with the uneven split 50/30/48 of
 * a global batch of 128 that both are handed.  Over 50 steps, every
 * member's loss follows the same array trained on one device within 1e-5
 * (relative), both processes report the same losses, and the three
 * replicas end with bit-identical parameters.  An MLP with dropout runs
 * with per-device statistics (it has no batch norm); a conv + batch-norm net
 * runs with synchronised batch norm, whose sums cross the processes too,
 * and (the check that the comparison can fail) does not follow one device
 * with per-device statistics.
 * Bad calls (a split that does not add up, pipeline stages, a communicator
 * of the wrong size or backend) are refused in every process alike, and the
 * group trains on afterwards.
 */
#include "xproc_util.h"

#include "engine/engine_util.h"
#include "par_util.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "array.h"
#include "device.h"
#include "data_parallel.h"
#include "kernels.h"

#define B 4
#define SIDE 6
#define CLASSES 5
#define BS 128
#define STEPS 50
#define WORLD 3
#define MAX_SHARD 64

_Static_assert(B == PU_B && SIDE == PU_SIDE && CLASSES == PU_CLASSES && STEPS == PU_STEPS,
               "the specs come from par_util.h");

static const int64_t SPLIT[WORLD] = {50, 30, 48};
static const unsigned char TOKEN[FB_COMM_TOKEN_BYTES] = "a group secret of 32 bytes......";
static char root_addr[64];
static fb_comm_tcp_listener *listener;
static fb_dataset ds;
static bool cnn, sync_bn;

/* All parameters of every member of a, member by member, tensor by tensor. */
static size_t params_of(const fb_array *a, float *out)
{
    size_t k = 0;
    for (int m = 0; m < B; m++)
        for (int t = 0; t < fb_array_tensor_count(a, FB_ARRAY_PARAM); t++) {
            if (out) fb_array_get(a, m, FB_ARRAY_PARAM, t, out + k);
            k += fb_array_tensor_at(a, FB_ARRAY_PARAM, t).numel;
        }
    return k;
}

/* The single-device trajectory and final parameters. */
static void reference(float loss[STEPS][B], float *params)
{
    char msg[256];
    fb_job_spec *s[B];
    pu_make_bs(cnn, BS, s);
    fb_array *a = NULL;
    CHECK_INT_EQ(fb_array_new(fb_backend_cpu(), (const fb_job_spec *const *)s, B, BS, &a, msg,
                              sizeof msg),
                 FB_OK);
    float *x = malloc((size_t)BS * SIDE * SIDE * sizeof *x);
    int32_t y[BS];
    fb_optim_hparams hp[B];
    CHECK(x != NULL);
    for (int t = 0; t < STEPS; t++) {
        xp_batch(&ds, t, BS, x, y);
        CHECK_INT_EQ(fb_array_forward_backward(a, x, y, BS, true, (uint64_t)t, loss[t], NULL, msg,
                                               sizeof msg),
                     FB_OK);
        for (int b = 0; b < B; b++) fb_array_hparams(a, b, t + 1, STEPS, &hp[b]);
        fb_array_step(a, hp);
    }
    params_of(a, params);
    free(x);
    fb_array_free(a);
    pu_free_specs(s);
}

typedef struct proc {
    int base, D;
    int out_fd; /* the losses, then each local replica's parameters */
} proc;

/* The reference in a process of its own: the test process itself never
 * starts the math library's threads, which a forked child would inherit
 * half-alive (and the leak checker would blame on it). */
static void reference_main(void *arg)
{
    const proc *p = arg;
    static float loss[STEPS][B];
    fb_job_spec *s[B];
    pu_make_bs(cnn, BS, s);
    fb_array *shape = NULL;
    char msg[256];
    CHECK_INT_EQ(fb_array_new(fb_backend_cpu(), (const fb_job_spec *const *)s, B, 1, &shape, msg,
                              sizeof msg),
                 FB_OK);
    size_t P = params_of(shape, NULL), want = 0;
    for (int m = 0; m < B; m++) want += (size_t)s[m]->n_params;
    CHECK_INT_EQ(P, want); /* what the test process expects to read */
    fb_array_free(shape);
    pu_free_specs(s);
    float *params = malloc(P * sizeof *params);
    CHECK(params != NULL);
    reference(loss, params);
    xp_write_all(p->out_fd, loss, sizeof loss);
    xp_write_all(p->out_fd, params, P * sizeof *params);
    close(p->out_fd);
    free(params);
}

/* Refusals that must change nothing, made before the group trains. */
static void refusals(const proc *p, fb_comm *comm, fb_device *devs, fb_job_spec **s)
{
    char msg[256];
    fb_dp *dp = (fb_dp *)&msg, *keep = dp;
    fb_dp_opts o = {.threads = 1, .slow_rank = -1, .comm = comm};
    /* a communicator holding another number of local ranks than the devices */
    fb_device more[3];
    for (int d = 0; d < 3; d++) more[d] = devs[0];
    CHECK_INT_EQ(fb_dp_new(more, p->D + 1, (const fb_job_spec *const *)s, B, MAX_SHARD, &o, &dp,
                           msg, sizeof msg),
                 FB_ERR_OUT_OF_RANGE);
    CHECK(strstr(msg, "local ranks") != NULL);
    CHECK(dp == keep);
    /* a communicator whose ranks are all in this process */
    fb_comm *shm = NULL;
    CHECK_INT_EQ(fb_comm_shm_new(p->D, &shm, msg, sizeof msg), FB_OK);
    o.comm = shm;
    CHECK_INT_EQ(fb_dp_new(devs, p->D, (const fb_job_spec *const *)s, B, MAX_SHARD, &o, &dp, msg,
                           sizeof msg),
                 FB_ERR_UNSUPPORTED);
    CHECK(strstr(msg, "does not span processes") != NULL);
    CHECK(dp == keep);
    fb_comm_free(shm);
}

static void proc_main(void *arg)
{
    const proc *p = arg;
    char msg[256];
    fb_comm *comm = xp_join(&listener, p->D, p->base, WORLD, root_addr, TOKEN, 20000);
    int err;

    fb_device devs[2];
    for (int d = 0; d < p->D; d++) {
        memset(&devs[d], 0, sizeof devs[d]);
        devs[d].kind = FB_DEVICE_CPU;
        devs[d].ordinal = d;
        snprintf(devs[d].name, sizeof devs[d].name, "cpu%d", d);
        devs[d].memory_bytes = (uint64_t)1 << 28;
        devs[d].be = fb_backend_cpu();
    }
    fb_job_spec *s[B];
    pu_make_bs(cnn, BS, s);
    refusals(p, comm, devs, s);
    fb_dp_opts o = {.bucket_bytes = 2048, .threads = 1, .slow_rank = -1, .sync_bn = sync_bn,
                    .comm = comm};
    fb_dp *dp = NULL;
    err = fb_dp_new(devs, p->D, (const fb_job_spec *const *)s, B, MAX_SHARD, &o, &dp, msg,
                    sizeof msg);
    if (err) fprintf(stderr, "rank %d: fb_dp_new: %s\n", p->base, msg);
    CHECK_INT_EQ(err, FB_OK);
    CHECK_INT_EQ(fb_dp_ranks(dp), p->D);
    CHECK_INT_EQ(fb_dp_world(dp), WORLD);

    float *x = malloc((size_t)BS * SIDE * SIDE * sizeof *x);
    int32_t y[BS];
    float loss[STEPS][B], before[B] = {-1, -1, -1, -1};
    fb_optim_hparams hp[B];
    CHECK(x != NULL);
    for (int t = 0; t < STEPS; t++) {
        xp_batch(&ds, t, BS, x, y);
        if (t == 3) {
            /* refused alike in every process, before any collective: nothing ran */
            int64_t bad[WORLD] = {50, 30, 47};
            CHECK_INT_EQ(fb_dp_forward_backward(dp, x, y, BS, bad, (uint64_t)t, before, NULL,
                                                msg, sizeof msg),
                         FB_ERR_OUT_OF_RANGE);
            CHECK(strstr(msg, "adds up to 127") != NULL);
            CHECK(before[0] == -1);
            float *out = malloc((size_t)B * BS * CLASSES * sizeof *out);
            CHECK(out != NULL);
            CHECK_INT_EQ(fb_dp_stage_forward(dp, x, BS, SPLIT, (uint64_t)t, out, msg, sizeof msg),
                         FB_ERR_UNSUPPORTED);
            CHECK(strstr(msg, "pipeline") != NULL);
            free(out);
        }
        err = fb_dp_forward_backward(dp, x, y, BS, SPLIT, (uint64_t)t, loss[t], NULL, msg,
                                     sizeof msg);
        if (err) fprintf(stderr, "rank %d, step %d: %s\n", p->base, t, msg);
        CHECK_INT_EQ(err, FB_OK);
        for (int b = 0; b < B; b++) fb_array_hparams(fb_dp_array(dp, 0), b, t + 1, STEPS, &hp[b]);
        fb_dp_step(dp, hp);
    }
    fb_dp_times tm = fb_dp_take_times(dp);
    CHECK_INT_EQ(tm.steps, STEPS);
    for (int d = 0; d < p->D; d++) CHECK_INT_EQ(tm.samples[d], STEPS * SPLIT[p->base + d]);
    xp_write_all(p->out_fd, loss, sizeof loss);
    size_t P = params_of(fb_dp_array(dp, 0), NULL);
    float *v = malloc(P * sizeof *v);
    CHECK(v != NULL);
    for (int d = 0; d < p->D; d++) {
        params_of(fb_dp_array(dp, d), v);
        xp_write_all(p->out_fd, v, P * sizeof *v);
    }
    close(p->out_fd);
    free(v);
    free(x);
    fb_dp_free(dp);
    fb_comm_free(comm);
    pu_free_specs(s);
}

/* Trains in two processes; the losses must follow one device's when match. */
static void run(bool with_cnn, bool with_sync_bn, bool match)
{
    cnn = with_cnn;
    sync_bn = with_sync_bn;
    /* ranks 0..1, rank 2, and the single-device reference, all at once */
    int rd[3];
    proc ps[3] = {{.base = 0, .D = 2}, {.base = 2, .D = 1}, {.base = -1}};
    pid_t pids[3];
    listener = xp_listen(root_addr, sizeof root_addr);
    for (int i = 0; i < 3; i++)
        pids[i] = xp_spawn_piped(i < 2 ? proc_main : reference_main, &ps[i], &ps[i].out_fd,
                                 &rd[i]);
    fb_comm_tcp_listener_free(listener);
    listener = NULL;

    /* the parameters' count, from the specs alone */
    fb_job_spec *s[B];
    pu_make_bs(cnn, BS, s);
    size_t P = 0;
    for (int m = 0; m < B; m++) P += (size_t)s[m]->n_params;
    pu_free_specs(s);
    static float ref[STEPS][B], got[2][STEPS][B];
    float *ref_params = malloc(P * sizeof(float));
    float *params = malloc(3 * P * sizeof(float));
    CHECK(ref_params && params);
    xp_read_all(rd[0], got[0], sizeof got[0]);
    xp_read_all(rd[0], params, 2 * P * sizeof(float));
    xp_read_all(rd[1], got[1], sizeof got[1]);
    xp_read_all(rd[1], params + 2 * P, P * sizeof(float));
    xp_read_all(rd[2], ref, sizeof ref);
    xp_read_all(rd[2], ref_params, P * sizeof(float));
    for (int i = 0; i < 3; i++) {
        close(rd[i]);
        xp_wait_ok(pids[i], 50);
    }
    /* the trajectory moves: a comparison against a constant would pass anyway */
    CHECK(fabs(ref[STEPS - 1][0] - ref[0][0]) > 1e-2);

    /* both processes report the one global loss */
    CHECK(memcmp(got[0], got[1], sizeof got[0]) == 0);
    double worst = 0;
    for (int t = 0; t < STEPS; t++)
        for (int b = 0; b < B; b++) {
            CHECK(isfinite(got[0][t][b]));
            double e = fabs(got[0][t][b] - ref[t][b]) / fmax(fabs(ref[t][b]), 1e-12);
            if (e > worst) worst = e;
        }
    /* the three replicas, in two processes, hold the same floats */
    CHECK(memcmp(params, params + P, P * sizeof(float)) == 0);
    CHECK(memcmp(params, params + 2 * P, P * sizeof(float)) == 0);
    double dmax = 0, pmax = 0;
    for (size_t i = 0; i < P; i++) {
        dmax = fmax(dmax, fabs((double)params[i] - ref_params[i]));
        pmax = fmax(pmax, fabs((double)ref_params[i]));
    }
    printf("%-40s worst relative loss error %.3g (%s 1e-05), "
           "parameters off by %.3g of their largest\n",
           !with_cnn ? "mlp with dropout, 50/30/48"
           : with_sync_bn ? "conv+bn, synchronised bn, 50/30/48"
                          : "conv+bn, per-device bn, 50/30/48",
           worst, match ? "must be <=" : "must be >", dmax / pmax);
    if (match) {
        CHECK(worst <= 1e-5);
        CHECK(dmax <= 1e-4 * pmax);
    } else {
        CHECK(worst > 1e-5);
    }
    free(ref_params);
    free(params);
}

int main(void)
{
    ds = et_synthetic(512, SIDE, CLASSES, 5);
    run(false, false, true);
    run(true, true, true);
    /* the check that the comparison can fail: per-device statistics depend on the split */
    run(true, false, false);
    free(ds.x);
    free(ds.y);
    printf("ok\n");
    return 0;
}
