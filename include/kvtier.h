/*
 * kvtier: a hierarchical KV-cache engine for LLM serving.
 *
 * One engine handle owns the device KV pool, its slot allocator, the request pool
 * (req_to_token) and the radix prefix cache. It is used from one owner thread, like an
 * LMDB transaction or a SQLite connection: calls on one handle must not overlap.
 *
 * Conventions
 * - Every function that can fail returns int: 0 on success, a negated errno value or a
 *   KVT_E* code on failure. errno is never set. kvt_strerror() names every code. Each
 *   function below lists what it can return ("Errors:"); pointers named there may not be
 *   NULL unless it says so.
 * - A call that fails with -EINVAL or -ENOMEM leaves the engine as it was: input is checked
 *   whole before anything changes, and room is known to suffice before anything is evicted.
 * - -EUCLEAN means an internal consistency check of kvtier failed (a bug in kvtier, never the
 *   caller's input); the call may have changed state: close the engine. Only the calls that
 *   insert (kvt_insert, kvt_req_cache_unfinished, kvt_req_cache_finished) can return it.
 * - KVT_EBACKEND from kvt_poll or kvt_sync means a transfer failed on the device: from then
 *   on kvt_match, kvt_req_begin and kvt_prefetch refuse with it, kvt_poll and kvt_sync
 *   report it, and the rest still work so that requests can be released; close the engine.
 * - Blocking: no call waits unless it says so ("Blocks:"). The calls that evict (kvt_evict,
 *   kvt_alloc_extend, kvt_alloc_decode, a load-back in kvt_req_begin) may wait for transfers
 *   in flight, and a backup (write_through on insert, write_through_selective on a match,
 *   write_back on eviction) that must evict host pages may, with a disk tier writing on
 *   host eviction (KVT_DISK_WRITE_ON_EVICT), wait for those disk writes.
 * - Slots are int32 indices of token rows in the device KV pool. Slot 0 .. page_size-1
 *   (page 0) is reserved for padding writes and is never handed out.
 * - Pages are page_size consecutive slots starting at a multiple of page_size. Keys given
 *   to the prefix cache are matched and inserted in whole pages.
 * - Nodes of the prefix cache are named by kvt_node_ref values, not pointers. A stale or
 *   forged ref is detected and rejected with -EINVAL.
 */
#ifndef KVTIER_H
#define KVTIER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_VERSION_MAJOR 0
#define KVT_VERSION_MINOR 9
#define KVT_VERSION_PATCH 0

/* kvtier-specific error codes, below the errno range. */
enum {
    KVT_ENOBACKEND = -20001,   /* the requested backend is not built in or has no device */
    KVT_EBACKEND = -20002,     /* the backend (CUDA runtime) reported a failure */
    KVT_EHOSTRAM = -20003,     /* the host pool does not fit in the memory available now */
    KVT_EHOSTSIZE = -20004,    /* the host pool must be larger than the device pool */
    KVT_EFORMAT = -20005,      /* not a kvtier data dir, or a format this build cannot read */
    KVT_EFINGERPRINT = -20006, /* the data dir holds KV of another model, geometry or layout */
    KVT_ECORRUPT = -20007,     /* stored bytes or records failed their checks */
};

enum kvt_backend {
    KVT_BACKEND_AUTO = 0, /* cuda when built with CUDA and a GPU is visible, else sim */
    KVT_BACKEND_SIM = 1,  /* host memory standing in for the GPU */
    KVT_BACKEND_CUDA = 2, /* cudaMalloc on the current CUDA device */
};

enum kvt_attention {
    KVT_ATTN_MHA = 0, /* K and V buffers per layer of kv_heads x head_dim (v_head_dim for V) */
    KVT_ATTN_MLA = 1, /* one buffer per layer of kv_lora_rank + qk_rope_head_dim */
};

enum kvt_evict_policy {
    KVT_EVICT_LRU = 0,      /* least recently used first */
    KVT_EVICT_LFU = 1,      /* fewest hits first, then least recently used */
    KVT_EVICT_FIFO = 2,     /* oldest insertion first */
    KVT_EVICT_MRU = 3,      /* most recently used first */
    KVT_EVICT_FILO = 4,     /* newest insertion first */
    KVT_EVICT_PRIORITY = 5, /* lowest priority first, then least recently used */
};

enum kvt_host_layout {
    KVT_HOST_PAGE_FIRST = 0,  /* [page][layer][K,V]: a page over all layers is contiguous */
    KVT_HOST_LAYER_FIRST = 1, /* [layer][K or V][page]: as the device pool */
};

enum kvt_write_policy {
    KVT_WRITE_THROUGH = 0,           /* back a prefix up to the host when it is inserted */
    KVT_WRITE_THROUGH_SELECTIVE = 1, /* back it up once it has been hit write_threshold times */
    KVT_WRITE_BACK = 2,              /* back it up when the device evicts it */
};

/* How the cuda backend moves scattered pages between device and host; sim ignores it. */
enum kvt_io {
    KVT_IO_AUTO = 0,   /* the kernel for scattered pages, the copy engine for long runs */
    KVT_IO_KERNEL = 1, /* gather/scatter kernels reading and writing pinned host memory */
    KVT_IO_DMA = 2,    /* cudaMemcpyAsync (batched where the toolkit has it) per run */
};

/* When a page goes from the host tier to the disk tier. */
enum kvt_disk_write {
    KVT_DISK_WRITE_THROUGH = 0,  /* once its host backup has landed */
    KVT_DISK_WRITE_ON_EVICT = 1, /* when the host tier evicts it */
};

/* What kvt_req_begin does with the part of a prefix that only the disk holds. */
enum kvt_prefetch {
    KVT_PREFETCH_WAIT_COMPLETE = 0, /* read it to the host and wait: it is served */
    KVT_PREFETCH_BEST_EFFORT = 1,   /* start the read, serve what has landed, compute the rest */
    KVT_PREFETCH_TIMEOUT = 2,       /* wait up to prefetch_timeout_ms, then as best_effort */
};

enum kvt_disk_io {
    KVT_DISK_IO_AUTO = 0,  /* io_uring, or pread/pwrite threads when the kernel refuses it or
                              the dir is in memory (tmpfs: they take checksums as they copy) */
    KVT_DISK_IO_URING = 1, /* io_uring only: opening fails where it is refused */
    KVT_DISK_IO_PSYNC = 2, /* pread/pwrite threads */
};

/* When the disk tier's writes reach the disk (kvt_options.disk_sync; docs/design.md says what
 * a crash or a power cut costs in each). Every page read from disk is checked against its
 * checksum either way, so neither mode ever serves bytes other than the page's. */
enum kvt_disk_sync {
    /* Each write batch is fdatasync'ed before its index records commit: a power cut loses the
     * pages in flight and at most the last commit's. */
    KVT_DISK_SYNC_DURABLE = 0,
    /* No sync per batch: the data and the index are flushed every disk_sync_ms or
     * disk_sync_bytes; a power cut may lose what was written since the last flush. */
    KVT_DISK_SYNC_RELAXED = 1,
};

struct kvt_geometry {
    uint32_t attention;        /* enum kvt_attention */
    uint32_t layers;           /* number of layers held by this engine (this TP rank) */
    uint32_t kv_heads;         /* MHA: KV heads on this rank */
    uint32_t head_dim;         /* MHA: K head dimension */
    uint32_t v_head_dim;       /* MHA: V head dimension; 0 means head_dim */
    uint32_t kv_lora_rank;     /* MLA: latent dimension */
    uint32_t qk_rope_head_dim; /* MLA: rope dimension */
    uint32_t dtype_bytes;      /* element size: 1, 2 or 4 */
};

