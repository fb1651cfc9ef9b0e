"""Shared prefix blocks across the hosts of a CXL domain: join, lookup, lease, read, publish.

A domain region holds the shared prefix index, the hosts' lease rows and request rings
(docs/coherence.md). One process per domain runs the owner role (:class:`Owner`: applies
publications, fences silent hosts, reclaims); every host joins with its own host id
(:meth:`Domain.join`). A lookup takes no lease; data may be used only under a lease, before
its deadline, and a read counts only if the lease validates after it.

Reading, the two ways (docs/coherence.md, "Reading blocks through the C API"):

* :meth:`Leases.copy_out` — the complete read (``cxlkv_lease_copy_out``): invalidates the
  range, copies it into a numpy array / CPU torch tensor / writable buffer, then validates.
  When it returns the destination holds the bytes as published; on ``StaleError`` the
  destination was written and must be discarded. Use it unless the data must stay in place.
* :meth:`Leases.view` — zero-copy (``cxlkv_block_invalidate``): a read-only numpy view of the
  block's memory. It is valid **only** while the lease is held and before its deadline
  (``Leases.deadline_ms``; renew first), only for reads made after the view was taken (the
  range was invalidated then — a new acquisition of the same block needs a new view), and
  what was computed from it may be used only after the view validates: leaving the
  ``with`` block validates and raises ``StaleError`` if the block was retired or reused or
  the lease expired meanwhile; read again after a validation and you must validate again
  (``ZeroCopyView.validate``). Never keep the array (or anything aliasing it) past the
  ``with`` block or the lease's release: the memory may hold another block by then.

Blocks to be read must be mapped in this process: :meth:`Domain.attach` the arenas that hold
them (the publisher's pool opened with ``Arena.open``; on one shared pool that is the arena
this host publishes from too). A domain joined through an orchestrator
(``orchestrator:<socket>``) finds them itself.

Thread-safety: the C API allows one thread at a time per domain handle; this class takes a
lock around every call, so a :class:`Domain` may be shared between threads (the store
worker threads, the heartbeat thread). A domain must heartbeat at least every host_ttl/4
(500 ms with the default geometry): :meth:`Domain.join` starts a heartbeat thread unless
``heartbeat_s=None``.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _buffers, _lib
from .errors import (
    ClosedError,
    CxlkvError,
    FullError,
    InvalidArgumentError,
    MismatchError,
    NotFoundError,
    StaleError,
    BufferMismatchError,
    E_INVALID,
    E_MISMATCH,
    E_NOT_FOUND,
    E_STALE,
)
from .keys import Namespace, PrefixKey, keys_to_c
from .pool import Arena, Block, KvLayout, arena_options, uuid_str

NamespaceLike = Union[Namespace, int]
_LEASE_SIZE = ctypes.sizeof(_lib.LeaseC)
_LEASE_REF_OFFSET = _lib.LeaseC.ref.offset
# cxlkv_copy_out_item is five 8-byte words (arena, lease, offset, dst, len): copy_out_many
# builds the items as a numpy array of that shape.
_ITEM_WORDS = 5
assert ctypes.sizeof(_lib.CopyOutItemC) == 8 * _ITEM_WORDS
_UNRESOLVED = object()


def _ns_id(ns: NamespaceLike) -> int:
    if isinstance(ns, Namespace):
        return ns.id
    if isinstance(ns, int) and 0 < ns < 1 << 64:
        return ns
    raise InvalidArgumentError(f"namespace {ns!r} is neither a Namespace nor a 64-bit id",
                               operation="namespace", hint="pass cxlkv.Namespace(...)")


def _key_c(key: PrefixKey, what: str) -> _lib.PrefixKeyC:
    if not isinstance(key, PrefixKey):
        raise InvalidArgumentError(f"key is a {type(key).__name__}, not a PrefixKey",
                                   operation=what,
                                   hint="build it with Namespace.chain_key or digest_key")
    return key.to_c()


@dataclass(frozen=True)
class Geometry:
    """A domain's table sizes and times (``cxlkv_domain_geometry``; 0 takes the default)."""

    max_hosts: int = 0  # 0: 8
    index_entries: int = 0  # 0: 4096
    lease_rows: int = 0  # per host; 0: 256
    ring_slots: int = 0  # per host; 0: 64
    lease_ttl_ms: int = 0  # 0: 2000
    host_ttl_ms: int = 0  # 0: 2000
    grace_ms: int = 0  # 0: 100

    def to_c(self) -> _lib.GeometryC:
        return _lib.GeometryC(self.max_hosts, self.index_entries, self.lease_rows,
                              self.ring_slots, self.lease_ttl_ms, self.host_ttl_ms,
                              self.grace_ms)

    def bytes_needed(self) -> int:
        """Bytes a domain of this geometry needs (``cxlkv_domain_bytes``)."""
        g = self.to_c()
        return int(_lib.load().cxlkv_domain_bytes(ctypes.byref(g)))


