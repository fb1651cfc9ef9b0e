"""The configuration both adapters take (an engine's extra-config dict), and what it builds.

Keys:
    domain (str, required): the domain's spec (``file:...``, ``devdax:...``, or
        ``orchestrator:/run/cxlkv/<domain>.sock``).
    host_id (int, required): this process's host row in the domain.
    pool (str): the pool spec holding this host's arena (not for an orchestrator domain).
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
from ..pool import Arena


class Attachment:
    """A domain joined with its arenas, as one configuration describes; close() undoes it."""

    def __init__(self, cfg: Mapping[str, Any], what: str) -> None:
        for k in ("domain", "host_id"):
            if k not in cfg:
                raise InvalidArgumentError(
                    f"the cxlkv configuration lacks {k!r}", operation=what,
                    hint="set domain (the domain's spec) and host_id in the engine's "
                    "extra config")
        self.arenas: List[Arena] = []
        try:
            pools: List[str] = []
            if cfg.get("pool"):
                pools.append(str(cfg["pool"]))
            pools += [str(p) for p in cfg.get("read_pools", ()) or ()]
            for spec in pools:
                self.arenas.append(Arena.open_spec(spec))
            hb: Optional[float] = cfg.get("heartbeat_s", 0.1)
            self.domain = Domain.join(str(cfg["domain"]), int(cfg["host_id"]),
                                      arenas=self.arenas, heartbeat_s=hb)
        except BaseException:
            for a in self.arenas:
                a.close()
            raise
        self.tenant = str(cfg.get("tenant", "default"))

    def close(self) -> None:
        self.domain.leave()
        for a in self.arenas:
            a.close()


def as_dict(x: Any) -> Dict[str, Any]:
    return dict(x) if x else {}
