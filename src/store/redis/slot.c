/*
 * A key's hash slot as Redis Cluster computes it: CRC16 (XMODEM: polynomial 0x1021, initial
 * value 0, no reflection) of the key, or of its hash tag, modulo 16384. A hash tag is what
 * lies between the first '{' and the first '}' after it, when that is not empty; page keys
 * have no braces, so each page hashes whole and pages spread over every master.
 */
#include <string.h>

#include "store/redis/redis.h"

static uint16_t crc16(const uint8_t *p, size_t n)
{
    uint16_t crc = 0;

    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

uint16_t store_redis_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len), *close;

    if (open && (close = memchr(open + 1, '}', len - (size_t)(open + 1 - key))) && close > open + 1)
        return crc16((const uint8_t *)open + 1, (size_t)(close - open - 1)) % STORE_REDIS_SLOTS;
    return crc16((const uint8_t *)key, len) % STORE_REDIS_SLOTS;
}
