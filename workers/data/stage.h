/*
 * Node-local staging: a bounded cache of shard files on fast local storage.
 *
 * On first use a shard is copied from the dataset directory (often a shared
 * file system) into the cache directory and checked against the manifest's
 * size and whole-file CRC32C on the way; later uses read the local copy,
 * which is checked again (size and CRC32C) each time it is staged, so a
 * corrupt or truncated cache entry is thrown away and copied afresh.  The
 * cache holds at most max_bytes of shards; when a new shard needs room the
 * least recently used entries (of other splits or datasets) are evicted.
 * The shards of the split being staged are never evicted by that same call:
 * a split larger than the bound is staged as far as it fits and the rest is
 * read in place (after the same size and checksum check).
 *
 * Cached files are named by content ("<crc32c>-<bytes>-<file name>"), so two
 * datasets with an identical shard share one copy.  The cache's index.json
 * records each entry's size and last use; processes on one node share a
 * cache safely (an exclusive flock on <cache>/lock covers every change).  A
 * missing or unreadable index is rebuilt from the files present.
 *
 * Functions that can fail return 0 or a negative fb_err and fill the
 * caller's message buffer (msg, msg_cap); on failure outputs are untouched.
 */
#ifndef FB_WORKERS_DATA_STAGE_H
#define FB_WORKERS_DATA_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "manifest.h"

#define FB_STAGE_INDEX "index.json"
#define FB_STAGE_PATH_MAX 4096

/* What one staging call did. */
typedef struct fb_stage_stats {
    int hits;            /* shards already cached and verified */
    int copied;          /* shards copied in (first use) */
    int restaged;        /* cached copies that failed verification and were copied again */
    int evicted;         /* entries removed to make room */
    int uncached;        /* shards larger than the room left: read in place */
    uint64_t bytes_copied;
    uint64_t bytes_verified;
    double seconds;
} fb_stage_stats;

/*
 * Stages every shard of split of the dataset in dataset_dir (described by
 * m) into cache_dir (created if missing), keeping the cache at most
 * max_bytes.  paths must hold one FB_STAGE_PATH_MAX buffer per shard of the
 * split; each receives the path to read that shard from: the cached copy,
 * or the original when it could not be given room (stats->uncached).
 * stats may be NULL.  FB_ERR_DATA when an original does not match the
 * manifest (size or checksum; the message names it), FB_ERR_IO,
 * FB_ERR_NOMEM, FB_ERR_NOT_FOUND for an unknown split.
 */
int fb_stage_split(char (*paths)[FB_STAGE_PATH_MAX], fb_stage_stats *stats, const char *cache_dir,
                   uint64_t max_bytes, const char *dataset_dir, const fb_manifest *m,
                   const char *split, char *msg, size_t msg_cap);

/* Total bytes of the shards the cache at cache_dir holds now (0 when it does
 * not exist). */
uint64_t fb_stage_cache_bytes(const char *cache_dir);

#endif
