#!/usr/bin/python3
"""LMCache's coordinator API served by cxlkv-orchestrator ([lmcache]): latency of reserve+finish
and lookup (p50/p99, batches of 1 and 64 keys) against a loopback HTTP baseline on the same
server and client, the same lookups through the domain's prefix index by chain lease (the
RPC-free path: a host joined to the domain, cxlkv Python package; the objects are there as
the owner's own entries), and objects per second at concurrency 1-16.

Run (Debian's interpreter; a release build of the orchestrator and libcxlkv):
    cmake --preset release
    cmake --build build/release --target cxlkv-orchestrator cxlkv
    /usr/bin/python3 bench/lmcache_coordinator_bench.py \
        --orchestrator build/release/orchestrator/daemon/cxlkv-orchestrator [--json out.json]

Client: tools/lmcache-qualify/coordinator_client.py (http.client, one kept-alive connection,
TCP_NODELAY), one process, loopback. Baselines, same server and client: GET /healthz (no
token, no body: the HTTP round trip) and POST /v1/lookup with no keys (token, JSON body and
reply, no index work). Objects are 4 KiB (the coordinator's cost does not depend on size).
The coordinator's state file is on --state-dir (default: a temp dir on the root disk);
every reserve and finish waits for its fdatasync there. Objects/s: N processes, each reserving
and finishing one object per call (and separately 64 per call) for --seconds, a fresh domain
per level. Under pressure: reserve+finish of one object when the region is full and every
reserve must evict one.

The peer, in the same run (--peer-lmcache PATH): LMCache's own coordinator (milestone M0:
``lmcache.v1.memory_coordinator``'s ``create_app`` under uvicorn, as LMCache's tests serve it)
over the same region size and alignment, driven by the same client for the same rows:
the baselines, reserve+finish and lookups, with 1 client and with --clients concurrent client
processes (each timing its own calls). PATH is a PYTHONPATH under which LMCache's coordinator
and its dependencies (pydantic 2, FastAPI, uvicorn) import, for --peer-python (default: this
interpreter). M0 keeps its objects in memory (its state file is only a start latch): what
cxlkv's durability costs is in the difference.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "lmcache-qualify"))
from coordinator_client import Client, make_key, make_layout  # noqa: E402
from emulated_domain import EmulatedDomain, die_with_parent, exit_on_termination  # noqa: E402

OBJ = 4096
#: The region of the rows with concurrent clients and of LMCache's coordinator: room for every
#: object they finish (4 clients: about 68,000 of 4 KiB).
PEER_REGION_MIB = 1024


def pct(ts, p):
    s = sorted(ts)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


def summary(ts, per=1):
    return {"n": len(ts), "p50_us": pct(ts, 50) * 1e6, "p99_us": pct(ts, 99) * 1e6,
            "per_key_p50_us": pct(ts, 50) * 1e6 / per}


def timed(fn, n):
    ts = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        ts.append(time.perf_counter() - t0)
    return ts


def latency(binary, n, state_dir, clients=1):
    # An index with room for every object this run finishes (at most 3/4 of it is published).
    d = EmulatedDomain(binary, pool_mib=512, region_mib=256, ttl_ms=60000, lease_ms=10,
                       state_dir=state_dir, index_entries=1 << 17)
    out = {}
    try:
        d.start()
        c = Client(d.port, d.tokens["default"])
        c.region()
        c.key_base = 0
        api_rows(c, n, out)
        out.update(index_path(d, n))
        # Under pressure: fill the region, then each reserve evicts the least recently used.
        cap = c.region()["capacity_bytes"] // OBJ
        have = c.status()["object_count"]
        k = 50_000_000
        while have < cap:
            m = min(256, cap - have)
            c.finish(c.reserve([(make_key(k + j), make_layout(OBJ)) for j in range(m)]))
            k += m
            have += m
        time.sleep(0.05)  # the read leases (10 ms) of the lookups above end
        before = c.stats()["evicted"]

        def rf_full(i):
            c.finish(c.reserve([(make_key(90_000_000 + i), make_layout(OBJ))]))
        ts = timed(rf_full, max(20, n // 4))
        out[f"reserve+finish, batch 1, region full ({cap} objects; each evicts)"] = summary(ts)
        st = c.stats()
        assert st["evicted"] - before >= len(ts)
        out["region full: coordinator figures"] = {
            k: st[k] for k in ("evicted", "held_bytes", "index_waits", "indexed", "index_skipped")}
    finally:
        d.close()
    if clients > 1:
        # A fresh domain whose region holds every object the clients finish (no eviction: M0
        # has none, and the rows compare like with like).
        d = EmulatedDomain(binary, pool_mib=2048, region_mib=PEER_REGION_MIB, ttl_ms=60000,
                           lease_ms=10, state_dir=state_dir, threads=16, index_entries=1 << 17)
        try:
            d.start()
            out.update(concurrent_rows(d.port, d.tokens["default"], n, clients,
                                       f"{clients} clients: "))
        finally:
            d.close()
    return out


def index_path(d, n):
    """The same keys as the HTTP lookups above, through the domain's prefix index: a host joined
    to the domain (the orchestrator's socket) leases them by chain lease (no HTTP), and reads
    one object through its own mapping of the region (the RPC-free path)."""
    sys.path.insert(0, str(ROOT / "python"))
    import mmap
    import cxlkv
    c = Client(d.port, d.tokens["default"])
    region = c.region()
    st = c.stats()
    ns = cxlkv.Namespace("default", "lmcache", region["layout_id"])
    assert int(st["index_namespace"], 16) == ns.id

    def ikey(k):
        return cxlkv.key_from_name(ns.id, cxlkv.lmcache_index_name(
            k["chunk_hash_hex"], k["model_name"], k["kv_rank"], k.get("object_group_id", 0),
            k.get("cache_salt", "")))
    host = cxlkv.Domain.join(f"orchestrator:{d.dir}/o.sock", 1)
    fd = os.open(d.pool, os.O_RDONLY)
    m = mmap.mmap(fd, d.region_bytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ,
                  offset=d.region_offset)
    view = memoryview(m)
    out = {}
    try:
        # The owner loop publishes finished objects within a step or two: wait for the last.
        last = ikey(make_key(64 * 10_000_000 + 64 * max(20, n // 4) - 1))
        deadline = time.monotonic() + 30
        while len(host.acquire_chain(ns, [last], wait_s=1.0)) == 0:
            assert time.monotonic() < deadline, "the objects never reached the index"
            time.sleep(0.01)
        for batch in (1, 64):
            reps = n if batch == 1 else max(20, n // 4)
            base = 10_000_000 * batch
            keys = [[ikey(make_key(base + r * batch + j)) for j in range(batch)]
                    for r in range(reps)]

            def acq(i, batch=batch, keys=keys):
                with host.acquire_chain(ns, keys[i % len(keys)], wait_s=1.0) as leases:
                    assert len(leases) == batch
            acq(0)
            out[f"index: chain lease acquire+release, {batch} keys"] = summary(
                timed(acq, reps), batch)
        keys1 = [ikey(make_key(10_000_000 + r)) for r in range(n)]
        dst = bytearray(OBJ)

        def read(i):
            with host.acquire_chain(ns, [keys1[i % n]], wait_s=1.0) as leases:
                assert leases.try_copy_out_region(0, view, dst)
        read(0)
        out[f"index: acquire + copy out {OBJ} B + release, 1 key"] = summary(timed(read, n))
    finally:
        host.leave()
        view.release()
        m.close()
        os.close(fd)
    return out


def api_rows(c, n, rows, summarize=summary):
    """The rows both servers answer: the HTTP baselines, reserve+finish and lookups of 1 and
    64 keys, into `rows`, each summarize(timings, keys per call). Keys are the client's own
    range (`c.key_base`)."""
    empty = {"region_epoch": c.epoch, "keys": []}
    for _ in range(50):  # warm the connection and the server's threads
        c.raw("GET", "/healthz")
    rows["baseline GET /healthz"] = summarize(timed(lambda i: c.raw("GET", "/healthz"), n))
    rows["baseline POST /v1/lookup, 0 keys"] = summarize(
        timed(lambda i: c.raw("POST", "/v1/lookup", empty), n))
    for batch in (1, 64):
        reps = n if batch == 1 else max(20, n // 4)
        base = c.key_base + 10_000_000 * batch

        def rf(i, batch=batch, base=base):
            c.finish(c.reserve([(make_key(base + i * batch + j), make_layout(OBJ))
                                for j in range(batch)]))
        rows[f"reserve+finish, batch {batch}"] = summarize(timed(rf, reps), batch)

        def lk(i, batch=batch, base=base, reps=reps):
            start = (i % reps) * batch
            hits = c.lookup([make_key(base + start + j) for j in range(batch)])
            assert all(h is not None for h in hits)
        rows[f"lookup (hits), batch {batch}"] = summarize(timed(lk, reps), batch)


def client_proc(port, token, wid, n, start_at):
    """One of --clients concurrent clients: its api_rows' raw timings, as JSON on stdout."""
    c = Client(port, token)
    c.region()
    c.key_base = (wid + 1) * 1_000_000_000
    while time.time() < start_at:
        time.sleep(0.001)
    rows = {}
    api_rows(c, n, rows, lambda ts, per=1: {"ts": ts, "per": per})  # merged by the parent
    print(json.dumps(rows), flush=True)


def concurrent_rows(port, token, n, clients, prefix):
    """api_rows from `clients` processes at once; each row's p50/p99 over every call."""
    start_at = time.time() + 1.0 + 0.1 * clients
    procs = [subprocess.Popen([sys.executable, __file__, "--client", str(port), token, str(w),
                               str(n), str(start_at)], stdout=subprocess.PIPE, text=True,
                              preexec_fn=die_with_parent) for w in range(clients)]
    outs = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
    rows = {}
    for name in outs[0]:
        ts = [t for o in outs for t in o[name]["ts"]]
        rows[f"{prefix}{name}"] = summary(ts, outs[0][name]["per"])
    return rows


class LmcacheServer:
    """LMCache's M0 coordinator (create_app under uvicorn) on a loopback port, with a token
    file and a state file of its own, the region's size and alignment as cxlkv's."""

    SCRIPT = (
        "import sys, uvicorn\n"
        "from lmcache.v1.memory_coordinator.app import create_app\n"
        "from lmcache.v1.memory_coordinator.config import MemoryCoordinatorConfig\n"
        "port, tok, state, cap, align = sys.argv[1:6]\n"
        "cfg = MemoryCoordinatorConfig(host='127.0.0.1', port=int(port), token_file=tok,\n"
        "    state_file=state, region_id='bench', capacity_bytes=int(cap),\n"
        "    alignment_bytes=int(align), layout_id='qualify')\n"
        "uvicorn.run(create_app(cfg), host='127.0.0.1', port=int(port), log_level='warning')\n")

    def __init__(self, pythonpath, python, region_bytes, alignment, state_dir):
        import secrets
        import socket
        import tempfile
        self.dir = Path(tempfile.mkdtemp(prefix="lmcache-m0-", dir=state_dir))
        self.token = secrets.token_hex(16)
        tok = self.dir / "token"
        tok.write_text(self.token + "\n")
        tok.chmod(0o600)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=pythonpath)
        self.proc = subprocess.Popen(
            [python, "-c", self.SCRIPT, str(self.port), str(tok), str(self.dir / "state"),
             str(region_bytes), str(alignment)], env=env, preexec_fn=die_with_parent,
            stderr=open(self.dir / "log", "w"))
        end = time.time() + 30
        while time.time() < end:
            if self.proc.poll() is not None:
                raise SystemExit(f"LMCache's coordinator exited {self.proc.returncode}: "
                                 f"{(self.dir / 'log').read_text()[-2000:]}")
            try:
                Client(self.port, self.token).region()
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("LMCache's coordinator did not answer in 30 s")

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)


