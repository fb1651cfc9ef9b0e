"""The vLLM SecondaryTierManager-shaped offload tier, two hosts in one process
(test_multihost.py runs them as separate processes)."""

from __future__ import annotations

import hashlib
import threading
import time
from typing import List, Optional

import numpy as np
import pytest

import cxlkv
from cxlkv.errors import ClosedError, InvalidArgumentError, KeyLengthError
from conftest import Env, wait_until

BLOCK, BLOCKS = 4096, 16


def offload_keys(n: int, group: int = 0, salt: bytes = b"") -> List[bytes]:
    """vLLM-style OffloadKeys: a chained 32-byte block hash + the 4-byte group index."""
    keys, prior = [], b""
    for i in range(n):
        prior = hashlib.sha256(prior + salt + i.to_bytes(4, "little")).digest()
        keys.append(prior + group.to_bytes(4, "big"))
    return keys


def primary(seed: int = 0) -> memoryview:
    return memoryview(bytearray(np.random.default_rng(seed).integers(
        0, 256, BLOCK * BLOCKS, dtype=np.uint8).tobytes()))


def block(view: memoryview, i: int) -> bytes:
    return bytes(view[i * BLOCK:(i + 1) * BLOCK])


def finished(tier: cxlkv.OffloadTier, n: int = 1) -> List[cxlkv.TierJobResult]:
    out: List[cxlkv.TierJobResult] = []
    wait_until(lambda: bool(out.extend(tier.get_finished()) or len(out) >= n),
               what=f"{n} finished job(s)")
    return out


@pytest.fixture
def env(make_env) -> Env:
    return make_env(block_bytes=BLOCK, blocks=64)


def tier(env: Env, host: int, ns: cxlkv.Namespace, view: memoryview, *,
         heartbeat_s: Optional[float] = 0.05, **kw) -> cxlkv.OffloadTier:
    t = cxlkv.OffloadTier(env.host(host, heartbeat_s=heartbeat_s), ns, view, block_bytes=BLOCK,
                          **kw)
    env._closers.insert(0, t.shutdown)
    return t


def test_store_then_lookup_then_load_on_another_host(env: Env, ns: cxlkv.Namespace) -> None:
    pa, pb = primary(1), primary(2)
    a, b = tier(env, 0, ns, pa), tier(env, 1, ns, pb)
    keys = offload_keys(4)
    assert [b.lookup(k) for k in keys] == [False] * 4
    a.submit_store(cxlkv.TierJob(7, keys, np.array([3, 4, 5, 6])))
    res = finished(a)
    assert res[0].job_id == 7 and res[0].success and res[0].transfer_bytes == 4 * BLOCK
    assert res[0].transfer_time is not None
    wait_until(lambda: all(b.lookup(k) for k in keys), what="the blocks visible on host 1")
    b.submit_load(cxlkv.TierJob(8, keys, np.array([10, 11, 12, 13]), is_promotion=True))
    res = finished(b)
    assert res[0].success and res[0].successful_keys is None
    for i in range(4):
        assert block(pb, 10 + i) == block(pa, 3 + i)
    assert b.get_finished() == []


def test_lookup_says_in_flight_until_the_owner_applied_the_store(env: Env,
                                                                 ns: cxlkv.Namespace) -> None:
    env.owner.stop()  # the owner applies nothing until restarted
    pa = primary(3)
    a = tier(env, 0, ns, pa)
    keys = offload_keys(2, salt=b"inflight")
    a.submit_store(cxlkv.TierJob(1, keys, np.array([0, 1])))
    assert finished(a)[0].success
    assert [a.lookup(k) for k in keys] == [None, None]  # published, not yet applied
    env.owner.start(0.002)
    wait_until(lambda: all(a.lookup(k) is True for k in keys), what="the owner to apply")


