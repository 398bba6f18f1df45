/*
 * bf16 support of the CPU backends: the rounding function on values whose
 * bf16 is known (ties to even, subnormals, the overflow edge, NaN and
 * infinities), fb_round_bf16 on cpu-ref and cpu against it (in place too,
 * guarded), the one-pass unscaling of loss scaling with its per-member
 * finiteness check (fb_grad_unscale) against a plain loop, and the fact
 * the CUDA path relies on: a product of two bf16 values is exact in float,
 * so linear ops over rounded operands agree across backends up to summation
 * order, and differ from the same op over the unrounded ones.
 */
#include "kt_util.h"

#include "bf16.h"

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Rounds the value with bits `in`; the result must have bits `want`. */
static void check_round(uint32_t in, uint32_t want)
{
    uint32_t got = bits_of(fb_bf16_round(from_bits(in)));
    if (got != want) {
        fprintf(stderr, "fb_bf16_round(0x%08x) = 0x%08x, want 0x%08x\n", in, got, want);
        abort();
    }
}

static void test_known_values(void)
{
    check_round(0x3f800000u, 0x3f800000u); /* 1 */
    check_round(0x3f808000u, 0x3f800000u); /* 1 + 2^-8: tie, down to even 1 */
    check_round(0x3f818000u, 0x3f820000u); /* 1 + 3*2^-8: tie, up to even 1 + 2^-6 */
    check_round(0x3f808001u, 0x3f810000u); /* just above the tie: up */
    check_round(0x3f807fffu, 0x3f800000u); /* just below the tie: down */
    check_round(0xbf808000u, 0xbf800000u); /* the sign rides along */
    check_round(0x00000000u, 0x00000000u);
    check_round(0x80000000u, 0x80000000u); /* -0 stays -0 */
    /* subnormals round on the same bits */
    check_round(0x00000001u, 0x00000000u); /* the smallest: to +0 */
    check_round(0x80000001u, 0x80000000u); /* to -0 */
    check_round(0x00008000u, 0x00000000u); /* tie, down to even 0 */
    check_round(0x00018000u, 0x00020000u); /* tie, up to even */
    check_round(0x00017fffu, 0x00010000u);
    check_round(0x007fffffu, 0x00800000u); /* the largest subnormal becomes normal */
    /* the overflow edge: the largest bf16 is 0x7f7f0000 */
    check_round(0x7f7f0000u, 0x7f7f0000u);
    check_round(0x7f7f7fffu, 0x7f7f0000u);
    check_round(0x7f7f8000u, 0x7f800000u); /* tie, up to even: infinity */
    check_round(0x7f7fffffu, 0x7f800000u); /* FLT_MAX overflows */
    check_round(0xff7fffffu, 0xff800000u);
    /* infinities stay, NaNs stay NaN (quiet, sign kept) even when their
     * payload lies only in the bits that are dropped */
    check_round(0x7f800000u, 0x7f800000u);
    check_round(0xff800000u, 0xff800000u);
    check_round(0x7fc00000u, 0x7fc00000u);
    check_round(0x7f800001u, 0x7fc00000u);
    check_round(0xff80ffffu, 0xffc00000u);
    CHECK(isnan(fb_bf16_round(NAN)));

    /* every result is a bf16 value within half a bf16 ulp (2^-8 relative) */
    for (int i = 0; i < 100000; i++) {
        float x = kt_uniform(-1.0f, 1.0f) * ldexpf(1.0f, kt_int(200) - 100);
        float r = fb_bf16_round(x);
        CHECK((bits_of(r) & 0xffffu) == 0);
        CHECK(fabsf(r - x) <= ldexpf(fabsf(x), -8));
        CHECK(fb_bf16_round(r) == r); /* idempotent */
    }
}

/* fb_round_bf16 on a backend equals the scalar function bit for bit, in
 * place and not, and writes nothing outside its output. */
static void test_backend_round(fb_backend *be)
{
    const size_t n = 1031;
    float *in = kt_guarded_new(n), *out = kt_guarded_new(n);
    for (size_t i = 0; i < n; i++)
        in[i] = kt_uniform(-3.0f, 3.0f);
    static const uint32_t hard[] = {0x3f808000u, 0x3f818000u, 0x00018000u, 0x7f7f8000u,
                                    0x7f800001u, 0xff800000u, 0x80000001u, 0x7f7fffffu};
    for (size_t i = 0; i < sizeof hard / sizeof *hard; i++)
        in[i * 97] = from_bits(hard[i]);
    fb_round_bf16(be, out, in, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t want = bits_of(fb_bf16_round(in[i]));
        if (bits_of(out[i]) != want) {
            fprintf(stderr, "%s: round_bf16[%zu] = 0x%08x, want 0x%08x\n", fb_backend_name(be), i,
                    bits_of(out[i]), want);
            abort();
        }
    }
    CHECK(kt_guarded_ok(out, n));
    fb_round_bf16(be, in, in, n);
    CHECK(memcmp(in, out, n * sizeof *in) == 0);
    CHECK(kt_guarded_ok(in, n));
    kt_guarded_free(in);
    kt_guarded_free(out);
}

