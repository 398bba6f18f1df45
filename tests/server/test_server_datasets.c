/*
 * The dataset routes against the real fuseboxd, the real fusebox-data and a
 * fresh PostgreSQL database: registering a built-in, importing IDX, CSV and
 * text files from a server path inside --import-roots (text as byte-level
 * token records: dtype int32, vocab 256, no classes), uploading CSV and text
 * splits, a table of bad text imports and uploads,
 * listing with a cursor, reading, deleting.  And what must be refused, with
 * nothing changed: bad bodies and queries, paths that leave the import roots
 * (.. parts, symbolic links, absolute paths elsewhere), imports when no root
 * is allowed, uploads over the tenant's quota (413), corrupt files (the
 * dataset turns failed with the file's own error and nothing stays on
 * disk), another tenant's datasets (404, like names that do not exist),
 * deleting or changing a dataset that queued jobs use (409), and imports a
 * stopped server left behind.  Every response is checked against
 * api/openapi.yaml when the node validator is installed.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "harness.h"

static fbt_server S;
static char tmp[128];   /* this test's files: roots/, outside/, builtin/ */
static char roots[200]; /* the import root */
static char a_id[64], a_key[128], b_id[64], b_key[128], small_id[64], small_key[128];

static const char *jstr(json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

static long long jint(json_t *o, const char *k)
{
    return (long long)json_integer_value(json_object_get(o, k));
}

static const char *err_message(const fbt_resp *r)
{
    return jstr(json_object_get(r->json, "error"), "message");
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

/* ---- files ---- */

static void mkdirs(const char *path)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", path);
    CHECK(system(cmd) == 0);
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(data, 1, len, f) == len);
    CHECK(fclose(f) == 0);
}

static void write_text(const char *path, const char *text)
{
    write_file(path, text, strlen(text));
}

/* IDX images [n, 4, 4] of unsigned bytes and labels [n_labels] in 0..2,
 * gzipped when gz; bad_magic spoils the images' first bytes. */
static void write_idx_pair(const char *dir, const char *prefix, int n, int n_labels, bool gz,
                           bool bad_magic)
{
    unsigned char img[16 + 64 * 16], lab[8 + 64];
    CHECK(n <= 64 && n_labels <= 64);
    unsigned char ih[16] = {0, 0, 8, 3, 0, 0, 0, (unsigned char)n, 0, 0, 0, 4, 0, 0, 0, 4};
    unsigned char lh[8] = {0, 0, 8, 1, 0, 0, 0, (unsigned char)n_labels};
    memcpy(img, ih, 16);
    memcpy(lab, lh, 8);
    if (bad_magic) img[0] = img[1] = 0x7f;
    for (int i = 0; i < n * 16; i++)
        img[16 + i] = (unsigned char)(i * 37);
    for (int i = 0; i < n_labels; i++)
        lab[8 + i] = (unsigned char)(i % 3);
    const char *kinds[2] = {"images-idx3", "labels-idx1"};
    const unsigned char *data[2] = {img, lab};
    size_t len[2] = {16 + (size_t)n * 16, 8 + (size_t)n_labels};
    for (int k = 0; k < 2; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s-%s-ubyte%s", dir, prefix, kinds[k], gz ? ".gz" : "");
        if (gz) {
            gzFile f = gzopen(path, "wb");
            CHECK(f != NULL);
            CHECK(gzwrite(f, data[k], (unsigned)len[k]) == (int)len[k]);
            CHECK(gzclose(f) == Z_OK);
        } else {
            write_file(path, data[k], len[k]);
        }
    }
}

static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* The entries of a tenant's datasets directory, space-separated and sorted
 * ("" when it has none or does not exist). */
static const char *tenant_entries(const char *tenant)
{
    static char out[2048];
    char dir[512];
    snprintf(dir, sizeof dir, "%s/datasets/%s", S.data_dir, tenant);
    out[0] = '\0';
    struct dirent **list = NULL;
    int n = scandir(dir, &list, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        if (strcmp(list[i]->d_name, ".") != 0 && strcmp(list[i]->d_name, "..") != 0) {
            size_t used = strlen(out);
            snprintf(out + used, sizeof out - used, "%s%s", used ? " " : "", list[i]->d_name);
        }
        free(list[i]);
    }
    free(list);
    return out;
}

/* The datasets table, the one these routes write.  (The whole database is
 * not compared: the control loop may touch queued jobs at any moment.) */
static char *ds_fingerprint(void)
{
    char *f = strdup(fbt_sql_value(&S, "SELECT count(*) || ':' || coalesce(md5(string_agg("
                                       "t::text, ',' ORDER BY t::text)), '-') FROM datasets t"));
    CHECK(f != NULL);
    return f;
}

/* ---- requests ---- */

static fbt_resp create(const char *key, const char *body)
{
    return fbt_call(&S, "POST", "/v1/datasets", key, body);
}

static fbt_resp get_ds(const char *key, const char *name)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/datasets/%s", name);
    return fbt_call(&S, "GET", path, key, NULL);
}

/* Polls GET until the dataset is no longer importing; returns its JSON. */
static json_t *wait_done(const char *key, const char *name)
{
    double start = fbt_now_ms();
    for (;;) {
        fbt_resp r = get_ds(key, name);
        fbt_expect(&r, 200, NULL, "poll a dataset");
        if (strcmp(jstr(r.json, "state"), "importing") != 0) {
            json_t *j = json_incref(r.json);
            fbt_resp_free(&r);
            return j;
        }
        fbt_resp_free(&r);
        if (fbt_now_ms() - start > 60000) {
            fbt_server_dump_log(&S);
            fprintf(stderr, "dataset %s still importing after 60 s\n", name);
            abort();
        }
        sleep_ms(30);
    }
}

/* PUT a split: query after the '?', a body of len bytes with content type
 * ctype (NULL: none), sent chunked when chunked. */
static fbt_resp put_split(const char *key, const char *name, const char *split, const char *query,
                          const char *body, size_t len, const char *ctype, bool chunked)
{
    char path[400], auth[200], ct[128];
    snprintf(path, sizeof path, "/v1/datasets/%s/splits/%s%s%s", name, split, query ? "?" : "",
             query ? query : "");
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    const char *h[4];
    int n = 0;
    h[n++] = auth;
    if (ctype) {
        snprintf(ct, sizeof ct, "Content-Type: %s", ctype);
        h[n++] = ct;
    }
    char *enc = NULL;
    size_t enc_len = len;
    if (chunked) {
        h[n++] = "Transfer-Encoding: chunked";
        enc = malloc(len + 64);
        CHECK(enc != NULL);
        int k = snprintf(enc, 64, "%zx\r\n", len);
        memcpy(enc + k, body, len);
        memcpy(enc + k + len, "\r\n0\r\n\r\n", 7);
        enc_len = (size_t)k + len + 7;
    }
    h[n] = NULL;
    fbt_resp r;
    CHECK(fbt_http(S.port, "PUT", path, h, chunked ? enc : body, enc_len, &r) == 0);
    free(enc);
    fbt_record("PUT", path, &r);
    return r;
}

