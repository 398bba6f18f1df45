/*
 * The control loop's copy of the queue: every queued job with what the
 * planner reads of it, kept in memory between plans and brought up to date
 * from the queue_changes table (schema/007) instead of read whole each time.
 *
 * A plan over a queue of 10,000 jobs used to spend about 40 ms reading it;
 * with this copy a plan reads only the jobs that entered, left or changed
 * since the last one.  The triggers that fill queue_changes run in the
 * transactions that change the jobs; the rows are taken with DELETE ...
 * RETURNING and the jobs they name read again afterwards, so every change a
 * sync takes is read in a state at least as new, and the copy equals what a
 * full read would have returned whatever order other transactions commit in.
 * A copy whose state is in doubt (a new connection, a failure after the rows
 * were taken) is read whole on the next sync.
 *
 * Not thread-safe: the control loop's thread owns it.
 */
#ifndef FB_QUEUE_H
#define FB_QUEUE_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FB_QUEUE_ID_LEN 36

/* One queued job as the planner and the ASSIGN need it. */
typedef struct fb_queue_job {
    char id[FB_QUEUE_ID_LEN + 1];
    char tenant_id[FB_QUEUE_ID_LEN + 1];
    int64_t seq;
    int64_t resume_step;
    int priority;
    bool public_dataset; /* a public built-in named as itself: arrays may mix tenants */
    char *fusion_key;
    char *queue_reason;  /* "" when none */
    char *resume_path;   /* NULL when it starts from step 0 */
    char *dataset;       /* the spec's dataset name */
    char *builtin;       /* the built-in the tenant's alias `dataset` stands for, NULL if none */
    char *init_path;     /* the init artifact (relative to the artifacts dir), NULL if none */
} fb_queue_job;

typedef struct fb_queue fb_queue;

/* An empty copy, invalid until its first fb_queue_sync; NULL when out of memory.
 * public_datasets is --public-datasets (NULL or "": the built-ins only). */
fb_queue *fb_queue_new(const char *public_datasets);

/* Frees the copy; NULL is fine. */
void fb_queue_free(fb_queue *q);

/* Makes the next fb_queue_sync read the whole queue (after a reconnect). */
void fb_queue_invalidate(fb_queue *q);

/*
 * Brings the copy up to date over pg: the whole queue when the copy is
 * invalid, else the jobs recorded in queue_changes.  Returns 0, or a negative
 * fb_err with msg set; on failure the copy is left invalid unless the change
 * rows are known to be still in the table.  *read_rows (may be NULL) gets the
 * number of job rows the sync read.
 */
int fb_queue_sync(fb_queue *q, PGconn *pg, int *read_rows, char *msg, size_t msg_cap);

/* Vacuums the change table after many rows were taken from it: a cheap
 * statement, outside any transaction, for the loop's idle moments. */
void fb_queue_maintain(fb_queue *q, PGconn *pg);

/*
 * The queued jobs in planning order (priority descending, then submission),
 * at most limit of them.  The array and the jobs are owned by the copy and
 * valid until its next sync or change.  Returns the count, or -1 when out of
 * memory.
 */
int fb_queue_ordered(fb_queue *q, int limit, const fb_queue_job *const **out);

/* Number of queued jobs in the copy. */
int fb_queue_count(const fb_queue *q);

/* Records the queue reason just written for a job (the triggers ignore it). */
void fb_queue_set_reason(fb_queue *q, const char *job_id, const char *reason);

#endif
