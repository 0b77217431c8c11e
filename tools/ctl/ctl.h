/*
 * kvtier-ctl's pieces (tools/ctl/):
 *   ctl.c         main: subcommands, options, help
 *   ctl_dir.c     opening a data dir: why it failed, a damaged index rebuilt; recover
 *   ctl_index.c   a data dir's index in memory: pages, namespaces, parent links, checks
 *   ctl_show.c    stat, ls, show (read-only)
 *   ctl_tree.c    tree (read-only)
 *   ctl_check.c   verify, gc, evict
 *   ctl_copy.c    export, import
 *   ctl_live.c    stat --live, top, metrics (a running engine's stats socket)
 *   ctl_remote.c  remote stat, remote verify (the Redis tier's server, plain or TLS)
 *   ctl_emb.c     emb: the multimodal embeddings a dir holds, checked whole
 *   ctl_out.c     output helpers every command uses (errors, hex, times, sizes)
 * ctl.c calls the commands, the commands call the helpers: nothing calls back up.
 */
#ifndef KVT_TOOLS_CTL_H
#define KVT_TOOLS_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "disk/store.h"

#define PROG "kvtier-ctl"
#define HASH_BYTES DSTORE_KEY_BYTES
#define SHORT_HEX 12 /* hex digits of a hash in tables */
#define MAX_SELECT 16

/* ---- the command line ---- */

struct ctl_args {
    const char *pos[2]; /* positional arguments: DIR or SOCKET, then HASH or another DIR;
                         * remote: stat or verify, then URL */
    int npos;
    bool json, dot, repair, reverse, all, dry_run, detached;
    bool verify;                    /* emb --verify */
    const char *live;               /* stat --live SOCKET */
    const char *ns[MAX_SELECT];     /* --ns, repeatable */
    const char *prefix[MAX_SELECT]; /* --prefix, repeatable */
    int nns, nprefix;
    const char *sort;  /* ls --sort */
    uint64_t limit;    /* ls --limit; 0: all */
    uint64_t to_bytes; /* evict --to */
    bool to_set;
    uint64_t capacity;                       /* export/import --capacity; 0: default */
    uint64_t count;                          /* top --count; 0: forever */
    double interval;                         /* top --interval, seconds */
    const char *tls_ca, *tls_cert, *tls_key; /* remote --tls-ca, --tls-cert, --tls-key */
};

/* ---- output helpers (ctl_out.c) ---- */

/* Print "kvtier-ctl: ..." on stderr; returns 1, the error status. */
int ctl_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ctl_hex(const uint8_t *b, size_t n, char *out); /* out: 2n + 1 chars */
/* "YYYY-MM-DDTHH:MM:SSZ" for ns since the epoch ("-" for 0); buf of 32. */
const char *ctl_time(uint64_t ns, char *buf);
/* "1.5 MiB"; buf of 32. */
const char *ctl_bytes(uint64_t n, char *buf);
void ctl_json_hex(const uint8_t *b, size_t n);

/* ---- opening a data dir (ctl_dir.c) ---- */

/* Explain why a data dir could not be opened (rc from dstore_open) and return 1. */
int ctl_open_error(const char *dir, int rc, bool writing);
/* Open a data dir as found, read-only; with heal (the command writes the dir anyway), a
 * damaged index is first rebuilt by a writer's open. 0, or an exit status after saying why. */
int ctl_open_ro(const char *dir, bool heal, struct dstore **out);
/* Open a data dir as found for writing, ready; a damaged index is rebuilt from the slabs,
 * with a note on stderr. 0, or an exit status after saying why. */
int ctl_open_rw(const char *dir, uint64_t disk_bytes, struct dstore **out);
/* When the writer's open of dir rebuilt its index from the slabs, say so on stderr (stdout may
 * be JSON); had_index: whether there was one to set aside. */
void ctl_note_rebuilt(const char *dir, struct dstore *s, bool had_index);
/* Whether to call the store again after rc (*tries counts the tries, from 0): -EAGAIN says a
 * snapshot of the index could not be taken just now (a writer grew the index past this
 * process's map while another snapshot was live, or LMDB's reader table was full); after a
 * short pause the snapshot is renewed. A bounded number of times (about a second). */
bool ctl_retry(int rc, int *tries);
/* Whether a writer (a running engine) holds dir's lock now; a quick check before a long scan. */
bool ctl_dir_locked(const char *dir);

/* ---- the index in memory (ctl_index.c) ---- */

enum page_problem {
    BAD_RECORD = 1u << 0,   /* corrupt: the record failed its checks */
    BAD_HASH = 1u << 1,     /* corrupt: key is not SHA256(parent || tokens) */
    BAD_LENGTH = 1u << 2,   /* corrupt: length is not the dir's page size */
    BAD_CHECKSUM = 1u << 3, /* corrupt: the page's bytes failed their checksum (verify) */
    BAD_DANGLING = 1u << 4, /* the slot is outside the slabs or past a truncated file */
    BAD_STALE = 1u << 5,    /* the slot table gives the slot to another page or none */
    BAD_IO = 1u << 6,       /* reading the page failed (verify) */
};
#define BAD_CORRUPT (BAD_RECORD | BAD_HASH | BAD_LENGTH | BAD_CHECKSUM)
#define NO_PAGE UINT32_MAX

