/*
 * Resuming from a full-state checkpoint continues exactly (session.h).
 *
 * For three arrays of B = 3 members (an MLP with dropout under Adam with a
 * cosine schedule; the same MLP under SGD with momentum, Nesterov and
 * dampening; a CNN with batch norm under AdamW), on a shuffled in-memory
 * dataset (10 steps per epoch, so the cut at step 17 falls mid-epoch):
 *   - a straight run of 40 steps is the reference;
 *   - a run cut after 17 steps, checkpointed member by member, freed, and
 *     resumed in a new session at start_step 17 from those checkpoints must
 *     give bit-identical losses at every step from 18 on, bit-identical
 *     full-state checkpoints at steps 20 and 30 (optimizer state and
 *     batch-norm counters included) and bit-identical final models;
 *   - resuming at 17 without restoring must not (the comparison can fail);
 *   - one member resumed alone (B = 1) from the B = 3 checkpoint follows
 *     its B = 3 trajectory within the fusion tolerance of tests/engine
 *     (losses relative 1e-5, weights normalised 1e-4): the GEMM shapes
 *     change with B, so the sums may round differently.
 */
#include "session_util.h"

#define N_TRAIN 160
#define N_TEST 48
#define SIDE 8
#define CLASSES 5
#define BS 16
#define STEPS 40
#define CUT 17
#define B 3

#define LOSS_TOL 1e-5
#define WEIGHT_TOL 1e-4

typedef enum case_kind { CASE_MLP_ADAM, CASE_MLP_SGD, CASE_CNN_ADAMW, N_CASES } case_kind;

static const char *const case_names[] = {"mlp-adam", "mlp-sgd-nesterov", "cnn-bn-adamw"};

static fb_dataset train, test;
static double worst_solo_loss, worst_solo_weight, worst_solo_abs;

static const char *layers(case_kind c)
{
    if (c != CASE_CNN_ADAMW)
        return "[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":24},{\"type\":\"relu\"},"
               "{\"type\":\"dropout\",\"p\":0.25},{\"type\":\"linear\",\"out\":5}]";
    return "[{\"type\":\"conv2d\",\"out\":4,\"kernel\":[3,3],\"padding\":[1,1],\"bias\":false},"
           "{\"type\":\"batchnorm\"},{\"type\":\"relu\"},{\"type\":\"maxpool2d\",\"kernel\":[2,2]},"
           "{\"type\":\"flatten\"},{\"type\":\"dropout\",\"p\":0.1},"
           "{\"type\":\"linear\",\"out\":5}]";
}

static fb_job_spec *member(case_kind c, int i)
{
    char o[256];
    if (c == CASE_MLP_ADAM)
        snprintf(o, sizeof o,
                 "{\"type\":\"adam\",\"lr\":%g,\"betas\":[%g,0.99],\"weight_decay\":%g}",
                 0.01 * (1 + 0.5 * i), 0.9 - 0.05 * i, i == 2 ? 1e-3 : 0.0);
    else if (c == CASE_MLP_SGD)
        snprintf(o, sizeof o,
                 "{\"type\":\"sgd\",\"lr\":%g,\"momentum\":%g,\"nesterov\":%s,\"dampening\":%g,"
                 "\"weight_decay\":%g}",
                 0.05 + 0.02 * i, 0.8 + 0.05 * i, i == 1 ? "false" : "true", i == 1 ? 0.1 : 0.0,
                 i == 0 ? 5e-4 : 0.0);
    else
        snprintf(o, sizeof o, "{\"type\":\"adamw\",\"lr\":%g,\"weight_decay\":%g}", 0.005 * (1 + i),
                 0.01 * (1 + i));
    return et_spec("{\"name\":\"%s-%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
                   "\"layers\":%s},\"batch_size\":%d,\"steps\":%d,\"optimizer\":%s,"
                   "\"schedule\":{\"type\":\"cosine\",\"warmup_steps\":5},\"seed\":%d,"
                   "\"data_seed\":9,\"eval_every\":10,\"checkpoint_every\":10}",
                   case_names[c], i, SIDE, SIDE, layers(c), BS, STEPS, o, 100 + 7 * i);
}

/* The checkpoint of `log` at `step` for member m. */
static const su_blob *ckpt_at(const su_log *log, int m, int64_t step)
{
    for (int k = 0; k < log->ckpts[m]; k++)
        if (log->ckpt[m][k].step == step) return &log->ckpt[m][k];
    fprintf(stderr, "member %d has no checkpoint at step %lld\n", m, (long long)step);
    abort();
}

