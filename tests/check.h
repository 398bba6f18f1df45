/*
 * Minimal assertions for fusebox tests: never compiled out, and every failure
 * prints both operands, the expression, file and line, then aborts the test
 * process.  A test that cannot run here exits with FB_TEST_SKIP (77), which
 * ctest reports as skipped; fb_test_missing() decides whether a missing
 * prerequisite is such a skip or a failure.
 */
#ifndef FB_TESTS_CHECK_H
#define FB_TESTS_CHECK_H

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FB_TEST_SKIP 77

/* True under FUSEBOX_TEST_STRICT=1, which scripts/test (and so CI) sets: it
 * installs every prerequisite a test needs, so none may be missing. */
static inline bool fb_test_strict(void)
{
    const char *v = getenv("FUSEBOX_TEST_STRICT");
    return v && strcmp(v, "1") == 0;
}

/*
 * A prerequisite of the test, or of a part of it, is missing: PyTorch, the
 * test database, the npm modules, a data set.  why (printf format) says what
 * and how to get it.  Prints "SKIPPED: why" and returns FB_TEST_SKIP, for the
 * caller to skip that part or to exit with it; a developer running one test
 * by hand without the prerequisite gets a skip.  Under FUSEBOX_TEST_STRICT=1
 * a missing prerequisite is a failure: prints "FAILED: ..." and exits 1.
 */
__attribute__((format(printf, 1, 2))) static inline int fb_test_missing(const char *why, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, why);
    vsnprintf(msg, sizeof msg, why, ap);
    va_end(ap);
    fflush(stdout);
    if (fb_test_strict()) {
        printf("FAILED: a prerequisite is missing under FUSEBOX_TEST_STRICT=1: %s\n", msg);
        fflush(stdout);
        exit(1);
    }
    printf("SKIPPED: %s\n", msg);
    return FB_TEST_SKIP;
}

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        if (!(expr)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #expr);               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_INT_EQ(a, b)                                                                         \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_) {                                                                            \
            fprintf(stderr, "%s:%d: CHECK_INT_EQ(%s, %s) failed: %lld != %lld\n", __FILE__,        \
                    __LINE__, #a, #b, a_, b_);                                                     \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_STR_EQ(a, b)                                                                         \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (!a_ || !b_ || strcmp(a_, b_) != 0) {                                                   \
            fprintf(stderr, "%s:%d: CHECK_STR_EQ(%s, %s) failed: \"%s\" != \"%s\"\n", __FILE__,    \
                    __LINE__, #a, #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)");                     \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* |a - b| <= tol * max(1, |b|) */
#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);                             \
        double s_ = fabs(b_) > 1.0 ? fabs(b_) : 1.0;                                               \
        if (!(fabs(a_ - b_) <= t_ * s_)) {                                                         \
            fprintf(stderr, "%s:%d: CHECK_NEAR(%s, %s, %s) failed: %.9g vs %.9g (diff %.3g)\n",    \
                    __FILE__, __LINE__, #a, #b, #tol, a_, b_, fabs(a_ - b_));                      \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* A whole file, NUL-terminated (malloc'd; its length in *len when len is not NULL), or NULL
 * when it cannot be opened. */
static inline char *fb_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    CHECK(n >= 0);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    CHECK(b != NULL);
    CHECK(fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    b[n] = '\0';
    if (len) *len = (size_t)n;
    return b;
}

#endif
