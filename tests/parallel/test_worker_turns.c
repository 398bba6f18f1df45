/*
 * Device turns between groups whose devices overlap, on a fusebox-worker with four CPU
 * devices taking turns on all of a group's devices, as CUDA devices do by default
 * (--device-turns all; docs/worker.md): G0 trains alone on device 3 for a few seconds, G1 starts on
 * device 1, then G2, data-parallel over devices 1 and 3, joins both.  Each device keeps
 * its own virtual time, which a newcomer joins at its smallest, so neither G0, whose device
 * has run for seconds, nor G2, which arrives last, is held back while the other catches
 * up: after G2 joins, G0 still makes at least a twentieth of its alone rate and G1 and G2
 * train too.  (With one virtual time per group across devices, G2 started at device 1's
 * young clock and G0 made a few hundredths of its rate for as long as G2 needed to catch
 * up; starting G2 at device 3's clock instead stalls G2.)
 */
#include "worker/worker_util.h"

#define F_IN 16
#define CLASSES 4
#define TENANT 0x7e
#define GROUPS 3

static char gids[GROUPS][FB_WIRE_ID_LEN + 1];
static long long last_step[GROUPS] = {-1, -1, -1};

/* An ASSIGN of one endless job (the worker is killed at the end) on D devices. */
static void assign(wu_server *s, int g, int D, const int *devices, const int64_t *split)
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
                     .time_share = 1.0};
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
            if (last_step[g] >= 0) steps[g] += at - last_step[g];
            last_step[g] = at;
        }
        wu_msg_free(&w);
    }
}

int main(void)
{
    wu_server s;
    wu_server_start(&s, "turns", true);
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
    assign(&s, 0, 1, dev3, one);
    pump(&s, 1000, warm);
    pump(&s, 2000, alone); /* G0 alone: its clock on device 3 runs ahead */
    assign(&s, 1, 1, dev1, one);
    pump(&s, 500, warm);
    assign(&s, 2, 2, dev13, two);
    pump(&s, 1000, warm);
    pump(&s, 3000, shared);
    double r_alone = alone[0] / 2.0, r_shared = shared[0] / 3.0;
    printf("G0 alone on device 3: %.0f steps/s; beside G1 (device 1) and G2 (devices 1 and 3): "
           "G0 %.0f, G1 %.0f, G2 %.0f steps/s\n",
           r_alone, r_shared, shared[1] / 3.0, shared[2] / 3.0);
    CHECK(alone[0] > 0);
    CHECK(r_shared > r_alone / 20);
    CHECK(shared[1] > 0 && shared[2] > 0);

    CHECK(kill(pid, SIGKILL) == 0);
    wu_wait(pid, 10000);
    wu_server_stop(&s);
    printf("ok\n");
    return 0;
}
