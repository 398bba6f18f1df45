/*
 * Dataset and artifact paths cannot escape their directories, tried
 * through the API of a real fuseboxd.
 *
 * Imports: with one import root, every path that leaves it -- "..", "."
 * parts, relative paths, a symbolic link to a directory or to a file
 * outside, a directory whose train.csv is such a link, an absolute path
 * elsewhere, a NUL byte -- is refused with a 4xx; so are dataset names and
 * split names with slashes or dots, in JSON and in upload URLs (escaped
 * too).  Each refusal leaves the database fingerprint and the files under
 * the test's directories unchanged.  The same import from inside the root
 * succeeds, so the refusals are not an artefact of the setup.
 *
 * Downloads: a job's newest checkpoint path is tampered with in the
 * database to point outside the artifacts directory (through "..", an
 * absolute path, a symbolic link or a FIFO planted inside it); GET
 * /v1/jobs/{id}/model answers 404 no_model every time and never sends a
 * byte of the file outside, while an honest path still downloads.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"

#define SECRET "secret,label\n7,1\n8,0\n"
#define GOOD_CSV "x,y\n1,0\n2,1\n3,0\n4,1\n"

static fbt_server S;
static char root[] = "/tmp/fbt-attack-paths-XXXXXX";
static char imports[300], outside[300];
static char t_id[64], t_key[128];
static int tried, refused;

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    CHECK(fclose(f) == 0);
}

/* Every file under dir with its size, as one text (for before/after). */
static void tree(const char *dir, char **out, size_t *len, size_t *cap)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) != 0) continue;
        if (*len + strlen(p) + 64 >= *cap) {
            *cap = *cap * 2 + strlen(p) + 64;
            *out = realloc(*out, *cap);
            CHECK(*out != NULL);
        }
        *len += (size_t)sprintf(*out + *len, "%s:%lld:%o\n", p, (long long)st.st_size,
                                (unsigned)st.st_mode);
        if (S_ISDIR(st.st_mode)) tree(p, out, len, cap);
    }
    closedir(d);
}

static char *snapshot(void)
{
    size_t len = 0, cap = 4096;
    char *out = malloc(cap);
    CHECK(out != NULL);
    out[0] = '\0';
    tree(root, &out, &len, &cap);
    char datasets[400];
    snprintf(datasets, sizeof datasets, "%s/datasets", S.data_dir);
    tree(datasets, &out, &len, &cap);
    size_t fl = strlen(out);
    char *fp = fbt_db_fingerprint(&S);
    out = realloc(out, fl + strlen(fp) + 1);
    CHECK(out != NULL);
    memcpy(out + fl, fp, strlen(fp) + 1);
    free(fp);
    return out;
}

/* Sends a request that must be refused with a 4xx and change nothing. */
static void expect_refused(const char *method, const char *path, const char *body, bool csv,
                           const char *what)
{
    char *before = snapshot();
    fbt_resp r;
    if (csv) {
        char auth[200];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", t_key);
        const char *h[] = {auth, "Content-Type: text/csv", NULL};
        CHECK_INT_EQ(fbt_http(S.port, method, path, h, body, strlen(body), &r), 0);
    } else {
        r = fbt_call(&S, method, path, t_key, body);
    }
    const char *code = json_string_value(json_object_get(json_object_get(r.json, "error"), "code"));
    printf("paths: %-52s %d %s\n", what, r.status, code ? code : "");
    if (r.status < 400 || r.status >= 500 || (r.body && strstr(r.body, "secret,label"))) {
        fprintf(stderr, "%s: %s %s was not refused: %d\n%s\n", what, method, path, r.status,
                r.body ? r.body : "");
        abort();
    }
    fbt_resp_free(&r);
    /* an import that got through would show up here once it ran */
    usleep(100 * 1000);
    char *after = snapshot();
    if (strcmp(before, after) != 0) {
        fprintf(stderr, "%s changed something:\n--- before\n%s\n--- after\n%s\n", what, before,
                after);
        abort();
    }
    free(before);
    free(after);
    tried++;
    refused++;
}

static void import_refused(const char *name, const char *path, const char *what)
{
    json_t *b = json_pack("{s:s, s:s, s:s, s:s, s:s}", "name", name, "source", "import", "path",
                          path, "format", "csv", "label_column", "y");
    char *body = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    expect_refused("POST", "/v1/datasets", body, false, what);
    free(body);
}

