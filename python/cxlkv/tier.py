"""Tiering: KV blocks in CXL and on NVMe under the placement rule (``cxlkv_tier_*``).

A :class:`Tier` keeps KV blocks of one size class of an :class:`~cxlkv.Arena` (the CXL tier)
and an NVMe store (a directory on a local file system with ``O_DIRECT``: ext4, xfs; not
tmpfs), and the placement rule (``docs/placement.md``) decides for every block whether it
lives in CXL, on NVMe, or nowhere (recomputing it is cheaper than any fetch). This module is
the binding of every ``cxlkv_tier_*`` function of ``include/cxlkv/cxlkv.h``;
``docs/tier-capi.md`` explains how the calls fit together, and the C header states each
contract in full. Per request, as an engine would:

1. :meth:`Tier.use` on the prompt's chain of keys (the rule's only source of reuse history);
2. :meth:`Tier.lookup`: each key's :class:`Residence`; the leading run of held keys are hits;
3. hits: :meth:`Tier.prefetch` (a :class:`PrefetchTicket`; NVMe blocks the rule now wants in
   CXL come back) and :meth:`Tier.read` into numpy arrays or CPU torch tensors, from wherever
   each block is; or :meth:`Tier.acquire` to pin a CXL block and read it in place;
4. misses: computed by the engine, then :meth:`Tier.place` (from buffers) or
   :meth:`Tier.place_blocks` (blocks the engine filled in the arena itself).

Keys are :class:`~cxlkv.PrefixKey` values: :meth:`Namespace.chain_keys` from token ids, or
:meth:`Namespace.digest_key` / :meth:`Namespace.digest_chain` from an engine's digests (the
same keys ``cxlkv_prefix_key_from_digest`` gives in C). They are unique within a tier.

Per-key results. Every call that takes keys acts on each key on its own and reports each in a
:class:`TierResults` list: a :class:`Residence` for a key that succeeded, or the exception of
the key's ``CXLKV_E_*`` code (:mod:`cxlkv.errors`; ``BusyError`` means "not now": pinned, I/O
in flight or cooling down). With ``check=True`` (the default) a call where any key failed
raises the first failed key's exception, with the whole list as its ``results`` attribute
(the keys before and after it were acted on: nothing is undone); ``check=False`` returns the
list and raises only for errors of the call itself.

Bad input — a buffer of the wrong size, dtype, device or contiguity, a key that is not a
PrefixKey, a closed tier or arena — raises before the library is called, naming the object
and the fix (``BufferMismatchError``, ``InvalidArgumentError``, ``ClosedError``).

Thread-safety: a tier may be used from any number of threads at once (the library releases
the GIL in every call; NVMe completions are reaped by the threads in :meth:`Tier.read`,
:meth:`PrefetchTicket.poll` / :meth:`~PrefetchTicket.wait` and other calls that wait for I/O:
there is no background thread, so collect every ticket). :meth:`Tier.close` waits for calls
in progress on other threads, then closes.

Ownership: the tier borrows its arena; close the tier first. The tier's blocks are allocated
in the arena's class by this process (``Arena.stats`` counts them; never free them) and return
to the arena when the tier closes: their data is lost unless demoted. Blocks on NVMe survive:
a tier opened later on the same directory finds them (``Residence.ON_NVME``). If the arena is
closed while the tier is open, the tier ends with it and every call raises ``ClosedError``;
close the tier anyway.
"""

from __future__ import annotations

import ctypes
import enum
import json as _json
import math
import os
import threading
from dataclasses import dataclass, fields
from typing import (
    Any,
    Dict,
    List,
    Literal,
    Optional,
    Sequence,
    Tuple,
    Union,
    overload,
)

import numpy as np

from . import _buffers, _lib, errors
from .errors import (
    BufferMismatchError,
    ClosedError,
    CxlkvError,
    InvalidArgumentError,
)
from .keys import Namespace, PrefixKey
from .pool import Arena, Block, uuid_str

__all__ = [
    "CLAUSES",
    "CxlKind",
    "Location",
    "PinnedBlock",
    "PrefetchTicket",
    "Residence",
    "Tier",
    "TierOptions",
    "TierResults",
    "TierStats",
]

# Flags of cxlkv.h (the ABI test compares them with the header).
NVME_DSYNC = 1
NVME_STAGE_READS = 2
NVME_DIRECT_READS = 4
RECORD_USE = 1
PREFETCH_FORCE = 2
EXPLAIN_JSON = 1

# cxlkv_tier_stats.clauses, in the rule's order (docs/placement.md).
CLAUSES = ("pinned", "recompute-cheaper", "below-break-even", "ttft-forced", "cxl-full",
           "above-break-even")

# A value the library never writes into a result slot: tells "not reached" from a result.
_UNSET = 0x7FFFFFFF


class Residence(enum.IntEnum):
    """Where a key's block is (``CXLKV_TIER_*``)."""

    MISSING = 0  #: not held by the tier
    IN_CXL = 1  #: in the arena (lookup gives its address)
    ON_NVME = 2  #: only on NVMe
    DEMOTING = 3  #: in flight: being written to NVMe
    PROMOTING = 4  #: in flight: being read back into CXL
    DROPPED = 5  #: only in placement results: the rule sent it nowhere (recompute it)

    @property
    def held(self) -> bool:
        """The tier holds the block (in CXL, on NVMe, or moving between them)."""
        return self in (Residence.IN_CXL, Residence.ON_NVME, Residence.DEMOTING,
                        Residence.PROMOTING)


class CxlKind(enum.IntEnum):
    """Which of the rule's two CXL tiers the arena is (``CXLKV_TIER_CXL_*``)."""

    EXPANDED = 0  #: a CXL memory expander in this host
    POOLED = 1  #: switch-attached memory pooled across hosts


