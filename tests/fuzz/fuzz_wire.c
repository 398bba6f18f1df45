/*
 * libFuzzer target for the wire protocol decoder.  Beyond "never crash, never
 * leak", it checks the codec's fixed point: any frame the decoder accepts
 * encodes, the encoding decodes again, and that message encodes to the same
 * text.  The first input byte (mod 8) is the number of blob frames that came
 * with the frame; the rest is frame 0.  The seeds in corpus/wire start with
 * an ASCII digit for that reason.
 */
#include "wire.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int n_blobs = data[0] % 8;
    fb_wire_msg m, again;
    char msg[512];
    if (fb_wire_decode((const char *)data + 1, size - 1, n_blobs, &m, msg, sizeof msg) != FB_OK)
        return 0;
    char *text = fb_wire_encode(&m, msg, sizeof msg);
    if (!text) {
        fprintf(stderr, "an accepted frame does not encode: %s\n", msg);
        abort();
    }
    if (fb_wire_decode(text, strlen(text), n_blobs, &again, msg, sizeof msg) != FB_OK) {
        fprintf(stderr, "the encoding is refused: %s\n%s\n", msg, text);
        abort();
    }
    char *text2 = fb_wire_encode(&again, msg, sizeof msg);
    if (!text2 || strcmp(text, text2) != 0) {
        fprintf(stderr, "the encoding is not a fixed point:\n%s\n%s\n", text, text2 ? text2 : msg);
        abort();
    }
    free(text2);
    free(text);
    fb_wire_msg_free(&again);
    fb_wire_msg_free(&m);
    return 0;
}
