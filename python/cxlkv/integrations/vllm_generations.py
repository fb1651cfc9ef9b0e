"""The generations of vLLM's secondary-tier interface the cxlkv tier is written for.

Pure data, no vLLM import: which releases share one interface (``SecondaryTierManager`` in
``vllm/v1/kv_offload/tiering/base.py``), what differs between them, and where each was read
(docs/engines.md has the table with sources). :mod:`cxlkv.integrations.vllm` builds one thin
adapter class per generation over one core, and picks the generation by the installed base
class's shape (:func:`read_shape`: its abstract methods, what ``lookup`` answers, the job
dataclass and its id field; :func:`identify`); the version only breaks ties between generations
of one shape. ``python -m cxlkv.integrations.check`` reports the same :class:`Identification`
(the adapter's own, :data:`cxlkv.integrations.vllm.IDENTIFICATION`): the generation, the facts
that matched, and for a shape no generation has, what did not match each one.

What every generation shares (read at each release):

* the tier factory (``SecondaryTierFactory.create_secondary_tier`` in
  ``tiering/factory.py``) pops ``type`` from the tier's config dict and calls
  ``tier_cls(offloading_spec=..., primary_kv_view=..., tier_type=..., **rest_of_config)``;
* the base constructor takes ``(offloading_spec, primary_kv_view, tier_type)``;
* ``submit_store(job)`` / ``submit_load(job)`` take a job naming primary-tier rows by id;
  keys are ``OffloadKey`` bytes (block hash + 4-byte big-endian group index);
* every method runs in the scheduler and must not block.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from . import parse_version


@dataclass(frozen=True)
class VllmGeneration:
    """One interface generation of vLLM's ``SecondaryTierManager``."""

    name: str  # "0.22", "0.23", "0.26", "0.28", "0.32": the release it was first mapped at
    min_version: str  # inclusive
    below_version: str  # exclusive
    tag_read: str  # the release tag (or page) whose interface this is; "" if none was read
    finished_method: str  # how the tier reports finished jobs
    lookup_enum: bool  # lookup answers a LookupResult (else True / False / None)
    job_ids_field: str  # the job's field of primary-tier ids ("block_ids" / "chunk_ids")
    job_class: str  # the job dataclass's name in tiering/base.py
    on_new_request: bool  # on_new_request(req_context) -> RequestOffloadingContext, abstract
    drain_jobs: bool  # drain_jobs() (block until in-flight jobs finish), abstract

    @property
    def abstract_methods(self) -> Tuple[str, ...]:
        """The methods the generation's base class declares abstract."""
        names = ["lookup", "submit_store", "submit_load", self.finished_method]
        if self.on_new_request:
            names.append("on_new_request")
        if self.drain_jobs:
            names.append("drain_jobs")
        return tuple(sorted(names))

    def covers(self, version: str) -> bool:
        v = _pad(parse_version(version))
        return bool(parse_version(version)) and _pad(parse_version(self.min_version)) <= v < _pad(
            parse_version(self.below_version))

    @property
    def pin(self) -> str:
        return f">={self.min_version},<{self.below_version}"


def _pad(t: Tuple[int, ...]) -> Tuple[int, ...]:
    return t + (0,) * (4 - len(t))


GENERATIONS: Tuple[VllmGeneration, ...] = (
    # v0.22.x: the first released tiering interface. lookup -> bool | None, get_finished().
    VllmGeneration("0.22", "0.22.0", "0.23.0", "v0.22.1", "get_finished", False, "block_ids",
                   "JobMetadata", False, False),
    # v0.23-v0.24: get_finished_jobs() replaces get_finished(); on_new_request is abstract
    # (and, at v0.24.0, drain_jobs: see generation_of_interface).
    VllmGeneration("0.23", "0.23.0", "0.25.0", "v0.23.0", "get_finished_jobs", False,
                   "block_ids", "JobMetadata", True, False),
    # v0.25-v0.27 (named "0.26", where it was first mapped): lookup answers
    # vllm.v1.kv_offload.base.LookupResult and drain_jobs() is abstract from the v0.25.0 tag
    # (tiering/base.py:84, :222 at 702f4814; docs/engines.md); v0.26.0 adds take_events()
    # (tier-owned events, medium a str), ParentManager and serve_external_requests (optional).
    # Where v0.27.x's job dataclass is JobMetadata (not established; docs/engines.md), it is
    # this shape.
    VllmGeneration("0.26", "0.25.0", "0.28.0", "v0.25.0", "get_finished_jobs", True,
                   "block_ids", "JobMetadata", True, True),
    # JobMetadata renamed TransferJob, still naming block_ids (vLLM's main branch by
    # 2026-08-17, before the block->chunk rename of PR #52615). No tag or release page was
    # read for it: named "0.28", the first release cut after that main (docs/engines.md); the
    # shape, not this pin, picks it.
    VllmGeneration("0.28", "0.28.0", "0.32.0", "", "get_finished_jobs", True,
                   "block_ids", "TransferJob", True, True),
    # v0.32+: blocks renamed chunks (TransferJob.chunk_ids; PR #52615); drain_jobs() is
    # abstract. Read from docs.vllm.ai's v0.32.0 release page, not a tag.
    VllmGeneration("0.32", "0.32.0", "0.34.0", "v0.32.0 (release page)", "get_finished_jobs",
                   True, "chunk_ids", "TransferJob", True, True),
)

