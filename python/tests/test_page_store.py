"""The SGLang HiCache-shaped page store, two hosts in one process (test_multihost.py runs
them as separate processes)."""

from __future__ import annotations

import hashlib
from typing import List, Optional

import numpy as np
import pytest

import cxlkv
from cxlkv.errors import BufferMismatchError, ClosedError, InvalidArgumentError, KeyLengthError
from conftest import Env, wait_until

PAGE, TOKENS, TOKEN_BYTES = 16, 128, 64  # 8 pages of 2 * 16 * 64 = 2 KiB (K and V)


def page_hashes(tokens: List[int], page: int) -> List[str]:
    """SGLang's chained page hash: SHA-256 of the prior hash and 4-byte LE token ids."""
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


def host_pool(seed: Optional[int] = None) -> cxlkv.HostPagePool:
    shape = (2, TOKENS, TOKEN_BYTES)
    data = (np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
            if seed is not None else np.zeros(shape, np.uint8))
    return cxlkv.HostPagePool(data, PAGE, kv_parts=2)


def store(env: Env, host: int, ns: cxlkv.Namespace, **kw) -> cxlkv.PageStore:
    return cxlkv.PageStore(env.host(host), ns, page_bytes=2 * PAGE * TOKEN_BYTES, **kw)


def pages_equal(a: cxlkv.HostPagePool, ia: int, b: cxlkv.HostPagePool, ib: int) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a.page(ia), b.page(ib)))


@pytest.fixture
def env(make_env) -> Env:
    return make_env(block_bytes=2 * PAGE * TOKEN_BYTES, blocks=64)


def test_set_exists_get_through_host_pools(env: Env, ns: cxlkv.Namespace) -> None:
    w, r = store(env, 0, ns), store(env, 1, ns)
    src, dst = host_pool(1), host_pool()
    w.register_mem_pool_host(src)
    r.register_mem_pool_host(dst)
    keys = page_hashes(list(range(1000, 1128)), PAGE)
    assert len(keys) == 8
    assert r.batch_exists(keys) == 0
    assert w.batch_set_v1(keys[:6], np.arange(6 * PAGE)) == [True] * 6
    wait_until(lambda: r.batch_exists(keys) == 6, what="6 pages visible")
    # Read into other slots of the reader's pool: pages 0..5 -> slots 2..7.
    got = r.batch_get_v1(keys[:6], np.arange(2 * PAGE, 8 * PAGE))
    assert got == [True] * 6
    for p in range(6):
        assert pages_equal(src, p * PAGE, dst, (p + 2) * PAGE)
    # Past the run: False for the missing ones.
    assert r.batch_get_v1(keys[5:8], np.arange(3 * PAGE)) == [True, False, False]
    assert r.exists(keys[0]) and not r.exists(keys[7])
    # Storing again is a no-op that reports success.
    assert w.batch_set_v1(keys[:2], np.arange(2 * PAGE)) == [True, True]


def test_leading_run_stops_at_a_gap(env: Env, ns: cxlkv.Namespace) -> None:
    w, r = store(env, 0, ns), store(env, 1, ns)
    w.register_mem_pool_host(host_pool(2))
    r.register_mem_pool_host(host_pool())
    keys = page_hashes(list(range(128)), PAGE)
    w.batch_set_v1([keys[0], keys[1]], np.arange(2 * PAGE))
    w.batch_set_v1([keys[3]], np.arange(3 * PAGE, 4 * PAGE))
    wait_until(lambda: r.exists(keys[3]))
    assert r.batch_exists(keys[:5]) == 2
    assert r.batch_get_v1(keys[:4], np.arange(4 * PAGE)) == [True, True, False, False]


def test_a_gap_ends_the_read_even_across_batches(env: Env, ns: cxlkv.Namespace) -> None:
    w, r = store(env, 0, ns), store(env, 1, ns, max_batch=2)
    w.register_mem_pool_host(host_pool(7))
    dst = host_pool()
    r.register_mem_pool_host(dst)
    keys = page_hashes(list(range(5 * PAGE)), PAGE)
    w.batch_set_v1(keys[:2], np.arange(2 * PAGE))
    w.batch_set_v1(keys[3:5], np.arange(3 * PAGE, 5 * PAGE))  # keys[2] missing
    wait_until(lambda: r.exists(keys[4]))
    assert r.batch_get_v1(keys, np.arange(5 * PAGE)) == [True, True, False, False, False]
    assert not dst.data[:, 4 * PAGE:].any()  # nothing past the gap was read


