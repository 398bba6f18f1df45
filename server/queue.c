/*
 * The control loop's copy of the queue (queue.h).  Jobs are kept one
 * allocation each in an unordered array, found by id through an
 * open-addressing hash table; the planning order is sorted on demand (a
 * 10,000-job sort is well under a millisecond, cheaper than keeping an order
 * up to date through every change).
 */
#include "queue.h"

#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "errors.h"
#include "config.h"

/* Columns both reads return, in this order: id, seq, tenant, fusion key, resume step,
 * priority, the dataset's source (NULL: not registered), queue reason, resume path, the
 * spec's dataset name, the built-in a registered built-in stands for, the init artifact.
 * job_from_row decides from them where the worker reads the data (dataset_place). */
#define JOB_COLUMNS                                                                                \
    " j.seq, j.tenant_id, j.fusion_key, j.resume_step, j.priority,"                                \
    " ds.source, coalesce(j.queue_reason, ''), j.resume_path, j.dataset,"                          \
    " ds.manifest->>'builtin', j.init_path"
#define JOIN_DATASET " LEFT JOIN datasets ds ON ds.tenant_id = j.tenant_id AND ds.name = j.dataset"

/* the whole queue; the change rows it makes obsolete go in the same snapshot */
static const char SQL_FULL[] = "WITH taken AS (DELETE FROM queue_changes)"
                               " SELECT j.id," JOB_COLUMNS " FROM jobs j" JOIN_DATASET
                               " WHERE j.state = 'queued'";
/* the change rows, taken */
static const char SQL_TAKE[] = "DELETE FROM queue_changes RETURNING job_id, tenant_id, dataset";
/* the jobs they name and the queued jobs of the datasets they name, as they stand now; a
 * job that is no longer queued comes back with NULL columns.  Separate from the DELETE so
 * that the planner sees the arrays' sizes and looks the jobs up by index: a change that a
 * transaction commits between the two statements is read here already and again with its
 * own row on the next sync, which is harmless. */
static const char SQL_READ[] = "WITH ids AS (SELECT unnest($1::uuid[]) AS id"
                               "  UNION SELECT q.id FROM unnest($2::uuid[], $3::text[]) AS"
                               "  t(tid, ds) JOIN jobs q ON q.tenant_id = t.tid"
                               "  AND q.dataset = t.ds AND q.state = 'queued')"
                               " SELECT ids.id," JOB_COLUMNS " FROM ids"
                               " LEFT JOIN jobs j ON j.id = ids.id AND j.state = 'queued'"
                               JOIN_DATASET;

/* change rows taken before fb_queue_maintain vacuums their table */
#define VACUUM_AFTER 2000

struct fb_queue {
    fb_queue_job **jobs; /* unordered */
    int n, cap;
    int *slots; /* hash table: 0 empty, -1 removed, else index into jobs + 1 */
    int n_slots, n_used; /* n_used counts live and removed slots */
    const fb_queue_job **order;
    int cap_order;
    bool valid;
    int64_t taken; /* change rows taken since the table was last vacuumed */
    char *public_datasets; /* --public-datasets */
};

