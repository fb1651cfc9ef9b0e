"""The chain protocol the engine stores share: storing a run of pages, loading a leased run.

Both engine stores (:class:`~cxlkv.OffloadTier`, vLLM's shape; :class:`~cxlkv.PageStore`,
SGLang's) move pages that the engine describes by address — a primary row, a host pool's K and
V segments — between its memory and the domain, in chain order. The steps and their order are
the protocol's (docs/coherence.md), so they live here once:

* :func:`store_chain` — per page, in order: a lookup (a published page counts as stored and
  becomes the next page's parent), a block of the home arena, the page's segments copied in
  with streaming stores (``cxlkv_copy_to_block``), the publish with the previous page as parent
  (``cxlkv_prefix_publish``). It stops at the first page the domain cannot take: the arena is
  full, or the request ring is (the owner is behind); that block is freed, pages already
  published stay published. Any other error frees the block and propagates.
* :func:`load_chain` — the leading run of published keys leased in batches
  (``cxlkv_lease_acquire_chain``), every segment of every leased page copied out and validated
  in one library call per batch (:meth:`Leases.copy_out_many`, ``cxlkv_lease_copy_out_many``),
  the batch released. It stops at the first key not published (or not leasable in
  ``wait_s``).

A segment is ``(address, bytes)`` in the engine's memory, which the caller keeps mapped (and,
for a load, writable) for the call; a page's segments are its bytes in order, from offset 0 of
its block. Thread-safety: as the :class:`~cxlkv.Domain` (its calls take its lock).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from . import _lib
from .domain import Domain, Leases, NamespaceLike
from .errors import FullError, InvalidArgumentError
from .keys import PrefixKey

Segments = Sequence[Tuple[int, int]]  # (address, bytes) of one page's parts, in order


@dataclass
class StoreChainResult:
    """What :func:`store_chain` did.

    Attributes:
        stored: how many leading pages are in the domain now (published before, or by this
            call); ``stored < len(keys)``: page ``stored`` could not be taken (arena or
            request ring full) and nothing after it was tried.
        published: indices of the pages this call published.
        bytes_copied: bytes copied into blocks this call published.
    """

    stored: int = 0
    published: List[int] = field(default_factory=list)
    bytes_copied: int = 0


def store_chain(domain: Domain, ns: NamespaceLike, keys: Sequence[PrefixKey],
                segments: Sequence[Segments], *, parent: Optional[PrefixKey] = None,
                size_class: int = 0) -> StoreChainResult:
    """Stores pages ``keys[i]`` from ``segments[i]`` in chain order (see the module docstring).

    Args:
        parent: the key of the page before ``keys[0]`` (None: the first page of a sequence).
        size_class: the home arena's size class blocks are allocated from; a page's segments
            must fit one of its blocks (the caller checked the page size once).

    Raises:
        InvalidArgumentError: the domain has no home arena. Errors other than a full arena or
            ring propagate after the block in hand is freed.
    """
    home = domain.home_arena
    if home is None:
        raise InvalidArgumentError(f"{domain!r} has no arena to store into",
                                   operation="store_chain",
                                   hint="Domain.join(spec, host, arenas=[arena]) first")
    lib = _lib.load()
    res = StoreChainResult()
    for i, pk in enumerate(keys):
        if domain.lookup(ns, pk) is not None:
            res.stored += 1
            parent = pk
            continue
        try:
            block = home.alloc(size_class)
        except FullError:
            return res
        off = 0
        for ptr, n in segments[i]:
            lib.cxlkv_copy_to_block(block.addr + off, ptr, n)
            off += n
        try:
            domain.publish_block(ns, pk, block, parent=parent)
        except FullError:
            home.free(block)  # the request ring is full: the owner is behind
            return res
        except BaseException:
            home.free(block)
            raise
        res.stored += 1
        res.published.append(i)
        res.bytes_copied += off
        parent = pk
    return res


def _acquire(domain: Domain, ns: NamespaceLike, keys: Sequence[PrefixKey],
             wait_s: float) -> Optional[Leases]:
    try:
        return domain.acquire_chain(ns, keys, wait_s=wait_s)
    except FullError:
        return None  # no lease row, or the owner is not confirming this host: a miss


def load_chain(domain: Domain, ns: NamespaceLike, keys: Sequence[PrefixKey],
               segments: Sequence[Segments], *, max_batch: int = 64, wait_s: float = 0.0,
               scatter: bool = True) -> List[bool]:
    """Loads the leading run of published ``keys`` into ``segments`` (see the module
    docstring).

    Args:
        max_batch: keys leased per ``cxlkv_lease_acquire_chain`` (at most the domain's lease
            rows).
        wait_s: how long a batch waits for a lease row or the owner's confirmation of this host
            (``Domain.acquire_chain``) before the run ends there.
        scatter: True: one ``cxlkv_lease_copy_out_many`` per batch; False: one
            ``cxlkv_lease_copy_out`` per segment (:meth:`Leases.copy_out_to`), the same reads
            and validations, kept to measure the difference (bench/engine_adapters.py).

    Returns:
        One bool per leased page, ``len(result)`` the length of the leased run: True when
        every segment of the page holds its bytes as published, False when one went stale
        (the page's bytes in the engine's memory must not be used).

    Raises:
        InvalidArgumentError: a segment outside its block (the caller's page size is wrong).
    """
    out: List[bool] = []
    i = 0
    n = len(keys)
    while i < n:
        chunk = keys[i:i + max_batch]
        leases = _acquire(domain, ns, chunk, wait_s)
        if leases is None:
            break
        with leases:
            got = len(leases)
            if scatter:
                pieces: List[Tuple[int, int, int, int]] = []
                owner: List[int] = []
                for j in range(got):
                    off = 0
                    for ptr, nb in segments[i + j]:
                        pieces.append((j, off, ptr, nb))
                        owner.append(j)
                        off += nb
                ok = [True] * got
                for j, good in zip(owner, leases.copy_out_many(pieces)):
                    if not good:
                        ok[j] = False
            else:
                ok = []
                for j in range(got):
                    off, good = 0, True
                    for ptr, nb in segments[i + j]:
                        good = leases.copy_out_to(j, ptr, nb, offset=off) and good
                        off += nb
                    ok.append(good)
            out += ok
        i += got
        if got < len(chunk):
            break
    return out
