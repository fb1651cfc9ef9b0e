"""Contract tests of the SGLang backend (sglang_interfaces.py states SGLang's interface as
facts read at its release tags, docs/engines.md): built over that base class as the package
builds it over the installed SGLang's, constructed by the dynamic loader's exact call, every
rank of an engine from one extra config, driven through the zero-copy path the controller
picks with ``interface_v1`` and through the generic path without it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

from cxlkv.errors import EngineVersionError, InvalidArgumentError, KeyLengthError
from cxlkv.integrations import sglang as adapter
from cxlkv.page_store import HostPagePool
from conftest import Env, wait_until
import sglang_interfaces as S

PAGE, TOKENS, TOKEN_BYTES = 16, 64, 64  # tokens per page, pool tokens, bytes per token and part
PAGE_BYTES = 2 * PAGE * TOKEN_BYTES
MODEL = "Qwen/Qwen3-8B"
HERE = Path(__file__).resolve().parent

#: The adapter class over the interface's base, as the package builds it (module_path and
#: class_name of the extra config below point here, so the dynamic loader imports it).
VERSION = "0.5.6"  # the first release that gives a dynamic backend the zero-copy path
Backend = adapter.build_backend_class(S.HiCacheStorage, VERSION)


@pytest.fixture
def env(make_env) -> Env:
    return make_env(block_bytes=PAGE_BYTES, blocks=128)


def page_keys(n: int, salt: bytes = b"") -> List[str]:
    """SGLang-style chained page hashes (hex SHA-256)."""
    keys, prior = [], b""
    for i in range(n):
        prior = hashlib.sha256(prior + salt + i.to_bytes(4, "little")).digest()
        keys.append(prior.hex())
    return keys


def extra_config(env: Env, host_id: int = 0, **more: Any) -> Dict[str, Any]:
    return dict(backend_name="cxlkv", module_path=__name__, class_name="Backend",
                interface_v1=1, domain=env.domain_spec, host_id=host_id, pool=env.pool_spec,
                heartbeat_s=0.05, **more)


def pool(seed: int, dtype: Any = np.uint8) -> HostPagePool:
    data = np.random.default_rng(seed).integers(0, 256, (2, TOKENS, TOKEN_BYTES), np.uint8)
    return HostPagePool(data.view(dtype), PAGE, kv_parts=2)


def start(env: Env, cfgs: List[S.HiCacheStorageConfig], pools: List[HostPagePool]) -> List[Any]:
    out = []
    for c, p in zip(cfgs, pools):
        b = S.create_dynamic_backend(c)
        b.register_mem_pool_host(p)
        env._closers.insert(0, b.close)
        out.append(b)
    return out


def idx(pages: List[int]) -> np.ndarray:
    return np.concatenate([np.arange(p * PAGE, (p + 1) * PAGE) for p in pages]).astype(np.int64)


def test_every_rank_of_one_config_joins_as_its_own_host(env: Env) -> None:
    """The bug this fixes: all ranks joined as one host, so rank 0's pages never showed."""
    cfg = extra_config(env, host_id=2)
    ranks = start(env, S.rank_configs(cfg, MODEL, tp_size=2, dp_size=2),
                  [pool(i) for i in range(4)])
    assert [r.core.host_id for r in ranks] == [2, 3, 4, 5]
    assert S.zero_copy(cfg, VERSION) and all(r.core.path == "v1" for r in ranks)
    keys = page_keys(2)
    for r in ranks:  # each rank stores its slice of the same two pages
        assert r.batch_set_v1(keys, idx([0, 1]), S.HiCacheStorageExtraInfo()) == [True, True]
    # A second engine's ranks (same config, other host rows) find each of them and read
    # their own rank's slice, byte for byte.
    other = start(env, S.rank_configs(extra_config(env, host_id=6), MODEL, tp_size=2),
                  [pool(10), pool(11)])
    for tp, o in enumerate(other):
        wait_until(lambda: o.batch_exists(keys) == 2, what=f"rank {tp}'s pages")
        assert o.batch_get_v1(keys, idx([2, 3])) == [True, True]
        src, dst = ranks[tp].core.stores[False].mem_pool_host, o.core.stores[False].mem_pool_host
        assert np.array_equal(src.data[:, 0:2 * PAGE], dst.data[:, 2 * PAGE:4 * PAGE])
    assert other[0].core.stores[False].namespace != other[1].core.stores[False].namespace