static uint64_t hash_id(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static void job_free(fb_queue_job *j)
{
    if (!j) return;
    free(j->fusion_key);
    free(j->queue_reason);
    free(j->resume_path);
    free(j->dataset);
    free(j->builtin);
    free(j->init_path);
    free(j);
}

/* Slot of id, or of where it would go (the first removed slot on its path, else the
 * empty one that ends it). */
static int find_slot(const fb_queue *q, const char *id, bool *found)
{
    size_t mask = (size_t)q->n_slots - 1;
    size_t i = (size_t)hash_id(id) & mask;
    int free_slot = -1;
    for (;;) {
        int s = q->slots[i];
        if (s == 0) {
            *found = false;
            return free_slot >= 0 ? free_slot : (int)i;
        }
        if (s < 0) {
            if (free_slot < 0) free_slot = (int)i;
        } else if (strcmp(q->jobs[s - 1]->id, id) == 0) {
            *found = true;
            return (int)i;
        }
        i = (i + 1) & mask;
    }
}

/* Rebuilds the table with room for at least want live entries at half load. */
static int rehash(fb_queue *q, int want)
{
    int n = 64;
    while (n < 2 * want + 2) n *= 2;
    int *slots = calloc((size_t)n, sizeof *slots);
    if (!slots) return FB_ERR_NOMEM;
    free(q->slots);
    q->slots = slots;
    q->n_slots = n;
    q->n_used = q->n;
    for (int k = 0; k < q->n; k++) {
        bool found;
        int s = find_slot(q, q->jobs[k]->id, &found);
        q->slots[s] = k + 1;
    }
    return 0;
}

static void clear(fb_queue *q)
{
    for (int k = 0; k < q->n; k++) job_free(q->jobs[k]);
    q->n = 0;
    if (q->slots) memset(q->slots, 0, (size_t)q->n_slots * sizeof *q->slots);
    q->n_used = 0;
}

fb_queue *fb_queue_new(const char *public_datasets)
{
    fb_queue *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    if (!(q->public_datasets = strdup(public_datasets ? public_datasets : "")) || rehash(q, 0)) {
        free(q->public_datasets);
        free(q);
        return NULL;
    }
    return q;
}

void fb_queue_free(fb_queue *q)
{
    if (!q) return;
    clear(q);
    free(q->jobs);
    free(q->slots);
    free(q->order);
    free(q->public_datasets);
    free(q);
}

void fb_queue_invalidate(fb_queue *q)
{
    if (q) q->valid = false;
}

int fb_queue_count(const fb_queue *q) { return q ? q->n : 0; }

static void remove_id(fb_queue *q, const char *id)
{
    bool found;
    int s = find_slot(q, id, &found);
    if (!found) return;
    int k = q->slots[s] - 1;
    q->slots[s] = -1;
    job_free(q->jobs[k]);
    int last = --q->n;
    if (k != last) {
        /* the last job moves into the hole; its slot follows it */
        q->jobs[k] = q->jobs[last];
        bool f2;
        int s2 = find_slot(q, q->jobs[k]->id, &f2);
        if (f2) q->slots[s2] = k + 1;
    }
}

static char *dup_value(const PGresult *r, int row, int col)
{
    return strdup(PQgetvalue(r, row, col));
}

/*
 * Where the worker reads a job's data, from its dataset's registration (source NULL: none):
 * - a public built-in named as itself (registered or not), or an unregistered name the
 *   server lists as public (--public-datasets), is public: arrays may hold jobs of several
 *   tenants;
 * - a registered built-in under another name (an alias) reads the built-in, but stays the
 *   tenant's own: two tenants' aliases of one name may stand for different built-ins;
 * - a tenant's imported or uploaded dataset comes from its directory, never shared;
 * - a name neither registered nor built-in (refused at submission since it could name
 *   anything in the workers' data directory) is looked for in the tenant's directory only,
 *   where the worker finds nothing and the job fails, instead of reading a public path.
 */
static int dataset_place(const fb_queue *q, fb_queue_job *j, const char *source,
                         const char *builtin)
{
    bool is_builtin = source ? strcmp(source, "builtin") == 0 && builtin
                             : fb_config_dataset_public(q->public_datasets, j->dataset);
    bool alias = is_builtin && source && strcmp(builtin, j->dataset) != 0;
    j->public_dataset = is_builtin && !alias;
    if (alias && !(j->builtin = strdup(builtin))) return FB_ERR_NOMEM;
    return FB_OK;
}

/* The job of row `row` (columns as JOB_COLUMNS after the id); NULL when out of memory. */
static fb_queue_job *job_from_row(const fb_queue *q, const PGresult *r, int row)
{
    fb_queue_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    snprintf(j->id, sizeof j->id, "%s", PQgetvalue(r, row, 0));
    j->seq = strtoll(PQgetvalue(r, row, 1), NULL, 10);
    snprintf(j->tenant_id, sizeof j->tenant_id, "%s", PQgetvalue(r, row, 2));
    j->fusion_key = dup_value(r, row, 3);
    j->resume_step = strtoll(PQgetvalue(r, row, 4), NULL, 10);
    j->priority = (int)strtol(PQgetvalue(r, row, 5), NULL, 10);
    j->queue_reason = dup_value(r, row, 7);
    j->resume_path = PQgetisnull(r, row, 8) ? NULL : dup_value(r, row, 8);
    j->dataset = dup_value(r, row, 9);
    j->init_path = PQgetisnull(r, row, 11) ? NULL : dup_value(r, row, 11);
    if (j->dataset) {
        const char *source = PQgetisnull(r, row, 6) ? NULL : PQgetvalue(r, row, 6);
        const char *builtin = PQgetisnull(r, row, 10) ? NULL : PQgetvalue(r, row, 10);
        if (dataset_place(q, j, source, builtin) != FB_OK) {
            job_free(j);
            return NULL;
        }
    }
    if (!j->fusion_key || !j->queue_reason || !j->dataset ||
        (!PQgetisnull(r, row, 8) && !j->resume_path) ||
        (!PQgetisnull(r, row, 11) && !j->init_path)) {
        job_free(j);
        return NULL;
    }
    return j;
}

/* Puts j in place of the job with its id, or adds it; takes j in every case. */
static int upsert(fb_queue *q, fb_queue_job *j)
{
    bool found;
    int s = find_slot(q, j->id, &found);
    if (found) {
        int k = q->slots[s] - 1;
        job_free(q->jobs[k]);
        q->jobs[k] = j;
        return 0;
    }
    if (q->n == q->cap) {
        int cap = q->cap ? 2 * q->cap : 1024;
        fb_queue_job **nj = realloc(q->jobs, (size_t)cap * sizeof *nj);
        if (!nj) {
            job_free(j);
            return FB_ERR_NOMEM;
        }
        q->jobs = nj;
        q->cap = cap;
    }
    if (2 * (q->n_used + 1) > q->n_slots) {
        if (rehash(q, q->n + 1)) {
            job_free(j);
            return FB_ERR_NOMEM;
        }
        s = find_slot(q, j->id, &found);
    }
    if (q->slots[s] == 0) q->n_used++;
    q->jobs[q->n] = j;
    q->slots[s] = ++q->n;
    return 0;
}

/* The result of SQL_READ for the change rows in taken; NULL with msg set on failure. */
static PGresult *read_changed(PGconn *pg, const PGresult *taken, char *msg, size_t msg_cap)
{
    int n = PQntuples(taken), nj = 0, nd = 0;
    const char **jobs = malloc((size_t)(n ? n : 1) * sizeof *jobs),
               **tids = malloc((size_t)(n ? n : 1) * sizeof *tids),
               **names = malloc((size_t)(n ? n : 1) * sizeof *names);
    char *a[3] = {NULL, NULL, NULL};
    PGresult *r = NULL;
    if (jobs && tids && names) {
        for (int i = 0; i < n; i++) {
            if (!PQgetisnull(taken, i, 0)) {
                jobs[nj++] = PQgetvalue(taken, i, 0);
            } else {
                tids[nd] = PQgetvalue(taken, i, 1);
                names[nd++] = PQgetvalue(taken, i, 2);
            }
        }
        a[0] = fb_db_text_array(jobs, nj);
        a[1] = fb_db_text_array(tids, nd);
        a[2] = fb_db_text_array(names, nd);
    }
    if (!a[0] || !a[1] || !a[2]) {
        fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory reading the queue");
    } else {
        const char *v[3] = {a[0], a[1], a[2]};
        r = PQexecParams(pg, SQL_READ, 3, NULL, v, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
            fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE, "reading the changed jobs: %s",
                    PQresultErrorMessage(r));
            PQclear(r);
            r = NULL;
        }
    }
    for (int i = 0; i < 3; i++) free(a[i]);
    free(jobs);
    free(tids);
    free(names);
    return r;
}

