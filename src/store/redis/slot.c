/*
 * A key's hash slot as Redis Cluster computes it: CRC16 (XMODEM: polynomial 0x1021, initial
 * value 0, no reflection) of the key, or of its hash tag, modulo 16384. A hash tag is what
 * lies between the first '{' and the first '}' after it, when that is not empty; page keys
 * have no braces, so each page hashes whole and pages spread over every master. A page's copy
 * name ends in a hash tag of five hex digits chosen for the slot it must land in: the table of
 * them is made once, the first five-digit numbers whose CRC16 reaches each slot (all 16384
 * slots are reached by 0x4cd70).
 */
#include <pthread.h>
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

#define TAG_DIGITS 5

static uint32_t tag_of[STORE_REDIS_SLOTS];
static pthread_once_t tags_once = PTHREAD_ONCE_INIT;

static void make_tags(void)
{
    static const char digits[] = "0123456789abcdef";
    size_t left = STORE_REDIS_SLOTS;
    uint8_t seen[STORE_REDIS_SLOTS] = {0};
    char t[TAG_DIGITS];

    for (uint32_t i = 0; left && i < (1u << (4 * TAG_DIGITS)); i++) {
        for (int d = 0; d < TAG_DIGITS; d++)
            t[d] = digits[(i >> (4 * (TAG_DIGITS - 1 - d))) & 15];
        uint16_t s = crc16((const uint8_t *)t, TAG_DIGITS) % STORE_REDIS_SLOTS;
        if (!seen[s]) {
            seen[s] = 1;
            tag_of[s] = i;
            left--;
        }
    }
}

void store_redis_slot_tag(uint16_t slot, char *out)
{
    static const char digits[] = "0123456789abcdef";
    uint32_t v;

    pthread_once(&tags_once, make_tags);
    v = tag_of[slot % STORE_REDIS_SLOTS];
    for (int d = 0; d < TAG_DIGITS; d++)
        out[d] = digits[(v >> (4 * (TAG_DIGITS - 1 - d))) & 15];
}
