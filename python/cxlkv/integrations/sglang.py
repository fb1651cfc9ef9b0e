"""cxlkv as an SGLang HiCache storage backend (L3), over :class:`cxlkv.PageStore`.

Pinned to SGLang >= 0.5.3, < 0.6 (:data:`cxlkv.integrations.TARGETS` ``["sglang"]``; what
each release offers and where it was read: docs/engines.md). Load it as a ``dynamic``
backend, with ``interface_v1`` so SGLang (from 0.5.6; :data:`ZERO_COPY_DYNAMIC_FROM`) takes the
zero-copy path (``batch_get_v1`` / ``batch_set_v1`` by host indices; without it, and on
0.5.3-0.5.5.x always, SGLang copies pages through ``get``/``set``)::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
      --hicache-mem-layout page_first --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "cxlkv",
        "module_path": "cxlkv.integrations.sglang", "class_name": "CxlkvHiCacheStorage",
        "interface_v1": 1, "domain": "orchestrator:/run/cxlkv/<domain>.sock", "host_id": 0}'

(:mod:`cxlkv.integrations._config` has every key; ``pool`` is needed for a ``file:`` or
``devdax:`` domain, not for an ``orchestrator:`` one.) The same JSON attaches it at run time
(``PUT /hicache/storage-backend``, ``hicache_storage_backend_extra_config_json``; SGLang
allows that only while idle and with ``--admin-api-key``); a detach closes it.

**Hybrid models** (SGLang 0.5.10+: mamba, SWA, indexer pools beside KV): SGLang registers
each of the model's host pools with ``register_mem_host_pool_v2`` and moves the non-KV pools
with ``batch_*_v2`` (:class:`PoolTransfer` by host indices); each such pool gets a page store
of its own, in a namespace naming the pool and the TP rank (:func:`v2_exists` has the hit rule).

**One host per rank, from one configuration.** SGLang builds a backend in every (dp, pp,
cp, tp) rank's process from the same extra config, and at 0.5.3 and 0.5.6 the
``HiCacheStorageConfig`` it passes carries only the (attention) TP rank and size: DP replicas
and PP stages of one engine see the same config. So a rank's host row is taken, not computed:
each rank tries the rows :func:`candidate_rows` names, ``host_id + rank_index + k * ranks``
for k = 0, 1, ... (``rank_index`` and ``ranks`` from whatever ranks the config carries,
:func:`rank_index`), and joins the first one free (no process of this machine holds its lock;
for an ``orchestrator:`` domain, no other machine holds it live), up to the domain's last
row. A config that names every rank gets exactly ``host_id + rank_index``; ranks that nothing
tells apart (the replicas of one TP rank, at 0.5.3) take the next free rows of their TP rank's
sequence, in the order they start. ``host_id`` is the first row an engine may use; engines on
one machine, or on an ``orchestrator:`` domain, may share it (each rank finds a free row), and
only engines on several machines sharing a ``devdax:`` domain without an orchestrator need
disjoint ``host_id`` ranges. docs/engines.md says why rows are taken rather than derived.

**The namespace names everything that changes a page's bytes**: the model, the rank's slice
(TP rank and size, except for MLA models, whose ranks hold the same page; PP and CP rank and
size where the config has them; the layers the host pool holds, ``start_layer`` to
``end_layer``, which tell PP stages apart where the config does not), the host pool's dtype
and layout (``page_first``, ``page_first_direct``,
``layer_first``), the page size in tokens and bytes, and the transfer path (``v1``
zero-copy, or ``generic``: SGLang's copy path hands pages over in another byte order for
some layouts). Draft-model pages (keys ``d:<hash>``) live in a namespace of their own.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import InvalidArgumentError
from ..keys import Namespace
from ..page_store import PageStore, page_buffer_meta
from . import check_engine_version, parse_version
from ._config import Attachment, as_dict

log = logging.getLogger(__name__)

DRAFT_PREFIX = "d:"

#: Keys SGLang itself puts in the extra config of a dynamic backend (not ours to check).
SGLANG_KEYS = frozenset({"backend_name", "module_path", "class_name", "interface_v1"})
#: Keys this backend reads.
CONFIG_KEYS = frozenset({"domain", "host_id", "pool", "read_pools", "tenant", "heartbeat_s",
                         "allow_untested_version", "namespace_layout"})


def _first_page(page_size: int) -> Any:
    """The host indices of the pool's first page, as SGLang passes indices (a torch tensor
    where torch is installed: SGLang's pools call .tolist() / index with it)."""
    try:
        import torch

        return torch.arange(page_size, dtype=torch.int64)
    except ImportError:
        return np.arange(page_size, dtype=np.int64)


