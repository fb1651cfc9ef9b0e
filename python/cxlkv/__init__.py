"""cxlkv: a CXL memory tier for LLM KV caches, from Python.

A ctypes binding of ``libcxlkv.so`` (the C API in ``include/cxlkv/cxlkv.h``) and stores
shaped like the serving engines' KV tiers:

* :class:`Pool`, :class:`Arena`, :class:`KvLayout` — memory sources, KV arenas, blocks;
* :class:`Domain`, :class:`Owner`, :class:`Geometry` — the hosts of one CXL domain sharing
  prefix blocks: lookup, chain leases (:class:`Leases`), validated copy-out into numpy arrays
  and torch tensors, zero-copy views, publish;
* :class:`Namespace`, :class:`PrefixKey` — keys from token ids or from an engine's digests;
* :class:`Tier` (:mod:`cxlkv.tier`) — one size class of an arena plus an NVMe store under the
  CXL-vs-NVMe placement rule: place, lookup, read, prefetch, demote, explain, stats;
* :class:`PageStore` (SGLang HiCache-shaped) and :class:`OffloadTier` (vLLM
  ``SecondaryTierManager``-shaped) in :mod:`cxlkv.page_store` and :mod:`cxlkv.offload_tier`;
* :mod:`cxlkv.integrations` — thin adapters subclassing the engines' own classes, and
  ``python -m cxlkv.integrations.check``;
* ``python -m cxlkv status`` — the library, a pool, a domain.

Errors are exceptions from :mod:`cxlkv.errors`, one class per ``CXLKV_E_*`` code. The library
is loaded on first use (see :mod:`cxlkv._lib` for where it is looked for; ``CXLKV_LIBRARY``
overrides).
"""

from __future__ import annotations

from . import errors
from .domain import Domain, Geometry, Hit, Leases, Owner, ZeroCopyView
from .errors import CxlkvError
from .keys import Namespace, PrefixKey, key_from_name, lmcache_index_key, lmcache_index_name
from .offload_tier import OffloadTier, TierJob, TierJobResult
from .page_store import HostPagePool, PageStore
from .pool import Arena, ArenaStats, Block, ClassStats, KvLayout, Pool
from .tier import (
    CxlKind,
    Location,
    PinnedBlock,
    PrefetchTicket,
    Residence,
    Tier,
    TierOptions,
    TierResults,
    TierStats,
)

__version__ = "0.1.0"

__all__ = [
    "Arena",
    "ArenaStats",
    "Block",
    "ClassStats",
    "CxlKind",
    "CxlkvError",
    "Domain",
    "Geometry",
    "Hit",
    "HostPagePool",
    "KvLayout",
    "Leases",
    "Location",
    "Namespace",
    "OffloadTier",
    "Owner",
    "PageStore",
    "PinnedBlock",
    "Pool",
    "PrefetchTicket",
    "PrefixKey",
    "Residence",
    "Tier",
    "TierJob",
    "TierJobResult",
    "TierOptions",
    "TierResults",
    "TierStats",
    "ZeroCopyView",
    "errors",
    "key_from_name",
    "library",
    "lmcache_index_key",
    "lmcache_index_name",
]


def library() -> "_LibraryInfo":
    """The loaded libcxlkv: ``path``, ``realpath``, ``version``, ``how`` it was found."""
    from . import _lib

    lib = _lib.load()
    return _LibraryInfo(lib.path, lib.realpath, lib.version, lib.how)


class _LibraryInfo:
    def __init__(self, path: str, realpath: str, version: str, how: str) -> None:
        self.path, self.realpath, self.version, self.how = path, realpath, version, how

    def __repr__(self) -> str:
        return f"libcxlkv {self.version} at {self.realpath} (found: {self.how})"
