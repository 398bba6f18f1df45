/*
 * The fused training array's weights files (array.h): a member's parameters
 * and batch-norm buffers as safetensors under their PyTorch names, with the
 * metadata that describes it, and loading them back strictly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array_impl.h"
#include "safetensors.h"

#ifndef FB_VERSION_STRING
#define FB_VERSION_STRING "0.1.0"
#endif

int fb_array_add_tensors(const fb_array *a, int m, bool grads, fb_st_writer *w, void **hold,
                         char *msg, size_t msg_cap)
{
    FB_ASSERT(m >= 0 && m < a->B);
    int n_total = a->n_params + (grads ? 0 : a->n_bufs);
    int n_bn = grads ? 0 : a->n_bn;
    size_t floats = 0;
    for (int t = 0; t < n_total; t++)
        floats += t < a->n_params ? a->params[t].per_member : a->bufs[t - a->n_params].per_member;
    floats += floats & 1; /* the counters that follow need 8-byte alignment */
    /* one block: every tensor's floats, then the int64 counters */
    char *block = malloc(floats * sizeof(float) + (size_t)n_bn * sizeof(int64_t) + 8);
    if (!block) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    float *at = (float *)block;
    int64_t *tracked = (int64_t *)(block + floats * sizeof(float));
    int err;
    for (int t = 0; t < n_total; t++) {
        bool is_buf = t >= a->n_params;
        const tensor_def *d = is_buf ? &a->bufs[t - a->n_params] : &a->params[t];
        const float *slab = is_buf ? a->rb : grads ? a->g : a->p;
        fb_backend_download(a->be, at, slab + d->offset + (size_t)m * d->per_member,
                            d->per_member * sizeof(float));
        if (grads && !is_buf) unscale_host(a, m, at, d->per_member);
        if ((err = fb_st_writer_add_f32(w, d->name, d->shape, d->ndim, at, msg, msg_cap)))
            goto fail;
        at += d->per_member;
    }
    /* num_batches_tracked sits beside each batch norm's running statistics */
    for (int k = 0; k < n_bn; k++) {
        char name[NAME_CAP + 32];
        fb_array_bn_name(a, k, name, sizeof name);
        tracked[k] = a->bn_tracked[(size_t)m * a->n_bn + k];
        if ((err = fb_st_writer_add_i64(w, name, NULL, 0, &tracked[k], msg, msg_cap))) goto fail;
    }
    if ((err = device_status(a, msg, msg_cap))) goto fail; /* the downloads may not have happened */
    *hold = block;
    return FB_OK;
fail:
    free(block);
    return err;
}

int fb_array_add_description(const fb_array *a, int m, fb_st_writer *w, char *msg, size_t msg_cap)
{
    FB_ASSERT(m >= 0 && m < a->B);
    char *spec = fb_job_spec_canonical(a->specs[m]);
    if (!spec) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    int err = fb_st_writer_set_metadata(w, "spec", spec, msg, msg_cap);
    free(spec);
    if (!err) err = fb_st_writer_set_metadata(w, "preprocess", FB_PREPROCESS_JSON, msg, msg_cap);
    if (!err)
        err = fb_st_writer_set_metadata(w, "fusebox_version", FB_VERSION_STRING, msg, msg_cap);
    return err;
}

int fb_array_save(const fb_array *a, int m, const char *path, bool grads, const char *meta_key,
                  const char *meta_value, char *msg, size_t msg_cap)
{
    int err;
    void *hold = NULL;
    fb_st_writer *w = fb_st_writer_new();
    if (!w) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    if ((err = fb_array_add_tensors(a, m, grads, w, &hold, msg, msg_cap))) goto done;
    if ((err = fb_array_add_description(a, m, w, msg, msg_cap))) goto done;
    if (meta_key && (err = fb_st_writer_set_metadata(w, meta_key, meta_value, msg, msg_cap)))
        goto done;
    err = fb_st_write(w, path, msg, msg_cap);
done:
    /* the writer references hold's data until here */
    fb_st_writer_free(w);
    free(hold);
    return err;
}

/* Loads member m's parameters and buffers from the parsed file f (path names it in
 * messages); takes f. */