/* The recurrent layers of a hybrid model (Mamba2 in Nemotron-H, Jamba and Falcon-H1; Gated
 * DeltaNet in Qwen3-Next), beside the attention layers that geometry describes. Such a layer
 * keeps no KV: a request carries one fixed-size state (per layer a conv state and an SSM state)
 * in a state slot, and the prefix cache keeps copies of states at checkpoint positions. A
 * cached prefix is served only up to the deepest checkpoint on it (kvt_req_mamba). (Since
 * 0.4.) */
struct kvt_mamba {
    uint32_t layers;         /* recurrent layers; 0 (the default): none */
    uint32_t slots;          /* state slots for requests (2 each while they run) and the
                                cache's checkpoints; 0: 4 x max_requests */
    uint64_t conv_bytes;     /* one layer's conv state (the sum of its conv tensors) */
    uint64_t ssm_bytes;      /* one layer's recurrent (SSM) state */
    uint32_t chunk;          /* tokens: the chunked scan's state grid, a power of two;
                                default 64 (FLA's chunk) */
    uint32_t track_interval; /* tokens: decode checkpoints, a multiple of chunk; default 256 */
};

/* The sliding-window layers of a hybrid model (GPT-OSS, Gemma 3, Mistral's SWA layers):
 * every layer of geometry that full_layers does not name attends only to the last window
 * tokens, so its KV is kept in a second, smaller pool of SWA slots (each full slot maps to
 * one) and freed once the window has passed it while the full-attention KV stays cached (an
 * SWA tombstone). A cached prefix is served only up to where its last window still has SWA
 * KV. Both kinds of layer share geometry's head shape. (Since 0.4.) */
struct kvt_swa {
    uint32_t window;             /* tokens; 0 (the default): no sliding-window layers */
    uint32_t nfull;              /* how many layers full_layers names, 1 at least */
    const uint32_t *full_layers; /* the full-attention layers' ids, distinct, below
                                    geometry.layers; copied at open */
    uint64_t tokens;             /* SWA slots; 0: 0.8 x the device's full slots (SGLang's
                                    swa_full_tokens_ratio) */
};

struct kvt_options {
    size_t size; /* sizeof(struct kvt_options) as the caller was compiled; set by init */
    struct kvt_geometry geometry;
    uint32_t page_size;     /* tokens per page, a power of two up to 256; default 16 */
    uint32_t backend;       /* enum kvt_backend; default KVT_BACKEND_AUTO */
    uint64_t device_tokens; /* KV slots on the device; 0: derive from device_bytes */
    uint64_t device_bytes;  /* KV pool budget used when device_tokens is 0 */
    uint32_t max_requests;  /* request slots; default 256 */
    uint32_t max_context;   /* tokens per request in req_to_token; default 32768 */
    uint32_t evict_policy;  /* enum kvt_evict_policy; default KVT_EVICT_LRU */
    uint32_t hash_pages;    /* 1 (default): keep a chained SHA256 per page; 0: none */
    /* Fingerprint input, copied at open; NULL means "". Name the weights and the KV format
     * in it ("llama-3-8b@rev/bf16"): the geometry gives the element size only, so fp16 and
     * bf16 (or two fp8 formats, or two KV scale schemes) of one model would otherwise share
     * a fingerprint, and a disk tier written by one would be served to the other. */
    const char *model_id;
    uint32_t tp_rank; /* fingerprint input; default 0 */
    uint32_t tp_size; /* fingerprint input; default 1 */
    /* Host tier (pinned host memory): sized by host_tokens, else host_bytes, else
     * host_ratio times the device pool; all 0 (the default) means no host tier. It must be
     * larger than the device pool (KVT_EHOSTSIZE) and fit in free RAM (KVT_EHOSTRAM). */
    uint64_t host_tokens;
    uint64_t host_bytes;
    double host_ratio;
    uint32_t host_layout;     /* enum kvt_host_layout; default page_first */
    uint32_t write_policy;    /* enum kvt_write_policy; default write_through */
    uint32_t write_threshold; /* hits before a selective backup; default 2 */
    uint32_t load_back_min;   /* host runs shorter than this many tokens are recomputed
                                 instead of loaded back; default 0 (load every page) */
    uint32_t io; /* enum kvt_io; default auto. kernel gives KVT_ENOBACKEND at open where the
                    kernels cannot run (not built, or no code for this GPU) */
    /* Disk tier: a data dir on a local disk that outlives the process; NULL (the default)
     * means none. It needs a host tier in page_first layout and hash_pages. A dir written
     * for another fingerprint is refused (KVT_EFINGERPRINT), one that is not kvtier's
     * (KVT_EFORMAT), one another process has open (-EBUSY). */
    const char *disk_dir;
    uint64_t disk_bytes;          /* capacity of the data; 0: 1 GiB */
    uint32_t disk_io;             /* enum kvt_disk_io; default auto */
    uint32_t disk_write_policy;   /* enum kvt_disk_write; default write_through */
    uint32_t prefetch_policy;     /* enum kvt_prefetch; default wait_complete */
    uint32_t prefetch_timeout_ms; /* for KVT_PREFETCH_TIMEOUT; default 100 */
    uint32_t prefetch_min;        /* disk runs shorter than this many tokens are computed
                                     instead of read; default 0 (read every page) */
    /* A unix socket path where a thread of the engine serves its stats to kvtier-ctl (one
     * line in: "stats" for JSON, "metrics" for Prometheus text; the reply, then close).
     * The figures are those of the last kvt_poll or kvt_sync. A client has 1 s for its whole
     * exchange and at most 32 are held at once (a new one displaces the oldest), so no client
     * holds up another or kvt_close. The socket is made mode 0600 and kvt_close removes it.
     * A stale socket at the path is replaced; anything else is left as it is and kvt_open
     * fails: -EADDRINUSE when a server answers there, -EEXIST when it is not a socket (file,
     * dir, symlink, fifo), -ENAMETOOLONG past 107 bytes, another -errno (-ENOENT, -EACCES)
     * when it cannot be made. NULL (default): none. */
    const char *stats_socket;
    /* sim backend: 1 copies each transfer on the calling thread as it is submitted, so that
     * a run does the same thing every time (tests, recorded baselines); 0 (default): worker
     * threads emulate the streams, and what lands when varies as on a GPU. cuda ignores it. */
    uint32_t sim_serial;
    /* Recurrent layers of a hybrid model (since 0.4); layers 0: none. With a host tier (since
     * 0.5) checkpoints are saved beside their nodes' host copies (mamba_host_states); with a
     * disk or remote store each is written there when cached, by the hash of the page it
     * follows, and read back with its KV by a match that runs past the tree. */
    struct kvt_mamba mamba;
    /* Sliding-window layers of a hybrid model (since 0.4); window 0: none. With tiers below
     * (since 0.5, sim backend; cuda is KVT_ENOBACKEND until a GPU has run it) the host copies
     * of pages holding SWA KV keep their sliding-window layers, a store below keeps window
     * copies of those pages, and a match brings a prefix back with its window. Not with
     * recurrent layers (-EINVAL). */
    struct kvt_swa swa;
    /* 1: EAGLE bigram keys (since 0.4), SGLang's convert_to_bigram_key. A speculative
     * decoder's draft model writes the KV of position i from tokens i and i + 1, so a cached
     * position is good only while the next token matches too. A key of n tokens then names
     * n - 1 positions, position i standing for the pair (token i, token i + 1), and every
     * length the API takes or gives (kvt_match, kvt_insert, protected_len, req_to_token rows,
     * kvt_prefetch) counts positions; a key may hold max_context + 1 tokens, and one of a
     * single token names no position (-EINVAL where an empty key is). One tree then serves the
     * target model's KV (which depends on tokens up to i only) and the draft's at the same
     * slots. 0 (default): plain keys. */
    uint32_t key_bigram;
    uint32_t disk_sync; /* enum kvt_disk_sync: KVT_DISK_SYNC_DURABLE (0, default) or
                           KVT_DISK_SYNC_RELAXED */
    /* Relaxed mode: a flush once the oldest unflushed write is disk_sync_ms old (0: 1000) or
     * disk_sync_bytes of pages wait (0: 256 MiB), whichever comes first. (Since 0.4.) */
    uint32_t disk_sync_ms;
    uint64_t disk_sync_bytes;
    /* A shared remote tier (since 0.4): a standalone Redis or Valkey server,
     * "redis://[[USER]:PASSWORD@]HOST[:PORT]" (USER: an ACL user, Redis 6+; USER and PASSWORD
     * percent-decoded, %XX), or a Redis Cluster: the URL of any node, or a comma-separated
     * list of seed URLs, "redis://H1:P1,redis://H2:P2" (at most 16; "redis://" may be left
     * off after the first; one user and password for all). A refused AUTH (WRONGPASS) or a
     * user without GET/SET/EXISTS (NOPERM) costs hits, counted as errors, never the engine. Whether
     * it is a cluster is what the first seed to answer says (CLUSTER SLOTS); pages are then routed
     * by hash slot to their master, MOVED and ASK followed, and a dead master costs the pages of
     * its slots only. Below the disk tier when there is one, else right below the host tier (which
     * it needs). Engines on many hosts share what any of them wrote. Pages go there as they go to
     * the disk tier (disk_write_policy); reads come from the nearest tier holding them. Every value
     * read is checked (a failing one is a miss, never served), and a server that is down, slow or
     * emptied costs only hits: ops fail within remote_timeout_ms and the engine serves on. NULL
     * (default): none. "rediss://" in place of "redis://" (every seed alike) speaks TLS: see
     * remote_tls_ca. A URL that is not of that form is -EINVAL; in a build without the Redis
     * store (-Dredis=disabled) any remote is KVT_ENOBACKEND. */
    const char *remote;
    uint32_t remote_timeout_ms; /* connect, read and write timeouts; 0: 1000 */
    uint32_t remote_ttl_s;      /* seconds a page lives on the server; 0: until it evicts it */
    /* Host copies of recurrent states (options.mamba with a host tier; since 0.5): a
     * checkpoint whose node keeps its host copy when the state leaves the device is saved
     * beside it and comes back with the node's KV. 0: mamba.slots times the host pool's pages
     * per device page, at most what half the memory available at open holds. Each takes the
     * state's bytes of host memory once used; more than the memory available is refused
     * (KVT_EHOSTRAM). */
    uint32_t mamba_host_states;
    /* TLS to the remote tier, with a "rediss://" URL (since 0.6): TLS 1.2 or later, the
     * server's certificate checked against these CAs and against the URL's host (a DNS name,
     * or an IP address its subjectAltName lists). A server whose certificate does not check
     * out, or that speaks no TLS, is one the engine cannot reach: its pages miss, counted as
     * errors. A file that cannot be read or holds no usable PEM is -EINVAL at kvt_open, as is
     * any of these without "rediss://". */
    const char *remote_tls_ca;   /* PEM file of the CA certificates; NULL: the system's */
    const char *remote_tls_cert; /* PEM client certificate (chain), for a server that asks for
                                    one (tls-auth-clients); NULL: none */
    const char *remote_tls_key;  /* its private key, PEM; NULL: in remote_tls_cert's file */
    /* Tokens per page of the tiers below the host, the disk and the remote store (since
     * 0.8): a multiple of page_size, at most 4096. Each page costs those tiers a record of
     * its own (an index entry, a server key) whatever its size; a store page holds that many
     * tokens of a key, from a multiple of them on, as one. What is left at a key's end short
     * of a whole store page is not written below; it goes down with the store page it starts
     * once the key grows past it. 0 (the default; since 0.9): chosen by bytes, the smallest
     * multiple of page_size whose KV is 64 KiB or more, at most max_context (page_size for
     * pages that large already, and for models with mamba or swa layers), which
     * kvt_store_page_tokens tells;
     * a data dir written by an engine whose store pages were page_size (the default before
     * 0.9) is opened with those. It is part of the fingerprint: a data dir written with
     * another store page size is refused (KVT_EFINGERPRINT), and a Redis server's keys of
     * one size are not seen by engines of another. Not with mamba or swa layers: a store
     * page of several pages is then -EINVAL (one of page_size, which changes nothing, is
     * taken). */
    uint32_t store_page_tokens;
    /* The multimodal embedding cache (since 0.9; see "multimodal embeddings" below): device
     * memory in bytes for vision-encoder outputs kept by item hash, least recently used out
     * first (SGLang's MultiModalStaticCache max_size). 0 (the default): no embedding cache,
     * and the other emb_ options must be 0. It is one allocation on the device, taken at open. */
    uint64_t emb_device_bytes;
    /* Host memory in bytes that keeps copies of embeddings (written as they are put or read
     * from below), so one evicted from the device comes back without the encoder; 0 (the
     * default): none. Its own budget, beside the host tier of KV; more than the memory
     * available at open is KVT_EHOSTRAM. */
    uint64_t emb_host_bytes;
    /* enum kvt_emb_store: whether embeddings also go to the engine's disk and remote tiers. */
    uint32_t emb_store;
};

