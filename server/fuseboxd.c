/*
 * fuseboxd: fusebox's control-plane server.  See server.h and `fuseboxd
 * --help`; docs/api.md describes the API it serves.
 */
#include <stdio.h>
#include <sys/resource.h>

#include "config.h"
#include "errors.h"
#include "log.h"
#include "server.h"

int main(int argc, char **argv)
{
    fb_config cfg;
    char msg[1024];
    fb_config_defaults(&cfg);
    int rc = fb_config_parse(&cfg, argc, argv, msg, sizeof msg);
    if (rc == 1) return 0;
    if (rc) {
        fprintf(stderr, "fuseboxd: %s\n", msg);
        return 2;
    }
    fb_log_set_level(cfg.log_level);
    /* before any thread reads the clock */
    if (fb_config_apply_test_clock(&cfg, msg, sizeof msg)) {
        fprintf(stderr, "fuseboxd: %s\n", msg);
        return 2;
    }
    /* every HTTP connection is a descriptor: allow what the hard limit allows */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    fb_server_block_signals();
    fb_server *srv = fb_server_new(&cfg, msg, sizeof msg);
    if (!srv) {
        fb_log_json(FB_LOG_ERROR, "fuseboxd cannot start", json_pack("{s:s}", "detail", msg));
        return 1;
    }
    int unfinished = fb_server_run(srv);
    fb_server_free(srv);
    return unfinished ? 1 : 0;
}