def _g(cfg: Any, name: str, default: Any = None) -> Any:
    v = getattr(cfg, name, default)
    return default if v is None else v


def rank_index(storage_config: Any) -> Tuple[int, int]:
    """(this rank's index, the engine's number of ranks) over (dp, pp, cp, tp)."""
    dp, dps = int(_g(storage_config, "dp_rank", 0)), int(_g(storage_config, "dp_size", 1))
    pp, pps = int(_g(storage_config, "pp_rank", 0)), int(_g(storage_config, "pp_size", 1))
    cp, cps = (int(_g(storage_config, "attn_cp_rank", 0)),
               int(_g(storage_config, "attn_cp_size", 1)))
    tp, tps = int(_g(storage_config, "tp_rank", 0)), int(_g(storage_config, "tp_size", 1))
    return ((dp * pps + pp) * cps + cp) * tps + tp, dps * pps * cps * tps


#: How many rows past its first one a rank looks for a free row (a bound on the scan when the
#: domain's host rows are many; the domain's last row ends it before that).
MAX_ROW_TRIES = 1024


def candidate_rows(host_id: int, storage_config: Any) -> Iterator[int]:
    """The host rows a rank tries, in order: ``host_id + rank_index + k * ranks``."""
    idx, ranks = rank_index(storage_config)
    for k in range(MAX_ROW_TRIES):
        yield host_id + idx + k * ranks


def pool_layers(mem_pool_host: Any) -> str:
    """The layers a host pool holds, ``"<start>-<end>"`` (SGLang's ``HostKVCache`` copies its
    device pool's ``start_layer`` and inclusive ``end_layer``: a PP stage's own layers), or
    ``"?"`` for a pool without them."""
    start, end = getattr(mem_pool_host, "start_layer", None), getattr(mem_pool_host,
                                                                       "end_layer", None)
    if start is None or end is None:
        return "?"
    return f"{int(start)}-{int(end)}"


def host_pool_facts(host_pool: Any) -> Dict[str, Any]:
    """What of a host pool its pages' namespace names: tokens and bytes per page (from the
    pool's own page description), dtype, layout and layers."""
    ps = int(host_pool.page_size)
    _, sizes = page_buffer_meta(host_pool, _first_page(ps))
    return {"page_tokens": ps, "page_bytes": int(sum(sizes)),
            "dtype": str(getattr(host_pool, "dtype", "?")).replace("torch.", ""),
            "layout": str(getattr(host_pool, "layout", "?")), "layers": pool_layers(host_pool)}


def namespace_for(storage_config: Any, tenant: str, page_bytes: int, *, dtype: str = "?",
                  layout: str = "?", page_tokens: int = 0, path: str = "v1",
                  layers: str = "?", extra: str = "", sharded: bool = False) -> Namespace:
    """The namespace of one SGLang rank's pages: everything that changes their bytes.
    `sharded`: the pool is split across TP ranks even for an MLA model (a hybrid model's
    sidecar pools: SGLang backs them up from every TP rank)."""
    model = str(_g(storage_config, "model_name", ""))
    mla = bool(_g(storage_config, "is_mla_model", False)) and not sharded
    tp = "mla" if mla else f"{_g(storage_config, 'tp_rank', 0)}/{_g(storage_config, 'tp_size', 1)}"
    words = (f"sglang dtype={dtype} layout={layout} path={path} page={page_tokens}t/"
             f"{page_bytes}B tp={tp} pp={_g(storage_config, 'pp_rank', 0)}/"
             f"{_g(storage_config, 'pp_size', 1)} cp={_g(storage_config, 'attn_cp_rank', 0)}/"
             f"{_g(storage_config, 'attn_cp_size', 1)} layers={layers} {extra}")
    return Namespace(tenant, model, words.strip())


