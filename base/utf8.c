/* Strict UTF-8 validation (utf8.h). */
#include "utf8.h"

#include <stdint.h>
#include <string.h>

/* The length of the well-formed sequence at s (at most n bytes), 0 when the
 * sequence is ill-formed or cut short. */
static size_t sequence_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    uint32_t cp, min;
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0) {
        len = 2, cp = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
        len = 3, cp = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
        len = 4, cp = c & 0x07, min = 0x10000;
    } else {
        return 0; /* a continuation byte, or 0xf8..0xff */
    }
    if (len > n) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

bool fb_utf8_valid(const void *s, size_t n, size_t *bad_at)
{
    const unsigned char *p = s;
    size_t i = 0;
    while (i < n) {
        size_t len = sequence_len(p + i, n - i);
        if (!len) {
            if (bad_at) *bad_at = i;
            return false;
        }
        i += len;
    }
    return true;
}

bool fb_utf8_valid_str(const char *s)
{
    return fb_utf8_valid(s, strlen(s), NULL);
}