def test_the_namespace_separates_dtype_layout_and_path(env: Env) -> None:
    cfg = S.rank_configs(extra_config(env), MODEL)[0]
    a = start(env, [cfg], [pool(1)])[0]
    keys = page_keys(1, b"ns")
    assert a.batch_set_v1(keys, idx([0])) == [True]
    wait_until(lambda: a.batch_exists(keys) == 1)
    # bf16-as-int16 vs uint8 pools, a layer_first pool, the generic path: none finds it.
    b16 = pool(2, np.int16)
    lf = pool(3)
    lf.layout = "layer_first"
    gen_cfg = S.rank_configs(dict(extra_config(env, host_id=3), interface_v1=0), MODEL)[0]
    others = start(env, [S.rank_configs(extra_config(env, host_id=1), MODEL)[0],
                         S.rank_configs(extra_config(env, host_id=2), MODEL)[0], gen_cfg],
                   [b16, lf, pool(4)])
    assert others[2].core.path == "generic"
    for o in others:
        assert o.batch_exists(keys) == 0
    names = {str(x.core.stores[False].namespace) for x in [a, *others]}
    assert len(names) == 4


def test_generic_path_round_trip(env: Env) -> None:
    """Without interface_v1 SGLang copies pages through batch_set / batch_get."""
    cfgs = [S.rank_configs(dict(extra_config(env, host_id=h), interface_v1=0), MODEL)[0]
            for h in (0, 1)]
    a, b = start(env, cfgs, [pool(1), pool(2)])
    keys = page_keys(2, b"generic")
    vals = [np.random.default_rng(i).integers(0, 256, PAGE_BYTES, np.uint8) for i in range(2)]
    assert a.batch_set(keys, vals) is True
    wait_until(lambda: b.batch_exists(keys) == 2)
    got = b.batch_get(keys, [np.zeros(PAGE_BYTES, np.uint8) for _ in keys])
    assert all(np.array_equal(g, v) for g, v in zip(got, vals))


def test_draft_keys_live_in_their_own_namespace(env: Env) -> None:
    cfg = S.rank_configs(extra_config(env), MODEL)[0]
    a = start(env, [cfg], [pool(1)])[0]
    keys = page_keys(2, b"draft")
    drafts = ["d:" + k for k in keys]
    assert a.batch_set_v1(drafts, idx([0, 1]),
                          S.HiCacheStorageExtraInfo(prefix_keys=["d:" + page_keys(1)[0]])) == [
        True, True]
    wait_until(lambda: a.batch_exists(drafts) == 2)
    assert a.batch_exists(keys) == 0  # the main model's pages of the same hashes: absent
    assert a.exists(drafts[0]) and not a.exists(keys[0])
    with pytest.raises(InvalidArgumentError, match="mixes draft"):
        a.batch_exists([drafts[0], keys[1]])
    with pytest.raises(KeyLengthError):
        a.batch_exists(["x:" + keys[0]])


