"""Pools (memory sources) and KV arenas with their block allocator.

A :class:`Pool` is one opened memory source, named by a spec string (README.md, "Memory
sources"): ``devdax:/dev/dax0.0``, ``kmem:node=2``, ``file:/dev/shm/kv?size=8G``,
``memfd:?size=1G``. A pool holds one :class:`Arena` (one open arena handle per pool handle in
a process; other processes open their own on the same source). Blocks belong to the process
that allocated them and go back to the free pool when it closes the arena or dies, except
blocks that were published (the domain holds those).

Thread-safety: pools and arenas may be used from any number of threads; close an arena only
after every thread stopped using it. Closing a pool closes its arena first. Every handle is
a context manager, and a closed handle raises :class:`~cxlkv.errors.ClosedError`.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

from . import _buffers, _lib
from .errors import ClosedError, InvalidArgumentError


@dataclass(frozen=True)
class KvLayout:
    """The KV layout an arena is formatted for (``cxlkv_kv_layout``).

    Block bytes = 2 * layers * kv_heads * head_dim * dtype_bytes * tokens_per_block.
    """

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    tokens_per_block: int
    layer_separate: bool = False

    @property
    def block_bytes(self) -> int:
        return (2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes
                * self.tokens_per_block)

    def to_c(self) -> _lib.KvLayoutC:
        for name in ("layers", "kv_heads", "head_dim", "dtype_bytes", "tokens_per_block"):
            v = getattr(self, name)
            if not isinstance(v, int) or not 0 < v < 1 << 32:
                raise InvalidArgumentError(f"KvLayout.{name}={v!r} must be an int in 1..2^32-1",
                                           operation="KvLayout", hint="fix the layout")
        return _lib.KvLayoutC(self.layers, self.kv_heads, self.head_dim, self.dtype_bytes,
                              self.tokens_per_block, 1 if self.layer_separate else 0)

    @classmethod
    def from_c(cls, c: _lib.KvLayoutC) -> "KvLayout":
        return cls(c.layers, c.kv_heads, c.head_dim, c.dtype_bytes, c.tokens_per_block,
                   bool(c.layer_separate))


@dataclass(frozen=True)
class ClassStats:
    """One size class of an arena (``cxlkv_class_stats``)."""

    block_bytes: int
    total_blocks: int
    free_blocks: int
    cached_blocks: int
    allocated_blocks: int
    persisted_blocks: int
    largest_free_run: int
    allocs: int
    frees: int
    failed_allocs: int


@dataclass(frozen=True)
class ArenaStats:
    """Usage of an arena (``cxlkv_arena_stats``): shared counts, and this process's."""

    arena_uuid: str
    region_bytes: int
    metadata_bytes: int
    owners_active: int
    bad_frees: int
    classes: List[ClassStats] = field(default_factory=list)


@dataclass(frozen=True)
class Block:
    """An allocated block: its ref (valid in every process) and its address in this one."""

    ref: _lib.BlockRef
    addr: int
    size_bytes: int

    @property
    def arena_uuid(self) -> bytes:
        return bytes(self.ref.arena_uuid)


def arena_options(layout: KvLayout, class_tokens: Sequence[int] = (),
                  class_weights: Sequence[int] = (), owner_slots: int = 0,
                  force: bool = False) -> _lib.ArenaOptionsC:
    """The C options of an arena format (``cxlkv_arena_options``)."""
    if len(class_tokens) > _lib.MAX_CLASSES or len(class_weights) > _lib.MAX_CLASSES:
        raise InvalidArgumentError(
            f"at most {_lib.MAX_CLASSES} size classes, got {len(class_tokens)}",
            operation="arena options", hint="merge size classes")
    opts = _lib.ArenaOptionsC()
    opts.layout = layout.to_c()
    for i, t in enumerate(class_tokens):
        opts.class_tokens[i] = t
    for i, w in enumerate(class_weights):
        opts.class_weights[i] = w
    opts.owner_slots = owner_slots
    opts.flags = _lib.FORMAT_FORCE if force else 0
    return opts


