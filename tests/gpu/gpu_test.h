/*
 * The start every op-level GPU test shares: which backend plays the device
 * (CUDA device 0, or with FB_GPU_CROSSCHECK_BACKEND=cpu the fast CPU backend,
 * which proves a harness on a machine without a GPU), the cpu-ref backend as
 * the reference, and a random seed that FB_TEST_SEED repeats.
 */
#ifndef FB_TESTS_GPU_GPU_TEST_H
#define FB_TESTS_GPU_GPU_TEST_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "cuda/cuda_backend.h"
#include "errors.h"
#include "kernels.h"

/*
 * Sets *dev and *ref.  Returns 0, FB_TEST_SKIP (printed) when there is no
 * CUDA device, or 2 (printed) for a bad FB_GPU_CROSSCHECK_BACKEND.  With
 * allow_cpu false the variable is not read; *on_cpu (may be NULL) says
 * whether the CPU stands in.
 */
static inline int gt_backends(bool allow_cpu, fb_backend **dev, fb_backend **ref,
                              bool *on_cpu)
{
    const char *which = allow_cpu ? getenv("FB_GPU_CROSSCHECK_BACKEND") : NULL;
    bool cpu = which && strcmp(which, "cpu") == 0;
    if (on_cpu) *on_cpu = cpu;
    if (cpu) {
        *dev = fb_backend_cpu();
    } else if (which && *which && strcmp(which, "cuda") != 0) {
        fprintf(stderr, "FB_GPU_CROSSCHECK_BACKEND=%s: expected cuda or cpu\n", which);
        return 2;
    } else {
        char msg[256];
        int rc = fb_cuda_backend_get(0, dev, msg, sizeof msg);
        if (rc == FB_ERR_NOT_FOUND || rc == FB_ERR_UNSUPPORTED) {
            printf("SKIPPED: no CUDA device: %s\n", msg);
            return FB_TEST_SKIP;
        }
        if (rc != FB_OK) fprintf(stderr, "fb_cuda_backend_get: %s\n", msg);
        CHECK_INT_EQ(rc, FB_OK);
    }
    *ref = fb_backend_cpu_ref();
    return 0;
}

/* A nonzero seed, FB_TEST_SEED's or the clock's, printed so that a run can be repeated. */
static inline uint64_t gt_seed(void)
{
    const char *seed = getenv("FB_TEST_SEED");
    uint64_t s = seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL) * 2654435761u;
    if (!s) s = 1;
    printf("seed %llu (set FB_TEST_SEED to repeat)\n", (unsigned long long)s);
    return s;
}

#endif
