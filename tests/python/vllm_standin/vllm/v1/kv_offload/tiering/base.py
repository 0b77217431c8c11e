"""Stand-in for vllm/v1/kv_offload/tiering/base.py: the secondary tier's interface."""
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Collection, Optional

import numpy as np

from vllm.v1.kv_offload.base import Medium

TIER_LABEL = "tier"


@dataclass
class TransferJob:
    job_id: int
    keys: Collection[bytes]
    chunk_ids: np.ndarray
    is_promotion: bool
    req_context: Any
    submit_time: float = field(default_factory=time.monotonic)


@dataclass
class JobResult:
    job_id: int
    success: bool
    successful_keys: Optional[Collection[bytes]] = None
    transfer_time: Optional[float] = None
    transfer_bytes: Optional[int] = None


class SecondaryTierManager(ABC):
    """The methods and the constructor vLLM 0.33.0's tiering manager uses."""

    medium: ClassVar[Optional[Medium]] = None
    tolerates_off_thread_polling: ClassVar[bool] = False

    def __init__(self, offloading_spec, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector=None) -> None:
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        assert primary_kv_view.strides is not None
        self._block_size_bytes = primary_kv_view.strides[0]
        self.tier_type = tier_type
        self.locality = None
        self._bp_detector = backpressure_detector

    @property
    def block_size_bytes(self) -> int:
        return self._block_size_bytes

    @abstractmethod
    def lookup(self, key, req_context): ...

    @abstractmethod
    def submit_store(self, job_metadata) -> None: ...

    @abstractmethod
    def submit_load(self, job_metadata) -> None: ...

    @abstractmethod
    def get_finished_jobs(self): ...

    @abstractmethod
    def on_new_request(self, req_context): ...

    @abstractmethod
    def drain_jobs(self) -> None: ...

    def has_pending_work(self) -> bool:
        return False

    def take_events(self):
        return ()

    def touch(self, keys, req_context):
        return

    def on_request_finished(self, req_context) -> None:
        return

    def on_schedule_end(self, context) -> None:
        return

    def shutdown(self) -> None:
        return

    @classmethod
    def build_metric_definitions(cls, extra_config):
        return {}

    def get_stats(self):
        return None

    @classmethod
    def config_info_keys(cls, tier_config):
        return ()

    def config_info(self):
        return {}
