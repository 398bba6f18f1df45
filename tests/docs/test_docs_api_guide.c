/*
 * docs/api-guide.md as a test.  The guide gives each endpoint a heading
 * "### `METHOD /path` → STATUS" followed by sh blocks that call it with
 * curl.  This test
 *
 * 1. requires every operation of api/openapi.yaml to have such a heading,
 *    and every heading to name an operation that exists;
 * 2. starts fuseboxd on a fresh database of the test PostgreSQL and a CPU
 *    worker (tests/dispatch/e2e.h), runs every sh block of the guide in
 *    order in one shell, with the guide's own preamble setting the
 *    variables, and records each curl call's status, method and URL through
 *    a .curlrc of the test's own (CURL_HOME), so the examples run exactly as
 *    a reader would type them;
 * 3. requires each call to a heading's endpoint inside its blocks to answer
 *    the heading's status, every other call to succeed (2xx), every heading
 *    to have at least one call, and the shell to run to the end;
 * 4. runs the sh blocks of README.md's "Quick start with curl" the same way
 *    in a shell of their own, and requires them to succeed and leave the
 *    downloaded model behind.
 *
 * Skipped (77) without FUSEBOX_TEST_DATABASE_URL, curl, jq, or Debian's
 * dataset-fashion-mnist, which the guide's jobs train on.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "e2e.h"

#define MAX_BLOCKS 128
#define MAX_OPS 128
#define FASHION_MNIST "/usr/share/datasets/fashion-mnist"
#define QUICK_START "Quick start with curl" /* the README's section that is run */
#define ARROW "\xe2\x86\x92"                /* U+2192, as the guide's headings write it */

typedef struct endpoint {
    char method[8];
    char path[160];
    int status; /* the documented status; 0 for an operation of openapi.yaml */
} endpoint;

typedef struct block {
    char *code;
    char section[80]; /* the "## " heading the block stands under */
    bool is_endpoint;
    endpoint ep;
    int line; /* of the block's opening fence in the guide, for messages */
} block;

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        CHECK(0);
    }
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    CHECK(n >= 0 && fseek(f, 0, SEEK_SET) == 0);
    char *s = malloc((size_t)n + 1);
    CHECK(s != NULL);
    CHECK(fread(s, 1, (size_t)n, f) == (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

/* The next line of *p (without its newline) into buf; false at the end. */
static bool next_line(const char **p, char *buf, size_t cap)
{
    if (!**p) return false;
    const char *e = strchr(*p, '\n');
    size_t n = e ? (size_t)(e - *p) : strlen(*p);
    snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), *p);
    *p += n + (e ? 1 : 0);
    return true;
}

/* "### `GET /v1/jobs/{id}` → 200 ..." into ep; false for any other line. */
static bool parse_heading(const char *line, endpoint *ep)
{
    if (strncmp(line, "### `", 5) != 0) return false;
    const char *m = line + 5, *sp = strchr(m, ' ');
    if (!sp || sp - m >= (long)sizeof ep->method) return false;
    const char *end = strchr(sp + 1, '`');
    if (!end || end - (sp + 1) >= (long)sizeof ep->path || sp[1] != '/') return false;
    if (strncmp(end + 1, " " ARROW " ", strlen(ARROW) + 2) != 0) return false;
    int status = atoi(end + 1 + strlen(ARROW) + 2);
    if (status < 100 || status > 599) return false;
    snprintf(ep->method, sizeof ep->method, "%.*s", (int)(sp - m), m);
    snprintf(ep->path, sizeof ep->path, "%.*s", (int)(end - (sp + 1)), sp + 1);
    ep->status = status;
    return true;
}

/* The sh blocks of the guide, each with the endpoint heading it stands
 * under (if the nearest heading above it is one). */
