/*
 * A worker without an authorized CURVE key can neither register nor receive
 * work.  fuseboxd runs with an allow-list of one key and a queued job; each
 * intruder speaks the real wire protocol (api/wire.h over a ZeroMQ DEALER)
 * and sends HELLO again and again for a while:
 *
 *   - a fresh keypair that is not on the list;
 *   - the listed worker's public key with a secret key of its own (it claims
 *     the identity without holding its secret);
 *   - a fresh keypair that trusts a wrong server key;
 *   - no encryption at all (the NULL mechanism).
 *
 * None may get a WELCOME, an ASSIGN or any other message; the workers
 * table stays empty and the jobs stay queued; the server log names the
 * refused unlisted key.  Then the listed worker, with the same code, gets a
 * WELCOME and an ASSIGN, so that the intruders' silence is not an artefact
 * of the test.  That ASSIGN is also where checkpoints are read from the
 * artifacts directory: the jobs' resume paths are tampered with to point
 * outside it, and no byte of the file outside may reach the worker.
 *
 * Last, the listed worker says HELLO 200 times at once, as a worker does
 * every heartbeat while it hears nothing from a loop that fell behind: every
 * one is answered, and the database is written for the first only (a HELLO
 * that says what the registry already holds costs no transaction, so the
 * loop does not fall further behind with each one).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "check.h"
#include "harness.h"
#include "wire.h"

#define TRY_MS 3000
#define SECRET "a file outside the artifacts directory"
#define LEGIT "a checkpoint inside the artifacts directory"

static fbt_server S;
static char root[] = "/tmp/fbt-attack-worker-XXXXXX";
static char endpoint[64], server_pub[41], listed_pub[41], listed_sec[41];
static void *zctx;
static int resume_blobs, secrets_sent, legit_sent, members_assigned, members_wanted = 1;

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    CHECK(fclose(f) == 0);
}

static char *hello_json(const char *name)
{
    fb_wire_msg m;
    memset(&m, 0, sizeof m);
    m.type = FB_WIRE_HELLO;
    snprintf(m.worker, sizeof m.worker, "%s", name);
    snprintf(m.backend, sizeof m.backend, "cpu");
    snprintf(m.version, sizeof m.version, "0.1.0");
    m.n_devices = 1;
    m.devices[0].idx = 0;
    snprintf(m.devices[0].kind, sizeof m.devices[0].kind, "cpu");
    snprintf(m.devices[0].name, sizeof m.devices[0].name, "cpu0");
    m.devices[0].memory_bytes = (int64_t)8 << 30;
    m.devices[0].free_bytes = (int64_t)8 << 30;
    char msg[256];
    char *json = fb_wire_encode(&m, msg, sizeof msg);
    if (!json) fprintf(stderr, "encode HELLO: %s\n", msg);
    CHECK(json != NULL);
    return json;
}

enum mode { CURVE_KEYS, NO_CURVE };

/* Connects a DEALER with the given keys (mode NO_CURVE: none), sends HELLO
 * every 250 ms for up to ms (HEARTBEATs once welcomed), and returns how many
 * messages came back; the type of the first is written to first_type (-1
 * when none) and a bit per type seen to *types.  Stops early once ASSIGNs
 * for members_wanted jobs came. */
