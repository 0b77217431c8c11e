/*
 * splitmix64 (Steele, Lea and Flood), the one generator of the tests: a seed gives the same
 * run on every machine, so KVT_SEED=<n> reruns a failure. Header only.
 */
#ifndef KVT_TESTS_RNG_H
#define KVT_TESTS_RNG_H

#include <stdint.h>

#define RNG_GAMMA 0x9E3779B97F4A7C15ull /* splitmix64's increment: 2^64 / the golden ratio */

/* splitmix64's output for state z: also a good 64-bit hash of z. */
static inline uint64_t rng_mix(uint64_t z)
{
    z += RNG_GAMMA;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The next value of the stream in *state. */
static inline uint64_t rng_next(uint64_t *state)
{
    uint64_t z = *state;

    *state += RNG_GAMMA;
    return rng_mix(z);
}

#endif
