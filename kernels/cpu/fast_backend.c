/*
 * The "cpu" backend: the table of fast functions.  Dropout keeps the
 * reference loops, whose cost is the counter-based RNG; everything else has
 * its own fast path.  And the choice between the kernels written for AVX2
 * and their portable loops, which give the same bits.
 */
#include "cpu.h"

#include <stdatomic.h>

static atomic_bool g_portable;

void fb_cpu_kernels_portable(bool on)
{
    atomic_store(&g_portable, on);
}

bool fb_cpu_own_avx2(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    return !atomic_load_explicit(&g_portable, memory_order_relaxed) &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

static const struct fb_backend_ops fb_cpu_ops = {
    .alloc = fb_cpumem_alloc,
    .free = fb_cpumem_free,
    .zero = fb_cpu_zero,
    .copy = fb_cpumem_copy,
    .upload = fb_cpumem_copy,
    .download = fb_cpumem_copy,
    .sync = NULL,
    .set_threads = fb_cpu_set_threads,
    .linear_forward = fb_cpu_linear_forward,
    .linear_backward = fb_cpu_linear_backward,
    .conv2d_scratch_floats = fb_cpu_conv2d_scratch_floats,
    .conv2d_forward = fb_cpu_conv2d_forward,
    .conv2d_backward = fb_cpu_conv2d_backward,
    .maxpool2d_forward = fb_cpu_maxpool2d_forward,
    .maxpool2d_backward = fb_cpu_maxpool2d_backward,
    .maxpool2d_backward_set = fb_cpu_maxpool2d_backward_set,
    .avgpool2d_forward = fb_cpu_avgpool2d_forward,
    .avgpool2d_backward = fb_cpu_avgpool2d_backward,
    .global_avgpool_forward = fb_cpu_global_avgpool_forward,
    .global_avgpool_backward = fb_cpu_global_avgpool_backward,
    .act_forward = fb_cpu_act_forward,
    .act_backward = fb_cpu_act_backward,
    .act_backward_set = fb_cpu_act_backward_set,
    .add_forward = fb_cpu_add_forward,
    .accumulate = fb_cpu_accumulate,
    .dropout_forward = fb_ref_dropout_forward,
    .dropout_backward = fb_ref_dropout_backward,
    .batchnorm_forward_train = fb_cpu_batchnorm_forward_train,
    .batchnorm_forward_eval = fb_cpu_batchnorm_forward_eval,
    .batchnorm_backward = fb_cpu_batchnorm_backward,
    .layernorm_forward = fb_cpu_layernorm_forward,
    .layernorm_backward = fb_cpu_layernorm_backward,
    .embedding_forward = fb_cpu_embedding_forward,
    .embedding_backward = fb_cpu_embedding_backward,
    .positional_forward = fb_cpu_positional_forward,
    .positional_backward = fb_cpu_positional_backward,
    .attention_scratch_floats = fb_cpu_attention_scratch_floats,
    .attention_forward = fb_cpu_attention_forward,
    .attention_backward = fb_cpu_attention_backward,
    .seq_pool_forward = fb_cpu_seq_pool_forward,
    .seq_pool_backward = fb_cpu_seq_pool_backward,
    .softmax_xent = fb_cpu_softmax_xent,
    .mse = fb_cpu_mse,
    .optim_step = fb_cpu_optim_step,
    .round_bf16 = fb_cpu_round_bf16,
    .grad_unscale = fb_cpu_grad_unscale,
    .scale_members = fb_cpu_scale_members,
    .sgemm = fb_cpu_sgemm,
};

static fb_backend fb_cpu_backend = {.name = "cpu", .ops = &fb_cpu_ops};

/* The process-wide fast CPU backend; never freed. */
fb_backend *fb_backend_cpu(void)
{
    fb_cpu_blas_init();
    return &fb_cpu_backend;
}
