"""kvtier for Python: the page store (kvtier's disk tier on its own) and the engine's multimodal
embedding cache.

A PageStore is a data dir of whole KV pages named by 32-byte keys, in the format of the
engine's disk tier (slab files, checksummed page heads, an LMDB index), so kvtier-ctl reads,
checks and repairs it. Every page read is checked: a damaged page is a miss, never wrong
bytes. The dir remembers the fingerprint it was opened with (bytes naming the model, weights
revision, dtype, layout, TP rank) and refuses any other.

    import ctypes, kvtier
    with kvtier.PageStore("/data/kv", b"model=m/dtype=bf16/tp=0", page_bytes=4096) as s:
        page = ctypes.create_string_buffer(b"x" * 4096, 4096)
        key = bytes(32)
        s.set([key], [ctypes.addressof(page)])          # zero-copy, from an address
        assert s.exists([key]) == 1
        out = bytearray(4096)
        assert s.get_into([key], [out]) == [0]          # or into a buffer

PageStore(dir, fingerprint, page_bytes, *, page_tokens=0, capacity=1 << 30,
          disk_io="auto", read_only=False, sync="durable", remote=None,
          remote_timeout_ms=0, remote_ttl_s=0, page_cache=True)
    remote="redis://host:6379" (or a cluster's seeds, or rediss:// for TLS): a shared server
    below the disk; a set writes both, a get reads the disk or, where it lacks the page, the
    server (checked), and exists asks the server for what the disk lacks (at most
    remote_timeout_ms, default 1000). A server that is down or hung costs only hits.
    sync="relaxed": set returns once pages are written and indexed; data and index are
    flushed every second or 256 MiB and at close (a power cut may lose the pages written
    since: each then a miss, never wrong bytes).
    page_cache=True: pages above 128 KiB are written through the page cache and read from it
    while it holds them (else with O_DIRECT); False: O_DIRECT only, no second copy in memory.
    .page_bytes, .dir, .closed                  read-only properties
    .exists(keys) -> int                        the leading run of keys that are stored
    .exists_local(keys) -> int                  the same on the disk alone (no network)
    .get(keys, ptrs, sizes=None, segs_per_page=1) -> list[int]
    .set(keys, ptrs, sizes=None, segs_per_page=1, parent=None) -> list[int]
        Zero-copy through int addresses: page i's segments are
        ptrs[i*segs_per_page:(i+1)*segs_per_page], sizes alike (None: one segment of
        page_bytes a page); a page's sizes add up to page_bytes. parent: the key of the
        page before keys[0] (page i's is keys[i-1]), or a list of one parent a page (a key,
        or None for a page that starts a sequence).
    .get_into(keys, buffers) -> list[int]       one writable buffer of page_bytes a page
    .set_from(keys, buffers, parent=None) -> list[int]
    .submit_get / .submit_set / .submit_get_into / .submit_set_from(...) -> int op id
    .wait(op, timeout_ms=-1) -> list[int]       TimeoutError if not done (wait again)
    .event_fd() -> int                          readable when a submitted op completes
    .touch(keys) -> int                         count pages as used now (eviction order)
    .delete(keys) -> int, .clear(), .stats() -> dict, .close(); a context manager

keys: bytes of n*32 bytes, or a sequence of 32-byte bytes-like keys. Per-page results:
0, -errno.ENOENT (not stored), ECORRUPT (failed its checks; dropped), -errno.EIO, and for
set -errno.ENOSPC. A call that fails as a whole raises Error (an OSError: .code is the
negative code, e.g. EFINGERPRINT; .errno is -code; .strerror kvtier's text); bad arguments
raise ValueError or TypeError before any I/O. The GIL is released inside every call, and
a store may be used from several threads at once.

EmbeddingCache(device_bytes, *, host_bytes=0, dir=None, disk_bytes=1 << 30, remote=None,
               chunk_bytes=262144, model_id="", store=True)
    The engine's multimodal embedding cache (vision-encoder outputs by 32-byte item hash):
    device_bytes of device memory (host memory in this build), least recently used out
    first; host_bytes of host memory below it; a data dir (dir: across restarts, every read
    checked) and a Redis server (remote) below that, in chunks of chunk_bytes.
    .put(hash, data, ns=b"") -> bool            False when not cached (no room, too large)
    .get(hash, ns=b"") -> bytes | None          from the nearest tier; None on a miss
    .get_into(hash, out, ns=b"") -> int | None  into a writable buffer
    .fetch(hash, ns=b"") -> Embedding | None    a hold: .wait(timeout_ms), .ready, .nbytes,
                                                .ptr, .tier, .read_into(out), .release(); its
                                                bytes through the buffer protocol, no copy
    .lookup(hash, ns=b"") -> (tier, length) | None, .drop(hash, ns=b"") -> bool,
    .stats() -> dict, .close(); a context manager
kvtier.mm.MultimodalCache puts SGLang's multimodal cache interface on one.
"""
from ._native import (ECORRUPT, EFINGERPRINT, EFORMAT, KEY_BYTES, Embedding, EmbeddingCache,
                      Error, PageStore)

__all__ = ["PageStore", "EmbeddingCache", "Embedding", "Error", "ECORRUPT", "EFINGERPRINT",
           "EFORMAT", "KEY_BYTES"]