@dataclass(frozen=True)
class Hit:
    """A published block found by :meth:`Domain.lookup` (no lease taken)."""

    entry: int
    entry_gen: int
    publisher: int  # host id
    arena_uuid: bytes
    index: int
    generation: int
    _c: Any = field(default=None, repr=False, compare=False)  # for cxlkv_lease_acquire


class Owner:
    """The domain's owner role (``cxlkv_owner_*``): one per domain; for tests and single-node
    use (in production the orchestrator runs it).

    :meth:`step` applies requests, fences, evicts and reclaims; :meth:`start` runs it on a
    thread every `period_s`.
    """

    def __init__(self, handle: int, spec: str) -> None:
        self._h: Optional[int] = handle
        self.spec = spec
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()

    @classmethod
    def open(cls, spec: str) -> "Owner":
        lib = _lib.load()
        out = ctypes.c_void_p()
        _lib.check(lib, lib.cxlkv_owner_open(spec.encode(), ctypes.byref(out)), "cxlkv_owner_open",
                   f"Owner({spec})")
        return cls(int(out.value or 0), spec)

    def __repr__(self) -> str:
        return f"Owner({self.spec}{'' if self._h else ', closed'})"

    def step(self) -> None:
        with self._lock:
            if not self._h:
                raise ClosedError(f"{self!r} is closed", operation="step",
                                  hint="open it again with cxlkv.Owner.open(spec)")
            _lib.load().cxlkv_owner_step(self._h)

    def start(self, period_s: float = 0.005) -> "Owner":
        """Steps on a background thread every `period_s` until :meth:`stop` or :meth:`close`."""
        if self._thread is not None:
            return self
        self._stop.clear()

        def run() -> None:
            while not self._stop.wait(period_s):
                try:
                    self.step()
                except ClosedError:
                    return

        self._thread = threading.Thread(target=run, name=f"cxlkv-owner {self.spec}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        self.stop()
        with self._lock:
            if self._h:
                _lib.load().cxlkv_owner_close(self._h)
                self._h = None

    def __enter__(self) -> "Owner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Domain:
    """This process's membership of a CXL domain as one host (``cxlkv_domain_*``)."""

    def __init__(self, handle: int, spec: str, host_id: int) -> None:
        self._h: Optional[int] = handle
        self.spec = spec
        self.host_id = host_id
        self.via_orchestrator = spec.startswith("orchestrator:")
        self._lock = threading.RLock()
        self._arenas: Dict[bytes, Arena] = {}
        self._home: Optional[Arena] = None
        self._hb_thread: Optional[threading.Thread] = None
        self._hb_stop = threading.Event()
        self.fenced = 0  # times a heartbeat found this host fenced (and rejoined)
        self.heartbeat_error: Optional[CxlkvError] = None  # the last failure of the thread
        self.blocks_returned = 0  # published blocks the owner handed back and that were freed

    # ---- lifetime ---------------------------------------------------------------------------

    @staticmethod
    def format(spec: str, geometry: Geometry = Geometry()) -> None:
        """Formats an empty domain on a source (the owner role's job, once).

        The source must hold ``geometry.bytes_needed()`` bytes (a ``file:`` spec with
        ``?size=``).
        """
        lib = _lib.load()
        g = geometry.to_c()
        _lib.check(lib, lib.cxlkv_domain_format(spec.encode(), ctypes.byref(g)),
                   "cxlkv_domain_format", f"Domain({spec})")

    @classmethod
    def join(cls, spec: str, host_id: int, *, arenas: Sequence[Arena] = (),
             heartbeat_s: Optional[float] = 0.1) -> "Domain":
        """Joins the domain as `host_id` with a new incarnation (``cxlkv_domain_join``).

        Args:
            spec: the domain's source spec, or ``orchestrator:/run/cxlkv/<domain>.sock``.
            host_id: this host's row, 0..max_hosts-1.
            arenas: arenas to :meth:`attach` (the first one is the arena this host publishes
                from, see :meth:`attach`).
            heartbeat_s: heartbeat period of a background thread; None: the caller calls
                :meth:`heartbeat` at least every host_ttl/4 itself.
        """
        if not isinstance(host_id, int) or not 0 <= host_id < 1 << 32:
            raise InvalidArgumentError(f"host id {host_id!r} must be an int >= 0",
                                       operation="Domain.join", subject=spec,
                                       hint="pass this host's row number, 0..max_hosts-1")
        lib = _lib.load()
        out = ctypes.c_void_p()
        _lib.check(lib, lib.cxlkv_domain_join(spec.encode(), host_id, ctypes.byref(out)),
                   "cxlkv_domain_join", f"Domain({spec}, host {host_id})")
        d = cls(int(out.value or 0), spec, host_id)
        for a in arenas:
            d.attach(a)
        if heartbeat_s is not None:
            d.start_heartbeat(heartbeat_s)
        return d

    def __repr__(self) -> str:
        return f"Domain({self.spec}, host {self.host_id}{'' if self._h else ', left'})"

    @property
    def closed(self) -> bool:
        return not self._h

    def _handle(self, what: str) -> int:
        if not self._h:
            raise ClosedError(f"{self!r} has left the domain", operation=what,
                              hint="join again with cxlkv.Domain.join(spec, host_id)")
        return self._h

    def leave(self) -> None:
        """Leaves the domain (stops the heartbeat thread first). Idempotent.

        Leases still held are dropped with the membership; published blocks stay published
        (the owner returns them to this host's arena only while it is joined).
        """
        self.stop_heartbeat()
        with self._lock:
            if self._h:
                _lib.load().cxlkv_domain_leave(self._h)
                self._h = None
                # cxlkv_domain_leave closed the arenas grown in the domain's extents.
                for a in self._arenas.values():
                    if a.pool is None:
                        a._h = None

    close = leave

    def __enter__(self) -> "Domain":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.leave()

    # ---- arenas -----------------------------------------------------------------------------

    def attach(self, arena: Arena) -> None:
        """Makes `arena`'s blocks readable through this domain handle and, for the first
        arena attached, the arena this host publishes from: heartbeats free into it the
        blocks the owner hands back. (``cxlkv_domain_heartbeat`` frees returned blocks only
        into the arena it is given and drops the rest, so one handle publishes from one
        arena.) Keep the home arena open while the domain is joined."""
        with self._lock:
            self._arenas[arena.uuid] = arena
            if self._home is None:
                self._home = arena

    @property
    def home_arena(self) -> Optional[Arena]:
        return self._home

    def _arena_handle_for(self, arena_uuid: bytes, what: str) -> Optional[int]:
        a = self._arenas.get(arena_uuid)
        if a is not None:
            return a.handle()
        if self.via_orchestrator:
            return None
        raise NotFoundError(
            f"no arena attached to {self!r} holds blocks of arena {uuid_str(arena_uuid)}",
            operation=what,
            hint="open the publisher's pool (cxlkv.Arena.open(cxlkv.Pool.open(spec))) and "
            "domain.attach(arena) before reading its blocks",
        )

    def grow(self, layout: Optional[KvLayout] = None, *, class_tokens: Sequence[int] = (),
             class_weights: Sequence[int] = ()) -> Arena:
        """A fresh arena in one more extent of the domain's pooled region
        (``cxlkv_domain_grow``; a domain joined through an orchestrator only), attached to this
        handle. Close it (``Arena.close``) to give the extent back.

        Raises:
            InvalidArgumentError: not joined through an orchestrator.
            FullError: no free extent, or this host's share is used up.
        """
        opts = arena_options(layout, class_tokens, class_weights) if layout is not None else None
        out = ctypes.c_void_p()
        with self._lock:
            h = self._handle("grow")
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_domain_grow(h, ctypes.byref(opts) if opts is not None
                                                  else None, ctypes.byref(out)),
                       "cxlkv_domain_grow", self,
                       hint="join through the orchestrator (orchestrator:<socket>) to grow"
                       if not self.via_orchestrator else None)
        arena = Arena(int(out.value or 0), None, where=f"an extent of {self.spec}")
        self.attach(arena)
        return arena

    # ---- heartbeat --------------------------------------------------------------------------

    def heartbeat(self) -> int:
        """One heartbeat (``cxlkv_domain_heartbeat``); returns how many returned blocks were
        freed into the home arena.

        Raises:
            MismatchError: this host had been fenced (its leases are gone) and has rejoined.
        """
        with self._lock:
            h = self._handle("heartbeat")
            freed = ctypes.c_size_t()
            home = self._home.handle() if self._home is not None and not self._home.closed else None
            lib = _lib.load()
            rc = lib.cxlkv_domain_heartbeat(h, home, ctypes.byref(freed))
            self.blocks_returned += int(freed.value)
            _lib.check(lib, rc, "cxlkv_domain_heartbeat", self,
                       hint="this host was fenced (silent for longer than host_ttl) and has "
                       "rejoined; its leases are gone: acquire again, and heartbeat at least "
                       "every host_ttl/4" if rc == E_MISMATCH else None)
            return int(freed.value)

    def lease_stats(self) -> Dict[str, int]:
        """What a busy or stopped machine cost this host's leases since it joined
        (``cxlkv_domain_lease_stats``; docs/coherence.md, "Busy hosts"): leases refused late,
        renewed to last a copy, taken again, copies retried and discarded, pauses, fences and
        waits for the owner's acknowledgement."""
        with self._lock:
            h = self._handle("lease_stats")
            out = _lib.LeaseStatsC()
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_domain_lease_stats(h, ctypes.byref(out)),
                       "cxlkv_domain_lease_stats", self)
            return {name: int(getattr(out, name)) for name, _ in _lib.LeaseStatsC._fields_}

    def start_heartbeat(self, period_s: float = 0.1) -> None:
        """Heartbeats on a background thread every `period_s` (must be <= host_ttl/4)."""
        if self._hb_thread is not None:
            return
        self._hb_stop.clear()

        def run() -> None:
            while not self._hb_stop.wait(period_s):
                try:
                    self.heartbeat()
                except MismatchError as e:
                    self.fenced += 1
                    self.heartbeat_error = e
                except ClosedError:
                    return
                except CxlkvError as e:
                    self.heartbeat_error = e

        self._hb_thread = threading.Thread(target=run, name=f"cxlkv-heartbeat {self!r}",
                                           daemon=True)
        self._hb_thread.start()

    def stop_heartbeat(self) -> None:
        if self._hb_thread is not None:
            self._hb_stop.set()
            self._hb_thread.join()
            self._hb_thread = None

    # ---- lookup and leases ------------------------------------------------------------------

    def lookup(self, ns: NamespaceLike, key: PrefixKey) -> Optional[Hit]:
        """Finds a published block (``cxlkv_prefix_lookup``); None on a miss. Takes no lease:
        use :meth:`acquire` before reading."""
        kc = _key_c(key, "lookup")
        hit = _lib.PrefixHitC()
        with self._lock:
            h = self._handle("lookup")
            lib = _lib.load()
            rc = lib.cxlkv_prefix_lookup(h, _ns_id(ns), ctypes.addressof(kc), ctypes.byref(hit))
            if rc == E_NOT_FOUND:
                return None
            _lib.check(lib, rc, "cxlkv_prefix_lookup", self)
        return Hit(hit.entry, hit.entry_gen, hit.publisher, bytes(hit.ref.arena_uuid),
                   hit.ref.index, hit.ref.generation, hit)

    def acquire(self, hit: Hit) -> "Leases":
        """Takes a lease on a hit (``cxlkv_lease_acquire``).

        Raises:
            StaleError: the block was retired meanwhile (look it up again).
            FullError: no free lease row, or the owner has not confirmed this host recently.
        """
        arr = (_lib.LeaseC * 1)()
        with self._lock:
            h = self._handle("acquire")
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_lease_acquire(h, ctypes.byref(hit._c), ctypes.addressof(arr)),
                       "cxlkv_lease_acquire", self)
        return Leases(self, arr, 1, None)

    def acquire_chain(self, ns: NamespaceLike, keys: Sequence[PrefixKey], *,
                      wait_s: float = 0.0) -> "Leases":
        """Looks up and leases the longest leading run of published `keys` in one pass
        (``cxlkv_lease_acquire_chain``). ``len(result)`` is 0 when the first key misses.

        Args:
            wait_s: on FullError, heartbeat and retry for up to this long (a host that just
                joined has no heartbeat the owner acknowledged yet; rows may free up).

        Raises:
            FullError: not even the first key could be leased (no free row, or the owner has
                not confirmed this host recently), also after `wait_s`.
        """
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self._acquire_chain(ns, keys)
            except FullError:
                if time.monotonic() >= deadline:
                    raise
            try:
                self.heartbeat()
            except MismatchError:
                pass  # fenced and rejoined: the retry runs as the new incarnation
            time.sleep(0.002)

    def _acquire_chain(self, ns: NamespaceLike, keys: Sequence[PrefixKey]) -> "Leases":
        n = len(keys)
        arr = (_lib.LeaseC * max(n, 1))()
        if n == 0:
            return Leases(self, arr, 0, [])
        karr = keys_to_c(keys)
        got = ctypes.c_size_t()
        with self._lock:
            h = self._handle("acquire_chain")
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_lease_acquire_chain(h, _ns_id(ns), ctypes.addressof(karr),
                                                          n, ctypes.addressof(arr),
                                                          ctypes.byref(got)),
                       "cxlkv_lease_acquire_chain", self)
        return Leases(self, arr, int(got.value), list(keys[: int(got.value)]))

    # ---- publishing -------------------------------------------------------------------------

    def publish(self, ns: NamespaceLike, key: PrefixKey, data: Any, *,
                parent: Optional[PrefixKey] = None, size_class: int = 0) -> Block:
        """Copies `data` into a new block of the home arena and publishes it under `key`.

        The copy uses streaming stores (``cxlkv_copy_to_block``), then
        ``cxlkv_prefix_publish`` hands the block to the domain: it becomes visible once the
        owner applies the request, and comes back (freed by a heartbeat) when reclaimed, or
        at once if the prefix was already published. On any failure the block is freed.

        Raises:
            BufferMismatchError: `data` is larger than a block, or not a CPU contiguous buffer.
            FullError: no free block, or the request ring is full (the owner is behind).
        """
        kc = _key_c(key, "publish")
        pc = _key_c(parent, "publish") if parent is not None else None
        home = self._home
        if home is None:
            raise InvalidArgumentError(
                f"{self!r} has no arena to publish from", operation="publish",
                hint="domain.attach(arena) first (the arena whose blocks heartbeats free)")
        src, n = _buffers.address(data, writable=False, what="publish")
        bs = home.block_size(size_class)
        if n == 0 or n > bs:
            raise BufferMismatchError(
                f"{_buffers.describe(data)} holds {n} bytes; a block of class {size_class} holds "
                f"{bs}", operation="publish", subject=repr(self),
                hint="publish 1..block-size bytes per key (one KV block)")
        block = home.alloc(size_class)
        try:
            _lib.load().cxlkv_copy_to_block(block.addr, src, n)
            self._publish_c(ns, kc, pc, home, block)
        except BaseException:
            home.free(block)
            raise
        return block

    def publish_block(self, ns: NamespaceLike, key: PrefixKey, block: Block, *,
                      parent: Optional[PrefixKey] = None) -> None:
        """Publishes a block of the home arena the caller has already written (and will not
        modify again). On failure the block stays the caller's."""
        kc = _key_c(key, "publish_block")
        pc = _key_c(parent, "publish_block") if parent is not None else None
        if self._home is None or block.arena_uuid != self._home.uuid:
            raise InvalidArgumentError(
                "the block is not in this domain handle's home arena", operation="publish_block",
                subject=repr(self), hint="allocate it from domain.home_arena")
        self._publish_c(ns, kc, pc, self._home, block)

    def publish_chain(self, ns: NamespaceLike,
                      items: Sequence[Tuple[PrefixKey, Optional[PrefixKey], Block]], *,
                      timeout_ms: int = 1000) -> None:
        """Publishes blocks of the home arena the caller has already written, as one ring
        transaction (``cxlkv_prefix_publish_chain``): `items` are (key, parent, block) in chain
        order, parent None for a sequence's first block. The owner applies all or none; when
        the ring lacks room for all, waits up to `timeout_ms` for the owner to drain it. On
        failure every block stays the caller's.

        Raises:
            InvalidArgumentError: a block not in the home arena, or more items than the
                domain's ring slots (split the chain).
            FullError: still no ring room after `timeout_ms`, or this host was fenced.
        """
        if self._home is None:
            raise InvalidArgumentError(
                f"{self!r} has no arena to publish from", operation="publish_chain",
                hint="domain.attach(arena) first (the arena whose blocks heartbeats free)")
        arr = (_lib.PublishItemC * max(len(items), 1))()
        for i, (key, parent, block) in enumerate(items):
            if block.arena_uuid != self._home.uuid:
                raise InvalidArgumentError(
                    f"item {i}: the block is not in this domain handle's home arena",
                    operation="publish_chain", subject=repr(self),
                    hint="allocate it from domain.home_arena")
            arr[i].key = _key_c(key, "publish_chain")
            if parent is not None:
                arr[i].parent = _key_c(parent, "publish_chain")
            arr[i].ref = block.ref
        with self._lock:
            h = self._handle("publish_chain")
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_prefix_publish_chain(
                h, _ns_id(ns), arr, len(items), self._home.handle(), timeout_ms),
                "cxlkv_prefix_publish_chain", self)

    def _publish_c(self, ns: NamespaceLike, kc: _lib.PrefixKeyC,
                   pc: Optional[_lib.PrefixKeyC], arena: Arena, block: Block) -> None:
        with self._lock:
            h = self._handle("publish")
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_prefix_publish(
                h, _ns_id(ns), ctypes.addressof(kc),
                ctypes.addressof(pc) if pc is not None else None, arena.handle(),
                ctypes.byref(block.ref)), "cxlkv_prefix_publish", self)

    def retire(self, ns: NamespaceLike, key: PrefixKey) -> None:
        """Asks the owner to retire this host's published entry for `key`."""
        kc = _key_c(key, "retire")
        with self._lock:
            h = self._handle("retire")
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_prefix_retire(h, _ns_id(ns), ctypes.addressof(kc)),
                       "cxlkv_prefix_retire", self)


