/*
 * The CUDA stack works on every device of this machine: device properties
 * read back sensibly, and the self-test (our own kernel, cuBLAS, cuDNN, NCCL)
 * matches the host.  Without a driver or a device the test is skipped.
 */
#include <stdio.h>

#include "check.h"
#include "cuda/cuda_device.h"
#include "errors.h"

int main(void)
{
    char msg[512];
    int n = fb_cuda_device_count();
    if (n == 0) {
        printf("SKIPPED: no CUDA device\n");
        return FB_TEST_SKIP;
    }
    CHECK(n > 0);

    for (int d = 0; d < n; d++) {
        struct fb_cuda_device_info info;
        int rc = fb_cuda_device_info(d, &info, msg, sizeof msg);
        if (rc != FB_OK) fprintf(stderr, "device %d: %s\n", d, msg);
        CHECK_INT_EQ(rc, FB_OK);
        printf("device %d: %s, cc %d.%d, %d SMs, %.1f GiB total, %.1f GiB free\n", info.device,
               info.name, info.cc_major, info.cc_minor, info.sm_count,
               (double)info.total_bytes / (1u << 30), (double)info.free_bytes / (1u << 30));
        CHECK_INT_EQ(info.device, d);
        CHECK(info.name[0] != '\0');
        CHECK(info.sm_count > 0);
        CHECK(info.cc_major >= 1);
        CHECK(info.total_bytes > 0);
        CHECK(info.free_bytes <= info.total_bytes);

        rc = fb_cuda_selftest(d, msg, sizeof msg);
        printf("selftest: %s\n", msg);
        CHECK_INT_EQ(rc, FB_OK);
    }

    /* A device that does not exist is an error code, never a crash, and
     * leaves the output untouched. */
    struct fb_cuda_device_info untouched = {.device = -7};
    CHECK_INT_EQ(fb_cuda_device_info(n, &untouched, msg, sizeof msg), FB_ERR_NOT_FOUND);
    CHECK_INT_EQ(untouched.device, -7);
    CHECK_INT_EQ(fb_cuda_device_info(-1, &untouched, msg, sizeof msg), FB_ERR_NOT_FOUND);
    CHECK_INT_EQ(fb_cuda_selftest(n, msg, sizeof msg), FB_ERR_NOT_FOUND);
    printf("ok: %d device(s)\n", n);
    return 0;
}
