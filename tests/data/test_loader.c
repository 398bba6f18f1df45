/*
 * The loader, on a dataset whose samples carry their own record index
 * (1000 records in 4 shards of chunks of 7 records, so shard ends, short
 * chunks and many shuffle windows all occur):
 *   - every epoch visits every sample exactly once, with 1 and 4 threads,
 *     and agrees with fb_loader_epoch_order; epochs and seeds differ;
 *   - the delivered order is the same for 1, 2 and 4 threads and any queue
 *     depth, and across runs;
 *   - shuffle false is file order;
 *   - resuming from (epoch, offset) continues the identical sequence, also
 *     from offsets that are not a batch multiple and across epochs;
 *   - rank sharding with uneven splits is disjoint and covers every global
 *     batch, also when the split and the world change at a step boundary;
 *   - with a validation fraction, the held-out records (a function of the
 *     record index alone) are never delivered, in any epoch, for any
 *     data_seed, thread count or rank split, and every other record is
 *     delivered exactly once per epoch; the held-out part loaded into memory
 *     is exactly those records; a dataset with a "val" split keeps all of
 *     train; bad fractions are refused;
 *   - a corrupt chunk and a label outside the manifest's classes stop the
 *     loader with FB_ERR_DATA naming the file and chunk, and bad options are
 *     refused;
 *   - a token dataset (byte-level text, several shards and chunks) is
 *     delivered as exact float ids with y 0, every record once an epoch,
 *     by the loader, the in-memory loads and fb_data_open_named; an id at
 *     or beyond the vocab, and a label in a dataset without labels, stop
 *     the loader naming the file, chunk and record.
 */
#include "data_util.h"

#include <inttypes.h>
#include <math.h>

#define N_REC 1000
#define CLASSES 4

static char g_dir[512], g_ds[1024];
static char g_msg[1024];

static fb_loader *open_loader(const char *dir, int64_t N, bool shuffle, bool drop_last,
                              int threads, int queue, uint64_t seed, fb_loader_pos start)
{
    fb_loader_opts o = {.dir = dir, .split = "train", .batch_size = N, .shuffle = shuffle,
                        .data_seed = seed, .shuffle_buffer = 50, .drop_last = drop_last,
                        .threads = threads, .queue_batches = queue, .start = start};
    fb_loader *l = NULL;
    int rc = fb_loader_open(&l, &o, g_msg, sizeof g_msg);
    if (rc) fprintf(stderr, "open: %s\n", g_msg);
    CHECK_INT_EQ(rc, 0);
    return l;
}

/* Reads one batch and writes its record indices to ids; checks the sample
 * and label agree with the index. */
static fb_loader_batch next_ids(fb_loader *l, int64_t *ids)
{
    fb_loader_batch b;
    int rc = fb_loader_next(&b, l, g_msg, sizeof g_msg);
    if (rc) fprintf(stderr, "next: %s\n", g_msg);
    CHECK_INT_EQ(rc, 0);
    for (int64_t k = 0; k < b.n; k++) {
        float v = b.x[2 * k];
        int64_t id = (int64_t)v;
        CHECK(v == (float)id && id >= 0 && id < N_REC);
        CHECK(b.x[2 * k + 1] == -v);
        CHECK_INT_EQ(b.y[k], id % CLASSES);
        ids[k] = id;
    }
    return b;
}

static void test_exactly_once(void)
{
    int64_t *order = malloc(N_REC * sizeof *order), ids[64];
    int *seen = calloc(N_REC, sizeof *seen);
    int64_t first_epoch[N_REC];
    CHECK(order && seen);
    static const int threads[] = {1, 4};
    for (int t = 0; t < 2; t++) {
        fb_loader *l = open_loader(g_ds, 64, true, false, threads[t], 4, 42,
                                   (fb_loader_pos){0, 0});
        CHECK_INT_EQ(fb_loader_samples(l), N_REC);
        for (int64_t e = 0; e < 3; e++) {
            memset(seen, 0, N_REC * sizeof *seen);
            CHECK_INT_EQ(fb_loader_epoch_order(order, l, e, g_msg, sizeof g_msg), 0);
            int64_t at = 0;
            for (int k = 0; k < 16; k++) { /* ceil(1000 / 64) */
                fb_loader_batch b = next_ids(l, ids);
                CHECK_INT_EQ(b.pos.epoch, e);
                CHECK_INT_EQ(b.pos.offset, at);
                CHECK_INT_EQ(b.n, k < 15 ? 64 : N_REC - 15 * 64);
                CHECK_INT_EQ(b.global_n, b.n);
                for (int64_t i = 0; i < b.n; i++) {
                    CHECK_INT_EQ(ids[i], order[at + i]);
                    seen[ids[i]]++;
                }
                at += b.n;
            }
            for (int i = 0; i < N_REC; i++) CHECK_INT_EQ(seen[i], 1);
            if (e == 0) {
                if (t == 0) memcpy(first_epoch, order, sizeof first_epoch);
                /* shuffled: not the file order, and records of one chunk are spread out */
                int64_t in_place = 0, same_chunk_neighbours = 0;
                for (int i = 0; i < N_REC; i++) in_place += order[i] == i;
                for (int i = 1; i < N_REC; i++)
                    same_chunk_neighbours += order[i] / 7 == order[i - 1] / 7;
                CHECK(in_place < 50);
                CHECK(same_chunk_neighbours < 200);
            } else {
                int64_t same = 0;
                for (int i = 0; i < N_REC; i++) same += order[i] == first_epoch[i];
                CHECK(same < 50); /* epochs differ */
            }
        }
        fb_loader_stats st;
        fb_loader_get_stats(&st, l);
        CHECK_INT_EQ(st.batches, 48);
        CHECK_INT_EQ(st.samples, 3 * N_REC);
        CHECK(st.wait_s >= 0 && st.max_wait_s <= st.wait_s + 1e-12);
        CHECK(st.chunks >= 3 * 144);
        CHECK(st.bytes_decoded > st.bytes_read);
        fb_loader_free(l);
    }
    /* another seed, another order */
    fb_loader *l = open_loader(g_ds, 64, true, false, 1, 4, 43, (fb_loader_pos){0, 0});
    CHECK_INT_EQ(fb_loader_epoch_order(order, l, 0, g_msg, sizeof g_msg), 0);
    int64_t same = 0;
    for (int i = 0; i < N_REC; i++) same += order[i] == first_epoch[i];
    CHECK(same < 50);
    fb_loader_free(l);
    free(order);
    free(seen);
}

