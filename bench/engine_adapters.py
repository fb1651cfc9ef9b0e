#!/usr/bin/python3
"""Per-job overhead of the engine adapters (issue #28) against a numpy copy of the same bytes.

vLLM tier (``cxlkv.integrations.vllm.VllmTierCore``, the core every generation's class
forwards to, 0.32 interface): one job of N primary rows of B bytes,

* store: ``submit_store(job)``, a wait for the worker to finish it (``drain_jobs``), then
  ``get_finished_jobs`` (the copy into a freshly allocated CXL block and the publish, on the
  tier's worker thread; an engine polls once a scheduler step, which adds up to a step);
  fresh keys every job, so every block is really copied;
* load: ``submit_load(job)`` of N published blocks into other primary rows, waited for the
  same way (chain lease, validated copy-out, release);

SGLang backend (``cxlkv.integrations.sglang.SglangBackendCore`` and its page store, what the
backend class forwards to): one call of N pages of B bytes (K and V halves: two segments),

* zero-copy path (``interface_v1``): ``batch_set_v1`` / ``batch_get_v1`` by host indices;
* generic path: ``batch_set`` / ``batch_get`` of N contiguous page buffers.

Baseline: ``numpy.copyto`` of the same N x B bytes between two arrays (rows to rows).
Overhead = median time of the adapter's job - median time of the copy. Host 0 stores, host 1
loads, in one process; the owner role steps every 2 ms on a thread; files in /dev/shm.

Load chain (``--load-path``, issue #43 item 4): what both engine stores' loads run
(``cxlkv.chains.load_chain``) with one ``cxlkv_lease_copy_out`` ctypes call per segment (the
path before) and with one ``cxlkv_lease_copy_out_many`` call per batch (the path now),
interleaved rep by rep in one run; every load compared byte for byte.

Run (Debian's interpreter; the library from a dev or release build):
    /usr/bin/python3 bench/engine_adapters.py [--reps 15] [--json out.json] [--load-path]
bench/RESULTS.md records a run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

import cxlkv  # noqa: E402
from cxlkv import chains  # noqa: E402
from cxlkv.integrations import sglang as sg  # noqa: E402
from cxlkv.integrations import vllm as vl  # noqa: E402
from cxlkv.integrations import vllm_generations as gens  # noqa: E402
from cxlkv.page_store import HostPagePool  # noqa: E402
from cxlkv.pool import layout_for_block_bytes  # noqa: E402


@dataclass
class Job:  # the fields of vLLM 0.32's TransferJob
    job_id: int
    keys: List[bytes]
    chunk_ids: np.ndarray
    is_promotion: bool
    req_context: Any = None


@dataclass
class Result:  # vLLM's JobResult fields the tier fills
    job_id: int
    success: bool


class Env:
    def __init__(self, block: int, blocks: int) -> None:
        tag = f"/dev/shm/cxlkv-bench-adapters-{os.getpid()}-{block}"
        self.paths = [tag + "-domain", tag + "-pool"]
        g = cxlkv.Geometry(index_entries=8192, ring_slots=1024)
        self.domain = f"file:{self.paths[0]}?size={(g.bytes_needed() + 4095) // 4096 * 4096}"
        cxlkv.Domain.format(self.domain, g)
        self.owner = cxlkv.Owner.open(self.domain).start(0.002)
        lay, _ = layout_for_block_bytes(block)
        with cxlkv.Pool.open(f"file:{self.paths[1]}?size={block * blocks + (8 << 20)}") as p:
            cxlkv.Arena.create(p, lay).close()
        self.pool = f"file:{self.paths[1]}"
        if PREFAULT:  # allocate the pool file's pages now (tmpfs), not on each first store
            fd = os.open(self.paths[1], os.O_RDWR)
            try:
                os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
            finally:
                os.close(fd)

    def close(self) -> None:
        self.owner.close()
        for p in self.paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


PREFAULT = False
_seq = [0]


def keys(n: int, group: bool = True) -> List[bytes]:
    out = []
    for _ in range(n):
        _seq[0] += 1
        d = hashlib.sha256(_seq[0].to_bytes(8, "little")).digest()
        out.append(d + (0).to_bytes(4, "big") if group else d)
    return out


def median_us(f: Callable[[], None], reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def wait(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("blocks did not become visible")
        time.sleep(0.001)


def bench_vllm(block: int, n: int, reps: int) -> Dict[str, float]:
    rows = 2 * n
    env = Env(block, n * (reps + 3))
    gen = gens.generation_named("0.32")
    spec = types.SimpleNamespace(vllm_config=None)
    va = np.random.default_rng(1).integers(0, 256, (rows, block), np.uint8)
    vb = np.zeros_like(va)
    cfg = dict(domain=env.domain, pool=env.pool, model="bench", heartbeat_s=0.1)
    a = vl.VllmTierCore(gen, "0.32.0", spec, memoryview(va), "cxlkv", dict(cfg, host_id=0))
    b = vl.VllmTierCore(gen, "0.32.0", spec, memoryview(vb), "cxlkv", dict(cfg, host_id=1))
    jid = [0]

    def run(core: Any, k: List[bytes], ids: np.ndarray, promotion: bool) -> None:
        jid[0] += 1
        (core.submit_load if promotion else core.submit_store)(Job(jid[0], k, ids, promotion))
        core.drain()  # wakes when the worker finishes (a busy poll would starve it of the GIL)
        done = core.finished(Result)
        assert len(done) == 1 and done[0].success, done
    try:
        store = median_us(lambda: run(a, keys(n), np.arange(n), False), reps)
        published = keys(n)
        run(a, published, np.arange(n), False)
        wait(lambda: all(b.lookup(k, None) for k in published))
        load = median_us(lambda: run(b, published, np.arange(n, 2 * n), True), reps)
        assert np.array_equal(va[:n], vb[n:2 * n])
        dst = np.empty((n, block), np.uint8)
        copy = median_us(lambda: np.copyto(dst, va[:n]), reps)
    finally:
        a.shutdown()
        b.shutdown()
        env.close()
    return {"store_us": store, "load_us": load, "copy_us": copy}


def bench_sglang(page: int, n: int, reps: int) -> Dict[str, float]:
    token_bytes, ps = page // 32, 16  # 16 tokens a page, K and V halves
    tokens = ps * n
    env = Env(page, n * (2 * reps + 4))
    out: Dict[str, float] = {}
    cores = []
    try:
        for path in ("v1", "generic"):
            cfg = dict(domain=env.domain, pool=env.pool, heartbeat_s=0.1,
                       interface_v1=1 if path == "v1" else 0)
            sc = types.SimpleNamespace(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                       attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
                                       model_name="bench", extra_config=None)
            ca = sg.SglangBackendCore(sc, dict(cfg, host_id=0 if path == "v1" else 2), "0.5.6")
            cb = sg.SglangBackendCore(sc, dict(cfg, host_id=1 if path == "v1" else 3), "0.5.6")
            cores += [ca, cb]
            src = np.random.default_rng(2).integers(0, 256, (2, tokens, token_bytes), np.uint8)
            dst = np.zeros_like(src)
            ca.register_mem_pool_host(HostPagePool(src, ps, kv_parts=2))
            cb.register_mem_pool_host(HostPagePool(dst, ps, kv_parts=2))
            idx = np.arange(tokens, dtype=np.int64)
            vals = [np.ascontiguousarray(src[:, i * ps:(i + 1) * ps]).reshape(-1) for i in range(n)]
            outs = [np.empty(page, np.uint8) for _ in range(n)]

            def put(k: List[str]) -> None:
                s, kk = ca.store_for(k, "set")
                ok = s.batch_set_v1(kk, idx) if path == "v1" else s.batch_set(kk, vals)
                assert all(ok) if path == "v1" else ok

            def get(k: List[str]) -> None:
                s, kk = cb.store_for(k, "get")
                if path == "v1":
                    assert all(s.batch_get_v1(kk, idx))
                else:
                    assert all(x is not None for x in s.batch_get(kk, outs))
            out[f"{path}_set_us"] = median_us(lambda: put([k.hex() for k in keys(n, False)]),
                                              reps)
            published = [k.hex() for k in keys(n, False)]
            put(published)
            s, kk = cb.store_for(published, "exists")
            wait(lambda: s.batch_exists(kk) == n)
            out[f"{path}_get_us"] = median_us(lambda: get(published), reps)
            if path == "v1":
                assert np.array_equal(src, dst)
        a2 = np.empty((n, page), np.uint8)
        flat = src.reshape(-1)[: n * page].reshape(n, page)
        out["copy_us"] = median_us(lambda: np.copyto(a2, flat), reps)
    finally:
        for c in cores:
            c.close()
        env.close()
    return out


def bench_load_path(block: int, n: int, segs: int, reps: int) -> Dict[str, float]:
    """#43 item 4: the engine stores' load chain (cxlkv.chains.load_chain: lease n published
    blocks, copy each out in `segs` segments, validated, release) with one
    cxlkv_lease_copy_out call per segment (the per-block path the stores used before) and with
    one cxlkv_lease_copy_out_many call per batch (what they use now). The two run interleaved,
    rep by rep (after one untimed round of each), on the same keys and destinations, so the
    machine's load hits both."""
    env = Env(block, n + 4)
    arenas = [cxlkv.Arena.open_spec(env.pool) for _ in range(2)]
    a = cxlkv.Domain.join(env.domain, 0, arenas=[arenas[0]], heartbeat_s=0.1)
    b = cxlkv.Domain.join(env.domain, 1, arenas=[arenas[1]], heartbeat_s=0.1)
    try:
        ns = cxlkv.Namespace("bench", "load-path", f"B={block}")
        ks = ns.chain_keys(range(16 * n), 16)
        src = np.random.default_rng(3).integers(0, 256, (n, block), np.uint8)
        res = chains.store_chain(a, ns, ks, [[(int(src[i].ctypes.data), block)]
                                             for i in range(n)])
        assert res.stored == n, res
        wait(lambda: b.lookup(ns, ks[-1]) is not None)
        dst = np.zeros((n, block), np.uint8)
        part = block // segs
        pieces = [[(int(dst[i].ctypes.data) + k * part, part) for k in range(segs)]
                  for i in range(n)]
        ts: Dict[bool, List[float]] = {False: [], True: []}
        # One untimed round of each first (the destination's and the pool's first touch), then
        # the two in turns, the order swapped every rep.
        for rep in range(-1, reps):
            for scatter in ((False, True) if rep % 2 else (True, False)):
                dst[:] = 0
                t0 = time.perf_counter()
                ok = chains.load_chain(b, ns, ks, pieces, max_batch=64, wait_s=1.0,
                                       scatter=scatter)
                if rep >= 0:
                    ts[scatter].append(time.perf_counter() - t0)
                assert ok == [True] * n and np.array_equal(dst, src), scatter
    finally:
        b.leave()
        a.leave()
        for ar in arenas:
            ar.close()
        env.close()
    return {"per_block_us": statistics.median(ts[False]) * 1e6,
            "scatter_us": statistics.median(ts[True]) * 1e6}


