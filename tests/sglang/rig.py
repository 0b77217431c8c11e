"""SGLang's real pools and cache controllers on a CPU, for the test-sglang suite.

Built here from SGLang 0.5.23's own classes: device pools (MHATokenToKVPool,
MLATokenToKVPool, DSATokenToKVPool, MambaPool) with device="cpu", their host pools
(MHATokenToKVPoolHost, MLATokenToKVPoolHost, DSAIndexerPoolHost, MambaPoolHost, pin_memory
off), HostPoolGroup entries, and HiCacheController or HybridCacheController with their own
prefetch, prefetch-I/O, prefetch-sync and backup threads, the storage backend made by SGLang's
factory from the extra config a user passes. What stays out: no GPU (the "device" pools are CPU
tensors and nothing here moves pages between them and the host pools), no model, no radix tree
and no scheduler: Driver plays the scheduler's part of the storage protocol (queue a backup or a
prefetch, take the hit, allocate host slots, hand the operation to the I/O thread, drain the
acks), as UnifiedRadixCache does.
"""

import ctypes
import os
import queue
import threading
from dataclasses import dataclass

import torch

TIMEOUT = 60  # seconds any wait on a controller queue may take before the test fails


def set_parallel(tp_rank=0, tp_size=1):
    from sglang.srt.runtime_context import get_parallel

    get_parallel().override_permanently(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                                        attn_dcp_size=1, attn_dcp_rank=0)


def extra_config(data_dir, **more):
    """The extra config a user passes with --hicache-storage-backend dynamic."""
    extra = {"backend_name": "kvtier", "module_path": "kvtier.sglang",
             "class_name": "KvtierHiCacheStorage", "interface_v1": 1, "dir": data_dir,
             "capacity": "64M", "hicache_storage_pass_prefix_keys": True}
    extra.update(more)
    return extra


@dataclass
class Geometry:
    page: int = 16
    tokens: int = 1024  # device pool tokens; the host pools hold twice as many
    layers: int = 4
    heads: int = 2
    head_dim: int = 64
    kv_lora_rank: int = 64
    rope_dim: int = 32


def mha_pools(g, layout, layers=None):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    layers = layers or g.layers
    dev = MHATokenToKVPool(size=g.tokens, page_size=g.page, dtype=torch.bfloat16,
                           head_num=g.heads, head_dim=g.head_dim, layer_num=layers,
                           device="cpu", enable_memory_saver=False, enable_alt_stream=False)
    info = dev.get_device_pool_infos()[0].buffer_info
    host = MHATokenToKVPoolHost(info, 2.0, 0, g.page, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=g.tokens, start_layer=0,
                                end_layer=layers)
    return dev, host


def mla_pools(g, layout, dsa=False):
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    if dsa:
        dev = DSATokenToKVPool(size=g.tokens, page_size=g.page, kv_lora_rank=g.kv_lora_rank,
                               dtype=torch.bfloat16, qk_rope_head_dim=g.rope_dim,
                               layer_num=g.layers, device="cpu", index_head_dim=128,
                               enable_memory_saver=False,
                               kv_cache_dim=g.kv_lora_rank + g.rope_dim)
    else:
        dev = MLATokenToKVPool(size=g.tokens, page_size=g.page, dtype=torch.bfloat16,
                               kv_lora_rank=g.kv_lora_rank, qk_rope_head_dim=g.rope_dim,
                               layer_num=g.layers, device="cpu", enable_memory_saver=False)
    info = dev.get_device_pool_infos()[0].buffer_info
    host = MLATokenToKVPoolHost(info, 2.0, 0, g.page, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=g.tokens, start_layer=0,
                                end_layer=g.layers, target_layer_num=g.layers,
                                override_kv_cache_dim=dev.kv_cache_dim)
    return dev, host


def indexer_host(dev, kv_host):
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost, make_dsa_indexer_pool_decl

    return DSAIndexerPoolHost(make_dsa_indexer_pool_decl(dev), kv_host, pin_memory=False)


def mamba_pools(layout, slots=32, tp_size=1):
    from sglang.srt.configs.mamba_utils import (Mamba2CacheParams, Mamba2StateDType,
                                                Mamba2StateShape)
    from sglang.srt.mem_cache.memory_pool import MambaPool
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost

    shape = Mamba2StateShape.create(tp_world_size=tp_size, intermediate_size=128, n_groups=2,
                                    num_heads=4, head_dim=32, state_size=16, conv_kernel=4)
    params = Mamba2CacheParams(shape=shape, layers=[1, 3], dtype=Mamba2StateDType(
        conv=torch.bfloat16, temporal=torch.float32))
    dev = MambaPool(size=slots, spec_state_size=0, cache_params=params, mamba_layer_ids=[1, 3],
                    device="cpu")
    (info,) = dev.get_device_pool_infos()
    host = MambaPoolHost(info.buffer_info, 2.0, 0, device_capacity=slots, pin_memory=False,
                         layout=layout)
    return dev, host


def entry(name, host, dev, layers, anchor=False):
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_pool_entry

    return build_pool_entry(name=name, host_pool=host, device_pool=dev,
                            layer_mapping={i: i for i in range(layers)},
                            transfer_layer_id_max=layers, is_anchor=anchor)


def allocator(dev, g):
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    return TokenToKVPoolAllocator(g.tokens, torch.bfloat16, "cpu", dev, False)


def controller(dev, host, g, extra, tp_group=None):
    """SGLang's HiCacheController over one KV host pool, storage attached at startup."""
    from sglang.srt.managers.cache_controller import HiCacheController

    return HiCacheController(allocator(dev, g), host, g.page, tp_group, threading.Event(),
                             io_backend="direct", storage_backend="dynamic",
                             model_name="test-org/test-model",
                             storage_backend_extra_config=dict(extra))


