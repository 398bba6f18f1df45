/*
 * Which workers may connect: the ZAP handler of the workers' CURVE socket and
 * the allow-list it consults.  Two sources, either enough: the worker-keys
 * file beside fuseboxd (re-read when its mtime changes) and the keys an
 * administrator registered in the database (worker_keys, schema 012; routes
 * in routes_worker_keys.c), read again at every tick.  A key the cache does
 * not know is looked up in the database before it is refused, so that a
 * worker registered a moment ago gets in at its first handshake.
 *
 * While PostgreSQL is away the last list read stays in force: an outage lets
 * no revoked key in and shuts no live worker out.  A key revoked in the
 * database leaves the list at the next tick; the loop then drops the
 * workers that connected with it (dispatch.c, tick) and refuses their HELLO.
 */
#include <string.h>
#include <sys/stat.h>

#include <sodium.h>
#include <zmq.h>

#include "dispatch_impl.h"
#include "log.h"

static const char sql_live_keys[] =
    "SELECT public_key FROM worker_keys WHERE revoked_at IS NULL ORDER BY created_at, id"
    " LIMIT " DSP_MAX_KEYS_S;
static const char sql_key_live[] =
    "SELECT 1 FROM worker_keys WHERE public_key = $1 AND revoked_at IS NULL";

void dsp_keys_reload_file(fb_dispatch *d)
{
    struct stat st;
    if (stat(d->cfg.worker_keys, &st) != 0) {
        if (!d->keys_missing_said && d->n_db_keys == 0)
            fb_log_json(FB_LOG_WARN,
                        "no worker keys file and no registered key; no worker can connect",
                        json_pack("{s:s}", "path", d->cfg.worker_keys));
        d->keys_missing_said = true;
        d->n_keys = 0;
        return;
    }
    d->keys_missing_said = false;
    if (st.st_mtim.tv_sec == d->keys_mtime.tv_sec && st.st_mtim.tv_nsec == d->keys_mtime.tv_nsec)
        return;
    char err[256];
    int n = 0;
    if (fb_wire_keys_load(d->cfg.worker_keys, d->keys, DSP_MAX_KEYS, &n, err, sizeof err)) {
        fb_log_json(FB_LOG_ERROR, "the worker keys file is invalid; keeping the previous list",
                    json_pack("{s:s, s:s}", "path", d->cfg.worker_keys, "error", err));
    } else {
        d->n_keys = n;
        fb_log_json(FB_LOG_INFO, "worker keys loaded",
                    json_pack("{s:s, s:i}", "path", d->cfg.worker_keys, "keys", n));
    }
    d->keys_mtime = st.st_mtim;
}

static void reload_db(fb_dispatch *d)
{
    if (!dsp_db_ok(d)) return; /* the last list stays */
    PGresult *r = dsp_q(d, sql_live_keys, 0, NULL);
    if (!r) return;
    int n = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        const char *k = PQgetvalue(r, i, 0);
        if (strlen(k) != 40) continue; /* the table's CHECK makes this impossible */
        memcpy(d->db_keys[n], k, 41);
        n++;
    }
    PQclear(r);
    if (n != d->n_db_keys)
        fb_log_json(FB_LOG_INFO, "registered worker keys read",
                    json_pack("{s:i, s:i}", "keys", n, "before", d->n_db_keys));
    if (n == DSP_MAX_KEYS && !d->db_keys_full_said) {
        fb_log_json(FB_LOG_ERROR, "more live worker keys are registered than the loop keeps",
                    json_pack("{s:i}", "kept", DSP_MAX_KEYS));
        d->db_keys_full_said = true;
    }
    d->n_db_keys = n;
}

void dsp_keys_reload(fb_dispatch *d)
{
    reload_db(d);
    dsp_keys_reload_file(d);
}

static bool listed(char (*keys)[41], int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (sodium_memcmp(keys[i], key, 40) == 0) return true;
    return false;
}

bool dsp_key_allowed(fb_dispatch *d, const char *key, bool ask_db)
{
    if (strlen(key) != 40) return false;
    if (listed(d->keys, d->n_keys, key) || listed(d->db_keys, d->n_db_keys, key)) return true;
    if (!ask_db || !dsp_db_ok(d)) return false;
    const char *v[1] = {key};
    PGresult *r = dsp_q(d, sql_key_live, 1, v);
    if (!r) return false;
    bool live = PQntuples(r) == 1;
    PQclear(r);
    if (live && d->n_db_keys < DSP_MAX_KEYS) memcpy(d->db_keys[d->n_db_keys++], key, 41);
    return live;
}

void dsp_on_zap(fb_dispatch *d)
{
    zmq_msg_t fr[8];
    int n = 0;
    bool more = true;
    while (more) {
        zmq_msg_t tmp;
        zmq_msg_init(&tmp);
        if (zmq_msg_recv(&tmp, d->zap, 0) < 0) {
            zmq_msg_close(&tmp);
            break;
        }
        more = zmq_msg_more(&tmp);
        if (n < 8)
            fr[n++] = tmp;
        else
            zmq_msg_close(&tmp);
    }
    /* version, request id, domain, address, identity, mechanism, client key */
    bool ok = false;
    char key[41] = "";
    if (n >= 7 && zmq_msg_size(&fr[5]) == 5 && memcmp(zmq_msg_data(&fr[5]), "CURVE", 5) == 0 &&
        zmq_msg_size(&fr[6]) == 32) {
        zmq_z85_encode(key, zmq_msg_data(&fr[6]), 32);
        ok = dsp_key_allowed(d, key, true);
    }
    if (!ok)
        fb_log_json(FB_LOG_WARN, "refused a worker connection: unknown key",
                    json_pack("{s:s}", "key", key[0] ? key : "(none)"));
    const char *status = ok ? "200" : "400", *text = ok ? "OK" : "unknown worker key";
    zmq_send(d->zap, "1.0", 3, ZMQ_SNDMORE);
    if (n >= 2)
        zmq_send(d->zap, zmq_msg_data(&fr[1]), zmq_msg_size(&fr[1]), ZMQ_SNDMORE);
    else
        zmq_send(d->zap, "", 0, ZMQ_SNDMORE);
    zmq_send(d->zap, status, 3, ZMQ_SNDMORE);
    zmq_send(d->zap, text, strlen(text), ZMQ_SNDMORE);
    /* the user id: the key, which every message of the connection then carries */
    zmq_send(d->zap, ok ? key : "", ok ? 40 : 0, ZMQ_SNDMORE);
    zmq_send(d->zap, "", 0, 0);
    for (int i = 0; i < n; i++) zmq_msg_close(&fr[i]);
}