/* The first nb batches' ids, concatenated. */
static int64_t *sequence(const char *dir, int threads, int queue, int nb, int64_t N,
                         bool shuffle, bool drop_last)
{
    int64_t *all = malloc((size_t)nb * (size_t)N * sizeof *all);
    CHECK(all != NULL);
    fb_loader *l = open_loader(dir, N, shuffle, drop_last, threads, queue, 7,
                               (fb_loader_pos){0, 0});
    for (int k = 0; k < nb; k++) {
        fb_loader_batch b = next_ids(l, all + (size_t)k * (size_t)N);
        CHECK_INT_EQ(b.n, N);
    }
    fb_loader_free(l);
    return all;
}

static void test_deterministic(void)
{
    int nb = 45; /* two epochs and a bit (bpe = 20) */
    int64_t *ref = sequence(g_ds, 1, 1, nb, 48, true, true);
    static const int cfg[][2] = {{1, 4}, {2, 1}, {2, 8}, {4, 3}, {4, 16}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        int64_t *s = sequence(g_ds, cfg[c][0], cfg[c][1], nb, 48, true, true);
        CHECK(memcmp(s, ref, (size_t)nb * 48 * sizeof *s) == 0);
        free(s);
    }
    /* drop_last: epoch 1 starts after 20 batches with a new order */
    fb_loader *l = open_loader(g_ds, 48, true, true, 2, 4, 7, (fb_loader_pos){0, 0});
    int64_t *order = malloc(N_REC * sizeof *order);
    CHECK(order != NULL);
    CHECK_INT_EQ(fb_loader_epoch_order(order, l, 1, g_msg, sizeof g_msg), 0);
    CHECK(memcmp(ref + 20 * 48, order, 48 * sizeof *order) == 0);
    fb_loader_free(l);
    free(order);
    free(ref);

    /* shuffle false: file order, every epoch, whatever the threads */
    for (int t = 1; t <= 3; t += 2) {
        fb_loader *f = open_loader(g_ds, 64, false, false, t, 2, 99, (fb_loader_pos){0, 0});
        int64_t ids[64];
        for (int e = 0; e < 2; e++) {
            int64_t at = 0;
            for (int k = 0; k < 16; k++) {
                fb_loader_batch b = next_ids(f, ids);
                for (int64_t i = 0; i < b.n; i++) CHECK_INT_EQ(ids[i], at + i);
                at += b.n;
            }
            CHECK_INT_EQ(at, N_REC);
        }
        fb_loader_free(f);
    }
}

