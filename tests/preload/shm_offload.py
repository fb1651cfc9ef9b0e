#!/usr/bin/python3
"""The preload shim under a program that does exactly what vLLM's CPU offload does.

tests/preload/vllm_offload.cc creates /dev/shm/vllm_offload_<id>.mmap (O_CREAT|O_EXCL, the
others wait for its size), ftruncates it, maps it MAP_SHARED, populates its slice with
MADV_POPULATE_WRITE, registers the whole mapping with one cudaHostRegister, writes and checks
every worker's slice, and cleans up (unregister, munmap, close, the creator unlinks). Here it
runs as several workers under LD_PRELOAD=libcxlkv_preload.so with CXLKV_SHM naming the file,
and the test checks where the bytes landed:

  file      a file: pool. While the workers hold the region: the pool's own statistics
            (`cxlkvctl arena info --json`) show the file's extent persisted, the bytes the
            workers wrote are in the pool file at the offset the binding records, the /dev/shm
            file has no page of its own, one process bound it and the other found the binding;
            the shim split each cudaHostRegister into CXLKV_REGISTER_CHUNK chunks. After they
            exit: the extent is free again and the binding record gone.
  control   the same without CXLKV_SHM: the file has its pages and the pool none (so the
            checks above can fail).
  shm_open  one worker using shm_open/shm_unlink and MAP_POPULATE (older vLLM): bound, freed.
  kmem      kmem:node=N: every page of the region on node N (move_pages), policy MPOL_BIND.
            With one NUMA node only node 0 can be named: the binding is checked, the placement
            proves nothing there (said so); qemu-cxl/guest-tests/vllm-offload.sh has a CXL node.
  bad       CXLKV_SHM with a memfd pool: the error names the fix, the program runs unchanged.

Usage: shm_offload.py SHIM VLLM_OFFLOAD CXLKVCTL  (exit 0: pass; 77: not run, with the reason)
It leaves nothing behind, also when a check fails or it gets SIGINT/SIGTERM/SIGHUP: the
workers still running are killed, and its directories and its pid-tagged files in /dev/shm
(the pools, the offload files and their sidecars) removed.
"""

import glob
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

SHIM, PROG, CTL = sys.argv[1:4]
PID = os.getpid()
SHM_PREFIX = f"/dev/shm/vllm_offload_cxlkvtest{PID}_"
REGION = 8 << 20
BLOCK = 256 << 10  # a blank pool's block (preload/cxl_heap.h kChunkBytes)
FAILED = []
DIRS = []   # every directory this run made (workers' barriers, the shim's logs)
PROCS = []  # every worker started


def mkdtemp(prefix):
    d = tempfile.mkdtemp(prefix=prefix)
    DIRS.append(d)
    return d


def cleanup():
    """Kills the workers still running and removes everything this run created."""
    for p in PROCS:
        if p.poll() is None:
            p.kill()
            p.wait()
    for d in DIRS:
        shutil.rmtree(d, ignore_errors=True)
    shm = glob.glob(SHM_PREFIX + "*") + glob.glob(f"/dev/shm/.vllm_offload_cxlkvtest{PID}_*") + \
        glob.glob(f"/dev/shm/cxlkv-shm-pool-*{PID}")
    for f in shm:
        try:
            os.unlink(f)
        except FileNotFoundError:
            pass


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILED.append(what)
    return cond


def pat(rank, i):
    return (rank * 71 + i * 13 + (i >> 12) + 1) & 0xFF


def clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("CXLKV_")}
    env.pop("LD_PRELOAD", None)
    return env


def arena_info(pool_path):
    out = subprocess.run([CTL, "arena", "info", f"file:{pool_path}", "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["classes"][0]


def sidecars(path):
    d, base = os.path.split(path)
    return glob.glob(os.path.join(d, "." + base + ".*.cxlkv"))


def read_binding(path):
    """The record (preload/include/cxlkv/preload/layout.h) in the file's sidecar."""
    found = sidecars(path)
    if len(found) != 1:
        return None
    with open(found[0], "rb") as f:
        raw = f.read(576)
    magic, = struct.unpack_from("<Q", raw, 0)
    state, cls = struct.unpack_from("<II", raw, 64)
    first, count = struct.unpack_from("<II", raw, 88)
    extent, source_offset = struct.unpack_from("<QQ", raw, 96)
    return dict(magic=magic, state=state, first=first, count=count, extent=extent,
                source_offset=source_offset)


def run_workers(tag, path, world, env, extra=(), hold=True):
    """Starts `world` workers; returns (procs, summaries, hold_file, work_dir)."""
    work = mkdtemp(f"cxlkv-shm-{tag}-")
    barrier = os.path.join(work, "barrier")
    os.mkdir(barrier)
    hold_file = os.path.join(work, "release")
    procs = []
    for rank in range(world):
        args = [PROG, path, str(REGION), "--rank", str(rank), "--world", str(world),
                "--barrier", barrier, *extra]
        if hold:
            args += ["--hold", hold_file]
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                      stderr=open(os.path.join(work, f"err.{rank}"), "w"),
                                      text=True))
        PROCS.append(procs[-1])
        if rank == 0:
            time.sleep(0.2)  # rank 0 creates the file, as vLLM's first worker usually does
    summaries = []
    for rank, p in enumerate(procs):
        line = p.stdout.readline()
        if not line.startswith("vllm_offload: {"):
            p.wait(timeout=30)
            err = open(os.path.join(work, f"err.{rank}")).read()
            sys.exit(f"FAIL: {tag}: worker {rank} printed no summary (exit {p.returncode}): {err}")
        summaries.append(json.loads(line[len("vllm_offload: "):]))
    return procs, summaries, hold_file, work


