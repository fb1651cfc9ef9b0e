"""A page store with the shape of SGLang's HiCache storage backend, on a CXL domain.

Pages are keyed by the engine's chained page hashes (SGLang's ``get_hash_str``: SHA-256 of the
prior page's hash and the page's token ids, 64 hex characters), mapped to prefix keys with
:meth:`Namespace.digest_key`; everything that changes a page's bytes (model, TP rank/size,
layout, page size, dtype) belongs in the :class:`~cxlkv.Namespace`, not in the key.

What each call does, in terms of the C API:

* :meth:`PageStore.batch_exists` — lookups (no lease) until the first miss: the length of the
  leading run of present pages;
* :meth:`PageStore.batch_get_v1` — ``cxlkv_lease_acquire_chain`` over the keys (in batches),
  then one ``cxlkv_lease_copy_out_many`` per batch that copies every segment straight into the
  host pool's page (no staging buffer: "zero-copy" in SGLang's sense), each validated after its
  copy, then one release per batch;
* :meth:`PageStore.batch_set_v1` — per page not yet published: allocate a block of this host's
  arena, copy the page's segments in with streaming stores (``cxlkv_copy_to_block``),
  ``cxlkv_prefix_publish`` with the previous page as parent.

Both are the chain helpers of :mod:`cxlkv.chains`, which :class:`~cxlkv.OffloadTier` uses too.

The host pool is anything with SGLang's host-pool surface for storage backends: ``page_size``
(tokens per page) and ``get_page_buffer_meta(host_indices) -> (pointers, sizes)``, the
segments of each page in order (MHA: K then V; MLA: one). :class:`HostPagePool` implements
it on a plain numpy array or CPU torch tensor; the SGLang adapter passes SGLang's own pool.

Optional NVMe spill (``spill=``, a :class:`~cxlkv.tier.Tier` whose block size is the page
size): pages the domain cannot take (this host's arena is full, or the owner is behind) go
to the tier instead, which keeps each in CXL or on NVMe or drops it as the placement rule
decides (``cxlkv_tier_place``, recorded as a use); :meth:`PageStore.batch_exists` and the
reads count a page present in either, the domain's leading run first and then the tier's
(``cxlkv_tier_read``: from CXL or NVMe, straight into the host pool when a page is one
segment, through a staging buffer otherwise). Spilled pages are this host's alone: the
tier does not publish them, so other hosts of the domain do not see them.

Failure model: bad input (a key of the wrong length, host indices that do not match the keys,
a tensor of the wrong size or dtype, a closed domain) raises before anything is stored or
read. A page that cannot be stored (arena full, the owner behind) or read (missing, stale)
is ``False`` in the result list, as SGLang expects; nothing already stored is touched.
"""

from __future__ import annotations

import ctypes
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import _buffers, chains
from .domain import Domain
from .errors import (
    BufferMismatchError,
    ClosedError,
    InvalidArgumentError,
)
from .keys import Namespace, PrefixKey, digest_bytes
from .tier import Residence, Tier

Segments = List[Tuple[int, int]]  # (address, bytes) of one page's parts, in order


def _indices_array(host_indices: Any, what: str) -> np.ndarray:
    if hasattr(host_indices, "detach") and hasattr(host_indices, "numpy"):
        host_indices = host_indices.detach().cpu().numpy()
    arr = np.asarray(host_indices)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise InvalidArgumentError(
            f"host_indices must be a 1-D integer tensor/array, got shape {arr.shape} dtype "
            f"{arr.dtype}", operation=what,
            hint="pass the token indices of the pages in the host pool")
    return arr.astype(np.int64, copy=False)


def page_buffer_meta(pool: Any, host_indices: Any) -> Tuple[List[int], List[int]]:
    """A host pool's ``get_page_buffer_meta``: (pointers, sizes) of the pages' segments.
    Some SGLang host pools give one size for every segment instead of a list; it is
    repeated here."""
    ptrs, sizes = pool.get_page_buffer_meta(host_indices)
    ptrs = list(ptrs)
    if isinstance(sizes, (int, np.integer)):
        sizes = [int(sizes)] * len(ptrs)
    return ptrs, list(sizes)


