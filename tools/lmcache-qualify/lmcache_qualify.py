#!/usr/bin/python3
"""lmcache-qualify: LMCache's shared-L1 qualification gates, run through the real visibility
library and a real coordinator (docs/lmcache.md "Qualification").

  lmcache_qualify.py --launch ORCHESTRATOR --library SO          # an emulated pool, here
  lmcache_qualify.py --endpoint URL --token-file F --pool DEV --library SO [--mapping-offset N]
  lmcache_qualify.py ... --role a   (on host A)  and  --role b  (on host B), same --run-id

Gates: visibility (both directions, checksums), stale_generation, concurrency (1, 2, 4, 8, 16
processes), failure (writer, reader, and with --launch the coordinator killed), mixed (a timed
allocate/read/evict run checking overlap, corruption, stale acceptance, premature reclaim and
leaked reservations or space). A report per gate in text, or --json. Exit 0 when every gate
that ran passed; 1 otherwise; 2 for bad usage.

Payloads are a function of (run id, key, generation), so a reader on another host checks what
it read without any channel but the coordinator. Python's standard library only.
"""

import argparse
import ctypes
import hashlib
import json
import mmap
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from coordinator_client import Client, CoordinatorError  # noqa: E402
from emulated_domain import EmulatedDomain, die_with_parent, exit_on_termination  # noqa: E402

PUBLISH, ACQUIRE = 1, 2


# ---- the pieces every process uses ------------------------------------------------------------

class Visibility:
    """LMCache's loader: ctypes.CDLL(path, use_errno=True), the v1 symbol, seven argtypes."""

    def __init__(self, path):
        if not os.path.isabs(path) or not os.path.isfile(path):
            raise ValueError(f"{path}: the visibility library must be an absolute regular file")
        lib = ctypes.CDLL(path, use_errno=True)
        f = lib.lmcache_shared_l1_visibility_v1
        f.argtypes = [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p,
                      ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint64]
        f.restype = ctypes.c_int
        self.lib, self.f = lib, f

    def apply(self, op, fd, address, device_offset, length, generation):
        r = self.f(b"software_fenced", op, fd, ctypes.c_void_p(address), device_offset, length,
                   generation)
        if r:
            raise RuntimeError(f"shared-L1 visibility operation {op} failed: {os.strerror(-r)}")


class Region:
    """The coordinator's region mapped as an MP server maps it (at the mapping offset). With
    sim_fabric (a test build's library, tests/lmcache/sim_fabric.cc), this process is one host
    of the non-coherence simulator instead: its loads and stores go through a simulated private
    cache over the pool file, and the addresses given to the visibility library are the
    simulator's window, whose cache operations act on that cache."""

    def __init__(self, pool, mapping_offset, capacity, library, sim_fabric=None, seed=0):
        self.vis = Visibility(library)
        self.fd = os.open(pool, os.O_RDWR)
        self.off = mapping_offset
        self.sim = None
        if sim_fabric:
            sim = ctypes.CDLL(sim_fabric, use_errno=True)
            sim.cxlkv_sim_attach.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64,
                                             ctypes.c_uint64]
            sim.cxlkv_sim_attach.restype = ctypes.c_void_p
            for f in (sim.cxlkv_sim_write, sim.cxlkv_sim_read):
                f.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
                f.restype = ctypes.c_int
            base = sim.cxlkv_sim_attach(pool.encode(), mapping_offset, capacity, seed)
            if not base:
                raise OSError(ctypes.get_errno(), f"{sim_fabric}: cannot attach to {pool}")
            self.sim, self.base, self.m = sim, base, None
            return
        self.m = mmap.mmap(self.fd, capacity, flags=mmap.MAP_SHARED,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=mapping_offset)
        self.anchor = ctypes.c_ubyte.from_buffer(self.m)
        self.base = ctypes.addressof(self.anchor)

    def store(self, o, data):
        if self.sim is None:
            self.m[o:o + len(data)] = data
        elif self.sim.cxlkv_sim_write(o, data, len(data)) != 0:
            raise OSError("simulated store outside the region")

    def load(self, o, n):
        if self.sim is None:
            return bytes(self.m[o:o + n])
        buf = ctypes.create_string_buffer(n)
        if self.sim.cxlkv_sim_read(o, buf, n) != 0:
            raise OSError("simulated load outside the region")
        return buf.raw

    def write(self, h, payload):
        o, n = h["offset"], h["length"]
        self.store(o, payload)
        self.vis.apply(PUBLISH, self.fd, self.base + o, self.off + o, n, h["generation"])

    def read(self, h):
        o, n = h["offset"], h["length"]
        self.vis.apply(ACQUIRE, self.fd, self.base + o, self.off + o, n, h["generation"])
        return self.load(o, n)


