/*
 * Whether the index may be handed to LMDB in this process (trust.c): a damaged LMDB file can
 * crash its reader, so an index this process did not stamp clean is first read whole by a
 * child process.
 */
#ifndef KVT_DISK_TRUST_H
#define KVT_DISK_TRUST_H

#include <stdbool.h>

/* The files under dirfd's index/ are what LMDB needs (no links, regular files, data.mdb at
 * least its meta pages long): 0 or KVT_ECORRUPT. */
int index_files_ok(int dirfd);

/* Trust the index at path (dirfd's index/): 0 when its clean stamp matches or a child read
 * all of it without harm (*walked tells which), KVT_ECORRUPT when it is damaged, -errno when
 * the system refused (no memory, no process). */
int index_trust(int dirfd, const char *path, bool *walked);

/* The walk alone, whatever the stamp says. */
int index_probe(int dirfd, const char *path);

/* Stamp the index as the writer left it, after its last commit; best effort. */
void index_stamp_clean(int dirfd);

/* Remove the stamp (the index is about to be rebuilt or replaced). */
void index_stamp_remove(int dirfd);

/* Remove the stamp and make its absence durable (a writer about to commit without flushing):
 * 0 or -errno. */
int index_stamp_revoke(int dirfd);

#endif
