/*
 * Manifests: a valid manifest parses, serialises canonically and round-trips;
 * a table of invalid ones (unknown and missing fields at every level, wrong
 * types, values out of range, counts that disagree, paths that could leave
 * the directory, duplicates, other versions, broken JSON) is each
 * FB_ERR_DATA with a message naming the source and the field; token datasets
 * (int32 ids with "tokens": {"vocab": V}, labels or "label": null) parse and
 * round-trip, and a table of bad token manifests is refused; and a manifest
 * that lies about its shard files (sizes, records, chunks, dtype, a missing
 * file) is caught by fb_manifest_check_files naming the file.
 */
#include "data_util.h"

static char g_dir[512];
static char g_msg[1024];

static const char *k_base =
    "{\"format\": \"fusebox-dataset\", \"version\": 1, \"name\": \"toy\","
    " \"sample\": {\"dtype\": \"uint8\", \"shape\": [1, 2, 3]},"
    " \"label\": {\"dtype\": \"int32\", \"classes\": 3},"
    " \"splits\": {\"train\": {\"samples\": 10, \"shards\": ["
    "{\"path\": \"train/a.fbs\", \"bytes\": 200, \"records\": 6, \"chunks\": 2, \"crc32c\": "
    "\"0badf00d\"},"
    " {\"path\": \"train/b.fbs\", \"bytes\": 150, \"records\": 4, \"chunks\": 1, \"crc32c\": "
    "\"deadbeef\"}]},"
    " \"test\": {\"samples\": 1, \"shards\": [{\"path\": \"test/t.fbs\", \"bytes\": 100, "
    "\"records\": 1, \"chunks\": 1, \"crc32c\": \"00000001\"}]}}}";

/* A token dataset: byte ids (vocab 256) in records of 65, no labels. */
static const char *k_tok =
    "{\"format\": \"fusebox-dataset\", \"version\": 1, \"name\": \"text\","
    " \"sample\": {\"dtype\": \"int32\", \"shape\": [65]},"
    " \"tokens\": {\"vocab\": 256},"
    " \"label\": null,"
    " \"splits\": {\"train\": {\"samples\": 6, \"shards\": ["
    "{\"path\": \"train/a.fbs\", \"bytes\": 200, \"records\": 6, \"chunks\": 2, \"crc32c\": "
    "\"0badf00d\"}]}}}";

/* base with the first occurrence of from replaced by to (malloc'd). */
static char *with_in(const char *base, const char *from, const char *to)
{
    const char *at = strstr(base, from);
    if (!at) {
        fprintf(stderr, "test bug: \"%s\" not in the base manifest\n", from);
        abort();
    }
    size_t a = (size_t)(at - base), fl = strlen(from), tl = strlen(to);
    char *s = malloc(strlen(base) - fl + tl + 1);
    CHECK(s != NULL);
    memcpy(s, base, a);
    memcpy(s + a, to, tl);
    strcpy(s + a + tl, at + fl);
    return s;
}

static char *with(const char *from, const char *to)
{
    return with_in(k_base, from, to);
}