enum kvt_emb_store {
    KVT_EMB_STORE_ALL = 0,  /* the disk tier and the remote tier, whichever the engine has */
    KVT_EMB_STORE_NONE = 1, /* neither: device and host only */
};

/* A key of the prefix cache: tokens in a namespace (LoRA id, cache_salt, tenant). Keys in
 * different namespaces never share a node. The engine copies what it keeps; the caller's
 * arrays need to live only for the call. */
struct kvt_key {
    const uint32_t *tokens;
    size_t len;
    const void *ns; /* namespace bytes; NULL or ns_len 0 is the default namespace */
    size_t ns_len;  /* at most KVT_NS_MAX */
};
#define KVT_NS_MAX 256

/* Names a prefix-cache node, and so the end of a cached prefix. 0 is never a valid ref. A
 * split keeps refs valid (the ref still names the node ending at the same prefix). A locked
 * node is never evicted; an unlocked one may be evicted by any later call that evicts, after
 * which its ref is rejected with -EINVAL. Evicted means its device copy went: the ref dies
 * even when the node lives on in the host tier, and stays dead when a load-back later gives
 * the node a device copy again (in other slots); a new match names it anew. */
typedef uint64_t kvt_node_ref;

struct kvt_match {
    size_t device_len;      /* tokens of the longest cached prefix, a multiple of page_size */
    kvt_node_ref last_node; /* node ending that prefix (the root when device_len is 0) */
    size_t host_len;        /* tokens after it that only the host tier holds */
    size_t disk_len;        /* tokens after those that only the disk tier holds */
    /* The load still filling part of that prefix (another request's load-back), as
     * kvt_req.load_op: wait for it with kvt_load_wait_layer before reading the slots; 0:
     * every slot has landed. (Since 0.2.) */
    uint64_t load_op;
};

/* The state a serving engine keeps per running request. Filled by kvt_req_begin, updated
 * by kvt_req_cache_unfinished, consumed by kvt_req_cache_finished. */
struct kvt_req {
    int32_t pool_idx;       /* row of req_to_token owned by this request; -1: none */
    size_t protected_len;   /* leading tokens whose slots belong to the prefix cache */
    kvt_node_ref last_node; /* locked node ending the protected prefix */
    size_t loaded_len;      /* tokens of the protected prefix loaded back from the host */
    uint64_t load_op;       /* the load the prefix waits for (kvt_load_wait_layer); 0: none */
    size_t disk_len;        /* tokens of loaded_len that were read from the disk tier first */
    /* Which holder of pool_idx this is: once the request is finished and its slot is taken
     * again, a leftover copy of this struct is refused with -EINVAL. (Since 0.2.) */
    uint32_t gen;
};

