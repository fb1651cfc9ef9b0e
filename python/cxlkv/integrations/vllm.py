"""cxlkv as a vLLM secondary offload tier, over :class:`cxlkv.OffloadTier`.

vLLM's ``TieringOffloadingSpec`` keeps a CPU primary tier and cascades stores to secondary
tiers. This module is one such tier for every released generation of the interface from
vLLM 0.22.0 (:mod:`cxlkv.integrations.vllm_generations`; docs/engines.md says what each
release offers and where it was read): one core (:class:`VllmTierCore`, which carries the
configuration, the checks and the store underneath) and, per generation, a thin class
(:func:`build_tier_class`) with that generation's method names and types. The class for the
installed vLLM is :data:`CxlkvSecondaryTier`: the class whose interface the installed base class
has (its abstract methods and what ``lookup`` answers), whatever the version says: a version
outside the releases that generation was read at is logged, not refused. Only an installed base
of no known shape leaves the version to decide, and then a version outside its pin is refused
at engine start, saying why.

Configuration (``TieringOffloadingSpec``)::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 8000000000, "block_size": 16,
        "secondary_tiers": [{"type": "cxlkv", "domain": "file:/dev/shm/cxlkv-domain",
          "host_id": 1, "pool": "file:/dev/shm/cxlkv-pool"}]}}'

The ``cxlkv`` tier type is registered by the package's ``vllm.general_plugins`` entry point
(:func:`register_plugin`, which vLLM calls in every process): installing the package is
enough. From vLLM 0.28 (PR #51007) the entry alone is enough, without the plugin: ``"type":
"CxlkvSecondaryTier", "module_path": "cxlkv.integrations.vllm"`` (the factory imports the
module and constructs the class named by ``type``; ``module_path`` is accepted and ignored if a
factory passes it on). Keys (:data:`CONFIG_KEYS`): ``domain`` and ``host_id`` are required;
``pool`` (not for an ``orchestrator:`` domain, which lends this host an extent),
``read_pools``, ``tenant``, ``heartbeat_s``, ``block_bytes`` (optional: the primary view's row
is the block; if given it must match), ``model`` (overrides the model name read from the
engine's config), ``namespace_layout`` (free text added to the namespace),
``allow_untested_version``,
``enable_kv_events``, ``locality``, ``removal_check_s`` (below) and ``medium`` (``CPU``, the
default, or ``STORAGE``: the medium the tier declares and its events name, a member of vLLM's
``Medium`` where it has one; a request whose load tier filter, PR #48123, does not allow it
misses). An unknown key is refused (a misspelt key would otherwise be ignored).

**KV events under the engine's own block hashes.** Where the installed
``SecondaryTierManager`` has ``take_events`` (tier-owned events, vLLM PR #46544; from the
v0.26.0 tag), the tier
with ``enable_kv_events: true`` records an ``OffloadingEvent(keys, medium, removed=False[,
locality])`` for the keys of every store job that succeeded (those not announced already),
and ``take_events`` hands them to
vLLM, which publishes them as ``BlockStored`` with its own block hashes (and, where its event
tracker saw the request, the parent hash and token ids), as its ``fs`` tier does: what a
router needs to match them with the engine's keys (docs/kv_events.md, "Matching by the
engine's hash"). Only while vLLM's own KV events are on (``kv_events_config``); ``locality``
(``"LOCAL"`` or ``"REMOTE"``) is passed where the event has that field. When announced blocks
leave the domain (the owner evicts or retires them), ``take_events`` yields
``OffloadingEvent(keys, medium, removed=True)`` for their keys, which vLLM publishes as
``BlockRemoved``: the tier looks its announced keys up every ``removal_check_s`` seconds
(default 1), on its worker thread (:class:`cxlkv.OffloadTier`, "Events").

Identity: one vLLM scheduler runs one tier; with data parallelism each DP engine has its own
scheduler, so the tier joins as host ``host_id + data_parallel_rank``. The namespace is
(tenant, model, "vllm" + row bytes + TP/PP sizes + KV cache dtype + ``namespace_layout``):
engines that differ in any of these never share blocks. vLLM's block hashes are equal across
processes only with the same hash algorithm and a fixed ``PYTHONHASHSEED``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional

from ..errors import EngineVersionError, InvalidArgumentError
from ..keys import Namespace
from ..offload_tier import OffloadTier, TierJob, TierJobResult, primary_rows
from . import vllm_generations as gens
from ._config import Attachment
from .vllm_generations import VllmGeneration

log = logging.getLogger(__name__)

TIER_TYPE = "cxlkv"

#: The medium of vLLM's CPU tier where mediums are strings (``vllm/distributed/kv_events.py``
#: ``MEDIUM_CPU`` at v0.26.0): what the tier's events name where vLLM has no ``Medium`` enum.
MEDIUM_CPU = "CPU"

#: Every key the tier's config dict may hold (besides ``type``, which the factory removes).
CONFIG_KEYS = frozenset({
    "domain", "host_id", "pool", "read_pools", "tenant", "heartbeat_s", "block_bytes",
    "model", "namespace_layout", "allow_untested_version", "enable_kv_events", "locality",
    "removal_check_s", "medium", "module_path"})

#: The mediums a tier may declare (``medium`` key): vLLM's ``Medium`` members a secondary tier
#: names (PR #48123: CPU memory, STORAGE for the fs and obj tiers). CXL memory is memory, so
#: ``CPU`` is the default; ``STORAGE`` lets a deployment have vLLM's per-request tier filters
#: and routers treat the domain as a storage tier, and is what
#: :mod:`cxlkv.integrations.router_credit` tells from the CPU primary tier's events.
MEDIUMS = ("CPU", "STORAGE")


def _attr_path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if obj is None:
            return None
        obj = getattr(obj, part, None)
    return obj


def _vllm_config(offloading_spec: Any) -> Any:
    """The ``VllmConfig`` an ``OffloadingSpec`` holds (``vllm_config`` in every released
    generation read)."""
    return getattr(offloading_spec, "vllm_config", None)


class VllmTierCore:
    """What every generation's tier does, on :class:`~cxlkv.OffloadTier`.

    Args:
        generation: the interface generation the caller's class implements.
        engine_version: the installed vLLM's version (None: unknown).
        offloading_spec: the engine's ``OffloadingSpec`` (model, parallel and cache configs).
        primary_kv_view: the primary tier's memoryview (rows of ``strides[0]`` bytes).
        tier_type: the type the factory registered (``"cxlkv"``).
        config: the rest of the tier's config dict.

    Raises (at engine start, each naming the setting and the fix):
        EngineVersionError: the version is outside the generation's pin, and the generation
            was not chosen by the installed base class's shape (`by_shape`; unless
            ``allow_untested_version``).
        InvalidArgumentError: a missing or unknown key, no model name, a ``block_bytes`` that
            does not match the view or that the TP size does not divide.
        BufferMismatchError: a view vLLM would not give (read-only, rows not contiguous).
    """

    def __init__(self, generation: VllmGeneration, engine_version: Optional[str],
                 offloading_spec: Any, primary_kv_view: Any, tier_type: str,
                 config: Mapping[str, Any], by_shape: bool = False) -> None:
        what = "the cxlkv vLLM tier"
        cfg = dict(config)
        unknown = sorted(set(cfg) - CONFIG_KEYS)
        if unknown:
            raise InvalidArgumentError(
                f"{what}: unknown key(s) {', '.join(map(repr, unknown))} in its secondary_tiers "
                f"entry", operation="CxlkvSecondaryTier",
                hint=f"known keys: {', '.join(sorted(CONFIG_KEYS))}")
        allow = bool(cfg.get("allow_untested_version"))
        outside = engine_version is None or not generation.covers(engine_version)
        if outside and by_shape:
            # The class was chosen by the installed base class's shape: it fits that base
            # whatever the version (python -m cxlkv.integrations.check round-trips it).
            log.warning("cxlkv: vLLM %s is outside the releases the %s interface was read at "
                        "(%s), but its SecondaryTierManager has that interface; the tier "
                        "runs by it", engine_version or "(version unknown)", generation.name,
                        generation.pin)
        elif outside and not allow:
            found = gens.generation_for(engine_version)
            raise EngineVersionError(
                f"vLLM {engine_version or '(version unknown)'} is outside the pin of the "
                f"{generation.name} interface ({generation.pin})"
                + (f"; its version is pinned to the {found.name} interface, but its "
                   f"SecondaryTierManager has the {generation.name} one (report this)"
                   if found else f"; the cxlkv tier supports vLLM {gens.SUPPORTED}"),
                operation="CxlkvSecondaryTier",
                hint=f"install vllm{gens.SUPPORTED}, or run `python -m "
                "cxlkv.integrations.check` and, if the interface fits, set "
                "allow_untested_version: true in the cxlkv tier's config")
        for k in ("domain", "host_id"):
            if k not in cfg:
                raise InvalidArgumentError(
                    f"{what}: its secondary_tiers entry lacks {k!r}",
                    operation="CxlkvSecondaryTier",
                    hint="set domain (the domain's spec, e.g. orchestrator:/run/cxlkv/<d>.sock) "
                    "and host_id (this engine's host row) in the cxlkv tier's config")
        self.generation = generation
        self.tier_type = tier_type
        vc = _vllm_config(offloading_spec)
        # The view first: its rows are the block size the arena and namespace need.
        bb = cfg.get("block_bytes")
        rows = primary_rows(primary_kv_view, int(bb) if bb is not None else None)
        tp = _attr_path(vc, "parallel_config.tensor_parallel_size") or 1
        pp = _attr_path(vc, "parallel_config.pipeline_parallel_size") or 1
        if rows.row_bytes % int(tp):
            raise InvalidArgumentError(
                f"{what}: a primary block of {rows.row_bytes} bytes cannot hold {tp} "
                f"tensor-parallel workers' equal slices", operation="CxlkvSecondaryTier",
                hint="check the offloading block_size and the TP size; block_bytes must be "
                "the primary view's row")
        model = cfg.get("model") or _attr_path(vc, "model_config.model")
        if not model:
            raise InvalidArgumentError(
                f"{what}: no model name in the engine's config (offloading_spec.vllm_config."
                "model_config.model)", operation="CxlkvSecondaryTier",
                hint="set model in the cxlkv tier's config: blocks are shared only between "
                "engines serving the same model")
        # The KV cache's dtype: cache_dtype, or the model's dtype when it is "auto".
        dtype = str(_attr_path(vc, "cache_config.cache_dtype") or "auto")
        if dtype == "auto":
            dtype = str(_attr_path(vc, "model_config.dtype") or "auto").replace("torch.", "")
        dp_rank = int(_attr_path(vc, "parallel_config.data_parallel_rank") or 0)
        self.host_id = int(cfg["host_id"]) + dp_rank
        layout = (f"vllm row_bytes={rows.row_bytes} tp={tp} pp={pp} kv_dtype={dtype} "
                  f"{cfg.get('namespace_layout', '')}").strip()
        self.namespace = Namespace(str(cfg.get("tenant", "default")), str(model), layout)
        if "PYTHONHASHSEED" not in os.environ:
            # vLLM seeds its root block hash at random without it: this engine's blocks are
            # then found by no other process (they are still stored and loaded correctly).
            log.warning("cxlkv: PYTHONHASHSEED is not set, so vLLM's block hashes differ from "
                        "every other engine's and no blocks will be shared; set the same "
                        "PYTHONHASHSEED for every engine using domain %s", cfg["domain"])
        # Tier-owned KV events (build_tier_class's event_cls): off unless asked for and
        # vLLM's own KV events are on.
        self.events = False
        if cfg.get("enable_kv_events"):
            if not _attr_path(offloading_spec, "kv_events_config.enable_kv_cache_events"):
                log.warning("cxlkv: enable_kv_events is set but vLLM's KV cache events are off "
                            "(kv_events_config.enable_kv_cache_events): the tier emits none")
            else:
                self.events = True
        check_s = cfg.get("removal_check_s", 1.0)
        if not isinstance(check_s, (int, float)) or isinstance(check_s, bool) or check_s <= 0:
            raise InvalidArgumentError(
                f"{what}: removal_check_s {check_s!r} is not a number of seconds > 0",
                operation="CxlkvSecondaryTier",
                hint="seconds between looks for blocks that left the domain, e.g. 1")
        loc = cfg.get("locality")
        if loc is not None and loc not in ("LOCAL", "REMOTE"):
            raise InvalidArgumentError(
                f"{what}: locality {loc!r} is not LOCAL or REMOTE",
                operation="CxlkvSecondaryTier",
                hint="LOCAL or REMOTE: where the domain's memory is, seen from this engine")
        self.locality = loc
        med = cfg.get("medium")
        if med is not None and med not in MEDIUMS:
            raise InvalidArgumentError(
                f"{what}: medium {med!r} is not one of {', '.join(MEDIUMS)}",
                operation="CxlkvSecondaryTier",
                hint="CPU (the default: CXL memory is memory) or STORAGE (for vLLM's "
                "per-request tier filters and routers to treat the domain as storage)")
        self.medium_name = med
        att_cfg = dict(cfg, host_id=self.host_id)
        self._att = Attachment(att_cfg, "CxlkvSecondaryTier", block_bytes=rows.row_bytes)
        try:
            self.tier = OffloadTier(self._att.domain, self.namespace, primary_kv_view,
                                    block_bytes=rows.row_bytes, track_events=self.events,
                                    removal_check_s=float(check_s))
        except BaseException:
            self._att.close()
            raise

    # ---- the calls every generation makes ----------------------------------------------------

    def lookup(self, key: Any, req_context: Any) -> Optional[bool]:
        return self.tier.lookup(key, req_context)

    def job(self, job: Any) -> TierJob:
        """vLLM's job (``JobMetadata`` / ``TransferJob``) as the store's job. The primary
        rows are the generation's id field (``block_ids`` or ``chunk_ids``); the other name
        is accepted too (both name rows of the primary view)."""
        ids_field = self.generation.job_ids_field
        other = "block_ids" if ids_field == "chunk_ids" else "chunk_ids"
        ids = getattr(job, ids_field, None)
        if ids is None:
            ids = getattr(job, other, None)
        if ids is None:
            raise InvalidArgumentError(
                f"a {type(job).__name__} with neither {ids_field!r} nor {other!r}: not a vLLM "
                f"transfer job", operation="submit",
                hint="run python -m cxlkv.integrations.check against this vLLM")
        return TierJob(job.job_id, list(job.keys), ids, bool(getattr(job, "is_promotion", False)),
                       getattr(job, "req_context", None))

    def submit_store(self, job: Any) -> None:
        self.tier.submit_store(self.job(job))

    def submit_load(self, job: Any) -> None:
        self.tier.submit_load(self.job(job))

    def finished(self, job_result_cls: Any) -> List[Any]:
        """Finished jobs as the engine's ``JobResult`` (the fields it declares)."""
        fields = {f.name for f in dataclasses.fields(job_result_cls)}
        out: List[Any] = []
        for r in self.tier.get_finished():
            if r.error:
                log.warning("cxlkv tier job %d failed: %s", r.job_id, r.error)
            out.append(job_result_cls(**_result_fields(r, fields)))
        return out

    def take_events(self, event_cls: Any, medium: Any, locality_cls: Any) -> List[Any]:
        """What happened to the tier's blocks since the last call, as the engine's
        ``OffloadingEvent``s in order: ``removed=False`` for the keys of each store job that
        succeeded, ``removed=True`` for keys that left the domain since they were announced
        (``locality`` only where the event declares it)."""
        events = self.tier.take_events()
        if not events:
            return []
        fields = {f.name for f in dataclasses.fields(event_cls)}
        out = []
        for removed, keys in events:
            kw: Dict[str, Any] = {"keys": keys, "medium": medium, "removed": removed}
            if "locality" in fields:
                kw["locality"] = (locality_cls(self.locality)
                                  if self.locality is not None and locality_cls is not None
                                  else None)
            out.append(event_cls(**kw))
        return out

    def drain(self) -> None:
        self.tier.drain()

    def shutdown(self) -> None:
        self.tier.shutdown()
        self._att.close()