def test_extra_info_with_its_released_default_means_no_prefix_keys(env: Env) -> None:
    """SGLang 0.5.4 - 0.5.9 default prefix_keys to (None,): HiCacheStorageExtraInfo() is
    "no prefix keys", as prefix_keys=None and no extra_info are (it failed: "KeyLengthError:
    prefix_keys: key of type NoneType"). Main and draft pages, every batch call."""
    a, b = start(env, [S.rank_configs(extra_config(env, host_id=h), MODEL)[0] for h in (0, 1)],
                 [pool(1), pool(2)])
    assert S.HiCacheStorageExtraInfo().prefix_keys == (None,)
    keys = page_keys(3, b"default")
    for i, info in enumerate([S.HiCacheStorageExtraInfo(),
                              S.HiCacheStorageExtraInfo(prefix_keys=None),
                              S.HiCacheStorageExtraInfo(prefix_keys=[])]):
        assert a.batch_set_v1(keys[i:i + 1], idx([i]), info) == [True]
    drafts = ["d:" + k for k in page_keys(1, b"default-draft")]
    assert a.batch_set_v1(drafts, idx([3]), S.HiCacheStorageExtraInfo()) == [True]
    wait_until(lambda: b.batch_exists(keys, S.HiCacheStorageExtraInfo()) == 3)
    assert b.batch_get_v1(keys, idx([0, 1, 2]), S.HiCacheStorageExtraInfo()) == [True] * 3
    # The draft page was stored last: published after the main ones, so waited for too (its
    # publication is asynchronous; on a busy machine it can land after the main pages show).
    wait_until(lambda: b.batch_exists(drafts, S.HiCacheStorageExtraInfo()) == 1,
               what="the draft page")
    assert b.batch_get_v1(drafts, idx([3]), S.HiCacheStorageExtraInfo()) == [True]
    src, dst = a.core.stores[False].mem_pool_host, b.core.stores[False].mem_pool_host
    assert np.array_equal(src.data[:, 0:3 * PAGE], dst.data[:, 0:3 * PAGE])
    # A key in the prefix after a None is still refused: SGLang never passes that.
    with pytest.raises(KeyLengthError):
        a.batch_set_v1(page_keys(1, b"mixed"), idx([0]),
                       S.HiCacheStorageExtraInfo(prefix_keys=[page_keys(1)[0], None]))


def test_bad_configuration_fails_at_start_naming_the_setting(env: Env) -> None:
    def err(cfg: Dict[str, Any], **kw: Any) -> Exception:
        with pytest.raises(Exception) as e:
            start(env, S.rank_configs(cfg, MODEL, **kw), [pool(0)] * 8)
        return e.value

    e = err({k: v for k, v in extra_config(env).items() if k != "host_id"})
    assert "'host_id'" in str(e) and "rank index" in e.hint
    e = err(extra_config(env, hostid=1))
    assert "'hostid'" in str(e)
    e = err(extra_config(env, host_id=6), tp_size=4)  # rows 6..9 of a domain of 8
    assert isinstance(e, InvalidArgumentError)
    assert "rank 2 of 4 (host_id 6 + rank index 2 = row 8" in str(e)
    assert "max_hosts" in e.hint
    old = adapter.build_backend_class(S.HiCacheStorage, "0.5.2")
    with pytest.raises(EngineVersionError, match="0.5.2"):
        old(S.rank_configs(extra_config(env), MODEL)[0], {})


def test_a_failed_store_is_false_and_keeps_what_was_stored(make_env) -> None:
    env = make_env(block_bytes=PAGE_BYTES, pool_bytes=128 << 10)  # a few pages' room
    a = start(env, [S.rank_configs(extra_config(env), MODEL)[0]], [pool(1)])[0]
    keys = page_keys(64, b"full")
    res = a.batch_set_v1(keys, np.tile(idx([0]), 64))
    n = res.index(False)
    assert 0 < n < 64 and not any(res[n:])  # the arena ran out: the rest are False
    wait_until(lambda: a.batch_exists(keys) == n, what="the stored prefix")


def test_the_checks_round_trip_drives_the_backend() -> None:
    """python -m cxlkv.integrations.check's round trip over the backend class (with SGLang
    installed it runs over the installed one's)."""
    import types

    from cxlkv.integrations import check

    mod = types.SimpleNamespace(CxlkvHiCacheStorage=Backend)
    assert check._roundtrip_sglang(mod, S) == []


