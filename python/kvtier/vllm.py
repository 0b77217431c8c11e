"""kvtier as a secondary tier of vLLM's offloading connector (vLLM 0.33.0).

vLLM's ``TieringOffloadingSpec`` keeps offloaded KV in a CPU pool (the primary tier) and
copies every chunk it stores there on to its secondary tiers, from which a chunk the CPU pool
no longer holds is promoted back. ``KvtierTier`` is such a secondary tier over a kvtier page
store: a data dir of slab files and an LMDB index, bounded by a capacity (least recently used
chunks go first), every chunk read checked against the checksum written with it, and found
again after a restart. Enable it with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "OffloadingConnector",
        "kv_role": "kv_both", "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 8589934592,
            "secondary_tiers": [{"type": "KvtierTier", "module_path": "kvtier.vllm",
                                 "dir": "/var/cache/kvtier-vllm", "capacity": "200G"}]}}'

Keys of a tier entry read here (vLLM passes each to the constructor): ``dir`` (required),
``capacity`` (bytes, or a string such as ``"200G"``; default 1 GiB), ``sync`` (``"relaxed"``,
the default: data and index flushed every second and at shutdown, or ``"durable"``: each write
batch fdatasync'd before it counts as stored), ``disk_io`` (``auto``, ``uring``, ``psync``),
``weights_revision`` (any string naming the weights: part of the fingerprint), ``locality``
(``LOCAL`` or ``REMOTE``, as vLLM's own tiers), ``enable_kv_events`` (BlockStored events for
chunks stored here, when vLLM publishes KV events), ``remote`` (a Redis/Valkey URL: a server
below the disk that engines of the same fingerprint share), ``remote_timeout_ms`` (default
1000), ``remote_ttl_s`` and ``page_cache`` (default ``false``: chunks above 128 KiB are written and
read with O_DIRECT, as vLLM's own ``fs`` tier does, with no second copy of what the CPU tier
holds; ``true`` keeps them in the page cache and reads them from it while it holds them).
``backpressure`` is vLLM's own.

The dir holds the page store in ``kv/`` (``kv-dp<i>of<n>/`` for data-parallel engines, one
each) and beside it ``kv.json``, the fields of the fingerprint in plain text: the model name,
dtype, tokens per hash, blocks per chunk, the TP/PP/PCP/DCP sizes, the KV-cache groups (tokens
per block and layer names), the layout flags, the chunk size and the weights revision. A dir
written for other values is refused at start, naming the field that differs. vLLM's block
hashes carry no model identity of their own; they are only stable across restarts when the
engine's seed is: ``PYTHONHASHSEED`` unset or the same on every run with ``sha256`` (the
default) or ``sha256_cbor``, and set, the same on every run, with ``xxhash`` (which otherwise
draws a random seed per process).

Failures stay inside: a chunk that fails to load (missing, a checksum that does not match, an
I/O error) fails that chunk alone, which vLLM recomputes; a failed store leaves that chunk out.
No call raises into vLLM after the constructor, and no chunk is ever served with bytes other
than those stored under its key.

Pinned to vLLM 0.33.0's tier interface: importing this module under another vLLM whose
interface differs raises ImportError naming both versions.
"""

from __future__ import annotations

import errno
import hashlib
import inspect
import json
import logging
import os
import threading
import time
from typing import Any, ClassVar, Dict, List, Optional

from . import ECORRUPT, EFINGERPRINT, Error, PageStore

SUPPORTED_VLLM = "0.33.0"
FORMAT = "kvtier-vllm 1"

logger = logging.getLogger(__name__)