def payload(run, key_hex, generation, length):
    return hashlib.shake_256(f"{run}:{key_hex}:{generation}".encode()).digest(length)


def key_of(run, name):
    """An EncodedObjectKey whose hash is derived from the run and a name."""
    return {"chunk_hash_hex": hashlib.sha256(f"{run}/{name}".encode()).hexdigest(),
            "model_name": "qualify", "kv_rank": 0, "object_group_id": 0, "cache_salt": ""}


def layout(nbytes):
    return {"shapes": [[nbytes]], "dtypes": ["uint8"]}


class Ctx:
    """What a worker needs: endpoint, token, the mapping. Passed as JSON to child processes."""

    def __init__(self, d):
        self.d = d
        self.client = Client(d["port"], d["token"], host=d["host"])
        self.contract = self.client.region()
        self.region = Region(d["pool"], d["mapping_offset"], self.contract["capacity_bytes"],
                             d["library"], d.get("sim_fabric"), os.getpid())
        self.run = d["run"]

    def put(self, names, sizes, finish=True):
        """Reserves, writes, publishes and (by default) finishes; returns the grants."""
        items = [(key_of(self.run, n), layout(s)) for n, s in zip(names, sizes)]
        grants = self.client.reserve(items)
        for g in grants:
            if g is not None:
                h = g["handle"]
                self.region.write(h, payload(self.run, g["key"]["chunk_hash_hex"],
                                             h["generation"], h["length"]))
        if finish:
            self.client.finish([g for g in grants if g is not None])
        return grants

    def get(self, names):
        """Lookup, acquire, copy, check, re-validate. Returns per name: 'ok', 'miss', 'stale'
        (changed during the copy: refused), or 'corrupt' (same generation, wrong bytes)."""
        keys = [key_of(self.run, n) for n in names]
        hits = self.client.lookup(keys)
        out = []
        for k, hit in zip(keys, hits):
            if hit is None:
                out.append(("miss", None))
                continue
            h = hit["handle"]
            t0 = time.monotonic()
            data = self.region.read(h)
            good = data == payload(self.run, k["chunk_hash_hex"], h["generation"], h["length"])
            again = self.client.lookup([k])[0]
            same = again is not None and again["handle"] == h
            elapsed_ms = (time.monotonic() - t0) * 1000
            if not same:
                out.append(("stale", elapsed_ms))
            elif not good:
                out.append(("corrupt", h))
            else:
                out.append(("ok", h))
        return out


# ---- workers (child processes) ---------------------------------------------------------------

def worker(spec):
    w = json.loads(spec)
    ctx = Ctx(w["ctx"])
    kind = w["kind"]
    if kind == "write":
        rng = random.Random(w["seed"])
        names = w["names"]
        done = 0
        for i in range(0, len(names), 8):
            batch = names[i:i + 8]
            grants = ctx.put(batch, [rng.randrange(64, w["max_bytes"]) for _ in batch])
            done += sum(g is not None for g in grants)
        print(json.dumps({"written": done}), flush=True)
    elif kind == "read":
        deadline = time.monotonic() + w.get("wait_s", 30)
        pending = list(w["names"])
        counts = {"ok": 0, "miss": 0, "stale": 0, "corrupt": 0}
        while pending and time.monotonic() < deadline:
            res = ctx.get(pending[:64])
            keep = []
            for n, (r, _) in zip(pending[:64], res):
                if r == "miss":
                    keep.append(n)
                else:
                    counts[r] += 1
            pending = keep + pending[64:]
            if keep:
                time.sleep(0.05)
        counts["miss"] = len(pending)
        print(json.dumps(counts), flush=True)
    elif kind == "hang_writer":
        g = ctx.put([w["name"]], [w["bytes"]], finish=False)[0]
        print(json.dumps(g), flush=True)
        time.sleep(3600)
    elif kind == "hang_reader":
        hit = ctx.client.lookup([key_of(ctx.run, w["name"])])[0]
        h = hit["handle"]
        half = h["length"] // 2
        ctx.region.vis.apply(ACQUIRE, ctx.region.fd, ctx.region.base + h["offset"],
                             ctx.region.off + h["offset"], h["length"], h["generation"])
        _ = ctx.region.load(h["offset"], half)
        print(json.dumps(hit), flush=True)
        time.sleep(3600)
    elif kind == "mixed":
        mixed_worker(ctx, w)


