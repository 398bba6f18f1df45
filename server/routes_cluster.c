/*
 * Read-only views of the cluster: GET /v1/workers and GET /v1/cluster.
 * The control loop (dispatch.c) fills the tables these read: workers and
 * their devices when they register, and one groups row per fused training
 * array with its worker, device indices, member count, tenants, time share
 * and the throughput and step-time breakdown of its last progress report,
 * as the mean over its devices and per device.  An array that spans workers
 * is listed once, with its leader as its worker and every worker of it
 * (ranks and devices) in `workers`, and it appears on each of its workers'
 * devices in GET /v1/workers.
 *
 * Several arrays may share a device, so which arrays a device hosts is read
 * from the arrays' device lists, never from devices.group_id (which names
 * only the last array placed there).  Every caller sees every array, so
 * that the picture of the cluster is whole, but only the tenants it may
 * see: a tenant its own tenant and a count of the others, the admin all.
 */
#include <stdio.h>
#include <string.h>

#include "routes.h"
#include "server_impl.h"

typedef struct cluster_read {
    const char *tenant; /* NULL: the admin, who sees every tenant */
    json_t *out;
} cluster_read;

/* The arrays that are not finished and host device d (a devices row aliased
 * d), as a derived table aliased g with the columns of groups: an array on
 * one worker names its worker and devices in its row, one that spans
 * workers (comm_port set) each of its workers in group_workers (schema 008).
 * Both sides are reached through the indexes on the worker; a UNION ALL
 * keeps them so, where an OR of the two would scan every array ever made. */
#define GROUPS_ON_D                                                                              \
    "(SELECT o.* FROM groups o WHERE o.worker_id = d.worker_id AND d.idx = ANY (o.device_idx)"   \
    " AND o.state <> 'finished' AND o.comm_port IS NULL"                                        \
    " UNION ALL SELECT o.* FROM group_workers gw JOIN groups o ON o.id = gw.group_id"           \
    " WHERE gw.worker_id = d.worker_id AND d.idx = ANY (gw.device_idx)"                         \
    " AND o.state <> 'finished') g"

/* The tenants of array g that the caller ($1: NULL for the admin) may see. */
#define VISIBLE_T "t.id = ANY (g.tenant_ids) AND ($1::uuid IS NULL OR t.id = $1::uuid)"

static int workers_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    cluster_read *x = arg;
    int err;
    PGresult *r = fb_db_query(
        c, "workers",
        "SELECT coalesce(json_agg(json_build_object('id', w.id, 'name', w.name, 'state', w.state,"
        " 'backend', w.backend, 'version', w.version,"
        " 'registered_at', w.registered_at, 'last_seen_at', w.last_seen_at,"
        " 'devices', coalesce((SELECT json_agg(json_build_object('index', d.idx, 'kind', d.kind,"
        " 'name', d.name, 'memory_bytes', d.memory_bytes, 'utilization', d.utilization,"
        " 'busy', EXISTS (SELECT 1 FROM " GROUPS_ON_D "),"
        " 'arrays', coalesce((SELECT json_agg(json_build_object('id', g.id, 'state', g.state,"
        " 'members', g.n_members, 'time_share', g.time_share,"
        " 'spans_workers', g.comm_port IS NOT NULL, 'leads', g.worker_id = d.worker_id)"
        " ORDER BY g.created_at, g.id)"
        " FROM " GROUPS_ON_D "), '[]'::json)"
        ") ORDER BY d.idx) FROM devices d"
        " WHERE d.worker_id = w.id), '[]'::json)) ORDER BY w.name, w.id), '[]'::json)"
        " FROM workers w",
        0, NULL, &err, msg, msg_cap);
    if (!r) return err;
    json_decref(x->out);
    x->out = fb_pg_json(r, 0, 0);
    PQclear(r);
    return FB_OK;
}

int fb_route_workers(fb_req *req)
{
    static const char *const none[] = {NULL};
    int err;
    if ((err = fb_req_check_query(req, none))) return err;
    cluster_read x = {0};
    if ((err = fb_route_txn(req, workers_txn, &x))) {
        json_decref(x.out);
        return err;
    }
    if (!x.out) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    fb_req_reply_json(req, 200, json_pack("{s:o}", "workers", x.out));
    fb_req_revalidate(req);
    return FB_OK;
}

