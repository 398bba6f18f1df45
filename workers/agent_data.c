/*
 * The worker agent's dataset cache (agent_int.h): a dataset is loaded once
 * and shared by every group that trains on it with one val_fraction, freed
 * when the last of them lets it go.  An IDX dataset's splits are in memory; a
 * shard dataset's validation set and test split are, and its train split is
 * read by each group's own prefetching loader (agent_group.c).  The cache is
 * guarded by the agent's ds_mu; group threads call it.
 */
#include "agent_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "datadir.h"
#include "idx.h"

/* ---- the dataset cache --------------------------------------------------------------------- */

/* Loads a dataset's train and (when there is one) test split into memory. */
static int dataset_load(fb_agent *a, dataset_ref *r, char *msg, size_t msg_cap)
{
    char dir[2048], m2[1024];
    if (r->tenant[0])
        snprintf(r->data_dir, sizeof r->data_dir, "%s/%s", a->data_dir, r->tenant);
    else
        snprintf(r->data_dir, sizeof r->data_dir, "%s", a->data_dir);
    int kind = fb_datadir_resolve(dir, sizeof dir, r->name, r->data_dir);
    if (kind < 0)
        return fb_errf(msg, msg_cap, FB_ERR_DATA, "dataset %s: not a valid dataset name", r->name);
    struct stat st;
    if ((stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) && !r->tenant[0] &&
        strcmp(a->data_dir, FB_DATASET_DEFAULT_DIR) != 0) {
        /* a public dataset not in the data directory (which may be fuseboxd's datasets
         * directory, holding tenants' datasets only): the system's built-in ones */
        snprintf(r->data_dir, sizeof r->data_dir, "%s", FB_DATASET_DEFAULT_DIR);
        kind = fb_datadir_resolve(dir, sizeof dir, r->name, r->data_dir);
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return fb_errf(msg, msg_cap, FB_ERR_NOT_FOUND,
                       "dataset %s is not in the worker's data directory (%s)%s", r->name,
                       a->data_dir, r->tenant[0] ? "" : " nor among the built-in datasets");
    int err;
    if (kind == 1) {
        r->shard = true;
        double held; /* each group's loader holds the same records out (fb_data_open_named) */
        if ((err = fb_datadir_load_val(&r->val, &held, dir, r->val_fraction, true, m2,
                                       sizeof m2)))
            return fb_errf(msg, msg_cap, err, "dataset %s: %s", r->name, m2);
        err = fb_datadir_load_split(&r->test, dir, "test", m2, sizeof m2);
        if (err && err != FB_ERR_NOT_FOUND) {
            fb_dataset_free(&r->val);
            return fb_errf(msg, msg_cap, err, "dataset %s: %s", r->name, m2);
        }
        r->has_test = err == FB_OK;
    } else {
        if ((err = fb_dataset_open_named(r->name, "train", r->data_dir, &r->train, m2,
                                         sizeof m2)))
            return fb_errf(msg, msg_cap, err, "dataset %s: %s", r->name, m2);
        if ((err = fb_dataset_holdout(&r->train, &r->val, r->val_fraction, m2, sizeof m2)) ||
            (err = fb_dataset_open_named(r->name, "test", r->data_dir, &r->test, m2,
                                         sizeof m2))) {
            fb_dataset_free(&r->train);
            fb_dataset_free(&r->val);
            return fb_errf(msg, msg_cap, err, "dataset %s: %s", r->name, m2);
        }
        r->has_test = true;
    }
    return FB_OK;
}

/* The named dataset, loaded on first use; NULL with msg filled when it cannot be. */
dataset_ref *agent_dataset_acquire(fb_agent *a, const char *tenant, const char *name,
                                   double val_fraction, char *msg, size_t msg_cap)
{
    pthread_mutex_lock(&a->ds_mu);
    dataset_ref *r;
    for (r = a->datasets; r; r = r->next)
        if (strcmp(r->name, name) == 0 && strcmp(r->tenant, tenant) == 0 &&
            r->val_fraction == val_fraction)
            break;
    if (r) {
        r->refs++;
        pthread_mutex_unlock(&a->ds_mu);
        return r;
    }
    r = calloc(1, sizeof *r);
    if (!r) {
        fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        pthread_mutex_unlock(&a->ds_mu);
        return NULL;
    }
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->tenant, sizeof r->tenant, "%s", tenant);
    r->val_fraction = val_fraction;
    /* loading under the lock: a second group on the same dataset waits for this load
     * instead of reading the files again */
    double t0 = agent_now_ms();
    if (dataset_load(a, r, msg, msg_cap)) {
        free(r);
        pthread_mutex_unlock(&a->ds_mu);
        return NULL;
    }
    r->refs = 1;
    r->next = a->datasets;
    a->datasets = r;
    pthread_mutex_unlock(&a->ds_mu);
    agent_log("dataset %s loaded in %.0f ms: %s, %lld validation and %lld test samples", name,
              agent_now_ms() - t0,
              r->shard ? "shards (train split read by each array's loader)" : "in memory",
              (long long)r->val.n, (long long)(r->has_test ? r->test.n : 0));
    return r;
}

/* Drops a reference; the last one frees the data. */
void agent_dataset_release(fb_agent *a, dataset_ref *r)
{
    if (!r) return;
    pthread_mutex_lock(&a->ds_mu);
    if (--r->refs == 0) {
        for (dataset_ref **p = &a->datasets; *p; p = &(*p)->next)
            if (*p == r) {
                *p = r->next;
                break;
            }
        fb_dataset_free(&r->train);
        fb_dataset_free(&r->val);
        fb_dataset_free(&r->test);
        free(r);
    }
    pthread_mutex_unlock(&a->ds_mu);
}