def uuid_str(raw: Any) -> str:
    b = bytes(raw)
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Pool:
    """An opened memory source (``cxlkv_pool_open``).

    Use :meth:`open`; close with :meth:`close` or a ``with`` block.
    """

    def __init__(self, handle: int, spec: str) -> None:
        self._h: Optional[int] = handle
        self.spec = spec
        self._arena: Optional[Arena] = None
        self._lock = threading.Lock()

    @classmethod
    def open(cls, spec: str) -> "Pool":
        """Opens the source named by `spec` (created if it is a ``file:`` spec with ``size=``).

        Raises:
            InvalidArgumentError, NotFoundError, PermissionDeniedError, InternalError.
        """
        if not isinstance(spec, str) or not spec:
            raise InvalidArgumentError(f"pool spec {spec!r} must be a non-empty str",
                                       operation="Pool.open",
                                       hint="e.g. 'file:/dev/shm/kv?size=1G' or 'memfd:?size=1G'")
        lib = _lib.load()
        out = ctypes.c_void_p()
        _lib.check(lib, lib.cxlkv_pool_open(spec.encode(), ctypes.byref(out)), "cxlkv_pool_open",
                   f"Pool({spec})")
        return cls(int(out.value or 0), spec)

    def __repr__(self) -> str:
        return f"Pool({self.spec}{'' if self._h else ', closed'})"

    def handle(self) -> int:
        if not self._h:
            raise ClosedError(f"{self!r} is closed", operation="use",
                              hint="open it again with cxlkv.Pool.open(spec)")
        return self._h

    def close(self) -> None:
        """Closes the pool, and its arena first if one is still open. Idempotent."""
        with self._lock:
            if self._arena is not None:
                self._arena.close()
                self._arena = None
            if self._h:
                _lib.load().cxlkv_pool_close(self._h)
                self._h = None

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _adopt(self, arena: "Arena") -> None:
        self._arena = arena

    def _forget(self, arena: "Arena") -> None:
        if self._arena is arena:
            self._arena = None


