"""Namespaces and prefix keys.

A :class:`Namespace` binds tenant, model and KV layout (``cxlkv_namespace``): lookups never
cross namespaces, so everything that changes the bytes of a block — model, dtype, tensor
parallel rank and size, page size, layout — belongs in it. It is a correctness boundary, not
a security one (docs/coherence.md, "Keys").

A :class:`PrefixKey` (128 bits) names one block. There are two ways to get one:

* from token ids, chained on the parent block's key: :meth:`Namespace.chain_key` and
  :meth:`Namespace.chain_keys` (``cxlkv_prefix_key_chain``: XXH3-128 of namespace, parent key
  and the block's token ids) — what the C tools and benchmarks use;
* from an engine's own chained page digest: :meth:`Namespace.digest_key`, or
  :func:`key_from_digest` for a raw namespace id (``cxlkv_prefix_key_from_digest``: XXH3-128
  with its own seed over the namespace, the parent key and the digest; the format is frozen
  in C and pinned by golden values in ``tests/capi_tier_test.c`` and ``python/tests``).
  SGLang's page hash (SHA-256 over the prior hash and the page's tokens, 32 bytes) and vLLM's
  block hash (32 bytes for sha256, 16 for a 128-bit hash) already identify a whole prefix, so
  the engine stores key a page by its digest alone (no parent): a single key can be looked up
  without its parents, and a C program, the tier (:mod:`cxlkv.tier`) and Python derive the
  same key from the same ``(namespace, digest)``. A chain whose digests are *not* chained
  (one per block's content only) passes the previous key as ``parent``
  (:meth:`Namespace.digest_chain`). A KV cache group other than 0 (vLLM's group index:
  another set of layers, other bytes for the same tokens) derives its keys in the namespace
  :meth:`Namespace.group` names, so equal digests of two groups are two keys.

  Keys derived by earlier versions of this package (a token chain over a "DGST"-tagged word
  list) differ from these: blocks published under them are not found under the new keys.

Keys that leave a domain (KV events, the directory's summary) are keyed with the domain's
publish secret unless it opts out (``keys.unkeyed``): its own, which ``cxlkvctl publish-key``
writes to a file, or ``keys.publish_file``'s (docs/kv_events.md, "What a subscriber can
learn"): :func:`published_key` turns a chain key into the key a router sees, so a router
that holds the secret matches events and the directory with its own keys; without the secret
nobody can.

Keys are plain values: hashable, comparable, safe to share between threads and processes
(``bytes(key)`` is 16 bytes, little-endian ``lo`` then ``hi``).
"""

from __future__ import annotations

import hashlib
import hmac

import ctypes
from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Sequence, Union

import numpy as np

from . import _lib
from .errors import InvalidArgumentError, KeyLengthError

DIGEST_LENGTHS = (16, 32)