struct kvt_stats {
    size_t size;                 /* set by the caller to sizeof(struct kvt_stats); see kvt_stats */
    uint32_t backend;            /* enum kvt_backend actually in use */
    uint32_t page_size;          /* tokens per page */
    uint64_t device_tokens;      /* usable KV slots (excluding the padding page) */
    uint64_t device_free_tokens; /* slots the allocator can hand out */
    uint64_t kv_pool_bytes;      /* bytes of KV buffers on the device */
    uint64_t cached_tokens;      /* tokens held by the prefix cache */
    uint64_t evictable_tokens;   /* cached tokens in unlocked nodes */
    uint64_t protected_tokens;   /* cached tokens in locked nodes */
    uint64_t nodes;              /* prefix-cache nodes, root excluded */
    uint64_t tree_bytes;         /* heap bytes of prefix-cache metadata */
    uint64_t req_slots_free;     /* free request slots */
    uint64_t match_calls;        /* kvt_match and kvt_req_begin calls */
    uint64_t match_query_tokens; /* page-aligned tokens asked for by those calls */
    uint64_t match_hit_tokens;   /* tokens they found cached */
    uint64_t inserted_tokens;    /* tokens newly added to the prefix cache */
    uint64_t evicted_tokens;     /* tokens dropped from the prefix cache by eviction */
    /* host tier (all 0 without one) */
    uint64_t host_tokens;           /* token capacity of the host pool */
    uint64_t host_free_tokens;      /* free host slots */
    uint64_t host_cached_tokens;    /* tokens with a host copy (backups in flight included) */
    uint64_t host_pinned;           /* 1 when the host pool is locked in RAM */
    uint64_t host_hit_tokens;       /* tokens matched on the host past the device prefix */
    uint64_t loaded_tokens;         /* tokens loaded back host -> device */
    uint64_t backed_up_tokens;      /* tokens backed up device -> host */
    uint64_t backup_skipped_tokens; /* backups given up for lack of host space */
    uint64_t host_evicted_tokens;   /* tokens dropped from the host tier */
    uint64_t h2d_bytes, d2h_bytes;  /* bytes of completed transfers */
    uint64_t ops_in_flight;         /* transfers not yet applied by kvt_poll */
    /* disk tier (all 0 without one) */
    uint64_t disk_tokens;        /* token capacity of the data dir */
    uint64_t disk_cached_tokens; /* tokens the index holds */
    uint64_t disk_hit_tokens;    /* tokens found on disk past the host part of a match */
    /* (with a remote tier, these four count the disk alone: remote_* below) */
    uint64_t disk_read_tokens;    /* tokens read disk -> host, checked */
    uint64_t disk_written_tokens; /* tokens written host -> disk, committed (disk_sync) */
    uint64_t disk_errors;         /* failed checksums, bad records, I/O errors, full disk */
    uint64_t disk_read_bytes, disk_written_bytes;
    uint64_t disk_ops_in_flight; /* disk reads and writes not yet applied by kvt_poll */
    uint32_t disk_io;            /* enum kvt_disk_io in use */
    /* 1 when the disk index was found damaged (or missing) at open: it was set aside as
     * DIR/index.damaged and is rebuilt from the slab files in the background, its pages
     * served as they come back (disk_recovered_tokens of them so far). */
    uint64_t disk_index_rebuilt;
    uint64_t disk_recovered_tokens;
    uint64_t disk_skipped_tokens; /* tokens not written: a chain longer than the whole tier */
    /* Mamba states (all 0 without recurrent layers; since 0.4). match_hit_tokens counts
     * the part of a hit that a checkpoint backs; mamba_kv_hit_tokens the KV found. */
    uint64_t mamba_slots;          /* state slots */
    uint64_t mamba_free_slots;     /* of them, free */
    uint64_t mamba_cached_states;  /* checkpoints the prefix cache holds */
    uint64_t mamba_kv_hit_tokens;  /* device KV the matches found */
    uint64_t mamba_evicted_states; /* checkpoints dropped to make room for states */
    uint64_t mamba_pool_bytes;     /* bytes of the state pool on the device */
    /* Sliding-window layers (all 0 without them; since 0.4). match_hit_tokens counts the
     * part of a hit whose last window has SWA KV; swa_kv_hit_tokens the KV found. */
    uint64_t swa_tokens;          /* SWA slots */
    uint64_t swa_free_tokens;     /* of them, free */
    uint64_t swa_cached_tokens;   /* cached tokens whose SWA KV is still held */
    uint64_t swa_kv_hit_tokens;   /* device KV the matches found */
    uint64_t swa_evicted_tokens;  /* SWA KV freed by the cache while its full KV stayed */
    uint64_t swa_released_tokens; /* SWA KV requests freed as their window moved on */
    uint64_t swa_revived_tokens;  /* SWA tombstones given a request's fresh SWA KV back */
    /* Host copies of recurrent states (all 0 without them; since 0.5). */
    uint64_t mamba_host_slots;      /* how many the host may keep (options.mamba_host_states) */
    uint64_t mamba_host_states;     /* of them, held */
    uint64_t mamba_saved_states;    /* states copied to the host as they left the device */
    uint64_t mamba_restored_states; /* host copies brought back onto the device */
    uint64_t mamba_stored_states;   /* checkpoints written to the store below (disk, remote) */
    uint64_t mamba_fetched_states;  /* states read back from it with their KV */
    /* The remote tier (options.remote; all 0 without one; since 0.5), counted apart from the
     * disk: with both, disk_hit_tokens, disk_read_tokens, disk_written_tokens and disk_errors
     * count the disk alone and these the remote server(s); with a remote alone, these count it
     * and those are 0. disk_tokens, disk_cached_tokens, disk_read_bytes, disk_written_bytes and
     * disk_ops_in_flight still cover the stores below the host together. */
    uint64_t remote_hit_tokens;     /* tokens found on the remote past the host and disk */
    uint64_t remote_read_tokens;    /* tokens read remote -> host, checked */
    uint64_t remote_written_tokens; /* tokens the remote kept (SET answered, or there already) */
    uint64_t remote_errors;         /* failed checks, refused or failed commands, dead servers */
};

typedef struct kvt_engine kvt_engine;

/* The version of the library linked (which may differ from the KVT_VERSION_* this header
 * gives), as "major.minor.patch"; a static string. Each pointer may be NULL. */
const char *kvt_version(int *major, int *minor, int *patch);

/* Fill *opts with defaults and set opts->size = size, where size is sizeof(struct
 * kvt_options) as the caller was compiled: a caller built against an older, smaller struct
 * gets only its size bytes written; a newer, larger one gets zeros past this library's
 * fields. Does nothing when opts is NULL or size is less than sizeof(size_t). */
void kvt_options_init(struct kvt_options *opts, size_t size);

/* Open an engine: allocate the KV pool, allocator, request pool and prefix cache. On success
 * *out owns them until kvt_close. Options are validated: a zero or inconsistent geometry, a
 * page_size that is not a power of two up to 256, an unknown enum value, or non-zero bytes past
 * the end of the options this library knows give -EINVAL. A smaller opts->size (a caller built
 * against an older header) is accepted: each field wholly inside it is read, the others take
 * their defaults; a size below sizeof(size_t) is -EINVAL. *out is NULL on failure. Errors:
 * -EINVAL (bad options, NULL out), -ENOMEM, KVT_ENOBACKEND, KVT_EBACKEND, KVT_EHOSTRAM,
 * KVT_EHOSTSIZE; with a disk tier KVT_EFORMAT, KVT_EFINGERPRINT, -EBUSY (another process has
 * the dir, or a page store of this process has it open: kvtier_store.h) and -errno of the file
 * system; with a stats socket -EADDRINUSE, -ENAMETOOLONG and -errno of the socket calls. Blocks:
 * allocates and pins memory, opens (and may create) the data dir, starts threads. */
int kvt_open(const struct kvt_options *opts, kvt_engine **out);

