#!/usr/bin/python3
"""LMCache's memory coordinator API served by a real cxlkv-orchestrator, driven by a client
written from docs/lmcache.md (tools/lmcache-qualify/coordinator_client.py, http.client only), moving real bytes
through handles with liblmcache_shared_l1_visibility.so.

Usage: coordinator_http_test.py ORCHESTRATOR_BIN VISIBILITY_LIBRARY   (exit 0: pass)
Seeded: CXLKV_SEED, printed. Listens on 127.0.0.1 only. Takes a few seconds.

What it shows: every route and every error of the contract (401, 403, 404, 405, 409
stale_epoch / invalid_reservation, 422, 507 for a whole batch); two writer processes (two
tenants) and a reader moving bytes through handles (publish / acquire, SHA-256); a writer
killed mid-reservation whose space comes back after the TTL; the orchestrator killed (-9)
between finish and lookup and restarted, then stopped by SIGTERM and restarted: same epoch,
same handles, same bytes; a tenant at its
quota gets 507 and evicts only its own objects.
"""

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
sys.path.insert(0, str(HERE.parent.parent / "tools" / "lmcache-qualify"))
sys.path.insert(0, str(HERE.parent.parent / "python"))  # cxlkv: a host of the domain
from coordinator_client import Client, CoordinatorError, make_key, make_layout  # noqa: E402
from emulated_domain import EmulatedDomain, die_with_parent, exit_on_termination  # noqa: E402
from visibility_ctypes import ACQUIRE, PUBLISH, Visibility  # noqa: E402

MiB = 1 << 20
POOL = 256 * MiB
EXTENT = 16 * MiB
REGION = 32 * MiB          # the pool's last two extents
REGION_OFFSET = POOL - REGION
ALIGN = 4096
TTL_MS = 600
LEASE_MS = 300
TOKENS = {"acme": "acme-token-0123456789", "batch": "batch-token-0123456789",
          "small": "small-token-0123456789"}
QUOTA_SMALL = 64 * 1024
SMALL_REGION = 64 * 1024   # LMCache's own tests' region: less than an extent


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


class Domain(EmulatedDomain):
    """A domain with [lmcache], its orchestrator as a process (the qualification kit's
    launcher, with this test's tenants, quotas and pin levels)."""

    def __init__(self, binary, lmcache_toml="", region_bytes=REGION):
        super().__init__(binary, pool_mib=POOL // MiB, region_bytes=region_bytes,
                         extent_mib=EXTENT // MiB, alignment=ALIGN, ttl_ms=TTL_MS,
                         lease_ms=LEASE_MS, quotas={"small": QUOTA_SMALL}, threads=4,
                         name="lmc", layout_id="test-layout", tokens=TOKENS, max_batch=256,
                         lmcache_toml=lmcache_toml, extra_toml="""[[namespace]]
tenant = "acme"
model = "lmcache"
layout = "test-layout"
pin = 2
""")

    def log_text(self):
        self.log.seek(0)
        return self.log.read()

    def client(self, tenant):
        c = Client(self.port, TOKENS[tenant])
        c.region()
        return c

    def cleanup(self):
        self.close()


class Mapping:
    """The coordinator's region as LMCache maps it: the pool at --l1-shared-mapping-offset-bytes
    = region_offset; a handle's device offset is region_offset + offset."""

    def __init__(self, pool, library):
        self.vis = Visibility(library)
        self.fd = os.open(pool, os.O_RDWR)
        self.m = mmap.mmap(self.fd, REGION, flags=mmap.MAP_SHARED,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=REGION_OFFSET)
        import ctypes
        self.anchor = ctypes.c_ubyte.from_buffer(self.m)
        self.base = ctypes.addressof(self.anchor)

    def write(self, handle, payload):
        off, n = handle["offset"], handle["length"]
        self.m[off:off + n] = payload
        self.vis.apply(PUBLISH, self.fd, self.base + off, REGION_OFFSET + off, n,
                       handle["generation"])

    def read(self, handle):
        off, n = handle["offset"], handle["length"]
        self.vis.apply(ACQUIRE, self.fd, self.base + off, REGION_OFFSET + off, n,
                       handle["generation"])
        return bytes(self.m[off:off + n])


