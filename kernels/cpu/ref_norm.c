/*
 * Reference batch norm and layer norm, statistics in double.
 */
#include "cpu.h"

#include <math.h>

/* Element (n, c, i) of a [N, BC, HW] tensor. */
#define AT(x, n, c, i) (x)[((size_t)(n)*BC + (c)) * HW + (i)]

/*
 * in, out [N, BC, HW]; mean, rstd [BC] saved; running_mean, running_var [BC]
 * (may be NULL).  Per channel c over its M = N*HW values:
 *   mean = sum x / M, var = sum (x - mean)^2 / M (biased), rstd = 1/sqrt(var + eps)
 *   out = (x - mean) rstd gamma[c] + beta[c]
 *   running = (1 - momentum) running + momentum stat, with the unbiased
 *   variance var M / (M - 1) for running_var.
 */
void fb_ref_batchnorm_forward_train(fb_backend *be, float *out, float *mean, float *rstd,
                                    float *running_mean, float *running_var, const float *in,
                                    const float *gamma, const float *beta, int N, int BC, int HW,
                                    float eps, float momentum)
{
    const double M = (double)N * HW;
    for (int c = 0; c < BC; c++) {
        double s = 0.0, ss = 0.0;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++)
                s += AT(in, n, c, i);
        double mu = s / M;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                double d = AT(in, n, c, i) - mu;
                ss += d * d;
            }
        double var = ss / M;
        double r = 1.0 / sqrt(var + eps);
        double g = gamma ? gamma[c] : 1.0, bt = beta ? beta[c] : 0.0;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++)
                AT(out, n, c, i) = (float)((AT(in, n, c, i) - mu) * r * g + bt);
        mean[c] = (float)mu;
        rstd[c] = (float)r;
        double unbiased = M > 1.0 ? var * M / (M - 1.0) : var;
        if (running_mean)
            running_mean[c] = (float)((1.0 - momentum) * running_mean[c] + momentum * mu);
        if (running_var)
            running_var[c] = (float)((1.0 - momentum) * running_var[c] + momentum * unbiased);
    }
}

/* out [N, BC, HW] = (in - running_mean[c]) / sqrt(running_var[c] + eps)
 * gamma[c] + beta[c]. */
void fb_ref_batchnorm_forward_eval(fb_backend *be, float *out, const float *in,
                                   const float *gamma, const float *beta, const float *running_mean,
                                   const float *running_var, int N, int BC, int HW, float eps)
{
    for (int n = 0; n < N; n++)
        for (int c = 0; c < BC; c++) {
            double r = 1.0 / sqrt((double)running_var[c] + eps);
            double g = gamma ? gamma[c] : 1.0, bt = beta ? beta[c] : 0.0;
            for (int i = 0; i < HW; i++)
                AT(out, n, c, i) = (float)((AT(in, n, c, i) - running_mean[c]) * r * g + bt);
        }
}

/*
 * dout, in, din [N, BC, HW]; mean, rstd from the training forward.  With
 * xhat = (x - mean) rstd and M = N*HW, per channel:
 *   dbeta += sum dout, dgamma += sum dout xhat
 *   din += gamma rstd (dout - sum dout / M - xhat sum(dout xhat) / M)
 */
void fb_ref_batchnorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                               const float *dout, const float *in, const float *mean,
                               const float *rstd, const float *gamma, int N, int BC, int HW)
{
    const double M = (double)N * HW;
    for (int c = 0; c < BC; c++) {
        double mu = mean[c], r = rstd[c], g = gamma ? gamma[c] : 1.0;
        double sdy = 0.0, sdyx = 0.0;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                double dy = AT(dout, n, c, i);
                sdy += dy;
                sdyx += dy * (AT(in, n, c, i) - mu) * r;
            }
        if (dgamma) dgamma[c] = (float)(dgamma[c] + sdyx);
        if (dbeta) dbeta[c] = (float)(dbeta[c] + sdy);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                double xhat = (AT(in, n, c, i) - mu) * r;
                double d = g * r * (AT(dout, n, c, i) - sdy / M - xhat * sdyx / M);
                AT(din, n, c, i) = (float)(AT(din, n, c, i) + d);
            }
    }
}

#undef AT

/*
 * in, out [N, B, F]; gamma, beta [B, F] (may be NULL); mean, rstd [N, B].
 * Per row (n, b): mean, biased variance over F, rstd = 1/sqrt(var + eps),
 * out = (x - mean) rstd gamma[b] + beta[b].
 */
void fb_ref_layernorm_forward(fb_backend *be, float *out, float *mean, float *rstd,
                              const float *in, const float *gamma, const float *beta, int N, int B,
                              int F, float eps)
{
    for (int n = 0; n < N; n++)
        for (int b = 0; b < B; b++) {
            size_t row = (size_t)n * B + b;
            const float *x = in + row * F;
            double s = 0.0, ss = 0.0;
            for (int f = 0; f < F; f++)
                s += x[f];
            double mu = s / F;
            for (int f = 0; f < F; f++)
                ss += (x[f] - mu) * (x[f] - mu);
            double r = 1.0 / sqrt(ss / F + eps);
            for (int f = 0; f < F; f++) {
                double g = gamma ? gamma[(size_t)b * F + f] : 1.0;
                double bt = beta ? beta[(size_t)b * F + f] : 0.0;
                out[row * F + f] = (float)((x[f] - mu) * r * g + bt);
            }
            mean[row] = (float)mu;
            rstd[row] = (float)r;
        }
}

/*
 * dout, in, din [N, B, F]; mean, rstd [N, B]; gamma [B, F] (may be NULL).
 * Per row, with xhat = (x - mean) rstd and dxhat = dout gamma:
 *   din += rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))
 *   dgamma[b] += sum over n of dout xhat, dbeta[b] += sum over n of dout
 */
void fb_ref_layernorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                               const float *dout, const float *in, const float *mean,
                               const float *rstd, const float *gamma, int N, int B, int F)
{
    for (int n = 0; n < N; n++)
        for (int b = 0; b < B; b++) {
            size_t row = (size_t)n * B + b;
            double mu = mean[row], r = rstd[row];
            double s1 = 0.0, s2 = 0.0;
            for (int f = 0; f < F; f++) {
                double g = gamma ? gamma[(size_t)b * F + f] : 1.0;
                double dxh = dout[row * F + f] * g;
                s1 += dxh;
                s2 += dxh * (in[row * F + f] - mu) * r;
            }
            for (int f = 0; f < F; f++) {
                double g = gamma ? gamma[(size_t)b * F + f] : 1.0;
                double xhat = (in[row * F + f] - mu) * r;
                double d = r * (dout[row * F + f] * g - s1 / F - xhat * s2 / F);
                din[row * F + f] = (float)(din[row * F + f] + d);
            }
        }
    for (int b = 0; b < B; b++)
        for (int f = 0; f < F; f++) {
            double sg = 0.0, sb = 0.0;
            for (int n = 0; n < N; n++) {
                size_t row = (size_t)n * B + b;
                double dy = dout[row * F + f];
                sg += dy * (in[row * F + f] - mean[row]) * rstd[row];
                sb += dy;
            }
            if (dgamma) dgamma[(size_t)b * F + f] = (float)(dgamma[(size_t)b * F + f] + sg);
            if (dbeta) dbeta[(size_t)b * F + f] = (float)(dbeta[(size_t)b * F + f] + sb);
        }
}