def _load_vllm():
    """vLLM's tier interface, checked against the one this module was written for."""
    try:
        import vllm
        from vllm.v1.kv_offload import base as kv_base
        from vllm.v1.kv_offload.tiering import base as tier_base
    except ImportError as e:
        raise ImportError(
            f"kvtier.vllm is a tier for vLLM {SUPPORTED_VLLM}, which could not be imported: {e}"
        ) from e
    found = getattr(vllm, "__version__", "unknown")
    wanted = {
        "SecondaryTierManager": tier_base,
        "TransferJob": tier_base,
        "JobResult": tier_base,
        "LookupResult": kv_base,
        "Medium": kv_base,
        "Locality": kv_base,
        "OffloadingEvent": kv_base,
        "RequestOffloadingContext": kv_base,
    }
    missing = [name for name, mod in wanted.items() if not hasattr(mod, name)]
    if not missing:
        base = tier_base.SecondaryTierManager
        for meth in ("lookup", "submit_store", "submit_load", "get_finished_jobs",
                     "drain_jobs", "on_new_request"):
            if meth not in getattr(base, "__abstractmethods__", ()):
                missing.append(f"SecondaryTierManager.{meth}")
        params = inspect.signature(base.__init__).parameters
        if "primary_kv_view" not in params or "backpressure_detector" not in params:
            missing.append("SecondaryTierManager(offloading_spec, primary_kv_view, ...)")
        job_fields = getattr(tier_base.TransferJob, "__dataclass_fields__", {})
        if "chunk_ids" not in job_fields:
            missing.append("TransferJob.chunk_ids")
        if "successful_keys" not in getattr(tier_base.JobResult, "__dataclass_fields__", {}):
            missing.append("JobResult.successful_keys")
        if not hasattr(getattr(kv_base, "LookupResult"), "RETRY"):
            missing.append("LookupResult.RETRY")
    if missing:
        raise ImportError(
            f"kvtier.vllm supports vLLM {SUPPORTED_VLLM}; vLLM {found} is installed and its "
            f"tier interface differs (no {', '.join(missing)}). Install vllm=={SUPPORTED_VLLM}."
        )
    if found != SUPPORTED_VLLM:
        logger.warning("kvtier.vllm is tested with vLLM %s; vLLM %s is installed (its tier "
                       "interface matches)", SUPPORTED_VLLM, found)
    return found, kv_base, tier_base


VLLM_VERSION, _kv, _tier = _load_vllm()
SecondaryTierManager = _tier.SecondaryTierManager
JobResult = _tier.JobResult
LookupResult = _kv.LookupResult
Medium = _kv.Medium
Locality = _kv.Locality
OffloadingEvent = _kv.OffloadingEvent
RequestOffloadingContext = _kv.RequestOffloadingContext
_TIER_LABEL = getattr(_tier, "TIER_LABEL", "tier")

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(value) -> int:
    """An int, or a string such as "512M" or "200G" (binary units)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip().upper().rstrip("B").rstrip("I")
    unit = text[-1:] if text[-1:] in _UNITS and not text[-1:].isdigit() else ""
    try:
        return int(float(text[: len(text) - len(unit)] if unit else text) * _UNITS[unit])
    except ValueError:
        raise ValueError(f"kvtier: capacity must be bytes or a size such as '200G', "
                         f"not {value!r}") from None


def page_key(offload_key: bytes) -> bytes:
    """The page store's 32-byte key of a vLLM OffloadKey (block hash + group index)."""
    return hashlib.sha256(offload_key).digest()


def fingerprint_fields(offloading_spec, chunk_bytes: int, weights_revision: str = "") -> dict:
    """What makes one chunk's bytes differ from another's under the same key: the fields
    vLLM's FileMapper names its dirs by, the chunk size and the weights revision."""
    c = offloading_spec.config
    par = c.parallel
    canonical = bool(getattr(c, "canonical_layout", False))
    return {
        "format": FORMAT,
        "model_name": str(c.model.name),
        "dtype": str(c.model.dtype),
        "tokens_per_hash": int(c.cache.tokens_per_hash),
        "blocks_per_chunk": int(c.cache.blocks_per_chunk),
        "tp_size": int(par.tp_size),
        "pp_size": int(par.pp_size),
        "pcp_size": int(par.pcp_size),
        "dcp_size": int(par.dcp_size),
        "kv_cache_groups": [
            {"tokens_per_block": int(g.tokens_per_block), "layer_names": list(g.layer_names)}
            for g in c.groups
        ],
        "replicated_layout": bool(getattr(c, "replicated_layout", False)),
        "canonical_layout": canonical,
        "kv_cache_layout": getattr(c, "kv_cache_layout", None) if canonical else None,
        "chunk_bytes": int(chunk_bytes),
        "weights_revision": str(weights_revision),
    }