static void test_resume(void)
{
    int nb = 50;
    int64_t N = 48;
    int64_t *ref = malloc((size_t)nb * (size_t)N * sizeof *ref);
    fb_loader_pos *pos_after = malloc((size_t)(nb + 1) * sizeof *pos_after);
    CHECK(ref && pos_after);
    fb_loader *a = open_loader(g_ds, N, true, true, 2, 4, 5, (fb_loader_pos){0, 0});
    pos_after[0] = fb_loader_position(a);
    for (int k = 0; k < nb; k++) {
        fb_loader_batch b = next_ids(a, ref + (size_t)k * (size_t)N);
        fb_loader_pos p = fb_loader_pos_at_step(N_REC, N, true, k);
        CHECK_INT_EQ(b.pos.epoch, p.epoch);
        CHECK_INT_EQ(b.pos.offset, p.offset);
        pos_after[k + 1] = fb_loader_position(a);
    }
    fb_loader_free(a);
    static const int ks[] = {0, 1, 5, 19, 20, 21, 33, 40};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        int k = ks[i];
        fb_loader_pos p = pos_after[k], q = fb_loader_pos_at_step(N_REC, N, true, k);
        CHECK_INT_EQ(p.epoch, q.epoch);
        CHECK_INT_EQ(p.offset, q.offset);
        fb_loader *b = open_loader(g_ds, N, true, true, 1 + (int)(i % 4), 3, 5, p);
        int64_t ids[48];
        for (int j = k; j < nb && j < k + 12; j++) {
            fb_loader_batch bt = next_ids(b, ids);
            CHECK_INT_EQ(bt.seq, j - k);
            CHECK(memcmp(ids, ref + (size_t)j * (size_t)N, (size_t)N * sizeof *ids) == 0);
        }
        fb_loader_free(b);
    }
    /* an offset that is not a batch multiple: positions 17.. of epoch 1 */
    int64_t *order = malloc(N_REC * sizeof *order), ids[48];
    CHECK(order != NULL);
    fb_loader *c = open_loader(g_ds, N, true, true, 2, 4, 5, (fb_loader_pos){1, 17});
    CHECK_INT_EQ(fb_loader_epoch_order(order, c, 1, g_msg, sizeof g_msg), 0);
    int64_t at = 17;
    while (at + N <= N_REC) {
        fb_loader_batch b = next_ids(c, ids);
        CHECK_INT_EQ(b.pos.epoch, 1);
        CHECK_INT_EQ(b.pos.offset, at);
        CHECK(memcmp(ids, order + at, (size_t)N * sizeof *ids) == 0);
        at += N;
    }
    fb_loader_batch b = next_ids(c, ids); /* then epoch 2 from its start */
    CHECK_INT_EQ(b.pos.epoch, 2);
    CHECK_INT_EQ(b.pos.offset, 0);
    fb_loader_free(c);
    /* a start with no full batch left moves to the next epoch */
    c = open_loader(g_ds, N, true, true, 1, 2, 5, (fb_loader_pos){3, 990});
    CHECK_INT_EQ(fb_loader_position(c).epoch, 4);
    CHECK_INT_EQ(fb_loader_position(c).offset, 0);
    b = next_ids(c, ids);
    CHECK_INT_EQ(b.pos.epoch, 4);
    fb_loader_free(c);
    free(order);
    free(ref);
    free(pos_after);
}

static void test_sharding(void)
{
    int64_t N = 16;
    fb_loader *ref = open_loader(g_ds, N, true, false, 1, 4, 11, (fb_loader_pos){0, 0});
    fb_loader *rk[3];
    int64_t counts[3] = {5, 0, 11};
    for (int r = 0; r < 3; r++) {
        fb_loader_opts o = {.dir = g_ds, .split = "train", .batch_size = N, .shuffle = true,
                            .data_seed = 11, .shuffle_buffer = 50, .threads = 1 + r,
                            .queue_batches = 2 + r, .rank = r, .world = 3, .split_counts = counts};
        CHECK_INT_EQ(fb_loader_open(&rk[r], &o, g_msg, sizeof g_msg), 0);
    }
    int world = 3;
    int64_t rids[16], gids[16];
    int seen_partial = 0;
    for (int step = 0; step < 150; step++) {
        if (step == 40) { /* rebalance: another uneven split */
            int64_t c2[3] = {8, 4, 4};
            for (int r = 0; r < 3; r++)
                CHECK_INT_EQ(fb_loader_set_split(rk[r], r, 3, c2, g_msg, sizeof g_msg), 0);
        }
        if (step == 90) { /* a device leaves: world 2, default even split */
            world = 2;
            for (int r = 0; r < 2; r++)
                CHECK_INT_EQ(fb_loader_set_split(rk[r], r, 2, NULL, g_msg, sizeof g_msg), 0);
        }
        if (step == 120) { /* and one of 2 takes everything */
            int64_t c3[2] = {0, 16};
            for (int r = 0; r < 2; r++)
                CHECK_INT_EQ(fb_loader_set_split(rk[r], r, 2, c3, g_msg, sizeof g_msg), 0);
        }
        fb_loader_batch g = next_ids(ref, gids);
        int64_t at = 0;
        for (int r = 0; r < world; r++) {
            fb_loader_batch b = next_ids(rk[r], rids);
            CHECK_INT_EQ(b.pos.epoch, g.pos.epoch);
            CHECK_INT_EQ(b.pos.offset, g.pos.offset);
            CHECK_INT_EQ(b.global_n, g.n);
            CHECK_INT_EQ(b.first, g.pos.offset + at);
            /* rank parts, in rank order, are exactly the global batch */
            CHECK(at + b.n <= g.n);
            CHECK(memcmp(rids, gids + at, (size_t)b.n * sizeof *rids) == 0);
            at += b.n;
        }
        CHECK_INT_EQ(at, g.n);
        seen_partial |= g.n < N;
    }
    CHECK(seen_partial); /* the short last batch of an epoch was split too */
    /* a bad split changes nothing */
    int64_t bad[2] = {10, 10};
    CHECK_INT_EQ(fb_loader_set_split(rk[0], 0, 2, bad, g_msg, sizeof g_msg), FB_ERR_OUT_OF_RANGE);
    CHECK_CONTAINS(g_msg, "add up to 20");
    CHECK_INT_EQ(fb_loader_set_split(rk[0], 2, 2, NULL, g_msg, sizeof g_msg), FB_ERR_OUT_OF_RANGE);
    int64_t neg[2] = {-1, 17};
    CHECK_INT_EQ(fb_loader_set_split(rk[0], 0, 2, neg, g_msg, sizeof g_msg), FB_ERR_OUT_OF_RANGE);
    fb_loader_batch g = next_ids(ref, gids);
    fb_loader_batch b = next_ids(rk[1], rids);
    CHECK_INT_EQ(b.n, g.n); /* rank 1 of {0, 16} still */
    for (int r = 0; r < 3; r++) fb_loader_free(rk[r]);
    fb_loader_free(ref);
}

