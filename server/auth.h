/*
 * API keys and per-tenant request limits.
 *
 * A key reads "fbk_<key id>_<secret>": 16 hex digits naming the key (its
 * public half, stored in clear and used to find it) and 64 hex digits of
 * secret drawn from libsodium's generator.  Only a BLAKE2b hash of the
 * secret is stored; presented keys are hashed and compared in constant time.
 *
 * fuseboxd keeps what it learned about a key for a few seconds (the key
 * cache) so that most requests cost no extra query; revoking a key or
 * changing a tenant through this process drops the entries at once.  Request
 * rates are limited per tenant with a token bucket held in memory.
 */
#ifndef FB_SERVER_AUTH_H
#define FB_SERVER_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FB_KEY_ID_LEN 16
#define FB_KEY_SECRET_LEN 64
#define FB_KEY_LEN (4 + FB_KEY_ID_LEN + 1 + FB_KEY_SECRET_LEN) /* "fbk_" id "_" secret */
#define FB_KEY_HASH_BYTES 32
#define FB_UUID_LEN 36

/*
 * Makes a new random key.  key gets FB_KEY_LEN + 1 bytes (NUL-terminated),
 * key_id FB_KEY_ID_LEN + 1, hash FB_KEY_HASH_BYTES.
 */
void fb_auth_key_new(char *key, char *key_id, uint8_t *hash);

/*
 * Splits a presented key into its id (FB_KEY_ID_LEN + 1 bytes) and the hash
 * of its secret.  Returns true when the key has the right form; a malformed
 * key returns false and leaves the outputs untouched.
 */
bool fb_auth_key_parse(const char *key, char *key_id, uint8_t *hash);

/* Compares two secret hashes in constant time. */
bool fb_auth_hash_equal(const uint8_t *a, const uint8_t *b);

/* What the server knows about one key (a snapshot; the cache owns its copy). */
typedef struct fb_auth_entry {
    char key_id[FB_KEY_ID_LEN + 1];
    char tenant_id[FB_UUID_LEN + 1];
    uint8_t hash[FB_KEY_HASH_BYTES];
    bool revoked;
    bool is_admin;
    double rate_rps;
    int rate_burst;
} fb_auth_entry;

typedef struct fb_auth fb_auth;

/* Creates the key cache and rate limiter; entries live ttl_ms.  NULL when
 * out of memory. */
fb_auth *fb_auth_new(int ttl_ms);

/* Frees everything; accepts NULL. */
void fb_auth_free(fb_auth *auth);

/* Copies the cached entry of key_id into *out; false when absent or stale. */
bool fb_auth_cache_get(fb_auth *auth, const char *key_id, fb_auth_entry *out);

/* Stores (or replaces) the entry for e->key_id. */
void fb_auth_cache_put(fb_auth *auth, const fb_auth_entry *e);

/* Drops the cached entry of one key, or of every key of one tenant. */
void fb_auth_forget_key(fb_auth *auth, const char *key_id);
void fb_auth_forget_tenant(fb_auth *auth, const char *tenant_id);

/*
 * Takes one token from the tenant's bucket (rate per second, burst tokens
 * at most).  Returns true when the request may go on; otherwise false and
 * *retry_after_s gets the whole seconds until a token is back (>= 1).
 */
bool fb_auth_rate_take(fb_auth *auth, const char *tenant_id, double rate, int burst,
                       int *retry_after_s);

#endif