def _differences(held: dict, want: dict) -> List[str]:
    out = []
    for name in sorted(set(held) | set(want)):
        if held.get(name) != want.get(name):
            out.append(f"{name}: the dir has {held.get(name)!r}, this engine {want.get(name)!r}")
    return out


def _write_json(path: str, fields: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(fields, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class _Job:
    """A submitted job: its ops in the page store and each key's result as they land."""

    __slots__ = ("job_id", "keys", "pkeys", "promotion", "submitted", "results", "pending")

    def __init__(self, job_id, keys, pkeys, promotion):
        self.job_id = job_id
        self.keys = keys
        self.pkeys = pkeys
        self.promotion = promotion
        self.submitted = time.monotonic()
        self.results: List[int] = [-errno.EIO] * len(keys)
        self.pending = 0


class KvtierTier(SecondaryTierManager):
    """A vLLM secondary tier over a kvtier page store: one chunk of the CPU pool a page."""

    medium: ClassVar = Medium.STORAGE
    # Every method is safe from any thread (a lock of its own, and the page store's), so the
    # manager's tier-poll thread may collect finished jobs between steps: primary slots free
    # and promotions land without waiting for a scheduler step.
    tolerates_off_thread_polling: ClassVar[bool] = True

    def __init__(self, offloading_spec, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector=None, *, dir: str, capacity="1G", sync: str = "relaxed",
                 disk_io: str = "auto", weights_revision: str = "",
                 locality: Optional[str] = None, enable_kv_events: bool = False,
                 remote: Optional[str] = None, remote_timeout_ms: int = 1000,
                 remote_ttl_s: int = 0, page_cache: bool = False):
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        import numpy as np  # vLLM's own dependency, as its views and chunk ids are numpy's

        if sync not in ("relaxed", "durable"):
            raise ValueError(f"kvtier: sync must be 'relaxed' or 'durable', not {sync!r}")
        self.locality = Locality(locality) if locality is not None else None
        self._chunk = int(self.block_size_bytes)
        if not primary_kv_view.c_contiguous or primary_kv_view.readonly or self._chunk <= 0:
            raise ValueError("kvtier: the primary KV view must be writable and contiguous")
        self.capacity = parse_bytes(capacity)
        self.sync = sync
        self.page_cache = bool(page_cache)
        self.remote = str(remote) if remote else None
        self._remote_opts = {"remote": self.remote, "remote_timeout_ms": int(remote_timeout_ms),
                             "remote_ttl_s": int(remote_ttl_s)} if self.remote else {}
        cfg = offloading_spec.config
        self._fields = fingerprint_fields(offloading_spec, self._chunk, weights_revision)
        tokens = [g.tokens_per_block * cfg.cache.blocks_per_chunk for g in cfg.groups]
        self._span = tokens  # tokens a chunk of group g covers
        page_tokens = tokens[0] if tokens and 0 < tokens[0] <= 4096 else 0
        self.base_dir = os.path.abspath(str(dir))
        par = cfg.parallel
        dp_size = int(getattr(par, "data_parallel_size", 1) or 1)
        name = "kv" if dp_size <= 1 else f"kv-dp{int(par.data_parallel_index)}of{dp_size}"
        self.dir = os.path.join(self.base_dir, name)
        self.record = self.dir + ".json"
        self._store = self._open(page_tokens, disk_io)
        # The primary view's memory: chunk c at c * stride. Held as an array (an export of
        # the view) until shutdown, so the address stays valid while any I/O may touch it;
        # taken last, so a refused start leaves vLLM free to unmap its region.
        self._arr = np.asarray(primary_kv_view)
        self._base = int(self._arr.ctypes.data)
        self._nchunks = self._arr.nbytes // self._chunk
        self._efd = self._store.event_fd()
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)  # a job finished (drain_jobs waits)
        self._ops: Dict[int, tuple] = {}  # op id -> (job, first key index, pages)
        self._jobs: Dict[int, _Job] = {}
        self._done: list = []
        self._bad: set = set()  # page keys whose load failed and that may still be indexed
        self._tails: Dict[str, Dict[tuple, bytes]] = {}  # req -> (group, end) -> page key
        self._events = None
        if enable_kv_events:
            if getattr(getattr(offloading_spec, "kv_events_config", None),
                       "enable_kv_cache_events", False):
                self._events = []
            else:
                logger.warning("kvtier: enable_kv_events is set on tier %s but vLLM publishes "
                               "no KV events; the tier emits none", tier_type)
        self.counters = {"lookups": 0, "lookup_hits": 0, "stored": 0, "store_failed": 0,
                         "loaded": 0, "load_failed": 0, "load_corrupt": 0, "touched": 0}
        self._reported: Dict[str, int] = {}
        self._logged: set = set()
        self._closed = False
        # With a remote, every call that may wait for the server runs on a worker thread, so
        # the scheduler's calls (the disk's index alone) never do.
        self._worker = _RemoteWorker(self, int(remote_timeout_ms)) if self.remote else None
        logger.info("kvtier: tier %s in %s, %d-byte chunks, capacity %d bytes, sync %s",
                    tier_type, self.dir, self._chunk, self.capacity, sync)

    # ---- open ----

    def _open(self, page_tokens: int, disk_io: str) -> PageStore:
        os.makedirs(self.base_dir, mode=0o700, exist_ok=True)
        held = None
        if os.path.exists(self.record):
            try:
                with open(self.record) as f:
                    held = json.load(f)
            except (OSError, ValueError) as e:
                raise ValueError(f"kvtier: {self.record} cannot be read ({e}); it names what "
                                 f"{self.dir} holds: remove both to start afresh") from None
            diff = _differences(held, self._fields)
            if diff:
                raise ValueError(f"kvtier: {self.dir} holds KV of another model or layout, "
                                 f"refused: " + "; ".join(diff) +
                                 " (give this engine another dir, or remove that one)")
        fp = json.dumps(self._fields, sort_keys=True, separators=(",", ":")).encode()
        try:
            store = PageStore(self.dir, fp, self._chunk, page_tokens=page_tokens,
                              capacity=self.capacity, disk_io=disk_io, sync=self.sync,
                              page_cache=self.page_cache, **self._remote_opts)
        except Error as e:
            if e.code == EFINGERPRINT:
                raise ValueError(f"kvtier: {self.dir} holds KV of another fingerprint and its "
                                 f"record {self.record} is missing or was changed; refused "
                                 f"(give this engine another dir, or remove that one)") from None
            if e.code == -errno.EBUSY:
                raise RuntimeError(f"kvtier: {self.dir} is in use by another process (each "
                                   f"engine needs a dir of its own)") from None
            what = f" with the remote {self.remote}" if self.remote else ""
            raise RuntimeError(f"kvtier: cannot open {self.dir}{what}: {e.strerror}") from None
        if held is None:
            try:
                _write_json(self.record, self._fields)
            except OSError as e:
                store.close()
                raise RuntimeError(f"kvtier: cannot write {self.record}: {e}") from None
        return store

    # ---- helpers ----

    def _log_once(self, what: str, err) -> None:
        if what not in self._logged:
            self._logged.add(what)
            logger.warning("kvtier: %s failed (%s); such chunks are recomputed. Logged once.",
                           what, err)

    def _ptrs(self, chunk_ids, n) -> List[Optional[int]]:
        out = []
        for i in range(n):
            c = int(chunk_ids[i])
            out.append(self._base + c * self._chunk if 0 <= c < self._nchunks else None)
        return out

    def _parents(self, job, pkeys) -> List[Optional[bytes]]:
        """Each chunk's parent where the request's stored chunks say it: the chunk of its
        group that ends one chunk earlier (eviction then keeps prefixes whole)."""
        ctx = job.req_context
        where = getattr(ctx, "get_offload_key_position", None)
        tails = self._tails.setdefault(ctx.req_id, {})
        out = []
        for key, pk in zip(job.keys, pkeys):
            end = where(key) if where else None
            g = int.from_bytes(bytes(key[-4:]), "big")
            if end is None or g >= len(self._span):
                out.append(None)
                continue
            out.append(tails.get((g, end - self._span[g])))
            tails[(g, end)] = pk
        return out

    def _submit(self, job: _Job, ptrs, parents=None) -> None:
        _start_op(self, self._ops, job, ptrs, parents)
        self._jobs[job.job_id] = job
        if job.pending == 0:
            self._finish(job)

    def _collect(self, block: bool) -> None:
        """Land what the page store finished (every op, waiting for each, when block)."""
        if not self._ops:
            return
        if not block:
            try:
                os.read(self._efd, 8)  # an eventfd: nonzero means some op completed
            except BlockingIOError:
                return
            except OSError:
                pass
        _land_ops(self, self._ops, block, self._finish)

    def _finish(self, job: _Job) -> None:
        del self._jobs[job.job_id]
        ok = [i for i, r in enumerate(job.results) if r == 0]
        n = len(job.keys)
        c = self.counters
        if job.promotion:
            c["loaded"] += len(ok)
            c["load_failed"] += n - len(ok)
            for i, r in enumerate(job.results):
                if r == ECORRUPT:
                    c["load_corrupt"] += 1
                if r != 0 and r not in (ECORRUPT, -errno.ENOENT):
                    # Still indexed (an I/O error, a bad chunk id): a miss from now on, so
                    # the scheduler does not ask for it again and again.
                    self._bad.add(job.pkeys[i])
                if r != 0 and self._worker:  # nor the server's word for it
                    self._worker.verdicts[job.pkeys[i]] = (False, time.monotonic())
                if r:
                    self._log_once("loading a chunk", os.strerror(-r) if r < 0 and r != ECORRUPT
                                   else "its checksum did not match")
            success = len(ok) == n
            good = None if success or not ok else tuple(job.keys[i] for i in ok)
        else:
            c["stored"] += len(ok)
            c["store_failed"] += n - len(ok)
            for i in ok:
                self._bad.discard(job.pkeys[i])
            for i, r in enumerate(job.results):
                if r:
                    self._log_once("storing a chunk", os.strerror(-r) if r < 0 else r)
            if self._events is not None and ok:
                self._events.append(OffloadingEvent(keys=[job.keys[i] for i in ok],
                                                    medium=self.medium, removed=False,
                                                    locality=self.locality))
            success = len(ok) == n
            good = None
        self._done.append(JobResult(job_id=job.job_id, success=success, successful_keys=good,
                                    transfer_time=time.monotonic() - job.submitted,
                                    transfer_bytes=len(ok) * self._chunk))
        self._cond.notify_all()

    # ---- vLLM's SecondaryTierManager ----

    def lookup(self, key, req_context):
        """HIT or MISS from the page store's index (no I/O beyond it); never blocks."""
        pk = page_key(key)
        with self._lock:
            self.counters["lookups"] += 1
            if self._closed or pk in self._bad:
                return LookupResult.MISS
            try:
                hit = self._store.exists_local(pk) == 1
            except Exception as e:  # noqa: BLE001
                self._log_once("a lookup", e)
                return LookupResult.MISS
            if not hit and self._worker:
                found = self._worker.verdict(pk)
                if found is None:
                    return LookupResult.RETRY
                hit = found
            self.counters["lookup_hits"] += hit
            return LookupResult.HIT if hit else LookupResult.MISS

    def submit_store(self, job_metadata) -> None:
        """Write the job's chunks from the primary view, zero-copy; returns at once."""
        with self._lock:
            keys = list(job_metadata.keys)
            job = _Job(job_metadata.job_id, keys, [page_key(k) for k in keys], False)
            if self._closed or len(job_metadata.chunk_ids) != len(keys):
                job.results = [-errno.EINVAL] * len(keys)
                self._jobs[job.job_id] = job
                self._finish(job)
                return
            ptrs = self._ptrs(job_metadata.chunk_ids, len(keys))
            parents = self._parents(job_metadata, job.pkeys)
            if self._worker:
                self._jobs[job.job_id] = job
                self._worker.post(("op", job, ptrs, parents))
                return
            self._submit(job, ptrs, parents)

    def submit_load(self, job_metadata) -> None:
        """Read the job's chunks into their primary slots, zero-copy; returns at once."""
        with self._lock:
            keys = list(job_metadata.keys)
            job = _Job(job_metadata.job_id, keys, [page_key(k) for k in keys], True)
            if self._closed or len(job_metadata.chunk_ids) != len(keys):
                job.results = [-errno.EINVAL] * len(keys)
                self._jobs[job.job_id] = job
                self._finish(job)
                return
            ptrs = self._ptrs(job_metadata.chunk_ids, len(keys))
            if self._worker:
                self._jobs[job.job_id] = job
                self._worker.post(("op", job, ptrs, None))
                return
            self._submit(job, ptrs)

    def get_finished_jobs(self):
        with self._lock:
            self._collect(block=False)
            done, self._done = self._done, []
            return done

    def drain_jobs(self) -> None:
        """Wait for every op in flight (none is cut short); their results stay queued for
        get_finished_jobs."""
        with self._lock:
            if not self._worker:
                self._collect(block=True)
                return
            while self._jobs:  # the worker lands them; each a server's timeout at most
                self._cond.wait(0.05)

    def has_pending_work(self) -> bool:
        with self._lock:
            return bool(self._jobs) or bool(self._done)

    def on_schedule_end(self, context) -> None:
        if self._worker:
            self._worker.flush()

    def touch(self, keys, req_context=None):
        with self._lock:
            if self._closed or not keys:
                return
            try:
                self.counters["touched"] += self._store.touch(
                    b"".join(page_key(k) for k in keys))
            except Exception as e:  # noqa: BLE001
                self._log_once("a touch", e)

    def on_new_request(self, req_context):
        return RequestOffloadingContext()

    def on_request_finished(self, req_context) -> None:
        with self._lock:
            self._tails.pop(req_context.req_id, None)

    def take_events(self):
        with self._lock:
            if not self._events:
                return ()
            events, self._events = self._events, []
            return events

    # ---- metrics ----

    _METRICS = {
        # name: (kind, documentation, counters' or the store's field)
        "vllm:kv_offload_kvtier_pages": ("gauge", "Chunks the kvtier tier holds.", "pages"),
        "vllm:kv_offload_kvtier_capacity_pages":
            ("gauge", "Chunks the kvtier tier's capacity holds.", "capacity_pages"),
        "vllm:kv_offload_kvtier_read_bytes":
            ("counter", "Bytes the kvtier tier read from its disk.", "bytes_read"),
        "vllm:kv_offload_kvtier_written_bytes":
            ("counter", "Bytes the kvtier tier wrote to its disk.", "bytes_written"),
        "vllm:kv_offload_kvtier_evicted_chunks":
            ("counter", "Chunks the kvtier tier evicted to stay within its capacity.",
             "evicted"),
        "vllm:kv_offload_kvtier_errors":
            ("counter", "Failed checksums and records, I/O errors and a full disk in the "
             "kvtier tier (each a miss or a chunk not stored).", "errors"),
        "vllm:kv_offload_kvtier_load_failures":
            ("counter", "Chunks the kvtier tier failed to load (vLLM recomputes them).",
             "load_failed"),
        "vllm:kv_offload_kvtier_checksum_failures":
            ("counter", "Chunks whose bytes failed their checksum on load (never served).",
             "load_corrupt"),
        "vllm:kv_offload_kvtier_store_failures":
            ("counter", "Chunks the kvtier tier failed to store.", "store_failed"),
    }

    @classmethod
    def build_metric_definitions(cls, extra_config) -> Dict[str, Any]:
        kinds = {"gauge": getattr(_kv, "OffloadingGaugeMetadata", None),
                 "counter": getattr(_kv, "OffloadingCounterMetadata", None)}
        out = {}
        for name, (kind, doc, _) in cls._METRICS.items():
            meta = kinds[kind]
            if meta is not None:
                out[name] = meta(documentation=doc, labelnames=(_TIER_LABEL,))
        return out

    def kvtier_stats(self) -> dict:
        """The page store's stats and this tier's counters, in one dict."""
        with self._lock:
            out = dict(self._store.stats()) if not self._closed else {}
            out.update(self.counters)
            return out

    def get_stats(self):
        try:
            from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
                OffloadingConnectorStats)
        except Exception:  # noqa: BLE001 - no metrics without vLLM's stats type
            return None
        try:
            now = self.kvtier_stats()
            stats = OffloadingConnectorStats()
            label = (self.tier_type,)
            for name, (kind, _, field) in self._METRICS.items():
                if field not in now:
                    continue
                if kind == "gauge":
                    stats.set_gauge(name, now[field], label)
                    continue
                delta = now[field] - self._reported.get(field, 0)
                self._reported[field] = now[field]
                if delta:
                    stats.increase_counter(name, delta, label)
            return stats
        except Exception as e:  # noqa: BLE001
            self._log_once("gathering stats", e)
            return None

    @classmethod
    def config_info_keys(cls, tier_config) -> tuple:
        return ("kvtier_dir", "kvtier_capacity_bytes", "kvtier_sync", "kvtier_remote")

    def config_info(self):
        return {"kvtier_dir": self.dir, "kvtier_capacity_bytes": self.capacity,
                "kvtier_sync": self.sync, "kvtier_remote": _redact(self.remote)}

    def shutdown(self) -> None:
        """Wait for what is in flight, flush and close the store; release the view."""
        if self._worker:
            self._worker.stop()  # lands every op first
        with self._lock:
            if self._closed:
                return
            try:
                self._collect(block=True)
                self._store.close()
            except Exception as e:  # noqa: BLE001
                self._log_once("closing the page store", e)
            self._closed = True
            self._arr = None  # the export of the primary view, which vLLM releases next


