/*
 * Schema migrations: the files schema/NNN_name.sql, applied in order of NNN
 * when fuseboxd starts, all pending ones inside one transaction, each
 * recorded in schema_migrations with its SHA-256.  An applied file whose
 * contents changed afterwards stops the server (schema changes only ever
 * come as new files), and so does a database that has migrations this
 * binary does not know.  An advisory lock keeps two servers starting at once
 * from applying the same files twice.
 */
#ifndef FB_SERVER_MIGRATE_H
#define FB_SERVER_MIGRATE_H

#include <libpq-fe.h>
#include <stddef.h>

/*
 * Applies the pending migrations of schema_dir on conn.  On success returns
 * FB_OK and sets *applied (files applied now) and *latest (highest version
 * known, 0 when the directory has none).  On failure rolls back, returns a
 * negative fb_err (FB_ERR_IO for unreadable files, FB_ERR_CONFLICT for
 * edited or unknown migrations, FB_ERR_UNAVAILABLE for database trouble) and
 * fills msg.
 */
int fb_migrate_apply(PGconn *conn, const char *schema_dir, int *applied, int *latest, char *msg,
                     size_t msg_cap);

#endif
