/*
 * Fast batch norm and layer norm.
 *
 * Batch norm of image activations [N, BC, HW] walks each channel's N
 * contiguous planes; for feature vectors (HW = 1) a channel is a strided
 * column, so channels go in chunks whose statistics sit in stack arrays while
 * the rows stream through contiguously.  Statistics accumulate in double.
 */
#include "cpu.h"

#include <math.h>

#define FB_BN_CHUNK 256

/* Sum of dy[i] (x[i] - c) over [0, n) in double. */
static inline double norm_dot_centered(const float *restrict dy, const float *restrict x, size_t n,
                                       double c)
{
    double s0 = 0, s1 = 0;
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
        s0 += dy[i] * (x[i] - c);
        s1 += dy[i + 1] * (x[i + 1] - c);
    }
    for (; i < n; i++)
        s0 += dy[i] * (x[i] - c);
    return s0 + s1;
}

/* PyTorch's running-statistics update with the unbiased variance. */
static inline void bn_update_running(float *running_mean, float *running_var, int c, double mu,
                                     double var, double M, float momentum)
{
    double unbiased = M > 1.0 ? var * M / (M - 1.0) : var;
    if (running_mean) running_mean[c] = (float)((1.0 - momentum) * running_mean[c] + momentum * mu);
    if (running_var)
        running_var[c] = (float)((1.0 - momentum) * running_var[c] + momentum * unbiased);
}

/* Feature-vector batch norm: in, out [N, BC]. */
static void bn_train_rows(float *out, float *mean, float *rstd, float *running_mean,
                          float *running_var, const float *in, const float *gamma,
                          const float *beta, int N, int BC, float eps, float momentum)
{
    for (int c0 = 0; c0 < BC; c0 += FB_BN_CHUNK) {
        const int cn = BC - c0 < FB_BN_CHUNK ? BC - c0 : FB_BN_CHUNK;
        double s[FB_BN_CHUNK] = {0}, ss[FB_BN_CHUNK] = {0};
        float mf[FB_BN_CHUNK], a[FB_BN_CHUNK], bt[FB_BN_CHUNK];
        for (int n = 0; n < N; n++) {
            const float *restrict x = in + (size_t)n * BC + c0;
            for (int c = 0; c < cn; c++)
                s[c] += x[c];
        }
        for (int c = 0; c < cn; c++)
            s[c] /= N; /* s now holds the mean */
        for (int n = 0; n < N; n++) {
            const float *restrict x = in + (size_t)n * BC + c0;
            for (int c = 0; c < cn; c++) {
                double d = x[c] - s[c];
                ss[c] += d * d;
            }
        }
        for (int c = 0; c < cn; c++) {
            double var = ss[c] / N, r = 1.0 / sqrt(var + eps);
            mf[c] = (float)s[c];
            a[c] = (float)(r * (gamma ? gamma[c0 + c] : 1.0f));
            bt[c] = beta ? beta[c0 + c] : 0.0f;
            mean[c0 + c] = (float)s[c];
            rstd[c0 + c] = (float)r;
            bn_update_running(running_mean, running_var, c0 + c, s[c], var, N, momentum);
        }
        for (int n = 0; n < N; n++) {
            const float *restrict x = in + (size_t)n * BC + c0;
            float *restrict o = out + (size_t)n * BC + c0;
            for (int c = 0; c < cn; c++)
                o[c] = (x[c] - mf[c]) * a[c] + bt[c];
        }
    }
}

/*
 * in, out [N, BC, HW]; mean, rstd [BC]; running_mean, running_var [BC] (may be
 * NULL).  Biased batch variance for normalising, unbiased for running_var.
 */