static void test_valid(void)
{
    fb_manifest m;
    CHECK_INT_EQ(fb_manifest_parse(&m, k_base, strlen(k_base), "base", g_msg, sizeof g_msg), 0);
    CHECK_STR_EQ(m.name, "toy");
    CHECK_INT_EQ(m.dtype, FB_DTYPE_U8);
    CHECK_INT_EQ(m.ndim, 3);
    CHECK_INT_EQ(m.sample_numel, 6);
    CHECK_INT_EQ(m.n_classes, 3);
    CHECK_INT_EQ(m.n_splits, 2);
    const fb_manifest_split *tr = fb_manifest_find_split(&m, "train");
    CHECK(tr != NULL);
    CHECK(fb_manifest_find_split(&m, "validation") == NULL);
    CHECK_INT_EQ(tr->samples, 10);
    CHECK_INT_EQ(tr->n_shards, 2);
    CHECK_STR_EQ(tr->shards[1].path, "train/b.fbs");
    CHECK_INT_EQ(tr->shards[0].crc32c, 0x0badf00d);
    CHECK_INT_EQ(fb_manifest_split_bytes(tr), 350);

    /* canonical JSON round-trips; writing is atomic and reads back the same */
    char *json = NULL;
    CHECK_INT_EQ(fb_manifest_to_json(&json, &m, g_msg, sizeof g_msg), 0);
    fb_manifest back;
    CHECK_INT_EQ(fb_manifest_parse(&back, json, strlen(json), "json", g_msg, sizeof g_msg), 0);
    char *json2 = NULL;
    CHECK_INT_EQ(fb_manifest_to_json(&json2, &back, g_msg, sizeof g_msg), 0);
    CHECK_STR_EQ(json, json2);
    char path[1024];
    snprintf(path, sizeof path, "%s/manifest.json", g_dir);
    CHECK_INT_EQ(fb_manifest_write(path, &m, g_msg, sizeof g_msg), 0);
    fb_manifest_free(&back);
    CHECK_INT_EQ(fb_manifest_read(&back, path, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(back.n_splits, m.n_splits);
    CHECK_INT_EQ(fb_manifest_split_bytes(fb_manifest_find_split(&back, "train")), 350);
    CHECK_INT_EQ(fb_manifest_find_split(&back, "test")->shards[0].crc32c, 1);
    free(json);
    free(json2);
    fb_manifest_free(&back);
    fb_manifest_free(&m);
    fb_manifest_free(&m); /* a freed (zeroed) manifest may be freed again */
    fb_manifest_free(NULL);

    /* a variable-record manifest */
    char *v = with("\"shape\": [1, 2, 3]", "\"shape\": \"variable\"");
    CHECK_INT_EQ(fb_manifest_parse(&m, v, strlen(v), "v", g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(m.ndim, 0);
    CHECK_INT_EQ(m.sample_numel, 0);
    fb_manifest_free(&m);
    free(v);
    /* features [F] */
    v = with("\"shape\": [1, 2, 3]", "\"shape\": [784]");
    CHECK_INT_EQ(fb_manifest_parse(&m, v, strlen(v), "v", g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(m.sample_numel, 784);
    fb_manifest_free(&m);
    free(v);
}

/* Parses json, serialises it, parses that and serialises again: the texts must agree. */
static void check_round_trip(const char *json, fb_manifest *m)
{
    CHECK_INT_EQ(fb_manifest_parse(m, json, strlen(json), "rt", g_msg, sizeof g_msg), 0);
    char *a = NULL, *b = NULL;
    CHECK_INT_EQ(fb_manifest_to_json(&a, m, g_msg, sizeof g_msg), 0);
    fb_manifest back;
    CHECK_INT_EQ(fb_manifest_parse(&back, a, strlen(a), "rt2", g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(back.dtype, m->dtype);
    CHECK_INT_EQ(back.vocab, m->vocab);
    CHECK_INT_EQ(back.n_classes, m->n_classes);
    CHECK_INT_EQ(fb_manifest_to_json(&b, &back, g_msg, sizeof g_msg), 0);
    CHECK_STR_EQ(a, b);
    fb_manifest_free(&back);
    free(a);
    free(b);
}

static void test_tokens(void)
{
    fb_manifest m;
    check_round_trip(k_tok, &m);
    CHECK_INT_EQ(m.dtype, FB_DTYPE_I32);
    CHECK_STR_EQ(fb_data_dtype_name(m.dtype), "int32");
    CHECK_INT_EQ(fb_data_dtype_size(m.dtype), 4);
    CHECK_INT_EQ(m.ndim, 1);
    CHECK_INT_EQ(m.sample_numel, 65);
    CHECK_INT_EQ(m.vocab, 256);
    CHECK_INT_EQ(m.n_classes, 0);
    /* the canonical text keeps "label": null and the tokens object */
    char *json = NULL;
    CHECK_INT_EQ(fb_manifest_to_json(&json, &m, g_msg, sizeof g_msg), 0);
    CHECK_CONTAINS(json, "\"label\": null");
    CHECK_CONTAINS(json, "\"vocab\": 256");
    free(json);
    fb_manifest_free(&m);

    /* a token dataset with labels (sequence classification), and the vocab bounds */
    char *v = with_in(k_tok, "\"label\": null", "\"label\": {\"dtype\": \"int32\", \"classes\": 4}");
    check_round_trip(v, &m);
    CHECK_INT_EQ(m.n_classes, 4);
    CHECK_INT_EQ(m.vocab, 256);
    fb_manifest_free(&m);
    free(v);
    v = with_in(k_tok, "\"vocab\": 256", "\"vocab\": 16777216");
    check_round_trip(v, &m);
    CHECK_INT_EQ(m.vocab, FB_MANIFEST_MAX_VOCAB);
    fb_manifest_free(&m);
    free(v);
    v = with_in(k_tok, "\"vocab\": 256", "\"vocab\": 1");
    check_round_trip(v, &m);
    CHECK_INT_EQ(m.vocab, 1);
    fb_manifest_free(&m);
    free(v);
    /* the older dtypes parse with vocab 0 */
    check_round_trip(k_base, &m);
    CHECK_INT_EQ(m.vocab, 0);
    /* to_json refuses a struct that breaks the rules instead of writing something else */
    char *out = NULL;
    m.vocab = 256; /* a uint8 dataset with a vocabulary */
    CHECK_INT_EQ(fb_manifest_to_json(&out, &m, g_msg, sizeof g_msg), FB_ERR_INTERNAL);
    CHECK(out == NULL);
    m.vocab = 0;
    m.n_classes = 0; /* a uint8 dataset without labels */
    CHECK(fb_manifest_to_json(&out, &m, g_msg, sizeof g_msg) != 0);
    CHECK(out == NULL);
    CHECK_CONTAINS(g_msg, "label is null");
    fb_manifest_free(&m);
}

typedef struct bad_case {
    const char *from, *to, *expect;
} bad_case;

/* Bad token manifests: each an edit of k_tok (or of k_base where marked by base 1). */
static const struct {
    int base; /* 0: k_tok, 1: k_base */
    const char *from, *to, *expect;
} k_bad_tok[] = {
    {0, "\"vocab\": 256", "\"vocab\": 0", "tokens.vocab is 0; allowed 1 to 16777216"},
    {0, "\"vocab\": 256", "\"vocab\": -1", "tokens.vocab is -1"},
    {0, "\"vocab\": 256", "\"vocab\": 16777217", "tokens.vocab is 16777217"},
    {0, "\"vocab\": 256", "\"vocab\": 256.0", "tokens.vocab must be an integer"},
    {0, "\"vocab\": 256", "\"vocab\": \"256\"", "tokens.vocab must be an integer"},
    {0, "\"vocab\": 256", "\"size\": 256", "unknown field \"size\" in tokens"},
    {0, "\"vocab\": 256", "\"vocab\": 256, \"bos\": 1", "unknown field \"bos\" in tokens"},
    {0, "{\"vocab\": 256}", "{}", "missing field tokens.vocab"},
    {0, "{\"vocab\": 256}", "256", "manifest.tokens must be an object"},
    {0, " \"tokens\": {\"vocab\": 256},", "", "missing field manifest.tokens"},
    {0, "\"shape\": [65]", "\"shape\": [1, 5, 13]", "an int32 token dataset has [L]"},
    {0, "\"shape\": [65]", "\"shape\": \"variable\"", "must be [L], not \"variable\""},
    {0, "\"label\": null", "\"label\": {\"dtype\": \"int32\", \"classes\": 0}",
     "label.classes is 0"},
    {0, "\"label\": null", "\"label\": []", "manifest.label must be an object"},
    {0, "\"label\": null,", "", "missing field manifest.label"},
    {1, "\"label\": {", "\"tokens\": {\"vocab\": 256}, \"label\": {",
     "tokens is only for int32 token datasets; sample.dtype is uint8"},
    {1, "\"label\": {\"dtype\": \"int32\", \"classes\": 3}", "\"label\": null",
     "label is null, which only an int32 token dataset may be; sample.dtype is uint8"},
    {1, "\"dtype\": \"uint8\"", "\"dtype\": \"int32\"", "sample.shape has 3 dimensions; an int32 token dataset has [L]"},
};

static void test_invalid_tokens(void)
{
    for (size_t i = 0; i < sizeof k_bad_tok / sizeof k_bad_tok[0]; i++) {
        char *j = with_in(k_bad_tok[i].base ? k_base : k_tok, k_bad_tok[i].from, k_bad_tok[i].to);
        fb_manifest m;
        memset(&m, 0x5A, sizeof m);
        g_msg[0] = '\0';
        int rc = fb_manifest_parse(&m, j, strlen(j), "tok.json", g_msg, sizeof g_msg);
        if (rc != FB_ERR_DATA || !du_contains(g_msg, "tok.json") ||
            !du_contains(g_msg, k_bad_tok[i].expect)) {
            fprintf(stderr, "token case %zu (%s -> %s): rc %d, message \"%s\", expected \"%s\"\n",
                    i, k_bad_tok[i].from, k_bad_tok[i].to, rc, g_msg, k_bad_tok[i].expect);
            abort();
        }
        unsigned char *p = (unsigned char *)&m;
        for (size_t k = 0; k < sizeof m; k++) CHECK_INT_EQ(p[k], 0x5A);
        free(j);
    }
}

static const bad_case k_bad[] = {
    {"\"version\": 1", "\"version\": 2", "version 2"},
    {"\"version\": 1", "\"version\": \"1\"", "version must be an integer"},
    {"\"format\": \"fusebox-dataset\"", "\"format\": \"tfrecord\"", "format"},
    {"\"name\": \"toy\"", "\"name\": \"toy\", \"owner\": \"x\"", "unknown field \"owner\""},
    {"\"name\": \"toy\"", "\"name\": \"Toy/../x\"", "name"},
    {"\"name\": \"toy\",", "", "missing field manifest.name"},
    {"\"dtype\": \"uint8\"", "\"dtype\": \"int64\"", "sample.dtype"},
    {"\"dtype\": \"uint8\"", "\"dtype\": \"uint8\", \"scale\": 2", "unknown field \"scale\" in sample"},
    {"\"shape\": [1, 2, 3]", "\"shape\": [2, 3]", "2 dimensions"},
    {"\"shape\": [1, 2, 3]", "\"shape\": [1, 0, 3]", "sample.shape[1]"},
    {"\"shape\": [1, 2, 3]", "\"shape\": [1, 2, 3.5]", "sample.shape[2]"},
    {"\"shape\": [1, 2, 3]", "\"shape\": [65536, 65536, 65536]", "more than"},
    {"\"shape\": [1, 2, 3]", "\"shape\": \"ragged\"", "sample.shape"},
    {"\"dtype\": \"int32\"", "\"dtype\": \"int64\"", "label.dtype"},
    {"\"classes\": 3", "\"classes\": 0", "label.classes"},
    {"\"classes\": 3", "\"classes\": 3, \"names\": []", "unknown field \"names\" in label"},
    {"\"samples\": 10", "\"samples\": 11", "splits.train.samples is 11 but its shards hold 10"},
    {"\"samples\": 10", "\"samples\": -10", "splits.train.samples"},
    {"\"samples\": 10", "\"samples\": 10, \"weight\": 1", "unknown field \"weight\" in splits.train"},
    {"\"records\": 6", "\"records\": 7", "samples is 10 but its shards hold 11"},
    {"\"chunks\": 2", "\"chunks\": 7", "7 chunks for 6 records"},
    {"\"chunks\": 2", "\"chunks\": 0", "chunks"},
    {"\"bytes\": 200", "\"bytes\": 12", "bytes"},
    {"\"bytes\": 200", "\"bytes\": 2e3", "bytes must be an integer"},
    {"\"crc32c\": \"0badf00d\"", "\"crc32c\": \"0BADF00D\"", "crc32c"},
    {"\"crc32c\": \"0badf00d\"", "\"crc32c\": \"badf00d\"", "crc32c"},
    {"\"crc32c\": \"0badf00d\"", "\"crc32c\": 195948557", "crc32c must be a string"},
    {"\"path\": \"train/a.fbs\"", "\"path\": \"../a.fbs\"", "not a relative path"},
    {"\"path\": \"train/a.fbs\"", "\"path\": \"/etc/passwd\"", "not a relative path"},
    {"\"path\": \"train/a.fbs\"", "\"path\": \"train//a.fbs\"", "not a relative path"},
    {"\"path\": \"train/a.fbs\"", "\"path\": \"train/./a.fbs\"", "not a relative path"},
    {"\"path\": \"train/a.fbs\"", "\"path\": \"train/a b.fbs\"", "not a relative path"},
    {"\"path\": \"train/a.fbs\"", "\"path\": \"train/b.fbs\"", "listed twice"},
    {"\"path\": \"train/a.fbs\"", "\"path\": \"test/t.fbs\"", "listed twice"},
    {"\"path\": \"train/a.fbs\", ", "", "missing field splits.train.shards[0].path"},
    {"\"path\": \"train/a.fbs\"", "\"path\": \"train/a.fbs\", \"note\": 1",
     "unknown field \"note\" in splits.train.shards[0]"},
    {"\"train\": {", "\"Train\": {", "split name"},
    {"\"shards\": [{\"path\": \"test", "\"shards\": [], \"x\": [{\"path\": \"test", "unknown field"},
    {"\"shards\": [{\"path\": \"test/t.fbs\", \"bytes\": 100, \"records\": 1, \"chunks\": 1, "
     "\"crc32c\": \"00000001\"}]",
     "\"shards\": []", "splits.test.shards has 0 entries"},
    {"\"splits\": {", "\"splits\": [], \"s\": {", "unknown field \"s\""},
    {"\"splits\": {\"train\"", "\"splits\": 1, \"old\": {\"train\"", "unknown field \"old\""},
    {"{\"format\"", "[{\"format\"", "not valid JSON"},
    {"\"version\": 1,", "\"version\": 1, \"version\": 1,", "not valid JSON"},
    {"\"name\": \"toy\"", "\"name\": \"toy\" \"x\"", "not valid JSON"},
};

static void test_invalid(void)
{
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        char *j = with(k_bad[i].from, k_bad[i].to);
        fb_manifest m;
        memset(&m, 0x5A, sizeof m);
        g_msg[0] = '\0';
        int rc = fb_manifest_parse(&m, j, strlen(j), "bad.json", g_msg, sizeof g_msg);
        if (rc != FB_ERR_DATA || !du_contains(g_msg, "bad.json") ||
            !du_contains(g_msg, k_bad[i].expect)) {
            fprintf(stderr, "case %zu (%s -> %s): rc %d, message \"%s\", expected \"%s\"\n", i,
                    k_bad[i].from, k_bad[i].to, rc, g_msg, k_bad[i].expect);
            abort();
        }
        /* failed: *out untouched */
        unsigned char *p = (unsigned char *)&m;
        for (size_t k = 0; k < sizeof m; k++) CHECK_INT_EQ(p[k], 0x5A);
        free(j);
    }
    fb_manifest m;
    CHECK_INT_EQ(fb_manifest_parse(&m, "", 0, "empty", g_msg, sizeof g_msg), FB_ERR_DATA);
    CHECK_INT_EQ(fb_manifest_parse(&m, "[]", 2, "arr", g_msg, sizeof g_msg), FB_ERR_DATA);
    CHECK_CONTAINS(g_msg, "must be a JSON object");
    /* too many splits */
    char big[4096];
    int n = snprintf(big, sizeof big, "{\"format\": \"fusebox-dataset\", \"version\": 1, \"name\": "
                     "\"x\", \"sample\": {\"dtype\": \"uint8\", \"shape\": [1]}, \"label\": "
                     "{\"dtype\": \"int32\", \"classes\": 2}, \"splits\": {");
    for (int s = 0; s < FB_MANIFEST_MAX_SPLITS + 1; s++)
        n += snprintf(big + n, sizeof big - (size_t)n,
                      "%s\"s%d\": {\"samples\": 1, \"shards\": [{\"path\": \"p%d\", \"bytes\": "
                      "100, \"records\": 1, \"chunks\": 1, \"crc32c\": \"00000000\"}]}",
                      s ? ", " : "", s, s);
    snprintf(big + n, sizeof big - (size_t)n, "}}");
    CHECK_INT_EQ(fb_manifest_parse(&m, big, strlen(big), "many", g_msg, sizeof g_msg), FB_ERR_DATA);
    CHECK_CONTAINS(g_msg, "splits has 9 entries");
    /* missing file: FB_ERR_DATA naming it */
    char path[1024];
    snprintf(path, sizeof path, "%s/none/manifest.json", g_dir);
    CHECK_INT_EQ(fb_manifest_read(&m, path, g_msg, sizeof g_msg), FB_ERR_DATA);
    CHECK_CONTAINS(g_msg, path);
}

/* Rewrites the dataset's manifest.json with one textual replacement. */
static void edit_manifest(const char *dir, const char *from, const char *to)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    size_t len;
    char *s = (char *)du_read(path, &len);
    char *at = strstr(s, from);
    CHECK(at != NULL);
    size_t a = (size_t)(at - s), fl = strlen(from), tl = strlen(to);
    char *o = malloc(len - fl + tl + 1);
    CHECK(o != NULL);
    memcpy(o, s, a);
    memcpy(o + a, to, tl);
    memcpy(o + a + tl, at + fl, len - a - fl);
    du_write(path, o, len - fl + tl);
    free(s);
    free(o);
}

static void test_lying_manifest(void)
{
    char ds[1024], orig[1100], mpath[1100];
    snprintf(ds, sizeof ds, "%s/ds", g_dir);
    du_make_index_dataset(ds, "train", 100, 4, 7, 40); /* 3 shards: 40, 40, 20 */
    snprintf(orig, sizeof orig, "%s/manifest.orig", g_dir);
    snprintf(mpath, sizeof mpath, "%s/manifest.json", ds);
    du_copy(orig, mpath);
    fb_manifest m;
    CHECK_INT_EQ(fb_manifest_open_dir(&m, ds, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(m.splits[0].n_shards, 3);
    CHECK_INT_EQ(m.splits[0].shards[2].records, 20);
    CHECK_INT_EQ(m.splits[0].shards[0].chunks, 6);
    char bytes_s[64], bytes_lie[64];
    snprintf(bytes_s, sizeof bytes_s, "\"bytes\": %" PRIu64, m.splits[0].shards[1].bytes);
    snprintf(bytes_lie, sizeof bytes_lie, "\"bytes\": %" PRIu64, m.splits[0].shards[1].bytes + 1);
    fb_manifest_free(&m);

    static const struct {
        const char *from, *to, *expect;
    } lies[] = {
        {NULL, NULL, "train-00001.fbs: the manifest says"},
        {"\"records\": 20", "\"records\": 21", "train-00002.fbs: holds 20 records in 3 chunks; the "
                                               "manifest says 21 in 3"},
        {"\"chunks\": 3", "\"chunks\": 2", "train-00002.fbs: holds 20 records in 3 chunks"},
        {"\"dtype\": \"float32\"", "\"dtype\": \"uint8\"", "holds float32 records of 2 values"},
        {"\"shape\": [\n      2\n    ]", "\"shape\": [\n      3\n    ]", "the manifest says float32 "
                                                                      "records of 3"},
        {"train/train-00000.fbs", "train/train-00009.fbs", "train-00009.fbs: listed in the manifest"},
    };
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        du_copy(mpath, orig);
        if (lies[i].from)
            edit_manifest(ds, lies[i].from, lies[i].to);
        else
            edit_manifest(ds, bytes_s, bytes_lie);
        /* the "records" lie also breaks the samples sum: fix that too */
        if (i == 1) edit_manifest(ds, "\"samples\": 100", "\"samples\": 101");
        g_msg[0] = '\0';
        int rc = fb_manifest_open_dir(&m, ds, g_msg, sizeof g_msg);
        if (rc != FB_ERR_DATA || !du_contains(g_msg, lies[i].expect)) {
            fprintf(stderr, "lie %zu: rc %d, message \"%s\", expected \"%s\"\n", i, rc, g_msg,
                    lies[i].expect);
            abort();
        }
    }
    du_copy(mpath, orig);
    CHECK_INT_EQ(fb_manifest_open_dir(&m, ds, g_msg, sizeof g_msg), 0);
    fb_manifest_free(&m);
    /* a truncated shard behind a correct manifest */
    char shard[1100];
    snprintf(shard, sizeof shard, "%s/train/train-00001.fbs", ds);
    CHECK(truncate(shard, 100) == 0);
    CHECK_INT_EQ(fb_manifest_open_dir(&m, ds, g_msg, sizeof g_msg), FB_ERR_DATA);
    CHECK_CONTAINS(g_msg, "train-00001.fbs");
}

int main(void)
{
    du_scratch(g_dir, sizeof g_dir, "manifest");
    test_valid();
    test_invalid();
    test_tokens();
    test_invalid_tokens();
    test_lying_manifest();
    du_rm_rf(g_dir);
    printf("test_manifest: ok\n");
    return 0;
}
