"""The tier API (cxlkv.tier over cxlkv_tier_*) on a real NVMe store in a temporary directory
and a memfd or file pool: the rule's placements, lookup, byte-exact round trips through
demote -> read -> prefetch and across a reopen, pins, blocks placed in place, watermarks,
threads, explain and stats, and bad input. Mirrors tests/capi_tier_test.c from Python."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

import numpy as np
import pytest

import cxlkv
from cxlkv import Residence, Tier, TierOptions
from cxlkv.errors import (
    BufferMismatchError,
    BusyError,
    ClosedError,
    ExistsError,
    ForeignError,
    InvalidArgumentError,
    KeyLengthError,
    MismatchError,
    NotFoundError,
    StaleError,
)
from cxlkv import tier
from cxlkv.tier import PrefetchTicket
from conftest import HERE, ShmFiles

# 16 KiB blocks of 16 tokens (class 0), 32 KiB of 32 tokens (class 1), as capi_tier_test.c.
LAYOUT = cxlkv.KvLayout(layers=2, kv_heads=2, head_dim=64, dtype_bytes=2, tokens_per_block=16)
B0, B1 = 16384, 32768
# No cool-down, and a recompute rate at which one token (10 us) beats an NVMe fetch of a
# 16 KiB block (81 us) while a block's 16 tokens (160 us) do not.
FAST = "[placement]\ncooldown_ms = 0\nrecompute_tokens_per_s = 100000\n"

NS = cxlkv.Namespace("tenant", "model", "layout")
NS2 = cxlkv.Namespace("tenant", "other-model", "layout")


def chain(ns: cxlkv.Namespace, salt: int, n: int) -> List[cxlkv.PrefixKey]:
    """A request's keys from 32-byte digests, each chained on the one before (as the C
    test's Chain does, with its digest bytes)."""
    digests = [bytes((salt * 31 + b * 7 + i) & 0xFF for i in range(32)) for b in range(n)]
    return ns.digest_chain(digests)