def mixed_worker(ctx, w):
    rng = random.Random(w["seed"])
    lease_ms = w["lease_ms"]
    me, workers = w["id"], w["workers"]
    c = {"reserved": 0, "finished": 0, "aborted": 0, "abandoned": 0, "out_of_space": 0,
         "ok": 0, "miss": 0, "stale_refused": 0, "corrupt": 0, "premature": 0}
    written = 0
    finished = []
    deadline = time.monotonic() + w["duration_s"]
    while time.monotonic() < deadline:
        if rng.random() < 0.45:
            n = rng.randrange(1, 5)
            names = [f"m{me}-{written + i}" for i in range(n)]
            written += n
            try:
                grants = ctx.put(names, [rng.randrange(64, w["max_bytes"]) for _ in names],
                                 finish=False)
            except CoordinatorError as e:
                if e.error != "out_of_space":
                    raise
                c["out_of_space"] += 1
                continue
            grants = [g for g in grants if g is not None]
            c["reserved"] += len(grants)
            fate = rng.random()
            if fate < 0.05:
                c["abandoned"] += len(grants)  # the TTL reclaims them
            elif fate < 0.12:
                ctx.client.abort(grants)
                c["aborted"] += len(grants)
            else:
                ctx.client.finish(grants)
                c["finished"] += len(grants)
                finished += [g["key"]["chunk_hash_hex"] for g in grants]
        else:
            names = []
            for _ in range(rng.randrange(1, 5)):
                peer = rng.randrange(workers)
                names.append(f"m{peer}-{rng.randrange(max(1, written))}")
            names = list(dict.fromkeys(names))
            for r, x in ctx.get(names):
                if r == "stale":
                    # Changed under the copy: refused. Within the read lease that is a premature
                    # reclaim (the lease should have kept it).
                    c["stale_refused"] += 1
                    if x < lease_ms * 0.5:
                        c["premature"] += 1
                elif r == "corrupt":
                    c["corrupt"] += 1
                else:
                    c[r] += 1
    c["finished_keys"] = finished
    print(json.dumps(c), flush=True)


_workers = []  # every worker started, so that the run stops them when it ends however it ends


def spawn(ctxd, kind, **kw):
    spec = json.dumps({"ctx": ctxd, "kind": kind, **kw})
    p = subprocess.Popen([sys.executable, __file__, "--worker", spec], stdout=subprocess.PIPE,
                         text=True, preexec_fn=die_with_parent)
    _workers.append(p)
    return p


def stop_workers():
    """Kills the workers still running (a gate that failed or was interrupted) and reaps them."""
    for p in _workers:
        if p.poll() is None:
            p.kill()
            p.wait()
        if p.stdout is not None:
            p.stdout.close()
    _workers.clear()


def collect(procs, timeout=120):
    out = []
    for p in procs:
        o, _ = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"a worker exited {p.returncode}")
        out.append(json.loads(o))
    return out


# ---- the gates --------------------------------------------------------------------------------

class Gate:
    def __init__(self, name):
        self.name, self.passed, self.skipped, self.detail, self.figures = name, False, False, "", {}

    def as_dict(self):
        return {"gate": self.name, "result": "skipped" if self.skipped else
                ("pass" if self.passed else "FAIL"), "detail": self.detail,
                "figures": self.figures}


