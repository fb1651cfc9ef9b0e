"""The stores across processes that join one domain as different hosts.

Each host is a process started with multiprocessing's spawn method: a fresh interpreter that
loads the library, maps the domain and the pool, and joins with its own host id. This process
runs the owner role (the orchestrator's job in production). Two writers storing the same keys
check that duplicates are resolved across hosts; the reader checks every byte.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
from typing import Any, List

import pytest

import cxlkv
import hosts
from conftest import Env

CTX = mp.get_context("spawn")
TIMEOUT_S = 60.0
NS = ("pytest", "multihost-model", "tp0/1 page16")


@pytest.fixture
def env(make_env) -> Env:
    return make_env(block_bytes=hosts.BLOCK, blocks=128)


def run_hosts(writers: List[Any], readers: List[Any]) -> List[tuple]:
    """Starts writer processes, waits for their "stored" reports, starts readers, collects
    their reports, then lets the writers leave. Fails (and kills the rest) on a timeout."""
    out: Any = CTX.Queue()
    go: Any = CTX.Queue()
    procs = []
    results: List[tuple] = []
    try:
        for fn, args in writers:
            p = CTX.Process(target=fn, args=(*args, out, go))
            p.start()
            procs.append(p)
        for _ in writers:
            results.append(out.get(timeout=TIMEOUT_S))
        for fn, args in readers:
            p = CTX.Process(target=fn, args=(*args, out))
            p.start()
            procs.append(p)
        for _ in readers:
            results.append(out.get(timeout=TIMEOUT_S))
        for _ in writers:
            go.put("leave")
        for p in procs:
            p.join(TIMEOUT_S)
            assert p.exitcode == 0, f"host process {p.name} exited with {p.exitcode}"
    except queue.Empty:
        pytest.fail("a host process did not report in time")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return results


def test_page_store_across_hosts(env: Env) -> None:
    keys = hosts.page_hashes(list(range(5000, 5000 + 12 * hosts.PAGE)))
    args = (env.domain_spec, env.pool_spec)
    res = run_hosts(
        writers=[(hosts.page_writer, (*args, 0, NS, keys)),
                 (hosts.page_writer, (*args, 2, NS, keys[:8]))],  # overlapping: duplicates
        readers=[(hosts.page_reader, (*args, 1, NS, keys))])
    stored = {r[1]: r[2] for r in res if r[0] == "stored"}
    assert stored[0] == [True] * 12 and stored[2] == [True] * 8
    (_, _, seen, exists, got, match), = [r for r in res if r[0] == "read"]
    assert seen and exists == 12
    assert got == [True] * 12 and match == [True] * 12


def test_page_store_hosts_of_another_namespace_see_nothing(env: Env) -> None:
    keys = hosts.page_hashes(list(range(32)))
    args = (env.domain_spec, env.pool_spec)
    other = ("pytest", "multihost-model", "tp1/2 page16")
    d = env.host(5)
    res = run_hosts(writers=[(hosts.page_writer, (*args, 0, NS, keys))], readers=[])
    assert res[0][2] == [True, True]
    mine = cxlkv.PageStore(d, cxlkv.Namespace(*NS), page_bytes=hosts.PAGE_BYTES)
    theirs = cxlkv.PageStore(d, cxlkv.Namespace(*other), page_bytes=hosts.PAGE_BYTES)
    assert mine.batch_exists(keys) == 2 and theirs.batch_exists(keys) == 0


def test_offload_tier_across_hosts(env: Env) -> None:
    keys = hosts.offload_keys(10, salt=b"multihost")
    args = (env.domain_spec, env.pool_spec)
    res = run_hosts(
        writers=[(hosts.tier_writer, (*args, 0, NS, keys)),
                 (hosts.tier_writer, (*args, 3, NS, keys[2:6]))],
        readers=[(hosts.tier_reader, (*args, 1, NS, keys))])
    stored = {r[1]: r[2] for r in res if r[0] == "stored"}
    assert stored[0][0][:2] == (0, True) and stored[3][0][:2] == (3, True)
    (_, _, seen, states, done, match), = [r for r in res if r[0] == "read"]
    assert seen and done == [(99, True)] and match == [True] * 10
    # The reader stored nothing itself, so its lookups are never "in flight".
    assert set(states) <= {"True", "False"}