class Leases:
    """Leases on published blocks, in order (the leading run of a chain, or one hit).

    A context manager: leaving the ``with`` block releases every lease still held (one fence,
    ``cxlkv_lease_release_many``). Also released when garbage collected, while the domain is
    joined. After release, every method raises ClosedError.
    """

    def __init__(self, domain: Domain, arr: Any, n: int, keys: Optional[List[PrefixKey]]) -> None:
        self._domain = domain
        self._arr = arr
        self._base = ctypes.addressof(arr)
        self._n = n
        self.keys = keys
        self._released = n == 0
        self._arena_cache: Dict[bytes, Optional[int]] = {}
        self._arena_of: List[Any] = [_UNRESOLVED] * n

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"Leases({self._n} on {self._domain!r}, {state})"

    def __enter__(self) -> "Leases":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            if not self._released and not self._domain.closed:
                self.release()
        except Exception:  # never raise from a finalizer (e.g. at interpreter exit)
            pass

    def _addr(self, i: int, what: str) -> int:
        if self._released:
            raise ClosedError(f"{self!r}: the leases were released", operation=what,
                              hint="acquire again (Domain.acquire_chain) before reading")
        if not 0 <= i < self._n:
            raise InvalidArgumentError(f"lease index {i} outside 0..{self._n - 1}",
                                       operation=what, subject=repr(self),
                                       hint="index the leased run: range(len(leases))")
        return self._base + i * _LEASE_SIZE

    def _lease(self, i: int) -> _lib.LeaseC:
        return self._arr[i]

    def deadline_ms(self, i: int) -> int:
        """CLOCK_MONOTONIC milliseconds after which lease `i`'s data must not be used."""
        self._addr(i, "deadline_ms")
        return int(self._arr[i].deadline_ms)

    def arena_uuid(self, i: int) -> bytes:
        self._addr(i, "arena_uuid")
        return bytes(self._arr[i].ref.arena_uuid)

    def _arena(self, i: int, what: str) -> Optional[int]:
        """The arena handle holding lease i's block (resolved once per lease)."""
        h = self._arena_of[i]
        if h is _UNRESOLVED:
            uuid = bytes(self._arr[i].ref.arena_uuid)
            if uuid not in self._arena_cache:
                self._arena_cache[uuid] = self._domain._arena_handle_for(uuid, what)
            h = self._arena_of[i] = self._arena_cache[uuid]
        return h

    # ---- reads ------------------------------------------------------------------------------

    def try_copy_out(self, i: int, dst: Any, *, offset: int = 0, nbytes: Optional[int] = None,
                     dtype: Any = None) -> bool:
        """Like :meth:`copy_out`, but returns False instead of raising StaleError."""
        self._addr(i, "copy_out")
        ptr, n = _buffers.address(dst, writable=True, what="copy_out destination",
                                  nbytes=nbytes, dtype=dtype)
        return self.copy_out_to(i, ptr, n, offset=offset)

    def copy_out_to(self, i: int, addr: int, nbytes: int, *, offset: int = 0) -> bool:
        """Reads `nbytes` of block `i` from `offset` to the address `addr`, validated as
        :meth:`copy_out` does (one ``cxlkv_lease_copy_out``). For memory an engine describes by
        address (SGLang's ``get_page_buffer_meta`` pointers, a vLLM primary row): the caller
        keeps ``[addr, addr + nbytes)`` mapped and writable for the call; nothing checks it.
        To read many blocks, :meth:`copy_out_many` crosses into the library once.

        Returns:
            True when the bytes at `addr` are the block's as published; False when they went
            stale during the copy and must be discarded.

        Raises:
            InvalidArgumentError: the range exceeds the block (the message gives its size), or
                `addr` is 0.
        """
        la = self._addr(i, "copy_out_to")
        d = self._domain
        arena = self._arena(i, "copy_out_to")
        with d._lock:
            h = d._handle("copy_out_to")
            lib = _lib.load()
            rc = lib.cxlkv_lease_copy_out(h, arena, la, offset, addr, nbytes)
        if rc:
            if rc == E_STALE:
                return False
            _lib.check(lib, rc, "cxlkv_lease_copy_out", d,
                       hint="read inside the block: offset + destination bytes <= the block size"
                       if rc == E_INVALID else None)
        return True

    def copy_out_many(self, pieces: Any) -> List[bool]:
        """Reads many pieces of leased blocks to scattered addresses in one library call
        (``cxlkv_lease_copy_out_many``): `pieces` is a sequence of ``(lease index, offset in
        the block, addr, nbytes)``; several pieces may name one lease (a page's K and V at
        two offsets). Each piece is read and validated as :meth:`copy_out_to` reads it, one
        after another, and one going stale does not stop the others. The caller keeps every
        destination mapped and writable for the call.

        Returns:
            One bool per piece: False means that piece's destination must be discarded.

        Raises:
            InvalidArgumentError: a lease index outside the leases, a range outside its block,
                or an address of 0 (the first such piece is named; the others were still read).
        """
        k = len(pieces)
        if k == 0:
            return []
        n = self._n
        self._addr(0, "copy_out_many")  # raises once released
        handles = [self._arena(i, "copy_out_many") or 0 for i in range(n)]
        base = self._base
        flat: List[int] = []
        try:
            for i, off, addr, nbytes in pieces:
                if not 0 <= i < n:
                    self._addr(i, "copy_out_many")  # raises, naming the index
                flat += (handles[i], base + i * _LEASE_SIZE, off, addr, nbytes)
            items = (ctypes.c_uint64 * (_ITEM_WORDS * k))(*flat)
        except CxlkvError:
            raise
        except (TypeError, ValueError, OverflowError) as e:
            raise InvalidArgumentError(
                f"pieces: {e}", operation="copy_out_many", subject=repr(self),
                hint="pass (lease index, offset, addr, nbytes) per piece, non-negative "
                "integers") from None
        results = (ctypes.c_int * k)()
        d = self._domain
        with d._lock:
            h = d._handle("copy_out_many")
            lib = _lib.load()
            rc = lib.cxlkv_lease_copy_out_many(h, items, k, results)
        if rc and rc != E_STALE:
            _lib.check(lib, rc, "cxlkv_lease_copy_out_many", d,
                       hint="read inside the block: offset + destination bytes <= the block size"
                       if rc == E_INVALID else None)
        return [r == 0 for r in results]

    def copy_out(self, i: int, dst: Any, *, offset: int = 0, nbytes: Optional[int] = None,
                 dtype: Any = None) -> None:
        """Reads ``dst``'s size in bytes of block `i` from `offset` into `dst`, validated.

        Args:
            dst: a C-contiguous writable numpy array, CPU torch tensor or buffer.
            offset: byte offset inside the block.
            nbytes: if given, `dst` must hold exactly this many bytes.
            dtype: if given, `dst`'s element type must be this (numpy or torch dtype).

        Raises:
            BufferMismatchError: `dst` is not a CPU contiguous writable buffer of the asked
                size/dtype (nothing was read).
            InvalidArgumentError: the range exceeds the block (the message gives its size).
            StaleError: the block was retired or reused, or the lease expired, during the
                copy: `dst` was written and must be discarded.
        """
        if not self.try_copy_out(i, dst, offset=offset, nbytes=nbytes, dtype=dtype):
            raise StaleError(
                f"lease {i} of {self!r} went stale during the copy", operation="copy_out",
                hint="discard the destination's contents and acquire the prefix again")

    def region_object(self, i: int) -> Optional[Tuple[int, int, int, int]]:
        """(offset, length, generation, region tag) when lease `i` is on a region object (an
        entry the owner published for an object of its own region, e.g. LMCache's coordinator:
        the object's handle), else None (an arena block)."""
        la = self._addr(i, "region_object")
        off, length, gen, tag = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64(), \
            ctypes.c_uint32()
        rc = _lib.load().cxlkv_region_object(la + _LEASE_REF_OFFSET, ctypes.byref(off),
                                             ctypes.byref(length), ctypes.byref(gen),
                                             ctypes.byref(tag))
        if rc:
            return None
        return int(off.value), int(length.value), int(gen.value), int(tag.value)

    def try_copy_out_region(self, i: int, region: Any, dst: Any, *, offset: int = 0) -> bool:
        """Reads ``dst``'s size in bytes of region object `i` from `offset`, validated
        (``cxlkv_lease_copy_out_region``): `region` is this process's mapping of the whole
        region (a buffer, e.g. an mmap or a numpy view of it). False: the object went stale
        during the copy; discard `dst`.

        Raises:
            InvalidArgumentError: not a region object, or a range outside it or the region.
        """
        la = self._addr(i, "copy_out_region")
        rptr, rn = _buffers.address(region, writable=False, what="region mapping")
        ptr, n = _buffers.address(dst, writable=True, what="copy_out_region destination")
        d = self._domain
        with d._lock:
            h = d._handle("copy_out_region")
            lib = _lib.load()
            rc = lib.cxlkv_lease_copy_out_region(h, la, rptr, rn, offset, ptr, n)
        if rc == E_STALE:
            return False
        if rc:
            _lib.check(lib, rc, "cxlkv_lease_copy_out_region", d,
                       hint="map the whole region; read inside the object")
        return True

    def copy_out_rows(self, dst: Any, *, offset: int = 0, dtype: Any = None) -> List[bool]:
        """Copies every leased block into its row of `dst` (block i into ``dst[i]``), each
        validated as :meth:`copy_out` does; one bool per lease, False: that row went stale and
        must be discarded. The fast way to fill a request's KV slots: `dst` is checked once,
        and the rows' addresses follow from its shape.

        Args:
            dst: a C-contiguous writable numpy array or CPU torch tensor with at least
                ``len(self)`` rows (first dimension); each row's bytes are read from `offset`
                in its block.
            dtype: if given, `dst`'s element type must be this.

        Raises:
            BufferMismatchError: `dst` is not such an array, or has too few rows.
            InvalidArgumentError: a row is larger than its block (the message gives the size).
        """
        n = self._n
        if n:
            self._addr(0, "copy_out_rows")  # raises once released
        shape = getattr(dst, "shape", None)
        if not shape:
            raise BufferMismatchError(
                f"{_buffers.describe(dst)} has no rows", operation="copy_out_rows",
                hint="pass an array or tensor shaped (blocks, ...)")
        ptr, size = _buffers.address(dst, writable=True, what="copy_out_rows destination",
                                     dtype=dtype)
        rows = int(shape[0])
        if rows < n:
            raise BufferMismatchError(
                f"{_buffers.describe(dst)} has {rows} rows for {n} leased blocks",
                operation="copy_out_rows", hint="pass one row per leased block")
        if n == 0:
            return []
        row = size // rows
        return self.copy_out_many([(i, offset, ptr + i * row, row) for i in range(n)])

    def read(self, i: int, nbytes: int, *, offset: int = 0, dtype: Any = np.uint8) -> np.ndarray:
        """A new numpy array with `nbytes` of block `i` (validated; StaleError if stale)."""
        out = np.empty(nbytes // np.dtype(dtype).itemsize, dtype=dtype)
        self.copy_out(i, out, offset=offset)
        return out

    def validate(self, i: int) -> bool:
        """Whether what was read under lease `i` is good (``cxlkv_lease_validate``): False
        means discard it (the lease expired, or the block was retired or reused)."""
        la = self._addr(i, "validate")
        d = self._domain
        with d._lock:
            h = d._handle("validate")
            lib = _lib.load()
            rc = lib.cxlkv_lease_validate(h, la)
            if rc == E_STALE:
                return False
            _lib.check(lib, rc, "cxlkv_lease_validate", d)
        return True

    def renew(self, i: int) -> None:
        """Extends lease `i` (``cxlkv_lease_renew``). StaleError: it expired (released)."""
        la = self._addr(i, "renew")
        d = self._domain
        with d._lock:
            h = d._handle("renew")
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_lease_renew(h, la), "cxlkv_lease_renew", d)

    def view(self, i: int, *, offset: int = 0, nbytes: int) -> "ZeroCopyView":
        """A zero-copy read-only view of `nbytes` of block `i` from `offset`; see the module
        docstring for when it is valid. Use as ``with leases.view(i, nbytes=n) as arr:``."""
        la = self._addr(i, "view")
        d = self._domain
        arena = self._arena(i, "view")
        addr = ctypes.c_void_p()
        with d._lock:
            h = d._handle("view")
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_block_invalidate(h, arena, la, offset, nbytes,
                                                       ctypes.byref(addr)),
                       "cxlkv_block_invalidate", d)
        return ZeroCopyView(self, i, int(addr.value or 0), nbytes)

    def release(self) -> None:
        """Releases every lease (one fence). Idempotent."""
        if self._released:
            return
        self._released = True
        d = self._domain
        with d._lock:
            if d.closed:
                return
            lib = _lib.load()
            _lib.check(lib, lib.cxlkv_lease_release_many(d._handle("release"), self._base,
                                                         self._n),
                       "cxlkv_lease_release_many", d)


