/*
 * The handlers behind fb_routes[] (routes.c) and what they share: id
 * checks, running a transaction on behalf of a request, and the SQL that
 * renders jobs, tenants and keys as JSON.  Private to server/.
 */
#ifndef FB_SERVER_ROUTES_H
#define FB_SERVER_ROUTES_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>

#include "db.h"
#include "http.h"
#include "jobspec.h"

/* The route table (routes.c) and its length; fb_server_new() gives them to
 * the HTTP layer (fb_http_start). */
extern const fb_route fb_routes[];
extern const int fb_n_routes;

/* The stream hook of the FB_BODY_STREAM routes (routes_datasets.c), as
 * http.h's fb_stream_open_fn describes: where an upload's body goes and how
 * long it may be. */
int fb_route_stream_open(fb_req *req, uint64_t declared, int *fd, uint64_t *limit);

/*
 * The handlers.  Each is called by the HTTP layer after the request passed
 * every check of its route (http.h); it reads its path parameters, query
 * and body from req, runs one transaction, and either answers through
 * fb_req_reply_*() and returns FB_OK or returns a negative fb_err after
 * fb_req_fail() described the problem.  The request owns all memory.
 */

/* health.c: GET /healthz, GET /readyz, GET /metrics. */
int fb_route_healthz(fb_req *req);
int fb_route_readyz(fb_req *req);
int fb_route_metrics(fb_req *req);

/* routes_tenants.c: tenants (create, list, read, update) and their keys
 * (create, list, revoke). */
int fb_route_tenant_create(fb_req *req);
int fb_route_tenant_list(fb_req *req);
int fb_route_tenant_self(fb_req *req);
int fb_route_tenant_get(fb_req *req);
int fb_route_tenant_update(fb_req *req);
int fb_route_key_create(fb_req *req);
int fb_route_key_list(fb_req *req);
int fb_route_key_revoke(fb_req *req);

/* routes_jobs.c: submit, list, read and cancel jobs; their metrics, events,
 * checkpoints and model. */
int fb_route_job_create(fb_req *req);
int fb_route_job_list(fb_req *req);
int fb_route_job_get(fb_req *req);
int fb_route_job_cancel(fb_req *req);
int fb_route_job_metrics(fb_req *req);
int fb_route_job_events(fb_req *req);
int fb_route_job_checkpoints(fb_req *req);
int fb_route_job_model(fb_req *req);

/* routes_sweeps.c: submit, list, read and cancel sweeps. */
int fb_route_sweep_create(fb_req *req);
int fb_route_sweep_list(fb_req *req);
int fb_route_sweep_get(fb_req *req);
int fb_route_sweep_cancel(fb_req *req);

/* routes_datasets.c: register a built-in, import from a server path, upload
 * a CSV split (an FB_BODY_STREAM route: see fb_route_stream_open below),
 * list, read and delete datasets. */
int fb_route_dataset_create(fb_req *req);
int fb_route_dataset_list(fb_req *req);
int fb_route_dataset_get(fb_req *req);
int fb_route_dataset_delete(fb_req *req);
int fb_route_dataset_upload(fb_req *req);

/* routes_static.c: the dashboard's files, GET / and GET /static/{file}. */
int fb_route_static_index(fb_req *req);
int fb_route_static_file(fb_req *req);

/* routes_cluster.c: GET /v1/workers and GET /v1/cluster. */
int fb_route_workers(fb_req *req);
int fb_route_cluster(fb_req *req);

/* routes_worker_keys.c: the workers' allow-list, POST/GET /v1/workers/keys and
 * DELETE /v1/workers/keys/{id} (admin). */
int fb_route_worker_key_create(fb_req *req);
int fb_route_worker_key_list(fb_req *req);
int fb_route_worker_key_revoke(fb_req *req);

/* ---- shared helpers (routes.c) ---- */

/* True for a canonical textual UUID (hex digits and four dashes). */
bool fb_is_uuid(const char *s);

/* Runs fn in a transaction (fb_db_run) and, on failure, records the error on
 * the request.  Returns fb_db_run's result. */
int fb_route_txn(fb_req *req, fb_db_fn fn, void *arg);

/* Parses a JSON text cell of r; JSON null for SQL NULL; NULL when out of
 * memory or malformed. */
json_t *fb_pg_json(const PGresult *r, int row, int col);

/*
 * One page of a cursor-paginated list from a query that asked for limit + 1
 * rows: column 0 is the row's cursor, column 1 its JSON.  Replaces *items
 * with the first limit rows' JSON (a new array) and writes the cursor of the
 * last one into next when a further row exists ("" otherwise).  Clears r.
 */
void fb_pg_page(PGresult *r, long long limit, json_t **items, char *next, size_t next_cap);

/*
 * Runs a list route's transaction fn (which fills *items and next with
 * fb_pg_page) and answers {"<key>": items, "next_cursor": next or null}.
 * Owns *items afterwards on every path.  Returns FB_OK or the error
 * already recorded on the request.
 */
int fb_route_reply_page(fb_req *req, fb_db_fn fn, void *arg, json_t **items, const char *next,
                        const char *key);

