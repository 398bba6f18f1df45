/*
 * Strict UTF-8 validation, the one check every input that must be text goes
 * through: HTTP bodies (server/http.c), strings of wire messages
 * (api/wire_encode.c), tensor names and metadata of safetensors files
 * (workers/io/safetensors.c).
 *
 * Well-formed means Table 3-7 of the Unicode standard: no overlong forms, no
 * surrogates (U+D800..U+DFFF), nothing above U+10FFFF, no stray continuation
 * byte, no sequence cut short.  A NUL byte is an ordinary one-byte character
 * to fb_utf8_valid(); fb_utf8_valid_str() stops at the first one.
 */
#ifndef FB_UTF8_H
#define FB_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* True when the n bytes at s are well-formed UTF-8.  Otherwise false, and
 * *bad_at (when bad_at is not NULL) is the offset of the first byte of the
 * first ill-formed sequence; it is untouched on success. */
bool fb_utf8_valid(const void *s, size_t n, size_t *bad_at);

/* The same for a NUL-terminated string. */
bool fb_utf8_valid_str(const char *s);

#endif
