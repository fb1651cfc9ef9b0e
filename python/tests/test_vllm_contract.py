"""Contract tests of the vLLM tier, one per interface generation (vllm_interfaces.py states
each generation's interface as facts read at its release tag, docs/engines.md).

Each test builds the adapter class for a generation over that generation's base class
(``build_tier_class``, as the package does over the installed vLLM's), registers it, and
drives it as that generation's engine does: construction through the factory's exact call
with the tier's config dict, a cascaded store of primary rows, lookups until the blocks are
readable, a promotion (load) into other primary rows, the finished-jobs poll, and shutdown.
Two engines (hosts) of one domain: blocks one stores, the other loads, byte for byte.
What only a real engine checks is listed in vllm_interfaces.py's docstring.
"""

from __future__ import annotations

import hashlib
import types
from typing import Any, Dict, List

import numpy as np
import pytest

import cxlkv

from cxlkv.errors import BufferMismatchError, EngineVersionError, FullError, InvalidArgumentError
from cxlkv.integrations import vllm as adapter
from cxlkv.integrations import vllm_generations as gens
from conftest import Env, wait_until
import vllm_interfaces as V

ROW, ROWS = 4096, 16
MODEL = "meta-llama/Llama-3.1-8B"


def offload_keys(n: int, salt: bytes = b"") -> List[bytes]:
    """OffloadKeys as vLLM makes them: a chained 32-byte block hash + 4-byte big-endian group."""
    keys, prior = [], b""
    for i in range(n):
        prior = hashlib.sha256(prior + salt + i.to_bytes(4, "little")).digest()
        keys.append(prior + (0).to_bytes(4, "big"))
    return keys


def primary_view(seed: int, row_stride: int = ROW) -> memoryview:
    """The primary tier's memoryview as vLLM shapes it: one row per block (uint8), rows
    ``row_stride`` bytes apart (the tiers read the block size from strides[0])."""
    buf = np.random.default_rng(seed).integers(0, 256, (ROWS, row_stride), dtype=np.uint8)
    return memoryview(buf[:, :ROW]) if row_stride != ROW else memoryview(buf)


def spec(tp: int = 1, dp_rank: int = 0, model: str = MODEL, dtype: str = "bfloat16",
         cache_dtype: str = "auto") -> V.OffloadingSpec:
    return V.OffloadingSpec(V.VllmConfig(V.ModelConfig(model, dtype),
                                         V.ParallelConfig(tp, 1, dp_rank),
                                         V.CacheConfig(cache_dtype)))


def registry_for(g: V.Generation) -> Dict[str, type]:
    """The factory's registry after the plugin registered the tier for generation `g`."""
    cls = adapter.build_tier_class(
        gens.generation_named(g.name), g.base, g.result_cls, engine_version=g.version,
        lookup_result=V.LookupResult, request_context_cls=V.RequestOffloadingContext,
        medium=V.Medium.CPU if g.name == "0.32" else None)
    return {adapter.TIER_TYPE: cls}


@pytest.fixture
def env(make_env) -> Env:
    return make_env(block_bytes=ROW, blocks=64)


def tier_config(env: Env, host_id: int, **extra: Any) -> Dict[str, Any]:
    return dict(type="cxlkv", domain=env.domain_spec, host_id=host_id, pool=env.pool_spec,
                heartbeat_s=0.05, **extra)


def make_tier(env: Env, g: V.Generation, host_id: int, view: memoryview, **extra: Any) -> Any:
    t = V.create_secondary_tier(registry_for(g), tier_config(env, host_id, **extra), view,
                                spec())
    env._closers.insert(0, t.shutdown)
    return t


@pytest.mark.parametrize("g", V.GENERATIONS, ids=lambda g: g.name)
def test_the_adapter_has_the_generations_interface(g: V.Generation) -> None:
    cls = registry_for(g)[adapter.TIER_TYPE]
    assert issubclass(cls, g.base)
    assert not getattr(cls, "__abstractmethods__", None), "an abstract method is left"
    ours = gens.generation_named(g.name)
    assert set(ours.abstract_methods) == set(g.base.__abstractmethods__)
    assert ours.covers(g.version) and ours.job_ids_field == g.ids_field


@pytest.mark.parametrize("g", V.GENERATIONS, ids=lambda g: g.name)
def test_the_installed_base_class_tells_its_generation(g: V.Generation) -> None:
    """What the package does with an installed vLLM: the class that fits its base (abstract
    methods, lookup's declared answer), whatever the version says."""
    found = gens.generation_of_interface(frozenset(g.base.__abstractmethods__),
                                         adapter._answers_lookup_result(g.base, V.LookupResult),
                                         g.version)
    assert found is not None and found.name == g.name


