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
 * torch nn.Sequential through fusebox's training back into torch).  Passes
 * when every Python test passes; prints the server's and worker's logs
 * otherwise.
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

    CHECK_INT_EQ(e2e_kill(worker, SIGTERM), 0);
    e2e_finish(&t);
    printf("ok: the Python package's tests passed against fuseboxd and a worker\n");
    return 0;
}