static int parse_guide(const char *text, block *b, int cap)
{
    char line[1024];
    const char *p = text;
    int n = 0, lineno = 0;
    bool in_sh = false, in_other = false;
    endpoint cur = {0};
    bool cur_is_ep = false;
    char section[80] = "";
    size_t len = 0, room = 0;
    char *code = NULL;
    while (next_line(&p, line, sizeof line)) {
        lineno++;
        if (in_sh) {
            if (strcmp(line, "```") == 0) {
                CHECK(n < cap);
                b[n].code = code;
                b[n].is_endpoint = cur_is_ep;
                snprintf(b[n].section, sizeof b[n].section, "%s", section);
                b[n].ep = cur;
                n++;
                code = NULL;
                in_sh = false;
                continue;
            }
            size_t l = strlen(line);
            if (len + l + 2 > room) {
                room = (len + l + 2) * 2;
                code = realloc(code, room);
                CHECK(code != NULL);
            }
            memcpy(code + len, line, l);
            len += l;
            code[len++] = '\n';
            code[len] = '\0';
            continue;
        }
        if (in_other) {
            if (strncmp(line, "```", 3) == 0) in_other = false;
            continue;
        }
        if (strcmp(line, "```sh") == 0) {
            in_sh = true;
            len = 0;
            room = 256;
            code = malloc(room);
            CHECK(code != NULL);
            code[0] = '\0';
            b[n < cap ? n : cap - 1].line = lineno;
            continue;
        }
        if (strncmp(line, "```", 3) == 0) {
            in_other = true;
            continue;
        }
        if (strncmp(line, "## ", 3) == 0) snprintf(section, sizeof section, "%s", line + 3);
        if (line[0] == '#') cur_is_ep = parse_heading(line, &cur);
    }
    CHECK(!in_sh); /* an unclosed block would silently drop the rest */
    return n;
}

/* The operations of openapi.yaml: a path at two spaces of indent, its
 * methods at four. */
static int parse_openapi(const char *text, endpoint *ops, int cap)
{
    static const char *const methods[] = {"get", "post", "put", "patch", "delete"};
    char line[1024], path[160] = "";
    const char *p = text;
    bool in_paths = false;
    int n = 0;
    while (next_line(&p, line, sizeof line)) {
        if (line[0] != ' ' && line[0] != '\0') in_paths = strcmp(line, "paths:") == 0;
        if (!in_paths) continue;
        if (strncmp(line, "  /", 3) == 0) {
            char *colon = strrchr(line, ':');
            CHECK(colon != NULL);
            *colon = '\0';
            snprintf(path, sizeof path, "%s", line + 2);
            continue;
        }
        for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
            char want[32];
            snprintf(want, sizeof want, "    %s:", methods[i]);
            if (strcmp(line, want) == 0 && path[0]) {
                CHECK(n < cap);
                for (size_t k = 0; methods[i][k] && k < sizeof ops[n].method - 1; k++)
                    ops[n].method[k] = (char)(methods[i][k] - 'a' + 'A');
                ops[n].method[strlen(methods[i])] = '\0';
                snprintf(ops[n].path, sizeof ops[n].path, "%s", path);
                ops[n].status = 0;
                n++;
            }
        }
    }
    return n;
}

/* Whether a request path matches an OpenAPI path template, where each
 * {param} stands for one non-empty segment. */
static bool path_matches(const char *tmpl, const char *path)
{
    while (*tmpl && *path) {
        if (*tmpl == '{') {
            const char *te = strchr(tmpl, '}');
            if (!te) return false;
            size_t seg = strcspn(path, "/");
            if (seg == 0) return false;
            tmpl = te + 1;
            path += seg;
            continue;
        }
        if (*tmpl != *path) return false;
        tmpl++;
        path++;
    }
    return *tmpl == '\0' && *path == '\0';
}

/* Every operation has a heading and every heading an operation. */
static int check_coverage(const endpoint *ops, int n_ops, const block *b, int n_blocks)
{
    int problems = 0;
    for (int i = 0; i < n_ops; i++) {
        bool found = false;
        for (int k = 0; k < n_blocks && !found; k++)
            found = b[k].is_endpoint && strcmp(b[k].ep.method, ops[i].method) == 0 &&
                    strcmp(b[k].ep.path, ops[i].path) == 0;
        if (!found) {
            fprintf(stderr, "FAIL: %s %s of openapi.yaml has no example in the guide\n",
                    ops[i].method, ops[i].path);
            problems++;
        }
    }
    for (int k = 0; k < n_blocks; k++) {
        if (!b[k].is_endpoint) continue;
        bool found = false;
        for (int i = 0; i < n_ops && !found; i++)
            found = strcmp(b[k].ep.method, ops[i].method) == 0 &&
                    strcmp(b[k].ep.path, ops[i].path) == 0;
        if (!found) {
            fprintf(stderr, "FAIL: the guide's heading %s %s (line %d) is not in openapi.yaml\n",
                    b[k].ep.method, b[k].ep.path, b[k].line);
            problems++;
        }
    }
    return problems;
}