LOAD_PATH_CASES = ((4 << 10, 64, 2), (64 << 10, 32, 2), (64 << 10, 32, 1), (2 << 20, 16, 1))


def run_load_path(reps: int) -> List[Dict[str, Any]]:
    rows = []
    print("load chain: per-block cxlkv_lease_copy_out calls vs one cxlkv_lease_copy_out_many "
          "a batch (medians, us)", flush=True)
    for block, n, segs in LOAD_PATH_CASES:
        r = bench_load_path(block, n, segs, reps)
        kib = f"{block >> 10} KiB" if block < 1 << 20 else f"{block >> 20} MiB"
        calls = n * segs
        print(f"{kib:>7} x{n:<3} {segs} seg  per-block ({calls:3} calls) "
              f"{r['per_block_us']:9.1f}  scatter (1 call) {r['scatter_us']:9.1f}  "
              f"saved {r['per_block_us'] - r['scatter_us']:8.1f} "
              f"({(r['per_block_us'] - r['scatter_us']) / calls:5.2f} a call)", flush=True)
        rows.append({"block": block, "n": n, "segments": segs, **r})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--prefault", action="store_true",
                    help="allocate the pool file's pages before the runs (posix_fallocate)")
    ap.add_argument("--load-path", action="store_true",
                    help="only the load chain, per-block copy-out calls vs one scatter call "
                    "(#43 item 4)")
    args = ap.parse_args()
    global PREFAULT
    PREFAULT = args.prefault
    if args.load_path:
        lp = run_load_path(args.reps)
        if args.json:
            Path(args.json).write_text(json.dumps({"reps": args.reps, "load_path": lp},
                                                  indent=2))
        return 0
    rows = []
    for block in (64 << 10, 2 << 20):
        for n in (1, 32):
            v = bench_vllm(block, n, args.reps)
            s = bench_sglang(block, n, args.reps)
            rows.append({"block": block, "n": n, "vllm": v, "sglang": s})
            kib = f"{block >> 10} KiB" if block < 1 << 20 else f"{block >> 20} MiB"
            c = v["copy_us"]
            print(f"{kib:>7} x{n:<3} copy {c:9.1f} us | vLLM store {v['store_us']:9.1f} "
                  f"(+{v['store_us'] - c:8.1f})  load {v['load_us']:9.1f} "
                  f"(+{v['load_us'] - c:8.1f}) | SGLang copy {s['copy_us']:9.1f}  v1 set "
                  f"{s['v1_set_us']:9.1f} get {s['v1_get_us']:9.1f}  generic set "
                  f"{s['generic_set_us']:9.1f} get {s['generic_get_us']:9.1f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"reps": args.reps, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