def finish(procs, hold_file, work, tag):
    open(hold_file, "w").close()
    for rank, p in enumerate(procs):
        rc = p.wait(timeout=60)
        err = "" if rc == 0 else \
            f" (got {rc}: {open(os.path.join(work, f'err.{rank}')).read().strip()[-300:]})"
        check(rc == 0, f"{tag}: worker {rank} exited 0{err}")


def shim_env(pool, shm_glob, work_tag):
    env = clean_env()
    logdir = mkdtemp(f"cxlkv-shm-log-{work_tag}-")
    env.update(LD_PRELOAD=SHIM, CXLKV_POOL=pool, CXLKV_LOG=f"info,{logdir}/shim.log",
               CXLKV_STATS=f"{logdir}/%p.json", CXLKV_REGISTER_CHUNK="1M")
    if shm_glob:
        env["CXLKV_SHM"] = shm_glob
    return env, logdir


def scenario_file():
    pool = f"/dev/shm/cxlkv-shm-pool-{PID}"
    path = SHM_PREFIX + "file.mmap"
    env, logdir = shim_env(f"file:{pool}?size=64M&reserve=0", SHM_PREFIX + "*", "file")
    try:
        procs, sums, hold, work = run_workers("file", path, 2, env)
        check(all(s["data_ok"] for s in sums), "file: both workers read every worker's slice back")
        check(sum(s["creator"] for s in sums) == 1, "file: one worker created the file")
        st = os.stat(path)
        check(st.st_blocks == 0, f"file: the /dev/shm file has no pages of its own "
                                 f"(st_blocks {st.st_blocks})")
        info = arena_info(pool)
        check(info["persisted"] == REGION // BLOCK,
              f"file: the pool's statistics show the extent: {info['persisted']} persisted "
              f"blocks of {info['block_bytes']} (want {REGION // BLOCK})")
        rec = read_binding(path)
        check(rec is not None and rec["magic"] == int.from_bytes(b"CXLKVSHM", "little")
              and rec["state"] == 1 and rec["extent"] == REGION,
              f"file: the binding record names the extent: {rec}")
        if rec:
            per = REGION // 2
            with open(pool, "rb") as f:
                for rank in range(2):
                    f.seek(rec["source_offset"] + rank * per)
                    got = f.read(8192)
                    check(got == bytes(pat(rank, i) for i in range(8192)),
                          f"file: worker {rank}'s bytes are in the pool file at offset "
                          f"{rec['source_offset'] + rank * per}")
        finish(procs, hold, work, "file")
        log = open(f"{logdir}/shim.log").read()
        check(log.count(" bound to file:") == 1,
              "file: one worker bound the file, the other found the binding")
        chunked = log.count("in 8 chunks of at most 1048576 bytes") + \
            log.count(": 8 chunks of at most 1048576 bytes")
        check(chunked == 2, f"file: each worker's cudaHostRegister of 8 MiB went to the driver in "
                            f"8 chunks of 1 MiB ({chunked} of 2 logged)")
        for s in sums:
            print(f"     worker {s['rank']}: registered: {s['registered']}")
        check(not sidecars(path) and arena_info(pool)["persisted"] == 0,
              "file: after the workers exit the extent is free and the record gone")
        stats = [json.load(open(f)) for f in glob.glob(f"{logdir}/*.json")]
        bound = [s["shm_bound"] for s in stats if s["shm_bound"]]
        check(bound == [1, 1] and all(s["shm_bound_bytes"] == REGION for s in stats
                                      if s["shm_bound"]),
              f"file: each worker's stats count one bound mapping of 8 MiB ({bound})")
    finally:
        for p in (pool, path, *sidecars(path)):
            if os.path.exists(p):
                os.unlink(p)


