"""Domains: publish, lookup, chain leases, validated copy-out, zero-copy views, bad input."""

from __future__ import annotations

import time

import numpy as np
import pytest

import cxlkv
from cxlkv.errors import (
    BufferMismatchError,
    ClosedError,
    FullError,
    InvalidArgumentError,
    NotFoundError,
    StaleError,
)
from conftest import Env, wait_until


def blocks(n: int, size: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]


def publish_chain(d: cxlkv.Domain, ns: cxlkv.Namespace, keys: list, data: list) -> None:
    parent = None
    for k, v in zip(keys, data):
        d.publish(ns, k, v, parent=parent)
        parent = k
    wait_until(lambda: d.lookup(ns, keys[-1]) is not None, what="the owner to apply publishes")


def allocated(arena: cxlkv.Arena) -> int:
    c = arena.stats().classes[0]
    return c.allocated_blocks + c.persisted_blocks


def test_publish_lookup_chain_lease_and_copy_out(env: Env, ns: cxlkv.Namespace) -> None:
    a, b = env.host(0), env.host(1)
    keys = ns.chain_keys(range(64), 16)
    data = blocks(4, env.block_bytes)
    assert b.lookup(ns, keys[0]) is None
    publish_chain(a, ns, keys, data)
    hit = b.lookup(ns, keys[0])
    assert hit is not None and hit.publisher == 0
    with b.acquire_chain(ns, keys, wait_s=1.0) as leases:
        assert len(leases) == 4 and leases.keys == keys
        for i in range(4):
            out = np.empty(env.block_bytes, np.uint8)
            leases.copy_out(i, out)
            assert np.array_equal(out, data[i])
            part = np.empty(100, np.uint8)
            leases.copy_out(i, part, offset=1000)
            assert np.array_equal(part, data[i][1000:1100])
            assert np.array_equal(leases.read(i, 64, offset=8), data[i][8:72])
            assert leases.validate(i)
            leases.renew(i)
    # A single hit's lease.
    with b.acquire(hit) as one:
        assert np.array_equal(one.read(0, env.block_bytes), data[0])


def test_chain_lease_stops_at_the_first_miss(env: Env, ns: cxlkv.Namespace) -> None:
    a, b = env.host(0), env.host(1)
    keys = ns.chain_keys(range(80), 16)
    data = blocks(5, env.block_bytes)
    publish_chain(a, ns, keys[:2], data[:2])
    a.publish(ns, keys[3], data[3])  # a gap at keys[2]
    wait_until(lambda: b.lookup(ns, keys[3]) is not None)
    with b.acquire_chain(ns, keys, wait_s=1.0) as leases:
        assert len(leases) == 2
    with b.acquire_chain(ns, keys[2:], wait_s=1.0) as leases:
        assert len(leases) == 0 and not leases.keys
    with b.acquire_chain(ns, []) as leases:
        assert len(leases) == 0