# ---- the worker processes ---------------------------------------------------------------------

def writer(port, tenant, pool, library, seed, first, count):
    """Reserves, writes, publishes and finishes `count` objects; prints {key hex: sha256}."""
    rng = random.Random(seed)
    c = Client(port, TOKENS[tenant])
    c.region()
    mp = Mapping(pool, library)
    out = {}
    for batch in range(0, count, 8):
        items = [(make_key(first + i), make_layout(rng.randrange(1, 5 * ALIGN)))
                 for i in range(batch, min(count, batch + 8))]
        grants = c.reserve(items)
        for g in grants:
            payload = rng.randbytes(g["handle"]["length"])
            mp.write(g["handle"], payload)
            out[g["key"]["chunk_hash_hex"]] = hashlib.sha256(payload).hexdigest()
        c.finish(grants)
    print(json.dumps(out), flush=True)


def hang(port, tenant, pool, library, key):
    """Reserves one object, writes half of it, says so, and waits to be killed."""
    c = Client(port, TOKENS[tenant])
    c.region()
    mp = Mapping(pool, library)
    g = c.reserve([(make_key(key), make_layout(8 * ALIGN))])[0]
    off = g["handle"]["offset"]
    mp.m[off:off + 4 * ALIGN] = b"\xab" * (4 * ALIGN)
    print(json.dumps(g), flush=True)
    time.sleep(3600)


def reader(port, tenant, pool, library, expected_json):
    """Looks every key up, acquires, and compares digests; prints the handles it saw."""
    expected = json.loads(expected_json)
    c = Client(port, TOKENS[tenant])
    c.region()
    mp = Mapping(pool, library)
    keys = [dict(make_key(0), chunk_hash_hex=h) for h in expected]
    hits = c.lookup(keys)
    seen = {}
    for h, hit in zip(expected, hits):
        if hit is None:
            fail(f"reader: {h} missing")
        if hashlib.sha256(mp.read(hit["handle"])).hexdigest() != expected[h]:
            fail(f"reader: {h} corrupt at {hit['handle']}")
        seen[h] = hit["handle"]
    print(json.dumps(seen), flush=True)


def spawn(mode, *args):
    return subprocess.Popen([sys.executable, __file__, "--" + mode, *map(str, args)],
                            stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent)


def run(mode, *args):
    p = spawn(mode, *args)
    out, _ = p.communicate(timeout=60)
    check(p.returncode == 0, f"{mode} exited {p.returncode}")
    return json.loads(out)


# ---- the checks -------------------------------------------------------------------------------