def _u(v: Any, bits: int, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << bits:
        raise InvalidArgumentError(f"TierOptions.{name}={v!r} must be an int in 0..2^{bits}-1",
                                   operation="TierOptions",
                                   hint=f"fix {name} (cxlkv.h, cxlkv_tier_options)")
    return v


@dataclass(frozen=True)
class TierOptions:
    """How to open a tier (``cxlkv_tier_options``).

    Attributes:
        nvme_dir: the NVMe store's directory (created if missing) on a local file system
            with O_DIRECT. Required.
        size_class: the arena's size class the tier keeps blocks of.
        cxl_kind: how the rule prices the arena (:class:`CxlKind`).
        cxl_blocks: the CXL capacity the occupancy and watermarks count against, in blocks;
            0: every block of the class. Leave some blocks of the class beyond the high
            watermark free: promotions and blocks on their way to NVMe pass through CXL.
        nvme_blocks: at most this many blocks only on NVMe (the least recently used past it
            are deleted); 0: no limit but `nvme_bytes`.
        nvme_bytes: limit on the store's slot file; 0: room for `nvme_blocks`, or the file
            system's free space when that is 0 too.
        config_path: a domain.toml whose ``[placement]`` table configures the rule
            (``orchestrator/domain.example.toml`` lists the keys); None: the defaults.
        nvme_queue_depth: io_uring entries, the most NVMe I/Os in flight; 0: 64.
        nvme_dsync: every NVMe write is on stable media when it completes
            (``CXLKV_TIER_NVME_DSYNC``).
        nvme_stage_reads: None (default): the store measures at open whether its disk reads
            faster into 2 MiB pages and stages reads through its own such buffers if so;
            True / False force staged (``CXLKV_TIER_NVME_STAGE_READS``) or direct reads
            (``CXLKV_TIER_NVME_DIRECT_READS``). docs/nvme.md, "Read staging".
    """

    nvme_dir: Union[str, "os.PathLike[str]"]
    size_class: int = 0
    cxl_kind: Union[CxlKind, int] = CxlKind.EXPANDED
    cxl_blocks: int = 0
    nvme_blocks: int = 0
    nvme_bytes: int = 0
    config_path: Optional[Union[str, "os.PathLike[str]"]] = None
    nvme_queue_depth: int = 0
    nvme_dsync: bool = False
    nvme_stage_reads: Optional[bool] = None

    def to_c(self) -> Tuple[_lib.TierOptionsC, Tuple[bytes, Optional[bytes]]]:
        """The C struct, and the encoded paths it points to (keep them alive with it)."""
        if self.nvme_dir is None or not os.fspath(self.nvme_dir):
            raise InvalidArgumentError(
                "TierOptions.nvme_dir is empty", operation="TierOptions",
                hint="pass the NVMe store's directory, on a local file system with O_DIRECT "
                "(ext4, xfs)")
        d = os.fsencode(self.nvme_dir)
        cfg = os.fsencode(self.config_path) if self.config_path is not None else None
        for name, p in (("nvme_dir", d), ("config_path", cfg)):
            if p is not None and b"\0" in p:
                raise InvalidArgumentError(f"TierOptions.{name} {p!r} contains a NUL byte",
                                           operation="TierOptions", hint="pass a plain path")
        o = _lib.TierOptionsC()
        o.size_class = _u(self.size_class, 32, "size_class")
        o.cxl_kind = _u(int(self.cxl_kind), 32, "cxl_kind")
        o.cxl_blocks = _u(self.cxl_blocks, 64, "cxl_blocks")
        o.nvme_dir = d
        o.nvme_blocks = _u(self.nvme_blocks, 64, "nvme_blocks")
        o.nvme_bytes = _u(self.nvme_bytes, 64, "nvme_bytes")
        o.config_path = cfg
        o.nvme_queue_depth = _u(self.nvme_queue_depth, 32, "nvme_queue_depth")
        o.flags = ((NVME_DSYNC if self.nvme_dsync else 0)
                   | {None: 0, True: NVME_STAGE_READS, False: NVME_DIRECT_READS}[
                       None if self.nvme_stage_reads is None else bool(self.nvme_stage_reads)])
        return o, (d, cfg)


@dataclass(frozen=True)
class Location:
    """Where one key's block is (``cxlkv_tier_location``).

    ``addr`` and ``ref`` are set only for :attr:`Residence.IN_CXL`; the address stays valid
    only while the block stays in CXL (the watermarks may demote it at any time): pin it with
    :meth:`Tier.acquire` to read it in place.
    """

    key: PrefixKey
    residence: Residence
    addr: int = 0
    ref: Optional[_lib.BlockRef] = None


@dataclass(frozen=True)
class TierStats:
    """A tier's counters (``cxlkv_tier_stats``); see cxlkv.h for each field."""

    block_bytes: int
    cxl_capacity_blocks: int
    high_watermark_blocks: int
    low_watermark_blocks: int
    cxl_blocks: int
    nvme_blocks: int
    placed_cxl: int
    placed_nvme: int
    placed_dropped: int
    already_held: int
    nvme_write_failures: int
    demotions: int
    demotion_failures: int
    promotions: int
    promotion_failures: int
    promotions_refused: int
    prefetch_kept: int
    watermark_runs: int
    victims_dropped: int
    nvme_evicted: int
    dropped: int
    cxl_reads: int
    nvme_reads: int
    uses: int
    decisions: int
    from_prior: int
    from_ancestor: int
    clauses: Dict[str, int]  # decisions by the clause that decided, names as CLAUSES
    nvme_file_bytes: int
    nvme_data_loss: int
    retention_s: float  # math.inf until the watermarks first evict
    break_even_s: float

    @classmethod
    def from_c(cls, s: _lib.TierStatsC) -> "TierStats":
        kw: Dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "clauses":
                kw["clauses"] = {name: int(s.clauses[i]) for i, name in enumerate(CLAUSES)}
            elif f.name in ("retention_s", "break_even_s"):
                kw[f.name] = float(getattr(s, f.name))
            else:
                kw[f.name] = int(getattr(s, f.name))
        return cls(**kw)

    def to_dict(self) -> Dict[str, Any]:
        """Plain values for JSON (an infinite retention as None)."""
        out: Dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = None if isinstance(v, float) and not math.isfinite(v) else v
        return out


KeyOutcome = Union[Residence, CxlkvError]


class TierResults(List[KeyOutcome]):
    """Per-key outcomes of a tier call, in the order of the keys acted on: a
    :class:`Residence`, or the exception for the key's ``CXLKV_E_*`` code.

    Attributes:
        keys: the keys, one per entry.
        operation: the C function.
    """

    def __init__(self, keys: Sequence[PrefixKey], outcomes: Sequence[KeyOutcome],
                 operation: str) -> None:
        super().__init__(outcomes)
        self.keys: List[PrefixKey] = list(keys)
        self.operation = operation

    @property
    def ok(self) -> bool:
        """No key failed."""
        return not any(isinstance(o, CxlkvError) for o in self)

    @property
    def errors(self) -> List[Tuple[int, CxlkvError]]:
        """(index, exception) of every key that failed."""
        return [(i, o) for i, o in enumerate(self) if isinstance(o, CxlkvError)]

    def residences(self) -> List[Optional[Residence]]:
        """The residence of each key, None where it failed."""
        return [o if isinstance(o, Residence) else None for o in self]

    def raise_first(self) -> None:
        """Raises the first failed key's exception (its ``results`` is this list), if any."""
        errs = self.errors
        if errs:
            raise errs[0][1]

    def __repr__(self) -> str:
        parts = [o.name if isinstance(o, Residence) else o.code_name for o in self]
        return f"TierResults({self.operation}: {', '.join(parts)})"


def _c_hex(k: PrefixKey) -> str:
    """A key as the library prints it (messages, explain): its one text form, ``str(key)``."""
    return str(k)


def _check_keys(keys: Sequence[PrefixKey], what: str, *, allow_empty: bool = False
                ) -> List[PrefixKey]:
    if isinstance(keys, (str, bytes, bytearray, memoryview, PrefixKey)):
        raise InvalidArgumentError(
            f"keys must be a sequence of PrefixKey, got one {type(keys).__name__}",
            operation=what, hint="wrap a single key in a list")
    out = list(keys)
    if not out and not allow_empty:
        raise InvalidArgumentError("no keys", operation=what, hint="pass at least one key")
    for i, k in enumerate(out):
        if not isinstance(k, PrefixKey):
            raise InvalidArgumentError(
                f"keys[{i}] is a {type(k).__name__}, not a PrefixKey", operation=what,
                hint="derive keys with Namespace.chain_keys (token ids) or "
                "Namespace.digest_key / digest_chain (an engine's 16- or 32-byte digests)")
    return out


def _keys_c(keys: Sequence[PrefixKey]) -> "ctypes.Array[_lib.PrefixKeyC]":
    arr = (_lib.PrefixKeyC * max(len(keys), 1))()
    for i, k in enumerate(keys):
        arr[i].lo = k.lo
        arr[i].hi = k.hi
    return arr


class PinnedBlock:
    """A CXL block pinned by :meth:`Tier.acquire`: no demotion or drop until released.

    ``addr`` (this process) and ``ref`` (the block, e.g. for a GPU copy) are valid until
    :meth:`release`; :meth:`array` gives a read-only numpy view of the block's memory, which
    must not be used after the release. A context manager: leaving the ``with`` block
    releases. Pins count: every acquire needs its own release.
    """

    def __init__(self, tier: "Tier", key: PrefixKey, addr: int, ref: _lib.BlockRef,
                 size_bytes: int) -> None:
        self._tier = tier
        self.key = key
        self.addr = addr
        self.ref = ref
        self.size_bytes = size_bytes
        self._released = False

    def __repr__(self) -> str:
        state = "released" if self._released else "pinned"
        return f"PinnedBlock({_c_hex(self.key)} in {self._tier!r}, {state})"

    def array(self, dtype: Any = np.uint8) -> np.ndarray:
        """A read-only view of the whole block as `dtype` (valid until the release)."""
        if self._released:
            raise ClosedError(f"{self!r} was released", operation="PinnedBlock.array",
                              hint="acquire the key again (Tier.acquire)")
        dt = np.dtype(dtype)
        if self.size_bytes % dt.itemsize:
            raise BufferMismatchError(
                f"a block of {self.size_bytes} bytes is not a whole number of {dt} elements",
                operation="PinnedBlock.array", hint="view it as uint8, or a dtype that divides it")
        buf = (ctypes.c_uint8 * self.size_bytes).from_address(self.addr)
        arr = np.frombuffer(memoryview(buf), dtype=dt)
        arr.setflags(write=False)
        return arr

    def release(self) -> None:
        """Unpins the block (``cxlkv_tier_release``). Idempotent."""
        if self._released:
            return
        self._released = True
        self._tier._release(self.key)

    def __enter__(self) -> "PinnedBlock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class PrefetchTicket:
    """A prefetch in flight (``cxlkv_tier_prefetch``): collect it with :meth:`poll` or
    :meth:`wait` (every ticket must be collected, or the tier closed). A context manager
    that waits on exit if it was not collected.

    The results, one per key acted on (``chain[first:]``): ``IN_CXL`` (promoted, or already
    there), ``ON_NVME`` (the rule or the cool-down kept it there: read it from NVMe),
    ``DEMOTING`` / ``PROMOTING`` (in flight when asked: look again later), ``MISSING``, or an
    exception: ``FullError`` (no free CXL block), ``BusyError`` (cooling down, when forced),
    ``CorruptError`` (the NVMe copy failed its checks and was dropped: recompute it).
    """

    def __init__(self, tier: "Tier", ticket: int, keys: List[PrefixKey]) -> None:
        self._tier = tier
        self.id = ticket
        self.keys = keys
        self._results: Optional[TierResults] = None

    def __repr__(self) -> str:
        state = "done" if self._results is not None else "pending"
        return f"PrefetchTicket({self.id} on {self._tier!r}, {len(self.keys)} key(s), {state})"

    @property
    def done(self) -> bool:
        """Collected (the results are in :attr:`results`)."""
        return self._results is not None

    @property
    def results(self) -> Optional[TierResults]:
        return self._results

    def poll(self, *, check: bool = True) -> Optional[TierResults]:
        """The results once the reads are done (``cxlkv_tier_prefetch_poll``: reaps
        completed I/O, never blocks); None while they run."""
        return self._collect(False, check)

    def wait(self, *, check: bool = True) -> TierResults:
        """Blocks until the reads are done (``cxlkv_tier_prefetch_wait``); the results."""
        res = self._collect(True, check)
        assert res is not None
        return res

    def _collect(self, block: bool, check: bool) -> Optional[TierResults]:
        if self._results is None:
            self._results = self._tier._collect(self, block)
            if self._results is None:
                return None
        if check:
            self._results.raise_first()
        return self._results

    def __enter__(self) -> "PrefetchTicket":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self._results is None and not self._tier.closed:
            self.wait(check=exc_type is None)


Source = Any  # a numpy array, CPU torch tensor or buffer; or a list of them


class Tier:
    """A size class of an arena plus an NVMe store, under the placement rule.

    Open with :meth:`open`; a context manager (closing waits for NVMe I/O in flight and frees
    the tier's CXL blocks; blocks on NVMe stay).
    """

    def __init__(self, handle: int, arena: Arena, options: TierOptions) -> None:
        self._h: Optional[int] = handle
        self.arena = arena
        self.options = options
        self._block = int(_lib.load().cxlkv_tier_block_size(handle))
        self._mu = threading.Lock()
        self._idle = threading.Condition(self._mu)
        self._users = 0

    # ---- lifetime ---------------------------------------------------------------------------

    @classmethod
    def open(cls, arena: Arena, options: Optional[TierOptions] = None, **kw: Any) -> "Tier":
        """Opens a tier over `arena` (``cxlkv_tier_open``): one per size class of an arena.

        Args:
            options: a :class:`TierOptions`, or its fields as keyword arguments.

        Raises:
            InvalidArgumentError: a size class or cxl_kind out of range, a cxl_blocks larger
                than the class, a bad ``[placement]`` key in config_path (the message gives
                ``<path>:<line>`` and the key), a store whose block size differs.
            NotFoundError: config_path (or its calibration file) is missing.
            ExistsError: the class already has a tier.
            MismatchError: the store's file system has no O_DIRECT (tmpfs), or the store is
                in use by another tier or process.
        """
        if options is None:
            options = TierOptions(**kw)
        elif kw:
            raise InvalidArgumentError("pass options or keyword fields, not both",
                                       operation="Tier.open",
                                       hint="Tier.open(arena, TierOptions(...))")
        if not isinstance(options, TierOptions):
            raise InvalidArgumentError(f"options is a {type(options).__name__}",
                                       operation="Tier.open", hint="pass a cxlkv.TierOptions")
        o, _keep = options.to_c()
        lib = _lib.load()
        out = ctypes.c_void_p()
        rc = lib.cxlkv_tier_open(arena.handle(), ctypes.byref(o), ctypes.byref(out))
        subject = f"Tier(class {options.size_class} of {arena!r}, nvme {options.nvme_dir})"
        hint = None
        if rc == errors.E_MISMATCH:
            hint = ("put nvme_dir on a local file system with O_DIRECT (ext4, xfs; not tmpfs), "
                    "and close the tier or process that holds the store")
        elif rc == errors.E_EXISTS:
            hint = "close the class's other tier first, or open this one on another size_class"
        _lib.check(lib, rc, "cxlkv_tier_open", subject, hint=hint)
        return cls(int(out.value or 0), arena, options)

    def __repr__(self) -> str:
        state = "" if self._h else ", closed"
        return (f"Tier(class {self.options.size_class} of arena {uuid_str(self.arena.uuid)}, "
                f"nvme {os.fspath(self.options.nvme_dir)}{state})")

    @property
    def closed(self) -> bool:
        return not self._h

    def close(self) -> None:
        """Waits for this object's calls in progress on other threads, then
        ``cxlkv_tier_close``: NVMe I/O drained (uncollected tickets are gone), CXL blocks
        freed (their data lost unless demoted), store closed. Idempotent."""
        with self._mu:
            h, self._h = self._h, None
            while self._users:
                self._idle.wait()
        if h:
            _lib.load().cxlkv_tier_close(h)

    def __enter__(self) -> "Tier":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # never raise from a finalizer (e.g. at interpreter exit)
            pass

    def _enter(self, what: str) -> int:
        with self._mu:
            if not self._h:
                raise ClosedError(f"{self!r} is closed", operation=what,
                                  hint="open a new tier (cxlkv.Tier.open(arena, options))")
            if self.arena.closed:
                raise ClosedError(
                    f"{self!r}: its arena was closed, which ended the tier", operation=what,
                    hint="close the tier (Tier.close) and open a new one over an open arena")
            self._users += 1
            return self._h

    def _leave(self) -> None:
        with self._mu:
            self._users -= 1
            if not self._users:
                self._idle.notify_all()

    @property
    def block_size(self) -> int:
        """Bytes of one block: every buffer read or placed is exactly this
        (``cxlkv_tier_block_size``)."""
        return self._block

    # ---- results ----------------------------------------------------------------------------

    def _results(self, lib: _lib.Library, rc: int, res: Any, keys: Sequence[PrefixKey],
                 operation: str, check: bool) -> TierResults:
        """Per-key outcomes from the C results array; raises for an error of the call itself
        (nothing done), and with `check` for the first failed key."""
        n = len(keys)
        raw = [int(res[i]) for i in range(n)]
        msg = lib.last_error() if rc or any(c < 0 for c in raw) else ""
        if rc and (rc not in raw or any(c == _UNSET for c in raw)):
            _lib.check(lib, rc, operation, self)  # the call failed as a whole
        first = True
        outcomes: List[KeyOutcome] = []
        for k, c in zip(keys, raw):
            if c >= 0:
                try:
                    outcomes.append(Residence(c))
                except ValueError:
                    outcomes.append(errors.from_code(
                        errors.E_INTERNAL, f"key {_c_hex(k)}: unknown residence {c}",
                        operation=operation, subject=repr(self),
                        hint="the library is newer than this package: update the package"))
                continue
            detail = msg if first and msg else f"key {_c_hex(k)}: {lib.strerror(c)}"
            first = False
            outcomes.append(errors.from_code(c, detail, operation=operation, subject=repr(self),
                                             hint=_KEY_HINTS.get((operation, c))))
        out = TierResults(keys, outcomes, operation)
        for o in outcomes:
            if isinstance(o, CxlkvError):
                o.results = out
        if check:
            out.raise_first()
        return out

    # ---- requests ---------------------------------------------------------------------------

    def _request(self, ns: Union[Namespace, int], chain: Sequence[PrefixKey], first: int,
                 tokens: int, queue_depth: int, pin: int, flags: int, what: str
                 ) -> Tuple[_lib.TierRequestC, Any, List[PrefixKey]]:
        keys = _check_keys(chain, what)
        ns_id = ns.id if isinstance(ns, Namespace) else ns
        if isinstance(ns_id, bool) or not isinstance(ns_id, int) or not 0 < ns_id < 1 << 64:
            raise InvalidArgumentError(f"namespace {ns!r} is neither a Namespace nor a 64-bit id",
                                       operation=what, hint="pass cxlkv.Namespace(...)")
        if not isinstance(first, int) or not 0 <= first < len(keys):
            raise InvalidArgumentError(
                f"first={first!r} is outside the chain of {len(keys)} key(s)", operation=what,
                hint="first is the index of the first key acted on (the number of hits): "
                "0 <= first < len(chain)")
        for name, v, hi in (("tokens", tokens, 1 << 32), ("queue_depth", queue_depth, 1 << 32),
                            ("pin", pin, 4)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < hi:
                raise InvalidArgumentError(
                    f"{name}={v!r} is out of range [0, {hi - 1}]", operation=what,
                    hint="pin is the namespace's [[namespace]] pin level, 0..3" if name == "pin"
                    else f"pass {name} as a non-negative int")
        karr = _keys_c(keys)
        r = _lib.TierRequestC(ns_id, ctypes.addressof(karr), len(keys), first, tokens,
                              queue_depth, pin, flags)
        return r, karr, keys

    def use(self, ns: Union[Namespace, int], chain: Sequence[PrefixKey], first: int = 0, *,
            tokens: int = 0, queue_depth: int = 0, pin: int = 0) -> None:
        """Records that a request uses ``chain[first:]`` now (``cxlkv_tier_use``): the rule's
        only source of reuse history. Call it once per request for the blocks it looked up,
        hits and misses alike (or for the hits, and place the produced blocks with
        ``record_use=True``). Marks those blocks most recently used, the root most.

        Args:
            ns: the keys' namespace.
            chain: the request's keys, root first.
            first: the first key acted on.
            tokens: prefill tokens one block's hit saves; 0: the class's tokens per block.
            queue_depth: prefills queued on the GPU now.
            pin: the namespace's pin level, 0..3.
        """
        r, _karr, _ = self._request(ns, chain, first, tokens, queue_depth, pin, 0, "use")
        h = self._enter("use")
        try:
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_tier_use(h, ctypes.byref(r)), "cxlkv_tier_use", self)
        finally:
            self._leave()

    def _sources(self, data: Source, count: int, what: str, writable: bool, dtype: Any
                 ) -> Tuple[Any, List[Any]]:
        """Addresses of `count` blocks in `data`: one buffer of count blocks back to back
        (an array or tensor shaped (count, ...) is that), or a list/tuple of one buffer per
        block. Each block exactly block_size bytes, of `dtype` if given."""
        bs = self._block
        ptrs = (ctypes.c_void_p * max(count, 1))()
        keep: List[Any] = []
        if isinstance(data, (list, tuple)):
            if len(data) != count:
                raise InvalidArgumentError(
                    f"{len(data)} buffer(s) for {count} key(s)", operation=what,
                    subject=repr(self), hint="pass one buffer per key acted on, in order")
            for i, d in enumerate(data):
                addr, size = _buffers.address(d, writable=writable, what=f"{what} buffer {i}",
                                              dtype=dtype)
                if size != bs:
                    raise BufferMismatchError(
                        f"buffer {i} ({_buffers.describe(d)}) holds {size} bytes; the tier's "
                        f"blocks are {bs}", operation=what, subject=repr(self),
                        hint=f"pass buffers of exactly Tier.block_size ({bs}) bytes each")
                ptrs[i] = addr
                keep.append(d)
            return ptrs, keep
        addr, size = _buffers.address(data, writable=writable, what=what, dtype=dtype)
        if size != count * bs:
            raise BufferMismatchError(
                f"{_buffers.describe(data)} holds {size} bytes; {count} block(s) of "
                f"{bs} bytes (Tier.block_size) need {count * bs}", operation=what,
                subject=repr(self),
                hint="pass an array or tensor shaped (keys, ...) of Tier.block_size bytes per "
                "row, or a list of one block-sized buffer per key")
        for i in range(count):
            ptrs[i] = addr + i * bs
        keep.append(data)
        return ptrs, keep

    def place(self, ns: Union[Namespace, int], chain: Sequence[PrefixKey], data: Source,
              first: int = 0, *, tokens: int = 0, queue_depth: int = 0, pin: int = 0,
              record_use: bool = False, dtype: Any = None, check: bool = True) -> TierResults:
        """Places new blocks ``chain[first:]`` from `data` (``cxlkv_tier_place``), each where
        the rule decides: copied into CXL, written to NVMe (one batch), or dropped.

        Args:
            data: the blocks' bytes, one per key acted on: a numpy array or CPU torch tensor
                shaped ``(len(chain) - first, ...)`` (or any C-contiguous buffer of that many
                blocks back to back), or a list of one buffer per key; every block exactly
                :attr:`block_size` bytes.
            record_use: record a use of each placed block first (blocks the request produced
                and did not pass to :meth:`use`).
            dtype: if given, the buffers' element type must be this.
            ns, chain, first, tokens, queue_depth, pin: as for :meth:`use`.

        Returns:
            One outcome per key acted on: ``IN_CXL``, ``ON_NVME``, ``DROPPED``; for a key the
            tier already holds, its residence (nothing copied). ``FullError``: no free block
            in the class to hold or stage it.

        Raises:
            BufferMismatchError: a buffer of the wrong size, dtype, device or layout (nothing
                placed).
        """
        r, _karr, keys = self._request(ns, chain, first, tokens, queue_depth, pin,
                                       RECORD_USE if record_use else 0, "place")
        acted = keys[first:]
        ptrs, _keep = self._sources(data, len(acted), "Tier.place", False, dtype)
        res = (ctypes.c_int * len(acted))(*([_UNSET] * len(acted)))
        h = self._enter("place")
        try:
            lib = _lib.load()
            rc = lib.cxlkv_tier_place(h, ctypes.byref(r), ptrs, self._block, res)
            return self._results(lib, rc, res, acted, "cxlkv_tier_place", check)
        finally:
            self._leave()

    def place_blocks(self, ns: Union[Namespace, int], chain: Sequence[PrefixKey],
                     blocks: Sequence[Union[Block, _lib.BlockRef]], first: int = 0, *,
                     tokens: int = 0, queue_depth: int = 0, pin: int = 0,
                     record_use: bool = False, check: bool = True) -> TierResults:
        """Hands over blocks the caller allocated in the tier's arena and class
        (``Arena.alloc(size_class)``) and filled itself: ``blocks[i]`` holds
        ``chain[first + i]`` (``cxlkv_tier_place_blocks``).

        Every block is checked first (``ForeignError``: another arena or class;
        ``StaleError``: not allocated; ``InvalidArgumentError``: the same block twice) and
        nothing is taken if one fails. Otherwise every block is the tier's from then on —
        kept in place, written to NVMe and freed, or freed — and the caller must not use or
        free it again. Outcomes as for :meth:`place`.
        """
        r, _karr, keys = self._request(ns, chain, first, tokens, queue_depth, pin,
                                       RECORD_USE if record_use else 0, "place_blocks")
        acted = keys[first:]
        blocks = list(blocks)
        if len(blocks) != len(acted):
            raise InvalidArgumentError(f"{len(blocks)} block(s) for {len(acted)} key(s)",
                                       operation="place_blocks", subject=repr(self),
                                       hint="pass one block per key acted on (chain[first:])")
        refs = (_lib.BlockRef * len(acted))()
        for i, b in enumerate(blocks):
            ref = b.ref if isinstance(b, Block) else b
            if not isinstance(ref, _lib.BlockRef):
                raise InvalidArgumentError(
                    f"blocks[{i}] is a {type(b).__name__}", operation="place_blocks",
                    hint="pass blocks from Arena.alloc(size_class) of the tier's arena")
            ctypes.memmove(ctypes.byref(refs[i]), ctypes.byref(ref), ctypes.sizeof(ref))
        res = (ctypes.c_int * len(acted))(*([_UNSET] * len(acted)))
        h = self._enter("place_blocks")
        try:
            lib = _lib.load()
            rc = lib.cxlkv_tier_place_blocks(h, ctypes.byref(r), refs, res)
            if rc and all(c == _UNSET for c in res):
                _lib.check(lib, rc, "cxlkv_tier_place_blocks", self,
                           hint=_REF_HINTS.get(rc))
            return self._results(lib, rc, res, acted, "cxlkv_tier_place_blocks", check)
        finally:
            self._leave()

    # ---- where blocks are -------------------------------------------------------------------

    def lookup(self, keys: Sequence[PrefixKey]) -> List[Location]:
        """Where each key's block is now (``cxlkv_tier_lookup``); records no use."""
        ks = _check_keys(keys, "lookup", allow_empty=True)
        if not ks:
            return []
        karr = _keys_c(ks)
        out = (_lib.TierLocationC * len(ks))()
        h = self._enter("lookup")
        try:
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_tier_lookup(h, karr, len(ks), out), "cxlkv_tier_lookup",
                       self)
        finally:
            self._leave()
        locs: List[Location] = []
        for k, loc in zip(ks, out):
            res = Residence(loc.residence)
            if res == Residence.IN_CXL:
                ref = _lib.BlockRef()
                ctypes.memmove(ctypes.byref(ref), ctypes.byref(loc.ref), ctypes.sizeof(ref))
                locs.append(Location(k, res, int(loc.addr or 0), ref))
            else:
                locs.append(Location(k, res))
        return locs

    def where(self, key: PrefixKey) -> Residence:
        """The residence of one key (:meth:`lookup` of one)."""
        return self.lookup([key])[0].residence

    def held_run(self, keys: Sequence[PrefixKey]) -> int:
        """The length of the leading run of keys the tier holds (the hits of a request)."""
        n = 0
        for loc in self.lookup(keys):
            if not loc.residence.held:
                break
            n += 1
        return n

    def acquire(self, key: PrefixKey) -> PinnedBlock:
        """Pins a CXL-resident block (no demotion or drop) and marks it most recently used
        (``cxlkv_tier_acquire``).

        Raises:
            NotFoundError: the tier does not hold the key.
            BusyError: it is on NVMe or in flight: prefetch it first (or :meth:`read` it).
        """
        (k,) = _check_keys([key], "acquire")
        kc = k.to_c()
        addr = ctypes.c_void_p()
        ref = _lib.BlockRef()
        h = self._enter("acquire")
        try:
            lib = _lib.load()
            rc = lib.cxlkv_tier_acquire(h, ctypes.addressof(kc), ctypes.byref(addr),
                                        ctypes.byref(ref))
            _lib.check(lib, rc, "cxlkv_tier_acquire", self,
                       hint="prefetch it into CXL first (Tier.prefetch with force=True), or "
                       "read it from NVMe (Tier.read)" if rc == errors.E_BUSY else None)
        finally:
            self._leave()
        return PinnedBlock(self, k, int(addr.value or 0), ref, self._block)

    def _release(self, key: PrefixKey) -> None:
        kc = key.to_c()
        h = self._enter("release")
        try:
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_tier_release(h, ctypes.addressof(kc)),
                       "cxlkv_tier_release", self)
        finally:
            self._leave()

    # ---- reads ------------------------------------------------------------------------------

    def read(self, keys: Sequence[PrefixKey], dst: Source, *, dtype: Any = None,
             check: bool = True) -> TierResults:
        """Copies each key's block into `dst` from where it is (``cxlkv_tier_read``): a pinned
        copy from CXL, or one NVMe batch read (no promotion). Waits for I/O in flight on a
        key (up to 10 s). Records no use. The bytes read equal the bytes placed.

        Args:
            dst: one writable buffer per key: a numpy array or CPU torch tensor shaped
                ``(len(keys), ...)`` (rows of :attr:`block_size` bytes), or a list of one
                block-sized writable buffer per key. 4 KiB-aligned blocks are read from NVMe
                directly, others through a bounce buffer.
            dtype: if given, `dst`'s element type must be this.

        Returns:
            One outcome per key: the residence it was read from (``IN_CXL``, ``ON_NVME``),
            or ``NotFoundError`` (not held), ``CorruptError`` (the NVMe copy failed its
            checksums and was dropped: recompute it), ``BusyError``. A failed key's
            destination holds nothing usable.
        """
        ks = _check_keys(keys, "read")
        ptrs, _keep = self._sources(dst, len(ks), "Tier.read", True, dtype)
        karr = _keys_c(ks)
        res = (ctypes.c_int * len(ks))(*([_UNSET] * len(ks)))
        h = self._enter("read")
        try:
            lib = _lib.load()
            rc = lib.cxlkv_tier_read(h, karr, len(ks), ptrs, self._block, res)
            return self._results(lib, rc, res, ks, "cxlkv_tier_read", check)
        finally:
            self._leave()

    def read_array(self, keys: Sequence[PrefixKey], dtype: Any = np.uint8) -> np.ndarray:
        """A new array ``(len(keys), block_size / itemsize)`` of `dtype` with the keys' blocks
        (:meth:`read`; raises if any key could not be read)."""
        dt = np.dtype(dtype)
        if self._block % dt.itemsize:
            raise BufferMismatchError(
                f"blocks of {self._block} bytes are not a whole number of {dt} elements",
                operation="read_array", subject=repr(self),
                hint="read as uint8, or a dtype whose size divides the block")
        ks = _check_keys(keys, "read_array")
        out = np.empty((len(ks), self._block // dt.itemsize), dtype=dt)
        self.read(ks, out)
        return out

    # ---- moves ------------------------------------------------------------------------------

    def prefetch(self, ns: Union[Namespace, int], chain: Sequence[PrefixKey], first: int = 0,
                 *, force: bool = False, tokens: int = 0, queue_depth: int = 0,
                 pin: int = 0) -> PrefetchTicket:
        """Starts promoting ``chain[first:]`` from NVMe back into CXL (one NVMe submission)
        and returns at once (``cxlkv_tier_prefetch``). Only blocks the rule would keep in CXL
        now, and not cooling down, are promoted (`force`: every NVMe block the cool-down
        allows). Records no use. Collect the ticket (:meth:`PrefetchTicket.wait`)."""
        r, _karr, keys = self._request(ns, chain, first, tokens, queue_depth, pin,
                                       PREFETCH_FORCE if force else 0, "prefetch")
        ticket = ctypes.c_uint64()
        h = self._enter("prefetch")
        try:
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_tier_prefetch(h, ctypes.byref(r), ctypes.byref(ticket)),
                       "cxlkv_tier_prefetch", self)
        finally:
            self._leave()
        return PrefetchTicket(self, int(ticket.value), keys[first:])

    def _collect(self, t: PrefetchTicket, block: bool) -> Optional[TierResults]:
        n = len(t.keys)
        res = (ctypes.c_int * n)(*([_UNSET] * n))
        h = self._enter("prefetch_wait" if block else "prefetch_poll")
        try:
            lib = _lib.load()
            fn = lib.cxlkv_tier_prefetch_wait if block else lib.cxlkv_tier_prefetch_poll
            rc = fn(h, t.id, res)
            if rc == errors.E_PENDING:
                return None
            name = "cxlkv_tier_prefetch_wait" if block else "cxlkv_tier_prefetch_poll"
            _lib.check(lib, rc, name, self,
                       hint="collect each ticket once, through its PrefetchTicket"
                       if rc == errors.E_NOT_FOUND else None)
            return self._results(lib, 0, res, t.keys, name, False)
        finally:
            self._leave()

    def demote(self, keys: Sequence[PrefixKey], *, check: bool = True) -> TierResults:
        """Writes CXL blocks to NVMe (one batch) and frees their CXL copies
        (``cxlkv_tier_demote``); their cool-down starts.

        Returns:
            ``ON_NVME`` (demoted, or already there), or ``NotFoundError``, ``BusyError``
            (pinned or in flight), the write's error (``FullError``: the store is full; the
            block stays in CXL, nothing is lost).
        """
        return self._per_key(keys, "demote", _lib.load().cxlkv_tier_demote, check)

    def drop(self, keys: Sequence[PrefixKey], *, check: bool = True) -> TierResults:
        """Forgets blocks wherever they are (``cxlkv_tier_drop``): ``MISSING``, or
        ``NotFoundError``, ``BusyError`` (pinned or in flight)."""
        return self._per_key(keys, "drop", _lib.load().cxlkv_tier_drop, check)

    def _per_key(self, keys: Sequence[PrefixKey], what: str, fn: Any, check: bool
                 ) -> TierResults:
        ks = _check_keys(keys, what)
        karr = _keys_c(ks)
        res = (ctypes.c_int * len(ks))(*([_UNSET] * len(ks)))
        h = self._enter(what)
        try:
            lib = _lib.load()
            rc = fn(h, karr, len(ks), res)
            return self._results(lib, rc, res, ks, f"cxlkv_tier_{what}", check)
        finally:
            self._leave()

    # ---- explain and stats ------------------------------------------------------------------

    @overload
    def explain(self, key: PrefixKey, *, as_json: Literal[False] = ...) -> str: ...

    @overload
    def explain(self, key: PrefixKey, *, as_json: Literal[True]) -> Dict[str, Any]: ...

    def explain(self, key: PrefixKey, *, as_json: bool = False) -> Union[str, Dict[str, Any]]:
        """Why `key` is where it is (``cxlkv_tier_explain``): its residence, whether a
        promotion would be allowed now, its reuse history, the tier's last move of it with
        the rule's inputs and verdict then, and the verdict if decided now. Text, or with
        `as_json` the JSON object as a dict (keys in docs/tier-capi.md)."""
        (k,) = _check_keys([key], "explain")
        kc = k.to_c()
        flags = EXPLAIN_JSON if as_json else 0
        need = ctypes.c_size_t()
        h = self._enter("explain")
        try:
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_tier_explain(h, ctypes.addressof(kc), flags, None, 0,
                                                   ctypes.byref(need)),
                       "cxlkv_tier_explain", self)
            while True:  # the account may grow between the two calls (another thread)
                size = int(need.value) + 256
                buf = ctypes.create_string_buffer(size)
                rc = lib.cxlkv_tier_explain(h, ctypes.addressof(kc), flags, buf, size,
                                            ctypes.byref(need))
                if rc == errors.E_INVALID and int(need.value) > size:
                    continue
                _lib.check(lib, rc, "cxlkv_tier_explain", self)
                break
        finally:
            self._leave()
        text = buf.value.decode("utf-8", "replace")
        if not as_json:
            return text
        out: Dict[str, Any] = _json.loads(text)
        return out

    def stats(self) -> TierStats:
        """The tier's counters (``cxlkv_tier_stats_get``)."""
        s = _lib.TierStatsC()
        h = self._enter("stats")
        try:
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_tier_stats_get(h, ctypes.byref(s)),
                       "cxlkv_tier_stats_get", self)
        finally:
            self._leave()
        return TierStats.from_c(s)


