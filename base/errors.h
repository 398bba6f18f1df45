/*
 * fusebox error codes: the one table of failures that can reach a user.
 *
 * Recoverable failures anywhere in fusebox return a negative fb_err and fill a
 * caller-supplied message buffer.  Each code has a stable machine-readable
 * name (used as "code" in HTTP error bodies and wire messages) and the HTTP
 * status a server answers with.  Codes are only ever appended, never renumbered.
 */
#ifndef FB_BASE_ERRORS_H
#define FB_BASE_ERRORS_H

#include <stddef.h>

/* X(enum name, value, code string, http status, short description) */
#define FB_ERR_TABLE(X)                                                                            \
    X(FB_OK, 0, "ok", 200, "success")                                                             \
    X(FB_ERR_NOMEM, -1, "out_of_memory", 503, "memory allocation failed")                          \
    X(FB_ERR_IO, -2, "io_error", 500, "a file or device operation failed")                          \
    X(FB_ERR_INTERNAL, -3, "internal", 500, "an internal invariant failed")                          \
    X(FB_ERR_JSON_SYNTAX, -10, "json_syntax", 400, "the body is not well-formed JSON")              \
    X(FB_ERR_NOT_OBJECT, -11, "not_object", 400, "a JSON object was expected")                      \
    X(FB_ERR_UNKNOWN_FIELD, -12, "unknown_field", 400, "a field is not part of the contract")       \
    X(FB_ERR_MISSING_FIELD, -13, "missing_field", 400, "a required field is absent")                \
    X(FB_ERR_WRONG_TYPE, -14, "wrong_type", 400, "a field has the wrong JSON type")                 \
    X(FB_ERR_OUT_OF_RANGE, -15, "out_of_range", 400, "a value is outside its allowed range")        \
    X(FB_ERR_BAD_ENUM, -16, "bad_enum", 400, "a value is not one of the allowed names")             \
    X(FB_ERR_CONFLICT, -17, "conflicting_fields", 400, "fields exclude each other")                 \
    X(FB_ERR_BAD_NAME, -18, "bad_name", 400, "a name has characters or length not allowed")         \
    X(FB_ERR_TOO_MANY_LAYERS, -20, "too_many_layers", 400, "the model has too many layers")         \
    X(FB_ERR_DIM_TOO_LARGE, -21, "dimension_too_large", 400, "a tensor dimension is too large")     \
    X(FB_ERR_SHAPE_MISMATCH, -22, "shape_mismatch", 400, "layer shapes do not chain")               \
    X(FB_ERR_KERNEL_TOO_LARGE, -23, "kernel_too_large", 400, "a window is larger than its input")   \
    X(FB_ERR_TOO_MANY_PARAMS, -24, "too_many_parameters", 400, "the model exceeds the parameter bound") \
    X(FB_ERR_NESTING_TOO_DEEP, -25, "nesting_too_deep", 400, "residual blocks nest too deeply")     \
    X(FB_ERR_BAD_LOSS, -26, "bad_loss", 400, "the loss does not fit the model output")              \
    X(FB_ERR_NOT_FUSIBLE, -30, "not_fusible", 400, "specs do not share a fusion key")               \
    X(FB_ERR_DATA, -40, "bad_data", 400, "a dataset file is missing, corrupt or does not fit")      \
    X(FB_ERR_CHECKPOINT, -41, "bad_checkpoint", 400, "a weights file is corrupt or does not fit")   \
    X(FB_ERR_UNSUPPORTED, -42, "unsupported", 501, "the operation is not supported here")           \
    X(FB_ERR_NOT_FOUND, -43, "not_found", 404, "the object does not exist")                       \
    X(FB_ERR_UNAUTHORIZED, -50, "unauthorized", 401, "no valid API key was presented")            \
    X(FB_ERR_FORBIDDEN, -51, "forbidden", 403, "the key may not use this route")                  \
    X(FB_ERR_NO_ROUTE, -52, "route_not_found", 404, "no route has this path")                     \
    X(FB_ERR_METHOD_NOT_ALLOWED, -53, "method_not_allowed", 405, "the route has no such method")  \
    X(FB_ERR_PAYLOAD_TOO_LARGE, -54, "payload_too_large", 413, "the body exceeds the size limit") \
    X(FB_ERR_UNSUPPORTED_MEDIA_TYPE, -55, "unsupported_media_type", 415,                          \
      "the body is not application/json")                                                         \
    X(FB_ERR_RATE_LIMITED, -56, "rate_limited", 429, "too many requests; retry later")            \
    X(FB_ERR_UNAVAILABLE, -57, "unavailable", 503, "the database is unreachable or busy; retry")  \
    X(FB_ERR_STATE_CONFLICT, -58, "state_conflict", 409, "the object's state forbids this")       \
    X(FB_ERR_IDEMPOTENCY_CONFLICT, -59, "idempotency_conflict", 422,                              \
      "an Idempotency-Key was reused with a different request")                                   \
    X(FB_ERR_QUOTA_EXCEEDED, -60, "quota_exceeded", 403, "a tenant quota would be exceeded")      \
    X(FB_ERR_ALREADY_EXISTS, -61, "already_exists", 409, "an object with this name exists")       \
    X(FB_ERR_BAD_QUERY, -62, "bad_query", 400, "a query parameter is malformed or out of range")  \
    X(FB_ERR_JSON_TOO_DEEP, -63, "json_too_deep", 400, "the body nests arrays/objects too deeply") \
    X(FB_ERR_BAD_HEADER, -64, "bad_header", 400, "a request header is malformed")                 \
    X(FB_ERR_BAD_ENCODING, -65, "bad_encoding", 400, "the body is not valid UTF-8")               \
    X(FB_ERR_NO_MODEL, -66, "no_model", 404, "the job has no exported model yet")                 \
    X(FB_ERR_TOO_MANY_TRIALS, -67, "too_many_trials", 400, "a sweep expands into too many jobs") \
    X(FB_ERR_BAD_WIRE, -68, "bad_wire_message", 400, "a wire message is malformed or stale")     \
    X(FB_ERR_DIVERGED, -69, "diverged", 422, "training produced a non-finite loss")              \
    X(FB_ERR_DETACHED, -70, "detached", 409, "the member left its array")                        \
    X(FB_ERR_NO_SPACE, -71, "insufficient_storage", 507,                                          \
      "the server's storage is full; retry once space is freed")                                \
    X(FB_ERR_UNKNOWN_REFERENCE, -72, "unknown_reference", 400,                                    \
      "a field names a dataset or artifact the tenant does not have")

typedef enum fb_err {
#define FB_ERR_ENUM_(name, value, code, http, desc) name = value,
    FB_ERR_TABLE(FB_ERR_ENUM_)
#undef FB_ERR_ENUM_
} fb_err;

/* Stable machine-readable name of an error ("unknown_field"); "unknown" for a
 * value not in the table. */
const char *fb_err_code(int err);

/* HTTP status a server answers with for this error (500 for unknown values). */
int fb_err_http_status(int err);

/* One-line human description of the error class. */
const char *fb_err_describe(int err);

/* Parses a code name back to its value; returns 1 and sets *out on success, 0
 * when the name is unknown. */
int fb_err_from_code(const char *code, int *out);

/* The error of a failed write with errno e: FB_ERR_NO_SPACE when the file
 * system or a quota is full (ENOSPC, EDQUOT), the machine's state rather
 * than the request's, which may succeed once space is freed; FB_ERR_IO
 * otherwise. */
int fb_err_write_errno(int e);

/* Formats a message into buf (always NUL-terminated when cap > 0) and returns
 * err, so callers can write `return fb_errf(msg, msg_cap, FB_ERR_X, "...", ...)`. */
int fb_errf(char *buf, size_t cap, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
