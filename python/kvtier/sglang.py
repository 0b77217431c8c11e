"""kvtier as SGLang's HiCache L3 storage backend.

Load it with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
        "interface_v1": 1, "hicache_storage_pass_prefix_keys": true,
        "dir": "/var/cache/kvtier", "capacity": "200G"}'

Extra config keys read here: ``dir`` (required: the base data dir; each rank gets its own
directory below it), ``capacity`` (bytes, or a string such as ``"200G"``; default 1 GiB per
rank, for the KV pool), ``pool_capacity`` (a hybrid model's other pools, by SGLang's pool
name: ``{"mamba": "20G"}``; a pool not named gets ``capacity`` scaled by its host pool's bytes
over the KV host pool's), ``weights_revision`` (any string naming the weights: part of the
fingerprint, so pages computed by other weights are never served), ``sync`` (``"relaxed"``,
the default: pages and index flushed every second and at shutdown, as a cache may be: a power
cut costs the pages written since, each then a miss, never wrong bytes; ``"durable"``: a set
returns once its pages are fdatasync'd and indexed), ``disk_io`` (``auto``, ``uring`` or
``psync``), ``interface_v1`` (SGLang's own switch to the zero-copy path for KV
pages; pages stored through one path are never served to the other, as their bytes are laid
out differently). ``hicache_storage_pass_prefix_keys`` is SGLang's: with it, each write names
the page before its first one, which the store keeps as the page's parent.

Hybrid models (Mamba / Gated DeltaNet states, sliding-window KV, sparse indexers, DeepSeek
V4's compressed pools, draft pools) go through SGLang's v2 calls: every host pool SGLang
registers gets a page store of its own (``<rank dir>.<pool name>``) with its own page size
and fingerprint, and batch_exists_v2 reports a prefix restorable only when every pool it needs
holds its pages there, by SGLang's hit policies (all_pages, trailing_pages, block_groups).
A KV host pool that holds no bytes (DeepSeek V4's logical anchor) gets no store: its pages
are all there, empty, and the pools beside it decide what is restorable.

What a dir holds is fixed by a fingerprint made of the model name, the weights revision, the
host pool's class, layout, dtype and geometry, the page size, the path (v1 or copy) and the
rank's place in TP/PP/CP: a dir written by one model, dtype or layout is refused to another
(SGLang's own keys name none of these). Every page read is checked against the checksum
stored with it; a page that fails is a miss.

Errors never leave this class as exceptions once it is registered: a failed call is a miss
(``False``, ``None``, a shorter run or an empty result), logged, so the scheduler keeps running
and recomputes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional

from . import PageStore

try:  # the real base class when SGLang is installed; the same methods otherwise
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:  # pragma: no cover - exercised where sglang is absent
    _Base = object

try:
    from sglang.srt.mem_cache.hicache_storage import PoolName as _PoolName
    from sglang.srt.mem_cache.hicache_storage import PoolTransferResult

    KV_POOL = _PoolName.KV
except Exception:  # pragma: no cover

    @dataclasses.dataclass
    class PoolTransferResult:  # the fields of SGLang's PoolTransferResult
        kv_hit_pages: int
        extra_pool_hit_pages: dict
        restorable_prefix_pages: Optional[List[int]] = None

    KV_POOL = "kv"

try:
    from sglang.srt.observability.metrics_collector import StorageMetrics as _Metrics
except Exception:  # pragma: no cover
    _Metrics = None

logger = logging.getLogger(__name__)

KEY_BYTES = 32
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

# SGLang's hit policies, by value (PoolHitPolicy is a str enum).
ALL_PAGES, TRAILING_PAGES, BLOCK_GROUPS = "all_pages", "trailing_pages", "block_groups"


def parse_bytes(value) -> int:
    """An int, or a string such as "512M" or "200G" (binary units)."""
    if isinstance(value, int):
        return value
    text = str(value).strip().upper().rstrip("B").rstrip("I")
    unit = text[-1:] if text[-1:] in _UNITS and not text[-1:].isdigit() else ""
    number = text[: len(text) - len(unit)] if unit else text
    return int(float(number) * _UNITS[unit])


def key_bytes(key: str) -> bytes:
    """SGLang's page key (64 hex digits of a SHA256) as kvtier's 32-byte key; another
    string is hashed to 32 bytes."""
    if len(key) == 2 * KEY_BYTES:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return hashlib.sha256(key.encode()).digest()


def _value(x) -> str:
    """A PoolName or PoolHitPolicy (str enums) or a plain string, as its value."""
    return str(getattr(x, "value", x))


# ---- SGLang's hit policies, over which pages a pool holds ----


def all_pages_restorable(present: List[bool]) -> set:
    """all_pages: a prefix of p pages needs every one of them."""
    n = present.index(False) if False in present else len(present)
    return set(range(1, n + 1))


def trailing_pages_restorable(present: List[bool], window: int) -> set:
    """trailing_pages: a prefix of p pages needs its last `window` pages (at least one), so
    the prefixes it allows may have holes (states at 2 and 5, not at 3 and 4)."""
    window = max(1, window)
    missing = [0]  # missing[i]: pages absent among the first i
    for p in present:
        missing.append(missing[-1] + (not p))
    return {p for p in range(1, len(present) + 1)
            if missing[p] - missing[max(0, p - window)] == 0}


def block_groups_pages(present: List[bool], block_pages: int, group_pages: int,
                       span_pages: int) -> int:
    """block_groups: the pool's keys come in groups of group_pages, group j standing for the
    span's full pages [j * block_pages, (j + 1) * block_pages); the pool's verdict is the pages
    its leading complete groups cover (at most the span). It never gates the KV hit."""
    if block_pages <= 0 or group_pages <= 0:
        return 0
    groups = 0
    while (groups + 1) * group_pages <= len(present) and all(
            present[groups * group_pages:(groups + 1) * group_pages]):
        groups += 1
    return min(groups * block_pages, span_pages)


class _Indices:
    """Token slots 0 .. n-1 for pools that are not given a torch tensor (tests)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def tolist(self) -> list:
        return list(range(self.n))