@dataclass(frozen=True)
class PrefixKey:
    """The 128-bit key of one KV block."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not (0 <= self.lo < 1 << 64 and 0 <= self.hi < 1 << 64):
            raise KeyLengthError(
                f"PrefixKey(lo={self.lo:#x}, hi={self.hi:#x}) has a word outside 0..2^64-1",
                operation="PrefixKey", hint="build keys with Namespace.chain_key or digest_key")

    def __bytes__(self) -> bytes:
        return self.lo.to_bytes(8, "little") + self.hi.to_bytes(8, "little")

    @classmethod
    def from_bytes(cls, b: bytes) -> "PrefixKey":
        """The key whose ``bytes()`` is `b` (16 bytes)."""
        if len(b) != 16:
            raise KeyLengthError(f"a PrefixKey is 16 bytes, got {len(b)}",
                                 operation="PrefixKey.from_bytes",
                                 hint="pass bytes(key) of a PrefixKey; for an engine digest use "
                                 "Namespace.digest_key")
        return cls(int.from_bytes(b[:8], "little"), int.from_bytes(b[8:], "little"))

    def hex(self) -> str:
        """The 16 bytes of ``bytes(key)`` (low word first, little-endian) in hex: a wire form,
        not the text form; ``str(key)`` is what the library, its logs and cxlkvctl print."""
        return bytes(self).hex()

    @classmethod
    def parse(cls, text: str) -> "PrefixKey":
        """The key ``str(key)`` printed: 32 hex digits, the high word first (an optional
        ``0x``), as cxlkvctl, the orchestrator and every log print keys (coherence::ParseKey)."""
        t = text[2:] if text[:2] in ("0x", "0X") else text
        if len(t) != 32 or any(c not in "0123456789abcdefABCDEF" for c in t):
            raise InvalidArgumentError(
                f"key {text!r} is not 32 hex digits",
                operation="PrefixKey.parse",
                hint="a key is 32 hex digits, the high word first (as cxlkvctl and the logs "
                "print it)")
        return cls(int(t[16:], 16), int(t[:16], 16))

    def to_c(self) -> _lib.PrefixKeyC:
        return _lib.PrefixKeyC(self.lo, self.hi)

    def __str__(self) -> str:
        """The one text form of a key (coherence::FormatKey): 32 hex digits, high word first."""
        return f"{self.hi:016x}{self.lo:016x}"

    def __repr__(self) -> str:
        return f"PrefixKey({self})"


def keys_to_c(keys: Sequence[PrefixKey]) -> "ctypes.Array[_lib.PrefixKeyC]":
    """An array of C keys (what cxlkv_lease_acquire_chain takes)."""
    arr = (_lib.PrefixKeyC * len(keys))()
    for i, k in enumerate(keys):
        if not isinstance(k, PrefixKey):
            raise InvalidArgumentError(
                f"keys[{i}] is a {type(k).__name__}, not a PrefixKey",
                operation="keys", hint="build keys with Namespace.chain_key or digest_key")
        arr[i].lo = k.lo
        arr[i].hi = k.hi
    return arr


TokenIds = Union[Sequence[int], np.ndarray, Any]


def _tokens_u32(tokens: TokenIds, what: str) -> np.ndarray:
    if hasattr(tokens, "detach") and hasattr(tokens, "numpy"):  # a torch tensor
        tokens = tokens.detach().cpu().numpy()
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise InvalidArgumentError(f"{what}: token ids must be one-dimensional, got shape "
                                   f"{arr.shape}", operation="chain_key",
                                   hint="pass one block's token ids as a flat list or array")
    if arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0 or int(arr.max()) >= 1 << 32):
        raise InvalidArgumentError(f"{what}: token ids must be integers in 0..2^32-1",
                                   operation="chain_key", hint="pass the tokenizer's ids")
    return np.ascontiguousarray(arr, dtype=np.uint32)


class Namespace:
    """A tenant + model + KV layout; every key lives in one.

    Args:
        tenant, model, kv_layout: free-form names; equal names give the equal namespace id on
            every host and process. Put everything that changes a block's bytes in them (e.g.
            ``kv_layout="bf16 L80 H8 D128 page16 tp0/8"``).
    """

    def __init__(self, tenant: str, model: str, kv_layout: str) -> None:
        for name, v in (("tenant", tenant), ("model", model), ("kv_layout", kv_layout)):
            if not isinstance(v, str):
                raise InvalidArgumentError(f"{name} must be a str, got {type(v).__name__}",
                                           operation="Namespace", hint="pass names as str")
            if "\0" in v:
                raise InvalidArgumentError(f"{name} {v!r} contains a NUL byte",
                                           operation="Namespace",
                                           hint="the C API takes NUL-terminated names")
        self.tenant, self.model, self.kv_layout = tenant, model, kv_layout
        lib = _lib.load()
        self.id: int = int(lib.cxlkv_namespace(tenant.encode(), model.encode(),
                                               kv_layout.encode()))

    def __repr__(self) -> str:
        return (f"Namespace({self.tenant!r}, {self.model!r}, {self.kv_layout!r}, "
                f"id={self.id:#018x})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Namespace) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    # ---- keys from token ids ----------------------------------------------------------------

    def chain_key(self, tokens: TokenIds, parent: Optional[PrefixKey] = None) -> PrefixKey:
        """The key of a block holding `tokens`, chained on `parent` (None for the first)."""
        arr = _tokens_u32(tokens, "chain_key")
        return self._chain(arr.ctypes.data, arr.size, parent)

    def chain_keys(self, tokens: TokenIds, tokens_per_block: int,
                   parent: Optional[PrefixKey] = None) -> List[PrefixKey]:
        """Keys of the full blocks of a token sequence, each chained on the one before.

        A trailing partial block gets no key (it is not shareable until full).
        """
        if tokens_per_block <= 0:
            raise InvalidArgumentError(f"tokens_per_block must be > 0, got {tokens_per_block}",
                                       operation="chain_keys",
                                       hint="pass the arena layout's tokens_per_block")
        arr = _tokens_u32(tokens, "chain_keys")
        keys: List[PrefixKey] = []
        base = arr.ctypes.data
        for i in range(arr.size // tokens_per_block):
            parent = self._chain(base + 4 * i * tokens_per_block, tokens_per_block, parent)
            keys.append(parent)
        return keys

    def _chain(self, addr: int, n: int, parent: Optional[PrefixKey]) -> PrefixKey:
        lib = _lib.load()
        pc = parent.to_c() if parent is not None else None
        k = lib.cxlkv_prefix_key_chain(self.id, ctypes.addressof(pc) if pc is not None else None,
                                       addr if n else None, n)
        return PrefixKey(int(k.lo), int(k.hi))

    # ---- keys from engine digests -----------------------------------------------------------

    def group(self, group: int) -> "Namespace":
        """The namespace a KV cache group's digest keys are derived in: this one for group 0,
        else ``Namespace(tenant, model, f"{kv_layout} kv-group {group}")`` (what a C program
        passes to ``cxlkv_namespace`` to derive the same keys)."""
        if not isinstance(group, int) or not 0 <= group < 1 << 32:
            raise KeyLengthError(f"group {group!r} is outside 0..2^32-1",
                                 operation="Namespace.group",
                                 hint="pass the engine's KV cache group index")
        if group == 0:
            return self
        return Namespace(self.tenant, self.model, f"{self.kv_layout} kv-group {group}")

    def digest_key(self, digest: Union[bytes, bytearray, memoryview, str], group: int = 0,
                   parent: Optional[PrefixKey] = None) -> PrefixKey:
        """The key of the block an engine names by `digest` (its chained page/block hash):
        ``cxlkv_prefix_key_from_digest(ns, parent, digest)`` with ``ns`` the id of
        :meth:`group` (this namespace's for group 0).

        Args:
            digest: 16 or 32 bytes (a 128- or 256-bit hash), or the same as a hex string
                (SGLang's ``get_hash_str`` output), passed to C as raw bytes.
            group: the KV cache group (vLLM's group index), 0..2^32-1.
            parent: the previous block's key for digests that are not chained already; None
                (the engine stores' choice) keys a block by its digest alone.

        Raises:
            KeyLengthError: another length, a string that is not hex, a group out of range.
        """
        raw = digest_bytes(digest, "digest_key")
        ns = self.group(group) if group else self
        return key_from_digest(ns.id, raw, parent)

    def digest_chain(self, digests: Iterable[Union[bytes, bytearray, memoryview, str]],
                     parent: Optional[PrefixKey] = None, group: int = 0) -> List[PrefixKey]:
        """Keys of a sequence of blocks from per-block digests, each chained on the key
        before (the first on `parent`), as ``cxlkv_prefix_key_from_digest`` chains them in C
        (``docs/tier-capi.md``'s example)."""
        ns = self.group(group) if group else self
        keys: List[PrefixKey] = []
        for i, d in enumerate(digests):
            parent = key_from_digest(ns.id, digest_bytes(d, f"digest_chain[{i}]"), parent)
            keys.append(parent)
        return keys


def key_from_digest(ns_id: int, digest: Union[bytes, bytearray, memoryview],
                    parent: Optional[PrefixKey] = None) -> PrefixKey:
    """``cxlkv_prefix_key_from_digest(ns_id, parent, digest)``: the key C derives from a raw
    namespace id (``Namespace.id``, or ``cxlkv_namespace``'s result), an optional parent key
    and a 16- or 32-byte digest. Equal inputs give equal keys in every process, host and
    library version.

    Raises:
        KeyLengthError: a digest of another length (checked here and by the library).
        InvalidArgumentError: a namespace id outside 0..2^64-1 or a parent that is not a
            PrefixKey.
    """
    if not isinstance(ns_id, int) or not 0 <= ns_id < 1 << 64:
        raise InvalidArgumentError(f"namespace id {ns_id!r} is outside 0..2^64-1",
                                   operation="key_from_digest",
                                   hint="pass Namespace(...).id")
    if parent is not None and not isinstance(parent, PrefixKey):
        raise InvalidArgumentError(f"parent is a {type(parent).__name__}, not a PrefixKey",
                                   operation="key_from_digest",
                                   hint="pass the previous block's key, or None for the first")
    raw = digest_bytes(digest, "key_from_digest")
    lib = _lib.load()
    pc = parent.to_c() if parent is not None else None
    out = _lib.PrefixKeyC()
    buf = ctypes.create_string_buffer(raw, len(raw))
    rc = lib.cxlkv_prefix_key_from_digest(ns_id, ctypes.addressof(pc) if pc is not None else None,
                                          buf, len(raw), ctypes.byref(out))
    if rc:
        raise KeyLengthError(lib.last_error() or lib.strerror(rc),
                             operation="cxlkv_prefix_key_from_digest", code=rc,
                             hint="pass the engine's 128- or 256-bit page hash as raw bytes")
    return PrefixKey(int(out.lo), int(out.hi))


def key_from_name(ns_id: int, name: Union[bytes, str]) -> PrefixKey:
    """``cxlkv_prefix_key_from_name(ns_id, name)``: the key of an object named by itself rather
    than by a place in a token chain (an LMCache object in the domain's index:
    :func:`lmcache_index_name`). A frozen format, equal in every process and host.

    Raises:
        InvalidArgumentError: a namespace id outside 0..2^64-1, or a name that is neither bytes
            nor str.
    """
    if not isinstance(ns_id, int) or not 0 <= ns_id < 1 << 64:
        raise InvalidArgumentError(f"namespace id {ns_id!r} is outside 0..2^64-1",
                                   operation="key_from_name", hint="pass Namespace(...).id")
    if isinstance(name, str):
        name = name.encode()
    if not isinstance(name, (bytes, bytearray)):
        raise InvalidArgumentError(f"name is a {type(name).__name__}, not bytes or str",
                                   operation="key_from_name", hint="pass the object's name")
    lib = _lib.load()
    out = _lib.PrefixKeyC()
    buf = ctypes.create_string_buffer(bytes(name), len(name))
    lib.cxlkv_prefix_key_from_name(ns_id, buf, len(name), ctypes.byref(out))
    return PrefixKey(int(out.lo), int(out.hi))


def _lmcache_key(operation: str, chunk_hash_hex: str, model_name: str, kv_rank: int,
                 object_group_id: int, cache_salt: str) -> Any:
    """An LMCache object key as the C struct (``cxlkv_lmcache_key``), its strings UTF-8. The
    library checks LMCache's rules; here only what C cannot carry: a NUL in a string, an
    integer outside int64."""
    fields = {}
    for field, value in (("chunk_hash_hex", chunk_hash_hex), ("model_name", model_name),
                         ("cache_salt", cache_salt)):
        if not isinstance(value, str):
            raise InvalidArgumentError(f"{field} is a {type(value).__name__}, not a str",
                                       operation=operation,
                                       hint="pass the EncodedObjectKey's fields as LMCache has "
                                       "them")
        if "\0" in value:
            raise InvalidArgumentError(f"{field} {value[:80]!r} contains a NUL character",
                                       operation=operation,
                                       hint="LMCache's keys hold no NUL; pass the key unchanged")
        fields[field] = value.encode()
    ints = {}
    for field, value in (("kv_rank", kv_rank), ("object_group_id", object_group_id)):
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"{field} {value!r} is not an integer",
                                       operation=operation, hint="pass an int") from None
        if not -(1 << 63) <= n < 1 << 63:
            raise InvalidArgumentError(f"{field} {n} is outside the 64-bit signed range",
                                       operation=operation,
                                       hint="LMCache's coordinator holds it as an int64")
        ints[field] = n
    return _lib.LmcacheKeyC(fields["chunk_hash_hex"], fields["model_name"], ints["kv_rank"],
                            ints["object_group_id"], fields["cache_salt"])


def lmcache_index_name(chunk_hash_hex: str, model_name: str, kv_rank: int,
                       object_group_id: int = 0, cache_salt: str = "") -> bytes:
    """The name an LMCache object has in a cxlkv domain's prefix index (docs/lmcache.md "Keys
    in the domain's index"): its EncodedObjectKey's fields, integers in decimal, joined by
    0x1F, as the coordinator computes it (``cxlkv_lmcache_index_name``). Its key is
    ``key_from_name(Namespace(tenant, "lmcache", layout_id).id, name)``, or
    :func:`lmcache_index_key`.

    Raises:
        InvalidArgumentError: naming the field, for a key LMCache refuses (chunk_hash_hex not
            lower-case hex of an even length, '@' in model_name, a negative object_group_id,
            '@', '/' or '\\' in cache_salt or more than 128 characters), a NUL in a string, an
            integer outside int64 or a field of another type.
    """
    op = "lmcache_index_name"
    key = _lmcache_key(op, chunk_hash_hex, model_name, kv_rank, object_group_id, cache_salt)
    lib = _lib.load()
    needed = ctypes.c_size_t(0)
    rc = lib.cxlkv_lmcache_index_name(ctypes.byref(key), None, 0, ctypes.byref(needed))
    if rc == 0:
        buf = ctypes.create_string_buffer(needed.value)
        rc = lib.cxlkv_lmcache_index_name(ctypes.byref(key), buf, needed.value, None)
    if rc:
        raise InvalidArgumentError(lib.last_error() or lib.strerror(rc),
                                   operation=op, code=rc,
                                   hint="pass the object's key as LMCache sent it")
    return buf.raw[:needed.value - 1]


def lmcache_index_key(tenant: str, layout_id: str, chunk_hash_hex: str, model_name: str,
                      kv_rank: int, object_group_id: int = 0, cache_salt: str = "") -> PrefixKey:
    """The key an LMCache object of `tenant` has in a cxlkv domain's prefix index, in the
    namespace ``Namespace(tenant, "lmcache", layout_id)`` (layout_id: the domain's [lmcache]
    layout_id), as the coordinator publishes it (``cxlkv_lmcache_index_key``).

    Raises:
        InvalidArgumentError: as :func:`lmcache_index_name`, or a tenant or layout_id that is
            not a str without NUL.
    """
    op = "lmcache_index_key"
    key = _lmcache_key(op, chunk_hash_hex, model_name, kv_rank, object_group_id, cache_salt)
    names = []
    for field, value in (("tenant", tenant), ("layout_id", layout_id)):
        if not isinstance(value, str) or "\0" in value:
            raise InvalidArgumentError(f"{field} {value!r} is not a str without NUL",
                                       operation=op, hint="pass the tenant's and the domain's "
                                       "[lmcache] layout_id names")
        names.append(value.encode())
    lib = _lib.load()
    out = _lib.PrefixKeyC()
    rc = lib.cxlkv_lmcache_index_key(names[0], names[1], ctypes.byref(key), None,
                                     ctypes.byref(out))
    if rc:
        raise InvalidArgumentError(lib.last_error() or lib.strerror(rc),
                                   operation=op, code=rc,
                                   hint="pass the object's key as LMCache sent it")
    return PrefixKey(int(out.lo), int(out.hi))


def digest_bytes(digest: Union[bytes, bytearray, memoryview, str], what: str) -> bytes:
    """An engine digest as bytes (16 or 32), from bytes or a hex string."""
    if isinstance(digest, str):
        try:
            raw = bytes.fromhex(digest)
        except ValueError:
            raise KeyLengthError(
                f"key {digest[:80]!r} is not a hex digest", operation=what,
                hint="pass the engine's page hash unchanged (hex of 16 or 32 bytes), or its bytes",
            ) from None
    elif isinstance(digest, (bytes, bytearray, memoryview)):
        raw = bytes(digest)
    else:
        raise KeyLengthError(f"key of type {type(digest).__name__}", operation=what,
                             hint="pass the engine's digest as bytes or a hex string")
    if len(raw) not in DIGEST_LENGTHS:
        raise KeyLengthError(
            f"digest of {len(raw)} bytes ({raw[:8].hex()}…): expected 16 or 32 bytes",
            operation=what,
            hint="pass the engine's 128- or 256-bit page hash itself, without suffixes (put "
            "model, rank and layout in the Namespace instead)",
        )
    return raw


def parse_keys(keys: Iterable[Any], ns: Namespace, what: str) -> List[PrefixKey]:
    """PrefixKeys from PrefixKey objects or engine digests (bytes or hex)."""
    out: List[PrefixKey] = []
    for k in keys:
        out.append(k if isinstance(k, PrefixKey) else ns.digest_key(digest_bytes(k, what)))
    return out


PUBLISH_SECRET_MIN = 16
_PUBLISHED_LABEL = b"cxlkv published key v1\0"
_KEY_ID_LABEL = b"cxlkv key id v1\0"


def _secret_bytes(secret: Union[bytes, str], what: str) -> bytes:
    b = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if len(b) < PUBLISH_SECRET_MIN:
        raise InvalidArgumentError(
            f"{what}: a publish secret must have at least {PUBLISH_SECRET_MIN} bytes "
            f"(it has {len(b)})", operation=what,
            hint="pass the contents of the domain's keys.publish_file (read_publish_secret)")
    return b


def published_key(secret: Union[bytes, str], key: PrefixKey) -> PrefixKey:
    """The key a domain keyed with `secret` publishes for chain key `key`: the first 16 bytes of
    HMAC-SHA256(secret, "cxlkv published key v1\\0" || hi || lo), words big-endian (the
    orchestrator's ``published_key.h``). Events carry it (hex, high word first, as bytes; its
    ``lo`` as an integer); the directory's filter holds it."""
    d = hmac.new(_secret_bytes(secret, "published_key"),
                 _PUBLISHED_LABEL + key.hi.to_bytes(8, "big") + key.lo.to_bytes(8, "big"),
                 hashlib.sha256).digest()
    return PrefixKey(int.from_bytes(d[8:16], "big"), int.from_bytes(d[0:8], "big"))


def publish_key_id(secret: Union[bytes, str]) -> int:
    """The id a keyed directory summary names its secret by (reveals nothing of it)."""
    d = hmac.new(_secret_bytes(secret, "publish_key_id"), _KEY_ID_LABEL, hashlib.sha256).digest()
    return int.from_bytes(d[0:8], "big")


def read_publish_secret(path: str) -> bytes:
    """A ``keys.publish_file`` as the orchestrator reads it (surrounding whitespace dropped)."""
    with open(path, "rb") as f:
        return _secret_bytes(f.read().strip(), path)