class ScalarSizePool(HostPagePool):
    """A host pool whose get_page_buffer_meta gives one size for all segments (some SGLang
    host pools do) instead of a list."""

    def get_page_buffer_meta(self, indices: Any) -> Any:
        ptrs, sizes = super().get_page_buffer_meta(indices)
        return ptrs, sizes[0]


def test_a_pool_giving_one_size_for_every_segment(env: Env) -> None:
    data = np.random.default_rng(9).integers(0, 256, (2, TOKENS, TOKEN_BYTES), np.uint8)
    a = start(env, [S.rank_configs(extra_config(env), MODEL)[0]],
              [ScalarSizePool(data, PAGE, kv_parts=2)])[0]
    assert a.core.stores[False].page_bytes == PAGE_BYTES
    keys = page_keys(2, b"scalar")
    assert a.batch_set_v1(keys, idx([0, 1])) == [True, True]
    wait_until(lambda: a.batch_exists(keys) == 2)
    b = start(env, [S.rank_configs(extra_config(env, host_id=1), MODEL)[0]], [pool(5)])[0]
    assert b.batch_get_v1(keys, idx([2, 3])) == [True, True]
    dst = b.core.stores[False].mem_pool_host.data
    assert np.array_equal(data[:, 0:2 * PAGE], dst[:, 2 * PAGE:4 * PAGE])


def test_two_engines_configured_alike_on_one_machine_take_rows_of_their_own(env: Env) -> None:
    """Two engines given the same host_id (or, what the backend cannot tell from that, two
    DP replicas of one engine): the second's ranks would take the first's host rows (the C API
    takes a new incarnation on every join). Each rank takes the next free row of its rank's
    sequence instead, and when the domain has none left the start fails, naming the rows."""
    cfg = extra_config(env, host_id=4)
    first = start(env, S.rank_configs(cfg, MODEL, tp_size=2), [pool(1), pool(2)])
    assert [b.core.host_id for b in first] == [4, 5]
    second = start(env, S.rank_configs(cfg, MODEL, tp_size=2), [pool(3), pool(4)])
    assert [b.core.host_id for b in second] == [6, 7]
    with pytest.raises(InvalidArgumentError) as e:  # rows 4, 6 taken; 8 beyond the domain's 8
        start(env, S.rank_configs(cfg, MODEL, tp_size=2), [pool(5), pool(6)])
    assert "no free host row" in str(e.value) and "row 8 is outside" in str(e.value)
    assert "host row 4 of domain" in str(e.value) and f"pid {os.getpid()}" in str(e.value)
    assert "max_hosts" in e.value.hint
    for b in first:
        b.close()
    again = start(env, S.rank_configs(cfg, MODEL, tp_size=2), [pool(3), pool(4)])
    assert [b.core.host_id for b in again] == [4, 5]


#: The backend class as the package builds it over SGLang 0.5.3 (module_path / class_name of
#: the extra config point here).
Backend053 = adapter.build_backend_class(S.HiCacheStorage, "0.5.3")


def test_interface_v1_on_053_is_the_generic_path_and_shares_with_it(env: Env) -> None:
    """SGLang 0.5.3-0.5.5 never give a dynamic backend the zero-copy path, whatever
    interface_v1 says: the backend files its pages under the generic path (the bytes SGLang
    really hands it), so a 0.5.3 engine with interface_v1 and a 0.5.6 engine without it share
    pages, and a 0.5.6 zero-copy engine never reads them as its own layout."""
    cfg = dict(extra_config(env, host_id=0), class_name="Backend053")
    assert not S.zero_copy(cfg, "0.5.3")
    old = S.create_dynamic_backend(S.rank_configs(cfg, MODEL)[0])
    old.register_mem_pool_host(pool(1))
    env._closers.insert(0, old.close)
    assert old.core.path == "generic"
    new_generic, new_v1 = start(env, [
        S.rank_configs(dict(extra_config(env, host_id=1), interface_v1=0), MODEL)[0],
        S.rank_configs(extra_config(env, host_id=2), MODEL)[0]], [pool(2), pool(3)])
    assert new_v1.core.path == "v1"
    keys = page_keys(2, b"053")
    vals = [np.random.default_rng(10 + i).integers(0, 256, PAGE_BYTES, np.uint8)
            for i in range(2)]
    assert old.batch_set(keys, vals) is True
    wait_until(lambda: new_generic.batch_exists(keys) == 2)
    got = new_generic.batch_get(keys, [np.zeros(PAGE_BYTES, np.uint8) for _ in keys])
    assert all(np.array_equal(g, v) for g, v in zip(got, vals))
    assert new_v1.batch_exists(keys) == 0


