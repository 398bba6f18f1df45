/*
 * What the libFuzzer targets share: FAIL, which reports a broken property
 * (printf-style, a line on stderr) and aborts, so that libFuzzer keeps the
 * input as a crash artifact.
 */
#ifndef FB_TESTS_FUZZ_H
#define FB_TESTS_FUZZ_H

#include <stdio.h>
#include <stdlib.h>

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        abort();                                                                                   \
    } while (0)

#endif
