/*
 * libFuzzer target for the manifest parser (api/manifest.h), the one
 * fusebox-data, the workers and fuseboxd all read manifest.json with: any
 * input must be refused with FB_ERR_DATA (or FB_ERR_NOMEM) and a message,
 * or accepted as a manifest that keeps the format's rules (names, limits,
 * counts that add up, no shard listed twice, a vocabulary exactly for int32
 * token datasets, no labels only for them) and whose canonical JSON parses
 * back to the same manifest and the same text.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "manifest.h"

/* A relative path none of whose components is empty, "." or "..": it names
 * a file inside the dataset directory. */
static int path_inside(const char *p)
{
    if (!*p) return 0;
    for (const char *seg = p;;) {
        size_t n = strcspn(seg, "/");
        if (n == 0 || (n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.'))
            return 0;
        if (!seg[n]) return 1;
        seg += n + 1;
    }
}

/* The rules fb_manifest_parse promises of what it accepts. */
static void check_rules(const fb_manifest *m)
{
    if (!fb_manifest_valid_name(m->name)) FAIL("accepted name \"%s\"", m->name);
    if (!fb_data_dtype_name(m->dtype)) FAIL("accepted dtype %d", (int)m->dtype);
    int tokens = m->dtype == FB_DTYPE_I32;
    if (m->n_classes < (tokens ? 0 : 1) || m->n_classes > FB_MANIFEST_MAX_CLASSES)
        FAIL("accepted %d classes for dtype %d", m->n_classes, (int)m->dtype);
    if (tokens ? m->vocab < 1 || m->vocab > FB_MANIFEST_MAX_VOCAB : m->vocab != 0)
        FAIL("accepted vocab %lld for dtype %d", (long long)m->vocab, (int)m->dtype);
    if (tokens && m->ndim != 1) FAIL("accepted %d dimensions for tokens", m->ndim);
    if (m->ndim != 0 && m->ndim != 1 && m->ndim != 3) FAIL("accepted %d dimensions", m->ndim);
    int64_t numel = m->ndim ? 1 : 0;
    for (int i = 0; i < m->ndim; i++) numel *= m->shape[i];
    if (numel != m->sample_numel || numel > FB_MANIFEST_MAX_SAMPLE_NUMEL)
        FAIL("sample_numel %lld for the shape (%lld)", (long long)m->sample_numel,
             (long long)numel);
    if (m->n_splits < 1 || m->n_splits > FB_MANIFEST_MAX_SPLITS)
        FAIL("accepted %d splits", m->n_splits);
    for (int s = 0; s < m->n_splits; s++) {
        const fb_manifest_split *sp = &m->splits[s];
        if (!fb_manifest_valid_split_name(sp->name)) FAIL("accepted split \"%s\"", sp->name);
        if (fb_manifest_find_split(m, sp->name) != sp) FAIL("split %s found elsewhere", sp->name);
        if (sp->n_shards < 1 || sp->n_shards > FB_MANIFEST_MAX_SHARDS)
            FAIL("split %s has %d shards", sp->name, sp->n_shards);
        int64_t records = 0;
        for (int i = 0; i < sp->n_shards; i++) {
            const fb_manifest_shard *sh = &sp->shards[i];
            if (sh->chunks < 1 || sh->chunks > sh->records ||
                sh->bytes < FB_MANIFEST_MIN_SHARD_BYTES)
                FAIL("shard %s: %lld chunks, %lld records, %llu bytes", sh->path,
                     (long long)sh->chunks, (long long)sh->records,
                     (unsigned long long)sh->bytes);
            if (!path_inside(sh->path)) FAIL("accepted path \"%s\"", sh->path);
            records += sh->records;
            for (int t = 0; t <= s; t++)
                for (int j = 0; j < (t == s ? i : m->splits[t].n_shards); j++)
                    if (strcmp(m->splits[t].shards[j].path, sh->path) == 0)
                        FAIL("shard %s listed twice", sh->path);
        }
        if (records != sp->samples)
            FAIL("split %s: %lld samples, its shards hold %lld", sp->name,
                 (long long)sp->samples, (long long)records);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char msg[256];
    fb_manifest m;
    int rc = fb_manifest_parse(&m, (const char *)data, size, "fuzz", msg, sizeof msg);
    if (rc) {
        if ((rc != FB_ERR_DATA && rc != FB_ERR_NOMEM) || msg[0] == '\0')
            FAIL("refused with %d and message \"%s\"", rc, msg);
        return 0;
    }
    check_rules(&m);
    char *json = NULL, *again = NULL;
    if (fb_manifest_to_json(&json, &m, msg, sizeof msg) != 0)
        FAIL("an accepted manifest does not serialise: %s", msg);
    fb_manifest back;
    if (fb_manifest_parse(&back, json, strlen(json), "canonical", msg, sizeof msg) != 0)
        FAIL("the canonical JSON does not parse: %s", msg);
    if (fb_manifest_to_json(&again, &back, msg, sizeof msg) != 0 || strcmp(json, again) != 0)
        FAIL("the canonical JSON does not round-trip");
    if (back.n_splits != m.n_splits || back.sample_numel != m.sample_numel ||
        back.vocab != m.vocab || back.n_classes != m.n_classes)
        FAIL("the canonical JSON parses to another manifest");
    free(json);
    free(again);
    fb_manifest_free(&back);
    fb_manifest_free(&m);
    return 0;
}