static bool have(const char *program)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", program);
    return system(cmd) == 0;
}

static void write_script(const char *path, const char *work, const block *b, int n)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fprintf(f, "set -eu\ncd '%s'\n", work);
    for (int i = 0; i < n; i++) {
        fprintf(f, "printf 'FBT-BLOCK %d\\n' >&2\n", i);
        fputs(b[i].code, f);
    }
    fprintf(f, "printf 'FBT-END\\n' >&2\n");
    CHECK(fclose(f) == 0);
}

/* Checks the record of one run (lines "FBT-BLOCK i", "FBT <status>
 * <method> <url>", "FBT-END") against the blocks; returns the problems,
 * which it prints unless quiet (the self-test's planted ones). */
static int check_log(const char *log, const block *b, int n, bool quiet)
{
    char line[2048];
    const char *p = log;
    int cur = -1, problems = 0;
    bool ended = false;
    int *hits = calloc((size_t)n, sizeof *hits);
    CHECK(hits != NULL);
    while (next_line(&p, line, sizeof line)) {
        int i;
        if (sscanf(line, "FBT-BLOCK %d", &i) == 1) {
            CHECK(i == cur + 1 && i < n);
            cur = i;
            continue;
        }
        if (strcmp(line, "FBT-END") == 0) {
            ended = true;
            continue;
        }
        int status;
        char method[16], url[1024];
        if (strncmp(line, "FBT ", 4) != 0 ||
            sscanf(line, "FBT %d %15s %1023s", &status, method, url) != 3)
            continue;
        CHECK(cur >= 0);
        /* the path of the URL, without scheme, host or query */
        const char *path = strstr(url, "://");
        path = path ? strchr(path + 3, '/') : NULL;
        char pbuf[1024];
        snprintf(pbuf, sizeof pbuf, "%s", path ? path : "/");
        pbuf[strcspn(pbuf, "?#")] = '\0';
        const block *bk = &b[cur];
        if (bk->is_endpoint && strcmp(method, bk->ep.method) == 0 &&
            path_matches(bk->ep.path, pbuf)) {
            hits[cur]++;
            if (status != bk->ep.status) {
                if (!quiet)
                    fprintf(stderr, "FAIL: line %d: %s %s answered %d, the guide says %d\n",
                            bk->line, method, pbuf, status, bk->ep.status);
                problems++;
            }
        } else if (status < 200 || status > 299) {
            if (!quiet)
                fprintf(stderr, "FAIL: line %d: %s %s answered %d\n", bk->line, method, pbuf,
                        status);
            problems++;
        }
    }
    if (!ended) {
        if (!quiet)
            fprintf(stderr, "FAIL: the shell stopped in the block of line %d\n",
                    cur >= 0 ? b[cur].line : 0);
        problems++;
    }
    /* blocks after the one the shell stopped in never ran: no use listing them */
    int last = ended ? n - 1 : cur;
    for (int i = 0; i <= last; i++)
        if (b[i].is_endpoint && hits[i] == 0) {
            if (!quiet)
                fprintf(stderr, "FAIL: line %d: the example never calls %s %s\n", b[i].line,
                        b[i].ep.method, b[i].ep.path);
            problems++;
        }
    free(hits);
    return problems;
}

/*
 * Runs blocks in order in one sh, in the directory scratch/name, with every
 * curl call recorded (CURL_HOME is set by the caller), and checks the record
 * (check_log).  Prints the shell's output and the logs on failure; returns
 * the number of problems.
 */