# What to do about a per-key code, where the package's default hint for it is too general.
_KEY_HINTS: Dict[Tuple[str, int], str] = {
    ("cxlkv_tier_read", errors.E_NOT_FOUND):
        "the tier does not hold this key (dropped, evicted or never placed): recompute the "
        "block from this key on, and place it",
    ("cxlkv_tier_read", errors.E_CORRUPT):
        "the NVMe copy failed its checksums and was dropped: recompute the block and place it",
    ("cxlkv_tier_demote", errors.E_NOT_FOUND): "the tier does not hold this key",
    ("cxlkv_tier_drop", errors.E_NOT_FOUND): "the tier does not hold this key",
    ("cxlkv_tier_place", errors.E_FULL):
        "no free block of the class: lower cxl_blocks or the watermarks so the tier keeps "
        "some free, or format the arena larger",
    ("cxlkv_tier_prefetch_wait", errors.E_FULL): "no free CXL block: read it from NVMe",
    ("cxlkv_tier_prefetch_poll", errors.E_FULL): "no free CXL block: read it from NVMe",
}

_REF_HINTS: Dict[int, str] = {
    errors.E_FOREIGN: "allocate the blocks with Arena.alloc(size_class) of the tier's arena and "
    "class; nothing was taken",
    errors.E_STALE: "pass blocks that are allocated now (not freed); nothing was taken",
    errors.E_INVALID: "pass each block once; nothing was taken",
}
