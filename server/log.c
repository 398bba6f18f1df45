/*
 * Structured JSON log lines on stderr.
 */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_int log_level = FB_LOG_INFO;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static const char *const level_names[] = {"debug", "info", "warn", "error"};

void fb_log_set_level(fb_log_level level)
{
    atomic_store(&log_level, (int)level);
}

bool fb_log_enabled(fb_log_level level)
{
    return (int)level >= atomic_load(&log_level);
}

int fb_log_level_parse(const char *name, fb_log_level *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcmp(name, level_names[i]) == 0) {
            *out = (fb_log_level)i;
            return 1;
        }
    }
    return 0;
}

void fb_log_json(fb_log_level level, const char *msg, json_t *fields)
{
    if (!fb_log_enabled(level)) {
        json_decref(fields);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    json_t *line = json_object();
    if (!line) {
        json_decref(fields);
        return;
    }
    json_object_set_new(line, "ts", json_string(when));
    json_object_set_new(line, "level", json_string(level_names[level]));
    json_object_set_new(line, "msg", json_string(msg ? msg : ""));
    if (fields && json_is_object(fields)) json_object_update_missing(line, fields);
    json_decref(fields);
    char *text = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(line);
    if (!text) return;
    pthread_mutex_lock(&log_mu);
    fputs(text, stderr);
    fputc('\n', stderr);
    fflush(stderr);
    pthread_mutex_unlock(&log_mu);
    free(text);
}

void fb_logf(fb_log_level level, const char *fmt, ...)
{
    if (!fb_log_enabled(level)) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fb_log_json(level, msg, NULL);
}
