"""A domain run by a real cxlkv-orchestrator: hosts join as ``orchestrator:<socket>``, a host
grows an arena in an extent of the pooled region (``Domain.grow``) and publishes pages from
it; another host, with no arena of its own attached, reads them (the library finds the block
in the other host's extent). Each host is a separate process."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, List, Optional

import numpy as np
import pytest

import cxlkv
import hosts
from conftest import HERE

CTX = mp.get_context("spawn")
NS = ("t", "m", "l")  # the namespace the configuration declares


def orchestrator_bin() -> Optional[str]:
    env = os.environ.get("CXLKV_ORCHESTRATOR_BIN")
    if env:
        return env
    built = HERE.parent.parent / "build" / "dev" / "orchestrator" / "daemon" / "cxlkv-orchestrator"
    return str(built) if built.exists() else shutil.which("cxlkv-orchestrator")


@pytest.fixture
def orchestrator() -> Iterator[str]:
    binary = orchestrator_bin()
    if binary is None:
        pytest.skip("cxlkv-orchestrator not built (cmake --build build/dev), nor "
                    "CXLKV_ORCHESTRATOR_BIN set")
    d = Path(tempfile.mkdtemp(prefix="cxlkv-pyorch-"))
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    shm = [f"/dev/shm/cxlkv-pyorch-pool-{tag}", f"/dev/shm/cxlkv-pyorch-domain-{tag}"]
    sock = str(d / "o.sock")
    (d / "domain.toml").write_text(
        f'[domain]\nname = "pytest"\npool = "file:{shm[0]}?size=128M"\n'
        f'prefix_domain = "file:{shm[1]}?size=4M"\nextent_size = "16M"\n'
        f'state_file = "{d}/d.state"\nindex_entries = 1024\nmax_hosts = 4\n'
        f'[rpc]\nsocket = "{sock}"\n[metrics]\nlisten = ""\n'
        "[timing]\nlease_ttl_ms = 2000\nhost_ttl_ms = 2000\nheartbeat_period_ms = 50\n"
        "grace_ms = 20\ncapacity_lease_ms = 4000\n"
        "[capacity]\ndefault_share = 0.5\n"
        '[[namespace]]\ntenant = "t"\nmodel = "m"\nlayout = "l"\n')
    proc = subprocess.Popen([binary, "--config", str(d / "domain.toml"), "--new-domain"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + 10
        while True:
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(sock)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > end:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    pytest.fail(f"the orchestrator did not come up: {err[-2000:]}")
                time.sleep(0.02)
        yield "orchestrator:" + sock
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(d, ignore_errors=True)
        for p in shm:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def grower(spec: str, keys: List[str], out: Any, go: Any) -> None:
    d = cxlkv.Domain.join(spec, 1, heartbeat_s=0.05)
    arena = d.grow(cxlkv.KvLayout(1, 1, hosts.PAGE_BYTES // 32, 1, 16))
    store = cxlkv.PageStore(d, cxlkv.Namespace(*NS), page_bytes=hosts.PAGE_BYTES)
    data = np.stack([hosts.content_for(k, hosts.PAGE_BYTES) for k in keys])
    store.register_mem_pool_host(cxlkv.HostPagePool(data.reshape(len(keys) * hosts.PAGE, -1),
                                                    hosts.PAGE))
    res = store.batch_set_v1(keys, np.arange(len(keys) * hosts.PAGE))
    out.put(("stored", res, arena.pool is None))
    go.get()
    d.leave()  # closes the grown arena (its extent goes back): the handle must know
    out.put(("left", arena.closed))


def reader(spec: str, keys: List[str], out: Any) -> None:
    d = cxlkv.Domain.join(spec, 2, heartbeat_s=0.05)  # no arena attached at all
    ns = cxlkv.Namespace(*NS)
    pks = [ns.digest_key(k) for k in keys]
    end = time.monotonic() + 10
    while d.lookup(ns, pks[-1]) is None and time.monotonic() < end:
        time.sleep(0.005)
    match = []
    with d.acquire_chain(ns, pks, wait_s=2.0) as leases:
        for i in range(len(leases)):
            buf = np.empty(hosts.PAGE_BYTES, np.uint8)
            leases.copy_out(i, buf)
            match.append(bool(np.array_equal(buf, hosts.content_for(keys[i], hosts.PAGE_BYTES))))
    out.put(("read", match))
    d.leave()


def test_grow_publish_and_read_across_hosts(orchestrator: str) -> None:
    keys = hosts.page_hashes(list(range(7000, 7000 + 6 * hosts.PAGE)))
    out: Any = CTX.Queue()
    go: Any = CTX.Queue()
    g = CTX.Process(target=grower, args=(orchestrator, keys, out, go))
    g.start()
    r: Optional[Any] = None
    try:
        kind, res, pooled = out.get(timeout=60)
        assert kind == "stored" and res == [True] * 6 and pooled
        r = CTX.Process(target=reader, args=(orchestrator, keys, out))
        r.start()
        assert out.get(timeout=60) == ("read", [True] * 6)
        go.put("leave")
        assert out.get(timeout=60) == ("left", True)
        for p in (g, r):
            p.join(60)
            assert p.exitcode == 0
    finally:
        for p in (g, r):
            if p is not None and p.is_alive():
                p.kill()


def test_grown_arenas_give_their_extents_back(orchestrator: str) -> None:
    d = cxlkv.Domain.join(orchestrator, 3, heartbeat_s=0.05)
    try:
        arenas = [d.grow(cxlkv.KvLayout(1, 1, 64, 1, 16)) for _ in range(2)]
        assert arenas[0].uuid != arenas[1].uuid and d.home_arena is arenas[0]
        arenas[1].close()  # gives its extent back; the domain stays joined
        assert d.lookup(cxlkv.Namespace(*NS), cxlkv.Namespace(*NS).chain_key([1])) is None
    finally:
        d.leave()
    assert all(a.closed for a in arenas)
