/*
 * The planner's memory estimate (server/planner.h, fb_plan_member_bytes)
 * against what an array really takes: for each kind of model (an MLP, a CNN,
 * a residual network, a language model of transformer blocks and a pooled
 * token classifier) the array is built on the fast CPU backend at the spec's
 * batch size, alone and fused four times, and what the planner reserves for
 * it (B members' estimates and the shared minibatch once) must be at least
 * its parameters, gradients and optimizer state plus its activation slab as
 * fb_array_new plans it.  An
 * estimate below that lets the control loop place a job on a device without
 * room for it (as it did for token models, whose attention probabilities and
 * MLP activations inside a block it never counted).  The estimate may be
 * generous, but not absurdly: at most 4 times the real figure.
 */
#include "engine_util.h"

#include "array.h"
#include "kernels.h"
#include "planner.h"

typedef struct mem_case {
    const char *name, *input, *layers, *optimizer;
    int batch;
} mem_case;

static const mem_case cases[] = {
    {"mlp", "[784]",
     "[{\"type\":\"linear\",\"out\":256},{\"type\":\"relu\"},{\"type\":\"dropout\",\"p\":0.2},"
     "{\"type\":\"linear\",\"out\":10}]",
     "{\"type\":\"adam\",\"lr\":0.001}", 64},
    {"cnn", "[1,28,28]",
     "[{\"type\":\"conv2d\",\"out\":8,\"kernel\":3,\"padding\":1},{\"type\":\"batchnorm\"},"
     "{\"type\":\"relu\"},{\"type\":\"maxpool2d\",\"kernel\":2},{\"type\":\"flatten\"},"
     "{\"type\":\"linear\",\"out\":10}]",
     "{\"type\":\"sgd\",\"lr\":0.01,\"momentum\":0.9}", 32},
    {"resnet", "[3,8,8]",
     "[{\"type\":\"conv2d\",\"out\":4,\"kernel\":3,\"padding\":1},{\"type\":\"residual\","
     "\"body\":[{\"type\":\"conv2d\",\"out\":4,\"kernel\":3,\"padding\":1},{\"type\":\"relu\"}]},"
     "{\"type\":\"global_avgpool\"},{\"type\":\"linear\",\"out\":10}]",
     "{\"type\":\"sgd\",\"lr\":0.01}", 16},
    {"charlm", "{\"tokens\":64,\"vocab\":256}",
     "[{\"type\":\"embedding\",\"dim\":128},{\"type\":\"positional\",\"max_len\":64},"
     "{\"type\":\"transformer_block\",\"heads\":4},{\"type\":\"transformer_block\",\"heads\":4},"
     "{\"type\":\"layernorm\"},{\"type\":\"linear\",\"out\":256}]",
     "{\"type\":\"adamw\",\"lr\":0.001}", 32},
    {"token-classifier", "{\"tokens\":32,\"vocab\":100}",
     "[{\"type\":\"embedding\",\"dim\":64},{\"type\":\"positional\"},"
     "{\"type\":\"transformer_block\",\"heads\":8,\"mlp_ratio\":2,\"causal\":false},"
     "{\"type\":\"pool\",\"mode\":\"mean\"},{\"type\":\"linear\",\"out\":5}]",
     "{\"type\":\"adam\",\"lr\":0.001}", 16},
};

static int optimizer_slots(const fb_job_spec *s)
{
    if (s->optim.type == FB_OPTIM_ADAM || s->optim.type == FB_OPTIM_ADAMW) return 2;
    return s->optim.momentum > 0.0 ? 1 : 0;
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    fb_backend *be = fb_backend_cpu();
    CHECK(be != NULL);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const mem_case *c = &cases[i];
        fb_job_spec *s = et_spec("{\"dataset\":\"x\",\"model\":{\"input\":%s,\"layers\":%s},"
                                 "\"batch_size\":%d,\"steps\":1,\"optimizer\":%s}",
                                 c->input, c->layers, c->batch, c->optimizer);
        const fb_job_spec *specs[4] = {s, s, s, s};
        for (int B = 1; B <= 4; B += 3) {
            fb_array *a = NULL;
            char msg[256];
            int err = fb_array_new(be, specs, B, c->batch, &a, msg, sizeof msg);
            if (err) fprintf(stderr, "%s: %s\n", c->name, msg);
            CHECK_INT_EQ(err, FB_OK);
            int64_t real = 4 * B * (int64_t)fb_array_member_params(a) * (2 + optimizer_slots(s)) +
                           4 * (int64_t)fb_array_slab_floats(a);
            int64_t shared = 0, member = fb_plan_member_bytes(s, &shared);
            int64_t est = B * member + shared; /* what the planner reserves for the array */
            printf("%-17s B=%d estimate %11lld bytes, array %11lld: %.2fx\n", c->name, B,
                   (long long)est, (long long)real, (double)est / (double)real);
            CHECK(est >= real);
            CHECK(est <= 4 * real);
            fb_array_free(a);
        }
        et_spec_free(s);
    }
    printf("ok\n");
    return 0;
}
