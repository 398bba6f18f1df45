/*
 * torch_driver: runs fusebox's engine on files that a PyTorch script wrote, and
 * writes back what the engine computed, so that test_torch_parity.py can
 * compare the two.
 *
 *   torch_driver [--backend cpu|cpu-ref|cuda] [--threads T] grad SPEC INIT BATCH OUT_PREFIX
 *     B = 1.  Loads INIT into the model of SPEC, runs one train-mode forward and
 *     backward on BATCH ("x" F32 [N, ...], "y" I64 [N]) and writes
 *       OUT_PREFIX.logits.safetensors  "logits" [N, K] and "loss" [] of that
 *                                      forward, "eval_logits" [N, K] of an
 *                                      eval-mode forward run afterwards (it
 *                                      uses the updated running statistics);
 *       OUT_PREFIX.grads.safetensors   every parameter's gradient;
 *       OUT_PREFIX.after.safetensors   parameters and batch-norm buffers after
 *                                      the train-mode forward.
 *
 *   torch_driver [--backend ...] [--threads T] traj SPEC INIT [SPEC INIT ...] BATCHES OUT.json
 *     B = number of SPEC/INIT pairs, fused in one array.  BATCHES holds "x" F32
 *     [S, N, ...] and "y" I64 [S, N].  For each step s: train-mode forward and
 *     backward on batch s, then one optimizer update (update s + 1 of S).
 *     Writes the losses before each update: a JSON array of S numbers when
 *     B = 1, else an array of B such arrays (one per member, in argument order).
 *     The specs' precision applies (bf16: operands rounded, loss scaling).
 *
 * Exit status: 0 on success, 1 on a failure (message on stderr), 2 on bad usage.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "cuda/cuda_backend.h"
#include "safetensors.h"

#define MSG_CAP 1024

static void usage(FILE *f)
{
    fprintf(f,
            "usage: torch_driver [--backend cpu|cpu-ref|cuda] [--threads T] grad SPEC INIT BATCH "
            "OUT_PREFIX\n"
            "       torch_driver [--backend cpu|cpu-ref|cuda] [--threads T] traj SPEC INIT "
            "[SPEC INIT ...] BATCHES OUT.json\n");
}

/*
 * Reads "x" [lead..., input shape] as float and "y" [lead...] as int32 from an
 * open batch file, where lead is n_lead leading dimensions taken from the file
 * (1 for a batch [N], 2 for a sequence of batches [S, N]).  lead[] receives
 * them.  *x and *y are malloc'd; the caller frees them.
 */
static int read_batch(const fb_st_file *f, const fb_shape *input, int n_lead, int64_t *lead,
                      float **x, int32_t **y, char *msg, size_t msg_cap)
{
    const fb_st_tensor *tx = fb_st_find(f, "x");
    if (!tx) return fb_errf(msg, msg_cap, FB_ERR_DATA, "the batch file has no tensor \"x\"");
    if (tx->ndim != n_lead + input->ndim)
        return fb_errf(msg, msg_cap, FB_ERR_DATA, "x has %d dimensions, expected %d", tx->ndim,
                       n_lead + input->ndim);
    int64_t shape[FB_ST_MAX_DIMS];
    size_t rows = 1;
    for (int i = 0; i < n_lead; i++) {
        if (tx->shape[i] < 1 || tx->shape[i] > (1 << 20))
            return fb_errf(msg, msg_cap, FB_ERR_DATA, "x dimension %d is %lld", i,
                           (long long)tx->shape[i]);
        lead[i] = shape[i] = tx->shape[i];
        rows *= (size_t)tx->shape[i];
    }
    for (int i = 0; i < input->ndim; i++) shape[n_lead + i] = input->d[i];
    size_t numel = rows * (size_t)fb_shape_numel(input);
    float *hx = malloc(numel * sizeof *hx);
    int64_t *y64 = malloc(rows * sizeof *y64);
    int32_t *hy = malloc(rows * sizeof *hy);
    int err = FB_ERR_NOMEM;
    if (!hx || !y64 || !hy) {
        fb_errf(msg, msg_cap, err, "out of memory");
        goto fail;
    }
    if ((err = fb_st_get_f32(f, "x", shape, n_lead + input->ndim, hx, msg, msg_cap))) goto fail;
    if ((err = fb_st_get_i64(f, "y", lead, n_lead, y64, msg, msg_cap))) goto fail;
    for (size_t i = 0; i < rows; i++) {
        if (y64[i] < 0 || y64[i] > INT32_MAX) {
            err = fb_errf(msg, msg_cap, FB_ERR_DATA, "label %lld at %zu is out of range",
                          (long long)y64[i], i);
            goto fail;
        }
        hy[i] = (int32_t)y64[i];
    }
    free(y64);
    *x = hx;
    *y = hy;
    return FB_OK;
fail:
    free(hx);
    free(y64);
    free(hy);
    return err;
}

