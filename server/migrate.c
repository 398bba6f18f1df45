/*
 * Reads schema/NNN_*.sql and applies what the database has not seen.
 */
#include "migrate.h"

#include <dirent.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "log.h"

#define MAX_MIGRATIONS 1000
#define MAX_MIGRATION_BYTES (16 << 20)
#define MIGRATION_LOCK_KEY "7460290521" /* arbitrary, fixed: fusebox's migration lock */

typedef struct migration {
    int version;
    char name[256];
    char *sql;
    char sha256[65];
} migration;

/* A migration file name: three digits, '_', [a-z0-9_]+, ".sql". */
static int parse_name(const char *name, int *version)
{
    size_t n = strlen(name);
    if (n < 9 || n > 200 || strcmp(name + n - 4, ".sql") != 0) return 0;
    for (int i = 0; i < 3; i++)
        if (name[i] < '0' || name[i] > '9') return 0;
    if (name[3] != '_') return 0;
    for (size_t i = 4; i < n - 4; i++) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_')) return 0;
    }
    *version = (name[0] - '0') * 100 + (name[1] - '0') * 10 + (name[2] - '0');
    return *version > 0;
}

static int cmp_migration(const void *a, const void *b)
{
    return ((const migration *)a)->version - ((const migration *)b)->version;
}

static void free_migrations(migration *m, int n)
{
    for (int i = 0; i < n; i++)
        free(m[i].sql);
    free(m);
}

static int read_file(const char *path, char **out, char *msg, size_t msg_cap)
{
    FILE *f = fopen(path, "rb");
    if (!f) return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot open migration %s", path);
    char *buf = malloc(MAX_MIGRATION_BYTES + 1);
    if (!buf) {
        fclose(f);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory reading %s", path);
    }
    size_t n = fread(buf, 1, MAX_MIGRATION_BYTES + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > MAX_MIGRATION_BYTES) {
        free(buf);
        return fb_errf(msg, msg_cap, FB_ERR_IO,
                       "cannot read migration %s (or larger than %d bytes)", path,
                       MAX_MIGRATION_BYTES);
    }
    buf[n] = '\0';
    if (strlen(buf) != n) {
        free(buf);
        return fb_errf(msg, msg_cap, FB_ERR_IO, "migration %s contains a NUL byte", path);
    }
    *out = buf;
    return FB_OK;
}

/* Lists, reads and hashes the migration files, sorted by version. */
static int load_dir(const char *dir, migration **out, int *n_out, char *msg, size_t msg_cap)
{
    DIR *d = opendir(dir);
    if (!d) return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot open schema directory %s", dir);
    migration *m = calloc(MAX_MIGRATIONS, sizeof *m);
    int n = 0, err = FB_OK;
    if (!m) {
        closedir(d);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        int version;
        if (!parse_name(e->d_name, &version)) continue;
        if (n == MAX_MIGRATIONS) {
            err = fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "more than %d migrations",
                          MAX_MIGRATIONS);
            goto fail;
        }
        for (int i = 0; i < n; i++) {
            if (m[i].version == version) {
                err = fb_errf(msg, msg_cap, FB_ERR_CONFLICT,
                              "two migrations with version %03d: %s, %s", version, m[i].name,
                              e->d_name);
                goto fail;
            }
        }
        migration *cur = &m[n++];
        cur->version = version;
        snprintf(cur->name, sizeof cur->name, "%s", e->d_name);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if ((err = read_file(path, &cur->sql, msg, msg_cap))) goto fail;
        unsigned char h[crypto_hash_sha256_BYTES];
        crypto_hash_sha256(h, (const unsigned char *)cur->sql, strlen(cur->sql));
        sodium_bin2hex(cur->sha256, sizeof cur->sha256, h, sizeof h);
    }
    closedir(d);
    qsort(m, (size_t)n, sizeof *m, cmp_migration);
    *out = m;
    *n_out = n;
    return FB_OK;
fail:
    closedir(d);
    free_migrations(m, n);
    return err;
}