static int speak(enum mode mode, const char *pub, const char *sec, const char *srv_pub,
                 const char *name, int ms, int *first_type, unsigned *types)
{
    void *s = zmq_socket(zctx, ZMQ_DEALER);
    CHECK(s != NULL);
    int zero = 0;
    CHECK(zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) == 0);
    /* the server knows a worker by its routing id, its name (as fusebox-worker sets it) */
    CHECK(zmq_setsockopt(s, ZMQ_ROUTING_ID, name, strlen(name)) == 0);
    if (mode == CURVE_KEYS) {
        CHECK(zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, srv_pub, 40) == 0);
        CHECK(zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, 40) == 0);
        CHECK(zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sec, 40) == 0);
    }
    CHECK(zmq_connect(s, endpoint) == 0);
    char *hello = hello_json(name);
    fb_wire_msg hb;
    memset(&hb, 0, sizeof hb);
    hb.type = FB_WIRE_HEARTBEAT;
    char hmsg[256];
    char *heartbeat = fb_wire_encode(&hb, hmsg, sizeof hmsg);
    CHECK(heartbeat != NULL);
    int got = 0;
    *first_type = -1;
    *types = 0;
    double end = fbt_now_ms() + ms;
    double next_hello = 0;
    while (fbt_now_ms() < end) {
        if (fbt_now_ms() >= next_hello) {
            /* DONTWAIT: an unauthenticated pipe never becomes writable */
            const char *say = *types & (1u << FB_WIRE_WELCOME) ? heartbeat : hello;
            zmq_send(s, say, strlen(say), ZMQ_DONTWAIT);
            next_hello = fbt_now_ms() + 250;
        }
        zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 50) > 0 && (it.revents & ZMQ_POLLIN)) {
            zmq_msg_t f;
            zmq_msg_init(&f);
            CHECK(zmq_msg_recv(&f, s, 0) >= 0);
            fb_wire_msg m;
            char msg[256];
            int more = zmq_msg_more(&f);
            /* keep the blob frames: an ASSIGN's resume checkpoints are checked */
            int blobs = 0;
            zmq_msg_t blob[8];
            while (more) {
                zmq_msg_t *b = &blob[blobs < 7 ? blobs : 7];
                if (blobs > 7) zmq_msg_close(b);
                zmq_msg_init(b);
                zmq_msg_recv(b, s, 0);
                more = zmq_msg_more(b);
                blobs++;
            }
            int type = -1;
            if (fb_wire_decode(zmq_msg_data(&f), zmq_msg_size(&f), blobs, &m, msg, sizeof msg) ==
                0) {
                type = (int)m.type;
                for (int i = 0; type == FB_WIRE_ASSIGN && i < m.n_members; i++) {
                    int k = m.members[i].resume_blob;
                    if (k < 1 || k > 7) continue;
                    resume_blobs++;
                    size_t n = zmq_msg_size(&blob[k - 1]);
                    if (n == strlen(SECRET) && memcmp(zmq_msg_data(&blob[k - 1]), SECRET, n) == 0)
                        secrets_sent++;
                    if (n == strlen(LEGIT) && memcmp(zmq_msg_data(&blob[k - 1]), LEGIT, n) == 0)
                        legit_sent++;
                }
                if (type == FB_WIRE_ASSIGN) members_assigned += m.n_members;
                fb_wire_msg_free(&m);
            }
            for (int i = 0; i < blobs && i < 8; i++)
                zmq_msg_close(&blob[i]);
            zmq_msg_close(&f);
            if (got == 0) *first_type = type;
            if (type >= 0) *types |= 1u << type;
            got++;
            if (members_assigned >= members_wanted) break;
        }
    }
    free(hello);
    free(heartbeat);
    zmq_close(s);
    return got;
}

/* Sends n HELLOs of the listed worker at once and counts the WELCOMEs that come back
 * within ms; registered_at of the workers row after the first WELCOME goes to first_reg. */
static int hello_flood(int n, int ms, char *first_reg, size_t cap)
{
    void *s = zmq_socket(zctx, ZMQ_DEALER);
    CHECK(s != NULL);
    int zero = 0;
    CHECK(zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) == 0);
    CHECK(zmq_setsockopt(s, ZMQ_ROUTING_ID, "listed", 6) == 0);
    CHECK(zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_pub, 40) == 0);
    CHECK(zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, listed_pub, 40) == 0);
    CHECK(zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, listed_sec, 40) == 0);
    CHECK(zmq_connect(s, endpoint) == 0);
    char *hello = hello_json("listed");
    for (int i = 0; i < n; i++) CHECK(zmq_send(s, hello, strlen(hello), 0) >= 0);
    free(hello);
    int welcomes = 0;
    first_reg[0] = '\0';
    double end = fbt_now_ms() + ms;
    while (welcomes < n && fbt_now_ms() < end) {
        zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 50) <= 0 || !(it.revents & ZMQ_POLLIN)) continue;
        zmq_msg_t f;
        zmq_msg_init(&f);
        CHECK(zmq_msg_recv(&f, s, 0) >= 0);
        int more = zmq_msg_more(&f), blobs = 0;
        while (more) { /* an ASSIGN's blobs */
            zmq_msg_t b;
            zmq_msg_init(&b);
            zmq_msg_recv(&b, s, 0);
            more = zmq_msg_more(&b);
            zmq_msg_close(&b);
            blobs++;
        }
        fb_wire_msg m;
        char msg[256];
        if (fb_wire_decode(zmq_msg_data(&f), zmq_msg_size(&f), blobs, &m, msg, sizeof msg) == 0) {
            if (m.type == FB_WIRE_WELCOME && welcomes++ == 0)
                snprintf(first_reg, cap, "%s",
                         fbt_sql_value(&S, "SELECT registered_at::text FROM workers"
                                           " WHERE name = 'listed'"));
            fb_wire_msg_free(&m);
        }
        zmq_msg_close(&f);
    }
    zmq_close(s);
    return welcomes;
}

