/*
 * Minimal assertions for fusebox tests: never compiled out, and every failure
 * prints both operands, the expression, file and line, then aborts the test
 * process.  A test that cannot run here exits with FB_TEST_SKIP (77), which
 * ctest reports as skipped.
 */
#ifndef FB_TESTS_CHECK_H
#define FB_TESTS_CHECK_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FB_TEST_SKIP 77

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

#endif