@pytest.mark.parametrize("g", V.GENERATIONS, ids=lambda g: g.name)
def test_engine_round_trip_across_two_hosts(env: Env, g: V.Generation) -> None:
    va, vb = primary_view(1), primary_view(2)
    a = make_tier(env, g, 1, va)
    b = make_tier(env, g, 2, vb)
    assert a.tier_type == "cxlkv" and a.core.host_id == 1
    ctx = V.ReqContext("req-1")
    if g.on_new_request:
        assert isinstance(a.on_new_request(ctx), V.RequestOffloadingContext)
    keys = offload_keys(4)
    assert [g.found(b.lookup(k, ctx)) for k in keys] == [False] * 4
    # The manager cascades a store of primary rows 0..3 of engine A.
    a.submit_store(g.job(7, keys, np.arange(4, dtype=np.int64), False, ctx))
    done = V.poll(getattr(a, g.finished), 1)
    assert [(r.job_id, r.success) for r in done] == [(7, True)]
    assert type(done[0]) is g.result_cls
    wait_until(lambda: all(g.found(b.lookup(k, ctx)) for k in keys), what="blocks visible on B")
    # Engine B promotes them into its primary rows 8..11.
    b.submit_load(g.job(9, keys, np.arange(8, 12, dtype=np.int64), True, ctx))
    done = V.poll(getattr(b, g.finished), 1)
    assert [(r.job_id, r.success) for r in done] == [(9, True)]
    src, dst = np.asarray(va), np.asarray(vb)
    assert np.array_equal(src[0:4], dst[8:12])
    if g.drain_jobs:
        b.drain_jobs()
    a.touch(keys, ctx)


@pytest.mark.parametrize("g", V.GENERATIONS[-1:], ids=lambda g: g.name)
def test_rows_with_a_stride_are_addressed_as_rows(env: Env, g: V.Generation) -> None:
    """A primary view whose rows are further apart than their bytes: block i is the row at
    base + i * strides[0], never the i-th 4 KiB of the buffer."""
    va, vb = primary_view(3, row_stride=ROW + 512), primary_view(4, row_stride=ROW + 512)
    a, b = make_tier(env, g, 1, va), make_tier(env, g, 2, vb)
    keys = offload_keys(3, b"stride")
    a.submit_store(g.job(1, keys, np.array([5, 0, 9]), False, V.ReqContext("r")))
    assert [r.success for r in V.poll(a.get_finished_jobs, 1)] == [True]
    wait_until(lambda: all(g.found(b.lookup(k, V.ReqContext("r"))) for k in keys))
    b.submit_load(g.job(2, keys, np.array([1, 2, 3]), True, V.ReqContext("r")))
    assert [r.success for r in V.poll(b.get_finished_jobs, 1)] == [True]
    src, dst = np.asarray(va), np.asarray(vb)
    assert np.array_equal(src[[5, 0, 9]], dst[[1, 2, 3]])
    assert a.core.namespace == b.core.namespace


def test_a_load_of_missing_blocks_fails_and_names_what_loaded(env: Env) -> None:
    g = V.GENERATIONS[-1]
    vb = primary_view(5)
    before = bytes(np.asarray(vb).tobytes())
    b = make_tier(env, g, 2, vb)
    b.submit_load(g.job(3, offload_keys(2, b"absent"), np.array([0, 1]), True,
                        V.ReqContext("r")))
    [r] = V.poll(b.get_finished_jobs, 1)
    assert (r.job_id, r.success, list(r.successful_keys)) == (3, False, [])
    assert np.asarray(vb).tobytes() == before


# ---- bad input: errors at engine start that name the setting and the fix -----------------------


def _start_error(env: Env, g: V.Generation, view: Any = None, spec_: Any = None,
                 version: str = "", **cfg: Any) -> Exception:
    reg = {adapter.TIER_TYPE: adapter.build_tier_class(
        gens.generation_named(g.name), g.base, g.result_cls, engine_version=version or g.version,
        lookup_result=V.LookupResult, request_context_cls=V.RequestOffloadingContext)}
    c = tier_config(env, 1)
    c.update(cfg)
    c = {k: v for k, v in c.items() if v is not None}
    with pytest.raises(Exception) as e:
        t = V.create_secondary_tier(reg, c, view if view is not None else primary_view(0),
                                    spec_ or spec())
        t.shutdown()
    return e.value


def test_an_engine_outside_the_pin_is_refused_with_the_reason(env: Env) -> None:
    g = V.GENERATIONS[0]
    e = _start_error(env, g, version="0.23.1")
    assert isinstance(e, EngineVersionError)
    assert "0.23.1" in str(e) and "0.22" in str(e)
    assert "pinned to the 0.23 interface" in str(e) and "has the 0.22 one" in str(e)
    assert "allow_untested_version" in e.hint
    e = _start_error(env, g, version="0.40.0")
    assert "supports vLLM >=0.22.0,<0.34.0" in str(e)
    # Allowed by the configuration, it starts.
    reg = registry_for(g)
    reg[adapter.TIER_TYPE] = adapter.build_tier_class(
        gens.generation_named(g.name), g.base, g.result_cls, engine_version="0.40.0")
    t = V.create_secondary_tier(reg, tier_config(env, 1, allow_untested_version=True),
                                primary_view(0), spec())
    t.shutdown()


def test_a_config_missing_a_key_or_with_an_unknown_one_is_refused(env: Env) -> None:
    g = V.GENERATIONS[1]
    e = _start_error(env, g, host_id=None)
    assert isinstance(e, InvalidArgumentError) and "'host_id'" in str(e)
    e = _start_error(env, g, pool=None)
    assert "no pool" in str(e) and "orchestrator" in e.hint
    e = _start_error(env, g, hostid=3)
    assert "'hostid'" in str(e) and "host_id" in e.hint


