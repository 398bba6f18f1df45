#include "errors.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

struct fb_err_row {
    int value;
    const char *code;
    int http;
    const char *desc;
};

static const struct fb_err_row fb_err_rows[] = {
#define FB_ERR_ROW_(name, value, code, http, desc) {value, code, http, desc},
    FB_ERR_TABLE(FB_ERR_ROW_)
#undef FB_ERR_ROW_
};

static const struct fb_err_row *fb_err_find(int err)
{
    for (size_t i = 0; i < sizeof fb_err_rows / sizeof fb_err_rows[0]; i++)
        if (fb_err_rows[i].value == err) return &fb_err_rows[i];
    return NULL;
}

const char *fb_err_code(int err)
{
    const struct fb_err_row *r = fb_err_find(err);
    return r ? r->code : "unknown";
}

int fb_err_http_status(int err)
{
    const struct fb_err_row *r = fb_err_find(err);
    return r ? r->http : 500;
}

const char *fb_err_describe(int err)
{
    const struct fb_err_row *r = fb_err_find(err);
    return r ? r->desc : "unknown error";
}

int fb_err_from_code(const char *code, int *out)
{
    for (size_t i = 0; i < sizeof fb_err_rows / sizeof fb_err_rows[0]; i++) {
        if (strcmp(fb_err_rows[i].code, code) == 0) {
            *out = fb_err_rows[i].value;
            return 1;
        }
    }
    return 0;
}

int fb_errf(char *buf, size_t cap, int err, const char *fmt, ...)
{
    if (buf && cap > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, cap, fmt, ap);
        va_end(ap);
    }
    return err;
}

int fb_err_write_errno(int e)
{
    return e == ENOSPC || e == EDQUOT ? FB_ERR_NO_SPACE : FB_ERR_IO;
}