def check_routes_and_errors(d):
    c = Client(d.port, None)
    check(c.raw("GET", "/healthz") == (200, {"status": "ok"}), "healthz")
    check(c.raw("GET", "/readyz") == (200, {"status": "ready"}), "readyz")
    check(c.raw("GET", "/v1/region")[0] == 401, "no token: 401")
    check(c.raw("GET", "/v1/region", headers={"Authorization": "Basic x"})[0] == 401, "Basic: 401")
    check(c.raw("GET", "/v1/region", headers={"Authorization": "Bearer wrong-token-123456"})
          == (403, {"detail": "invalid bearer token"}), "wrong token: 403")
    check(c.raw("GET", "/v1/nothing")[0] == 404, "unknown route: 404")
    check(c.raw("POST", "/v1/region")[0] == 405, "POST region: 405")
    check(c.raw("GET", "/v1/lookup")[0] == 405, "GET lookup: 405")
    a = d.client("acme")
    region = a.region()
    check(set(region) == {"region_id", "capacity_bytes", "alignment_bytes", "layout_id",
                          "region_epoch"}, f"region fields {region}")
    check(region["region_id"] == "lmc" and region["capacity_bytes"] == REGION and
          region["alignment_bytes"] == ALIGN and region["layout_id"] == "test-layout",
          f"region {region}")
    st = a.status()
    check(set(st) == {"region", "used_bytes", "object_count"} and st["region"] == region,
          f"status {st}")
    check(a.stats()["region_offset"] == REGION_OFFSET, "stats: region_offset")
    check(a.stats()["namespace"] == "acme/lmcache/test-layout", "stats: namespace")
    check(a.stats()["pin_level"] == 2 and d.client("batch").stats()["pin_level"] == 0,
          "[[namespace]] pin levels do not reach the coordinator")
    e = a.epoch
    k = make_key(1, model="errs")
    lay = make_layout(ALIGN)

    def expect(path, body, status, error=None, what=""):
        s, out = a.raw("POST", path, body)
        check(s == status, f"{what}: {path} gave {s} {out}, expected {status}")
        if error:
            check(out.get("error") == error, f"{what}: error {out}, expected {error}")
        return out

    expect("/v1/lookup", "{not json", 422, what="malformed JSON")
    expect("/v1/lookup", [1, 2], 422, what="array body")
    expect("/v1/lookup", {"region_epoch": e, "keys": [], "x": 1}, 422, what="unknown field")
    expect("/v1/lookup", {"region_epoch": e, "keys": [dict(k, extra=1)]}, 422,
           what="unknown key field")
    expect("/v1/lookup", {"keys": []}, 422, what="missing epoch")
    expect("/v1/lookup", {"region_epoch": 5, "keys": []}, 422, what="epoch type")
    # LMCache's models read kv_rank and object_group_id as pydantic's lax `int`: "0" and 0.0
    # are 0 (served: a miss here); a fraction or a word is 422.
    for coerced in (dict(k, kv_rank="0"), dict(k, kv_rank=0.0), dict(k, object_group_id="2")):
        out = expect("/v1/lookup", {"region_epoch": e, "keys": [coerced]}, 200,
                     what=f"coerced {coerced}")
        check(out["hits"] == [None], f"coerced key: {out}")
    expect("/v1/lookup", {"region_epoch": e, "keys": [dict(k, kv_rank=0.5)]}, 422,
           what="kv_rank 0.5")
    expect("/v1/lookup", {"region_epoch": e, "keys": [dict(k, kv_rank="x")]}, 422,
           what="kv_rank type")
    # Keys LMCache's ObjectKey refuses: 422 with its reason.
    for bad, reason in ((dict(k, model_name="a@b"), "model_name must not contain '@'"),
                        (dict(k, cache_salt="u/1"), "cache_salt must not contain"),
                        (dict(k, object_group_id=-1), "object_group_id must be >= 0")):
        out = expect("/v1/lookup", {"region_epoch": e, "keys": [bad]}, 422, what=reason)
        check(reason in out.get("detail", ""), f"{reason}: {out}")
    # A lookup larger than max_batch (256 here) is served, as LMCache serves it.
    out = expect("/v1/lookup", {"region_epoch": e, "keys": [make_key(i, "big") for i in range(300)]},
                 200, what="lookup over max_batch")
    check(len(out["hits"]) == 300, "lookup over max_batch: hits")
    # A layout whose size is past any integer type is too large for the region: 507, as
    # LMCache's (its sizes are Python integers).
    expect("/v1/writes/reserve", {"region_epoch": e, "items": [
        {"key": k, "layout": {"shapes": [[1 << 40, 1 << 40]], "dtypes": ["float64"]}}]}, 507,
           "out_of_space", "dimensions whose product overflows")
    expect("/v1/lookup", {"region_epoch": e, "keys": [k, k]}, 422, what="duplicate keys")
    expect("/v1/lookup", {"region_epoch": e, "keys": [dict(k, chunk_hash_hex="ABC")]}, 422,
           what="non-canonical hash")
    expect("/v1/writes/reserve", {"region_epoch": e, "items": [
        {"key": k, "layout": {"shapes": [[4]], "dtypes": ["float17"]}}]}, 422, what="dtype")
    expect("/v1/writes/reserve", {"region_epoch": e, "items": [
        {"key": k, "layout": {"shapes": [[4.0]], "dtypes": ["uint8"]}}]}, 422, what="float dim")
    expect("/v1/writes/reserve", {"region_epoch": e, "items": [
        {"key": k, "layout": dict(lay, strides=[1])}]}, 422, what="unknown layout field")
    expect("/v1/writes/reserve", {"region_epoch": e, "items": [{"key": k, "layout": lay}] * 300},
           422, what="batch over max_batch")
    expect("/v1/lookup", {"region_epoch": "0" * 32, "keys": [k]}, 409, "stale_epoch", "stale")
    expect("/v1/writes/reserve", {"region_epoch": "x", "items": [{"key": k, "layout": lay}]}, 409,
           "stale_epoch", "stale reserve")
    expect("/v1/writes/finish", {"region_epoch": e, "reservations": [{"key": k, "token": "t"}]},
           409, "invalid_reservation", "unknown token")
    expect("/v1/writes/abort", {"region_epoch": e, "reservations": [{"key": k, "token": "t"}]},
           409, "invalid_reservation", "abort unknown token")
    before = a.status()
    out = expect("/v1/writes/reserve", {"region_epoch": e, "items": [
        {"key": make_key(2, "errs"), "layout": lay},
        {"key": make_key(3, "errs"), "layout": make_layout(REGION)}]}, 507, "out_of_space",
        "batch larger than the region")
    check(a.status() == before, "a refused batch changed the status")
    # Grants, finish, lookup, then the same reservation again: invalid_reservation.
    g = a.reserve([(k, lay)])
    check(g[0] is not None and set(g[0]) == {"key", "token", "handle", "layout"}, f"grant {g}")
    check(set(g[0]["handle"]) == {"region_id", "offset", "length", "generation"}, "handle")
    check(g[0]["handle"]["offset"] % ALIGN == 0, "alignment")
    check(a.reserve([(k, lay)]) == [None], "second reserve of a key: null grant")
    check(a.lookup([k]) == [None], "WRITING is a miss")
    a.finish(g)
    hit = a.lookup([k])[0]
    check(hit == {"key": k, "handle": g[0]["handle"], "layout": lay}, f"hit {hit}")
    expect("/v1/writes/finish", {"region_epoch": e, "reservations": [
        {"key": k, "token": g[0]["token"]}]}, 409, "invalid_reservation", "finish twice")
    # Another tenant does not see acme's object (its own namespace).
    check(d.client("batch").lookup([k]) == [None], "tenants share a namespace")
    # Abort gives the space back.
    used = a.status()["used_bytes"]
    g2 = a.reserve([(make_key(9, "errs"), make_layout(4 * ALIGN))])
    check(a.status()["used_bytes"] == used + 4 * ALIGN, "reserve used_bytes")
    a.abort(g2)
    check(a.status()["used_bytes"] == used, "abort did not give the space back")
    check("for POST /v1/writes/finish from 127.0.0.1" in d.log_text() and "(tenant acme)" in
          d.log_text(), "refused requests are logged naming the client")


