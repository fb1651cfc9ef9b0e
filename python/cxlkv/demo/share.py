"""Sharing a model's KV blocks between serving processes through a cxlkv domain.

What a serving engine would embed, for :class:`~cxlkv.demo.model.TinyDecoder`:

* :func:`model_namespace` — the namespace of a model's blocks. It names the model by its
  fingerprint (configuration and every weight's bytes) and the KV layout in words (dtype,
  dimension order, layers, heads, head_dim, tokens per block), so blocks of two models or two
  layouts never meet in a lookup: a mismatched server cannot read the wrong bytes.
* :func:`publish_prefix` — the publisher's side: the full blocks of a prefilled prompt,
  published under chained prefix keys (each key hashes the namespace, its parent key and
  the block's token ids), then a *manifest* saying which model and layout published it.
* :func:`check_publisher` — the reader's handshake: reads the manifest of a shared prompt and
  raises :class:`ModelMismatchError`, naming both sides and what differs, when the publisher
  ran another model or KV layout. Namespaces alone would only make every lookup miss (and the
  server silently recompute); the manifest turns that misconfiguration into an error.
* :func:`load_prefix` — the reader's side: the chain keys of a request's full blocks (all but
  the last token, which must run to give logits), leased in one pass (the leading run that is
  published), copied out and validated straight into the request's KV cache rows.

Manifests live in a namespace of their own, the same for every model (:func:`catalog`),
under the chain key of the prompt's first :data:`CATALOG_TOKENS` token ids, in a block of the
publisher's arena: :data:`MANIFEST_BYTES` bytes, a 4-byte little-endian length then JSON.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

import cxlkv
from cxlkv.errors import FullError, MismatchError

from .model import DTYPE_NAME, KvCache, KvSpec, TinyDecoder

MANIFEST_MAGIC = "cxlkv-demo-manifest/1"
MANIFEST_BYTES = 2048
CATALOG_TOKENS = 16


class ModelMismatchError(MismatchError):
    """A shared prefix was published by another model or KV layout than this server's."""


def model_name(model: TinyDecoder, fingerprint: str) -> str:
    return f"{model.cfg.name}@{fingerprint[:16]}"


def model_namespace(tenant: str, model: TinyDecoder, kv: KvSpec,
                    fingerprint: Optional[str] = None) -> cxlkv.Namespace:
    """The namespace of `model`'s KV blocks cut as `kv` says (see the module docstring)."""
    fp = fingerprint or model.fingerprint()
    return cxlkv.Namespace(tenant, model_name(model, fp), kv.describe(model.cfg))


def catalog(tenant: str) -> cxlkv.Namespace:
    """The namespace of the tenant's manifests (model-independent)."""
    return cxlkv.Namespace(tenant, "cxlkv.demo.catalog", MANIFEST_MAGIC)


def catalog_key(tenant: str, tokens: Sequence[int]) -> cxlkv.PrefixKey:
    if len(tokens) < CATALOG_TOKENS:
        raise ValueError(f"a shared prompt needs at least {CATALOG_TOKENS} tokens, got "
                         f"{len(tokens)}")
    return catalog(tenant).chain_key(list(tokens[:CATALOG_TOKENS]))


# ---- manifests ------------------------------------------------------------------------------

def manifest(model: TinyDecoder, kv: KvSpec, fingerprint: str, ns: cxlkv.Namespace,
             blocks: int, publisher: int) -> Dict[str, Any]:
    """What a publisher says about the blocks of one shared prompt."""
    cfg = model.cfg
    return {
        "magic": MANIFEST_MAGIC,
        "model": model_name(model, fingerprint),
        "fingerprint": fingerprint,
        "config": asdict(cfg),
        "dtype": DTYPE_NAME,
        "tokens_per_block": kv.tokens_per_block,
        "kv_layout": kv.describe(cfg),
        "block_bytes": kv.layout(cfg).block_bytes,
        "namespace": f"{ns.id:#018x}",
        "blocks": blocks,
        "publisher": publisher,
    }


