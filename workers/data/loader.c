/*
 * The loader's machinery.  One mutex guards all shared state; reader threads
 * take work in this order of preference:
 *
 *   1. assemble the next batch, when its queue slot is free and every
 *      window its samples come from is decoded;
 *   2. decode a chunk of the oldest window still loading;
 *   3. open the next window of the order (hand its chunks out for decoding
 *      and draw its record permutation outside the lock), when a window
 *      slot is free and the window is needed by a batch within the queue's
 *      reach, or is the one window of read-ahead beyond it.
 *
 * Readers run as SCHED_BATCH where Linux offers it and sleep on an event
 * count with a timeout paced to the consumer (work_wait); fb_loader_next
 * wakes them only when it finds its batch not ready, so on a busy machine it
 * neither pays for waking threads nor hands a reader its CPU.
 *
 * A window stays resident until the consumer has passed its end, so a
 * change of rank split can reassemble any batch not yet delivered.  The
 * order itself comes only from plan_compute and window_perm, which depend
 * on data_seed, the epoch and the manifest.
 */
#define _GNU_SOURCE /* SCHED_BATCH */
#include "loader.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "manifest_file.h"
#include "rng.h"

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define STREAM_CHUNKS 0x63686e6b00000000ULL /* "chnk": the epoch's chunk permutation */
#define STREAM_WINDOW 0x77696e6400000000ULL /* "wind": a window's record permutation */
#define LOADER_MAX_BATCH ((int64_t)1 << 24)
#define LOADER_MAX_SHUFFLE ((int64_t)1 << 28)
#define LOADER_MAX_WINDOW_SLOTS 65536

typedef struct gchunk {
    int shard;
    int64_t chunk;   /* index in its shard */
    int64_t first;   /* first record, split-wide */
    int64_t records;
    int64_t kept;    /* records that train: not held out for validation */
    uint64_t raw;
} gchunk;

enum { W_FREE, W_LOADING, W_READY };

typedef struct wslot {
    int state;
    int64_t epoch, w;
    int64_t start, end; /* positions [start, end) of the epoch order */
    int64_t nch, claimed, done;
    int64_t *gidx;      /* [W] split-wide chunk ids, in window order */
    int64_t *cstart;    /* [W + 1] first window record of each chunk */
    uint8_t **buf;      /* [W] decoded chunks */
    size_t *buf_cap;
    fb_shard_chunk *view;
    int64_t *perm;      /* [end - start]: window record visited at each position */
    size_t perm_cap;
    bool perm_ready;    /* perm is computed (by the thread that opened the window) */
} wslot;

enum { B_FREE, B_BUSY, B_READY, B_HELD };

typedef struct bslot {
    int state;
    int64_t seq;
    uint64_t gen;
    float *x;
    int32_t *y;
    int64_t n, gn, first;
    fb_loader_pos pos;
} bslot;

typedef struct geom {
    int64_t epoch, start, gn; /* the global batch: [start, start + gn) of epoch */
    int64_t lo, hi;           /* this rank's part, absolute positions [lo, hi) */
} geom;

typedef struct reader_arg {
    struct fb_loader *l;
    fb_shard_scratch *scratch;
    wslot **list;
} reader_arg;

struct fb_loader {
    fb_manifest m;
    const fb_manifest_split *sp;
    int n_shards;
    fb_shard_reader **readers;
    gchunk *chunks;
    int64_t G, n, numel, min_chunk;
    int64_t N;
    bool shuffle, drop_last;
    uint64_t seed;
    double val_fraction; /* records held out of training (fb_data_held_out) */
    int64_t W, n_windows;
    fb_loader_pos origin;
    int64_t first_epoch_batches, bpe;
    /* rank split */
    int rank, world;
    int64_t *counts; /* [FB_LOADER_MAX_WORLD] */
    int64_t off_r, cnt_r;
    uint64_t gen;
    /* threads */
    pthread_t *th;
    reader_arg *args;
    int nth, started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_ready;
    atomic_uint work_seq;  /* readers' event count (Linux): bumped by every work_wake */
    atomic_int sleepers;   /* readers blocked in work_wait */
    double pace_s, last_next_s; /* consumer: smoothed time between fb_loader_next calls */
    bool stop;
    int err;
    char errmsg[1024];
    /* windows, and the plan of the epoch the window cursor is in */
    wslot *ws;
    int nws;
    int64_t cursor_epoch, cursor_w, plan_epoch;
    int64_t *plan_perm, *plan_wstart;
    /* batches */
    bslot *bs;
    int nbs;
    int64_t Q, next_assemble, returned;
    int held;
    fb_loader_stats st;
};

/*
 * Readers sleep on an event count rather than a condition variable, and the
 * training thread does not wake them when it merely frees a queue slot:
 * waking a thread costs the waker a system call that, on a busy (virtual)
 * machine, took over half a millisecond here, and glibc's condition variable
 * can make the waker wait for a waiter preempted on its way into the wait.
 * A reader with nothing to do sleeps until its state changes (work_wake,
 * after every change made under the mutex by a reader, a stalled consumer,
 * a split change or shutdown) or until a timeout paced to the consumer
 * (about a quarter of the queue's worth of steps), then looks again; it
 * reads the count under the mutex after finding no work, so no wake-up is
 * lost.
 */