def _start_op(tier, ops: dict, job, ptrs, parents=None) -> None:
    """One op of the job's keys whose chunk ids are valid, kept in ops (op -> (job, the keys'
    places in it)); the rest fail at once, and all of them if the page store refuses the op."""
    idx = [i for i, p in enumerate(ptrs) if p is not None]
    for i, p in enumerate(ptrs):
        if p is None:
            job.results[i] = -errno.EINVAL
    if not idx:
        return
    keys = b"".join(job.pkeys[i] for i in idx)
    try:
        if job.promotion:
            op = tier._store.submit_get(keys, [ptrs[i] for i in idx])
        else:
            par = [parents[i] for i in idx] if parents else None
            op = tier._store.submit_set(keys, [ptrs[i] for i in idx], parent=par)
    except Exception as e:  # noqa: BLE001 - a failed submit fails its keys, no more
        tier._log_once("submitting to the page store", e)
        for i in idx:
            job.results[i] = getattr(e, "code", -errno.EIO)
    else:
        ops[op] = (job, idx)
        job.pending += 1


def _land_ops(tier, ops: dict, block: bool, finish) -> None:
    """The results of the ops in ops that are done (of each, waiting, when block) into their
    jobs; finish(job) for a job with no op left."""
    for op in list(ops):
        try:
            results = tier._store.wait(op, -1 if block else 0)
        except TimeoutError:
            continue
        except Exception as e:  # noqa: BLE001 - cannot tell: its pages failed
            tier._log_once("collecting a page store op", e)
            results = [-errno.EIO] * len(ops[op][1])
        job, idx = ops.pop(op)
        for i, r in zip(idx, results):
            job.results[i] = r
        job.pending -= 1
        if job.pending == 0:
            finish(job)


