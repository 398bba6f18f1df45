/*
 * Pipeline plan: stages balanced by FLOPs (checked against every possible
 * cut by brute force), the 1F1B order (each stage runs every micro-batch's
 * forward and backward once, a backward never before its forward, at most
 * P - s forwards in flight), and the simulated bubble against the formula
 * (P-1)/(m+P-1) for equal stages.  Bad arguments are refused.
 */
#include "check.h"
#include "engine/engine_util.h"

#include "errors.h"
#include "pipeline_plan.h"

static double cost(const fb_job_spec *s, int a, int b)
{
    double c = 0;
    for (int i = a; i < b; i++) {
        double v = s->layers[i].flops_fwd + s->layers[i].flops_bwd;
        c += v > 0 ? v : 1e-3;
    }
    return c;
}

static void check_partition(const fb_job_spec *s)
{
    int n = s->n_layers;
    for (int P = 1; P <= 3 && P <= n; P++) {
        int first[4];
        char msg[128];
        CHECK_INT_EQ(fb_pipeline_partition(s, P, first, msg, sizeof msg), FB_OK);
        CHECK_INT_EQ(first[0], 0);
        CHECK_INT_EQ(first[P], n);
        double worst = 0;
        for (int p = 0; p < P; p++) {
            CHECK(first[p + 1] > first[p]);
            if (p > 0) CHECK(fb_pipeline_can_cut(s, first[p]));
            worst = fmax(worst, cost(s, first[p], first[p + 1]));
        }
        /* brute force over every cut into at most 3 stages */
        double best = INFINITY;
        if (P == 1) best = cost(s, 0, n);
        for (int i = 1; P == 2 && i < n; i++)
            if (fb_pipeline_can_cut(s, i)) best = fmin(best, fmax(cost(s, 0, i), cost(s, i, n)));
        for (int i = 1; P == 3 && i < n; i++)
            for (int j = i + 1; j < n; j++)
                if (fb_pipeline_can_cut(s, i) && fb_pipeline_can_cut(s, j))
                    best = fmin(best, fmax(cost(s, 0, i), fmax(cost(s, i, j), cost(s, j, n))));
        CHECK(fabs(worst - best) <= 1e-9 * best);
        printf("P=%d: stages start at", P);
        for (int p = 0; p < P; p++) printf(" %d", first[p]);
        printf(", largest stage %.4g of %.4g FLOPs\n", worst, cost(s, 0, n));
    }
}

static void check_1f1b(int P, int m)
{
    for (int s = 0; s < P; s++) {
        fb_pipe_op ops[64];
        CHECK_INT_EQ(fb_pipeline_1f1b(P, m, s, ops, 64), 2 * m);
        int fwd_seen[32] = {0}, bwd_seen[32] = {0}, in_flight = 0, max_flight = 0;
        int next_f = 0, next_b = 0;
        for (int k = 0; k < 2 * m; k++) {
            int mb = ops[k].micro;
            CHECK(mb >= 0 && mb < m);
            if (!ops[k].backward) {
                CHECK_INT_EQ(mb, next_f++); /* forwards in micro-batch order */
                fwd_seen[mb]++;
                in_flight++;
            } else {
                CHECK_INT_EQ(mb, next_b++);
                CHECK_INT_EQ(fwd_seen[mb], 1);
                bwd_seen[mb]++;
                in_flight--;
            }
            if (in_flight > max_flight) max_flight = in_flight;
        }
        for (int i = 0; i < m; i++) CHECK(fwd_seen[i] == 1 && bwd_seen[i] == 1);
        CHECK(max_flight <= P - s);
    }
    double tf[8], tb[8], span, bubble;
    for (int s = 0; s < P; s++) {
        tf[s] = 1;
        tb[s] = 2;
    }
    CHECK_INT_EQ(fb_pipeline_simulate(P, m, tf, tb, &span, &bubble), FB_OK);
    double formula = fb_pipeline_bubble_formula(P, m);
    printf("P=%d m=%d: simulated bubble %.4f, formula %.4f, makespan %.1f\n", P, m, bubble,
           formula, span);
    CHECK(fabs(bubble - formula) < 1e-12);
    CHECK(fabs(span - (m + P - 1) * 3.0) < 1e-12);
}

int main(void)
{
    fb_job_spec *s = et_spec(
        "{\"name\":\"p\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,8,8],"
        "\"layers\":[{\"type\":\"conv2d\",\"out\":8,\"kernel\":3,\"padding\":1},"
        "{\"type\":\"relu\"},{\"type\":\"conv2d\",\"out\":8,\"kernel\":3,\"padding\":1},"
        "{\"type\":\"relu\"},{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":64},"
        "{\"type\":\"relu\"},{\"type\":\"linear\",\"out\":10}]},\"batch_size\":8,\"steps\":1,"
        "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1}}");
    check_partition(s);
    check_1f1b(2, 4);
    check_1f1b(4, 8);
    check_1f1b(3, 1);

    /* unequal stages: the slowest stage sets the pace, the bubble grows */
    double tf[2] = {1, 3}, tb[2] = {2, 6}, span, bubble;
    CHECK_INT_EQ(fb_pipeline_simulate(2, 4, tf, tb, &span, &bubble), FB_OK);
    CHECK(bubble > fb_pipeline_bubble_formula(2, 4));

    char msg[128] = "";
    int first[70] = {-7};
    CHECK_INT_EQ(fb_pipeline_partition(s, 0, first, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK_INT_EQ(fb_pipeline_partition(s, s->n_layers + 1, first, msg, sizeof msg),
                 FB_ERR_OUT_OF_RANGE);
    /* 5 stages need 4 cuts; the model has 3 (before layers 2, 5 and 7) */
    CHECK_INT_EQ(fb_pipeline_partition(s, 5, first, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    printf("refused: %s\n", msg);
    CHECK(strstr(msg, "3 places") != NULL);
    CHECK_INT_EQ(first[0], -7);
    CHECK(strstr(msg, "stages") != NULL);
    fb_pipe_op ops[4];
    CHECK_INT_EQ(fb_pipeline_1f1b(2, 4, 0, ops, 4), FB_ERR_OUT_OF_RANGE);
    CHECK_INT_EQ(fb_pipeline_1f1b(2, 2, 2, ops, 4), FB_ERR_OUT_OF_RANGE);
    CHECK_INT_EQ(fb_pipeline_simulate(0, 4, tf, tb, &span, &bubble), FB_ERR_OUT_OF_RANGE);
    et_spec_free(s);
    printf("ok\n");
    return 0;
}