/* A bit pattern no op produces (a NaN with a payload): what fills the
 * floats of the gradient slab that no block owns. */
#define POISON 0x7fa5a5a5u

/*
 * One fb_grad_unscale on a backend against a plain loop over a copy: the
 * products bit for bit, the flags exactly (overwriting what they held), the
 * floats between and after the blocks (poisoned) and the guards of both
 * buffers untouched.  g holds n floats, guarded.
 */
static void check_unscale(fb_backend *be, float *g, size_t n, const float *inv,
                          const fb_param_block *blocks, int n_blocks, int B,
                          const float *want_flags)
{
    float *want = malloc((n ? n : 1) * sizeof *want), *flags = kt_guarded_new((size_t)B);
    CHECK(want != NULL);
    memcpy(want, g, n * sizeof *g);
    float plain[16];
    CHECK(B <= 16);
    for (int b = 0; b < B; b++) {
        plain[b] = 0.0f;
        flags[b] = 7.0f;
        for (int k = 0; k < n_blocks; k++)
            for (size_t i = 0; i < blocks[k].per_member; i++) {
                float *v = &want[blocks[k].offset + (size_t)b * blocks[k].per_member + i];
                *v *= inv[b];
                if (isnan(*v) || isinf(*v)) plain[b] = 1.0f;
            }
    }
    fb_grad_unscale(be, flags, g, inv, blocks, n_blocks, B);
    for (int b = 0; b < B; b++) {
        if (flags[b] != plain[b] || flags[b] != want_flags[b]) {
            fprintf(stderr, "%s: grad_unscale flag[%d] = %g, plain loop %g, expected %g\n",
                    fb_backend_name(be), b, (double)flags[b], (double)plain[b],
                    (double)want_flags[b]);
            abort();
        }
    }
    for (size_t i = 0; i < n; i++)
        if (bits_of(g[i]) != bits_of(want[i])) {
            fprintf(stderr, "%s: grad_unscale g[%zu] = 0x%08x, want 0x%08x\n", fb_backend_name(be),
                    i, bits_of(g[i]), bits_of(want[i]));
            abort();
        }
    CHECK(kt_guarded_ok(g, n));
    CHECK(kt_guarded_ok(flags, (size_t)B));
    free(want);
    kt_guarded_free(flags);
}

/* Number of floats of a block table's slab (the end of its last block),
 * plus tail floats after it. */
static size_t slab_floats(const fb_param_block *blocks, int n_blocks, int B, size_t tail)
{
    size_t end = 0;
    for (int k = 0; k < n_blocks; k++) {
        size_t e = blocks[k].offset + (size_t)B * blocks[k].per_member;
        if (e > end) end = e;
    }
    return end + tail;
}

/* A guarded slab: every float poisoned, then the blocks filled with values
 * in [-1e30, 1e30], some tiny (subnormal once unscaled). */
static float *unscale_slab(const fb_param_block *blocks, int n_blocks, int B, size_t n)
{
    float *g = kt_guarded_new(n);
    for (size_t i = 0; i < n; i++)
        g[i] = from_bits(POISON);
    for (int k = 0; k < n_blocks; k++)
        for (size_t i = 0; i < (size_t)B * blocks[k].per_member; i++)
            g[blocks[k].offset + i] = kt_uniform(-1.0f, 1.0f) * (i % 7 ? 1e30f : 1e-36f);
    return g;
}

/* fb_grad_unscale: NaN and infinities in chosen members and blocks, empty
 * blocks, gaps between blocks, B = 1, no blocks, an inverse above 1 that
 * overflows a finite gradient, and a large block the fast backend splits
 * over threads. */