def gate_visibility(q, g):
    """Host A writes, host B reads, and the other way; every object checked."""
    n = q.objects
    if q.role in ("a", "b"):
        mine, theirs = ("a", "b") if q.role == "a" else ("b", "a")
        w = collect([spawn(q.ctxd, "write", names=[f"vis-{mine}-{i}" for i in range(n)],
                           seed=q.seed, max_bytes=256 * 1024)])[0]
        if q.scribble:
            scribble(q, [f"vis-{theirs}-{i}" for i in range(n)][:q.scribble])
        r = collect([spawn(q.ctxd, "read", names=[f"vis-{theirs}-{i}" for i in range(n)],
                           wait_s=q.peer_wait_s)], timeout=q.peer_wait_s + 60)[0]
        g.figures = {"written": w["written"], **r}
        if q.scribble:
            g.figures["scribbled"] = q.scribble
        g.passed = r["ok"] == n and r["corrupt"] == 0
        g.detail = f"{r['ok']}/{n} of the peer's objects read intact"
        return
    ws = collect([spawn(q.ctxd, "write", names=[f"vis-{s}-{i}" for i in range(n)],
                        seed=q.seed + k, max_bytes=256 * 1024) for k, s in enumerate("ab")])
    rs = collect([spawn(q.ctxd, "read", names=[f"vis-{s}-{i}" for i in range(n)])
                  for s in "ba"])
    ok = sum(r["ok"] for r in rs)
    g.figures = {"written": sum(w["written"] for w in ws), "read_ok": ok,
                 "corrupt": sum(r["corrupt"] for r in rs), "missing": sum(r["miss"] for r in rs)}
    g.passed = ok == 2 * n
    g.detail = f"{ok}/{2 * n} objects intact, written by one process and read by the other"


def scribble(q, names):
    """The negative control (--scribble): once the peer has published these objects, flips
    the first 8 bytes of each through this host's mapping, then publishes that store, so the
    reader that follows must find them corrupt."""
    keys = [key_of(q.ctx.run, n) for n in names]
    deadline = time.monotonic() + q.peer_wait_s
    hits = q.ctx.client.lookup(keys)
    while any(h is None for h in hits):
        if time.monotonic() > deadline:
            raise RuntimeError(f"--scribble: the peer's objects {names} never appeared")
        time.sleep(0.05)
        hits = q.ctx.client.lookup(keys)
    for hit in hits:
        h = dict(hit["handle"], length=8)
        old = q.ctx.region.read(h)
        q.ctx.region.write(h, bytes(b ^ 0xA5 for b in old))


def gate_stale_generation(q, g):
    ctx = q.ctx
    c = ctx.client
    name = f"stale-{q.seed}"
    g1 = ctx.put([name], [4096], finish=False)[0]
    c.abort([g1])
    # The same bytes granted again: a larger generation, and the old key is gone.
    g2 = ctx.put([name + "-next"], [4096])[0]
    reuse = g2["handle"]["offset"] == g1["handle"]["offset"]
    newer = g2["handle"]["generation"] > g1["handle"]["generation"]
    gone = c.lookup([g1["key"]]) == [None]
    # A reader holding the old handle re-validates and refuses.
    status, body = c.raw("POST", "/v1/writes/finish", {"region_epoch": c.epoch, "reservations": [
        {"key": g1["key"], "token": g1["token"]}]})
    refused_finish = status == 409 and body.get("error") == "invalid_reservation"
    status, body = c.raw("POST", "/v1/lookup", {"region_epoch": "0" * 32, "keys": [g1["key"]]})
    refused_epoch = status == 409 and body.get("error") == "stale_epoch"
    g.figures = {"same_range_reused": reuse, "generation_before": g1["handle"]["generation"],
                 "generation_after": g2["handle"]["generation"]}
    g.passed = newer and gone and refused_finish and refused_epoch
    g.detail = ("a reused range carries a larger generation, the old key is gone, its finish is "
                "invalid_reservation, an old epoch is stale_epoch") if g.passed else \
        f"newer={newer} gone={gone} finish_refused={refused_finish} epoch_refused={refused_epoch}"


