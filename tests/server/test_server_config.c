/*
 * fuseboxd's configuration for the control lock and the installed layout:
 *
 * 1. --control-lock-poll-ms (and FUSEBOX_CONTROL_LOCK_POLL_MS): a table of bad
 *    values, each refused with a message naming the flag or variable, the
 *    configuration left as it was; good values, the default, and a flag
 *    winning over its variable;
 * 2. fb_path_beside_exe, which finds an installed fuseboxd's schema, dashboard
 *    and fusebox-data next to its own directory: a path that exists is joined
 *    to the executable's directory, one that does not, or does not fit, is
 *    refused with an empty result; and this test program, which is not
 *    installed, keeps the build tree's defaults.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config.h"
#include "errors.h"
#include "paths.h"

/* Parses argv (NULL-terminated) over the defaults into *cfg; the return of fb_config_parse. */
static int parse(fb_config *cfg, const char *const *args, char *msg, size_t cap)
{
    const char *argv[16] = {"fuseboxd", "--database-url", "postgresql://x/y"};
    int argc = 3;
    for (int i = 0; args[i]; i++) argv[argc++] = args[i];
    argv[argc] = NULL;
    msg[0] = '\0';
    return fb_config_parse(cfg, argc, (char **)argv, msg, cap);
}

static void check_poll_flag(void)
{
    static const struct {
        const char *what, *flag, *env, *names; /* names: what the message must name */
    } bad[] = {
        {"zero", "0", NULL, "--control-lock-poll-ms"},
        {"below the bound", "9", NULL, "--control-lock-poll-ms"},
        {"above the bound", "600001", NULL, "--control-lock-poll-ms"},
        {"negative", "-100", NULL, "--control-lock-poll-ms"},
        {"not a number", "1s", NULL, "--control-lock-poll-ms"},
        {"empty", "", NULL, "--control-lock-poll-ms"},
        {"huge", "99999999999999999999", NULL, "--control-lock-poll-ms"},
        {"variable out of range", NULL, "5", "FUSEBOX_CONTROL_LOCK_POLL_MS"},
        {"variable not a number", NULL, "often", "FUSEBOX_CONTROL_LOCK_POLL_MS"},
    };
    char msg[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fb_config cfg, before;
        fb_config_defaults(&cfg);
        before = cfg;
        if (bad[i].env) CHECK(setenv("FUSEBOX_CONTROL_LOCK_POLL_MS", bad[i].env, 1) == 0);
        const char *with_flag[] = {"--control-lock-poll-ms", bad[i].flag, NULL};
        const char *none[] = {NULL};
        int rc = parse(&cfg, bad[i].flag ? with_flag : none, msg, sizeof msg);
        unsetenv("FUSEBOX_CONTROL_LOCK_POLL_MS");
        printf("%-24s -> %d %s\n", bad[i].what, rc, msg);
        CHECK(rc < 0);
        CHECK(strstr(msg, bad[i].names) != NULL);
        CHECK(memcmp(&cfg, &before, sizeof cfg) == 0);
    }
    fb_config cfg;
    fb_config_defaults(&cfg);
    CHECK_INT_EQ(cfg.control_lock_poll_ms, 1000);
    const char *lo[] = {"--control-lock-poll-ms", "10", NULL};
    CHECK_INT_EQ(parse(&cfg, lo, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(cfg.control_lock_poll_ms, 10);
    const char *hi[] = {"--control-lock-poll-ms=600000", NULL};
    CHECK_INT_EQ(parse(&cfg, hi, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(cfg.control_lock_poll_ms, 600000);
    /* the variable, and the flag over it */
    CHECK(setenv("FUSEBOX_CONTROL_LOCK_POLL_MS", "250", 1) == 0);
    fb_config_defaults(&cfg);
    const char *none[] = {NULL};
    CHECK_INT_EQ(parse(&cfg, none, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(cfg.control_lock_poll_ms, 250);
    const char *flag[] = {"--control-lock-poll-ms", "300", NULL};
    CHECK_INT_EQ(parse(&cfg, flag, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(cfg.control_lock_poll_ms, 300);
    unsetenv("FUSEBOX_CONTROL_LOCK_POLL_MS");
}

static void check_beside_exe(void)
{
    char exe[PATH_MAX], dir[PATH_MAX], out[PATH_MAX], want[PATH_MAX + 8];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    CHECK(n > 0);
    exe[n] = '\0';
    snprintf(dir, sizeof dir, "%s", exe);
    *strrchr(dir, '/') = '\0';
    const char *base = strrchr(exe, '/') + 1;
    /* this program itself, next to itself */
    CHECK(fb_path_beside_exe(base, out, sizeof out));
    snprintf(want, sizeof want, "%s/%s", dir, base);
    CHECK_STR_EQ(out, want);
    CHECK(fb_path_beside_exe("..", out, sizeof out));
    snprintf(want, sizeof want, "%s/..", dir);
    CHECK_STR_EQ(out, want);
    /* missing, or too long for the buffer: refused, out empty */
    strcpy(out, "unchanged?");
    CHECK(!fb_path_beside_exe("no-such-file-beside-the-test", out, sizeof out));
    CHECK_STR_EQ(out, "");
    char small[8] = "x";
    CHECK(!fb_path_beside_exe(base, small, sizeof small));
    CHECK_STR_EQ(small, "");
    /* not installed: the defaults are the build tree's (the source schema/, the build's
     * web/www and fusebox-data), none of them under this program's directory */
    fb_config cfg;
    fb_config_defaults(&cfg);
    printf("defaults: schema %s, web %s, data tool %s\n", cfg.schema_dir, cfg.web_dir,
           cfg.data_tool);
    CHECK(strstr(cfg.schema_dir, "share/fusebox") == NULL);
    CHECK(strstr(cfg.web_dir, "share/fusebox") == NULL);
    CHECK(access(cfg.schema_dir, F_OK) == 0);
    CHECK(access(cfg.data_tool, X_OK) == 0);
}

int main(void)
{
    unsetenv("FUSEBOX_CONTROL_LOCK_POLL_MS");
    check_poll_flag();
    check_beside_exe();
    printf("ok\n");
    return 0;
}
