/*
 * A backend's clone with a thread count of its own (fb_backend_clone_threads):
 *   - the clone reads back its count, and the backend keeps its own;
 *   - it is the same backend: the same name, the same ops, memory of one is
 *     memory of the other;
 *   - at the backend's count it computes the same bits as the backend, forward
 *     and backward; at another count the same values within float rounding
 *     (the fast path cuts the work by its team's size); the reference, which
 *     is single-threaded, the same bits at any count.
 */
#include "kt_util.h"

#include <math.h>
#include <string.h>

enum { N = 7, B = 3, I = 19, O = 11 };

typedef struct linear_out {
    float *out, *din, *dw, *dbias;
} linear_out;

static const size_t n_out = (size_t)N * B * O, n_in = (size_t)N * B * I, n_w = (size_t)B * O * I,
                    n_b = (size_t)B * O;

/* One linear layer forward and backward on be, over fixed inputs. */
static linear_out run_linear(fb_backend *be, const float *in, const float *w, const float *bias,
                             const float *dout)
{
    linear_out r = {kt_guarded_new(n_out), kt_guarded_new(n_in), kt_guarded_new(n_w),
                    kt_guarded_new(n_b)};
    fb_linear_forward(be, r.out, in, w, bias, N, B, I, O, false);
    fb_linear_backward(be, r.din, r.dw, r.dbias, dout, in, w, N, B, I, O, false);
    CHECK(kt_guarded_ok(r.out, n_out) && kt_guarded_ok(r.din, n_in));
    CHECK(kt_guarded_ok(r.dw, n_w) && kt_guarded_ok(r.dbias, n_b));
    return r;
}

static void linear_out_free(linear_out *r)
{
    kt_guarded_free(r->out);
    kt_guarded_free(r->din);
    kt_guarded_free(r->dw);
    kt_guarded_free(r->dbias);
}

static bool same_bits(const linear_out *a, const linear_out *b)
{
    return memcmp(a->out, b->out, n_out * sizeof(float)) == 0 &&
           memcmp(a->din, b->din, n_in * sizeof(float)) == 0 &&
           memcmp(a->dw, b->dw, n_w * sizeof(float)) == 0 &&
           memcmp(a->dbias, b->dbias, n_b * sizeof(float)) == 0;
}

static double max_err(const linear_out *a, const linear_out *b)
{
    bool ok[4];
    double e[4] = {kt_norm_err(a->out, b->out, n_out, &ok[0]),
                   kt_norm_err(a->din, b->din, n_in, &ok[1]),
                   kt_norm_err(a->dw, b->dw, n_w, &ok[2]),
                   kt_norm_err(a->dbias, b->dbias, n_b, &ok[3])};
    double m = 0;
    for (int k = 0; k < 4; k++) {
        CHECK(ok[k]);
        if (e[k] > m) m = e[k];
    }
    return m;
}

/* be at `own` threads against its clones at `own` and at `other` threads. */
static void check_backend(fb_backend *be, int own, int other, bool exact_at_any_count)
{
    fb_backend_set_threads(be, own);
    fb_backend *same = fb_backend_clone_threads(be, own);
    fb_backend *more = fb_backend_clone_threads(be, other);
    CHECK(same != NULL && more != NULL);
    CHECK_INT_EQ(fb_backend_threads(same), own);
    CHECK_INT_EQ(fb_backend_threads(more), other);
    CHECK_INT_EQ(fb_backend_threads(be), own);
    CHECK_STR_EQ(fb_backend_name(more), fb_backend_name(be));
    for (int op = 0; op < FB_OP_COUNT; op++)
        CHECK(fb_backend_supports(more, (fb_op)op) == fb_backend_supports(be, (fb_op)op));

    /* memory of the clone is the backend's */
    float *p = fb_backend_alloc(more, 64 * sizeof(float));
    CHECK(p != NULL);
    fb_backend_free(be, p);

    float *in = kt_rand(n_in, -1, 1), *w = kt_rand(n_w, -0.5f, 0.5f);
    float *bias = kt_rand(n_b, -0.1f, 0.1f), *dout = kt_rand(n_out, -1, 1);
    linear_out ref = run_linear(be, in, w, bias, dout);
    linear_out a = run_linear(same, in, w, bias, dout);
    linear_out b = run_linear(more, in, w, bias, dout);
    CHECK(same_bits(&ref, &a));
    if (exact_at_any_count)
        CHECK(same_bits(&ref, &b));
    else
        CHECK(max_err(&b, &ref) <= 1e-5);
    printf("%-8s clone at %d threads: the same bits; at %d threads: %s\n", fb_backend_name(be),
           own, other, same_bits(&ref, &b) ? "the same bits" : "the same within 1e-5");

    /* the backend's count is still its own after its clones computed */
    CHECK_INT_EQ(fb_backend_threads(be), own);
    linear_out_free(&ref);
    linear_out_free(&a);
    linear_out_free(&b);
    free(in);
    free(w);
    free(bias);
    free(dout);
    fb_backend_clone_free(same);
    fb_backend_clone_free(more);
}

int main(void)
{
    check_backend(fb_backend_cpu(), 1, 4, false);
    check_backend(fb_backend_cpu(), 3, 2, false);
    check_backend(fb_backend_cpu_ref(), 0, 5, true);
    /* a clone of a clone is a clone too */
    fb_backend *c1 = fb_backend_clone_threads(fb_backend_cpu(), 2);
    fb_backend *c2 = c1 ? fb_backend_clone_threads(c1, 6) : NULL;
    CHECK(c2 != NULL);
    CHECK_INT_EQ(fb_backend_threads(c1), 2);
    CHECK_INT_EQ(fb_backend_threads(c2), 6);
    fb_backend_clone_free(c2);
    fb_backend_clone_free(c1);
    fb_backend_clone_free(NULL);
    printf("ok\n");
    return 0;
}