def check_writers_and_reader(d, library, seed):
    w1 = spawn("writer", d.port, "acme", d.pool, library, seed, 1000, 40)
    w2 = spawn("writer", d.port, "acme", d.pool, library, seed + 1, 2000, 40)
    o1, _ = w1.communicate(timeout=60)
    o2, _ = w2.communicate(timeout=60)
    check(w1.returncode == 0 and w2.returncode == 0, "writers failed")
    objects = {**json.loads(o1), **json.loads(o2)}
    check(len(objects) == 80, "writers wrote 80 objects")
    handles = run("reader", d.port, "acme", d.pool, library, json.dumps(objects))
    spans = sorted((h["offset"], h["offset"] + h["length"]) for h in handles.values())
    for (a0, a1), (b0, _) in zip(spans, spans[1:]):
        check(a1 <= b0, f"handles overlap: {a0}-{a1} and {b0}")
    gens = sorted(h["generation"] for h in handles.values())
    check(len(set(gens)) == len(gens), "a generation handed out twice")
    return objects, handles


def check_writer_killed(d, library):
    a = d.client("acme")
    used = a.status()["used_bytes"]
    p = spawn("hang", d.port, "acme", d.pool, library, 77)
    grant = json.loads(p.stdout.readline())
    p.kill()
    p.wait()
    check(a.stats()["writing"] >= 1, "the killed writer's reservation is not held")
    check(a.status()["used_bytes"] == used + 8 * ALIGN, "reservation not counted")
    time.sleep(TTL_MS / 1000 * 2.5)
    st = a.stats()
    check(st["writing"] == 0 and st["expired"] >= 1, f"reservation not reclaimed {st}")
    check(a.status()["used_bytes"] == used, "used_bytes did not go down after the TTL")
    s, out = a.raw("POST", "/v1/writes/finish", {"region_epoch": a.epoch, "reservations": [
        {"key": grant["key"], "token": grant["token"]}]})
    check(s == 409 and out["error"] == "invalid_reservation", "finish after TTL")
    check(a.reserve([(make_key(77), make_layout(ALIGN))])[0] is not None,
          "the abandoned key cannot be reserved again")


