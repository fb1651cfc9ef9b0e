"""The chain helpers both engine stores share (cxlkv.chains) and the reads under them:
Leases.copy_out_to and Leases.copy_out_many (one cxlkv_lease_copy_out_many call)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

import cxlkv
from cxlkv import _lib, chains
from cxlkv.errors import InvalidArgumentError
from conftest import Env, wait_until

PKG = Path(cxlkv.__file__).resolve().parent


@pytest.fixture
def env(make_env) -> Env:
    return make_env(block_bytes=4096, blocks=64)


def blocks(n: int, size: int, seed: int) -> List[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]


def rows_of(a: np.ndarray) -> List[List[tuple]]:
    """One segment per row of `a`: (address, bytes)."""
    return [[(int(a.ctypes.data) + i * a.strides[0], a.shape[1])] for i in range(a.shape[0])]


def test_store_chain_then_load_chain_with_scattered_segments(env: Env,
                                                             ns: cxlkv.Namespace) -> None:
    a, b = env.host(0), env.host(1)
    keys = ns.chain_keys(range(16 * 5), 16)
    src = np.stack(blocks(5, env.block_bytes, seed=3))
    res = chains.store_chain(a, ns, keys[:4], rows_of(src[:4]))
    assert (res.stored, res.published, res.bytes_copied) == (4, [0, 1, 2, 3],
                                                             4 * env.block_bytes)
    wait_until(lambda: b.lookup(ns, keys[3]) is not None, what="4 blocks visible")
    again = chains.store_chain(a, ns, keys[:4], rows_of(src[:4]))
    assert (again.stored, again.published, again.bytes_copied) == (4, [], 0)
    # Each block read into two destinations at once (its halves, swapped places): a page's K
    # and V segments in an engine's pool.
    half = env.block_bytes // 2
    dst = np.zeros((5, env.block_bytes), np.uint8)
    segs = [[(int(dst[i].ctypes.data) + half, half), (int(dst[i].ctypes.data), half)]
            for i in range(5)]
    for scatter in (True, False):
        dst[:] = 0
        got = chains.load_chain(b, ns, keys, segs, max_batch=3, wait_s=1.0, scatter=scatter)
        assert got == [True] * 4  # the run ends at the fifth key, never published
        for i in range(4):
            assert np.array_equal(dst[i][half:], src[i][:half])
            assert np.array_equal(dst[i][:half], src[i][half:])
        assert not dst[4].any()


def test_copy_out_many_reports_each_piece(env: Env, ns: cxlkv.Namespace) -> None:
    a, b = env.host(0), env.host(1)
    keys = ns.chain_keys(range(16 * 3), 16)
    data = blocks(3, env.block_bytes, seed=5)
    chains.store_chain(a, ns, keys, [[(int(d.ctypes.data), d.nbytes)] for d in data])
    wait_until(lambda: b.lookup(ns, keys[2]) is not None, what="3 blocks visible")
    out = np.zeros((3, 2, 100), np.uint8)
    pieces = [(i, off, int(out[i, k].ctypes.data), 100)
              for i in range(3) for k, off in enumerate((0, 1000))]
    with b.acquire_chain(ns, keys, wait_s=1.0) as leases:
        assert leases.copy_out_many(pieces) == [True] * 6
        for i in range(3):
            assert np.array_equal(out[i, 0], data[i][:100])
            assert np.array_equal(out[i, 1], data[i][1000:1100])
        one = np.zeros(10, np.uint8)
        assert leases.copy_out_to(2, int(one.ctypes.data), 10, offset=7)
        assert np.array_equal(one, data[2][7:17])
        assert leases.copy_out_many([]) == []
        with pytest.raises(InvalidArgumentError, match="lease index 3"):
            leases.copy_out_many([(3, 0, int(one.ctypes.data), 10)])
        with pytest.raises(InvalidArgumentError, match="pieces: "):
            leases.copy_out_many([(0, "0", int(one.ctypes.data), 10)])
        # A piece past its block is an argument error naming the piece; the others are read.
        out[:] = 0
        bad = pieces[:2] + [(1, env.block_bytes - 5, int(one.ctypes.data), 10)] + pieces[2:]
        with pytest.raises(InvalidArgumentError, match="item 2: "):
            leases.copy_out_many(bad)
        assert np.array_equal(out[2, 1], data[2][1000:1100])
        # The middle block retired under its lease: its pieces alone are False.
        a.retire(ns, keys[1])
        wait_until(lambda: b.lookup(ns, keys[1]) is None, what="the retirement")
        assert leases.copy_out_many(pieces) == [True, True, False, False, True, True]
        assert not leases.copy_out_to(1, int(one.ctypes.data), 10)
        assert np.array_equal(out[2, 0], data[2][:100])


class Calls:
    """Counts the chain helpers' and the C copy-out calls' uses, passing each through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n: Dict[str, int] = {}
        self.items = 0
        for name in ("store_chain", "load_chain"):
            monkeypatch.setattr(chains, name, self._wrap(name, getattr(chains, name)))
        lib = _lib.load()
        for name in ("cxlkv_lease_copy_out", "cxlkv_lease_copy_out_many"):
            monkeypatch.setattr(lib, name, self._wrap(name, getattr(lib, name)))

    def _wrap(self, name: str, fn: Any) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            self.n[name] = self.n.get(name, 0) + 1
            if name == "cxlkv_lease_copy_out_many":
                self.items += int(args[2])
            return fn(*args, **kw)
        return call


