/* A data dir's entries as the tools' messages tell them. */
#ifndef KVT_TOOLS_DATADIR_H
#define KVT_TOOLS_DATADIR_H

#include <stdbool.h>
#include <stddef.h>

/* The first entry of the data dir at dir whose kind is not the one kvtier keeps there (a
 * directory where its lock file goes, a regular file where slabs/ goes, a link, a FIFO...),
 * said in buf as "SHOWN/lock is a directory, where kvtier keeps the lock file a writer holds"
 * (shown: dir as the message names it); NULL when there is none, or dir is no directory to
 * look in. For the message of an open that failed with a bare errno. */
const char *cli_dir_problem(const char *dir, const char *shown, char *buf, size_t len);

#endif