class HostPagePool:
    """A host KV pool on a plain buffer, page-first, as SGLang's host pool presents itself to a
    storage backend (``page_size``, ``get_page_buffer_meta``).

    Args:
        data: a C-contiguous numpy array or CPU torch tensor, ``(tokens, ...)`` with
            ``kv_parts=1`` or ``(2, tokens, ...)`` with ``kv_parts=2`` (K and V apart, as
            SGLang's MHA page-first pool: a page is two segments).
        page_size: tokens per page; ``tokens`` must be a multiple of it.
        kv_parts: 1 or 2.
    """

    def __init__(self, data: Any, page_size: int, kv_parts: int = 1) -> None:
        if kv_parts not in (1, 2):
            raise InvalidArgumentError(f"kv_parts must be 1 or 2, got {kv_parts}",
                                       operation="HostPagePool", hint="1: K and V together")
        self.data = data
        self._base, nbytes = _buffers.address(data, writable=True, what="HostPagePool data")
        shape = tuple(data.shape)
        if kv_parts == 2 and (len(shape) < 2 or shape[0] != 2):
            raise BufferMismatchError(f"{_buffers.describe(data)}: kv_parts=2 needs shape "
                                      "(2, tokens, ...)", operation="HostPagePool",
                                      hint="stack K and V in the first dimension")
        tokens = shape[1] if kv_parts == 2 else shape[0]
        if page_size <= 0 or tokens % page_size:
            raise InvalidArgumentError(f"{tokens} tokens are not a whole number of pages of "
                                       f"{page_size}", operation="HostPagePool",
                                       hint="size the pool in whole pages")
        self.page_size = page_size
        self.kv_parts = kv_parts
        self.size = tokens
        # What SGLang's host pools say of themselves (the backend's namespace names them).
        self.layout = "page_first"
        self.dtype = str(getattr(data, "dtype", "uint8")).replace("torch.", "")
        self.token_bytes = nbytes // (kv_parts * tokens)
        self._part_stride = nbytes // kv_parts

    @property
    def page_bytes(self) -> int:
        """Bytes of one page, all its segments together."""
        return self.kv_parts * self.page_size * self.token_bytes

    def get_page_buffer_meta(self, indices: Any) -> Tuple[List[int], List[int]]:
        """(pointers, sizes) of the segments of the pages at token `indices` (page-aligned,
        each page's indices consecutive), ``kv_parts`` per page."""
        idx = _indices_array(indices, "get_page_buffer_meta")
        ps = self.page_size
        if idx.size % ps:
            raise InvalidArgumentError(f"{idx.size} host indices are not whole pages of {ps}",
                                       operation="get_page_buffer_meta",
                                       hint="pass page_size indices per page")
        pages = idx.reshape(-1, ps)
        starts = pages[:, 0]
        if (starts % ps).any() or not np.array_equal(pages, starts[:, None] + np.arange(ps)):
            raise InvalidArgumentError("host indices are not page-aligned runs",
                                       operation="get_page_buffer_meta",
                                       hint="each page's indices must be start..start+page_size-1 "
                                       "with start a multiple of page_size")
        if starts.size and (starts.min() < 0 or starts.max() + ps > self.size):
            raise InvalidArgumentError(
                f"host indices reach token {int(starts.max()) + ps - 1} of a pool of {self.size}",
                operation="get_page_buffer_meta", hint="index inside the host pool")
        seg = ps * self.token_bytes
        ptrs: List[int] = []
        for s in starts.tolist():
            for part in range(self.kv_parts):
                ptrs.append(self._base + part * self._part_stride + s * self.token_bytes)
        return ptrs, [seg] * len(ptrs)

    def page(self, index: int) -> List[Any]:
        """The segments of the page at token `index` as views of `data` (for tests)."""
        ps = self.page_size
        if self.kv_parts == 2:
            return [self.data[0, index:index + ps], self.data[1, index:index + ps]]
        return [self.data[index:index + ps]]


