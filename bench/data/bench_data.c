/*
 * bench_data: is the data path ever why a device waits?  One table, all rows
 * measured in one run on Fashion-MNIST's train split (60000 x 28x28 uint8):
 *
 *   - the consumption rate of a fused array of 16 MLPs (784-256-10, batch
 *     128) on this machine's CPU backend: the rate the loader must beat
 *     (in a child process, 10 timed steps after 3 warm-up steps);
 *   - a plain single-threaded read of the raw IDX file (read + u8->float);
 *   - the loader with 1, 2 and 4 reader threads, cold (staging into an
 *     empty cache: copy + verify, then read) and warm (cache populated);
 *   - zstd -d on the same compressed chunks (written out as one .zst file),
 *     and libzstd in-process: the decompression limit; the loader's
 *     per-thread decompression rate against it;
 *   - the compression ratio;
 *   - fusebox-train training 16 MLPs from the shard dataset: the I/O wait
 *     per step as a fraction of the step time.
 *
 * Every figure is the median of --reps runs.  MB/s counts decoded record
 * bytes (788 per sample: 784 pixels and a 4-byte label) for the loader and
 * zstd rows, file bytes for the IDX row.
 *
 * usage: bench_data --train-bin PATH [--src DIR] [--work DIR] [--reps N]
 *                   [--epochs N] [--train-steps N]
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <zlib.h>
#include <zstd.h>

#include "array.h"
#include "datadir.h"
#include "jobspec.h"
#include "kernels.h"
#include "loader.h"

#define BATCH 128
#define MEMBERS 16
#define MAXREP 32

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_data: %s: %s\n", what, msg);
    exit(1);
}

static void rm_rf(const char *p)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    if (system(cmd) != 0) die("rm -rf", p);
}

/* gunzips src into dst (the raw IDX file the plain reader reads). */
static void gunzip(const char *src, const char *dst)
{
    gzFile in = gzopen(src, "rb");
    FILE *out = fopen(dst, "wb");
    if (!in || !out) die("cannot open", src);
    static char buf[1 << 16];
    int k;
    while ((k = gzread(in, buf, sizeof buf)) > 0)
        if (fwrite(buf, 1, (size_t)k, out) != (size_t)k) die("cannot write", dst);
    gzclose(in);
    if (fclose(out) != 0) die("cannot write", dst);
}

/* ---------------------------------------------------------------- rows */

/* Plain single-threaded read of the raw IDX images and labels, converting
 * pixels to floats as the loader does. Returns seconds. */
