"""vLLM's secondary-tier interface per release generation, stated as facts for the contract
tests (test_vllm_contract.py). Test-only: never installed or shipped.

Each generation below restates, in this project's words, what vLLM's
``vllm/v1/kv_offload/tiering/base.py`` and ``tiering/factory.py`` declare at the release tag
named (docs/engines.md cites commit and lines): the abstract method set, each method's
parameters, the job and result dataclasses' fields, and the exact call the factory makes to
construct a tier. The ``Engine`` class drives a tier the way that generation's
``TieringOffloadingManager`` does: construction through the factory's call, cascaded stores,
lookups, promotions (loads) into primary rows, polling for finished jobs.

What only a real engine can check (python -m cxlkv.integrations.check does, where vLLM is
installed): that the installed release really has these signatures; that its
``OffloadingSpec`` carries ``vllm_config`` with the model, parallel and cache configs read here;
the real primary view (vLLM's shared mmap region and its row stride); the scheduler's call
order under load, and the block hashes' equality across processes (PYTHONHASHSEED).
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

# ---- types shared by the generations (vllm/v1/kv_offload/base.py) ------------------------------


@dataclass
class ReqContext:
    """Per-request context passed to lookup/touch (req_id, kv_transfer_params)."""

    req_id: str
    kv_transfer_params: Optional[dict] = None


@dataclass
class RequestOffloadingContext:
    """What on_new_request returns: a tier's offloading preference for the request."""

    policy: str = "chunk_level"


class LookupResult(enum.Enum):
    """The lookup answer of 0.26+: MISS, HIT, HIT_PENDING, RETRY (vllm/v1/kv_offload/base.py)."""

    MISS = enum.auto()
    HIT = enum.auto()
    HIT_PENDING = enum.auto()
    RETRY = enum.auto()


class Medium(enum.Enum):
    """0.32+ tiers declare a storage medium class attribute."""

    CPU = "CPU"
    STORAGE = "STORAGE"


# ---- job and result dataclasses (tiering/base.py) ----------------------------------------------


@dataclass
class JobMetadata:
    """0.22-0.31: job_id, keys, block_ids (primary rows), is_promotion, req_context."""

    job_id: int
    keys: Sequence[bytes]
    block_ids: np.ndarray
    is_promotion: bool
    req_context: Any


@dataclass
class TransferJob:
    """0.32+: blocks renamed chunks: job_id, keys, chunk_ids, is_promotion, req_context."""

    job_id: int
    keys: Sequence[bytes]
    chunk_ids: np.ndarray
    is_promotion: bool
    req_context: Any


@dataclass
class JobResultV22:
    """0.22-0.31: job_id, success."""

    job_id: int
    success: bool


@dataclass
class JobResultV32:
    """0.32+: job_id, success, and optional successful_keys, transfer_time, transfer_bytes."""

    job_id: int
    success: bool
    successful_keys: Optional[Sequence[bytes]] = None
    transfer_time: Optional[float] = None
    transfer_bytes: Optional[int] = None


# ---- the base classes, one per generation -----------------------------------------------------


class _BaseCommon(abc.ABC):
    """The constructor every released generation has: (offloading_spec, primary_kv_view,
    tier_type), stored on the instance."""

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str
                 ) -> None:
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        self.tier_type = tier_type

    def touch(self, keys: Any, req_context: Any) -> None:
        return None

    def shutdown(self) -> None:
        return None


class SecondaryTierManagerV22(_BaseCommon):
    """v0.22.x: abstract lookup (-> bool | None), submit_store, submit_load, get_finished."""

    @abc.abstractmethod
    def lookup(self, key: bytes, req_context: Any) -> Optional[bool]: ...

    @abc.abstractmethod
    def submit_store(self, job_metadata: JobMetadata) -> None: ...

    @abc.abstractmethod
    def submit_load(self, job_metadata: JobMetadata) -> None: ...

    @abc.abstractmethod
    def get_finished(self) -> List[JobResultV22]: ...

    def get_request_offloading_context(self, req_context: Any) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def request_finished(self, req_context: Any) -> None:
        return None