void fb_cpu_batchnorm_forward_train(fb_backend *be, float *out, float *mean, float *rstd,
                                    float *running_mean, float *running_var, const float *in,
                                    const float *gamma, const float *beta, int N, int BC, int HW,
                                    float eps, float momentum)
{
    if (HW == 1) {
        bn_train_rows(out, mean, rstd, running_mean, running_var, in, gamma, beta, N, BC, eps,
                      momentum);
        return;
    }
    const double M = (double)N * HW;
    for (int c = 0; c < BC; c++) {
        double s = 0.0, ss = 0.0;
        for (int n = 0; n < N; n++)
            s += fb_cpu_sum(in + ((size_t)n * BC + c) * HW, (size_t)HW);
        const double mu = s / M;
        for (int n = 0; n < N; n++)
            ss += fb_cpu_sum_sqdev(in + ((size_t)n * BC + c) * HW, (size_t)HW, mu);
        const double var = ss / M, r = 1.0 / sqrt(var + eps);
        const float mf = (float)mu, a = (float)(r * (gamma ? gamma[c] : 1.0f));
        const float bt = beta ? beta[c] : 0.0f;
        for (int n = 0; n < N; n++) {
            const float *restrict x = in + ((size_t)n * BC + c) * HW;
            float *restrict o = out + ((size_t)n * BC + c) * HW;
            for (int i = 0; i < HW; i++)
                o[i] = (x[i] - mf) * a + bt;
        }
        mean[c] = mf;
        rstd[c] = (float)r;
        bn_update_running(running_mean, running_var, c, mu, var, M, momentum);
    }
}

/* out [N, BC, HW] = (in - running_mean) / sqrt(running_var + eps) gamma + beta. */
void fb_cpu_batchnorm_forward_eval(fb_backend *be, float *out, const float *in,
                                   const float *gamma, const float *beta, const float *running_mean,
                                   const float *running_var, int N, int BC, int HW, float eps)
{
    for (int n = 0; n < N; n++) {
        if (HW == 1) {
            const float *restrict x = in + (size_t)n * BC;
            float *restrict o = out + (size_t)n * BC;
            for (int c = 0; c < BC; c++) {
                float a = (float)((gamma ? gamma[c] : 1.0f) / sqrt((double)running_var[c] + eps));
                o[c] = (x[c] - running_mean[c]) * a + (beta ? beta[c] : 0.0f);
            }
            continue;
        }
        for (int c = 0; c < BC; c++) {
            const float *restrict x = in + ((size_t)n * BC + c) * HW;
            float *restrict o = out + ((size_t)n * BC + c) * HW;
            const float a = (float)((gamma ? gamma[c] : 1.0f) / sqrt((double)running_var[c] + eps));
            const float m = running_mean[c], bt = beta ? beta[c] : 0.0f;
            for (int i = 0; i < HW; i++)
                o[i] = (x[i] - m) * a + bt;
        }
    }
}

/* Feature-vector batch norm backward: [N, BC] rows, channels in chunks. */
static void bn_backward_rows(float *din, float *dgamma, float *dbeta, const float *dout,
                             const float *in, const float *mean, const float *rstd,
                             const float *gamma, int N, int BC)
{
    for (int c0 = 0; c0 < BC; c0 += FB_BN_CHUNK) {
        const int cn = BC - c0 < FB_BN_CHUNK ? BC - c0 : FB_BN_CHUNK;
        double sdy[FB_BN_CHUNK] = {0}, sdyx[FB_BN_CHUNK] = {0};
        float a[FB_BN_CHUNK], k1[FB_BN_CHUNK], k0[FB_BN_CHUNK];
        const float *restrict mu = mean + c0;
        for (int n = 0; n < N; n++) {
            const float *restrict x = in + (size_t)n * BC + c0;
            const float *restrict dy = dout + (size_t)n * BC + c0;
            for (int c = 0; c < cn; c++) {
                sdy[c] += dy[c];
                sdyx[c] += dy[c] * ((double)x[c] - mu[c]);
            }
        }
        for (int c = 0; c < cn; c++) {
            double r = rstd[c0 + c], g = gamma ? gamma[c0 + c] : 1.0;
            double sx = sdyx[c] * r; /* sum dout xhat */
            if (dgamma) dgamma[c0 + c] += (float)sx;
            if (dbeta) dbeta[c0 + c] += (float)sdy[c];
            a[c] = (float)(g * r);
            k0[c] = (float)(-g * r * sdy[c] / N);
            k1[c] = (float)(-g * r * r * sx / N);
        }
        for (int n = 0; n < N; n++) {
            const float *restrict x = in + (size_t)n * BC + c0;
            const float *restrict dy = dout + (size_t)n * BC + c0;
            float *restrict d = din + (size_t)n * BC + c0;
            for (int c = 0; c < cn; c++)
                d[c] += a[c] * dy[c] + k1[c] * (x[c] - mu[c]) + k0[c];
        }
    }
}