static void test_errors(void)
{
    fb_loader *l = NULL;
    fb_loader_opts o = {.dir = g_ds, .split = "train", .batch_size = 10};
    o.threads = FB_LOADER_MAX_THREADS + 1;
    CHECK_INT_EQ(fb_loader_open(&l, &o, g_msg, sizeof g_msg), FB_ERR_OUT_OF_RANGE);
    o.threads = 1;
    o.batch_size = 0;
    CHECK_INT_EQ(fb_loader_open(&l, &o, g_msg, sizeof g_msg), FB_ERR_OUT_OF_RANGE);
    o.batch_size = 2000;
    o.drop_last = true;
    CHECK_INT_EQ(fb_loader_open(&l, &o, g_msg, sizeof g_msg), FB_ERR_DATA);
    CHECK_CONTAINS(g_msg, "fewer than the batch size");
    o.batch_size = 10;
    o.split = "validation";
    CHECK_INT_EQ(fb_loader_open(&l, &o, g_msg, sizeof g_msg), FB_ERR_NOT_FOUND);
    o.split = "train";
    o.world = 2;
    o.rank = 2;
    CHECK_INT_EQ(fb_loader_open(&l, &o, g_msg, sizeof g_msg), FB_ERR_OUT_OF_RANGE);
    o.rank = 0;
    o.start.offset = -1;
    CHECK_INT_EQ(fb_loader_open(&l, &o, g_msg, sizeof g_msg), FB_ERR_OUT_OF_RANGE);
    o.start.offset = 0;
    o.dir = g_dir; /* no manifest */
    CHECK_INT_EQ(fb_loader_open(&l, &o, g_msg, sizeof g_msg), FB_ERR_DATA);
    CHECK_CONTAINS(g_msg, "manifest.json");
    CHECK(l == NULL);
    fb_loader_free(NULL);

    /* a flipped byte inside chunk 5 of the second shard */
    char bad[1100], cmd[2400], shard[1200];
    snprintf(bad, sizeof bad, "%s/bad", g_dir);
    du_make_index_dataset(bad, "train", N_REC, CLASSES, 7, 300);
    snprintf(shard, sizeof shard, "%s/train/train-00001.fbs", bad);
    fb_shard_reader *r;
    CHECK_INT_EQ(fb_shard_open(&r, shard, g_msg, sizeof g_msg), 0);
    const fb_shard_chunk_entry *e = fb_shard_get_chunk(r, 5);
    uint64_t off = e->offset + e->stored / 2;
    fb_shard_close(r);
    du_flip(shard, off, 0x10);
    for (int t = 1; t <= 4; t += 3) {
        l = open_loader(bad, 32, true, false, t, 4, 1, (fb_loader_pos){0, 0});
        fb_loader_batch b;
        int rc = 0, k;
        for (k = 0; k < 100 && rc == 0; k++) rc = fb_loader_next(&b, l, g_msg, sizeof g_msg);
        CHECK_INT_EQ(rc, FB_ERR_DATA);
        CHECK_CONTAINS(g_msg, "train-00001.fbs");
        CHECK_CONTAINS(g_msg, "chunk 5: checksum mismatch");
        /* and it stays stopped */
        CHECK_INT_EQ(fb_loader_next(&b, l, g_msg, sizeof g_msg), FB_ERR_DATA);
        fb_loader_free(l);
    }
    /* labels outside the classes the manifest promises */
    du_make_index_dataset(bad, "train", N_REC, CLASSES, 7, 300);
    snprintf(cmd, sizeof cmd, "%s/manifest.json", bad);
    size_t len;
    char *m = (char *)du_read(cmd, &len);
    char *at = strstr(m, "\"classes\": 4");
    CHECK(at != NULL);
    at[11] = '3';
    du_write(cmd, m, len);
    free(m);
    l = open_loader(bad, 32, false, false, 2, 4, 1, (fb_loader_pos){0, 0});
    fb_loader_batch b;
    CHECK_INT_EQ(fb_loader_next(&b, l, g_msg, sizeof g_msg), FB_ERR_DATA);
    /* readers decode chunks in parallel: whichever bad chunk they meet first */
    CHECK_CONTAINS(g_msg, "train-00000.fbs: chunk ");
    CHECK_CONTAINS(g_msg, " has label 3, outside [0, 3) of the manifest");
    fb_loader_free(l);
    /* a shard truncated behind the manifest's back: refused at open */
    du_make_index_dataset(bad, "train", N_REC, CLASSES, 7, 300);
    CHECK(truncate(shard, 1000) == 0);
    o = (fb_loader_opts){.dir = bad, .split = "train", .batch_size = 10};
    CHECK_INT_EQ(fb_loader_open(&l, &o, g_msg, sizeof g_msg), FB_ERR_DATA);
    CHECK_CONTAINS(g_msg, "train-00001.fbs");
}

