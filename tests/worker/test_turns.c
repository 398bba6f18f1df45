/*
 * The device turns' pure core (workers/turns.h), driven call by call with the time as an
 * argument: every grant is asserted.  Two groups of shares 0.75 and 0.25 take turns 3:1
 * exactly; a newcomer joins at the smallest virtual time and neither starves nor is
 * starved; a group spanning two devices alternates with the groups of each; a group that
 * leaves frees its devices; a share changed mid-run changes the ratio from the next charge;
 * a leader between two steps is waited for a bounded time (real mode) or until it asks
 * (scripted); scripted steps end in the order of their ends; bad shares and devices are
 * refused with a clear message and change nothing.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "errors.h"
#include "turns.h"

#define MS 1000000LL /* ns */
/* A leader's wait that never runs out here: where groups ask again at once, a wait of a few
 * ms would run out over several of the leader's turns (it runs from the first of them) */
#define LONG_WAIT (3600000 * MS)

static fb_turn G[4];
static const char NAMES[] = "ABCD";

/* The grants the core made, as letters, in order (the event hook's log). */
static char granted[4096];
static int n_granted;

static void on_event(void *user, fb_turn_event ev, const fb_turn *g, int64_t at, double v)
{
    (void)user, (void)at, (void)v;
    if (ev == FB_TURN_EV_GRANT && n_granted < (int)sizeof granted - 1) {
        granted[n_granted++] = NAMES[g - G];
        granted[n_granted] = '\0';
    }
}

static void log_reset(void)
{
    n_granted = 0;
    granted[0] = '\0';
}

static void prepare(int i, int n_devices, double share, const int *devs, int n, int64_t step_ns)
{
    char msg[256];
    CHECK_INT_EQ(fb_turn_init(&G[i], n_devices, (uint64_t)i, share, devs, n, step_ns, NULL, msg,
                              sizeof msg),
                 FB_OK);
}

/* The group holding the device now (one device, one stepping group at a time), or -1. */
static int stepping(void)
{
    int who = -1;
    for (int i = 0; i < 4; i++)
        if (fb_turn_granted(&G[i])) {
            CHECK(who < 0);
            who = i;
        }
    return who;
}

/* On one device: n turns of groups 0..k-1 that ask again as soon as their step ends, each
 * step charged charge_ms; returns the letters granted. */
static const char *one_device_turns(int k, int n, double charge_ms, fb_turns *t, int64_t *now)
{
    log_reset();
    for (int i = 0; i < k; i++)
        if (G[i].state == FB_TURN_BETWEEN) fb_turns_ask(t, &G[i], *now);
    for (int turn = 0; turn < n; turn++) {
        int who = stepping();
        CHECK(who >= 0);
        *now += (int64_t)(charge_ms * MS);
        fb_turns_done(t, &G[who], charge_ms, *now);
        fb_turns_ask(t, &G[who], *now);
    }
    return granted;
}

static int count(const char *s, char c)
{
    int n = 0;
    for (; *s; s++) n += *s == c;
    return n;
}

static void test_three_to_one(void)
{
    fb_turns t;
    fb_turns_init(&t, 1, LONG_WAIT, false, on_event, NULL);
    const int dev0[1] = {0};
    prepare(0, 1, 0.75, dev0, 1, 0);
    prepare(1, 1, 0.25, dev0, 1, 0);
    int64_t now = 0;
    fb_turns_join(&t, &G[0], now);
    fb_turns_join(&t, &G[1], now);
    /* charges of 3 ms: A's virtual time moves by 4, B's by 12, exactly */
    const char *s = one_device_turns(2, 400, 3.0, &t, &now);
    CHECK(strncmp(s, "ABAAABAAAB", 10) == 0);
    CHECK_INT_EQ(strlen(s), 401); /* the first grant, then one per ended turn */
    /* every window of four turns after the first: three of A, one of B */
    for (int w = 1; w + 4 <= 401; w += 4) {
        char win[5];
        memcpy(win, s + w, 4);
        win[4] = '\0';
        CHECK_INT_EQ(count(win, 'A'), 3);
        CHECK_INT_EQ(count(win, 'B'), 1);
    }
    printf("shares 0.75 : 0.25: %d : %d turns of 401\n", count(s, 'A'), count(s, 'B'));

    /* the share changes mid-run: from the next charge on, B's weight equals A's */
    char msg[256];
    CHECK_INT_EQ(fb_turns_set_share(&t, &G[1], 0.75, now, msg, sizeof msg), FB_OK);
    CHECK(fb_turn_share(&G[1]) == 0.75);
    s = one_device_turns(2, 200, 3.0, &t, &now);
    /* B is behind by what it was charged less: it catches up, then they alternate */
    int a = count(s + 100, 'A'), b = count(s + 100, 'B');
    CHECK_INT_EQ(a + b, 100);
    CHECK(a - b <= 1 && b - a <= 1);
    for (int i = 101; i + 1 < 200; i++) CHECK(s[i] != s[i + 1]);

    /* bad shares are refused with the value named, and the share stays */
    const double bad[] = {0, -0.5, 1.0001, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msg[0] = '\0';
        CHECK_INT_EQ(fb_turns_set_share(&t, &G[1], bad[i], now, msg, sizeof msg),
                     FB_ERR_OUT_OF_RANGE);
        CHECK(strstr(msg, "a time share must be in (0, 1]"));
        CHECK(fb_turn_share(&G[1]) == 0.75);
    }
    fb_turns_leave(&t, &G[0], now);
    fb_turns_leave(&t, &G[1], now);
}

