"""The cross-domain prefix directory (docs/ha.md): which CXL domains may hold a prefix.

``where(orchestrators, key)`` asks an orchestrator that runs with ``[etcd]`` (leader or standby,
of any domain) through ``cxlkv_directory_where`` in libcxlkv. The answer comes from each
domain's Bloom filter over its published chain keys: a domain in ``may_hold`` may hold the
prefix (false positives at its ``fp_rate``), a domain left out does not (as of its leader's
last summary).

`key` is the chain key of the prefix's last block: a :class:`~cxlkv.keys.PrefixKey`, or its
hex as ``cxlkvctl`` prints it (the high word's 16 digits, then the low word's).
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass, field
from typing import List, Union

from . import _lib, errors
from .keys import PrefixKey

__all__ = ["DomainVerdict", "WhereAnswer", "where", "key_from_ctl_hex"]


@dataclass(frozen=True)
class DomainVerdict:
    domain: str
    may_hold: bool
    anchor: bool  # False: not an anchor under that domain's anchor_every (ask a deeper key)
    published: int
    fp_rate: float
    epoch: int
    age_ms: int
    filter_bytes: int
    keyed: bool = False  # the domain keys its published chain keys (docs/kv_events.md)
    key_held: bool = True  # keyed: the answering orchestrator holds its secret


@dataclass(frozen=True)
class WhereAnswer:
    may_hold: List[str]
    revision: int
    domains: List[DomainVerdict] = field(default_factory=list)


def key_from_ctl_hex(text: str) -> PrefixKey:
    """The key of ``cxlkvctl``'s hex form (up to 32 digits, high word first; ``0x`` allowed)."""
    t = text[2:] if text.lower().startswith("0x") else text
    if not t or len(t) > 32:
        raise errors.InvalidArgumentError(
            f"prefix '{text}' is not a chain key in hex (1 to 32 digits)",
            operation="key_from_ctl_hex", subject=text,
            hint="pass the key as cxlkvctl prints it, or a PrefixKey")
    try:
        v = int(t, 16)
    except ValueError:
        raise errors.InvalidArgumentError(
            f"prefix '{text}' is not hex", operation="key_from_ctl_hex", subject=text,
            hint="pass the key as cxlkvctl prints it, or a PrefixKey") from None
    return PrefixKey(v & ((1 << 64) - 1), v >> 64)


def where(orchestrators: str, key: Union[PrefixKey, str]) -> WhereAnswer:
    """Which domains may hold the prefix ending in `key` (``cxlkv_directory_where``).

    `orchestrators`: a socket path, ``unix:PATH`` or ``tcp:HOST:PORT``, several separated by
    commas. Raises the package's error for the library's code (an orchestrator without
    ``[etcd]``, etcd unreadable, nobody answering), with the orchestrator's message."""
    k = key_from_ctl_hex(key) if isinstance(key, str) else key
    kc = k.to_c()
    lib = _lib.load()
    target = orchestrators.encode()
    need = ctypes.c_size_t()
    _lib.check(lib, lib.cxlkv_directory_where(target, ctypes.addressof(kc), None, 0,
                                              ctypes.byref(need)),
               "cxlkv_directory_where", orchestrators)
    size = int(need.value) + 4096  # the answer may grow between the calls
    buf = ctypes.create_string_buffer(size)
    _lib.check(lib, lib.cxlkv_directory_where(target, ctypes.addressof(kc), buf, size,
                                              ctypes.byref(need)),
               "cxlkv_directory_where", orchestrators)
    j = json.loads(buf.value.decode("utf-8"))
    return WhereAnswer(
        may_hold=list(j["may_hold"]),
        revision=int(j["revision"]),
        domains=[DomainVerdict(d["domain"], bool(d["may_hold"]), bool(d["anchor"]),
                               int(d["published"]), float(d["fp_rate"]), int(d["epoch"]),
                               int(d["age_ms"]), int(d["filter_bytes"]),
                               bool(d.get("keyed", False)), bool(d.get("key_held", True)))
                 for d in j["domains"]])