def gate_concurrency(q, g):
    figures = {}
    ok_all = True
    for n in q.levels:
        per = max(8, q.objects // 2)
        names = [[f"conc{n}-{w}-{i}" for i in range(per)] for w in range(n)]
        t0 = time.monotonic()
        ws = collect([spawn(q.ctxd, "write", names=names[w], seed=q.seed + w,
                            max_bytes=64 * 1024) for w in range(n)])
        tw = time.monotonic() - t0
        t0 = time.monotonic()
        rs = collect([spawn(q.ctxd, "read", names=names[(w + 1) % n], wait_s=10)
                      for w in range(n)])
        tr = time.monotonic() - t0
        ok = sum(r["ok"] for r in rs)
        bad = sum(r["corrupt"] for r in rs)
        figures[str(n)] = {"objects": n * per, "intact": ok, "corrupt": bad,
                           "write_s": round(tw, 3), "read_s": round(tr, 3)}
        ok_all = ok_all and ok == n * per and bad == 0 and sum(w["written"] for w in ws) == n * per
    g.figures = figures
    g.passed = ok_all
    g.detail = f"{', '.join(map(str, q.levels))} processes: every object written and read back intact" \
        if ok_all else "objects lost or corrupt (see figures)"


def gate_failure(q, g):
    c = q.ctx.client
    st = c.stats() if q.cxlkv else None
    ttl = st["reservation_ttl_ms"] if st else q.ttl_ms
    notes, ok = [], True
    # A writer killed mid-reservation: the reservation is reclaimed after the TTL.
    used = c.status()["used_bytes"]
    p = spawn(q.ctxd, "hang_writer", name=f"fail-w-{q.seed}", bytes=65536)
    grant = json.loads(p.stdout.readline())
    p.kill()
    p.wait()
    time.sleep(ttl / 1000 * 2 + 0.5)
    back = c.status()["used_bytes"] <= used
    status, body = c.raw("POST", "/v1/writes/finish", {"region_epoch": c.epoch, "reservations": [
        {"key": grant["key"], "token": grant["token"]}]})
    reclaimed = back and status == 409
    notes.append(f"writer killed: reservation {'reclaimed' if reclaimed else 'NOT reclaimed'} "
                 f"after {ttl} ms")
    ok &= reclaimed
    # A reader killed mid-copy: the object stays, readable by others; nothing is held.
    q.ctx.put([f"fail-r-{q.seed}"], [65536])
    p = spawn(q.ctxd, "hang_reader", name=f"fail-r-{q.seed}")
    p.stdout.readline()
    p.kill()
    p.wait()
    r = q.ctx.get([f"fail-r-{q.seed}"])[0][0]
    notes.append(f"reader killed: object {r}")
    ok &= r == "ok"
    # The coordinator killed between finish and lookup (only where this tool started it).
    if q.domain is not None:
        names = [f"fail-c-{q.seed}-{i}" for i in range(16)]
        collect([spawn(q.ctxd, "write", names=names, seed=q.seed, max_bytes=65536)])
        epoch = c.epoch
        q.domain.kill(signal.SIGKILL)
        q.domain.start()
        q.ctxd["port"] = q.domain.port
        q.ctx = Ctx(q.ctxd)
        same = q.ctx.client.epoch == epoch
        rs = collect([spawn(q.ctxd, "read", names=names, wait_s=5)])[0]
        survived = same and rs["ok"] == len(names)
        notes.append(f"coordinator killed -9 and restarted: epoch {'kept' if same else 'CHANGED'},"
                     f" {rs['ok']}/{len(names)} objects intact")
        ok &= survived
    else:
        notes.append("coordinator kill: skipped (only with --launch)")
    g.passed = ok
    g.detail = "; ".join(notes)


def gate_mixed(q, g):
    c = q.ctx.client
    st = c.stats() if q.cxlkv else {}
    lease_ms = st.get("read_lease_ms", q.lease_ms)
    ttl = st.get("reservation_ttl_ms", q.ttl_ms)
    n = q.mixed_workers
    res = collect([spawn(q.ctxd, "mixed", id=w, workers=n, seed=q.seed * 100 + w,
                         duration_s=q.duration, lease_ms=lease_ms, max_bytes=256 * 1024)
                   for w in range(n)], timeout=q.duration + 120)
    tot = {k: sum(r[k] for r in res) for k in res[0] if k != "finished_keys"}
    # After the TTL: nothing left WRITING, and the bytes in use are exactly the live objects'.
    time.sleep(ttl / 1000 * 2 + 0.5)
    keys = [k for r in res for k in r["finished_keys"]]
    align = q.ctx.contract["alignment_bytes"]
    live, spans = 0, []
    for i in range(0, len(keys), 256):
        batch = [{"chunk_hash_hex": h, "model_name": "qualify", "kv_rank": 0,
                  "object_group_id": 0, "cache_salt": ""} for h in keys[i:i + 256]]
        for hit in c.lookup(batch):
            if hit:
                h = hit["handle"]
                live += (h["length"] + align - 1) // align * align
                spans.append((h["offset"], h["offset"] + h["length"]))
    spans.sort()
    overlap = sum(1 for a, b in zip(spans, spans[1:]) if a[1] > b[0])
    status = c.status()
    writing = c.stats()["writing"] if q.cxlkv else 0
    # Objects from other gates are also in use: only what the mixed run left is compared.
    tot.update({"overlaps": overlap, "live_objects": len(spans), "writing_after_ttl": writing,
                "used_bytes": status["used_bytes"], "live_bytes": live})
    g.figures = tot
    leaked = writing != 0 or status["used_bytes"] < live
    g.passed = (tot["corrupt"] == 0 and tot["premature"] == 0 and overlap == 0 and not leaked
                and tot["ok"] > 0)
    g.detail = (f"{q.duration:g} s, {n} processes: {tot['finished']} finished, {tot['ok']} reads "
                f"intact, {tot['stale_refused']} stale refused, {tot['corrupt']} corrupt, "
                f"{tot['premature']} premature reclaims, {overlap} overlaps, "
                f"{writing} reservations left after the TTL")


GATES = {"visibility": gate_visibility, "stale_generation": gate_stale_generation,
         "concurrency": gate_concurrency, "failure": gate_failure, "mixed": gate_mixed}


class Qualify:
    pass


def read_token(path):
    lines = [l.split() for l in Path(path).read_text().splitlines()
             if l.strip() and not l.strip().startswith("#")]
    return lines[0][-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--launch", metavar="ORCHESTRATOR", help="start an emulated domain here")
    ap.add_argument("--endpoint", help="the coordinator, http://HOST:PORT")
    ap.add_argument("--token-file")
    ap.add_argument("--pool", help="the device (or file) the region lives on")
    ap.add_argument("--mapping-offset", type=int, default=None,
                    help="the region's offset in --pool (default: cxlkv's region_offset)")
    ap.add_argument("--library", required=False, help="the visibility library (absolute path)")
    ap.add_argument("--gates", default=",".join(GATES))
    ap.add_argument("--role", choices=["both", "a", "b"], default="both",
                    help="visibility between two hosts: run a on one and b on the other")
    ap.add_argument("--run-id", default=None, help="the same on both hosts (default: random)")
    ap.add_argument("--objects", type=int, default=64)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of the mixed run")
    ap.add_argument("--mixed-workers", type=int, default=4)
    ap.add_argument("--peer-wait-s", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--scribble", type=int, default=0, metavar="N",
                    help="with --role: a negative control; corrupt N of the peer's objects "
                         "after it published them and before reading them (the gate must fail)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run for CI: concurrency 1, 2, 4, fewer objects, 2 s mixed")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sim-fabric", metavar="SO",
                    help="test builds: each process a host of the non-coherence simulator "
                         "(tests/lmcache/sim_fabric.cc's library, absolute path); not a "
                         "qualification of anything")
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
        return 0
    # SIGTERM and SIGHUP end the run as SIGINT does: through the `finally` below, which stops
    # the workers and the launched domain and removes its files.
    exit_on_termination()
    if not a.library or not os.path.isabs(a.library):
        print("lmcache-qualify: --library /absolute/path/liblmcache_shared_l1_visibility.so is "
              "required", file=sys.stderr)
        return 2
    q = Qualify()
    q.seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    q.role, q.objects, q.duration, q.mixed_workers = a.role, a.objects, a.duration, a.mixed_workers
    q.peer_wait_s, q.scribble = a.peer_wait_s, a.scribble
    if a.scribble and a.role == "both":
        print("lmcache-qualify: --scribble needs --role a or b", file=sys.stderr)
        return 2
    q.levels = (1, 2, 4, 8, 16)
    if a.quick:
        q.levels, q.objects, q.duration, q.mixed_workers = (1, 2, 4), 16, 2.0, 2
    q.ttl_ms, q.lease_ms = 60000, 10000
    q.domain = None
    run = a.run_id or f"{os.getpid()}-{q.seed}"
    try:
        return qualify(q, a, run)
    finally:
        # Also on a failure and on SIGINT/SIGTERM/SIGHUP; a second signal waits for this.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        stop_workers()
        if q.domain is not None:
            q.domain.close()


def qualify(q, a, run):
    if a.launch:
        # The state file on tmpfs: the gates test the fabric and the coordinator's rules, not the
        # latency of this machine's disk (bench/RESULTS.md measures both).
        ttl_ms = 1500 if a.quick else 3000
        q.domain = EmulatedDomain(a.launch, region_mib=64, ttl_ms=ttl_ms, lease_ms=ttl_ms // 2,
                                  state_dir="/dev/shm")
        print(f"lmcache-qualify: the emulated domain's files are removed when this run ends; "
              f"after a kill -9: {q.domain.removal}", file=sys.stderr, flush=True)
        q.domain.start()
        host, port = "127.0.0.1", q.domain.port
        token = q.domain.tokens["default"]
        pool, mapping_offset = q.domain.pool, q.domain.region_offset
    else:
        if not (a.endpoint and a.token_file and a.pool):
            print("lmcache-qualify: give --launch ORCHESTRATOR, or --endpoint, --token-file and "
                  "--pool", file=sys.stderr)
            return 2
        hp = a.endpoint.split("://", 1)[-1].rstrip("/")
        host, port = hp.rsplit(":", 1)[0], int(hp.rsplit(":", 1)[1])
        token, pool, mapping_offset = read_token(a.token_file), a.pool, a.mapping_offset
    probe = Client(port, token, host=host)
    probe.region()
    status, stats = probe.raw("GET", "/cxlkv/v1/stats")
    q.cxlkv = status == 200
    if mapping_offset is None:
        if not q.cxlkv:
            print("lmcache-qualify: --mapping-offset is required for a coordinator that is not "
                  "cxlkv's", file=sys.stderr)
            return 2
        mapping_offset = stats["region_offset"]
    q.ctxd = {"host": host, "port": port, "token": token, "pool": pool,
              "mapping_offset": mapping_offset, "library": a.library, "run": run,
              "sim_fabric": a.sim_fabric}
    q.ctx = Ctx(q.ctxd)
    gates = [x for x in a.gates.split(",") if x]
    unknown = [x for x in gates if x not in GATES]
    if unknown:
        print(f"lmcache-qualify: unknown gate(s) {unknown}; known: {list(GATES)}",
              file=sys.stderr)
        return 2
    if a.role != "both":
        gates = ["visibility"]
    results = []
    for name in gates:
        g = Gate(name)
        t0 = time.monotonic()
        try:
            GATES[name](q, g)
        except Exception as e:  # a gate that crashes fails, with the reason
            g.passed, g.detail = False, f"{type(e).__name__}: {e}"
        stop_workers()  # a crashed gate's workers
        g.figures["seconds"] = round(time.monotonic() - t0, 2)
        results.append(g)
        if not a.json:
            print(f"{'PASS' if g.passed else 'FAIL'}  {name:17} {g.detail}", flush=True)
    if q.domain is not None:
        q.domain.close()
    passed = all(g.passed or g.skipped for g in results)
    report = {"passed": passed, "seed": q.seed, "run_id": run, "library": a.library,
              "coordinator": "launched emulated domain" if a.launch else a.endpoint,
              "cxlkv_coordinator": q.cxlkv, "gates": [g.as_dict() for g in results]}
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{'QUALIFIED' if passed else 'NOT QUALIFIED'} (seed {q.seed}; the visibility gate "
              "on one machine checks the contract, not cross-host visibility)")
    return 0 if passed else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the domain and the workers are gone (main's `finally`)
        print("lmcache-qualify: interrupted", file=sys.stderr)
        sys.exit(130)
