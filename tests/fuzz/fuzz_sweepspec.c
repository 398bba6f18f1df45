/*
 * libFuzzer target for the sweep-spec parser.  Beyond "never crash, never
 * leak" it checks properties: an accepted sweep expands into 1..FB_SWEEP_MAX_TRIALS
 * trials whose specs parse on their own (what the server stores as jobs),
 * and its canonical form parses back to the same canonical text with the
 * same trials.
 */
#include "sweepspec.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fb_sweep_spec *s = NULL;
    char msg[512];
    if (fb_sweep_spec_parse((const char *)data, size, NULL, &s, msg, sizeof msg) != FB_OK) return 0;
    int n = fb_sweep_spec_n_trials(s);
    if (n < 1 || n > FB_SWEEP_MAX_TRIALS) FAIL("%d trials", n);
    for (int i = 0; i < n; i++) {
        const char *json = fb_sweep_spec_trial_json(s, i);
        fb_job_spec t;
        if (fb_job_spec_parse(json, strlen(json), NULL, &t, msg, sizeof msg) != FB_OK)
            FAIL("trial %d does not parse alone: %s\n%s", i, msg, json);
        if (strcmp(t.fusion_key, fb_sweep_spec_trial(s, i)->fusion_key) != 0)
            FAIL("trial %d's fusion key changes when its spec is parsed alone", i);
        fb_job_spec_free(&t);
    }
    char *canon = fb_sweep_spec_canonical(s);
    if (!canon) abort();
    fb_sweep_spec *again = NULL;
    if (fb_sweep_spec_parse(canon, strlen(canon), NULL, &again, msg, sizeof msg) != FB_OK)
        FAIL("canonical form rejected: %s\n%s", msg, canon);
    char *canon2 = fb_sweep_spec_canonical(again);
    if (!canon2 || strcmp(canon, canon2) != 0)
        FAIL("canonical form is not a fixed point:\n%s\n%s", canon, canon2 ? canon2 : "(null)");
    if (fb_sweep_spec_n_trials(again) != n) FAIL("the canonical form expands differently");
    for (int i = 0; i < n; i++)
        if (strcmp(fb_sweep_spec_trial_json(s, i), fb_sweep_spec_trial_json(again, i)) != 0)
            FAIL("trial %d differs after the canonical round trip", i);
    free(canon2);
    free(canon);
    fb_sweep_spec_free(again);
    fb_sweep_spec_free(s);
    return 0;
}
