"""The configuration both adapters take (an engine's extra-config dict), and what it builds.

Keys:
    domain (str, required): the domain's spec (``file:...``, ``devdax:...``, or
        ``orchestrator:/run/cxlkv/<domain>.sock``).
    host_id (int, required): this process's host row in the domain.
    pool (str): the pool spec holding this host's arena. Not needed for an
        ``orchestrator:`` domain: without it the adapter grows an arena in an extent the
        orchestrator lends (``cxlkv_domain_grow``), as the C and C++ clients do.
    read_pools (list of str): pools of other hosts whose blocks this host reads (on one
        shared pool, leave it out: ``pool`` serves both).
    tenant (str): namespace tenant, default ``"default"``.
    heartbeat_s (float): heartbeat period, default 0.1.
    allow_untested_version (bool): use the adapter with an engine outside its pin.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ..domain import Domain
from ..errors import InvalidArgumentError
from ..pool import Arena, layout_for_block_bytes


class Attachment:
    """A domain joined with its arenas, as one configuration describes; close() undoes it."""

    def __init__(self, cfg: Mapping[str, Any], what: str, *,
                 block_bytes: Optional[int] = None) -> None:
        for k in ("domain", "host_id"):
            if k not in cfg:
                raise InvalidArgumentError(
                    f"the cxlkv configuration lacks {k!r}", operation=what,
                    hint="set domain (the domain's spec) and host_id in the engine's "
                    "extra config")
        self.arenas: List[Arena] = []
        self.grown: Optional[Arena] = None
        try:
            pools: List[str] = []
            if cfg.get("pool"):
                pools.append(str(cfg["pool"]))
            pools += [str(p) for p in cfg.get("read_pools", ()) or ()]
            for spec in pools:
                self.arenas.append(Arena.open_spec(spec))
            hb: Optional[float] = cfg.get("heartbeat_s", 0.1)
            spec = str(cfg["domain"])
            if not self.arenas and not spec.startswith("orchestrator:"):
                raise InvalidArgumentError(
                    f"the cxlkv configuration has no pool for domain {spec}", operation=what,
                    hint="set pool (the pool spec of this host's arena), or join through an "
                    "orchestrator (domain = orchestrator:/run/cxlkv/<domain>.sock), which lends "
                    "extents")
            self.domain = Domain.join(spec, int(cfg["host_id"]), arenas=self.arenas,
                                      heartbeat_s=hb)
            if not self.arenas:  # an orchestrator domain: an arena in a lent extent
                if block_bytes is None:
                    raise InvalidArgumentError(
                        "the block size is not known yet", operation=what,
                        hint="the adapter grows its arena once it knows the block size")
                lay, _ = layout_for_block_bytes(_round_block(block_bytes))
                try:
                    self.grown = self.domain.grow(lay)
                except BaseException:
                    self.domain.leave()
                    raise
        except BaseException:
            for a in self.arenas:
                a.close()
            raise
        self.tenant = str(cfg.get("tenant", "default"))

    def close(self) -> None:
        # Leaving closes an arena grown in a lent extent (cxlkv_domain_leave).
        self.domain.leave()
        for a in self.arenas:
            a.close()


def as_dict(x: Any) -> Dict[str, Any]:
    return dict(x) if x else {}


def _round_block(n: int, tokens_per_block: int = 16) -> int:
    """`n` rounded up to a block size layout_for_block_bytes accepts."""
    q = 2 * tokens_per_block
    return (n + q - 1) // q * q