#: The first release whose cache controller gives a ``dynamic`` backend the zero-copy path
#: when ``interface_v1`` is set (SGLang PR #13140, 2025-11-17; cache_controller.py:318-326 at
#: 0.5.6's version commit 7ae368efd). 0.5.3-0.5.5.x give it only to hf3fs, mooncake and eic
#: (cache_controller.py:309-315 at 0.5.3's a4a3d8239) and ignore ``interface_v1``.
ZERO_COPY_DYNAMIC_FROM = "0.5.6"


def transfer_path(cfg: Dict[str, Any], engine_version: Optional[str]) -> str:
    """The path SGLang will hand this backend pages by: ``"v1"`` (zero-copy, batch_*_v1 by
    host indices) or ``"generic"`` (copies through get/set/batch_*). It is part of the
    namespace, so it must be the path SGLang really takes, not the one asked for."""
    if not cfg.get("interface_v1"):
        return "generic"
    if engine_version and parse_version(engine_version) < parse_version(ZERO_COPY_DYNAMIC_FROM):
        log.warning("cxlkv: SGLang %s ignores interface_v1 for a dynamic backend (zero-copy "
                    "from %s): pages go through the generic copy path", engine_version,
                    ZERO_COPY_DYNAMIC_FROM)
        return "generic"
    return "v1"


