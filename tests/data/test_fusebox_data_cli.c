/*
 * fusebox-data as a user runs it: the real binary, real files, exit codes
 * (0 ok, 1 data, 2 usage) and messages.  Two tests run this file: "basic"
 * (everything but Fashion-MNIST) and "fmnist".
 *   - Fashion-MNIST (when dataset-fashion-mnist is installed): import both
 *     splits from the gzipped IDX files, inspect, verify; the imported
 *     splits load back bit-identical to the IDX loader's; a flipped byte in
 *     the train shard makes verify fail naming the file and the chunk;
 *   - a tiny IDX pair (raw and gzip) into several shards and chunks;
 *   - a tiny CSV with a header (label by name) and one without (label by
 *     index, quotes, CRLF), loaded back exactly;
 *   - bad CSVs and bad IDX files (exit 1, message naming file, line and
 *     column), bad usage (exit 2), a directory holding another dataset, a
 *     manifest that lies about a size;
 *   - text: files joined into byte-level token records (context, stride, a
 *     newline between files), loaded back exactly as floats with y 0; the
 *     built-in licence corpus; a table of bad text imports; verify naming
 *     the record of a token id beyond a (lowered) vocab.
 */
#include "data_util.h"

#include <stdarg.h>
#include <sys/wait.h>
#include <zlib.h>

static char g_dir[512], g_bin[1024];
static char g_msg[1024];

typedef struct result {
    int rc;
    char *out, *err;
} result;