def scenario_control():
    pool = f"/dev/shm/cxlkv-shm-pool-ctl-{PID}"
    path = SHM_PREFIX + "control.mmap"
    env, _ = shim_env(f"file:{pool}?size=64M&reserve=0", None, "control")
    try:
        procs, sums, hold, work = run_workers("control", path, 2, env)
        st = os.stat(path)
        check(st.st_blocks * 512 >= REGION, f"control: without CXLKV_SHM the file holds the "
                                            f"region's pages ({st.st_blocks * 512} bytes)")
        check(arena_info(pool)["persisted"] == 0 and not sidecars(path),
              "control: ... and the pool nothing of it")
        finish(procs, hold, work, "control")
    finally:
        for p in (pool, path):
            if os.path.exists(p):
                os.unlink(p)


def scenario_shm_open():
    pool = f"/dev/shm/cxlkv-shm-pool-so-{PID}"
    path = SHM_PREFIX + "shmopen.mmap"
    env, logdir = shim_env(f"file:{pool}?size=64M&reserve=0", SHM_PREFIX + "*", "shmopen")
    try:
        procs, sums, hold, work = run_workers("shm_open", path, 1, env,
                                              ("--open", "shm_open", "--populate", "map"))
        check(sums[0]["data_ok"] and os.stat(path).st_blocks == 0 and
              arena_info(pool)["persisted"] == REGION // BLOCK,
              "shm_open + MAP_POPULATE: the region is in the pool, not in the file")
        finish(procs, hold, work, "shm_open")
        check(not os.path.exists(path) and not sidecars(path) and
              arena_info(pool)["persisted"] == 0, "shm_open: shm_unlink freed the extent")
    finally:
        for p in (pool, path, *sidecars(path)):
            if os.path.exists(p):
                os.unlink(p)


def memory_nodes():
    nodes = []
    for d in glob.glob("/sys/devices/system/node/node[0-9]*"):
        n = int(d.rsplit("node", 1)[1])
        mem = open(os.path.join(d, "meminfo")).read()
        total = int(mem.split("MemTotal:")[1].split()[0])
        if total > 0:
            nodes.append(n)
    return sorted(nodes)


def scenario_kmem():
    nodes = memory_nodes()
    node = nodes[-1] if nodes else 0
    path = SHM_PREFIX + "kmem.mmap"
    env, logdir = shim_env(f"kmem:node={node}", SHM_PREFIX + "*", "kmem")
    procs, sums, hold, work = run_workers("kmem", path, 2, env, ("--expect-node", str(node)),
                                          hold=False)
    for p in procs:
        p.wait(timeout=60)
    check(all(p.returncode == 0 for p in procs) and all(s["data_ok"] for s in sums),
          f"kmem:node={node}: both workers ran and read every slice back")
    check(all(s["policy"] == f"bind:{node}" for s in sums),
          f"kmem:node={node}: the region's policy is MPOL_BIND to node {node} "
          f"({[s['policy'] for s in sums]})")
    check(all(list(s["nodes"]) == [str(node)] for s in sums),
          f"kmem:node={node}: move_pages puts every page on node {node} ({sums[0]['nodes']})")
    if len(nodes) < 2:
        print(f"note kmem: this machine has one NUMA node with memory ({nodes}): the placement "
              f"check cannot tell a binding from none here; see the QEMU kmem guest test")
    if os.path.exists(path):
        os.unlink(path)


def scenario_bad():
    path = SHM_PREFIX + "bad.mmap"
    env, _ = shim_env("memfd:?size=64M", SHM_PREFIX + "*", "bad")
    p = subprocess.run([PROG, path, str(REGION)], env=env, capture_output=True, text=True,
                       timeout=60)
    check(p.returncode == 0 and "needs a pool every process can map" in p.stderr and
          "kmem:node=N" in p.stderr,
          "bad: CXLKV_SHM with a memfd pool is reported with the fix, and the program runs")
    if os.path.exists(path):
        os.unlink(path)


def main():
    for f in (SHIM, PROG, CTL):
        if not os.path.exists(f):
            sys.exit(f"missing {f}")

    def terminate(sig, _frame):
        raise SystemExit(128 + sig)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, terminate)
    try:
        scenario_file()
        scenario_control()
        scenario_shm_open()
        scenario_kmem()
        scenario_bad()
    finally:
        cleanup()
    if FAILED:
        sys.exit(f"{len(FAILED)} check(s) failed")
    print("PASS")


if __name__ == "__main__":
    main()
