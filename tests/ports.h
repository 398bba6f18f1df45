/*
 * Loopback TCP ports for the tests that run servers, workers and PostgreSQL
 * clusters as processes: a port the system has just handed out, so that
 * tests running side by side do not pick the same one; a run of consecutive
 * free ports, for a worker's communication range; and a socket bound to a
 * given port, with which a test can also play another program that holds
 * it.  A port found free is free only until someone binds it: the process
 * the test starts on it may lose it to another, and tests that cannot
 * afford that race listen on port 0 themselves instead.  Every call either
 * succeeds or fails the test (CHECK), except fbt_port_bind on a taken port.
 */
#ifndef FB_TESTS_PORTS_H
#define FB_TESTS_PORTS_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

/*
 * A TCP socket bound to 127.0.0.1:port, port in [0, 65535] (0: one the
 * system picks), not listening yet; the caller closes it.  Returns -1 with
 * errno set (EADDRINUSE for a port that is taken) when it cannot be bound.
 */
static inline int fbt_port_bind(int port)
{
    CHECK(port >= 0 && port <= 65535);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* A TCP port on 127.0.0.1 that was free a moment ago. */
static inline int fbt_free_port(void)
{
    int fd = fbt_port_bind(0);
    CHECK(fd >= 0);
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* The lowest port of the kernel's ephemeral range (ip_local_port_range), 32768 if unknown. */
static inline int fbt_ephemeral_low(void)
{
    int lo = 32768, hi = 0;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
        fclose(f);
    }
    return lo;
}

/*
 * The first of n consecutive TCP ports on 127.0.0.1, n in [1, 64], that were
 * all free a moment ago, below the kernel's ephemeral range: the ports the
 * system hands out to outgoing connections (every test's clients of fuseboxd
 * and PostgreSQL, many a second on a busy machine) never land in it, so a
 * worker's communication range stays free until the worker binds it, however
 * many tests run beside.  Runs start at a port drawn from the pid and the
 * clock, so two calls rarely overlap; a test that needs disjoint runs checks
 * that they are and asks again.
 */
static inline int fbt_free_port_range(int n)
{
    CHECK(n >= 1 && n <= 64);
    int top = fbt_ephemeral_low(), bottom = 10000;
    CHECK(top - n > bottom);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)ts.tv_nsec;
    for (int attempt = 0; attempt < 200; attempt++) {
        seed = seed * 1103515245u + 12345u;
        int base = bottom + (int)((seed >> 8) % (unsigned)(top - n - bottom));
        bool all = true;
        for (int k = 0; k < n && all; k++) {
            int fd = fbt_port_bind(base + k);
            all = fd >= 0;
            if (all) close(fd);
        }
        if (all) return base;
    }
    CHECK(!"no run of free loopback ports in 200 attempts");
    return -1;
}

#endif
