#!/usr/bin/python3
"""tools/lmcache-qualify against a real orchestrator on an emulated pool: the quick run passes
every gate (--json checked); the two-host mode (--role a / --role b, one run id) passes with one
process per role; and a peer's object scribbled on between write and read (what an overlapping
grant or a fabric that loses write-backs would do) fails the visibility gate, naming it corrupt.
Over the non-coherence simulator's seam (each kit process a host with a private, non-coherent
cache over the pool file: tests/lmcache/sim_fabric.cc), the visibility gate passes with the
visibility library's real steps and fails, every object corrupt, with a library that does
nothing.

Usage: qualify_test.py ORCHESTRATOR_BIN VISIBILITY_LIBRARY SIM_FABRIC_LIBRARY NOOP_LIBRARY
(exit 0: pass). About 40 s.
"""

import hashlib
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "lmcache-qualify" / "lmcache_qualify.py"
sys.path.insert(0, str(TOOL.parent))
from coordinator_client import Client  # noqa: E402
from emulated_domain import EmulatedDomain, die_with_parent, exit_on_termination  # noqa: E402


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def qualify(*args, wait=True):
    cmd = [sys.executable, str(TOOL), *map(str, args)]
    # A kit run ends (and removes its domain) when this test ends, however it ends.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=die_with_parent)
    if not wait:
        return p
    out, err = p.communicate(timeout=300)
    return p.returncode, out, err


def main():
    binary, library, sim_fabric, noop = sys.argv[1:5]
    exit_on_termination()
    # The simulated fabric: the real steps pass, a library that does nothing fails.
    for lib, want in ((sim_fabric, 0), (noop, 1)):
        rc, out, err = qualify("--quick", "--gates", "visibility", "--launch", binary,
                               "--library", lib, "--sim-fabric", sim_fabric, "--json")
        if rc != want:
            fail(f"simulated fabric with {lib}: exit {rc}, want {want}: {out} {err}")
        g = json.loads(out)["gates"][0]
        n = g["figures"]["written"]
        if want == 0 and not (g["result"] == "pass" and g["figures"]["read_ok"] == n):
            fail(f"simulated fabric, real library: {g}")
        if want == 1 and not (g["result"] == "FAIL" and g["figures"]["read_ok"] == 0 and
                              g["figures"]["corrupt"] == n):
            fail(f"simulated fabric, no-op library: every object must be corrupt: {g}")
    print("simulated fabric: the real library passes, a no-op library fails", flush=True)
    rc, out, err = qualify("--quick", "--launch", binary, "--library", library, "--json")
    if rc != 0:
        fail(f"quick run exited {rc}: {out} {err}")
    report = json.loads(out)
    names = [g["gate"] for g in report["gates"]]
    if names != ["visibility", "stale_generation", "concurrency", "failure", "mixed"]:
        fail(f"gates {names}")
    if not report["passed"] or any(g["result"] != "pass" for g in report["gates"]):
        fail(f"report {out}")
    print("quick run: every gate passes", flush=True)

    d = EmulatedDomain(binary, state_dir="/dev/shm")
    print(f"the domain's files are removed at the end; after a kill -9: {d.removal}", flush=True)
    try:
        d.start()
        tf = d.dir / "token"
        tf.write_text(d.tokens["default"] + "\n")
        tf.chmod(0o600)
        common = ["--endpoint", d.endpoint(), "--token-file", tf, "--pool", d.pool,
                  "--library", library, "--objects", 16]
        # Two hosts: one process per role, one run id.
        pa = qualify(*common, "--role", "a", "--run-id", "two", "--json", wait=False)
        pb = qualify(*common, "--role", "b", "--run-id", "two", "--json", wait=False)
        for p, role in ((pa, "a"), (pb, "b")):
            out, err = p.communicate(timeout=120)
            if p.returncode != 0:
                fail(f"role {role} exited {p.returncode}: {out} {err}")
            g = json.loads(out)["gates"][0]
            if g["gate"] != "visibility" or g["figures"]["ok"] != 16:
                fail(f"role {role}: {g}")
        print("two roles, one run id: both pass", flush=True)

        # The kit's own negative control: role b corrupts 3 of a's objects once a published
        # them (--scribble 3); b fails with 3 corrupt, a (reading b's) passes.
        pa = qualify(*common, "--role", "a", "--run-id", "scr", "--json", wait=False)
        pb = qualify(*common, "--role", "b", "--run-id", "scr", "--scribble", 3, "--json",
                     wait=False)
        (oa, ea), (ob, eb) = pa.communicate(timeout=120), pb.communicate(timeout=120)
        if pa.returncode != 0:
            fail(f"role a failed beside a scribbling b: {oa} {ea}")
        g = json.loads(ob)["gates"][0]
        if pb.returncode != 1 or g["result"] != "FAIL" or g["figures"]["corrupt"] != 3:
            fail(f"role b with --scribble 3 (exit {pb.returncode}): {g} {eb}")
        print("--scribble 3: role b fails with 3 corrupt, role a passes", flush=True)

        # A peer's objects scribbled on after they were published: the reader must say corrupt.
        rc, out, err = qualify(*common, "--role", "a", "--run-id", "bad", "--peer-wait-s", 1,
                               "--json")
        if rc == 0:
            fail("role a passed without a peer")
        c = Client(d.port, d.tokens["default"])
        c.region()
        keys = [{"chunk_hash_hex": hashlib.sha256(f"bad/vis-a-{i}".encode()).hexdigest(),
                 "model_name": "qualify", "kv_rank": 0, "object_group_id": 0, "cache_salt": ""}
                for i in range(16)]
        hits = c.lookup(keys)
        if any(h is None for h in hits):
            fail("role a's objects are not all there")
        fd = os.open(d.pool, os.O_RDWR)
        m = mmap.mmap(fd, d.region_bytes, offset=d.region_offset)
        for h in hits[:3]:
            o = h["handle"]["offset"]
            m[o:o + 8] = bytes(8 * [0x5A]) if m[o:o + 8] != bytes(8 * [0x5A]) else bytes(8)
        m.close()
        os.close(fd)
        rc, out, err = qualify(*common, "--role", "b", "--run-id", "bad", "--json")
        if rc != 1:
            fail(f"a scribbled peer object passed (exit {rc}): {out} {err}")
        g = json.loads(out)["gates"][0]
        if g["result"] != "FAIL" or g["figures"]["corrupt"] != 3:
            fail(f"expected 3 corrupt objects: {g}")
        print("scribbled objects: visibility fails, 3 corrupt", flush=True)
    finally:
        d.close()
    print("PASS")


if __name__ == "__main__":
    main()