int fb_queue_sync(fb_queue *q, PGconn *pg, int *read_rows, char *msg, size_t msg_cap)
{
    if (!q || !pg) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "no queue or connection");
    bool full = !q->valid;
    PGresult *r = PQexec(pg, full ? SQL_FULL : SQL_TAKE);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        /* the statement failed as a whole: the change rows are still there */
        int err = fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE, "reading the queue: %s",
                          PQresultErrorMessage(r));
        PQclear(r);
        return err;
    }
    /* the change rows are gone now: from here a failure must reread everything */
    q->valid = false;
    if (!full) {
        PGresult *taken = r;
        q->taken += PQntuples(taken);
        r = PQntuples(taken) ? read_changed(pg, taken, msg, msg_cap) : NULL;
        bool failed = PQntuples(taken) && !r;
        PQclear(taken);
        if (failed) return FB_ERR_UNAVAILABLE;
        if (!r) {
            q->valid = true;
            if (read_rows) *read_rows = 0;
            return 0;
        }
    }
    int n = PQntuples(r), err = 0;
    if (full) {
        clear(q);
        if (rehash(q, n)) err = FB_ERR_NOMEM;
    }
    for (int i = 0; i < n && !err; i++) {
        if (!full && PQgetisnull(r, i, 1)) {
            remove_id(q, PQgetvalue(r, i, 0));
            continue;
        }
        fb_queue_job *j = job_from_row(q, r, i);
        err = j ? upsert(q, j) : FB_ERR_NOMEM;
    }
    PQclear(r);
    if (err) return fb_errf(msg, msg_cap, err, "out of memory keeping the queue");
    q->valid = true;
    if (read_rows) *read_rows = n;
    return 0;
}