class SglangBackendCore:
    """What the backend does, whatever SGLang's base class: the configuration, the rank's
    identity, and the page stores (main and draft) once the host pool is known.

    Raises (at engine start, naming the setting and the fix): a missing or unknown key, no
    free host row in the domain from ``host_id`` + this rank's index on, an engine outside
    the pin.
    """

    def __init__(self, storage_config: Any, kwargs: Any, engine_version: Optional[str]
                 ) -> None:
        cfg = as_dict(_g(storage_config, "extra_config", None))
        cfg.update(as_dict(kwargs))
        check_engine_version("sglang", engine_version,
                             allow_untested=bool(cfg.get("allow_untested_version")))
        unknown = sorted(set(cfg) - CONFIG_KEYS - SGLANG_KEYS)
        if unknown:
            raise InvalidArgumentError(
                f"unknown key(s) {', '.join(map(repr, unknown))} in the cxlkv backend's "
                "--hicache-storage-backend-extra-config", operation="CxlkvHiCacheStorage",
                hint=f"known keys: {', '.join(sorted(CONFIG_KEYS | SGLANG_KEYS))}")
        if "host_id" not in cfg:
            raise InvalidArgumentError(
                "the cxlkv backend's extra config lacks 'host_id'",
                operation="CxlkvHiCacheStorage",
                hint="set host_id: the first host row of this engine (each rank takes "
                "the first free row from host_id + its rank index)")
        self.storage_config = storage_config
        self.path = transfer_path(cfg, engine_version)
        idx, ranks = rank_index(storage_config)
        self.rank, self.ranks = idx, ranks
        self.first_row = int(cfg["host_id"])
        #: The host row joined (None until joined: an orchestrator domain without a pool
        #: joins once the host pool is registered).
        self.host_id: Optional[int] = None
        self._cfg = cfg
        self._extra = str(cfg.get("namespace_layout", ""))
        self.tenant = str(cfg.get("tenant", "default"))
        self._att: Optional[Attachment] = None
        self.stores: Dict[bool, PageStore] = {}  # draft? -> store
        #: A hybrid model's other host pools (mamba, swa, indexer, ...), by SGLang's pool name:
        #: each in a namespace of its own (register_pool_v2).
        self.pools: Dict[str, PageStore] = {}
        self._layout = "?"
        if str(cfg.get("domain", "")).startswith("orchestrator:") and not cfg.get("pool"):
            return  # the arena is grown once the page size is known
        self._attach(None)

    def _attach(self, page_bytes: Optional[int]) -> None:
        first = self.first_row + self.rank
        try:
            self._att = Attachment(self._cfg, "CxlkvHiCacheStorage", block_bytes=page_bytes,
                                   rows=candidate_rows(self.first_row, self.storage_config))
        except InvalidArgumentError as e:
            if "outside the domain" in str(e) or "not allowed in this domain" in str(e):
                raise InvalidArgumentError(
                    f"rank {self.rank} of {self.ranks} (host_id {self.first_row} + rank index "
                    f"{self.rank} = row {first}, then every {self.ranks} rows): {e}",
                    operation="CxlkvHiCacheStorage",
                    hint="lower host_id, or format the domain with max_hosts >= host_id + "
                    "the ranks of every engine on it (dp_size * pp_size * attn_cp_size * "
                    "tp_size each)") from e
            raise
        self.host_id = self._att.host_id

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        facts = host_pool_facts(mem_pool_host)
        if self._att is None:
            self._attach(facts["page_bytes"])
        for draft in (False, True):
            extra = (self._extra + " draft").strip() if draft else self._extra
            self._open(self.stores, draft, mem_pool_host, facts, path=self.path, extra=extra)

    def register_pool_v2(self, host_pool: Any, name: Any) -> None:
        """A hybrid model's host pool `name` (SGLang's ``PoolName``; from 0.5.10 its hybrid
        cache controller registers every pool of the model this way, after the KV pool, and
        moves their pages with ``batch_*_v2``). The KV pool is the main store already; any
        other pool gets a store of its own over that pool, in a namespace naming the pool and
        always the TP rank (sidecars are backed up from every rank)."""
        pool_name = str(getattr(name, "value", name))
        if pool_name == KV_POOL:
            return
        if self._att is None:
            raise InvalidArgumentError(
                f"host pool {pool_name!r} registered before the KV pool",
                operation="register_mem_host_pool_v2",
                hint="SGLang registers the KV host pool (register_mem_pool_host) first; "
                "attach the backend through SGLang's cache controller")
        self._open(self.pools, pool_name, host_pool, host_pool_facts(host_pool), path="v2",
                   extra=f"{self._extra} pool={pool_name}".strip(), sharded=True)

    def _open(self, table: Dict[Any, PageStore], key: Any, host_pool: Any,
              facts: Dict[str, Any], *, path: str, extra: str, sharded: bool = False) -> None:
        """A page store over `host_pool` in its namespace, as table[key] (closing the one it
        replaces: SGLang may register a pool again)."""
        assert self._att is not None
        ns = namespace_for(self.storage_config, self.tenant, facts["page_bytes"],
                           dtype=facts["dtype"], layout=facts["layout"],
                           page_tokens=facts["page_tokens"], path=path, layers=facts["layers"],
                           extra=extra, sharded=sharded)
        store = PageStore(self._att.domain, ns, page_bytes=facts["page_bytes"])
        store.register_mem_pool_host(host_pool)
        old = table.get(key)
        if old is not None:
            old.close()
        table[key] = store

    def pool_store(self, name: Any, what: str) -> PageStore:
        """The store of a pool registered through register_pool_v2."""
        pool_name = str(getattr(name, "value", name))
        store = self.pools.get(pool_name)
        if store is None:
            raise InvalidArgumentError(
                f"{what}: no host pool {pool_name!r} registered", operation=what,
                hint=f"registered: {', '.join(sorted(self.pools)) or 'none'}; SGLang registers "
                "each pool with register_mem_host_pool_v2 when it attaches the backend")
        return store

    def store_for(self, keys: Sequence[Any], what: str) -> Tuple[PageStore, List[Any]]:
        """The store of `keys` (all draft ``d:<hash>`` or all main) and the keys unprefixed."""
        if not self.stores:
            raise InvalidArgumentError("no host pool registered yet", operation=what,
                                       hint="SGLang calls register_mem_pool_host before any "
                                       "transfer")
        if isinstance(keys, (str, bytes)):
            keys = [keys]
        drafts = [isinstance(k, str) and k.startswith(DRAFT_PREFIX) for k in keys]
        if any(drafts) and not all(drafts):
            raise InvalidArgumentError(
                f"{what}: a batch mixes draft (d:<hash>) and main-model keys",
                operation=what, hint="pass draft and main pages in separate calls")
        draft = bool(drafts) and drafts[0]
        plain = [k[len(DRAFT_PREFIX):] for k in keys] if draft else list(keys)
        return self.stores[draft], plain

    def close(self) -> None:
        for s in [*self.stores.values(), *self.pools.values()]:
            s.close()
        if self._att is not None:
            self._att.close()