static void test_newcomer(void)
{
    fb_turns t;
    fb_turns_init(&t, 1, LONG_WAIT, false, on_event, NULL);
    const int dev0[1] = {0};
    for (int i = 0; i < 3; i++) prepare(i, 1, 1.0, dev0, 1, 0);
    int64_t now = 0;
    fb_turns_join(&t, &G[0], now);
    fb_turns_join(&t, &G[1], now);
    /* A and B run for a long time: their virtual times are far from 0 */
    const char *s = one_device_turns(2, 1000, 2.0, &t, &now);
    CHECK_INT_EQ(count(s, 'A'), 501);
    CHECK_INT_EQ(count(s, 'B'), 500);
    /* A holds the device; C joins at the smallest virtual time there, 1000 ms, not at 0 */
    CHECK_INT_EQ(stepping(), 0);
    fb_turns_join(&t, &G[2], now);
    CHECK(G[2].vtime[0] == 1000.0);
    CHECK(G[0].vtime[0] == 1000.0 && G[1].vtime[0] == 1000.0);
    fb_turns_ask(&t, &G[2], now);
    log_reset();
    for (int turn = 0; turn < 300; turn++) {
        int who = stepping();
        now += 2 * MS;
        fb_turns_done(&t, &G[who], 2.0, now);
        fb_turns_ask(&t, &G[who], now);
    }
    /* no burst for C (it did not start at 0) and no wait for it to catch up: B (older than
     * C at the same time), C, then A, whose step was charged after C joined, in turn */
    CHECK(strncmp(granted, "BCABCABCA", 9) == 0);
    CHECK_INT_EQ(count(granted, 'A'), 100);
    CHECK_INT_EQ(count(granted, 'B'), 100);
    CHECK_INT_EQ(count(granted, 'C'), 100);
    for (int i = 0; i < 3; i++) fb_turns_leave(&t, &G[i], now);
}

/* Ends the turns of every stepping group in the order given (letters), each asking again. */
static void end_steps(fb_turns *t, const char *order, double charge_ms, int64_t now)
{
    for (const char *p = order; *p; p++) {
        fb_turn *g = &G[strchr(NAMES, *p) - NAMES];
        CHECK(fb_turn_granted(g));
        fb_turns_done(t, g, charge_ms, now);
        fb_turns_ask(t, g, now);
    }
}

static void test_span_and_leave(void)
{
    fb_turns t;
    fb_turns_init(&t, 2, LONG_WAIT, false, on_event, NULL);
    const int dev0[1] = {0}, dev1[1] = {1}, both[3] = {1, 0, 1};
    prepare(0, 2, 1.0, dev0, 1, 0);
    prepare(1, 2, 1.0, dev1, 1, 0);
    prepare(2, 2, 1.0, both, 3, 0); /* a layout may name a device twice: it counts once */
    CHECK_INT_EQ(G[2].n_devs, 2);
    CHECK_INT_EQ(G[2].devs[0], 0);
    CHECK_INT_EQ(G[2].devs[1], 1);
    int64_t now = 0;
    log_reset();
    for (int i = 0; i < 3; i++) fb_turns_join(&t, &G[i], now);
    for (int i = 0; i < 3; i++) fb_turns_ask(&t, &G[i], now);
    /* A and B step side by side, C (both devices) waits for both */
    CHECK_STR_EQ(granted, "AB");
    for (int round = 0; round < 50; round++) {
        now += 10 * MS;
        log_reset();
        end_steps(&t, "AB", 10.0, now);
        /* C takes both devices at once; A and B wait behind it (C's lead is 0) */
        CHECK_STR_EQ(granted, "C");
        now += 10 * MS;
        log_reset();
        end_steps(&t, "C", 10.0, now);
        CHECK_STR_EQ(granted, "AB");
    }
    /* B ends first, then A: C still waits for both devices, so the order is the same */
    now += 10 * MS;
    log_reset();
    end_steps(&t, "BA", 10.0, now);
    CHECK_STR_EQ(granted, "C");
    /* C leaves while it holds both: A and B take them at once, then step back to back */
    log_reset();
    fb_turns_leave(&t, &G[2], now);
    CHECK_STR_EQ(granted, "AB");
    for (int round = 0; round < 10; round++) {
        now += 10 * MS;
        end_steps(&t, "AB", 10.0, now);
    }
    CHECK_STR_EQ(granted, "ABABABABABABABABABABAB");
    fb_turns_leave(&t, &G[0], now);
    fb_turns_leave(&t, &G[1], now);
}

