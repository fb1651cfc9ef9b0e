"""An offload tier with the shape of vLLM's ``SecondaryTierManager``, on a CXL domain.

vLLM's tiered offloading keeps a CPU primary tier (one memoryview of blocks) and cascades
stores to secondary tiers; loads are staged secondary → primary → GPU. A secondary tier
answers ``lookup(key)`` (present / missing / ``None``: in flight, retry), takes asynchronous
jobs naming primary blocks (``submit_store`` reads them, ``submit_load`` writes them) and
reports them through ``get_finished``. Every call runs in the scheduler and must not block.

:class:`OffloadTier` does that on a :class:`~cxlkv.Domain`: the calls validate their input
and queue a job; a worker thread does the copies through the chain helpers both engine stores
share (:mod:`cxlkv.chains`; store: lookup, allocate, ``cxlkv_copy_to_block``,
``cxlkv_prefix_publish``; load: ``cxlkv_lease_acquire_chain`` then one
``cxlkv_lease_copy_out_many`` per batch, each primary block validated after its copy).

Keys are vLLM's ``OffloadKey`` bytes: the block hash (16 or 32 bytes) followed by the KV cache
group index (4 bytes, big-endian); they map to prefix keys with :meth:`Namespace.digest_key`,
so any host of the domain that computes the same block hash finds the block (vLLM's hashes are
process-independent only with a fixed ``PYTHONHASHSEED``, see the integrations notes).

``lookup`` says ``None`` while a store of the key is queued or running, and after it is
published until the owner has applied it (at most ``visibility_timeout_s``; then ``False``).

**Events** (``track_events=True``; vLLM's tier-owned KV events): :meth:`take_events` yields,
in the order they happened, ``(False, keys)`` for the keys of each store job whose success
:meth:`get_finished` handed over (keys not announced already), and ``(True, keys)`` for
announced keys that left the domain (the owner evicted or retired them, or another host's
block a store found there went away), so a router stops scoring them. Removals are found by
looking up the announced keys on the worker thread every ``removal_check_s`` (sooner when the
owner hands this host blocks back), a few hundred at a time between jobs, never on the
scheduler's calls. The tier keeps the engine keys it announced, because a removal must name
them and the domain knows only its one-way prefix keys; an entry leaves when its removal is
announced.

No NVMe spill here (unlike :class:`~cxlkv.PageStore`'s ``spill=``): vLLM cascades every store
to all of its configured secondary tiers and stages loads through the primary itself, so
local NVMe is another secondary tier listed after this one (python/README.md, "Engine
stores").
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from . import _buffers, chains
from .domain import Domain
from .errors import (
    BufferMismatchError,
    ClosedError,
    CxlkvError,
    InvalidArgumentError,
    KeyLengthError,
)
from .keys import Namespace, PrefixKey

GROUP_BYTES = 4


@dataclass
class TierJob:
    """A transfer job (vLLM's ``JobMetadata``): ``keys[i]`` is stored from / loaded into
    primary block ``block_ids[i]``."""

    job_id: int
    keys: Sequence[bytes]
    block_ids: Any  # 1-D integer np.ndarray (or sequence)
    is_promotion: bool = False
    req_context: Any = None


@dataclass
class TierJobResult:
    """A finished job (vLLM's ``JobResult`` with its optional fields)."""

    job_id: int
    success: bool
    successful_keys: Optional[List[bytes]] = None  # loads that failed part way: what succeeded
    transfer_time: Optional[float] = None  # seconds
    transfer_bytes: Optional[int] = None
    error: Optional[str] = None  # why it failed, when it failed on an error
    # A store that succeeded, with events tracked: its keys (announced by get_finished).
    stored_keys: Optional[List[bytes]] = field(default=None, repr=False, compare=False)


@dataclass
class _Queued:
    kind: str  # "store" | "load"
    job: TierJob
    pks: List[PrefixKey]
    kbytes: List[bytes]
    block_ids: np.ndarray
    submitted: float = field(default_factory=time.monotonic)


def offload_key_parts(key: Any, what: str = "key") -> Tuple[bytes, int]:
    """(block hash, group index) of a vLLM OffloadKey (block hash + 4-byte big-endian group)."""
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise KeyLengthError(f"OffloadKey of type {type(key).__name__}", operation=what,
                             hint="pass vLLM's OffloadKey (bytes) unchanged")
    raw = bytes(key)
    if len(raw) - GROUP_BYTES not in (16, 32):
        raise KeyLengthError(
            f"OffloadKey of {len(raw)} bytes ({raw[:8].hex()}…): expected a 16- or 32-byte block "
            f"hash followed by the 4-byte group index (20 or 36 bytes)", operation=what,
            hint="pass vLLM's OffloadKey unchanged (make_offload_key(block_hash, group_idx))")
    return raw[:-GROUP_BYTES], int.from_bytes(raw[-GROUP_BYTES:], "big")


@dataclass
class PrimaryRows:
    """Where a primary view's blocks are: block ``i`` is ``row_bytes`` bytes at
    ``base + i * row_stride`` (vLLM's primary memoryview is shaped this way: one row per
    block, ``strides[0]`` bytes apart)."""

    base: int
    rows: int
    row_stride: int
    row_bytes: int
    keep: Any  # what keeps the memory mapped while the tier uses it


def _describe_view(a: Any) -> str:
    shape = tuple(getattr(a, "shape", ()))
    strides = getattr(a, "strides", None)
    if callable(strides):  # a torch tensor: strides in elements
        strides = tuple(s * a.element_size() for s in strides())
    return f"{type(a).__name__}(shape={shape}, strides={tuple(strides or ())})"


def primary_rows(view: Any, block_bytes: Optional[int] = None) -> PrimaryRows:
    """The rows of a primary tier's memory, as vLLM shapes it.

    A view of two or more dimensions is addressed by its rows: ``shape[0]`` blocks,
    ``strides[0]`` bytes apart, each row contiguous (``block_bytes``, if given, must equal a
    row's bytes). A one-dimensional contiguous view is cut into ``block_bytes`` pieces.

    Raises:
        BufferMismatchError: a read-only, GPU or non-row-contiguous view, or ``block_bytes``
            that does not match the view's rows, naming the view's shape and strides.
    """
    what = "primary_kv_view"
    if hasattr(view, "data_ptr"):  # a torch tensor
        if not view.is_cpu:
            raise BufferMismatchError(f"{_describe_view(view)} is not in host memory",
                                      operation=what, hint="pass the CPU primary tier's view")
        if view.dim() >= 2:
            row = view[0]
            if not row.is_contiguous() or view.stride(0) * view.element_size() < (
                    row.numel() * view.element_size()):
                raise BufferMismatchError(f"{_describe_view(view)}: rows are not contiguous",
                                          operation=what, hint="pass the primary view as vLLM "
                                          "gives it (one contiguous row per block)")
            arr: Any = view
            base = int(view.data_ptr())
            rows_n = int(view.shape[0])
            stride = int(view.stride(0) * view.element_size())
            row_bytes = int(row.numel() * view.element_size())
        else:
            base, nbytes = _buffers.address(view, writable=True, what=what)
            arr, rows_n, stride, row_bytes = view, -1, 0, nbytes
    else:
        if isinstance(view, np.ndarray):
            arr = view
        else:
            try:
                mv = memoryview(view)
            except TypeError:
                raise BufferMismatchError(
                    f"{type(view).__name__} is not a buffer", operation=what,
                    hint="pass the primary tier's memoryview, a numpy array or a CPU tensor"
                ) from None
            if mv.readonly:
                raise BufferMismatchError(f"{_describe_view(mv)} is read-only", operation=what,
                                          hint="pass the primary tier's writable memoryview")
            try:
                arr = np.asarray(mv)
            except (TypeError, ValueError, NotImplementedError):
                if not mv.c_contiguous:
                    raise BufferMismatchError(
                        f"{_describe_view(mv)} has format {mv.format!r} and is not contiguous",
                        operation=what, hint="pass a uint8 view of the primary memory") from None
                arr = np.frombuffer(mv.cast("B"), dtype=np.uint8)
        if not arr.flags.writeable:
            raise BufferMismatchError(f"{_describe_view(arr)} is read-only", operation=what,
                                      hint="pass the primary tier's writable memoryview")
        base = int(arr.__array_interface__["data"][0])
        if arr.ndim >= 2:
            row = arr[0]
            if not row.flags.c_contiguous or arr.strides[0] < row.nbytes:
                raise BufferMismatchError(f"{_describe_view(arr)}: rows are not contiguous",
                                          operation=what, hint="pass the primary view as vLLM "
                                          "gives it (one contiguous row per block)")
            rows_n, stride, row_bytes = int(arr.shape[0]), int(arr.strides[0]), int(row.nbytes)
        else:
            if not arr.flags.c_contiguous:
                raise BufferMismatchError(f"{_describe_view(arr)} is not contiguous",
                                          operation=what, hint="pass a contiguous view")
            rows_n, stride, row_bytes = -1, 0, int(arr.nbytes)
    if rows_n >= 0:  # rows from the view's shape
        if block_bytes is not None and block_bytes != row_bytes:
            raise BufferMismatchError(
                f"block_bytes = {block_bytes}, but {_describe_view(arr)} has rows of "
                f"{row_bytes} bytes", operation=what,
                hint=f"leave block_bytes out (the view's row is the block) or set it to "
                f"{row_bytes}")
        if row_bytes <= 0:
            raise BufferMismatchError(f"{_describe_view(arr)} has empty rows", operation=what,
                                      hint="pass the primary tier's view")
        return PrimaryRows(base, rows_n, stride, row_bytes, (view, arr))
    if block_bytes is None or block_bytes <= 0:
        raise InvalidArgumentError(
            f"a one-dimensional primary view ({_describe_view(arr)}) needs block_bytes",
            operation="OffloadTier", hint="set block_bytes to the primary tier's block size")
    if row_bytes % block_bytes:
        raise BufferMismatchError(
            f"the primary view holds {row_bytes} bytes, not a whole number of {block_bytes}-byte "
            f"blocks", operation="OffloadTier", hint="pass block_bytes = the primary block size")
    return PrimaryRows(base, row_bytes // block_bytes, block_bytes, block_bytes, (view, arr))


class OffloadTier:
    """vLLM ``SecondaryTierManager``-shaped tier over a :class:`~cxlkv.Domain`.

    Args:
        domain: the joined domain (its home arena stores this host's blocks; other hosts'
            arenas must be attached for loads).
        namespace: model, layout, TP rank: blocks are shared only within it.
        primary_kv_view: the primary tier's memory, writable (vLLM's ``memoryview``, a numpy
            array or CPU tensor): rows of ``strides[0]`` bytes, one block each, when it has
            two or more dimensions; ``n * block_bytes`` contiguous bytes when it has one
            (:func:`primary_rows`).
        block_bytes: bytes of one primary block (at most the arena's block size); for a view
            with rows, None or the row's bytes.
        size_class: the arena size class blocks are allocated from.
        visibility_timeout_s: how long ``lookup`` says "in flight" for a published key the
            owner has not applied yet.
        max_batch: keys leased per ``cxlkv_lease_acquire_chain``.
        acquire_wait_s: how long a load waits for a lease row or the owner's confirmation of
            this host before the rest of the job fails.
        track_events: record stores and removals for :meth:`take_events`.
        removal_check_s: how often the announced keys are looked up for removals.
    """

    def __init__(self, domain: Domain, namespace: Namespace, primary_kv_view: Any, *,
                 block_bytes: Optional[int] = None, size_class: int = 0,
                 visibility_timeout_s: float = 5.0,
                 max_batch: int = 64, acquire_wait_s: float = 0.25,
                 track_events: bool = False, removal_check_s: float = 1.0) -> None:
        home = domain.home_arena
        if home is None:
            raise InvalidArgumentError(f"{domain!r} has no arena attached",
                                       operation="OffloadTier",
                                       hint="Domain.join(spec, host, arenas=[arena]) first")
        rows = primary_rows(primary_kv_view, block_bytes)
        if rows.row_bytes > home.block_size(size_class):
            raise InvalidArgumentError(
                f"primary blocks of {rows.row_bytes} bytes do not fit the arena's blocks of "
                f"{home.block_size(size_class)}", operation="OffloadTier",
                hint="format the arena with a block size >= the primary block size")
        self._base = rows.base
        block_bytes = rows.row_bytes
        self._keep = rows.keep
        self.num_blocks = rows.rows
        self.block_bytes = block_bytes
        self.row_stride_bytes = rows.row_stride
        self.domain = domain
        self.namespace = namespace
        self.size_class = size_class
        self.visibility_timeout_s = visibility_timeout_s
        self.max_batch = max_batch
        self.acquire_wait_s = acquire_wait_s
        self._q: "queue.Queue[Optional[_Queued]]" = queue.Queue()
        self._done: Deque[TierJobResult] = collections.deque()
        self._mu = threading.Lock()
        self._storing: Dict[bytes, int] = {}  # key -> stores queued or running
        self._unapplied: Dict[bytes, float] = {}  # published, not seen yet -> give up at
        self._pending = 0  # jobs queued or running
        self._idle = threading.Condition(self._mu)
        self._closed = False
        if removal_check_s <= 0:
            raise InvalidArgumentError(f"removal_check_s must be > 0, got {removal_check_s}",
                                       operation="OffloadTier",
                                       hint="seconds between looks for removed blocks, e.g. 1")
        self.track_events = track_events
        self.removal_check_s = removal_check_s
        # Events: the engine keys announced as stored (-> prefix key, announcement number),
        # the log take_events hands out, and the worker's sweep for removals.
        self._announced: Dict[bytes, Tuple[PrefixKey, int]] = {}
        self._announce_seq = 0
        self._events: List[Tuple[bool, List[bytes]]] = []
        self._sweep: List[Tuple[bytes, PrefixKey, int]] = []
        self._next_sweep = time.monotonic() + removal_check_s
        self._returned_seen = 0
        self._worker = threading.Thread(target=self._run, name=f"cxlkv-offload {namespace!r}",
                                        daemon=True)
        self._worker.start()

    def __repr__(self) -> str:
        return f"OffloadTier({self.namespace!r} on {self.domain!r})"

    # ---- the scheduler's calls (non-blocking) ---------------------------------------------

    def key(self, key: Any, what: str = "key") -> PrefixKey:
        digest, group = offload_key_parts(key, what)
        return self.namespace.digest_key(digest, group)

    def lookup(self, key: Any, req_context: Any = None) -> Optional[bool]:
        """True: present and ready; False: not here; None: being stored, retry later."""
        self._check_open("lookup")
        pk = self.key(key, "lookup")
        kb = bytes(key)
        if self.domain.lookup(self.namespace, pk) is not None:
            with self._mu:
                self._unapplied.pop(kb, None)
            return True
        with self._mu:
            if self._storing.get(kb):
                return None
            until = self._unapplied.get(kb)
            if until is not None:
                if time.monotonic() < until:
                    return None
                del self._unapplied[kb]
        return False

    def submit_store(self, job: TierJob) -> None:
        """Queues a store of primary blocks ``job.block_ids`` under ``job.keys``."""
        q = self._validate(job, "submit_store", "store")
        with self._mu:
            for kb in q.kbytes:
                self._storing[kb] = self._storing.get(kb, 0) + 1
            self._pending += 1
        self._q.put(q)

    def submit_load(self, job: TierJob) -> None:
        """Queues a load of ``job.keys`` into primary blocks ``job.block_ids``."""
        q = self._validate(job, "submit_load", "load")
        with self._mu:
            self._pending += 1
        self._q.put(q)

    def get_finished(self) -> List[TierJobResult]:
        """Jobs finished since the last call."""
        out: List[TierJobResult] = []
        with self._mu:
            while self._done:
                r = self._done.popleft()
                if r.stored_keys is not None:
                    self._announce(r.stored_keys)
                    r.stored_keys = None
                out.append(r)
        return out

    def take_events(self) -> List[Tuple[bool, List[bytes]]]:
        """What happened to this tier's blocks since the last call, in order:
        ``(removed, keys)`` (``track_events`` only; else always empty)."""
        with self._mu:
            out, self._events = self._events, []
        return out

    def _announce(self, keys: Sequence[bytes]) -> None:
        """(under _mu) Records a stored event for the keys not announced already."""
        new = [kb for kb in keys if kb not in self._announced]
        if not new:
            return
        self._announce_seq += 1
        for kb in new:
            self._announced[kb] = (self.key(kb), self._announce_seq)
        self._events.append((False, new))

    def touch(self, keys: Iterable[Any], req_context: Any = None) -> None:
        """Recency hint. The domain's owner decides evictions, and a lease is what keeps a
        block from reuse, so there is nothing to record here."""
        return None

    def drain(self, timeout_s: Optional[float] = None) -> bool:
        """Waits until every submitted job has finished; False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def shutdown(self) -> None:
        """Finishes the submitted jobs, then stops the worker. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._q.put(None)
        self._worker.join()

    close = shutdown

    # ---- validation -------------------------------------------------------------------------

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ClosedError(f"{self!r} was shut down", operation=what,
                              hint="create a new OffloadTier")
        self.domain._handle(what)

    def _validate(self, job: TierJob, what: str, kind: str) -> _Queued:
        self._check_open(what)
        keys = list(job.keys)
        bids = np.asarray(job.block_ids)
        if bids.ndim != 1 or (bids.size and bids.dtype.kind not in "iu"):
            raise InvalidArgumentError(f"job {job.job_id}: block_ids must be a 1-D integer array",
                                       operation=what, hint="pass primary block ids")
        if len(keys) != bids.size:
            raise InvalidArgumentError(
                f"job {job.job_id}: {len(keys)} keys but {bids.size} block ids", operation=what,
                hint="pass one primary block id per key")
        bad = bids[(bids < 0) | (bids >= self.num_blocks)] if bids.size else bids
        if bad.size:
            raise InvalidArgumentError(
                f"job {job.job_id}: block id {int(bad[0])} is outside the primary view's "
                f"{self.num_blocks} blocks", operation=what,
                hint="block ids index the primary memoryview")
        pks = [self.key(k, what) for k in keys]
        return _Queued(kind, job, pks, [bytes(k) for k in keys], bids.astype(np.int64))

    # ---- the worker ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            if self.track_events:
                # A step of a sweep between any two jobs, so a busy queue does not starve it.
                self._sweep_some()
                try:
                    q = self._q.get(timeout=self._sweep_wait())
                except queue.Empty:
                    continue
            else:
                q = self._q.get()
            if q is None:
                return
            t0 = time.monotonic()
            try:
                res = self._store(q) if q.kind == "store" else self._load(q)
            except Exception as e:  # a closed domain, an arena not attached, ...: the job
                # fails, the worker (and the scheduler's process) carry on
                msg = str(e) if isinstance(e, CxlkvError) else f"{type(e).__name__}: {e}"
                res = TierJobResult(q.job.job_id, False, [] if q.kind == "load" else None,
                                    error=msg)
            res.transfer_time = time.monotonic() - t0
            if self.track_events and q.kind == "store" and res.success:
                res.stored_keys = list(q.kbytes)
            with self._mu:
                if q.kind == "store":
                    for kb in q.kbytes:
                        n = self._storing.get(kb, 0) - 1
                        if n > 0:
                            self._storing[kb] = n
                        else:
                            self._storing.pop(kb, None)
                self._done.append(res)
                self._pending -= 1
                self._idle.notify_all()

    # ---- removals (track_events) ----------------------------------------------------------------

    #: Announced keys looked up per step of a sweep (between jobs).
    SWEEP_STEP = 256
    #: How often an idle worker checks whether the owner handed blocks back.
    RETURN_POLL_S = 0.1

    def _sweep_wait(self) -> float:
        """How long the worker may wait for a job before it looks at the sweep again."""
        if self._sweep:
            return 0.0
        # Woken at least every RETURN_POLL_S to notice returned blocks.
        return min(self.RETURN_POLL_S, max(0.0, self._next_sweep - time.monotonic()))

    def _sweep_some(self) -> None:
        """One step of a sweep: a new one when due (every removal_check_s, or at once when
        the owner handed this host blocks back), then up to SWEEP_STEP lookups; the announced
        keys found gone become one removed event."""
        if not self._sweep:
            returned = self.domain.blocks_returned
            now = time.monotonic()
            if returned == self._returned_seen and now < self._next_sweep:
                return
            self._returned_seen = returned
            with self._mu:
                self._sweep = [(kb, pk, seq) for kb, (pk, seq) in self._announced.items()]
            self._next_sweep = now + self.removal_check_s
        step, self._sweep = self._sweep[:self.SWEEP_STEP], self._sweep[self.SWEEP_STEP:]
        gone: List[Tuple[bytes, int]] = []
        seen: List[bytes] = []
        for kb, pk, seq in step:
            try:
                hit = self.domain.lookup(self.namespace, pk)
            except CxlkvError:  # the domain left meanwhile: nothing more to announce
                self._sweep = []
                return
            if hit is None:
                gone.append((kb, seq))
            else:
                seen.append(kb)
        now = time.monotonic()
        with self._mu:
            for kb in seen:  # applied: a later miss is a removal, not a late publish
                self._unapplied.pop(kb, None)
            removed = []
            for kb, seq in gone:
                entry = self._announced.get(kb)
                if entry is None or entry[1] != seq or self._storing.get(kb):
                    continue  # announced again, or being stored again, since the snapshot
                until = self._unapplied.get(kb)
                if until is not None and now < until:
                    continue  # published, not applied by the owner yet
                del self._announced[kb]
                removed.append(kb)
            if removed:
                self._events.append((True, removed))

    def _store(self, q: _Queued) -> TierJobResult:
        rows = [[(self._base + bid * self.row_stride_bytes, self.block_bytes)]
                for bid in q.block_ids.tolist()]
        res = chains.store_chain(self.domain, self.namespace, q.pks, rows,
                                 size_class=self.size_class)
        if res.published:
            until = time.monotonic() + self.visibility_timeout_s
            with self._mu:
                for i in res.published:
                    self._unapplied[q.kbytes[i]] = until
        return TierJobResult(q.job.job_id, res.stored == len(q.pks),
                             transfer_bytes=res.bytes_copied)

    def _load(self, q: _Queued) -> TierJobResult:
        rows = [[(self._base + bid * self.row_stride_bytes, self.block_bytes)]
                for bid in q.block_ids.tolist()]
        ok = chains.load_chain(self.domain, self.namespace, q.pks, rows,
                               max_batch=self.max_batch, wait_s=self.acquire_wait_s)
        good = [kb for kb, g in zip(q.kbytes, ok) if g]
        success = len(good) == len(q.pks)
        return TierJobResult(q.job.job_id, success, None if success else good,
                             transfer_bytes=len(good) * self.block_bytes)
