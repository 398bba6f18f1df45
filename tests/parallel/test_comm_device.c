/*
 * The communication and device interfaces: the shared-memory sum adds every
 * rank's values and leaves the same floats in every buffer (ranks stay
 * bit-identical), for 1..5 ranks and sizes around its block; bad arguments
 * are refused with a clear error and leave the output alone; NCCL answers
 * "unsupported" in a build without CUDA; device discovery offers the CPU
 * devices asked for, each with a backend, and refuses a bad count.
 */
#include "check.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "device.h"
#include "errors.h"

static void check_sum(int R, size_t n)
{
    char msg[128];
    fb_comm *c = NULL;
    CHECK_INT_EQ(fb_comm_shm_new(R, &c, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(fb_comm_local_size(c), R);
    CHECK_STR_EQ(fb_comm_name(c), "shm");
    CHECK(fb_comm_host_memory(c));
    float *bufs[5];
    for (int r = 0; r < R; r++) {
        bufs[r] = malloc((n ? n : 1) * sizeof(float));
        CHECK(bufs[r] != NULL);
        for (size_t i = 0; i < n; i++) bufs[r][i] = (float)(r + 1) * 0.1f + (float)i * 1e-3f;
    }
    CHECK_INT_EQ(fb_comm_allreduce_sum(c, bufs, n, msg, sizeof msg), FB_OK);
    for (size_t i = 0; i < n; i++) {
        float want = 0.1f + (float)i * 1e-3f;
        for (int r = 1; r < R; r++) want += (float)(r + 1) * 0.1f + (float)i * 1e-3f;
        for (int r = 0; r < R; r++) CHECK(bufs[r][i] == want);
    }
    for (int r = 0; r < R; r++) free(bufs[r]);
    fb_comm_free(c);
}

int main(void)
{
    for (int R = 1; R <= 5; R++) {
        check_sum(R, 0);
        check_sum(R, 1);
        check_sum(R, 1023);
        check_sum(R, 1025);
        check_sum(R, 5000);
    }

    char msg[128] = "";
    fb_comm *c = (fb_comm *)&msg; /* any non-NULL value: must stay */
    fb_comm *keep = c;
    CHECK_INT_EQ(fb_comm_shm_new(0, &c, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK(c == keep);
    CHECK(strstr(msg, "1..64") != NULL);
    CHECK_INT_EQ(fb_comm_shm_new(65, &c, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK(c == keep);
    fb_comm_free(NULL);

#ifndef FB_HAVE_CUDA
    unsigned char id[FB_COMM_ID_BYTES];
    CHECK_INT_EQ(fb_comm_nccl_unique_id(id, msg, sizeof msg), FB_ERR_UNSUPPORTED);
    int dev = 0;
    CHECK_INT_EQ(fb_comm_nccl_new(1, &dev, 0, 1, id, &c, msg, sizeof msg), FB_ERR_UNSUPPORTED);
    CHECK(c == keep);
    printf("nccl without CUDA: %s\n", msg);
#endif

    fb_device devs[4];
    memset(devs, 0x5a, sizeof devs);
    int n = fb_devices_discover(3, 3000, devs, 4, msg, sizeof msg);
    if (n > 0 && devs[0].kind == FB_DEVICE_CUDA) {
        printf("CUDA devices found: %d; CPU discovery not checked\n", n);
    } else {
        CHECK_INT_EQ(n, 3);
        for (int i = 0; i < 3; i++) {
            CHECK(devs[i].kind == FB_DEVICE_CPU);
            CHECK(devs[i].be != NULL);
            CHECK_INT_EQ(devs[i].memory_bytes, 1000);
        }
        CHECK_STR_EQ(devs[2].name, "cpu2");
        unsigned char before[sizeof devs];
        memcpy(before, devs, sizeof devs);
        CHECK_INT_EQ(fb_devices_discover(0, 3000, devs, 4, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
        CHECK_INT_EQ(fb_devices_discover(5, 3000, devs, 4, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
        printf("refused: %s\n", msg);
        CHECK(memcmp(before, devs, sizeof devs) == 0);
    }
    CHECK_INT_EQ(fb_devices_discover(1, 1, devs, 0, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    printf("ok\n");
    return 0;
}