def _rank_process(arg: Dict[str, Any]) -> "subprocess.Popen[str]":
    return subprocess.Popen([sys.executable, str(HERE / "sglang_rank_process.py"),
                             json.dumps(arg)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _answers(procs: List["subprocess.Popen[str]"]) -> List[Dict[str, Any]]:
    out = []
    for p in procs:
        line = p.stdout.readline() if p.stdout else ""
        if not line:
            p.wait(timeout=10)
            pytest.fail(f"rank process failed: {p.stderr.read() if p.stderr else ''}")
        out.append(json.loads(line))
    return out


@pytest.mark.parametrize("version,path", [("053", "generic"), ("056", "v1")])
def test_dp_replicas_and_pp_stages_of_053_and_056_get_hosts_and_stages_keep_apart(
        env: Env, version: str, path: str) -> None:
    """SGLang 0.5.3/0.5.6 give every DP replica and PP stage of a TP rank the same config
    (no DP or PP rank in it), from one extra config, each rank in its own process (0.5.3:
    pages through the generic path; 0.5.6 with interface_v1: by host indices). Each rank
    still joins as a host of its own, with no per-rank setting; a PP stage's pages are filed
    under its layers (its host pool's start_layer..end_layer), so a stage never reads
    another's, while the replicas of a stage share theirs."""
    import sglang_rank_process as R

    cfg = dict(extra_config(env, host_id=1), module_path="sglang_rank_process",
               class_name=f"Backend{version}")
    ranks = S.rank_configs_053(cfg, MODEL, layers=32, dp_size=2, pp_size=2)
    assert len({json.dumps(dataclasses.asdict(r.config)) for r in ranks}) == 1  # all alike
    keys = page_keys(2, b"pp")

    def arg(r: S.RankOf053, do: str) -> Dict[str, Any]:
        return dict(config=dataclasses.asdict(r.config), start_layer=r.start_layer,
                    end_layer=r.end_layer, pp_rank=r.pp_rank, keys=keys, do=do)

    # Replica 0's stages store the same page hashes, each its own layers' bytes, while
    # replica 1's stages wait for them and read them (all four start together).
    procs = [_rank_process(arg(r, "store" if r.dp_rank == 0 else "read")) for r in ranks]
    try:
        stored, read = _answers(procs[:2]), _answers(procs[2:])
    finally:
        for p in procs:
            if p.stdin:
                p.stdin.close()
        for p in procs:
            p.wait(timeout=10)
    assert all(s["stored"] is True for s in stored)
    assert {a["path"] for a in stored + read} == {path}
    rows = [a["host_id"] for a in stored + read]
    assert len(set(rows)) == 4 and min(rows) >= 1, rows  # a host of its own each
    ns = [a["namespace"] for a in stored + read]
    assert ns[0] != ns[1] and "layers=0-15" in ns[0] and "layers=16-31" in ns[1]
    assert ns[2:] == ns[:2]  # replica 1's stages: the namespaces of replica 0's
    for pp, a in enumerate(read):  # each stage read its own layers' bytes, not the other's
        want = [hashlib.sha256(bytes(p)).hexdigest() for p in R.stage_pages(pp, len(keys))]
        assert a["read"] == want, f"stage {pp}"


from test_orchestrator import orchestrator  # noqa: E402,F401  (the fixture: a real daemon)


@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/usr/bin/unshare", os.X_OK),
                    reason="needs root and unshare(1) to join under another host name")
def test_a_row_live_on_another_machine_is_skipped_on_an_orchestrator_domain(
        orchestrator: str) -> None:  # noqa: F811
    """Across machines the per-row lock sees nothing: an orchestrator domain's orchestrator
    refuses a row that is live on another machine, and the rank takes its next row. The other
    machine is a process under another host name (a UTS namespace) holding row 1."""
    code = ("import sys; sys.path.insert(0, {py!r}); import cxlkv; "
            "d = cxlkv.Domain.join({spec!r}, 1, heartbeat_s=0.05); print('joined', flush=True); "
            "sys.stdin.read(); d.leave()").format(py=str(HERE.parent), spec=orchestrator)
    other = subprocess.Popen(["/usr/bin/unshare", "--uts", "--", "/bin/sh", "-c",
                              f"hostname node-b && exec {sys.executable} -c \"$0\"", code],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline() == "joined\n", (
            other.stderr.read() if other.stderr else "")
        cfg = dict(backend_name="cxlkv", module_path=__name__, class_name="Backend053",
                   domain=orchestrator, host_id=1, heartbeat_s=0.05)
        b = S.create_dynamic_backend(S.HiCacheStorageConfig053(0, 1, False, True, MODEL, cfg))
        try:
            b.register_mem_pool_host(pool(1))  # joins here: the page size sizes the arena
            assert b.core.host_id == 2
            assert b.core._att.grown is not None
        finally:
            b.close()
    finally:
        if other.stdin:
            other.stdin.close()
        other.wait(timeout=10)


# ---- 0.5.10 - 0.5.18: a hybrid model's other pools through the v2 interface -------------------

#: The adapter over 0.5.18's base (sglang_interfaces.HiCacheStorage0518), as the package builds it.
Backend0518 = adapter.build_backend_class(S.HiCacheStorage0518, "0.5.18")
SIDE_BYTES = 32  # bytes per token of the sidecar pool (a mamba-like state)


def side_pool(seed: int) -> HostPagePool:
    data = np.random.default_rng(seed).integers(0, 256, (TOKENS, SIDE_BYTES), np.uint8)
    return HostPagePool(data, PAGE)


def start_hybrid(env: Env, cfg: S.HiCacheStorageConfig, kv: HostPagePool,
                 side: HostPagePool) -> Any:
    """As 0.5.18's hybrid cache controller attaches a backend: the base attach (the dynamic
    loader's call, then the KV host pool), then every host pool entry through
    register_mem_host_pool_v2 (the KV entry among them)."""
    b = S.create_dynamic_backend(cfg)
    b.register_mem_pool_host(kv)
    env._closers.insert(0, b.close)
    b.register_mem_host_pool_v2(kv, S.PoolName.KV)
    b.register_mem_host_pool_v2(side, S.PoolName.MAMBA)
    return b


def test_a_hybrid_models_sidecar_pool_round_trips_through_v2(env: Env) -> None:
    """Before: the base class's batch_*_v2 raised NotImplementedError at the hybrid
    controller's first backup, so a hybrid model (mamba, SWA, indexer pools) could not use the
    backend at 0.5.10 - 0.5.18."""
    cfg = dict(extra_config(env), class_name="Backend0518")
    a = start_hybrid(env, S.rank_configs(cfg, MODEL)[0], pool(1), side_pool(2))
    keys = page_keys(3, b"hybrid")
    # The controller's backup: the sidecar's trailing page first (batch_set_v2), then the KV
    # pages (the base path: interface_v1, by host indices).
    tail = S.PoolTransfer(S.PoolName.MAMBA, host_indices=idx([2]), keys=keys[-1:],
                          hit_policy=S.PoolHitPolicy.TRAILING_PAGES)
    assert a.batch_set_v2([tail]) == {S.PoolName.MAMBA: [True]}
    assert a.batch_set_v1(keys, idx([0, 1, 2]), S.HiCacheStorageExtraInfo0512()) == [True] * 3
    # Another engine finds the three KV pages and the sidecar's trailing page.
    b = start_hybrid(env, S.rank_configs(dict(cfg, host_id=1), MODEL)[0], pool(3), side_pool(4))
    want = S.PoolTransfer(S.PoolName.MAMBA, keys=keys[-1:],
                          hit_policy=S.PoolHitPolicy.TRAILING_PAGES)
    wait_until(lambda: b.batch_exists_v2(keys, [want]).kv_hit_pages == 3, what="the hybrid hit")
    hit = b.batch_exists_v2(keys, [want], S.HiCacheStorageExtraInfo0512())
    assert isinstance(hit, S.PoolTransferResult)
    assert hit.kv_hit_pages == 3 and hit.extra_pool_hit_pages == {"kv": 3, "mamba": 3}
    # The load: KV pages through the base path, then the sidecar through batch_get_v2.
    assert b.batch_get_v1(keys, idx([1, 2, 3])) == [True] * 3
    got = b.batch_get_v2([S.PoolTransfer(S.PoolName.MAMBA, host_indices=idx([0]),
                                         keys=keys[-1:])])
    assert got == {S.PoolName.MAMBA: [True]}
    src, dst = a.core.pools["mamba"].mem_pool_host.data, b.core.pools["mamba"].mem_pool_host.data
    assert np.array_equal(src[2 * PAGE:3 * PAGE], dst[0:PAGE])
    # The sidecar lives in a namespace of its own, not the KV pages'.
    assert b.core.pools["mamba"].namespace != b.core.stores[False].namespace
    assert "pool=mamba" in str(b.core.pools["mamba"].namespace)


def test_v2_hits_are_cut_where_a_sidecar_pool_misses(env: Env) -> None:
    """batch_exists_v2 as the base class documents it: all_pages needs every page of the KV
    run, trailing_pages only the last len(keys) before the cut; the result is the minimum."""
    cfg = dict(extra_config(env), class_name="Backend0518")
    a = start_hybrid(env, S.rank_configs(cfg, MODEL)[0], pool(5), side_pool(6))
    keys = page_keys(4, b"cut")
    assert a.batch_set_v1(keys, idx([0, 1, 2, 3])) == [True] * 4
    # The sidecar holds pages 0, 1 and 3: not page 2.
    for i in (0, 1, 3):
        assert a.batch_set_v2([S.PoolTransfer(S.PoolName.MAMBA, host_indices=idx([i]),
                                              keys=[keys[i]])]) == {S.PoolName.MAMBA: [True]}
    wait_until(lambda: a.batch_exists(keys) == 4, what="the KV pages")
    side = a.core.pools["mamba"]
    wait_until(lambda: all(side.exists(keys[i]) for i in (0, 1, 3)), what="the sidecar pages")
    every = S.PoolTransfer(S.PoolName.MAMBA, keys=keys, hit_policy=S.PoolHitPolicy.ALL_PAGES)
    r = a.batch_exists_v2(keys, [every])
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (2, {"kv": 4, "mamba": 2})
    last = S.PoolTransfer(S.PoolName.MAMBA, keys=keys[-1:],
                          hit_policy=S.PoolHitPolicy.TRAILING_PAGES)
    r = a.batch_exists_v2(keys, [last])
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (4, {"kv": 4, "mamba": 4})
    two = S.PoolTransfer(S.PoolName.MAMBA, keys=keys[-2:],
                         hit_policy=S.PoolHitPolicy.TRAILING_PAGES)
    r = a.batch_exists_v2(keys, [two])  # pages 2-3 lack page 2; pages 0-1 are whole
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (2, {"kv": 4, "mamba": 2})
    assert a.batch_exists_v2(page_keys(2, b"none"), [last]).kv_hit_pages == 0
    with pytest.raises(InvalidArgumentError, match="no host pool 'swa' registered"):
        a.batch_get_v2([S.PoolTransfer(S.PoolName.SWA, host_indices=idx([0]), keys=keys[:1])])


def test_sidecar_pools_of_an_mla_model_keep_each_tp_rank_apart(env: Env) -> None:
    """An MLA model's KV pages are the same on every TP rank (one namespace); its sidecar
    pools are backed up from every rank (hybrid_cache_controller.py should_backup at v0.5.18),
    so each rank's sidecar pages have a namespace of their own."""
    cfg = dict(extra_config(env, host_id=2), class_name="Backend0518")
    ranks = [start_hybrid(env, c, pool(7 + c.tp_rank), side_pool(9 + c.tp_rank))
             for c in S.rank_configs(cfg, MODEL, tp_size=2, mla=True)]
    assert ranks[0].core.stores[False].namespace == ranks[1].core.stores[False].namespace
    assert ranks[0].core.pools["mamba"].namespace != ranks[1].core.pools["mamba"].namespace


def test_runtime_detach_and_attach_again_keeps_the_domains_pages(env: Env) -> None:
    """SGLang's runtime attach (PUT /hicache/storage-backend, http_server.py:1078 at v0.5.18;
    only while the scheduler is idle) builds the backend through the same factory and
    registers the host pool; detach (DELETE, cache_controller.py:557) calls close() and drops
    it. After a detach the rank's row is free again; the next attach joins it again and reads
    the pages another engine published meanwhile."""
    cfg = dict(extra_config(env, host_id=3), class_name="Backend0518")
    rank = S.rank_configs(cfg, MODEL)[0]
    a = start_hybrid(env, rank, pool(11), side_pool(12))
    row = a.core.host_id
    a.close()  # detach
    p = start_hybrid(env, S.rank_configs(dict(cfg, host_id=5), MODEL)[0], pool(13),
                     side_pool(14))
    keys = page_keys(2, b"attach")
    assert p.batch_set_v1(keys, idx([0, 1])) == [True, True]
    b = start_hybrid(env, rank, pool(15), side_pool(16))  # attach again, same config
    assert b.core.host_id == row, "the detached row is free again"
    wait_until(lambda: b.batch_exists(keys) == 2, what="the other engine's pages")
    assert b.batch_get_v1(keys, idx([2, 3])) == [True, True]
    assert np.array_equal(p.core.stores[False].mem_pool_host.data[:, 0:2 * PAGE],
                          b.core.stores[False].mem_pool_host.data[:, 2 * PAGE:4 * PAGE])


def test_a_v2_transfer_without_matching_indices_fails_without_raising(env: Env) -> None:
    """As SGLang's own file backend answers a transfer whose host indices are not page_size
    per key (or that has no keys): all False, logged; the controller's thread goes on."""
    cfg = dict(extra_config(env), class_name="Backend0518")
    a = start_hybrid(env, S.rank_configs(cfg, MODEL)[0], pool(17), side_pool(18))
    keys = page_keys(2, b"short")
    short = S.PoolTransfer(S.PoolName.MAMBA, host_indices=idx([0]), keys=keys)
    assert a.batch_set_v2([short]) == {S.PoolName.MAMBA: [False, False]}
    assert a.batch_get_v2([S.PoolTransfer(S.PoolName.MAMBA, host_indices=idx([0]))]) == {
        S.PoolName.MAMBA: []}
    assert a.batch_set_v2([S.PoolTransfer(S.PoolName.MAMBA, host_indices=idx([0, 1]),
                                          keys=keys)]) == {S.PoolName.MAMBA: [True, True]}