def _redact(url: Optional[str]) -> str:
    """A URL without its password, for labels and logs."""
    if not url:
        return ""
    out = []
    for part in url.split(","):
        head, at, tail = part.rpartition("@")
        out.append(f"{head.split(':')[0]}:***@{tail}" if at and ":" in head.split("//")[-1]
                   else part)
    return ",".join(out)


class _RemoteWorker:
    """The tier's calls that may wait for the remote server, on a thread of their own: jobs'
    submissions and completions (the chain of disk and server waits for the server on a read
    the disk cannot serve), and the lookups the disk cannot answer, batched per scheduler step
    (RETRY until answered; unanswered past the deadline, a MISS). The tier's lock is taken only
    to hand results over, never across a call into the page store."""

    HIT_TTL = 5.0   # seconds a server's "stored" is believed
    MISS_TTL = 1.0  # and its "not stored" (another engine may store it meanwhile)

    def __init__(self, tier: "KvtierTier", timeout_ms: int):
        import queue

        self.tier = tier
        self.q: "queue.SimpleQueue" = queue.SimpleQueue()
        self.ops: Dict[int, tuple] = {}  # the worker's: op id -> (job, key indices)
        self.deadline = 3 * max(timeout_ms, 1) / 1000 + 0.2
        self.asked: Dict[bytes, float] = {}  # page key -> when first asked (tier lock)
        self.verdicts: Dict[bytes, tuple] = {}  # page key -> (stored, when) (tier lock)
        self.batch: List[bytes] = []  # asked this step, not yet posted (tier lock)
        self.thread = threading.Thread(target=self.run, name="kvtier-remote", daemon=True)
        self.thread.start()

    # ---- the scheduler's side (tier lock held) ----

    def verdict(self, pk: bytes) -> Optional[bool]:
        now = time.monotonic()
        v = self.verdicts.get(pk)
        if v is not None and now - v[1] < (self.HIT_TTL if v[0] else self.MISS_TTL):
            return v[0]
        since = self.asked.get(pk)
        if since is None:
            self.asked[pk] = now
            self.batch.append(pk)
            return None
        return None if now - since < self.deadline else False

    def flush(self) -> None:
        with self.tier._lock:
            batch, self.batch = self.batch, []
            if len(self.verdicts) > 100000:  # forget what has expired
                now = time.monotonic()
                self.verdicts = {k: v for k, v in self.verdicts.items()
                                 if now - v[1] < self.HIT_TTL}
        if batch:
            self.q.put(("lookup", batch))

    def post(self, task) -> None:
        self.q.put(task)

    def stop(self) -> None:
        if self.thread.is_alive():
            self.q.put(("stop",))
            self.thread.join()

    # ---- the worker's side ----

    def run(self) -> None:
        import queue

        while True:
            try:
                task = self.q.get(timeout=0.001 if self.ops else None)
            except queue.Empty:
                task = None
            if task is not None and task[0] == "stop":
                self.land(block=True)
                return
            try:
                if task is not None and task[0] == "lookup":
                    self.lookup(task[1])
                elif task is not None:
                    self.submit(*task[1:])
                self.land(block=False)
            except Exception as e:  # noqa: BLE001 - the thread must live on
                self.tier._log_once("the remote worker", e)

    def lookup(self, keys: List[bytes]) -> None:
        store = self.tier._store
        out = []
        for pk in keys:
            try:
                out.append((pk, store.exists(pk) == 1))
            except Exception as e:  # noqa: BLE001
                self.tier._log_once("a remote lookup", e)
                out.append((pk, False))
        now = time.monotonic()
        with self.tier._lock:
            for pk, found in out:
                self.verdicts[pk] = (found, now)
                self.asked.pop(pk, None)

    def submit(self, job: "_Job", ptrs, parents) -> None:
        _start_op(self.tier, self.ops, job, ptrs, parents)
        if job.pending == 0:
            self._finish(job)

    def land(self, block: bool) -> None:
        _land_ops(self.tier, self.ops, block, self._finish)

    def _finish(self, job: "_Job") -> None:
        with self.tier._lock:
            self.tier._finish(job)