static double idx_read(const char *images, const char *labels, uint64_t *bytes)
{
    double t0 = now_s();
    int fi = open(images, O_RDONLY), fl = open(labels, O_RDONLY);
    if (fi < 0 || fl < 0) die("cannot open", images);
    static uint8_t buf[1 << 20];
    float *out = malloc(sizeof(float) * (1 << 20));
    uint64_t total = 0;
    ssize_t k;
    double sink = 0;
    while ((k = read(fi, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < k; i++) out[i] = (float)buf[i] / 255.0f;
        sink += out[k / 2];
        total += (uint64_t)k;
    }
    while ((k = read(fl, buf, sizeof buf)) > 0) total += (uint64_t)k;
    close(fi);
    close(fl);
    free(out);
    *bytes = total;
    if (sink < 0) printf("%f", sink);
    return now_s() - t0;
}

typedef struct loader_run {
    double seconds;     /* open (staging included) to the last batch */
    double per_thread;  /* decoded bytes per thread-second of decoding */
    double wait_frac;
} loader_run;

static loader_run loader_epochs(const char *dir, const char *cache, int threads, int epochs)
{
    char msg[1024];
    double t0 = now_s();
    fb_loader *l = NULL;
    fb_loader_opts o = {.dir = dir, .split = "train", .batch_size = BATCH, .shuffle = true,
                        .data_seed = 0, .drop_last = true, .threads = threads,
                        .cache_dir = cache, .cache_bytes = (uint64_t)1 << 34};
    if (fb_loader_open(&l, &o, msg, sizeof msg)) die("loader", msg);
    int64_t nb = epochs * (fb_loader_samples(l) / BATCH);
    int64_t sink = 0;
    for (int64_t k = 0; k < nb; k++) {
        fb_loader_batch b;
        if (fb_loader_next(&b, l, msg, sizeof msg)) die("loader", msg);
        sink += b.y[0];
    }
    loader_run r;
    r.seconds = now_s() - t0;
    fb_loader_stats st;
    fb_loader_get_stats(&st, l);
    r.per_thread = st.decode_s > 0 ? (double)st.bytes_decoded / st.decode_s : 0;
    r.wait_frac = st.wait_s / r.seconds;
    fb_loader_free(l);
    if (sink < 0) printf("%" PRId64, sink);
    return r;
}

/* Writes every chunk's zstd frame of the train split into one .zst file
 * (concatenated frames are one valid zstd stream); returns decoded bytes. */
static uint64_t extract_frames(const char *dir, const char *zst, uint8_t **frames, size_t *flen,
                               size_t **offs, size_t **lens, size_t *nframes)
{
    char msg[1024], path[4400];
    fb_manifest m;
    if (fb_manifest_open_dir(&m, dir, msg, sizeof msg)) die("manifest", msg);
    const fb_manifest_split *sp = fb_manifest_find_split(&m, "train");
    FILE *out = fopen(zst, "wb");
    if (!out) die("cannot create", zst);
    uint64_t raw = 0;
    size_t cap = 0, n = 0, ncap = 0;
    *frames = NULL;
    *flen = 0;
    *offs = NULL;
    *lens = NULL;
    for (int i = 0; i < sp->n_shards; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, sp->shards[i].path);
        fb_shard_reader *r;
        if (fb_shard_open(&r, path, msg, sizeof msg)) die("shard", msg);
        size_t blen;
        FILE *f = fopen(path, "rb");
        const fb_shard_meta *mt = fb_shard_get_meta(r);
        uint8_t *b = malloc(mt->bytes);
        blen = fread(b, 1, mt->bytes, f);
        fclose(f);
        if (blen != mt->bytes) die("short read", path);
        for (int64_t c = 0; c < mt->chunks; c++) {
            const fb_shard_chunk_entry *e = fb_shard_get_chunk(r, c);
            fwrite(b + e->offset, 1, e->stored, out);
            if (*flen + e->stored > cap) {
                cap = 2 * (*flen + e->stored);
                *frames = realloc(*frames, cap);
            }
            if (n == ncap) {
                ncap = ncap ? 2 * ncap : 256;
                *offs = realloc(*offs, ncap * sizeof **offs);
                *lens = realloc(*lens, ncap * sizeof **lens);
            }
            memcpy(*frames + *flen, b + e->offset, e->stored);
            (*offs)[n] = *flen;
            (*lens)[n] = e->stored;
            n++;
            *flen += e->stored;
            raw += e->raw;
        }
        free(b);
        fb_shard_close(r);
    }
    *nframes = n;
    fclose(out);
    fb_manifest_free(&m);
    return raw;
}

