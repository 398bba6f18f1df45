/*
 * Key generation and hashing (libsodium), the key cache and the per-tenant
 * token buckets.  Both tables are small chained hash maps under one mutex
 * each; a request holds a lock only to copy an entry.
 */
#include "auth.h"

#include <math.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_BUCKETS 1024
#define MAX_ENTRIES 100000 /* beyond this the cache is emptied, not grown */

static const char key_prefix[] = "fbk_";
static const char hash_context[] = "fusebox-api-key-v1";

typedef struct cache_node {
    struct cache_node *next;
    fb_auth_entry e;
    int64_t expires_ms;
} cache_node;

typedef struct bucket_node {
    struct bucket_node *next;
    char tenant_id[FB_UUID_LEN + 1];
    double tokens;
    int64_t last_ms;
} bucket_node;

struct fb_auth {
    int ttl_ms;
    pthread_mutex_t cache_mu, rate_mu;
    cache_node *cache[N_BUCKETS];
    int n_cache;
    bucket_node *buckets[N_BUCKETS];
    int n_buckets;
};

/* Real time, not the control loop's clock (base/clock.h): the rate limit guards the
 * server against real request rates, and the key cache bounds how long a key changed in
 * the database is served from memory; on a test's manual clock, which stands still, a
 * tenant's tokens would never come back and a cached key would never expire. */
static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static unsigned slot_of(const char *s)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h % N_BUCKETS;
}

static void hash_secret(const char *secret, uint8_t *hash)
{
    crypto_generichash(hash, FB_KEY_HASH_BYTES, (const unsigned char *)secret, FB_KEY_SECRET_LEN,
                       (const unsigned char *)hash_context, sizeof hash_context - 1);
}

void fb_auth_key_new(char *key, char *key_id, uint8_t *hash)
{
    uint8_t id_raw[FB_KEY_ID_LEN / 2], secret_raw[FB_KEY_SECRET_LEN / 2];
    char secret[FB_KEY_SECRET_LEN + 1];
    randombytes_buf(id_raw, sizeof id_raw);
    randombytes_buf(secret_raw, sizeof secret_raw);
    sodium_bin2hex(key_id, FB_KEY_ID_LEN + 1, id_raw, sizeof id_raw);
    sodium_bin2hex(secret, sizeof secret, secret_raw, sizeof secret_raw);
    snprintf(key, FB_KEY_LEN + 1, "%s%s_%s", key_prefix, key_id, secret);
    hash_secret(secret, hash);
    sodium_memzero(secret_raw, sizeof secret_raw);
    sodium_memzero(secret, sizeof secret);
}

static bool is_lower_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

bool fb_auth_key_parse(const char *key, char *key_id, uint8_t *hash)
{
    if (!key || strlen(key) != FB_KEY_LEN || strncmp(key, key_prefix, 4) != 0) return false;
    const char *id = key + 4, *secret = id + FB_KEY_ID_LEN + 1;
    if (id[FB_KEY_ID_LEN] != '_' || !is_lower_hex(id, FB_KEY_ID_LEN) ||
        !is_lower_hex(secret, FB_KEY_SECRET_LEN))
        return false;
    memcpy(key_id, id, FB_KEY_ID_LEN);
    key_id[FB_KEY_ID_LEN] = '\0';
    hash_secret(secret, hash);
    return true;
}

bool fb_auth_hash_equal(const uint8_t *a, const uint8_t *b)
{
    return sodium_memcmp(a, b, FB_KEY_HASH_BYTES) == 0;
}

fb_auth *fb_auth_new(int ttl_ms)
{
    fb_auth *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->ttl_ms = ttl_ms;
    pthread_mutex_init(&a->cache_mu, NULL);
    pthread_mutex_init(&a->rate_mu, NULL);
    return a;
}

static void cache_clear(fb_auth *a)
{
    for (int i = 0; i < N_BUCKETS; i++) {
        cache_node *n = a->cache[i];
        while (n) {
            cache_node *next = n->next;
            sodium_memzero(n, sizeof *n);
            free(n);
            n = next;
        }
        a->cache[i] = NULL;
    }
    a->n_cache = 0;
}

static void buckets_clear(fb_auth *a)
{
    for (int i = 0; i < N_BUCKETS; i++) {
        bucket_node *n = a->buckets[i];
        while (n) {
            bucket_node *next = n->next;
            free(n);
            n = next;
        }
        a->buckets[i] = NULL;
    }
    a->n_buckets = 0;
}