static int run_blocks(e2e *t, const char *scratch, const char *name, const block *b, int n)
{
    char work[200], script[200], log[200], out[200], cmd[800];
    snprintf(work, sizeof work, "%s/%s", scratch, name);
    snprintf(script, sizeof script, "%s/%s.sh", scratch, name);
    snprintf(log, sizeof log, "%s/%s-calls.log", scratch, name);
    snprintf(out, sizeof out, "%s/%s-stdout.log", scratch, name);
    CHECK(mkdir(work, 0755) == 0);
    write_script(script, work, b, n);
    snprintf(cmd, sizeof cmd, "sh '%s' >'%s' 2>'%s'", script, out, log);
    double t0 = fbt_now_ms();
    int rc = system(cmd);
    printf("%s: %d blocks ran in %.1f s (shell status %d)\n", name, n, (fbt_now_ms() - t0) / 1000.0,
           rc);
    char *calls = slurp(log);
    int problems = check_log(calls, b, n, false);
    if (rc != 0 && problems == 0) {
        fprintf(stderr, "FAIL: %s: the shell exited with status %d\n", name, rc);
        problems++;
    }
    if (problems) {
        char *o = slurp(out);
        fprintf(stderr, "== %s: the shell's output\n%s\n== its calls and errors\n%s\n", name, o,
                calls);
        free(o);
        e2e_dump(t);
    }
    free(calls);
    return problems;
}

static void self_test(void)
{
    CHECK(path_matches("/v1/jobs/{id}", "/v1/jobs/0b5c"));
    CHECK(!path_matches("/v1/jobs/{id}", "/v1/jobs/0b5c/cancel"));
    CHECK(!path_matches("/v1/jobs/{id}", "/v1/jobs/"));
    CHECK(path_matches("/v1/tenants/{id}/keys/{key_id}", "/v1/tenants/a/keys/b"));
    CHECK(!path_matches("/v1/tenant", "/v1/tenants"));
    endpoint ep;
    CHECK(parse_heading("### `POST /v1/jobs` " ARROW " 201", &ep));
    CHECK_STR_EQ(ep.method, "POST");
    CHECK_STR_EQ(ep.path, "/v1/jobs");
    CHECK_INT_EQ(ep.status, 201);
    CHECK(!parse_heading("### POST /v1/jobs " ARROW " 201", &ep));
    CHECK(!parse_heading("## `POST /v1/jobs` " ARROW " 201", &ep));
    /* a planted record: a wrong status, a failing side call, a block that
     * never calls its endpoint, and a shell that stopped early */
    block b[3] = {
        {.code = "", .is_endpoint = true, .ep = {"GET", "/v1/jobs/{id}", 200}, .line = 10},
        {.code = "", .is_endpoint = true, .ep = {"POST", "/v1/jobs", 201}, .line = 20},
        {.code = "", .is_endpoint = false, .line = 30},
    };
    const char *bad = "FBT-BLOCK 0\nFBT 404 GET http://h:1/v1/jobs/x?a=b\n"
                      "FBT-BLOCK 1\nFBT 500 GET http://h:1/v1/jobs\n";
    CHECK_INT_EQ(check_log(bad, b, 3, true), 4);
    const char *good =
        "FBT-BLOCK 0\nFBT 200 GET http://h:1/v1/jobs/x?a=b\n"
        "FBT-BLOCK 1\nFBT 200 GET http://h:1/v1/jobs\nFBT 201 POST http://h:1/v1/jobs\n"
        "FBT-BLOCK 2\nFBT-END\n";
    CHECK_INT_EQ(check_log(good, b, 3, true), 0);
}

