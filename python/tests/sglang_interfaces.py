"""SGLang's HiCache storage-backend interface, stated as facts for the contract tests
(test_sglang_contract.py). Test-only: never installed or shipped.

Restated in this project's words from ``python/sglang/srt/mem_cache/hicache_storage.py``,
``storage/backend_factory.py`` and ``cache_controller.py`` (docs/engines.md cites the tag,
commit and lines): the base class's abstract and default methods, the config dataclass every
rank's backend gets, the extra-info dataclass, how the ``dynamic`` backend is constructed,
and how the controller picks the zero-copy path.

What only a real engine can check (python -m cxlkv.integrations.check does, where SGLang is
installed): the installed release's signatures; its real host pools (``layout``, ``dtype``,
``get_page_buffer_meta`` for each layout, MLA pools); the controller's threads and call order;
and a multi-rank launch where every rank builds its backend in its own process.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, List, Optional


@dataclass
class HiCacheStorageConfig:
    """What every rank's backend is given. dp_rank/dp_size, tp_lcm_size, should_split_heads
    and extra_config have defaults; the rest are required."""

    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    """Passed to batch_exists / batch_get_v1 / batch_set_v1: the prefix's earlier keys.

    The default of prefix_keys is ``(None,)`` at every tag from v0.5.4 (1053e1be,
    hicache_storage.py:39) to v0.5.9 (bbe9c7ee, :61); main made it None after 0.5.9 (#25252,
    "typo defaults"). v0.5.3 has no prefix_keys (:38-39 at a4a3d823). SGLang's own controller
    always passes prefix_keys: the node's earlier page hashes, or None when
    hicache_storage_pass_prefix_keys is off (hiradix_cache.py:639-643, scheduler.py:1666-1670,
    cache_controller.py:838, :899, :1000 at v0.5.9). So None means "no prefix keys"."""

    prefix_keys: Optional[List[str]] = (None,)  # type: ignore[assignment]
    extra_info: Optional[dict] = None


class HiCacheStorage(abc.ABC):
    """Abstract: get, batch_get, set, batch_set, exists. Defaults: register_mem_pool_host
    (keeps the pool as mem_pool_host), batch_exists (exists() until the first miss),
    batch_get_v1/batch_set_v1 (raise NotImplementedError), clear, get_stats."""

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        raise NotImplementedError()

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        raise NotImplementedError()

    @abc.abstractmethod
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any: ...

    @abc.abstractmethod
    def batch_get(self, keys: List[str], target_locations: Any = None,
                  target_sizes: Any = None) -> Any: ...

    @abc.abstractmethod
    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool: ...

    @abc.abstractmethod
    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool: ...

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        for i, k in enumerate(keys):
            if not self.exists(k):
                return i
        return len(keys)

    def clear(self) -> None:
        return None

    def get_stats(self) -> Any:
        return None


def create_dynamic_backend(storage_config: HiCacheStorageConfig, **kwargs: Any) -> Any:
    """StorageBackendFactory for backend 'dynamic': extra_config must name backend_name,
    module_path, class_name; the class is imported, must subclass HiCacheStorage, and is
    constructed as backend_class(storage_config, kwargs) (kwargs: create_backend's extra
    keyword arguments, as one dict)."""
    import importlib

    cfg = storage_config.extra_config
    for f in ("backend_name", "module_path", "class_name"):
        if f not in cfg:
            raise ValueError(f"Missing required field '{f}' in backend config for 'dynamic' "
                             "backend")
    cls = getattr(importlib.import_module(cfg["module_path"]), cfg["class_name"])
    if not issubclass(cls, HiCacheStorage):
        raise TypeError(f"Backend class {cfg['class_name']} must inherit from HiCacheStorage")
    return cls(storage_config, kwargs)


def zero_copy(extra_config: Dict[str, Any], version: str) -> bool:
    """cache_controller: from 0.5.6 (PR #13140; cache_controller.py:318-326 at the 0.5.6
    version commit 7ae368efd) a dynamic backend gets the zero-copy page get/set (batch_*_v1 by
    host indices) when extra_config's interface_v1 is truthy; otherwise, and always on
    0.5.3-0.5.5.x (:309-315 at 0.5.3's a4a3d8239: only hf3fs, mooncake, eic), the generic
    copy path."""
    major_minor_patch = tuple(int(x) for x in version.split(".")[:3])
    return major_minor_patch >= (0, 5, 6) and bool(extra_config.get("interface_v1", 0))


def rank_configs(extra_config: Dict[str, Any], model: str, *, tp_size: int = 1,
                 dp_size: int = 1, mla: bool = False) -> List[HiCacheStorageConfig]:
    """The configs of every rank of one engine: the same extra_config for each."""
    return [HiCacheStorageConfig(tp, tp_size, 0, 1, 0, 1, mla, False, True, model, dp, dp_size,
                                 extra_config=dict(extra_config))
            for dp in range(dp_size) for tp in range(tp_size)]


# ---- 0.5.3 and 0.5.6: what a rank's backend can see --------------------------------------------
#
# Read at the release commits (docs/engines.md): HiCacheStorageConfig holds tp_rank, tp_size,
# is_mla_model, is_page_first_layout, model_name and extra_config only (hicache_storage.py:28 at
# 0.5.3's a4a3d8239365, :47 at 0.5.6's 7ae368efde14). The cache controller fills it in every
# scheduler process (cache_controller.py _generate_storage_config, :361-387 at 0.5.3, :372-398 at
# 0.5.6): with DP attention tp_rank/tp_size are the attention TP rank and size and the DP rank is
# computed but not passed; without it, the TP rank and size. So every DP replica and every PP
# stage of one TP rank gets an equal config. The host pool a backend is registered with
# (HostKVCache, memory_pool_host.py:70-71 at 0.5.3, :83-84 at 0.5.6) copies its device pool's
# start_layer and end_layer, the stage's first and last layer (inclusive: KVCache's default
# end_layer is layer_num - 1, memory_pool.py:338-340 at 0.5.3).


@dataclass
class HiCacheStorageConfig053:
    """The config of 0.5.3 and 0.5.6 (no PP, DP or CP rank)."""

    tp_rank: int
    tp_size: int
    is_mla_model: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    extra_config: Optional[dict] = None


@dataclass
class RankOf053:
    """One rank of a 0.5.3/0.5.6 engine: the config its backend gets, and the layers its host
    pool holds (start_layer, end_layer inclusive). dp_rank and pp_rank are the engine's, which
    the backend is not told."""

    config: HiCacheStorageConfig053
    start_layer: int
    end_layer: int
    dp_rank: int
    pp_rank: int


def rank_configs_053(extra_config: Dict[str, Any], model: str, *, layers: int, tp_size: int = 1,
                     dp_size: int = 1, pp_size: int = 1) -> List[RankOf053]:
    """Every rank of one engine at 0.5.3/0.5.6: PP stages split the layers evenly."""
    per = layers // pp_size
    return [RankOf053(HiCacheStorageConfig053(tp, tp_size, False, True, model,
                                              dict(extra_config)),
                      pp * per, (pp + 1) * per - 1, dp, pp)
            for dp in range(dp_size) for pp in range(pp_size) for tp in range(tp_size)]


# ---- 0.5.10 - 0.5.18: the v2 interface for a hybrid model's other pools ---------------------
#
# Read at SGLang's tags v0.5.16 (fdebc938), v0.5.17 (29481685) and v0.5.18 (71de97b2) in
# bytedance-iaas/sglang, a public fork carrying SGLang's tags v0.5.10 - v0.5.18
# (python/sglang/srt/mem_cache/hicache_storage.py; docs/engines.md has the lines). PoolName,
# PoolHitPolicy, PoolTransfer and PoolTransferResult exist from v0.5.10 (:69, :76, :88, :103 at
# 1519acf3). HiCacheStorage gains register_mem_host_pool_v2 (fills registered_pools[name]) and
# batch_exists_v2 / batch_get_v2 / batch_set_v2, which raise NotImplementedError in the base.
# The hybrid cache controller (hybrid_cache/hybrid_cache_controller.py at v0.5.18) attaches the
# backend through the base controller (which registers the KV host pool with
# register_mem_pool_host), then calls register_mem_host_pool_v2(entry.host_pool, entry.name)
# for every host pool entry (:170); it asks batch_exists_v2(page hashes, the other pools'
# transfers, extra info) when a prefetch carries pool transfers (:595); it loads the KV pages
# through the base path and then the other pools with batch_get_v2(transfers) (:657), and backs
# them up with batch_set_v2(transfers) before the KV pages (:672). prefix_keys defaults to None
# from v0.5.12 (PR #25252, :45 at v0.5.16 - v0.5.18).


class PoolName(str, Enum):
    """A subset of v0.5.18's names (:58): the KV pool and some sidecars."""

    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"
    INDEXER = "indexer"

    def __str__(self) -> str:
        return self.value


class PoolHitPolicy(str, Enum):
    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"


@dataclass
class PoolTransfer:
    name: PoolName
    host_indices: Any = None
    device_indices: Any = None
    keys: Optional[List[str]] = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: Optional[List[Any]] = None
    indices_from_pool: Optional[PoolName] = None


@dataclass
class PoolTransferResult:
    kv_hit_pages: int
    extra_pool_hit_pages: Dict[str, int]


@dataclass
class HiCacheStorageExtraInfo0512:
    """From v0.5.12: prefix_keys defaults to None."""

    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class HiCacheStorage0518(HiCacheStorage):
    """0.5.10 - 0.5.18's base: 0.5.6's, plus the v2 pool interface."""

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        if not hasattr(self, "registered_pools"):
            self.registered_pools: Dict[str, Any] = {}
        self.registered_pools[host_pool_name] = host_pool

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Any = None) -> PoolTransferResult:
        raise NotImplementedError()

    def batch_get_v2(self, transfers: List[PoolTransfer], extra_info: Any = None
                     ) -> Dict[str, List[bool]]:
        raise NotImplementedError()

    def batch_set_v2(self, transfers: List[PoolTransfer], extra_info: Any = None
                     ) -> Dict[str, List[bool]]:
        raise NotImplementedError()