/* Free everything the engine owns. NULL is a no-op.
 * Blocks: until every transfer and disk op in flight has landed. */
void kvt_close(kvt_engine *e);

/* A static string naming err (an errno value, negated or not, or a KVT_E* code). */
const char *kvt_strerror(int err);

/* Tokens of KV a budget of bytes holds for geometry g with page_size, after the padding
 * page, aligned down to page_size. 0 when the budget is too small or the input invalid. */
uint64_t kvt_max_tokens(const struct kvt_geometry *g, uint32_t page_size, uint64_t bytes);

/* KV bytes per token for geometry g over all its layers; 0 for an invalid geometry. */
uint64_t kvt_cell_bytes(const struct kvt_geometry *g);

/* The store page size (tokens) kvt_open takes for o when it opens a disk or remote tier:
 * o->store_page_tokens when set, else the one chosen by bytes; 0 for options kvt_open
 * refuses with -EINVAL. (A dir written before 0.9 with pages of page_size is opened with
 * those; see kvt_options.store_page_tokens.) Since 0.9. */
uint32_t kvt_store_page_tokens(const struct kvt_options *o);

/* Copy the engine's 32-byte fingerprint (model id, geometry, page size, TP, hash version).
 * out NULL: nothing; e NULL: 32 zero bytes. */
void kvt_fingerprint(const kvt_engine *e, uint8_t out[32]);

/* Fill *st. st->size is set by the caller to sizeof(struct kvt_stats) as it was compiled: an
 * older, smaller struct gets the fields it has, a newer, larger one zeros past this library's.
 * On return st->size is the number of bytes filled, the smaller of the two sizes. The figures
 * are those of now; nothing is polled. Errors: -EINVAL (NULL, st->size < sizeof(size_t)). */
int kvt_stats(const kvt_engine *e, struct kvt_stats *st);

/* ---- prefix cache ---- */

/* Find the longest cached prefix of key, in whole pages. When slots is not NULL it receives
 * the device slots of that prefix (it must hold key->len entries); their bytes may still be
 * landing (m->load_op says). May split a node so the prefix ends on a node boundary;
 * refreshes access times and hit counts on the path. The slots are valid only while the
 * prefix stays cached: lock m->last_node before any later call that may evict.
 * Errors: -EINVAL (key empty, longer than max_context, tokens NULL, ns_len > KVT_NS_MAX),
 * -ENOMEM (a split found no memory), KVT_EBACKEND.
 * Blocks: with a disk tier it reads the disk index (LMDB) past the host part; under
 * write_through_selective a hit may start a backup, which may evict host pages (see the
 * conventions). It never waits for a load: m->load_op names it. With recurrent layers
 * (options.mamba) the prefix ends at the deepest checkpoint on the KV found, as kvt_req_begin
 * would serve it. */
int kvt_match(kvt_engine *e, const struct kvt_key *key, int32_t *slots, struct kvt_match *m);

/* Insert key (key->len a multiple of page_size) with the device slots of its tokens. The
 * part already cached is left as it is and its length is stored in *prefix_len: the caller
 * still owns its own slots for that part and frees those it allocated. Slots past the cached
 * part pass to the prefix cache; they must be allocated, not cached, page-aligned runs.
 * Errors: -EINVAL (key as kvt_match, or not whole pages; slots NULL, not page runs, or past
 * the cached part not held by the caller or named twice; prefix_len NULL), -ENOMEM (tree
 * memory), -EUCLEAN.
 * Blocks: under write_through it starts a backup (see the conventions); a key that runs into
 * a disk read still filling the host tier waits for the disk tier's ops in flight. */
int kvt_insert(kvt_engine *e, const struct kvt_key *key, const int32_t *slots, int32_t priority,
               size_t *prefix_len);

/* Lock a node and its ancestors against eviction (lock refs are counted). -EINVAL for a ref
 * that is stale (see kvt_node_ref), forged or 0. */
int kvt_lock(kvt_engine *e, kvt_node_ref node);

/* Drop one lock ref from node and its ancestors; -EINVAL if node is not locked. The root
 * (the last node of an empty match) counts as always locked: both calls on it do nothing. */
int kvt_unlock(kvt_engine *e, kvt_node_ref node);

/* Evict at least tokens tokens of unlocked leaves by the eviction policy (fewer if not
 * enough are evictable), freeing their slots. *evicted (may be NULL) gets the count. Nodes
 * with a host copy keep it. With sliding-window layers it makes kvt_available grow by tokens
 * instead: full KV (with its SWA KV) goes where the full side is short of that, SWA KV alone
 * (SWA tombstones, least recently covered first) where only the SWA side is; *evicted counts
 * the full KV. Errors: -EINVAL (e NULL).
 * Blocks: applies finished transfers; when nodes a transfer is filling stand in the way, waits
 * for the transfers in flight (kvt_sync); under write_back it backs leaves up and waits for
 * those backups before they go. */
int kvt_evict(kvt_engine *e, size_t tokens, size_t *evicted);

/* ---- device slot allocator ---- */

/* Allocate n slots (n a multiple of page_size, 0 included: nothing is allocated and slots
 * may be NULL) as whole pages. Does not evict: -ENOMEM (changing nothing) when fewer are
 * free; make room with kvt_evict. Errors: -EINVAL, -ENOMEM. */
int kvt_alloc(kvt_engine *e, size_t n, int32_t *slots);

/* Free slots the caller allocated: each page named returns once. Slots of pages that are
 * free, cached or out of range give -EINVAL and nothing is freed. Inside a free group the
 * pages are held back until kvt_free_group_end, and so are pages eviction frees meanwhile:
 * kvt_alloc_extend, kvt_alloc_decode and load-backs do not evict inside a group. slots may be
 * NULL when n is 0.
 * Errors: -EINVAL; begin inside a group and end outside one are -EINVAL too. */
int kvt_free(kvt_engine *e, const int32_t *slots, size_t n);
int kvt_free_group_begin(kvt_engine *e);
int kvt_free_group_end(kvt_engine *e);

/* Slots for extending batch requests (0: nothing to do, out_len 0) from prefix_lens[i] to
 * seq_lens[i] tokens, each seq_lens[i] > prefix_lens[i] and at most max_context. last_locs[i]
 * is the slot of token prefix_lens[i]-1 (-1 when the prefix is empty). out receives, request
 * after request, the slots of the new tokens: the rest of the last partial page, then whole
 * new pages, then a new partial page. out_len must be the sum of the extensions. Short of
 * free pages, it evicts unlocked device leaves for the shortfall, but only when eviction can
 * cover it: -ENOMEM has evicted nothing. Errors: -EINVAL (bad lengths, a last_loc not at the
 * prefix's end or in a page the caller does not hold, out_len), -ENOMEM.
 * Blocks: when it evicts, as kvt_evict. */
int kvt_alloc_extend(kvt_engine *e, size_t batch, const uint32_t *prefix_lens,
                     const uint32_t *seq_lens, const int32_t *last_locs, int32_t *out,
                     size_t out_len);

/* One slot per request (batch 0: nothing to do) for decoding token seq_lens[i]-1:
 * last_locs[i]+1 inside a page, the first slot of a new page at a page boundary. Evicts as
 * kvt_alloc_extend does. Errors: -EINVAL, -ENOMEM. Blocks: when it evicts, as kvt_evict. */
int kvt_alloc_decode(kvt_engine *e, size_t batch, const uint32_t *seq_lens,
                     const int32_t *last_locs, int32_t *out);

/* Slots the allocator can hand out now (pages held in a free group are not counted). */
size_t kvt_available(const kvt_engine *e);

/* ---- KV data ---- */