static void test_imports(void)
{
    char p[600];
    snprintf(p, sizeof p, "%s/../outside/good.csv", imports);
    import_refused("dotdot", p, "import: root/../outside/good.csv");
    snprintf(p, sizeof p, "%s/./ok.csv", imports);
    import_refused("dot", p, "import: root/./ok.csv");
    snprintf(p, sizeof p, "%s/sub/../ok.csv", imports);
    import_refused("dotdot-inside", p, "import: root/sub/../ok.csv (stays inside)");
    import_refused("relative", "imports/ok.csv", "import: a relative path");
    snprintf(p, sizeof p, "%s/link-dir/good.csv", imports);
    import_refused("linkdir", p, "import: a link to a directory outside");
    snprintf(p, sizeof p, "%s/link.csv", imports);
    import_refused("linkfile", p, "import: a link to a file outside");
    snprintf(p, sizeof p, "%s/trap", imports);
    import_refused("trapdir", p, "import: a directory whose train.csv links out");
    snprintf(p, sizeof p, "%s/good.csv", outside);
    import_refused("outside", p, "import: an absolute path outside the root");
    import_refused("passwd", "/etc/passwd", "import: /etc/passwd");
    import_refused("root", "/", "import: /");
    snprintf(p, sizeof p, "%s/fifo.csv", imports);
    import_refused("fifo", p, "import: a FIFO inside the root");

    /* a NUL byte inside the path, which would cut a C string short */
    char body[900];
    snprintf(body, sizeof body,
             "{\"name\": \"nul\", \"source\": \"import\", \"path\": \"%s/ok.csv\\u0000/../../x\","
             " \"format\": \"csv\", \"label_column\": \"y\"}",
             imports);
    expect_refused("POST", "/v1/datasets", body, false, "import: a NUL byte in the path");

    /* names that would be directories elsewhere */
    static const char *const names[] = {"a/b",  "..",   ".",      "../x",
                                        "x/..", "/abs", "a\\\\b", "%2e%2e"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/ok.csv", imports);
        snprintf(body, sizeof body,
                 "{\"name\": \"%s\", \"source\": \"import\", \"path\": \"%s\", \"format\": \"csv\","
                 " \"label_column\": \"y\"}",
                 names[i], p);
        char what[120];
        snprintf(what, sizeof what, "import named \"%s\"", names[i]);
        expect_refused("POST", "/v1/datasets", body, false, what);
    }
    snprintf(body, sizeof body,
             "{\"name\": \"../up\", \"source\": \"builtin\", \"builtin\": \"mnist\"}");
    expect_refused("POST", "/v1/datasets", body, false, "built-in named \"../up\"");

    /* uploads: the name and the split come from the URL, escaped or not */
    static const char *const uploads[] = {
        "/v1/datasets/..%2Fup/splits/train?label_column=y",
        "/v1/datasets/a%2Fb/splits/train?label_column=y",
        "/v1/datasets/%2e%2e/splits/train?label_column=y",
        "/v1/datasets/ok/splits/..%2F..%2Fup?label_column=y",
        "/v1/datasets/ok/splits/%2e%2e?label_column=y",
        "/v1/datasets/ok/splits/.?label_column=y",
        "/v1/datasets/ok/splits/train%00.csv?label_column=y",
        "/v1/datasets/ok%00x/splits/train?label_column=y",
    };
    for (size_t i = 0; i < sizeof uploads / sizeof uploads[0]; i++) {
        char what[160];
        snprintf(what, sizeof what, "upload %.140s", uploads[i]);
        expect_refused("PUT", uploads[i], GOOD_CSV, true, what);
    }

    /* the control: the same import from inside the root works */
    json_t *b = json_pack("{s:s, s:s, s:s, s:s, s:s}", "name", "fine", "source", "import", "path",
                          "", "format", "csv", "label_column", "y");
    snprintf(p, sizeof p, "%s/ok.csv", imports);
    json_object_set_new(b, "path", json_string(p));
    char *text = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    fbt_resp r = fbt_call(&S, "POST", "/v1/datasets", t_key, text);
    free(text);
    fbt_expect(&r, 202, NULL, "the import from inside the root");
    fbt_resp_free(&r);
    const char *state = "";
    for (int i = 0; i < 300; i++) {
        state = fbt_sql_value(&S, "SELECT state FROM datasets WHERE name = 'fine'");
        if (strcmp(state, "importing") != 0) break;
        usleep(50 * 1000);
    }
    CHECK_STR_EQ(state, "ready");
    printf("paths: the import from inside the root is ready\n");
}

