/*
 * The wire codec's own: what its three files share (wire.c, the names and
 * the key files; wire_decode.c; wire_encode.c).  Private to api/
 * (docs/architecture.md, "Private headers"): other parts use wire.h.
 */
#ifndef FB_API_WIRE_INT_H
#define FB_API_WIRE_INT_H

#include <stddef.h>

#include "wire.h"

/* The wire's names of message types, fault kinds and event kinds, indexed by
 * their enums. */
extern const char *const fb_wire_type_names[FB_WIRE_TYPE_COUNT];
extern const char *const fb_wire_fault_names[FB_FAULT_COUNT];
extern const char *const fb_wire_event_names[FB_EV_KIND_COUNT];

/*
 * Runs the receiver's checks on len bytes of JSON the encoder built: 0, or
 * FB_ERR_BAD_WIRE (FB_ERR_NOMEM) with msg naming the field.  The blob count
 * is not known to the encoder, so any index is allowed and the ones used
 * must be exactly 1..k.
 */
int fb_wire_check_encoded(const char *json, size_t len, char *msg, size_t msg_cap);

#endif