static int load_member(fb_array *a, int m, fb_st_file *f, const char *path, char *msg,
                       size_t msg_cap)
{
    int err;
    int n_total = a->n_params + a->n_bufs;
    float **host = calloc((size_t)n_total + 1, sizeof *host);
    int64_t *tracked = calloc((size_t)a->n_bn + 1, sizeof *tracked);
    bool *present = calloc((size_t)n_total + 1, sizeof *present);
    if (!host || !tracked || !present) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* a full-state checkpoint's optimizer state is not part of the model */
    const char *format = fb_st_metadata_get(f, "format");
    bool checkpoint = format && strcmp(format, FB_CHECKPOINT_FORMAT) == 0;
    /* every tensor in the file must be one of ours */
    for (size_t i = 0; i < fb_st_count(f); i++) {
        const char *name = fb_st_at(f, i)->name;
        if (checkpoint && strncmp(name, "optim.", 6) == 0) continue;
        bool known = false;
        for (int t = 0; t < n_total && !known; t++) {
            const tensor_def *d = t < a->n_params ? &a->params[t] : &a->bufs[t - a->n_params];
            known = strcmp(d->name, name) == 0;
        }
        const char *dot = strrchr(name, '.');
        if (!known && dot && strcmp(dot, ".num_batches_tracked") == 0) {
            /* a batch norm's counter is ours only when that batch norm is */
            size_t len = (size_t)(dot - name);
            for (int t = 0; t < a->n_bufs && !known; t++)
                known = strncmp(a->bufs[t].name, name, len) == 0 &&
                        strcmp(a->bufs[t].name + len, ".running_mean") == 0;
        }
        if (!known) {
            err = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                          "%s: tensor %s is not a parameter of this model", path, name);
            goto done;
        }
    }
    for (int t = 0; t < n_total; t++) {
        bool is_buf = t >= a->n_params;
        const tensor_def *d = is_buf ? &a->bufs[t - a->n_params] : &a->params[t];
        if (!fb_st_find(f, d->name)) {
            if (is_buf) continue; /* running statistics keep their initial values */
            err = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: parameter %s is missing", path,
                          d->name);
            goto done;
        }
        host[t] = malloc(d->per_member * sizeof(float));
        if (!host[t]) {
            err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
            goto done;
        }
        if ((err = fb_st_get_f32(f, d->name, d->shape, d->ndim, host[t], msg, msg_cap))) goto done;
        present[t] = true;
    }
    for (int t = 0, k = 0; t < a->n_bufs; t++) {
        const char *dot = strrchr(a->bufs[t].name, '.');
        if (strcmp(dot, ".running_mean") != 0) continue;
        char name[NAME_CAP];
        snprintf(name, sizeof name, "%.*s.num_batches_tracked", (int)(dot - a->bufs[t].name),
                 a->bufs[t].name);
        tracked[k] = a->bn_tracked[(size_t)m * a->n_bn + k];
        if (fb_st_find(f, name) &&
            (err = fb_st_get_i64(f, name, NULL, 0, &tracked[k], msg, msg_cap)))
            goto done;
        k++;
    }
    /* everything validated: now change the member */
    for (int t = 0; t < n_total; t++) {
        if (!present[t]) continue;
        bool is_buf = t >= a->n_params;
        const tensor_def *d = is_buf ? &a->bufs[t - a->n_params] : &a->params[t];
        fb_backend_upload(a->be, (is_buf ? a->rb : a->p) + d->offset + (size_t)m * d->per_member,
                          host[t], d->per_member * sizeof(float));
    }
    memcpy(a->bn_tracked + (size_t)m * a->n_bn, tracked, (size_t)a->n_bn * sizeof *tracked);
    err = device_status(a, msg, msg_cap);
done:
    if (host)
        for (int t = 0; t < n_total; t++) free(host[t]);
    free(host);
    free(tracked);
    free(present);
    fb_st_close(f);
    return err;
}

int fb_array_load(fb_array *a, int m, const char *path, char *msg, size_t msg_cap)
{
    fb_st_file *f = NULL;
    int err = fb_st_open(path, &f, msg, msg_cap);
    if (err) return err;
    return load_member(a, m, f, path, msg, msg_cap);
}

int fb_array_load_buffer(fb_array *a, int m, const void *buf, size_t len, const char *who,
                         char *msg, size_t msg_cap)
{
    fb_st_file *f = NULL;
    char inner[512];
    int err = fb_st_parse_buffer(buf, len, &f, inner, sizeof inner);
    if (err == FB_ERR_NOMEM) return fb_errf(msg, msg_cap, err, "%s", inner);
    if (err) return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: %s", who, inner);
    return load_member(a, m, f, who, msg, msg_cap);
}
