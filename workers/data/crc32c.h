/*
 * CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every
 * shard header, chunk index, chunk and whole shard file.
 *
 * fb_crc32c uses the SSE4.2 crc32 instruction where the CPU has it and a
 * slice-by-8 table otherwise; fb_crc32c_sw is the portable table version,
 * kept callable so tests can check that both agree.  Both are incremental:
 * pass 0 to start and the previous result to continue, so
 * crc(ab) == fb_crc32c(fb_crc32c(0, a), b).
 */
#ifndef FB_WORKERS_DATA_CRC32C_H
#define FB_WORKERS_DATA_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC32C of len bytes at p, continuing from crc (0 to start).  Thread-safe. */
uint32_t fb_crc32c(uint32_t crc, const void *p, size_t len);

/* The same checksum computed with the portable slice-by-8 table only. */
uint32_t fb_crc32c_sw(uint32_t crc, const void *p, size_t len);

#endif
