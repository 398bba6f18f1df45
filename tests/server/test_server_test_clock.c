/*
 * fuseboxd's --test-clock (docs/configuration.md): refused unless the
 * environment has FUSEBOX_TEST_HOOKS=1 exactly, whichever way it is asked for
 * (flag or FUSEBOX_TEST_CLOCK); with it, a clock file that is missing, not a
 * regular file of 8 bytes, or holds a negative time stops fuseboxd at start
 * with exit status 2 and a message naming the flag and the file.  A good
 * clock file is accepted: fuseboxd goes on to look for PostgreSQL (at an
 * address where none answers, with no start-up wait), which is the next
 * thing it does and fails with exit status 1.  No database needed.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"

/* Runs fuseboxd with the flags of argv_extra (NULL-terminated) and the environment
 * assignments of env (NULL-terminated, "NAME=VALUE" or "NAME" to unset) and its data
 * directory in data_dir, output into out (cap bytes); returns its exit status. */
static int run_fuseboxd(const char *data_dir, const char *const *argv_extra, const char *const *env,
                        char *out, size_t cap)
{
    const char *bin = getenv("FB_BINARY_DIR");
    CHECK(bin != NULL && bin[0]);
    char exe[512];
    snprintf(exe, sizeof exe, "%s/server/fuseboxd", bin);
    char log[] = "/tmp/fb-test-clock-out-XXXXXX";
    int fd = mkstemp(log);
    CHECK(fd >= 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        unsetenv("FUSEBOX_TEST_HOOKS");
        unsetenv("FUSEBOX_TEST_CLOCK");
        for (int i = 0; env && env[i]; i++) {
            char name[64];
            const char *eq = strchr(env[i], '=');
            size_t n = eq ? (size_t)(eq - env[i]) : strlen(env[i]);
            snprintf(name, sizeof name, "%.*s", (int)n, env[i]);
            if (eq)
                setenv(name, eq + 1, 1);
            else
                unsetenv(name);
        }
        const char *argv[32] = {
            exe,          "--database-url", "postgresql://127.0.0.1:1/none", "--startup-wait", "0",
            "--data-dir", data_dir};
        int k = 7;
        for (int i = 0; argv_extra && argv_extra[i] && k < 31; i++)
            argv[k++] = argv_extra[i];
        argv[k] = NULL;
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    ssize_t n = pread(fd, out, cap - 1, 0);
    out[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(log);
    CHECK(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(b, 1, n, f) == n);
    CHECK(fclose(f) == 0);
}

int main(void)
{
    char dir[] = "/tmp/fb-test-clock-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char good[300], shorter[300], negative[300], missing[300], data[300];
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(good, sizeof good, "%s/clock", dir);
    snprintf(shorter, sizeof shorter, "%s/short", dir);
    snprintf(negative, sizeof negative, "%s/negative", dir);
    snprintf(missing, sizeof missing, "%s/missing", dir);
    char msg[256];
    fb_clock_file *c = fb_clock_file_create(good, (int64_t)1000 * 1000000000, msg, sizeof msg);
    CHECK(c != NULL);
    write_bytes(shorter, "1234", 4);
    unsigned char neg[8];
    memset(neg, 0xff, sizeof neg); /* -1 in little-endian two's complement */
    write_bytes(negative, neg, sizeof neg);
    char env_good[340], env_missing[340];
    snprintf(env_good, sizeof env_good, "FUSEBOX_TEST_CLOCK=%s", good);
    snprintf(env_missing, sizeof env_missing, "FUSEBOX_TEST_CLOCK=%s", missing);

    static const char refused[] = "is for tests only and needs FUSEBOX_TEST_HOOKS=1 in the "
                                  "environment; refusing to start";
    static const char unreachable[] = "cannot reach PostgreSQL";
    struct {
        const char *flag_value; /* --test-clock's, NULL: none */
        const char *env[3];
        int status;
        const char *says;  /* in the output */
        const char *names; /* in the output too (NULL: nothing more) */
    } cases[] = {
        /* refused without the hooks, whichever way it is asked for */
        {good, {NULL}, 2, refused, "--test-clock is for tests only"},
        {NULL, {env_good, NULL}, 2, refused, "FUSEBOX_TEST_CLOCK is for tests only"},
        {good, {"FUSEBOX_TEST_HOOKS=0", NULL}, 2, refused, NULL},
        {good, {"FUSEBOX_TEST_HOOKS=yes", NULL}, 2, refused, NULL},
        {good, {"FUSEBOX_TEST_HOOKS=", NULL}, 2, refused, NULL},
        {good, {"FUSEBOX_TEST_HOOKS=1 ", NULL}, 2, refused, NULL},
        {good, {"FUSEBOX_TEST_HOOKS=11", NULL}, 2, refused, NULL},
        /* with them, a bad file stops it at start */
        {missing, {"FUSEBOX_TEST_HOOKS=1", NULL}, 2, "No such file or directory", missing},
        {NULL, {"FUSEBOX_TEST_HOOKS=1", env_missing, NULL}, 2, "No such file", "--test-clock"},
        {dir, {"FUSEBOX_TEST_HOOKS=1", NULL}, 2, "not a regular file of 8 bytes", dir},
        {shorter, {"FUSEBOX_TEST_HOOKS=1", NULL}, 2, "not a regular file of 8 bytes", shorter},
        {negative, {"FUSEBOX_TEST_HOOKS=1", NULL}, 2, "holds a negative time", negative},
        /* "" is no clock file, as for every path flag: the monotonic clock */
        {"", {"FUSEBOX_TEST_HOOKS=1", NULL}, 1, unreachable, NULL},
        /* a good file is accepted; the flag wins over the variable */
        {good, {"FUSEBOX_TEST_HOOKS=1", NULL}, 1, unreachable, NULL},
        {NULL, {"FUSEBOX_TEST_HOOKS=1", env_good, NULL}, 1, unreachable, NULL},
        {good, {"FUSEBOX_TEST_HOOKS=1", env_missing, NULL}, 1, unreachable, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[3] = {NULL};
        if (cases[i].flag_value) {
            args[0] = "--test-clock";
            args[1] = cases[i].flag_value;
        }
        char out[8192];
        int status = run_fuseboxd(data, args, cases[i].env, out, sizeof out);
        bool ok = status == cases[i].status && strstr(out, cases[i].says) &&
                  (!cases[i].names || strstr(out, cases[i].names));
        if (!ok)
            fprintf(stderr, "case %zu (--test-clock %s, %s): exit %d, wanted %d with \"%s\":\n%s\n",
                    i, cases[i].flag_value ? cases[i].flag_value : "(none)",
                    cases[i].env[0] ? cases[i].env[0] : "(no env)", status, cases[i].status,
                    cases[i].says, out);
        CHECK(ok);
        /* a refused start did not get as far as the database */
        if (cases[i].status == 2) CHECK(strstr(out, unreachable) == NULL);
    }
    /* the test moved nothing: the good file still holds its time */
    CHECK_INT_EQ(fb_clock_file_get(c), (long long)1000 * 1000000000);
    fb_clock_file_close(c);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    printf("ok: %zu cases\n", sizeof cases / sizeof cases[0]);
    return 0;
}
