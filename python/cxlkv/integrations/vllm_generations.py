"""The generations of vLLM's secondary-tier interface the cxlkv tier is written for.

Pure data, no vLLM import: which releases share one interface (``SecondaryTierManager`` in
``vllm/v1/kv_offload/tiering/base.py``), what differs between them, and where each was read
(docs/engines.md has the table with sources). :mod:`cxlkv.integrations.vllm` builds one thin
adapter class per generation over one core, and picks the generation by the installed base
class's shape (its abstract methods and what ``lookup`` answers); the version only breaks ties
between generations of one shape.

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

from dataclasses import dataclass
from typing import Optional, Tuple

from . import parse_version


@dataclass(frozen=True)
class VllmGeneration:
    """One interface generation of vLLM's ``SecondaryTierManager``."""

    name: str  # "0.22", "0.23", "0.26", "0.32": the release the generation was first mapped at
    min_version: str  # inclusive
    below_version: str  # exclusive
    tag_read: str  # the release tag whose interface this is
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
    # v0.25-v0.31 (named "0.26", where it was first mapped): lookup answers
    # vllm.v1.kv_offload.base.LookupResult and drain_jobs() is abstract from the v0.25.0 tag
    # (tiering/base.py:84, :222 at 702f4814; docs/engines.md); v0.26.0 adds take_events()
    # (tier-owned events, medium a str), ParentManager and serve_external_requests (optional).
    VllmGeneration("0.26", "0.25.0", "0.32.0", "v0.25.0", "get_finished_jobs", True,
                   "block_ids", "JobMetadata", True, True),
    # v0.32+: blocks renamed chunks (TransferJob.chunk_ids); drain_jobs() is abstract.
    VllmGeneration("0.32", "0.32.0", "0.34.0", "v0.32.0", "get_finished_jobs", True,
                   "chunk_ids", "TransferJob", True, True),
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


def generation_of_interface(abstract: Tuple[str, ...] | frozenset, lookup_enum: bool,
                            version: Optional[str] = None) -> Optional[VllmGeneration]:
    """The generation whose abstract method set (and lookup answer) an installed base class
    has; None if none matches.

    ``drain_jobs`` does not tell generations apart: vLLM's main branch made it abstract on
    2026-06-15 (PR #44541), before the LookupResult change, so release branches cut after it
    declare it whatever else they have (the v0.24.0 tag has it with ``bool | None`` lookups;
    docs/engines.md), and every adapter class defines it. Among the generations that
    match, the one whose pin covers `version` wins, else the newest."""
    want = _without_drain(abstract)
    found = [g for g in reversed(GENERATIONS)
             if _without_drain(g.abstract_methods) == want and g.lookup_enum == lookup_enum]
    for g in found:
        if version and g.covers(version):
            return g
    return found[0] if found else None