def _result_fields(r: TierJobResult, fields: Iterable[str]) -> Dict[str, Any]:
    d: Dict[str, Any] = {"job_id": r.job_id, "success": r.success}
    for k in ("successful_keys", "transfer_time", "transfer_bytes"):
        if k in fields:
            d[k] = getattr(r, k)
    return d


def build_tier_class(generation: VllmGeneration, base: type, job_result_cls: type, *,
                     engine_version: Optional[str], by_shape: bool = False,
                     lookup_result: Any = None,
                     request_context_cls: Any = None, medium: Any = None,
                     event_cls: Any = None, locality_cls: Any = None,
                     medium_cls: Any = None) -> type:
    """The tier class of one interface generation: a subclass of the engine's
    ``SecondaryTierManager`` (`base`) whose methods are that generation's, each forwarding to
    one :class:`VllmTierCore`.

    Args:
        generation: which interface `base` has.
        base, job_result_cls: the engine's ``SecondaryTierManager`` and ``JobResult``.
        engine_version: the installed engine's version, checked against the pin when a tier
            is constructed.
        by_shape: the generation was chosen by `base`'s shape
            (:func:`~cxlkv.integrations.vllm_generations.generation_of_interface`): a version
            outside its pin is logged, not refused.
        lookup_result: the engine's ``LookupResult`` enum (generations that answer with it).
        request_context_cls: the engine's ``RequestOffloadingContext`` (what
            ``on_new_request`` returns), where the generation has it.
        medium: the tier's medium: the ``medium`` class attribute and the medium of its events
            (``Medium.CPU`` where the engine has that enum, the string ``"CPU"`` where events
            name mediums by strings, as v0.26.0's do).
        event_cls, locality_cls: the engine's ``OffloadingEvent`` and ``Locality``, where its
            base has ``take_events`` (tier-owned KV events): the class then implements it.
        medium_cls: the engine's ``Medium`` enum (None where mediums are strings): a tier whose
            config sets ``medium`` declares ``medium_cls[<name>]`` (else the name itself) on
            the instance, and its events name it.

    Where the request context carries a ``load_tier_filter`` (vLLM's per-request tier
    filtering, PR #48123: ``load_tier_filter.allows(medium)``), a lookup the filter does not
    allow for the tier's medium answers a miss, as vLLM's own tiers do.
    """
    if generation.lookup_enum and lookup_result is None:
        raise EngineVersionError(f"the {generation.name} interface answers lookups with "
                                 "LookupResult, and none was given", operation="build_tier_class",
                                 hint="pass vllm.v1.kv_offload.base.LookupResult")

    def __init__(self: Any, offloading_spec: Any, primary_kv_view: Any, tier_type: str,
                 **config: Any) -> None:
        base.__init__(self, offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                      tier_type=tier_type)
        self._core = VllmTierCore(generation, engine_version, offloading_spec, primary_kv_view,
                                  tier_type, config, by_shape=by_shape)
        name = self._core.medium_name
        if name is not None:
            member = getattr(medium_cls, name, None) if medium_cls is not None else name
            if member is None:
                self._core.shutdown()
                raise EngineVersionError(
                    f"the cxlkv tier's medium {name!r} is not a member of this vLLM's Medium "
                    f"enum ({', '.join(m.name for m in medium_cls)})",
                    operation="CxlkvSecondaryTier",
                    hint="leave medium unset (CPU) or name one of those members")
            self.medium = member

    ns: Dict[str, Any] = {
        "__init__": __init__,
        "__doc__": f"cxlkv's vLLM secondary tier, {generation.name} interface "
                   f"({generation.pin}); see cxlkv.integrations.vllm.",
        "__module__": __name__,
        "generation": generation,
        "core": property(lambda self: self._core),
        "tier": property(lambda self: self._core.tier),
    }
    if generation.lookup_enum:
        answers = {True: lookup_result.HIT, False: lookup_result.MISS,
                   None: lookup_result.RETRY}

        def lookup(self: Any, key: Any, req_context: Any) -> Any:
            if not _load_allowed(req_context, getattr(self, "medium", None)):
                return lookup_result.MISS
            return answers[self._core.lookup(key, req_context)]
    else:
        def lookup(self: Any, key: Any, req_context: Any) -> Optional[bool]:
            return self._core.lookup(key, req_context)
    ns["lookup"] = lookup

    def submit_store(self: Any, job_metadata: Any) -> None:
        self._core.submit_store(job_metadata)

    def submit_load(self: Any, job_metadata: Any) -> None:
        self._core.submit_load(job_metadata)

    def finished(self: Any) -> List[Any]:
        return self._core.finished(job_result_cls)

    ns.update(submit_store=submit_store, submit_load=submit_load)
    ns[generation.finished_method] = finished

    def touch(self: Any, keys: Any, req_context: Any) -> None:
        self._core.tier.touch(keys, req_context)

    def shutdown(self: Any) -> None:
        self._core.shutdown()

    ns.update(touch=touch, shutdown=shutdown)
    if generation.on_new_request:
        def on_new_request(self: Any, req_context: Any) -> Any:
            return request_context_cls()
        ns["on_new_request"] = on_new_request
    # Every class drains: releases of several generations declare drain_jobs abstract
    # (vllm_generations.generation_of_interface), and one that does not never calls it.
    def drain_jobs(self: Any) -> None:
        self._core.drain()
    ns["drain_jobs"] = drain_jobs
    if medium is not None:
        ns["medium"] = medium
    if event_cls is not None:
        def take_events(self: Any) -> List[Any]:
            return self._core.take_events(event_cls, getattr(self, "medium", medium),
                                          locality_cls)
        ns["take_events"] = take_events
    return type("CxlkvSecondaryTier", (base,), ns)