def _first_page_indices(page_size: int):
    try:
        import torch

        return torch.arange(page_size, dtype=torch.int64)
    except Exception:
        return _Indices(page_size)


def _buffer_of(obj):
    """(address, nbytes) of a tensor (data_ptr) or a writable/readable buffer object."""
    if hasattr(obj, "data_ptr"):
        if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
            raise ValueError("a page tensor must be contiguous")
        return obj.data_ptr(), obj.numel() * obj.element_size()
    return None, None


def _nbytes(obj) -> int:
    addr, nbytes = _buffer_of(obj)
    return int(nbytes if addr is not None else memoryview(obj).nbytes)


def _host_bytes(pool) -> Optional[int]:
    """Bytes of a host pool's memory, where it says."""
    size, per_token = getattr(pool, "size", None), getattr(pool, "size_per_token", None)
    if isinstance(size, int) and isinstance(per_token, int) and size > 0 and per_token > 0:
        return size * per_token
    return None


def _is_logical(host) -> bool:
    """A KV host pool that holds no bytes (DeepSeek V4's logical anchor, an MLA pool in
    allocator-only mode): it owns the token slots, its side pools carry the data."""
    return hasattr(host, "kv_buffer") and host.kv_buffer is None


class _Pool:
    """One of SGLang's host pools (the KV pool, or one a hybrid model registers through v2)
    and the page store holding its pages. A page is what one key names: page_size host slots
    of the pool, moved in place through the pool's page buffer description (zero-copy) or,
    for a pool without one, as the pool's flat data page. A logical KV pool has no store:
    each of its pages is there, empty, and the pools beside it say what is restorable."""

    def __init__(self, name: str, host, zero_copy: bool, *, read_only: bool,
                 logical: bool = False):
        self.name, self.host, self.zero_copy, self.read_only = name, host, zero_copy, read_only
        self.logical = logical
        self.page_size = int(getattr(host, "page_size", 1) or 1)
        self.dir = self.fingerprint = None
        self.capacity = 0
        self.store: Optional[PageStore] = None
        self.next_open = 0.0
        self.opening = threading.Lock()
        self.closed = False
        if logical:
            self.seg_sizes, self.segs, self.page_bytes = [], 0, 0
            return
        if zero_copy:  # the pool's own regions of one page
            tokens = int(getattr(host, "logical_page_size", None) or self.page_size)
            ptrs, sizes = host.get_page_buffer_meta(_first_page_indices(tokens))
            self.seg_sizes = [int(s) for s in sizes]
        else:
            self.seg_sizes = [_nbytes(host.get_dummy_flat_data_page())]
        self.segs, self.page_bytes = len(self.seg_sizes), sum(self.seg_sizes)
        if not self.segs or self.page_bytes <= 0:
            raise ValueError(f"pool {name}: an empty page description")

    # ---- the store ----

    def open(self, opts: dict) -> bool:
        """Open the store; a reader of a dir its writer has not made yet tries again later."""
        if self.store is not None or self.logical:
            return True
        try:
            self.store = PageStore(self.dir, self.fingerprint, self.page_bytes,
                                   page_tokens=min(self.page_size, 4096),
                                   capacity=self.capacity, read_only=self.read_only, **opts)
            logger.info("kvtier: store %s open (%d-byte pages, %d segments, %s)", self.dir,
                        self.page_bytes, self.segs, "read-only" if self.read_only else "writer")
            return True
        except Exception as e:
            if not self.read_only:  # a writer that cannot open its dir: a configuration error
                raise RuntimeError(
                    f"kvtier: cannot open {self.dir}: {e}. A dir written for another model, "
                    "weights revision, dtype, layout or rank is refused: point \"dir\" "
                    "elsewhere, or remove it") from e
            logger.warning("kvtier: cannot open %s yet: %s", self.dir, e)
            return False

    def ready(self, opts: dict) -> bool:
        """Open. A reader whose writer (another TP rank) has not made the dir's index yet
        looks for it at each call, one stat, and opens it once it is there; an open that
        fails is tried again at most once a second. The calls in between are misses."""
        if self.store is not None or (self.logical and not self.closed):
            return True
        if self.closed or time.monotonic() < self.next_open:
            return False
        if self.read_only and not os.path.exists(os.path.join(self.dir, "index", "data.mdb")):
            return False
        with self.opening:  # one open, whichever of SGLang's threads asks first
            if self.store is None and not self.closed:
                self.next_open = time.monotonic() + 1.0
                self.open(opts)
        return self.store is not None

    def close(self) -> None:
        self.closed = True
        if self.store is not None:
            self.store.close()
            self.store = None

    # ---- pages ----

    def run(self, keys: List[bytes]) -> int:
        """The leading run of keys that are stored."""
        return len(keys) if self.logical else self.store.exists(keys)

    def present(self, keys: List[bytes]) -> List[bool]:
        """Which of keys are stored, each (an index lookup per absent key and per run)."""
        if self.logical:
            return [True] * len(keys)
        out, at = [], 0
        while at < len(keys):
            run = self.store.exists(keys[at:])
            out += [True] * run
            at += run
            if at < len(keys):
                out.append(False)
                at += 1
        return out

    def _regions(self, n: int, host_indices):
        ptrs, sizes = self.host.get_page_buffer_meta(host_indices)
        if len(ptrs) != n * self.segs:
            raise ValueError(f"pool {self.name}: {len(ptrs)} regions for {n} pages")
        return ptrs, sizes

    def get(self, keys: List[bytes], host_indices) -> List[bool]:
        if self.logical:
            return [True] * len(keys)
        if self.zero_copy:
            ptrs, sizes = self._regions(len(keys), host_indices)
            return [r == 0 for r in self.store.get(keys, ptrs, sizes, self.segs)]
        slots = host_indices.tolist()
        pages = [self.host.get_dummy_flat_data_page() for _ in keys]
        res = self._flat(keys, pages, None, writing=False)
        for i, r in enumerate(res):
            if r == 0:  # scattered into the pool only when whole and checked
                self.host.set_from_flat_data_page(slots[i * self.page_size], pages[i])
        return [r == 0 for r in res]

    def set(self, keys: List[bytes], host_indices, parent: Optional[bytes]) -> List[bool]:
        if self.logical:
            return [True] * len(keys)
        if self.zero_copy:
            ptrs, sizes = self._regions(len(keys), host_indices)
            return [r == 0 for r in self.store.set(keys, ptrs, sizes, self.segs,
                                                   parent=parent)]
        slots = host_indices.tolist()
        pages = []
        for i in range(len(keys)):
            page = self.host.get_data_page(slots[i * self.page_size], flat=True)
            pages.append(page.contiguous() if hasattr(page, "contiguous") else page)
        res = self._flat(keys, pages, parent, writing=True)
        return [r == 0 for r in res]

    def _flat(self, keys, pages, parent, writing: bool):
        """One call for flat pages: by address (tensors) or through the buffer protocol."""
        addrs = [_buffer_of(p) for p in pages]
        for _, nbytes in addrs:
            if nbytes is not None and nbytes != self.page_bytes:
                raise ValueError(f"pool {self.name}: a {nbytes}-byte flat page for "
                                 f"{self.page_bytes}-byte pages")
        s = self.store
        if all(a is not None for a, _ in addrs):
            ptrs = [a for a, _ in addrs]
            return s.set(keys, ptrs, parent=parent) if writing else s.get(keys, ptrs)
        return s.set_from(keys, pages, parent=parent) if writing else s.get_into(keys, pages)