static void run_case(case_kind c)
{
    fb_job_spec *specs[B];
    for (int i = 0; i < B; i++)
        specs[i] = member(c, i);
    static su_log straight, part, resumed, fresh, solo;

    /* the reference: 40 steps in one go */
    su_log_init(&straight);
    fb_session *s = su_open(specs, B, &train, &test, 0, NULL, true, &straight);
    su_step_to(s, -1);
    CHECK(fb_session_done(s));
    CHECK_INT_EQ(fb_session_size(s), 0);
    fb_session_free(s);
    for (int i = 0; i < B; i++) {
        CHECK_INT_EQ(straight.dones[i], 1);
        CHECK_INT_EQ(straight.ckpts[i], 3); /* 10, 20, 30; not at the last step */
        CHECK_INT_EQ(straight.steps[i], STEPS);
    }

    /* cut after 17 steps: checkpoint every member, drop the session */
    su_log_init(&part);
    s = su_open(specs, B, &train, &test, 0, NULL, true, &part);
    su_step_to(s, CUT);
    CHECK_INT_EQ(fb_session_steps_done(s), CUT);
    void *ck[B];
    size_t ck_len[B];
    for (int i = 0; i < B; i++)
        ck[i] = su_checkpoint(s, i, &ck_len[i]);
    fb_session_free(s);
    for (int i = 0; i < B; i++)
        for (int st = 1; st <= CUT; st++)
            CHECK(memcmp(&part.loss[i][st], &straight.loss[i][st], sizeof(double)) == 0);

    /* a new session at step 17 from the checkpoints */
    su_log_init(&resumed);
    s = su_open(specs, B, &train, &test, CUT, NULL, true, &resumed);
    CHECK_INT_EQ(fb_session_steps_done(s), CUT);
    for (int i = 0; i < B; i++)
        su_restore(s, i, ck[i], ck_len[i]);
    su_step_to(s, -1);
    fb_session_free(s);
    int64_t checked = 0;
    for (int i = 0; i < B; i++) {
        CHECK_INT_EQ(resumed.steps[i], STEPS - CUT);
        for (int st = 1; st <= CUT; st++)
            CHECK(isnan(resumed.loss[i][st]));
        for (int st = CUT + 1; st <= STEPS; st++) {
            if (memcmp(&resumed.loss[i][st], &straight.loss[i][st], sizeof(double)) != 0) {
                fprintf(stderr, "%s member %d step %d: loss %.9g resumed, %.9g straight\n",
                        case_names[c], i, st, resumed.loss[i][st], straight.loss[i][st]);
                abort();
            }
            checked++;
        }
        CHECK_INT_EQ(resumed.ckpts[i], 2); /* 20, 30 */
        for (int64_t at = 20; at <= 30; at += 10) {
            const su_blob *x = ckpt_at(&resumed, i, at), *y = ckpt_at(&straight, i, at);
            CHECK_INT_EQ(x->len, y->len);
            CHECK(memcmp(x->data, y->data, x->len) == 0);
        }
        CHECK_INT_EQ(resumed.dones[i], 1);
        CHECK_INT_EQ(resumed.done[i].len, straight.done[i].len);
        CHECK(memcmp(resumed.done[i].data, straight.done[i].data, resumed.done[i].len) == 0);
    }

    /* the same start without the checkpoints ends elsewhere: the comparison has teeth */
    su_log_init(&fresh);
    s = su_open(specs, B, &train, &test, CUT, NULL, true, &fresh);
    su_step_to(s, -1);
    fb_session_free(s);
    for (int i = 0; i < B; i++) {
        CHECK_INT_EQ(fresh.dones[i], 1);
        CHECK(fresh.done[i].len != straight.done[i].len ||
              memcmp(fresh.done[i].data, straight.done[i].data, fresh.done[i].len) != 0);
        CHECK(fresh.loss[i][CUT + 1] != straight.loss[i][CUT + 1]);
    }

    /* each member alone (B = 1) from its B = 3 checkpoint */
    for (int i = 0; i < B; i++) {
        su_log_init(&solo);
        s = su_open(&specs[i], 1, &train, &test, CUT, NULL, true, &solo);
        su_restore(s, 0, ck[i], ck_len[i]);
        su_step_to(s, -1);
        fb_session_free(s);
        double worst_loss = 0;
        for (int st = CUT + 1; st <= STEPS; st++) {
            double a = solo.loss[0][st], b = straight.loss[i][st];
            CHECK(isfinite(a));
            worst_loss = fmax(worst_loss, fabs(a - b) / fmax(fabs(b), 1e-12));
        }
        double max_abs;
        double werr = su_compare(solo.done[0].data, solo.done[0].len, straight.done[i].data,
                                 straight.done[i].len, &max_abs);
        printf("  %s member %d alone from the B=3 checkpoint: losses %.3g (relative), "
               "weights %.3g (normalised), max abs diff %.3g\n",
               case_names[c], i, worst_loss, werr, max_abs);
        CHECK(worst_loss <= LOSS_TOL);
        CHECK(werr <= WEIGHT_TOL);
        worst_solo_loss = fmax(worst_solo_loss, worst_loss);
        worst_solo_weight = fmax(worst_solo_weight, werr);
        worst_solo_abs = fmax(worst_solo_abs, max_abs);
        su_log_free(&solo);
    }
    printf("%s: resumed at step %d: %lld losses, 6 checkpoints and 3 models bit-identical\n",
           case_names[c], CUT, (long long)checked);

    for (int i = 0; i < B; i++) {
        free(ck[i]);
        et_spec_free(specs[i]);
    }
    su_log_free(&straight);
    su_log_free(&part);
    su_log_free(&resumed);
    su_log_free(&fresh);
}

int main(void)
{
    train = et_synthetic(N_TRAIN, SIDE, CLASSES, 1);
    test = et_synthetic(N_TEST, SIDE, CLASSES, 2);
    for (int c = 0; c < N_CASES; c++)
        run_case((case_kind)c);
    printf("alone vs in the array: worst loss %.3g (bound %g), weights %.3g (bound %g), "
           "max abs diff %.3g\n",
           worst_solo_loss, LOSS_TOL, worst_solo_weight, WEIGHT_TOL, worst_solo_abs);
    fb_dataset_free(&train);
    fb_dataset_free(&test);
    return 0;
}
