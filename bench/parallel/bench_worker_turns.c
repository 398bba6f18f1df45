/*
 * Device turns on real step times, side by side in one run (the tests run the same
 * scenarios on scripted steps and the test's clock: tests/parallel/test_worker_turns.c and
 * the share scenario of tests/worker/test_worker.c).  On a fusebox-worker with four CPU
 * devices taking turns on all of a group's devices (--device-turns all):
 *   overlap  G0 trains alone on device 3, then G1 joins on device 1 and G2 on devices 1 and
 *            3: G0's rate beside the others over its rate alone (equal shares: about 1/2
 *            on device 3, which G2 takes as long as G0 does), and G1's and G2's rates;
 *   shares   two groups on device 0 with time shares 1 and 0.25, then 1 and 1: the ratio of
 *            their device time (4 and 1 by the shares).
 * Prints the ratios; what the machine's other load does to them is the point of measuring
 * on real time, so nothing is asserted but that every group trains.
 * Usage: bench_worker_turns (FB_BINARY_DIR=the build directory).
 */
#include "worker/worker_util.h"

#define F_IN 16
#define CLASSES 4
#define TENANT 0x7e
#define GROUPS 3

static char gids[GROUPS][FB_WIRE_ID_LEN + 1];
static long long last_step[GROUPS] = {-1, -1, -1};
static double device_ms[GROUPS]; /* (compute + io) per step x steps, summed over reports */

/* An ASSIGN (time share `share`) of one endless job (the worker is killed at the end) on D
 * devices. */
static void assign(wu_server *s, int g, int D, const int *devices, const int64_t *split,
                   double share)
{
    char id[FB_WIRE_ID_LEN + 1];
    wu_uuid(id, 0x20c, (unsigned long long)(100 * g + 1));
    fb_job_spec spec;
    char *json;
    wu_spec(&spec, &json,
            "{\"name\": \"t%d\", \"dataset\": \"synth\", \"model\": {\"input\": [%d], "
            "\"layers\": [{\"type\": \"linear\", \"out\": 64}, {\"type\": \"relu\"}, "
            "{\"type\": \"linear\", \"out\": %d}]}, \"batch_size\": 32, \"steps\": 1000000, "
            "\"optimizer\": {\"type\": \"sgd\", \"lr\": 0.001}, \"seed\": 7, "
            "\"data_seed\": 5, \"eval_every\": 0}",
            g, F_IN, CLASSES);
    fb_wire_msg m = {.type = FB_WIRE_ASSIGN,
                     .generation = 1,
                     .n_group_devices = D,
                     .parallel_data = D,
                     .parallel_pipeline = 1,
                     .n_split = D,
                     .time_share = share};
    snprintf(m.group_id, sizeof m.group_id, "%s", gids[g]);
    snprintf(m.fusion_key, sizeof m.fusion_key, "%s", spec.fusion_key);
    snprintf(m.dataset, sizeof m.dataset, "synth");
    for (int k = 0; k < D; k++) m.group_devices[k] = devices[k];
    for (int d = 0; d < D; d++) m.split[d] = split[d];
    m.n_members = 1;
    m.members = calloc(1, sizeof *m.members);
    CHECK(m.members != NULL);
    snprintf(m.members[0].job_id, sizeof m.members[0].job_id, "%s", id);
    wu_uuid(m.members[0].tenant_id, TENANT, 1);
    m.members[0].spec = strdup(json);
    CHECK(m.members[0].spec != NULL);
    wu_send(s, "w-turns", &m, NULL, NULL, 0);
    fb_wire_msg_free(&m);
    fb_job_spec_free(&spec);
    free(json);
}

/* Answers the worker for ms and adds each group's steps reported meanwhile to steps. */
static void pump(wu_server *s, int ms, long long steps[GROUPS])
{
    double end = wu_now_ms() + ms;
    for (int left; (left = (int)(end - wu_now_ms())) > 0;) {
        wu_msg w;
        if (!wu_next(s, left < 50 ? left : 50, true, &w)) continue;
        if (w.m.type == FB_WIRE_EVENT) {
            if (w.m.event == FB_EV_FAILED) fprintf(stderr, "failed: %s\n", w.m.text);
            CHECK(w.m.event != FB_EV_FAILED);
        }
        for (int g = 0; g < GROUPS && w.m.type == FB_WIRE_PROGRESS; g++) {
            if (strcmp(w.m.group_id, gids[g]) != 0 || w.m.n_progress < 1) continue;
            long long at = w.m.progress[0].step;
            if (last_step[g] >= 0) {
                steps[g] += at - last_step[g];
                device_ms[g] += (w.m.compute_ms + w.m.io_ms) * (double)(at - last_step[g]);
            }
            last_step[g] = at;
        }
        wu_msg_free(&w);
    }
}