class SecondaryTierManagerV23(_BaseCommon):
    """v0.23-v0.24: get_finished_jobs replaces get_finished; on_new_request is abstract."""

    @abc.abstractmethod
    def lookup(self, key: bytes, req_context: Any) -> Optional[bool]: ...

    @abc.abstractmethod
    def submit_store(self, job_metadata: JobMetadata) -> None: ...

    @abc.abstractmethod
    def submit_load(self, job_metadata: JobMetadata) -> None: ...

    @abc.abstractmethod
    def get_finished_jobs(self) -> List[JobResultV22]: ...

    @abc.abstractmethod
    def on_new_request(self, req_context: Any) -> RequestOffloadingContext: ...

    def on_request_finished(self, req_context: Any) -> None:
        return None


class SecondaryTierManagerV24(SecondaryTierManagerV23):
    """The v0.24.0 release branch as read (neuralmagic/vllm branch varun/v0.24.0 at
    217c64a976, below its owner's own commits; tiering/base.py): as v0.23, plus abstract
    drain_jobs (:212) and has_pending_work (:156, optional); lookup still -> bool | None
    (:74), JobMetadata.block_ids (:29)."""

    @abc.abstractmethod
    def drain_jobs(self) -> None: ...


class SecondaryTierManagerV26Drain(SecondaryTierManagerV23):
    """vLLM main after the LookupResult change (neuralmagic/vllm bb61177e49, 2026-06-24):
    LookupResult lookups (:83) and abstract drain_jobs (:221), block_ids (:38): what a release
    cut from main after 2026-06-24 declares."""

    @abc.abstractmethod
    def lookup(self, key: bytes, req_context: Any) -> LookupResult: ...

    @abc.abstractmethod
    def drain_jobs(self) -> None: ...


class SecondaryTierManagerV25(SecondaryTierManagerV23):
    """The v0.25.0 tag (702f4814; v0.25.1 at 752a3a50 has the same tiering/base.py, blob
    b022e1f2): abstract lookup -> LookupResult (:84), submit_store (:100), submit_load (:128),
    get_finished_jobs (:153), on_new_request (:185), drain_jobs (:222); optional
    has_pending_work (:166), touch (:174), on_request_finished (:197), on_schedule_end (:213),
    shutdown (:238); JobMetadata.block_ids (:39), JobResult(job_id, success) (:45-49); no
    take_events."""

    @abc.abstractmethod
    def lookup(self, key: bytes, req_context: Any) -> LookupResult: ...

    @abc.abstractmethod
    def drain_jobs(self) -> None: ...


class SecondaryTierManagerV26(SecondaryTierManagerV25):
    """The v0.26.0 tag (568afb3a): as v0.25.0 (lookup :129, drain_jobs :280 abstract), plus
    optional take_events (:219, default none) and serve_external_requests(parent) (:262)."""

    def take_events(self) -> Any:
        return ()

    def serve_external_requests(self, parent: Any) -> None:
        return None


class SecondaryTierManagerV32(_BaseCommon):
    """v0.32+: TransferJob with chunk_ids; drain_jobs is abstract. Tiers declare a ``medium``
    class attribute (a Medium) and ``serves_external_requests`` (False: not serviced off the
    scheduler thread)."""

    serves_external_requests = False

    @abc.abstractmethod
    def lookup(self, key: bytes, req_context: Any) -> LookupResult: ...

    @abc.abstractmethod
    def submit_store(self, job_metadata: TransferJob) -> None: ...

    @abc.abstractmethod
    def submit_load(self, job_metadata: TransferJob) -> None: ...

    @abc.abstractmethod
    def get_finished_jobs(self) -> List[JobResultV32]: ...

    @abc.abstractmethod
    def on_new_request(self, req_context: Any) -> RequestOffloadingContext: ...

    @abc.abstractmethod
    def drain_jobs(self) -> None: ...

    def on_request_finished(self, req_context: Any) -> None:
        return None

    def serve_external_requests(self, parent: Any) -> None:
        return None


