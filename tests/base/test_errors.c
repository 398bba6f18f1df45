/* The error table: codes are unique, round-trip by name, and map to HTTP. */
#include "check.h"
#include "errors.h"

int main(void)
{
    static const int all[] = {
#define X_(name, value, code, http, desc) name,
        FB_ERR_TABLE(X_)
#undef X_
    };
    size_t n = sizeof all / sizeof all[0];
    for (size_t i = 0; i < n; i++) {
        int back = 1;
        CHECK(fb_err_from_code(fb_err_code(all[i]), &back));
        CHECK_INT_EQ(back, all[i]);
        for (size_t j = 0; j < i; j++) {
            CHECK(all[i] != all[j]);
            CHECK(strcmp(fb_err_code(all[i]), fb_err_code(all[j])) != 0);
        }
        CHECK(fb_err_http_status(all[i]) >= 200 && fb_err_http_status(all[i]) < 600);
        CHECK(strlen(fb_err_describe(all[i])) > 0);
    }
    CHECK_STR_EQ(fb_err_code(12345), "unknown");
    CHECK_INT_EQ(fb_err_http_status(12345), 500);
    int out = 7;
    CHECK(!fb_err_from_code("no_such_code", &out));
    CHECK_INT_EQ(out, 7);
    char buf[8];
    CHECK_INT_EQ(fb_errf(buf, sizeof buf, FB_ERR_IO, "%s", "a long message"), FB_ERR_IO);
    CHECK_STR_EQ(buf, "a long ");
    CHECK_INT_EQ(fb_err_http_status(FB_ERR_UNKNOWN_FIELD), 400);
    CHECK_INT_EQ(fb_err_http_status(FB_ERR_NOT_FOUND), 404);
    printf("%zu error codes checked\n", n);
    return 0;
}