static void test_downloads(void)
{
    char job[64], path[600], artifacts[400];
    snprintf(job, sizeof job, "%s", fbt_job(&S, t_key, "tampered"));
    snprintf(artifacts, sizeof artifacts, "%s/artifacts", S.data_dir);
    char secret[400];
    snprintf(secret, sizeof secret, "%s/secret.bin", outside);
    write_text(secret, SECRET);
    snprintf(path, sizeof path, "%s/escape", artifacts);
    CHECK(symlink(outside, path) == 0);
    snprintf(path, sizeof path, "%s/escape-file", artifacts);
    CHECK(symlink(secret, path) == 0);
    /* a FIFO inside the directory: opening it for reading would block the
     * HTTP thread until a writer came */
    snprintf(path, sizeof path, "%s/model.fifo", artifacts);
    CHECK(mkfifo(path, 0600) == 0);
    char updots[600];
    snprintf(updots, sizeof updots, "../../../../../../../../..%s", secret);
    const char *tampered[] = {updots,
                              secret,
                              "escape/secret.bin",
                              "escape-file",
                              "x/../../outside/secret.bin",
                              "./escape/secret.bin",
                              "escape//secret.bin",
                              "model.fifo",
                              "",
                              "."};
    char url[200];
    snprintf(url, sizeof url, "/v1/jobs/%s/model", job);
    for (size_t i = 0; i < sizeof tampered / sizeof tampered[0]; i++) {
        char *lit = PQescapeLiteral(S.sql, tampered[i], strlen(tampered[i]));
        CHECK(lit != NULL);
        char sql[1200];
        snprintf(sql, sizeof sql,
                 "INSERT INTO checkpoints (job_id, step, path, bytes, is_final)"
                 " VALUES ('%s', %zu, %s, 10, true)",
                 job, 100 + i, lit);
        PQfreemem(lit);
        PQclear(fbt_sql(&S, sql));
        fbt_resp r = fbt_call(&S, "GET", url, t_key, NULL);
        printf("paths: model at \"%.60s\": %d\n", tampered[i], r.status);
        if (r.body && strstr(r.body, "secret,label")) {
            fprintf(stderr, "the model download sent the file outside (%s)\n", tampered[i]);
            abort();
        }
        fbt_expect(&r, 404, "no_model", "a tampered model path");
        fbt_resp_free(&r);
        tried++;
        refused++;
    }
    /* the control: an honest path inside downloads */
    snprintf(path, sizeof path, "%s/honest", artifacts);
    CHECK(mkdir(path, 0700) == 0);
    snprintf(path, sizeof path, "%s/honest/model.safetensors", artifacts);
    write_text(path, "honest bytes");
    char sql[400];
    snprintf(sql, sizeof sql,
             "INSERT INTO checkpoints (job_id, step, path, bytes, is_final)"
             " VALUES ('%s', 1000, 'honest/model.safetensors', 12, true)",
             job);
    PQclear(fbt_sql(&S, sql));
    fbt_resp r = fbt_call(&S, "GET", url, t_key, NULL);
    fbt_expect(&r, 200, NULL, "an honest model path");
    CHECK_STR_EQ(r.body, "honest bytes");
    fbt_resp_free(&r);
    printf("paths: the honest model downloads\n");
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    fbt_require_database();
    CHECK(mkdtemp(root) != NULL);
    char p[600], q[600];
    snprintf(imports, sizeof imports, "%s/imports", root);
    snprintf(outside, sizeof outside, "%s/outside", root);
    CHECK(mkdir(imports, 0755) == 0);
    CHECK(mkdir(outside, 0755) == 0);
    snprintf(p, sizeof p, "%s/ok.csv", imports);
    write_text(p, GOOD_CSV);
    snprintf(p, sizeof p, "%s/sub", imports);
    CHECK(mkdir(p, 0755) == 0);
    snprintf(p, sizeof p, "%s/good.csv", outside);
    write_text(p, SECRET);
    snprintf(p, sizeof p, "%s/link-dir", imports);
    CHECK(symlink(outside, p) == 0);
    snprintf(p, sizeof p, "%s/link.csv", imports);
    snprintf(q, sizeof q, "%s/good.csv", outside);
    CHECK(symlink(q, p) == 0);
    snprintf(p, sizeof p, "%s/trap", imports);
    CHECK(mkdir(p, 0755) == 0);
    snprintf(p, sizeof p, "%s/trap/train.csv", imports);
    CHECK(symlink(q, p) == 0);
    snprintf(p, sizeof p, "%s/fifo.csv", imports);
    CHECK(mkfifo(p, 0600) == 0);

    fbt_db_create(&S);
    const char *extra[] = {"--import-roots", imports, NULL};
    fbt_server_start(&S, extra);
    fbt_tenant(&S, "paths", "", t_id, sizeof t_id, t_key, sizeof t_key);
    test_imports();
    test_downloads();
    printf("paths: %d escapes tried, %d refused, 0 files read or written outside\n", tried,
           refused);
    CHECK_INT_EQ(fbt_server_stop(&S), 0);
    fbt_db_drop(&S);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("ok\n");
    return 0;
}
