/*
 * The database's limit for durable job submissions: N threads, each with its
 * own libpq connection, insert job rows as fast as they can for a fixed
 * time.  Each INSERT is a prepared, self-committing statement (INSERT +
 * COMMIT in one round trip, the least work a durable submission can cost)
 * carrying the same columns and spec document as fuseboxd's POST /v1/jobs.
 * Prints "raw_inserts_per_s <rate>" and the count.
 *
 * usage: bench_api_raw CONNINFO TENANT_ID SPEC_FILE THREADS SECONDS
 */
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *conninfo, *tenant, *spec;
static double seconds;
static atomic_long total;
static atomic_int failed;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *run(void *arg)
{
    (void)arg;
    PGconn *c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "connect: %s", PQerrorMessage(c));
        atomic_store(&failed, 1);
        PQfinish(c);
        return NULL;
    }
    PGresult *r = PQprepare(
        c, "ins",
        "INSERT INTO jobs (tenant_id, name, queue_reason, spec, fusion_key, dataset, n_params,"
        " flops_per_sample, priority, steps, epochs, max_restarts)"
        " VALUES ($1::uuid, 'raw', 'waiting for devices', $2::jsonb, "
        "'0123456789abcdef0123456789abcdef',"
        " 'fashion-mnist', 7850, 47100, 50, 100, 0, 3)",
        2, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        fprintf(stderr, "prepare: %s", PQresultErrorMessage(r));
        atomic_store(&failed, 1);
    }
    PQclear(r);
    const char *vals[2] = {tenant, spec};
    double end = now_s() + seconds;
    long n = 0;
    while (!atomic_load(&failed) && now_s() < end) {
        r = PQexecPrepared(c, "ins", 2, vals, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_COMMAND_OK) {
            fprintf(stderr, "insert: %s", PQresultErrorMessage(r));
            atomic_store(&failed, 1);
        }
        PQclear(r);
        n++;
    }
    atomic_fetch_add(&total, n);
    PQfinish(c);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s CONNINFO TENANT_ID SPEC_FILE THREADS SECONDS\n", argv[0]);
        return 2;
    }
    conninfo = argv[1];
    tenant = argv[2];
    int threads = atoi(argv[4]);
    seconds = atof(argv[5]);
    if (threads < 1 || threads > 256 || seconds <= 0) {
        fprintf(stderr, "bad THREADS or SECONDS\n");
        return 2;
    }
    FILE *f = fopen(argv[3], "rb");
    if (!f) {
        perror(argv[3]);
        return 1;
    }
    static char buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    spec = buf;
    pthread_t th[256];
    double t0 = now_s();
    for (int i = 0; i < threads; i++)
        pthread_create(&th[i], NULL, run, NULL);
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    double dt = now_s() - t0;
    if (atomic_load(&failed)) return 1;
    long n = atomic_load(&total);
    printf("raw_inserts %ld\nraw_inserts_per_s %.1f\n", n, n / dt);
    return 0;
}