def test_block_bytes_must_match_the_view(env: Env) -> None:
    g = V.GENERATIONS[2]
    e = _start_error(env, g, block_bytes=2048)
    assert isinstance(e, BufferMismatchError)
    assert "block_bytes = 2048" in str(e) and "4096" in e.hint
    flat = memoryview(bytearray(ROW * 4))
    e = _start_error(env, g, view=flat)
    assert "needs block_bytes" in str(e)
    ro = memoryview(bytes(ROW * 4)).cast("B", (4, ROW))
    e = _start_error(env, g, view=ro)
    assert isinstance(e, BufferMismatchError) and "read-only" in str(e)
    e = _start_error(env, g, spec_=spec(tp=3))
    assert "3 tensor-parallel workers" in str(e)
    e = _start_error(env, g, spec_=spec(model=""))
    assert "no model name" in str(e) and "set model" in e.hint


def test_a_key_of_the_wrong_form_is_refused_before_anything_is_stored(env: Env) -> None:
    g = V.GENERATIONS[-1]
    a = make_tier(env, g, 1, primary_view(6))
    from cxlkv.errors import KeyLengthError

    with pytest.raises(KeyLengthError, match="OffloadKey of 7 bytes"):
        a.submit_store(g.job(1, [b"1234567"], np.array([0]), False, V.ReqContext("r")))
    with pytest.raises(InvalidArgumentError, match="neither 'chunk_ids' nor 'block_ids'"):
        a.submit_store(types.SimpleNamespace(job_id=1, keys=offload_keys(1), ids=[0]))
    assert a.get_finished_jobs() == []


def test_namespaces_separate_models_tp_sizes_and_data_parallel_engines_join_apart(
        env: Env) -> None:
    g = V.GENERATIONS[3]
    reg = registry_for(g)
    ts = []
    for i, s in enumerate([spec(), spec(model="other"), spec(tp=2), spec(dp_rank=1),
                           spec(dtype="float16"), spec(cache_dtype="fp8")]):
        t = V.create_secondary_tier(reg, tier_config(env, [0, 1, 2, 5, 3, 4][i]),
                                    primary_view(i), s)
        env._closers.insert(0, t.shutdown)
        ts.append(t)
    nss = [t.core.namespace for t in ts]
    assert nss[0] != nss[1] and nss[0] != nss[2] and nss[0] == nss[3]
    assert len({nss[0], nss[4], nss[5]}) == 3  # bf16, fp16 and an fp8 KV cache apart
    assert [t.core.host_id for t in ts] == [0, 1, 2, 6, 3, 4]  # host_id + data_parallel_rank


@pytest.mark.parametrize("g", V.GENERATIONS, ids=lambda g: g.name)
def test_the_checks_round_trip_drives_each_generation(g: V.Generation) -> None:
    """python -m cxlkv.integrations.check's round trip, over each generation's class (with
    vLLM installed it runs over the installed one's)."""
    import types

    from cxlkv.integrations import check

    mod = types.SimpleNamespace(GENERATION=gens.generation_named(g.name), IMPORT_ERROR=None,
                                TIER_TYPE=adapter.TIER_TYPE,
                                CxlkvSecondaryTier=registry_for(g)[adapter.TIER_TYPE])
    base = types.SimpleNamespace(**{V.JOB_NAMES[g.job_cls]: g.job_cls})
    assert check._roundtrip_vllm(mod, base) == []


from test_orchestrator import orchestrator  # noqa: E402,F401  (the fixture: a real daemon)


def test_an_orchestrator_domain_needs_no_pool(orchestrator: str) -> None:  # noqa: F811
    """The documented orchestrator: config without pool: each tier grows an arena in an
    extent the orchestrator lends (cxlkv_domain_grow), and blocks one engine stores the other
    loads."""
    g = V.GENERATIONS[-1]
    reg = registry_for(g)
    va, vb = primary_view(11), primary_view(12)
    cfg = dict(type="cxlkv", domain=orchestrator, host_id=0, heartbeat_s=0.05)
    a = V.create_secondary_tier(reg, cfg, va, spec())
    try:
        b = V.create_secondary_tier(reg, dict(cfg, host_id=1), vb, spec())
        try:
            assert a.core._att.grown is not None and a.core._att.arenas == []
            keys = offload_keys(2, b"orch")
            a.submit_store(g.job(1, keys, np.array([0, 1]), False, V.ReqContext("r")))
            assert [r.success for r in V.poll(a.get_finished_jobs, 1)] == [True]
            wait_until(lambda: all(g.found(b.lookup(k, V.ReqContext("r"))) for k in keys))
            b.submit_load(g.job(2, keys, np.array([4, 5]), True, V.ReqContext("r")))
            assert [r.success for r in V.poll(b.get_finished_jobs, 1)] == [True]
            assert np.array_equal(np.asarray(va)[0:2], np.asarray(vb)[4:6])
        finally:
            b.shutdown()
    finally:
        a.shutdown()


