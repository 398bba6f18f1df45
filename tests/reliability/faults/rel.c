/* The fault scripts' shared helpers (rel.h). */
#include "rel.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

void rel_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int rel_rounds(int argc, char **argv, int short_rounds, int long_rounds)
{
    const char *env = getenv("FUSEBOX_RELIABILITY_LONG");
    int rounds = env && strcmp(env, "1") == 0 ? long_rounds : short_rounds;
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        long v = 0;
        if (strcmp(argv[i], "--long") == 0) {
            rounds = long_rounds;
        } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc &&
                   (v = strtol(argv[i + 1], &end, 10), *end == '\0') && v >= 1 && v <= 1000) {
            rounds = (int)v;
            i++;
        } else {
            fprintf(stderr, "usage: %s [--long | --rounds N (1..1000)]\n", argv[0]);
            CHECK(0);
        }
    }
    return rounds;
}

static void spec_fields(char *buf, size_t cap, int hidden, int batch, int data_seed, int steps,
                        int every)
{
    snprintf(buf, cap,
             "\"dataset\": \"synth\", \"model\": {\"input\": [16], \"layers\": [{\"type\":"
             " \"linear\", \"out\": %d}, {\"type\": \"relu\"}, {\"type\": \"linear\", \"out\":"
             " 4}]}, \"batch_size\": %d, \"data_seed\": %d, \"steps\": %d, \"eval_every\": 0,"
             " \"checkpoint_every\": %d, \"seed\": 5",
             hidden, batch, data_seed, steps, every);
}

void rel_sweep(e2e *t, const char *name, int hidden, int batch, int data_seed, int steps,
               int checkpoint_every, const char *lrs, int n, char (*ids)[64], char (*names)[64])
{
    CHECK(n >= 1 && n <= REL_MAX_TRIALS);
    char common[1024], body[2048];
    spec_fields(common, sizeof common, hidden, batch, data_seed, steps, checkpoint_every);
    snprintf(body, sizeof body,
             "{\"name\": \"%s\", \"base\": {%s, \"optimizer\": {\"type\": \"adam\","
             " \"lr\": 0.001}}, \"search\": {\"type\": \"grid\", \"params\":"
             " {\"optimizer.lr\": {\"values\": %s}}}}",
             name, common, lrs);
    /* trials in submission order, as the array holds them */
    e2e_submit_sweep(t, t->key, body, n, ids, names);
}

double rel_max_diff_to_reference(e2e *t, char (*ids)[64], char (*names)[64], int n,
                                 const char *tag)
{
    CHECK(n >= 1 && n <= REL_MAX_TRIALS);
    char files[REL_MAX_TRIALS][400], ref[400], path[128];
    const char *fp[REL_MAX_TRIALS];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "/v1/jobs/%s", ids[i]);
        fbt_resp r = fbt_call(&t->s, "GET", path, t->key, NULL);
        fbt_expect(&r, 200, NULL, "get a job");
        char *spec = json_dumps(json_object_get(r.json, "spec"), JSON_COMPACT);
        CHECK(spec != NULL);
        snprintf(files[i], sizeof files[i], "%s/%s-%d.json", t->root, tag, i);
        e2e_write(files[i], spec);
        free(spec);
        fbt_resp_free(&r);
        fp[i] = files[i];
    }
    snprintf(ref, sizeof ref, "%s/ref-%s", t->root, tag);
    e2e_train_reference(t, fp, n, ref);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        char got[400], want[600];
        snprintf(got, sizeof got, "%s/%s-model-%d.safetensors", t->root, tag, i);
        e2e_download_model(t, t->key, ids[i], got);
        snprintf(want, sizeof want, "%s/%s.safetensors", ref, names[i]);
        double d = e2e_max_diff(got, want);
        printf("%s: job %d: max |model - uninterrupted fusebox-train| = %g\n", tag, i, d);
        CHECK(d >= 0);
        if (d > worst) worst = d;
    }
    return worst;
}

long long rel_sql_ll(e2e *t, const char *sql)
{
    const char *v = fbt_sql_value(&t->s, sql);
    if (v[0] == '\0') fprintf(stderr, "NULL from: %s\n", sql);
    CHECK(v[0] != '\0');
    return atoll(v);
}

const char *rel_file_sha256(const char *path)
{
    static char out[65];
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "sha256sum '%s' 2>/dev/null", path);
    out[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (!p) return out;
    if (fscanf(p, "%64s", out) != 1) out[0] = '\0';
    pclose(p);
    return out;
}

long long rel_fill_disk(const char *filler)
{
    static char block[65536];
    int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    long long total = 0;
    size_t chunk = sizeof block;
    for (;;) {
        ssize_t n = write(fd, block, chunk);
        if (n > 0) {
            total += n;
            continue;
        }
        CHECK(n < 0 && errno == ENOSPC);
        if (chunk == 1) break;
        chunk /= 2; /* the last few bytes too */
    }
    close(fd);
    return total;
}

int rel_count_in(const char *file, const char *text)
{
    char cmd[PATH_MAX + 256];
    CHECK(!strchr(text, '\''));
    snprintf(cmd, sizeof cmd, "grep -c '%s' '%s' 2>/dev/null", text, file);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    int n = 0;
    if (fscanf(p, "%d", &n) != 1) n = 0;
    pclose(p);
    return n;
}

void rel_wait_count(e2e *t, const char *file, const char *text, int n, int timeout_s,
                    const char *what)
{
    double start = fbt_now_ms();
    while (rel_count_in(file, text) < n) {
        if (fbt_now_ms() - start > timeout_s * 1000.0) {
            fprintf(stderr, "timed out after %d s waiting for %s\n", timeout_s, what);
            e2e_dump(t);
            CHECK(0);
        }
        rel_sleep_ms(20);
    }
}
