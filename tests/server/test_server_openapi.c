/*
 * api/openapi.yaml is linted (Redocly's recommended rules plus
 * tests/server/openapi/redocly.yaml, every warning an error) and compared
 * with the server: every route of fb_routes[] is documented and nothing
 * else is, and the error-code enum is exactly the table of base/errors.h.
 * Skipped when node or `npm ci` in tests/server is missing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "errors.h"
#include "routes.h"

int main(void)
{
    const char *src = getenv("FB_SOURCE_DIR");
    CHECK(src != NULL);
    char path[1024], cmd[4096];
    snprintf(path, sizeof path, "%s/tests/server/node_modules/.bin/redocly", src);
    if (access(path, X_OK) != 0 || system("node --version > /dev/null 2>&1") != 0)
        return fb_test_missing("run `npm ci` in %s/tests/server (needs node)", src);
    char dir[] = "/tmp/fbt-openapi-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char routes[128], codes[128];
    snprintf(routes, sizeof routes, "%s/routes.txt", dir);
    snprintf(codes, sizeof codes, "%s/codes.txt", dir);
    FILE *f = fopen(routes, "w");
    CHECK(f != NULL);
    for (int i = 0; i < fb_n_routes; i++)
        fprintf(f, "%s %s\n", fb_routes[i].method, fb_routes[i].pattern);
    fclose(f);
    f = fopen(codes, "w");
    CHECK(f != NULL);
#define X_(name, value, code, http, desc) fprintf(f, "%s\n", code);
    FB_ERR_TABLE(X_)
#undef X_
    fclose(f);

    snprintf(cmd, sizeof cmd,
             "node '%s/tests/server/openapi/validate.mjs' '%s/api/openapi.yaml' --routes '%s' "
             "--codes '%s'",
             src, src, routes, codes);
    int rc = system(cmd);
    CHECK_INT_EQ(rc, 0);

    snprintf(cmd, sizeof cmd,
             "cd '%s/tests/server' && REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true"
             " NO_COLOR=1 node_modules/.bin/redocly lint --config openapi/redocly.yaml"
             " --max-problems 50 '%s/api/openapi.yaml' > '%s/lint.txt' 2>&1",
             src, src, dir);
    rc = system(cmd);
    snprintf(cmd, sizeof cmd, "grep -v '[═║╔╚]' '%s/lint.txt'", dir);
    if (system(cmd) != 0) fprintf(stderr, "(no lint output)\n");
    CHECK_INT_EQ(rc, 0);
    /* warnings fail too */
    snprintf(cmd, sizeof cmd, "grep -q 'You have [0-9]* warning' '%s/lint.txt'", dir);
    CHECK(system(cmd) != 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_INT_EQ(system(cmd), 0);
    printf("ok\n");
    return 0;
}
