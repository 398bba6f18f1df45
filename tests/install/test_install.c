/*
 * fusebox installed like a C project (docs/deploy.md, "Installing with CMake
 * and systemd"): `cmake --install` of this build into a scratch prefix, then
 *
 * 1. every installed program answers --version with one line "NAME VERSION",
 *    VERSION the project's (CMakeLists.txt), and bin/ holds exactly the
 *    programs the test knows;
 * 2. the prefix is moved elsewhere (nothing may point into it, nor into the
 *    source tree), a probe migration is added to the installed schema, and the
 *    installed fuseboxd, given only a database, a data directory and ports,
 *    runs on a fresh test database: /readyz answers 200 at the probe's schema
 *    version (the migrations ran from the installed share/fusebox/schema, not
 *    from the source tree, which has no such file), / serves the installed
 *    dashboard, and its --help names the installed directories as defaults;
 * 3. the installed systemd units pass `systemd-analyze verify` with their
 *    ExecStart pointed at the installed programs, where systemd-analyze
 *    exists (a syntax check of the test's own otherwise).
 *
 * argv: cmake, the build directory, the project version.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <fcntl.h>

#include "check.h"
#include "harness.h"

static char root[256], prefix[400];

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Runs a shell command, its output into buf (cap bytes, NUL-terminated); the exit status. */
static int run(const char *cmd, char *buf, size_t cap)
{
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    size_t n = fread(buf, 1, cap - 1, p);
    buf[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    CHECK(fputs(text, f) >= 0);
    CHECK(fclose(f) == 0);
}

/* 1. --version of every installed program */
static void check_versions(const char *version)
{
    static const char *const programs[] = {"fusebox-data", "fusebox-sim", "fusebox-train",
                                           "fusebox-worker", "fuseboxd", NULL};
    char bin[500], cmd[1200], out[4096], want[128];
    snprintf(bin, sizeof bin, "%s/bin", prefix);
    int n = 0;
    for (int i = 0; programs[i]; i++, n++) {
        snprintf(cmd, sizeof cmd, "'%s/%s' --version 2>&1", bin, programs[i]);
        int rc = run(cmd, out, sizeof out);
        snprintf(want, sizeof want, "%s %s\n", programs[i], version);
        if (rc != 0 || strcmp(out, want) != 0)
            fprintf(stderr, "%s --version: exit %d, \"%s\" (want \"%s\")\n", programs[i], rc, out,
                    want);
        CHECK_INT_EQ(rc, 0);
        CHECK_STR_EQ(out, want);
    }
    /* every installed program is one of those: a new one must answer --version too */
    DIR *d = opendir(bin);
    CHECK(d != NULL);
    struct dirent *e;
    int seen = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        bool known = false;
        for (int i = 0; programs[i]; i++) known = known || strcmp(e->d_name, programs[i]) == 0;
        if (!known) fprintf(stderr, "bin/%s is not a program this test knows\n", e->d_name);
        CHECK(known);
        seen++;
    }
    closedir(d);
    CHECK_INT_EQ(seen, n);
}

/* 2. the installed fuseboxd on a test database */
static void check_server(void)
{
    char path[600], cmd[1500], out[16384];
    /* a migration only the installed schema has */
    snprintf(path, sizeof path, "%s/share/fusebox/schema/999_install_probe.sql", prefix);
    write_file(path, "CREATE TABLE install_probe (id int);\n");
    /* its defaults are the installed directories */
    snprintf(cmd, sizeof cmd, "'%s/bin/fuseboxd' --help", prefix);
    CHECK_INT_EQ(run(cmd, out, sizeof out), 0);
    CHECK(strstr(out, "/bin/../share/fusebox/schema") != NULL);
    CHECK(strstr(out, "/bin/../share/fusebox/web") != NULL);
    CHECK(strstr(out, "/bin/fusebox-data") != NULL);

    fbt_server s;
    memset(&s, 0, sizeof s);
    fbt_db_create(&s);
    snprintf(s.data_dir, sizeof s.data_dir, "%s/state", root);
    CHECK(mkdir(s.data_dir, 0700) == 0);
    char exe[500], port_file[400], log[400];
    snprintf(exe, sizeof exe, "%s/bin/fuseboxd", prefix);
    snprintf(port_file, sizeof port_file, "%s/port", root);
    snprintf(log, sizeof log, "%s/fuseboxd.log", root);
    snprintf(s.log_path, sizeof s.log_path, "%s", log);
    const char *argv[] = {exe,         "--database-url",  s.db_url,           "--data-dir",
                          s.data_dir,  "--port",          "0",                "--port-file",
                          port_file,   "--worker-listen", "tcp://127.0.0.1:0", NULL};
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        /* from a directory with no schema/ of its own */
        if (chdir(root) != 0) _exit(126);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    s.pid = pid;
    double start = fbt_now_ms();
    for (;;) {
        FILE *f = fopen(port_file, "r");
        if (f) {
            if (fscanf(f, "%d", &s.port) != 1) s.port = 0;
            fclose(f);
        }
        if (s.port > 0) {
            fbt_resp r;
            int rc = fbt_http(s.port, "GET", "/readyz", NULL, NULL, 0, &r);
            int status = r.status;
            fbt_resp_free(&r);
            if (rc == 0 && status == 200) break;
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid || fbt_now_ms() - start > 60000) {
            fprintf(stderr, "the installed fuseboxd did not become ready\n");
            fbt_server_dump_log(&s);
            CHECK(0);
        }
        sleep_ms(20);
    }
    fbt_resp r = fbt_call(&s, "GET", "/readyz", NULL, NULL);
    fbt_expect(&r, 200, NULL, "readyz");
    CHECK_INT_EQ(json_integer_value(json_object_get(r.json, "schema_version")), 999);
    CHECK_STR_EQ(json_string_value(json_object_get(r.json, "control_loop")), "active");
    fbt_resp_free(&r);
    CHECK_STR_EQ(fbt_sql_value(&s, "SELECT to_regclass('install_probe') IS NOT NULL"), "t");
    r = fbt_call(&s, "GET", "/", NULL, NULL);
    fbt_expect(&r, 200, NULL, "the dashboard");
    CHECK(strstr(r.body, "<title>fusebox</title>") != NULL);
    fbt_resp_free(&r);
    r = fbt_call(&s, "GET", "/static/app.js", NULL, NULL);
    fbt_expect(&r, 200, NULL, "the dashboard's script");
    fbt_resp_free(&r);
    CHECK_INT_EQ(fbt_server_stop(&s), 0);
    fbt_db_drop(&s);
}

