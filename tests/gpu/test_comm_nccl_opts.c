/*
 * The checks of fb_comm_nccl_new_opts that need no device, run in every
 * build (with CUDA and without): a deadline of zero, a negative one or one
 * past an hour is refused with FB_ERR_OUT_OF_RANGE and a message naming
 * it, as are ranks that do not fit the world, negative or repeated device
 * ordinals and missing arguments, and *out is never written.  The refusal
 * comes before any CUDA or NCCL call, so it holds on a machine without a
 * GPU; a build without CUDA answers FB_ERR_UNSUPPORTED only to arguments
 * that pass the checks.
 */
#include <limits.h>

#include "check.h"
#include "comm.h"
#include "errors.h"

/* A value no constructor writes: *out must still hold it after a refusal. */
static fb_comm *const SENTINEL = (fb_comm *)&SENTINEL;

static unsigned char id[FB_COMM_ID_BYTES];

/* Calls fb_comm_nccl_new_opts, requires err, an untouched *out and a message holding
 * every string of need (NULL-terminated). */
static void refused(int n_local, const int *devices, int base, int world,
                    const fb_comm_nccl_opts *o, int err, const char *const *need)
{
    char msg[256] = "";
    fb_comm *c = SENTINEL;
    int got = fb_comm_nccl_new_opts(n_local, devices, base, world, id, o, &c, msg, sizeof msg);
    printf("n_local %d, base %d, world %d, deadline %d ms: %s (%s)\n", n_local, base, world,
           o ? o->timeout_ms : -1, fb_err_code(got), msg);
    CHECK_INT_EQ(got, err);
    CHECK(c == SENTINEL);
    for (; need && *need; need++) {
        if (!strstr(msg, *need)) fprintf(stderr, "message lacks \"%s\"\n", *need);
        CHECK(strstr(msg, *need) != NULL);
    }
}

int main(void)
{
    int dev[2] = {0, 1};

    /* deadlines: zero and negative are refused, not taken for a default */
    const int bad_ms[] = {0, -1, -1000, INT_MIN, FB_COMM_MAX_TIMEOUT_MS + 1, INT_MAX};
    for (size_t k = 0; k < sizeof bad_ms / sizeof bad_ms[0]; k++) {
        fb_comm_nccl_opts o = {.timeout_ms = bad_ms[k]};
        char shown[32];
        snprintf(shown, sizeof shown, "%d ms", bad_ms[k]);
        const char *need[] = {"deadline", shown, NULL};
        refused(1, dev, 0, 2, &o, FB_ERR_OUT_OF_RANGE, need);
    }

    /* the checks of the other arguments come before the deadline's, and with a good one */
    fb_comm_nccl_opts ok = {.timeout_ms = 5000};
    const char *fit[] = {"do not fit", NULL};
    refused(2, dev, 1, 2, &ok, FB_ERR_OUT_OF_RANGE, fit);
    refused(1, dev, -1, 2, &ok, FB_ERR_OUT_OF_RANGE, fit);
    refused(2, dev, 0, 1, &ok, FB_ERR_OUT_OF_RANGE, fit);
    refused(1, dev, INT_MAX, INT_MAX, &ok, FB_ERR_OUT_OF_RANGE, fit); /* base + n overflows */
    const char *local[] = {"1..64", NULL};
    refused(0, dev, 0, 2, &ok, FB_ERR_OUT_OF_RANGE, local);
    refused(65, dev, 0, 100, &ok, FB_ERR_OUT_OF_RANGE, local);
    int neg[2] = {0, -3};
    const char *negative[] = {"-3", "negative", NULL};
    refused(2, neg, 0, 2, &ok, FB_ERR_OUT_OF_RANGE, negative);
    int twice[3] = {2, 0, 2};
    const char *repeated[] = {"both on device 2", NULL};
    refused(3, twice, 0, 3, &ok, FB_ERR_OUT_OF_RANGE, repeated);

    /* missing arguments */
    char msg[256];
    fb_comm *c = SENTINEL;
    CHECK_INT_EQ(fb_comm_nccl_new_opts(1, NULL, 0, 1, id, &ok, &c, msg, sizeof msg),
                 FB_ERR_INTERNAL);
    CHECK_INT_EQ(fb_comm_nccl_new_opts(1, dev, 0, 1, NULL, &ok, &c, msg, sizeof msg),
                 FB_ERR_INTERNAL);
    CHECK_INT_EQ(fb_comm_nccl_new_opts(1, dev, 0, 1, id, &ok, NULL, msg, sizeof msg),
                 FB_ERR_INTERNAL);
    CHECK(c == SENTINEL);
    /* the deadline's bounds themselves are accepted by the checks: without CUDA the
     * answer is then that NCCL is missing, not that the deadline is wrong */
#ifndef FB_HAVE_CUDA
    const char *no_cuda[] = {"no CUDA", NULL};
    fb_comm_nccl_opts lo = {.timeout_ms = 1}, hi = {.timeout_ms = FB_COMM_MAX_TIMEOUT_MS};
    refused(1, dev, 0, 2, &lo, FB_ERR_UNSUPPORTED, no_cuda);
    refused(2, dev, 0, 2, &hi, FB_ERR_UNSUPPORTED, no_cuda);
    refused(1, dev, 0, 2, NULL, FB_ERR_UNSUPPORTED, no_cuda);
    c = SENTINEL;
    CHECK_INT_EQ(fb_comm_nccl_new(1, dev, 0, 2, id, &c, msg, sizeof msg), FB_ERR_UNSUPPORTED);
    CHECK(c == SENTINEL);
#endif
    printf("ok\n");
    return 0;
}