static void work_wait(struct fb_loader *l, double timeout_s)
{
#ifdef __linux__
    struct timespec ts, *tp = NULL;
    if (timeout_s > 0) {
        ts.tv_sec = (time_t)timeout_s;
        ts.tv_nsec = (long)((timeout_s - (double)ts.tv_sec) * 1e9);
        tp = &ts;
    }
    atomic_fetch_add(&l->sleepers, 1);
    unsigned seen = atomic_load(&l->work_seq);
    pthread_mutex_unlock(&l->mu);
    syscall(SYS_futex, (void *)&l->work_seq, FUTEX_WAIT_PRIVATE, seen, tp, NULL, 0);
    atomic_fetch_sub(&l->sleepers, 1);
    pthread_mutex_lock(&l->mu);
#else
    if (timeout_s > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = (double)ts.tv_nsec * 1e-9 + timeout_s;
        ts.tv_sec += (time_t)t;
        ts.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
        pthread_cond_timedwait(&l->cv_work, &l->mu, &ts);
    } else {
        pthread_cond_wait(&l->cv_work, &l->mu);
    }
#endif
}

static void work_wake(struct fb_loader *l)
{
#ifdef __linux__
    atomic_fetch_add(&l->work_seq, 1);
    if (atomic_load(&l->sleepers) > 0)
        syscall(SYS_futex, (void *)&l->work_seq, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    pthread_cond_broadcast(&l->cv_work);
#endif
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* How long an idle reader sleeps before it looks at the queue again: a
 * quarter of the queue at the consumer's pace, within [0.5 ms, 50 ms]. */
static double idle_timeout(const struct fb_loader *l)
{
    double t = l->pace_s > 0 ? l->pace_s * (double)l->Q / 4 : 5e-3;
    return t < 5e-4 ? 5e-4 : t > 5e-2 ? 5e-2 : t;
}

/* ------------------------------------------------------------ the order */

bool fb_data_held_out(int64_t record, double val_fraction)
{
    if (!(val_fraction > 0)) return false;
    /* splitmix64's finaliser of the index and a constant: nothing else enters */
    uint64_t z = (uint64_t)record + FB_DATA_HOLDOUT_SALT;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53 < val_fraction;
}

int64_t fb_data_kept_count(int64_t n, double val_fraction)
{
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += !fb_data_held_out(i, val_fraction);
    return k;
}

/* Epoch's chunk permutation perm[G] and window start positions wstart[nw+1]. */
static void plan_compute(const fb_loader *l, int64_t epoch, int64_t *perm, int64_t *wstart)
{
    for (int64_t i = 0; i < l->G; i++) perm[i] = i;
    if (l->shuffle)
        for (int64_t i = l->G - 1; i > 0; i--) {
            uint64_t r = fb_rng_u64(l->seed, STREAM_CHUNKS + (uint64_t)epoch, (uint64_t)i);
            int64_t j = (int64_t)(r % (uint64_t)(i + 1)), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
    wstart[0] = 0;
    for (int64_t w = 0; w < l->n_windows; w++) {
        int64_t s = wstart[w], end = (w + 1) * l->W < l->G ? (w + 1) * l->W : l->G;
        for (int64_t k = w * l->W; k < end; k++) s += l->chunks[perm[k]].kept;
        wstart[w + 1] = s;
    }
}

/* The window's records that train, in file order, into out: their numbers in the
 * concatenation of the window's chunks gidx[0..nch) (what assemble reads), the
 * records held out for validation left out.  Returns how many. */
static int64_t window_kept(const fb_loader *l, const int64_t *gidx, int64_t nch, int64_t *out)
{
    int64_t k = 0, base = 0;
    for (int64_t c = 0; c < nch; c++) {
        const gchunk *g = &l->chunks[gidx[c]];
        for (int64_t i = 0; i < g->records; i++)
            if (!fb_data_held_out(g->first + i, l->val_fraction)) out[k++] = base + i;
        base += g->records;
    }
    return k;
}

/* The record order of window w of epoch: perm[0..R) holds the window's records that
 * train (window_kept), which it shuffles in place.  Without held-out records it is a
 * permutation of 0..R-1 drawn as before validation existed. */
static void window_perm(const fb_loader *l, int64_t epoch, int64_t w, int64_t R, int64_t *perm)
{
    if (!l->shuffle) return;
    for (int64_t i = R - 1; i > 0; i--) {
        uint64_t r = fb_rng_u64(l->seed, STREAM_WINDOW + (uint64_t)epoch,
                                ((uint64_t)w << 32) ^ (uint64_t)i);
        int64_t j = (int64_t)(r % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

fb_loader_pos fb_loader_pos_at_step(int64_t n, int64_t batch_size, bool drop_last, int64_t step)
{
    fb_loader_pos p = {0, 0};
    if (n < 1 || batch_size < 1 || step < 0) return p;
    int64_t bpe = drop_last ? n / batch_size : (n + batch_size - 1) / batch_size;
    if (bpe < 1) return p;
    p.epoch = step / bpe;
    p.offset = (step % bpe) * batch_size;
    return p;
}

/* The global batch `seq` (counted from the origin) and this rank's part. */
static geom batch_geom(const fb_loader *l, int64_t seq)
{
    geom g;
    if (seq < l->first_epoch_batches) {
        g.epoch = l->origin.epoch;
        g.start = l->origin.offset + seq * l->N;
    } else {
        int64_t q = seq - l->first_epoch_batches;
        g.epoch = l->origin.epoch + 1 + q / l->bpe;
        g.start = (q % l->bpe) * l->N;
    }
    g.gn = l->n - g.start < l->N ? l->n - g.start : l->N;
    g.lo = g.start + g.gn * l->off_r / l->N;
    g.hi = g.start + g.gn * (l->off_r + l->cnt_r) / l->N;
    return g;
}

static int pos_lt(int64_t e1, int64_t p1, int64_t e2, int64_t p2)
{
    return e1 < e2 || (e1 == e2 && p1 < p2);
}

/* ------------------------------------------------------------ shared state (locked) */

static void set_error(fb_loader *l, int rc, const char *msg)
{
    if (!l->err) {
        l->err = rc;
        snprintf(l->errmsg, sizeof l->errmsg, "%s", msg);
    }
    pthread_cond_broadcast(&l->cv_ready);
    work_wake(l);
}

/* Frees every window the consumer has passed. */
static void reclaim_windows(fb_loader *l)
{
    geom f = batch_geom(l, l->returned);
    for (int i = 0; i < l->nws; i++) {
        wslot *w = &l->ws[i];
        if (w->state == W_READY && !pos_lt(f.epoch, f.start, w->epoch, w->end)) w->state = W_FREE;
    }
}

/* Collects, in position order, the resident windows covering g's part;
 * returns 0 when one of them is not decoded yet. */
static int batch_windows(fb_loader *l, const geom *g, wslot **list, int *nl)
{
    int k = 0;
    for (int64_t p = g->lo; p < g->hi;) {
        wslot *found = NULL;
        for (int i = 0; i < l->nws; i++) {
            wslot *w = &l->ws[i];
            if (w->state == W_READY && w->epoch == g->epoch && w->start <= p && p < w->end) {
                found = w;
                break;
            }
        }
        if (!found) return 0;
        list[k++] = found;
        p = found->end;
    }
    *nl = k;
    return 1;
}

/* A window is ready once its chunks are decoded and its permutation drawn. */
static void window_check_ready(fb_loader *l, wslot *w)
{
    if (w->state == W_LOADING && w->done == w->nch && w->perm_ready) {
        w->state = W_READY;
        work_wake(l);
    }
}

/* Opens the window at the cursor when allowed and returns it; its chunks
 * can be claimed at once, its permutation is left to the caller. */
static wslot *try_open_window(fb_loader *l)
{
    for (;;) {
        if (l->cursor_w >= l->n_windows) {
            l->cursor_epoch++;
            l->cursor_w = 0;
        }
        if (l->plan_epoch != l->cursor_epoch) {
            plan_compute(l, l->cursor_epoch, l->plan_perm, l->plan_wstart);
            l->plan_epoch = l->cursor_epoch;
        }
        int64_t ws = l->plan_wstart[l->cursor_w], we = l->plan_wstart[l->cursor_w + 1];
        bool first = l->cursor_epoch == l->origin.epoch;
        int64_t begin = first ? l->origin.offset : 0;
        int64_t used_end = l->drop_last ? begin + (first ? l->first_epoch_batches : l->bpe) * l->N
                                        : l->n;
        /* a window before the start, or one whose records are all held out, is never read */
        if (we <= begin || we == ws) {
            l->cursor_w++;
            continue;
        }
        if (ws >= used_end) {
            l->cursor_w = l->n_windows;
            continue;
        }
        break;
    }
    int64_t ws = l->plan_wstart[l->cursor_w];
    geom lim = batch_geom(l, l->returned + l->Q);
    if (!pos_lt(l->cursor_epoch, ws, lim.epoch, lim.start)) {
        for (int i = 0; i < l->nws; i++)
            if (l->ws[i].state != W_FREE &&
                !pos_lt(l->ws[i].epoch, l->ws[i].start, lim.epoch, lim.start))
                return NULL; /* the one window of read-ahead is already there */
    }
    wslot *w = NULL;
    reclaim_windows(l);
    for (int i = 0; i < l->nws && !w; i++)
        if (l->ws[i].state == W_FREE) w = &l->ws[i];
    if (!w) return NULL;
    if (!w->gidx) {
        w->gidx = calloc((size_t)l->W, sizeof *w->gidx);
        w->cstart = calloc((size_t)l->W + 1, sizeof *w->cstart);
        w->buf = calloc((size_t)l->W, sizeof *w->buf);
        w->buf_cap = calloc((size_t)l->W, sizeof *w->buf_cap);
        w->view = calloc((size_t)l->W, sizeof *w->view);
        if (!w->gidx || !w->cstart || !w->buf || !w->buf_cap || !w->view) {
            set_error(l, FB_ERR_NOMEM, "out of memory opening a shuffle window");
            return NULL;
        }
    }
    int64_t cw = l->cursor_w, k0 = cw * l->W;
    int64_t k1 = k0 + l->W < l->G ? k0 + l->W : l->G;
    int64_t R = l->plan_wstart[cw + 1] - ws;
    if ((size_t)R > w->perm_cap) {
        int64_t *np = realloc(w->perm, (size_t)R * sizeof *np);
        if (!np) {
            set_error(l, FB_ERR_NOMEM, "out of memory opening a shuffle window");
            return NULL;
        }
        w->perm = np;
        w->perm_cap = (size_t)R;
    }
    w->nch = k1 - k0;
    w->cstart[0] = 0;
    for (int64_t k = k0; k < k1; k++) {
        w->gidx[k - k0] = l->plan_perm[k];
        w->cstart[k - k0 + 1] = w->cstart[k - k0] + l->chunks[l->plan_perm[k]].records;
    }
    w->epoch = l->cursor_epoch;
    w->w = cw;
    w->start = ws;
    w->end = ws + R;
    w->claimed = w->done = 0;
    w->perm_ready = false;
    w->state = W_LOADING;
    l->cursor_w++;
    return w;
}

/* ------------------------------------------------------------ reader threads */

/* Reads and checks chunk j of window w into its buffer (outside the lock). */
static int decode_chunk(fb_loader *l, fb_shard_scratch *sc, wslot *w, int64_t j, char *msg,
                        size_t msg_cap)
{
    const gchunk *gc = &l->chunks[w->gidx[j]];
    if (w->buf_cap[j] < gc->raw) {
        uint8_t *nb = realloc(w->buf[j], (size_t)gc->raw);
        if (!nb) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        w->buf[j] = nb;
        w->buf_cap[j] = (size_t)gc->raw;
    }
    fb_shard_reader *r = l->readers[gc->shard];
    int rc =
        fb_shard_read_chunk(&w->view[j], w->buf[j], w->buf_cap[j], sc, r, gc->chunk, msg, msg_cap);
    if (rc) return rc;
    /* labels within the classes (0 without labels), token ids within the vocab */
    return fb_manifest_check_chunk(&l->m, &w->view[j], fb_shard_name(r), msg, msg_cap);
}

/* Fills batch slot b with g's part from the windows in list (outside the lock). */
static void assemble(const fb_loader *l, bslot *b, const geom *g, wslot *const *list)
{
    int64_t numel = l->numel;
    int k = 0;
    const wslot *w = list[0];
    for (int64_t p = g->lo; p < g->hi; p++) {
        while (p >= w->end) w = list[++k];
        int64_t r = w->perm[p - w->start];
        /* the chunk holding window record r: binary search over cstart */
        int64_t a = 0, z = w->nch - 1;
        while (a < z) {
            int64_t mid = (a + z + 1) / 2;
            if (w->cstart[mid] <= r)
                a = mid;
            else
                z = mid - 1;
        }
        const fb_shard_chunk *c = &w->view[a];
        int64_t i = r - w->cstart[a], o = p - g->lo;
        float *dst = b->x + o * numel;
        b->y[o] = c->labels[i];
        fb_data_values_to_float(dst, l->m.dtype,
                                (const uint8_t *)c->values +
                                    (size_t)(i * numel) * fb_data_dtype_size(l->m.dtype),
                                numel);
    }
    b->n = g->hi - g->lo;
    b->gn = g->gn;
    b->first = g->lo;
    b->pos.epoch = g->epoch;
    b->pos.offset = g->start;
}

static void *reader_main(void *arg)
{
    reader_arg *ra = arg;
    fb_loader *l = ra->l;
    char msg[1024];
#ifdef SCHED_BATCH
    /* Readers keep their fair share of the CPU but do not preempt the
     * training thread when they wake up: on a busy machine a woken reader
     * would otherwise take the CPU from the caller of fb_loader_next, and
     * the step would wait for the scheduler, not for data.  Best effort. */
    struct sched_param sp = {0};
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
#endif
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        if (l->err) {
            work_wait(l, 0);
            continue;
        }
        /* 1. assemble */
        int64_t seq = l->next_assemble;
        bslot *b = &l->bs[seq % l->nbs];
        if (seq < l->returned + l->Q && b->state == B_FREE) {
            geom g = batch_geom(l, seq);
            int nl = 0;
            if (batch_windows(l, &g, ra->list, &nl)) {
                b->state = B_BUSY;
                b->seq = seq;
                b->gen = l->gen;
                l->next_assemble++;
                pthread_mutex_unlock(&l->mu);
                double t0 = now_s();
                assemble(l, b, &g, ra->list);
                double dt = now_s() - t0;
                pthread_mutex_lock(&l->mu);
                l->st.assemble_s += dt;
                if (b->gen == l->gen) {
                    b->state = B_READY;
                    pthread_cond_broadcast(&l->cv_ready);
                } else {
                    b->state = B_FREE;
                }
                work_wake(l);
                continue;
            }
        }
        /* 2. decode a chunk of the oldest loading window */
        wslot *w = NULL;
        for (int i = 0; i < l->nws; i++) {
            wslot *c = &l->ws[i];
            if (c->state == W_LOADING && c->claimed < c->nch &&
                (!w || pos_lt(c->epoch, c->start, w->epoch, w->start)))
                w = c;
        }
        if (w) {
            int64_t j = w->claimed++;
            pthread_mutex_unlock(&l->mu);
            double t0 = now_s();
            int rc = decode_chunk(l, ra->scratch, w, j, msg, sizeof msg);
            double dt = now_s() - t0;
            pthread_mutex_lock(&l->mu);
            if (rc) {
                set_error(l, rc, msg);
                continue;
            }
            const gchunk *gc = &l->chunks[w->gidx[j]];
            l->st.decode_s += dt;
            l->st.chunks++;
            l->st.bytes_read += fb_shard_get_chunk(l->readers[gc->shard], gc->chunk)->stored;
            l->st.bytes_decoded += gc->raw;
            w->done++;
            window_check_ready(l, w);
            continue;
        }
        /* 3. open the next window; draw its permutation outside the lock */
        wslot *nw = try_open_window(l);
        if (nw) {
            work_wake(l);
            int64_t epoch = nw->epoch, wi = nw->w, R = nw->end - nw->start;
            pthread_mutex_unlock(&l->mu);
            window_kept(l, nw->gidx, nw->nch, nw->perm); /* R of them: plan_compute counted */
            window_perm(l, epoch, wi, R, nw->perm);
            pthread_mutex_lock(&l->mu);
            nw->perm_ready = true;
            window_check_ready(l, nw);
            continue;
        }
        work_wait(l, idle_timeout(l));
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* ------------------------------------------------------------ public API */

static int check_split(int64_t *off, int64_t *cnt, int rank, int world, const int64_t *counts,
                       int64_t N, int64_t *dst, char *msg, size_t msg_cap)
{
    if (world < 1 || world > FB_LOADER_MAX_WORLD)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "world size %d; allowed 1 to %d", world,
                       FB_LOADER_MAX_WORLD);
    if (rank < 0 || rank >= world)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "rank %d of %d", rank, world);
    int64_t sum = 0, o = 0;
    for (int r = 0; r < world; r++) {
        int64_t c = counts ? counts[r] : N / world + (r < N % world ? 1 : 0);
        if (c < 0 || c > N)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "rank %d's share %" PRId64 " is outside 0..%" PRId64, r, c, N);
        if (r < rank) o += c;
        sum += c;
    }
    if (sum != N)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "the ranks' shares add up to %" PRId64 ", not the batch size %" PRId64, sum,
                       N);
    for (int r = 0; r < world; r++)
        dst[r] = counts ? counts[r] : N / world + (r < N % world ? 1 : 0);
    *off = o;
    *cnt = dst[rank];
    return 0;
}

static int open_shards(fb_loader *l, const char *dir, char (*staged)[FB_STAGE_PATH_MAX], char *msg,
                       size_t msg_cap)
{
    const fb_manifest_split *sp = l->sp;
    l->n_shards = sp->n_shards;
    l->readers = calloc((size_t)sp->n_shards, sizeof *l->readers);
    if (!l->readers) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    int64_t G = 0;
    char path[FB_STAGE_PATH_MAX];
    for (int i = 0; i < sp->n_shards; i++) {
        const fb_manifest_shard *sh = &sp->shards[i];
        if (staged)
            snprintf(path, sizeof path, "%s", staged[i]);
        else
            snprintf(path, sizeof path, "%s/%s", dir, sh->path);
        int rc = fb_shard_open(&l->readers[i], path, msg, msg_cap);
        if (rc) return rc;
        const fb_shard_meta *mt = fb_shard_get_meta(l->readers[i]);
        if (mt->bytes != sh->bytes)
            return fb_errf(msg, msg_cap, FB_ERR_DATA,
                           "%s: the manifest says %" PRIu64 " bytes, the file has %" PRIu64, path,
                           sh->bytes, mt->bytes);
        if (mt->dtype != l->m.dtype || mt->sample_numel != l->m.sample_numel)
            return fb_errf(msg, msg_cap, FB_ERR_DATA,
                           "%s: holds %s records of %" PRId64 " values; the manifest says %s "
                           "records of %" PRId64,
                           path, fb_data_dtype_name(mt->dtype), mt->sample_numel,
                           fb_data_dtype_name(l->m.dtype), l->m.sample_numel);
        if (mt->records != sh->records || mt->chunks != sh->chunks)
            return fb_errf(msg, msg_cap, FB_ERR_DATA,
                           "%s: holds %" PRId64 " records in %" PRId64 " chunks; the manifest "
                           "says %" PRId64 " in %" PRId64,
                           path, mt->records, mt->chunks, sh->records, sh->chunks);
        G += mt->chunks;
    }
    l->chunks = calloc((size_t)G, sizeof *l->chunks);
    if (!l->chunks) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    int64_t g = 0, first = 0, kept = 0, minc = INT64_MAX;
    for (int i = 0; i < sp->n_shards; i++) {
        const fb_shard_meta *mt = fb_shard_get_meta(l->readers[i]);
        for (int64_t c = 0; c < mt->chunks; c++, g++) {
            const fb_shard_chunk_entry *e = fb_shard_get_chunk(l->readers[i], c);
            l->chunks[g] = (gchunk){.shard = i, .chunk = c, .first = first,
                                    .records = e->records, .raw = e->raw};
            int64_t k = 0;
            for (int64_t r = 0; r < e->records; r++)
                k += !fb_data_held_out(first + r, l->val_fraction);
            l->chunks[g].kept = k;
            first += e->records;
            kept += k;
            if (k < minc) minc = k;
        }
    }
    l->G = G;
    l->n = kept;
    /* an empty window is skipped (try_open_window), so every window read holds a record */
    l->min_chunk = minc > 0 ? minc : 1;
    return 0;
}

/* The options' bounds, before anything is allocated. */
static int loader_check_opts(const fb_loader_opts *o, int threads, int Q, int64_t sbuf,
                             char *msg, size_t msg_cap)
{
    if (threads < 1 || threads > FB_LOADER_MAX_THREADS)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%d reader threads; allowed 1 to %d",
                       threads, FB_LOADER_MAX_THREADS);
    if (Q < 1 || Q > FB_LOADER_MAX_QUEUE)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "queue of %d batches; allowed 1 to %d",
                       Q, FB_LOADER_MAX_QUEUE);
    if (o->batch_size < 1 || o->batch_size > LOADER_MAX_BATCH)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "batch size %" PRId64 "; allowed 1 to %" PRId64, o->batch_size,
                       LOADER_MAX_BATCH);
    if (sbuf < 1 || sbuf > LOADER_MAX_SHUFFLE)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "shuffle buffer of %" PRId64 " samples; allowed 1 to %" PRId64, sbuf,
                       LOADER_MAX_SHUFFLE);
    if (o->start.epoch < 0 || o->start.offset < 0)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "start position (%" PRId64 ", %" PRId64
                       ") is negative", o->start.epoch, o->start.offset);
    if (o->cache_dir && o->cache_bytes == 0)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "a staging cache needs a byte bound");
    if (!(o->val_fraction >= 0 && o->val_fraction <= FB_DATA_MAX_VAL_FRACTION))
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "validation fraction %g; allowed 0 to %g", o->val_fraction,
                       FB_DATA_MAX_VAL_FRACTION);

    return FB_OK;
}

