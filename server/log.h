/*
 * Structured logs: one JSON object per line on stderr.
 *
 * Every line carries "ts" (UTC, RFC 3339 with milliseconds), "level" and
 * "msg", plus whatever fields the caller adds, so that log shippers and jq can
 * read fuseboxd's output without parsing prose.  Lines are written whole under
 * a mutex; any thread may log.
 */
#ifndef FB_SERVER_LOG_H
#define FB_SERVER_LOG_H

#include <jansson.h>
#include <stdbool.h>

typedef enum fb_log_level { FB_LOG_DEBUG, FB_LOG_INFO, FB_LOG_WARN, FB_LOG_ERROR } fb_log_level;

/* Sets the lowest level that is written (default FB_LOG_INFO). */
void fb_log_set_level(fb_log_level level);

/* True when lines of this level are written; lets callers skip building
 * fields nobody will see. */
bool fb_log_enabled(fb_log_level level);

/* Parses "debug", "info", "warn" or "error"; returns 1 and sets *out, or 0. */
int fb_log_level_parse(const char *name, fb_log_level *out);

/*
 * Writes one line with message msg and the members of fields (an object, may
 * be NULL).  Takes ownership of fields (it is released here even when the
 * level is filtered out).
 */
void fb_log_json(fb_log_level level, const char *msg, json_t *fields);

/* Writes one line whose message is formatted printf-style. */
void fb_logf(fb_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
