/*
 * Datasets inside server/: what the dataset handlers (routes_datasets.c)
 * and the import engine (routes_datasets_import.c) share.  The handlers
 * check a request, claim the dataset's row and fill an fb_ds_import; the
 * engine runs the import in a thread of its own (the data tool as a child
 * process, its manifest read back, the directory moved into place under the
 * quota) and finishes imports a stopped fuseboxd left behind.  Private to
 * server/ (docs/architecture.md, "Private headers").
 *
 * Functions that can fail return 0 or a negative fb_err and fill the
 * caller's message buffer (msg, msg_cap), or answer the request themselves
 * (those taking an fb_req).
 */
#ifndef FB_SERVER_ROUTES_DATASETS_H
#define FB_SERVER_ROUTES_DATASETS_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "config.h"
#include "routes.h"

#define DS_NAME_MAX 64
#define DS_SPLIT_MAX 32
#define DS_LABEL_MAX 128
#define DS_SHOWN_MAX (PATH_MAX + 64)

/* Bounds of a text import (fusebox-data import text): tokens a record
 * predicts from, and bytes from one record's start to the next. */
#define DS_TEXT_MAX_CONTEXT 65536
#define DS_TEXT_MAX_STRIDE ((long long)1 << 30)

/* One split to import: a CSV or text file, or IDX images and labels. */
typedef struct fb_ds_input {
    char split[DS_SPLIT_MAX + 1];
    int fd[2];                   /* -1 when unused */
    char shown[2][DS_SHOWN_MAX]; /* how messages name them to the client */
} fb_ds_input;

typedef struct fb_ds_import {
    char id[FB_UUID_LEN + 1];
    char tenant_id[FB_UUID_LEN + 1];
    char name[DS_NAME_MAX + 1];
    char tenant_dir[PATH_MAX];
    char tool[FB_CONFIG_PATH_MAX];
    bool csv;
    bool text;          /* byte-level token records: context, stride (0: the context) */
    long long context, stride;
    char label_column[DS_LABEL_MAX + 1];
    int header;  /* -1: the tool decides; 0: --no-header; 1: --header */
    bool update; /* adds a split to a ready dataset, built on a linked copy of it */
    int n_inputs;
    fb_ds_input in[2];
    PGconn *pg; /* holds the dataset's advisory lock while the import runs */
} fb_ds_import;

/*
 * Renames of dataset directories (an import moving its own into place, a
 * delete renaming one away, the clean-up of a stopped import) happen under
 * this one process-wide mutex: one fuseboxd owns a datasets directory.
 */
extern pthread_mutex_t fb_ds_fs_mu;

/* DATASETS_DIR/<tenant> into out (cap bytes), created (with DATASETS_DIR)
 * when missing.  FB_ERR_NO_SPACE, FB_ERR_IO (logged), FB_ERR_INTERNAL. */
int fb_ds_tenant_dir(const fb_config *cfg, const char *tenant, char *out, size_t cap, char *msg,
                     size_t msg_cap);

/* Removes dir/name and everything below it, never following symbolic links;
 * logs what could not be removed. */
void fb_ds_rm_path(const char *dir, const char *name);

/* A connection of an import's own (the pool's belong to requests), or NULL
 * with FB_ERR_UNAVAILABLE's message in msg. */
PGconn *fb_ds_import_connect(const fb_config *cfg, char *msg, size_t msg_cap);

/* One statement on an import connection, with fb_db_query's error mapping:
 * the result, or NULL with *err and msg set. */
PGresult *fb_ds_import_exec(PGconn *c, const char *sql, int n, const char *const *vals, int *err,
                            char *msg, size_t msg_cap);

/* fb_ds_import_exec for a statement whose rows are not needed (msg may be
 * NULL). */
int fb_ds_import_do(PGconn *c, const char *sql, int n, const char *const *vals, char *msg,
                    size_t msg_cap);

/* A zeroed import with no descriptors, or NULL when out of memory. */
fb_ds_import *fb_ds_import_new(void);

/* Closes an import's descriptors and connection and frees it.  Accepts NULL. */
void fb_ds_import_free(fb_ds_import *im);

/* Takes one of the slots of imports running at once, or refuses the
 * request (503); a slot taken is given back by fb_ds_import_slot_give or by
 * the import fb_ds_import_start started. */
int fb_ds_import_slot_take(fb_req *req);

/* Gives back a slot taken for an import that did not start. */
void fb_ds_import_slot_give(void);

/* Starts the import thread, which owns im (and its slot) from then on.
 * When no thread can start, the row is marked failed, im freed and the
 * request answered 503. */
int fb_ds_import_start(fb_req *req, fb_ds_import *im);

/*
 * Finishes the imports of the request's tenant that a stopped fuseboxd left:
 * a row that is importing while nobody holds its advisory lock turns failed
 * (or, for an added split, ready as before), and what it left on disk goes.
 */
int fb_ds_recover_stale(fb_req *req);

#endif
