/*
 * The Python package (python/fusebox) against a real fuseboxd and worker.
 *
 * Starts fuseboxd on a fresh database of the test PostgreSQL and one CPU
 * worker (tests/dispatch/e2e.h: the public dataset "synth" in the worker's
 * data directory, a tenant and its key), links Debian's Fashion-MNIST into
 * the worker's data directory, then runs
 *
 *     python3 -m unittest discover -s tests/python -p 'test_*.py'
 *
 * with FUSEBOX_URL, FUSEBOX_KEY and the repository's python/ on PYTHONPATH,
 * so the tests use the package exactly as a user does: test_model.py (no
 * server: to_torch, from_torch, load, bad input) and test_client.py (the
 * client and the command line on this server, with a round trip from a
 * torch nn.Sequential through fusebox's training back into torch); then the
 * python blocks of README.md's "Quick start with Python", which must run to
 * the end and leave the downloaded model.  Passes when all of it does;
 * prints the server's and worker's logs otherwise.
 *
 * Skipped (77) without FUSEBOX_TEST_DATABASE_URL or Debian's
 * dataset-fashion-mnist (scripts/test installs both; torch too, whose
 * absence fails the Python tests).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "e2e.h"

#define FASHION_MNIST "/usr/share/datasets/fashion-mnist"
#define QUICK_START "Quick start with Python" /* the README's section that is run */

/* The python blocks of README.md's "Quick start with Python", run in one python3 in a
 * scratch directory, on this server; returns the problems (printed). */
static int readme_quick_start(const char *src)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/README.md", src);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *sec = strstr(text, "\n## " QUICK_START "\n");
    if (!sec) {
        fprintf(stderr, "FAIL: README.md has no section \"## %s\"\n", QUICK_START);
        return 1;
    }
    sec += 1;
    const char *end = strstr(sec + 3, "\n## ");
    if (!end) end = sec + strlen(sec);
    char scratch[] = "/tmp/fb-py-readme-XXXXXX";
    CHECK(mkdtemp(scratch) != NULL);
    char script[200];
    snprintf(script, sizeof script, "%s/quick_start.py", scratch);
    FILE *out = fopen(script, "w");
    CHECK(out != NULL);
    int blocks = 0;
    for (const char *p = strstr(sec, "```python\n"); p && p < end;
         p = strstr(p, "```python\n")) {
        p += strlen("```python\n");
        const char *close = strstr(p, "\n```");
        CHECK(close != NULL && close < end);
        fwrite(p, 1, (size_t)(close - p + 1), out);
        blocks++;
        p = close + 4;
    }
    CHECK(fclose(out) == 0);
    if (blocks == 0) {
        fprintf(stderr, "FAIL: README.md's \"%s\" has no python block\n", QUICK_START);
        return 1;
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cd '%s' && /usr/bin/python3 quick_start.py", scratch);
    int rc = system(cmd);
    snprintf(path, sizeof path, "%s/model.safetensors", scratch);
    struct stat st;
    int problems = 0;
    if (rc != 0) {
        fprintf(stderr, "FAIL: README.md's Python quick start exited with status %d\n", rc);
        problems++;
    } else if (stat(path, &st) != 0 || st.st_size < 64) {
        fprintf(stderr, "FAIL: README.md's Python quick start left no model.safetensors\n");
        problems++;
    }
    printf("README.md's Python quick start: %d block%s, status %d\n", blocks,
           blocks == 1 ? "" : "s", rc);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
    CHECK(system(cmd) == 0);
    return problems;
}

int main(void)
{
    const char *src = getenv("FB_SOURCE_DIR");
    CHECK(src != NULL && src[0]);
    fbt_require_database();
    struct stat st;
    if (stat(FASHION_MNIST, &st) != 0) {
        printf("SKIP: the round trip trains on %s (Debian's dataset-fashion-mnist)\n",
               FASHION_MNIST);
        return FB_TEST_SKIP;
    }

    static e2e t;
    e2e_start(&t, NULL);
    /* fashion-mnist is public; the worker finds it in its data directory */
    char link[400];
    snprintf(link, sizeof link, "%s/fashion-mnist", t.data_dir);
    CHECK(symlink(FASHION_MNIST, link) == 0);
    pid_t worker = e2e_worker(&t, "python-cpu");

    char url[64], pythonpath[1200];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", t.s.port);
    snprintf(pythonpath, sizeof pythonpath, "%s/python", src);
    CHECK(setenv("FUSEBOX_URL", url, 1) == 0);
    CHECK(setenv("FUSEBOX_KEY", t.key, 1) == 0);
    CHECK(setenv("PYTHONPATH", pythonpath, 1) == 0);
    CHECK(setenv("FASHION_MNIST", FASHION_MNIST, 1) == 0);
    CHECK(setenv("PYTHONDONTWRITEBYTECODE", "1", 1) == 0); /* no __pycache__ in the tree */
    /* one thread: the worker and the test share the machine */
    CHECK(setenv("OMP_NUM_THREADS", "1", 1) == 0);

    char cmd[2600];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && /usr/bin/python3 -W error::ResourceWarning -m unittest discover -v "
             "-s tests/python -p 'test_*.py'",
             src);
    double t0 = fbt_now_ms();
    int rc = system(cmd);
    printf("the Python tests ran in %.1f s (status %d)\n", (fbt_now_ms() - t0) / 1000.0, rc);
    if (rc != 0) e2e_dump(&t);
    CHECK_INT_EQ(rc, 0);

    CHECK_INT_EQ(readme_quick_start(src), 0);

    CHECK_INT_EQ(e2e_kill(worker, SIGTERM), 0);
    e2e_finish(&t);
    printf("ok: the Python package's tests passed against fuseboxd and a worker\n");
    return 0;
}