/*
 * dout, in, din [N, BC, HW]; mean, rstd [BC].  Per channel, with M = N*HW:
 *   din += a dout + k1 (x - mean) + k0, a = gamma rstd,
 *   k0 = -a sum(dout) / M, k1 = -a rstd sum(dout xhat) / M.
 */
void fb_cpu_batchnorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                               const float *dout, const float *in, const float *mean,
                               const float *rstd, const float *gamma, int N, int BC, int HW)
{
    if (HW == 1) {
        bn_backward_rows(din, dgamma, dbeta, dout, in, mean, rstd, gamma, N, BC);
        return;
    }
    const double M = (double)N * HW;
    for (int c = 0; c < BC; c++) {
        const double mu = mean[c], r = rstd[c], g = gamma ? gamma[c] : 1.0;
        double sdy = 0.0, sdyx = 0.0;
        for (int n = 0; n < N; n++) {
            const float *x = in + ((size_t)n * BC + c) * HW;
            const float *dy = dout + ((size_t)n * BC + c) * HW;
            sdy += fb_cpu_sum(dy, (size_t)HW);
            sdyx += norm_dot_centered(dy, x, (size_t)HW, mu);
        }
        const double sx = sdyx * r;
        if (dgamma) dgamma[c] += (float)sx;
        if (dbeta) dbeta[c] += (float)sdy;
        const float a = (float)(g * r), k0 = (float)(-g * r * sdy / M);
        const float k1 = (float)(-g * r * r * sx / M), mf = (float)mu;
        for (int n = 0; n < N; n++) {
            const float *restrict x = in + ((size_t)n * BC + c) * HW;
            const float *restrict dy = dout + ((size_t)n * BC + c) * HW;
            float *restrict d = din + ((size_t)n * BC + c) * HW;
            for (int i = 0; i < HW; i++)
                d[i] += a * dy[i] + k1 * (x[i] - mf) + k0;
        }
    }
}

/* Floats moved below which a layer norm stays on one thread. */
#define LN_GRAIN 32768.0

/*
 * in, out [N, B, F]; gamma, beta [B, F] (may be NULL); mean, rstd [N, B].
 * Rows are independent: they are cut over threads.
 */
void fb_cpu_layernorm_forward(fb_backend *be, float *out, float *mean, float *rstd,
                              const float *in, const float *gamma, const float *beta, int N, int B,
                              int F, float eps)
{
    const int nt = fb_cpu_team(be, 2.0 * N * (double)B * F, LN_GRAIN);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (size_t row = 0; row < (size_t)N * B; row++) {
        const size_t b = row % (size_t)B;
        const float *restrict x = in + row * F;
        float *restrict o = out + row * F;
        const double mu = fb_cpu_sum(x, (size_t)F) / F;
        const double r = 1.0 / sqrt(fb_cpu_sum_sqdev(x, (size_t)F, mu) / F + eps);
        const float mf = (float)mu, rf = (float)r;
        const float *restrict g = gamma ? gamma + b * F : NULL;
        const float *restrict bt = beta ? beta + b * F : NULL;
        if (g && bt)
            for (int f = 0; f < F; f++)
                o[f] = (x[f] - mf) * rf * g[f] + bt[f];
        else if (g)
            for (int f = 0; f < F; f++)
                o[f] = (x[f] - mf) * rf * g[f];
        else if (bt)
            for (int f = 0; f < F; f++)
                o[f] = (x[f] - mf) * rf + bt[f];
        else
            for (int f = 0; f < F; f++)
                o[f] = (x[f] - mf) * rf;
        mean[row] = mf;
        rstd[row] = rf;
    }
}