/* Runs fusebox-data with the NULL-terminated arguments; captures output. */
static result run(const char *a0, ...)
{
    const char *argv[40];
    int argc = 0;
    argv[argc++] = g_bin;
    va_list ap;
    va_start(ap, a0);
    for (const char *s = a0; s; s = va_arg(ap, const char *)) {
        CHECK(argc < 39);
        argv[argc++] = s;
    }
    va_end(ap);
    argv[argc] = NULL;
    char po[1024], pe[1024];
    snprintf(po, sizeof po, "%s/out.txt", g_dir);
    snprintf(pe, sizeof pe, "%s/err.txt", g_dir);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int o = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(pe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int i = open("/dev/null", O_RDONLY);
        if (o < 0 || e < 0 || i < 0 || dup2(i, 0) < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(126);
        execv(g_bin, (char *const *)argv);
        _exit(127);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    result r;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    size_t len;
    r.out = (char *)du_read(po, &len);
    r.err = (char *)du_read(pe, &len);
    return r;
}

static void expect(result r, int rc, const char *in_out, const char *in_err)
{
    if (r.rc != rc || (in_out && !strstr(r.out, in_out)) || (in_err && !strstr(r.err, in_err))) {
        fprintf(stderr, "expected exit %d, \"%s\" on stdout, \"%s\" on stderr; got exit %d\n"
                        "stdout:\n%s\nstderr:\n%s\n",
                rc, in_out ? in_out : "", in_err ? in_err : "", r.rc, r.out, r.err);
        abort();
    }
    free(r.out);
    free(r.err);
}

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

/* Returns 0, or FB_TEST_SKIP when Fashion-MNIST is not installed. */
static int test_fashion_mnist(void)
{
    const char *src = "/usr/share/datasets/fashion-mnist";
    char ti[512], tl[512], vi[512], vl[512], out[1024];
    snprintf(ti, sizeof ti, "%s/train-images-idx3-ubyte.gz", src);
    snprintf(tl, sizeof tl, "%s/train-labels-idx1-ubyte.gz", src);
    snprintf(vi, sizeof vi, "%s/t10k-images-idx3-ubyte.gz", src);
    snprintf(vl, sizeof vl, "%s/t10k-labels-idx1-ubyte.gz", src);
    struct stat st;
    if (stat(ti, &st) != 0 || stat(tl, &st) != 0 || stat(vi, &st) != 0 || stat(vl, &st) != 0) {
        return fb_test_missing(
            "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)");
    }
    path_in(out, sizeof out, "fmnist");
    expect(run("import", "idx", "--images", ti, "--labels", tl, "--out", out, "--name",
               "fashion-mnist", "--split", "train", NULL),
           0, "imported 60000 samples as fashion-mnist/train", NULL);
    expect(run("import", "idx", "--images", vi, "--labels", vl, "--out", out, "--name",
               "fashion-mnist", "--split", "test", "--level", "9", NULL),
           0, "imported 10000 samples as fashion-mnist/test", NULL);
    expect(run("inspect", out, NULL), 0, "uint8 [1, 28, 28], labels int32 in [0, 10)", NULL);
    expect(run("verify", out, NULL), 0, "70000 records", NULL);

    /* the shards hold exactly what the IDX files hold */
    static const char *const splits[] = {"train", "test"};
    for (int s = 0; s < 2; s++) {
        fb_dataset a = {0}, b = {0};
        CHECK_INT_EQ(fb_dataset_open_named("fashion-mnist", splits[s], "/usr/share/datasets", &a,
                                           g_msg, sizeof g_msg),
                     0);
        CHECK_INT_EQ(fb_datadir_load_split(&b, out, splits[s], g_msg, sizeof g_msg), 0);
        CHECK_INT_EQ(a.n, b.n);
        CHECK_INT_EQ(a.C * a.H * a.W, b.C * b.H * b.W);
        CHECK_INT_EQ(a.H, b.H);
        CHECK_INT_EQ(a.n_classes, b.n_classes);
        CHECK(memcmp(a.x, b.x, (size_t)a.n * 784 * sizeof *a.x) == 0);
        CHECK(memcmp(a.y, b.y, (size_t)a.n * sizeof *a.y) == 0);
        fb_dataset_free(&a);
        fb_dataset_free(&b);
    }

    /* one flipped byte: verify names the file and the chunk */
    char shard[1200];
    snprintf(shard, sizeof shard, "%s/train/train-00000.fbs", out);
    fb_shard_reader *r;
    CHECK_INT_EQ(fb_shard_open(&r, shard, g_msg, sizeof g_msg), 0);
    const fb_shard_chunk_entry *e = fb_shard_get_chunk(r, 77);
    uint64_t off = e->offset + e->stored / 3;
    fb_shard_close(r);
    du_flip(shard, off, 0x20);
    expect(run("verify", out, NULL), 1, "FAILED train/train-00000.fbs",
           "train-00000.fbs: chunk 77: checksum mismatch");
    expect(run("inspect", out, NULL), 0, "train/train-00000.fbs", NULL); /* headers are fine */
    return 0;
}

static void write_idx(const char *path, int gz, int type, int ndim, const uint32_t *dims,
                      const void *body, size_t len)
{
    uint8_t hdr[4 + 16] = {0, 0, (uint8_t)type, (uint8_t)ndim};
    for (int i = 0; i < ndim; i++)
        for (int k = 0; k < 4; k++) hdr[4 + 4 * i + k] = (uint8_t)(dims[i] >> (24 - 8 * k));
    size_t hl = 4 + 4 * (size_t)ndim;
    if (gz) {
        gzFile f = gzopen(path, "wb");
        CHECK(f != NULL);
        CHECK(gzwrite(f, hdr, (unsigned)hl) == (int)hl);
        CHECK(gzwrite(f, body, (unsigned)len) == (int)len);
        CHECK(gzclose(f) == Z_OK);
    } else {
        uint8_t *b = malloc(hl + len);
        CHECK(b != NULL);
        memcpy(b, hdr, hl);
        memcpy(b + hl, body, len);
        du_write(path, b, hl + len);
        free(b);
    }
}

static void test_tiny_idx(void)
{
    uint8_t px[7 * 3 * 4], lab[7] = {0, 4, 1, 4, 2, 3, 0};
    for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)(i * 5);
    uint32_t di[3] = {7, 3, 4}, dl[1] = {7};
    char im[600], lb[600], out[600], bad[600];
    path_in(im, sizeof im, "tiny-images.gz");
    path_in(lb, sizeof lb, "tiny-labels");
    path_in(out, sizeof out, "tiny");
    write_idx(im, 1, 0x08, 3, di, px, sizeof px);
    write_idx(lb, 0, 0x08, 1, dl, lab, sizeof lab);
    expect(run("import", "idx", "--images", im, "--labels", lb, "--out", out, "--name", "tiny",
               "--split", "train", "--chunk-records", "2", "--shard-records", "3", "--level", "1",
               NULL),
           0, "3 shards, 5 chunks", NULL);
    expect(run("inspect", out, NULL), 0, "train/train-00002.fbs", NULL);
    expect(run("verify", out, NULL), 0, "verified tiny: 3 shards, 5 chunks, 7 records", NULL);
    fb_dataset d = {0};
    CHECK_INT_EQ(fb_datadir_load_split(&d, out, "train", g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(d.n, 7);
    CHECK_INT_EQ(d.n_classes, 5);
    CHECK_INT_EQ(d.H, 3);
    CHECK_INT_EQ(d.W, 4);
    for (int i = 0; i < 7 * 12; i++) CHECK(d.x[i] == (float)px[i] / 255.0f);
    for (int i = 0; i < 7; i++) CHECK_INT_EQ(d.y[i], lab[i]);
    fb_dataset_free(&d);
    /* re-import with other chunking: the old shards of the split go */
    expect(run("import", "idx", "--images", im, "--labels", lb, "--out", out, "--name", "tiny",
               "--split", "train", NULL),
           0, "1 shard, 1 chunk,", NULL);
    char gone[700];
    snprintf(gone, sizeof gone, "%s/train/train-00002.fbs", out);
    struct stat st;
    CHECK(stat(gone, &st) != 0);
    expect(run("verify", out, NULL), 0, "1 shards", NULL);

    /* counts that disagree, a missing file, a float label file */
    uint32_t dl6[1] = {6};
    path_in(bad, sizeof bad, "six-labels");
    write_idx(bad, 0, 0x08, 1, dl6, lab, 6);
    expect(run("import", "idx", "--images", im, "--labels", bad, "--out", out, "--name", "tiny",
               "--split", "test", NULL),
           1, NULL, "holds 7 images but");
    expect(run("import", "idx", "--images", "/nonexistent/x", "--labels", lb, "--out", out,
               "--name", "tiny", "--split", "test", NULL),
           1, NULL, "/nonexistent/x");
    /* another dataset into the same directory */
    expect(run("import", "idx", "--images", im, "--labels", lb, "--out", out, "--name", "other",
               "--split", "test", NULL),
           1, NULL, "already holds dataset tiny");
}

static void test_csv(void)
{
    char csv[600], out[600], out2[600];
    path_in(csv, sizeof csv, "iris.csv");
    path_in(out, sizeof out, "csvds");
    const char *text = "f1,f2,label,f3\n"
                       "1,2,0,3\n"
                       "4.5,-1e3,2,0.25\n"
                       "\n"
                       " 7 , 8 , 1 , 9 \n";
    du_write(csv, text, strlen(text));
    expect(run("import", "csv", csv, "--label-column", "label", "--out", out, "--name", "iris",
               "--split", "train", NULL),
           0, "imported 3 samples as iris/train", NULL);
    expect(run("verify", out, NULL), 0, "every checksum matches", NULL);
    expect(run("inspect", out, NULL), 0, "float32 [3], labels int32 in [0, 3)", NULL);
    fb_dataset d = {0};
    CHECK_INT_EQ(fb_datadir_load_split(&d, out, "train", g_msg, sizeof g_msg), 0);
    static const float want_x[9] = {1, 2, 3, 4.5f, -1e3f, 0.25f, 7, 8, 9};
    static const int32_t want_y[3] = {0, 2, 1};
    CHECK_INT_EQ(d.n, 3);
    CHECK_INT_EQ(d.W, 3);
    for (int i = 0; i < 9; i++) CHECK(d.x[i] == want_x[i]);
    for (int i = 0; i < 3; i++) CHECK_INT_EQ(d.y[i], want_y[i]);
    fb_dataset_free(&d);

    /* no header, label by index, quotes and CRLF */
    const char *t2 = "\"0.5\",3,\"1\"\r\n1.5,4,0\r\n";
    du_write(csv, t2, strlen(t2));
    path_in(out2, sizeof out2, "csvds2");
    expect(run("import", "csv", csv, "--label-column", "2", "--out", out2, "--name", "two",
               "--split", "test", "--no-header", NULL),
           0, "imported 2 samples", NULL);
    CHECK_INT_EQ(fb_datadir_load_split(&d, out2, "test", g_msg, sizeof g_msg), 0);
    CHECK(d.x[0] == 0.5f && d.x[1] == 3 && d.x[2] == 1.5f && d.x[3] == 4);
    CHECK_INT_EQ(d.y[0], 1);
    CHECK_INT_EQ(d.n_classes, 2);
    fb_dataset_free(&d);

    static const struct {
        const char *text, *label, *expect;
    } bad[] = {
        {"a,b,y\n1,2,0\n1,x,1\n", "y", "bad.csv:3, column 1 (\"b\"): \"x\" is not a finite number"},
        {"a,b,y\n1,2,0\n1,2\n", "y", "bad.csv:3: 2 fields, expected 3"},
        {"a,b,y\n1,2,0.5\n", "y", "bad.csv:2, label column 2: \"0.5\" is not an integer class"},
        {"a,b,y\n1,2,-1\n", "y", "not an integer class"},
        {"a,b,y\n1,2,1\n", "z", "no label column \"z\""},
        {"a,b,y\n1,2,1\n", "5", "no label column \"5\""},
        {"a,b,y\n", "y", "no data rows"},
        {"", "y", "empty file"},
        {"a,b,y\n1,inf,1\n", "y", "not a finite number"},
        {"a,b,y\n1,1e999,1\n", "y", "not a finite number"},
        {"a,b,y\n1,\"2,1\n", "y", "bad.csv:2: unterminated or misplaced double quote"},
        {"y\n1\n", "y", "1 column"},
        {"a,b,y\n1,,1\n", "y", "bad.csv:2, column 1"},
    };
    char bpath[600], bout[600];
    path_in(bpath, sizeof bpath, "bad.csv");
    path_in(bout, sizeof bout, "badout");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        du_write(bpath, bad[i].text, strlen(bad[i].text));
        expect(run("import", "csv", bpath, "--label-column", bad[i].label, "--out", bout, "--name",
                   "bad", "--split", "train", NULL),
               1, NULL, bad[i].expect);
    }
    struct stat st;
    char mp[700];
    snprintf(mp, sizeof mp, "%s/manifest.json", bout);
    CHECK(stat(mp, &st) != 0); /* nothing was written */
}

static void test_usage(void)
{
    char out[600];
    path_in(out, sizeof out, "u");
    expect(run(NULL), 2, NULL, "usage");
    expect(run("--help", NULL), 0, "usage", NULL);
    expect(run("frobnicate", NULL), 2, NULL, "unknown command");
    expect(run("import", NULL), 2, NULL, "idx, csv or text");
    expect(run("import", "tfrecord", NULL), 2, NULL, "unknown source");
    expect(run("import", "idx", "--images", "a", "--out", out, "--name", "x", "--split", "train",
               NULL),
           2, NULL, "--images and --labels are required");
    expect(run("import", "idx", "--images", "a", "--labels", "b", "--name", "x", "--split",
               "train", NULL),
           2, NULL, "--out, --name and --split are required");
    expect(run("import", "csv", "f.csv", "--out", out, "--name", "x", "--split", "train", NULL),
           2, NULL, "--label-column is required");
    expect(run("import", "csv", "--label-column", "y", "--out", out, "--name", "x", "--split",
               "train", NULL),
           2, NULL, "exactly one CSV file");
    expect(run("import", "idx", "--images", "a", "--labels", "b", "--out", out, "--name", "x",
               "--split", "train", "--level", "99", NULL),
           2, NULL, "--level");
    expect(run("import", "idx", "--images", "a", "--labels", "b", "--out", out, "--name", "x",
               "--split", "train", "--chunk-records", "0", NULL),
           2, NULL, "--chunk-records");
    expect(run("import", "idx", "--images", "a", "--labels", "b", "--out", out, "--name", "x",
               "--split", "train", "--bogus", NULL),
           2, NULL, NULL);
    expect(run("verify", NULL), 2, NULL, "usage: fusebox-data verify DIR");
    expect(run("verify", "a", "b", NULL), 2, NULL, "usage");
    expect(run("inspect", "--bogus", NULL), 2, NULL, "usage");
    /* a bad dataset name is the caller's mistake: usage */
    char csv[600];
    path_in(csv, sizeof csv, "ok.csv");
    du_write(csv, "a,y\n1,0\n", 8);
    expect(run("import", "csv", csv, "--label-column", "y", "--out", out, "--name", "Bad Name",
               "--split", "train", NULL),
           2, NULL, "dataset name");
    /* data errors: no manifest, a manifest lying about a size */
    expect(run("verify", g_dir, NULL), 1, NULL, "manifest.json");
    expect(run("inspect", g_dir, NULL), 1, NULL, "manifest.json");
    expect(run("import", "csv", csv, "--label-column", "y", "--out", out, "--name", "ok",
               "--split", "train", NULL),
           0, NULL, NULL);
    char mp[700];
    snprintf(mp, sizeof mp, "%s/manifest.json", out);
    size_t len;
    char *m = (char *)du_read(mp, &len);
    char *b = strstr(m, "\"bytes\": ");
    CHECK(b != NULL);
    b[9] = b[9] == '9' ? '8' : (char)(b[9] + 1);
    du_write(mp, m, len);
    free(m);
    expect(run("verify", out, NULL), 1, "FAILED", "the manifest says");
    expect(run("inspect", out, NULL), 1, "disagrees with the manifest", NULL);
}

static void test_text(void)
{
    char a[600], b[600], out[600];
    path_in(a, sizeof a, "a.txt");
    path_in(b, sizeof b, "b.txt");
    path_in(out, sizeof out, "text");
    du_write(a, "hello world", 11); /* no final newline: one is put after it */
    du_write(b, "\xff\x00z\n", 4);
    const char joined[] = "hello world\n\xff\x00z\n"; /* 16 bytes */
    /* context 3, stride 2: records of 4 bytes at 0, 2, ..., 12: 7 records */
    expect(run("import", "text", a, b, "--context", "3", "--stride", "2", "--out", out, "--name",
               "tiny-text", "--split", "train", "--chunk-records", "3", NULL),
           0, "imported 7 records of 4 tokens as tiny-text/train", NULL);
    expect(run("inspect", out, NULL), 0, "int32 [4], token ids in [0, 256), no labels", NULL);
    expect(run("verify", out, NULL), 0, "verified tiny-text: 1 shards, 3 chunks, 7 records", NULL);
    fb_dataset d = {0};
    CHECK_INT_EQ(fb_datadir_load_split(&d, out, "train", g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(d.n, 7);
    CHECK_INT_EQ(d.W, 4);
    CHECK_INT_EQ(d.n_classes, 0);
    for (int i = 0; i < 7; i++) {
        CHECK_INT_EQ(d.y[i], 0);
        for (int k = 0; k < 4; k++) CHECK(d.x[i * 4 + k] == (float)(uint8_t)joined[2 * i + k]);
    }
    fb_dataset_free(&d);
    /* the default stride is the context: records at 0, 3, ..., 12 */
    expect(run("import", "text", a, b, "--context", "3", "--out", out, "--name", "tiny-text",
               "--split", "test", NULL),
           0, "imported 5 records of 4 tokens", NULL);
    CHECK_INT_EQ(fb_datadir_load_split(&d, out, "test", g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(d.n, 5);
    CHECK(d.x[4 * 4 + 0] == 0xff && d.x[4 * 4 + 3] == '\n');
    fb_dataset_free(&d);

    /* a token id beyond the vocab: lower the manifest's vocab below 0xff and verify */
    char mp[700];
    snprintf(mp, sizeof mp, "%s/manifest.json", out);
    size_t len;
    char *m = (char *)du_read(mp, &len);
    char *v = strstr(m, "\"vocab\": 256");
    CHECK(v != NULL);
    memcpy(v, "\"vocab\": 255", 13);
    du_write(mp, m, len);
    free(m);
    expect(run("verify", out, NULL), 1, "FAILED",
           "train-00000.fbs: chunk 1: record 5 has token id 255 at position 2, outside [0, 255)");
    CHECK(fb_datadir_load_split(&d, out, "test", g_msg, sizeof g_msg) == FB_ERR_DATA);
    CHECK_CONTAINS(g_msg, "test-00000.fbs: chunk 0: record 3 has token id 255 at position 3");

    /* the built-in licence corpus: deterministic, the same bytes twice */
    char lic[600], lic2[600];
    path_in(lic, sizeof lic, "licenses");
    path_in(lic2, sizeof lic2, "licenses2");
    expect(run("import", "text", "--builtin", "licenses", "--context", "64", "--out", lic,
               "--name", "licenses", "--split", "train", NULL),
           0, "records of 65 tokens as licenses/train", NULL);
    expect(run("verify", lic, NULL), 0, "every checksum matches", NULL);
    expect(run("import", "text", "--builtin", "licenses", "--context", "64", "--out", lic2,
               "--name", "licenses", "--split", "train", NULL),
           0, NULL, NULL);
    char m1[700], m2[700];
    snprintf(m1, sizeof m1, "%s/manifest.json", lic);
    snprintf(m2, sizeof m2, "%s/manifest.json", lic2);
    size_t l1, l2;
    char *t1 = (char *)du_read(m1, &l1), *t2 = (char *)du_read(m2, &l2);
    CHECK(l1 == l2 && memcmp(t1, t2, l1) == 0);
    free(t1);
    free(t2);
    /* the corpus is GPL-3 first: record 0 is its first 65 bytes */
    char gpl[600];
    snprintf(gpl, sizeof gpl, "%s/GPL-3", FB_TEXT_LICENSES_DIR);
    uint8_t *g = du_read(gpl, &len);
    CHECK(len > 65);
    CHECK_INT_EQ(fb_datadir_load_split(&d, lic, "train", g_msg, sizeof g_msg), 0);
    for (int k = 0; k < 65; k++) CHECK(d.x[k] == (float)g[k]);
    fb_dataset_free(&d);
    free(g);
    /* a missing file of the corpus is named */
    char partial[600], one[700];
    path_in(partial, sizeof partial, "partial-licenses");
    CHECK(mkdir(partial, 0755) == 0);
    snprintf(one, sizeof one, "%s/GPL-3", partial);
    du_write(one, "text\n", 5);
    expect(run("import", "text", "--builtin", "licenses", "--builtin-dir", partial, "--context",
               "2", "--out", lic, "--name", "licenses", "--split", "x", NULL),
           1, NULL, "partial-licenses/GPL-2");

    /* bad text imports: nothing is written */
    char tiny[600], dirf[600], bout[600];
    path_in(tiny, sizeof tiny, "tiny.txt");
    du_write(tiny, "abc", 3); /* 4 bytes with the newline */
    path_in(dirf, sizeof dirf, "a-directory");
    CHECK(mkdir(dirf, 0755) == 0);
    path_in(bout, sizeof bout, "textbad");
    static const struct {
        int file; /* 0 a.txt, 1 tiny.txt, 2 a missing file, 3 a directory, 4 empty */
        const char *context, *stride;
        int rc;
        const char *expect;
    } bad[] = {
        {0, "0", NULL, 2, "--context needs an integer in [1, 65536]"},
        {0, "-3", NULL, 2, "--context"},
        {0, "65537", NULL, 2, "--context needs an integer in [1, 65536]"},
        {0, "99999999999999999999", NULL, 2, "--context"},
        {0, "x", NULL, 2, "--context"},
        {0, "3", "0", 2, "--stride needs an integer in [1, 1073741824]"},
        {0, "3", "-1", 2, "--stride"},
        {0, NULL, "2", 2, "--context is required"},
        {1, "4", NULL, 1, "the text has 4 bytes; a record needs context + 1 = 5"},
        {2, "3", NULL, 1, "no-such-file.txt"},
        {3, "3", NULL, 1, "cannot read"},
        {4, "3", NULL, 1, "empty.txt: empty file"},
    };
    char missing[600], empty[600];
    path_in(missing, sizeof missing, "no-such-file.txt");
    path_in(empty, sizeof empty, "empty.txt");
    du_write(empty, "", 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *files[] = {a, tiny, missing, dirf, empty};
        const char *args[16];
        int n = 0;
        args[n++] = "import", args[n++] = "text", args[n++] = files[bad[i].file];
        if (bad[i].context) args[n++] = "--context", args[n++] = bad[i].context;
        if (bad[i].stride) args[n++] = "--stride", args[n++] = bad[i].stride;
        args[n++] = "--out", args[n++] = bout, args[n++] = "--name", args[n++] = "bad";
        args[n++] = "--split", args[n++] = "train";
        while (n < 15) args[n++] = NULL;
        expect(run(args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7],
                   args[8], args[9], args[10], args[11], args[12], args[13], args[14], NULL),
               bad[i].rc, NULL, bad[i].expect);
        struct stat st;
        snprintf(mp, sizeof mp, "%s/manifest.json", bout);
        CHECK(stat(mp, &st) != 0);
    }
    /* usage: files and --builtin together, neither, an unknown corpus */
    expect(run("import", "text", a, "--builtin", "licenses", "--context", "3", "--out", bout,
               "--name", "x", "--split", "train", NULL),
           2, NULL, "not both");
    expect(run("import", "text", "--context", "3", "--out", bout, "--name", "x", "--split",
               "train", NULL),
           2, NULL, "give text files or --builtin licenses");
    expect(run("import", "text", "--builtin", "poems", "--context", "3", "--out", bout, "--name",
               "x", "--split", "train", NULL),
           2, NULL, "unknown built-in text corpus \"poems\"");
    /* text into a directory holding an image dataset */
    char img[600];
    path_in(img, sizeof img, "tiny");
    expect(run("import", "text", a, "--context", "3", "--out", img, "--name", "tiny", "--split",
               "text", NULL),
           1, NULL, "would mix them");
}

/* argv[1]: "basic" (usage, tiny IDX, CSV) or "fmnist" (the real dataset) */
int main(int argc, char **argv)
{
    bool fmnist = argc > 1 && strcmp(argv[1], "fmnist") == 0;
    const char *bd = getenv("FB_BINARY_DIR");
    snprintf(g_bin, sizeof g_bin, "%s/workers/data/fusebox-data", bd ? bd : ".");
    struct stat st;
    if (stat(g_bin, &st) != 0) {
        fprintf(stderr, "%s not built\n", g_bin);
        return 1;
    }
    du_scratch(g_dir, sizeof g_dir, "cli");
    double t0 = du_now();
    if (fmnist) {
        if (test_fashion_mnist() == FB_TEST_SKIP) {
            du_rm_rf(g_dir);
            return FB_TEST_SKIP;
        }
    } else {
        test_usage();
        test_tiny_idx();
        test_csv();
        test_text();
    }
    du_rm_rf(g_dir);
    printf("test_fusebox_data_cli %s: ok (%.2f s)\n", fmnist ? "fmnist" : "basic",
           du_now() - t0);
    return 0;
}