def build_backend_class(base: type, engine_version: Optional[str]) -> type:
    """The backend class over SGLang's ``HiCacheStorage`` (`base`), each method forwarding to
    one :class:`SglangBackendCore`; constructed as SGLang's dynamic loader does,
    ``backend_class(storage_config, kwargs)``."""

    class CxlkvHiCacheStorage(base):  # type: ignore[misc,valid-type]
        """SGLang ``HiCacheStorage`` backed by a CXL domain (see the module docstring)."""

        def __init__(self, storage_config: Any, kwargs: Any = None) -> None:
            self.storage_config = storage_config
            self.core = SglangBackendCore(storage_config, kwargs, engine_version)

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            super().register_mem_pool_host(mem_pool_host)
            self.core.register_mem_pool_host(mem_pool_host)

        @property
        def store(self) -> PageStore:
            """The main model's page store."""
            return self.core.store_for([], "store")[0]

        def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
            s, k = self.core.store_for(keys, "batch_exists")
            return s.batch_exists(k, extra_info)

        def exists(self, key: str) -> bool:
            s, k = self.core.store_for([key], "exists")
            return s.exists(k[0])

        def batch_get_v1(self, keys: List[str], host_indices: Any,
                         extra_info: Any = None) -> List[bool]:
            s, k = self.core.store_for(keys, "batch_get_v1")
            return s.batch_get_v1(k, host_indices, _unprefixed(extra_info))

        def batch_set_v1(self, keys: List[str], host_indices: Any,
                         extra_info: Any = None) -> List[bool]:
            s, k = self.core.store_for(keys, "batch_set_v1")
            return s.batch_set_v1(k, host_indices, _unprefixed(extra_info))

        def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
            s, k = self.core.store_for([key], "get")
            return s.get(k[0], target_location, target_sizes)

        def batch_get(self, keys: List[str], target_locations: Any = None,
                      target_sizes: Any = None) -> Any:
            s, k = self.core.store_for(keys, "batch_get")
            return s.batch_get(k, target_locations, target_sizes)

        def set(self, key: str, value: Any = None, target_location: Any = None,
                target_sizes: Any = None) -> bool:
            s, k = self.core.store_for([key], "set")
            return s.set(k[0], value, target_location, target_sizes)

        def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                      target_sizes: Any = None) -> bool:
            s, k = self.core.store_for(keys, "batch_set")
            return s.batch_set(k, values, target_locations, target_sizes)

        def clear(self) -> None:
            """Not supported: published pages are shared with other hosts; the domain's owner
            reclaims them. Left as SGLang's no-op."""
            return None

        def close(self) -> None:
            self.core.close()

        # ---- v2: a hybrid model's other pools (SGLang >= 0.5.10, docs/engines.md) ----------

        def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
            if hasattr(super(), "register_mem_host_pool_v2"):
                super().register_mem_host_pool_v2(host_pool, host_pool_name)
            self.core.register_pool_v2(host_pool, host_pool_name)

        def batch_exists_v2(self, keys: List[str], pool_transfers: Any = None,
                            extra_info: Any = None) -> Any:
            return v2_exists(self, keys, pool_transfers, extra_info, result_type)

        def batch_get_v2(self, transfers: List[Any], extra_info: Any = None
                         ) -> Dict[str, List[bool]]:
            return {t.name: v2_move(self.core, t, "batch_get_v2") for t in transfers}

        def batch_set_v2(self, transfers: List[Any], extra_info: Any = None
                         ) -> Dict[str, List[bool]]:
            return {t.name: v2_move(self.core, t, "batch_set_v2") for t in transfers}

    result_type = getattr(sys.modules.get(base.__module__), "PoolTransferResult", None)
    return CxlkvHiCacheStorage