/* Reads the manifest and its split, stages the shards when asked, opens them, and takes the
 * record counts the batches come from. */
static int loader_open_dataset(fb_loader *l, const fb_loader_opts *o, char *msg, size_t msg_cap)
{
    int rc;
    char (*staged)[FB_STAGE_PATH_MAX] = NULL;
    char mpath[4200];
    snprintf(mpath, sizeof mpath, "%s/%s", o->dir, FB_MANIFEST_FILE);
    if ((rc = fb_manifest_read(&l->m, mpath, msg, msg_cap))) goto done;
    l->sp = fb_manifest_find_split(&l->m, o->split);
    if (!l->sp) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOT_FOUND, "dataset %s (%s) has no split \"%.32s\"",
                     l->m.name, o->dir, o->split);
        goto done;
    }
    if (l->m.sample_numel == 0) {
        rc = fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                     "dataset %s has variable-size records; the loader needs fixed-size ones",
                     l->m.name);
        goto done;
    }
    if (o->cache_dir) {
        staged = calloc((size_t)l->sp->n_shards, sizeof *staged);
        if (!staged) {
            rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
            goto done;
        }
        if ((rc = fb_stage_split(staged, &l->st.stage, o->cache_dir, o->cache_bytes, o->dir, &l->m,
                                 o->split, msg, msg_cap)))
            goto done;
    }
    l->val_fraction = o->val_fraction;
    if ((rc = open_shards(l, o->dir, staged, msg, msg_cap))) goto done;
    l->numel = l->m.sample_numel;
    l->N = o->batch_size;
    l->shuffle = o->shuffle;
    l->drop_last = o->drop_last;
    l->seed = o->data_seed;
    if (l->n == 0) {
        /* cannot happen within FB_DATA_MAX_VAL_FRACTION (record 0 always trains); kept so
         * that the window arithmetic below never divides by zero */
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "dataset %s (%s): every record is held out for validation (val_fraction %g)",
                     l->m.name, o->split, l->val_fraction);
        goto done;
    }
    if (l->drop_last && l->n < l->N) {
        rc = fb_errf(msg, msg_cap, FB_ERR_DATA,
                     "dataset %s (%s) has %" PRId64 " samples, fewer than the batch size %" PRId64,
                     l->m.name, o->split, l->n, l->N);
        goto done;
    }
    rc = FB_OK;
