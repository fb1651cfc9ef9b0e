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

Two processes joining as one host row would both publish as that host, each taking the
row from the other (the C API takes a new incarnation on every join, silently). Processes
of one machine are kept apart: the attachment holds an exclusive ``flock`` on a file named
after the domain and the host row (in ``/dev/shm``, else the temporary directory; removed
when it leaves) while it is joined; across machines an ``orchestrator:`` domain's orchestrator
refuses a row that is live on another machine. A vLLM tier joins its one row and a taken row
is refused at engine start; an SGLang rank tries the rows its configuration allows and takes
the first free one (``Attachment(rows=...)``). Engines on different machines sharing a
``devdax:`` domain without an orchestrator must be given disjoint ``host_id`` ranges by
configuration: nothing else sees both machines.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from typing import Any, Dict, Iterable, List, Mapping, Optional, TextIO

from ..domain import Domain
from ..errors import ExistsError, InvalidArgumentError, PermissionDeniedError
from ..pool import Arena, layout_for_block_bytes


class RowTaken(InvalidArgumentError):
    """A host row another attachment holds: on this machine (the per-row lock), or, for an
    ``orchestrator:`` domain, live on another machine (the orchestrator refused the join)."""


class Attachment:
    """A domain joined with its arenas, as one configuration describes; close() undoes it.

    `rows`, when given, are the host rows to try in order (SGLang's ranks: see
    :func:`cxlkv.integrations.sglang.candidate_rows`): the first one free is joined, so
    processes that nothing in their configuration tells apart still get rows of their own.
    A row is free when no process of this machine holds its lock and, for an ``orchestrator:``
    domain, no other machine holds it live. Without `rows` only ``cfg["host_id"]`` is tried
    and a taken row is an error. :attr:`host_id` is the row joined.
    """

    def __init__(self, cfg: Mapping[str, Any], what: str, *,
                 block_bytes: Optional[int] = None,
                 rows: Optional[Iterable[int]] = None) -> None:
        for k in ("domain", "host_id"):
            if k not in cfg:
                raise InvalidArgumentError(
                    f"the cxlkv configuration lacks {k!r}", operation=what,
                    hint="set domain (the domain's spec) and host_id in the engine's "
                    "extra config")
        if rows is None:
            self._join(cfg, int(cfg["host_id"]), what, block_bytes)
            return
        taken: List[str] = []
        for row in rows:
            try:
                self._join(cfg, row, what, block_bytes)
                return
            except RowTaken as e:
                taken.append(f"{row} ({e.args[0] if e.args else e})")
            except (InvalidArgumentError, PermissionDeniedError) as e:
                if not taken or not _outside(e):
                    raise
                raise InvalidArgumentError(
                    f"no free host row in domain {cfg['domain']}: row {row} is outside it "
                    f"({e}), and the rows before it are taken: {'; '.join(taken)}",
                    operation=what,
                    hint="format the domain with more host rows (max_hosts), lower host_id, "
                    "or stop an engine that holds rows of this domain") from e
        raise InvalidArgumentError(f"no host row to try in domain {cfg['domain']}",
                                   operation=what, hint="report this")

    def _join(self, cfg: Mapping[str, Any], row: int, what: str,
              block_bytes: Optional[int]) -> None:
        self.host_id = row
        self.arenas: List[Arena] = []
        self.grown: Optional[Arena] = None
        self._lock = _HostRowLock(str(cfg["domain"]), row, what)
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
            try:
                self.domain = Domain.join(spec, row, arenas=self.arenas, heartbeat_s=hb)
            except ExistsError as e:  # the orchestrator: row `row` is live on another machine
                raise RowTaken(str(e), operation=what, hint=e.hint) from e
            if not self.arenas:  # an orchestrator domain: an arena in a lent extent
                if block_bytes is None:
                    self.domain.leave()
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
            self._lock.close()
            raise
        self.tenant = str(cfg.get("tenant", "default"))

    def close(self) -> None:
        # Leaving closes an arena grown in a lent extent (cxlkv_domain_leave).
        self.domain.leave()
        self._lock.close()  # the host row is free for another engine
        for a in self.arenas:
            a.close()


def _outside(e: Exception) -> bool:
    """Whether a join failed because the row is beyond the domain's host rows (a file or
    devdax domain's max_hosts, or what an orchestrator admits)."""
    return "outside the domain" in str(e) or "not allowed in this domain" in str(e)


class _HostRowLock:
    """An exclusive flock on a file named after (domain, host row), removed on release.

    Taking it: open (creating), flock without waiting, then check that the path still names
    the locked file (a holder that released meanwhile unlinked it: try again on the new one).
    Releasing: unlink while still holding the lock, then close. So a file exists exactly
    while a holder holds it, and no two holders hold one row.
    """

    def __init__(self, spec: str, host_id: int, what: str) -> None:
        source = spec.split("?", 1)[0]  # file:/dev/shm/d?size=... and file:/dev/shm/d: one
        tag = hashlib.sha256(source.encode()).hexdigest()[:16]
        base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        self.path = os.path.join(base, f"cxlkv-hostrow-{tag}-{host_id}.lock")
        while True:
            f = open(self.path, "a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "unknown"
                f.close()
                raise RowTaken(
                    f"host row {host_id} of domain {source} is already joined by another "
                    f"engine on this machine (pid {holder}; lock {self.path})", operation=what,
                    hint="give every vLLM engine its own host_id (SGLang ranks take the next "
                    "free row themselves): two processes on one host row would take it from "
                    "each other") from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            f.close()  # the previous holder removed it after we opened it: take the new one
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._f: Optional[TextIO] = f

    def close(self) -> None:
        if self._f is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self._f.close()
        self._f = None


def as_dict(x: Any) -> Dict[str, Any]:
    return dict(x) if x else {}


def _round_block(n: int, tokens_per_block: int = 16) -> int:
    """`n` rounded up to a block size layout_for_block_bytes accepts."""
    q = 2 * tokens_per_block
    return (n + q - 1) // q * q