def test_page_store_goes_through_the_chain_helpers(env: Env, ns: cxlkv.Namespace,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    page, tokens = 16, 6 * 16
    w = cxlkv.PageStore(env.host(0), ns, page_bytes=env.block_bytes)
    r = cxlkv.PageStore(env.host(1), ns, page_bytes=env.block_bytes)
    tb = env.block_bytes // (2 * page)
    src = np.random.default_rng(7).integers(0, 256, (2, tokens, tb), dtype=np.uint8)
    dst = np.zeros_like(src)
    w.register_mem_pool_host(cxlkv.HostPagePool(src, page, kv_parts=2))
    r.register_mem_pool_host(cxlkv.HostPagePool(dst, page, kv_parts=2))
    keys = [bytes([i]) * 32 for i in range(6)]
    calls = Calls(monkeypatch)
    assert w.batch_set_v1(keys, np.arange(tokens)) == [True] * 6
    assert calls.n == {"store_chain": 1}
    wait_until(lambda: r.batch_exists(keys) == 6, what="6 pages visible")
    assert r.batch_get_v1(keys, np.arange(tokens)) == [True] * 6
    assert np.array_equal(src, dst)
    # One library call for the batch's 12 segments (K and V of 6 pages), none per block.
    assert calls.n == {"store_chain": 1, "load_chain": 1, "cxlkv_lease_copy_out_many": 1}
    assert calls.items == 12
    assert r.batch_get(keys[:2])[1] is not None
    assert calls.n["load_chain"] == 2 and "cxlkv_lease_copy_out" not in calls.n


def test_offload_tier_goes_through_the_chain_helpers(env: Env, ns: cxlkv.Namespace,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    n = 5
    va = np.random.default_rng(8).integers(0, 256, (n, env.block_bytes), dtype=np.uint8)
    vb = np.zeros_like(va)
    ta = cxlkv.OffloadTier(env.host(0), ns, memoryview(va))
    tb = cxlkv.OffloadTier(env.host(1), ns, memoryview(vb))
    try:
        calls = Calls(monkeypatch)
        keys = [bytes([i]) * 32 + (0).to_bytes(4, "big") for i in range(n)]
        ta.submit_store(cxlkv.TierJob(1, keys, np.arange(n)))
        assert ta.drain(10.0) and ta.get_finished()[0].success
        wait_until(lambda: all(tb.lookup(k) for k in keys), what="5 blocks visible")
        tb.submit_load(cxlkv.TierJob(2, keys, np.arange(n)[::-1].copy()))
        assert tb.drain(10.0)
        res = tb.get_finished()[0]
        assert res.success and res.transfer_bytes == n * env.block_bytes
        assert np.array_equal(vb, va[::-1])
        assert calls.n == {"store_chain": 1, "load_chain": 1, "cxlkv_lease_copy_out_many": 1}
        assert calls.items == n
    finally:
        ta.shutdown()
        tb.shutdown()


def calls_in(path: Path) -> List[ast.Attribute]:
    """The attribute calls in a module's code (``x.name(...)``), docstrings aside."""
    tree = ast.parse(path.read_text())
    return [n.func for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]


def test_no_module_composes_the_chain_protocol_itself() -> None:
    """The engine stores reach the protocol through cxlkv.chains only, and nothing outside
    domain.py calls Leases' or Domain's private read and publish steps."""
    protocol = {"lookup", "acquire", "acquire_chain", "publish", "publish_block",
                "publish_chain", "alloc", "free", "cxlkv_copy_to_block", "cxlkv_lease_copy_out",
                "cxlkv_lease_copy_out_many", "copy_out", "try_copy_out", "copy_out_to",
                "copy_out_many", "copy_out_rows"}
    for name in ("offload_tier.py", "page_store.py"):
        steps = sorted({f.attr for f in calls_in(PKG / name)
                        if f.attr in protocol and f.attr != "lookup"})
        assert not steps, f"{name} calls {steps} itself: use cxlkv.chains"
    private = {"_copy_out_ptr", "_addr", "_arena", "_lease", "_acquire_chain", "_publish_c"}
    for path in PKG.rglob("*.py"):
        if path.name == "domain.py":
            continue
        found = sorted({f.attr for f in calls_in(path) if f.attr in private})
        assert not found, f"{path.relative_to(PKG)} calls the private {found} of cxlkv.domain"