def test_tensor_api(env: Env, ns: cxlkv.Namespace) -> None:
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    w, r = store(env, 0, ns), store(env, 1, ns)
    n = 2 * PAGE * TOKEN_BYTES // 2
    vals = [torch.randn(n).to(torch.bfloat16) for _ in range(3)]
    keys = page_hashes(list(range(48)), PAGE)
    assert w.batch_set(keys, vals)
    wait_until(lambda: r.batch_exists(keys) == 3)
    outs = r.batch_get(keys, [torch.empty(n, dtype=torch.bfloat16) for _ in range(3)])
    assert all(o is not None and torch.equal(o, v) for o, v in zip(outs, vals))
    one = r.get(keys[1], torch.empty(n, dtype=torch.bfloat16))
    assert one is not None and torch.equal(one, vals[1])
    assert r.get(page_hashes(list(range(5000, 5016)), PAGE)[0]) is None
    raw = r.get(keys[2])  # no target: a fresh uint8 array
    assert bytes(raw) == vals[2].view(torch.uint8).numpy().tobytes()
    assert w.set(page_hashes([9] * 16, PAGE)[0], vals[0].clone())


def test_bad_input_raises_and_loses_nothing(env: Env, ns: cxlkv.Namespace) -> None:
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    w, r = store(env, 0, ns), store(env, 1, ns)
    src = host_pool(3)
    w.register_mem_pool_host(src)
    r.register_mem_pool_host(host_pool())
    keys = page_hashes(list(range(64)), PAGE)
    assert all(w.batch_set_v1(keys[:2], np.arange(2 * PAGE)))
    wait_until(lambda: r.batch_exists(keys) == 2)
    arena = w.domain.home_arena
    assert arena is not None
    used = arena.stats().classes[0]
    before = (used.allocated_blocks, used.persisted_blocks)

    with pytest.raises(KeyLengthError, match="31 bytes") as e:  # a truncated hash
        w.batch_set_v1([keys[2], keys[3][:-2]], np.arange(2 * PAGE))
    assert "page hash" in e.value.hint
    with pytest.raises(KeyLengthError, match="not a hex digest"):
        w.batch_set_v1([keys[2] + "_0_1"], np.arange(PAGE))  # a suffixed key
    with pytest.raises(InvalidArgumentError, match="2 keys need 32 host indices"):
        w.batch_set_v1(keys[2:4], np.arange(PAGE))
    with pytest.raises(InvalidArgumentError, match="page-aligned"):
        w.batch_set_v1(keys[2:3], np.arange(1, PAGE + 1))
    with pytest.raises(InvalidArgumentError, match="reach token"):
        w.batch_set_v1(keys[2:3], np.arange(TOKENS, TOKENS + PAGE))
    with pytest.raises(InvalidArgumentError, match="not one hash"):
        w.batch_exists(keys[0])  # type: ignore[arg-type]
    n = 2 * PAGE * TOKEN_BYTES
    with pytest.raises(BufferMismatchError, match=f"expected exactly {n}"):
        w.set(keys[2], torch.zeros(n // 4 + 1, dtype=torch.float32))
    with pytest.raises(BufferMismatchError, match=f"expected exactly {n}"):
        r.get(keys[0], torch.empty(n // 2 - 1, dtype=torch.float16))
    with pytest.raises(InvalidArgumentError, match="2 keys but 1 values"):
        w.batch_set(keys[2:4], [torch.zeros(n, dtype=torch.uint8)])
    # A host pool whose pages are not the store's page size.
    r2 = cxlkv.PageStore(r.domain, ns, page_bytes=n // 2)
    r2.register_mem_pool_host(host_pool())
    with pytest.raises(BufferMismatchError, match="page_bytes"):
        r2.batch_get_v1(keys[:1], np.arange(PAGE))

    # Nothing stored was lost, nothing new was stored, no block leaked.
    used = arena.stats().classes[0]
    assert (used.allocated_blocks, used.persisted_blocks) == before
    assert r.batch_exists(keys) == 2
    dst = host_pool()
    r.register_mem_pool_host(dst)
    assert r.batch_get_v1(keys[:2], np.arange(2 * PAGE)) == [True, True]
    assert pages_equal(src, 0, dst, 0) and pages_equal(src, PAGE, dst, PAGE)


def test_closed_domain_or_store(env: Env, ns: cxlkv.Namespace) -> None:
    w = store(env, 0, ns)
    w.register_mem_pool_host(host_pool(4))
    keys = page_hashes(list(range(32)), PAGE)
    w.close()
    with pytest.raises(ClosedError, match="PageStore"):
        w.batch_exists(keys)
    w2 = cxlkv.PageStore(env.host(1), ns, page_bytes=2 * PAGE * TOKEN_BYTES)
    w2.register_mem_pool_host(host_pool(4))
    w2.domain.leave()
    with pytest.raises(ClosedError, match="has left the domain"):
        w2.batch_set_v1(keys, np.arange(2 * PAGE))
    with pytest.raises(InvalidArgumentError, match="no host pool"):
        cxlkv.PageStore(env.host(2), ns, page_bytes=64).batch_get_v1(keys, np.arange(32))


def test_a_full_arena_stores_a_prefix_and_keeps_what_it_has(make_env, ns: cxlkv.Namespace
                                                            ) -> None:
    # A pool of a few dozen blocks: fewer than the request ring's 64 slots, so the arena, not
    # the ring, is what fills up.
    env = make_env(block_bytes=2 * PAGE * TOKEN_BYTES, pool_bytes=128 << 10)
    w, r = store(env, 0, ns), store(env, 1, ns)
    total = w.domain.home_arena.stats().classes[0].total_blocks  # type: ignore[union-attr]
    assert 0 < total < 64
    tokens = PAGE * (total + 2)
    data = np.random.default_rng(5).integers(0, 256, (2, tokens, TOKEN_BYTES), dtype=np.uint8)
    src = cxlkv.HostPagePool(data, PAGE, kv_parts=2)
    w.register_mem_pool_host(src)
    keys = page_hashes(list(range(tokens)), PAGE)
    res = w.batch_set_v1(keys, np.arange(tokens))
    stored = sum(res)
    assert res == [True] * stored + [False] * (len(keys) - stored)
    assert stored == total  # every block of the arena holds a page; the rest are refused
    wait_until(lambda: r.batch_exists(keys) == stored)
    dst = cxlkv.HostPagePool(np.zeros_like(data), PAGE, kv_parts=2)
    r.register_mem_pool_host(dst)
    assert r.batch_get_v1(keys[:stored], np.arange(stored * PAGE)) == [True] * stored
    assert all(pages_equal(src, p * PAGE, dst, p * PAGE) for p in range(stored))


def test_host_page_pool_checks_its_shape() -> None:
    with pytest.raises(BufferMismatchError, match="kv_parts=2 needs shape"):
        cxlkv.HostPagePool(np.zeros((3, 32, 8), np.uint8), 16, kv_parts=2)
    with pytest.raises(InvalidArgumentError, match="whole number of pages"):
        cxlkv.HostPagePool(np.zeros((33, 8), np.uint8), 16)
    p = cxlkv.HostPagePool(np.zeros((64, 8), np.uint8), 16)
    ptrs, sizes = p.get_page_buffer_meta(np.arange(16, 48))
    base = p.data.__array_interface__["data"][0]
    assert ptrs == [base + 16 * 8, base + 32 * 8] and sizes == [128, 128]


# ---- NVMe spill through a tier ---------------------------------------------------------------


def spill_tier(root, page_bytes: int):  # type: ignore[no-untyped-def]
    """A tier over an arena of its own whose blocks are the page size, its store in `root`;
    closes with its pool at the end of the test (the caller's `closers`)."""
    from cxlkv.pool import layout_for_block_bytes

    layout, _ = layout_for_block_bytes(page_bytes)
    pool = cxlkv.Pool.open("memfd:pytest-spill?size=4M")
    arena = cxlkv.Arena.create(pool, layout)
    try:
        tier = cxlkv.Tier.open(arena, nvme_dir=root / "spill-nvme")
    except cxlkv.errors.MismatchError as e:
        pool.close()
        pytest.skip(f"{root} cannot hold an NVMe store: {e}")
    return tier, pool


@pytest.fixture
def small_env(make_env) -> Env:
    # A pool of a few dozen blocks (fewer than the request ring's 64 slots): the arena fills.
    return make_env(block_bytes=2 * PAGE * TOKEN_BYTES, pool_bytes=128 << 10)


@pytest.mark.parametrize("kv_parts", [2, 1])
def test_pages_the_domain_cannot_take_spill_to_nvme(small_env: Env, ns: cxlkv.Namespace,
                                                    tmp_path, kv_parts: int) -> None:
    page_bytes = 2 * PAGE * TOKEN_BYTES
    tier, tier_pool = spill_tier(tmp_path, page_bytes)
    try:
        w = store(small_env, 0, ns, spill=tier)
        total = w.domain.home_arena.stats().classes[0].total_blocks  # type: ignore[union-attr]
        pages = total + 6
        tokens = PAGE * pages
        shape = (2, tokens, TOKEN_BYTES) if kv_parts == 2 else (tokens, 2 * TOKEN_BYTES)
        data = np.random.default_rng(11).integers(0, 256, shape, dtype=np.uint8)
        src = cxlkv.HostPagePool(data, PAGE, kv_parts=kv_parts)
        w.register_mem_pool_host(src)
        keys = page_hashes(list(range(7, 7 + tokens)), PAGE)
        # Every page is stored: the domain's arena takes `total`, the tier the rest (new
        # pages, never used before: the rule sends them to NVMe).
        assert w.batch_set_v1(keys, np.arange(tokens)) == [True] * pages
        st = tier.stats()
        assert st.placed_nvme == 6 and st.placed_cxl == 0 and st.nvme_blocks == 6
        assert w.exists(keys[-1])  # spilled: at once (published pages: once applied)
        wait_until(lambda: w.batch_exists(keys) == pages, what="the published pages applied")
        # Read back into another pool: the domain's run, then the tier's, byte for byte.
        dst = cxlkv.HostPagePool(np.zeros_like(data), PAGE, kv_parts=kv_parts)
        w.register_mem_pool_host(dst)
        assert w.batch_get_v1(keys, np.arange(tokens)) == [True] * pages
        assert np.array_equal(dst.data, data)
        assert tier.stats().nvme_reads == 6
        # The spilled pages are this host's: another host sees the domain's only.
        r = store(small_env, 1, ns)
        assert r.batch_exists(keys) == total
        # Without a spill the same writer refuses the pages past the arena.
        more = page_hashes(list(range(90000, 90000 + 2 * PAGE)), PAGE)
        w_plain = store(small_env, 2, ns)
        w_plain.register_mem_pool_host(src)
        assert w_plain.batch_set_v1(more, np.arange(2 * PAGE)) == [False, False]
    finally:
        tier.close()
        tier_pool.close()


def test_a_run_alternating_between_domain_and_spill(env: Env, ns: cxlkv.Namespace,
                                                   tmp_path) -> None:
    page_bytes = 2 * PAGE * TOKEN_BYTES
    tier, tier_pool = spill_tier(tmp_path, page_bytes)
    try:
        w = store(env, 0, ns, spill=tier)
        src, dst = host_pool(21), host_pool()
        w.register_mem_pool_host(src)
        keys = page_hashes(list(range(3000, 3000 + TOKENS)), PAGE)
        # Pages 0, 1 and 4 in the domain; 2 and 3 in the tier (placed directly); 5 nowhere.
        w.batch_set_v1([keys[0], keys[1]], np.arange(2 * PAGE))
        w.batch_set_v1([keys[4]], np.arange(4 * PAGE, 5 * PAGE))
        two = [np.concatenate([x.reshape(-1) for x in src.page(p * PAGE)]) for p in (2, 3)]
        pks = [w.key(k) for k in keys]
        assert tier.place(ns, pks[:4], two, first=2) == [cxlkv.Residence.ON_NVME] * 2
        wait_until(lambda: w.batch_exists(keys) == 5, what="pages 0, 1 and 4 applied")
        w.register_mem_pool_host(dst)
        assert w.batch_get_v1(keys[:6], np.arange(6 * PAGE)) == [True] * 5 + [False]
        assert all(pages_equal(src, p * PAGE, dst, p * PAGE) for p in range(5))
        assert not dst.data[:, 5 * PAGE:].any()
        # The tensor API reads through the spill too.
        one = w.get(keys[3])
        assert one is not None and bytes(one) == two[1].tobytes()
    finally:
        tier.close()
        tier_pool.close()


def test_a_spill_tier_of_another_block_size_is_refused(env: Env, ns: cxlkv.Namespace,
                                                      tmp_path) -> None:
    tier, tier_pool = spill_tier(tmp_path, 4096)
    try:
        with pytest.raises(InvalidArgumentError, match="4096 bytes, the store's pages 2048") as e:
            store(env, 0, ns, spill=tier)
        assert "layout_for_block_bytes" in str(e.value)
    finally:
        tier.close()
        tier_pool.close()
