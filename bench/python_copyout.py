#!/usr/bin/python3
"""Per-block cost of lookup + chain lease + validated copy-out into a torch tensor, from Python
(the cxlkv package) against the same loop in C (capi_copyout_benchmark), same setup.

One request's prefix is `chain` published blocks of B bytes. Per request, from Python:

    with reader.acquire_chain(ns, keys) as leases:      # cxlkv_lease_acquire_chain
        for i in range(len(leases)):
            leases.copy_out(i, dst[i])                   # checks the tensor, cxlkv_lease_copy_out
                                                         # leaving: cxlkv_lease_release_many

with ``dst`` a (chain, B/2) float16 CPU tensor; capi_copyout_benchmark does the same calls in
C into a plain buffer. Both: host 0 publishes into an arena in /dev/shm, host 1 reads with its
own pool and arena handles, the owner role steps every 2 ms on a thread, the reader
heartbeats every 100 ms from its loop. Every copy is compared with what was published after
the timed runs.

Run (Debian's interpreter, a release build):
    cmake --preset release && cmake --build build/release --target capi_copyout_benchmark
    /usr/bin/python3 bench/python_copyout.py [--reps 5] [--min-time 1] [--json out.json]

Python runs two ways: one ``copy_out(i, dst[i])`` per block (above), and one
``leases.copy_out_rows(dst)`` per request (the tensor checked once, block i into row i).
Prints, per block size and variant: time per block (median of the rounds) and bandwidth,
Python's share of C's bandwidth, and Python's added time per block (its per-call overhead).
bench/RESULTS.md records a run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parent.parent


class PythonSide:
    """The Python loop's setup for one block size (files in /dev/shm, removed by close())."""

    def __init__(self, block: int, chain: int) -> None:
        import numpy as np
        import torch

        import cxlkv
        from cxlkv.pool import layout_for_block_bytes

        self.chain = chain
        tag = f"/dev/shm/cxlkv-bench-pycopyout-{os.getpid()}-{block}"
        self.paths = [tag + "-domain", tag + "-pool"]
        g = cxlkv.Geometry()
        dspec = f"file:{self.paths[0]}?size={(g.bytes_needed() + 4095) // 4096 * 4096}"
        cxlkv.Domain.format(dspec, g)
        self.owner = cxlkv.Owner.open(dspec).start(0.002)
        lay, _ = layout_for_block_bytes(block)
        self.pub_pool = cxlkv.Pool.open(
            f"file:{self.paths[1]}?size={block * (chain + 4) + (8 << 20)}")
        self.pub_arena = cxlkv.Arena.create(self.pub_pool, lay)
        self.read_arena = cxlkv.Arena.open_spec(f"file:{self.paths[1]}")
        self.pub = cxlkv.Domain.join(dspec, 0, arenas=[self.pub_arena], heartbeat_s=0.1)
        self.reader = cxlkv.Domain.join(dspec, 1, arenas=[self.read_arena], heartbeat_s=None)
        self.ns = cxlkv.Namespace("bench", "copyout-py", str(block))
        self.keys = self.ns.chain_keys(np.arange(16 * chain), 16)
        rng = np.random.default_rng(block)
        self.data = [rng.integers(0, 256, block, dtype=np.uint8) for _ in range(chain)]
        parent = None
        for k, v in zip(self.keys, self.data):
            self.pub.publish(self.ns, k, v, parent=parent)
            parent = k
        while self.reader.lookup(self.ns, self.keys[-1]) is None:
            time.sleep(0.001)
        self.dst = torch.empty((chain, block // 2), dtype=torch.float16)
        self.n = 0

    def requests(self, n: int, rows: bool) -> float:
        """Seconds for n requests (the loop the C benchmark runs); `rows`: the whole run in
        one copy_out_rows call instead of one copy_out per block."""
        reader, ns, keys, dst, chain = self.reader, self.ns, self.keys, self.dst, self.chain
        next_beat = 0.0
        t0 = time.perf_counter()
        for _ in range(n):
            now = time.monotonic()
            if now >= next_beat:
                reader.heartbeat()
                next_beat = now + 0.1
            with reader.acquire_chain(ns, keys, wait_s=1.0) as leases:
                if len(leases) != chain:
                    raise RuntimeError(f"leased {len(leases)} of {chain} blocks")
                if rows:
                    if not all(leases.copy_out_rows(dst)):
                        raise RuntimeError("a block went stale")
                else:
                    for i in range(chain):
                        leases.copy_out(i, dst[i])
        return time.perf_counter() - t0

    def measure(self, min_time: float, rows: bool) -> float:
        """Seconds per request over about min_time."""
        if not self.n:  # calibrate once, on the slower variant
            n = 1
            while self.requests(n, False) < min_time / 10:
                n *= 2
            self.n = max(1, int(min_time / (self.requests(n, False) / n)))
        return self.requests(self.n, rows) / self.n

    def verify(self) -> None:
        import numpy as np

        for i in range(self.chain):
            if self.dst[i].numpy().view(np.uint8).tobytes() != self.data[i].tobytes():
                raise RuntimeError(f"block {i} read back differs from what was published")

    def close(self) -> None:
        self.reader.leave()
        self.pub.leave()
        self.read_arena.close()
        self.pub_arena.close()
        self.pub_pool.close()
        self.owner.close()
        for p in self.paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def c_once(binary: str, block: int, chain: int, min_time: float) -> float:
    """Seconds per request from one run of capi_copyout_benchmark."""
    out = subprocess.run(
        [binary, f"--benchmark_filter=BM_CapiChainCopyOut/block_bytes:{block}/chain:{chain}/",
         f"--benchmark_min_time={min_time}", "--benchmark_format=json"],
        check=True, capture_output=True, text=True).stdout
    (b,) = [b for b in json.loads(out)["benchmarks"] if b.get("run_type") == "iteration"]
    if b.get("error_occurred"):
        raise RuntimeError(f"capi_copyout_benchmark: {b.get('error_message')}")
    return float(b["real_time"]) * 1e-6  # us per request -> s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="65536,5242880", help="block sizes in bytes")
    ap.add_argument("--chain", type=int, default=8, help="blocks per request")
    ap.add_argument("--reps", type=int, default=5, help="rounds (each: one C run, one Python run)")
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds per repetition")
    ap.add_argument("--c-bench", default=str(ROOT / "build/release/bench/capi_copyout_benchmark"))
    ap.add_argument("--library", default=str(ROOT / "build/release/capi/libcxlkv.so.0"),
                    help="libcxlkv for the Python side (default: the release build's)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if os.path.exists(args.library):
        os.environ["CXLKV_LIBRARY"] = args.library
    sys.path.insert(0, str(ROOT / "python"))
    import cxlkv

    info = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": f"{os.uname().sysname} {os.uname().release}, {os.cpu_count()} CPUs",
            "load_before": open("/proc/loadavg").read().split()[:3],
            "library": repr(cxlkv.library()), "python": sys.version.split()[0]}
    have_c = os.path.exists(args.c_bench)
    rows = []
    for b in sizes:
        # Rounds alternate C and Python, so a change in the machine's load hits both.
        py_side = PythonSide(b, args.chain)
        py_t: List[float] = []
        rows_t: List[float] = []
        c_t: List[float] = []
        try:
            for _ in range(args.reps):
                if have_c:
                    # The Python reader must not fall silent meanwhile (the owner would fence
                    # it): a heartbeat thread keeps it alive, stopped again before it measures.
                    py_side.reader.start_heartbeat(0.1)
                    c_t.append(c_once(args.c_bench, b, args.chain, args.min_time))
                    py_side.reader.stop_heartbeat()
                py_t.append(py_side.measure(args.min_time, rows=False))
                py_side.dst.zero_()
                rows_t.append(py_side.measure(args.min_time, rows=True))
                py_side.verify()
        finally:
            py_side.close()
        row: Dict[str, Any] = {"block_bytes": b, "chain": args.chain}
        for name, ts in (("py", py_t), ("rows", rows_t), ("c", c_t)):
            if ts:
                t = statistics.median(ts)
                row.update({f"{name}_s_per_request": ts,
                            f"{name}_us_per_block": t / args.chain * 1e6,
                            f"{name}_GBps": b * args.chain / t / 1e9})
        if c_t:
            for name in ("py", "rows"):
                row[f"{name}_share_of_c_bandwidth"] = row[f"{name}_GBps"] / row["c_GBps"]
                row[f"{name}_added_us_per_block"] = (row[f"{name}_us_per_block"]
                                                     - row["c_us_per_block"])
        rows.append(row)
    info["load_after"] = open("/proc/loadavg").read().split()[:3]
    print(f"# {info['date']}  {info['host']}  load {' '.join(info['load_before'])}"
          f" -> {' '.join(info['load_after'])}")
    print(f"# {info['library']}; python {info['python']}; median of {args.reps} x "
          f"{args.min_time}s, C and Python alternating; {args.chain} blocks per request")
    print("Py: one copy_out(i, dst[i]) per block; rows: one copy_out_rows(dst) per request")
    print(f"{'block':>9} {'variant':>7} {'us/block':>9} {'GB/s':>7} {'of C bw':>8} "
          f"{'+us/block':>10}")
    for r in rows:
        for name, label in (("c", "C"), ("py", "Py"), ("rows", "rows")):
            if f"{name}_GBps" not in r:
                continue
            share = r.get(f"{name}_share_of_c_bandwidth")
            added = r.get(f"{name}_added_us_per_block")
            print(f"{r['block_bytes']:>9} {label:>7} {r[f'{name}_us_per_block']:9.1f} "
                  f"{r[f'{name}_GBps']:7.2f} "
                  + (f"{100 * share:7.1f}% {added:10.2f}" if share is not None else ""))
    if not have_c:
        print(f"(no C figures: {args.c_bench} not built; cmake --build build/release --target "
              "capi_copyout_benchmark)")
    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
