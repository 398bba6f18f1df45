/*
 * The one clock fuseboxd's control loop and the worker's decisions read.
 *
 * By default it is the monotonic clock.  A test may make a process read a
 * manual clock instead, so that every decision that depends on time
 * (heartbeat judgement, ticks, fair-share periods, profile windows,
 * re-queue timing, device turns) is taken at a time the test chose:
 *
 *   - in-process: fb_clock_manual(t) stops time at t; fb_clock_set and
 *     fb_clock_advance move it (unit tests of a loop or a scheduler);
 *   - across processes: fb_clock_use_file(path) makes this process read the
 *     time from a file of 8 bytes (a little-endian int64 of nanoseconds,
 *     mapped shared), which the test writes with fb_clock_file_create and
 *     fb_clock_file_set.  fuseboxd and fusebox-worker accept it only as a
 *     test hook (--test-clock, with FUSEBOX_TEST_HOOKS=1).
 *
 * Manual time never moves by itself.  Code that waits for a deadline sleeps
 * in real time for fb_clock_wait_ms(deadline) milliseconds and then reads the
 * clock again: the remaining time on the monotonic clock, a short poll on a
 * manual one (whose deadline comes only when the test moves it).
 *
 * Budgets that bound real latency (how long one pass of the loop may take
 * before it yields) are not decisions and may keep reading CLOCK_MONOTONIC.
 */
#ifndef FB_CLOCK_H
#define FB_CLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Nanoseconds on this process's clock (monotonic unless made manual). */
int64_t fb_clock_ns(void);

/* The same time in milliseconds (truncated) and in seconds. */
int64_t fb_clock_ms(void);
double fb_clock_s(void);

/* Whether this process reads a manual clock (in-process or from a file). */
bool fb_clock_is_manual(void);

/* How long, in real milliseconds (0 to cap_ms), to sleep before the clock
 * may have reached deadline_ms: the time left on the monotonic clock (0 when
 * it has passed), a short poll (at most cap_ms) on a manual one. */
int fb_clock_wait_ms(int64_t deadline_ms, int cap_ms);

/* In-process manual time: stops the clock at start_ns; set and advance move
 * it (never backwards: fb_clock_set to an earlier time is ignored and returns
 * false).  For unit tests, before any thread reads the clock. */
void fb_clock_manual(int64_t start_ns);
bool fb_clock_set(int64_t ns);
void fb_clock_advance(int64_t ns);

/* Makes this process read its time from the clock file at path (see above).
 * 0, or -1 with a message naming the file and what is wrong with it. */
int fb_clock_use_file(const char *path, char *msg, size_t msg_cap);

/* The writing side, for tests: creates (or truncates) the clock file at path
 * holding start_ns, and moves it.  fb_clock_file_set never moves it
 * backwards (returns false). */
typedef struct fb_clock_file fb_clock_file;
fb_clock_file *fb_clock_file_create(const char *path, int64_t start_ns, char *msg, size_t msg_cap);
bool fb_clock_file_set(fb_clock_file *f, int64_t ns);
void fb_clock_file_advance(fb_clock_file *f, int64_t ns);
int64_t fb_clock_file_get(const fb_clock_file *f);
void fb_clock_file_close(fb_clock_file *f);

#endif