/* Copy n token rows of layer between the pool and host buffers. For MHA, k and v hold n rows
 * of kv_heads x head_dim (v: v_head_dim) elements; for MLA, k holds n rows of kv_lora_rank +
 * qk_rope_head_dim elements and v must be NULL. Slots are any rows of the pool (ownership is
 * not checked). Errors: -EINVAL (layer, a slot outside the pool, k NULL, v given or not as the
 * attention kind wants), KVT_EBACKEND (cuda copy failed). On cuda, slots of more than one
 * run cross through a staging buffer of up to 32 MiB on the device (one per KV pool: two with
 * sliding-window layers), taken at the first such call and kept until kvt_close; a slot named
 * twice in one write then gets one of its rows, not necessarily the last.
 * Blocks: the copy is synchronous (cuda: until the bytes have landed). */
int kvt_kv_write(kvt_engine *e, uint32_t layer, const int32_t *slots, size_t n, const void *k,
                 const void *v);
int kvt_kv_read(kvt_engine *e, uint32_t layer, const int32_t *slots, size_t n, void *k, void *v);

/* The device address of a layer's K (which 0) or V (which 1; MHA only) buffer and its row
 * size in bytes, for the caller's attention kernels. Valid until kvt_close. Errors: -EINVAL. */
int kvt_kv_buffer(kvt_engine *e, uint32_t layer, int which, void **ptr, size_t *row_bytes);

/* ---- requests ---- */

/* Start a request: take a request slot, match key (which may be empty), lock the match and
 * write its slots into the request's req_to_token row. *req is filled; the cached prefix
 * length is req->protected_len. -ENOMEM when no request slot is free.
 * With a host tier, pages found only on the host past the device prefix (at least
 * load_back_min tokens of them) are loaded back: device slots are allocated for them
 * (evicting if needed), the load starts, they join the protected prefix (req->loaded_len
 * tokens) and req->load_op names the load. Before its forward reads layer l, the caller
 * waits with kvt_load_wait_layer(e, req->load_op, l, stream). load_op is also set when
 * the device prefix is still being filled by another request's load. When the device has
 * no room even after eviction, the host part is left to be recomputed and nothing is evicted.
 * Errors: -EINVAL (key as kvt_match, but may be empty; req NULL), -ENOMEM (no request slot,
 * or a split found no memory), KVT_EBACKEND.
 * Blocks: a load-back may evict (as kvt_evict). With a disk tier the part only the disk holds
 * is read to the host first: prefetch_policy wait_complete waits for that read, timeout waits
 * up to prefetch_timeout_ms, best_effort does not wait; the read may need host room (see the
 * conventions). With recurrent layers (options.mamba) the prefix is cut to the deepest
 * checkpoint on it and the request gets two state slots (kvt_req_mamba): -ENOMEM also when
 * no two can be had after evicting unlocked checkpoints. */
int kvt_req_begin(kvt_engine *e, const struct kvt_key *key, struct kvt_req *req);

/* Write n slots into the request's req_to_token row from position start; start may not be
 * past the entries written so far (no holes). Errors: -EINVAL (req not live, past
 * max_context, a hole, slots NULL with n > 0). */
int kvt_req_write(kvt_engine *e, const struct kvt_req *req, size_t start, const int32_t *slots,
                  size_t n);

/* Read n slots of the request's req_to_token row from position start. Errors: -EINVAL (req
 * not live, past max_context, out NULL with n > 0). */
int kvt_req_read(const kvt_engine *e, const struct kvt_req *req, size_t start, size_t n,
                 int32_t *out);

/* Chunked prefill boundary: insert the whole pages of key (the tokens filled so far, whose
 * slots are in req_to_token), free the request's duplicates of pages the cache already had,
 * re-match, point req_to_token at the cached slots, and move the lock to the new last node.
 * req->load_op grows when the cached slots are another request's load still landing.
 * Errors: -EINVAL (req not live or not as kvt_req_begin left it, key shorter than the
 * protected prefix or longer than the row, a slot of the key's part not the caller's),
 * -ENOMEM (tree memory), -EUCLEAN. Blocks: as kvt_insert.
 * With recurrent layers the key is inserted only up to the state recorded in the track slot
 * (kvt_req_mamba_track), which the cache takes there (a fresh track slot takes its place;
 * -ENOMEM when none can be had); without one nothing is inserted. */
int kvt_req_cache_unfinished(kvt_engine *e, struct kvt_req *req, const struct kvt_key *key);

/* Finish a request: insert the whole pages of key (its committed tokens) with priority,
 * unlock, release the request slot, and free every slot the request's row holds past the
 * protected prefix that did not pass to the cache: duplicates of pages the cache already had,
 * the key's partial tail page, and slots written past key->len (allocated for tokens that
 * were not committed). With insert 0 nothing is inserted and every slot past the protected
 * prefix is freed. key must cover the protected prefix and no more than the row holds, and
 * the row past the protected prefix must be whole pages then at most one partial page, each
 * held by the caller and none named twice (-EINVAL otherwise: rewrite bad entries with
 * kvt_req_write). A request that allocated nothing is released with key->len ==
 * req->protected_len (0 when nothing matched). On success req is dead (pool_idx -1).
 * Errors: -EINVAL, -ENOMEM (tree memory), -EUCLEAN. Blocks: as kvt_insert.
 * With recurrent layers the key is inserted only up to the state recorded in the track slot
 * (none: nothing is inserted), the cache takes that state, and the request's slots go. */
int kvt_req_cache_finished(kvt_engine *e, struct kvt_req *req, const struct kvt_key *key,
                           int32_t priority, int insert);

/* Request slots free now. */
size_t kvt_req_available(const kvt_engine *e);

/* ---- hybrid models: Mamba states (options.mamba; since 0.4) ----
 * On an engine with recurrent layers a prefix is worth reusing only up to a position where
 * the cache kept the recurrent state. kvt_req_begin then serves the prefix up to the deepest
 * checkpoint on the KV it matched (protected_len), copies that state into the request's own
 * slot (copy on write: the cached state stays as it was), and the request recomputes from
 * there. The request leaves states for the cache through its track slot: its forward writes
 * the state at a checkpoint position there (or the engine copies the running slot there,
 * kvt_req_mamba_track), and the next kvt_req_cache_unfinished or kvt_req_cache_finished
 * inserts the key up to that position, no further, and hands the state to the node ending
 * it. kvt_match reports the same state-backed prefix as device_len. kvt_insert inserts KV
 * without a state. Unlocked checkpoints are evicted, least recently used first, when a
 * request needs state slots; a checkpoint also goes when its node loses its KV. */

struct kvt_req_mamba {
    int32_t slot;         /* the state slot the request runs in (kvt_mamba_buffer): after
                             kvt_req_begin a copy of the state at protected_len, zeros when
                             nothing was matched */
    int32_t track_slot;   /* where the forward leaves the state at a checkpoint position */
    size_t kv_len;        /* device KV the match found; protected_len, the part a state
                             backs, may be shorter */
    size_t branch_len;    /* kv_len rounded down to grid when that lies past protected_len: a
                             checkpoint there in the prefill gives the next request on this
                             prefix all of the KV; 0: none */
    size_t track_len;     /* the position of the state in track_slot; 0: none recorded */
    uint32_t grid;        /* prefill checkpoints at multiples of this: lcm(chunk, page_size) */
    uint32_t decode_grid; /* decode checkpoints at multiples of this (track_interval) */
};

/* The Mamba side of a live request. Errors: -EINVAL (no recurrent layers, req not live, m
 * NULL). */
int kvt_req_mamba(const kvt_engine *e, const struct kvt_req *req, struct kvt_req_mamba *m);

/* Record that the request's track slot holds the state after its first len tokens: len a
 * multiple of grid, past protected_len, within what its row holds. With copy 1 the engine
 * first copies the running slot into the track slot (the forward stopped at len); with 0 the
 * caller's forward wrote it there. A later record replaces an earlier one.
 * Errors: -EINVAL (as kvt_req_mamba, or len not as said), KVT_EBACKEND (the copy failed).
 * Blocks: with copy, until the copy is done. */