#: SGLang's name of the KV pool (``PoolName.KV``).
KV_POOL = "kv"


def v2_move(core: SglangBackendCore, transfer: Any, what: str) -> List[bool]:
    """One transfer of ``batch_get_v2`` / ``batch_set_v2``: its pages by host indices, one bool
    per key. A pool never registered raises (a wiring error, at the first transfer). A transfer
    whose host indices are not page_size per key, or that has none, is answered all False and
    logged, as SGLang's own file backend does (hicache_storage.py ``_batch_io_v2`` at v0.5.18):
    the controller's thread sees a failed transfer, not an exception."""
    store = core.pool_store(transfer.name, what)
    keys = list(transfer.keys or [])
    move = store.batch_get_v1 if what == "batch_get_v2" else store.batch_set_v1
    try:  # the store checks the indices (page_size per key) itself
        return move(keys, transfer.host_indices) if keys else []
    except InvalidArgumentError as e:
        log.error("cxlkv: %s of pool %s: %s", what, transfer.name, e)
        return [False] * len(keys)


def v2_exists(backend: Any, keys: List[str], pool_transfers: Any, extra_info: Any,
              result_type: Any) -> Any:
    """``batch_exists_v2`` as SGLang's base class documents it (hicache_storage.py:165 at
    v0.5.18): the KV pool's leading run of present pages, cut to where every other pool's
    pages are present too, by that pool's hit policy: ``all_pages``, every page of the run;
    ``trailing_pages``, only the last len(transfer.keys) pages before the cut. The result is
    SGLang's ``PoolTransferResult(kv_hit_pages, extra_pool_hit_pages)``."""
    kv = backend.batch_exists(keys, extra_info)
    hits: Dict[Any, int] = {KV_POOL: kv} if kv else {}
    final = kv
    for t in pool_transfers or []:
        if final == 0:
            break
        store = backend.core.pool_store(t.name, "batch_exists_v2")
        have: Dict[int, bool] = {}

        def present(i: int) -> bool:
            if i not in have:
                have[i] = store.exists(keys[i])
            return have[i]

        policy = str(getattr(t.hit_policy, "value", t.hit_policy))
        if policy == "trailing_pages":
            window = max(1, len(t.keys or []))
            cut = next((n for n in range(kv, 0, -1)
                        if all(present(i) for i in range(max(0, n - window), n))), 0)
        else:  # all_pages
            cut = next((i for i in range(kv) if not present(i)), kv)
        if cut:
            hits[t.name] = cut
        final = min(final, cut)
    if result_type is None:
        raise InvalidArgumentError(
            "batch_exists_v2: SGLang's PoolTransferResult is not in the base class's module",
            operation="batch_exists_v2",
            hint="this SGLang has no v2 interface (it came with 0.5.10); do not pass "
            "pool_transfers")
    return result_type(final, hits)


class _Unprefixed:
    """extra_info with draft prefixes taken off its prefix_keys."""

    def __init__(self, prefix_keys: List[Any], extra_info: Any) -> None:
        self.prefix_keys = prefix_keys
        self.extra_info = extra_info


def _unprefixed(extra_info: Any) -> Any:
    prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
    if not prefix or not any(isinstance(k, str) and k.startswith(DRAFT_PREFIX) for k in prefix):
        return extra_info
    return _Unprefixed([k[len(DRAFT_PREFIX):] if isinstance(k, str) and
                        k.startswith(DRAFT_PREFIX) else k for k in prefix],
                       getattr(extra_info, "extra_info", None))


IMPORT_ERROR: Optional[BaseException] = None
ENGINE_VERSION: Optional[str] = None
CxlkvHiCacheStorage: Any = None
try:
    import sglang as _sglang
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base

    ENGINE_VERSION = getattr(_sglang, "__version__", None)
    CxlkvHiCacheStorage = build_backend_class(_Base, ENGINE_VERSION)
except ImportError as e:  # SGLang is not installed here
    IMPORT_ERROR = e