def events_registry() -> Dict[str, type]:
    """The registry of an engine whose base has take_events (tier-owned events)."""
    g = V.GENERATIONS[-1]
    cls = adapter.build_tier_class(
        gens.generation_named(g.name), V.SecondaryTierManagerEvents, g.result_cls,
        engine_version=g.version, lookup_result=V.LookupResult,
        request_context_cls=V.RequestOffloadingContext, medium=V.Medium.CPU,
        event_cls=V.OffloadingEvent, locality_cls=V.Locality)
    return {adapter.TIER_TYPE: cls}


def test_stores_reach_the_engines_kv_events_under_its_own_keys(env: Env) -> None:
    """With tier-owned events (vLLM PR #46544) and enable_kv_events, each store job that
    succeeded becomes one OffloadingEvent naming the engine's own keys (which vLLM publishes
    as BlockStored with its block hashes); loads (found or not), events off in vLLM, or the
    option unset yield none."""
    g = V.GENERATIONS[-1]
    on = spec()
    on.kv_events_config = V.KVEventsConfig(enable_kv_cache_events=True)
    ctx = V.ReqContext("req-ev")

    def tier(host_id: int, sp: V.OffloadingSpec, **extra: Any) -> Any:
        t = V.create_secondary_tier(events_registry(), tier_config(env, host_id, **extra),
                                    primary_view(host_id), sp)
        env._closers.insert(0, t.shutdown)
        return t

    a = tier(1, on, enable_kv_events=True, locality="REMOTE")
    assert list(a.take_events()) == []
    keys = offload_keys(3)
    a.submit_store(g.job(5, keys, np.arange(3, dtype=np.int64), False, ctx))
    assert [(r.job_id, r.success) for r in V.poll(a.get_finished_jobs, 1)] == [(5, True)]
    ev = list(a.take_events())
    assert ev == [V.OffloadingEvent(keys=keys, medium=V.Medium.CPU, removed=False,
                                    locality=V.Locality.REMOTE)]
    assert list(a.take_events()) == []  # taken once
    # A load is no store: no event.
    a.submit_load(g.job(6, keys, np.arange(8, 11, dtype=np.int64), True, ctx))
    assert [r.success for r in V.poll(a.get_finished_jobs, 1)] == [True]
    assert list(a.take_events()) == []
    # A load that fails (nothing stored under those keys) yields none either.
    b = tier(2, on, enable_kv_events=True)
    missing = offload_keys(2, salt=b"never-stored")
    b.submit_load(g.job(7, missing, np.arange(2, dtype=np.int64), True, ctx))
    assert [r.success for r in V.poll(b.get_finished_jobs, 1)] == [False]
    assert list(b.take_events()) == []
    # vLLM's events off, or the option unset: the tier records nothing.
    for t in (tier(3, spec(), enable_kv_events=True), tier(4, on)):
        more = offload_keys(2, salt=bytes([t.core.host_id]))
        t.submit_store(g.job(8, more, np.arange(2, dtype=np.int64), False, ctx))
        assert [r.success for r in V.poll(t.get_finished_jobs, 1)] == [True]
        assert list(t.take_events()) == []
    with pytest.raises(InvalidArgumentError, match="locality"):
        tier(5, on, enable_kv_events=True, locality="NEARBY")


@pytest.mark.parametrize("base,lookup_enum,version,want", [
    (V.SecondaryTierManagerV24, False, "0.24.0", "0.23"),
    (V.SecondaryTierManagerV26Drain, True, "0.26.0", "0.26"),
    (V.SecondaryTierManagerV32, True, "0.32.0", "0.32"),
], ids=["v0.24-branch", "main-after-LookupResult", "v0.32"])
def test_bases_that_declare_drain_jobs_get_the_class_of_their_release(
        env: Env, base: type, lookup_enum: bool, version: str, want: str) -> None:
    """drain_jobs became abstract on vLLM's main before LookupResult did, so releases of the
    0.23 and 0.26 interfaces may declare it (the v0.24.0 branch does): the installed base and
    version pick the class, it implements drain_jobs, and the engine constructs it and runs a
    store through it."""
    gen = gens.generation_of_interface(frozenset(base.__abstractmethods__), lookup_enum, version)
    assert gen is not None and gen.name == want and gen.covers(version)
    g = next(x for x in V.GENERATIONS if x.name == want)
    cls = adapter.build_tier_class(gen, base, g.result_cls, engine_version=version,
                                   lookup_result=V.LookupResult,
                                   request_context_cls=V.RequestOffloadingContext,
                                   medium=V.Medium.CPU if gen.drain_jobs else None)
    assert not getattr(cls, "__abstractmethods__", None)
    t = V.create_secondary_tier({adapter.TIER_TYPE: cls}, tier_config(env, 1), primary_view(1),
                                spec())
    env._closers.insert(0, t.shutdown)
    ctx = V.ReqContext("req-d")
    keys = offload_keys(2, salt=version.encode())
    job = V.JobMetadata(3, keys, np.arange(2, dtype=np.int64), False, ctx)
    t.submit_store(job)
    t.drain_jobs()
    assert [(r.job_id, r.success) for r in V.poll(t.get_finished_jobs, 1)] == [(3, True)]


def _events_tier(env: Env, host_id: int, **extra: Any) -> Any:
    sp = spec()
    sp.kv_events_config = V.KVEventsConfig(enable_kv_cache_events=True)
    t = V.create_secondary_tier(events_registry(), tier_config(env, host_id, enable_kv_events=True,
                                                               removal_check_s=0.05, **extra),
                                primary_view(host_id), sp)
    env._closers.insert(0, t.shutdown)
    return t


