/*
 * Helpers of the tests whose ranks live in several processes: forking a
 * child that dies with the test, waiting for children with a deadline (a
 * child that hangs fails the test instead of stalling it), and a loopback
 * listener on a port the system chooses, so that tests running in parallel
 * never collide; whole reads and writes of the pipes that bring the
 * children's results back, and each step's global batch (every process of a
 * world reads the same one).
 */
#ifndef FB_TESTS_XPROC_UTIL_H
#define FB_TESTS_XPROC_UTIL_H

#include "check.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "errors.h"
#include "idx.h"

static inline double xp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs fn(arg) in a child process, which exits 0 when fn returns (a failed
 * CHECK aborts it).  The child is killed if the test dies first. */
static inline pid_t xp_spawn(void (*fn)(void *), void *arg)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        fn(arg);
        fflush(stdout);
        exit(0);
    }
    return pid;
}

/* Spawns fn(arg) with a pipe for its results: *child_fd (a field of arg) gets
 * the write end before the fork, and the parent keeps only the read end,
 * *read_fd, so that the child's exit ends the parent's reads.  Earlier
 * children never hold a later child's write end. */
static inline pid_t xp_spawn_piped(void (*fn)(void *), void *arg, int *child_fd, int *read_fd)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    *child_fd = fds[1];
    pid_t pid = xp_spawn(fn, arg);
    close(fds[1]);
    *read_fd = fds[0];
    return pid;
}

/* Waits up to secs for pid; returns its wait status (a child still running
 * then is killed and fails the test). */
static inline int xp_wait(pid_t pid, double secs)
{
    double end = xp_now() + secs;
    for (;;) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG);
        CHECK(r >= 0);
        if (r == pid) return st;
        if (xp_now() > end) {
            fprintf(stderr, "child %d did not finish within %.0f s\n", (int)pid, secs);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            CHECK(!"a child hung");
        }
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
}

/* Waits for pid and requires that it exited 0. */
static inline void xp_wait_ok(pid_t pid, double secs)
{
    int st = xp_wait(pid, secs);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fprintf(stderr, "child %d: %s %d\n", (int)pid,
                WIFEXITED(st) ? "exit status" : "killed by signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* A listener on host (a loopback address; IPv6 in brackets) at a port the
 * system chose; *addr gets "connect_host:port".  NULL where host cannot be
 * bound (a machine without IPv6). */
static inline fb_comm_tcp_listener *xp_listen_on(const char *host, const char *connect_host,
                                                 char *addr, size_t cap)
{
    char msg[256], where[128];
    fb_comm_tcp_listener *l = NULL;
    int port = 0;
    snprintf(where, sizeof where, "%s:0", host);
    int err = fb_comm_tcp_listen(where, &l, &port, msg, sizeof msg);
    if (err) {
        printf("cannot listen on %s: %s\n", where, msg);
        return NULL;
    }
    CHECK(port > 0 && port < 65536);
    snprintf(addr, cap, "%s:%d", connect_host, port);
    return l;
}

/* A listener on 127.0.0.1 at a port the system chose; *addr gets "127.0.0.1:port". */
static inline fb_comm_tcp_listener *xp_listen(char *addr, size_t cap)
{
    fb_comm_tcp_listener *l = xp_listen_on("127.0.0.1", "127.0.0.1", addr, cap);
    CHECK(l != NULL);
    return l;
}

/* Joins a TCP world as ranks base..base+n-1 through addr, or fails the test.  The
 * process of rank 0 listens on *l (made by the parent before it forked); the others close
 * their inherited copy first.  *l is closed and NULL afterwards. */
static inline fb_comm *xp_join(fb_comm_tcp_listener **l, int n, int base, int world,
                                 const char *addr, const unsigned char *token, int timeout_ms)
{
    char msg[512];
    if (base != 0) {
        fb_comm_tcp_listener_free(*l);
        *l = NULL;
    }
    fb_comm *comm = NULL;
    int err = fb_comm_tcp_new(n, base, world, addr, *l, token, timeout_ms, &comm, msg, sizeof msg);
    if (err) fprintf(stderr, "rank %d: %s\n", base, msg);
    CHECK_INT_EQ(err, FB_OK);
    fb_comm_tcp_listener_free(*l);
    *l = NULL;
    return comm;
}

/* Writes all n bytes of p to fd (a pipe to the parent). */
static inline void xp_write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        CHECK(k > 0);
        c += k;
        n -= (size_t)k;
    }
}

/* Reads exactly n bytes from fd into p (a child's pipe). */
static inline void xp_read_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t k = read(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        CHECK(k > 0);
        c += k;
        n -= (size_t)k;
    }
}

/* Step t's global batch of bs samples of ds: consecutive samples, wrapping around. */
static inline void xp_batch(const fb_dataset *ds, int t, int bs, float *x, int32_t *y)
{
    int64_t F = (int64_t)ds->C * ds->H * ds->W;
    for (int i = 0; i < bs; i++) {
        int64_t k = ((int64_t)t * bs + i) % ds->n;
        memcpy(x + i * F, ds->x + k * F, (size_t)F * sizeof *x);
        y[i] = ds->y[k];
    }
}

#endif
