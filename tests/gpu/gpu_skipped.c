/*
 * Stand-in for the gpu tests in a build without CUDA (FUSEBOX_CUDA=OFF): it
 * reports skipped, so the gpu label exists in every build tree.
 */
#include <stdio.h>

#include "check.h"

int main(void)
{
    printf("SKIPPED: built without CUDA (FUSEBOX_CUDA=OFF)\n");
    return FB_TEST_SKIP;
}