done:
    free(staged);
    return rc;
}

/* The shuffle windows, the epochs and this rank's share of each batch, and the window slots
 * the queue needs. */
static int loader_plan(fb_loader *l, const fb_loader_opts *o, int world, int Q, int64_t sbuf,
                       char *msg, size_t msg_cap)
{
    int rc;
    /* W chunks per window: the shuffle buffer's worth of records on average */
    {
        long double w = (long double)sbuf * (long double)l->G / (long double)l->n;
        l->W = w < 1 ? 1 : w > (long double)l->G ? l->G : (int64_t)w;
    }
    l->n_windows = (l->G + l->W - 1) / l->W;
    l->bpe = l->drop_last ? l->n / l->N : (l->n + l->N - 1) / l->N;
    l->origin = o->start;
    {
        int64_t left = l->n - o->start.offset;
        int64_t feb = left <= 0 ? 0 : l->drop_last ? left / l->N : (left + l->N - 1) / l->N;
        if (feb == 0) {
            l->origin.epoch++;
            l->origin.offset = 0;
            feb = l->bpe;
        }
        l->first_epoch_batches = feb;
    }
    l->cursor_epoch = l->origin.epoch;
    l->counts = calloc(FB_LOADER_MAX_WORLD, sizeof *l->counts);
    if (!l->counts) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        return rc;
    }
    if ((rc = check_split(&l->off_r, &l->cnt_r, o->rank, world, o->split_counts, l->N, l->counts,
                          msg, msg_cap)))
        return rc;
    l->rank = o->rank;
    l->world = world;

    /* window slots: enough for every window the queue's batches can span,
     * plus read-ahead and an epoch boundary (windows are at least W chunks
     * of min_chunk records, except an epoch's last) */
    {
        int64_t per = l->W * l->min_chunk;
        int64_t need = ((int64_t)(Q + 2) * l->N + per - 1) / per + 6;
        if (need > LOADER_MAX_WINDOW_SLOTS) {
            rc = fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                         "a queue of %d batches of %" PRId64 " spans too many shuffle windows of "
                         "%" PRId64 " samples; raise the shuffle buffer or the chunk size",
                         Q, l->N, per);
            return rc;
        }
        l->nws = (int)need;
    }
    l->Q = Q;
    l->nbs = Q + 1;
    return FB_OK;
}