static fbt_resp put_csv(const char *key, const char *name, const char *split, const char *csv)
{
    return put_split(key, name, split, "label_column=label", csv, strlen(csv),
                     "application/octet-stream", false);
}

/* A request that must be refused with status and code, changing nothing in
 * the database and leaving the tenant's directory as it was. */
static void refused(const char *what, fbt_resp (*send)(const void *), const void *arg, int status,
                    const char *code, const char *tenant)
{
    char *before = ds_fingerprint();
    char entries[2048];
    snprintf(entries, sizeof entries, "%s", tenant_entries(tenant));
    fbt_resp r = send(arg);
    fbt_expect(&r, status, code, what);
    CHECK(err_message(&r) != NULL && err_message(&r)[0]);
    fbt_resp_free(&r);
    char *after = ds_fingerprint();
    CHECK_STR_EQ(after, before);
    CHECK_STR_EQ(tenant_entries(tenant), entries);
    free(before);
    free(after);
    printf("refused as it should be: %s\n", what);
}

typedef struct post_arg {
    const char *key, *body;
} post_arg;

static fbt_resp send_post(const void *arg)
{
    const post_arg *p = arg;
    return create(p->key, p->body);
}

static void refused_post(const char *key, const char *body, int status, const char *code,
                         const char *tenant)
{
    post_arg p = {key, body};
    char what[300];
    snprintf(what, sizeof what, "POST %.250s", body);
    refused(what, send_post, &p, status, code, tenant);
}

/* ---- tests ---- */

static void test_builtin(void)
{
    fbt_resp r = create(
        a_key, "{\"name\": \"fm\", \"source\": \"builtin\", \"builtin\": \"fashion-mnist\"}");
    fbt_expect(&r, 201, NULL, "register a built-in");
    CHECK_STR_EQ(fbt_header(&r, "Location"), "/v1/datasets/fm");
    CHECK_STR_EQ(jstr(r.json, "state"), "ready");
    CHECK_STR_EQ(jstr(r.json, "source"), "builtin");
    CHECK_STR_EQ(jstr(r.json, "builtin"), "fashion-mnist");
    CHECK_INT_EQ(jint(r.json, "bytes"), 0); /* shared, not copied: no quota used */
    json_t *sum = json_object_get(r.json, "summary");
    CHECK_INT_EQ(jint(sum, "samples"), 70000);
    CHECK_INT_EQ(jint(sum, "classes"), 10);
    CHECK_INT_EQ(jint(json_object_get(json_object_get(sum, "splits"), "train"), "samples"), 60000);
    CHECK_INT_EQ(jint(sum, "bytes"), 4 * 100); /* the four fake files of 100 bytes */
    fbt_resp_free(&r);
    CHECK_STR_EQ(tenant_entries(a_id), ""); /* nothing is copied */

    refused_post(a_key,
                 "{\"name\": \"fm\", \"source\": \"builtin\", \"builtin\": \"fashion-mnist\"}", 409,
                 "already_exists", a_id);
    /* mnist is known but its files are not installed in --builtin-dir */
    refused_post(a_key, "{\"name\": \"mn\", \"source\": \"builtin\", \"builtin\": \"mnist\"}", 501,
                 "unsupported", a_id);
    refused_post(a_key, "{\"name\": \"c\", \"source\": \"builtin\", \"builtin\": \"cifar-10\"}",
                 400, "bad_enum", a_id);
    refused_post(a_key, "{\"name\": \"c\", \"source\": \"builtin\"}", 400, "missing_field", a_id);
    refused_post(a_key,
                 "{\"name\": \"c\", \"source\": \"builtin\", \"builtin\": \"mnist\", \"path\": "
                 "\"/x\"}",
                 400, "unknown_field", a_id);
}

