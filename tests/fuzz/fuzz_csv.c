/*
 * libFuzzer target for CSV import (fb_datadir_import_csv), what a tenant's
 * upload goes through on the server.  The input is written to a file and
 * imported into a scratch dataset directory with the label in column
 * "label" (or column 0 when the first line is not a header).  Beyond "never
 * crash, never leak" it checks properties: an accepted file imports at
 * least one record, its split loads back with exactly the imported count,
 * every value finite and every label below the class count; a refused file
 * leaves no split behind.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include "datadir.h"

#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"

static char root[64];

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void cleanup(void)
{
    if (root[0]) nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!root[0]) {
        snprintf(root, sizeof root, "/tmp/fuzz-csv-XXXXXX");
        if (!mkdtemp(root)) abort();
        atexit(cleanup);
    }
    char csv[128], out[128];
    snprintf(csv, sizeof csv, "%s/in.csv", root);
    snprintf(out, sizeof out, "%s/ds", root);
    nftw(out, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    FILE *f = fopen(csv, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f) != 0) abort();

    fb_import_opts o = {.out_dir = out, .name = "fuzz", .split = "train"};
    fb_import_result res;
    char msg[1024];
    bool header = size > 0 && data[0] >= 'a' && data[0] <= 'z';
    int err = fb_datadir_import_csv(&res, &o, csv, header ? "label" : "0", FB_CSV_HEADER_AUTO, msg,
                                    sizeof msg);
    char split[160];
    snprintf(split, sizeof split, "%s/train", out);
    if (err) {
        if (access(split, F_OK) == 0) {
            /* a refused import may leave the empty directory, never a shard */
            fb_dataset ds = {0};
            if (fb_datadir_load_split(&ds, out, "train", msg, sizeof msg) == FB_OK)
                FAIL("a refused import left a loadable split");
        }
        return 0;
    }
    if (res.samples < 1) FAIL("accepted with %lld records", (long long)res.samples);
    fb_dataset ds = {0};
    if (fb_datadir_load_split(&ds, out, "train", msg, sizeof msg) != FB_OK)
        FAIL("the imported split does not load: %s", msg);
    if (ds.n != res.samples) FAIL("%lld records imported, %lld load", (long long)res.samples,
                                  (long long)ds.n);
    size_t numel = (size_t)ds.n * (size_t)ds.C * (size_t)ds.H * (size_t)ds.W;
    for (size_t i = 0; i < numel; i++)
        if (!isfinite(ds.x[i])) FAIL("value %zu is not finite", i);
    for (int64_t i = 0; i < ds.n; i++)
        if (ds.y[i] < 0 || ds.y[i] >= ds.n_classes) FAIL("label %d of %d classes", ds.y[i],
                                                        ds.n_classes);
    fb_dataset_free(&ds);
    return 0;
}