int main(void)
{
    if (!getenv("FB_BINARY_DIR")) {
        fprintf(stderr, "bench_worker_turns: set FB_BINARY_DIR to the build directory\n");
        return 2;
    }
    wu_server s;
    wu_server_start(&s, "bench-turns", true);
    wu_make_dataset(s.data_dir, "synth", 512, 128, F_IN, CLASSES, 11);
    const char *extra[] = {"--cpu-devices", "4", "--device-turns", "all", NULL};
    pid_t pid = wu_start_worker(&s, "w-turns", extra);
    wu_msg w;
    wu_expect_hello(&s, "w-turns", 20000, &w);
    CHECK_INT_EQ(w.m.n_devices, 4);
    wu_msg_free(&w);
    wu_send_welcome(&s, "w-turns");
    for (int g = 0; g < GROUPS; g++) wu_uuid(gids[g], 0x7, (unsigned long long)(g + 1));

    const int dev3[1] = {3}, dev1[1] = {1}, dev13[2] = {1, 3};
    const int64_t one[1] = {32}, two[2] = {16, 16};
    long long warm[GROUPS] = {0}, alone[GROUPS] = {0}, shared[GROUPS] = {0};
    assign(&s, 0, 1, dev3, one, 1.0);
    pump(&s, 1000, warm);
    pump(&s, 2000, alone);
    assign(&s, 1, 1, dev1, one, 1.0);
    pump(&s, 500, warm);
    assign(&s, 2, 2, dev13, two, 1.0);
    pump(&s, 1000, warm);
    pump(&s, 3000, shared);
    double r_alone = alone[0] / 2.0, r_shared = shared[0] / 3.0;
    CHECK(alone[0] > 0 && shared[0] > 0 && shared[1] > 0 && shared[2] > 0);
    printf("| overlap | G0 alone | G0 beside G1, G2 | ratio | G1 | G2 |\n"
           "|---|---|---|---|---|---|\n");
    printf("| steps/s | %.0f | %.0f | %.2f | %.0f | %.0f |\n", r_alone, r_shared,
           r_shared / r_alone, shared[1] / 3.0, shared[2] / 3.0);
    for (int g = 0; g < GROUPS; g++) {
        fb_wire_msg d = {.type = FB_WIRE_DETACH, .generation = 1};
        snprintf(d.group_id, sizeof d.group_id, "%s", gids[g]);
        wu_send(&s, "w-turns", &d, NULL, NULL, 0);
    }
    pump(&s, 500, warm);

    /* shares: two new groups on device 0 */
    const int dev0[1] = {0};
    for (int g = 0; g < 2; g++) {
        wu_uuid(gids[g], 0x8, (unsigned long long)(g + 1));
        last_step[g] = -1;
    }
    assign(&s, 0, 1, dev0, one, 1.0);
    assign(&s, 1, 1, dev0, one, 0.25);
    printf("\n| shares | device ms A | device ms B | ratio A/B | by the shares |\n"
           "|---|---|---|---|---|\n");
    for (int round = 0; round < 2; round++) {
        long long steps[GROUPS] = {0};
        pump(&s, 1000, steps);
        device_ms[0] = device_ms[1] = 0;
        pump(&s, 2000, steps);
        CHECK(device_ms[0] > 0 && device_ms[1] > 0);
        printf("| %s | %.0f | %.0f | %.2f | %d |\n", round ? "1 : 1" : "1 : 0.25", device_ms[0],
               device_ms[1], device_ms[0] / device_ms[1], round ? 1 : 4);
        fb_wire_msg rb = {.type = FB_WIRE_REBALANCE, .generation = 1, .n_split = 1,
                          .split = {32}, .time_share = 1.0};
        snprintf(rb.group_id, sizeof rb.group_id, "%s", gids[1]);
        wu_send(&s, "w-turns", &rb, NULL, NULL, 0);
    }
    CHECK(kill(pid, SIGKILL) == 0);
    wu_wait(pid, 10000);
    wu_server_stop(&s);
    return 0;
}