/* The window slots, the batch queue and each reader thread's scratch. */
static int loader_alloc(fb_loader *l, int threads, char *msg, size_t msg_cap)
{
    int rc;
    l->ws = calloc((size_t)l->nws, sizeof *l->ws);
    l->bs = calloc((size_t)l->nbs, sizeof *l->bs);
    l->plan_perm = malloc((size_t)l->G * sizeof *l->plan_perm);
    l->plan_wstart = malloc((size_t)(l->n_windows + 1) * sizeof *l->plan_wstart);
    l->th = calloc((size_t)threads, sizeof *l->th);
    l->args = calloc((size_t)threads, sizeof *l->args);
    if (!l->ws || !l->bs || !l->plan_perm || !l->plan_wstart || !l->th || !l->args) {
        rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        return rc;
    }
    for (int i = 0; i < l->nbs; i++) {
        l->bs[i].x = malloc((size_t)l->N * (size_t)l->numel * sizeof(float));
        l->bs[i].y = malloc((size_t)l->N * sizeof(int32_t));
        if (!l->bs[i].x || !l->bs[i].y) {
            rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory for the batch queue");
            return rc;
        }
    }
    l->nth = threads;
    for (int t = 0; t < threads; t++) {
        l->args[t].l = l;
        l->args[t].scratch = fb_shard_scratch_new();
        l->args[t].list = calloc((size_t)l->nws, sizeof *l->args[t].list);
        if (!l->args[t].scratch || !l->args[t].list) {
            rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
            return rc;
        }
    }
    return FB_OK;
}

