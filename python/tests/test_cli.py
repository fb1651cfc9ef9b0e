"""``python -m cxlkv status``: its --json output is the oracle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import List

import numpy as np
import pytest

import cxlkv
from conftest import HERE, Env, wait_until


def run(args: List[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    return subprocess.run([sys.executable, "-m", "cxlkv", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_status_reports_the_library_a_pool_and_a_domain(env: Env, ns: cxlkv.Namespace) -> None:
    a = env.host(0)
    for i in range(3):
        a.publish(ns, ns.chain_key([i] * 16), np.full(env.block_bytes, i, np.uint8))
    wait_until(lambda: a.lookup(ns, ns.chain_key([2] * 16)) is not None)
    held = [a.home_arena.alloc() for _ in range(2)]  # type: ignore[union-attr]
    r = run(["status", "--pool", env.pool_spec, "--domain", env.domain_spec, "--json"])
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    lib = cxlkv.library()
    assert rep["library"]["realpath"] == lib.realpath
    assert rep["library"]["version"] == lib.version != "unknown"
    assert rep["library"]["gpu"]
    (pool,) = rep["pools"]
    assert pool["arena_uuid"] == cxlkv.pool.uuid_str(a.home_arena.uuid)  # type: ignore[union-attr]
    (cls,) = pool["classes"]
    assert cls["block_bytes"] == env.block_bytes
    assert cls["persisted_blocks"] == 3  # published
    assert cls["allocated_blocks"] + cls["cached_blocks"] >= 2  # this process's two blocks
    assert pool["owners_active"] >= 2  # this process and the status command
    (dom,) = rep["domains"]
    assert dom["source_bytes"] >= dom["default_geometry_bytes"]
    assert "not exposed by the C API" in dom["geometry"]
    for b in held:
        a.home_arena.free(b)  # type: ignore[union-attr]

    text = run(["status", "--pool", env.pool_spec])
    assert text.returncode == 0
    assert f"blocks of {env.block_bytes // 1024}.0 KiB" in text.stdout
    assert "3 published/persisted" in text.stdout


def test_status_names_what_it_could_not_read(shm) -> None:
    missing = f"file:{shm.path('absent')}"
    r = run(["status", "--pool", missing, "--domain", missing, "--json"])
    assert r.returncode == 1
    rep = json.loads(r.stdout)
    assert missing in rep["pools"][0]["error"] and "?size=" in rep["pools"][0]["error"]
    assert "does not exist" in rep["domains"][0]["error"]


def test_status_without_a_library_says_how_to_get_one(tmp_path) -> None:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent),
               CXLKV_LIBRARY=str(tmp_path / "libcxlkv.so.0"))
    r = subprocess.run([sys.executable, "-m", "cxlkv", "status"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 1 and "CXLKV_LIBRARY" in r.stderr


def test_usage() -> None:
    r = run([])
    assert r.returncode == 2 and "status" in r.stderr
    assert run(["--version"]).stdout.strip() == f"cxlkv {cxlkv.__version__}"


def test_status_reports_a_tier_store(shm, tmp_path) -> None:
    layout = cxlkv.KvLayout(layers=2, kv_heads=2, head_dim=64, dtype_bytes=2, tokens_per_block=16)
    spec = f"file:{shm.path('tier-pool')}"
    with cxlkv.Pool.open(spec + "?size=16M") as p:
        cxlkv.Arena.create(p, layout).close()
    store = tmp_path / "nvme"
    arena = cxlkv.Arena.open_spec(spec)
    try:
        tier = cxlkv.Tier.open(arena, nvme_dir=store)
    except cxlkv.errors.MismatchError as e:
        arena.close()
        pytest.skip(f"{tmp_path} cannot hold an NVMe store: {e}")
    ns = cxlkv.Namespace("tenant", "cli", "layout")
    keys = ns.digest_chain([bytes([i]) * 32 for i in range(3)])
    placed = tier.place(ns, keys, np.zeros((3, tier.block_size), np.uint8))
    assert placed == [cxlkv.Residence.ON_NVME] * 3  # new blocks: NVMe
    # Held by a live tier: in use, not an error.
    r = run(["status", "--pool", spec, "--tier", str(store), "--json"])
    assert r.returncode == 0, r.stdout + r.stderr
    (t,) = json.loads(r.stdout)["tiers"]
    assert "another process" in t["in_use"] and "stats" not in t
    tier.close()
    r = run(["status", "--pool", spec, "--tier", str(store), "--json"])
    assert r.returncode == 0, r.stdout + r.stderr
    (t,) = json.loads(r.stdout)["tiers"]
    st = t["stats"]
    assert st["nvme_blocks"] == 3 and st["block_bytes"] == tier.block_size
    assert st["nvme_file_bytes"] == t["slot_file_bytes"] > 0
    text = run(["status", "--tier-pool", spec, "--tier", str(store)])
    assert text.returncode == 0 and "3 block(s) of 16.0 KiB" in text.stdout
    # Nothing there, or no pool to open it through: said, exit 1, nothing created.
    r = run(["status", "--tier", str(tmp_path / "absent"), "--pool", spec, "--json"])
    assert r.returncode == 1
    assert "not an NVMe tier store" in json.loads(r.stdout)["tiers"][0]["error"]
    assert not (tmp_path / "absent").exists()
    r = run(["status", "--tier", str(store), "--json"])
    assert r.returncode == 1 and "--tier-pool" in json.loads(r.stdout)["tiers"][0]["error"]
    arena.close()