def check_restart(d, library, objects, handles):
    # Killed (-9) between finish and lookup, then stopped as systemctl stops it (SIGTERM, with
    # a kept-alive client connected: exit status 0): the same state after each start.
    for sig in (signal.SIGKILL, signal.SIGTERM):
        a = d.client("acme")
        epoch, before = a.epoch, a.status()
        d.kill(sig)
        if sig == signal.SIGTERM:
            check(d.proc.returncode == 0, f"SIGTERM: exit status {d.proc.returncode}")
        a.close()
        d.start()
        a = d.client("acme")
        name = signal.Signals(sig).name
        check(a.epoch == epoch, f"{name}: region_epoch changed across a restart that lost nothing")
        check(a.status() == before,
              f"{name}: status changed across the restart: {before} {a.status()}")
        check(a.stats()["restored"], f"{name}: not restored")
        after = run("reader", d.port, "acme", d.pool, library, json.dumps(objects))
        check(after == handles, f"{name}: handles changed across the restart")


def check_quota(d):
    s = d.client("small")
    b = d.client("batch")
    bk = [make_key(i, "q") for i in range(4)]
    b.finish(b.reserve([(k, make_layout(8 * ALIGN)) for k in bk]))
    ks = [make_key(i, "q") for i in range(20)]
    s.finish(s.reserve([(k, make_layout(8 * ALIGN)) for k in ks[:2]]))  # 64 KiB: the quota
    check(s.stats()["tenant_used_bytes"] == QUOTA_SMALL, "small at its quota")
    time.sleep(LEASE_MS / 1000 * 1.5)
    s.finish(s.reserve([(ks[2], make_layout(8 * ALIGN))]))  # evicts its own ks[0]
    check(s.lookup([ks[0]]) == [None], "small's oldest object was not evicted")
    check(all(h is not None for h in b.lookup(bk)), "small evicted another tenant's objects")
    st, out = s.raw("POST", "/v1/writes/reserve", {"region_epoch": s.epoch, "items": [
        {"key": ks[3], "layout": make_layout(8 * ALIGN)}]})  # ks[1], ks[2] read-leased? no:
    # ks[2] was just finished (no lease) and ks[1] is unleased: one of them goes.
    check(st == 200, f"small could not make room {st} {out}")
    s.lookup([ks[1], ks[2], ks[3]])  # all of small's objects leased now
    st, out = s.raw("POST", "/v1/writes/reserve", {"region_epoch": s.epoch, "items": [
        {"key": ks[4], "layout": make_layout(8 * ALIGN)}]})
    check(st == 507 and out["error"] == "out_of_space" and "quota" in out["detail"],
          f"at quota with everything leased: {st} {out}")


