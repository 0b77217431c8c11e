"""kvtier as SGLang's HiCache L3 storage backend.

Load it with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
        "interface_v1": 1, "dir": "/var/cache/kvtier", "capacity": "200G"}'

Extra config keys read here: ``dir`` (required: the base data dir; each rank gets its own
directory below it), ``capacity`` (bytes, or a string such as ``"200G"``; default 1 GiB per
rank), ``weights_revision`` (any string naming the weights: part of the fingerprint, so pages
computed by other weights are never served), ``disk_io`` (``auto``, ``uring`` or ``psync``),
``interface_v1`` (SGLang's own switch to the zero-copy path; pages stored through one path
are never served to the other, as their bytes are laid out differently).

What a dir holds is fixed by a fingerprint made of the model name, the weights revision, the
host pool's class, layout, dtype and geometry, the page size, the path (v1 or copy) and the
rank's place in TP/PP/CP: a dir written by one model, dtype or layout is refused to another
(SGLang's own keys name none of these). Every page read is checked against the checksum
stored with it; a page that fails is a miss.

Errors never leave this class as exceptions: a failed call is a miss (``False``, ``None`` or
a shorter run), logged, so the scheduler keeps running and recomputes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from typing import Any, List, Optional

from . import PageStore

try:  # the real base class when SGLang is installed; the same methods otherwise
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:  # pragma: no cover - exercised where sglang is absent
    _Base = object

try:
    from sglang.srt.observability.metrics_collector import StorageMetrics as _Metrics
except Exception:  # pragma: no cover
    _Metrics = None

logger = logging.getLogger(__name__)

KEY_BYTES = 32
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


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


class KvtierHiCacheStorage(_Base):
    """SGLang HiCacheStorage over a kvtier page store (one per rank)."""

    def __init__(self, storage_config, kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        extra.update(kwargs or {})
        if not extra.get("dir"):
            raise ValueError('kvtier: extra config needs "dir", the data dir')
        self.base_dir = str(extra["dir"])
        self.capacity = parse_bytes(extra.get("capacity", 1 << 30))
        self.weights_revision = str(extra.get("weights_revision", ""))
        self.disk_io = str(extra.get("disk_io", "auto"))
        self.interface_v1 = bool(extra.get("interface_v1", False))
        self.store: Optional[PageStore] = None
        self.mem_pool_host = None
        self.page_bytes = 0
        self.segs_per_page = 0
        self.dir = None
        self.read_only = not getattr(storage_config, "is_storage_writer", True)
        self._lock = threading.Lock()
        self._metrics = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [],
                         "backup_bandwidth": []}
        self._logged = set()
        self._next_open = 0.0
        self._closed = False

    # ---- setup ----

    def _rank_dir(self) -> str:
        c = self.storage_config
        parts = []
        if c.is_mla_model:  # MLA KV is the same on every TP rank: one writer, shared
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

    def _fingerprint(self, pool) -> bytes:
        c = self.storage_config
        ident = {
            "kvtier_sglang": 1,
            "model": c.model_name or "",
            "weights_revision": self.weights_revision,
            "pool": type(pool).__name__,
            "layout": str(getattr(pool, "layout", "")),
            "dtype": str(getattr(pool, "dtype", "")),
            "page_size": int(getattr(pool, "page_size", 0)),
            "page_bytes": self.page_bytes,
            "segments": self.segs_per_page,
            "path": "v1" if self.interface_v1 else "copy",
            "mla": bool(c.is_mla_model),
            "tp": None if c.is_mla_model else [c.tp_rank, c.tp_size],
            "pp": [c.pp_rank, c.pp_size],
            "cp": [c.attn_cp_rank, c.attn_cp_size],
            "dcp": [getattr(c, "dcp_rank", 0), getattr(c, "dcp_size", 1)],
        }
        for name in ("layer_num", "head_num", "head_dim", "kv_lora_rank",
                     "qk_rope_head_dim"):
            value = getattr(pool, name, None)
            if isinstance(value, int):
                ident[name] = value
        return json.dumps(ident, sort_keys=True).encode()

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Called once by SGLang with the host pool: the page geometry is known now, so the
        store opens here."""
        self.mem_pool_host = mem_pool_host
        if self.interface_v1:  # the pool's own regions of one page
            tokens = getattr(mem_pool_host, "logical_page_size", None) or mem_pool_host.page_size
            ptrs, sizes = mem_pool_host.get_page_buffer_meta(_first_page_indices(int(tokens)))
            self.segs_per_page = len(ptrs)
            self.page_bytes = int(sum(sizes))
        else:  # the copy path moves flat pages
            page = mem_pool_host.get_dummy_flat_data_page()
            addr, nbytes = _buffer_of(page)
            self.segs_per_page = 1
            self.page_bytes = int(nbytes if addr is not None else memoryview(page).nbytes)
        self.dir = self._rank_dir()
        if not self.read_only:
            os.makedirs(self.dir, exist_ok=True)
        self.fingerprint = self._fingerprint(mem_pool_host)
        self._open()

    def _open(self) -> bool:
        """Open the store; a reader of a dir its writer has not made yet tries again later."""
        if self.store is not None:
            return True
        try:
            self.store = PageStore(self.dir, self.fingerprint, self.page_bytes,
                                   page_tokens=int(self.mem_pool_host.page_size),
                                   capacity=self.capacity, disk_io=self.disk_io,
                                   read_only=self.read_only)
            logger.info("kvtier: store %s open (%d-byte pages, %d segments, %s)", self.dir,
                        self.page_bytes, self.segs_per_page,
                        "read-only" if self.read_only else "writer")
            return True
        except Exception as e:
            if not self.read_only:  # a writer that cannot open its dir: a configuration error
                raise RuntimeError(
                    f"kvtier: cannot open {self.dir}: {e}. A dir written for another model, "
                    "weights revision, dtype, layout or rank is refused: point \"dir\" "
                    "elsewhere, or remove it") from e
            self._log_once("open", f"kvtier: cannot open {self.dir} yet: {e}")
            return False

    def _log_once(self, what: str, msg: str) -> None:
        if what not in self._logged:
            self._logged.add(what)
            logger.warning(msg)

    def _ready(self) -> bool:
        """Open, or a reader whose writer has not made the dir yet: try again at most once a
        second, the calls in between are misses."""
        if self.store is not None:
            return True
        if self.mem_pool_host is None or self._closed or time.monotonic() < self._next_open:
            return False
        self._next_open = time.monotonic() + 1.0
        return self._open()

    # ---- the zero-copy path (interface_v1) ----

    def _segments(self, keys, host_indices):
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if len(ptrs) != len(keys) * self.segs_per_page:
            raise ValueError(f"{len(ptrs)} regions for {len(keys)} pages")
        return ptrs, sizes

    def _record(self, kind: str, pages: int, seconds: float) -> None:
        if pages <= 0:
            return
        gbps = pages * self.page_bytes / max(seconds, 1e-9) / 1e9
        with self._lock:
            self._metrics[kind + "_pgs"].append(pages)
            self._metrics[kind + "_bandwidth"].append(gbps)

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        try:
            if not keys or not self._ready():
                return [False] * len(keys)
            ptrs, sizes = self._segments(keys, host_indices)
            t = time.perf_counter()
            res = self.store.get([key_bytes(k) for k in keys], ptrs, sizes,
                                 self.segs_per_page)
            ok = [r == 0 for r in res]
            self._record("prefetch", sum(ok), time.perf_counter() - t)
            return ok
        except Exception as e:
            self._log_once("get", f"kvtier: batch_get_v1 failed, served as misses: {e}")
            return [False] * len(keys)

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        try:
            if not keys or self.read_only or not self._ready():
                return [False] * len(keys)
            ptrs, sizes = self._segments(keys, host_indices)
            prefix = getattr(extra_info, "prefix_keys", None) if extra_info else None
            parent = key_bytes(prefix[-1]) if prefix else None
            t = time.perf_counter()
            res = self.store.set([key_bytes(k) for k in keys], ptrs, sizes,
                                 self.segs_per_page, parent=parent)
            ok = [r == 0 for r in res]
            self._record("backup", sum(ok), time.perf_counter() - t)
            return ok
        except Exception as e:
            self._log_once("set", f"kvtier: batch_set_v1 failed, nothing stored: {e}")
            return [False] * len(keys)

    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        try:
            if not keys or not self._ready():
                return 0
            return self.store.exists([key_bytes(k) for k in keys])
        except Exception as e:
            self._log_once("exists", f"kvtier: batch_exists failed, a miss: {e}")
            return 0

    # ---- the copy path (flat pages) ----

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None):
        try:
            if target_location is None or not self._ready():
                return None
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

    def clear(self) -> bool:
        try:
            if self.store is None or self.read_only:
                return False
            self.store.clear()
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

    def store_stats(self) -> dict:
        """The page store's own counters (pages, hits, errors, bytes), for people."""
        return self.store.stats() if self.store is not None else {}

    def close(self) -> None:
        """Detach: close the store; later calls are misses."""
        self._closed = True
        if self.store is not None:
            self.store.close()
            self.store = None