/* Writes a JSON number, or null for a value JSON cannot hold. */
static void put_number(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.9g", v);
    else
        fputs("null", f);
}

static int run_grad(fb_backend *be, const char *spec_path, const char *init_path,
                    const char *batch_path, const char *prefix, char *msg, size_t msg_cap)
{
    fb_job_spec spec;
    fb_st_file *bf = NULL;
    fb_array *a = NULL;
    fb_st_writer *w = NULL;
    float *x = NULL, *logits = NULL, *eval_logits = NULL;
    int32_t *y = NULL;
    int64_t lead[1];
    char path[4096];
    int err = fb_job_spec_load(spec_path, NULL, &spec, msg, msg_cap);
    if (err) return err;
    const fb_job_spec *specs[1] = {&spec};
    if ((err = fb_st_open(batch_path, &bf, msg, msg_cap))) goto done;
    if ((err = read_batch(bf, &spec.input, 1, lead, &x, &y, msg, msg_cap))) goto done;
    int N = (int)lead[0];
    if ((err = fb_array_new(be, specs, 1, N, &a, msg, msg_cap))) goto done;
    if ((err = fb_array_load(a, 0, init_path, msg, msg_cap))) goto done;

    float loss = 0;
    if ((err = fb_array_forward_backward(a, x, y, N, true, 0, &loss, NULL, msg, msg_cap)))
        goto done;
    int K = fb_array_outputs(a);
    logits = malloc((size_t)N * (size_t)K * sizeof *logits);
    eval_logits = malloc((size_t)N * (size_t)K * sizeof *eval_logits);
    w = fb_st_writer_new();
    if (!logits || !eval_logits || !w) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto done;
    }
    fb_array_logits(a, 0, N, logits);

    /* gradients and running statistics before the eval forward touches anything */
    snprintf(path, sizeof path, "%s.grads.safetensors", prefix);
    if ((err = fb_array_save(a, 0, path, true, NULL, NULL, msg, msg_cap))) goto done;
    snprintf(path, sizeof path, "%s.after.safetensors", prefix);
    if ((err = fb_array_save(a, 0, path, false, NULL, NULL, msg, msg_cap))) goto done;

    if ((err = fb_array_forward_backward(a, x, NULL, N, false, 0, NULL, NULL, msg, msg_cap)))
        goto done;
    fb_array_logits(a, 0, N, eval_logits);

    int64_t shape[2] = {N, K};
    if ((err = fb_st_writer_add_f32(w, "logits", shape, 2, logits, msg, msg_cap)) ||
        (err = fb_st_writer_add_f32(w, "eval_logits", shape, 2, eval_logits, msg, msg_cap)) ||
        (err = fb_st_writer_add_f32(w, "loss", NULL, 0, &loss, msg, msg_cap)))
        goto done;
    snprintf(path, sizeof path, "%s.logits.safetensors", prefix);
    err = fb_st_write(w, path, msg, msg_cap);
done:
    fb_st_writer_free(w);
    free(logits);
    free(eval_logits);
    free(x);
    free(y);
    fb_array_free(a);
    fb_st_close(bf);
    fb_job_spec_free(&spec);
    return err;
}