static void test_bad_bodies(void)
{
    static const struct {
        const char *body;
        int status;
        const char *code;
    } cases[] = {
        {"{\"source\": \"builtin\", \"builtin\": \"fashion-mnist\"}", 400, "missing_field"},
        {"{\"name\": \"Caps\", \"source\": \"builtin\", \"builtin\": \"fashion-mnist\"}", 400,
         "bad_name"},
        {"{\"name\": \".hidden\", \"source\": \"builtin\", \"builtin\": \"fashion-mnist\"}", 400,
         "bad_name"},
        {"{\"name\": \"a/b\", \"source\": \"builtin\", \"builtin\": \"fashion-mnist\"}", 400,
         "bad_name"},
        {"{\"name\": 7, \"source\": \"builtin\"}", 400, "wrong_type"},
        {"{\"name\": \"x\"}", 400, "missing_field"},
        {"{\"name\": \"x\", \"source\": \"upload\"}", 400, "bad_enum"},
        {"{\"name\": \"x\", \"source\": \"import\", \"format\": \"idx\"}", 400, "missing_field"},
        {"{\"name\": \"x\", \"source\": \"import\", \"path\": \"/a\", \"format\": \"png\"}", 400,
         "bad_enum"},
        {"{\"name\": \"x\", \"source\": \"import\", \"path\": \"/a\", \"format\": \"csv\"}", 400,
         "missing_field"},
        {"{\"name\": \"x\", \"source\": \"import\", \"path\": \"/a\", \"format\": \"idx\","
         " \"label_column\": \"y\"}",
         400, "conflicting_fields"},
        {"{\"name\": \"x\", \"source\": \"import\", \"path\": \"/a\", \"format\": \"csv\","
         " \"label_column\": \"y\", \"header\": \"yes\"}",
         400, "wrong_type"},
        {"{\"name\": \"x\", \"source\": \"import\", \"path\": \"/a\", \"format\": \"csv\","
         " \"label_column\": \"y\", \"split\": \"Bad!\"}",
         400, "bad_name"},
        {"{\"name\": \"x\", \"source\": \"import\", \"path\": \"/a\", \"format\": \"idx\","
         " \"mode\": 1}",
         400, "unknown_field"},
        {"{\"name\": \"x\", \"source\": \"import\", \"path\": \"relative/dir\", \"format\": "
         "\"idx\"}",
         400, "bad_name"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        refused_post(a_key, cases[i].body, cases[i].status, cases[i].code, a_id);
    /* the HTTP layer's checks apply too */
    fbt_resp r;
    const char *h[] = {"Authorization: Bearer x", NULL};
    CHECK(fbt_http(S.port, "POST", "/v1/datasets", h, "{}", 2, &r) == 0);
    fbt_record("POST", "/v1/datasets", &r);
    fbt_expect(&r, 401, "unauthorized", "no valid key");
    fbt_resp_free(&r);
}

static void test_import_idx(void)
{
    char body[800];
    snprintf(body, sizeof body,
             "{\"name\": \"fm-import\", \"source\": \"import\", \"path\": \"%s/fm\", \"format\": "
             "\"idx\"}",
             roots);
    fbt_resp r = create(a_key, body);
    fbt_expect(&r, 202, NULL, "import an IDX directory");
    CHECK_STR_EQ(fbt_header(&r, "Location"), "/v1/datasets/fm-import");
    CHECK_STR_EQ(jstr(r.json, "source"), "import");
    CHECK(strcmp(jstr(r.json, "state"), "importing") == 0 ||
          strcmp(jstr(r.json, "state"), "ready") == 0);
    fbt_resp_free(&r);
    json_t *d = wait_done(a_key, "fm-import");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    CHECK(json_is_null(json_object_get(d, "error")));
    json_t *sum = json_object_get(d, "summary");
    CHECK_STR_EQ(jstr(sum, "dtype"), "uint8");
    json_t *shape = json_object_get(sum, "shape");
    CHECK_INT_EQ(json_array_size(shape), 3);
    CHECK_INT_EQ(json_integer_value(json_array_get(shape, 0)), 1);
    CHECK_INT_EQ(json_integer_value(json_array_get(shape, 2)), 4);
    CHECK_INT_EQ(jint(sum, "classes"), 3);
    CHECK_INT_EQ(jint(sum, "samples"), 70);
    json_t *splits = json_object_get(sum, "splits");
    CHECK_INT_EQ(json_object_size(splits), 2);
    CHECK_INT_EQ(jint(json_object_get(splits, "train"), "samples"), 50);
    CHECK_INT_EQ(jint(json_object_get(splits, "test"), "samples"), 20); /* from the .gz pair */
    CHECK_INT_EQ(jint(json_object_get(splits, "train"), "shards"), 1);
    CHECK(jint(d, "bytes") > 0);
    CHECK_INT_EQ(jint(d, "bytes"), jint(sum, "bytes"));
    json_decref(d);
    /* the shard dataset is where workers look for it, and nothing else is left */
    char path[600];
    snprintf(path, sizeof path, "%s/datasets/%s/fm-import/manifest.json", S.data_dir, a_id);
    CHECK(exists(path));
    CHECK_STR_EQ(tenant_entries(a_id), "fm-import");
    /* the dataset is checked again by the tool itself */
    char cmd[1200];
    snprintf(cmd, sizeof cmd,
             "'%s/workers/data/fusebox-data' verify '%s/datasets/%s/fm-import'"
             " > /dev/null",
             getenv("FB_BINARY_DIR"), S.data_dir, a_id);
    CHECK_INT_EQ(system(cmd), 0);
    /* a name is a tenant's only once */
    refused_post(a_key, body, 409, "already_exists", a_id);
}

static void test_import_csv(void)
{
    char body[800];
    snprintf(body, sizeof body,
             "{\"name\": \"iris\", \"source\": \"import\", \"path\": \"%s/iris.csv\", \"format\":"
             " \"csv\", \"label_column\": \"species\", \"header\": true, \"split\": \"valid\"}",
             roots);
    fbt_resp r = create(a_key, body);
    fbt_expect(&r, 202, NULL, "import a CSV file");
    fbt_resp_free(&r);
    json_t *d = wait_done(a_key, "iris");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    json_t *sum = json_object_get(d, "summary");
    CHECK_STR_EQ(jstr(sum, "dtype"), "float32");
    CHECK_INT_EQ(json_integer_value(json_array_get(json_object_get(sum, "shape"), 0)), 2);
    CHECK_INT_EQ(jint(json_object_get(json_object_get(sum, "splits"), "valid"), "samples"), 4);
    json_decref(d);
    /* a directory of train.csv and test.csv, the label column by index */
    snprintf(body, sizeof body,
             "{\"name\": \"iris-dir\", \"source\": \"import\", \"path\": \"%s/csvdir\", "
             "\"format\": \"csv\", \"label_column\": 2}",
             roots);
    r = create(a_key, body);
    fbt_expect(&r, 202, NULL, "import a CSV directory");
    fbt_resp_free(&r);
    d = wait_done(a_key, "iris-dir");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    json_t *splits = json_object_get(json_object_get(d, "summary"), "splits");
    CHECK_INT_EQ(jint(json_object_get(splits, "train"), "samples"), 4);
    CHECK_INT_EQ(jint(json_object_get(splits, "test"), "samples"), 2);
    json_decref(d);
    /* a link inside the root to a directory inside the root is fine */
    snprintf(body, sizeof body,
             "{\"name\": \"fm-linked\", \"source\": \"import\", \"path\": \"%s/fm-link\", "
             "\"format\": \"idx\"}",
             roots);
    r = create(a_key, body);
    fbt_expect(&r, 202, NULL, "import through a link that stays inside");
    fbt_resp_free(&r);
    d = wait_done(a_key, "fm-linked");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    json_decref(d);
}

static void test_path_escapes(void)
{
    char body[800];
    struct {
        const char *path_fmt; /* %s: the root */
        int status;
        const char *code;
    } cases[] = {
        {"%s/../outside/fm", 400, "bad_name"}, /* a .. part, even one that would resolve */
        {"%s/./fm", 400, "bad_name"},          /* a . part */
        {"%s/escape", 403, "forbidden"},       /* a link inside to a directory outside */
        {"%s/mixed", 403, "forbidden"},        /* a file inside that links outside */
        {"%s/../../../../../../etc", 400, "bad_name"},
        {"/etc", 403, "forbidden"},                  /* absolute, outside */
        {"/no/such/place/at/all", 403, "forbidden"}, /* outside and absent: the same answer */
        {"%s/absent", 400, "bad_data"},              /* inside and absent */
        {"%s/fm/train-images-idx3-ubyte", 400, "bad_data"}, /* idx needs a directory */
        {"%s/empty", 400, "bad_data"},                      /* a directory without the files */
        {"%s/half", 400, "bad_data"},                       /* images without labels */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[400];
        snprintf(path, sizeof path, cases[i].path_fmt, roots);
        snprintf(body, sizeof body,
                 "{\"name\": \"esc\", \"source\": \"import\", \"path\": \"%s\", \"format\": "
                 "\"idx\"}",
                 path);
        refused_post(a_key, body, cases[i].status, cases[i].code, a_id);
    }
    /* a CSV file that is a link to a file outside */
    snprintf(body, sizeof body,
             "{\"name\": \"esc\", \"source\": \"import\", \"path\": \"%s/secret.csv\", \"format\":"
             " \"csv\", \"label_column\": 0}",
             roots);
    refused_post(a_key, body, 403, "forbidden", a_id);
    /* the outside file's contents never appear in an answer */
    fbt_resp r = create(a_key, body);
    CHECK(strstr(r.body, "top-secret") == NULL);
    fbt_resp_free(&r);
}

static void test_import_corrupt(void)
{
    char body[800];
    snprintf(body, sizeof body,
             "{\"name\": \"broken\", \"source\": \"import\", \"path\": \"%s/badmagic\", "
             "\"format\": \"idx\"}",
             roots);
    fbt_resp r = create(a_key, body);
    fbt_expect(&r, 202, NULL, "import a corrupt IDX file");
    fbt_resp_free(&r);
    json_t *d = wait_done(a_key, "broken");
    CHECK_STR_EQ(jstr(d, "state"), "failed");
    const char *e = jstr(d, "error");
    printf("corrupt IDX: %s\n", e);
    CHECK(e && strstr(e, "magic") && strstr(e, "badmagic/train-images-idx3-ubyte"));
    CHECK(strstr(e, "/dev/fd") == NULL && strstr(e, ".import-") == NULL);
    CHECK(json_is_null(json_object_get(d, "summary")));
    CHECK_INT_EQ(jint(d, "bytes"), 0);
    json_decref(d);
    /* nothing of it is on disk: neither the dataset nor its staging directory */
    CHECK(strstr(tenant_entries(a_id), "broken") == NULL);
    CHECK(strstr(tenant_entries(a_id), ".import") == NULL);
    /* images and labels that disagree on the count */
    snprintf(body, sizeof body,
             "{\"name\": \"uneven\", \"source\": \"import\", \"path\": \"%s/uneven\", "
             "\"format\": \"idx\"}",
             roots);
    r = create(a_key, body);
    fbt_expect(&r, 202, NULL, "import uneven IDX files");
    fbt_resp_free(&r);
    d = wait_done(a_key, "uneven");
    CHECK_STR_EQ(jstr(d, "state"), "failed");
    printf("uneven IDX: %s\n", jstr(d, "error"));
    CHECK(strstr(jstr(d, "error"), "split train") != NULL);
    json_decref(d);
    CHECK(strstr(tenant_entries(a_id), "uneven") == NULL);
    CHECK(strstr(tenant_entries(a_id), ".import") == NULL);
    /* a failed dataset is deleted like any other */
    r = fbt_call(&S, "DELETE", "/v1/datasets/uneven", a_key, NULL);
    fbt_expect(&r, 200, NULL, "delete a failed dataset");
    CHECK_STR_EQ(jstr(r.json, "state"), "failed");
    fbt_resp_free(&r);
}

static const char train_csv[] = "x,y,label\n1,2,0\n3,4,1\n5,6,2\n7,8,1\n";
static const char test_csv[] = "x,y,label\n1.5,2.5,0\n3.5,4.5,2\n";
static const char bad_csv[] = "x,y,label\n1,2,0\n3,oops,1\n";

typedef struct put_arg {
    const char *key, *name, *split, *query, *body, *ctype;
} put_arg;

static fbt_resp send_put(const void *arg)
{
    const put_arg *p = arg;
    return put_split(p->key, p->name, p->split, p->query, p->body, strlen(p->body), p->ctype,
                     false);
}

static void test_upload(void)
{
    fbt_resp r = put_csv(a_key, "up", "train", train_csv);
    fbt_expect(&r, 202, NULL, "upload a train split");
    CHECK_STR_EQ(fbt_header(&r, "Location"), "/v1/datasets/up");
    CHECK_STR_EQ(jstr(r.json, "source"), "upload");
    fbt_resp_free(&r);
    json_t *d = wait_done(a_key, "up");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    CHECK_INT_EQ(jint(json_object_get(d, "summary"), "samples"), 4);
    json_decref(d);
    /* a second split joins the first, sent chunked with a CSV media type */
    r = put_split(a_key, "up", "test", "label_column=2&header=true", test_csv, strlen(test_csv),
                  "text/csv", true);
    fbt_expect(&r, 202, NULL, "upload a test split");
    fbt_resp_free(&r);
    d = wait_done(a_key, "up");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    json_t *sum = json_object_get(d, "summary");
    CHECK_INT_EQ(jint(sum, "samples"), 6);
    CHECK_INT_EQ(jint(json_object_get(json_object_get(sum, "splits"), "test"), "samples"), 2);
    CHECK_INT_EQ(jint(json_object_get(json_object_get(sum, "splits"), "train"), "samples"), 4);
    long long bytes = jint(d, "bytes");
    json_decref(d);

    /* a corrupt file for a third split: the dataset stays as it was, with the error */
    char manifest[600], before_text[8192] = "", after_text[8192] = "";
    snprintf(manifest, sizeof manifest, "%s/datasets/%s/up/manifest.json", S.data_dir, a_id);
    FILE *f = fopen(manifest, "r");
    CHECK(f != NULL);
    CHECK(fread(before_text, 1, sizeof before_text - 1, f) > 0);
    fclose(f);
    r = put_csv(a_key, "up", "extra", bad_csv);
    fbt_expect(&r, 202, NULL, "upload a corrupt third split");
    fbt_resp_free(&r);
    d = wait_done(a_key, "up");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    printf("corrupt split of a ready dataset: %s\n", jstr(d, "error"));
    CHECK(strstr(jstr(d, "error"), "extra.csv:3") != NULL);
    CHECK_INT_EQ(jint(d, "bytes"), bytes);
    CHECK_INT_EQ(json_object_size(json_object_get(json_object_get(d, "summary"), "splits")), 2);
    json_decref(d);
    f = fopen(manifest, "r");
    CHECK(f != NULL);
    CHECK(fread(after_text, 1, sizeof after_text - 1, f) > 0);
    fclose(f);
    CHECK_STR_EQ(after_text, before_text);
    CHECK(strstr(tenant_entries(a_id), ".import") == NULL);
    CHECK(strstr(tenant_entries(a_id), ".upload") == NULL);

    /* a corrupt first upload: failed, the CSV's own words, nothing on disk */
    r = put_csv(a_key, "up-bad", "train", bad_csv);
    fbt_expect(&r, 202, NULL, "upload a corrupt CSV");
    fbt_resp_free(&r);
    d = wait_done(a_key, "up-bad");
    CHECK_STR_EQ(jstr(d, "state"), "failed");
    printf("corrupt upload: %s\n", jstr(d, "error"));
    CHECK(strstr(jstr(d, "error"), "train.csv:3, column 1 (\"y\")") != NULL);
    json_decref(d);
    CHECK(strstr(tenant_entries(a_id), "up-bad") == NULL);
    CHECK(strstr(tenant_entries(a_id), ".upload") == NULL);
    /* uploading again replaces a failed dataset */
    r = put_csv(a_key, "up-bad", "train", train_csv);
    fbt_expect(&r, 202, NULL, "upload over a failed dataset");
    fbt_resp_free(&r);
    d = wait_done(a_key, "up-bad");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    CHECK(json_is_null(json_object_get(d, "error")));
    json_decref(d);

    /* refusals */
    const put_arg bad[] = {
        {a_key, "fm", "train", "label_column=label", train_csv, "application/octet-stream"},
        {a_key, "fm-import", "train", "label_column=label", train_csv, NULL},
        {a_key, "new", "train", NULL, train_csv, NULL},
        {a_key, "new", "train", "label_column=label&delimiter=tab", train_csv, NULL},
        {a_key, "new", "train", "label_column=label&header=maybe", train_csv, NULL},
        {a_key, "new", "train", "label_column=label", "", NULL},
        {a_key, "new", "Train", "label_column=label", train_csv, NULL},
        {a_key, "New", "train", "label_column=label", train_csv, NULL},
        {a_key, "new", "train", "label_column=label", train_csv, "application/json"},
    };
    const int status[] = {409, 409, 400, 400, 400, 400, 400, 400, 415};
    const char *codes[] = {"state_conflict", "state_conflict", "bad_query",
                           "bad_query",      "bad_query",      "bad_data",
                           "bad_name",       "bad_name",       "unsupported_media_type"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char what[200];
        snprintf(what, sizeof what, "PUT %s/splits/%s?%s (%s)", bad[i].name, bad[i].split,
                 bad[i].query ? bad[i].query : "", bad[i].ctype ? bad[i].ctype : "no type");
        refused(what, send_put, &bad[i], status[i], codes[i], a_id);
    }
}

static const char text_body[] = "the quick brown fox jumps over the lazy dog\n"; /* 44 bytes */

static void test_text(void)
{
    char body[800];
    /* a text file, context 8, stride 4: (44 - 9) / 4 + 1 = 9 records of 9 tokens */
    snprintf(body, sizeof body,
             "{\"name\": \"fox\", \"source\": \"import\", \"path\": \"%s/fox.txt\", \"format\":"
             " \"text\", \"context\": 8, \"stride\": 4, \"split\": \"train\"}",
             roots);
    fbt_resp r = create(a_key, body);
    fbt_expect(&r, 202, NULL, "import a text file");
    fbt_resp_free(&r);
    json_t *d = wait_done(a_key, "fox");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    json_t *sum = json_object_get(d, "summary");
    CHECK_STR_EQ(jstr(sum, "dtype"), "int32");
    CHECK_INT_EQ(json_integer_value(json_array_get(json_object_get(sum, "shape"), 0)), 9);
    CHECK_INT_EQ(jint(sum, "vocab"), 256);
    CHECK_INT_EQ(jint(sum, "classes"), 0);
    CHECK_INT_EQ(jint(sum, "samples"), 9);
    json_decref(d);
    /* the listing shows it too */
    r = fbt_call(&S, "GET", "/v1/datasets?limit=100", a_key, NULL);
    fbt_expect(&r, 200, NULL, "list with a text dataset");
    json_t *items = json_object_get(r.json, "datasets");
    bool found = false;
    for (size_t i = 0; i < json_array_size(items); i++) {
        json_t *it = json_array_get(items, i);
        if (strcmp(jstr(it, "name"), "fox") != 0) continue;
        found = true;
        CHECK_STR_EQ(jstr(json_object_get(it, "summary"), "dtype"), "int32");
        CHECK_INT_EQ(jint(json_object_get(it, "summary"), "vocab"), 256);
    }
    CHECK(found);
    fbt_resp_free(&r);
    /* a directory of train.txt and test.txt, the default stride (the context) */
    snprintf(body, sizeof body,
             "{\"name\": \"fox-dir\", \"source\": \"import\", \"path\": \"%s/textdir\", "
             "\"format\": \"text\", \"context\": 10}",
             roots);
    r = create(a_key, body);
    fbt_expect(&r, 202, NULL, "import a text directory");
    fbt_resp_free(&r);
    d = wait_done(a_key, "fox-dir");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    json_t *splits = json_object_get(json_object_get(d, "summary"), "splits");
    CHECK_INT_EQ(jint(json_object_get(splits, "train"), "samples"), 4); /* (44 - 11) / 10 + 1 */
    CHECK_INT_EQ(jint(json_object_get(splits, "test"), "samples"), 1);  /* 12 bytes */
    json_decref(d);
    /* a text shorter than a record: failed, the tool's words naming the file */
    snprintf(body, sizeof body,
             "{\"name\": \"short\", \"source\": \"import\", \"path\": \"%s/short.txt\", "
             "\"format\": \"text\", \"context\": 8}",
             roots);
    r = create(a_key, body);
    fbt_expect(&r, 202, NULL, "import a text too short for a record");
    fbt_resp_free(&r);
    d = wait_done(a_key, "short");
    CHECK_STR_EQ(jstr(d, "state"), "failed");
    printf("short text: %s\n", jstr(d, "error"));
    CHECK(strstr(jstr(d, "error"), "the text has 4 bytes; a record needs context + 1 = 9"));
    json_decref(d);
    CHECK(strstr(tenant_entries(a_id), "short") == NULL);

    /* an upload of a text split, then a second one */
    r = put_split(a_key, "up-text", "train", "format=text&context=4", text_body,
                  strlen(text_body), "application/octet-stream", false);
    fbt_expect(&r, 202, NULL, "upload a text split");
    fbt_resp_free(&r);
    d = wait_done(a_key, "up-text");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    CHECK_INT_EQ(jint(json_object_get(d, "summary"), "samples"), 10); /* (44 - 5) / 4 + 1 */
    CHECK_INT_EQ(jint(json_object_get(d, "summary"), "vocab"), 256);
    json_decref(d);
    r = put_split(a_key, "up-text", "test", "format=text&context=4&stride=20", text_body,
                  strlen(text_body), NULL, true);
    fbt_expect(&r, 202, NULL, "upload a second text split");
    fbt_resp_free(&r);
    d = wait_done(a_key, "up-text");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    splits = json_object_get(json_object_get(d, "summary"), "splits");
    CHECK_INT_EQ(jint(json_object_get(splits, "test"), "samples"), 2); /* (44 - 5) / 20 + 1 */
    json_decref(d);
    /* a text split of another context cannot join: the dataset stays as it was */
    r = put_split(a_key, "up-text", "other", "format=text&context=6", text_body,
                  strlen(text_body), NULL, false);
    fbt_expect(&r, 202, NULL, "upload a text split of another context");
    fbt_resp_free(&r);
    d = wait_done(a_key, "up-text");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    CHECK(strstr(jstr(d, "error"), "would mix them") != NULL);
    CHECK_INT_EQ(json_object_size(json_object_get(json_object_get(d, "summary"), "splits")), 2);
    json_decref(d);

    /* bad text imports */
    static const struct {
        const char *extra; /* fields after the path */
        const char *code;
    } bad[] = {
        {"\"format\": \"text\"", "missing_field"},
        {"\"format\": \"text\", \"context\": 0", "out_of_range"},
        {"\"format\": \"text\", \"context\": -8", "out_of_range"},
        {"\"format\": \"text\", \"context\": 65537", "out_of_range"},
        {"\"format\": \"text\", \"context\": \"8\"", "wrong_type"},
        {"\"format\": \"text\", \"context\": 8.5", "wrong_type"},
        {"\"format\": \"text\", \"context\": 8, \"stride\": 0", "out_of_range"},
        {"\"format\": \"text\", \"context\": 8, \"stride\": 1073741825", "out_of_range"},
        {"\"format\": \"text\", \"context\": 8, \"stride\": true", "wrong_type"},
        {"\"format\": \"text\", \"context\": 8, \"label_column\": 0", "conflicting_fields"},
        {"\"format\": \"text\", \"context\": 8, \"header\": true", "conflicting_fields"},
        {"\"format\": \"csv\", \"label_column\": 0, \"context\": 8", "conflicting_fields"},
        {"\"format\": \"idx\", \"stride\": 8", "conflicting_fields"},
        {"\"format\": \"text\", \"context\": 8, \"split\": \"Bad!\"", "bad_name"},
        {"\"format\": \"txt\", \"context\": 8", "bad_enum"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body,
                 "{\"name\": \"t\", \"source\": \"import\", \"path\": \"%s/fox.txt\", %s}",
                 roots, bad[i].extra);
        refused_post(a_key, body, 400, bad[i].code, a_id);
    }
    /* bad text uploads */
    const put_arg bad_put[] = {
        {a_key, "t", "train", "format=text", text_body, NULL},
        {a_key, "t", "train", "format=text&context=0", text_body, NULL},
        {a_key, "t", "train", "format=text&context=65537", text_body, NULL},
        {a_key, "t", "train", "format=text&context=x", text_body, NULL},
        {a_key, "t", "train", "format=text&context=8&stride=0", text_body, NULL},
        {a_key, "t", "train", "format=text&context=8&label_column=label", text_body, NULL},
        {a_key, "t", "train", "format=text&context=8&header=true", text_body, NULL},
        {a_key, "t", "train", "label_column=label&context=8", train_csv, NULL},
        {a_key, "t", "train", "format=png&context=8", text_body, NULL},
        {a_key, "t", "train", "format=text&context=8", "", NULL},
    };
    for (size_t i = 0; i < sizeof bad_put / sizeof bad_put[0]; i++) {
        char what[200];
        snprintf(what, sizeof what, "PUT t/splits/train?%s", bad_put[i].query);
        refused(what, send_put, &bad_put[i], 400, i == 9 ? "bad_data" : "bad_query", a_id);
    }
}

static void test_quota(void)
{
    /* small may store 1000 bytes of datasets */
    char body[2001] = "a,label\n";
    while (strlen(body) + 4 < sizeof body)
        strcat(body, "1,0\n");
    put_arg over = {small_key, "huge", "train", "label_column=label", body, NULL};
    refused("an upload over the quota", send_put, &over, 413, "payload_too_large", small_id);
    /* the same, chunked: the limit is found while streaming */
    char *before = ds_fingerprint();
    fbt_resp r =
        put_split(small_key, "huge", "train", "label_column=label", body, strlen(body), NULL, true);
    fbt_expect(&r, 413, "payload_too_large", "a chunked upload over the quota");
    fbt_resp_free(&r);
    char *after = ds_fingerprint();
    CHECK_STR_EQ(after, before);
    free(before);
    free(after);
    CHECK(strstr(tenant_entries(small_id), "huge") == NULL);
    CHECK(strstr(tenant_entries(small_id), ".upload") == NULL);
    /* a file that fits, but whose shards do not: failed, nothing kept */
    const char *fits = "a,b,c,d,label\n1,2,3,4,0\n5,6,7,8,1\n9,10,11,12,0\n";
    r = put_csv(small_key, "tight", "train", fits);
    fbt_expect(&r, 202, NULL, "an upload that fits");
    fbt_resp_free(&r);
    json_t *d = wait_done(small_key, "tight");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    long long used = jint(d, "bytes");
    json_decref(d);
    CHECK(used > 500 && used < 1000); /* so that a second one does not fit */
    r = put_csv(small_key, "tight2", "train", fits);
    fbt_expect(&r, 202, NULL, "a second upload, over the quota once imported");
    fbt_resp_free(&r);
    d = wait_done(small_key, "tight2");
    CHECK_STR_EQ(jstr(d, "state"), "failed");
    printf("over the quota once imported: %s\n", jstr(d, "error"));
    CHECK(strstr(jstr(d, "error"), "max_dataset_bytes") != NULL);
    json_decref(d);
    CHECK(strstr(tenant_entries(small_id), "tight2") == NULL);
    CHECK(strstr(tenant_entries(small_id), ".import") == NULL);
}

static void test_isolation(void)
{
    /* B sees none of A's datasets, exactly as if they did not exist */
    const char *names[] = {"up", "fm", "fm-import", "broken", NULL};
    fbt_resp ghost = get_ds(b_key, "no-such-dataset");
    fbt_expect(&ghost, 404, "not_found", "a name that does not exist");
    for (int i = 0; names[i]; i++) {
        char *before = ds_fingerprint();
        char entries[2048];
        snprintf(entries, sizeof entries, "%s", tenant_entries(a_id));
        fbt_resp r = get_ds(b_key, names[i]);
        fbt_expect(&r, 404, "not_found", "B reads A's dataset");
        CHECK_STR_EQ(err_message(&r), err_message(&ghost));
        fbt_resp_free(&r);
        char path[200];
        snprintf(path, sizeof path, "/v1/datasets/%s", names[i]);
        r = fbt_call(&S, "DELETE", path, b_key, NULL);
        fbt_expect(&r, 404, "not_found", "B deletes A's dataset");
        CHECK_STR_EQ(err_message(&r), err_message(&ghost));
        fbt_resp_free(&r);
        char *after = ds_fingerprint();
        CHECK_STR_EQ(after, before);
        CHECK_STR_EQ(tenant_entries(a_id), entries);
        free(before);
        free(after);
    }
    fbt_resp_free(&ghost);
    fbt_resp r = fbt_call(&S, "GET", "/v1/datasets", b_key, NULL);
    fbt_expect(&r, 200, NULL, "B's list");
    CHECK_INT_EQ(json_array_size(json_object_get(r.json, "datasets")), 0);
    fbt_resp_free(&r);
    /* the same name is B's own, in B's own directory */
    r = put_csv(b_key, "up", "train", test_csv);
    fbt_expect(&r, 202, NULL, "B uploads its own up");
    fbt_resp_free(&r);
    json_t *d = wait_done(b_key, "up");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    CHECK_INT_EQ(jint(json_object_get(d, "summary"), "samples"), 2);
    json_decref(d);
    d = wait_done(a_key, "up");
    CHECK_INT_EQ(jint(json_object_get(d, "summary"), "samples"), 6);
    json_decref(d);
    CHECK_STR_EQ(tenant_entries(b_id), "up");
}

static void test_list(void)
{
    const char *want[] = {"broken", "fm",    "fm-import", "fm-linked", "fox",  "fox-dir",
                          "iris",   "iris-dir", "short",  "up",        "up-bad", "up-text"};
    int n_want = 12, seen = 0;
    char cursor[80] = "";
    for (int page = 0; page < 20; page++) {
        char path[200];
        snprintf(path, sizeof path, "/v1/datasets?limit=2%s%s", cursor[0] ? "&cursor=" : "",
                 cursor);
        fbt_resp r = fbt_call(&S, "GET", path, a_key, NULL);
        fbt_expect(&r, 200, NULL, "a page of datasets");
        json_t *items = json_object_get(r.json, "datasets");
        CHECK(json_array_size(items) <= 2);
        for (size_t i = 0; i < json_array_size(items); i++) {
            CHECK(seen < n_want);
            CHECK_STR_EQ(jstr(json_array_get(items, i), "name"), want[seen]);
            seen++;
        }
        json_t *next = json_object_get(r.json, "next_cursor");
        if (json_is_null(next)) {
            fbt_resp_free(&r);
            break;
        }
        snprintf(cursor, sizeof cursor, "%s", json_string_value(next));
        fbt_resp_free(&r);
    }
    CHECK_INT_EQ(seen, n_want);
    const char *bad[] = {"/v1/datasets?limit=0", "/v1/datasets?limit=x",
                         "/v1/datasets?cursor=Not%20a%20name", "/v1/datasets?state=ready", NULL};
    for (int i = 0; bad[i]; i++) {
        fbt_resp r = fbt_call(&S, "GET", bad[i], a_key, NULL);
        fbt_expect(&r, 400, "bad_query", bad[i]);
        fbt_resp_free(&r);
    }
    fbt_resp r = get_ds(a_key, "Not-Valid");
    fbt_expect(&r, 404, "not_found", "an invalid name reads as absent");
    fbt_resp_free(&r);
}

static void test_delete(void)
{
    /* a queued job trains on up: it can neither be deleted nor changed */
    fbt_resp r = fbt_call(&S, "POST", "/v1/jobs", a_key,
                          "{\"name\": \"uses-up\", \"dataset\": \"up\", \"model\": {\"input\": [2],"
                          " \"layers\": [{\"type\": \"linear\", \"out\": 3}]}, \"batch_size\": 2,"
                          " \"steps\": 10, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}");
    fbt_expect(&r, 201, NULL, "a job on up");
    char job[64];
    snprintf(job, sizeof job, "%s", jstr(r.json, "id"));
    fbt_resp_free(&r);
    char *before = ds_fingerprint();
    r = fbt_call(&S, "DELETE", "/v1/datasets/up", a_key, NULL);
    fbt_expect(&r, 409, "state_conflict", "delete a dataset a queued job uses");
    printf("delete refused: %s\n", err_message(&r));
    CHECK(strstr(err_message(&r), "1 queued, scheduled or running job") != NULL);
    fbt_resp_free(&r);
    r = put_csv(a_key, "up", "more", test_csv);
    fbt_expect(&r, 409, "state_conflict", "upload to a dataset a queued job uses");
    fbt_resp_free(&r);
    char *after = ds_fingerprint();
    CHECK_STR_EQ(after, before);
    free(before);
    free(after);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/datasets/%s/up/manifest.json", S.data_dir, a_id);
    CHECK(exists(dir));
    char path[200];
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", job);
    r = fbt_call(&S, "POST", path, a_key, NULL);
    fbt_expect(&r, 200, NULL, "cancel the job");
    fbt_resp_free(&r);
    r = fbt_call(&S, "DELETE", "/v1/datasets/up", a_key, NULL);
    fbt_expect(&r, 200, NULL, "delete once no job uses it");
    CHECK_STR_EQ(jstr(r.json, "name"), "up");
    fbt_resp_free(&r);
    CHECK(!exists(dir));
    snprintf(dir, sizeof dir, "%s/datasets/%s/up", S.data_dir, a_id);
    CHECK(!exists(dir));
    CHECK(strstr(tenant_entries(a_id), ".delete") == NULL);
    r = get_ds(a_key, "up");
    fbt_expect(&r, 404, "not_found", "a deleted dataset");
    fbt_resp_free(&r);
    r = fbt_call(&S, "DELETE", "/v1/datasets/up", a_key, NULL);
    fbt_expect(&r, 404, "not_found", "delete twice");
    fbt_resp_free(&r);
    /* B's up is untouched */
    json_t *d = wait_done(b_key, "up");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    json_decref(d);
    /* a built-in row goes without touching the built-in's files */
    r = fbt_call(&S, "DELETE", "/v1/datasets/fm", a_key, NULL);
    fbt_expect(&r, 200, NULL, "delete a built-in registration");
    fbt_resp_free(&r);
    char fake[400];
    snprintf(fake, sizeof fake, "%s/builtin/fashion-mnist/train-images-idx3-ubyte.gz", tmp);
    CHECK(exists(fake));
}

static void test_interrupted(void)
{
    /* rows a stopped server left importing, with no import holding them */
    char sql[1200], stage[600];
    snprintf(sql, sizeof sql,
             "INSERT INTO datasets (id, tenant_id, name, source, state, manifest) VALUES"
             " ('11111111-2222-4333-8444-555555555555', '%s', 'lost', 'upload', 'importing',"
             " '{\"importing\": [\"train\"]}'),"
             " ('11111111-2222-4333-8444-666666666666', '%s', 'lost-update', 'upload', 'importing',"
             " '{\"importing\": [\"test\"], \"summary\": {\"dtype\": \"float32\", \"shape\": [2],"
             " \"classes\": 2, \"samples\": 1, \"bytes\": 10, \"splits\": {\"train\": {\"samples\":"
             " 1, \"bytes\": 10}}}}')",
             a_id, a_id);
    PQclear(fbt_sql(&S, sql));
    snprintf(stage, sizeof stage, "%s/datasets/%s/.import-11111111-2222-4333-8444-555555555555",
             S.data_dir, a_id);
    mkdirs(stage);
    json_t *d = wait_done(a_key, "lost");
    CHECK_STR_EQ(jstr(d, "state"), "failed");
    CHECK(strstr(jstr(d, "error"), "interrupted") != NULL);
    json_decref(d);
    CHECK(!exists(stage));
    d = wait_done(a_key, "lost-update");
    CHECK_STR_EQ(jstr(d, "state"), "ready");
    CHECK(strstr(jstr(d, "error"), "as it was before") != NULL);
    CHECK(json_is_null(json_object_get(d, "importing")));
    json_decref(d);
}

/* Restarts the server with other flags (same database and data). */
static void restart(const char *const *flags)
{
    CHECK_INT_EQ(fbt_server_stop(&S), 0);
    fbt_server_start(&S, flags);
}

static void test_flags(void)
{
    char builtin_dir[300], bad_root[300];
    snprintf(builtin_dir, sizeof builtin_dir, "%s/builtin", tmp);
    /* without --import-roots, imports are refused before anything else */
    const char *no_roots[] = {"--builtin-dir", builtin_dir, NULL};
    restart(no_roots);
    char body[800];
    snprintf(body, sizeof body,
             "{\"name\": \"again\", \"source\": \"import\", \"path\": \"%s/fm\", \"format\": "
             "\"idx\"}",
             roots);
    refused_post(a_key, body, 403, "forbidden", a_id);
    fbt_resp r = create(a_key, body);
    CHECK(strstr(err_message(&r), "--import-roots") != NULL);
    fbt_resp_free(&r);
    /* a data tool that cannot run: the import fails, saying so */
    const char *no_tool[] = {"--builtin-dir",
                             builtin_dir,
                             "--import-roots",
                             roots,
                             "--data-tool",
                             "/nonexistent/fusebox-data",
                             NULL};
    restart(no_tool);
    r = create(a_key, body);
    fbt_expect(&r, 202, NULL, "import with a missing data tool");
    fbt_resp_free(&r);
    json_t *d = wait_done(a_key, "again");
    CHECK_STR_EQ(jstr(d, "state"), "failed");
    printf("missing data tool: %s\n", jstr(d, "error"));
    CHECK(strstr(jstr(d, "error"), "could not be executed") != NULL);
    json_decref(d);
    CHECK(strstr(tenant_entries(a_id), "again") == NULL);
    CHECK(strstr(tenant_entries(a_id), ".import") == NULL);
    /* import roots must be absolute: fuseboxd refuses to start otherwise */
    snprintf(bad_root, sizeof bad_root,
             "'%s/server/fuseboxd' --database-url x --import-roots '/ok:relative/dir' 2>&1 | "
             "grep -q 'import-roots'",
             getenv("FB_BINARY_DIR"));
    CHECK_INT_EQ(system(bad_root), 0);
}

/* The import root and what lies around it. */
static void setup_files(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/fbt-ds-XXXXXX");
    CHECK(mkdtemp(tmp) != NULL);
    snprintf(roots, sizeof roots, "%s/roots", tmp);
    char p[400], q[400];
    const char *dirs[] = {
        "roots/fm",   "roots/badmagic", "roots/uneven", "roots/csvdir",          "roots/empty",
        "roots/half", "roots/mixed",    "outside/fm",   "builtin/fashion-mnist", "roots/textdir",
        NULL};
    for (int i = 0; dirs[i]; i++) {
        snprintf(p, sizeof p, "%s/%s", tmp, dirs[i]);
        mkdirs(p);
    }
    snprintf(p, sizeof p, "%s/fm", roots);
    write_idx_pair(p, "train", 50, 50, false, false);
    write_idx_pair(p, "t10k", 20, 20, true, false);
    snprintf(p, sizeof p, "%s/badmagic", roots);
    write_idx_pair(p, "train", 10, 10, false, true);
    snprintf(p, sizeof p, "%s/uneven", roots);
    write_idx_pair(p, "train", 10, 8, false, false);
    snprintf(p, sizeof p, "%s/half", roots);
    write_idx_pair(p, "train", 10, 10, false, false);
    snprintf(p, sizeof p, "%s/half/train-labels-idx1-ubyte", roots);
    CHECK(unlink(p) == 0);
    snprintf(p, sizeof p, "%s/outside/fm", tmp);
    write_idx_pair(p, "train", 10, 10, false, false);
    /* mixed: images inside, labels a link to a file outside */
    snprintf(p, sizeof p, "%s/mixed", roots);
    write_idx_pair(p, "train", 10, 10, false, false);
    snprintf(p, sizeof p, "%s/mixed/train-labels-idx1-ubyte", roots);
    CHECK(unlink(p) == 0);
    snprintf(q, sizeof q, "%s/outside/fm/train-labels-idx1-ubyte", tmp);
    CHECK(symlink(q, p) == 0);
    /* links: one leaving the root, one staying inside it */
    snprintf(p, sizeof p, "%s/escape", roots);
    snprintf(q, sizeof q, "%s/outside/fm", tmp);
    CHECK(symlink(q, p) == 0);
    snprintf(p, sizeof p, "%s/fm-link", roots);
    CHECK(symlink("fm", p) == 0);
    snprintf(p, sizeof p, "%s/outside/secret.csv", tmp);
    write_text(p, "top-secret,label\n1,0\n");
    snprintf(q, sizeof q, "%s/secret.csv", roots);
    CHECK(symlink(p, q) == 0);
    snprintf(p, sizeof p, "%s/iris.csv", roots);
    write_text(p, "sepal,petal,species\n5.1,1.4,0\n7.0,4.7,1\n6.3,6.0,2\n5.0,1.5,0\n");
    snprintf(p, sizeof p, "%s/csvdir/train.csv", roots);
    write_text(p, "5.1,1.4,0\n7.0,4.7,1\n6.3,6.0,2\n5.0,1.5,0\n");
    snprintf(p, sizeof p, "%s/csvdir/test.csv", roots);
    write_text(p, "5.2,1.3,0\n6.9,4.8,1\n");
    snprintf(p, sizeof p, "%s/fox.txt", roots);
    write_text(p, text_body);
    snprintf(p, sizeof p, "%s/textdir/train.txt", roots);
    write_text(p, text_body);
    snprintf(p, sizeof p, "%s/textdir/test.txt", roots);
    write_text(p, "hello world"); /* and a newline after it: 12 bytes */
    snprintf(p, sizeof p, "%s/short.txt", roots);
    write_text(p, "abc");
    /* the built-in's files: registration only looks at them */
    const char *fake[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                          "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", NULL};
    char hundred[100];
    memset(hundred, 'x', sizeof hundred);
    for (int i = 0; fake[i]; i++) {
        snprintf(p, sizeof p, "%s/builtin/fashion-mnist/%s", tmp, fake[i]);
        write_file(p, hundred, sizeof hundred);
    }
}

int main(void)
{
    fbt_require_database();
    setup_files();
    fbt_db_create(&S);
    char builtin_dir[300];
    snprintf(builtin_dir, sizeof builtin_dir, "%s/builtin", tmp);
    const char *flags[] = {"--import-roots", roots, "--builtin-dir", builtin_dir, NULL};
    fbt_server_start(&S, flags);
    fbt_tenant(&S, "alice", "", a_id, sizeof a_id, a_key, sizeof a_key);
    fbt_tenant(&S, "bob", "", b_id, sizeof b_id, b_key, sizeof b_key);
    fbt_tenant(&S, "small", "\"quotas\": {\"max_dataset_bytes\": 1000}", small_id, sizeof small_id,
               small_key, sizeof small_key);
    test_builtin();
    test_bad_bodies();
    test_import_idx();
    test_import_csv();
    test_path_escapes();
    test_import_corrupt();
    test_upload();
    test_text();
    test_quota();
    test_isolation();
    test_list();
    test_delete();
    test_interrupted();
    test_flags();
    CHECK_INT_EQ(fbt_server_stop(&S), 0);
    fbt_db_drop(&S);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0);
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("ok\n");
    return 0;
}