/* Reads an optional integer query parameter in [lo, hi] into *out (def when
 * absent); FB_ERR_BAD_QUERY naming it otherwise. */
int fb_query_int(fb_req *req, const char *name, long long def, long long lo, long long hi,
                 long long *out);

/* The parsing behind fb_query_int, without a request (for the fuzz target):
 * a decimal integer, optionally negative, with nothing around it, into *out.
 * FB_OK; FB_ERR_BAD_QUERY when v is not such an integer or overflows;
 * FB_ERR_OUT_OF_RANGE when it lies outside [lo, hi].  *out is untouched on
 * failure. */
int fb_query_parse_int(const char *v, long long lo, long long hi, long long *out);

/* Stores text of at most cap-1 bytes, else fails with FB_ERR_BAD_QUERY. */
int fb_query_str(fb_req *req, const char *name, char *out, size_t cap);

/* A list cursor of jobs or sweeps: the seq of the last item, 1..18 decimal digits. */
bool fb_cursor_seq_ok(const char *s);

/* The metric series of GET /v1/jobs/{id}/metrics (routes_jobs.c): their count, the name of
 * series i (NULL out of range), and ?fields= parsed: a comma-separated list of names, each
 * known, repeats kept once, into sel[0..*n_sel) in order of first mention; false (sel and
 * *n_sel unspecified) when any name is unknown or empty. */
#define FB_METRIC_FIELDS 12
const char *fb_metric_field_name(int i);
bool fb_metric_fields_parse(const char *list, int sel[FB_METRIC_FIELDS], int *n_sel);

/* Idempotency-Key header: NULL when absent, else validated into buf (1-128
 * bytes of [A-Za-z0-9._:-]); FB_ERR_BAD_HEADER when malformed. */
int fb_idempotency_key(fb_req *req, char *buf, size_t cap, const char **out);

/*
 * Checks what a parsed spec names beyond itself, for the request's tenant,
 * before it is stored: its dataset is one of the tenant's (registered, in any
 * state) or a public built-in; its init, when it has one, is the service's
 * form and names a job of the tenant that has the weights asked for.  The
 * local form (a file path) is refused.  init_path[cap] receives the resolved
 * artifact, a path relative to the artifacts directory under the tenant's
 * own <tenant id>/ ("" without init).  Fields are named under prefix ("" or
 * "base").  Returns FB_OK, or the error recorded on the request
 * (unknown_reference, wrong_type, or the database's).
 */
int fb_route_spec_refs(fb_req *req, const fb_job_spec *spec, const char *prefix, char *init_path,
                       size_t cap);

/* The JSON rendering of a job row aliased j, in SQL; position is an SQL
 * expression for queue.position (use "NULL" when not computed). */
#define FB_SQL_JOB_JSON(position, extra)                                                           \
    "json_build_object('id', j.id, 'name', j.name, 'state', j.state,"                              \
    " 'queue', CASE WHEN j.state = 'queued' THEN json_build_object('reason', j.queue_reason,"      \
    " 'position', " position ") END,"                                                              \
    " 'sweep_id', j.sweep_id, 'trial_index', j.trial_index, 'group_id', j.group_id,"               \
    " 'fusion_key', j.fusion_key, 'dataset', j.dataset, 'priority', j.priority,"                   \
    " 'step', j.step, 'steps', j.steps, 'epochs', j.epochs, 'restarts', j.restarts,"               \
    " 'max_restarts', j.max_restarts, 'slowdown', j.slowdown,"                                     \
    " 'latest_metrics', j.latest_metrics, 'n_params', j.n_params,"                                 \
    " 'flops_per_sample', j.flops_per_sample, 'error', j.error,"                                   \
    " 'created_at', j.created_at, 'scheduled_at', j.scheduled_at,"                                 \
    " 'started_at', j.started_at, 'finished_at', j.finished_at, 'updated_at', j.updated_at" extra  \
    ")"

/* Full view: adds the canonical spec and the trial parameters. */
#define FB_SQL_JOB_FULL(position)                                                                  \
    FB_SQL_JOB_JSON(position, ", 'trial_params', j.trial_params, 'spec', j.spec")

/* Queue position: 1 + the queued jobs ahead of j (higher priority first,
 * then earlier submission).  Both counts are range scans of the jobs_queue
 * index that stop after FB_QUEUE_POSITION_MAX entries, so a GET reads at
 * most that many; the position is null when more jobs are ahead. */
#define FB_QUEUE_POSITION_MAX 100
#define FB_SQL_QUEUE_POSITION                                                                      \
    "(SELECT CASE WHEN a.n + b.n < 100 THEN a.n + b.n + 1 END"                                     \
    " FROM (SELECT count(*) AS n FROM (SELECT 1 FROM jobs q WHERE q.state = 'queued'"              \
    " AND q.priority > j.priority LIMIT 100) x) a,"                                                \
    " (SELECT count(*) AS n FROM (SELECT 1 FROM jobs q WHERE q.state = 'queued'"                   \
    " AND q.priority = j.priority AND q.seq < j.seq LIMIT 100) y) b)"

#endif