def _collect(t: Any, until: Any, timeout_s: float = 5.0) -> List[Any]:
    """take_events, polled as the engine's manager does each step, until `until(events)`."""
    import time

    out: List[Any] = []
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        out.extend(t.take_events())
        if until(out):
            return out
        time.sleep(0.005)
    pytest.fail(f"timed out; events so far: {out}")


def test_blocks_that_leave_the_domain_are_announced_removed(env: Env) -> None:
    """Keys the tier announced as stored whose blocks then leave the domain (here: another
    host's block that a store found there, retired by that host) come back from take_events as
    one OffloadingEvent(removed=True), which vLLM publishes as BlockRemoved under its own
    block hashes, so a router stops scoring them; a later store of the same keys is announced
    stored again, after the removal."""
    g = V.GENERATIONS[-1]
    ctx = V.ReqContext("req-rm")
    a = _events_tier(env, 1, locality="LOCAL")
    other = env.host(5)  # another engine's host of the domain
    keys = offload_keys(3, salt=b"rm")
    pks = [a.tier.key(k) for k in keys]
    for pk in pks[:2]:  # the other host holds the first two blocks already
        other.publish(a.core.namespace, pk, np.full(ROW, 7, np.uint8))
    wait_until(lambda: all(other.lookup(a.core.namespace, pk) for pk in pks[:2]))
    a.submit_store(g.job(1, keys, np.arange(3, dtype=np.int64), False, ctx))
    assert [r.success for r in V.poll(a.get_finished_jobs, 1)] == [True]
    assert list(a.take_events()) == [V.OffloadingEvent(keys, V.Medium.CPU, False,
                                                       V.Locality.LOCAL)]
    for pk in pks[:2]:
        other.retire(a.core.namespace, pk)
    ev = _collect(a, lambda out: out)
    assert ev == [V.OffloadingEvent(keys[:2], V.Medium.CPU, True, V.Locality.LOCAL)]
    # The third block (the tier's own) is still there: never announced removed.
    assert [a.tier.lookup(k) for k in keys] == [False, False, True]
    assert list(a.take_events()) == []
    a.submit_store(g.job(2, keys, np.arange(3, dtype=np.int64), False, ctx))
    assert [r.success for r in V.poll(a.get_finished_jobs, 1)] == [True]
    assert list(a.take_events()) == [V.OffloadingEvent(keys[:2], V.Medium.CPU, False,
                                                       V.Locality.LOCAL)]


def test_blocks_the_owner_evicts_are_announced_removed(make_env) -> None:
    """The owner evicts under index pressure (a 256-entry index keeps 192 entries): every
    announced key that a lookup then misses is announced removed, exactly once, and no key
    that is still there is."""
    env = make_env(block_bytes=ROW, blocks=512, geometry=cxlkv.Geometry(index_entries=256))
    g = V.GENERATIONS[-1]
    ctx = V.ReqContext("req-evict")
    a = _events_tier(env, 1)
    stored: List[bytes] = []
    events: List[Any] = []
    for job in range(4):
        keys = offload_keys(ROWS, salt=b"evict%d" % job)
        a.submit_store(g.job(job, keys, np.arange(ROWS, dtype=np.int64), False, ctx))
        assert [r.success for r in V.poll(a.get_finished_jobs, 1)] == [True]
        wait_until(lambda: all(a.tier.lookup(k) for k in keys), what="the stored blocks")
        stored += keys
        events += a.take_events()
    assert [e.keys for e in events if not e.removed] == [stored[i:i + ROWS]
                                                        for i in range(0, len(stored), ROWS)]
    # Another engine's host fills the index past what the owner keeps.
    other, other_ns = env.host(5), cxlkv.Namespace("pytest", "another-model", "l")
    for i in range(160):
        key = other_ns.digest_key(hashlib.sha256(b"fill%d" % i).digest())
        wait_until(lambda: _published(other, other_ns, key), what="room in the request ring")

    def settled(out: List[Any]) -> bool:
        removed = [k for e in events + out if e.removed for k in e.keys]
        missing = [k for k in stored if a.tier.lookup(k) is False]
        return bool(removed) and sorted(removed) == sorted(missing)

    events += _collect(a, settled)
    removed = [k for e in events if e.removed for k in e.keys]
    assert len(removed) == len(set(removed))
    assert all(a.tier.lookup(k) is False for k in removed)


def _published(d: Any, ns: Any, key: Any) -> bool:
    try:
        d.publish(ns, key, np.zeros(ROW, np.uint8))
        return True
    except FullError:
        return False


# ---- released engines as the package sees them installed (issue #41) ---------------------------


def _installed(monkeypatch: pytest.MonkeyPatch, tag: str, version: str) -> Any:
    """cxlkv.integrations.vllm's import-time pick over a vLLM of release `tag` (the facts of
    vllm_interfaces.release_modules), as the package does over an installed one; the adapter's
    module state is put back after the test."""
    _install(monkeypatch, tag, version)
    assert adapter.CxlkvSecondaryTier is not None, adapter.IMPORT_ERROR
    return adapter.CxlkvSecondaryTier


