/*
 * The process clock (base/clock.h): monotonic by default; a manual clock in
 * memory that moves only when told, never backwards; a clock file that one
 * side writes and another maps, and the clear errors for a file that cannot
 * be a clock (missing, a directory, the wrong size, a negative time).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"

static void test_monotonic(void)
{
    CHECK(!fb_clock_is_manual());
    int64_t a = fb_clock_ns(), b = fb_clock_ns();
    CHECK(a > 0 && b >= a);
    /* a deadline already passed needs no wait; one ahead waits its distance, capped */
    CHECK_INT_EQ(fb_clock_wait_ms(fb_clock_ms() - 5, 100), 0);
    int w = fb_clock_wait_ms(fb_clock_ms() + 100000, 250);
    CHECK_INT_EQ(w, 250);
}

static void test_file(const char *dir)
{
    char path[512], msg[256];
    snprintf(path, sizeof path, "%s/clock", dir);
    fb_clock_file *f = fb_clock_file_create(path, 5000000000LL, msg, sizeof msg);
    CHECK(f);
    CHECK_INT_EQ(fb_clock_file_get(f), 5000000000LL);

    /* files that are no clock: each refused with its reason, the clock unchanged */
    char sub[600], small[600];
    snprintf(sub, sizeof sub, "%s/subdir", dir);
    CHECK(mkdir(sub, 0700) == 0);
    snprintf(small, sizeof small, "%s/small", dir);
    int fd = open(small, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && write(fd, "1234", 4) == 4);
    close(fd);
    char neg[600];
    snprintf(neg, sizeof neg, "%s/negative", dir);
    fd = open(neg, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    unsigned char m1[8];
    memset(m1, 0xff, sizeof m1);
    CHECK(fd >= 0 && write(fd, m1, 8) == 8);
    close(fd);
    struct {
        const char *path, *says;
    } bad[] = {
        {"", "no path"},
        {"/nonexistent/fusebox-clock", "No such file"},
        {sub, "not a regular file of 8 bytes"},
        {small, "not a regular file of 8 bytes"},
        {neg, "negative time"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msg[0] = 0;
        CHECK_INT_EQ(fb_clock_use_file(bad[i].path, msg, sizeof msg), -1);
        if (!strstr(msg, bad[i].says)) {
            fprintf(stderr, "case %zu: '%s' does not say '%s'\n", i, msg, bad[i].says);
            CHECK(0);
        }
        CHECK(!fb_clock_is_manual());
    }
    CHECK(fb_clock_file_create("/nonexistent/dir/clock", 0, msg, sizeof msg) == NULL);
    CHECK(strstr(msg, "/nonexistent/dir/clock"));
    CHECK(fb_clock_file_create(path, -1, msg, sizeof msg) == NULL);
    CHECK(strstr(msg, "negative"));

    /* the reader sees exactly what the writer sets, and nothing moves it otherwise */
    fb_clock_file *g = fb_clock_file_create(path, 7000000000LL, msg, sizeof msg);
    CHECK(g);
    fb_clock_file_close(f);
    CHECK_INT_EQ(fb_clock_use_file(path, msg, sizeof msg), 0);
    CHECK(fb_clock_is_manual());
    CHECK_INT_EQ(fb_clock_ns(), 7000000000LL);
    CHECK_INT_EQ(fb_clock_ms(), 7000);
    usleep(20000);
    CHECK_INT_EQ(fb_clock_ns(), 7000000000LL);
    fb_clock_file_advance(g, 1500000);
    CHECK_INT_EQ(fb_clock_ms(), 7001);
    CHECK(!fb_clock_file_set(g, 1));
    CHECK_INT_EQ(fb_clock_ms(), 7001);
    CHECK(fb_clock_file_set(g, 9000000000LL));
    CHECK_NEAR(fb_clock_s(), 9.0, 1e-12);
    /* a manual deadline ahead is a short poll; one reached needs none */
    int w = fb_clock_wait_ms(9500, 1000);
    CHECK(w > 0 && w < 1000);
    CHECK_INT_EQ(fb_clock_wait_ms(9000, 1000), 0);
    fb_clock_file_close(g);
}

static void test_memory(void)
{
    fb_clock_manual(1000000);
    CHECK(fb_clock_is_manual());
    CHECK_INT_EQ(fb_clock_ns(), 1000000);
    fb_clock_advance(2000000);
    CHECK_INT_EQ(fb_clock_ms(), 3);
    CHECK(!fb_clock_set(2999999));
    CHECK_INT_EQ(fb_clock_ns(), 3000000);
    CHECK(fb_clock_set(10000000));
    CHECK_INT_EQ(fb_clock_ms(), 10);
    fb_clock_advance(-5);
    CHECK_INT_EQ(fb_clock_ms(), 10);
}

int main(void)
{
    char dir[] = "/tmp/fb-clock-XXXXXX";
    CHECK(mkdtemp(dir));
    test_monotonic();
    test_file(dir);
    test_memory();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    printf("test_clock: ok\n");
    return 0;
}