static void test_unscale(fb_backend *be)
{
    /* four members; block 1 is empty, a gap of 6 floats before block 2, 5
     * after block 3 */
    {
        const int B = 4;
        fb_param_block blocks[4] = {{0, 10}, {40, 0}, {46, 33}, {178, 1}};
        size_t n = slab_floats(blocks, 4, B, 5);
        float inv[4] = {0x1p-16f, 0x1p-1f, 1.0f, 0x1p-24f};
        float *g = unscale_slab(blocks, 4, B, n);
        const float none[4] = {0, 0, 0, 0};
        check_unscale(be, g, n, inv, blocks, 4, B, none);
        g[1 * 10 + 9] = NAN;            /* member 1, first block, last float */
        g[46 + 3 * 33 + 0] = -INFINITY; /* member 3, block 2, first float */
        g[178 + 2] = INFINITY;          /* member 2, last block (one float) */
        g[41] = INFINITY;               /* in the gap: no member's */
        g[n - 1] = NAN;                 /* after the last block */
        const float some[4] = {0, 1, 1, 1};
        check_unscale(be, g, n, inv, blocks, 4, B, some);
        /* the empty block alone, and no blocks at all: nothing is read */
        check_unscale(be, g, n, inv, blocks + 1, 1, B, none);
        check_unscale(be, g, n, inv, blocks, 0, B, none);
        kt_guarded_free(g);
    }
    /* B = 1: one member, a NaN in the second block only */
    {
        fb_param_block blocks[2] = {{8, 17}, {32, 3}};
        size_t n = slab_floats(blocks, 2, 1, 0);
        float inv[1] = {0x1p-8f};
        float *g = unscale_slab(blocks, 2, 1, n);
        const float none[1] = {0}, one[1] = {1};
        check_unscale(be, g, n, inv, blocks, 2, 1, none);
        g[33] = NAN;
        check_unscale(be, g, n, inv, blocks, 2, 1, one);
        kt_guarded_free(g);
    }
    /* a loss scale below 1: an inverse of 2^8 carries member 0's finite 1e37
     * to infinity, which is flagged; member 1's inverse of 1 leaves the same
     * value finite */
    {
        fb_param_block blocks[1] = {{0, 4}};
        float inv[2] = {0x1p8f, 1.0f};
        float *g = unscale_slab(blocks, 1, 2, 8);
        g[2] = 1e37f;
        g[4 + 2] = 1e37f;
        const float first[2] = {1, 0};
        check_unscale(be, g, 8, inv, blocks, 1, 2, first);
        kt_guarded_free(g);
    }
    /* a block large enough for the fast backend's threads, with an infinity
     * near the end of member 2's part */
    {
        const int B = 3;
        fb_param_block blocks[2] = {{0, 5}, {16, 300001}};
        size_t n = slab_floats(blocks, 2, B, 3);
        float inv[3] = {0x1p-10f, 0x1p-12f, 0x1p-14f};
        float *g = unscale_slab(blocks, 2, B, n);
        g[16 + 2 * 300001 + 299990] = -INFINITY;
        const float last[3] = {0, 0, 1};
        fb_backend_set_threads(be, 4);
        check_unscale(be, g, n, inv, blocks, 2, B, last);
        fb_backend_set_threads(be, 0);
        kt_guarded_free(g);
    }
}

/* Products of bf16 values are exact in float (8 + 8 significant bits fit in
 * 24), which is why a GPU's TF32 math over bf16 operands matches the CPU. */
static void test_exact_products(void)
{
    for (int i = 0; i < 100000; i++) {
        float a = fb_bf16_round(kt_uniform(-4.0f, 4.0f)),
              b = fb_bf16_round(kt_uniform(-4.0f, 4.0f));
        CHECK((double)(a * b) == (double)a * (double)b);
    }
}

/* A linear layer over rounded operands: cpu and cpu-ref agree within the
 * fast-versus-reference bound of the cross-check (1e-5), and the result
 * differs from the one over unrounded operands by about bf16's rounding, so
 * the rounding is not a no-op. */
static void test_linear_rounded(void)
{
    const int N = 16, B = 3, I = 40, O = 7;
    size_t nin = (size_t)N * B * I, nw = (size_t)B * O * I, nout = (size_t)N * B * O;
    float *in = kt_rand(nin, -1.0f, 1.0f), *w = kt_rand(nw, -1.0f, 1.0f);
    float *rin = malloc(nin * sizeof *rin), *rw = malloc(nw * sizeof *rw);
    float *ref = calloc(nout, sizeof *ref), *fast = calloc(nout, sizeof *fast);
    float *plain = calloc(nout, sizeof *plain);
    CHECK(rin && rw && ref && fast && plain);
    fb_round_bf16(fb_backend_cpu_ref(), rin, in, nin);
    fb_round_bf16(fb_backend_cpu_ref(), rw, w, nw);
    fb_linear_forward(fb_backend_cpu_ref(), ref, rin, rw, NULL, N, B, I, O, false);
    fb_linear_forward(fb_backend_cpu(), fast, rin, rw, NULL, N, B, I, O, false);
    fb_linear_forward(fb_backend_cpu_ref(), plain, in, w, NULL, N, B, I, O, false);
    bool nan_ok;
    double fast_err = kt_norm_err(fast, ref, nout, &nan_ok);
    CHECK(nan_ok);
    double bf16_err = kt_norm_err(plain, ref, nout, &nan_ok);
    printf("linear over bf16 operands: cpu vs cpu-ref %.3g, vs unrounded %.3g\n", fast_err,
           bf16_err);
    CHECK(fast_err <= 1e-5);
    CHECK(bf16_err > 1e-4 && bf16_err < 3e-2);
    free(in);
    free(w);
    free(rin);
    free(rw);
    free(ref);
    free(fast);
    free(plain);
}

int main(void)
{
    test_known_values();
    fb_backend *bes[] = {fb_backend_cpu_ref(), fb_backend_cpu()};
    for (int i = 0; i < 2; i++) {
        CHECK(fb_backend_supports(bes[i], FB_OP_BF16));
        test_backend_round(bes[i]);
        test_unscale(bes[i]);
    }
    test_exact_products();
    test_linear_rounded();
    printf("ok\n");
    return 0;
}
