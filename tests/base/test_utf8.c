/*
 * Strict UTF-8 (base/utf8.h), the one validator of HTTP bodies, wire strings
 * and safetensors names: a table of cases (the valid 1- to 4-byte forms at
 * their bounds, overlong forms, surrogates, code points above U+10FFFF,
 * stray and missing continuation bytes, truncated sequences), each with the
 * offset of the first bad sequence; then every code point encoded; then
 * every string of one to three bytes against the well-formed sequences of
 * Table 3-7 of the Unicode standard, written out here independently.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "utf8.h"

#define NO_BAD ((size_t)-1)

static const struct {
    const char *name;
    const char *bytes;
    size_t n;      /* 0: strlen(bytes) */
    size_t bad_at; /* NO_BAD: valid */
} cases[] = {
    {"empty", "", 0, NO_BAD},
    {"ASCII", "hello, world", 0, NO_BAD},
    {"NUL inside, counted by length", "a\0b", 3, NO_BAD},
    {"U+007F, the last 1-byte form", "\x7f", 0, NO_BAD},
    {"U+0080, the first 2-byte form", "\xc2\x80", 0, NO_BAD},
    {"U+07FF, the last 2-byte form", "\xdf\xbf", 0, NO_BAD},
    {"U+0800, the first 3-byte form", "\xe0\xa0\x80", 0, NO_BAD},
    {"U+D7FF, below the surrogates", "\xed\x9f\xbf", 0, NO_BAD},
    {"U+E000, above the surrogates", "\xee\x80\x80", 0, NO_BAD},
    {"U+FFFF, the last 3-byte form", "\xef\xbf\xbf", 0, NO_BAD},
    {"U+10000, the first 4-byte form", "\xf0\x90\x80\x80", 0, NO_BAD},
    {"U+10FFFF, the last code point", "\xf4\x8f\xbf\xbf", 0, NO_BAD},
    {"mixed text", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 0, NO_BAD},
    /* overlong forms */
    {"overlong NUL (C0 80)", "\xc0\x80", 0, 0},
    {"overlong / (C0 AF)", "a\xc0\xaf", 0, 1},
    {"overlong U+007F (C1 BF)", "\xc1\xbf", 0, 0},
    {"overlong 3-byte U+007F (E0 81 BF)", "\xe0\x81\xbf", 0, 0},
    {"overlong 3-byte U+07FF (E0 9F BF)", "ab\xe0\x9f\xbf", 0, 2},
    {"overlong 4-byte U+FFFF (F0 8F BF BF)", "\xf0\x8f\xbf\xbf", 0, 0},
    {"overlong 4-byte NUL (F0 80 80 80)", "x\xf0\x80\x80\x80", 0, 1},
    /* surrogates */
    {"U+D800, the first surrogate", "\xed\xa0\x80", 0, 0},
    {"U+DBFF U+DC00, a surrogate pair", "\xed\xaf\xbf\xed\xb0\x80", 0, 0},
    {"U+DFFF, the last surrogate", "ok\xed\xbf\xbf", 0, 2},
    /* beyond U+10FFFF */
    {"U+110000 (F4 90 80 80)", "\xf4\x90\x80\x80", 0, 0},
    {"F5 lead byte", "\xf5\x80\x80\x80", 0, 0},
    {"F7 BF BF BF", "\xf7\xbf\xbf\xbf", 0, 0},
    {"F8, a 5-byte lead", "\xf8\x88\x80\x80\x80", 0, 0},
    {"FE", "\xfe", 0, 0},
    {"FF", "a\xff", 0, 1},
    /* continuation bytes out of place */
    {"a lone continuation byte", "\x80", 0, 0},
    {"a continuation byte after a complete one", "\xc3\xa9\xbf", 0, 2},
    {"2-byte lead, then ASCII", "\xc2\x41", 0, 0},
    {"3-byte lead, bad second byte", "\xe2\x28\xa1", 0, 0},
    {"3-byte lead, bad third byte", "\xe2\x82\x28", 0, 0},
    {"4-byte lead, bad fourth byte", "\xf0\x9f\x98\x28", 0, 0},
    /* truncated at the end */
    {"2-byte lead at the end", "abc\xc2", 0, 3},
    {"3-byte sequence cut after 2", "\xe2\x82", 0, 0},
    {"4-byte sequence cut after 3", "z\xf0\x9f\x98", 0, 1},
    {"4-byte sequence cut by the length", "\xf0\x9f\x98\x80", 3, 0},
    {"a NUL inside a sequence", "\xe2\0\xac", 3, 0},
};

/* Table 3-7 of the Unicode standard: the well-formed byte sequences.  The
 * length of the sequence at s (n bytes available), 0 when ill-formed. */