def _install(monkeypatch: pytest.MonkeyPatch, tag: str, version: str) -> None:
    import sys

    for name in ("IMPORT_ERROR", "ENGINE_VERSION", "GENERATION", "IDENTIFICATION",
                 "CxlkvSecondaryTier"):
        monkeypatch.setattr(adapter, name, getattr(adapter, name))
    for name, mod in V.release_modules(tag, version).items():
        monkeypatch.setitem(sys.modules, name, mod)
    adapter._from_installed_vllm()


@pytest.mark.parametrize("version", ["0.25.0", "0.25.1"])
def test_vllm_025_starts_and_round_trips(env: Env, monkeypatch: pytest.MonkeyPatch,
                                         version: str) -> None:
    """At the v0.25.0 tag (v0.25.1: the same tiering/base.py) lookup already answers
    LookupResult and drain_jobs is abstract: the 0.26 interface. The engine constructs the
    tier through the factory's call and round-trips blocks (it was refused: "vLLM 0.25.0 is
    outside the pin of the 0.32 interface")."""
    cls = _installed(monkeypatch, "v0.25.0", version)
    reg = {adapter.TIER_TYPE: cls}
    va, vb = primary_view(21), primary_view(22)
    a = V.create_secondary_tier(reg, tier_config(env, 1), va, spec())
    env._closers.insert(0, a.shutdown)
    b = V.create_secondary_tier(reg, tier_config(env, 2), vb, spec())
    env._closers.insert(0, b.shutdown)
    ctx = V.ReqContext("req-025")
    keys = offload_keys(3, salt=version.encode())
    assert [b.lookup(k, ctx) for k in keys] == [V.LookupResult.MISS] * 3
    a.submit_store(V.JobMetadata(1, keys, np.arange(3, dtype=np.int64), False, ctx))
    assert [(r.job_id, r.success) for r in V.poll(a.get_finished_jobs, 1)] == [(1, True)]
    wait_until(lambda: all(b.lookup(k, ctx) is V.LookupResult.HIT for k in keys))
    b.submit_load(V.JobMetadata(2, keys, np.arange(5, 8, dtype=np.int64), True, ctx))
    b.drain_jobs()
    assert [(r.job_id, r.success) for r in V.poll(b.get_finished_jobs, 1)] == [(2, True)]
    assert np.array_equal(np.asarray(va)[0:3], np.asarray(vb)[5:8])
    # The class of the 0.26 interface, inside its pin (no warning, no override).
    assert adapter.GENERATION.name == "0.26" and adapter.GENERATION.covers(version)
    assert gens.generation_for(version).name == "0.26"
    assert issubclass(cls, V.SecondaryTierManagerV25) and not cls.__abstractmethods__