struct page {
    uint8_t key[HASH_BYTES], parent[HASH_BYTES];
    uint32_t ns;    /* index into ix->ns; NO_PAGE for a record that failed its checks */
    uint32_t up;    /* index of the parent page; NO_PAGE for a first page, a missing parent
                     * or a key that is not the hash of its parent (links never loop) */
    uint32_t child; /* first child, NO_PAGE when none */
    uint32_t next;  /* next sibling, NO_PAGE when none */
    uint32_t depth; /* pages from the namespace root through this one; 0: not served now */
    uint32_t slab, slot;
    uint32_t first_token; /* for listings */
    uint32_t problems;    /* enum page_problem */
    /* No problem of its own, but no chain of good pages leads to it from its namespace root:
     * a page above is not on this disk (its copy aged out while its hits went to the upper
     * tiers) or is bad. Not a problem: an engine serves it again once it stores that page. */
    bool detached;
    bool owns_slot; /* the slot table gives its slot to it */
    bool key_ok;    /* key is SHA256(parent || tokens): it may hang below its parent */
    uint64_t created, atime;
};

struct ns_info {
    uint8_t root[HASH_BYTES];
    bool is_default;
    bool is_states;     /* the pages of recurrent states (KVT_STATE_TAG) */
    bool is_windows;    /* window copies of sliding-window pages (KVT_WINDOW_TAG) */
    bool is_embeddings; /* chunks of multimodal embeddings (EMB_TAG, src/emb/format.h) */
    uint32_t first;     /* first of its first pages (linked by next), NO_PAGE when none */
    uint64_t pages, good, detached; /* good: served now */
    uint64_t oldest, newest;        /* created */
};

struct ctl_index {
    struct dstore *s;
    struct dstore_info info;
    struct page *p; /* in key order */
    uint32_t n, cap;
    struct ns_info *ns;
    uint32_t nns;
    uint8_t default_root[HASH_BYTES];
    uint8_t states_root[HASH_BYTES];
    uint8_t windows_root[HASH_BYTES];
    uint8_t embeddings_root[HASH_BYTES];
    uint64_t bad_keys; /* records whose key is not 32 bytes: listed apart, never dropped */
    /* The engine's page, which records of several (kvt_options.store_page_tokens) chain their
     * key over; info.page_tokens when none was found. */
    uint32_t engine_page_tokens;
    uint64_t slot_entries; /* the slot table's size */
    bool quiet_dir;        /* no writer held the dir while it was read: slot_entries agrees */
};

/* Whether the pages of namespace n hang from the page of KV they follow (a state's pages, a
 * page's window copy) rather than from their namespace root: their depth counts that page. */
static inline bool ns_follows_kv(const struct ns_info *n)
{
    return n->is_states || n->is_windows;
}

/* Read every record of s into ix and run the record checks (not the page bytes). */
int index_load(struct dstore *s, struct ctl_index *ix);
void index_free(struct ctl_index *ix);
/* The page whose key starts with hex (a unique prefix, 4 to 64 digits): 0 and *out, or an
 * exit status after saying why. */
int index_find(const struct ctl_index *ix, const char *hex, uint32_t *out);
/* The namespace named by arg: "default", "states", "windows", "embeddings", "name:TEXT" (its bytes)
 * or a unique hex prefix of a root hash; 0 and *out, or an exit status after saying why. */
int index_find_ns(const struct ctl_index *ix, const char *arg, uint32_t *out);
/* Mark (sel[i] = true) the pages chosen by a's --ns, --prefix (the page, its chain to the
 * root and its descendants) or --all (also when none is given); with good_only, only pages
 * without problems. 0, or an exit status after saying why. */
int index_select(const struct ctl_index *ix, const struct ctl_args *a, bool good_only, bool *sel);
/* After problems changed (verify's reads): detached pages and per-namespace counts again. */
int index_relink(struct ctl_index *ix);
/* Open dir read-only (ctl_open_ro) and load its index: 0, or an exit status after saying
 * why. */
int ctl_load(const char *dir, bool heal, struct dstore **s, struct ctl_index *ix);
void ctl_unload(struct dstore *s, struct ctl_index *ix);
/* Problems by kind, over the pages of ix; and the detached pages, which are none. */
struct problem_counts {
    uint64_t corrupt, dangling, stale, io, total;
    uint64_t detached; /* not in total */
};
void index_count_problems(const struct ctl_index *ix, struct problem_counts *c);
/* Short hex of a namespace for tables: "default" or the root's first digits. */
const char *index_ns_name(const struct ctl_index *ix, uint32_t ns, char *buf);
/* Name of the first problem in mask, e.g. "dangling"; "ok" for none. */
const char *problem_name(uint32_t mask);
/* A page's state for listings: its first problem, "detached" or "ok". */
const char *page_state(const struct page *p);
/* Whether a page has no problem found so far (its checksum may not have been read): it is
 * served, or, detached, would be once the pages above it are stored again. */
static inline bool page_good(const struct page *p)
{
    return p->problems == 0;
}

/* ---- subcommands: each returns the exit status ---- */

int cmd_stat(const struct ctl_args *a);
int cmd_ls(const struct ctl_args *a);
int cmd_show(const struct ctl_args *a);
int cmd_tree(const struct ctl_args *a);
int cmd_verify(const struct ctl_args *a);
int cmd_gc(const struct ctl_args *a);
int cmd_evict(const struct ctl_args *a);
int cmd_recover(const struct ctl_args *a);
int cmd_export(const struct ctl_args *a);
int cmd_import(const struct ctl_args *a);
int cmd_stat_live(const struct ctl_args *a);
int cmd_top(const struct ctl_args *a);
int cmd_metrics(const struct ctl_args *a);
int cmd_emb(const struct ctl_args *a);
/* remote stat URL, remote verify URL (pos[0] says which); 2 where the Redis store is not built. */
int cmd_remote(const struct ctl_args *a);

#endif
