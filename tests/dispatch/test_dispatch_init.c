/*
 * Initial weights and built-in aliases end to end: fuseboxd, PostgreSQL and a
 * real fusebox-worker, the tenant speaking HTTP (docs/jobspec.md, "Initial
 * weights").
 *
 * - A fine-tune from the tenant's own job trains from that job's model: one
 *   step at lr 1e-9 from the final model leaves the weights where the model
 *   was, while the same job without init lands far from it; a checkpoint by
 *   step serves too.
 * - Weights that do not fit the model fail the job with the worker's message
 *   naming the tensor, as a spec fault (no restart used).
 * - An init artifact replaced by a symbolic link leading out of the tenant's
 *   artifacts (to the server's admin key) is never read: the job fails with
 *   a clear error and the file's bytes reach no worker.
 * - A built-in registered under a name of the tenant's choosing trains.
 */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "e2e.h"

static e2e T;

/* e2e_spec's job with more members (before the closing brace). */
static const char *spec_with(const char *name, double lr, int steps, int hidden, const char *extra)
{
    static char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"name\": \"%s\", \"dataset\": \"synth\", \"model\": {\"input\": [16],"
             " \"layers\": [{\"type\": \"linear\", \"out\": %d}, {\"type\": \"relu\"},"
             " {\"type\": \"linear\", \"out\": 4}]}, \"batch_size\": 32, \"steps\": %d,"
             " \"checkpoint_every\": 30, \"optimizer\": {\"type\": \"adam\", \"lr\": %g},"
             " \"seed\": 3%s}",
             name, hidden, steps, lr, extra);
    return buf;
}

static const char *init_of(const char *job, const char *checkpoint)
{
    static char buf[256];
    snprintf(buf, sizeof buf, ", \"init\": {\"job\": \"%s\", \"checkpoint\": %s}", job,
             checkpoint);
    return buf;
}

static void run_to(const char *id, const char *state)
{
    e2e_wait_state(&T, T.key, id, state, 120);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    e2e_start(&T, NULL);
    pid_t w = e2e_worker(&T, "w-init");
    char a[64], b[64], c[64], d[64], e[64], f[64], path_a[600], path_b[600], path_c[600];

    /* the tenant's earlier job */
    snprintf(a, sizeof a, "%s", e2e_submit(&T, T.key, spec_with("source", 0.01, 60, 32, "")));
    run_to(a, "completed");
    snprintf(path_a, sizeof path_a, "%s/a.safetensors", T.root);
    e2e_download_model(&T, T.key, a, path_a);

    /* a fine-tune of it, and the same job from its seeded initialisation */
    snprintf(b, sizeof b, "%s",
             e2e_submit(&T, T.key, spec_with("tune", 1e-9, 1, 32, init_of(a, "\"final\""))));
    snprintf(c, sizeof c, "%s", e2e_submit(&T, T.key, spec_with("tune", 1e-9, 1, 32, "")));
    /* from its checkpoint at step 30 */
    snprintf(d, sizeof d, "%s",
             e2e_submit(&T, T.key, spec_with("from-30", 1e-9, 1, 32, init_of(a, "30"))));
    /* weights of another model */
    snprintf(e, sizeof e, "%s",
             e2e_submit(&T, T.key, spec_with("misfit", 0.01, 10, 8, init_of(a, "\"latest\""))));
    run_to(b, "completed");
    run_to(c, "completed");
    run_to(d, "completed");
    run_to(e, "failed");
    snprintf(path_b, sizeof path_b, "%s/b.safetensors", T.root);
    snprintf(path_c, sizeof path_c, "%s/c.safetensors", T.root);
    e2e_download_model(&T, T.key, b, path_b);
    e2e_download_model(&T, T.key, c, path_c);
    double from_init = e2e_max_diff(path_b, path_a), from_seed = e2e_max_diff(path_c, path_a);
    printf("one step at lr 1e-9: %.3g from the source model with init, %.3g without\n",
           from_init, from_seed);
    CHECK(from_init >= 0 && from_init < 1e-6);
    CHECK(from_seed > 1e-2);
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT init_path LIKE '%%state%%30%%' FROM jobs WHERE id = '%s'", d);
    CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "t");

    const char *err_e = e2e_job_field(&T, T.key, e, "error");
    printf("misfit: %s\n", err_e);
    CHECK(strstr(err_e, "do not fit") != NULL);
    CHECK(strstr(err_e, "0.weight") != NULL);
    CHECK_STR_EQ(e2e_job_field(&T, T.key, e, "restarts"), "0");

    /* the source's model replaced by a link to the server's admin key: never read */
    snprintf(sql, sizeof sql, "SELECT init_path FROM jobs WHERE id = '%s'", b);
    char rel[400], file[900], keep[920], target[400];
    snprintf(rel, sizeof rel, "%s", fbt_sql_value(&T.s, sql));
    snprintf(file, sizeof file, "%s/artifacts/%s", T.s.data_dir, rel);
    snprintf(keep, sizeof keep, "%s.kept", file);
    snprintf(target, sizeof target, "%s/admin.key", T.s.data_dir);
    struct stat st;
    CHECK(stat(target, &st) == 0);
    CHECK(rename(file, keep) == 0);
    CHECK(symlink(target, file) == 0);
    snprintf(f, sizeof f, "%s",
             e2e_submit(&T, T.key, spec_with("linked", 0.01, 5, 32, init_of(a, "\"final\""))));
    run_to(f, "failed");
    const char *err_f = e2e_job_field(&T, T.key, f, "error");
    printf("linked: %s\n", err_f);
    CHECK(strstr(err_f, "cannot be read") != NULL);
    CHECK(unlink(file) == 0);
    CHECK(rename(keep, file) == 0);

    /* a built-in under the tenant's own name */
    struct stat fm;
    if (stat("/usr/share/datasets/fashion-mnist", &fm) == 0) {
        fbt_resp r = fbt_call(&T.s, "POST", "/v1/datasets", T.key,
                              "{\"name\": \"clothes\", \"source\": \"builtin\", \"builtin\":"
                              " \"fashion-mnist\"}");
        fbt_expect(&r, 201, NULL, "register an alias");
        fbt_resp_free(&r);
        char g[64];
        snprintf(g, sizeof g, "%s",
                 e2e_submit(&T, T.key,
                            "{\"name\": \"alias\", \"dataset\": \"clothes\", \"model\": {\"input\":"
                            " [1, 28, 28], \"layers\": [{\"type\": \"flatten\"}, {\"type\":"
                            " \"linear\", \"out\": 10}]}, \"batch_size\": 32, \"steps\": 5,"
                            " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}"));
        run_to(g, "completed");
        printf("a job on the alias clothes of fashion-mnist completed\n");
    } else {
        /* scripts/test installs dataset-fashion-mnist: its absence is a broken set-up */
        fprintf(stderr, "/usr/share/datasets/fashion-mnist is missing (dataset-fashion-mnist)\n");
        CHECK(0);
    }

    CHECK_INT_EQ(e2e_kill(w, SIGTERM), 0);
    e2e_finish(&T);
    printf("ok\n");
    return 0;
}