class KvtierHiCacheStorage(_Base):
    """SGLang HiCacheStorage over kvtier page stores (one per rank and host pool)."""

    def __init__(self, storage_config, kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        extra.update(kwargs or {})
        if not extra.get("dir"):
            raise ValueError('kvtier: extra config needs "dir", the data dir')
        self.base_dir = str(extra["dir"])
        self.capacity = parse_bytes(extra.get("capacity", 1 << 30))
        pool_capacity = extra.get("pool_capacity") or {}
        if not isinstance(pool_capacity, dict):
            raise ValueError('kvtier: "pool_capacity" must map pool names to sizes')
        self.pool_capacity = {str(k): parse_bytes(v) for k, v in pool_capacity.items()}
        self.weights_revision = str(extra.get("weights_revision", ""))
        sync = str(extra.get("sync", "relaxed"))
        if sync not in ("relaxed", "durable"):
            raise ValueError(f'kvtier: "sync" must be "relaxed" or "durable", not {sync!r}')
        self.store_opts = {"disk_io": str(extra.get("disk_io", "auto")), "sync": sync}
        self.interface_v1 = bool(extra.get("interface_v1", False))
        self.kv: Optional[_Pool] = None
        self.pools: Dict[str, _Pool] = {}  # by pool name's value; "kv" is self.kv
        self.mem_pool_host = None
        self.writer = getattr(storage_config, "is_storage_writer", True)
        self._lock = threading.Lock()
        self._metrics = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [],
                         "backup_bandwidth": []}
        self._logged = set()
        self._closed = False

    # The KV pool's store, as the v1 backend had them.
    store = property(lambda self: self.kv.store if self.kv else None)
    dir = property(lambda self: self.kv.dir if self.kv else None)
    page_bytes = property(lambda self: self.kv.page_bytes if self.kv else 0)
    segs_per_page = property(lambda self: self.kv.segs if self.kv else 0)
    read_only = property(lambda self: self.kv.read_only if self.kv else not self.writer)

    # ---- setup ----

    def _rank_dir(self, shared: bool) -> str:
        c = self.storage_config
        parts = []
        if shared:  # MLA KV is the same on every TP rank: one writer, shared
            parts.append("mla")
            if getattr(c, "dcp_size", 1) > 1:
                parts.append(f"dcp{c.dcp_rank}of{c.dcp_size}")
        else:
            parts.append(f"tp{c.tp_rank}of{c.tp_size}")
        if c.pp_size > 1:
            parts.append(f"pp{c.pp_rank}of{c.pp_size}")
        if c.attn_cp_size > 1:
            parts.append(f"cp{c.attn_cp_rank}of{c.attn_cp_size}")
        if getattr(c, "dp_rank", 0):
            parts.append(f"dp{c.dp_rank}")
        return os.path.join(self.base_dir, "_".join(parts))

    def _ranks(self, shared: bool) -> dict:
        c = self.storage_config
        return {
            "tp": None if shared else [c.tp_rank, c.tp_size],
            "pp": [c.pp_rank, c.pp_size],
            "cp": [c.attn_cp_rank, c.attn_cp_size],
            "dcp": [getattr(c, "dcp_rank", 0), getattr(c, "dcp_size", 1)],
        }

    def _kv_fingerprint(self, pool: _Pool) -> bytes:
        c, host = self.storage_config, pool.host
        ident = {
            "kvtier_sglang": 1,
            "model": c.model_name or "",
            "weights_revision": self.weights_revision,
            "pool": type(host).__name__,
            "layout": str(getattr(host, "layout", "")),
            "dtype": str(getattr(host, "dtype", "")),
            "page_size": int(getattr(host, "page_size", 0)),
            "page_bytes": pool.page_bytes,
            "segments": pool.segs,
            "path": "v1" if pool.zero_copy else "copy",
            "mla": bool(c.is_mla_model),
            **self._ranks(bool(c.is_mla_model)),
        }
        for name in ("layer_num", "head_num", "head_dim", "kv_lora_rank",
                     "qk_rope_head_dim"):
            value = getattr(host, name, None)
            if isinstance(value, int):
                ident[name] = value
        return json.dumps(ident, sort_keys=True).encode()

    def _pool_fingerprint(self, pool: _Pool, shared: bool) -> bytes:
        """A v2 pool's identity: the KV's, with the pool's name, its regions' sizes and the
        shapes and dtypes its class has (Mamba's conv and temporal states)."""
        c, host = self.storage_config, pool.host
        ident = {
            "kvtier_sglang_pool": 1,
            "name": pool.name,
            "model": c.model_name or "",
            "weights_revision": self.weights_revision,
            "class": type(host).__name__,
            "layout": str(getattr(host, "layout", "")),
            "page_size": pool.page_size,
            "regions": pool.seg_sizes,
            "path": "v1" if pool.zero_copy else "copy",
            **self._ranks(shared),
        }
        for name in ("dtype", "conv_dtype", "temporal_dtype", "temporal_state_shape",
                     "conv_state_shapes", "layer_num", "head_num", "head_dim", "v_head_dim",
                     "kv_lora_rank", "qk_rope_head_dim", "kv_cache_dim", "num_mamba_layers",
                     "index_head_dim", "storage_format_tag"):
            value = getattr(host, name, None)
            if value is not None and not callable(value):
                ident[name] = str(value) if not isinstance(value, int) else value
        return json.dumps(ident, sort_keys=True).encode()

    def _shared(self, name: str, host) -> bool:
        """Whether every TP rank holds the same bytes of this pool (then one rank writes a
        dir they all read): an MLA model's pools, except Mamba states and pools of heads,
        which each rank holds a share of."""
        if not self.storage_config.is_mla_model or name == "mamba":
            return False
        return not (hasattr(host, "head_num") and not hasattr(host, "kv_lora_rank"))

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Called once by SGLang with the host (KV) pool: the page geometry is known now, so
        the store opens here."""
        self.mem_pool_host = mem_pool_host
        logical = _is_logical(mem_pool_host)
        kv = _Pool("kv", mem_pool_host, self.interface_v1, read_only=not self.writer,
                   logical=logical)
        kv.dir = self._rank_dir(bool(self.storage_config.is_mla_model))
        kv.capacity = self.capacity
        if not logical:
            kv.fingerprint = self._kv_fingerprint(kv)
            if not kv.read_only:
                os.makedirs(kv.dir, exist_ok=True)
        self.kv = kv
        kv.ready(self.store_opts) if kv.read_only else kv.open(self.store_opts)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        """SGLang registers each host pool of a hybrid model (its KV pool too): each gets a
        page store of its own, opened here; a dir another model or layout wrote is refused
        (RuntimeError, which fails SGLang's attach)."""
        if _Base is not object:
            super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = _value(host_pool_name)
        if name == "kv" and (self.kv is None or host_pool is self.kv.host):
            if self.kv is None:
                self.register_mem_pool_host(host_pool)
            return
        if name == "kv":
            raise RuntimeError("kvtier: a second KV host pool registered through v2")
        shared = self._shared(name, host_pool)
        try:
            pool = _Pool(name, host_pool, True, read_only=shared and not self.writer)
        except Exception:  # no page buffer description (Mamba with side states): flat pages
            pool = _Pool(name, host_pool, False, read_only=shared and not self.writer)
        pool.dir = f"{self._rank_dir(shared)}.{name}"
        pool.fingerprint = self._pool_fingerprint(pool, shared)
        pool.capacity = self._pool_capacity_of(pool)
        if not pool.read_only:
            os.makedirs(pool.dir, exist_ok=True)
        pool.ready(self.store_opts) if pool.read_only else pool.open(self.store_opts)
        with self._lock:
            old = self.pools.get(name)
            self.pools = {**self.pools, name: pool}
        if old is not None:
            old.close()

    def _pool_capacity_of(self, pool: _Pool) -> int:
        if pool.name in self.pool_capacity:
            return self.pool_capacity[pool.name]
        kv_bytes = _host_bytes(self.mem_pool_host) if self.mem_pool_host is not None else None
        mine = _host_bytes(pool.host)
        cap = self.capacity
        if kv_bytes and mine:
            cap = int(self.capacity * mine / kv_bytes)
        return max(cap, 64 * (pool.page_bytes + 8192))  # room for a few pages and heads

    def on_host_pools_registered(self) -> None:
        """Nothing left to do: each pool's store opened when it was registered."""

    def _pool(self, name) -> Optional[_Pool]:
        key = _value(name)
        return self.kv if key == "kv" else self.pools.get(key)

    def _log_once(self, what: str, msg: str) -> None:
        if what not in self._logged:
            self._logged.add(what)
            logger.warning(msg)

    def _ready(self, pool: Optional[_Pool] = None) -> bool:
        pool = pool or self.kv
        return pool is not None and not self._closed and pool.ready(self.store_opts)

    def _record(self, kind: str, pages: int, page_bytes: int, seconds: float) -> None:
        if pages <= 0:
            return
        gbps = pages * page_bytes / max(seconds, 1e-9) / 1e9
        with self._lock:
            self._metrics[kind + "_pgs"].append(pages)
            self._metrics[kind + "_bandwidth"].append(gbps)

    @staticmethod
    def _parent(extra_info) -> Optional[bytes]:
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info else None
        return key_bytes(prefix[-1]) if prefix else None

    # ---- the zero-copy path (interface_v1) ----

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        try:
            if not keys or not self._ready():
                return [False] * len(keys)
            t = time.perf_counter()
            ok = self.kv.get([key_bytes(k) for k in keys], host_indices)
            self._record("prefetch", sum(ok), self.kv.page_bytes, time.perf_counter() - t)
            return ok
        except Exception as e:
            self._log_once("get", f"kvtier: batch_get_v1 failed, served as misses: {e}")
            return [False] * len(keys)

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        try:
            if not keys or self.read_only or not self._ready():
                return [False] * len(keys)
            t = time.perf_counter()
            ok = self.kv.set([key_bytes(k) for k in keys], host_indices,
                             self._parent(extra_info))
            self._record("backup", sum(ok), self.kv.page_bytes, time.perf_counter() - t)
            return ok
        except Exception as e:
            self._log_once("set", f"kvtier: batch_set_v1 failed, nothing stored: {e}")
            return [False] * len(keys)

    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        try:
            if not keys or not self._ready():
                return 0
            return self.kv.run([key_bytes(k) for k in keys])
        except Exception as e:
            self._log_once("exists", f"kvtier: batch_exists failed, a miss: {e}")
            return 0

    # ---- hybrid models (v2): every pool ----

    def _present(self, pool: Optional[_Pool], keys: List[bytes]) -> List[bool]:
        if pool is None or not keys or not self._ready(pool):
            return [False] * len(keys)
        return pool.present(keys)

    def batch_exists_v2(self, keys: List[str], pool_transfers=None,
                        extra_info=None) -> PoolTransferResult:
        """The longest prefix of keys whose KV pages are stored and, for every pool in
        pool_transfers, what the pool's hit policy asks for: kv_hit_pages is the longest
        prefix every pool allows, restorable_prefix_pages all of them (a trailing_pages pool
        allows some lengths and not others), extra_pool_hit_pages each pool's own verdict."""
        try:
            return self._exists_v2(list(keys), list(pool_transfers or []))
        except Exception as e:
            self._log_once("exists_v2", f"kvtier: batch_exists_v2 failed, a miss: {e}")
            return PoolTransferResult(0, {}, [])

    def _exists_v2(self, keys: List[str], transfers) -> PoolTransferResult:
        kb = [key_bytes(k) for k in keys]
        kv_pages = self.batch_exists(keys) if keys else 0
        hits = {KV_POOL: kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for t in transfers:
            policy, pool = _value(t.hit_policy or ALL_PAGES), self._pool(t.name)
            if pool is None:
                self._log_once(f"unregistered-{_value(t.name)}",
                               f"kvtier: pool {_value(t.name)} was never registered: a miss")
            if policy == BLOCK_GROUPS:  # a verdict of its own, never gating the KV hit
                group_keys = [key_bytes(k) for k in t.keys] if t.keys is not None else kb
                pages = block_groups_pages(self._present(pool, group_keys),
                                           int(getattr(t, "block_pages", 0) or 0),
                                           int(getattr(t, "group_pages", 0) or 0), len(keys))
                if pages:
                    hits[t.name] = pages
                continue
            if not restorable:
                continue
            present = self._present(pool, kb[:kv_pages])
            if policy == ALL_PAGES:
                allowed = all_pages_restorable(present)
            elif policy == TRAILING_PAGES:
                allowed = trailing_pages_restorable(present, len(t.keys) if t.keys else 1)
            else:
                self._log_once(f"policy-{policy}", f"kvtier: unknown hit policy {policy}: "
                               f"pool {_value(t.name)} restores nothing")
                allowed = set()
            if allowed:
                hits[t.name] = max(allowed)
            restorable = [p for p in restorable if p in allowed]
        return PoolTransferResult(restorable[-1] if restorable else 0, hits, restorable)

    def _transfer_io(self, transfers, extra_info, writing: bool) -> Dict[Any, List[bool]]:
        results, parent = {}, self._parent(extra_info) if writing else None
        for t in transfers or []:
            keys = list(t.keys or [])
            results[t.name] = self._pool_io(t, keys, parent, writing)
        return results

    def _pool_io(self, t, keys: List[str], parent, writing: bool) -> List[bool]:
        name, pool = _value(t.name), self._pool(t.name)
        what = "set" if writing else "get"
        try:
            if not keys:
                return []
            if pool is None:
                self._log_once(f"unregistered-{name}",
                               f"kvtier: pool {name} was never registered: a miss")
                return [False] * len(keys)
            if (writing and pool.read_only) or not self._ready(pool):
                return [False] * len(keys)
            indices = t.host_indices
            want = len(keys) * pool.page_size
            if indices is None or len(indices) != want:
                raise ValueError(f"{0 if indices is None else len(indices)} host slots for "
                                 f"{len(keys)} pages of {pool.page_size}")
            t0 = time.perf_counter()
            kb = [key_bytes(k) for k in keys]
            ok = pool.set(kb, indices, parent) if writing else pool.get(kb, indices)
            self._record("backup" if writing else "prefetch", sum(ok), pool.page_bytes,
                         time.perf_counter() - t0)
            return ok
        except Exception as e:
            self._log_once(f"{what}-v2-{name}",
                           f"kvtier: batch_{what}_v2 of pool {name} failed, a miss: {e}")
            return [False] * len(keys)

    def batch_get_v2(self, transfers, extra_info=None) -> Dict[Any, List[bool]]:
        """Each transfer's pages into its pool's host slots; per pool, per page: True only
        for a page read whole and checked (a page that fails is a miss, its slots unused)."""
        return self._transfer_io(transfers, extra_info, writing=False)

    def batch_set_v2(self, transfers, extra_info=None) -> Dict[Any, List[bool]]:
        """Each transfer's pages from its pool's host slots, under its pool's keys."""
        return self._transfer_io(transfers, extra_info, writing=True)

    # ---- the copy path (flat pages) ----

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None):
        try:
            if target_location is None or not self._ready():
                return None
            if self.kv.logical:  # an anchor's page holds nothing
                return target_location
            addr, nbytes = _buffer_of(target_location)
            if addr is not None:
                if nbytes != self.page_bytes:
                    raise ValueError(f"a {nbytes}-byte target for {self.page_bytes}-byte pages")
                res = self.store.get([key_bytes(key)], [addr])
            else:
                res = self.store.get_into([key_bytes(key)], [target_location])
            return target_location if res[0] == 0 else None
        except Exception as e:
            self._log_once("copy-get", f"kvtier: get failed, a miss: {e}")
            return None

    def batch_get(self, keys: List[str], target_locations: Any = None,
                  target_sizes: Any = None):
        targets = target_locations or [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, targets)]

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        try:
            if value is None or self.read_only or not self._ready():
                return False
            if self.kv.logical:
                return True
            addr, nbytes = _buffer_of(value)
            if addr is not None:
                if nbytes != self.page_bytes:
                    raise ValueError(f"a {nbytes}-byte value for {self.page_bytes}-byte pages")
                res = self.store.set([key_bytes(key)], [addr])
            else:
                res = self.store.set_from([key_bytes(key)], [value])
            return res[0] == 0
        except Exception as e:
            self._log_once("copy-set", f"kvtier: set failed, nothing stored: {e}")
            return False

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        if values is None:
            return False
        return all([self.set(k, v) for k, v in zip(keys, values)]) and len(values) == len(keys)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ---- the rest ----

    def _all_pools(self) -> List[_Pool]:
        return ([self.kv] if self.kv else []) + list(self.pools.values())

    def clear(self) -> bool:
        """Delete every page of every pool this rank writes."""
        try:
            mine = [p for p in self._all_pools() if p.store is not None and not p.read_only]
            if not mine:
                return False
            for pool in mine:
                pool.store.clear()
            return True
        except Exception as e:
            self._log_once("clear", f"kvtier: clear failed: {e}")
            return False

    def get_stats(self):
        with self._lock:
            drained = {k: list(v) for k, v in self._metrics.items()}
            for v in self._metrics.values():
                v.clear()
        if _Metrics is None:
            return drained
        m = _Metrics()
        m.prefetch_pgs.extend(drained["prefetch_pgs"])
        m.backup_pgs.extend(drained["backup_pgs"])
        m.prefetch_bandwidth.extend(drained["prefetch_bandwidth"])
        m.backup_bandwidth.extend(drained["backup_bandwidth"])
        return m

    def store_stats(self, pool: str = "kv") -> dict:
        """A pool's page store's own counters (pages, hits, errors, bytes), for people."""
        p = self._pool(pool)
        return p.store.stats() if p is not None and p.store is not None else {}

    def close(self) -> None:
        """Detach: close every store; later calls are misses."""
        self._closed = True
        for pool in self._all_pools():
            pool.close()