#define TOK_N 300 /* records */
#define TOK_L 9   /* tokens a record: context 8 */

/* The text of the token dataset: record i (stride TOK_L, so records do not overlap) starts
 * with its index in two bytes, then bytes that run through all 256 values. */
static uint8_t *token_text(size_t *len)
{
    uint8_t *t = malloc(TOK_N * TOK_L);
    CHECK(t != NULL);
    for (int i = 0; i < TOK_N; i++) {
        t[i * TOK_L] = (uint8_t)(i >> 8);
        t[i * TOK_L + 1] = (uint8_t)(i & 255);
        for (int k = 2; k < TOK_L; k++) t[i * TOK_L + k] = (uint8_t)(i * 7 + k * 31);
    }
    *len = TOK_N * TOK_L;
    return t;
}

/* The record index of delivered sample x (TOK_L floats), checking every value exactly. */
static int token_id(const float *x, const uint8_t *text)
{
    int i = (int)x[0] * 256 + (int)x[1];
    CHECK(i >= 0 && i < TOK_N);
    for (int k = 0; k < TOK_L; k++) CHECK(x[k] == (float)text[i * TOK_L + k]);
    return i;
}

static void test_tokens(void)
{
    char ds[1100], mp[1200];
    snprintf(ds, sizeof ds, "%s/tokens", g_dir);
    size_t len;
    uint8_t *text = token_text(&len);
    fb_import_opts io = {.out_dir = ds, .name = "tokens", .split = "train", .chunk_records = 11,
                         .shard_records = 110, .level = 1};
    fb_import_result ir;
    CHECK_INT_EQ(fb_datadir_import_tokens(&ir, &io, text, len, TOK_L - 1, TOK_L, g_msg,
                                          sizeof g_msg),
                 0);
    CHECK_INT_EQ(ir.samples, TOK_N);
    CHECK_INT_EQ(ir.shards, 3);
    CHECK_INT_EQ(ir.vocab, 256);
    CHECK_INT_EQ(ir.n_classes, 0);
    /* the loader: shuffled, 1 and 3 threads, two epochs, every record once, exact */
    static int seen[TOK_N];
    for (int t = 1; t <= 3; t += 2) {
        fb_loader *l = open_loader(ds, 16, true, false, t, 3, 5, (fb_loader_pos){0, 0});
        CHECK_INT_EQ(fb_loader_manifest(l)->vocab, 256);
        for (int e = 0; e < 2; e++) {
            memset(seen, 0, sizeof seen);
            for (int64_t got = 0; got < TOK_N;) {
                fb_loader_batch b;
                CHECK_INT_EQ(fb_loader_next(&b, l, g_msg, sizeof g_msg), 0);
                for (int64_t k = 0; k < b.n; k++) {
                    CHECK_INT_EQ(b.y[k], 0);
                    seen[token_id(b.x + k * TOK_L, text)]++;
                }
                got += b.n;
            }
            for (int i = 0; i < TOK_N; i++) CHECK_INT_EQ(seen[i], 1);
        }
        fb_loader_free(l);
    }
    /* in memory: the whole split, and the held-out part */
    fb_dataset d = {0};
    CHECK_INT_EQ(fb_datadir_load_split(&d, ds, "train", g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(d.n, TOK_N);
    CHECK_INT_EQ(d.W, TOK_L);
    CHECK_INT_EQ(d.n_classes, 0);
    for (int i = 0; i < TOK_N; i++) {
        CHECK_INT_EQ(token_id(d.x + i * TOK_L, text), i);
        CHECK_INT_EQ(d.y[i], 0);
    }
    fb_dataset_free(&d);
    CHECK_INT_EQ(fb_datadir_load_split_part(&d, ds, "train", FB_PART_HELD_OUT, 0.2, g_msg,
                                            sizeof g_msg),
                 0);
    CHECK(d.n > 0 && d.n < TOK_N);
    for (int64_t i = 0; i < d.n; i++) CHECK(fb_data_held_out(token_id(d.x + i * TOK_L, text), 0.2));
    fb_dataset_free(&d);
    /* the way training opens it */
    char data_dir[1100];
    snprintf(data_dir, sizeof data_dir, "%s", g_dir);
    fb_dataset tr = {0}, va = {0}, te = {0};
    fb_loader *l = NULL;
    fb_data_source_opts so = {.batch_size = 8, .shuffle = true, .threads = 2, .want_val = true,
                              .val_fraction = 0.1};
    CHECK_INT_EQ(fb_data_open_named(&tr, &va, &te, &l, "tokens", data_dir, &so, g_msg,
                                    sizeof g_msg),
                 0);
    CHECK_INT_EQ(tr.W, TOK_L);
    CHECK_INT_EQ(tr.n_classes, 0);
    CHECK_INT_EQ(tr.n + va.n, TOK_N);
    for (int64_t i = 0; i < va.n; i++) token_id(va.x + i * TOK_L, text);
    fb_loader_free(l);
    fb_dataset_free(&va);

    /* an id at the vocab: lower the manifest's vocab to 255 (byte 255 occurs) */
    snprintf(mp, sizeof mp, "%s/manifest.json", ds);
    char *m = (char *)du_read(mp, &len);
    char *at = strstr(m, "\"vocab\": 256");
    CHECK(at != NULL);
    at[11] = '5';
    du_write(mp, m, len);
    free(m);
    l = open_loader(ds, 16, false, false, 2, 4, 1, (fb_loader_pos){0, 0});
    fb_loader_batch b;
    int rc = 0;
    for (int k = 0; k < 40 && rc == 0; k++) rc = fb_loader_next(&b, l, g_msg, sizeof g_msg);
    CHECK_INT_EQ(rc, FB_ERR_DATA);
    CHECK_CONTAINS(g_msg, ".fbs: chunk ");
    CHECK_CONTAINS(g_msg, " has token id 255 at position ");
    CHECK_CONTAINS(g_msg, ", outside [0, 255) of the manifest's vocab");
    fb_loader_free(l);
    CHECK_INT_EQ(fb_datadir_load_split(&d, ds, "train", g_msg, sizeof g_msg), FB_ERR_DATA);
    CHECK_CONTAINS(g_msg, " has token id 255");

    /* a label in a dataset without labels: a shard written by hand, record 5 labelled 1 */
    char lds[1100], shard[1200];
    snprintf(lds, sizeof lds, "%s/labelled-tokens", g_dir);
    CHECK(mkdir(lds, 0755) == 0);
    snprintf(shard, sizeof shard, "%s/t.fbs", lds);
    fb_shard_params sp = {.dtype = FB_DTYPE_I32, .sample_numel = TOK_L, .chunk_records = 4,
                          .level = 1};
    fb_shard_writer *w = NULL;
    CHECK_INT_EQ(fb_shard_writer_open(&w, shard, &sp, g_msg, sizeof g_msg), 0);
    int32_t ids[TOK_L];
    for (int i = 0; i < 12; i++) {
        for (int k = 0; k < TOK_L; k++) ids[k] = text[i * TOK_L + k];
        CHECK_INT_EQ(fb_shard_writer_add(w, ids, TOK_L, i == 5, g_msg, sizeof g_msg), 0);
    }
    fb_shard_info info;
    CHECK_INT_EQ(fb_shard_writer_finish(&info, w, g_msg, sizeof g_msg), 0);
    fb_shard_writer_free(w);
    fb_manifest_shard msh = {.path = "t.fbs", .bytes = info.bytes, .records = info.records,
                             .chunks = info.chunks, .crc32c = info.crc32c};
    fb_manifest lm = {.name = "labelled-tokens", .dtype = FB_DTYPE_I32, .ndim = 1,
                      .shape = {TOK_L}, .sample_numel = TOK_L, .vocab = 256, .n_classes = 0,
                      .n_splits = 1};
    lm.splits[0] = (fb_manifest_split){.name = "train", .samples = 12, .n_shards = 1,
                                       .shards = &msh};
    snprintf(mp, sizeof mp, "%s/manifest.json", lds);
    CHECK_INT_EQ(fb_manifest_write(mp, &lm, g_msg, sizeof g_msg), 0);
    l = open_loader(lds, 4, false, false, 1, 2, 1, (fb_loader_pos){0, 0});
    rc = 0;
    for (int k = 0; k < 4 && rc == 0; k++) rc = fb_loader_next(&b, l, g_msg, sizeof g_msg);
    CHECK_INT_EQ(rc, FB_ERR_DATA);
    CHECK_CONTAINS(g_msg, "t.fbs: chunk 1: record 5 has label 1; the dataset has no labels");
    fb_loader_free(l);
    fb_verify_result vr;
    CHECK_INT_EQ(fb_datadir_verify_shard(&vr, &lm, lds, &msh, g_msg, sizeof g_msg), FB_ERR_DATA);
    CHECK_CONTAINS(g_msg, "chunk 1: record 5 has label 1");
    free(text);
    printf("tokens: %d records of %d ids delivered exactly; bad ids and labels named\n", TOK_N,
           TOK_L);
}

/* Delivered indices of `epochs` epochs into seen[epoch][record] (counts). */
static void deliver(const char *dir, double f, uint64_t seed, int threads, int64_t sbuf, int rank,
                    int world, int epochs, int (*seen)[N_REC])
{
    int64_t N = 32;
    fb_loader_opts o = {.dir = dir, .split = "train", .batch_size = N, .shuffle = true,
                        .data_seed = seed, .shuffle_buffer = sbuf, .drop_last = false,
                        .threads = threads, .queue_batches = 3, .rank = rank, .world = world,
                        .val_fraction = f};
    fb_loader *l = NULL;
    int rc = fb_loader_open(&l, &o, g_msg, sizeof g_msg);
    if (rc) fprintf(stderr, "open: %s\n", g_msg);
    CHECK_INT_EQ(rc, 0);
    int64_t n = fb_loader_samples(l), ids[64];
    CHECK_INT_EQ(n, fb_data_kept_count(N_REC, f));
    int64_t *order = malloc((size_t)n * sizeof *order);
    CHECK(order);
    for (int e = 0; e < epochs; e++) {
        CHECK_INT_EQ(fb_loader_epoch_order(order, l, e, g_msg, sizeof g_msg), 0);
        for (int64_t got = 0; got < n;) {
            fb_loader_batch b = next_ids(l, ids);
            CHECK_INT_EQ(b.pos.epoch, e);
            for (int64_t k = 0; k < b.n; k++) {
                CHECK_INT_EQ(ids[k], order[b.first + k]); /* what epoch_order says */
                seen[e][ids[k]]++;
            }
            got += b.global_n;
        }
    }
    free(order);
    fb_loader_free(l);
}

static void test_holdout(void)
{
    static int seen[3][N_REC], ref[3][N_REC];
    int64_t held = 0;
    for (int64_t i = 0; i < N_REC; i++) held += fb_data_held_out(i, 0.1);
    /* about a tenth, and never for a fraction of 0 */
    CHECK(held > 60 && held < 140);
    for (int64_t i = 0; i < N_REC; i++) CHECK(!fb_data_held_out(i, 0));
    /* record 0 trains at every allowed fraction: no split is ever held out whole */
    CHECK(!fb_data_held_out(0, FB_DATA_MAX_VAL_FRACTION));
    /* a larger fraction holds out a superset: one hash per record, compared */
    for (int64_t i = 0; i < N_REC; i++)
        CHECK(!fb_data_held_out(i, 0.1) || fb_data_held_out(i, 0.3));

    /* chunks of 2 records: at 0.5 about a quarter of them are held out whole */
    char d2[1200];
    snprintf(d2, sizeof d2, "%s/pairs", g_dir);
    du_make_index_dataset(d2, "train", N_REC, CLASSES, 2, 300);
    struct { const char *dir; uint64_t seed; int threads; int64_t sbuf; int world; double f; }
    runs[] = {
        {g_ds, 1, 1, 50, 1, 0.1}, {g_ds, 7, 4, 50, 1, 0.1}, {g_ds, 99, 2, 1000, 1, 0.1},
        {g_ds, 3, 2, 50, 2, 0.1}, /* two ranks: their parts together */
        {d2, 5, 3, 1, 1, 0.5},    /* one chunk per window: some windows are all held out */
        {d2, 6, 1, 1, 2, 0.5},
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        memset(seen, 0, sizeof seen);
        for (int rank = 0; rank < runs[r].world; rank++)
            deliver(runs[r].dir, runs[r].f, runs[r].seed, runs[r].threads, runs[r].sbuf, rank,
                    runs[r].world, 3, seen);
        for (int e = 0; e < 3; e++)
            for (int64_t i = 0; i < N_REC; i++)
                CHECK_INT_EQ(seen[e][i], fb_data_held_out(i, runs[r].f) ? 0 : 1);
        if (r == 0) memcpy(ref, seen, sizeof ref);
        if (runs[r].f == 0.1) CHECK(memcmp(ref, seen, sizeof ref) == 0); /* the same set */
    }

    /* the held-out part in memory: exactly the held-out records, in file order */
    fb_dataset v = {0}, k = {0};
    CHECK_INT_EQ(fb_datadir_load_split_part(&v, g_ds, "train", FB_PART_HELD_OUT, 0.1, g_msg,
                                            sizeof g_msg), 0);
    CHECK_INT_EQ(fb_datadir_load_split_part(&k, g_ds, "train", FB_PART_KEPT, 0.1, g_msg,
                                            sizeof g_msg), 0);
    CHECK_INT_EQ(v.n, held);
    CHECK_INT_EQ(k.n, N_REC - held);
    int64_t a = 0, b = 0;
    for (int64_t i = 0; i < N_REC; i++) {
        fb_dataset *d = fb_data_held_out(i, 0.1) ? &v : &k;
        int64_t at = d == &v ? a++ : b++;
        CHECK(d->x[2 * at] == (float)i);
        CHECK_INT_EQ(d->y[at], i % CLASSES);
    }
    /* the in-memory holdout of the whole split agrees */
    fb_dataset all = {0}, hv = {0};
    CHECK_INT_EQ(fb_datadir_load_split(&all, g_ds, "train", g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_dataset_holdout(&all, &hv, 0.1, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(all.n, k.n);
    CHECK_INT_EQ(hv.n, v.n);
    CHECK(memcmp(all.x, k.x, (size_t)k.n * 2 * sizeof(float)) == 0);
    CHECK(memcmp(hv.x, v.x, (size_t)v.n * 2 * sizeof(float)) == 0);
    CHECK(memcmp(all.y, k.y, (size_t)k.n * sizeof(int32_t)) == 0);
    fb_dataset_free(&all);
    fb_dataset_free(&hv);

    /* fb_datadir_load_val: without a val split, the held-out records */
    fb_dataset lv = {0};
    double hf = -1;
    CHECK_INT_EQ(fb_datadir_load_val(&lv, &hf, g_ds, 0.1, true, g_msg, sizeof g_msg), 0);
    CHECK(hf == 0.1);
    CHECK_INT_EQ(lv.n, v.n);
    CHECK(memcmp(lv.x, v.x, (size_t)v.n * 2 * sizeof(float)) == 0);
    fb_dataset_free(&lv);
    fb_dataset_free(&v);
    fb_dataset_free(&k);

    /* a dataset with a val split: that split is the validation set, train stays whole */
    char dv[1200];
    snprintf(dv, sizeof dv, "%s/withval", g_dir);
    du_make_index_dataset(dv, "train", 200, CLASSES, 7, 300);
    du_make_index_dataset(dv, "val", 30, CLASSES, 7, 300);
    CHECK_INT_EQ(fb_datadir_load_val(&lv, &hf, dv, 0.1, true, g_msg, sizeof g_msg), 0);
    CHECK(hf == 0);
    CHECK_INT_EQ(lv.n, 30);
    fb_dataset_free(&lv);
    fb_dataset tr = {0}, va = {0}, te = {0};
    fb_loader *l = NULL;
    fb_data_source_opts so = {.batch_size = 16, .val_fraction = 0.1, .want_val = true};
    CHECK_INT_EQ(fb_data_open_named(&tr, &va, &te, &l, "withval", g_dir, &so, g_msg,
                                    sizeof g_msg), 0);
    CHECK_INT_EQ(tr.n, 200);
    CHECK_INT_EQ(va.n, 30);
    fb_loader_free(l);
    fb_dataset_free(&va);
    /* without one, the loader trains on what is not held out */
    CHECK_INT_EQ(fb_data_open_named(&tr, &va, &te, &l, "index", g_dir, &so, g_msg, sizeof g_msg),
                 0);
    CHECK_INT_EQ(tr.n, N_REC - held);
    CHECK_INT_EQ(va.n, held);
    fb_loader_free(l);
    fb_dataset_free(&va);

    /* bad fractions: refused by name, nothing opened */
    static const double bad[] = {-0.1, 0.500001, 1, 1e300, -1e300};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0] + 1; i++) {
        double f = i < sizeof bad / sizeof bad[0] ? bad[i] : NAN;
        fb_loader_opts o = {.dir = g_ds, .split = "train", .batch_size = 8, .val_fraction = f};
        l = NULL;
        CHECK_INT_EQ(fb_loader_open(&l, &o, g_msg, sizeof g_msg), FB_ERR_OUT_OF_RANGE);
        CHECK(l == NULL);
        CHECK_CONTAINS(g_msg, "validation fraction");
        so.val_fraction = f;
        CHECK_INT_EQ(fb_data_open_named(&tr, &va, &te, &l, "index", g_dir, &so, g_msg,
                                        sizeof g_msg), FB_ERR_OUT_OF_RANGE);
        CHECK_CONTAINS(g_msg, "val_fraction");
        CHECK(l == NULL);
    }
    printf("holdout: %lld of %d records held out at 0.1, never delivered; val split used\n",
           (long long)held, N_REC);
}

int main(void)
{
    du_scratch(g_dir, sizeof g_dir, "loader");
    snprintf(g_ds, sizeof g_ds, "%s/index", g_dir);
    du_make_index_dataset(g_ds, "train", N_REC, CLASSES, 7, 300);
    double t0 = du_now();
    test_exactly_once();
    test_deterministic();
    test_resume();
    test_sharding();
    test_errors();
    test_holdout();
    test_tokens();
    du_rm_rf(g_dir);
    printf("test_loader: ok (%.2f s)\n", du_now() - t0);
    return 0;
}