/* 3. the systemd units, ExecStart pointed at this prefix */
static void check_units(void)
{
    static const char *const units[] = {"fuseboxd.service", "fusebox-worker.service", NULL};
    char dir[500], cmd[2000], out[8192];
    snprintf(dir, sizeof dir, "%s/units", root);
    CHECK(mkdir(dir, 0755) == 0);
    bool have = run("command -v systemd-analyze", out, sizeof out) == 0;
    for (int i = 0; units[i]; i++) {
        snprintf(cmd, sizeof cmd,
                 "sed 's|^ExecStart=/usr/local/bin/|ExecStart=%s/bin/|' "
                 "'%s/share/fusebox/systemd/%s' > '%s/%s'",
                 prefix, prefix, units[i], dir, units[i]);
        CHECK(system(cmd) == 0);
        /* the test's own check: sections, Key=value lines, an ExecStart that is installed */
        snprintf(cmd, sizeof cmd,
                 "awk '/^[[:space:]]*(#|$)/ {next} /^\\[(Unit|Service|Install)\\]$/ {next} "
                 "/^[A-Za-z]+=/ {next} {print \"bad line: \" $0; bad=1} END {exit bad}' '%s/%s' "
                 "&& grep -q '^ExecStart=%s/bin/' '%s/%s' && "
                 "test -x \"$(sed -n 's/^ExecStart=//p' '%s/%s')\"",
                 dir, units[i], prefix, dir, units[i], dir, units[i]);
        int rc = run(cmd, out, sizeof out);
        if (rc) fprintf(stderr, "%s: %s\n", units[i], out);
        CHECK_INT_EQ(rc, 0);
        if (!have) continue;
        snprintf(cmd, sizeof cmd, "cd '%s' && systemd-analyze verify './%s' 2>&1", dir, units[i]);
        rc = run(cmd, out, sizeof out);
        if (rc || out[0]) fprintf(stderr, "systemd-analyze verify %s: %s\n", units[i], out);
        CHECK_INT_EQ(rc, 0);
        CHECK_STR_EQ(out, "");
    }
    if (!have) printf("systemd-analyze is missing: the units had the test's own check only\n");
}

int main(int argc, char **argv)
{
    CHECK_INT_EQ(argc, 4);
    fbt_require_database();
    snprintf(root, sizeof root, "/tmp/fb-install-XXXXXX");
    CHECK(mkdtemp(root) != NULL);
    char cmd[2000], out[16384], first[400];
    snprintf(first, sizeof first, "%s/first-prefix", root);
    snprintf(cmd, sizeof cmd, "'%s' --install '%s' --prefix '%s' 2>&1", argv[1], argv[2], first);
    int rc = run(cmd, out, sizeof out);
    if (rc) fprintf(stderr, "%s\n", out);
    CHECK_INT_EQ(rc, 0);
    /* the installed tree works where it is moved to: nothing in it names its prefix */
    snprintf(prefix, sizeof prefix, "%s/moved", root);
    CHECK(rename(first, prefix) == 0);
    snprintf(cmd, sizeof cmd,
             "test -f '%s/share/fusebox/schema/001_core.sql' && test -f "
             "'%s/share/fusebox/web/index.html' && test -f '%s/share/doc/fusebox/deploy.md' "
             "&& test -f '%s/share/doc/fusebox/README.md' && test -f "
             "'%s/share/fusebox/systemd/fuseboxd.env.example' && test -x "
             "'%s/share/fusebox/slurm/fusebox-worker.sbatch'",
             prefix, prefix, prefix, prefix, prefix, prefix);
    CHECK(system(cmd) == 0);
    check_versions(argv[3]);
    check_server();
    check_units();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
    /* the responses, /readyz's control_loop among them, against api/openapi.yaml */
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("ok: installed into a prefix, moved, and run from there\n");
    return 0;
}