# ---- tier-owned KV events (vLLM PR #46544) -----------------------------------------------------
#
# Read on vLLM's main branch after the PR (neuralmagic/vllm, a fork that follows main, at
# c46ced1ee3fa, 2026-07-07, and at 017e9f4448b7, 2026-08-17; the release that first ships it is
# not established, docs/engines.md): SecondaryTierManager gains take_events() (default: no
# events; tiering/base.py:246 at 017e9f44), TieringOffloadingManager.take_events yields the
# primary tier's events and then each secondary tier's (tiering/manager.py), and the connector's
# event tracker turns each OffloadingEvent into BlockStored under the engine's block hashes with
# the parent hash and token ids it recorded for the request, medium by the Medium
# (offloading/events.py, _take_stored_event). OffloadingEvent: keys, medium (a Medium),
# removed, locality (a Locality or None; base.py:154). The fs tier creates its events list only
# when its enable_kv_events is set and offloading_spec.kv_events_config.enable_kv_cache_events
# is on.


class Locality(enum.Enum):
    LOCAL = "LOCAL"
    REMOTE = "REMOTE"


@dataclass
class OffloadingEvent:
    keys: List[bytes]
    medium: Medium
    removed: bool
    locality: Optional[Locality] = None


@dataclass
class KVEventsConfig:
    enable_kv_cache_events: bool = False


@dataclass
class OffloadingEventV26:
    """v0.26.0 tag (vllm/v1/kv_offload/base.py:107-113): there is no Medium enum; the medium
    is a str, vLLM's own tiers naming theirs by vllm/distributed/kv_events.py's constants
    (:45-48: MEDIUM_GPU "GPU", MEDIUM_CPU "CPU", MEDIUM_FS "FS", MEDIUM_OBJ "OBJ"), and the
    connector copies it into BlockStored/BlockRemoved (offloading/events.py:237, :252, :293)."""

    keys: List[bytes]
    medium: str
    removed: bool
    locality: Optional[Locality] = None


@dataclass
class OffloadingEventV25:
    """v0.25.0 tag (vllm/v1/kv_offload/base.py:111-116): keys, medium (a str), removed."""

    keys: List[bytes]
    medium: str
    removed: bool


@dataclass
class TransferJobBlocks:
    """vLLM's main by 2026-08-17 (neuralmagic/vllm 017e9f44, tiering/base.py:60-65): the job
    dataclass is named TransferJob but still names its primary rows block_ids; the rename to
    chunk_ids is PR #52615 (docs/engines.md). Exposed as ``TransferJob`` (release_modules)."""

    job_id: int
    keys: Sequence[bytes]
    block_ids: np.ndarray
    is_promotion: bool
    req_context: Any


class SecondaryTierManagerV28(SecondaryTierManagerV26):
    """The 0.28 shape (no tag or release page read; docs/engines.md): the v0.26.0 abstract
    set and LookupResult lookups, jobs as TransferJob(block_ids), tiers declaring ``medium``
    (a Medium, PR #48123), take_events yielding OffloadingEvent with a Medium."""

    serves_external_requests = False


class SecondaryTierManagerV32Events(SecondaryTierManagerV32):
    """v0.32.0 (docs.vllm.ai's release page; docs/engines.md) with tier-owned events:
    take_events() optional, yielding nothing by default."""

    def take_events(self) -> Any:
        return ()


@dataclass
class TierFilter:
    """A request's load tier filter (PR #48123, as the obj tier's lookup reads it:
    ``req_context.load_tier_filter.allows(medium)``): here, the mediums it allows."""

    mediums: Sequence[Medium]

    def allows(self, medium: Medium) -> bool:
        return medium in self.mediums


@dataclass
class ReqContextFiltered(ReqContext):
    load_tier_filter: Optional[TierFilter] = None


class SecondaryTierManagerUnknownShape(SecondaryTierManagerV26):
    """No release: a made-up base for the check's test of a shape no generation has (the
    v0.26.0 interface with one more abstract method, ``lookup_batch``)."""

    @abc.abstractmethod
    def lookup_batch(self, keys: Sequence[bytes], req_context: Any) -> List[LookupResult]: ...


