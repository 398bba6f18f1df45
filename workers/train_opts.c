/*
 * What the training loop and the session share (train_opts.h).
 */
#include "train_opts.h"

int64_t fb_train_total_steps(const fb_job_spec *spec, int64_t n_train)
{
    if (spec->steps) return spec->steps;
    return spec->epochs * (n_train / spec->batch_size);
}