class ZeroCopyView:
    """A read-only numpy view of a leased block's memory (``cxlkv_block_invalidate``).

    ``with leases.view(i, nbytes=n) as arr:`` gives the array; leaving the block validates the
    lease and raises StaleError if what was read must be discarded. ``valid`` records the
    outcome. The array must not be used after the ``with`` block.
    """

    def __init__(self, leases: Leases, i: int, addr: int, nbytes: int) -> None:
        self._leases = leases
        self._i = i
        buf = (ctypes.c_uint8 * nbytes).from_address(addr)
        self.array: np.ndarray = np.frombuffer(memoryview(buf), dtype=np.uint8)
        self.array.setflags(write=False)
        self.valid: Optional[bool] = None
        self.taken_at = time.monotonic()

    def validate(self) -> bool:
        """Validates the lease after the reads so far (call again after reading again)."""
        self.valid = self._leases.validate(self._i)
        return self.valid

    def __enter__(self) -> np.ndarray:
        return self.array

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        ok = self.validate()
        # Drop our reference: the memory may hold another block once the lease ends.
        self.array = np.empty(0, dtype=np.uint8)
        if not ok and exc_type is None:
            raise StaleError(
                f"lease {self._i} of {self._leases!r} is no longer valid",
                operation="zero-copy view",
                hint="discard everything computed from the view and acquire the prefix again")
