/*
 * fusebox error codes: the one table of failures that can reach a user.
 *
 * Recoverable failures anywhere in fusebox return a negative fb_err and fill a
 * caller-supplied message buffer.  Each code has a stable machine-readable
 * name (used as "code" in HTTP error bodies and wire messages) and the HTTP
 * status a server answers with.  Codes are only ever appended, never renumbered.
 */
#ifndef FB_API_ERRORS_H
#define FB_API_ERRORS_H

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
    X(FB_ERR_NOT_FOUND, -43, "not_found", 404, "the object does not exist")

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

/* Formats a message into buf (always NUL-terminated when cap > 0) and returns
 * err, so callers can write `return fb_errf(msg, cap, FB_ERR_X, "...", ...)`. */
int fb_errf(char *buf, size_t cap, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