/* s1 = sum of dy g, s2 = sum of dy g (x - mf) over [0, F), in double, with
 * four accumulators each (one running sum would be a chain of dependent
 * adds), kept in scalars so that they stay in registers. */
static inline void ln_row_sums(const float *restrict dy, const float *restrict g,
                               const float *restrict x, float mf, int F, double *s1, double *s2)
{
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0, c0 = 0, c1 = 0, c2 = 0, c3 = 0;
    int f = 0;
    for (; f + 4 <= F; f += 4) {
        const double d0 = (double)dy[f] * g[f], d1 = (double)dy[f + 1] * g[f + 1];
        const double d2 = (double)dy[f + 2] * g[f + 2], d3 = (double)dy[f + 3] * g[f + 3];
        a0 += d0;
        a1 += d1;
        a2 += d2;
        a3 += d3;
        c0 += d0 * (x[f] - mf);
        c1 += d1 * (x[f + 1] - mf);
        c2 += d2 * (x[f + 2] - mf);
        c3 += d3 * (x[f + 3] - mf);
    }
    for (; f < F; f++) {
        const double d = (double)dy[f] * g[f];
        a0 += d;
        c0 += d * (x[f] - mf);
    }
    *s1 = (a0 + a1) + (a2 + a3);
    *s2 = (c0 + c1) + (c2 + c3);
}

/*
 * dout, in, din [N, B, F]; mean, rstd [N, B]; gamma [B, F] (may be NULL).
 * Per row, xhat = (x - mean) rstd, dxhat = dout gamma:
 *   din += rstd (dxhat - sum(dxhat)/F - xhat sum(dxhat xhat)/F)
 *   dgamma[b] += dout xhat, dbeta[b] += dout
 * Members are dealt out to threads, each walking its members' rows in memory
 * order (n ascending), so dgamma and dbeta are summed in the same order at
 * every thread count.
 */
void fb_cpu_layernorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                               const float *dout, const float *in, const float *mean,
                               const float *rstd, const float *gamma, int N, int B, int F)
{
    const int nt = fb_cpu_team(be, 3.0 * N * (double)B * F, LN_GRAIN);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        size_t b0, b1;
        fb_cpu_split((size_t)B, omp_get_thread_num(), omp_get_num_threads(), 1, &b0, &b1);
        for (size_t n = 0; n < (size_t)N; n++)
            for (size_t b = b0; b < b1; b++) {
                const size_t row = n * B + b;
                const float *restrict x = in + row * F;
                const float *restrict dy = dout + row * F;
                float *restrict d = din + row * F;
                const float *restrict g = gamma ? gamma + b * F : NULL;
                const float mf = mean[row], rf = rstd[row];
                double s1 = 0.0, s2 = 0.0;
                if (g) {
                    ln_row_sums(dy, g, x, mf, F, &s1, &s2);
                } else {
                    s1 = fb_cpu_sum(dy, (size_t)F);
                    s2 = norm_dot_centered(dy, x, (size_t)F, mf);
                }
                const float k0 = (float)(-(double)rf * s1 / F);
                const float k1 = (float)(-(double)rf * rf * rf * s2 / F); /* times (x - mean) */
                if (g)
                    for (int f = 0; f < F; f++)
                        d[f] += rf * dy[f] * g[f] + k1 * (x[f] - mf) + k0;
                else
                    for (int f = 0; f < F; f++)
                        d[f] += rf * dy[f] + k1 * (x[f] - mf) + k0;
                if (dgamma) {
                    float *restrict dg = dgamma + b * F;
                    for (int f = 0; f < F; f++)
                        dg[f] += dy[f] * ((x[f] - mf) * rf);
                }
                if (dbeta) {
                    float *restrict db = dbeta + b * F;
                    for (int f = 0; f < F; f++)
                        db[f] += dy[f];
                }
            }
    }
}