int kvt_req_mamba_track(kvt_engine *e, const struct kvt_req *req, size_t len, int copy);

/* Copy one recurrent layer's conv (part 0) or SSM (part 1) state of slot between the pool and
 * buf (conv_bytes or ssm_bytes). Writes go to a request's slot (running or track), reads also
 * to the cache's checkpoints. Errors: -EINVAL (no recurrent layers, layer, part, a slot that
 * is free or, for a write, the cache's; buf NULL), KVT_EBACKEND. Blocks: until copied. */
int kvt_mamba_write(kvt_engine *e, int32_t slot, uint32_t layer, int part, const void *buf);
int kvt_mamba_read(kvt_engine *e, int32_t slot, uint32_t layer, int part, void *buf);

/* The device address of a recurrent layer's conv (part 0) or SSM (part 1) buffer, slot s at
 * ptr + s * slot_bytes, for the caller's kernels. Valid until kvt_close. Errors: -EINVAL. */
int kvt_mamba_buffer(kvt_engine *e, uint32_t layer, int part, void **ptr, size_t *slot_bytes);

/* ---- hybrid models: sliding-window layers (options.swa; since 0.4) ----
 * Slots are full-attention slots throughout the API; each maps to an SWA slot holding its
 * sliding-window layers' KV while that is kept. kvt_alloc, kvt_alloc_extend and
 * kvt_alloc_decode hand out both, kvt_free frees both, kvt_kv_write and kvt_kv_read take a
 * model layer and go through the map (-ENOENT for a slot whose SWA KV was freed, nothing
 * moved), kvt_kv_buffer gives a sliding-window layer's buffer in the SWA pool. kvt_match and
 * kvt_req_begin serve a prefix only up to where its last window (or the whole prefix, when
 * shorter) still has SWA KV; the cache frees SWA KV alone when the SWA pool is short. */

/* The request has seq_len tokens: free the SWA KV of its own slots that its window has left
 * (SGLang's free_swa_out_of_window_slots), in whole pages, keeping a whole window (at least a
 * page) so that a key ending on a page boundary can still be cached with one. Call it as
 * decode moves on; kvt_req_cache_unfinished and kvt_req_cache_finished insert those pages as
 * SWA tombstones. Errors: -EINVAL (no sliding-window layers, req not live, seq_len past what
 * its row holds). */
int kvt_req_swa_slide(kvt_engine *e, const struct kvt_req *req, size_t seq_len);

/* Each full slot's SWA slot for a sliding-window layer's kernel (the row in kvt_kv_buffer's
 * buffer), 0 where its SWA KV was freed, -1 for -1. Errors: -EINVAL (no sliding-window
 * layers, a slot outside the pool, NULL with n > 0). */
int kvt_swa_translate(const kvt_engine *e, const int32_t *slots, size_t n, int32_t *swa_slots);

/* ---- host tier ---- */

/* Make the caller wait until layer of load op (kvt_req.load_op) has landed on the device.
 * sim: blocks the calling thread. cuda: makes stream (a cudaStream_t; NULL: the legacy
 * default stream) wait for the layer, and returns at once. op 0, or an op already done,
 * returns at once. KVT_EBACKEND when the load failed: the prefix must not be used.
 * Errors: -EINVAL (layer out of range, an op never issued), KVT_EBACKEND.
 * Blocks: sim, until the layer has landed. */
int kvt_load_wait_layer(kvt_engine *e, uint64_t op, uint32_t layer, void *stream);

/* Apply up to max finished transfers and disk ops together (0: all) to the prefix cache:
 * backups become host copies, loads release their pages for eviction, disk writes and reads
 * land. *applied (may be NULL) gets the count. The embedding cache's finished reads and
 * writes are applied too (all of them; not counted).
 * Call once per scheduler step; the engine also polls when it needs room. KVT_EBACKEND once
 * any transfer failed (a CUDA error): from then on the engine refuses to serve; close it.
 * Errors: -EINVAL (e NULL), KVT_EBACKEND. Never waits; applied backups may start disk
 * writes. */
int kvt_poll(kvt_engine *e, size_t max, size_t *applied);

/* Wait for every transfer and disk op in flight and apply them all: afterwards nothing is
 * pending (the embedding cache's reads and writes included), and the records of pages that
 * reads found bad are dropped from the disk tier.
 * Errors: -EINVAL (e NULL), KVT_EBACKEND. Blocks: until all of it has landed. */
int kvt_sync(kvt_engine *e);

/* ---- disk tier ---- */

/* Start reading the part of key's prefix that only the disk tier holds into the host tier,
 * without waiting (call it when a request is queued; kvt_req_begin then finds the pages on
 * the host, or waits for them per prefetch_policy). *tokens (may be NULL) gets how many
 * tokens are being read: the leading pages the disk tier found and has on their way, which
 * nothing evicts before they land (a page failing its checksum still ends the prefix there);
 * 0 when there is nothing to read, it is shorter than prefetch_min, a read of it is already
 * under way, or the host tier has no room.
 * Errors: -EINVAL (key as kvt_match), -ENOMEM (a split found no memory), KVT_EBACKEND.
 * Blocks: it reads the disk index; a device-only prefix before the disk part is backed up to
 * the host first, and room on the host may be made (see the conventions). */
int kvt_prefetch(kvt_engine *e, const struct kvt_key *key, size_t *tokens);

/* ---- multimodal embeddings (options.emb_device_bytes; since 0.9) ----
 * A vision-language model runs its encoder over each image (video frame, audio clip) of a
 * request and puts the embedding it gives in place of the image's tokens. The embedding
 * cache keeps those outputs by the item's hash (SGLang's mm_hash: a hash of the item's
 * content), so a repeated image is not encoded again: in device memory up to
 * emb_device_bytes, least recently used out first; below it, when configured, in host memory
 * (emb_host_bytes), in the engine's disk tier (surviving restarts) and in its remote tier
 * (shared between engines). An embedding is a blob of bytes of any size up to the device
 * budget; the cache never looks inside.
 *
 * The prefix cache needs nothing of it: an image's tokens in a key are pad tokens that name
 * the image (kvt_emb_pad_tokens), so prefixes with different images part there, and the same
 * image after the same text shares its KV like any text (docs/design.md discusses pad values
 * and their collisions).
 *
 * Holds: an embedding a caller holds (kvt_emb_fetch, kvt_emb_put with a struct kvt_emb) is
 * never evicted from the device and its device address stays valid until it is released
 * (kvt_emb_release, or a failed kvt_emb_wait). Each hold is released once. Embeddings are
 * named by namespace as keys are (LoRA id, cache_salt): the same hash in two namespaces names
 * two embeddings. Every call here follows the owner-thread rule of the engine. */

#define KVT_EMB_HASH_BYTES 32

/* An embedding's name: the item's hash in a namespace. The caller's bytes need to live only
 * for the call. */
struct kvt_emb_key {
    const uint8_t *hash; /* KVT_EMB_HASH_BYTES bytes: the item's content hash */
    const void *ns;      /* namespace bytes as kvt_key's; NULL or ns_len 0: the default one */
    size_t ns_len;       /* at most KVT_NS_MAX */
};

/* Where an embedding was found. */
enum kvt_emb_tier {
    KVT_EMB_DEVICE = 0,
    KVT_EMB_HOST = 1,
    KVT_EMB_DISK = 2,
    KVT_EMB_REMOTE = 3,
};

/* A held embedding, filled by kvt_emb_fetch and kvt_emb_put. */
struct kvt_emb {
    uint64_t handle; /* names the hold; 0: none (released, or a failed wait) */
    uint64_t op;     /* the read bringing it onto the device (kvt_emb_wait); 0: it is there */
    void *ptr;       /* its device address, len bytes; NULL while op is not 0 */
    size_t len;      /* its bytes; 0 while op is not 0 */
    uint32_t tier;   /* enum kvt_emb_tier it came from (disk or remote: the read's, once
                        waited for) */
};