#: The whole range the tier supports, lowest to highest release.
SUPPORTED = f">={GENERATIONS[0].min_version},<{GENERATIONS[-1].below_version}"


def generation_for(version: Optional[str]) -> Optional[VllmGeneration]:
    """The generation whose pin covers `version`; None outside every pin."""
    if not version:
        return None
    for g in GENERATIONS:
        if g.covers(version):
            return g
    return None


def generation_named(name: str) -> VllmGeneration:
    for g in GENERATIONS:
        if g.name == name:
            return g
    raise KeyError(f"no vLLM interface generation {name!r}; known: "
                   f"{', '.join(g.name for g in GENERATIONS)}")


def _without_drain(names: Tuple[str, ...] | frozenset) -> Tuple[str, ...]:
    return tuple(sorted(set(names) - {"drain_jobs"}))


# ---- the installed base class's shape: the one home of the detection ---------------------------
#
# The adapter (cxlkv.integrations.vllm._from_installed_vllm) and the check
# (python -m cxlkv.integrations.check) both read the installed base class with read_shape and
# pick the generation with identify; nothing else tells generations apart.


@dataclass(frozen=True)
class BaseShape:
    """The facts of an installed ``SecondaryTierManager`` that tell the generations apart.

    ``job`` is the job dataclass ``tiering/base.py`` declares and its field of primary-tier ids
    (e.g. ``("TransferJob", "chunk_ids")``); None where it could not be read (then it is not
    compared)."""

    abstract_methods: Tuple[str, ...]
    lookup_enum: bool  # lookup is declared to answer vllm.v1.kv_offload.base.LookupResult
    job: Optional[Tuple[str, str]] = None

    def facts(self) -> Tuple[str, ...]:
        """The shape in words, one fact a line."""
        out = [f"abstract methods: {', '.join(self.abstract_methods) or '(none)'}",
               "lookup answers: " + ("LookupResult" if self.lookup_enum
                                     else "True / False / None (no LookupResult declared)")]
        out.append("job: " + (f"{self.job[0]}.{self.job[1]}" if self.job
                              else "(no JobMetadata or TransferJob dataclass found)"))
        return tuple(out)


def read_shape(base: type, lookup_result: Any = None, base_module: Any = None) -> BaseShape:
    """The shape of an installed ``SecondaryTierManager``.

    Args:
        base: the class (``vllm.v1.kv_offload.tiering.base.SecondaryTierManager``).
        lookup_result: vLLM's ``LookupResult`` (``vllm.v1.kv_offload.base``), None if absent.
        base_module: the module holding `base` and its job dataclass (``tiering/base.py``);
            None: the job is not read."""
    job = None
    if base_module is not None:
        for cls_name in ("TransferJob", "JobMetadata"):
            cls = getattr(base_module, cls_name, None)
            if cls is None or not dataclasses.is_dataclass(cls):
                continue
            fields = {f.name for f in dataclasses.fields(cls)}
            ids = next((n for n in ("chunk_ids", "block_ids") if n in fields), None)
            if ids:
                job = (cls_name, ids)
                break
    return BaseShape(tuple(sorted(getattr(base, "__abstractmethods__", ()))),
                     answers_lookup_result(base, lookup_result), job)


def answers_lookup_result(base: type, lookup_result: Any) -> bool:
    """Whether `base.lookup` is declared to return `lookup_result` (vLLM's LookupResult)."""
    if lookup_result is None:
        return False
    ann = getattr(getattr(base, "lookup", None), "__annotations__", {}).get("return")
    return ann is lookup_result or (isinstance(ann, str) and ann.strip("'\"") == "LookupResult")