#: What each release's modules hold (release_modules): the base class, its job and result
#: dataclasses, its OffloadingEvent, and whether vllm.v1.kv_offload.base has Locality and a
#: Medium enum. "unknown-shape" is no release (SecondaryTierManagerUnknownShape).
RELEASES: Dict[str, Dict[str, Any]] = {
    "v0.25.0": dict(base=SecondaryTierManagerV25, job=JobMetadata, result=JobResultV22,
                    event=OffloadingEventV25, locality=False, medium=False),
    "v0.26.0": dict(base=SecondaryTierManagerV26, job=JobMetadata, result=JobResultV22,
                    event=OffloadingEventV26, locality=True, medium=False),
    # The 0.28 shape: main by 2026-08-17, not a tag or release page (docs/engines.md).
    "0.28-shape": dict(base=SecondaryTierManagerV28, job=TransferJobBlocks,
                       result=JobResultV22, event=OffloadingEvent, locality=True, medium=True),
    # docs.vllm.ai's v0.32.0 release page (docs/engines.md), not a tag.
    "v0.32.0": dict(base=SecondaryTierManagerV32Events, job=TransferJob, result=JobResultV32,
                    event=OffloadingEvent, locality=True, medium=True),
    "unknown-shape": dict(base=SecondaryTierManagerUnknownShape, job=JobMetadata,
                          result=JobResultV22, event=OffloadingEventV26, locality=True,
                          medium=False),
}

#: The name each job dataclass has in vllm.v1.kv_offload.tiering.base.
JOB_NAMES = {JobMetadata: "JobMetadata", TransferJobBlocks: "TransferJob",
             TransferJob: "TransferJob"}


def release_modules(tag: str, version: str) -> Dict[str, Any]:
    """The modules an installed vLLM of release `tag` (a key of :data:`RELEASES`) gives the
    adapter's import (cxlkv.integrations.vllm._from_installed_vllm), holding only the facts
    above: vllm (``__version__``), vllm.v1.kv_offload.base (LookupResult,
    RequestOffloadingContext, OffloadingEvent; Locality and Medium where the release has them)
    and vllm.v1.kv_offload.tiering.base (SecondaryTierManager, the job dataclass, JobResult)."""
    import types

    r = RELEASES[tag]
    mods = {name: types.ModuleType(name) for name in (
        "vllm", "vllm.v1", "vllm.v1.kv_offload", "vllm.v1.kv_offload.base",
        "vllm.v1.kv_offload.tiering", "vllm.v1.kv_offload.tiering.base")}
    mods["vllm"].__version__ = version
    kvbase = mods["vllm.v1.kv_offload.base"]
    kvbase.LookupResult = LookupResult
    kvbase.RequestOffloadingContext = RequestOffloadingContext
    kvbase.OffloadingEvent = r["event"]
    if r["locality"]:
        kvbase.Locality = Locality
    if r["medium"]:
        kvbase.Medium = Medium
    tbase = mods["vllm.v1.kv_offload.tiering.base"]
    tbase.SecondaryTierManager = r["base"]
    setattr(tbase, JOB_NAMES[r["job"]], r["job"])
    tbase.JobResult = r["result"]
    for name, mod in mods.items():
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(mods[parent], leaf, mod)
    return mods


class SecondaryTierManagerEvents(SecondaryTierManagerV32):
    """0.32 with tier-owned events: take_events() is optional and yields nothing by default."""

    def take_events(self) -> Any:
        return ()


# ---- the factory's call (tiering/factory.py), the same in every release read --------------------

# From v0.28.0 (PR #51007, merged 2026-08-04, after the 0.27.x branch was cut on 2026-08-03;
# docs/engines.md): an entry of secondary_tiers may carry module_path; the factory removes it
# from the config and, for a type not registered, imports module_path and constructs the
# class named by type from it, with the same keyword call. No register_tier, no plugin.


