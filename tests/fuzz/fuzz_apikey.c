/*
 * libFuzzer target for API-key parsing (server/auth.c), the first thing
 * fuseboxd does with a presented "Authorization: Bearer <key>".  Beyond
 * "never crash" it checks properties: an accepted key is exactly "fbk_",
 * 16 lower-case hex digits, "_" and 64 lower-case hex digits; its id is the
 * 16 digits; its hash is a function of the secret alone (a key differing
 * only in its id hashes the same, one differing in its secret does not);
 * and every key fb_auth_key_new makes is accepted with its own id and hash.
 */
#include "auth.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

static bool hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *key = malloc(size + 1);
    if (!key) return 0;
    memcpy(key, data, size);
    key[size] = '\0';
    char id[FB_KEY_ID_LEN + 1];
    uint8_t hash[FB_KEY_HASH_BYTES], hash2[FB_KEY_HASH_BYTES];
    if (fb_auth_key_parse(key, id, hash)) {
        if (strlen(key) != FB_KEY_LEN || strncmp(key, "fbk_", 4) != 0 || key[4 + FB_KEY_ID_LEN] != '_')
            FAIL("accepted a key of another shape: %s", key);
        for (int i = 0; i < FB_KEY_LEN; i++)
            if (i >= 4 && i != 4 + FB_KEY_ID_LEN && !hex(key[i])) FAIL("accepted byte %d", i);
        if (strncmp(id, key + 4, FB_KEY_ID_LEN) != 0 || id[FB_KEY_ID_LEN]) FAIL("wrong id");
        /* another id, the same secret: the same hash; a flipped secret digit: another */
        char other[FB_KEY_LEN + 1];
        memcpy(other, key, sizeof other);
        other[4] = other[4] == '0' ? '1' : '0';
        if (!fb_auth_key_parse(other, id, hash2) || !fb_auth_hash_equal(hash, hash2))
            FAIL("the hash depends on the id");
        memcpy(other, key, sizeof other);
        other[FB_KEY_LEN - 1] = other[FB_KEY_LEN - 1] == '0' ? '1' : '0';
        if (!fb_auth_key_parse(other, id, hash2) || fb_auth_hash_equal(hash, hash2))
            FAIL("two secrets hash the same");
    }
    free(key);
    if (size > 0 && data[0] == 0) {
        /* now and then, a new key */
        char fresh[FB_KEY_LEN + 1], fid[FB_KEY_ID_LEN + 1], pid[FB_KEY_ID_LEN + 1];
        uint8_t fh[FB_KEY_HASH_BYTES], ph[FB_KEY_HASH_BYTES];
        fb_auth_key_new(fresh, fid, fh);
        if (!fb_auth_key_parse(fresh, pid, ph) || strcmp(fid, pid) != 0 ||
            !fb_auth_hash_equal(fh, ph))
            FAIL("a new key does not parse back: %s", fresh);
    }
    return 0;
}