class PageStore:
    """SGLang HiCache-shaped page store over a :class:`~cxlkv.Domain`.

    Args:
        domain: the joined domain; its home arena (the first attached) holds this host's
            pages, and the arenas of the other hosts' pages must be attached for reads.
        namespace: model, TP rank/size, layout: pages are shared only within it.
        page_bytes: bytes of one page (all segments); at most the arena's block size.
        size_class: the arena size class pages are allocated from.
        max_batch: keys leased per ``cxlkv_lease_acquire_chain`` (<= the domain's lease rows).
        acquire_wait_s: how long a read waits for a lease row or for the owner to confirm this
            host (``Domain.acquire_chain``'s ``wait_s``) before it counts the pages as misses.
        spill: an open :class:`~cxlkv.tier.Tier` (its block size = `page_bytes`; best over an
            arena of its own, so it does not take the blocks the domain publishes from) that
            takes the pages the domain cannot; None: no spill. The store does not close it.
    """

    def __init__(self, domain: Domain, namespace: Namespace, *, page_bytes: int,
                 size_class: int = 0, max_batch: int = 64, acquire_wait_s: float = 0.25,
                 spill: Optional[Tier] = None) -> None:
        home = domain.home_arena
        if home is None:
            raise InvalidArgumentError(f"{domain!r} has no arena attached", operation="PageStore",
                                       hint="Domain.join(spec, host, arenas=[arena]) first")
        block = home.block_size(size_class)
        if not 0 < page_bytes <= block:
            raise InvalidArgumentError(
                f"page of {page_bytes} bytes does not fit a block of {block} bytes "
                f"(class {size_class} of {home!r})", operation="PageStore",
                hint="format the arena with a block size >= the page size")
        if max_batch <= 0:
            raise InvalidArgumentError("max_batch must be > 0", operation="PageStore",
                                       hint="e.g. 64")
        self.domain = domain
        self.namespace = namespace
        self.page_bytes = page_bytes
        self.size_class = size_class
        self.max_batch = max_batch
        self.acquire_wait_s = acquire_wait_s
        if spill is not None and (not isinstance(spill, Tier) or spill.block_size != page_bytes):
            have = spill.block_size if isinstance(spill, Tier) else type(spill).__name__
            raise InvalidArgumentError(
                f"the spill tier's blocks are {have} bytes, the store's pages {page_bytes}",
                operation="PageStore", subject=repr(spill),
                hint="open the tier over an arena size class whose block size is the page size "
                "(cxlkv.pool.layout_for_block_bytes(page_bytes) gives such a layout)")
        self.spill = spill
        self.mem_pool_host: Any = None
        self._closed = False

    def __repr__(self) -> str:
        return f"PageStore({self.namespace!r} on {self.domain!r})"

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ClosedError(f"{self!r} is closed", operation=what,
                              hint="create a new PageStore")
        self.domain._handle(what)

    def close(self) -> None:
        """Stops using the domain (the domain itself stays joined)."""
        self._closed = True

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """The host KV pool `batch_get_v1`/`batch_set_v1` copy into and out of."""
        for attr in ("page_size", "get_page_buffer_meta"):
            if not hasattr(mem_pool_host, attr):
                raise InvalidArgumentError(
                    f"{type(mem_pool_host).__name__} has no {attr}",
                    operation="register_mem_pool_host",
                    hint="pass SGLang's host pool or a cxlkv.HostPagePool")
        self.mem_pool_host = mem_pool_host

    # ---- keys -------------------------------------------------------------------------------

    def key(self, key: Any, what: str = "key") -> PrefixKey:
        """The prefix key of an engine page hash (hex str or bytes of 16/32 bytes)."""
        return key if isinstance(key, PrefixKey) else self.namespace.digest_key(
            digest_bytes(key, what))

    def _keys(self, keys: Sequence[Any], what: str) -> List[PrefixKey]:
        if isinstance(keys, (str, bytes)):
            raise InvalidArgumentError("keys must be a list of page hashes, not one hash",
                                       operation=what, hint="wrap a single key in a list")
        return [self.key(k, what) for k in keys]

    # ---- existence --------------------------------------------------------------------------

    def exists(self, key: Any) -> bool:
        """Whether the page is published in the domain (a lookup; no lease), or held by the
        spill tier."""
        self._check_open("exists")
        pk = self.key(key, "exists")
        if self.domain.lookup(self.namespace, pk) is not None:
            return True
        return self.spill is not None and self.spill.where(pk).held

    def batch_exists(self, keys: Sequence[Any], extra_info: Any = None) -> int:
        """The number of consecutive pages present from the start of `keys`."""
        self._check_open("batch_exists")
        pks = self._keys(keys, "batch_exists")
        held: Optional[List[bool]] = None
        for i, pk in enumerate(pks):
            if self.domain.lookup(self.namespace, pk) is not None:
                continue
            if self.spill is None:
                return i
            if held is None:  # one tier lookup for the rest of the keys
                held = [False] * i + [loc.residence.held for loc in self.spill.lookup(pks[i:])]
            if not held[i]:
                return i
        return len(pks)

    # ---- zero-copy batches through the host pool ----------------------------------------------

    def _page_segments(self, keys: Sequence[Any], host_indices: Any, what: str
                       ) -> Tuple[List[PrefixKey], List[Segments]]:
        self._check_open(what)
        pool = self.mem_pool_host
        if pool is None:
            raise InvalidArgumentError(f"{self!r} has no host pool", operation=what,
                                       hint="call register_mem_pool_host(host_pool) first")
        pks = self._keys(keys, what)
        idx = _indices_array(host_indices, what)
        if idx.size != len(pks) * pool.page_size:
            raise InvalidArgumentError(
                f"{len(pks)} keys need {len(pks) * pool.page_size} host indices "
                f"(page_size {pool.page_size}), got {idx.size}", operation=what,
                hint="pass page_size indices per key")
        if not pks:
            return [], []
        ptrs, sizes = page_buffer_meta(pool, host_indices)
        if len(ptrs) != len(sizes) or len(ptrs) % len(pks):
            raise InvalidArgumentError(
                f"the host pool gave {len(ptrs)} segments for {len(pks)} pages", operation=what,
                hint="the host pool must describe every page with the same number of segments")
        per = len(ptrs) // len(pks)
        segs: List[Segments] = []
        for p in range(len(pks)):
            s = [(int(ptrs[p * per + j]), int(sizes[p * per + j])) for j in range(per)]
            total = sum(n for _, n in s)
            if total != self.page_bytes:
                raise BufferMismatchError(
                    f"page {p} of the host pool is {total} bytes, the store's pages are "
                    f"{self.page_bytes}", operation=what, subject=repr(self),
                    hint="open the PageStore with page_bytes = the host pool's page size (all "
                    "layers, K and V)")
            segs.append(s)
        return pks, segs

    def batch_get_v1(self, keys: Sequence[Any], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        """Reads pages into the host pool at `host_indices`; one bool per key.

        Leases the leading run of present keys (in batches of ``max_batch``), copies each page
        (validated) into its host-pool segments, releases. A page that went stale during its
        copy is False (its host-pool bytes must not be used).
        """
        pks, segs = self._page_segments(keys, host_indices, "batch_get_v1")
        return self._read(pks, segs)

    def _read(self, pks: List[PrefixKey], segs: List[Segments]) -> List[bool]:
        """Reads the leading run of present pages: the domain's run, then the spill tier's,
        then the domain's again, until a page is in neither."""
        out = [False] * len(pks)
        i = 0
        while i < len(pks):
            j = self._read_domain(pks, segs, i, out)
            i += j
            if i >= len(pks) or self.spill is None:
                break
            m = self._read_spill(self.spill, pks, segs, i, out)
            i += m
            if j == 0 and m == 0:
                break
        return out

    def _read_domain(self, pks: List[PrefixKey], segs: List[Segments], start: int,
                     out: List[bool]) -> int:
        """Leases and copies the domain's leading run from `start`; how many were leased."""
        ok = chains.load_chain(self.domain, self.namespace, pks[start:], segs[start:],
                               max_batch=self.max_batch, wait_s=self.acquire_wait_s)
        out[start:start + len(ok)] = ok
        return len(ok)

    def _read_spill(self, spill: Tier, pks: List[PrefixKey], segs: List[Segments], start: int,
                    out: List[bool]) -> int:
        """Reads the spill tier's leading run from `start` (a use of each); how many it held."""
        run = spill.held_run(pks[start:])
        if run == 0:
            return 0
        keys = pks[start:start + run]
        spill.use(self.namespace, pks[:start + run], start)
        direct = all(len(sg) == 1 for sg in segs[start:start + run])
        if direct:  # one segment of page_bytes per page: read into the host pool itself
            dst: Any = [(ctypes.c_uint8 * sg[0][1]).from_address(sg[0][0])
                        for sg in segs[start:start + run]]
        else:
            dst = np.empty((run, self.page_bytes), np.uint8)
        res = spill.read(keys, dst, check=False)
        for k, r in enumerate(res):
            ok = isinstance(r, Residence)
            if ok and not direct:
                src, off = int(dst.ctypes.data) + k * self.page_bytes, 0
                for ptr, n in segs[start + k]:
                    ctypes.memmove(ptr, src + off, n)
                    off += n
            out[start + k] = ok
        return run

    def batch_set_v1(self, keys: Sequence[Any], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        """Stores the host-pool pages at `host_indices` under `keys`; one bool per key.

        Pages already published count as stored. Each page's parent is the page before it
        (the first page's: the last of ``extra_info.prefix_keys``, if given).
        """
        pks, segs = self._page_segments(keys, host_indices, "batch_set_v1")
        return self._write(pks, segs, self._prior(extra_info))

    def _prior(self, extra_info: Any) -> Optional[PrefixKey]:
        """The key of the page before the first: the last of ``extra_info.prefix_keys``.

        None there means no key, as SGLang means it: its controller passes ``prefix_keys=None``
        when it does not pass them, and ``HiCacheStorageExtraInfo``'s default is ``(None,)``
        from 0.5.4 to 0.5.9 (a typo for None, fixed after 0.5.9; docs/engines.md)."""
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        if prefix is None or all(k is None for k in prefix):
            return None
        return self.key(prefix[-1], "prefix_keys")

    def _write(self, pks: List[PrefixKey], segs: List[Segments],
               parent: Optional[PrefixKey]) -> List[bool]:
        res = chains.store_chain(self.domain, self.namespace, pks, segs, parent=parent,
                                 size_class=self.size_class)
        out = [i < res.stored for i in range(len(pks))]
        if res.stored < len(pks):
            # The arena or the request ring is full: this page and the rest are not stored in
            # the domain.
            return self._spill(pks, segs, res.stored, out)
        return out

    def _spill(self, pks: List[PrefixKey], segs: List[Segments], start: int,
               out: List[bool]) -> List[bool]:
        """Places pages[start:] in the spill tier, if there is one (a use of each): stored
        when the rule kept it in CXL or on NVMe (or the tier held it already)."""
        spill = self.spill
        if spill is None:
            return out
        rest = segs[start:]
        if all(len(sg) == 1 for sg in rest):
            data: Any = [(ctypes.c_uint8 * sg[0][1]).from_address(sg[0][0]) for sg in rest]
        else:
            data = np.empty((len(rest), self.page_bytes), np.uint8)
            base = int(data.ctypes.data)
            for k, sg in enumerate(rest):
                off = 0
                for ptr, n in sg:
                    ctypes.memmove(base + k * self.page_bytes + off, ptr, n)
                    off += n
        res = spill.place(self.namespace, pks, data, start, record_use=True, check=False)
        for k, r in enumerate(res):
            out[start + k] = isinstance(r, Residence) and r.held
        return out

    # ---- tensor API (SGLang's get/set/batch_get/batch_set) --------------------------------------

    def get(self, key: Any, target_location: Any = None, target_sizes: Any = None) -> Any:
        """Reads one page into `target_location` (a CPU tensor/array of ``page_bytes``); a new
        uint8 numpy array when None. Returns the target, or None if missing or stale."""
        self._check_open("get")
        pk = self.key(key, "get")
        if target_location is None:
            target_location = np.empty(self.page_bytes, dtype=np.uint8)
        ptr, _ = _buffers.address(target_location, writable=True, what="get target",
                                  nbytes=self.page_bytes)
        ok = self._read([pk], [[(ptr, self.page_bytes)]])[0]
        return target_location if ok else None

    def batch_get(self, keys: Sequence[Any], target_locations: Any = None,
                  target_sizes: Any = None) -> List[Any]:
        """:meth:`get` for each key (the leading run leased together)."""
        self._check_open("batch_get")
        pks = self._keys(keys, "batch_get")
        targets = list(target_locations) if target_locations is not None else [
            np.empty(self.page_bytes, dtype=np.uint8) for _ in pks]
        if len(targets) != len(pks):
            raise InvalidArgumentError(f"{len(pks)} keys but {len(targets)} targets",
                                       operation="batch_get", hint="pass one target per key")
        segs = [[(_buffers.address(t, writable=True, what=f"batch_get target {i}",
                                   nbytes=self.page_bytes)[0], self.page_bytes)]
                for i, t in enumerate(targets)]
        ok = self._read(pks, segs)
        return [t if g else None for t, g in zip(targets, ok)]

    def set(self, key: Any, value: Any = None, target_location: Any = None,
            target_sizes: Any = None, *, parent: Any = None) -> bool:
        """Stores one page (`value`: a CPU tensor/array of exactly ``page_bytes``)."""
        self._check_open("set")
        pk = self.key(key, "set")
        ptr, _ = _buffers.address(value, writable=False, what="set value", nbytes=self.page_bytes)
        par = self.key(parent, "set parent") if parent is not None else None
        return self._write([pk], [[(ptr, self.page_bytes)]], par)[0]

    def batch_set(self, keys: Sequence[Any], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Stores pages (each value exactly ``page_bytes``), chained in order; True if all
        were stored."""
        self._check_open("batch_set")
        pks = self._keys(keys, "batch_set")
        vals = list(values) if values is not None else []
        if len(vals) != len(pks):
            raise InvalidArgumentError(f"{len(pks)} keys but {len(vals)} values",
                                       operation="batch_set", hint="pass one value per key")
        segs = [[(_buffers.address(v, writable=False, what=f"batch_set value {i}",
                                   nbytes=self.page_bytes)[0], self.page_bytes)]
                for i, v in enumerate(vals)]
        return all(self._write(pks, segs, None))