def test_a_known_shape_runs_whatever_the_version_says(env: Env,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The class is the one the installed base class's shape asks for; a version outside the
    releases that shape was read at is logged, not refused (no allow_untested_version)."""
    cls = _installed(monkeypatch, "v0.26.0", "0.26.1.dev7+g568afb3a")
    t = V.create_secondary_tier({adapter.TIER_TYPE: cls}, tier_config(env, 1), primary_view(1),
                                spec())
    t.shutdown()
    cls = _installed(monkeypatch, "v0.25.0", "0.40.0")
    assert adapter.GENERATION.name in ("0.26", "0.32")
    t = V.create_secondary_tier({adapter.TIER_TYPE: cls}, tier_config(env, 1), primary_view(1),
                                spec())
    t.shutdown()


def test_vllm_026_events_name_the_cpu_medium_as_a_string(env: Env,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """v0.26.0 has no Medium enum: OffloadingEvent.medium is a str, vLLM's CPU tier's is "CPU"
    (kv_events.py MEDIUM_CPU). The tier's events name that medium (they named None, which
    routers read as the device tier, scoring CXL-held blocks as GPU hits)."""
    cls = _installed(monkeypatch, "v0.26.0", "0.26.0")
    assert adapter.GENERATION.name == "0.26"
    sp = spec()
    sp.kv_events_config = V.KVEventsConfig(enable_kv_cache_events=True)
    t = V.create_secondary_tier({adapter.TIER_TYPE: cls},
                                tier_config(env, 1, enable_kv_events=True, locality="LOCAL"),
                                primary_view(1), sp)
    env._closers.insert(0, t.shutdown)
    ctx = V.ReqContext("req-026")
    keys = offload_keys(2, salt=b"026")
    t.submit_store(V.JobMetadata(4, keys, np.arange(2, dtype=np.int64), False, ctx))
    assert [(r.job_id, r.success) for r in V.poll(t.get_finished_jobs, 1)] == [(4, True)]
    ev = list(t.take_events())
    assert [e.medium for e in ev] == ["CPU"]
    assert ev == [V.OffloadingEventV26(keys, "CPU", False, V.Locality.LOCAL)]
    assert type(ev[0].medium) is str and t.medium == "CPU"


# ---- python -m cxlkv.integrations.check over released shapes (issue #41, item 5) ----------------

#: The shape facts of the 0.26 interface as the check prints them (v0.25.0 and v0.26.0 tags).
SHAPE_026 = ["abstract methods: drain_jobs, get_finished_jobs, lookup, on_new_request, "
             "submit_load, submit_store", "lookup answers: LookupResult",
             "job: JobMetadata.block_ids"]


#: The 0.28 and 0.32 shapes: the 0.26 abstract set and lookup, jobs as TransferJob.
SHAPE_028 = SHAPE_026[:2] + ["job: TransferJob.block_ids"]
SHAPE_032 = SHAPE_026[:2] + ["job: TransferJob.chunk_ids"]


@pytest.mark.parametrize("tag,version,want,facts", [
    ("v0.25.0", "0.25.1", "0.26", SHAPE_026),
    ("v0.26.0", "0.26.0", "0.26", SHAPE_026),
    ("0.28-shape", "0.29.1", "0.28", SHAPE_028),
    ("v0.32.0", "0.33.1", "0.32", SHAPE_032),
], ids=lambda x: x if isinstance(x, str) else "")
def test_the_check_names_the_generation_and_the_facts_that_matched(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tag: str, version: str,
        want: str, facts: List[str]) -> None:
    """The check reports the generation the adapter built for the installed base class and
    why (the facts of that base, read by the adapter's own code), then round-trips blocks
    through that class: exit 0."""
    from cxlkv.integrations import check

    _installed(monkeypatch, tag, version)
    rc = check.main(["vllm"])
    out = capsys.readouterr()
    assert rc == 0, out
    assert f"vllm: ok (version {version}," in out.out
    assert f"  generation: {want}\n" in out.out
    for fact in facts + [f"only the {want} interface has this shape"]:
        assert f"    because: {fact}\n" in out.out, fact
    f = check.check_engine("vllm")
    assert (f["status"], f["generation"], f["shape"]) == ("ok", want, facts)
    assert f["generation"] == adapter.GENERATION.name  # the adapter's pick, not a second one


def test_the_check_says_when_the_version_broke_a_tie() -> None:
    """Where the job dataclass cannot be read, the 0.26, 0.28 and 0.32 shapes are equal: the
    version picks between them, and the reasons say so."""
    shape = gens.BaseShape(tuple(sorted(V.SecondaryTierManagerV26.__abstractmethods__)), True)
    ident = gens.identify(shape, "0.26.0")
    assert ident.generation.name == "0.26"
    assert set(ident.candidates) == {"0.26", "0.28", "0.32"}
    assert any("version 0.26.0 is in the 0.26 one's releases" in r for r in ident.reasons())
    ident = gens.identify(shape, "0.40.0")
    assert ident.generation.name == gens.GENERATIONS[-1].name
    assert any("is in none of their releases" in r for r in ident.reasons())
    assert any("the tier runs by the shape" in r for r in ident.reasons())


def test_the_check_fails_loudly_on_a_shape_no_generation_has(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        caplog: pytest.LogCaptureFixture) -> None:
    """A base class of no known shape (here: one more abstract method than any release has)
    fails the check with exit 1, naming the engine, its version, its shape and what did not
    match each generation, on stdout and stderr; no round trip runs. The adapter's import
    logs the same shape, pointing at the check."""
    from cxlkv.integrations import check

    with caplog.at_level("WARNING", logger="cxlkv.integrations.vllm"):
        _install(monkeypatch, "unknown-shape", "0.26.0")
    assert adapter.IDENTIFICATION.generation is None
    assert "shape no cxlkv generation knows" in caplog.text and "lookup_batch" in caplog.text
    rc = check.main(["vllm"])
    out = capsys.readouterr()
    assert rc == 1
    assert "vllm: FAILED (version 0.26.0," in out.out
    assert "  generation: none (unknown shape); falls back to 0.26 by version" in out.out
    assert "problem: not the 0.26 interface: abstract methods: declares lookup_batch " \
           "abstract" in out.out
    assert "problem: not the 0.22 interface: abstract methods: declares drain_jobs" not in \
        out.out  # drain_jobs is never held against a shape
    assert "lookup_batch" in out.err and "vllm 0.26.0" in out.err
    assert "no cxlkv adapter generation knows" in out.err
    f = check.check_engine("vllm")
    assert f["status"] == "failed" and f["generation"] is None
    assert not any("round trip" in p for p in f["problems"])


# ---- v0.28+: module_path registration, chunk-named jobs, mediums (issue #41, item 2) -----------

#: The user's secondary_tiers entry on v0.28+: the class by name and its module, nothing else
#: (no vllm.general_plugins entry point, no register_tier).
MODULE_PATH = dict(type="CxlkvSecondaryTier", module_path="cxlkv.integrations.vllm")


def _events_spec() -> V.OffloadingSpec:
    sp = spec()
    sp.kv_events_config = V.KVEventsConfig(enable_kv_cache_events=True)
    return sp


@pytest.mark.parametrize("tag,version,want", [
    ("0.28-shape", "0.28.0", "0.28"),
    ("0.28-shape", "0.31.0", "0.28"),
    ("v0.32.0", "0.32.0", "0.32"),
    ("v0.32.0", "0.33.1", "0.32"),
])
def test_module_path_from_the_users_config_alone_round_trips(
        env: Env, monkeypatch: pytest.MonkeyPatch, tag: str, version: str, want: str) -> None:
    """vLLM v0.28+ constructs the tier from the secondary_tiers entry alone (type = the class,
    module_path = this package's module; PR #51007): nothing registered, no plugin. The engine
    drives it with its own job dataclass (TransferJob with block_ids, or chunk_ids after the
    rename), polls JobResult, takes events naming Medium.CPU, and a second engine loads the
    blocks byte for byte."""
    _install(monkeypatch, tag, version)
    assert adapter.IDENTIFICATION.generation.name == want  # by shape
    r = V.RELEASES[tag]
    registry: Dict[str, type] = {}
    va, vb = primary_view(31), primary_view(32)
    cfg = dict(MODULE_PATH, domain=env.domain_spec, pool=env.pool_spec, heartbeat_s=0.05,
               enable_kv_events=True)
    a = V.create_secondary_tier_module_path(registry, dict(cfg, host_id=1), va, _events_spec())
    env._closers.insert(0, a.shutdown)
    b = V.create_secondary_tier_module_path(registry, dict(cfg, host_id=2), vb, _events_spec())
    env._closers.insert(0, b.shutdown)
    assert registry == {} and type(a) is adapter.CxlkvSecondaryTier
    assert isinstance(a, r["base"]) and a.tier_type == "CxlkvSecondaryTier"
    assert a.medium is V.Medium.CPU
    ids = adapter.GENERATION.job_ids_field
    ctx = V.ReqContext("req-mp")
    keys = offload_keys(3, salt=tag.encode() + version.encode())

    def job(job_id: int, rows: Any, promotion: bool) -> Any:
        return r["job"](**{"job_id": job_id, "keys": keys, ids: rows,
                           "is_promotion": promotion, "req_context": ctx})

    assert [b.lookup(k, ctx) for k in keys] == [V.LookupResult.MISS] * 3
    a.submit_store(job(1, np.arange(3, dtype=np.int64), False))
    done = V.poll(a.get_finished_jobs, 1)
    assert [(type(x), x.job_id, x.success) for x in done] == [(r["result"], 1, True)]
    assert list(a.take_events()) == [V.OffloadingEvent(keys, V.Medium.CPU, False, None)]
    wait_until(lambda: all(b.lookup(k, ctx) is V.LookupResult.HIT for k in keys))
    b.submit_load(job(2, np.arange(6, 9, dtype=np.int64), True))
    b.drain_jobs()
    assert [(x.job_id, x.success) for x in V.poll(b.get_finished_jobs, 1)] == [(2, True)]
    assert np.array_equal(np.asarray(va)[0:3], np.asarray(vb)[6:9])


def test_module_path_with_a_factory_that_passes_it_on_is_accepted(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A factory that left module_path in the config would hand it to the tier: accepted and
    ignored, not refused as an unknown key."""
    _install(monkeypatch, "v0.32.0", "0.32.0")
    t = adapter.CxlkvSecondaryTier(offloading_spec=spec(), primary_kv_view=primary_view(33),
                                   tier_type="CxlkvSecondaryTier",
                                   **{k: v for k, v in tier_config(env, 1).items()
                                      if k != "type"},
                                   module_path="cxlkv.integrations.vllm")
    t.shutdown()


def test_a_storage_medium_is_declared_filtered_and_named_in_events(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """medium: STORAGE (vLLM's Medium.STORAGE, PR #48123) makes the tier declare that medium,
    its events name it, and a request whose load tier filter does not allow STORAGE misses
    (allowed, it hits). An unknown medium is refused, naming the ones accepted."""
    _install(monkeypatch, "v0.32.0", "0.32.0")
    cfg = dict(MODULE_PATH, domain=env.domain_spec, pool=env.pool_spec, heartbeat_s=0.05,
               enable_kv_events=True, medium="STORAGE", locality="REMOTE")
    t = V.create_secondary_tier_module_path({}, dict(cfg, host_id=1), primary_view(34),
                                            _events_spec())
    env._closers.insert(0, t.shutdown)
    assert t.medium is V.Medium.STORAGE and type(t).medium is V.Medium.CPU
    ctx = V.ReqContext("req-st")
    keys = offload_keys(2, salt=b"storage")
    t.submit_store(V.TransferJob(1, keys, np.arange(2, dtype=np.int64), False, ctx))
    assert [x.success for x in V.poll(t.get_finished_jobs, 1)] == [True]
    assert list(t.take_events()) == [V.OffloadingEvent(keys, V.Medium.STORAGE, False,
                                                       V.Locality.REMOTE)]
    wait_until(lambda: t.lookup(keys[0], ctx) is V.LookupResult.HIT)
    cpu_only = V.ReqContextFiltered("r1", load_tier_filter=V.TierFilter([V.Medium.CPU]))
    storage = V.ReqContextFiltered("r2", load_tier_filter=V.TierFilter([V.Medium.STORAGE]))
    assert [t.lookup(k, cpu_only) for k in keys] == [V.LookupResult.MISS] * 2
    assert [t.lookup(k, storage) for k in keys] == [V.LookupResult.HIT] * 2
    with pytest.raises(InvalidArgumentError, match="medium 'NVME' is not one of CPU, STORAGE"):
        V.create_secondary_tier_module_path({}, dict(cfg, host_id=2, medium="NVME"),
                                            primary_view(35), _events_spec())
