/*
 * The "cpu-ref" backend: the table of reference functions.
 */
#include "cpu.h"

static const struct fb_backend_ops fb_ref_ops = {
    .alloc = fb_cpumem_alloc,
    .free = fb_cpumem_free,
    .zero = fb_cpumem_zero,
    .copy = fb_cpumem_copy,
    .upload = fb_cpumem_copy,
    .download = fb_cpumem_copy,
    .sync = NULL,
    .set_threads = NULL, /* single-threaded loops */
    .linear_forward = fb_ref_linear_forward,
    .linear_backward = fb_ref_linear_backward,
    .conv2d_scratch_floats = NULL,
    .conv2d_forward = fb_ref_conv2d_forward,
    .conv2d_backward = fb_ref_conv2d_backward,
    .maxpool2d_forward = fb_ref_maxpool2d_forward,
    .maxpool2d_backward = fb_ref_maxpool2d_backward,
    .avgpool2d_forward = fb_ref_avgpool2d_forward,
    .avgpool2d_backward = fb_ref_avgpool2d_backward,
    .global_avgpool_forward = fb_ref_global_avgpool_forward,
    .global_avgpool_backward = fb_ref_global_avgpool_backward,
    .act_forward = fb_ref_act_forward,
    .act_backward = fb_ref_act_backward,
    .add_forward = fb_ref_add_forward,
    .accumulate = fb_ref_accumulate,
    .dropout_forward = fb_ref_dropout_forward,
    .dropout_backward = fb_ref_dropout_backward,
    .batchnorm_forward_train = fb_ref_batchnorm_forward_train,
    .batchnorm_forward_eval = fb_ref_batchnorm_forward_eval,
    .batchnorm_backward = fb_ref_batchnorm_backward,
    .layernorm_forward = fb_ref_layernorm_forward,
    .layernorm_backward = fb_ref_layernorm_backward,
    .embedding_forward = fb_ref_embedding_forward,
    .embedding_backward = fb_ref_embedding_backward,
    .positional_forward = fb_ref_positional_forward,
    .positional_backward = fb_ref_positional_backward,
    .attention_scratch_floats = NULL,
    .attention_forward = fb_ref_attention_forward,
    .attention_backward = fb_ref_attention_backward,
    .seq_pool_forward = fb_ref_seq_pool_forward,
    .seq_pool_backward = fb_ref_seq_pool_backward,
    .softmax_xent = fb_ref_softmax_xent,
    .mse = fb_ref_mse,
    .optim_step = fb_ref_optim_step,
    .round_bf16 = fb_cpu_round_bf16,
    .grad_unscale = fb_ref_grad_unscale,
    .scale_members = fb_cpu_scale_members,
    .sgemm = fb_ref_sgemm,
};

static fb_backend fb_ref_backend = {.name = "cpu-ref", .ops = &fb_ref_ops};

/* The process-wide reference backend; never freed. */
fb_backend *fb_backend_cpu_ref(void)
{
    return &fb_ref_backend;
}