static void test_leader_wait(void)
{
    const int dev0[1] = {0};
    for (int scripted = 0; scripted < 2; scripted++) {
        fb_turns t;
        fb_turns_init(&t, 1, 5 * MS, scripted, on_event, NULL);
        prepare(0, 1, 1.0, dev0, 1, scripted ? 7 * MS : 0);
        prepare(1, 1, 1.0, dev0, 1, scripted ? 7 * MS : 0);
        int64_t now = 100 * MS;
        log_reset();
        fb_turns_join(&t, &G[0], now);
        fb_turns_join(&t, &G[1], now);
        /* B asks first, but A (older, same virtual time) is ahead and between steps */
        fb_turns_ask(&t, &G[1], now);
        CHECK_STR_EQ(granted, "");
        int64_t next = fb_turns_poll(&t, now + 5 * MS - 1);
        if (!scripted) {
            /* real mode: B waits 5 ms for A, then goes */
            CHECK_INT_EQ(next, now + 5 * MS);
            CHECK_STR_EQ(granted, "");
            fb_turns_poll(&t, now + 5 * MS);
            CHECK_STR_EQ(granted, "B");
            fb_turns_done(&t, &G[1], 1.0, now + 6 * MS);
        } else {
            /* scripted: no deadline; B waits until A asks, whenever that is */
            CHECK_INT_EQ(next, INT64_MAX);
            fb_turns_poll(&t, now + 3600000 * MS);
            CHECK_STR_EQ(granted, "");
            fb_turns_ask(&t, &G[0], now + 3600000 * MS);
            CHECK_STR_EQ(granted, "A");
            /* the grant is at the time A is at (it joined at now), not when it came */
            CHECK_INT_EQ(G[0].end_ns, now + 7 * MS);
            fb_turns_done(&t, &G[0], 123.0, now + 3600000 * MS);
            /* charged its script, whatever the caller measured; B goes at A's end */
            CHECK(G[0].vtime[0] == 7.0);
            CHECK_STR_EQ(granted, "AB");
            CHECK_INT_EQ(G[1].end_ns, now + 14 * MS);
        }
        /* a parked group (held by the test step hook) is no one's leader */
        fb_turns_leave(&t, &G[0], now);
        fb_turns_leave(&t, &G[1], now);
    }
    fb_turns t;
    fb_turns_init(&t, 1, 5 * MS, false, on_event, NULL);
    prepare(0, 1, 1.0, dev0, 1, 0);
    prepare(1, 1, 1.0, dev0, 1, 0);
    fb_turns_join(&t, &G[0], 0);
    fb_turns_join(&t, &G[1], 0);
    log_reset();
    fb_turns_park(&t, &G[0], true, 0);
    fb_turns_ask(&t, &G[1], 0);
    CHECK_STR_EQ(granted, "B");
    fb_turns_done(&t, &G[1], 1.0, 1 * MS);
    /* back from its hold it asks and, behind in virtual time, goes first */
    fb_turns_ask(&t, &G[0], 1 * MS);
    CHECK_STR_EQ(granted, "BA");
    fb_turns_ask(&t, &G[1], 1 * MS);
    fb_turns_cancel(&t, &G[1], 1 * MS); /* B gives its place in line up */
    CHECK(G[1].state == FB_TURN_BETWEEN);
    /* A gives its turn back unstepped: nothing charged, and B (ahead by 1 ms) waits for A */
    fb_turns_cancel(&t, &G[0], 2 * MS);
    CHECK(G[0].vtime[0] == 0.0);
    fb_turns_ask(&t, &G[1], 2 * MS);
    CHECK_STR_EQ(granted, "BA");
    fb_turns_ask(&t, &G[0], 2 * MS);
    CHECK_STR_EQ(granted, "BAA");
    fb_turns_leave(&t, &G[0], 1 * MS);
    fb_turns_leave(&t, &G[1], 1 * MS);
}

