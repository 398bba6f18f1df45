/*
 * libFuzzer target for the job-spec parser.  Beyond "never crash, never
 * leak", it checks a property: any spec the parser accepts has a canonical
 * form that parses back to the same canonical text and the same fusion key.
 */
#include "jobspec.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fb_job_spec s;
    char msg[512];
    if (fb_job_spec_parse((const char *)data, size, NULL, &s, msg, sizeof msg) != FB_OK) return 0;
    char *canon = fb_job_spec_canonical(&s);
    if (!canon) abort();
    fb_job_spec t;
    if (fb_job_spec_parse(canon, strlen(canon), NULL, &t, msg, sizeof msg) != FB_OK) {
        fprintf(stderr, "canonical form rejected: %s\n%s\n", msg, canon);
        abort();
    }
    char *again = fb_job_spec_canonical(&t);
    if (!again || strcmp(canon, again) != 0 || strcmp(s.fusion_key, t.fusion_key) != 0) {
        fprintf(stderr, "canonical form is not a fixed point:\n%s\n%s\n", canon, again);
        abort();
    }
    free(again);
    free(canon);
    fb_job_spec_free(&t);
    fb_job_spec_free(&s);
    return 0;
}