def check_index(binary, library):
    """The objects in the domain's prefix index: a host joined to the domain finds a finished
    object by chain lease, with no HTTP, and reads its bytes through its own mapping of the
    region; an object it leases keeps its range from reuse after the coordinator evicted it,
    until the lease is released."""
    import cxlkv
    d = Domain(binary, lmcache_toml="index_wait_ms = 300\nevict_ahead = 0")
    host = None
    try:
        d.start()
        b = d.client("batch")
        st = b.stats()
        check(st["index"] and st["indexed"] == 0, f"index stats at start: {st}")
        ns = cxlkv.Namespace("batch", "lmcache", "test-layout")
        check(int(st["index_namespace"], 16) == ns.id, "index_namespace is not the tenant's")
        m = Mapping(d.pool, library)
        size = REGION // 4  # four objects fill the region
        keys = [make_key(i, "idx") for i in range(5)]
        payload = {}
        handles = {}
        for i in range(4):
            g = b.reserve([(keys[i], make_layout(size))])[0]
            payload[i] = hashlib.sha256(b"idx%d" % i).digest() * (size // 32)
            m.write(g["handle"], payload[i])
            b.finish([g])
            handles[i] = g["handle"]

        def ikey(k):
            # The key as a reader computes it (the coordinator's own code through the C API):
            # the owner must have published the object under exactly this key.
            fields = (k["chunk_hash_hex"], k["model_name"], k["kv_rank"],
                      k.get("object_group_id", 0), k.get("cache_salt", ""))
            key = cxlkv.lmcache_index_key("batch", "test-layout", *fields)
            check(key == cxlkv.key_from_name(ns.id, cxlkv.lmcache_index_name(*fields)),
                  f"lmcache_index_key is not key_from_name over the name for {k}")
            return key
        host = cxlkv.Domain.join(f"orchestrator:{d.dir}/o.sock", 1)
        ikeys = [ikey(k) for k in keys]
        deadline = time.monotonic() + 10
        while True:
            leases = host.acquire_chain(ns, ikeys[:4], wait_s=1.0)
            if len(leases) == 4 or time.monotonic() > deadline:
                break
            leases.release()
            time.sleep(0.01)
        check(len(leases) == 4, f"the host leased {len(leases)} of 4 objects through the index")
        region = memoryview(m.m)
        for i in range(4):
            h = handles[i]
            check(leases.region_object(i) == (h["offset"], h["length"], h["generation"],
                                              st["region_tag"]),
                  f"object {i}: the index's ref {leases.region_object(i)} is not its handle {h}")
            dst = bytearray(h["length"])
            check(leases.try_copy_out_region(i, region, dst), f"object {i}: copy went stale")
            check(bytes(dst) == payload[i], f"object {i}: bytes read through the index differ")
        check(b.stats()["indexed"] == 4, "indexed count")
        # Object 0 is the least recently used: a fifth object evicts it. The host's lease keeps
        # its range: the reserve waits index_wait_ms, then 507 naming the index.
        s, out = b.raw("POST", "/v1/writes/reserve", {"region_epoch": b.epoch, "items": [
            {"key": keys[4], "layout": make_layout(size)}]})
        check(s == 507 and "index" in out.get("detail", ""), f"reserve under a lease: {s} {out}")
        st = b.stats()
        check(st["evicted"] == 1 and st["held_bytes"] == size and st["used_bytes"] == REGION,
              f"after the eviction: {st}")
        check(b.lookup([keys[0]])[0] is None, "the evicted object is still served")
        dst = bytearray(size)
        check(not leases.try_copy_out_region(0, region, dst),
              "a copy of the evicted object validated after its entry was retired")
        leases.release()
        # Released: the owner reclaims the entry after its grace and the range comes back.
        g = b.reserve([(keys[4], make_layout(size))])[0]
        check(g is not None and g["handle"]["offset"] == handles[0]["offset"] and
              g["handle"]["generation"] > handles[3]["generation"],
              f"the fifth object did not get object 0's range: {g}")
        check(b.stats()["held_bytes"] == 0, "held bytes after the release")
        b.finish([g])
        again = host.acquire_chain(ns, [ikeys[0]])
        check(len(again) == 0, "the evicted object is still in the index")
        again.release()
    finally:
        if host is not None:
            host.leave()
        d.cleanup()


def check_small_region(binary):
    """A region of LMCache's tests' size (64 KiB, less than an extent): the capacity and the
    507 answers follow it, and it keeps the pool's last extent to itself."""
    d = Domain(binary, region_bytes=SMALL_REGION)
    try:
        d.start()
        a = d.client("acme")
        region = a.region()
        check(region["capacity_bytes"] == SMALL_REGION, f"small region: {region}")
        check(a.stats()["region_offset"] == POOL - EXTENT,
              f"small region: offset {a.stats()['region_offset']}, not its extent's start")
        e = a.epoch

        def reserve(i, nbytes):
            return a.raw("POST", "/v1/writes/reserve", {"region_epoch": e, "items": [
                {"key": make_key(i, "small-region"), "layout": make_layout(nbytes)}]})
        s, out = reserve(1, 2 * SMALL_REGION)
        check(s == 507 and out.get("error") == "out_of_space", f"128 KiB reserve: {s} {out}")
        s, out = reserve(2, SMALL_REGION)
        check(s == 200 and out["grants"][0] is not None, f"64 KiB reserve: {s} {out}")
        s, out = reserve(3, ALIGN)  # the region holds one WRITING object: nothing to evict
        check(s == 507 and out.get("error") == "out_of_space", f"a full region: {s} {out}")
        check(a.status()["used_bytes"] == SMALL_REGION, f"small region: {a.status()}")
    finally:
        d.cleanup()


def check_bad_config(binary):
    """Bad [lmcache] settings stop the orchestrator with the key and the fix; nothing starts."""
    cases = [
        (lambda d: d.config.write_text(d.config.read_text().replace(
            f"region_size = {REGION}", 'region_size = "256M"')), "leaves the hosts no extent"),
        (lambda d: d.config.write_text(d.config.read_text().replace(
            f"region_size = {REGION}", f"region_size = {POOL - EXTENT + 1}")),
         "leaves the hosts no extent"),
        (lambda d: d.config.write_text(d.config.read_text().replace("layout_id", "layout")),
         "key 'lmcache.layout': unknown key"),
        (lambda d: (d.dir / "tokens").chmod(0o644), "chmod 600"),
    ]
    for mutate, want in cases:
        d = Domain(binary)
        try:
            mutate(d)
            p = subprocess.run([binary, "--config", str(d.config), "--new-domain"],
                               capture_output=True, text=True, timeout=30)
            check(p.returncode != 0 and want in p.stderr,
                  f"bad config ({want}): exit {p.returncode}, stderr {p.stderr!r}")
        finally:
            d.cleanup()


def main():
    if len(sys.argv) > 1 and sys.argv[1].startswith("--"):
        mode, args = sys.argv[1][2:], sys.argv[2:]
        if mode == "writer":
            writer(int(args[0]), args[1], args[2], args[3], int(args[4]), int(args[5]),
                   int(args[6]))
        elif mode == "hang":
            hang(int(args[0]), args[1], args[2], args[3], int(args[4]))
        elif mode == "reader":
            reader(int(args[0]), args[1], args[2], args[3], args[4])
        return
    binary, library = sys.argv[1], sys.argv[2]
    exit_on_termination()
    seed = int(os.environ.get("CXLKV_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (CXLKV_SEED to replay)", flush=True)
    check_bad_config(binary)
    print("bad [lmcache] settings refused with the key and the fix: ok", flush=True)
    check_small_region(binary)
    print("a 64 KiB region: its capacity, 507 past it, an extent of its own: ok", flush=True)
    d = Domain(binary)
    try:
        d.start()
        check_routes_and_errors(d)
        print("routes and errors: ok", flush=True)
        objects, handles = check_writers_and_reader(d, library, seed)
        print("two writers and a reader, 80 objects through handles: ok", flush=True)
        check_writer_killed(d, library)
        print("writer killed mid-reservation, reclaimed after the TTL: ok", flush=True)
        check_restart(d, library, objects, handles)
        print("orchestrator killed between finish and lookup, and stopped by SIGTERM: ok",
              flush=True)
        check_quota(d)
        print("tenant quota: ok", flush=True)
        d.cleanup()
        check_index(binary, library)
        print("objects in the domain's index: found, read and held by a host's lease: ok",
              flush=True)
    except SystemExit:
        print(f"seed {seed}", file=sys.stderr)
        raise
    finally:
        d.cleanup()
    print("PASS")


if __name__ == "__main__":
    main()