/* Executes sql (possibly several statements) and checks for success. */
static int exec_simple(PGconn *conn, const char *sql, const char *what, char *msg, size_t msg_cap)
{
    PGresult *r = PQexec(conn, sql);
    ExecStatusType st = PQresultStatus(r);
    int err = FB_OK;
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        char text[400];
        snprintf(text, sizeof text, "%s", PQresultErrorMessage(r));
        text[strcspn(text, "\n")] = '\0';
        err = fb_errf(msg, msg_cap,
                      PQstatus(conn) == CONNECTION_OK ? FB_ERR_INTERNAL : FB_ERR_UNAVAILABLE,
                      "%s: %s", what, text);
    }
    PQclear(r);
    return err;
}

int fb_migrate_apply(PGconn *conn, const char *schema_dir, int *applied, int *latest, char *msg,
                     size_t msg_cap)
{
    migration *m = NULL;
    int n = 0, n_applied = 0;
    int err = load_dir(schema_dir, &m, &n, msg, msg_cap);
    if (err) return err;
    PGresult *r = NULL;
    if ((err = exec_simple(conn, "BEGIN", "BEGIN", msg, msg_cap))) goto fail;
    if ((err = exec_simple(conn, "SELECT pg_advisory_xact_lock(" MIGRATION_LOCK_KEY ")",
                           "migration lock", msg, msg_cap)))
        goto fail;
    if ((err = exec_simple(conn,
                           "CREATE TABLE IF NOT EXISTS schema_migrations ("
                           " version integer PRIMARY KEY, name text NOT NULL,"
                           " sha256 text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
                           "schema_migrations", msg, msg_cap)))
        goto fail;
    r = PQexec(conn, "SELECT version, name, sha256 FROM schema_migrations ORDER BY version");
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        err = fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE, "reading schema_migrations: %s",
                      PQresultErrorMessage(r));
        goto fail;
    }
    for (int row = 0; row < PQntuples(r); row++) {
        int version = atoi(PQgetvalue(r, row, 0));
        const migration *known = NULL;
        for (int i = 0; i < n; i++)
            if (m[i].version == version) known = &m[i];
        if (!known) {
            err = fb_errf(msg, msg_cap, FB_ERR_CONFLICT,
                          "the database has migration %03d (%s) that %s does not; "
                          "is this fuseboxd older than the database?",
                          version, PQgetvalue(r, row, 1), schema_dir);
            goto fail;
        }
        if (strcmp(known->sha256, PQgetvalue(r, row, 2)) != 0) {
            err = fb_errf(msg, msg_cap, FB_ERR_CONFLICT,
                          "migration %s was edited after it was applied (sha256 %s, applied %s); "
                          "add a new migration instead",
                          known->name, known->sha256, PQgetvalue(r, row, 2));
            goto fail;
        }
    }
    for (int i = 0; i < n; i++) {
        bool done = false;
        for (int row = 0; row < PQntuples(r); row++)
            if (atoi(PQgetvalue(r, row, 0)) == m[i].version) done = true;
        if (done) continue;
        if ((err = exec_simple(conn, m[i].sql, m[i].name, msg, msg_cap))) goto fail;
        char version[16];
        snprintf(version, sizeof version, "%d", m[i].version);
        const char *vals[3] = {version, m[i].name, m[i].sha256};
        PGresult *ins = PQexecParams(conn,
                                     "INSERT INTO schema_migrations (version, name, sha256)"
                                     " VALUES ($1::integer, $2, $3)",
                                     3, NULL, vals, NULL, NULL, 0);
        int bad = PQresultStatus(ins) != PGRES_COMMAND_OK;
        PQclear(ins);
        if (bad) {
            err = fb_errf(msg, msg_cap, FB_ERR_UNAVAILABLE, "recording migration %s failed",
                          m[i].name);
            goto fail;
        }
        n_applied++;
        fb_log_json(FB_LOG_INFO, "migration applied",
                    json_pack("{s:i, s:s}", "version", m[i].version, "file", m[i].name));
    }
    PQclear(r);
    r = NULL;
    if ((err = exec_simple(conn, "COMMIT", "COMMIT", msg, msg_cap))) goto fail;
    *applied = n_applied;
    *latest = n ? m[n - 1].version : 0;
    free_migrations(m, n);
    return FB_OK;
fail:
    PQclear(r);
    if (PQstatus(conn) == CONNECTION_OK && PQtransactionStatus(conn) != PQTRANS_IDLE) {
        PGresult *rb = PQexec(conn, "ROLLBACK");
        PQclear(rb);
    }
    free_migrations(m, n);
    return err;
}