def test_lookup_says_in_flight_while_a_store_is_queued(env: Env, ns: cxlkv.Namespace) -> None:
    a = tier(env, 0, ns, primary(12))
    k = offload_keys(1, salt=b"queued")
    with a.domain._lock:  # the worker cannot start the job; this thread can still look up
        a.submit_store(cxlkv.TierJob(1, k, np.array([0])))
        assert a.lookup(k[0]) is None
    assert finished(a)[0].success
    wait_until(lambda: a.lookup(k[0]) is True)


def test_lookup_gives_up_on_a_publication_never_applied(env: Env, ns: cxlkv.Namespace) -> None:
    env.owner.stop()
    a = tier(env, 0, ns, primary(4), visibility_timeout_s=1.0)
    k = offload_keys(1, salt=b"never")
    a.submit_store(cxlkv.TierJob(1, k, np.array([0])))
    finished(a)
    assert a.lookup(k[0]) is None
    time.sleep(1.1)
    assert a.lookup(k[0]) is False
    env.owner.start(0.002)


def test_submit_is_non_blocking(env: Env, ns: cxlkv.Namespace) -> None:
    a = tier(env, 0, ns, primary(5))
    keys = offload_keys(3, salt=b"nb")
    returned = threading.Event()
    # Hold the domain: the worker cannot copy, yet submit_* must return.
    with a.domain._lock:
        t = threading.Thread(target=lambda: (a.submit_store(cxlkv.TierJob(1, keys, np.arange(3))),
                                             a.submit_load(cxlkv.TierJob(2, keys, np.arange(3, 6))),
                                             returned.set()))
        t.start()
        assert returned.wait(2.0), "submit_store/submit_load blocked on the domain"
        assert a.get_finished() == []  # nothing could finish while the domain was held
    t.join()
    done = finished(a, 2)
    assert {r.job_id for r in done} == {1, 2}


def test_partial_load_reports_the_keys_that_made_it(env: Env, ns: cxlkv.Namespace) -> None:
    pa, pb = primary(6), primary(7)
    a, b = tier(env, 0, ns, pa), tier(env, 1, ns, pb)
    keys = offload_keys(4, salt=b"partial")
    a.submit_store(cxlkv.TierJob(1, keys[:2], np.array([0, 1])))
    assert finished(a)[0].success
    wait_until(lambda: b.lookup(keys[1]) is True)
    b.submit_load(cxlkv.TierJob(2, keys, np.array([4, 5, 6, 7])))
    r = finished(b)[0]
    assert not r.success and r.successful_keys == keys[:2]
    assert block(pb, 4) == block(pa, 0) and block(pb, 5) == block(pa, 1)
    assert block(pb, 6) == block(primary(7), 6)  # untouched


def test_groups_and_namespaces_keep_blocks_apart(env: Env, ns: cxlkv.Namespace) -> None:
    a = tier(env, 0, ns, primary(8))
    other = tier(env, 1, cxlkv.Namespace("pytest", "model-b", "layout-1"), primary(9))
    k0 = offload_keys(1, group=0, salt=b"g")
    k1 = offload_keys(1, group=1, salt=b"g")
    a.submit_store(cxlkv.TierJob(1, k0, np.array([0])))
    finished(a)
    wait_until(lambda: a.lookup(k0[0]) is True)
    assert a.lookup(k1[0]) is False
    assert other.lookup(k0[0]) is False