void fb_queue_maintain(fb_queue *q, PGconn *pg)
{
    if (!q || !pg || q->taken < VACUUM_AFTER) return;
    /* a table that only ever holds a few live rows is scanned whole by every take; the
     * dead rows of a burst of submissions would make each scan long until autovacuum's
     * next round (a minute by default) */
    PGresult *r = PQexec(pg, "VACUUM queue_changes");
    if (PQresultStatus(r) == PGRES_COMMAND_OK) q->taken = 0;
    PQclear(r);
}

static int cmp_order(const void *a, const void *b)
{
    const fb_queue_job *x = *(const fb_queue_job *const *)a, *y = *(const fb_queue_job *const *)b;
    if (x->priority != y->priority) return x->priority > y->priority ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

int fb_queue_ordered(fb_queue *q, int limit, const fb_queue_job *const **out)
{
    if (q->n > q->cap_order) {
        const fb_queue_job **o = realloc(q->order, (size_t)q->n * sizeof *o);
        if (!o) return -1;
        q->order = o;
        q->cap_order = q->n;
    }
    if (q->n == 0) {
        *out = q->order;
        return 0;
    }
    for (int k = 0; k < q->n; k++) q->order[k] = q->jobs[k];
    qsort(q->order, (size_t)q->n, sizeof *q->order, cmp_order);
    *out = q->order;
    return limit < q->n ? limit : q->n;
}

void fb_queue_set_reason(fb_queue *q, const char *job_id, const char *reason)
{
    bool found;
    int s = find_slot(q, job_id, &found);
    if (!found) return;
    fb_queue_job *j = q->jobs[q->slots[s] - 1];
    char *r = strdup(reason);
    if (!r) {
        /* unknown is safe: the next plan writes the reason again */
        j->queue_reason[0] = '\0';
        return;
    }
    free(j->queue_reason);
    j->queue_reason = r;
}