def _mismatches(g: VllmGeneration, shape: BaseShape) -> Tuple[str, ...]:
    """What in `shape` differs from generation `g`'s interface (empty: it has it)."""
    out = []
    want, have = set(_without_drain(g.abstract_methods)), set(_without_drain(
        shape.abstract_methods))
    if want != have:
        parts = []
        if have - want:
            parts.append(f"declares {', '.join(sorted(have - want))} abstract")
        if want - have:
            parts.append(f"lacks abstract {', '.join(sorted(want - have))}")
        out.append("abstract methods: " + "; ".join(parts))
    if g.lookup_enum != shape.lookup_enum:
        out.append("lookup answers " + ("LookupResult" if shape.lookup_enum else
                                        "True / False / None")
                   + f", the {g.name} interface's " + ("LookupResult" if g.lookup_enum else
                                                       "True / False / None"))
    if shape.job is not None and shape.job != (g.job_class, g.job_ids_field):
        out.append(f"job {shape.job[0]}.{shape.job[1]}, the {g.name} interface's "
                   f"{g.job_class}.{g.job_ids_field}")
    return tuple(out)


@dataclass(frozen=True)
class Identification:
    """Which generation an installed base class has, and why.

    ``generation`` is None when no generation has the shape; then ``mismatches`` says, per
    generation, what did not match."""

    shape: BaseShape
    version: Optional[str]
    generation: Optional[VllmGeneration]
    candidates: Tuple[str, ...]  # the generations whose interface the shape has
    mismatches: Tuple[Tuple[str, Tuple[str, ...]], ...]  # (generation, what differs)

    @property
    def by_shape(self) -> bool:
        return self.generation is not None

    def reasons(self) -> Tuple[str, ...]:
        """Why this generation, in words: the shape facts, then how the choice was made."""
        out = list(self.shape.facts())
        out.append("drain_jobs is not compared (releases of several generations declare it "
                   "abstract; every adapter class defines it)")
        if self.generation is None:
            out.append("no generation has this shape")
            return tuple(out)
        g = self.generation
        if len(self.candidates) == 1:
            out.append(f"only the {g.name} interface has this shape")
        elif self.version and g.covers(self.version):
            out.append(f"the {', '.join(self.candidates)} interfaces have this shape; version "
                       f"{self.version} is in the {g.name} one's releases ({g.pin}), which "
                       "breaks the tie")
        else:
            out.append(f"the {', '.join(self.candidates)} interfaces have this shape; version "
                       f"{self.version or '(unknown)'} is in none of their releases, so the "
                       f"newest, {g.name}, is used")
        if self.version and not g.covers(self.version):
            out.append(f"version {self.version} is outside the releases the {g.name} interface "
                       f"was read at ({g.pin}); the tier runs by the shape")
        return tuple(out)

    def unmatched(self) -> Tuple[str, ...]:
        """What did not match, per generation (for a shape no generation has)."""
        return tuple(f"not the {name} interface: {'; '.join(why)}"
                     for name, why in self.mismatches if why)


def identify(shape: BaseShape, version: Optional[str] = None) -> Identification:
    """The generation whose interface `shape` has.

    ``drain_jobs`` does not tell generations apart: vLLM's main branch made it abstract on
    2026-06-15 (PR #44541), before the LookupResult change, so release branches cut after it
    declare it whatever else they have (the v0.24.0 tag has it with ``bool | None`` lookups;
    docs/engines.md), and every adapter class defines it. Among the generations that
    match, the one whose pin covers `version` wins, else the newest."""
    mism = tuple((g.name, _mismatches(g, shape)) for g in GENERATIONS)
    found = [g for g in reversed(GENERATIONS) if not dict(mism)[g.name]]
    pick = next((g for g in found if version and g.covers(version)), None)
    if pick is None and found:
        pick = found[0]
    return Identification(shape, version, pick, tuple(g.name for g in reversed(found)), mism)


def generation_of_interface(abstract: Tuple[str, ...] | frozenset, lookup_enum: bool,
                            version: Optional[str] = None,
                            job: Optional[Tuple[str, str]] = None) -> Optional[VllmGeneration]:
    """The generation whose abstract method set, lookup answer (and job, where given) an
    installed base class has; None if none matches (:func:`identify`)."""
    return identify(BaseShape(tuple(sorted(abstract)), lookup_enum, job), version).generation