def test_bad_jobs_are_refused_and_queue_nothing(env: Env, ns: cxlkv.Namespace) -> None:
    pa = primary(10)
    a = tier(env, 0, ns, pa)
    keys = offload_keys(2, salt=b"bad")
    with pytest.raises(KeyLengthError, match="OffloadKey of 32 bytes") as e:
        a.submit_store(cxlkv.TierJob(1, [keys[0][:-4]], np.array([0])))
    assert "make_offload_key" in e.value.hint
    with pytest.raises(KeyLengthError, match="OffloadKey of type str"):
        a.lookup(keys[0].hex())
    with pytest.raises(InvalidArgumentError, match="2 keys but 1 block ids"):
        a.submit_store(cxlkv.TierJob(2, keys, np.array([0])))
    with pytest.raises(InvalidArgumentError, match=f"block id {BLOCKS} is outside"):
        a.submit_load(cxlkv.TierJob(3, keys, np.array([0, BLOCKS])))
    with pytest.raises(InvalidArgumentError, match="1-D integer"):
        a.submit_load(cxlkv.TierJob(4, keys, np.array([0.5, 1.5])))
    assert a.drain(1.0) and a.get_finished() == []
    assert [a.lookup(k) for k in keys] == [False, False]  # nothing was half stored
    a.shutdown()
    with pytest.raises(ClosedError, match="shut down"):
        a.submit_store(cxlkv.TierJob(5, keys, np.array([0, 1])))


def test_primary_view_checks(env: Env, ns: cxlkv.Namespace) -> None:
    d = env.host(0)
    with pytest.raises(cxlkv.errors.BufferMismatchError, match="writable"):
        cxlkv.OffloadTier(d, ns, memoryview(bytes(BLOCK * 2)), block_bytes=BLOCK)
    with pytest.raises(cxlkv.errors.BufferMismatchError, match="whole number"):
        cxlkv.OffloadTier(d, ns, memoryview(bytearray(BLOCK + 1)), block_bytes=BLOCK)
    with pytest.raises(InvalidArgumentError, match="do not fit"):
        cxlkv.OffloadTier(d, ns, memoryview(bytearray(BLOCK * 4)), block_bytes=BLOCK * 2)


def test_a_closed_domain_fails_jobs_not_the_process(env: Env, ns: cxlkv.Namespace) -> None:
    a = tier(env, 0, ns, primary(11), heartbeat_s=None)
    keys = offload_keys(2, salt=b"closed")
    with a.domain._lock:  # queue a job, then leave before the worker can run it
        a.submit_store(cxlkv.TierJob(1, keys, np.array([0, 1])))
        a.domain.leave()
    r = finished(a)[0]
    assert not r.success and r.error and "has left the domain" in r.error
    with pytest.raises(ClosedError):
        a.lookup(keys[0])


def test_events_stores_then_removals_when_blocks_come_back(env: Env,
                                                          ns: cxlkv.Namespace) -> None:
    """track_events: take_events gives each successful store's new keys, then, when the owner
    hands the tier's own blocks back (here: retired by this host), the keys that left, long
    before the periodic look (30 s here) would have found them."""
    t = tier(env, 1, ns, primary(1), track_events=True, removal_check_s=30)
    keys = offload_keys(3, salt=b"events")
    t.submit_store(cxlkv.TierJob(1, keys, np.arange(3)))
    assert [r.success for r in finished(t)] == [True]
    assert t.take_events() == [(False, keys)]
    wait_until(lambda: all(t.lookup(k) for k in keys), what="the stored blocks")
    t.submit_store(cxlkv.TierJob(2, keys[:2], np.arange(2)))  # stored already: no new event
    assert [r.success for r in finished(t)] == [True]
    assert t.take_events() == []
    t.domain.retire(ns, t.key(keys[1]))
    got: List = []
    wait_until(lambda: bool(got.extend(t.take_events()) or got), what="the removal")
    assert got == [(True, [keys[1]])]
    assert [t.lookup(k) for k in keys] == [True, False, True]


def test_no_events_unless_tracked(env: Env, ns: cxlkv.Namespace) -> None:
    t = tier(env, 1, ns, primary(1))
    keys = offload_keys(2, salt=b"untracked")
    t.submit_store(cxlkv.TierJob(1, keys, np.arange(2)))
    assert [r.success for r in finished(t)] == [True]
    assert t.take_events() == []
    with pytest.raises(InvalidArgumentError, match="removal_check_s"):
        cxlkv.OffloadTier(t.domain, ns, primary(2), block_bytes=BLOCK, track_events=True,
                          removal_check_s=0)