int fb_loader_open(fb_loader **out, const fb_loader_opts *o, char *msg, size_t msg_cap)
{
    if (!out || !o || !o->dir || !o->split)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_loader_open: NULL argument");
    double t_open = now_s();
    int threads = o->threads ? o->threads : 1, world = o->world ? o->world : 1;
    int Q = o->queue_batches ? o->queue_batches : FB_LOADER_DEFAULT_QUEUE;
    int64_t sbuf = o->shuffle_buffer ? o->shuffle_buffer : FB_LOADER_DEFAULT_SHUFFLE_BUFFER;
    int rc = loader_check_opts(o, threads, Q, sbuf, msg, msg_cap);
    if (rc) return rc;

    fb_loader *l = calloc(1, sizeof *l);
    if (!l) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    l->held = -1;
    l->plan_epoch = -1;
    atomic_init(&l->work_seq, 0);
    atomic_init(&l->sleepers, 0);
    if (pthread_mutex_init(&l->mu, NULL) != 0) {
        free(l);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "cannot create a mutex");
    }
    if (pthread_cond_init(&l->cv_work, NULL) != 0) {
        pthread_mutex_destroy(&l->mu);
        free(l);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "cannot create a condition variable");
    }
    if (pthread_cond_init(&l->cv_ready, NULL) != 0) {
        pthread_cond_destroy(&l->cv_work);
        pthread_mutex_destroy(&l->mu);
        free(l);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "cannot create a condition variable");
    }

    if ((rc = loader_open_dataset(l, o, msg, msg_cap)) ||
        (rc = loader_plan(l, o, world, Q, sbuf, msg, msg_cap)) ||
        (rc = loader_alloc(l, threads, msg, msg_cap)))
        goto fail;
    l->st.open_s = now_s() - t_open;
    for (int t = 0; t < threads; t++) {
        if (pthread_create(&l->th[t], NULL, reader_main, &l->args[t]) != 0) {
            rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "cannot start reader thread %d: %s", t,
                         strerror(errno));
            goto fail;
        }
        l->started++;
    }
    *out = l;
    return 0;
