/*
 * A structural check of an LMDB data file (lmdb_check.c): every page its trees can reach is
 * what LMDB's reads and writes assume, and the free list names only pages no tree holds. For
 * the index probe's child (trust.c), before LMDB touches the file.
 */
#ifndef KVT_DISK_LMDB_CHECK_H
#define KVT_DISK_LMDB_CHECK_H

#include <stddef.h>
#include <stdint.h>

#define LMDB_CHECK_BAD 1      /* the file fails a check */
#define LMDB_CHECK_MAX_DBS 16 /* named databases looked at, at most */

/* Check size bytes of a data file mapped (or read) at map: 0, LMDB_CHECK_BAD, or -ENOMEM. */
int lmdb_check(const void *map, size_t size);

#endif