int main(void)
{
    self_test();
    const char *src = getenv("FB_SOURCE_DIR");
    CHECK(src != NULL && src[0]);
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/api-guide.md", src);
    char *guide = slurp(path);
    snprintf(path, sizeof path, "%s/api/openapi.yaml", src);
    char *yaml = slurp(path);
    static block blocks[MAX_BLOCKS];
    static endpoint ops[MAX_OPS];
    int n_blocks = parse_guide(guide, blocks, MAX_BLOCKS);
    int n_ops = parse_openapi(yaml, ops, MAX_OPS);
    /* a parser that finds nothing would make the coverage check vacuous */
    CHECK(n_ops >= 10);
    CHECK(n_blocks >= n_ops);
    int problems = check_coverage(ops, n_ops, blocks, n_blocks);
    free(guide);
    free(yaml);
    if (problems) return 1;
    printf("the guide has an example for each of the %d operations of openapi.yaml\n", n_ops);

    fbt_require_database();
    struct stat st;
    if (!have("curl") || !have("jq") || stat(FASHION_MNIST, &st) != 0) {
        printf("SKIP: the guide's examples need curl, jq and %s\n", FASHION_MNIST);
        return FB_TEST_SKIP;
    }

    /* the import root must exist before fuseboxd checks its flags */
    char scratch[] = "/tmp/fb-guide-XXXXXX";
    CHECK(mkdtemp(scratch) != NULL);
    char imports[128], curlhome[128], rc_path[160];
    snprintf(imports, sizeof imports, "%s/import", scratch);
    snprintf(curlhome, sizeof curlhome, "%s/curl", scratch);
    CHECK(mkdir(imports, 0755) == 0 && mkdir(curlhome, 0755) == 0);
    const char *flags[] = {"--import-roots", imports, NULL};
    static e2e t;
    e2e_start(&t, flags);
    /* the worker finds the built-in as the guide's preamble tells readers to arrange it */
    char link[400];
    snprintf(link, sizeof link, "%s/fashion-mnist", t.data_dir);
    CHECK(symlink(FASHION_MNIST, link) == 0);
    pid_t worker = e2e_worker(&t, "guide-cpu");

    snprintf(rc_path, sizeof rc_path, "%s/.curlrc", curlhome);
    e2e_write(rc_path, "write-out = \"%{stderr}FBT %{http_code} %{method} %{url_effective}\\n\"\n");
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", t.s.port);
    CHECK(setenv("FUSEBOX_URL", url, 1) == 0);
    CHECK(setenv("FUSEBOX_DATA_DIR", t.s.data_dir, 1) == 0);
    CHECK(setenv("IMPORTS", imports, 1) == 0);
    CHECK(setenv("CURL_HOME", curlhome, 1) == 0);
    /* the guide's reader has the programs installed ("Before you start"): fusebox-worker
     * --gen-key makes a node's keypair */
    char path_env[2048];
    snprintf(path_env, sizeof path_env, "%s/workers:%s", getenv("FB_BINARY_DIR"),
             getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    CHECK(setenv("PATH", path_env, 1) == 0);
    problems = run_blocks(&t, scratch, "guide", blocks, n_blocks);

    /* the README's quick start, in a shell of its own, on the same server */
    snprintf(path, sizeof path, "%s/README.md", src);
    char *readme = slurp(path);
    static block rblocks[MAX_BLOCKS];
    int n_all = parse_guide(readme, rblocks, MAX_BLOCKS), n_quick = 0;
    free(readme);
    for (int i = 0; i < n_all; i++) {
        if (strcmp(rblocks[i].section, QUICK_START) == 0)
            rblocks[n_quick++] = rblocks[i];
        else
            free(rblocks[i].code);
    }
    if (n_quick == 0) {
        fprintf(stderr, "FAIL: README.md has no sh block under \"## %s\"\n", QUICK_START);
        problems++;
    } else {
        problems += run_blocks(&t, scratch, "readme", rblocks, n_quick);
        /* its last step downloads the model */
        snprintf(path, sizeof path, "%s/readme/model.safetensors", scratch);
        if (problems == 0 && (stat(path, &st) != 0 || st.st_size < 64)) {
            fprintf(stderr, "FAIL: the README's quick start left no model.safetensors\n");
            problems++;
        }
    }
    for (int i = 0; i < n_blocks; i++)
        free(blocks[i].code);
    for (int i = 0; i < n_quick; i++)
        free(rblocks[i].code);
    CHECK_INT_EQ(problems, 0);

    CHECK_INT_EQ(e2e_kill(worker, SIGTERM), 0);
    e2e_finish(&t);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
    CHECK(system(cmd) == 0);
    printf("ok: every example of the guide answered its documented status, and the README's "
           "quick start ran\n");
    return 0;
}