static int cluster_txn(fb_db_conn *c, void *arg, char *msg, size_t msg_cap)
{
    cluster_read *x = arg;
    int err;
    const char *v[1] = {x->tenant};
    PGresult *r = fb_db_query(
        c, "cluster",
        "SELECT json_build_object("
        " 'workers', (SELECT json_build_object('total', count(*),"
        " 'ready', count(*) FILTER (WHERE state = 'ready')) FROM workers),"
        " 'devices', (SELECT json_build_object('total', count(*),"
        " 'busy', count(*) FILTER (WHERE EXISTS (SELECT 1 FROM " GROUPS_ON_D ")),"
        " 'cpu', count(*) FILTER (WHERE kind = 'cpu'),"
        " 'cuda', count(*) FILTER (WHERE kind = 'cuda')) FROM devices d),"
        " 'utilization', (SELECT coalesce(avg(utilization), 0) FROM devices),"
        " 'groups', (SELECT json_build_object('total', count(*),"
        " 'scheduled', count(*) FILTER (WHERE state = 'scheduled'),"
        " 'running', count(*) FILTER (WHERE state = 'running'),"
        " 'mean_members', coalesce(avg(n_members), 0)) FROM groups WHERE state <> 'finished'),"
        " 'arrays', coalesce((SELECT json_agg(json_build_object('id', g.id, 'state', g.state,"
        " 'worker_id', g.worker_id, 'worker', w.name, 'devices', to_json(g.device_idx),"
        " 'spans_workers', g.comm_port IS NOT NULL, 'leader', CASE WHEN g.comm_port IS NOT NULL"
        " THEN w.name END, 'comm_port', g.comm_port,"
        " 'workers', coalesce((SELECT json_agg(json_build_object('worker_id', gw.worker_id,"
        " 'worker', ww.name, 'leader', gw.worker_id = g.worker_id, 'rank_base', gw.rank_base,"
        " 'ranks', gw.n_ranks, 'devices', to_json(gw.device_idx)) ORDER BY gw.rank_base)"
        " FROM group_workers gw JOIN workers ww ON ww.id = gw.worker_id"
        " WHERE gw.group_id = g.id), json_build_array(json_build_object('worker_id', g.worker_id,"
        " 'worker', w.name, 'leader', true, 'rank_base', 0, 'ranks', g.parallel_data,"
        " 'devices', to_json(g.device_idx)))),"
        " 'members', g.n_members,"
        " 'tenants', coalesce((SELECT json_agg(json_build_object('tenant_id', t.id,"
        " 'name', t.name) ORDER BY t.name, t.id) FROM tenants t WHERE " VISIBLE_T "), '[]'::json),"
        " 'other_tenants', cardinality(g.tenant_ids) - (SELECT count(*) FROM tenants t"
        " WHERE " VISIBLE_T "),"
        " 'time_share', g.time_share, 'split', to_json(g.split),"
        " 'slowdown', (SELECT max(j.slowdown) FROM jobs j WHERE j.group_id = g.id AND j.in_group),"
        " 'samples_per_s', g.samples_per_s,"
        " 'breakdown', g.breakdown,"
        " 'device_breakdown', coalesce(g.device_breakdown, '[]'::jsonb),"
        " 'created_at', g.created_at)"
        " ORDER BY w.name, g.device_idx, g.created_at, g.id)"
        " FROM groups g LEFT JOIN workers w ON w.id = g.worker_id"
        " WHERE g.state <> 'finished'), '[]'::json),"
        " 'jobs', (SELECT json_build_object("
        " 'queued', count(*) FILTER (WHERE state = 'queued'),"
        " 'scheduled', count(*) FILTER (WHERE state = 'scheduled'),"
        " 'running', count(*) FILTER (WHERE state = 'running'))"
        " FROM jobs WHERE state IN ('queued', 'scheduled', 'running')),"
        " 'slowdown', (SELECT json_build_object('max', max(slowdown), 'mean', avg(slowdown))"
        " FROM jobs WHERE state = 'running' AND slowdown IS NOT NULL),"
        " 'tenants', coalesce((SELECT json_agg(json_build_object('tenant_id', t.id, 'name', t.name,"
        " 'weight', t.weight,"
        " 'queued_jobs', (SELECT coalesce(sum(q.n), 0) FROM tenant_queued_counts q"
        " WHERE q.tenant_id = t.id),"
        " 'active_jobs', (SELECT count(*) FROM jobs a WHERE a.tenant_id = t.id"
        " AND a.state IN ('scheduled', 'running')),"
        " 'devices_in_use', (SELECT count(*) FROM devices d WHERE EXISTS (SELECT 1 FROM"
        " " GROUPS_ON_D " WHERE t.id = ANY (g.tenant_ids))))"
        " ORDER BY t.name) FROM tenants t WHERE $1::uuid IS NULL OR t.id = $1::uuid), '[]'::json))",
        1, v, &err, msg, msg_cap);
    if (!r) return err;
    json_decref(x->out);
    x->out = fb_pg_json(r, 0, 0);
    PQclear(r);
    return FB_OK;
}

int fb_route_cluster(fb_req *req)
{
    static const char *const none[] = {NULL};
    int err;
    if ((err = fb_req_check_query(req, none))) return err;
    cluster_read x = {.tenant = req->key.is_admin ? NULL : req->key.tenant_id};
    if ((err = fb_route_txn(req, cluster_txn, &x))) {
        json_decref(x.out);
        return err;
    }
    if (!x.out) return fb_req_fail(req, FB_ERR_NOMEM, NULL, "out of memory");
    fb_req_reply_json(req, 200, x.out);
    fb_req_revalidate(req);
    return FB_OK;
}
