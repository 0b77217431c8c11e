/* The tools' one pseudo-random generator: splitmix64. Seeded runs repeat exactly, and its
 * finalizer is a bijection, so distinct inputs give distinct outputs (keys that never collide). */
#ifndef KVT_TOOLS_RNG_H
#define KVT_TOOLS_RNG_H

#include <stdint.h>

#define RNG_GAMMA 0x9e3779b97f4a7c15ull /* splitmix64's increment: 2^64 over the golden ratio */

/* splitmix64's finalizer: consecutive inputs give unrelated outputs. */
static inline uint64_t rng_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The next draw from state *s. */
static inline uint64_t rng_next(uint64_t *s)
{
    return rng_mix64(*s += RNG_GAMMA);
}

/* A draw below n (n > 0), with the slight bias of a modulo, which no figure here notices. */
static inline uint64_t rng_below(uint64_t *s, uint64_t n)
{
    return rng_next(s) % n;
}

#endif