def peer(pythonpath, python, n, clients, state_dir):
    """The API rows on LMCache's M0 coordinator: 1 client, then `clients` at once."""
    out = {}
    srv = LmcacheServer(pythonpath, python, PEER_REGION_MIB << 20, 4096, state_dir)
    try:
        c = Client(srv.port, srv.token)
        c.region()
        c.key_base = 0
        api_rows(c, n, out)
        out.update(concurrent_rows(srv.port, srv.token, n, clients, f"{clients} clients: "))
    finally:
        srv.close()
    return out


def writer_proc(port, token, wid, seconds, batch, start_at):
    c = Client(port, token)
    c.region()
    while time.time() < start_at:
        time.sleep(0.001)
    end = start_at + seconds
    n = 0
    while time.time() < end:
        c.finish(c.reserve([(make_key(wid * 100_000_000 + n + j), make_layout(OBJ))
                            for j in range(batch)]))
        n += batch
    print(n, flush=True)


def throughput(binary, seconds, state_dir, levels):
    out = {}
    for batch in (1, 64):
        for conc in levels:
            d = EmulatedDomain(binary, pool_mib=1024, region_mib=768, ttl_ms=60000,
                               lease_ms=10, state_dir=state_dir, threads=16)
            try:
                d.start()
                start_at = time.time() + 1.0 + 0.05 * conc
                procs = [subprocess.Popen([sys.executable, __file__, "--writer", str(d.port),
                                           d.tokens["default"], str(w), str(seconds), str(batch),
                                           str(start_at)], stdout=subprocess.PIPE, text=True,
                                          preexec_fn=die_with_parent)
                         for w in range(conc)]
                total = sum(int(p.communicate(timeout=seconds + 60)[0]) for p in procs)
                out[f"batch {batch}, {conc} processes"] = {"objects": total,
                                                           "objects_per_s": total / seconds}
            finally:
                d.close()
    return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--writer":
        a = sys.argv[2:]
        writer_proc(int(a[0]), a[1], int(a[2]), float(a[3]), int(a[4]), float(a[5]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        a = sys.argv[2:]
        client_proc(int(a[0]), a[1], int(a[2]), int(a[3]), float(a[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orchestrator", required=True)
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--state-dir", default=None)
    ap.add_argument("--levels", default="1,2,4,8,16")
    ap.add_argument("--json", default=None)
    ap.add_argument("--clients", type=int, default=4,
                    help="concurrent clients of the second latency round (1: none)")
    ap.add_argument("--peer-lmcache", default=None, metavar="PYTHONPATH",
                    help="also measure LMCache's own coordinator, importable under PYTHONPATH")
    ap.add_argument("--peer-python", default=sys.executable)
    ap.add_argument("--no-throughput", action="store_true")
    a = ap.parse_args()
    exit_on_termination()  # SIGTERM/SIGHUP: each domain's `finally` removes its files
    info = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "load_before": open("/proc/loadavg").read().split()[:3],
            "uptime_before": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
            "cpus": os.cpu_count(), "orchestrator": a.orchestrator,
            "state_dir": a.state_dir or "temp dir under /tmp (root disk)"}
    res = {"latency": latency(a.orchestrator, a.iterations, a.state_dir, a.clients)}
    if a.peer_lmcache:
        res["peer_lmcache_m0"] = peer(a.peer_lmcache, a.peer_python, a.iterations, a.clients,
                                      a.state_dir)
    res["throughput"] = {} if a.no_throughput else throughput(
        a.orchestrator, a.seconds, a.state_dir, [int(x) for x in a.levels.split(",")])
    info["load_after"] = open("/proc/loadavg").read().split()[:3]
    info["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"# {info['date']}; {info['cpus']} CPUs; state file: {info['state_dir']}")
    print(f"# before: {info['uptime_before']}")
    print(f"# after:  {info['uptime_after']}")
    print(f"{'operation':64} {'p50 us':>9} {'p99 us':>9} {'p50 us/key':>11}")
    for part in ("latency", "peer_lmcache_m0"):
        if part not in res:
            continue
        if part != "latency":
            print("# LMCache's own coordinator (M0), same client, same run")
        for name, r in res[part].items():
            if "p50_us" not in r:
                print(f"{name}: {r}")
                continue
            print(f"{name:64} {r['p50_us']:9.1f} {r['p99_us']:9.1f} {r['per_key_p50_us']:11.2f}")
    print(f"{'reserve+finish throughput':64} {'objects/s':>9}")
    for name, r in res["throughput"].items():
        print(f"{name:64} {r['objects_per_s']:9.0f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"info": info, **res}, indent=2))


if __name__ == "__main__":
    main()
