/* A benchmark's own work dir: made fresh under a parent the user names, everything the run
 * writes goes in it, and it is removed at the end. Also what a disk benchmark does to the
 * file system around its timings: settle it, forget its cached pages, check its free space. */
#ifndef KVT_TOOLS_WORKDIR_H
#define KVT_TOOLS_WORKDIR_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define WORKDIR_NAME_ROOM 64 /* bytes kept free after the path for the names made in it */

struct workdir {
    char path[PATH_MAX]; /* empty until workdir_make succeeds */
    char fs[32];         /* the file system's name ("ext4"), or its magic in hex */
};

/* Make "<parent>/<prog>.XXXXXX" and name its file system. 0, or -1 after saying why on
 * stderr (prefixed with prog). */
int workdir_make(struct workdir *w, const char *prog, const char *parent);

/* "<dir>/<name>" into out; workdir_make left room for names up to WORKDIR_NAME_ROOM. */
void workdir_path(const struct workdir *w, const char *name, char *out, size_t len);

/* 0 when the dir's file system has need bytes free and a margin; else -1 after saying so on
 * stderr, with hint (what the user can do about it). Checked before a phase writes a byte. */
int workdir_check_space(const struct workdir *w, const char *prog, uint64_t need, const char *hint);

/* Remove a tree this program made (never anything it did not). */
void workdir_rm_tree(const char *path);

/* A cold open without root: the page cache forgets the clean pages of the files under path. */
void workdir_drop_cache(const char *path);

/* Settle the disk before a timed write: the file system's dirty data and journal (with the
 * discards of files unlinked) written out and the device's write cache flushed, so that a
 * phase never pays for what an earlier one left behind. */
void workdir_quiesce(const char *path);

#endif