static void keypair(char pub[41], char sec[41])
{
    CHECK(zmq_curve_keypair(pub, sec) == 0);
}

static void expect_silence(const char *what, int got, int first_type)
{
    printf("worker: %-40s %d messages back (first: %s)\n", what, got,
           first_type < 0 ? "none" : fb_wire_type_name((fb_wire_type)first_type));
    if (got != 0) {
        fbt_server_dump_log(&S);
        fprintf(stderr, "%s: the server answered an unauthorized worker\n", what);
        abort();
    }
}

static bool log_contains(const char *needle)
{
    FILE *f = fopen(S.log_path, "r");
    CHECK(f != NULL);
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    fbt_require_database();
    CHECK(mkdtemp(root) != NULL);
    char msg[256], path[512], port_file[512];
    snprintf(path, sizeof path, "%s/listed.key", root);
    CHECK(fb_wire_key_generate(path, msg, sizeof msg) == 0);
    CHECK(fb_wire_key_load(path, listed_pub, listed_sec, msg, sizeof msg) == 0);
    CHECK(unlink(path) == 0);
    snprintf(S.data_dir, sizeof S.data_dir, "%s/server", root);
    CHECK(mkdir(S.data_dir, 0700) == 0);
    char keys[600], line[128];
    snprintf(keys, sizeof keys, "%s/worker-keys", S.data_dir);
    snprintf(line, sizeof line, "# the one allowed worker\n%s\n", listed_pub);
    write_text(keys, line);
    snprintf(port_file, sizeof port_file, "%s/worker-port", root);

    fbt_db_create(&S);
    const char *extra[] = {
        "--worker-port-file", port_file, "--heartbeat-ms", "200", "--tick-ms", "100", NULL};
    fbt_server_start(&S, extra);
    FILE *pf = fopen(port_file, "r");
    CHECK(pf != NULL);
    int wport = 0;
    CHECK(fscanf(pf, "%d", &wport) == 1);
    fclose(pf);
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", wport);
    snprintf(path, sizeof path, "%s/server.key", S.data_dir);
    CHECK(fb_wire_key_load(path, server_pub, NULL, msg, sizeof msg) == 0);

    char tenant[64], key[128];
    fbt_tenant(&S, "lab", "", tenant, sizeof tenant, key, sizeof key);
    char job[4][64];
    for (int i = 0; i < 4; i++)
        snprintf(job[i], sizeof job[i], "%s", fbt_job(&S, key, "bait"));

    zctx = zmq_ctx_new();
    CHECK(zctx != NULL);
    int first, got;
    unsigned types;
    char pub[41], sec[41], other_pub[41], other_sec[41];

    keypair(pub, sec);
    got = speak(CURVE_KEYS, pub, sec, server_pub, "intruder", TRY_MS, &first, &types);
    expect_silence("an unlisted keypair", got, first);

    keypair(other_pub, other_sec);
    got = speak(CURVE_KEYS, listed_pub, other_sec, server_pub, "impostor", TRY_MS, &first, &types);
    expect_silence("the listed public key, another secret", got, first);

    char wrong_pub[41], wrong_sec[41];
    keypair(wrong_pub, wrong_sec);
    keypair(other_pub, other_sec);
    got = speak(CURVE_KEYS, other_pub, other_sec, wrong_pub, "misled", TRY_MS, &first, &types);
    expect_silence("an unlisted keypair, a wrong server key", got, first);

    got = speak(NO_CURVE, NULL, NULL, NULL, "plain", TRY_MS, &first, &types);
    expect_silence("no encryption", got, first);

    CHECK_STR_EQ(fbt_sql_value(&S, "SELECT count(*) FROM workers"), "0");
    char sql[256];
    CHECK_STR_EQ(fbt_sql_value(&S, "SELECT count(*) FROM jobs WHERE state <> 'queued'"), "0");
    /* the refusal is in the log, with the key that was refused */
    CHECK(log_contains("refused a worker connection: unknown key"));
    CHECK(log_contains(pub));
    printf("worker: the server log names the refused key %s\n", pub);

    /* The jobs' resume checkpoints, as if the database had been tampered with,
     * point outside the artifacts directory: through a symbolic link planted
     * in it, through "..", and absolutely.  The server must send none of
     * them to the worker, and restart the jobs from step 0 instead. */
    char outside[600], link[600];
    snprintf(outside, sizeof outside, "%s/outside", S.data_dir);
    CHECK(mkdir(outside, 0700) == 0);
    snprintf(path, sizeof path, "%s/secret.bin", outside);
    write_text(path, SECRET);
    snprintf(link, sizeof link, "%s/artifacts/escape", S.data_dir);
    CHECK(symlink(outside, link) == 0);
    const char *tampered[3] = {"escape/secret.bin", "../outside/secret.bin", path};
    for (int i = 0; i < 3; i++) {
        char *lit = PQescapeLiteral(S.sql, tampered[i], strlen(tampered[i]));
        CHECK(lit != NULL);
        snprintf(sql, sizeof sql,
                 "UPDATE jobs SET resume_step = 3, step = 3, resume_path = %s WHERE id = '%s'", lit,
                 job[i]);
        PQfreemem(lit);
        PQclear(fbt_sql(&S, sql));
    }
    /* and one honest checkpoint, which must still be sent */
    snprintf(path, sizeof path, "%s/artifacts/honest", S.data_dir);
    CHECK(mkdir(path, 0700) == 0);
    snprintf(path, sizeof path, "%s/artifacts/honest/state.bin", S.data_dir);
    write_text(path, LEGIT);
    snprintf(sql, sizeof sql,
             "UPDATE jobs SET resume_step = 3, step = 3, resume_path = 'honest/state.bin'"
             " WHERE id = '%s'",
             job[3]);
    PQclear(fbt_sql(&S, sql));
    members_wanted = 4;

    /* the same code with the listed keys is welcomed */
    got = speak(CURVE_KEYS, listed_pub, listed_sec, server_pub, "listed", 15000, &first, &types);
    printf("worker: %-40s %d messages back (first: %s, assign: %s)\n", "the listed keypair", got,
           first < 0 ? "none" : fb_wire_type_name((fb_wire_type)first),
           types & (1u << FB_WIRE_ASSIGN) ? "yes" : "no");
    CHECK_INT_EQ(first, FB_WIRE_WELCOME);
    /* the bait was there to be had: the listed worker is given it */
    CHECK(types & (1u << FB_WIRE_ASSIGN));
    printf("worker: %d jobs assigned, %d resume checkpoints sent: %d the file outside, %d the"
           " honest one\n",
           members_assigned, resume_blobs, secrets_sent, legit_sent);
    CHECK_INT_EQ(members_assigned, 4);
    CHECK_INT_EQ(secrets_sent, 0);
    CHECK_INT_EQ(legit_sent, 1);
    /* the three tampered jobs were restarted from step 0 instead */
    CHECK_STR_EQ(fbt_sql_value(&S, "SELECT count(*) FROM jobs WHERE resume_path IS NOT NULL"), "1");

    char first_reg[64];
    double t0 = fbt_now_ms();
    int welcomes = hello_flood(200, 20000, first_reg, sizeof first_reg);
    const char *last_reg =
        fbt_sql_value(&S, "SELECT registered_at::text FROM workers WHERE name = 'listed'");
    printf("worker: 200 HELLOs at once: %d WELCOMEs in %.0f ms; registered at %s, then %s\n",
           welcomes, fbt_now_ms() - t0, first_reg, last_reg);
    CHECK_INT_EQ(welcomes, 200);
    CHECK_STR_EQ(last_reg, first_reg);
    zmq_ctx_term(zctx);

    CHECK_INT_EQ(fbt_server_stop(&S), 0);
    fbt_db_drop(&S);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
    printf("ok\n");
    return 0;
}