class Arena:
    """A KV arena and its block allocator (``cxlkv_arena_*``, ``cxlkv_alloc``).

    Use :meth:`create` (format) or :meth:`open`. The arena's pool stays open while it is.
    """

    def __init__(self, handle: int, pool: Optional[Pool], *, where: str = "") -> None:
        self._h: Optional[int] = handle
        self.pool = pool  # None for an arena grown in a domain's extent (Domain.grow)
        self._where = where or (pool.spec if pool is not None else "a domain extent")
        if pool is not None:
            pool._adopt(self)
        self._owns_pool = False
        self._uuid = self._read_uuid()

    # ---- lifetime ---------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        pool: Pool,
        layout: KvLayout,
        *,
        class_tokens: Sequence[int] = (),
        class_weights: Sequence[int] = (),
        owner_slots: int = 0,
        force: bool = False,
    ) -> "Arena":
        """Formats a new arena in `pool` (``cxlkv_arena_create``).

        Args:
            layout: the KV layout.
            class_tokens: size classes in tokens per block (up to 8); empty: one class of
                ``layout.tokens_per_block``.
            class_weights: how the classes share the space (0 or missing: 1).
            owner_slots: processes that may attach at once (0: 256).
            force: overwrite an arena or foreign data (never one in use).

        Raises:
            ExistsError: an arena is already there and `force` is False.
            MismatchError: it is in use by a live process.
        """
        opts = arena_options(layout, class_tokens, class_weights, owner_slots, force)
        lib = _lib.load()
        out = ctypes.c_void_p()
        _lib.check(lib, lib.cxlkv_arena_create(pool.handle(), ctypes.byref(opts),
                                               ctypes.byref(out)),
                   "cxlkv_arena_create", pool)
        return cls(int(out.value or 0), pool)

    @classmethod
    def open(cls, pool: Pool, expect: Optional[KvLayout] = None) -> "Arena":
        """Opens the arena formatted in `pool` (``cxlkv_arena_open``).

        Args:
            expect: if given, the arena's layout must equal it (MismatchError otherwise).
        """
        lib = _lib.load()
        out = ctypes.c_void_p()
        lay = expect.to_c() if expect is not None else None
        _lib.check(lib, lib.cxlkv_arena_open(pool.handle(),
                                             ctypes.byref(lay) if lay is not None else None,
                                             ctypes.byref(out)),
                   "cxlkv_arena_open", pool)
        return cls(int(out.value or 0), pool)

    @classmethod
    def open_spec(cls, spec: str, expect: Optional[KvLayout] = None) -> "Arena":
        """Opens a pool and its arena; closing the arena closes the pool too."""
        pool = Pool.open(spec)
        try:
            arena = cls.open(pool, expect)
        except BaseException:
            pool.close()
            raise
        arena._owns_pool = True
        return arena

    def _read_uuid(self) -> bytes:
        st = _lib.ArenaStatsC()
        lib = _lib.load()
        _lib.check(lib, lib.cxlkv_arena_stats_get(self._h, ctypes.byref(st)),
                   "cxlkv_arena_stats_get", f"Arena in {self._where}")
        return bytes(st.arena_uuid)

    @property
    def uuid(self) -> bytes:
        """The arena's 16-byte uuid (what a block ref's ``arena_uuid`` names)."""
        return self._uuid

    def __repr__(self) -> str:
        state = "" if self._h else ", closed"
        return f"Arena({uuid_str(self._uuid)} in {self._where}{state})"

    def handle(self) -> int:
        if not self._h:
            raise ClosedError(f"{self!r} is closed", operation="use",
                              hint="open it again with cxlkv.Arena.open(pool)")
        return self._h

    @property
    def closed(self) -> bool:
        return not self._h

    def close(self) -> None:
        """Closes the arena: blocks this process still owns (not published) are freed. An
        arena grown in a domain's extent gives the extent back."""
        if self._h:
            _lib.load().cxlkv_arena_close(self._h)
            self._h = None
            if self.pool is not None:
                self.pool._forget(self)
                if self._owns_pool:
                    self.pool.close()

    def __enter__(self) -> "Arena":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- blocks -----------------------------------------------------------------------------

    def block_size(self, size_class: int = 0) -> int:
        """Bytes of a block of `size_class` (0 if the class does not exist)."""
        return int(_lib.load().cxlkv_block_size(self.handle(), size_class))

    def alloc(self, size_class: int = 0) -> Block:
        """Allocates one block (``cxlkv_alloc``). FullError when the class has none free."""
        lib = _lib.load()
        ref = _lib.BlockRef()
        addr = ctypes.c_void_p()
        _lib.check(lib, lib.cxlkv_alloc(self.handle(), size_class, ctypes.byref(ref),
                                        ctypes.byref(addr)),
                   "cxlkv_alloc", self)
        return Block(ref, int(addr.value or 0), self.block_size(size_class))

    def free(self, block: Block) -> None:
        """Frees a block this process allocated (DoubleFreeError, StaleError, ForeignError)."""
        lib = _lib.load()
        _lib.check(lib, lib.cxlkv_free(self.handle(), ctypes.byref(block.ref)), "cxlkv_free",
                   self)

    def write(self, block: Block, data: Any, offset: int = 0) -> None:
        """Copies `data` (array, tensor or buffer) into a block this process owns and has not
        published, with streaming stores (``cxlkv_copy_to_block``): in memory on return."""
        src, n = _buffers.address(data, writable=False, what="Arena.write")
        if offset < 0 or offset + n > block.size_bytes:
            raise InvalidArgumentError(
                f"{n} bytes at offset {offset} do not fit a block of {block.size_bytes} bytes",
                operation="Arena.write", subject=repr(self),
                hint="write at most the block size")
        if n:
            _lib.load().cxlkv_copy_to_block(block.addr + offset, src, n)

    def ref_to_addr(self, ref: _lib.BlockRef) -> int:
        """The address in this process of an allocated block of this arena (validated)."""
        lib = _lib.load()
        addr = ctypes.c_void_p()
        _lib.check(lib, lib.cxlkv_ref_to_addr(self.handle(), ctypes.byref(ref),
                                              ctypes.byref(addr)),
                   "cxlkv_ref_to_addr", self)
        return int(addr.value or 0)

    def stats(self) -> ArenaStats:
        """Usage counts (``cxlkv_arena_stats_get``)."""
        lib = _lib.load()
        st = _lib.ArenaStatsC()
        _lib.check(lib, lib.cxlkv_arena_stats_get(self.handle(), ctypes.byref(st)),
                   "cxlkv_arena_stats_get", self)
        classes = [
            ClassStats(c.block_bytes, c.total_blocks, c.free_blocks, c.cached_blocks,
                       c.allocated_blocks, c.persisted_blocks, c.largest_free_run, c.allocs,
                       c.frees, c.failed_allocs)
            for c in list(st.classes)[: st.class_count]
        ]
        return ArenaStats(uuid_str(st.arena_uuid), st.region_bytes, st.metadata_bytes,
                          st.owners_active, st.bad_frees, classes)


def layout_for_block_bytes(block_bytes: int, tokens_per_block: int = 16) -> Tuple[KvLayout, int]:
    """A layout whose blocks are `block_bytes` (a helper for tests and stores of opaque
    pages): one layer, one head, dtype 1 byte; returns (layout, block bytes)."""
    if block_bytes % (2 * tokens_per_block):
        raise InvalidArgumentError(
            f"block_bytes {block_bytes} is not a multiple of 2 * tokens_per_block "
            f"({2 * tokens_per_block})", operation="layout_for_block_bytes",
            hint="pick a page size that divides evenly")
    head_dim = block_bytes // (2 * tokens_per_block)
    lay = KvLayout(1, 1, head_dim, 1, tokens_per_block)
    return lay, lay.block_bytes