/* pairs: B (SPEC, INIT) path pairs. */
static int run_traj(fb_backend *be, char **pairs, int B, const char *batch_path,
                    const char *out_path, char *msg, size_t msg_cap)
{
    fb_job_spec *specs = calloc((size_t)B, sizeof *specs);
    const fb_job_spec **sp = calloc((size_t)B, sizeof *sp);
    fb_optim_hparams *hp = calloc((size_t)B, sizeof *hp);
    float *step_loss = calloc((size_t)B, sizeof *step_loss);
    fb_st_file *bf = NULL;
    fb_array *a = NULL;
    float *x = NULL, *losses = NULL;
    int32_t *y = NULL;
    int n_specs = 0, err = FB_ERR_NOMEM;
    if (!specs || !sp || !hp || !step_loss) {
        fb_errf(msg, msg_cap, err, "out of memory");
        goto done;
    }
    for (; n_specs < B; n_specs++) {
        if ((err = fb_job_spec_load(pairs[2 * n_specs], NULL, &specs[n_specs], msg, msg_cap)))
            goto done;
        sp[n_specs] = &specs[n_specs];
    }
    int64_t lead[2];
    if ((err = fb_st_open(batch_path, &bf, msg, msg_cap))) goto done;
    if ((err = read_batch(bf, &specs[0].input, 2, lead, &x, &y, msg, msg_cap))) goto done;
    int S = (int)lead[0], N = (int)lead[1];
    size_t x_step = (size_t)N * (size_t)fb_shape_numel(&specs[0].input);
    losses = calloc((size_t)S * (size_t)B, sizeof *losses);
    if (!losses) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((err = fb_array_new(be, sp, B, N, &a, msg, msg_cap))) goto done;
    for (int b = 0; b < B; b++)
        if ((err = fb_array_load(a, b, pairs[2 * b + 1], msg, msg_cap))) goto done;
    /* as the worker does per group turn: TF32 for tf32, and for bf16, whose
     * operands the array rounds itself (exact in TF32); no-op off CUDA */
    fb_cuda_backend_set_tf32(be, specs[0].precision != FB_PREC_FP32);

    for (int s = 0; s < S; s++) {
        if ((err = fb_array_forward_backward(a, x + (size_t)s * x_step, y + (size_t)s * N, N, true,
                                             (uint64_t)s, step_loss, NULL, msg, msg_cap)))
            goto done;
        for (int b = 0; b < B; b++) {
            losses[(size_t)b * S + s] = step_loss[b];
            fb_array_hparams(a, b, s + 1, S, &hp[b]);
        }
        fb_array_step(a, hp);
    }

    FILE *f = fopen(out_path, "w");
    if (!f) {
        err = fb_errf(msg, msg_cap, FB_ERR_IO, "cannot write %s", out_path);
        goto done;
    }
    if (B > 1) fputc('[', f);
    for (int b = 0; b < B; b++) {
        fputs(b ? ",\n[" : "[", f);
        for (int s = 0; s < S; s++) {
            if (s) fputc(',', f);
            put_number(f, losses[(size_t)b * S + s]);
        }
        fputc(']', f);
    }
    if (B > 1) fputc(']', f);
    fputc('\n', f);
    err = fclose(f) == 0 ? FB_OK : fb_errf(msg, msg_cap, FB_ERR_IO, "cannot write %s", out_path);
done:
    fb_array_free(a);
    fb_st_close(bf);
    free(x);
    free(y);
    free(losses);
    if (specs)
        for (int b = 0; b < n_specs; b++) fb_job_spec_free(&specs[b]);
    free(specs);
    free(sp);
    free(hp);
    free(step_loss);
    return err;
}

int main(int argc, char **argv)
{
    const char *backend = "cpu";
    int threads = 1, i = 1;
    while (i < argc && strncmp(argv[i], "--", 2) == 0) {
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
            backend = argv[i + 1];
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            threads = atoi(argv[i + 1]);
            if (threads < 1 || threads > 1024) {
                fprintf(stderr, "torch_driver: --threads needs an integer in [1, 1024]\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
        i += 2;
    }
    fb_backend *be = strcmp(backend, "cpu") == 0       ? fb_backend_cpu()
                       : strcmp(backend, "cpu-ref") == 0 ? fb_backend_cpu_ref()
                                                          : NULL;
    if (strcmp(backend, "cuda") == 0) {
        /* device 0; 77 tells the test script that there is none to test */
        char why[256];
        if (fb_cuda_backend_get(0, &be, why, sizeof why) != FB_OK) {
            fprintf(stderr, "torch_driver: no CUDA backend: %s\n", why);
            return 77;
        }
    }
    if (!be) {
        fprintf(stderr, "torch_driver: unknown backend '%s' (cpu, cpu-ref, cuda)\n", backend);
        return 2;
    }
    fb_backend_set_threads(be, threads);

    int rest = argc - i, err;
    char msg[MSG_CAP] = "";
    if (rest == 5 && strcmp(argv[i], "grad") == 0) {
        err = run_grad(be, argv[i + 1], argv[i + 2], argv[i + 3], argv[i + 4], msg, sizeof msg);
    } else if (rest >= 5 && (rest - 3) % 2 == 0 && strcmp(argv[i], "traj") == 0) {
        int B = (rest - 3) / 2;
        err = run_traj(be, argv + i + 1, B, argv[argc - 2], argv[argc - 1], msg, sizeof msg);
    } else {
        usage(stderr);
        return 2;
    }
    /* A failed device call is recorded by the backend, not returned by the
     * ops: the run only counts if none happened. */
    if (!err) err = fb_cuda_backend_error(be, msg, sizeof msg);
    if (err) {
        fprintf(stderr, "torch_driver: %s (%s)\n", msg, fb_err_code(err));
        return 1;
    }
    return 0;
}