def encode_manifest(m: Dict[str, Any]) -> np.ndarray:
    raw = json.dumps(m, sort_keys=True).encode()
    if len(raw) + 4 > MANIFEST_BYTES:
        raise ValueError(f"manifest of {len(raw)} bytes exceeds {MANIFEST_BYTES - 4}")
    out = np.zeros(MANIFEST_BYTES, np.uint8)
    out[:4] = np.frombuffer(len(raw).to_bytes(4, "little"), np.uint8)
    out[4:4 + len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def decode_manifest(buf: np.ndarray) -> Dict[str, Any]:
    """The manifest in `buf`; ValueError naming the problem if it is not one."""
    b = bytes(np.ascontiguousarray(buf, dtype=np.uint8))
    n = int.from_bytes(b[:4], "little")
    if not 0 < n <= len(b) - 4:
        raise ValueError(f"manifest length {n} outside 1..{len(b) - 4}")
    try:
        m = json.loads(b[4:4 + n])
    except ValueError as e:
        raise ValueError(f"manifest is not JSON: {e}") from None
    if not isinstance(m, dict) or m.get("magic") != MANIFEST_MAGIC:
        raise ValueError(f"not a {MANIFEST_MAGIC} manifest")
    return m


def _side(m: Dict[str, Any]) -> str:
    c = m["config"]
    return (f"{m['model']} ({c['layers']} layers x {c['heads']} heads x {c['head_dim']} "
            f"head_dim, vocab {c['vocab']}, seed {c['seed']}; KV {m['kv_layout']})")


def compare(published: Dict[str, Any], mine: Dict[str, Any]) -> List[str]:
    """What differs between two manifests' model and layout ("layers: 6 vs 5", ...)."""
    diffs = []
    for k in sorted(set(published["config"]) | set(mine["config"])):
        a, b = published["config"].get(k), mine["config"].get(k)
        if a != b:
            diffs.append(f"{k}: {a} vs {b}")
    for k in ("dtype", "tokens_per_block"):
        if published.get(k) != mine.get(k):
            diffs.append(f"{k}: {published.get(k)} vs {mine.get(k)}")
    if not diffs and published.get("kv_layout") != mine["kv_layout"]:
        diffs.append(f"kv_layout: {published.get('kv_layout')} vs {mine['kv_layout']}")
    if not diffs and published["fingerprint"] != mine["fingerprint"]:
        diffs.append("weights: same configuration, different bytes")
    return diffs


def check_publisher(published: Dict[str, Any], mine: Dict[str, Any], subject: str) -> None:
    """Raises ModelMismatchError when the published prompt's model or KV layout is not mine."""
    diffs = compare(published, mine)
    if diffs:
        raise ModelMismatchError(
            f"refusing the shared prompt: host {published['publisher']} published its KV "
            f"blocks for "
            f"{_side(published)}; this server runs {_side(mine)}. Differs in: "
            + "; ".join(diffs),
            operation="check_publisher", subject=subject,
            hint="serve with the publisher's model and KV layout (same configuration, seed "
            "and tokens_per_block), or let this model prefill and publish its own copy of the "
            "prompt (its namespace differs, so the two never mix)")


# ---- publishing -----------------------------------------------------------------------------

def _publish(domain: cxlkv.Domain, ns: cxlkv.Namespace, key: cxlkv.PrefixKey, data: Any,
             parent: Optional[cxlkv.PrefixKey], wait_s: float) -> None:
    """Publishes, retrying while the request ring is full (the owner drains it every few ms)."""
    end = time.monotonic() + wait_s
    while True:
        try:
            domain.publish(ns, key, data, parent=parent)
            return
        except FullError:
            if time.monotonic() >= end:
                raise
            time.sleep(0.002)


@dataclass
class Published:
    blocks: int
    bytes: int
    publish_s: float
    keys: List[cxlkv.PrefixKey]


def publish_prefix(domain: cxlkv.Domain, tenant: str, model: TinyDecoder, kv: KvSpec,
                   fingerprint: str, tokens: Sequence[int], cache: KvCache, *,
                   wait_s: float = 5.0) -> Published:
    """Publishes the full blocks of `cache` (which holds `tokens`' KV from position 0) under
    their chain keys, then the prompt's manifest. The domain's home arena must have blocks
    of ``kv.layout(model.cfg)`` (e.g. ``domain.grow(kv.layout(cfg))``)."""
    ns = model_namespace(tenant, model, kv, fingerprint)
    if cache.length < len(tokens):
        raise ValueError(f"the cache holds {cache.length} positions, the prompt {len(tokens)}")
    block_bytes = cache.block_bytes
    if block_bytes < MANIFEST_BYTES:
        raise ValueError(f"KV blocks of {block_bytes} bytes cannot hold a {MANIFEST_BYTES}-byte "
                         "manifest: use more tokens per block or a larger model")
    t0 = time.perf_counter()
    keys = ns.chain_keys(list(tokens), kv.tokens_per_block)
    for i, key in enumerate(keys):
        _publish(domain, ns, key, cache.blocks[i], keys[i - 1] if i else None, wait_s)
    publish_s = time.perf_counter() - t0
    m = manifest(model, kv, fingerprint, ns, len(keys), domain.host_id)
    _publish(domain, catalog(tenant), catalog_key(tenant, tokens), encode_manifest(m), None,
             wait_s)
    return Published(len(keys), len(keys) * block_bytes, publish_s, keys)


# ---- reading --------------------------------------------------------------------------------

def wait_for_manifest(domain: cxlkv.Domain, tenant: str, tokens: Sequence[int],
                      timeout_s: float) -> Dict[str, Any]:
    """The manifest of the prompt starting with `tokens`, once published (TimeoutError after
    `timeout_s`): leased, copied out and validated like any block."""
    ns, key = catalog(tenant), catalog_key(tenant, tokens)
    end = time.monotonic() + timeout_s
    buf = np.empty(MANIFEST_BYTES, np.uint8)
    while True:
        if domain.lookup(ns, key) is not None:
            with domain.acquire_chain(ns, [key], wait_s=1.0) as leases:
                if len(leases) and leases.try_copy_out(0, buf):
                    return decode_manifest(buf)
        if time.monotonic() >= end:
            raise TimeoutError(f"no host published a manifest for this prompt in {domain!r} "
                               f"within {timeout_s:.0f} s (is the publisher running?)")
        time.sleep(0.005)


@dataclass
class Loaded:
    blocks_leased: int  # the leading run of the request's chain found published
    blocks_loaded: int  # copied and validated into the cache (a stale one ends the run)
    bytes_copied: int
    lease_s: float  # chain keys + lookup + leases
    copy_s: float  # validated copy-out into the cache rows, and the release


def load_prefix(domain: cxlkv.Domain, ns: cxlkv.Namespace, kv: KvSpec,
                tokens: Sequence[int], cache: KvCache) -> Loaded:
    """Fills an empty `cache` with the published blocks of `tokens`' leading full blocks, all
    but the block holding the last token (which must run to give logits), and sets
    ``cache.length`` to the positions loaded. A block whose copy went stale (retired, reused
    or its lease expired during the copy) ends the run there: it and the rest are
    recomputed, never used."""
    if cache.length:
        raise ValueError("load_prefix needs an empty cache")
    t = kv.tokens_per_block
    usable = (len(tokens) - 1) // t
    t0 = time.perf_counter()
    keys = ns.chain_keys(list(tokens[:usable * t]), t) if usable else []
    with domain.acquire_chain(ns, keys, wait_s=1.0) as leases:
        t1 = time.perf_counter()
        n = len(leases)
        ok = leases.copy_out_rows(cache.blocks[:n], dtype=torch.float32) if n else []
    t2 = time.perf_counter()
    loaded = ok.index(False) if False in ok else n
    cache.length = loaded * t
    return Loaded(n, loaded, n * cache.block_bytes, t1 - t0, t2 - t1)
