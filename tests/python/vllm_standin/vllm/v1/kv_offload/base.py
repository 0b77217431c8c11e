"""Stand-in for vllm/v1/kv_offload/base.py: keys, lookup results, media, request context."""
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, NamedTuple, Optional


def make_offload_key(block_hash: bytes, group_idx: int) -> bytes:
    """A block hash and its KV-cache group, 4 bytes big-endian after it, as vLLM packs them."""
    return bytes(block_hash) + int(group_idx).to_bytes(4, "big")


class Medium(Enum):
    CPU = "CPU"
    STORAGE = "STORAGE"


class Locality(Enum):
    LOCAL = "LOCAL"
    REMOTE = "REMOTE"


class LookupResult(Enum):
    MISS = auto()
    HIT = auto()
    HIT_PENDING = auto()
    RETRY = auto()


class OffloadPolicy(Enum):
    CHUNK_LEVEL = "chunk_level"
    REQUEST_LEVEL = "request_level"


@dataclass
class RequestOffloadingContext:
    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: Optional[dict] = None
    _positions: dict = field(default_factory=dict, repr=False)

    def set_offload_key_position(self, key: bytes, end_token: int) -> None:
        self._positions[key] = end_token

    def get_offload_key_position(self, key: bytes) -> Optional[int]:
        return self._positions.get(key)


class ScheduleEndContext(NamedTuple):
    new_req_ids: Any
    preempted_req_ids: Any


@dataclass
class OffloadingEvent:
    keys: list
    medium: Medium
    removed: bool
    locality: Optional[Locality] = None
    ownership: Optional[str] = None


@dataclass(frozen=True)
class OffloadingMetricMetadata:
    documentation: str
    labelnames: tuple = ()


@dataclass(frozen=True)
class OffloadingCounterMetadata(OffloadingMetricMetadata):
    pass


@dataclass(frozen=True)
class OffloadingGaugeMetadata(OffloadingMetricMetadata):
    multiprocess_mode: str = "mostrecent"
