"""Host processes for test_multihost.py (started with multiprocessing's spawn method, so each
is a fresh interpreter that maps the domain and the pool itself, as another host would), and
the engines' key schemes the tests use."""

from __future__ import annotations

import hashlib
import time
from typing import Any, List, Optional, Tuple

import numpy as np

import cxlkv

PAGE, TOKEN_BYTES = 16, 64  # SGLang-like pages: 16 tokens, K and V of 64 bytes per token
PAGE_BYTES = 2 * PAGE * TOKEN_BYTES
BLOCK = 4096  # vLLM-like primary blocks


def page_hashes(tokens: List[int], page: int = PAGE) -> List[str]:
    """SGLang's chained page hash: SHA-256 of the prior hash and 4-byte LE token ids, hex."""
    out: List[str] = []
    prior: Optional[str] = None
    for i in range(0, len(tokens) - len(tokens) % page, page):
        h = hashlib.sha256()
        if prior:
            h.update(bytes.fromhex(prior))
        for t in tokens[i:i + page]:
            h.update(t.to_bytes(4, "little"))
        prior = h.hexdigest()
        out.append(prior)
    return out


def offload_keys(n: int, salt: bytes = b"", group: int = 0) -> List[bytes]:
    """vLLM-style OffloadKeys: chained 32-byte block hashes + the 4-byte group index."""
    keys, prior = [], b""
    for i in range(n):
        prior = hashlib.sha256(prior + salt + i.to_bytes(4, "little")).digest()
        keys.append(prior + group.to_bytes(4, "big"))
    return keys


def content_for(key: Any, nbytes: int) -> np.ndarray:
    """Bytes a block holds, derived from its key: every writer of a key writes the same."""
    seed = int.from_bytes(hashlib.sha256(bytes(key, "ascii") if isinstance(key, str)
                                         else bytes(key)).digest()[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def _join(domain_spec: str, pool_spec: str, host_id: int) -> cxlkv.Domain:
    return cxlkv.Domain.join(domain_spec, host_id, arenas=[cxlkv.Arena.open_spec(pool_spec)],
                             heartbeat_s=0.05)


def _wait(cond: Any, timeout_s: float = 10.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return bool(cond())


def page_writer(domain_spec: str, pool_spec: str, host_id: int, ns_parts: Tuple[str, str, str],
                keys: List[str], out: Any, go: Any) -> None:
    """Stores pages under `keys` (page i = content_for(keys[i])) from a host pool."""
    d = _join(domain_spec, pool_spec, host_id)
    store = cxlkv.PageStore(d, cxlkv.Namespace(*ns_parts), page_bytes=PAGE_BYTES)
    data = np.stack([content_for(k, PAGE_BYTES).reshape(2, PAGE, TOKEN_BYTES) for k in keys],
                    axis=1).reshape(2, len(keys) * PAGE, TOKEN_BYTES)
    store.register_mem_pool_host(cxlkv.HostPagePool(np.ascontiguousarray(data), PAGE, 2))
    res = store.batch_set_v1(keys, np.arange(len(keys) * PAGE))
    out.put(("stored", host_id, res))
    go.get()  # stay joined until the reader is done
    d.leave()


def page_reader(domain_spec: str, pool_spec: str, host_id: int, ns_parts: Tuple[str, str, str],
                keys: List[str], out: Any) -> None:
    """Waits for the pages, reads them into its own host pool, reports what matched."""
    d = _join(domain_spec, pool_spec, host_id)
    store = cxlkv.PageStore(d, cxlkv.Namespace(*ns_parts), page_bytes=PAGE_BYTES)
    pool = cxlkv.HostPagePool(np.zeros((2, len(keys) * PAGE, TOKEN_BYTES), np.uint8), PAGE, 2)
    store.register_mem_pool_host(pool)
    seen = _wait(lambda: store.batch_exists(keys) == len(keys))
    got = store.batch_get_v1(keys, np.arange(len(keys) * PAGE))
    match = []
    for i, k in enumerate(keys):
        want = content_for(k, PAGE_BYTES).reshape(2, PAGE, TOKEN_BYTES)
        have = np.stack(pool.page(i * PAGE))
        match.append(bool(np.array_equal(want, have)))
    out.put(("read", host_id, seen, store.batch_exists(keys), got, match))
    d.leave()


def tier_writer(domain_spec: str, pool_spec: str, host_id: int, ns_parts: Tuple[str, str, str],
                keys: List[bytes], out: Any, go: Any) -> None:
    """Stores blocks under `keys` from its primary view (block i+1 holds keys[i]'s content)."""
    d = _join(domain_spec, pool_spec, host_id)
    view = memoryview(bytearray(BLOCK * (len(keys) + 2)))
    for i, k in enumerate(keys):
        view[(i + 1) * BLOCK:(i + 2) * BLOCK] = content_for(k, BLOCK).tobytes()
    tier = cxlkv.OffloadTier(d, cxlkv.Namespace(*ns_parts), view, block_bytes=BLOCK)
    tier.submit_store(cxlkv.TierJob(host_id, keys, np.arange(1, len(keys) + 1)))
    done: List[cxlkv.TierJobResult] = []
    _wait(lambda: bool(done.extend(tier.get_finished()) or done))
    out.put(("stored", host_id, [(r.job_id, r.success, r.transfer_bytes) for r in done]))
    go.get()
    tier.shutdown()
    d.leave()


def tier_reader(domain_spec: str, pool_spec: str, host_id: int, ns_parts: Tuple[str, str, str],
                keys: List[bytes], out: Any) -> None:
    """Waits until lookup says True for every key, loads them, reports what matched."""
    d = _join(domain_spec, pool_spec, host_id)
    view = memoryview(bytearray(BLOCK * (len(keys) + 3)))
    tier = cxlkv.OffloadTier(d, cxlkv.Namespace(*ns_parts), view, block_bytes=BLOCK)
    states = {tier.lookup(k) for k in keys}
    seen = _wait(lambda: all(tier.lookup(k) is True for k in keys))
    tier.submit_load(cxlkv.TierJob(99, keys, np.arange(3, 3 + len(keys))))
    done: List[cxlkv.TierJobResult] = []
    _wait(lambda: bool(done.extend(tier.get_finished()) or done))
    match = [bytes(view[(3 + i) * BLOCK:(4 + i) * BLOCK]) == content_for(k, BLOCK).tobytes()
             for i, k in enumerate(keys)]
    out.put(("read", host_id, seen, sorted(map(str, states)),
             [(r.job_id, r.success) for r in done], match))
    tier.shutdown()
    d.leave()