def fill(k: cxlkv.PrefixKey, n: int) -> np.ndarray:
    """Block contents derived from the key alone, so any copy can be checked against it."""
    seed = int.from_bytes(hashlib.sha256(bytes(k)).digest()[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def filled(keys: List[cxlkv.PrefixKey], n: int) -> np.ndarray:
    return np.stack([fill(k, n) for k in keys])


def intact(rows: np.ndarray, keys: List[cxlkv.PrefixKey]) -> bool:
    return all(np.array_equal(rows[i].view(np.uint8).reshape(-1), fill(k, rows[i].nbytes))
               for i, k in enumerate(keys))


class Rig:
    """A pool with a two-class arena, and a temporary directory for stores and configs."""

    def __init__(self, spec: str, root: Path) -> None:
        self.spec = spec
        self.root = root
        self.pool = cxlkv.Pool.open(spec)
        self.arena = cxlkv.Arena.create(self.pool, LAYOUT, class_tokens=[16, 32])
        (root / "fast.toml").write_text(FAST)
        self.tiers: List[Tier] = []

    def tier(self, store: str = "nvme0", *, size_class: int = 0, config: Optional[str] = "fast",
             arena: Optional[cxlkv.Arena] = None, **kw: Any) -> Tier:
        opts = TierOptions(nvme_dir=self.root / store, size_class=size_class,
                           config_path=self.root / f"{config}.toml" if config else None, **kw)
        t = Tier.open(arena or self.arena, opts)
        self.tiers.append(t)
        return t

    def close(self) -> None:
        for t in self.tiers:
            t.close()
        self.arena.close()
        self.pool.close()


@pytest.fixture(params=["memfd", "file"])
def rig(request: pytest.FixtureRequest, tmp_path: Path, shm: ShmFiles) -> Iterator[Rig]:
    spec = ("memfd:pytest-tier?size=64M" if request.param == "memfd"
            else f"file:{shm.path('tier-pool')}?size=64M")
    r = Rig(spec, tmp_path)
    try:
        probe = r.tier("probe")
    except MismatchError as e:  # a store needs O_DIRECT
        r.close()
        pytest.skip(f"{tmp_path} cannot hold an NVMe store: {e}")
    probe.close()
    yield r
    r.close()


@pytest.fixture
def memfd_rig(tmp_path: Path, shm: ShmFiles) -> Iterator[Rig]:
    r = Rig("memfd:pytest-tier?size=64M", tmp_path)
    try:
        r.tier("probe").close()
    except MismatchError as e:
        r.close()
        pytest.skip(f"{tmp_path} cannot hold an NVMe store: {e}")
    yield r
    r.close()


# ---- the rule's placements, lookup, read, explain, stats ------------------------------------


def test_rule_placements_lookup_read_and_stats(rig: Rig) -> None:
    t = rig.tier(nvme_blocks=1000)
    assert t.block_size == B0

    # Hot: its first four blocks used twice within microseconds: CXL; blocks 4..7 take the
    # nearest ancestor's reuse interval: CXL too.
    hot = chain(NS, 1, 8)
    t.use(NS, hot[:4])
    t.use(NS, hot[:4])
    assert t.place(NS, hot, filled(hot, B0)) == [Residence.IN_CXL] * 8
    assert "below-break-even" in t.explain(hot[1])
    assert t.explain(hot[6], as_json=True)["last_move"]["reuse_source"] == "ancestor"

    # Cold: never used, nothing to inherit: NVMe, above the break-even interval.
    cold = chain(NS2, 2, 4)
    assert t.place(NS2, cold, [fill(k, B0) for k in cold]) == [Residence.ON_NVME] * 4
    js = t.explain(cold[2], as_json=True)
    assert js["residence"] == "nvme" and "file" in js["nvme"]
    assert js["last_move"]["verdict"]["clause"] == "above-break-even"
    # The tier names the key exactly as Python derived it (the same key in C and Python).
    assert js["key"] == f"{cold[2].hi:016x}{cold[2].lo:016x}"

    # One token: recomputing it beats the NVMe fetch of a block not worth CXL: dropped.
    cheap = chain(NS2, 3, 2)
    assert t.place(NS2, cheap, filled(cheap, B0), tokens=1) == [Residence.DROPPED] * 2
    assert t.where(cheap[0]) == Residence.MISSING
    assert "recompute-cheaper" in t.explain(cheap[0])

    # A pinned namespace: CXL whatever its reuse.
    pinned = chain(NS2, 4, 3)
    assert t.place(NS2, pinned, filled(pinned, B0), pin=2,
                   record_use=True) == [Residence.IN_CXL] * 3
    assert "pinned" in t.explain(pinned[0])

    # Placing a held key again copies nothing and says where it is.
    assert t.place(NS2, cold, np.zeros((1, B0), np.uint8), first=3) == [Residence.ON_NVME]

    # lookup: residence, and the block's address and ref in CXL.
    loc = t.lookup([hot[0], cold[0], cheap[0]])
    assert [x.residence for x in loc] == [Residence.IN_CXL, Residence.ON_NVME,
                                          Residence.MISSING]
    assert loc[0].addr and loc[0].ref is not None
    assert rig.arena.ref_to_addr(loc[0].ref) == loc[0].addr
    in_place = np.ctypeslib.as_array((ctypes.c_uint8 * B0).from_address(loc[0].addr))
    assert np.array_equal(in_place, fill(hot[0], B0))
    assert loc[1].addr == 0 and loc[1].ref is None
    assert t.held_run(hot + cheap) == 8 and t.held_run(cheap) == 0

    # read: from CXL and NVMe alike, byte for byte.
    out = np.full((8, B0), 0xEE, np.uint8)
    assert t.read(hot, out) == [Residence.IN_CXL] * 8 and intact(out, hot)
    assert intact(t.read_array(cold), cold)

    # A missing key fails on its own; the others are read.
    mixed = [hot[2], cheap[1], cold[1]]
    out = np.zeros((3, B0), np.uint8)
    res = t.read(mixed, out, check=False)
    assert res[0] == Residence.IN_CXL and res[2] == Residence.ON_NVME
    assert isinstance(res[1], NotFoundError) and not res.ok
    assert [i for i, _ in res.errors] == [1] and res.residences()[1] is None
    assert intact(out[[0, 2]], [hot[2], cold[1]])
    with pytest.raises(NotFoundError, match="recompute the block") as e:
        t.read(mixed, out)
    assert e.value.results is not None and e.value.results[2] == Residence.ON_NVME

    # An unaligned destination goes through a bounce buffer: the same bytes.
    raw = np.zeros(B0 + 1, np.uint8)
    assert t.read([cold[3]], [raw[1:]]) == [Residence.ON_NVME]
    assert np.array_equal(raw[1:], fill(cold[3], B0))

    s = t.stats()
    assert s.block_bytes == B0
    assert (s.placed_cxl, s.placed_nvme, s.placed_dropped, s.already_held) == (11, 4, 2, 1)
    assert (s.cxl_blocks, s.nvme_blocks) == (11, 4)
    assert s.uses == 11  # 2 x 4 hot, 3 pinned
    assert sum(s.clauses.values()) == s.decisions == 17
    assert s.clauses["pinned"] == 3 and s.clauses["recompute-cheaper"] == 2
    assert s.clauses["below-break-even"] == 8 and s.clauses["above-break-even"] == 4
    assert s.from_ancestor == 4
    assert 1 < s.break_even_s < 100
    d = s.to_dict()
    json.dumps(d)  # plain values
    assert d["retention_s"] is None  # +inf until the watermarks first evict


# ---- demote -> read -> prefetch, byte for byte ---------------------------------------------


def test_round_trip_through_demote_read_and_prefetch(rig: Rig) -> None:
    t = rig.tier(nvme_blocks=1000)
    hot = chain(NS, 1, 8)
    t.use(NS, hot)
    t.use(NS, hot)
    data = filled(hot, B0)
    assert t.place(NS, hot, data) == [Residence.IN_CXL] * 8
    assert t.demote(hot) == [Residence.ON_NVME] * 8
    assert t.where(hot[5]) == Residence.ON_NVME
    assert "demoted-by-caller" in t.explain(hot[5])
    assert t.demote(hot[:1]) == [Residence.ON_NVME]  # already there

    out = np.zeros_like(data)
    assert t.read(hot, out) == [Residence.ON_NVME] * 8  # read, not promoted
    assert np.array_equal(out, data)

    # The rule wants them back in CXL (hot, no cool-down): promoted. Polled to completion.
    ticket = t.prefetch(NS, hot)
    deadline = time.monotonic() + 30
    res = ticket.poll()
    while res is None and time.monotonic() < deadline:
        res = ticket.poll()
    assert res == [Residence.IN_CXL] * 8 and ticket.done
    assert ticket.poll() is res and ticket.wait() is res  # collected once, kept
    with pytest.raises(NotFoundError, match="no prefetch ticket 987654"):
        PrefetchTicket(t, 987654, hot).wait()
    for loc, row in zip(t.lookup(hot), data):
        assert loc.residence == Residence.IN_CXL
        assert np.array_equal(
            np.ctypeslib.as_array((ctypes.c_uint8 * B0).from_address(loc.addr)), row)
    out[:] = 0
    assert t.read(hot, out) == [Residence.IN_CXL] * 8 and np.array_equal(out, data)
    assert t.explain(hot[3], as_json=True)["last_move"]["event"] == "promoted"

    # Cold blocks: the rule keeps them on NVMe; forced, they come up.
    cold = chain(NS2, 2, 4)
    t.place(NS2, cold, filled(cold, B0))
    with t.prefetch(NS2, cold) as tk:
        pass  # leaving the block waits
    assert tk.results == [Residence.ON_NVME] * 4
    assert "prefetch-kept-on-nvme" in t.explain(cold[0])
    assert t.prefetch(NS2, cold, force=True).wait() == [Residence.IN_CXL] * 4
    assert intact(t.read_array(cold), cold)

    s = t.stats()
    assert s.demotions == 8 and s.promotions == 12 and s.prefetch_kept == 4


def test_pins_and_drop(memfd_rig: Rig) -> None:
    t = memfd_rig.tier()
    keys = chain(NS, 7, 3)
    t.place(NS, keys, filled(keys, B0), pin=2)
    with t.acquire(keys[0]) as pin:
        assert pin.addr and pin.size_bytes == B0
        assert np.array_equal(pin.array(), fill(keys[0], B0))
        with pytest.raises(ValueError):
            pin.array()[0] = 1  # read-only
        assert pin.array(np.uint16).size == B0 // 2
        with pytest.raises(BusyError, match="pins") as e:
            t.demote(keys)
        assert "release it" in str(e.value)
        # The other keys were demoted: nothing is undone when one key fails.
        assert e.value.results == [e.value, Residence.ON_NVME, Residence.ON_NVME]
        with pytest.raises(BusyError):
            t.drop(keys[:1])
    with pytest.raises(ClosedError, match="released"):
        pin.array()
    pin.release()  # idempotent
    assert t.demote(keys[:1]) == [Residence.ON_NVME]
    with pytest.raises(BusyError, match="prefetch it into CXL first"):
        t.acquire(keys[0])  # on NVMe
    nobody = cxlkv.PrefixKey(1, 2)
    with pytest.raises(NotFoundError):
        t.acquire(nobody)
    res = t.demote([nobody], check=False)
    assert isinstance(res[0], NotFoundError)
    assert t.drop(keys[:2]) == [Residence.MISSING] * 2
    assert [x.residence for x in t.lookup(keys)] == [Residence.MISSING, Residence.MISSING,
                                                     Residence.ON_NVME]
    with pytest.raises(NotFoundError, match="does not hold"):
        t.drop(keys[:1])


# ---- blocks the caller filled in place ------------------------------------------------------


def held(arena: cxlkv.Arena) -> int:
    """Blocks of class 0 this process holds (allocated and not freed)."""
    c = arena.stats().classes[0]
    return c.allocs - c.frees


def test_place_blocks_filled_in_the_arena(memfd_rig: Rig) -> None:
    arena = memfd_rig.arena
    t = memfd_rig.tier()
    ns = cxlkv.Namespace("tenant", "blocks", "layout")
    keys = chain(ns, 9, 2)
    blocks = [arena.alloc(0) for _ in keys]
    for b, k in zip(blocks, keys):
        arena.write(b, fill(k, B0))
    held_before = held(arena)
    # A block of another class is refused, and nothing is taken.
    other = arena.alloc(1)
    with pytest.raises(ForeignError, match="size class 0") as e:
        t.place_blocks(ns, keys, [blocks[0], other])
    assert "nothing was taken" in str(e.value)
    arena.free(other)
    with pytest.raises(InvalidArgumentError):
        t.place_blocks(ns, keys, [blocks[0], blocks[0]])
    with pytest.raises(InvalidArgumentError, match="1 block"):
        t.place_blocks(ns, keys, [blocks[0]])
    # Pinned: kept in place, at the caller's address.
    assert t.place_blocks(ns, keys[:1], [blocks[0]], pin=3) == [Residence.IN_CXL]
    assert t.lookup(keys[:1])[0].addr == blocks[0].addr
    # Cold: written to NVMe from the caller's block, which goes back to the arena.
    assert t.place_blocks(ns, keys, [blocks[1].ref], first=1) == [Residence.ON_NVME]
    assert intact(t.read_array(keys), keys)
    assert held(arena) == held_before - 1  # keys[0]'s block is the tier's, keys[1]'s freed
    # A stale block (freed since) is refused.
    stale = arena.alloc(0)
    arena.free(stale)
    with pytest.raises(StaleError, match="allocated now"):
        t.place_blocks(ns, chain(ns, 10, 1), [stale])


# ---- watermarks, threads --------------------------------------------------------------------


def test_watermarks_evict_the_chains_tail_first(memfd_rig: Rig) -> None:
    t = memfd_rig.tier("nvme1", size_class=1, cxl_kind=cxlkv.CxlKind.POOLED, cxl_blocks=20)
    ns = cxlkv.Namespace("tenant", "wm", "layout")
    keys = chain(ns, 20, 30)
    assert t.place(ns, keys, filled(keys, B1), pin=2) == [Residence.IN_CXL] * 30
    s = t.stats()
    assert (s.cxl_capacity_blocks, s.high_watermark_blocks, s.low_watermark_blocks) == (20, 19, 16)
    assert s.watermark_runs >= 1 and s.cxl_blocks <= 19
    assert s.cxl_blocks + s.nvme_blocks == 30 and s.demotions == s.nvme_blocks
    assert t.where(keys[0]) == Residence.ON_NVME and t.where(keys[29]) == Residence.IN_CXL
    why = t.explain(keys[0])
    assert "watermark-victim" in why and "pinned" in why
    first_cxl = next(i for i, k in enumerate(keys) if t.where(k) == Residence.IN_CXL)
    more = chain(ns, 21, 4)
    t.place(ns, more, filled(more, B1), pin=2)
    assert first_cxl > 0 and t.where(keys[first_cxl]) == Residence.IN_CXL
    assert t.where(keys[29]) == Residence.ON_NVME
    assert intact(t.read_array(keys), keys) and intact(t.read_array(more), more)


def test_threads_share_a_tier(memfd_rig: Rig) -> None:
    t = memfd_rig.tier("nvme1", size_class=1, cxl_blocks=20)
    ns = cxlkv.Namespace("threads", "model", "layout")
    failures: List[str] = []

    def work(wid: int) -> None:
        try:
            for rnd in range(6):
                keys = chain(ns, 1000 + wid * 100 + rnd, 8)
                t.place(ns, keys, filled(keys, B1), pin=2 if rnd % 2 else 0)
                if not intact(t.read_array(keys), keys):
                    failures.append(f"thread {wid} round {rnd}: read after place")
                res = t.demote(keys[:3], check=False)
                for r in res:
                    if r != Residence.ON_NVME and not isinstance(r, BusyError):
                        failures.append(f"thread {wid} round {rnd}: demote {r!r}")
                t.prefetch(ns, keys, force=True).wait(check=False)
                if not intact(t.read_array(keys), keys):
                    failures.append(f"thread {wid} round {rnd}: read after prefetch")
        except Exception as e:  # reported below with the thread's id
            failures.append(f"thread {wid}: {e!r}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures, failures
    s = t.stats()
    assert s.cxl_blocks <= s.high_watermark_blocks + 4 * 8


# ---- reopen, cool-down ----------------------------------------------------------------------


def test_nvme_blocks_survive_a_reopen_and_the_cooldown_refuses(rig: Rig) -> None:
    t = rig.tier("nvme-reopen")
    cold = chain(NS2, 30, 5)
    assert t.place(NS2, cold, filled(cold, B0)) == [Residence.ON_NVME] * 5
    t.close()
    t = rig.tier("nvme-reopen", config=None)  # the defaults: a 5 s cool-down
    assert t.read(cold, np.zeros((5, B0), np.uint8)) == [Residence.ON_NVME] * 5
    assert intact(t.read_array(cold), cold)
    assert "found on NVMe when it opened" in t.explain(cold[0])

    ns = cxlkv.Namespace("tenant", "cool", "layout")
    k = chain(ns, 77, 1)
    assert t.place(ns, k, filled(k, B0), pin=2) == [Residence.IN_CXL]
    assert t.demote(k) == [Residence.ON_NVME]
    res = t.prefetch(ns, k, force=True).wait(check=False)
    assert isinstance(res[0], BusyError) and "cool-down" in str(res[0])
    with pytest.raises(BusyError, match="cool-down"):
        t.prefetch(ns, k, force=True).wait()
    assert t.prefetch(ns, k).wait() == [Residence.ON_NVME]
    assert "cooling down" in t.explain(k[0])
    assert t.read(k, [np.zeros(B0, np.uint8)]) == [Residence.ON_NVME]
    s = t.stats()
    assert s.promotions_refused == 2 and s.promotions == 0


# ---- numpy and torch sources and destinations -----------------------------------------------


def test_torch_tensors_in_and_out_with_dtype_checks(memfd_rig: Rig) -> None:
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    t = memfd_rig.tier()
    keys = chain(NS, 40, 3)
    src = torch.randn(3, B0 // 2).to(torch.bfloat16)
    t.use(NS, keys)
    t.use(NS, keys)
    assert t.place(NS, keys, src, dtype=torch.bfloat16) == [Residence.IN_CXL] * 3
    dst = torch.zeros(3, B0 // 2, dtype=torch.bfloat16)
    assert t.read(keys, dst, dtype=torch.bfloat16) == [Residence.IN_CXL] * 3
    assert torch.equal(dst, src)
    t.demote(keys)
    rows = [torch.zeros(B0 // 2, dtype=torch.bfloat16) for _ in keys]
    assert t.read(keys, rows) == [Residence.ON_NVME] * 3
    assert all(torch.equal(r, src[i]) for i, r in enumerate(rows))
    with pytest.raises(BufferMismatchError, match="wrong dtype: expected float16"):
        t.read(keys, dst, dtype=torch.float16)
    with pytest.raises(BufferMismatchError, match="requires grad"):
        t.read(keys, torch.zeros(3, B0 // 4, requires_grad=True))
    with pytest.raises(BufferMismatchError, match="not contiguous"):
        t.read(keys, torch.zeros(B0 // 2, 3, dtype=torch.bfloat16).t())
    # Wrong sizes: one element short; a row of the wrong size in a list.
    with pytest.raises(BufferMismatchError, match=f"need {3 * B0}"):
        t.read(keys, torch.zeros(3, B0 // 2 - 1, dtype=torch.bfloat16))
    with pytest.raises(BufferMismatchError, match="buffer 1"):
        t.place(NS, keys, [src[0], src[1][:-1], src[2]])


# ---- bad input ------------------------------------------------------------------------------


def test_bad_input_raises_before_anything_is_done(memfd_rig: Rig) -> None:
    t = memfd_rig.tier()
    keys = chain(NS, 50, 2)
    before = t.stats()
    data = filled(keys, B0)
    # Wrong digest length: no key, nothing placed.
    with pytest.raises(KeyLengthError, match="expected 16 or 32 bytes"):
        NS.digest_chain([b"\1" * 32, b"\2" * 20])
    # A digest where a key belongs.
    with pytest.raises(InvalidArgumentError, match="digest_key"):
        t.place(NS, [keys[0], hashlib.sha256(b"x").digest()], data)  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match="sequence of PrefixKey"):
        t.lookup(keys[0])  # type: ignore[arg-type]
    # Wrong sizes and dtypes.
    with pytest.raises(BufferMismatchError, match=f"need {2 * B0}"):
        t.place(NS, keys, data[:, :-1].copy())
    with pytest.raises(BufferMismatchError, match="wrong dtype"):
        t.place(NS, keys, data, dtype=np.float16)
    with pytest.raises(BufferMismatchError, match="not C-contiguous"):
        t.place(NS, keys, np.zeros((B0, 2), np.uint8).T)
    with pytest.raises(InvalidArgumentError, match="1 buffer"):
        t.place(NS, keys, [data[0]])
    ro = np.zeros((2, B0), np.uint8)
    ro.setflags(write=False)
    with pytest.raises(BufferMismatchError, match="read-only"):
        t.read(keys, ro)
    with pytest.raises(BufferMismatchError, match="neither"):
        t.read(keys, object())
    # Request fields.
    with pytest.raises(InvalidArgumentError, match="first=2"):
        t.place(NS, keys, data, first=2)
    with pytest.raises(InvalidArgumentError, match="pin level"):
        t.use(NS, keys, pin=9)
    with pytest.raises(InvalidArgumentError, match="namespace"):
        t.use(0, keys)
    with pytest.raises(InvalidArgumentError, match="no keys"):
        t.use(NS, [])
    assert t.stats() == before  # nothing reached the tier
    assert t.lookup([]) == []


def test_bad_options_name_the_field_and_the_fix(memfd_rig: Rig) -> None:
    rig = memfd_rig
    with pytest.raises(InvalidArgumentError, match="cxl_kind 7") as e:
        rig.tier("bad", cxl_kind=7)
    assert "CXLKV_TIER_CXL_POOLED" in str(e.value) and "Tier(class 0" in str(e.value)
    with pytest.raises(InvalidArgumentError, match="size_class 9"):
        rig.tier("bad", size_class=9)
    with pytest.raises(InvalidArgumentError, match="cxl_blocks"):
        rig.tier("bad", cxl_blocks=1 << 30)
    with pytest.raises(InvalidArgumentError, match="nvme_dir is empty"):
        Tier.open(rig.arena, TierOptions(nvme_dir=""))
    with pytest.raises(InvalidArgumentError, match="size_class=-1"):
        rig.tier("bad", size_class=-1)
    (rig.root / "bad-value.toml").write_text(
        "[placement]\nttft_budget_ms = 300\nnvme_read_gbps = -3\n")
    with pytest.raises(InvalidArgumentError, match=r"bad-value.toml:3.*placement.nvme_read_gbps"
                       r".*out of range") as e:
        rig.tier("bad", config="bad-value")
    assert "domain.example.toml" in str(e.value)
    with pytest.raises(NotFoundError, match="missing.toml"):
        rig.tier("bad", config="missing")
    with pytest.raises(InvalidArgumentError, match="not both"):
        Tier.open(rig.arena, TierOptions(nvme_dir=rig.root / "x"), size_class=1)
    # One tier per class; the store directory is locked by its tier.
    t = rig.tier("one")
    with pytest.raises(ExistsError, match="size class 0") as e:
        rig.tier("two")
    assert "close the class's other tier" in str(e.value)
    other_pool = cxlkv.Pool.open("memfd:pytest-tier-2?size=16M")
    other = cxlkv.Arena.create(other_pool, LAYOUT)
    try:
        with pytest.raises(MismatchError) as e:
            rig.tier("one", arena=other)
        assert "close the tier or process that holds the store" in str(e.value)
    finally:
        other.close()
        other_pool.close()
    t.close()


def test_a_closed_tier_and_a_tier_whose_arena_closed(tmp_path: Path) -> None:
    pool = cxlkv.Pool.open("memfd:pytest-tier-closed?size=8M")
    arena = cxlkv.Arena.create(pool, LAYOUT)
    try:
        t = Tier.open(arena, nvme_dir=tmp_path / "nvme")
    except MismatchError as e:
        pool.close()
        pytest.skip(f"{tmp_path} cannot hold an NVMe store: {e}")
    keys = chain(NS, 5, 2)
    t.place(NS, keys, filled(keys, B0), pin=2)
    t.close()
    t.close()  # idempotent
    assert t.closed and "closed" in repr(t)
    with pytest.raises(ClosedError, match="is closed") as e:
        t.lookup(keys)
    assert "Tier.open" in str(e.value)
    with pytest.raises(ClosedError):
        t.stats()

    t = Tier.open(arena, nvme_dir=tmp_path / "nvme")
    t.place(NS, keys, filled(keys, B0), pin=2)
    pin = t.acquire(keys[0])
    tk = t.prefetch(NS, keys)
    arena.close()  # the tier ends with its arena
    for call in (lambda: t.lookup(keys), lambda: t.place(NS, keys, filled(keys, B0)),
                 t.stats, lambda: tk.wait(), pin.release):
        with pytest.raises(ClosedError, match="its arena was closed") as e:
            call()
        assert "open a new one over an open arena" in str(e.value)
    t.close()  # still needed, and safe
    # The class is free again for a new arena handle over the same pool.
    arena = cxlkv.Arena.open(pool)
    with Tier.open(arena, nvme_dir=tmp_path / "nvme") as t2:
        assert t2.block_size == B0
        # What was on NVMe is found again; CXL blocks of the ended tier are gone.
        assert all(r in (Residence.MISSING, Residence.ON_NVME)
                   for r in (x.residence for x in t2.lookup(keys)))
    with pytest.raises(ClosedError):
        t2.where(keys[0])
    arena.close()
    pool.close()


def test_a_process_killed_mid_tier_leaves_the_store_usable(tmp_path: Path,
                                                            shm: ShmFiles) -> None:
    """Blocks written to NVMe by a process that dies without closing are found by the next
    tier on the directory (the store's lock dies with the process)."""
    spec = f"file:{shm.path('tier-kill')}?size=16M"
    with cxlkv.Pool.open(spec) as p:
        cxlkv.Arena.create(p, LAYOUT).close()
    code = f"""
import os, sys
sys.path.insert(0, {str(HERE.parent)!r}); sys.path.insert(0, {str(HERE)!r})
import cxlkv, numpy as np
from test_tier import chain, filled, NS2, B0
a = cxlkv.Arena.open_spec({spec.split('?')[0]!r})
t = cxlkv.Tier.open(a, nvme_dir={str(tmp_path / 'nvme')!r}, nvme_dsync=True)
keys = chain(NS2, 60, 4)
assert t.place(NS2, keys, filled(keys, B0)) == [cxlkv.Residence.ON_NVME] * 4
print("placed", flush=True)
os._exit(0)  # no close
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ))
    if "cannot hold" in r.stderr or "O_DIRECT" in r.stderr:
        pytest.skip(r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0 and "placed" in r.stdout, r.stderr
    arena = cxlkv.Arena.open_spec(spec.split("?")[0])
    # Reads forced through the store's staging buffers: the blocks come back the same.
    with Tier.open(arena, nvme_dir=tmp_path / "nvme", nvme_stage_reads=True) as t:
        keys = chain(NS2, 60, 4)
        assert [x.residence for x in t.lookup(keys)] == [Residence.ON_NVME] * 4
        assert intact(t.read_array(keys), keys)
    arena.close()


def test_nvme_read_staging_maps_to_the_c_flags() -> None:
    """None lets the store measure; True / False force one way; dsync combines with either."""
    flags = lambda **kw: TierOptions(nvme_dir="d", **kw).to_c()[0].flags  # noqa: E731
    assert flags() == 0
    assert flags(nvme_stage_reads=True) == tier.NVME_STAGE_READS
    assert flags(nvme_stage_reads=False) == tier.NVME_DIRECT_READS
    assert flags(nvme_stage_reads=False, nvme_dsync=True) == (tier.NVME_DIRECT_READS
                                                              | tier.NVME_DSYNC)


# ---- an engine's request loop, as docs/tier-capi.md's example -------------------------------


def serve(t: Tier, ns: cxlkv.Namespace, keys: List[cxlkv.PrefixKey],
          compute: Callable[[cxlkv.PrefixKey], np.ndarray]) -> Tuple[int, np.ndarray]:
    """One request: admission, the leading run of hits (prefetched, then read), the misses
    computed and placed. Returns (hits, the request's KV blocks)."""
    t.use(ns, keys)
    hits = t.held_run(keys)
    kv = np.empty((len(keys), t.block_size), np.uint8)
    if hits:
        t.prefetch(ns, keys[:hits]).wait(check=False)  # what the rule wants back in CXL
        res = t.read(keys[:hits], kv[:hits], check=False)
        ok = next((i for i, r in enumerate(res) if not isinstance(r, Residence)), hits)
        hits = ok  # a hit gone meanwhile: recompute from there
    for i in range(hits, len(keys)):
        kv[i] = compute(keys[i])
    if hits < len(keys):
        t.place(ns, keys, kv[hits:], first=hits)
    return hits, kv


def test_an_engines_request_loop(memfd_rig: Rig) -> None:
    t = memfd_rig.tier(nvme_blocks=1000)
    ns = cxlkv.Namespace("tenant-a", "llama3-8b", "2x2x64xbf16/16")
    digests = [hashlib.sha256(f"block {b}".encode()).digest() for b in range(4)]
    keys = ns.digest_chain(digests)
    computed: List[cxlkv.PrefixKey] = []

    def compute(k: cxlkv.PrefixKey) -> np.ndarray:
        computed.append(k)
        return fill(k, B0)

    hits, kv = serve(t, ns, keys, compute)
    assert hits == 0 and len(computed) == 4 and intact(kv, keys)
    assert [x.residence for x in t.lookup(keys)] == [Residence.ON_NVME] * 4  # new: NVMe
    hits, kv = serve(t, ns, keys, compute)
    assert hits == 4 and len(computed) == 4 and intact(kv, keys)  # nothing recomputed
    # The second use moments later: the rule promoted them.
    assert [x.residence for x in t.lookup(keys)] == [Residence.IN_CXL] * 4
    # A longer prompt sharing the prefix: only its new block is computed.
    longer = ns.digest_chain(digests + [hashlib.sha256(b"block 4").digest()])
    assert longer[:4] == keys
    hits, kv = serve(t, ns, longer, compute)
    assert hits == 4 and computed[-1] == longer[4] and intact(kv, longer)


def test_the_readme_tier_example_runs(tmp_path: Path) -> None:
    text = (HERE.parent / "README.md").read_text()
    m = re.search(r"## Tiering.*?```python\n(.*?)```", text, re.S)
    assert m, "python/README.md has a Tiering section with an example"
    code = m.group(1).replace("/var/tmp/cxlkv-nvme", str(tmp_path / "nvme"))
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "request 2: 4 hit(s)" in r.stdout, r.stdout