def _load_allowed(req_context: Any, medium: Any) -> bool:
    """Whether the request's load tier filter (vLLM PR #48123; absent before it) allows a
    tier of `medium`: no filter, or no medium, allows."""
    flt = getattr(req_context, "load_tier_filter", None)
    if flt is None or medium is None or not hasattr(flt, "allows"):
        return True
    return bool(flt.allows(medium))


# ---- the installed vLLM -------------------------------------------------------------------------

IMPORT_ERROR: Optional[BaseException] = None
ENGINE_VERSION: Optional[str] = None
GENERATION: Optional[VllmGeneration] = None
#: How the installed base class's shape was read and which generation it has, and why
#: (:func:`~cxlkv.integrations.vllm_generations.identify`); None without vLLM.
IDENTIFICATION: Optional[gens.Identification] = None
CxlkvSecondaryTier: Any = None


def _from_installed_vllm() -> None:
    """Builds :data:`CxlkvSecondaryTier` for the installed vLLM (if any)."""
    global IMPORT_ERROR, ENGINE_VERSION, GENERATION, IDENTIFICATION, CxlkvSecondaryTier
    try:
        import vllm as _vllm
        from vllm.v1.kv_offload import base as _kvbase
        from vllm.v1.kv_offload.tiering import base as _tbase
    except ImportError as e:  # vLLM is not installed here
        IMPORT_ERROR = e
        return
    ENGINE_VERSION = getattr(_vllm, "__version__", None)
    base = _tbase.SecondaryTierManager
    lookup_result = getattr(_kvbase, "LookupResult", None)
    by_version = gens.generation_for(ENGINE_VERSION)
    # The installed base class decides which class fits it, and that class runs whatever the
    # version (it is logged if outside the class's pin); only a base of no known shape falls
    # back to the version, whose class VllmTierCore refuses outside its pin, saying why.
    # python -m cxlkv.integrations.check reports IDENTIFICATION: the same reading.
    IDENTIFICATION = gens.identify(gens.read_shape(base, lookup_result, _tbase), ENGINE_VERSION)
    by_interface = IDENTIFICATION.generation
    gen = by_interface or by_version
    if gen is None:
        IMPORT_ERROR = EngineVersionError(
            f"vLLM {ENGINE_VERSION}: outside every pin ({gens.SUPPORTED}) and its "
            f"SecondaryTierManager has no known shape ("
            + "; ".join(IDENTIFICATION.shape.facts()) + ")",
            operation="cxlkv.integrations.vllm",
            hint=f"install vllm{gens.SUPPORTED}; python -m cxlkv.integrations.check says what "
            "did not match")
        return
    if by_interface is None:
        # Its version's class is built, and refused or failing at engine start; say why now.
        log.warning("cxlkv: vLLM %s's SecondaryTierManager has a shape no cxlkv generation "
                    "knows (%s); the tier falls back to the %s interface its version is pinned "
                    "to. Run python -m cxlkv.integrations.check for what did not match",
                    ENGINE_VERSION, "; ".join(IDENTIFICATION.shape.facts()), gen.name)
    GENERATION = gen
    # Tier-owned KV events (PR #46544): the base declares take_events.
    owns_events = callable(getattr(base, "take_events", None))
    # Tiers declare their medium, and their events name it; CXL memory is memory, the medium
    # of vLLM's own CPU tier, not storage: Medium.CPU where vLLM has that enum, else the string
    # its CPU tier uses (v0.26.0: OffloadingEvent.medium is a str, MEDIUM_CPU = "CPU";
    # docs/engines.md), never None, which routers read as the device tier.
    medium_enum = getattr(_kvbase, "Medium", None)
    medium = (getattr(medium_enum, "CPU", None) if medium_enum is not None
              else MEDIUM_CPU if owns_events else None)
    CxlkvSecondaryTier = build_tier_class(
        gen, base, _tbase.JobResult, engine_version=ENGINE_VERSION,
        by_shape=by_interface is not None, lookup_result=lookup_result,
        request_context_cls=getattr(_kvbase, "RequestOffloadingContext", None), medium=medium,
        event_cls=getattr(_kvbase, "OffloadingEvent", None) if owns_events else None,
        locality_cls=getattr(_kvbase, "Locality", None), medium_cls=medium_enum)