def test_copy_out_into_torch_tensors(env: Env, ns: cxlkv.Namespace) -> None:
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    a, b = env.host(0), env.host(1)
    src = torch.randn(env.block_bytes // 2, dtype=torch.float32).to(torch.float16)
    key = ns.chain_key([7] * 16)
    a.publish(ns, key, src)
    wait_until(lambda: b.lookup(ns, key) is not None)
    with b.acquire_chain(ns, [key], wait_s=1.0) as leases:
        dst = torch.empty(env.block_bytes // 2, dtype=torch.float16)
        leases.copy_out(0, dst, dtype=torch.float16, nbytes=env.block_bytes)
        assert torch.equal(dst, src)
        shaped = torch.empty((4, env.block_bytes // 8), dtype=torch.float16)
        leases.copy_out(0, shaped)
        assert torch.equal(shaped.flatten(), src)
        # Wrong dtype, size, contiguity, grad: refused before anything is read.
        with pytest.raises(BufferMismatchError, match="wrong dtype: expected float16") as e:
            leases.copy_out(0, torch.empty(env.block_bytes // 4, dtype=torch.float32),
                            dtype=torch.float16)
        assert "dtype float16" in e.value.hint
        with pytest.raises(BufferMismatchError, match=f"expected exactly {env.block_bytes}"):
            leases.copy_out(0, torch.empty(10, dtype=torch.float16), nbytes=env.block_bytes)
        with pytest.raises(BufferMismatchError, match="not contiguous") as e:
            leases.copy_out(0, torch.empty((64, 64), dtype=torch.float16).t())
        assert "contiguous()" in e.value.hint
        with pytest.raises(BufferMismatchError, match="requires grad"):
            leases.copy_out(0, torch.empty(16, requires_grad=True))
        with pytest.raises(InvalidArgumentError, match=f"of {env.block_bytes} bytes"):
            leases.copy_out(0, torch.empty(env.block_bytes, dtype=torch.float16))
        assert torch.equal(dst, src)  # still good, nothing was disturbed
        assert leases.validate(0)


def test_copy_out_rows_fills_one_row_per_block(env: Env, ns: cxlkv.Namespace) -> None:
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    a, b = env.host(0), env.host(1)
    keys = ns.chain_keys(range(64), 16)
    data = blocks(4, env.block_bytes, seed=9)
    publish_chain(a, ns, keys[:3], data[:3])
    dst = torch.zeros((4, env.block_bytes // 2), dtype=torch.float16)
    with b.acquire_chain(ns, keys, wait_s=1.0) as leases:
        assert len(leases) == 3
        assert leases.copy_out_rows(dst, dtype=torch.float16) == [True] * 3
        for i in range(3):
            assert bytes(dst[i].numpy().view(np.uint8)) == data[i].tobytes()
        assert not dst[3].any()  # a row past the leased run is left alone
        half = np.zeros((3, 100), np.uint8)
        assert leases.copy_out_rows(half, offset=50) == [True] * 3
        assert all(np.array_equal(half[i], data[i][50:150]) for i in range(3))
        with pytest.raises(BufferMismatchError, match="2 rows for 3 leased blocks"):
            leases.copy_out_rows(np.zeros((2, 8), np.uint8))
        with pytest.raises(BufferMismatchError, match="wrong dtype"):
            leases.copy_out_rows(dst, dtype=torch.float32)
        with pytest.raises(InvalidArgumentError, match=f"of {env.block_bytes} bytes"):
            leases.copy_out_rows(np.zeros((3, env.block_bytes + 1), np.uint8))
        a.retire(ns, keys[1])
        wait_until(lambda: b.lookup(ns, keys[1]) is None)
        assert leases.copy_out_rows(half) == [True, False, True]  # row 1: discard


def test_copy_out_refuses_read_only_and_odd_buffers(env: Env, ns: cxlkv.Namespace) -> None:
    a, b = env.host(0), env.host(1)
    key = ns.chain_key([1] * 16)
    a.publish(ns, key, blocks(1, env.block_bytes)[0])
    wait_until(lambda: b.lookup(ns, key) is not None)
    with b.acquire_chain(ns, [key], wait_s=1.0) as leases:
        ro = np.empty(64, np.uint8)
        ro.setflags(write=False)
        with pytest.raises(BufferMismatchError, match="read-only"):
            leases.copy_out(0, ro)
        with pytest.raises(BufferMismatchError, match="read-only"):
            leases.copy_out(0, b"immutable")
        with pytest.raises(BufferMismatchError, match="neither a numpy array"):
            leases.copy_out(0, object())
        buf = bytearray(32)
        leases.copy_out(0, buf)
        with pytest.raises(InvalidArgumentError, match="lease index 5"):
            leases.copy_out(5, buf)


def test_retired_block_goes_stale_under_a_lease(env: Env, ns: cxlkv.Namespace) -> None:
    a, b = env.host(0), env.host(1)
    key = ns.chain_key([2] * 16)
    a.publish(ns, key, blocks(1, env.block_bytes)[0])
    wait_until(lambda: b.lookup(ns, key) is not None)
    leases = b.acquire_chain(ns, [key], wait_s=1.0)
    view = leases.view(0, nbytes=256)
    a.retire(ns, key)
    wait_until(lambda: b.lookup(ns, key) is None, what="the retirement")
    out = np.empty(env.block_bytes, np.uint8)
    assert leases.try_copy_out(0, out) is False
    with pytest.raises(StaleError, match="discard") as e:
        leases.copy_out(0, out)
    assert "acquire the prefix again" in str(e.value)
    assert not leases.validate(0)
    with pytest.raises(StaleError):
        with view:
            pass
    assert view.valid is False
    leases.release()


def test_zero_copy_view_reads_the_block_in_place(env: Env, ns: cxlkv.Namespace) -> None:
    a, b = env.host(0), env.host(1)
    key = ns.chain_key([3] * 16)
    data = blocks(1, env.block_bytes, seed=3)[0]
    a.publish(ns, key, data)
    wait_until(lambda: b.lookup(ns, key) is not None)
    with b.acquire_chain(ns, [key], wait_s=1.0) as leases:
        v = leases.view(0, offset=128, nbytes=512)
        with v as arr:
            assert not arr.flags.writeable
            total = int(arr.astype(np.int64).sum())
        assert v.valid and total == int(data[128:640].astype(np.int64).sum())
        assert v.array.size == 0  # the view is dropped after the with block
        with pytest.raises(InvalidArgumentError):
            leases.view(0, offset=env.block_bytes - 10, nbytes=11)


def test_leases_are_released_by_the_with_block(make_env, ns: cxlkv.Namespace) -> None:
    env = make_env(geometry=cxlkv.Geometry(lease_rows=4))
    a, b = env.host(0), env.host(1)
    keys = ns.chain_keys(range(64), 16)
    publish_chain(a, ns, keys, blocks(4, env.block_bytes))
    for _ in range(10):  # 40 leases through 4 rows: only if each set is released
        with b.acquire_chain(ns, keys, wait_s=1.0) as leases:
            assert len(leases) == 4
    held = b.acquire_chain(ns, keys, wait_s=1.0)
    with pytest.raises(FullError, match="lease row|row"):
        b.acquire_chain(ns, keys[:1], wait_s=0.05)
    held.release()
    held.release()  # idempotent
    with pytest.raises(ClosedError, match="released"):
        held.copy_out(0, np.empty(8, np.uint8))
    with b.acquire_chain(ns, keys, wait_s=1.0) as leases:
        assert len(leases) == 4


def test_closed_domain_raises_and_nothing_crashes(env: Env, ns: cxlkv.Namespace) -> None:
    a, b = env.host(0), env.host(1)
    key = ns.chain_key([4] * 16)
    data = blocks(1, env.block_bytes)[0]
    a.publish(ns, key, data)
    wait_until(lambda: b.lookup(ns, key) is not None)
    leases = b.acquire_chain(ns, [key], wait_s=1.0)
    b.leave()
    for call in (lambda: b.lookup(ns, key), lambda: b.acquire_chain(ns, [key]),
                 lambda: b.publish(ns, key, data), lambda: b.heartbeat(),
                 lambda: leases.copy_out(0, np.empty(8, np.uint8)), lambda: b.retire(ns, key)):
        with pytest.raises(ClosedError, match="has left the domain") as e:
            call()
        assert "Domain.join" in str(e.value)
    leases.release()  # after leave: nothing to do, no crash
    b.leave()  # idempotent
    # The published block is still there for everyone else.
    c = env.host(2)
    with c.acquire_chain(ns, [key], wait_s=1.0) as l2:
        assert np.array_equal(l2.read(0, env.block_bytes), data)


def test_publish_failures_leak_no_block(env: Env, ns: cxlkv.Namespace) -> None:
    a = env.host(0)
    arena = a.home_arena
    assert arena is not None
    before = allocated(arena)
    with pytest.raises(BufferMismatchError, match="a block of class 0 holds"):
        a.publish(ns, ns.chain_key([5]), np.zeros(env.block_bytes + 1, np.uint8))
    with pytest.raises(BufferMismatchError):
        a.publish(ns, ns.chain_key([5]), np.zeros((64, 64), np.uint8)[::2])
    with pytest.raises(InvalidArgumentError, match="not a PrefixKey"):
        a.publish(ns, b"x" * 16, np.zeros(8, np.uint8))  # type: ignore[arg-type]
    assert allocated(arena) == before
    lone = cxlkv.Domain.join(env.domain_spec, 5, heartbeat_s=None)
    try:
        with pytest.raises(InvalidArgumentError, match="no arena to publish from"):
            lone.publish(ns, ns.chain_key([5]), np.zeros(8, np.uint8))
    finally:
        lone.leave()


def test_publish_failing_after_the_alloc_frees_the_block(make_env, ns: cxlkv.Namespace) -> None:
    env = make_env(geometry=cxlkv.Geometry(ring_slots=4))
    env.owner.stop()  # nothing consumes the request ring
    a = env.host(0, heartbeat_s=None)
    arena = a.home_arena
    assert arena is not None
    before = allocated(arena)
    data = np.ones(64, np.uint8)
    for i in range(4):
        a.publish(ns, ns.chain_key([i]), data)
    with pytest.raises(FullError, match="request ring full") as e:
        a.publish(ns, ns.chain_key([99]), data)
    assert "owner is behind" in str(e.value)
    assert allocated(arena) == before + 4  # the fifth block went back
    a.leave()
    with pytest.raises(ClosedError):
        a.publish(ns, ns.chain_key([100]), data)
    assert allocated(arena) == before + 4
    env.owner.start(0.002)


def test_duplicate_publish_comes_back_through_heartbeats(env: Env, ns: cxlkv.Namespace) -> None:
    a = env.host(0)
    arena = a.home_arena
    assert arena is not None
    key = ns.chain_key([6] * 16)
    data = blocks(1, env.block_bytes)[0]
    a.publish(ns, key, data)
    wait_until(lambda: a.lookup(ns, key) is not None)
    before = allocated(arena)
    a.publish(ns, key, data)  # already published: the owner hands the new block back
    wait_until(lambda: allocated(arena) == before, what="the duplicate block to be freed")
    assert a.blocks_returned >= 1


def test_reading_needs_the_publishers_arena(env: Env, ns: cxlkv.Namespace) -> None:
    a = env.host(0)
    key = ns.chain_key([8] * 16)
    a.publish(ns, key, blocks(1, env.block_bytes)[0])
    wait_until(lambda: a.lookup(ns, key) is not None)
    bare = cxlkv.Domain.join(env.domain_spec, 3, heartbeat_s=0.05)
    try:
        with bare.acquire_chain(ns, [key], wait_s=1.0) as leases:
            with pytest.raises(NotFoundError, match="no arena attached") as e:
                leases.copy_out(0, np.empty(8, np.uint8))
            assert "attach" in e.value.hint
            bare.attach(env.arena())
            assert len(leases.read(0, 8)) == 8
    finally:
        bare.leave()


def test_join_and_grow_errors(env: Env) -> None:
    with pytest.raises(InvalidArgumentError, match="host id"):
        cxlkv.Domain.join(env.domain_spec, -1)
    with pytest.raises(InvalidArgumentError) as e:
        cxlkv.Domain.join(env.domain_spec, 200)
    assert "host 200" in str(e.value)
    d = env.host(4)
    with pytest.raises(InvalidArgumentError, match="orchestrator") as e:
        d.grow()
    assert "orchestrator:" in e.value.hint


def test_geometry_bytes() -> None:
    small = cxlkv.Geometry(max_hosts=2, index_entries=64, lease_rows=4, ring_slots=4)
    assert 0 < small.bytes_needed() < cxlkv.Geometry().bytes_needed()


def test_publish_chain_is_one_transaction_and_reads_back(env: Env, ns: cxlkv.Namespace) -> None:
    a, b = env.host(0), env.host(1)
    keys = ns.chain_keys(range(96), 16)
    data = blocks(len(keys), env.block_bytes, seed=7)
    home = a.home_arena
    before = allocated(home)
    items = []
    parent = None
    for k, v in zip(keys, data):
        blk = home.alloc(0)
        home.write(blk, v)
        items.append((k, parent, blk))
        parent = k
    a.publish_chain(ns, items)
    wait_until(lambda: b.lookup(ns, keys[-1]) is not None, what="the owner to apply the chain")
    with b.acquire_chain(ns, keys, wait_s=1.0) as leases:
        assert len(leases) == len(keys)
        for i, v in enumerate(data):
            out = np.empty(env.block_bytes, np.uint8)
            leases.copy_out(i, out)
            assert np.array_equal(out, v)
    assert allocated(home) == before + len(keys)
    # Bad input: a chain longer than the request ring is refused before anything is written.
    spare = home.alloc(0)
    long_keys = ns.chain_keys(range(10**6, 10**6 + 16 * 4096), 16)
    with pytest.raises(InvalidArgumentError, match="publish it in parts"):
        a.publish_chain(ns, [(k, None, spare) for k in long_keys])
    assert a.lookup(ns, long_keys[0]) is None
    home.free(spare)
    a.publish_chain(ns, [])  # nothing to do


def test_a_lease_that_expired_while_python_held_the_gil_is_taken_again(
        make_env, ns: cxlkv.Namespace) -> None:
    # Busy hosts (docs/coherence.md): a serving process holds the GIL in long C calls (a
    # tokenizer, a torch op) between leasing a prefix and copying it out. The lease (150 ms
    # of life here) expires meanwhile; copy_out takes it again on the same entry and
    # generation and copies the block: the request reuses it instead of recomputing.
    env = make_env(geometry=cxlkv.Geometry(lease_ttl_ms=200, host_ttl_ms=2000))
    a, b = env.host(0), env.host(1)
    keys = ns.chain_keys(range(16), 16)
    data = blocks(1, env.block_bytes, seed=3)
    publish_chain(a, ns, keys[:1], data)
    with b.acquire_chain(ns, keys[:1], wait_s=1.0) as leases:
        deadline = leases.deadline_ms(0)
        held = 0
        while time.monotonic() * 1000 < deadline + 100:  # one C call at a time, GIL held
            held += sum(range(2_000_000))
        out = np.empty(env.block_bytes, np.uint8)
        leases.copy_out(0, out)
        assert np.array_equal(out, data[0])
        assert leases.deadline_ms(0) > deadline, "the handle comes back with the live lease"
    s = b.lease_stats()
    assert s["leases_retaken"] >= 1, s
    assert s["copies_discarded"] == 0, s
    assert set(s) == {"leases_refused_late", "leases_renewed_for_copy", "leases_retaken",
                      "copies_retried", "copies_discarded", "pauses_detected",
                      "rejoins_after_fence", "ack_waits"}