void fb_auth_free(fb_auth *a)
{
    if (!a) return;
    cache_clear(a);
    buckets_clear(a);
    pthread_mutex_destroy(&a->cache_mu);
    pthread_mutex_destroy(&a->rate_mu);
    free(a);
}

bool fb_auth_cache_get(fb_auth *a, const char *key_id, fb_auth_entry *out)
{
    bool found = false;
    int64_t now = now_ms();
    pthread_mutex_lock(&a->cache_mu);
    for (cache_node *n = a->cache[slot_of(key_id)]; n; n = n->next) {
        if (strcmp(n->e.key_id, key_id) == 0) {
            if (n->expires_ms > now) {
                *out = n->e;
                found = true;
            }
            break;
        }
    }
    pthread_mutex_unlock(&a->cache_mu);
    return found;
}

void fb_auth_cache_put(fb_auth *a, const fb_auth_entry *e)
{
    int64_t expires = now_ms() + a->ttl_ms;
    unsigned s = slot_of(e->key_id);
    pthread_mutex_lock(&a->cache_mu);
    for (cache_node *n = a->cache[s]; n; n = n->next) {
        if (strcmp(n->e.key_id, e->key_id) == 0) {
            n->e = *e;
            n->expires_ms = expires;
            pthread_mutex_unlock(&a->cache_mu);
            return;
        }
    }
    if (a->n_cache >= MAX_ENTRIES) cache_clear(a);
    cache_node *n = malloc(sizeof *n);
    if (n) {
        n->e = *e;
        n->expires_ms = expires;
        n->next = a->cache[s];
        a->cache[s] = n;
        a->n_cache++;
    }
    pthread_mutex_unlock(&a->cache_mu);
}

void fb_auth_forget_key(fb_auth *a, const char *key_id)
{
    pthread_mutex_lock(&a->cache_mu);
    for (cache_node **p = &a->cache[slot_of(key_id)]; *p; p = &(*p)->next) {
        if (strcmp((*p)->e.key_id, key_id) == 0) {
            cache_node *dead = *p;
            *p = dead->next;
            sodium_memzero(dead, sizeof *dead);
            free(dead);
            a->n_cache--;
            break;
        }
    }
    pthread_mutex_unlock(&a->cache_mu);
}

void fb_auth_forget_tenant(fb_auth *a, const char *tenant_id)
{
    pthread_mutex_lock(&a->cache_mu);
    for (int i = 0; i < N_BUCKETS; i++) {
        cache_node **p = &a->cache[i];
        while (*p) {
            if (strcmp((*p)->e.tenant_id, tenant_id) == 0) {
                cache_node *dead = *p;
                *p = dead->next;
                sodium_memzero(dead, sizeof *dead);
                free(dead);
                a->n_cache--;
            } else {
                p = &(*p)->next;
            }
        }
    }
    pthread_mutex_unlock(&a->cache_mu);
}

bool fb_auth_rate_take(fb_auth *a, const char *tenant_id, double rate, int burst,
                       int *retry_after_s)
{
    int64_t now = now_ms();
    unsigned s = slot_of(tenant_id);
    bool ok;
    pthread_mutex_lock(&a->rate_mu);
    bucket_node *b = NULL;
    for (bucket_node *n = a->buckets[s]; n; n = n->next)
        if (strcmp(n->tenant_id, tenant_id) == 0) b = n;
    if (!b) {
        if (a->n_buckets >= MAX_ENTRIES) buckets_clear(a);
        b = calloc(1, sizeof *b);
        if (!b) {
            pthread_mutex_unlock(&a->rate_mu);
            return true; /* without memory for a bucket, do not refuse service */
        }
        snprintf(b->tenant_id, sizeof b->tenant_id, "%s", tenant_id);
        b->tokens = burst;
        b->last_ms = now;
        b->next = a->buckets[s];
        a->buckets[s] = b;
        a->n_buckets++;
    }
    b->tokens += (double)(now - b->last_ms) / 1000.0 * rate;
    if (b->tokens > burst) b->tokens = burst;
    b->last_ms = now;
    if (b->tokens >= 1.0) {
        b->tokens -= 1.0;
        ok = true;
    } else {
        double wait = (1.0 - b->tokens) / rate;
        *retry_after_s = (int)ceil(wait) < 1 ? 1 : (int)ceil(wait);
        ok = false;
    }
    pthread_mutex_unlock(&a->rate_mu);
    return ok;
}