def hybrid_controller(kv_dev, entries, g, extra, tp_group=None, model="test-org/hybrid"):
    """SGLang's HybridCacheController over a HostPoolGroup (the anchor first)."""
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.pool_host import HostPoolGroup

    return HybridCacheController(allocator(kv_dev, g), HostPoolGroup(entries), g.page, tp_group,
                                 threading.Event(), io_backend="direct",
                                 storage_backend="dynamic", model_name=model,
                                 storage_backend_extra_config=dict(extra),
                                 transfer_layer_id_max=g.layers)


# ---- page bytes, through the host pools' own flat-page methods ----


def fill(pool, slot, seed):
    """Random bytes (from seed) into one page of a host pool, through the pool's own
    set_from_flat_data_page; returns them."""
    gen = torch.Generator().manual_seed(seed)
    dummy = pool.get_dummy_flat_data_page()
    nbytes = dummy.numel() * dummy.element_size()
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    pool.set_from_flat_data_page(slot, data.view(dummy.dtype))
    return data.numpy().tobytes()


def seed_of(key, salt=0):
    """A page's bytes are a function of its key (its token prefix), as real KV is: the same
    prefix written twice is the same bytes."""
    return (int(key[:15], 16) * 31 + salt) % (1 << 62)


def page_bytes(pool, slot):
    page = pool.get_data_page(slot, flat=True).contiguous()
    return page.view(torch.uint8).numpy().tobytes()


def region_bytes(pool, indices):
    """A KV page's bytes as the zero-copy path sees them (get_page_buffer_meta)."""
    ptrs, sizes = pool.get_page_buffer_meta(indices)
    return b"".join(ctypes.string_at(p, n) for p, n in zip(ptrs, sizes))


def page_slots(first_slot, pages, page):
    return torch.arange(first_slot, first_slot + pages * page, dtype=torch.int64)


def damage(data_dir, every=64 << 10, length=4096):
    """Overwrite bytes across every slab file below data_dir; returns how many bytes."""
    hurt = 0
    for root, _, files in os.walk(data_dir):
        for name in files:
            if not name.endswith(".slab"):
                continue
            path = os.path.join(root, name)
            size = os.path.getsize(path)
            with open(path, "r+b") as f:
                for at in range(every // 2, size, every):
                    f.seek(at)
                    f.write(b"\x5a" * min(length, size - at))
                    hurt += min(length, size - at)
    return hurt


# ---- the scheduler's side of the storage protocol ----


def _get(q, what):
    try:
        return q.get(timeout=TIMEOUT)
    except queue.Empty:
        raise AssertionError(f"no {what} from the controller in {TIMEOUT} s") from None


class Driver:
    """Queues backups and prefetches on a controller and collects what its threads did."""

    def __init__(self, ctl):
        self.ctl, self.page = ctl, ctl.page_size
        self.hybrid = hasattr(ctl, "submit_prefetch")

    def keys(self, tokens):
        from sglang.srt.mem_cache.utils import get_storage_hash_str

        return get_storage_hash_str(tokens, None, page_size=self.page)

    def backup(self, host_indices, tokens, extra_pools=None, prefix_keys=()):
        """write_storage, then the backup thread's ack: the KV tokens it stored."""
        keys = self.keys(tokens)
        if self.hybrid:
            self.ctl.write_storage(host_indices, tokens, hash_value=keys,
                                   prefix_keys=list(prefix_keys), extra_pools=extra_pools)
        else:
            self.ctl.write_storage(host_indices, tokens, hash_value=keys,
                                   prefix_keys=list(prefix_keys))
        op = _get(self.ctl.ack_backup_queue, "backup ack")
        return op.completed_tokens, op

    def prefetch(self, tokens, extra_pools=None, rid="r"):
        """prefetch, the hit query's answer, host slots for it (KV and each pool's trailing
        window), the I/O thread's transfer, and its acks. Returns (hit tokens, loaded
        tokens, pool hits, KV host indices, the operation)."""
        ctl = self.ctl
        if self.hybrid:
            from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

            ctl.prefetch(CacheRequestHandle(rid, 0), tokens, None, prefix_keys=[],
                         extra_pools=extra_pools)
        else:
            ctl.prefetch(rid, tokens, None, [])
        op = _get(ctl.prefetch_hit_queue, "prefetch hit")
        hit = op.storage_hit_count
        if hit == 0:
            return 0, 0, {}, None, op
        if self.hybrid:
            host_indices, got = ctl.allocate_storage_hit(op, hit, allow_partial=False,
                                                         min_tokens=0, evict_host=lambda n: 0)
            assert host_indices is not None and got == hit, "no host room for the hit"
            for t in op.pool_transfers or []:
                if t.host_indices is not None or t.indices_from_pool is not None:
                    continue
                pool = ctl.mem_pool_host.entry_map[t.name].host_pool
                n = min(len(t.keys or ()), hit // self.page) * pool.page_size
                t.host_indices = pool.alloc(n)
                assert t.host_indices is not None, f"no {t.name} host room"
        else:
            host_indices = ctl.mem_pool_host.alloc(hit)
        op.host_indices = host_indices
        ctl.prefetch_buffer.put(op)
        loaded, pool_hits = 0, {}
        while True:
            ack = _get(ctl.ack_prefetch_queue, "prefetch ack")
            if ack.completed_tokens is not None:
                loaded = max(loaded, ack.completed_tokens)
            if ack.pool_hits:
                pool_hits.update({str(k): v for k, v in ack.pool_hits.items()})
            if ack.completed_req:
                break
        return hit, loaded, pool_hits, host_indices, op
