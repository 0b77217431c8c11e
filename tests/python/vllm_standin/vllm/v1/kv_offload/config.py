"""Stand-in for vllm/v1/kv_offload/config.py: what an OffloadingSpec's config holds."""
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class OffloadingGroupConfig:
    tokens_per_block: int
    layer_names: tuple
    group_id: int = 0


@dataclass(frozen=True)
class OffloadingModelConfig:
    name: str
    dtype: str


@dataclass(frozen=True)
class OffloadingCacheConfig:
    tokens_per_hash: int
    blocks_per_chunk: int


@dataclass(frozen=True)
class OffloadingParallelConfig:
    rank: int = 0
    world_size: int = 1
    tp_size: int = 1
    pp_size: int = 1
    pcp_size: int = 1
    dcp_size: int = 1
    data_parallel_index: int = 0
    data_parallel_size: int = 1
    data_parallel_rank_local: Optional[int] = None
    is_parallelism_agnostic: bool = False


@dataclass(frozen=True)
class OffloadingConfig:
    groups: tuple
    worker_kv_bytes_per_block: int
    enable_kv_cache_events: bool
    extra_config: Mapping[str, Any]
    engine_id: str
    model: OffloadingModelConfig
    cache: OffloadingCacheConfig
    parallel: OffloadingParallelConfig = field(default_factory=OffloadingParallelConfig)
    replicated_layout: bool = False
    canonical_layout: bool = False
    kv_cache_layout: Optional[str] = None