fail:
    fb_loader_free(l);
    return rc;
}

int fb_loader_next(fb_loader_batch *out, fb_loader *l, char *msg, size_t msg_cap)
{
    if (!out || !l) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_loader_next: NULL argument");
    double t0 = now_s();
    pthread_mutex_lock(&l->mu);
    if (l->last_next_s > 0) {
        double dt = t0 - l->last_next_s;
        l->pace_s = l->pace_s > 0 ? 0.8 * l->pace_s + 0.2 * dt : dt;
    }
    l->last_next_s = t0;
    if (l->held >= 0) {
        /* the readers see the free slot when they next look (idle_timeout) */
        l->bs[l->held].state = B_FREE;
        l->held = -1;
        reclaim_windows(l);
    }
    int64_t seq = l->returned;
    bslot *b = &l->bs[seq % l->nbs];
    if (!l->err && !(b->state == B_READY && b->seq == seq)) {
        l->st.stalls++;
        work_wake(l);
        while (!l->err && !(b->state == B_READY && b->seq == seq))
            pthread_cond_wait(&l->cv_ready, &l->mu);
    }
    if (l->err) {
        int rc = fb_errf(msg, msg_cap, l->err, "%s", l->errmsg);
        pthread_mutex_unlock(&l->mu);
        return rc;
    }
    b->state = B_HELD;
    l->held = (int)(b - l->bs);
    l->returned++;
    double wait = now_s() - t0;
    l->st.batches++;
    l->st.samples += b->n;
    l->st.wait_s += wait;
    if (wait > l->st.max_wait_s) l->st.max_wait_s = wait;
    pthread_mutex_unlock(&l->mu);
    out->x = b->x;
    out->y = b->y;
    out->n = b->n;
    out->global_n = b->gn;
    out->first = b->first;
    out->pos = b->pos;
    out->seq = seq;
    out->wait_s = wait;
    return 0;
}

