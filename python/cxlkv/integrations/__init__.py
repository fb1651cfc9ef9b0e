"""Thin adapters that plug cxlkv's stores into serving engines, and the version pins.

Each adapter subclasses the engine's own base class and forwards to a store of this package
that carries the behaviour (and the tests):

==============  ==========================================  ===================================
engine          adapter                                     store underneath
==============  ==========================================  ===================================
SGLang          :class:`cxlkv.integrations.sglang.           :class:`cxlkv.PageStore`
                CxlkvHiCacheStorage` (a ``HiCacheStorage``,
                loaded as a ``dynamic`` storage backend)
vLLM            :class:`cxlkv.integrations.vllm.             :class:`cxlkv.OffloadTier`
                CxlkvSecondaryTier` (a
                ``SecondaryTierManager``)
==============  ==========================================  ===================================

The adapters are import-guarded: importing them without the engine works, and their class is
``None`` with the reason in ``IMPORT_ERROR``. Each is pinned (:data:`TARGETS`) to the upstream
versions and interface it was written against, read from the engine's source; an engine
outside the pin is refused with :class:`~cxlkv.errors.EngineVersionError` unless the
configuration says ``allow_untested_version``. ``python -m cxlkv.integrations.check`` checks an
installed engine against the pin, structurally (base class, abstract methods, signatures) and
with a round trip through the adapter on a temporary domain.

:mod:`cxlkv.integrations.router_credit` is not an adapter: it relays the vLLM tier's KV events
to every worker of the domain, so that a router credits them all (docs/kv_events.md).

Nothing here was run against a real engine by this project (neither engine can be installed
where it is built and tested); the check is how a user finds out on their machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from ..errors import EngineVersionError


@dataclass(frozen=True)
class EngineTarget:
    """What an adapter was written against."""

    engine: str  # the distribution / import name
    min_version: str  # inclusive
    below_version: str  # exclusive
    interface: str  # the surface, in words
    source: str  # where it was read


TARGETS: Dict[str, EngineTarget] = {
    "sglang": EngineTarget(
        "sglang", "0.5.3", "0.6.0",
        "HiCacheStorage(storage_config, kwargs) with get/set/batch_get/batch_set/exists, "
        "batch_exists -> leading run, zero-copy batch_get_v1/batch_set_v1(keys, host_indices, "
        "extra_info) -> List[bool]; host pool page_size + get_page_buffer_meta",
        "sgl-project/sglang python/sglang/srt/mem_cache/hicache_storage.py and "
        "storage/backend_factory.py (docs/engines.md)"),
    "vllm": EngineTarget(
        "vllm", "0.22.0", "0.34.0",
        "SecondaryTierManager(offloading_spec, primary_kv_view, tier_type) built by "
        "SecondaryTierFactory as tier_cls(offloading_spec=, primary_kv_view=, tier_type=, "
        "**config); five interface generations (0.22, 0.23-0.24, 0.25-0.27, 0.28-0.31, 0.32+, "
        "picked by the installed base class's shape: "
        "cxlkv.integrations.vllm_generations)",
        "vllm-project/vllm vllm/v1/kv_offload/tiering/{base,factory}.py at release tags "
        "(docs/engines.md)"),
}


def parse_version(v: str) -> Tuple[int, ...]:
    """The leading numeric release of a version string ("0.22.1rc1+cu12" -> (0, 22, 1))."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", v)
    if not m:
        return ()
    return tuple(int(p) for p in m.group(1).split("."))


def _pad(t: Tuple[int, ...]) -> Tuple[int, ...]:
    return t + (0,) * (4 - len(t))


def version_supported(engine: str, version: str) -> bool:
    t = TARGETS[engine]
    v = parse_version(version)
    return bool(v) and _pad(parse_version(t.min_version)) <= _pad(v) < _pad(
        parse_version(t.below_version))


def check_engine_version(engine: str, version: Optional[str], *,
                         allow_untested: bool = False) -> None:
    """Refuses an engine version outside the adapter's pin.

    Raises:
        EngineVersionError: naming the version found, the range supported, and the fix.
    """
    if engine not in TARGETS:
        raise EngineVersionError(
            f"no cxlkv adapter for engine {engine!r}", operation="check_engine_version",
            hint=f"adapters exist for: {', '.join(sorted(TARGETS))}")
    if allow_untested:
        return
    t = TARGETS[engine]
    if version is None or not version_supported(engine, version):
        raise EngineVersionError(
            f"{engine} {version or '(version unknown)'} is outside the versions this adapter "
            f"was written for ({t.min_version} <= version < {t.below_version}; interface: "
            f"{t.interface})",
            operation=f"cxlkv.integrations.{engine}",
            hint=f"install {engine}>={t.min_version},<{t.below_version}; or run `python -m "
            f"cxlkv.integrations.check` to see whether this version's interface still matches "
            f"and, if it does, set allow_untested_version=true in the adapter's configuration",
        )