static size_t table_len(const unsigned char *s, size_t n)
{
    static const struct {
        unsigned char lo[4], hi[4];
        size_t len;
    } rows[] = {
        {{0x00}, {0x7f}, 1},
        {{0xc2, 0x80}, {0xdf, 0xbf}, 2},
        {{0xe0, 0xa0, 0x80}, {0xe0, 0xbf, 0xbf}, 3},
        {{0xe1, 0x80, 0x80}, {0xec, 0xbf, 0xbf}, 3},
        {{0xed, 0x80, 0x80}, {0xed, 0x9f, 0xbf}, 3},
        {{0xee, 0x80, 0x80}, {0xef, 0xbf, 0xbf}, 3},
        {{0xf0, 0x90, 0x80, 0x80}, {0xf0, 0xbf, 0xbf, 0xbf}, 4},
        {{0xf1, 0x80, 0x80, 0x80}, {0xf3, 0xbf, 0xbf, 0xbf}, 4},
        {{0xf4, 0x80, 0x80, 0x80}, {0xf4, 0x8f, 0xbf, 0xbf}, 4},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        if (rows[r].len > n) continue;
        bool ok = true;
        for (size_t k = 0; k < rows[r].len && ok; k++)
            ok = s[k] >= rows[r].lo[k] && s[k] <= rows[r].hi[k];
        if (ok) return rows[r].len;
    }
    return 0;
}

/* The verdict of the table over n bytes, and where it stops. */
static bool table_valid(const unsigned char *s, size_t n, size_t *bad_at)
{
    size_t i = 0, len;
    while (i < n && (len = table_len(s + i, n - i)) > 0)
        i += len;
    *bad_at = i;
    return i == n;
}

/* Encodes cp (any value up to 0x10FFFF, surrogates too) the textbook way. */
static size_t encode(uint32_t cp, unsigned char *out)
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xc0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xe0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (unsigned char)(0xf0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

static void check_cases(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = cases[i].n ? cases[i].n : strlen(cases[i].bytes);
        size_t bad_at = 12345;
        bool ok = fb_utf8_valid(cases[i].bytes, n, &bad_at);
        printf("%-44s %s", cases[i].name, ok ? "valid" : "invalid");
        if (!ok) printf(" at %zu", bad_at);
        printf("\n");
        if (cases[i].bad_at == NO_BAD) {
            CHECK(ok);
            CHECK_INT_EQ(bad_at, 12345); /* untouched on success */
        } else {
            CHECK(!ok);
            CHECK_INT_EQ(bad_at, cases[i].bad_at);
        }
        CHECK(fb_utf8_valid(cases[i].bytes, n, NULL) == ok);
        /* the string form agrees wherever the case holds no NUL */
        if (!memchr(cases[i].bytes, '\0', n) && strlen(cases[i].bytes) == n)
            CHECK(fb_utf8_valid_str(cases[i].bytes) == ok);
        /* and the table of the standard agrees with the case */
        size_t t_bad;
        CHECK(table_valid((const unsigned char *)cases[i].bytes, n, &t_bad) == ok);
        if (!ok) CHECK_INT_EQ(t_bad, cases[i].bad_at);
    }
    /* the string form stops at the first NUL */
    CHECK(fb_utf8_valid_str("ok\0\xff"));
    CHECK(!fb_utf8_valid_str("\xe2\x82"));
}

static void check_code_points(void)
{
    unsigned char buf[4];
    size_t valid = 0;
    for (uint32_t cp = 0; cp <= 0x10ffff; cp++) {
        size_t n = encode(cp, buf);
        bool surrogate = cp >= 0xd800 && cp <= 0xdfff;
        bool ok = fb_utf8_valid(buf, n, NULL);
        if (ok == surrogate) {
            fprintf(stderr, "U+%04X (%zu bytes): %s\n", (unsigned)cp, n, ok ? "valid" : "invalid");
            CHECK(ok != surrogate);
        }
        valid += ok;
    }
    CHECK_INT_EQ(valid, 0x110000 - 0x800);
}

/* Every string of 1, 2 and 3 bytes (16.8 million), validator against table. */
static void check_all_short_strings(void)
{
    unsigned char s[3];
    size_t count[4] = {0};
    for (uint32_t v = 0; v < (1u << 24); v++) {
        for (size_t n = 1; n <= 3; n++) {
            if (n < 3 && (v >> (8 * n)) != 0) continue;
            for (size_t k = 0; k < n; k++)
                s[k] = (unsigned char)(v >> (8 * k));
            size_t bad = NO_BAD, t_bad;
            bool ok = fb_utf8_valid(s, n, &bad);
            bool t_ok = table_valid(s, n, &t_bad);
            if (ok != t_ok || (!ok && bad != t_bad)) {
                fprintf(stderr, "%zu bytes %02x %02x %02x: %d at %zu, the table %d at %zu\n", n,
                        s[0], n > 1 ? s[1] : 0, n > 2 ? s[2] : 0, ok, bad, t_ok, t_bad);
                CHECK(ok == t_ok);
                CHECK_INT_EQ(bad, t_bad);
            }
            count[n] += ok;
        }
    }
    /* 128 one-byte characters; 1920 two-byte ones; 61440 three-byte ones */
    CHECK_INT_EQ(count[1], 128);
    CHECK_INT_EQ(count[2], 128 * 128 + 1920);
    CHECK_INT_EQ(count[3], 128 * 128 * 128 + 2 * 128 * 1920 + 61440);
}

int main(void)
{
    check_cases();
    check_code_points();
    check_all_short_strings();
    printf("ok\n");
    return 0;
}