static void test_scripted_ends(void)
{
    /* scripted, two devices: A (dev 0, 10 ms), B (dev 1, 15 ms), C (devs 0 and 1, 20 ms) */
    fb_turns t;
    fb_turns_init(&t, 2, 5 * MS, true, on_event, NULL);
    const int dev0[1] = {0}, dev1[1] = {1}, both[2] = {0, 1};
    prepare(0, 2, 1.0, dev0, 1, 10 * MS);
    prepare(1, 2, 1.0, dev1, 1, 15 * MS);
    prepare(2, 2, 1.0, both, 2, 20 * MS);
    log_reset();
    for (int i = 0; i < 3; i++) fb_turns_join(&t, &G[i], 0);
    /* C asks first but waits for A, older and between steps (scripted: with no deadline) */
    for (int i = 2; i >= 0; i--) fb_turns_ask(&t, &G[i], 0);
    CHECK_STR_EQ(granted, "BA");
    /* a step ends only when its end has come and every earlier end has ended */
    CHECK(!fb_turns_may_end(&t, &G[0], 9 * MS));
    CHECK(fb_turns_may_end(&t, &G[0], 10 * MS));
    CHECK(!fb_turns_may_end(&t, &G[1], 20 * MS)); /* A's end (10) comes first */
    CHECK(!fb_turns_may_join(&t, 10 * MS)); /* A's end (10) is not taken yet */
    CHECK(fb_turns_may_join(&t, 9 * MS));
    fb_turns_done(&t, &G[0], 0, 20 * MS);
    /* A, between steps at 10, acts before B's end at 15, however late its thread comes */
    CHECK(fb_turns_is_next(&t, &G[0]));
    CHECK(!fb_turns_may_end(&t, &G[1], 20 * MS));
    /* at A's end C still waits for device 1; A waits behind C, who leads by less */
    fb_turns_ask(&t, &G[0], 20 * MS);
    CHECK_STR_EQ(granted, "BA");
    CHECK(fb_turns_may_end(&t, &G[1], 20 * MS));
    fb_turns_done(&t, &G[1], 0, 20 * MS);
    /* C goes at B's end (15 ms), however late the call came, and ends at 35 */
    CHECK_STR_EQ(granted, "BAC");
    CHECK_INT_EQ(G[2].end_ns, 35 * MS);
    fb_turns_ask(&t, &G[1], 20 * MS);
    fb_turns_done(&t, &G[2], 0, 40 * MS);
    /* A (10 ms charged) and B (15) now lead C (20) by nothing on their devices' smallest */
    CHECK_STR_EQ(granted, "BACAB");
    CHECK_INT_EQ(G[0].end_ns, 45 * MS);
    CHECK_INT_EQ(G[1].end_ns, 50 * MS);
    /* a turn given back unstepped is held to its end, uncharged: A is at 45 then, and its
     * next event comes before B's end at 50 */
    fb_turns_ask(&t, &G[2], 40 * MS);
    fb_turns_cancel(&t, &G[0], 40 * MS);
    CHECK(G[0].vtime[0] == 10.0);
    CHECK_INT_EQ(G[0].at_ns, 45 * MS);
    CHECK(fb_turns_is_next(&t, &G[0])); /* at 45, before B's end at 50 */
    for (int i = 0; i < 3; i++) fb_turns_leave(&t, &G[i], 0);
}

static void test_bad_turns(void)
{
    char msg[256];
    fb_turn g;
    memset(&g, 0x5a, sizeof g);
    fb_turn before = g;
    const int ok[1] = {0}, out[2] = {0, 4}, neg[1] = {-1};
    struct {
        double share;
        const int *devs;
        int n;
        int64_t step_ns;
        const char *says;
    } bad[] = {
        {0, ok, 1, 0, "a time share must be in (0, 1], not 0"},
        {1.5, ok, 1, 0, "not 1.5"},
        {NAN, ok, 1, 0, "not nan"},
        {1, ok, 0, 0, "1..64 devices, not 0"},
        {1, NULL, 1, 0, "1..64 devices"},
        {1, ok, 65, 0, "not 65"},
        {1, out, 2, 0, "device 4 does not exist (there are 4)"},
        {1, neg, 1, 0, "device -1 does not exist"},
        {1, ok, 1, -1, "a scripted step of -1 ns"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msg[0] = '\0';
        CHECK_INT_EQ(fb_turn_init(&g, 4, 1, bad[i].share, bad[i].devs, bad[i].n, bad[i].step_ns,
                                  NULL, msg, sizeof msg),
                     FB_ERR_OUT_OF_RANGE);
        if (!strstr(msg, bad[i].says)) {
            fprintf(stderr, "case %zu: '%s' does not say '%s'\n", i, msg, bad[i].says);
            CHECK(0);
        }
        CHECK(memcmp(&g, &before, sizeof g) == 0);
    }
}

int main(void)
{
    test_three_to_one();
    test_newcomer();
    test_span_and_leave();
    test_leader_wait();
    test_scripted_ends();
    test_bad_turns();
    printf("test_turns: ok\n");
    return 0;
}