fb_loader_pos fb_loader_position(const fb_loader *l)
{
    geom g = batch_geom(l, l->returned);
    return (fb_loader_pos){g.epoch, g.start};
}

int fb_loader_set_split(fb_loader *l, int rank, int world, const int64_t *counts, char *msg,
                        size_t msg_cap)
{
    if (!l) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_loader_set_split: NULL argument");
    int64_t *tmp = calloc(FB_LOADER_MAX_WORLD, sizeof *tmp), off, cnt;
    if (!tmp) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    int rc = check_split(&off, &cnt, rank, world, counts, l->N, tmp, msg, msg_cap);
    if (rc) {
        free(tmp);
        return rc;
    }
    pthread_mutex_lock(&l->mu);
    memcpy(l->counts, tmp, FB_LOADER_MAX_WORLD * sizeof *tmp);
    l->rank = rank;
    l->world = world;
    l->off_r = off;
    l->cnt_r = cnt;
    l->gen++;
    for (int i = 0; i < l->nbs; i++)
        if (l->bs[i].state == B_READY) l->bs[i].state = B_FREE;
    l->next_assemble = l->returned;
    work_wake(l);
    pthread_mutex_unlock(&l->mu);
    free(tmp);
    return 0;
}

void fb_loader_get_stats(fb_loader_stats *out, const fb_loader *l)
{
    pthread_mutex_t *mu = (pthread_mutex_t *)&l->mu;
    pthread_mutex_lock(mu);
    *out = l->st;
    pthread_mutex_unlock(mu);
}

const fb_manifest *fb_loader_manifest(const fb_loader *l)
{
    return &l->m;
}

int64_t fb_loader_samples(const fb_loader *l)
{
    return l->n;
}

int64_t fb_loader_batch_size(const fb_loader *l)
{
    return l->N;
}

int fb_loader_epoch_order(int64_t *order, const fb_loader *l, int64_t epoch, char *msg,
                          size_t msg_cap)
{
    if (!order || !l || epoch < 0)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_loader_epoch_order: bad argument");
    int64_t *perm = malloc((size_t)l->G * sizeof *perm);
    int64_t *wstart = malloc((size_t)(l->n_windows + 1) * sizeof *wstart);
    int64_t *wp = malloc(((size_t)l->n + 1) * sizeof *wp);
    int64_t *cst = malloc(((size_t)l->W + 1) * sizeof *cst);
    if (!perm || !wstart || !wp || !cst) {
        free(perm);
        free(wstart);
        free(wp);
        free(cst);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    }
    plan_compute(l, epoch, perm, wstart);
    for (int64_t w = 0; w < l->n_windows; w++) {
        int64_t k0 = w * l->W, k1 = k0 + l->W < l->G ? k0 + l->W : l->G;
        int64_t R = wstart[w + 1] - wstart[w];
        cst[0] = 0;
        for (int64_t k = k0; k < k1; k++) cst[k - k0 + 1] = cst[k - k0] + l->chunks[perm[k]].records;
        window_kept(l, perm + k0, k1 - k0, wp);
        window_perm(l, epoch, w, R, wp);
        for (int64_t q = 0; q < R; q++) {
            int64_t r = wp[q], a = 0, z = k1 - k0 - 1;
            while (a < z) { /* the chunk holding window record r */
                int64_t mid = (a + z + 1) / 2;
                if (cst[mid] <= r)
                    a = mid;
                else
                    z = mid - 1;
            }
            order[wstart[w] + q] = l->chunks[perm[k0 + a]].first + (r - cst[a]);
        }
    }
    free(perm);
    free(wstart);
    free(wp);
    free(cst);
    return 0;
}

void fb_loader_free(fb_loader *l)
{
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    work_wake(l);
    pthread_mutex_unlock(&l->mu);
    for (int t = 0; t < l->started; t++) pthread_join(l->th[t], NULL);
    if (l->args)
        for (int t = 0; t < l->nth; t++) {
            fb_shard_scratch_free(l->args[t].scratch);
            free(l->args[t].list);
        }
    if (l->ws)
        for (int i = 0; i < l->nws; i++) {
            wslot *w = &l->ws[i];
            if (w->buf)
                for (int64_t j = 0; j < l->W; j++) free(w->buf[j]);
            free(w->gidx);
            free(w->cstart);
            free(w->buf);
            free(w->buf_cap);
            free(w->view);
            free(w->perm);
        }
    if (l->bs)
        for (int i = 0; i < l->nbs; i++) {
            free(l->bs[i].x);
            free(l->bs[i].y);
        }
    if (l->readers)
        for (int i = 0; i < l->n_shards; i++) fb_shard_close(l->readers[i]);
    free(l->readers);
    free(l->chunks);
    free(l->counts);
    free(l->th);
    free(l->args);
    free(l->ws);
    free(l->bs);
    free(l->plan_perm);
    free(l->plan_wstart);
    fb_manifest_free(&l->m);
    pthread_cond_destroy(&l->cv_work);
    pthread_cond_destroy(&l->cv_ready);
    pthread_mutex_destroy(&l->mu);
    free(l);
}