/* Cache the len bytes at buf (host memory) as the embedding named by key: copied onto the
 * device, evicting unheld embeddings least recently used first, then, when configured, to
 * the host and written to the disk and remote tiers (asynchronously; a write that fails
 * costs only later hits). An embedding the device has already is left as it is (its bytes
 * are not compared: a hash names one content) and becomes the most recent. With held not
 * NULL the embedding is also held (as kvt_emb_fetch would). One larger than the whole device
 * budget is refused and evicts nothing, as SGLang refuses it.
 * Errors: -EINVAL (no embedding cache, key or its hash NULL, ns_len > KVT_NS_MAX, buf NULL,
 * len 0), -E2BIG (len > emb_device_bytes), -ENOMEM (held embeddings leave no room, or no
 * memory: nothing was evicted), -EBUSY (the embedding is being read from below: wait for it
 * with kvt_emb_fetch's op instead), KVT_EBACKEND (the copy to the device failed).
 * Blocks: copies to the device and the host (synchronous). */
int kvt_emb_put(kvt_engine *e, const struct kvt_emb_key *key, const void *buf, size_t len,
                struct kvt_emb *held);

/* Find the embedding named by key, nearest tier first, and hold it on the device: out->tier
 * says where it was. From the device it is there at once (op 0); from the host it is copied
 * up (op 0); from the disk or remote tier a read starts (out->op): wait for it with
 * kvt_emb_wait before using it. It is then the most recent embedding. A read of the same
 * embedding already under way is joined (the same op).
 * Errors: -EINVAL (as kvt_emb_put's key; out NULL), -ENOENT (not cached in any tier: encode
 * the item and kvt_emb_put it), -ENOMEM (no room on the device for it: held embeddings fill
 * it, or no memory; nothing was evicted), -EIO (the store below refused the read: a miss),
 * KVT_EBACKEND (the copy from the host failed).
 * Blocks: the copy from the host; with a disk or remote tier it reads their index (LMDB, a
 * round trip to the server) when the device and host do not have it. */
int kvt_emb_fetch(kvt_engine *e, const struct kvt_emb_key *key, struct kvt_emb *out);

/* Wait up to timeout_ms (negative: no limit; 0: do not wait) for emb's read: 0 when it is on
 * the device (emb->ptr, emb->len, emb->tier set, op 0); at once when there was none.
 * A read that found the embedding damaged or incomplete is a miss: the hold is gone
 * (emb->handle 0, nothing to release) and it returns -ENOENT (a chunk missing),
 * KVT_ECORRUPT (it failed its checks) or -EIO: encode the item and put it.
 * Errors: -EINVAL (e or emb NULL, no embedding cache, not a held embedding), -ETIMEDOUT (not
 * landed yet: wait again), the misses above, KVT_EBACKEND (the copy to the device failed:
 * a miss too). Blocks: up to timeout_ms. */
int kvt_emb_wait(kvt_engine *e, struct kvt_emb *emb, int timeout_ms);

/* Let go of a hold: the embedding may be evicted from then on (a read still under way lands
 * all the same). emb->handle becomes 0. Errors: -EINVAL (e or emb NULL, no embedding cache,
 * not a held embedding). */
int kvt_emb_release(kvt_engine *e, struct kvt_emb *emb);

/* Copy n bytes of a held embedding from offset into buf (host memory): for a caller that
 * cannot read device memory itself, and for checks. Errors: -EINVAL (as kvt_emb_release;
 * buf NULL with n > 0; past its end), -EAGAIN (its read has not landed: kvt_emb_wait first),
 * KVT_EBACKEND. Blocks: until copied. */
int kvt_emb_read(kvt_engine *e, const struct kvt_emb *emb, size_t offset, void *buf, size_t n);

/* Where the embedding named by key is, without moving or refreshing it: 0 with *tier (enum
 * kvt_emb_tier, the nearest) and *len (its bytes; 0 when only the disk or remote tier has it,
 * whose head has not been read; either may be NULL), or -ENOENT. The disk and remote tiers
 * answer from their index: a read of what they report may still miss.
 * Errors: -EINVAL (as kvt_emb_put's key), -ENOENT, -ENOMEM. Blocks: as kvt_emb_fetch's index
 * look. */
int kvt_emb_lookup(kvt_engine *e, const struct kvt_emb_key *key, uint32_t *tier, size_t *len);

/* Drop the embedding named by key from the device and the host (SGLang's free); the disk and
 * remote tiers keep theirs. Errors: -EINVAL (as kvt_emb_put's key), -ENOENT (neither has
 * it), -EBUSY (held, or a read or write of it is under way). */
int kvt_emb_drop(kvt_engine *e, const struct kvt_emb_key *key);

struct kvt_emb_stats {
    size_t size;           /* set by the caller to sizeof(struct kvt_emb_stats) */
    uint64_t device_bytes; /* the device budget (emb_device_bytes) */
    uint64_t device_used;  /* bytes of it in use (whole units of 256 bytes) */
    uint64_t device_embeddings;
    uint64_t held;       /* embeddings held now */
    uint64_t host_bytes; /* the host budget (emb_host_bytes) */
    uint64_t host_used;  /* bytes of it in use (whole 4 KiB units) */
    uint64_t host_embeddings;
    uint64_t puts;           /* kvt_emb_put calls that cached an embedding anew */
    uint64_t put_bytes;      /* their bytes */
    uint64_t put_present;    /* puts of an embedding the device had */
    uint64_t refused;        /* puts refused: larger than the device budget, or no room */
    uint64_t fetches;        /* kvt_emb_fetch calls */
    uint64_t hits[4];        /* by enum kvt_emb_tier: fetches served from there (disk and
                                remote once their reads landed whole) */
    uint64_t misses;         /* fetches that found nothing, and reads that missed */
    uint64_t read_errors;    /* reads that found a damaged or incomplete embedding */
    uint64_t evicted_device; /* embeddings evicted from the device */
    uint64_t evicted_host;   /* from the host */
    uint64_t stored;         /* embeddings written whole to the disk or remote tier */
    uint64_t store_errors;   /* writes that failed (a chunk not kept) */
    uint64_t ops_in_flight;  /* reads and writes not yet landed */
};

/* Fill *st (st->size bytes of it, as kvt_stats). Errors: -EINVAL (NULL, st->size <
 * sizeof(size_t), no embedding cache). */
int kvt_emb_stats(const kvt_engine *e, struct kvt_emb_stats *st);

/* The n pad tokens of an item whose hash is hash (KVT_EMB_HASH_BYTES), for its place in a
 * key: token i is 0x80000000 | bits 0..30 of the hash's little-endian u32 word i mod 8. They
 * lie above every vocabulary (bit 31 set), and any 8 in a row carry 248 bits of the hash, so
 * a page of the prefix cache holding 8 of them names the item, not only its first 30 bits
 * (SGLang's pad value before 0.5: hash mod 2^30, one value repeated). Does nothing when hash
 * or tokens is NULL. */
void kvt_emb_pad_tokens(const uint8_t *hash, uint32_t *tokens, size_t n);

/* How much of a cached prefix of matched tokens (kvt_match's device, host and disk parts
 * together) a request may use when its key holds items whose pad tokens start at starts[0 ..
 * n): matched, cut back to the last page boundary at or before an item's start wherever it
 * would end fewer than 8 tokens into that item. Such a page holds only the item's first k < 8
 * pad tokens, which name it by 31 k bits: two items agreeing on those bits would share that
 * page's KV. A caller that matches first (kvt_match) and passes kvt_req_begin the key cut to
 * this length never shares KV on less than 248 bits of an item's hash. page_size 0 or starts
 * NULL with n > 0: 0. */
size_t kvt_emb_prefix_limit(const size_t *starts, size_t n, size_t matched, uint32_t page_size);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_H */
