/*
 * Dropout masks: a member's mask depends only on its seed, the stream and the
 * element's position in the global batch, on both CPU backends:
 *   - a member at slot 0 of B = 1 and at slot 2 of B = 4 (same seed) drops
 *     the same elements;
 *   - p = 0 is the identity, forward and backward;
 *   - the kept fraction is close to 1 - p and kept values are in / (1 - p);
 *   - a shard with n_offset k reproduces samples k.. of the whole batch;
 *   - another stream gives another mask.
 */
#include "kt_util.h"

#define F 257

static float *ones(size_t n)
{
    float *x = malloc(n * sizeof(float));
    CHECK(x != NULL);
    for (size_t i = 0; i < n; i++)
        x[i] = 1.0f;
    return x;
}

static void check_slots(fb_backend *be)
{
    const int N = 6;
    const float p = 0.4f;
    uint64_t alone[1] = {9001}, fused[4] = {1, 2, 9001, 4};
    float *x1 = kt_rand((size_t)N * F, -1, 1), *x4 = kt_rand((size_t)N * 4 * F, -1, 1);
    float *y1 = kt_guarded_new((size_t)N * F), *y4 = kt_guarded_new((size_t)N * 4 * F);
    for (int n = 0; n < N; n++) /* member 2 of the array sees the same data */
        memcpy(x4 + ((size_t)n * 4 + 2) * F, x1 + (size_t)n * F, F * sizeof(float));
    fb_dropout_forward(be, y1, x1, alone, 3, p, N, 1, F, 0);
    fb_dropout_forward(be, y4, x4, fused, 3, p, N, 4, F, 0);
    for (int n = 0; n < N; n++)
        CHECK(memcmp(y1 + (size_t)n * F, y4 + ((size_t)n * 4 + 2) * F, F * sizeof(float)) == 0);
    /* other members have other masks */
    int differ = 0;
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++)
            differ += (y4[((size_t)n * 4 + 0) * F + f] == 0.0f) != (y1[(size_t)n * F + f] == 0.0f);
    CHECK(differ > 0);
    /* backward: the same mask */
    float *d1 = kt_guarded_new((size_t)N * F), *d4 = kt_guarded_new((size_t)N * 4 * F);
    fb_dropout_backward(be, d1, x1, alone, 3, p, N, 1, F, 0);
    fb_dropout_backward(be, d4, x4, fused, 3, p, N, 4, F, 0);
    for (int n = 0; n < N; n++)
        CHECK(memcmp(d1 + (size_t)n * F, d4 + ((size_t)n * 4 + 2) * F, F * sizeof(float)) == 0);
    CHECK(kt_guarded_ok(y1, (size_t)N * F) && kt_guarded_ok(y4, (size_t)N * 4 * F));
    CHECK(kt_guarded_ok(d1, (size_t)N * F) && kt_guarded_ok(d4, (size_t)N * 4 * F));
    printf("%-8s slot 0 of B=1 == slot 2 of B=4 (forward and backward) ok\n", fb_backend_name(be));
    free(x1);
    free(x4);
    kt_guarded_free(y1);
    kt_guarded_free(y4);
    kt_guarded_free(d1);
    kt_guarded_free(d4);
}

static void check_identity(fb_backend *be)
{
    const int N = 5, B = 3;
    const size_t n = (size_t)N * B * F;
    uint64_t seeds[3] = {7, 8, 9};
    float *x = kt_rand(n, -1, 1), *y = kt_guarded_new(n), *d = kt_guarded_new(n);
    fb_dropout_forward(be, y, x, seeds, 1, 0.0f, N, B, F, 0);
    CHECK(memcmp(x, y, n * sizeof(float)) == 0);
    fb_dropout_backward(be, d, x, seeds, 1, 0.0f, N, B, F, 0);
    CHECK(memcmp(x, d, n * sizeof(float)) == 0); /* 0 + dout */
    CHECK(kt_guarded_ok(y, n) && kt_guarded_ok(d, n));
    printf("%-8s p = 0 is the identity ok\n", fb_backend_name(be));
    free(x);
    kt_guarded_free(y);
    kt_guarded_free(d);
}

static void check_fraction(fb_backend *be, float p)
{
    const int N = 64, B = 2;
    const size_t n = (size_t)N * B * F;
    uint64_t seeds[2] = {123, 456};
    float *x = kt_rand(n, 0.5f, 1.5f), *y = kt_guarded_new(n);
    fb_dropout_forward(be, y, x, seeds, 42, p, N, B, F, 0);
    const float scale = 1.0f / (1.0f - p);
    for (int b = 0; b < B; b++) {
        size_t kept = 0;
        for (int s = 0; s < N; s++)
            for (int f = 0; f < F; f++) {
                size_t i = ((size_t)s * B + b) * F + f;
                if (y[i] != 0.0f) {
                    CHECK(y[i] == x[i] * scale);
                    kept++;
                }
            }
        double frac = (double)kept / ((double)N * F);
        /* 16448 draws: the standard deviation is below 0.004 */
        CHECK_NEAR(frac, 1.0 - p, 0.02);
        printf("%-8s p = %.2f member %d kept %.4f (expect %.2f) ok\n", fb_backend_name(be), p, b,
               frac, 1.0 - p);
    }
    CHECK(kt_guarded_ok(y, n));
    free(x);
    kt_guarded_free(y);
}

static void check_offset(fb_backend *be)
{
    const int N = 10, B = 2, k = 3, shard = 4;
    uint64_t seeds[2] = {31, 32};
    float *x = ones((size_t)N * B * F), *whole = kt_guarded_new((size_t)N * B * F);
    float *part = kt_guarded_new((size_t)shard * B * F);
    fb_dropout_forward(be, whole, x, seeds, 77, 0.5f, N, B, F, 0);
    fb_dropout_forward(be, part, x, seeds, 77, 0.5f, shard, B, F, k);
    CHECK(memcmp(part, whole + (size_t)k * B * F, (size_t)shard * B * F * sizeof(float)) == 0);
    /* another stream (layer, step) draws another mask */
    fb_dropout_forward(be, part, x, seeds, 78, 0.5f, shard, B, F, k);
    CHECK(memcmp(part, whole + (size_t)k * B * F, (size_t)shard * B * F * sizeof(float)) != 0);
    CHECK(kt_guarded_ok(whole, (size_t)N * B * F) && kt_guarded_ok(part, (size_t)shard * B * F));
    printf("%-8s shard with n_offset %d == samples %d..%d of the batch ok\n", fb_backend_name(be),
           k, k, k + shard - 1);
    free(x);
    kt_guarded_free(whole);
    kt_guarded_free(part);
}

int main(void)
{
    fb_backend *bes[2] = {fb_backend_cpu_ref(), fb_backend_cpu()};
    for (int i = 0; i < 2; i++) {
        check_slots(bes[i]);
        check_identity(bes[i]);
        check_fraction(bes[i], 0.3f);
        check_fraction(bes[i], 0.75f);
        check_offset(bes[i]);
    }
    return 0;
}