#: Whether a base's lookup is declared to answer vLLM's LookupResult (one home:
#: vllm_generations.answers_lookup_result).
_answers_lookup_result = gens.answers_lookup_result


_from_installed_vllm()


def register() -> None:
    """Makes the ``cxlkv`` tier type known to vLLM's ``SecondaryTierFactory`` (idempotent).

    Raises:
        EngineVersionError: vLLM is missing, matches no known interface, or its factory has no
            ``register_tier``.
    """
    if CxlkvSecondaryTier is None:
        raise EngineVersionError(f"vLLM is not usable: {IMPORT_ERROR}", operation="register",
                                 hint=f"install vllm{gens.SUPPORTED} in this environment")
    from vllm.v1.kv_offload.tiering import factory

    fac = getattr(factory, "SecondaryTierFactory", None)
    if fac is None or not hasattr(fac, "register_tier"):
        raise EngineVersionError(
            "vllm.v1.kv_offload.tiering.factory has no SecondaryTierFactory.register_tier",
            operation="register", hint="run python -m cxlkv.integrations.check")
    if TIER_TYPE in getattr(fac, "_registry", {}):
        return
    fac.register_tier(TIER_TYPE, __name__, "CxlkvSecondaryTier")


def register_plugin() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM calls it in every process it starts.

    Registers the tier where vLLM is usable; otherwise logs why and leaves vLLM alone (a
    plugin that raises would stop engines that do not use the tier). A configuration that
    names the ``cxlkv`` tier then fails at engine start with that reason."""
    try:
        register()
    except EngineVersionError as e:
        log.warning("cxlkv: the vLLM tier is not registered: %s", e)
