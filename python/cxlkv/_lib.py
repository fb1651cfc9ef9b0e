"""Loading libcxlkv.so and declaring its C API for ctypes (private to the package).

Where the library is looked for, in this order (the first that loads wins):

1. ``$CXLKV_LIBRARY`` — a path to ``libcxlkv.so.0`` (or any file of that library). When it is
   set nothing else is tried: an explicit choice that fails is an error, never a fallback.
2. Next to the package: ``cxlkv/libcxlkv.so.0`` (a wheel or a copy that bundles it).
3. Where ``cmake --install`` put it: ``cxlkv/_install_paths.py`` (written at install time)
   names the library relative to the package directory.
4. The soname, ``libcxlkv.so.0``, through the dynamic loader (``ldconfig`` paths,
   ``LD_LIBRARY_PATH``).
5. In a source tree (the package run from ``<tree>/python``): ``<tree>/build/<preset>/capi``,
   for the presets ``dev``, ``release``, then any other build directory.

The structs mirror ``include/cxlkv/cxlkv.h`` field by field; ``tests/test_abi.py`` checks
their sizes and offsets against the C compiler's (the ``cxlkv_abi_layout`` program).
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

from . import errors

SONAME = "libcxlkv.so.0"
MAX_CLASSES = 8
FORMAT_FORCE = 1

c_u8 = ctypes.c_uint8
c_u32 = ctypes.c_uint32
c_u64 = ctypes.c_uint64
c_i64 = ctypes.c_int64


class BlockRef(ctypes.Structure):
    _fields_ = [("arena_uuid", c_u8 * 16), ("index", c_u32), ("generation", c_u32)]


class KvLayoutC(ctypes.Structure):
    _fields_ = [
        ("layers", c_u32),
        ("kv_heads", c_u32),
        ("head_dim", c_u32),
        ("dtype_bytes", c_u32),
        ("tokens_per_block", c_u32),
        ("layer_separate", c_u32),
    ]


class ArenaOptionsC(ctypes.Structure):
    _fields_ = [
        ("layout", KvLayoutC),
        ("class_tokens", c_u32 * MAX_CLASSES),
        ("class_weights", c_u32 * MAX_CLASSES),
        ("owner_slots", c_u32),
        ("flags", c_u32),
    ]


class ClassStatsC(ctypes.Structure):
    _fields_ = [
        ("block_bytes", c_u64),
        ("total_blocks", c_u32),
        ("free_blocks", c_u32),
        ("cached_blocks", c_u32),
        ("allocated_blocks", c_u32),
        ("persisted_blocks", c_u32),
        ("largest_free_run", c_u32),
        ("allocs", c_u64),
        ("frees", c_u64),
        ("failed_allocs", c_u64),
    ]


class ArenaStatsC(ctypes.Structure):
    _fields_ = [
        ("arena_uuid", c_u8 * 16),
        ("region_bytes", c_u64),
        ("metadata_bytes", c_u64),
        ("owners_active", c_u32),
        ("class_count", c_u32),
        ("bad_frees", c_u64),
        ("classes", ClassStatsC * MAX_CLASSES),
    ]


class GeometryC(ctypes.Structure):
    _fields_ = [
        ("max_hosts", c_u32),
        ("index_entries", c_u32),
        ("lease_rows", c_u32),
        ("ring_slots", c_u32),
        ("lease_ttl_ms", c_u32),
        ("host_ttl_ms", c_u32),
        ("grace_ms", c_u32),
    ]


class PrefixKeyC(ctypes.Structure):
    _fields_ = [("lo", c_u64), ("hi", c_u64)]


class LmcacheKeyC(ctypes.Structure):
    _fields_ = [("chunk_hash_hex", ctypes.c_char_p), ("model_name", ctypes.c_char_p),
                ("kv_rank", c_i64), ("object_group_id", c_i64), ("cache_salt", ctypes.c_char_p)]


class PublishItemC(ctypes.Structure):
    _fields_ = [("key", PrefixKeyC), ("parent", PrefixKeyC), ("ref", BlockRef)]


class CopyOutItemC(ctypes.Structure):
    """``cxlkv_copy_out_item``: arena handle, lease address, offset, destination, length."""

    _fields_ = [("arena", ctypes.c_void_p), ("lease", ctypes.c_void_p), ("offset", c_u64),
                ("dst", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class PrefixHitC(ctypes.Structure):
    _fields_ = [("entry", c_u32), ("entry_gen", c_u32), ("ref", BlockRef), ("publisher", c_u32)]


class LeaseStatsC(ctypes.Structure):
    _fields_ = [(name, c_u64) for name in (
        "leases_refused_late", "leases_renewed_for_copy", "leases_retaken", "copies_retried",
        "copies_discarded", "pauses_detected", "rejoins_after_fence", "ack_waits")]


class LeaseC(ctypes.Structure):
    _fields_ = [
        ("row", c_u32),
        ("entry", c_u32),
        ("entry_gen", c_u32),
        ("ref", BlockRef),
        ("deadline_ms", c_i64),
        ("id", c_u64),
    ]


class TierOptionsC(ctypes.Structure):
    _fields_ = [
        ("size_class", c_u32),
        ("cxl_kind", c_u32),
        ("cxl_blocks", c_u64),
        ("nvme_dir", ctypes.c_char_p),
        ("nvme_blocks", c_u64),
        ("nvme_bytes", c_u64),
        ("config_path", ctypes.c_char_p),
        ("nvme_queue_depth", c_u32),
        ("flags", c_u32),
    ]


class TierRequestC(ctypes.Structure):
    _fields_ = [
        ("ns", c_u64),
        ("chain", ctypes.c_void_p),  # const cxlkv_prefix_key*
        ("n", ctypes.c_size_t),
        ("first", ctypes.c_size_t),
        ("tokens", c_u32),
        ("queue_depth", c_u32),
        ("pin", ctypes.c_int32),
        ("flags", c_u32),
    ]


class TierLocationC(ctypes.Structure):
    _fields_ = [
        ("residence", ctypes.c_int32),
        ("reserved", c_u32),
        ("addr", ctypes.c_void_p),
        ("ref", BlockRef),
    ]


TIER_CLAUSES = 6  # cxlkv_tier_stats.clauses


class TierStatsC(ctypes.Structure):
    _fields_ = [
        ("block_bytes", c_u64),
        ("cxl_capacity_blocks", c_u64),
        ("high_watermark_blocks", c_u64),
        ("low_watermark_blocks", c_u64),
        ("cxl_blocks", c_u64),
        ("nvme_blocks", c_u64),
        ("placed_cxl", c_u64),
        ("placed_nvme", c_u64),
        ("placed_dropped", c_u64),
        ("already_held", c_u64),
        ("nvme_write_failures", c_u64),
        ("demotions", c_u64),
        ("demotion_failures", c_u64),
        ("promotions", c_u64),
        ("promotion_failures", c_u64),
        ("promotions_refused", c_u64),
        ("prefetch_kept", c_u64),
        ("watermark_runs", c_u64),
        ("victims_dropped", c_u64),
        ("nvme_evicted", c_u64),
        ("dropped", c_u64),
        ("cxl_reads", c_u64),
        ("nvme_reads", c_u64),
        ("uses", c_u64),
        ("decisions", c_u64),
        ("from_prior", c_u64),
        ("from_ancestor", c_u64),
        ("clauses", c_u64 * TIER_CLAUSES),
        ("nvme_file_bytes", c_u64),
        ("nvme_data_loss", c_u64),
        ("retention_s", ctypes.c_double),
        ("break_even_s", ctypes.c_double),
    ]


# Every struct the ABI test compares with the C compiler's layout.
STRUCTS = {
    "cxlkv_block_ref": BlockRef,
    "cxlkv_kv_layout": KvLayoutC,
    "cxlkv_arena_options": ArenaOptionsC,
    "cxlkv_class_stats": ClassStatsC,
    "cxlkv_arena_stats": ArenaStatsC,
    "cxlkv_domain_geometry": GeometryC,
    "cxlkv_prefix_key": PrefixKeyC,
    "cxlkv_lmcache_key": LmcacheKeyC,
    "cxlkv_prefix_hit": PrefixHitC,
    "cxlkv_publish_item": PublishItemC,
    "cxlkv_copy_out_item": CopyOutItemC,
    "cxlkv_lease": LeaseC,
    "cxlkv_lease_stats": LeaseStatsC,
    "cxlkv_tier_options": TierOptionsC,
    "cxlkv_tier_request": TierRequestC,
    "cxlkv_tier_location": TierLocationC,
    "cxlkv_tier_stats": TierStatsC,
}

_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_INT = ctypes.c_int
_SIZE = ctypes.c_size_t

# name: (restype, argtypes). Pointers to structs the package builds itself are declared as
# c_void_p where the hot path passes addresses (leases, keys), so no ctypes pointer object is
# built per call.
_PROTOTYPES = {
    "cxlkv_pool_open": (_INT, [ctypes.c_char_p, _PP]),
    "cxlkv_pool_close": (None, [_P]),
    "cxlkv_arena_create": (_INT, [_P, ctypes.POINTER(ArenaOptionsC), _PP]),
    "cxlkv_arena_open": (_INT, [_P, ctypes.POINTER(KvLayoutC), _PP]),
    "cxlkv_arena_close": (None, [_P]),
    "cxlkv_block_size": (c_u64, [_P, c_u32]),
    "cxlkv_alloc": (_INT, [_P, c_u32, ctypes.POINTER(BlockRef), _PP]),
    "cxlkv_free": (_INT, [_P, ctypes.POINTER(BlockRef)]),
    "cxlkv_block_persist": (_INT, [_P, ctypes.POINTER(BlockRef)]),
    "cxlkv_ref_to_addr": (_INT, [_P, ctypes.POINTER(BlockRef), _PP]),
    "cxlkv_arena_stats_get": (_INT, [_P, ctypes.POINTER(ArenaStatsC)]),
    "cxlkv_copy_to_block": (None, [_P, _P, _SIZE]),
    "cxlkv_domain_bytes": (c_u64, [ctypes.POINTER(GeometryC)]),
    "cxlkv_domain_format": (_INT, [ctypes.c_char_p, ctypes.POINTER(GeometryC)]),
    "cxlkv_domain_join": (_INT, [ctypes.c_char_p, c_u32, _PP]),
    "cxlkv_domain_leave": (None, [_P]),
    "cxlkv_domain_grow": (_INT, [_P, ctypes.POINTER(ArenaOptionsC), _PP]),
    "cxlkv_domain_shrink": (_INT, [_P, _P]),
    "cxlkv_domain_heartbeat": (_INT, [_P, _P, ctypes.POINTER(_SIZE)]),
    "cxlkv_domain_lease_stats": (_INT, [_P, ctypes.POINTER(LeaseStatsC)]),
    "cxlkv_namespace": (c_u64, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]),
    "cxlkv_prefix_key_chain": (PrefixKeyC, [c_u64, _P, _P, _SIZE]),
    "cxlkv_prefix_key_from_digest": (_INT, [c_u64, _P, _P, _SIZE, _P]),
    "cxlkv_prefix_key_from_name": (_INT, [c_u64, _P, _SIZE, _P]),
    "cxlkv_lmcache_index_key": (_INT, [ctypes.c_char_p, ctypes.c_char_p,
                                       ctypes.POINTER(LmcacheKeyC), ctypes.POINTER(c_u64),
                                       ctypes.POINTER(PrefixKeyC)]),
    "cxlkv_lmcache_index_name": (_INT, [ctypes.POINTER(LmcacheKeyC), ctypes.c_char_p, _SIZE,
                                        ctypes.POINTER(_SIZE)]),
    "cxlkv_region_object": (_INT, [_P, ctypes.POINTER(c_u64), ctypes.POINTER(c_u64),
                                   ctypes.POINTER(c_u64), ctypes.POINTER(c_u32)]),
    "cxlkv_lease_copy_out_region": (_INT, [_P, _P, _P, c_u64, c_u64, _P, _SIZE]),
    "cxlkv_prefix_lookup": (_INT, [_P, c_u64, _P, ctypes.POINTER(PrefixHitC)]),
    "cxlkv_prefix_publish": (_INT, [_P, c_u64, _P, _P, _P, ctypes.POINTER(BlockRef)]),
    "cxlkv_prefix_publish_chain": (_INT, [_P, c_u64, ctypes.POINTER(PublishItemC), _SIZE, _P,
                                          c_u32]),
    "cxlkv_prefix_retire": (_INT, [_P, c_u64, _P]),
    "cxlkv_lease_acquire": (_INT, [_P, ctypes.POINTER(PrefixHitC), _P]),
    "cxlkv_lease_acquire_chain": (_INT, [_P, c_u64, _P, _SIZE, _P, ctypes.POINTER(_SIZE)]),
    "cxlkv_lease_release_many": (_INT, [_P, _P, _SIZE]),
    "cxlkv_lease_renew": (_INT, [_P, _P]),
    "cxlkv_lease_release": (_INT, [_P, _P]),
    "cxlkv_lease_validate": (_INT, [_P, _P]),
    "cxlkv_lease_copy_out": (_INT, [_P, _P, _P, c_u64, _P, _SIZE]),
    "cxlkv_lease_copy_out_many": (_INT, [_P, _P, _SIZE, _P]),
    "cxlkv_block_invalidate": (_INT, [_P, _P, _P, c_u64, _SIZE, _PP]),
    "cxlkv_directory_where": (_INT, [ctypes.c_char_p, _P, _P, _SIZE, ctypes.POINTER(_SIZE)]),
    "cxlkv_owner_open": (_INT, [ctypes.c_char_p, _PP]),
    "cxlkv_owner_step": (None, [_P]),
    "cxlkv_owner_close": (None, [_P]),
    "cxlkv_gpu_open": (_INT, [_INT, _PP]),
    "cxlkv_gpu_close": (None, [_P]),
    "cxlkv_tier_open": (_INT, [_P, ctypes.POINTER(TierOptionsC), _PP]),
    "cxlkv_tier_close": (None, [_P]),
    "cxlkv_tier_block_size": (c_u64, [_P]),
    "cxlkv_tier_use": (_INT, [_P, ctypes.POINTER(TierRequestC)]),
    "cxlkv_tier_place": (_INT, [_P, ctypes.POINTER(TierRequestC), _P, _SIZE, _P]),
    "cxlkv_tier_place_blocks": (_INT, [_P, ctypes.POINTER(TierRequestC), _P, _P]),
    "cxlkv_tier_lookup": (_INT, [_P, _P, _SIZE, _P]),
    "cxlkv_tier_acquire": (_INT, [_P, _P, _PP, ctypes.POINTER(BlockRef)]),
    "cxlkv_tier_release": (_INT, [_P, _P]),
    "cxlkv_tier_read": (_INT, [_P, _P, _SIZE, _P, _SIZE, _P]),
    "cxlkv_tier_prefetch": (_INT, [_P, ctypes.POINTER(TierRequestC), ctypes.POINTER(c_u64)]),
    "cxlkv_tier_prefetch_poll": (_INT, [_P, c_u64, _P]),
    "cxlkv_tier_prefetch_wait": (_INT, [_P, c_u64, _P]),
    "cxlkv_tier_demote": (_INT, [_P, _P, _SIZE, _P]),
    "cxlkv_tier_drop": (_INT, [_P, _P, _SIZE, _P]),
    "cxlkv_tier_explain": (_INT, [_P, _P, c_u32, _P, _SIZE, ctypes.POINTER(_SIZE)]),
    "cxlkv_tier_stats_get": (_INT, [_P, ctypes.POINTER(TierStatsC)]),
    "cxlkv_strerror": (ctypes.c_char_p, [_INT]),
    "cxlkv_last_error": (ctypes.c_char_p, []),
}


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


class Library:
    """The loaded library: its functions as attributes, and where it came from."""

    def __init__(self, cdll: ctypes.CDLL, how: str) -> None:
        self.cdll = cdll
        self.how = how  # which rule of the search order found it
        missing = [n for n in _PROTOTYPES if not hasattr(cdll, n)]
        path = _loaded_path(cdll, "cxlkv_pool_open") or str(cdll._name)
        if missing:
            raise errors.LibraryNotFoundError(
                f"{path} lacks {', '.join(missing)}",
                operation="load libcxlkv",
                hint="it is older than this package: rebuild and install libcxlkv from the same "
                "tree (cmake --build <build> --target cxlkv), or point CXLKV_LIBRARY at a "
                "matching build",
            )
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(cdll, name)
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)
        self.path = path
        self.realpath = os.path.realpath(path)

    def __getattr__(self, name: str) -> Any:
        # The C functions are set as attributes in __init__ (from _PROTOTYPES); this only
        # runs for a name that is not one of them, and tells type checkers they exist.
        raise AttributeError(f"libcxlkv has no function {name} in this binding")

    @property
    def version(self) -> str:
        """The library's version, from its file name (``libcxlkv.so.X.Y.Z``).

        The C API has no version function; the installed file carries the project version
        (CMake's VERSION property), the soname the ABI major.
        """
        m = re.search(r"libcxlkv\.so\.(\d+(?:\.\d+)*)$", self.realpath)
        return m.group(1) if m else "unknown"

    def last_error(self) -> str:
        msg = self.cxlkv_last_error()
        return msg.decode("utf-8", "replace") if msg else ""

    def strerror(self, code: int) -> str:
        msg = self.cxlkv_strerror(code)
        return msg.decode("utf-8", "replace") if msg else f"code {code}"


def _loaded_path(cdll: ctypes.CDLL, symbol: str) -> Optional[str]:
    """The file the dynamic loader mapped for `cdll` (dladdr on one of its functions)."""
    try:
        libdl = ctypes.CDLL(None)
        dladdr = libdl.dladdr
    except (OSError, AttributeError):
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    addr = ctypes.cast(getattr(cdll, symbol), ctypes.c_void_p).value
    if not dladdr(addr, ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.fsdecode(info.dli_fname)


def _candidates() -> Iterator[Tuple[str, str]]:
    here = Path(__file__).resolve().parent
    yield "next to the package", str(here / SONAME)
    try:
        from . import _install_paths  # type: ignore[attr-defined]  # written by cmake --install

        rel = getattr(_install_paths, "LIBRARY_RELATIVE_TO_PACKAGE", None)
        if rel:
            yield "cmake --install", os.path.normpath(str(here / rel))
    except ImportError:
        pass
    yield "soname (dynamic loader)", SONAME
    tree = here.parent.parent
    if here.parent.name == "python" and (tree / "include" / "cxlkv" / "cxlkv.h").is_file():
        build = tree / "build"
        seen = []
        for preset in ("dev", "release"):
            seen.append(build / preset)
        if build.is_dir():
            seen += sorted(p for p in build.iterdir() if p.is_dir() and p not in seen)
        for b in seen:
            lib = b / "capi" / SONAME
            if lib.exists():
                yield f"source tree ({b.name} build)", str(lib)


_LIB: Optional[Library] = None


def load() -> Library:
    """The library, loaded on first use (see the module docstring for the search order)."""
    global _LIB
    if _LIB is not None:
        return _LIB
    env = os.environ.get("CXLKV_LIBRARY")
    if env:
        try:
            _LIB = Library(ctypes.CDLL(env), "CXLKV_LIBRARY")
        except OSError as e:
            raise errors.LibraryNotFoundError(
                f"CXLKV_LIBRARY={env}: {e}",
                operation="load libcxlkv",
                hint="point CXLKV_LIBRARY at a built libcxlkv.so.0, or unset it to search the "
                "usual places",
            ) from None
        return _LIB
    tried: List[str] = []
    for how, path in _candidates():
        if os.sep in path and not os.path.exists(path):
            continue
        try:
            _LIB = Library(ctypes.CDLL(path), how)
            return _LIB
        except OSError as e:
            tried.append(f"{path} ({how}): {e}")
    raise errors.LibraryNotFoundError(
        "libcxlkv.so.0 not found; tried: " + ("; ".join(tried) if tried else SONAME),
        operation="load libcxlkv",
        hint="build it (cmake --build build/dev --target cxlkv) and set "
        "CXLKV_LIBRARY=<build>/capi/libcxlkv.so.0, or install it (cmake --install)",
    )


def check(lib: Library, rc: int, operation: str, subject: object,
          hint: Optional[str] = None) -> None:
    """Raises the exception for a non-zero return code, with the library's message (and
    `hint`, else the code's default, as what to do). `subject` names the object: a str, or
    an object whose repr() does (computed only on failure: this runs on every call)."""
    if rc != 0:
        raise errors.from_code(rc, lib.last_error() or lib.strerror(rc), operation=operation,
                               subject=subject if isinstance(subject, str) else repr(subject),
                               hint=hint)