/* Wall time of `zstd -d -q -c FILE > /dev/null`, or -1 without zstd. */
static double zstd_cli(const char *zst)
{
    double t0 = now_s();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int nul = open("/dev/null", O_WRONLY);
        if (nul < 0 || dup2(nul, 1) < 0) _exit(126);
        execlp("zstd", "zstd", "-d", "-q", "-c", zst, (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return -1;
    return now_s() - t0;
}

/* One thread decompressing every frame in process. Returns seconds. */
static double zstd_lib(const uint8_t *frames, const size_t *offs, const size_t *lens, size_t n,
                       uint8_t *dst, size_t cap)
{
    ZSTD_DCtx *d = ZSTD_createDCtx();
    double t0 = now_s();
    for (size_t i = 0; i < n; i++) {
        size_t k = ZSTD_decompressDCtx(d, dst, cap, frames + offs[i], lens[i]);
        if (ZSTD_isError(k)) die("zstd", ZSTD_getErrorName(k));
    }
    double t = now_s() - t0;
    ZSTD_freeDCtx(d);
    return t;
}

static const char *mlp_spec(char *buf, size_t cap, int member, int steps)
{
    snprintf(buf, cap,
             "{\"name\": \"mlp%02d\", \"dataset\": \"fashion-mnist\", \"model\": {\"input\": "
             "[1, 28, 28], \"layers\": [{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": "
             "256}, {\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 10}]}, "
             "\"batch_size\": %d, \"steps\": %d, \"optimizer\": {\"type\": \"adamw\", \"lr\": "
             "%.5f}, \"seed\": %d, \"data_seed\": 0, \"eval_every\": 0}",
             member, BATCH, steps, 0.001 * (1 + member % 4), member + 1);
    return buf;
}

/* The fused array the consumption rate is measured on. */
typedef struct consumer {
    fb_job_spec specs[MEMBERS];
    fb_array *a;
    float *x;
    int32_t y[BATCH];
} consumer;

static void consumer_init(consumer *c, int threads)
{
    char msg[1024], json[2048];
    const fb_job_spec *sp[MEMBERS];
    for (int b = 0; b < MEMBERS; b++) {
        mlp_spec(json, sizeof json, b, 100);
        if (fb_job_spec_parse(json, strlen(json), NULL, &c->specs[b], msg, sizeof msg))
            die("spec", msg);
        sp[b] = &c->specs[b];
    }
    fb_backend *be = fb_backend_cpu();
    fb_backend_set_threads(be, threads);
    if (fb_array_new(be, sp, MEMBERS, BATCH, &c->a, msg, sizeof msg)) die("array", msg);
    c->x = malloc(sizeof(float) * BATCH * 784);
    for (int i = 0; i < BATCH * 784; i++) c->x[i] = (float)((i * 37) % 255) / 255.0f;
    for (int i = 0; i < BATCH; i++) c->y[i] = i % 10;
}

static void consumer_free(consumer *c)
{
    fb_array_free(c->a);
    free(c->x);
    for (int b = 0; b < MEMBERS; b++) fb_job_spec_free(&c->specs[b]);
}

/* Seconds per training step of the fused array, measured in a child
 * process: its BLAS and OpenMP threads keep spinning after a step, and must
 * not steal the CPU from the loader measurements that follow.  The array is
 * built and warmed up (3 steps) first; then `steps` steps are timed. */
static double consumer_step(consumer *c, int steps);

static double consumer_child(int threads, int steps)
{
    int fd[2];
    if (pipe(fd) != 0) die("pipe", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) die("fork", strerror(errno));
    if (pid == 0) {
        /* a fresh process (exec), not a fork: BLAS and OpenMP thread pools
         * do not survive fork */
        char th[16], st[16];
        snprintf(th, sizeof th, "%d", threads);
        snprintf(st, sizeof st, "%d", steps);
        if (dup2(fd[1], 1) < 0) _exit(126);
        execl("/proc/self/exe", "bench_data", "--consume", th, st, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[64] = "";
    ssize_t k = read(fd[0], buf, sizeof buf - 1);
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    if (k <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) die("consumer", "no result");
    buf[k] = '\0';
    return atof(buf);
}

/* The child's side: prints the seconds per step. */
static int consumer_main(int threads, int steps)
{
    consumer c;
    consumer_init(&c, threads);
    consumer_step(&c, 3);
    double t = consumer_step(&c, steps);
    consumer_free(&c);
    printf("%.9f\n", t);
    return 0;
}

/* Seconds per training step of the fused array (mean of `steps`). */
static double consumer_step(consumer *c, int steps)
{
    char msg[1024];
    float loss[MEMBERS], corr[MEMBERS];
    fb_optim_hparams hp[MEMBERS];
    double t0 = now_s();
    for (int s = 0; s < steps; s++) {
        if (fb_array_forward_backward(c->a, c->x, c->y, BATCH, true, (uint64_t)s, loss, corr,
                                      msg, sizeof msg))
            die("forward", msg);
        for (int b = 0; b < MEMBERS; b++) fb_array_hparams(c->a, b, s + 1, 100, &hp[b]);
        fb_array_step(c->a, hp);
    }
    return (now_s() - t0) / steps;
}

typedef struct train_run {
    double io_frac, io_frac_steady; /* I/O wait / step time: all steps, after the first log */
    double step_ms, io_ms;
} train_run;

/* Runs fusebox-train on 16 fused MLP specs over the shard dataset and reads
 * its JSON lines: member 0's step events carry the mean I/O wait per step
 * and the array's samples/s since the previous event. */
static train_run train_wait(const char *bin, const char *work, const char *root,
                            const char *stage, int steps, int threads)
{
    char json[2048], out[4400];
    const char *argv[64];
    int argc = 0;
    static char specs[MEMBERS][4400];
    argv[argc++] = bin;
    argv[argc++] = "--json";
    argv[argc++] = "--no-out";
    argv[argc++] = "--no-eval";
    argv[argc++] = "--log-every";
    argv[argc++] = "10";
    argv[argc++] = "--threads";
    char th[16];
    snprintf(th, sizeof th, "%d", threads);
    argv[argc++] = th;
    argv[argc++] = "--data-threads";
    argv[argc++] = "2";
    argv[argc++] = "--data-dir";
    argv[argc++] = root;
    argv[argc++] = "--stage";
    argv[argc++] = stage;
    for (int b = 0; b < MEMBERS; b++) {
        snprintf(specs[b], sizeof specs[b], "%s/mlp%02d.json", work, b);
        FILE *f = fopen(specs[b], "w");
        fputs(mlp_spec(json, sizeof json, b, steps), f);
        fclose(f);
        argv[argc++] = specs[b];
    }
    argv[argc] = NULL;
    snprintf(out, sizeof out, "%s/train.jsonl", work);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 1) < 0) _exit(126);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("fusebox-train failed", out);
    FILE *f = fopen(out, "r");
    char line[8192];
    double io = 0, tot = 0, io2 = 0, tot2 = 0;
    int64_t last = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j) continue;
        const char *ev = json_string_value(json_object_get(j, "event"));
        if (ev && !strcmp(ev, "step") && json_integer_value(json_object_get(j, "member")) == 0) {
            int64_t step = json_integer_value(json_object_get(j, "step"));
            double rate = json_number_value(json_object_get(j, "samples_per_s"));
            double w = json_number_value(json_object_get(j, "io_ms"));
            int B = (int)json_integer_value(json_object_get(j, "array_size"));
            double step_ms = 1e3 * BATCH * B / rate, k = (double)(step - last);
            io += w * k;
            tot += step_ms * k;
            if (last > 0) {
                io2 += w * k;
                tot2 += step_ms * k;
            }
            last = step;
        }
        json_decref(j);
    }
    fclose(f);
    train_run r = {.io_frac = io / tot, .io_frac_steady = tot2 > 0 ? io2 / tot2 : NAN,
                   .step_ms = tot / (double)last, .io_ms = io / (double)last};
    return r;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--consume") == 0)
        return consumer_main(atoi(argv[2]), atoi(argv[3]));
    const char *src = "/usr/share/datasets/fashion-mnist", *train_bin = NULL;
    const char *work_arg = NULL;
    int reps = 5, epochs = 2, train_steps = 300, blas_threads = 2;
    static const struct option lo[] = {{"src", required_argument, NULL, 's'},
                                       {"work", required_argument, NULL, 'w'},
                                       {"train-bin", required_argument, NULL, 'b'},
                                       {"reps", required_argument, NULL, 'r'},
                                       {"epochs", required_argument, NULL, 'e'},
                                       {"train-steps", required_argument, NULL, 't'},
                                       {"blas-threads", required_argument, NULL, 'B'},
                                       {NULL, 0, NULL, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (opt) {
        case 's': src = optarg; break;
        case 'w': work_arg = optarg; break;
        case 'b': train_bin = optarg; break;
        case 'r': reps = atoi(optarg); break;
        case 'e': epochs = atoi(optarg); break;
        case 't': train_steps = atoi(optarg); break;
        case 'B': blas_threads = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: bench_data --train-bin PATH [--src DIR] [--work DIR] "
                            "[--reps N] [--epochs N] [--train-steps N] [--blas-threads N]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > MAXREP || epochs < 1 || train_steps < 20 || !train_bin) {
        fprintf(stderr, "bench_data: --train-bin is required; reps 1..%d, epochs >= 1, "
                        "train-steps >= 20\n", MAXREP);
        return 2;
    }
    char work[4096], p1[4400], p2[4400], ds[4400], root[4400], cache[4400], zst[4400];
    if (work_arg)
        snprintf(work, sizeof work, "%s", work_arg);
    else {
        snprintf(work, sizeof work, "/tmp/fb-bench-data-XXXXXX");
        if (!mkdtemp(work)) die("mkdtemp", strerror(errno));
    }
    mkdir(work, 0755);
    char gz_i[4400], gz_l[4400], raw_i[4400], raw_l[4400];
    snprintf(gz_i, sizeof gz_i, "%s/train-images-idx3-ubyte.gz", src);
    snprintf(gz_l, sizeof gz_l, "%s/train-labels-idx1-ubyte.gz", src);
    snprintf(raw_i, sizeof raw_i, "%s/train-images-idx3-ubyte", work);
    snprintf(raw_l, sizeof raw_l, "%s/train-labels-idx1-ubyte", work);
    struct stat sb;
    if (stat(gz_i, &sb) != 0) die("Fashion-MNIST not found (apt-get install dataset-fashion-mnist)", gz_i);
    gunzip(gz_i, raw_i);
    gunzip(gz_l, raw_l);
    snprintf(root, sizeof root, "%s/shards", work);
    snprintf(ds, sizeof ds, "%s/fashion-mnist", root);
    snprintf(cache, sizeof cache, "%s/cache", work);
    rm_rf(root);
    mkdir(root, 0755);
    char msg[1024];
    fb_import_opts io = {.out_dir = ds, .name = "fashion-mnist", .split = "train"};
    fb_import_result ir;
    double t_imp = now_s();
    if (fb_datadir_import_idx(&ir, &io, raw_i, raw_l, msg, sizeof msg)) die("import", msg);
    t_imp = now_s() - t_imp;
    snprintf(p1, sizeof p1, "%s/t10k-images-idx3-ubyte.gz", src);
    snprintf(p2, sizeof p2, "%s/t10k-labels-idx1-ubyte.gz", src);
    io.split = "test";
    if (fb_datadir_import_idx(NULL, &io, p1, p2, msg, sizeof msg)) die("import", msg);
    const double n = 60000, rec = 788;
    fprintf(stderr, "bench_data: imported in %.2f s; measuring (%d reps)...\n", t_imp, reps);

    /* every row once per rep, interleaved, so that a change in the
     * machine's load moves all rows alike; medians at the end */
    uint8_t *frames;
    size_t flen, *offs, *lens, nfr;
    snprintf(zst, sizeof zst, "%s/train-chunks.zst", work);
    uint64_t raw = extract_frames(ds, zst, &frames, &flen, &offs, &lens, &nfr);
    uint8_t *dst = malloc(1 << 22);
    memset(dst, 0, 1 << 22);
    zstd_lib(frames, offs, lens, nfr, dst, 1 << 22); /* warm up */
    static const int threads[] = {1, 2, 4};
    double t_cons[MAXREP], t_idx[MAXREP], t_cold[3][MAXREP], t_warm[3][MAXREP];
    double t_pt[3][MAXREP], t_ww[3][MAXREP], t_zc[MAXREP], t_zl[MAXREP];
    uint64_t idx_bytes = 0;
    bool have_zstd = true;
    for (int r = 0; r < reps; r++) {
        t_cons[r] = consumer_child(blas_threads, 10);
        t_idx[r] = idx_read(raw_i, raw_l, &idx_bytes);
        for (int k = 0; k < 3; k++) {
            rm_rf(cache);
            t_cold[k][r] = loader_epochs(ds, cache, threads[k], 1).seconds;
            loader_run lr = loader_epochs(ds, cache, threads[k], epochs);
            t_warm[k][r] = lr.seconds / epochs;
            t_pt[k][r] = lr.per_thread;
            t_ww[k][r] = lr.wait_frac;
        }
        if (have_zstd) {
            t_zc[r] = zstd_cli(zst);
            have_zstd = t_zc[r] > 0;
        }
        t_zl[r] = zstd_lib(frames, offs, lens, nfr, dst, 1 << 22);
    }
    free(dst);
    free(frames);
    free(offs);
    free(lens);
    double consume = BATCH / median(t_cons, reps), idx_t = median(t_idx, reps);
    double cold[3], warm[3], per_thread[3], warm_wait[3];
    for (int k = 0; k < 3; k++) {
        cold[k] = median(t_cold[k], reps);
        warm[k] = median(t_warm[k], reps);
        per_thread[k] = median(t_pt[k], reps);
        warm_wait[k] = median(t_ww[k], reps);
    }
    double zcli = have_zstd ? median(t_zc, reps) : NAN, zlib_t = median(t_zl, reps);

    /* fusebox-train's I/O wait */
    train_run tr[MAXREP];
    double f1[MAXREP], f2[MAXREP], sm[MAXREP], im[MAXREP];
    int treps = reps < 3 ? reps : 3;
    train_wait(train_bin, work, root, cache, 20, blas_threads); /* stage + warm up */
    for (int r = 0; r < treps; r++) {
        tr[r] = train_wait(train_bin, work, root, cache, train_steps, blas_threads);
        f1[r] = tr[r].io_frac;
        f2[r] = tr[r].io_frac_steady;
        sm[r] = tr[r].step_ms;
        im[r] = tr[r].io_ms;
    }
    double frac = median(f1, treps), frac2 = median(f2, treps), step_ms = median(sm, treps);
    double io_ms = median(im, treps);

    /* the table */
    double zcli_mbs = (double)raw / zcli / 1e6, zlib_mbs = (double)raw / zlib_t / 1e6;
    printf("| measurement | threads | samples/s | MB/s | vs. fused 16-MLP consumption | "
           "target |\n");
    printf("|---|---|---:|---:|---:|---|\n");
    printf("| fused array of 16 MLPs 784-256-10, batch %d: data consumption | %d (BLAS) | "
           "%.0f | %.1f | 1.00x | |\n",
           BATCH, blas_threads, consume, consume * rec / 1e6);
    printf("| plain read of the raw IDX file (read + u8->float) | 1 | %.0f | %.1f | %.1fx | |\n",
           n / idx_t, (double)idx_bytes / idx_t / 1e6, n / idx_t / consume);
    for (int k = 0; k < 3; k++)
        printf("| loader, cold: stage (copy + verify) then read 1 epoch | %d | %.0f | %.1f | "
               "%.1fx | |\n",
               threads[k], n / cold[k], n * rec / cold[k] / 1e6, n / cold[k] / consume);
    for (int k = 0; k < 3; k++)
        printf("| loader, warm: %d epochs from the cache (no-op consumer waited %.0f%%) | %d | "
               "%.0f | %.1f | %.1fx | >= 5x: %s |\n",
               epochs, 100 * warm_wait[k], threads[k], n / warm[k], n * rec / warm[k] / 1e6,
               n / warm[k] / consume, n / warm[k] / consume >= 5 ? "met" : "NOT met");
    if (have_zstd)
        printf("| `zstd -d` on the same chunks (decompression limit) | 1 | %.0f | %.1f | %.1fx "
               "| |\n",
               (double)raw / rec / zcli, zcli_mbs, (double)raw / rec / zcli / consume);
    else
        printf("| `zstd -d` on the same chunks | 1 | n/a (no zstd command) | | | |\n");
    printf("| libzstd in process, same frames | 1 | %.0f | %.1f | %.1fx | |\n",
           (double)raw / rec / zlib_t, zlib_mbs, (double)raw / rec / zlib_t / consume);
    for (int k = 0; k < 3; k++)
        printf("| loader per-thread decompression (pread + CRC32C + zstd) | %d | %.0f | %.1f | "
               "%.0f%% of `zstd -d` | >= 50%%: %s |\n",
               threads[k], per_thread[k] / rec, per_thread[k] / 1e6,
               have_zstd ? 100 * per_thread[k] / 1e6 / zcli_mbs : NAN,
               have_zstd && per_thread[k] / 1e6 >= 0.5 * zcli_mbs ? "met" : "NOT met");
    printf("| compression ratio (zstd level %d, %d chunks of ~%d records) | | | | %.2f "
           "(%.1f MB -> %.1f MB) | |\n",
           FB_IMPORT_DEFAULT_LEVEL, (int)ir.chunks, (int)(ir.samples / ir.chunks),
           (double)ir.raw_bytes / (double)ir.bytes, ir.raw_bytes / 1e6, ir.bytes / 1e6);
    printf("| fusebox-train, 16 fused MLPs, shard dataset, %d steps: I/O wait / step time | %d "
           "(BLAS) + 2 (loader) | %.0f | | %.3f%% (%.4f of %.1f ms); after step 10: %.3f%% | "
           "<= 2%%: %s |\n",
           train_steps, blas_threads, BATCH / (step_ms / 1e3), 100 * frac, io_ms, step_ms,
           100 * frac2, frac <= 0.02 ? "met" : "NOT met");
    if (!work_arg) rm_rf(work);
    return 0;
}
