/*
 * libFuzzer target for the list and series query values fuseboxd parses
 * itself: list cursors (the seq of the last item) and the metric series of
 * ?fields=.  Properties: an accepted cursor is 1..18 decimal digits, so it
 * fits an SQL bigint; an accepted field list names only known series, each
 * once, and writing the selection back as a list parses to the same
 * selection; a list with an unknown or empty name is refused.
 */
#include "routes.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *v = malloc(size + 1);
    if (!v) return 0;
    memcpy(v, data, size);
    v[size] = '\0';

    if (fb_cursor_seq_ok(v)) {
        size_t n = strlen(v);
        if (n == 0 || n > 18) FAIL("cursor of %zu digits accepted", n);
        for (size_t i = 0; i < n; i++)
            if (v[i] < '0' || v[i] > '9') FAIL("cursor \"%s\" accepted", v);
        if (strtoll(v, NULL, 10) < 0) FAIL("cursor \"%s\" overflows", v);
    }

    int sel[FB_METRIC_FIELDS], n_sel = -1;
    if (fb_metric_fields_parse(v, sel, &n_sel)) {
        if (n_sel < 1 || n_sel > FB_METRIC_FIELDS) FAIL("%d series selected", n_sel);
        char list[512] = "";
        size_t used = 0;
        for (int i = 0; i < n_sel; i++) {
            const char *name = fb_metric_field_name(sel[i]);
            if (!name) FAIL("series %d selected", sel[i]);
            for (int k = 0; k < i; k++)
                if (sel[k] == sel[i]) FAIL("%s selected twice", name);
            if (!strstr(v, name)) FAIL("%s selected, not named", name);
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? "," : "", name);
        }
        int again[FB_METRIC_FIELDS], n_again = -1;
        if (!fb_metric_fields_parse(list, again, &n_again) || n_again != n_sel ||
            memcmp(again, sel, (size_t)n_sel * sizeof *sel) != 0)
            FAIL("\"%s\" does not parse back to its selection", list);
    } else {
        /* refused: some comma-separated part is not a series name */
        bool all_known = true;
        size_t parts = 0;
        const char *p = v;
        for (;;) {
            const char *end = strchr(p, ',');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            bool known = false;
            for (int i = 0; i < FB_METRIC_FIELDS; i++) {
                const char *name = fb_metric_field_name(i);
                if (strlen(name) == len && strncmp(name, p, len) == 0) known = true;
            }
            all_known &= known;
            parts++;
            if (!end) break;
            p = end + 1;
        }
        if (all_known) FAIL("\"%s\" (%zu known names) refused", v, parts);
    }
    free(v);
    return 0;
}
