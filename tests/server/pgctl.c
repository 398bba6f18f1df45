/* A PostgreSQL cluster of a test's own (pgctl.h). */
#define _GNU_SOURCE /* pipe2 */
#include "pgctl.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ports.h"

/* Where Debian's postgresql-15 package puts the server programs. */
#define PG_BIN_DEFAULT "/usr/lib/postgresql/15/bin"

int fbt_run(const char *cmd)
{
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

int fbt_pg_cmd(const fbt_pg *pg, const char *args)
{
    char cmd[1024];
    /* PostgreSQL refuses to run as root */
    if (geteuid() == 0)
        snprintf(cmd, sizeof cmd, "cd / && runuser -u postgres -- %s/%s", pg->bin, args);
    else
        snprintf(cmd, sizeof cmd, "cd / && %s/%s", pg->bin, args);
    return fbt_run(cmd);
}

void fbt_pg_start(const fbt_pg *pg)
{
    char args[700];
    snprintf(args, sizeof args,
             "pg_ctl -D %s/data -l %s/server.log -w -t 60 -o \"-p %d\" start > /dev/null", pg->dir,
             pg->dir, pg->port);
    CHECK_INT_EQ(fbt_pg_cmd(pg, args), 0);
}

void fbt_pg_stop(const fbt_pg *pg, const char *mode)
{
    CHECK(mode && (strcmp(mode, "smart") == 0 || strcmp(mode, "fast") == 0 ||
                   strcmp(mode, "immediate") == 0));
    char args[400];
    snprintf(args, sizeof args, "pg_ctl -D %s/data -m %s -w -t 60 stop > /dev/null", pg->dir,
             mode);
    CHECK_INT_EQ(fbt_pg_cmd(pg, args), 0);
}

/*
 * pg_ctl detaches the postmaster, so nothing stops it when the test aborts
 * or is killed for its timeout.  A process of its own waits on a pipe whose
 * only writer is the test: end of file without a word means the test is
 * gone, and the cluster is stopped.  It is forked twice so that it is no
 * child of the test (a runner that kills the test's process tree leaves it
 * alone), and its output goes nowhere (a runner that reads the test's output
 * does not wait for it).
 */
static void start_watchdog(fbt_pg *pg)
{
    int fds[2];
    CHECK(pipe2(fds, O_CLOEXEC) == 0);
    fflush(NULL);
    pid_t mid = fork();
    CHECK(mid >= 0);
    if (mid == 0) {
        if (fork() != 0) _exit(0);
        setsid();
        close(fds[1]);
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 1);
            dup2(null, 2);
        }
        char c;
        ssize_t n;
        do
            n = read(fds[0], &c, 1);
        while (n < 0);
        if (n == 0) {
            char args[400];
            snprintf(args, sizeof args, "pg_ctl -D %s/data -m immediate -w -t 30 stop", pg->dir);
            fbt_pg_cmd(pg, args);
        }
        _exit(0);
    }
    close(fds[0]);
    int st;
    CHECK(waitpid(mid, &st, 0) == mid);
    pg->watchdog_fd = fds[1];
    pg->watching = true;
}

void fbt_pg_create(fbt_pg *pg)
{
    memset(pg, 0, sizeof *pg);
    snprintf(pg->bin, sizeof pg->bin, "%s", PG_BIN_DEFAULT);
    char path[400];
    snprintf(path, sizeof path, "%s/initdb", pg->bin);
    if (access(path, X_OK) != 0) {
        exit(fb_test_missing("%s not found (apt-get install postgresql)", path));
    }
    if (geteuid() == 0 && fbt_run("id postgres > /dev/null 2>&1") != 0) {
        exit(fb_test_missing(
            "running as root without a postgres user (apt-get install postgresql)"));
    }
    snprintf(pg->dir, sizeof pg->dir, "/tmp/fbt-pg-XXXXXX");
    CHECK(mkdtemp(pg->dir) != NULL);
    char cmd[1024];
    if (geteuid() == 0) {
        snprintf(cmd, sizeof cmd, "chown postgres:postgres %s", pg->dir);
        CHECK_INT_EQ(fbt_run(cmd), 0);
    }
    snprintf(cmd, sizeof cmd,
             "initdb -D %s/data -U postgres -A trust -E UTF8 --no-locale > %s/initdb.log 2>&1",
             pg->dir, pg->dir);
    CHECK_INT_EQ(fbt_pg_cmd(pg, cmd), 0);
    snprintf(path, sizeof path, "%s/data/postgresql.conf", pg->dir);
    FILE *f = fopen(path, "a");
    CHECK(f != NULL);
    /* synchronous_commit stays on: an acknowledged COMMIT must survive the crash */
    fprintf(f, "\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n"
               "fsync = off\nmax_connections = 50\n");
    CHECK(fclose(f) == 0);
    pg->port = fbt_free_port();
    start_watchdog(pg);
    fbt_pg_start(pg);
    snprintf(pg->url, sizeof pg->url, "host=127.0.0.1 port=%d user=postgres dbname=postgres",
             pg->port);
}

void fbt_pg_destroy(fbt_pg *pg)
{
    if (!pg || !pg->dir[0]) return;
    if (pg->watching) {
        /* a word before closing: the test is not gone, the cluster is stopped here.  A
         * watchdog killed from outside must not take the test down with SIGPIPE. */
        struct sigaction ign = {.sa_handler = SIG_IGN}, old;
        sigaction(SIGPIPE, &ign, &old);
        if (write(pg->watchdog_fd, "q", 1) != 1) fprintf(stderr, "pgctl: the watchdog is gone\n");
        sigaction(SIGPIPE, &old, NULL);
        close(pg->watchdog_fd);
        pg->watching = false;
    }
    char args[400];
    snprintf(args, sizeof args, "pg_ctl -D %s/data -m immediate -w -t 30 stop > /dev/null 2>&1",
             pg->dir);
    fbt_pg_cmd(pg, args);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", pg->dir);
    if (fbt_run(cmd) != 0) fprintf(stderr, "pgctl: could not remove %s\n", pg->dir);
    pg->dir[0] = '\0';
}