def create_secondary_tier_module_path(registry: Dict[str, type], tier_config: dict,
                                      primary_kv_view: memoryview,
                                      offloading_spec: Any) -> Any:
    """SecondaryTierFactory.create_secondary_tier from v0.28.0: as below, plus module_path."""
    import importlib

    config = dict(tier_config)
    tier_type = config.pop("type", None)
    module_path = config.pop("module_path", None)
    if not tier_type:
        raise ValueError("Secondary tier configuration must include 'type'")
    if tier_type in registry:
        tier_cls = registry[tier_type]
    elif module_path:
        tier_cls = getattr(importlib.import_module(module_path), tier_type)
    else:
        raise ValueError(f"Unknown secondary tier type: {tier_type!r}")
    return tier_cls(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                    tier_type=tier_type, **config)



def create_secondary_tier(registry: Dict[str, type], tier_config: dict,
                          primary_kv_view: memoryview, offloading_spec: Any) -> Any:
    """SecondaryTierFactory.create_secondary_tier: copy the config, pop 'type' (required,
    registered), construct with keywords and the rest of the config."""
    config = dict(tier_config)
    tier_type = config.pop("type", None)
    if not tier_type:
        raise ValueError("Secondary tier configuration must include 'type'")
    if tier_type not in registry:
        raise ValueError(f"Unknown secondary tier type: {tier_type!r}")
    tier_cls = registry[tier_type]
    return tier_cls(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                    tier_type=tier_type, **config)


# ---- what the engine hands a tier --------------------------------------------------------------


@dataclass
class ModelConfig:
    model: str
    dtype: str = "bfloat16"


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_rank: int = 0


@dataclass
class CacheConfig:
    cache_dtype: str = "auto"


@dataclass
class VllmConfig:
    model_config: ModelConfig
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)


@dataclass
class OffloadingSpec:
    """The spec object the factory passes as offloading_spec (its vllm_config; with
    tier-owned events also kv_events_config)."""

    vllm_config: VllmConfig
    kv_events_config: KVEventsConfig = field(default_factory=KVEventsConfig)


@dataclass(frozen=True)
class Generation:
    """One generation as the tests drive it."""

    name: str
    tag: str  # the tag or release page read ("": none, docs/engines.md)
    version: str  # a release inside the generation
    base: type
    job_cls: type
    ids_field: str
    result_cls: type
    finished: str  # the polling method's name
    lookup_enum: bool
    on_new_request: bool
    drain_jobs: bool

    def job(self, job_id: int, keys: Sequence[bytes], ids: Any, promotion: bool,
            ctx: Any) -> Any:
        return self.job_cls(**{"job_id": job_id, "keys": list(keys), self.ids_field: ids,
                               "is_promotion": promotion, "req_context": ctx})

    def found(self, answer: Any) -> Optional[bool]:
        """A lookup answer as True (readable) / False (missing) / None (retry)."""
        if not self.lookup_enum:
            return answer
        return {LookupResult.HIT: True, LookupResult.MISS: False,
                LookupResult.RETRY: None, LookupResult.HIT_PENDING: None}[answer]


GENERATIONS: List[Generation] = [
    Generation("0.22", "v0.22.1", "0.22.1", SecondaryTierManagerV22, JobMetadata, "block_ids",
               JobResultV22, "get_finished", False, False, False),
    Generation("0.23", "v0.23.0", "0.24.1", SecondaryTierManagerV23, JobMetadata, "block_ids",
               JobResultV22, "get_finished_jobs", False, True, False),
    Generation("0.26", "v0.26.0", "0.26.0", SecondaryTierManagerV26, JobMetadata, "block_ids",
               JobResultV22, "get_finished_jobs", True, True, True),
    Generation("0.28", "", "0.28.0", SecondaryTierManagerV28, TransferJobBlocks, "block_ids",
               JobResultV22, "get_finished_jobs", True, True, True),
    Generation("0.32", "v0.32.0", "0.32.0", SecondaryTierManagerV32, TransferJob, "chunk_ids",
               JobResultV32, "get_finished_jobs", True, True, True),
]


def poll(finished: Callable[[], Any], want: int, timeout_s: float = 10.0) -> List[Any]:
    """Polls a tier's finished-jobs method, as the manager does each step, until `want`
    results arrived."""
    import time

    out: List[Any] = []
    end = time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < end:
        out.extend(finished())
        time.sleep(0.002)
    return out
